//! nats-server processes for the tests: started on free 127.0.0.1 ports with
//! their own store directories, waited for until their health endpoint says
//! ok, killed (SIGKILL) and restarted on the same ports and stores, and
//! killed when dropped. Only the processes started here are ever signalled.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One nats-server process (or the configuration of one that is down).
pub struct Server {
    pub name: String,
    pub port: u16,
    http_port: u16,
    conf: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// Makes the process `command` starts receive SIGKILL when the test process
/// dies, however it dies (a panic, a timeout's kill): no test leaves a
/// server or a service running.
pub fn die_with_parent(command: &mut Command) {
    // SAFETY: between fork and exec the closure only calls prctl(2), which
    // is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

/// A port free on 127.0.0.1 at the time of asking.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// The nats-server binary: on PATH, or where Debian's package puts it.
fn binary() -> PathBuf {
    for candidate in [
        "nats-server",
        "/usr/sbin/nats-server",
        "/usr/bin/nats-server",
    ] {
        let found = Command::new(candidate)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if found {
            return PathBuf::from(candidate);
        }
    }
    panic!(
        "nats-server not found: these tests run a real server, 2.10 or later \
         (`apt-get install nats-server` on Debian 13; docs/RELAY.md)"
    );
}

impl Server {
    /// A single server with JetStream, storing under `dir`.
    pub fn single(dir: &Path) -> Server {
        Server::configure(dir, "single", None)
    }

    /// Three servers routed to one another (cluster `segwal`), each storing
    /// under its own directory in `dir`.
    pub fn cluster(dir: &Path) -> Vec<Server> {
        let routes: Vec<u16> = (0..3).map(|_| free_port()).collect();
        (0..3)
            .map(|n| Server::configure(dir, &format!("n{}", n + 1), Some((n, &routes))))
            .collect()
    }

    fn configure(dir: &Path, name: &str, cluster: Option<(usize, &[u16])>) -> Server {
        let home = dir.join(name);
        std::fs::create_dir_all(&home).expect("server directory");
        let (port, http_port) = (free_port(), free_port());
        let mut conf = format!(
            "server_name: {name}\nlisten: 127.0.0.1:{port}\nhttp: 127.0.0.1:{http_port}\n\
             jetstream {{ store_dir: \"{}\" }}\n",
            home.join("store").display()
        );
        if let Some((me, routes)) = cluster {
            let others: Vec<String> = routes
                .iter()
                .enumerate()
                .filter(|(n, _)| *n != me)
                .map(|(_, p)| format!("nats-route://127.0.0.1:{p}"))
                .collect();
            conf.push_str(&format!(
                "cluster {{ name: segwal\n listen: 127.0.0.1:{}\n routes: [{}] }}\n",
                routes[me],
                others.join(", ")
            ));
        }
        let conf_path = home.join("server.conf");
        std::fs::write(&conf_path, conf).expect("server configuration");
        Server {
            name: name.to_owned(),
            port,
            http_port,
            conf: conf_path,
            log: home.join("server.log"),
            child: None,
        }
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the process (without waiting for it to be ready).
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "{} is running already", self.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("server log");
        let mut command = Command::new(binary());
        command
            .arg("-c")
            .arg(&self.conf)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("server log"))
            .stderr(log);
        die_with_parent(&mut command);
        let child = command.spawn().expect("nats-server starts");
        self.child = Some(child);
    }

    /// Starts the process and waits until it is healthy.
    pub fn start(&mut self) {
        self.spawn();
        self.wait_ready(Duration::from_secs(30));
    }

    /// Waits until the health endpoint answers 200 (JetStream included).
    pub fn wait_ready(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "{} exited at start ({status}); see {}",
                    self.name,
                    self.log.display()
                );
            }
            if self.healthy() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} not healthy within {limit:?}; see {}",
                self.name,
                self.log.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn healthy(&self) -> bool {
        let Ok(mut conn) = TcpStream::connect(("127.0.0.1", self.http_port)) else {
            return false;
        };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
        let request = "GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        if conn.write_all(request.as_bytes()).is_err() {
            return false;
        }
        let mut answer = String::new();
        let _ = conn.read_to_string(&mut answer);
        answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200")
    }

    /// Prints the warnings and errors of its log (for a failed test).
    pub fn print_warnings(&self) {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        for line in log
            .lines()
            .filter(|l| l.contains("[WRN]") || l.contains("[ERR]"))
        {
            println!("  {}: {line}", self.name);
        }
    }

    /// SIGKILL, and waits for the process to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}
