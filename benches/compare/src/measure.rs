//! What the harness measures besides the engines: CPU time, percentiles, the
//! file system under the engines, and the machine's `fdatasync` latency.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::engines::Result;

/// User plus system CPU time of the whole process (every thread, the engines'
/// background threads included) so far.
pub fn cpu_time() -> Duration {
    // SAFETY: `getrusage` fills the zeroed struct we pass; RUSAGE_SELF is valid.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// The machine's CPU time so far, in clock ticks of all its processors
/// together, from the first line of /proc/stat: all of it, and what the
/// hypervisor gave to other guests while this one had work to run ("steal").
#[derive(Clone, Copy, Debug)]
pub struct CpuTicks {
    pub total: u64,
    pub steal: u64,
}

impl CpuTicks {
    /// Now; `None` where /proc/stat does not tell (not Linux).
    pub fn now() -> Option<CpuTicks> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let line = stat.lines().next()?.strip_prefix("cpu ")?;
        // user nice system idle iowait irq softirq steal (guest time is
        // already counted in user and nice).
        let fields: Vec<u64> = line
            .split_whitespace()
            .take(8)
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        (fields.len() == 8).then(|| CpuTicks {
            total: fields.iter().sum(),
            steal: fields[7],
        })
    }

    /// The share of the machine's CPU time stolen between `before` and
    /// `after` (0 to 1); `None` if either is unknown or no tick passed.
    pub fn stolen_share(before: Option<CpuTicks>, after: Option<CpuTicks>) -> Option<f64> {
        let (a, b) = (before?, after?);
        let total = b.total.checked_sub(a.total).filter(|&t| t > 0)?;
        Some(b.steal.saturating_sub(a.steal) as f64 / total as f64)
    }
}

/// Latency percentiles in microseconds, from samples in nanoseconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Percentiles {
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub mean_us: f64,
}

impl Percentiles {
    /// Sorts `samples_ns` and reads the nearest-rank percentiles.
    pub fn of(samples_ns: &mut [u64]) -> Percentiles {
        if samples_ns.is_empty() {
            return Percentiles::default();
        }
        samples_ns.sort_unstable();
        let rank = |q: f64| {
            let i = (q * samples_ns.len() as f64).ceil() as usize;
            samples_ns[i.clamp(1, samples_ns.len()) - 1] as f64 / 1000.0
        };
        let sum: u128 = samples_ns.iter().map(|&s| s as u128).sum();
        Percentiles {
            p50_us: rank(0.50),
            p99_us: rank(0.99),
            p999_us: rank(0.999),
            mean_us: sum as f64 / samples_ns.len() as f64 / 1000.0,
        }
    }
}

/// The mount a path lives on, from /proc/mounts.
#[derive(Clone, Debug)]
pub struct Mount {
    pub device: String,
    pub point: String,
    pub fs_type: String,
    pub options: String,
}

/// The mount holding `path`: the longest mount point that is a prefix of it.
pub fn mount_of(path: &Path) -> Option<Mount> {
    let path = path.canonicalize().ok()?;
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let m = Mount {
                device: f.next()?.to_string(),
                point: unescape_mount(f.next()?),
                fs_type: f.next()?.to_string(),
                options: f.next()?.to_string(),
            };
            path.starts_with(&m.point).then_some(m)
        })
        // The last of equally long points is the one mounted on top.
        .fold(None, |best: Option<Mount>, m| match &best {
            Some(b) if b.point.len() > m.point.len() => best,
            _ => Some(m),
        })
}

/// /proc/mounts writes a space in a mount point as `\040`.
fn unescape_mount(s: &str) -> String {
    s.replace("\\040", " ").replace("\\011", "\t")
}

/// How a probe file is laid out before the timed writes.
#[derive(Clone, Copy, Debug)]
pub enum FileKind {
    /// Space reserved with `fallocate`, never written: each write converts
    /// unwritten extents, which the file system must journal.
    Fallocated,
    /// Every write appends, so each `fdatasync` also makes the new size durable.
    Growing,
    /// Space already written and fsynced (zeros): each write changes data only.
    Overwrite,
}

impl FileKind {
    pub const ALL: [FileKind; 3] = [FileKind::Fallocated, FileKind::Growing, FileKind::Overwrite];

    pub fn describe(self) -> &'static str {
        match self {
            FileKind::Fallocated => "preallocated with fallocate (unwritten extents)",
            FileKind::Growing => "growing (each write appends)",
            FileKind::Overwrite => "preallocated by writing zeros (overwrite in place)",
        }
    }
}

/// `fdatasync` latency on one kind of file.
#[derive(Clone, Debug)]
pub struct SyncProbe {
    pub kind: FileKind,
    pub write_bytes: usize,
    pub iterations: usize,
    pub fdatasync: Percentiles,
}

/// Times `iterations` rounds of one `pwrite` of `write_bytes` at the next
/// offset followed by one `fdatasync` (only the `fdatasync` is timed), on a new
/// file in `dir` laid out as `kind`.
pub fn probe_fdatasync(
    dir: &Path,
    kind: FileKind,
    write_bytes: usize,
    iterations: usize,
) -> Result<SyncProbe> {
    let path: PathBuf = dir.join(format!("fdatasync-probe-{kind:?}"));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    let total = (write_bytes * iterations) as u64;
    match kind {
        FileKind::Fallocated => {
            // SAFETY: `fallocate` on a file descriptor we own, with plain integers.
            let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, total as i64) };
            if rc != 0 {
                return Err(std::io::Error::last_os_error().into());
            }
        }
        FileKind::Growing => {}
        FileKind::Overwrite => {
            let zeros = vec![0u8; 1 << 20];
            let mut at = 0u64;
            while at < total {
                let n = (total - at).min(zeros.len() as u64) as usize;
                file.write_all_at(&zeros[..n], at)?;
                at += n as u64;
            }
        }
    }
    file.sync_all()?;
    File::open(dir)?.sync_all()?;

    let block = vec![0xA5u8; write_bytes];
    let mut samples = Vec::with_capacity(iterations);
    for i in 0..iterations {
        file.write_all_at(&block, (i * write_bytes) as u64)?;
        let start = Instant::now();
        file.sync_data()?;
        samples.push(start.elapsed().as_nanos() as u64);
    }
    drop(file);
    std::fs::remove_file(&path)?;
    Ok(SyncProbe {
        kind,
        write_bytes,
        iterations,
        fdatasync: Percentiles::of(&mut samples),
    })
}

/// Bytes written to the block device `device` (as /proc/mounts names it,
/// `/dev/vda`) since boot, from its statistics in sysfs (sectors of 512
/// bytes, whatever the device's own sector size); `None` where the device has
/// none (tmpfs, overlay).
pub fn device_written_bytes(device: &str) -> Option<u64> {
    let name = Path::new(device).file_name()?.to_str()?;
    let stat = std::fs::read_to_string(format!("/sys/class/block/{name}/stat")).ok()?;
    // Fields: reads, read merges, sectors read, read ticks, writes, write
    // merges, sectors written, ...
    let sectors: u64 = stat.split_whitespace().nth(6)?.parse().ok()?;
    Some(sectors * 512)
}
