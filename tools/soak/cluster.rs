//! `holdfast-soak --cluster N`: the soak against N real nodes on loopback, every peer link
//! through a fault-injecting proxy (`proxy.rs`), with a fault thread killing, pausing,
//! restarting and partitioning nodes while the clients of `mc.rs`, `lockd.rs` and `dlock.rs`
//! spread their connections over all nodes and the model checks the rules of `main.rs`
//! (rules 1-8, and the cluster rules 9-11).
//!
//! Owns the nodes (started, signalled and stopped by their PIDs only), their data directories
//! (a fresh temporary directory, removed after a PASS) and the proxies; it must not decide
//! anything about mutual exclusion itself (that is the model's).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::client::Ctx;
use crate::model::Model;
use crate::net::{Conn, Rng, REPLY_DEADLINE};
use crate::proxy::{Mesh, Mode};
use crate::report::Report;
use crate::{locks_left, stats, Args, LOCK_STATS, MAX_LEASE, PROGRESS_EVERY, SAMPLE_EVERY};

/// How long a node may take to print its listening lines (a restart replays its log).
const START_WITHIN: Duration = Duration::from_secs(20);
/// How long the cluster may take to serve through every node again after a fault (an
/// election, a restarted node catching up) before that counts as an error.
const RECOVER_WITHIN: Duration = Duration::from_secs(30);
/// Pause between two faults (the previous one has been recovered from by then).
const FAULT_GAP_MS: (u64, u64) = (1500, 4000);
/// How long a node stays down, a partition stays, a node stays paused beyond the session
/// timeout (ms).
const DOWN_MS: (u64, u64) = (1000, 3000);
const PAUSE_EXTRA_MS: (u64, u64) = (200, 1500);
/// How long the fill (`--fill-mb`) may take before the run fails.
const FILL_WITHIN: Duration = Duration::from_secs(300);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    /// SIGKILL a random node, restart it after 1-3 s with its data directory.
    Kill,
    /// SIGKILL the leader, likewise.
    KillLeader,
    /// SIGSTOP a node for longer than the session timeout, then SIGCONT.
    Stop,
    /// SIGTERM a node (it must exit cleanly), restart it.
    Term,
    /// Cut a node off both ways (blackhole or refused connections) for 1-3 s.
    Partition,
    /// Cut one direction between the leader and a follower for 1-3 s.
    OneWay,
}

const FAULTS: [Fault; 6] = [
    Fault::Kill,
    Fault::KillLeader,
    Fault::Stop,
    Fault::Term,
    Fault::Partition,
    Fault::OneWay,
];

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::KillLeader => "kill_leader",
            Fault::Stop => "stop",
            Fault::Term => "term",
            Fault::Partition => "partition",
            Fault::OneWay => "one_way",
        }
    }
}

struct Node {
    id: usize,
    dir: PathBuf,
    log: PathBuf,
    memcache: SocketAddr,
    lockd: SocketAddr,
    dlock: SocketAddr,
    admin: SocketAddr,
    child: Option<holdfast_testkit::Daemon>,
    peak_rss: u64,
    /// This node's peer TLS flags (`--peer-tls`), else empty.
    tls_flags: Vec<String>,
}

/// The nodes, their proxies and how to start them.
struct Nodes {
    bin: String,
    flags: Vec<String>,
    mesh: Mesh,
    nodes: Mutex<Vec<Node>>,
    base: PathBuf,
}

/// A free port for a node's listener, below the kernel's ephemeral range: a node restarts on
/// the same ports, and a port the kernel may give to an outgoing connection meanwhile (the
/// clients', the proxies') could then be taken. The listener is kept until the mesh is up
/// (the proxies bind port 0).
fn free_listener(rng: &mut Rng) -> Result<TcpListener, String> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| {
            t.split_whitespace()
                .next()
                .and_then(|p| p.parse::<u64>().ok())
        })
        .unwrap_or(32768)
        .clamp(2048, 65535);
    let from = (low / 2).max(1024);
    for _ in 0..1000 {
        let port = rng.range(from, low) as u16;
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            return Ok(l);
        }
    }
    Err(format!("no free port in {from}..{low}"))
}

impl Nodes {
    fn lock(&self) -> MutexGuard<'_, Vec<Node>> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn create(n: usize, bin: &str, flags: &[String], peer_tls: bool) -> Result<Nodes, String> {
        let base =
            std::env::temp_dir().join(format!("holdfast-soak-cluster-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let tls_flags = if peer_tls {
            peer_tls_flags(&base.join("pki"), n)?
        } else {
            vec![Vec::new(); n]
        };
        let mut nodes = Vec::new();
        let mut peers = Vec::new();
        let mut held = Vec::new();
        let mut rng = Rng::mixed(u64::from(std::process::id()));
        let mut addr = || -> Result<SocketAddr, String> {
            let l = free_listener(&mut rng)?;
            let a = l.local_addr().map_err(|e| e.to_string())?;
            held.push(l);
            Ok(a)
        };
        for id in 1..=n {
            let dir = base.join(format!("node{id}"));
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            peers.push(addr()?);
            nodes.push(Node {
                id,
                log: base.join(format!("node{id}.log")),
                dir,
                memcache: addr()?,
                lockd: addr()?,
                dlock: addr()?,
                admin: addr()?,
                child: None,
                peak_rss: 0,
                tls_flags: tls_flags[id - 1].clone(),
            });
        }
        let mesh = Mesh::start(&peers).map_err(|e| format!("start the peer proxies: {e}"))?;
        drop(held);
        Ok(Nodes {
            bin: bin.to_string(),
            flags: flags.to_vec(),
            mesh,
            nodes: Mutex::new(nodes),
            base,
        })
    }

    /// Start node `id` (not running) with its data directory; its stderr goes to its log.
    fn spawn(&self, nodes: &mut [Node], id: usize) -> Result<(), String> {
        let node = &mut nodes[id - 1];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .map_err(|e| format!("{}: {e}", node.log.display()))?;
        let mut cmd = Command::new(&self.bin);
        cmd.args(["--memcache", &node.memcache.to_string()])
            .args(["--lockd", &node.lockd.to_string()])
            .args(["--dlock", &node.dlock.to_string()])
            .args(["--admin", &node.admin.to_string()])
            .args(["--counter", "off"])
            .args(["--peers", &self.mesh.peers_for(id)])
            .args(["--node-id", &id.to_string()])
            .arg("--data-dir")
            .arg(&node.dir)
            .args(&self.flags)
            .args(&node.tls_flags)
            .stderr(Stdio::from(log));
        // SAFETY: prctl is async-signal-safe; between fork and exec it only asks the kernel to
        // kill the node should the soak die first (SIGKILL: a stopped node gets it too).
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = holdfast_testkit::Daemon::spawn(
            &mut cmd,
            &["memcache", "lockd", "dlock", "admin"],
            START_WITHIN,
        )
        .map_err(|e| format!("start node {id}: {e}"))?;
        node.child = Some(child);
        Ok(())
    }

    fn signal(&self, nodes: &[Node], id: usize, sig: libc::c_int) {
        if let Some(c) = &nodes[id - 1].child {
            // SAFETY: kill(2) on the PID of a child this soak started and has not reaped
            // (`child` is dropped, or reaped by `terminate`, only after this).
            unsafe { libc::kill(c.pid() as libc::pid_t, sig) };
        }
    }

    /// SIGKILL node `id` and reap it.
    fn kill(&self, id: usize) {
        let mut nodes = self.lock();
        self.signal(&nodes, id, libc::SIGKILL);
        if let Some(mut c) = nodes[id - 1].child.take() {
            let _ = c.terminate(Duration::from_secs(10));
        }
    }

    /// SIGTERM node `id`; it must exit with status 0 within 10 s.
    fn term(&self, id: usize) -> Result<(), String> {
        let mut nodes = self.lock();
        let Some(mut c) = nodes[id - 1].child.take() else {
            return Ok(());
        };
        match c.terminate(Duration::from_secs(10)) {
            Ok(st) if st.success() => Ok(()),
            Ok(st) => Err(format!("node {id} exited with {st} on SIGTERM")),
            Err(e) => Err(format!("node {id}: {e}")),
        }
    }

    fn restart(&self, id: usize) -> Result<(), String> {
        let mut nodes = self.lock();
        self.spawn(&mut nodes, id)
    }

    fn addrs(&self) -> (Vec<SocketAddr>, Vec<SocketAddr>, Vec<SocketAddr>) {
        let nodes = self.lock();
        (
            nodes.iter().map(|n| n.memcache).collect(),
            nodes.iter().map(|n| n.lockd).collect(),
            nodes.iter().map(|n| n.dlock).collect(),
        )
    }

    /// The leader as the first node that names one says (0: none known).
    fn leader(&self) -> usize {
        let admins: Vec<SocketAddr> = self
            .lock()
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.admin)
            .collect();
        for a in admins {
            if let Some(body) = http_get(a, "/cluster") {
                if let Some(l) = json_u64(&body, "leader").filter(|&l| l > 0) {
                    return l as usize;
                }
            }
        }
        0
    }

    /// Sample every node's RSS; (id, rss KiB, running) each.
    fn sample(&self) -> Vec<(usize, u64, bool)> {
        let mut nodes = self.lock();
        nodes
            .iter_mut()
            .map(|n| {
                let running = n.child.as_mut().is_some_and(|c| c.is_running());
                let rss = n.child.as_ref().and_then(|c| c.rss_kib()).unwrap_or(0);
                n.peak_rss = n.peak_rss.max(rss);
                (n.id, rss, running)
            })
            .collect()
    }

    /// SIGTERM every node (each must exit cleanly).
    fn stop_all(&self) -> Vec<String> {
        let n = self.lock().len();
        (1..=n).filter_map(|id| self.term(id).err()).collect()
    }
}

/// `--peer-tls`: a CA in `dir` and a certificate for 127.0.0.1 (every node's and every proxy's
/// address: a node checks the name of its `--peers` entry, a proxy's) per node; each node's
/// flags.
fn peer_tls_flags(dir: &Path, n: usize) -> Result<Vec<Vec<String>>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let ca = holdfast_testkit::pki::Ca::new("holdfast soak peer CA");
    let ca_path = ca.write(&dir.join("ca.pem"));
    Ok((1..=n)
        .map(|id| {
            let cert = ca.issue(dir, &format!("node{id}"), &["127.0.0.1"]);
            [
                ("--peer-tls-cert", &cert.cert),
                ("--peer-tls-key", &cert.key),
                ("--peer-tls-ca", &ca_path),
            ]
            .iter()
            .flat_map(|(flag, path)| [flag.to_string(), path.to_string_lossy().into_owned()])
            .collect()
        })
        .collect())
}

/// One HTTP/1.0 GET on the admin port: the body of a 200 answer.
fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: soak\r\n\r\n").as_bytes())
        .ok()?;
    let mut out = Vec::new();
    let _ = s.take(1 << 20).read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.to_string())
        .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_string()))
}

/// The number after `"field":` in a JSON text (enough for the admin port's flat answers).
fn json_u64(text: &str, field: &str) -> Option<u64> {
    let at = text.find(&format!("\"{field}\""))? + field.len() + 2;
    let rest = text[at..].trim_start().strip_prefix(':')?.trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The boolean after `"field":` in a JSON text.
fn json_bool(text: &str, field: &str) -> Option<bool> {
    let at = text.find(&format!("\"{field}\""))? + field.len() + 2;
    let rest = text[at..].trim_start().strip_prefix(':')?.trim_start();
    if rest.starts_with("true") {
        Some(true)
    } else if rest.starts_with("false") {
        Some(false)
    } else {
        None
    }
}

/// Every node's `/cluster` field `field` (a number; None for a node that does not answer).
fn cluster_u64(nodes: &Nodes, field: &str) -> Vec<Option<u64>> {
    let admins: Vec<SocketAddr> = nodes.lock().iter().map(|n| n.admin).collect();
    admins
        .into_iter()
        .map(|a| http_get(a, "/cluster").and_then(|b| json_u64(&b, field)))
        .collect()
}

/// Whether a `set` through `addr` is STORED (the cluster commits through that node).
fn serves(addr: SocketAddr) -> bool {
    let Ok(mut c) = Conn::connect(addr) else {
        return false;
    };
    if c.send(b"set soak-probe 0 0 1\r\nx\r\n").is_err() {
        return false;
    }
    let line = c.recv(Instant::now() + Duration::from_secs(5), |b| {
        Ok(b.windows(2)
            .position(|w| w == b"\r\n")
            .map(|i| (b[..i].to_vec(), i + 2)))
    });
    c.close(false);
    matches!(line, Ok(l) if l == b"STORED")
}

/// Wait until every node serves; false after `within`.
fn wait_all_serving(nodes: &Nodes, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let (mc, _, _) = nodes.addrs();
    for addr in mc {
        while !serves(addr) {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    true
}

/// The timers the cluster runs with, from the daemon flags.
fn flag_ms(flags: &[String], name: &str) -> Option<u64> {
    flags
        .windows(2)
        .rev()
        .find(|w| w[0] == name)
        .and_then(|w| w[1].parse().ok())
}

/// Counts of faults by kind.
struct FaultLog {
    counts: [AtomicU64; FAULTS.len()],
    /// Set when the cluster did not recover: the run ends.
    broken: AtomicBool,
    /// Set by the fault thread when it injects no more faults.
    done: AtomicBool,
    /// Set when the nodes are stopped: the fault thread may end.
    release: AtomicBool,
}

impl FaultLog {
    fn summary(&self) -> String {
        FAULTS
            .iter()
            .enumerate()
            .map(|(i, f)| format!("{}:{}", f.name(), self.counts[i].load(Ordering::Relaxed)))
            .collect::<Vec<_>>()
            .join(",")
    }
}

fn say(report: &Report, text: String) {
    println!(
        "soak-cluster: [{:.3}s] {text}",
        report.started.elapsed().as_secs_f64()
    );
}

fn sleep_ms(rng: &mut Rng, (lo, hi): (u64, u64)) -> Duration {
    let d = Duration::from_millis(rng.range(lo, hi));
    std::thread::sleep(d);
    d
}

/// One fault, from start to heal or restart. Returns an error text when the cluster did
/// something the daemon must not do (a node that does not stop cleanly, cannot restart).
fn inject(
    nodes: &Nodes,
    fault: Fault,
    rng: &mut Rng,
    session: Duration,
    report: &Report,
) -> Result<String, String> {
    let n = nodes.lock().len();
    let random = |rng: &mut Rng| 1 + rng.below(n as u64) as usize;
    match fault {
        Fault::Kill | Fault::KillLeader => {
            let id = match fault {
                Fault::KillLeader => match nodes.leader() {
                    0 => random(rng),
                    l => l,
                },
                _ => random(rng),
            };
            say(
                report,
                format!("fault: SIGKILL node {id} ({})", fault.name()),
            );
            nodes.kill(id);
            let down = sleep_ms(rng, DOWN_MS);
            nodes.restart(id)?;
            Ok(format!(
                "node {id} killed, restarted after {} ms",
                down.as_millis()
            ))
        }
        Fault::Stop => {
            let id = random(rng);
            say(report, format!("fault: SIGSTOP node {id}"));
            nodes.signal(&nodes.lock(), id, libc::SIGSTOP);
            let extra = Duration::from_millis(rng.range(PAUSE_EXTRA_MS.0, PAUSE_EXTRA_MS.1));
            std::thread::sleep(session + extra);
            nodes.signal(&nodes.lock(), id, libc::SIGCONT);
            Ok(format!(
                "node {id} paused {} ms",
                (session + extra).as_millis()
            ))
        }
        Fault::Term => {
            let id = random(rng);
            say(report, format!("fault: SIGTERM node {id}"));
            nodes.term(id)?;
            let down = sleep_ms(rng, (200, 1500));
            nodes.restart(id)?;
            Ok(format!(
                "node {id} stopped, restarted after {} ms",
                down.as_millis()
            ))
        }
        Fault::Partition => {
            let id = random(rng);
            let mode = if rng.chance(50) {
                Mode::Drop
            } else {
                Mode::Refuse
            };
            say(
                report,
                format!("fault: node {id} cut off both ways ({mode:?})"),
            );
            nodes.mesh.isolate(id, mode);
            let d = sleep_ms(rng, DOWN_MS);
            nodes.mesh.heal();
            Ok(format!("node {id} cut off for {} ms", d.as_millis()))
        }
        Fault::OneWay => {
            let leader = match nodes.leader() {
                0 => random(rng),
                l => l,
            };
            let other = 1 + (leader % n + rng.below(n as u64 - 1) as usize) % n;
            let (from, to) = if rng.chance(50) {
                (leader, other)
            } else {
                (other, leader)
            };
            let mode = if rng.chance(50) {
                Mode::Drop
            } else {
                Mode::Refuse
            };
            say(
                report,
                format!("fault: one way: node {from} -> node {to} cut ({mode:?}), leader {leader}"),
            );
            nodes.mesh.set(from, to, mode);
            let d = sleep_ms(rng, DOWN_MS);
            nodes.mesh.heal();
            Ok(format!("{from} -> {to} cut for {} ms", d.as_millis()))
        }
    }
}

/// The fault thread: one fault every few seconds until `stop_at`, each recovered from before
/// the next (so at most one node is down or cut off at a time). Then it sets `log.done` and
/// waits for `log.release`: the nodes it restarted have PR_SET_PDEATHSIG, which the kernel
/// sends when the *thread* that started them ends, so it must outlive them.
fn faults(
    nodes: &Nodes,
    log: &FaultLog,
    report: &Report,
    stop_at: Instant,
    seed: u64,
    session: Duration,
) {
    run_faults(nodes, log, report, stop_at, seed, session);
    log.done.store(true, Ordering::Release);
    while !log.release.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run_faults(
    nodes: &Nodes,
    log: &FaultLog,
    report: &Report,
    stop_at: Instant,
    seed: u64,
    session: Duration,
) {
    let mut rng = Rng::mixed(seed ^ 0xfa01_7fa0_17fa_017f);
    loop {
        let gap = Duration::from_millis(rng.range(FAULT_GAP_MS.0, FAULT_GAP_MS.1));
        if Instant::now() + gap >= stop_at {
            break;
        }
        std::thread::sleep(gap);
        let fault = FAULTS[rng.below(FAULTS.len() as u64) as usize];
        let i = FAULTS.iter().position(|&f| f == fault).unwrap_or(0);
        log.counts[i].fetch_add(1, Ordering::Relaxed);
        match inject(nodes, fault, &mut rng, session, report) {
            Ok(what) => say(report, format!("fault over: {what}")),
            Err(e) => report.error(format!("fault {}: {e}", fault.name())),
        }
        let t = Instant::now();
        if !wait_all_serving(nodes, RECOVER_WITHIN) {
            report.error(format!(
                "the cluster did not serve through every node within {} s after {}",
                RECOVER_WITHIN.as_secs(),
                fault.name()
            ));
            log.broken.store(true, Ordering::Relaxed);
            return;
        }
        say(
            report,
            format!(
                "every node serves again after {} ms",
                t.elapsed().as_millis()
            ),
        );
    }
}

fn dir_kib(p: &Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => total += dir_kib(&e.path()) * 1024,
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total.div_ceil(1024)
}

/// The whole cluster soak; prints the report line; exit status 0 on PASS.
pub fn main(args: &Args, bin: &str) -> ExitCode {
    let mut flags = args.daemon_args.clone();
    let election = flag_ms(&flags, "--election-timeout").unwrap_or(1000);
    let session = flag_ms(&flags, "--session-timeout").unwrap_or(3 * election);
    let session = Duration::from_millis(session);
    if !flags.iter().any(|f| f == "--threads") {
        flags.extend(["--threads".to_string(), "1".to_string()]);
    }
    // Room for the fill and the clients' items, with no eviction (a sampled fill item evicted
    // would be reported lost).
    if args.fill_mb > 0 && !flags.iter().any(|f| f == "--memory" || f == "-M") {
        let mib = (4 * args.fill_mb).max(1024);
        flags.extend(["--memory".to_string(), mib.to_string()]);
    }
    let nodes = match Nodes::create(args.cluster, bin, &flags, args.peer_tls) {
        Ok(n) => Arc::new(n),
        Err(e) => {
            eprintln!("holdfast-soak: {e}");
            return ExitCode::FAILURE;
        }
    };
    {
        let mut list = nodes.lock();
        for id in 1..=args.cluster {
            if let Err(e) = nodes.spawn(&mut list, id) {
                eprintln!("holdfast-soak: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let pass = run(args, &nodes, session, election);
    // Nodes still running (an early return) are killed when `nodes` drops.
    if pass {
        let _ = std::fs::remove_dir_all(&nodes.base);
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "soak-cluster: data directories and node logs kept in {}",
            nodes.base.display()
        );
        ExitCode::FAILURE
    }
}

fn run(args: &Args, nodes: &Arc<Nodes>, session: Duration, election: u64) -> bool {
    let report = Arc::new(Report::new());
    if !wait_all_serving(nodes, Duration::from_secs(60)) {
        eprintln!("soak-cluster: error: no quorum through every node within 60 s of the start");
        return false;
    }
    if args.peer_tls {
        let admins: Vec<SocketAddr> = nodes.lock().iter().map(|n| n.admin).collect();
        for (i, a) in admins.into_iter().enumerate() {
            let tls = http_get(a, "/cluster").and_then(|b| json_bool(&b, "peer_tls"));
            if tls != Some(true) {
                eprintln!(
                    "soak-cluster: error: node {} does not say its peer links are TLS ({tls:?})",
                    i + 1
                );
                return false;
            }
        }
    }
    let (mc, ld, dl) = nodes.addrs();
    let fill_items = crate::fill::items_for(args.fill_mb);
    if fill_items > 0 {
        match crate::fill::fill(&mc, fill_items, FILL_WITHIN) {
            Ok(f) => println!(
                "soak-cluster: filled {} MiB: {} items of {} B through the {} nodes in {:.1} s \
                 ({:.1} MB/s, {} reconnects); the traffic and the faults start now",
                args.fill_mb,
                f.items,
                crate::fill::VALUE_LEN,
                mc.len(),
                f.seconds,
                (f.items * crate::fill::VALUE_LEN as u64) as f64 / f.seconds / 1e6,
                f.retries
            ),
            Err(e) => {
                eprintln!("soak-cluster: error: the fill: {e}");
                return false;
            }
        }
    }
    let settings = Conn::connect(mc[0])
        .map_err(|e| e.to_string())
        .and_then(|mut c| stats(&mut c, "settings").map_err(|e| e.to_string()));
    let settings = match settings {
        Ok(s) => s,
        Err(e) => {
            eprintln!("soak-cluster: error: stats settings: {e}");
            return false;
        }
    };
    let ms = |k: &str, d: u64| Duration::from_millis(settings.get(k).copied().unwrap_or(d));
    let orphan_timeout = ms("lockd_orphan_timeout_ms", 5000);
    let idle_timeout = ms("dlock_idle_timeout_ms", 60000);
    println!(
        "soak-cluster: nodes={} base={} memcache={mc:?} seconds={} clients={}x{} names={} seed={} \
         election_timeout_ms={election} session_timeout_ms={} orphan_timeout_ms={} \
         idle_timeout_ms={} tolerance_ms={}",
        mc.len(),
        nodes.base.display(),
        args.seconds,
        args.clients,
        args.protocols.join(","),
        args.names,
        args.seed,
        session.as_millis(),
        orphan_timeout.as_millis(),
        idle_timeout.as_millis(),
        args.tolerance.as_millis()
    );
    let started = Instant::now();
    let ctx = Arc::new(Ctx {
        memcache: mc.clone(),
        lockd: ld,
        dlock: dl,
        session_timeout: Some(session),
        model: Model::new(args.tolerance, report.clone()).with_session_bound(Some(
            session.saturating_sub(Duration::from_millis(election)),
        )),
        report: report.clone(),
        stop_at: started + Duration::from_secs(args.seconds),
        orphan_timeout,
        idle_timeout,
        tolerance: args.tolerance,
        names: args.names,
        abort: AtomicBool::new(false),
        closes: Default::default(),
    });
    let threads = crate::spawn_clients(args, &ctx, &report);
    let fault_log = Arc::new(FaultLog {
        counts: Default::default(),
        broken: AtomicBool::new(false),
        done: AtomicBool::new(false),
        release: AtomicBool::new(false),
    });
    let fault_thread = {
        let (nodes, log, report) = (nodes.clone(), fault_log.clone(), report.clone());
        let (stop_at, seed) = (ctx.stop_at, args.seed);
        std::thread::Builder::new()
            .name("faults".into())
            .spawn(move || faults(&nodes, &log, &report, stop_at, seed, session))
    };
    let fault_thread = match fault_thread {
        Ok(t) => Some(t),
        Err(e) => {
            report.error(format!("spawn the fault thread: {e}"));
            None
        }
    };

    // Traffic phase: sample the nodes, print progress.
    let mut next_progress = started + PROGRESS_EVERY;
    let join_by = ctx.stop_at + idle_timeout + REPLY_DEADLINE + Duration::from_secs(60);
    while threads.iter().any(|t| !t.is_finished()) {
        std::thread::sleep(SAMPLE_EVERY);
        if fault_log.broken.load(Ordering::Relaxed) {
            ctx.abort.store(true, Ordering::Relaxed);
        }
        let sample = nodes.sample();
        if Instant::now() >= next_progress {
            next_progress += PROGRESS_EVERY;
            progress(&report, started, &sample, &fault_log);
        }
        if Instant::now() > join_by {
            report.error("client threads still running long after the end".into());
            ctx.abort.store(true, Ordering::Relaxed);
            break;
        }
    }
    let faults_by = Instant::now() + Duration::from_secs(120);
    while fault_thread.is_some() && !fault_log.done.load(Ordering::Acquire) {
        if Instant::now() > faults_by {
            report.error("the fault thread did not finish".into());
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for t in threads {
        if t.is_finished() {
            let _ = t.join();
        }
    }
    // The end: heal, every node up and serving, then past every timer nothing may be left.
    nodes.mesh.heal();
    if !wait_all_serving(nodes, RECOVER_WITHIN) {
        report.error("after the faults stopped, not every node serves".into());
    }
    let drain_by = Instant::now()
        + orphan_timeout.max(idle_timeout).max(MAX_LEASE)
        + session
        + Duration::from_secs(20);
    let (mc, _, _) = nodes.addrs();
    let mut last: Vec<Option<std::collections::HashMap<String, u64>>> = vec![None; mc.len()];
    loop {
        for (i, addr) in mc.iter().enumerate() {
            last[i] = Conn::connect(*addr)
                .ok()
                .and_then(|mut c| stats(&mut c, "").ok());
        }
        nodes.sample();
        let done = last.iter().all(|s| {
            s.as_ref().is_some_and(|s| {
                locks_left(s) == 0 && s.get("curr_connections").copied().unwrap_or(0) <= 1
            })
        });
        if done {
            break;
        }
        if Instant::now() > drain_by {
            for (i, s) in last.iter().enumerate() {
                let text = match s {
                    None => "no stats".to_string(),
                    Some(s) => LOCK_STATS
                        .iter()
                        .chain(&["curr_connections"])
                        .map(|k| format!("{k}={}", s.get(*k).copied().unwrap_or(0)))
                        .collect::<Vec<_>>()
                        .join(" "),
                };
                report.error(format!("node {} after the drain: {text}", i + 1));
            }
            for n in nodes.lock().iter() {
                let Some(c) = &n.child else { continue };
                let d = crate::Daemon {
                    child: None,
                    pid: c.pid(),
                    memcache: n.memcache,
                    lockd: n.lockd,
                    dlock: n.dlock,
                };
                eprintln!("soak-cluster: node {}'s connections:", n.id);
                crate::leaked_connections(&d, &ctx, 0);
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // Every node must agree on what is held (nothing).
    let views: Vec<Vec<u64>> = last
        .iter()
        .map(|s| {
            LOCK_STATS
                .iter()
                .map(|k| {
                    s.as_ref()
                        .and_then(|s| s.get(*k).copied())
                        .unwrap_or(u64::MAX)
                })
                .collect()
        })
        .collect();
    if views.windows(2).any(|w| w[0] != w[1]) {
        report.error(format!("the nodes disagree on the lock tables: {views:?}"));
    }
    let locks: u64 = last.iter().flatten().map(locks_left).sum();
    let sample = nodes.sample();
    let dirs: Vec<u64> = nodes.lock().iter().map(|n| dir_kib(&n.dir)).collect();
    let peaks: Vec<u64> = nodes.lock().iter().map(|n| n.peak_rss).collect();
    for (i, &kib) in dirs.iter().enumerate() {
        if kib > args.max_data_dir_kib {
            report.error(format!(
                "node {}'s data directory holds {kib} KiB (more than {} KiB)",
                i + 1,
                args.max_data_dir_kib
            ));
        }
    }
    for &(id, rss, _) in &sample {
        if rss > args.max_node_rss_kib {
            report.error(format!(
                "node {id}'s RSS is {rss} KiB at the end (more than {} KiB)",
                args.max_node_rss_kib
            ));
        }
    }
    // The fill's items outlived the faults on every node.
    let mut fill_checked = 0;
    if fill_items > 0 {
        let (checked, errors) = crate::fill::check(&mc, fill_items, args.seed);
        fill_checked = checked;
        for e in errors.into_iter().take(20) {
            report.error(e);
        }
    }
    let refused = cluster_u64(nodes, "peer_refused");
    // Every node must stop cleanly on SIGTERM; then the fault thread may end.
    for e in nodes.stop_all() {
        report.error(e);
    }
    fault_log.release.store(true, Ordering::Release);
    if let Some(t) = fault_thread {
        let _ = t.join();
    }
    let pass = report.failures() == 0 && locks == 0;
    let counters: Vec<String> = report
        .c
        .snapshot()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    println!("soak-cluster: clients {}", counters.join(" "));
    let c = &report.c;
    let grants = c.mc_grants.load(Ordering::Relaxed)
        + c.lockd_grants.load(Ordering::Relaxed)
        + c.lockd_adoptions.load(Ordering::Relaxed)
        + c.dlock_grants.load(Ordering::Relaxed);
    let list = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    println!(
        "soak-cluster: seconds={} nodes={} ops={} grants={grants} double_grants={} \
         token_violations={} tokens_checked={} errors={} no_quorum={} closed_by_node={} \
         past_session_bound={} faults={} locks_left={locks} data_dir_kib={} rss_peak_kib={} \
         rss_end_kib={} peer_tls={} peer_refused={} fill_mib={} fill_checked={fill_checked} \
         result={}",
        args.seconds,
        mc.len(),
        report.ops.load(Ordering::Relaxed),
        report.double_grants.load(Ordering::Relaxed),
        report.token_violations.load(Ordering::Relaxed),
        c.tokens_checked.load(Ordering::Relaxed),
        report.errors.load(Ordering::Relaxed),
        c.no_quorum.load(Ordering::Relaxed),
        c.closed_by_node.load(Ordering::Relaxed),
        c.past_session_bound.load(Ordering::Relaxed),
        fault_log.summary(),
        list(&dirs),
        list(&peaks),
        list(&sample.iter().map(|s| s.1).collect::<Vec<_>>()),
        if args.peer_tls { "on" } else { "off" },
        refused
            .iter()
            .map(|r| r.map_or("-".to_string(), |v| v.to_string()))
            .collect::<Vec<_>>()
            .join(","),
        args.fill_mb,
        if pass { "PASS" } else { "FAIL" }
    );
    pass
}

fn progress(report: &Report, started: Instant, sample: &[(usize, u64, bool)], faults: &FaultLog) {
    let secs = started.elapsed().as_secs_f64();
    let ops = report.ops.load(Ordering::Relaxed);
    let c = &report.c;
    let rss: Vec<String> = sample
        .iter()
        .map(|(id, rss, up)| format!("{id}:{}", if *up { rss.to_string() } else { "down".into() }))
        .collect();
    println!(
        "soak-cluster: t={secs:.0}s ops={ops} ops_per_s={:.0} double_grants={} \
         token_violations={} errors={} no_quorum={} closed_by_node={} faults={} rss_kib={}",
        ops as f64 / secs,
        report.double_grants.load(Ordering::Relaxed),
        report.token_violations.load(Ordering::Relaxed),
        report.errors.load(Ordering::Relaxed),
        c.no_quorum.load(Ordering::Relaxed),
        c.closed_by_node.load(Ordering::Relaxed),
        faults.summary(),
        rss.join(",")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_numbers_of_the_cluster_status_are_found() {
        let body = "{\n  \"applied\": 17,\n  \"leader\": 2,\n  \"term\": 3\n}\n";
        assert_eq!(json_u64(body, "leader"), Some(2));
        assert_eq!(json_u64(body, "applied"), Some(17));
        assert_eq!(json_u64(body, "missing"), None);
        assert_eq!(json_u64("{\"leader\": null}", "leader"), None);
    }

    #[test]
    fn flags_give_the_last_value() {
        let f: Vec<String> = [
            "--session-timeout",
            "900",
            "--x",
            "--session-timeout",
            "800",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(flag_ms(&f, "--session-timeout"), Some(800));
        assert_eq!(flag_ms(&f, "--election-timeout"), None);
    }
}
