//! A small tmpfs, mounted for a test that needs a real file system to fill
//! up (root only: a test says it skips where it cannot mount one).

use std::path::{Path, PathBuf};
use std::process::Command;

/// A mounted tmpfs, unmounted on drop (also when the test fails).
pub struct Tmpfs {
    at: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (as `mount -o size=` takes it: `2m`,
    /// `4096k`) at `at`, or says why it cannot.
    pub fn mount(at: &Path, size: &str) -> Result<Tmpfs, String> {
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(Tmpfs { at: at.to_owned() })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        match Command::new("umount").arg(&self.at).status() {
            Ok(status) if status.success() => {}
            other => eprintln!("could not unmount {}: {other:?}", self.at.display()),
        }
    }
}
