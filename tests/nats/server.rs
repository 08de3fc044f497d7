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

/// A port free on 127.0.0.1 at the time of asking, below the kernel's
/// ephemeral range (`net.ipv4.ip_local_port_range`) and never handed out
/// twice by this process. A port from `bind(0)` would be an ephemeral one:
/// between our check and the server's own bind, an outgoing connection (a
/// route from the node started just before, a client) can be given it, and
/// the server exits with "address already in use". Ports below the range
/// are only ever taken by a listener that asks for them by number.
fn free_port() -> u16 {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let given = given.get_or_insert_with(HashSet::new);
    // A system whose ephemeral range starts low leaves too few ports below
    // it: then a port from `bind(0)`, as good as it gets there.
    if low < 12_000 {
        loop {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free loopback port")
                .port();
            if given.insert(port) {
                return port;
            }
        }
    }
    let (first, last) = (10_000u16, low - 1);
    // Start somewhere that depends on the process and the time, so that two
    // test processes running at once do not walk the same ports in step.
    let span = u32::from(last - first) + 1;
    let mut seed = std::process::id().wrapping_mul(2_654_435_761)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
    // A random start, then every port of the range in turn.
    seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
    let start = (seed >> 8) % span;
    for step in 0..span {
        let port = first + ((start + step) % span) as u16;
        if given.contains(&port) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return port;
        }
    }
    panic!("no free loopback port between {first} and {last}");
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

    /// Three servers routed to one another, started and healthy. A node
    /// that exits at start (a port taken by something outside this test
    /// between our check and its bind) makes the whole cluster start again
    /// on new ports and new directories, at most three times; the reasons
    /// are printed.
    pub fn start_cluster(dir: &Path, limit: Duration) -> Vec<Server> {
        let mut reasons = Vec::new();
        for attempt in 1..=3 {
            let mut nodes = Server::cluster(&dir.join(format!("cluster-{attempt}")));
            for node in &mut nodes {
                node.spawn();
            }
            let deadline = Instant::now() + limit;
            let mut failed: Vec<String> = nodes
                .iter_mut()
                .filter_map(|node| node.ready_within(limit).err())
                .collect();
            // Healthy nodes may not yet be one cluster: nats-server 2.10
            // places a stream of three replicas only on peers its meta
            // leader sees current (one such start left every creation
            // refused for minutes).
            if failed.is_empty()
                && let Err(why) = Server::formed(&nodes, deadline)
            {
                failed.push(why);
            }
            if failed.is_empty() {
                return nodes;
            }
            for why in &failed {
                println!("  cluster start {attempt} failed: {why}");
            }
            reasons.extend(failed);
        }
        panic!("the cluster did not start in three tries: {reasons:?}");
    }

    /// Waits, up to `deadline`, until every node names the same leader of
    /// the JetStream meta group and that leader sees each other node as a
    /// current, online peer; an error says what the nodes last reported.
    fn formed(nodes: &[Server], deadline: Instant) -> Result<(), String> {
        loop {
            let views: Vec<Result<serde_json::Value, String>> =
                nodes.iter().map(|n| n.get_json("/jsz")).collect();
            let leaders: Vec<Option<&str>> = views
                .iter()
                .map(|v| {
                    let v = v.as_ref().ok()?;
                    v["meta_cluster"]["leader"]
                        .as_str()
                        .filter(|l| !l.is_empty())
                })
                .collect();
            let agreed = leaders[0].filter(|l| leaders.iter().all(|o| *o == Some(l)));
            let peers_current = agreed.and_then(|leader| {
                let at = nodes.iter().position(|n| n.name == leader)?;
                let view = views[at].as_ref().ok()?;
                let replicas = view["meta_cluster"]["replicas"].as_array()?;
                let current = |name: &str| {
                    replicas
                        .iter()
                        .any(|r| r["name"] == name && r["current"] == true && r["offline"] != true)
                };
                Some(
                    nodes
                        .iter()
                        .filter(|n| n.name != leader)
                        .all(|n| current(&n.name)),
                )
            });
            if peers_current == Some(true) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let said: Vec<String> = nodes
                    .iter()
                    .zip(&views)
                    .map(|(n, v)| match v {
                        Ok(v) => format!("{}: {}", n.name, v["meta_cluster"]),
                        Err(why) => format!("{}: {why}", n.name),
                    })
                    .collect();
                return Err(format!(
                    "the nodes did not form one cluster in time: {}",
                    said.join("; ")
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Three servers routed to one another (cluster `segwal`), each storing
    /// under its own directory in `dir`.
    fn cluster(dir: &Path) -> Vec<Server> {
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

    /// Starts a node of a cluster again on its store and waits, up to
    /// `limit`, until it is healthy. A restarted node reports healthy only
    /// once it has caught up with its streams, which can take long on a
    /// slow machine (and nats-server 2.10 can keep saying "catching up"
    /// after the catch-up is done, nats-io/nats-server#6964): then the
    /// reason is printed with the log's warnings and the test goes on, since
    /// what it asserts is that every record reaches the stream. A node that
    /// exits is a failure.
    pub fn restart(&mut self, limit: Duration) {
        self.spawn();
        match self.ready_within(limit) {
            Ok(()) => {}
            Err(why) if self.child.is_none() => panic!("{why}"),
            Err(why) => {
                println!("  {why}; going on");
                self.print_warnings();
            }
        }
    }

    /// Waits until the health endpoint answers 200 (JetStream included).
    pub fn wait_ready(&mut self, limit: Duration) {
        if let Err(why) = self.ready_within(limit) {
            panic!("{why}");
        }
    }

    /// Waits until healthy; an error names what went wrong (the process
    /// exited, with the end of its log, or it never became healthy).
    fn ready_within(&mut self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(12).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                return Err(format!(
                    "{} exited at start ({status}); the end of {}:\n{}",
                    self.name,
                    self.log.display(),
                    tail.join("\n")
                ));
            }
            let health = self.health();
            if health.is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} not healthy within {limit:?} ({}); see {}",
                    self.name,
                    health.err().unwrap_or_default(),
                    self.log.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Ok when the health endpoint answers 200 (JetStream included);
    /// otherwise what it answered, or why it could not be asked.
    fn health(&self) -> Result<(), String> {
        let (ok, body) = self.get("/healthz")?;
        if ok {
            return Ok(());
        }
        // The body names what is not current.
        Err(body.trim().chars().take(300).collect())
    }

    /// The JSON a monitoring endpoint answers with.
    fn get_json(&self, path: &str) -> Result<serde_json::Value, String> {
        match self.get(path)? {
            (true, body) => serde_json::from_str(&body).map_err(|e| format!("{path}: {e}")),
            (false, body) => Err(format!("{path}: {}", body.trim())),
        }
    }

    /// GET `path` from the monitoring port: whether it answered 200, and
    /// the body (the whole answer when it has none).
    fn get(&self, path: &str) -> Result<(bool, String), String> {
        let mut conn = TcpStream::connect(("127.0.0.1", self.http_port))
            .map_err(|e| format!("monitoring endpoint: {e}"))?;
        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
        let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        conn.write_all(request.as_bytes())
            .map_err(|e| format!("monitoring endpoint: {e}"))?;
        let mut answer = String::new();
        let _ = conn.read_to_string(&mut answer);
        let ok = answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200");
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or(&answer);
        Ok((ok, body.to_owned()))
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
