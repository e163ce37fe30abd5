//! Cluster mode with real processes on loopback: three daemons started with `--peers`, clients
//! on every node, a node stopped and restarted with its data directory.
//!
//! Each test picks its own peer ports and data directories (under the system's temporary
//! directory, removed at the end) and stops only the daemons it started.

mod common;
#[path = "../tools/soak/proxy.rs"]
mod proxy;

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Client, Daemon};
use holdfast::proto::lockd as ld;

/// Short, so that the tests elect quickly; long enough for a loaded 2-core machine.
const ELECTION_MS: &str = "300";

struct Cluster {
    peers: String,
    dirs: Vec<PathBuf>,
    nodes: Vec<Option<Daemon>>,
    extra: Vec<String>,
    /// Set by [`Cluster::start_proxied`]: every peer link goes through a proxy of its own.
    mesh: Option<proxy::Mesh>,
    /// Flags of one node each (its peer TLS certificate), after `extra`.
    node_flags: Vec<Vec<String>>,
    /// Set by [`Cluster::start_tls`]: the peer CA and where its files are.
    pki: Option<Pki>,
}

/// The peer TLS files of a test cluster.
struct Pki {
    dir: PathBuf,
    ca: holdfast_testkit::pki::Ca,
    ca_path: PathBuf,
}

impl Pki {
    /// A CA in `dir`, a certificate for 127.0.0.1 per node, and each node's flags: node i's
    /// certificate is the CA's, except for the nodes in `foreign`, whose certificate is of
    /// another CA (they trust the cluster's CA all the same).
    fn create(dir: &Path, n: usize, foreign: &[usize]) -> (Pki, Vec<Vec<String>>) {
        std::fs::create_dir_all(dir).expect("pki directory");
        let ca = holdfast_testkit::pki::Ca::new("holdfast test peer CA");
        let ca_path = ca.write(&dir.join("ca.pem"));
        let other = holdfast_testkit::pki::Ca::new("a foreign CA");
        let flags = (1..=n)
            .map(|i| {
                let signer = if foreign.contains(&i) { &other } else { &ca };
                let cert = signer.issue(dir, &format!("node{i}"), &["127.0.0.1"]);
                [
                    ("--peer-tls-cert", &cert.cert),
                    ("--peer-tls-key", &cert.key),
                    ("--peer-tls-ca", &ca_path),
                ]
                .iter()
                .flat_map(|(f, p)| [f.to_string(), p.to_string_lossy().into_owned()])
                .collect()
            })
            .collect();
        let pki = Pki {
            dir: dir.to_path_buf(),
            ca,
            ca_path,
        };
        (pki, flags)
    }

    /// A TLS client of a node's peer port with a certificate of the cluster's CA: the
    /// handshake done.
    fn client(&self, addr: SocketAddr) -> holdfast::tls::ClientStream {
        let cert = self.ca.issue(&self.dir, "intruder", &["127.0.0.1"]);
        let config =
            holdfast::tls::client_config(Some(&self.ca_path), Some((&cert.cert, &cert.key)))
                .expect("client config");
        let tcp = std::net::TcpStream::connect(addr).expect("connect to the peer port");
        tcp.set_read_timeout(Some(common::DEADLINE))
            .expect("timeout");
        let name = holdfast::tls::server_name("127.0.0.1").expect("name");
        holdfast::tls::connect_blocking(config, name, tcp).expect("handshake")
    }
}

/// A port for a node's peer listener, free when asked. Drawn below Linux's ephemeral range
/// (32768-60999): a port the kernel handed out for `bind(0)` or an outgoing connection (every
/// other test's daemons make many) can be taken again before the node binds it, and a node
/// then failed to start with "Address already in use" under parallel tests.
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let seed = u64::from(std::process::id()) << 20 ^ DRAWS.fetch_add(1, Ordering::Relaxed);
    for k in 0..10_000u64 {
        // A multiplicative hash of (seed, k) over 20000..32000.
        let x = (seed ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let port = 20_000 + (x >> 40) as u16 % 12_000;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 20000..32000")
}

impl Cluster {
    fn start(n: usize, name: &str, extra: &[&str]) -> Cluster {
        Cluster::start_prepared(n, name, extra, |_| {})
    }

    /// Like [`Cluster::start`], with `prepare` run on the data directories (created, empty)
    /// before any node starts.
    fn start_prepared(
        n: usize,
        name: &str,
        extra: &[&str],
        prepare: impl FnOnce(&[PathBuf]),
    ) -> Cluster {
        Cluster::start_with(n, name, extra, prepare, false)
    }

    /// Started with every peer link (i -> j) through a fault-injecting proxy
    /// (`tools/soak/proxy.rs`), and committing through every node.
    fn start_proxied(n: usize, name: &str, extra: &[&str]) -> Cluster {
        let c = Cluster::start_with(n, name, extra, |_| {}, true);
        for id in 1..=n {
            wait_for_quorum(c.node(id).memcache.expect("memcache"));
        }
        c
    }

    /// With peer TLS: every node has a certificate of one CA, except those in `foreign` (see
    /// [`Pki::create`]). Proxied or not; committing through every node that is not foreign.
    fn start_tls(
        n: usize,
        name: &str,
        extra: &[&str],
        proxied: bool,
        foreign: &[usize],
    ) -> Cluster {
        let c = Cluster::start_full(n, name, extra, |_| {}, proxied, Some(foreign));
        for id in (1..=n).filter(|i| !foreign.contains(i)) {
            wait_for_quorum(c.node(id).memcache.expect("memcache"));
        }
        c
    }

    fn start_with(
        n: usize,
        name: &str,
        extra: &[&str],
        prepare: impl FnOnce(&[PathBuf]),
        proxied: bool,
    ) -> Cluster {
        Cluster::start_full(n, name, extra, prepare, proxied, None)
    }

    /// `tls`: peer TLS, with these nodes' certificates of a foreign CA.
    fn start_full(
        n: usize,
        name: &str,
        extra: &[&str],
        prepare: impl FnOnce(&[PathBuf]),
        proxied: bool,
        tls: Option<&[usize]>,
    ) -> Cluster {
        let mut c = Cluster::define(n, name, extra, prepare, proxied, tls);
        for i in 1..=n {
            c.restart(i);
        }
        c
    }

    /// A cluster of `n` nodes with their ports and data directories, none of them running yet
    /// (each starts with [`Cluster::restart`]).
    fn define(
        n: usize,
        name: &str,
        extra: &[&str],
        prepare: impl FnOnce(&[PathBuf]),
        proxied: bool,
        tls: Option<&[usize]>,
    ) -> Cluster {
        let peers: Vec<String> = (1..=n)
            .map(|i| format!("{i}=127.0.0.1:{}", free_port()))
            .collect();
        let base = std::env::temp_dir().join(format!("holdfast-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let dirs: Vec<PathBuf> = (1..=n).map(|i| base.join(format!("node{i}"))).collect();
        for d in &dirs {
            std::fs::create_dir_all(d).expect("data directory");
        }
        prepare(&dirs);
        let (pki, node_flags) = match tls {
            Some(foreign) => {
                let (pki, flags) = Pki::create(&base.join("pki"), n, foreign);
                (Some(pki), flags)
            }
            None => (None, Vec::new()),
        };
        let mesh = proxied.then(|| {
            let real: Vec<SocketAddr> = peers
                .iter()
                .filter_map(|p| p.split_once('=').and_then(|(_, a)| a.parse().ok()))
                .collect();
            // The proxies bind port 0: the kernel may hand one a peer port just released by
            // free_port; then start them again.
            loop {
                let mesh = proxy::Mesh::start(&real).expect("start the peer proxies");
                let taken = (1..=n).any(|i| {
                    (1..=n)
                        .filter(|&j| j != i)
                        .any(|j| real.contains(&mesh.link(i, j).addr()))
                });
                if !taken {
                    break mesh;
                }
            }
        });
        Cluster {
            peers: peers.join(","),
            dirs,
            nodes: (0..n).map(|_| None).collect(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            mesh,
            node_flags,
            pki,
        }
    }

    /// Started, and committing through every node.
    fn start_ready(n: usize, name: &str, extra: &[&str]) -> Cluster {
        let c = Cluster::start(n, name, extra);
        for id in 1..=n {
            wait_for_quorum(c.node(id).memcache.expect("memcache"));
        }
        c
    }

    fn spawn(&self, id: usize) -> Daemon {
        let id_s = id.to_string();
        let dir = self.dirs[id - 1].to_string_lossy().into_owned();
        let peers = match &self.mesh {
            Some(m) => m.peers_for(id),
            None => self.peers.clone(),
        };
        let mut args = vec![
            "--peers",
            &peers,
            "--node-id",
            &id_s,
            "--data-dir",
            &dir,
            "--election-timeout",
            ELECTION_MS,
        ];
        args.extend(self.extra.iter().map(String::as_str));
        if let Some(flags) = self.node_flags.get(id - 1) {
            args.extend(flags.iter().map(String::as_str));
        }
        Daemon::start(&args)
    }

    /// Where node `id` listens for its peers (its own `--peers` entry).
    fn peer_addr(&self, id: usize) -> SocketAddr {
        self.peers
            .split(',')
            .find_map(|p| {
                p.split_once('=')
                    .filter(|(i, _)| *i == id.to_string())
                    .and_then(|(_, a)| a.parse().ok())
            })
            .expect("the node's peer address")
    }

    fn node(&self, id: usize) -> &Daemon {
        self.nodes[id - 1].as_ref().expect("node running")
    }

    fn stop(&mut self, id: usize) {
        if let Some(d) = self.nodes[id - 1].take() {
            d.terminate();
        }
    }

    /// Stop node `id` if it runs, and start it (again) on its data directory.
    fn restart(&mut self, id: usize) {
        self.stop(id);
        let d = self.spawn(id);
        self.nodes[id - 1] = Some(d);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for d in self.nodes.iter_mut().filter_map(Option::take) {
            // A test that failed while it had a node stopped (SIGSTOP) must not leave it
            // stopped: a stopped process does not act on SIGTERM.
            // SAFETY: signalling a child process this test started and has not reaped.
            unsafe { libc::kill(d.pid() as libc::pid_t, libc::SIGCONT) };
            d.terminate();
        }
        for d in &self.dirs {
            // A test may have mounted a small file system there; nothing else is mounted.
            let _ = std::process::Command::new("umount")
                .arg(d)
                .stderr(std::process::Stdio::null())
                .status();
        }
        if let Some(base) = self.dirs.first().and_then(|d| d.parent()) {
            let _ = std::fs::remove_dir_all(base);
        }
    }
}

fn frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    ld::encode(&mut out, opcode, payload);
    out
}

/// One old-protocol reply: (opcode, payload).
fn lockd_reply(c: &mut Client) -> (u8, Vec<u8>) {
    let h = c.take(ld::HEADER_LEN);
    let len = (u32::from_be_bytes([h[0], h[1], h[2], h[3]]) & 0xf_ffff) as usize;
    let mut whole = h.clone();
    whole.extend_from_slice(&c.take(len));
    let (f, n) = ld::parse(&whole).expect("an old-protocol frame");
    assert_eq!(n, whole.len());
    (f.opcode, f.payload.to_vec())
}

/// A node's view of the cluster (`holdfast cluster status`).
fn status(d: &Daemon) -> serde_json::Value {
    let admin = d.admin.expect("admin").to_string();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(["cluster", "status", "--admin", &admin])
        .output()
        .expect("run holdfast cluster status");
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// The leader every running node names (waiting until they agree on one).
fn leader(c: &Cluster) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let named: Vec<u64> = c
            .nodes
            .iter()
            .flatten()
            .map(|d| status(d)["leader"].as_u64().unwrap_or(0))
            .collect();
        if named[0] != 0 && named.iter().all(|&l| l == named[0]) {
            return named[0] as usize;
        }
        assert!(Instant::now() < deadline, "no agreed leader: {named:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Wait until every thread of `pid` is stopped: a SIGSTOP is delivered asynchronously, and a
/// thread running on the other core may still serve a request sent right after `kill`.
/// One request on a new connection to `addr`: its reply line, or None if the connection
/// closed (or timed out) first.
fn lock_once(addr: &std::net::SocketAddr, request: &[u8]) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(request).ok()?;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        match s.read(&mut byte) {
            Ok(1) => line.push(byte[0]),
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&line).into_owned())
}

fn wait_stopped(pid: libc::pid_t) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stopped = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|tasks| {
                tasks.flatten().all(|t| {
                    std::fs::read_to_string(t.path().join("stat"))
                        .ok()
                        .and_then(|st| st.rsplit_once(") ").map(|(_, r)| r.starts_with('T')))
                        .unwrap_or(true)
                })
            })
            .unwrap_or(false);
        if stopped {
            return;
        }
        assert!(Instant::now() < deadline, "{pid} did not stop");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn kill9(d: &Daemon) {
    // SAFETY: signalling a child process this test started and has not reaped.
    assert_eq!(
        unsafe { libc::kill(d.pid() as libc::pid_t, libc::SIGKILL) },
        0
    );
}

/// Send an old-protocol request about `name` and return the reply's opcode (checking that the
/// reply echoes the name).
fn ask(c: &mut Client, opcode: u8, name: &[u8]) -> u8 {
    c.send(&frame(opcode, name));
    reply_to(c, name)
}

/// The next old-protocol reply, which must be about `name`: its opcode.
fn reply_to(c: &mut Client, name: &[u8]) -> u8 {
    let (op, payload) = lockd_reply(c);
    assert_eq!(payload, name, "reply {op} about another name");
    op
}

/// Wait until the cluster commits: a `set` through `addr` answered STORED (a no-quorum answer
/// closes the connection; the next try opens another).
/// Until `addr`'s node stores a value through the log. While the cluster forms, the node
/// answers no quorum; and a node without a confirmed contact with a quorum for its fence time
/// since it started counts as cut off: it closes its clients' connections (fencing,
/// `docs/cluster.md`), and its workers close a connection rather than write a reply the log decided
/// before the node's first confirmed contact (the write deadline). With a 300 ms election
/// timeout the fence time is 750 ms, which a first election that splits its votes can pass.
/// Each of those is asked again on a new connection.
fn wait_for_quorum(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match mc_once(addr, b"set warmup 0 0 1\r\nx\r\n").as_deref() {
            Some("STORED\r\n") => return,
            Some(line) => assert_eq!(line, "SERVER_ERROR no quorum\r\n"),
            None => {}
        }
        assert!(Instant::now() < deadline, "no quorum within 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A node's owner drives raft on a thread of its own, which asks for the scheduler's shortest
/// slice like the I/O workers; the node's other threads (peer links, snapshot, compaction and
/// install helpers) keep the default. Checked on a kernel that grants such a request.
#[test]
fn a_nodes_owner_and_workers_ask_for_the_shortest_scheduler_slice() {
    if !common::kernel_grants_slices() {
        eprintln!("this kernel grants no slice requests: nothing to check");
        return;
    }
    let cluster = Cluster::start_ready(1, "slice", &["--threads", "2"]);
    let expected = ["holdfast-owner", "holdfast-worker", "holdfast-worker"]
        .map(|c| (c.to_string(), holdfast::slice::SERVING_THREAD_NANOS))
        .to_vec();
    let (serving, others) = common::serving_threads_once_they_are(cluster.node(1).pid(), &expected);
    assert_eq!(serving, expected);
    assert!(!others.is_empty(), "a node has helper threads");
    for (comm, slice) in others {
        assert_ne!(slice, holdfast::slice::SERVING_THREAD_NANOS, "{comm}");
    }
}

#[test]
fn a_lock_taken_through_one_node_is_held_on_every_node_and_tokens_grow_across_nodes() {
    let cluster = Cluster::start_ready(3, "one-lock", &[]);
    // old protocol: node 1 holds "job"; nodes 2 and 3 see it taken.
    let mut a = cluster.node(1).lockd();
    assert_eq!(ask(&mut a, ld::op::ACQ, b"job\0"), ld::op::ACQUIRED);
    let mut b = cluster.node(2).lockd();
    assert_eq!(ask(&mut b, ld::op::TRY, b"job\0"), ld::op::WBLOCK);
    // A blocking ACQ through node 3 waits, and is granted when node 1's holder releases.
    let mut c = cluster.node(3).lockd();
    assert_eq!(ask(&mut c, ld::op::ACQ, b"job\0"), ld::op::ACK);
    assert_eq!(ask(&mut a, ld::op::REL, b"job\0"), ld::op::RELEASED);
    assert_eq!(reply_to(&mut c, b"job\0"), ld::op::ACQUIRED);
    // Fencing tokens: one counter for the whole cluster, growing whichever node grants.
    let mut tokens = Vec::new();
    for id in [3, 1, 2] {
        let mut m = cluster.node(id).memcache();
        let key = format!("item{id}");
        m.expect(
            format!("set {key} 0 0 1\r\nv\r\n").as_bytes(),
            b"STORED\r\n",
        );
        m.expect(format!("lock {key}\r\n").as_bytes(), b"OK\r\n");
        m.send(format!("lock_token {key}\r\n").as_bytes());
        let line = m.line();
        let token: u64 = line
            .strip_prefix("TOKEN ")
            .and_then(|t| t.trim_end().parse().ok())
            .unwrap_or_else(|| panic!("lock_token answered {line:?}"));
        tokens.push(token);
        // Another node sees the item locked.
        let other = if id == 1 { 2 } else { 1 };
        let mut o = cluster.node(other).memcache();
        o.expect(format!("lock {key}\r\n").as_bytes(), b"LOCKED\r\n");
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens {tokens:?} must grow"
    );
    // `holdfast cluster status`: one leader, whom every node names.
    let mut leaders = Vec::new();
    let mut roles = Vec::new();
    for id in 1..=3 {
        let v = status(cluster.node(id));
        assert_eq!(v["node"], id as u64);
        assert_eq!(v["peers"].as_array().map(Vec::len), Some(3));
        assert_eq!(v["fenced"], false);
        leaders.push(v["leader"].as_u64().expect("leader"));
        roles.push(v["role"].as_str().expect("role").to_string());
    }
    assert!(
        leaders.iter().all(|&l| l == leaders[0] && l != 0),
        "{leaders:?}"
    );
    assert_eq!(roles[leaders[0] as usize - 1], "leader", "{roles:?}");
    assert_eq!(
        roles.iter().filter(|r| *r == "leader").count(),
        1,
        "{roles:?}"
    );
}

#[test]
fn a_restarted_node_rejoins_and_its_old_connections_locks_become_orphans() {
    // Orphans wait 1 s for an ADOPT, then go to the next in the queue.
    let mut cluster = Cluster::start_ready(3, "restart", &["--orphan-timeout", "1000"]);
    let mut a = cluster.node(1).lockd();
    assert_eq!(ask(&mut a, ld::op::ACQ, b"job\0"), ld::op::ACQUIRED);
    let mut b = cluster.node(2).lockd();
    assert_eq!(ask(&mut b, ld::op::ACQ, b"job\0"), ld::op::ACK);
    // Node 1 goes away and comes back with its data directory: its earlier run's connection
    // is gone, so "job" becomes an orphan, and after the orphan timeout node 2's waiter has it.
    cluster.restart(1);
    let started = Instant::now();
    assert_eq!(reply_to(&mut b, b"job\0"), ld::op::ACQUIRED);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "granted {:?} after the restart: before the orphan timeout",
        started.elapsed()
    );
    // The restarted node serves again, and sees the lock held.
    wait_for_quorum(cluster.node(1).memcache.expect("memcache"));
    let mut c = cluster.node(1).lockd();
    assert_eq!(ask(&mut c, ld::op::TRY, b"job\0"), ld::op::WBLOCK);
}

#[test]
fn two_nodes_of_three_keep_serving_and_one_alone_answers_no_quorum() {
    let base = std::env::temp_dir().join(format!("holdfast-poncio-{}", std::process::id()));
    let _ = std::fs::remove_file(&base);
    let program = format!(
        "echo \"$HOLDFAST_EVENT $HOLDFAST_NODE_ID\" >> {}",
        base.display()
    );
    let mut cluster = Cluster::start_ready(
        3,
        "minority",
        &["--session-timeout", "900", "--on-quorum-loss", &program],
    );
    // A client of node 1 that will be fenced off when node 1 is alone.
    let mut idle = cluster.node(1).memcache();
    idle.expect(b"set idle 0 0 1\r\nv\r\n", b"STORED\r\n");
    cluster.stop(3);
    // Two of three: a quorum, whoever led before.
    wait_for_quorum(cluster.node(1).memcache.expect("memcache"));
    let mut m = cluster.node(2).memcache();
    m.expect(b"set k 0 0 1\r\nv\r\n", b"STORED\r\n");
    m.expect(b"lock k\r\n", b"OK\r\n");
    cluster.stop(2);
    // One of three: no grant; the no-quorum answers, within 2 x the election timeout (plus
    // slack for a loaded machine), and the connection closed.
    let node = cluster.node(1);
    let mut m = node.memcache();
    let asked = Instant::now();
    m.send(b"lock k\r\n");
    assert_eq!(m.line(), "SERVER_ERROR no quorum\r\n");
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "{:?}",
        asked.elapsed()
    );
    m.expect_closed();
    let mut l = node.lockd();
    assert_eq!(ask(&mut l, ld::op::TRY, b"other\0"), ld::op::ERR);
    // Both answers counted.
    let answered = metric(
        &metrics(node),
        "holdfast_cluster_no_quorum_answers_total",
        "",
    );
    assert!(answered >= 2.0, "{answered}");
    // Cut off for the session timeout less an election timeout, node 1 has fenced itself:
    // its earlier client's connection is closed, and the operator's program was told.
    idle.expect_closed();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let told = std::fs::read_to_string(&base).unwrap_or_default();
        if told.lines().any(|l| l == "quorum-lost 1") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "on-quorum-loss not run: {told:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(&base);
}

/// A node whose peers never started answers every request with no quorum within two election
/// timeouts, for as long as it is alone: many more requests than it keeps proposals in flight
/// (8), from three clients at once, spread over seconds, each on a connection that the answer
/// closes, and binary pipelines answered in order. Then its peers start and it serves again.
#[test]
fn a_node_alone_answers_every_request_no_quorum_in_time_for_as_long_as_it_is_alone() {
    use common::mcbin;
    const CLIENTS: usize = 3;
    const ROUNDS: usize = 9;
    let mut cluster = Cluster::define(3, "alone", &[], |_| {}, false, None);
    cluster.restart(3);
    let addr = cluster.node(3).memcache.expect("memcache");
    let election = Duration::from_millis(ELECTION_MS.parse().expect("election timeout"));
    let within = 2 * election + SLACK;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|t| {
            std::thread::spawn(move || {
                let mut keys = Vec::new();
                for round in 0..ROUNDS {
                    let key = format!("alone{t}x{round}");
                    let mut c = Client::connect(addr);
                    let asked = Instant::now();
                    if round % 3 == 2 {
                        // A pipeline in one write: every answer, in order.
                        let frames: Vec<u8> = (0..3u32)
                            .flat_map(|i| {
                                let k = format!("{key}p{i}");
                                mcbin::request(0x01, &[0; 8], k.as_bytes(), b"v", i, 0)
                            })
                            .collect();
                        c.send(&frames);
                        for i in 0..3u32 {
                            let r = mcbin::read(&mut c);
                            assert_eq!((r.status, r.opaque), (0x0086, i), "{key}: {r:?}");
                            assert_eq!(r.value, b"no quorum");
                            keys.push(format!("{key}p{i}"));
                        }
                    } else {
                        c.send(format!("set {key} 0 0 1\r\nv\r\n").as_bytes());
                        assert_eq!(
                            try_line(&mut c).as_deref(),
                            Some("SERVER_ERROR no quorum\r\n")
                        );
                        keys.push(key.clone());
                    }
                    let took = asked.elapsed();
                    assert!(took < within, "{key} answered after {took:?}");
                    c.expect_closed();
                    std::thread::sleep(Duration::from_millis(250));
                }
                keys
            })
        })
        .collect();
    let mut refused = Vec::new();
    for c in clients {
        refused.extend(c.join().expect("a client of the lone node"));
    }
    assert!(refused.len() > 3 * 8, "{}", refused.len());
    // Its peers start: it serves through the log again.
    cluster.restart(1);
    cluster.restart(2);
    wait_for_quorum(addr);
    let mut c = cluster.node(3).memcache();
    c.expect(b"set after 0 0 1\r\nv\r\n", b"STORED\r\n");
    c.expect(b"get after\r\n", b"VALUE after 0 1\r\nv\r\nEND\r\n");
    // None of the requests it refused was applied: no proposal of this node ever reached a
    // leader while it was alone, and what it had queued was never proposed.
    for key in &refused {
        c.expect(format!("get {key}\r\n").as_bytes(), b"END\r\n");
    }
}

#[test]
fn a_paused_nodes_sessions_expire_on_the_majority_and_it_fences_itself_on_waking() {
    let cluster = Cluster::start_ready(3, "pause", &["--session-timeout", "900"]);
    let mut holder = cluster.node(3).memcache();
    holder.expect(b"set job 0 0 1\r\nv\r\n", b"STORED\r\n");
    holder.expect(b"lock job\r\n", b"OK\r\n");
    let mut other = cluster.node(1).memcache();
    other.expect(b"lock job\r\n", b"LOCKED\r\n");
    let pid = cluster.node(3).pid() as libc::pid_t;
    // SAFETY: signalling a child process this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    wait_stopped(pid);
    let paused = Instant::now();
    // The majority expires node 3's sessions after the session timeout: the lock is free. If
    // node 3 led, node 1 waits for an election; one slower than the session timeout (a loaded
    // machine) makes node 1 fence itself and close its clients: then ask again on a new
    // connection.
    drop(other);
    loop {
        match lock_once(&cluster.node(1).memcache_addr(), b"lock job\r\n") {
            Some(line) if line == "OK\r\n" => break,
            Some(line) => assert!(
                line == "LOCKED\r\n" || line.starts_with("SERVER_ERROR"),
                "{line:?}"
            ),
            None => {}
        }
        assert!(paused.elapsed() < Duration::from_secs(15), "never expired");
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = paused.elapsed();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    assert!(
        took >= Duration::from_millis(850),
        "node 3's lock was given away {took:?} after it stopped: before the session timeout"
    );
    // Node 3 wakes, finds it has been cut off, and closes its client: the client learns it
    // lost the lock.
    holder.expect_closed();
}

#[test]
fn the_leader_killed_with_sigkill_leaves_its_locks_and_the_service_to_the_survivors() {
    let mut cluster = Cluster::start_ready(3, "kill-leader", &[]);
    let dead = leader(&cluster);
    let (f1, f2) = match dead {
        1 => (2, 3),
        2 => (1, 3),
        _ => (1, 2),
    };
    // A lock held through a follower, a waiter queued through the other.
    let mut holder = cluster.node(f1).lockd();
    assert_eq!(ask(&mut holder, ld::op::ACQ, b"job\0"), ld::op::ACQUIRED);
    let mut waiter = cluster.node(f2).lockd();
    assert_eq!(ask(&mut waiter, ld::op::ACQ, b"job\0"), ld::op::ACK);
    kill9(cluster.node(dead));
    // The survivors elect a leader and go on: the lock is still held, the queue kept.
    wait_for_quorum(cluster.node(f2).memcache.expect("memcache"));
    let mut probe = cluster.node(f2).lockd();
    assert_eq!(ask(&mut probe, ld::op::TRY, b"job\0"), ld::op::WBLOCK);
    assert_eq!(ask(&mut holder, ld::op::REL, b"job\0"), ld::op::RELEASED);
    assert_eq!(reply_to(&mut waiter, b"job\0"), ld::op::ACQUIRED);
    // The killed node restarts with its data directory and catches up.
    cluster.restart(dead);
    wait_for_quorum(cluster.node(dead).memcache.expect("memcache"));
    let mut late = cluster.node(dead).lockd();
    assert_eq!(ask(&mut late, ld::op::TRY, b"job\0"), ld::op::WBLOCK);
}

#[test]
fn five_nodes_keep_serving_with_two_killed_and_stop_granting_with_three() {
    let cluster = Cluster::start_ready(5, "five", &[]);
    kill9(cluster.node(4));
    kill9(cluster.node(5));
    for id in 1..=3 {
        wait_for_quorum(cluster.node(id).memcache.expect("memcache"));
    }
    let mut a = cluster.node(1).lockd();
    assert_eq!(ask(&mut a, ld::op::ACQ, b"job\0"), ld::op::ACQUIRED);
    let mut b = cluster.node(3).lockd();
    assert_eq!(ask(&mut b, ld::op::TRY, b"job\0"), ld::op::WBLOCK);
    kill9(cluster.node(3));
    // Two of five: no quorum, nothing granted.
    let mut c = cluster.node(2).lockd();
    assert_eq!(ask(&mut c, ld::op::TRY, b"free\0"), ld::op::ERR);
}

/// A node whose disk fills up stops (exit status 74, EX_IOERR) rather than acknowledge what it
/// could not make durable; the other two go on, and every write they acknowledged is there.
/// Node 1's data directory is a 1 MiB tmpfs (this needs root, as the machine's tests run).
#[test]
fn a_node_whose_disk_fills_stops_and_the_others_keep_every_acknowledged_write() {
    let mut mounted = true;
    let mut cluster = Cluster::start_prepared(3, "full-disk", &[], |dirs| {
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(&dirs[0])
            .status()
            .is_ok_and(|s| s.success());
        mounted = ok;
    });
    assert!(
        mounted,
        "cannot mount a tmpfs for node 1's data directory (not root?)"
    );
    for id in 1..=3 {
        wait_for_quorum(cluster.node(id).memcache.expect("memcache"));
    }
    // 100 KiB values through node 2 until node 1 has stopped.
    let value = vec![b'v'; 100 * 1024];
    let mut stored = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut m = cluster.node(2).memcache();
    let mut i = 0;
    while cluster.nodes[0].as_mut().is_some_and(|d| d.is_running()) {
        assert!(Instant::now() < deadline, "node 1 never stopped");
        let key = format!("big{i}");
        m.send(format!("set {key} 0 0 {}\r\n", value.len()).as_bytes());
        m.send(&value);
        m.send(b"\r\n");
        match m.line().as_str() {
            "STORED\r\n" => stored.push(key),
            "SERVER_ERROR no quorum\r\n" => m = cluster.node(2).memcache(),
            other => panic!("{other:?}"),
        }
        i += 1;
    }
    let status = cluster.nodes[0].take().expect("node 1").terminate();
    assert_eq!(status.code(), Some(74), "{status:?}");
    assert!(!stored.is_empty());
    // The survivors hold every acknowledged write.
    wait_for_quorum(cluster.node(3).memcache.expect("memcache"));
    let mut r = cluster.node(3).memcache();
    for key in &stored {
        r.send(format!("get {key}\r\n").as_bytes());
        let head = r.line();
        assert_eq!(head, format!("VALUE {key} 0 {}\r\n", value.len()));
        assert_eq!(r.take(value.len() + 2).len(), value.len() + 2);
        assert_eq!(r.line(), "END\r\n");
    }
}

/// `holdfast cluster add|remove ...` through `d`'s admin port: its exit status and output.
fn cluster_cli(d: &Daemon, args: &[&str]) -> std::process::Output {
    let admin = d.admin.expect("admin").to_string();
    std::process::Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .arg("cluster")
        .args(args)
        .args(["--admin", &admin])
        .output()
        .expect("run holdfast cluster")
}

fn ids(v: &serde_json::Value, key: &str) -> Vec<u64> {
    v[key]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x.as_u64()).collect())
        .unwrap_or_default()
}

/// Replacing a dead node (`docs/operations.md`): a node whose data directory is lost is removed, and a
/// new node (a new id, `--join`, an empty directory) is added while the cluster serves; it
/// catches up from a snapshot and serves the same locks. The removed node, started again,
/// is refused by the others and never grants; a live node removed stops by itself.
#[test]
fn a_wiped_node_is_removed_and_a_new_node_joins_from_a_snapshot() {
    let mut cluster = Cluster::start_ready(3, "membership", &[]);
    let lead = leader(&cluster);
    let victim = if lead == 3 { 2 } else { 3 };
    let survivor = 6 - lead - victim;
    // State the new node must get: a held old-protocol lock and an item.
    let mut holder = cluster.node(lead).lockd();
    assert_eq!(ask(&mut holder, ld::op::ACQ, b"kept\0"), ld::op::ACQUIRED);
    let mut m = cluster.node(survivor).memcache();
    m.expect(b"set item 0 0 5\r\nhello\r\n", b"STORED\r\n");

    // The victim dies and its data directory is lost.
    kill9(cluster.node(victim));
    cluster.nodes[victim - 1] = None;
    let dir = cluster.dirs[victim - 1].clone();
    std::fs::remove_dir_all(&dir).expect("wipe");
    std::fs::create_dir_all(&dir).expect("recreate");

    // Bad requests are refused with a reason; the process says what it proposes.
    let out = cluster_cli(cluster.node(lead), &["remove", "9"]);
    assert!(!out.status.success(), "removing a stranger: {out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a member"),
        "{out:?}"
    );
    let out = cluster_cli(cluster.node(lead), &["remove", &victim.to_string()]);
    assert!(out.status.success(), "remove: {out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let mut want: Vec<u64> = vec![lead as u64, survivor as u64];
    want.sort();
    assert_eq!(ids(&v, "voters"), want);
    assert!(ids(&v, "voters_outgoing").is_empty());

    // A new node, id 4, started with --join and an empty directory, then added.
    let port = free_port();
    let dir4 = dir.parent().expect("base").join("node4");
    std::fs::create_dir_all(&dir4).expect("dir4");
    let peers4 = format!("{},4=127.0.0.1:{port}", cluster.peers);
    let dir4s = dir4.to_string_lossy().into_owned();
    let joiner = Daemon::start(&[
        "--peers",
        &peers4,
        "--node-id",
        "4",
        "--data-dir",
        &dir4s,
        "--election-timeout",
        ELECTION_MS,
        "--join",
    ]);
    let out = cluster_cli(
        cluster.node(survivor),
        &["add", &format!("4=127.0.0.1:{port}")],
    );
    assert!(out.status.success(), "add: {out:?}");
    let out = cluster_cli(cluster.node(lead), &["add", &format!("4=127.0.0.1:{port}")]);
    assert!(!out.status.success(), "adding a member twice: {out:?}");
    let out = cluster_cli(
        cluster.node(lead),
        &["add", &format!("{victim}=127.0.0.1:{}", free_port())],
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("new id"),
        "a removed id comes back only as a new one: {out:?}"
    );
    wait_for_quorum(joiner.memcache.expect("memcache"));
    // It caught up: the lock is held, the item is there, and it names the same members.
    let mut j = joiner.lockd();
    assert_eq!(ask(&mut j, ld::op::TRY, b"kept\0"), ld::op::WBLOCK);
    let mut jm = joiner.memcache();
    jm.expect(b"get item\r\n", b"VALUE item 0 5\r\nhello\r\nEND\r\n");
    let v = status(&joiner);
    want.push(4);
    want.sort();
    assert_eq!(ids(&v, "voters"), want);
    assert_eq!(v["peers"].as_array().map(Vec::len), Some(3), "{v}");
    // The lock's holder releases through its node; the new node grants it next.
    assert_eq!(ask(&mut holder, ld::op::REL, b"kept\0"), ld::op::RELEASED);
    assert_eq!(ask(&mut j, ld::op::TRY, b"kept\0"), ld::op::ACQUIRED);

    // The removed node started again (its old id, its wiped directory): the others refuse it,
    // so it never has a leader and never grants.
    let removed = cluster.spawn(victim);
    std::thread::sleep(Duration::from_millis(6 * 300));
    assert_eq!(
        status(&removed)["leader"],
        0,
        "a removed node found a leader"
    );
    let mut r = removed.memcache();
    r.send(b"set x 0 0 1\r\nx\r\n");
    assert_eq!(r.line(), "SERVER_ERROR no quorum\r\n");
    removed.terminate();

    // A live member removed stops by itself (exit status 0), and the rest go on.
    let mut gone = cluster.nodes[survivor - 1].take().expect("survivor");
    let out = cluster_cli(cluster.node(lead), &["remove", &survivor.to_string()]);
    assert!(out.status.success(), "remove a live node: {out:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while gone.is_running() {
        assert!(Instant::now() < deadline, "a removed node kept running");
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_for_quorum(joiner.memcache.expect("memcache"));
    let v = status(&joiner);
    let mut want = vec![lead as u64, 4];
    want.sort();
    assert_eq!(ids(&v, "voters"), want);
    joiner.terminate();
}

/// Election and session timeouts of the partition tests (ms), and the fence time they imply:
/// a node cut off closes its clients after the session timeout less half an election timeout.
const PART_ELECTION_MS: u64 = 300;
const PART_SESSION_MS: u64 = 900;
/// Added to every "within" bound of the partition tests: the machine is shared and loaded.
const SLACK: Duration = Duration::from_secs(2);

/// One memcached text request through a fresh connection to `addr`: its reply line, or None
/// when the node closed the connection without one.
fn mc_once(addr: SocketAddr, request: &[u8]) -> Option<String> {
    let mut c = Client::connect(addr);
    c.send(request);
    try_line(&mut c)
}

/// The next line, or None when the connection closes first.
fn try_line(c: &mut Client) -> Option<String> {
    use std::io::Read;
    let deadline = Instant::now() + common::DEADLINE;
    loop {
        if let Some(i) = c.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = c.pending.drain(..=i).collect();
            return Some(String::from_utf8_lossy(&line).into_owned());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "neither a line nor a close");
        c.stream.set_read_timeout(Some(left)).expect("timeout");
        let mut buf = [0u8; 4096];
        match c.stream.read(&mut buf) {
            Ok(0) => return None,
            Ok(k) => c.pending.extend_from_slice(&buf[..k]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(_) => return None,
        }
    }
}

/// Lock and unlock `key` through `addr` `rounds` times, each answered within `within`: the
/// cluster grants through this node.
fn keeps_granting(addr: SocketAddr, key: &str, rounds: usize, within: Duration) {
    let mut m = Client::connect(addr);
    m.expect(
        format!("set {key} 0 0 1\r\nv\r\n").as_bytes(),
        b"STORED\r\n",
    );
    for round in 0..rounds {
        let asked = Instant::now();
        m.expect(format!("lock {key}\r\n").as_bytes(), b"OK\r\n");
        m.expect(format!("unlock {key}\r\n").as_bytes(), b"OK\r\n");
        assert!(
            asked.elapsed() < within,
            "round {round} through {addr} took {:?}",
            asked.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn applied(d: &Daemon) -> u64 {
    status(d)["applied"].as_u64().expect("applied index")
}

/// A minority partition through the peer proxies (a blackhole both ways): the cut-off
/// follower's clients get the no-quorum answer or a closed connection within 2 x the election
/// timeout plus the fence time, the majority keeps granting, and after the session timeout
/// grants the cut-off node's clients' locks to others; healed, the node catches up.
///
/// It also guards the worker's routing: `Outbox::direct` gives every effect it makes the
/// session `Session(0)`, so a fenced node's closes (and no-quorum answers to several
/// connections in one turn) reach each its own connection only because the worker ends a run
/// of effects where the connection changes, not only where the session does.
#[test]
fn a_follower_cut_off_both_ways_fences_its_clients_and_the_majority_takes_its_locks() {
    let session = PART_SESSION_MS.to_string();
    let cluster = Cluster::start_proxied(
        3,
        "cut-off",
        &["--session-timeout", &session, "--orphan-timeout", "500"],
    );
    let lead = leader(&cluster);
    let x = if lead == 1 { 2 } else { 1 };
    let other = (1..=3)
        .find(|&i| i != lead && i != x)
        .expect("a third node");
    // X's clients: a memcached holder and an old-protocol holder.
    let mut holder = cluster.node(x).memcache();
    holder.expect(b"set job 0 0 1\r\nv\r\n", b"STORED\r\n");
    holder.expect(b"lock job\r\n", b"OK\r\n");
    let mut lholder = cluster.node(x).lockd();
    assert_eq!(ask(&mut lholder, ld::op::ACQ, b"ljob\0"), ld::op::ACQUIRED);
    // The majority sees both held; an old-protocol waiter queues through the other follower.
    let mut probe = cluster.node(lead).memcache();
    probe.expect(b"lock job\r\n", b"LOCKED\r\n");
    let mut lwaiter = cluster.node(other).lockd();
    assert_eq!(ask(&mut lwaiter, ld::op::ACQ, b"ljob\0"), ld::op::ACK);

    let mesh = cluster.mesh.as_ref().expect("proxied");
    mesh.isolate(x, proxy::Mode::Drop);
    let cut = Instant::now();
    // X cannot commit: a request through X gets the no-quorum answer (or X has already fenced
    // itself and closes the connection), and the connection closes.
    let xaddr = cluster.node(x).memcache.expect("memcache");
    let answer_within =
        Duration::from_millis(2 * PART_ELECTION_MS + PART_SESSION_MS - PART_ELECTION_MS);
    let mut m = Client::connect(xaddr);
    let asked = Instant::now();
    m.send(b"lock other\r\n");
    if let Some(line) = try_line(&mut m) {
        assert_eq!(line, "SERVER_ERROR no quorum\r\n");
        m.expect_closed();
    }
    assert!(
        asked.elapsed() < answer_within + SLACK,
        "no answer from the cut-off node for {:?}",
        asked.elapsed()
    );
    // X's idle clients are closed: it fenced itself.
    holder.expect_closed();
    if let Some(line) = try_line(&mut lholder) {
        panic!("the cut-off node sent its old-protocol holder {line:?}");
    }
    let fenced_after = cut.elapsed();
    assert!(
        fenced_after < answer_within + SLACK,
        "the cut-off node closed its clients {fenced_after:?} after the cut"
    );
    // The majority keeps granting meanwhile.
    keeps_granting(
        cluster.node(lead).memcache.expect("memcache"),
        "maj1",
        5,
        SLACK,
    );
    keeps_granting(
        cluster.node(other).memcache.expect("memcache"),
        "maj2",
        5,
        SLACK,
    );
    // After the session timeout the majority gives X's clients' locks to others: the
    // memcached lock at once, the old-protocol lock after its orphan window.
    loop {
        probe.send(b"lock job\r\n");
        let line = probe.line();
        if line == "OK\r\n" {
            break;
        }
        assert_eq!(line, "LOCKED\r\n");
        assert!(
            cut.elapsed() < Duration::from_secs(15),
            "X's lock never expired"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = cut.elapsed();
    assert!(
        took >= Duration::from_millis(PART_SESSION_MS - 50),
        "X's lock was given away {took:?} after the cut: before the session timeout"
    );
    assert_eq!(reply_to(&mut lwaiter, b"ljob\0"), ld::op::ACQUIRED);
    assert!(
        cut.elapsed() >= Duration::from_millis(PART_SESSION_MS + 500 - 50),
        "X's old-protocol lock went to a waiter {:?} after the cut: before session + orphan timeout",
        cut.elapsed()
    );
    // While cut off X still refuses to grant.
    if let Some(line) = mc_once(xaddr, b"lock other\r\n") {
        assert_eq!(line, "SERVER_ERROR no quorum\r\n");
    }
    // Heal: X catches up (its applied index reaches the leader's of after the heal's first
    // write) and serves again, seeing the majority's decisions.
    mesh.heal();
    let mut w = cluster.node(lead).memcache();
    w.expect(b"set after-heal 0 0 1\r\nv\r\n", b"STORED\r\n");
    let target = applied(cluster.node(lead));
    let deadline = Instant::now() + Duration::from_secs(20);
    while applied(cluster.node(x)) < target {
        assert!(
            Instant::now() < deadline,
            "X never caught up to index {target}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    wait_for_quorum(xaddr);
    let mut late = cluster.node(x).memcache();
    late.expect(b"lock job\r\n", b"LOCKED\r\n");
    late.expect(
        b"get after-heal\r\n",
        b"VALUE after-heal 0 1\r\nv\r\nEND\r\n",
    );
    let mut l = cluster.node(x).lockd();
    assert_eq!(ask(&mut l, ld::op::TRY, b"ljob\0"), ld::op::WBLOCK);
    assert_eq!(status(cluster.node(x))["fenced"], false);
}

/// One-way partitions through the peer proxies: the leader can send to a follower but not
/// hear from it, then the reverse; either way the cluster keeps granting through the other
/// two nodes, and healed, all three serve.
#[test]
fn a_one_way_partition_keeps_the_majority_granting() {
    let session = PART_SESSION_MS.to_string();
    let cluster = Cluster::start_proxied(3, "one-way", &["--session-timeout", &session]);
    let mesh = cluster.mesh.as_ref().expect("proxied");
    for (case, blackhole) in [("leader deaf to X", true), ("X deaf to leader", false)] {
        let lead = leader(&cluster);
        let x = if lead == 1 { 2 } else { 1 };
        let other = (1..=3)
            .find(|&i| i != lead && i != x)
            .expect("a third node");
        if blackhole {
            mesh.set(x, lead, proxy::Mode::Drop);
        } else {
            mesh.set(lead, x, proxy::Mode::Refuse);
        }
        let cut = Instant::now();
        // Longer than the session timeout: whatever X's sessions become, the other two go on.
        let mut round = 0;
        while cut.elapsed() < Duration::from_millis(3 * PART_SESSION_MS) {
            for id in [lead, other] {
                let key = format!("oneway{round}");
                keeps_granting(cluster.node(id).memcache.expect("memcache"), &key, 1, SLACK);
            }
            round += 1;
        }
        assert!(round >= 3, "{case}: only {round} rounds");
        mesh.heal();
        for id in 1..=3 {
            wait_for_quorum(cluster.node(id).memcache.expect("memcache"));
        }
        let mut m = cluster.node(x).memcache();
        m.expect(b"set healed 0 0 1\r\nv\r\n", b"STORED\r\n");
    }
}

/// A dlock Lock of `key` (waiting forever when `wait` is None).
fn dlock_lock(id: u64, key: &[u8], wait_micro: Option<u64>) -> Vec<u8> {
    use holdfast::proto::dlock as dl;
    let keys = [key];
    let mut out = Vec::new();
    dl::encode_request(
        &mut out,
        Some(id),
        None,
        dl::req_type::LOCK,
        Some(dl::LockFields {
            wait_micro,
            release_micro: None,
            keys: &keys,
            native: Default::default(),
        }),
    );
    out
}

/// One dlock response's status.
fn dlock_status(c: &mut Client) -> u32 {
    use holdfast::proto::dlock as dl;
    let h = c.take(dl::PREFIX_LEN);
    let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
    let body = c.take(len);
    let r = dl::decode_response(&body).expect("a dlock response");
    r.status.unwrap_or(dl::status::OK)
}

/// Everything a connection receives until it closes (or `within` passes: None).
fn until_closed(c: &mut Client, within: Duration) -> Option<Vec<u8>> {
    use std::io::Read;
    let deadline = Instant::now() + within;
    let mut got = std::mem::take(&mut c.pending);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        c.stream.set_read_timeout(Some(left)).expect("timeout");
        let mut buf = [0u8; 4096];
        match c.stream.read(&mut buf) {
            Ok(0) => return Some(got),
            Ok(k) => got.extend_from_slice(&buf[..k]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(_) => return Some(got),
        }
    }
}

/// A node cut off fences itself by closing *every* client connection, also one whose dlock
/// Lock is queued (a request in flight): otherwise, healed, it would deliver a grant that the
/// log decided before the cut, after the majority had expired the session and given the key to
/// someone else: a double grant.
///
/// A reply's close waits until no request of the connection is in flight, so such a
/// connection would never be closed that way; a fence closes with `Body::Abort`, at once.
#[test]
fn a_cut_off_node_closes_also_a_connection_whose_dlock_lock_waits() {
    let session = PART_SESSION_MS.to_string();
    let cluster = Cluster::start_proxied(3, "cut-waiter", &["--session-timeout", &session]);
    let lead = leader(&cluster);
    let x = if lead == 1 { 2 } else { 1 };
    let mut holder = cluster.node(lead).dlock();
    holder.send(&dlock_lock(1, b"k", Some(0)));
    assert_eq!(dlock_status(&mut holder), 0);
    let mut waiter = cluster.node(x).dlock();
    waiter.send(&dlock_lock(1, b"k", None));
    waiter.expect_silence(Duration::from_millis(300));
    let mesh = cluster.mesh.as_ref().expect("proxied");
    mesh.isolate(x, proxy::Mode::Drop);
    let within = Duration::from_millis(PART_SESSION_MS) + SLACK;
    let got = until_closed(&mut waiter, within);
    mesh.heal();
    assert_eq!(
        got,
        Some(Vec::new()),
        "the cut-off node must close the waiting connection, unanswered, within {within:?}"
    );
}

/// A node stopped past the session timeout answers nothing when it wakes: it closes its
/// clients' connections first, also one whose request arrived while it was stopped (the
/// majority has ended that session and may have given its locks away: writes and unlocks of
/// expired sessions must not be answered after the wake).
///
/// The fence closes with `Body::Abort`, not waiting for the requests in flight (which would
/// then be proposed and answered in a new session).
#[test]
fn a_paused_node_answers_nothing_after_waking() {
    let session = PART_SESSION_MS.to_string();
    let cluster = Cluster::start_ready(3, "pause-quiet", &["--session-timeout", &session]);
    let lead = leader(&cluster);
    let x = if lead == 1 { 2 } else { 1 };
    let mut holder = cluster.node(x).memcache();
    holder.expect(b"set job 0 0 1\r\nv\r\n", b"STORED\r\n");
    holder.expect(b"lock job\r\n", b"OK\r\n");
    let pid = cluster.node(x).pid() as libc::pid_t;
    // SAFETY: signalling a child process this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    wait_stopped(pid);
    // Requests that wait in the stopped node's socket.
    holder.send(b"set job 0 0 1\r\nw\r\nunlock job\r\n");
    let mut other = cluster.node(lead).memcache();
    let paused = Instant::now();
    loop {
        other.send(b"lock job\r\n");
        if other.line() == "OK\r\n" {
            break;
        }
        assert!(paused.elapsed() < Duration::from_secs(15), "never expired");
        std::thread::sleep(Duration::from_millis(20));
    }
    other.expect(b"set job 0 0 1\r\no\r\n", b"STORED\r\n");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    let got = until_closed(&mut holder, common::DEADLINE);
    assert_eq!(
        got.as_deref().map(String::from_utf8_lossy),
        Some("".into()),
        "the woken node must close without answering"
    );
    other.expect(b"get job\r\n", b"VALUE job 0 1\r\no\r\nEND\r\n");
}

/// A follower that hears the leader but is not heard by it (a one-way partition) must fence
/// itself before the majority expires its sessions: its client learns that it lost the lock
/// (its connection closes) before anyone else is granted it. (Measuring a node's contact from
/// the messages it receives would never fence it here: it goes on hearing the leader.)
#[test]
fn a_node_the_leader_cannot_hear_fences_itself_before_its_locks_move() {
    let session = PART_SESSION_MS.to_string();
    let cluster = Cluster::start_proxied(3, "deaf", &["--session-timeout", &session]);
    let mesh = cluster.mesh.as_ref().expect("proxied");
    let lead = leader(&cluster);
    let x = if lead == 1 { 2 } else { 1 };
    let mut holder = cluster.node(x).memcache();
    holder.expect(b"set job 0 0 1\r\nv\r\n", b"STORED\r\n");
    holder.expect(b"lock job\r\n", b"OK\r\n");
    // X's messages to the leader vanish; the leader's to X still arrive.
    mesh.set(x, lead, proxy::Mode::Drop);
    let cut = Instant::now();
    let closed = std::thread::spawn(move || {
        holder.expect_closed();
        Instant::now()
    });
    let granted = loop {
        let mut c = cluster.node(lead).memcache();
        c.send(b"lock job\r\n");
        match c.line().as_str() {
            "OK\r\n" => break Instant::now(),
            "LOCKED\r\n" => {}
            other => panic!("lock through the leader answered {other:?}"),
        }
        assert!(
            cut.elapsed() < Duration::from_millis(3 * PART_SESSION_MS) + SLACK,
            "the majority never took the cut-off node's lock"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let closed = closed.join().expect("the holder's connection closed");
    assert!(
        closed < granted,
        "granted {:?} after the cut, but the holder's connection closed only {:?} after it",
        granted - cut,
        closed - cut
    );
    assert_eq!(status(cluster.node(x))["fenced"], true);
    mesh.heal();
    wait_for_quorum(cluster.node(x).memcache.expect("memcache"));
}

/// The data directory stays bounded when a small state sees a lot of log: 100 writes of 1 MB
/// to one item (100 MB of entries) leave each node a snapshot past the bootstrap one and well
/// under 100 MB on disk (snapshots come every 16 MiB of log, not only every 10,000 entries).
///
/// Heavy (100 MB through three debug-build nodes): ignored in the parallel run, where it
/// starves the other clusters' timers, and run alone by `make test-rust`.
#[test]
#[ignore = "heavy: run alone by make test-rust (cargo test --test cluster -- --ignored)"]
fn a_busy_log_is_snapshotted_by_its_size_and_the_directory_stays_bounded() {
    let cluster = Cluster::start_ready(3, "log-bytes", &[]);
    let value = vec![b'v'; 1_000_000];
    let mut req = b"set big 0 0 1000000\r\n".to_vec();
    req.extend_from_slice(&value);
    req.extend_from_slice(b"\r\n");
    // 100 MB through a debug build on a loaded machine can make a node miss its quorum for a
    // while (a no-quorum answer, a fenced connection): the write is sent again, through the
    // next node. What is measured is the directories, not the availability.
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut stored = 0;
    let mut via = 1;
    while stored < 100 {
        assert!(
            Instant::now() < deadline,
            "only {stored} of 100 writes stored"
        );
        let Some(addr) = cluster.nodes[via - 1].as_ref().and_then(|d| d.memcache) else {
            via = via % 3 + 1;
            continue;
        };
        match mc_once(addr, &req) {
            Some(line) if line == "STORED\r\n" => stored += 1,
            _ => via = via % 3 + 1,
        }
    }
    // Every node applies the last write before its size is read.
    for id in 1..=3 {
        let mut c = cluster.node(id).memcache();
        c.expect(b"set probe 0 0 1\r\nx\r\n", b"STORED\r\n");
    }
    std::thread::sleep(Duration::from_millis(500));
    for (i, dir) in cluster.dirs.iter().enumerate() {
        let mut total = 0;
        let mut snapshot_past_bootstrap = false;
        for e in std::fs::read_dir(dir).expect("data dir").flatten() {
            total += e.metadata().map(|m| m.len()).unwrap_or(0);
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(index) = name
                .strip_prefix("snap-")
                .and_then(|r| r.split('-').next())
                .and_then(|n| n.parse::<u64>().ok())
            {
                snapshot_past_bootstrap |= index > 1;
            }
        }
        assert!(
            snapshot_past_bootstrap,
            "node {}: no snapshot past the bootstrap one",
            i + 1
        );
        assert!(
            total < 60 << 20,
            "node {}: {} bytes on disk after 100 MB of log",
            i + 1,
            total
        );
    }
}

/// A follower stopped while the others write 40 MB (so they snapshot, in child processes,
/// and compact past it) catches up on its restart from a snapshot sent in chunks and installed
/// off its owner's thread, then serves what was written and what comes after. (A follower
/// only paused would catch up from the appends raft already sent it, up to 256 messages.)
/// Heavy (40 MB through three debug-build nodes): run alone by `make test-rust`.
#[test]
#[ignore = "heavy: run alone by make test-rust (cargo test --test cluster -- --ignored)"]
fn a_stopped_follower_catches_up_from_a_chunked_snapshot_made_in_the_background() {
    let mut cluster = Cluster::start_ready(3, "chunked", &[]);
    let lead = leader(&cluster);
    let behind = if lead == 3 { 2 } else { 3 };
    cluster.stop(behind);
    let value = vec![b'v'; 1_000_000];
    let mut c = cluster.node(lead).memcache();
    for i in 0..40 {
        let mut req = format!("set big{i} 0 0 1000000\r\n").into_bytes();
        req.extend_from_slice(&value);
        req.extend_from_slice(b"\r\n");
        c.expect(&req, b"STORED\r\n");
    }
    wait_until(
        Duration::from_secs(60),
        "the leader makes a snapshot",
        || {
            let m = metrics(cluster.node(lead));
            metric(&m, "holdfast_cluster_snapshots_total", "result=\"made\"") >= 1.0
        },
    );
    cluster.restart(behind);
    wait_until(
        Duration::from_secs(120),
        "the restarted node installs a snapshot",
        || {
            let m = metrics(cluster.node(behind));
            metric(
                &m,
                "holdfast_cluster_snapshots_total",
                "result=\"installed\"",
            ) >= 1.0
                && metric(
                    &m,
                    "holdfast_cluster_snapshot_in_progress",
                    "op=\"install\"",
                ) == 0.0
        },
    );
    let m = metrics(cluster.node(behind));
    assert!(metric(&m, "holdfast_cluster_snapshot_bytes_received_total", "") > 16e6);
    let m = metrics(cluster.node(lead));
    assert!(metric(&m, "holdfast_cluster_snapshot_bytes_sent_total", "") > 16e6);
    wait_for_quorum(cluster.node(behind).memcache.expect("memcache"));
    let mut r = cluster.node(behind).memcache();
    r.expect(b"set after 0 0 1\r\nx\r\n", b"STORED\r\n");
    r.send(b"get big0 big39 after\r\n");
    for key in ["big0", "big39"] {
        assert_eq!(r.line(), format!("VALUE {key} 0 1000000\r\n"));
        let got = r.take(1_000_002);
        assert!(got[..1_000_000] == value[..], "{key}'s value");
    }
    assert_eq!(r.line(), "VALUE after 0 1\r\n");
    assert_eq!(r.line(), "x\r\n");
    assert_eq!(r.line(), "END\r\n");
}

/// Inbound peer connections a node refused since it started.
fn peer_refused(d: &Daemon) -> u64 {
    status(d)["peer_refused"].as_u64().expect("peer_refused")
}

/// The two nodes of three that are not `id`.
fn the_others(id: usize) -> (usize, usize) {
    match id {
        1 => (2, 3),
        2 => (1, 3),
        _ => (1, 2),
    }
}

/// Reads until the other side closes: true when it did (EOF, a reset, or through TLS an
/// unclean close or an alert) within the deadline.
fn closed_by_peer(s: &mut impl std::io::Read) -> bool {
    let deadline = Instant::now() + common::DEADLINE;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return true,
        }
    }
    false
}

/// What a node sends back to `request` on a fresh connection within `within` (empty when
/// nothing, or when it closes the connection first).
fn first_bytes(addr: SocketAddr, request: &[u8], within: Duration) -> Vec<u8> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(within)).expect("timeout");
    s.write_all(request).expect("write");
    let mut buf = vec![0u8; 256];
    match s.read(&mut buf) {
        Ok(n) => buf[..n].to_vec(),
        Err(_) => Vec::new(),
    }
}

/// Waits until `d` has refused more than `than` inbound peer connections.
fn wait_refused(d: &Daemon, than: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while peer_refused(d) <= than {
        assert!(Instant::now() < deadline, "{what}: no refusal counted");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Peer TLS on every link, each also through a proxy (which forwards the TLS bytes as they
/// are): the cluster elects, serves a lock, and goes through the plain cluster's faults: the
/// leader killed and restarted, a follower paused past the session timeout, a follower cut
/// off both ways.
#[test]
fn a_peer_tls_cluster_survives_a_leader_kill_a_pause_and_a_partition() {
    let session = PART_SESSION_MS.to_string();
    let mut cluster =
        Cluster::start_tls(3, "tls-faults", &["--session-timeout", &session], true, &[]);
    for id in 1..=3 {
        assert_eq!(status(cluster.node(id))["peer_tls"], true);
    }
    // A lock through a follower, held on every node.
    let lead = leader(&cluster);
    let (f1, f2) = the_others(lead);
    let mut holder = cluster.node(f1).lockd();
    assert_eq!(ask(&mut holder, ld::op::ACQ, b"job\0"), ld::op::ACQUIRED);
    for id in [lead, f2] {
        let mut probe = cluster.node(id).lockd();
        assert_eq!(ask(&mut probe, ld::op::TRY, b"job\0"), ld::op::WBLOCK);
    }

    // The leader killed: the other two elect one and keep the lock; restarted, it catches up.
    kill9(cluster.node(lead));
    wait_for_quorum(cluster.node(f2).memcache.expect("memcache"));
    let mut probe = cluster.node(f2).lockd();
    assert_eq!(ask(&mut probe, ld::op::TRY, b"job\0"), ld::op::WBLOCK);
    cluster.restart(lead);
    wait_for_quorum(cluster.node(lead).memcache.expect("memcache"));
    let mut late = cluster.node(lead).lockd();
    assert_eq!(ask(&mut late, ld::op::TRY, b"job\0"), ld::op::WBLOCK);
    assert_eq!(ask(&mut holder, ld::op::REL, b"job\0"), ld::op::RELEASED);

    // A follower paused past the session timeout: the other two keep granting; woken, it
    // serves again.
    let lead = leader(&cluster);
    let (x, other) = the_others(lead);
    let pid = cluster.node(x).pid() as libc::pid_t;
    // SAFETY: signalling a child process this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    wait_stopped(pid);
    let paused = Instant::now();
    for (id, key) in [(lead, "paused1"), (other, "paused2")] {
        keeps_granting(cluster.node(id).memcache.expect("memcache"), key, 3, SLACK);
    }
    std::thread::sleep(
        Duration::from_millis(PART_SESSION_MS + 300).saturating_sub(paused.elapsed()),
    );
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    wait_for_quorum(cluster.node(x).memcache.expect("memcache"));

    // A follower cut off both ways through its proxies: the majority grants; healed, the
    // follower catches up.
    let lead = leader(&cluster);
    let (x, other) = the_others(lead);
    let mesh = cluster.mesh.as_ref().expect("proxied");
    mesh.isolate(x, proxy::Mode::Drop);
    let cut = Instant::now();
    for (id, key) in [(lead, "cut1"), (other, "cut2")] {
        keeps_granting(cluster.node(id).memcache.expect("memcache"), key, 5, SLACK);
    }
    let mut w = cluster.node(lead).memcache();
    w.expect(b"set during-cut 0 0 1\r\nv\r\n", b"STORED\r\n");
    // Past the session timeout: the cut-off node fences itself, then comes back.
    std::thread::sleep(Duration::from_millis(PART_SESSION_MS + 300).saturating_sub(cut.elapsed()));
    mesh.heal();
    wait_for_quorum(cluster.node(x).memcache.expect("memcache"));
    let mut m = cluster.node(x).memcache();
    m.expect(
        b"get during-cut\r\n",
        b"VALUE during-cut 0 1\r\nv\r\nEND\r\n",
    );
}

/// A node whose certificate is of another CA never takes part: the two others refuse its
/// connections (and count them), and do not accept its certificate when they dial it, so none
/// of its bytes is read and none of theirs reaches it. Nodes 1 and 2 are a quorum of the three
/// and serve; node 3 never hears of a leader.
#[test]
fn a_node_with_a_foreign_certificate_never_takes_part() {
    let cluster = Cluster::start_tls(3, "tls-foreign", &[], false, &[3]);
    let mut a = cluster.node(1).lockd();
    assert_eq!(ask(&mut a, ld::op::ACQ, b"job\0"), ld::op::ACQUIRED);
    let mut b = cluster.node(2).lockd();
    assert_eq!(ask(&mut b, ld::op::TRY, b"job\0"), ld::op::WBLOCK);
    keeps_granting(
        cluster.node(2).memcache.expect("memcache"),
        "pair",
        3,
        SLACK,
    );
    wait_refused(cluster.node(1), 0, "node 1 refuses node 3");
    wait_refused(cluster.node(2), 0, "node 2 refuses node 3");
    // Many election timeouts: node 3 knows no leader and commits nothing (a write through it is
    // never STORED: it answers no quorum, closes, or says nothing).
    let foreign = cluster.node(3).memcache.expect("memcache");
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let s = status(cluster.node(3));
        assert_eq!(s["leader"], 0, "the foreign node heard of a leader: {s}");
        let answer = first_bytes(foreign, b"set x 0 0 1\r\nv\r\n", Duration::from_millis(700));
        assert!(
            !answer.starts_with(b"STORED"),
            "the foreign node stored a value"
        );
    }
    let lead = status(cluster.node(1))["leader"].as_u64().unwrap_or(0);
    assert!(lead == 1 || lead == 2, "leader {lead}");
    assert!(applied(cluster.node(3)) < applied(cluster.node(1)));
    assert_eq!(status(cluster.node(2))["leader"].as_u64(), Some(lead));
}

/// Bytes that are not TLS, sent to a node's peer port, and bytes that are not frames, sent
/// after a valid handshake (a client certificate of the cluster's CA), each close that
/// connection and are counted; the cluster keeps serving through every node.
#[test]
fn garbage_on_a_tls_peer_port_is_refused_and_the_cluster_keeps_serving() {
    use std::io::Write;
    let cluster = Cluster::start_tls(3, "tls-garbage", &[], false, &[]);
    let peer = cluster.peer_addr(1);
    let before = peer_refused(cluster.node(1));
    let mut s = std::net::TcpStream::connect(peer).expect("connect");
    s.set_read_timeout(Some(common::DEADLINE)).expect("timeout");
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    assert!(
        closed_by_peer(&mut s),
        "garbage before a handshake: not closed"
    );
    wait_refused(cluster.node(1), before, "garbage before a handshake");

    let before = peer_refused(cluster.node(1));
    let mut c = cluster.pki.as_ref().expect("pki").client(peer);
    c.write_all(&[0xde; 64]).expect("write");
    c.flush().expect("flush");
    assert!(
        closed_by_peer(&mut c),
        "garbage after a handshake: not closed"
    );
    wait_refused(cluster.node(1), before, "garbage after a handshake");

    for id in 1..=3 {
        let key = format!("after{id}");
        keeps_granting(cluster.node(id).memcache.expect("memcache"), &key, 2, SLACK);
    }
}

/// A GET on a node's admin port: status and body.
fn http_get(d: &Daemon, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(d.admin.expect("admin")).expect("connect admin");
    s.set_read_timeout(Some(common::DEADLINE)).expect("timeout");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .expect("send");
    let mut all = String::new();
    s.read_to_string(&mut all).expect("read the answer");
    let (head, body) = all.split_once("\r\n\r\n").expect("an HTTP answer");
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status");
    (code, body.to_string())
}

/// A node's `/metrics`, parsed strictly (`common::check_exposition`).
fn metrics(d: &Daemon) -> Vec<common::Sample> {
    let (code, text) = http_get(d, "/metrics");
    assert_eq!(code, 200, "{text}");
    common::check_exposition(&text)
}

fn metric(samples: &[common::Sample], name: &str, labels: &str) -> f64 {
    common::sample(samples, name, labels).unwrap_or_else(|| panic!("no {name}{{{labels}}}"))
}

/// Polls `done` every 50 ms until it holds; fails after `within` saying `what`.
fn wait_until(within: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every node's `/metrics` has the cluster series of `docs/operations.md`; they agree with `/cluster`,
/// `/healthz` and `/status.json`; followers reach each other (keepalives); `/locks` names the
/// node a holder's connection is on; open connections are this node's sockets.
#[test]
fn cluster_metrics_health_and_holders_nodes_agree_on_every_node() {
    let cluster = Cluster::start_ready(3, "metrics", &[]);
    // Every node reaches both others, followers included.
    for id in 1..=3 {
        let (a, b) = the_others(id);
        wait_until(Duration::from_secs(10), "peers reachable", || {
            let m = metrics(cluster.node(id));
            [a, b].iter().all(|p| {
                metric(
                    &m,
                    "holdfast_cluster_peer_reachable",
                    &format!("peer=\"{p}\""),
                ) == 1.0
            })
        });
    }
    let lead = leader(&cluster);
    let mut lockd = cluster.node(2).lockd();
    assert_eq!(
        ask(&mut lockd, ld::op::ACQ, b"held-on-2\0"),
        ld::op::ACQUIRED
    );
    for id in 1..=3 {
        let d = cluster.node(id);
        let m = metrics(d);
        let role = if id == lead { "leader" } else { "follower" };
        for r in ["leader", "follower", "candidate", "precandidate", "learner"] {
            let want = if r == role { 1.0 } else { 0.0 };
            let got = metric(&m, "holdfast_cluster_role", &format!("role=\"{r}\""));
            assert_eq!(got, want, "node {id} role {r}");
        }
        assert_eq!(metric(&m, "holdfast_cluster_leader_id", ""), lead as f64);
        assert!(metric(&m, "holdfast_cluster_term", "") >= 1.0);
        let (commit, applied) = (
            metric(&m, "holdfast_cluster_commit_index", ""),
            metric(&m, "holdfast_cluster_applied_index", ""),
        );
        assert!(applied > 1.0 && commit >= applied, "{commit} {applied}");
        assert_eq!(metric(&m, "holdfast_cluster_fenced", ""), 0.0);
        assert!(metric(&m, "holdfast_cluster_leader_changes_total", "") >= 1.0);
        assert_eq!(metric(&m, "holdfast_cluster_fences_total", ""), 0.0);
        assert!(metric(&m, "holdfast_cluster_proposal_apply_seconds_count", "") >= 1.0);
        assert!(metric(&m, "holdfast_cluster_log_sync_seconds_count", "") >= 1.0);
        assert!(metric(&m, "holdfast_cluster_snapshot_bytes", "") > 0.0);
        assert!(metric(&m, "holdfast_cluster_log_file_bytes", "") > 0.0);
        let cached = metric(&m, "holdfast_cluster_log_cached_bytes", "");
        assert!(cached > 0.0 && cached <= (32 << 20) as f64, "{cached}");
        assert!(metric(&m, "holdfast_cluster_log_entries_read_total", "") >= 0.0);
        for result in ["made", "failed", "installed"] {
            let label = format!("result=\"{result}\"");
            assert!(metric(&m, "holdfast_cluster_snapshots_total", &label) >= 0.0);
        }
        assert_eq!(
            metric(&m, "holdfast_cluster_snapshots_total", "result=\"failed\""),
            0.0
        );
        assert!(metric(&m, "holdfast_cluster_snapshot_write_seconds_count", "") >= 0.0);
        assert!(metric(&m, "holdfast_cluster_quorum_losses_total", "") >= 0.0);
        // (The start's warm-up may have been answered no quorum while the cluster formed.)
        assert!(metric(&m, "holdfast_cluster_no_quorum_answers_total", "") >= 0.0);
        // This node's sockets, not the cluster's sessions: only node 2 has a lockd client.
        let open = m
            .iter()
            .find(|(n, l, _)| n == "holdfast_open_connections" && l.contains("\"lockd\""))
            .expect("lockd's open connections")
            .2;
        assert_eq!(open, if id == 2 { 1.0 } else { 0.0 }, "node {id}");
        // One source of truth for health.
        assert_eq!(
            http_get(d, "/healthz"),
            (200, "ok\n".to_string()),
            "node {id}"
        );
        let c = status(d);
        assert_eq!(
            (c["health"].clone(), c["healthy"].clone()),
            ("ok".into(), true.into())
        );
        assert_eq!(c["commit"].as_u64().map(|v| v as f64 >= commit), Some(true));
        let (_, body) = http_get(d, "/status.json");
        let s: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(s["cluster"]["health"], "ok");
        assert_eq!(s["cluster"]["node"], id);
        // The holder's node, on every node once the log carried the grant there.
        wait_until(Duration::from_secs(10), "the grant replicated", || {
            let (_, body) = http_get(d, "/locks?table=lockd");
            let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
            v["locks"].as_array().is_some_and(|l| {
                l.iter()
                    .any(|k| k["name"] == "held-on-2" && k["holder"]["node"] == 2)
            })
        });
    }
}

/// Two nodes of three killed: the survivor's `/healthz` turns 503 with the reason within a
/// few election timeouts, `/cluster` and `/metrics` say it fenced itself; the two restarted,
/// it answers 200 again.
#[test]
fn a_survivor_of_two_killed_nodes_is_unhealthy_until_they_are_back() {
    let mut cluster = Cluster::start_ready(3, "health", &[]);
    let survivor = leader(&cluster);
    let (a, b) = the_others(survivor);
    kill9(cluster.node(a));
    kill9(cluster.node(b));
    let election = Duration::from_millis(ELECTION_MS.parse().expect("ms"));
    let killed = Instant::now();
    let d = cluster.node(survivor);
    wait_until(4 * election + SLACK, "healthz still 200", || {
        http_get(d, "/healthz").0 == 503
    });
    let (_, why) = http_get(d, "/healthz");
    assert!(
        why == "no leader\n" || why == "no quorum\n" || why.starts_with("fenced: "),
        "{why:?}"
    );
    // Fenced within the session timeout (3 election timeouts) less half an election timeout.
    wait_until(4 * election + SLACK, "never fenced", || {
        status(d)["fenced"] == true
    });
    assert!(killed.elapsed() < 4 * election + SLACK + Duration::from_secs(1));
    let (code, why) = http_get(d, "/healthz");
    assert_eq!(code, 503);
    assert!(why.starts_with("fenced: no quorum contact for "), "{why:?}");
    let c = status(d);
    assert_eq!(c["healthy"], false);
    assert!(
        c["health"]
            .as_str()
            .is_some_and(|h| h.starts_with("fenced: ")),
        "{c}"
    );
    let m = metrics(d);
    assert_eq!(metric(&m, "holdfast_cluster_fenced", ""), 1.0);
    assert!(metric(&m, "holdfast_cluster_fences_total", "") >= 1.0);
    assert!(metric(&m, "holdfast_cluster_quorum_losses_total", "") >= 1.0);
    for p in [a, b] {
        let label = format!("peer=\"{p}\"");
        assert_eq!(metric(&m, "holdfast_cluster_peer_reachable", &label), 0.0);
    }
    for id in [a, b] {
        cluster.nodes[id - 1]
            .take()
            .expect("killed node")
            .terminate();
        cluster.restart(id);
    }
    let d = cluster.node(survivor);
    wait_until(Duration::from_secs(30), "healthz never 200 again", || {
        http_get(d, "/healthz") == (200, "ok\n".to_string())
    });
    assert_eq!(status(d)["fenced"], false);
    assert_eq!(metric(&metrics(d), "holdfast_cluster_fenced", ""), 0.0);
}

/// Start a daemon that must fail: its exit status and standard error.
fn start_fails(args: &[&str]) -> (Option<i32>, String) {
    use std::io::Read;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args([
            "--memcache",
            "127.0.0.1:0",
            "--lockd",
            "off",
            "--dlock",
            "off",
        ])
        .args(["--counter", "off", "--admin", "off"])
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn holdfast");
    let deadline = Instant::now() + common::DEADLINE;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let mut err = String::new();
            let _ = child
                .stderr
                .take()
                .expect("stderr")
                .read_to_string(&mut err);
            return (status.code(), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("holdfast {args:?} did not stop");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The one line (besides the info lines every start logs) that says why a start failed.
fn the_reason(err: &str) -> &str {
    let said: Vec<&str> = err.lines().filter(|l| !l.contains(" info ")).collect();
    assert_eq!(said.len(), 1, "one line: {err:?}");
    said[0]
}

/// A data directory that is a file, not writable, or in use by a running node, and `--peers`
/// that disagrees with the cluster stored there: each stops the start with one line naming
/// the flag, and exit status 2.
#[test]
fn bad_data_directories_and_disagreeing_peers_stop_the_start_with_status_2() {
    let base = std::env::temp_dir().join(format!("holdfast-startchecks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).expect("base");
    let peer = format!("1=127.0.0.1:{}", free_port());
    let node = |dir: &Path, peers: &str| -> Vec<String> {
        [
            "--peers",
            peers,
            "--node-id",
            "1",
            "--election-timeout",
            ELECTION_MS,
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(["--data-dir".to_string(), dir.to_string_lossy().into_owned()])
        .collect()
    };
    let run = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        start_fails(&args)
    };

    let file = base.join("a-file");
    std::fs::write(&file, b"not a directory").expect("file");
    let (code, err) = run(node(&file, &peer));
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(
        the_reason(&err),
        format!("holdfast: --data-dir {}: not a directory", file.display())
    );
    // Every line of a cluster node names it.
    assert!(err.contains(" info node=1 holdfast: starting "), "{err}");

    let read_only = base.join("read-only");
    std::fs::create_dir_all(&read_only).expect("dir");
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "ro,size=1m", "tmpfs"])
            .arg(&read_only)
            .status()
            .is_ok_and(|s| s.success());
        assert!(mounted, "cannot mount a read-only tmpfs");
    } else {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&read_only, std::fs::Permissions::from_mode(0o555)).unwrap();
    }
    let (code, err) = run(node(&read_only, &peer));
    if root {
        let _ = std::process::Command::new("umount")
            .arg(&read_only)
            .status();
    }
    assert_eq!(code, Some(2), "{err}");
    let line = the_reason(&err);
    assert!(
        line.starts_with(&format!(
            "holdfast: --data-dir {}: not writable: ",
            read_only.display()
        )),
        "{line}"
    );

    // A running node's directory.
    let dir = base.join("node1");
    let args = node(&dir, &peer);
    let args_ref: Vec<&str> = args.iter().map(String::as_str).collect();
    let first = Daemon::start(&args_ref);
    wait_for_quorum(first.memcache.expect("memcache"));
    let other_peer = format!("1=127.0.0.1:{}", free_port());
    let (code, err) = run(node(&dir, &other_peer));
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(
        the_reason(&err),
        format!(
            "holdfast: --data-dir {}: in use by another running holdfast node (process {}): \
             one directory per node",
            dir.display(),
            first.pid()
        )
    );
    first.terminate();

    // --peers that names a node the stored one-node cluster never had.
    let two = format!("{peer},2=127.0.0.1:{}", free_port());
    let (code, err) = run(node(&dir, &two));
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(
        the_reason(&err),
        format!(
            "holdfast: --peers names nodes 1,2 but the cluster stored in --data-dir {} has \
             nodes 1, and no membership change explains the difference (2): give --peers the \
             stored nodes, or found a new cluster with an empty --data-dir",
            dir.display()
        )
    );
    // The directory is still good for the node as it was.
    let again = Daemon::start(&args_ref);
    wait_for_quorum(again.memcache.expect("memcache"));
    again.terminate();
    let _ = std::fs::remove_dir_all(&base);
}

/// A version-3 (native protocol) request frame.
fn native_frame(
    id: u64,
    t: u64,
    key: &[u8],
    f: impl FnOnce(&mut holdfast::proto::dlock::LockFields<'_>),
) -> Vec<u8> {
    use holdfast::proto::dlock as dl;
    let keys = [key];
    let mut lock = dl::LockFields {
        keys: &keys,
        ..Default::default()
    };
    f(&mut lock);
    let mut out = Vec::new();
    dl::encode_request_version(&mut out, dl::NATIVE_VERSION, Some(id), None, t, Some(lock));
    out
}

/// The next version-3 frame a connection receives.
fn native_read(c: &mut Client) -> holdfast::proto::dlock::Response {
    use holdfast::proto::dlock as dl;
    let h = c.take(dl::PREFIX_LEN);
    let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
    let r = dl::decode_response(&c.take(len)).expect("a response");
    assert_eq!(r.version, Some(3), "{r:?}");
    r
}

/// A native request sent until it is not answered "no quorum" (a failover under way).
fn native_ask(
    d: &Daemon,
    frame: &[u8],
    within: Duration,
) -> (Client, holdfast::proto::dlock::Response) {
    let deadline = Instant::now() + within;
    loop {
        let mut c = d.dlock();
        c.send(frame);
        let r = native_read(&mut c);
        if r.error_text.as_deref() != Some(&b"no quorum"[..]) {
            return (c, r);
        }
        assert!(Instant::now() < deadline, "no quorum for {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The native protocol across a leader failover: a watcher on a follower sees a grant made
/// through the leader; the leader is killed with its client's connection; the client, now on
/// another node, keeps its lease by Extend with its fence (same token, no event in between);
/// an Unlock by fence from the watcher tells the holder Lost on its new connection and the
/// watcher Released.
#[test]
fn native_watches_notices_and_extend_by_fence_survive_a_leader_failover() {
    use holdfast::proto::dlock::{event_kind, req_type, status};
    let cluster = Cluster::start_ready(3, "native-failover", &[]);
    let dead = leader(&cluster);
    let (f1, f2) = the_others(dead);
    let mut watcher = cluster.node(f2).dlock();
    watcher.send(&native_frame(90, req_type::WATCH, b"svc", |_| {}));
    let r = native_read(&mut watcher);
    assert_eq!((r.status, r.info.len()), (Some(status::OK), 1), "{r:?}");
    let mut holder = cluster.node(dead).dlock();
    holder.send(&native_frame(1, req_type::LOCK, b"svc", |l| {
        l.release_micro = Some(30_000_000);
        l.native.value = Some(b"node-a");
    }));
    let r = native_read(&mut holder);
    assert_eq!(r.status, Some(status::OK), "{r:?}");
    let fence = r.fence.expect("a fence");
    let ev = native_read(&mut watcher).event.expect("an event");
    assert_eq!((ev.kind, ev.fence), (event_kind::ACQUIRED, fence));

    kill9(cluster.node(dead));
    drop(holder);
    let extend = native_frame(2, req_type::EXTEND, b"svc", |l| {
        l.release_micro = Some(30_000_000);
        l.native.fence = Some(fence);
    });
    let (mut moved, r) = native_ask(cluster.node(f2), &extend, Duration::from_secs(20));
    assert_eq!(
        (r.request_id, r.status),
        (Some(2), Some(status::OK)),
        "{r:?}"
    );
    // The lease outlived its node and its connection: no event reached the watcher.
    watcher.expect_silence(Duration::from_millis(300));

    let (_, r) = native_ask(
        cluster.node(f1),
        &native_frame(3, req_type::GET, b"svc", |_| {}),
        Duration::from_secs(20),
    );
    let holders = &r.info[0].holders;
    assert_eq!(holders.len(), 1, "{r:?}");
    assert_eq!(holders[0].fence, fence, "the token did not change");
    assert_eq!(holders[0].value.as_deref(), Some(&b"node-a"[..]));
    assert_eq!(
        holders[0].node,
        Some(f2 as u32),
        "held through the watcher's node now"
    );

    watcher.send(&native_frame(91, req_type::UNLOCK, b"svc", |l| {
        l.native.fence = Some(fence)
    }));
    let mut seen = Vec::new();
    for _ in 0..2 {
        let r = native_read(&mut watcher);
        seen.push((r.request_id, r.event.map(|e| (e.kind, e.fence))));
    }
    assert_eq!(
        seen,
        vec![
            (Some(91), None),
            (Some(90), Some((event_kind::RELEASED, fence)))
        ]
    );
    let r = native_read(&mut moved);
    assert_eq!(r.request_id, Some(2), "the notice carries the Extend's id");
    let ev = r.event.expect("a loss notice");
    assert_eq!((ev.kind, ev.fence), (event_kind::LOST, fence));
}

/// The dlock addresses of the running nodes, `first` first.
fn dlock_servers(c: &Cluster, first: usize) -> Vec<String> {
    let mut ids: Vec<usize> = (1..=c.nodes.len()).filter(|&i| i != first).collect();
    ids.insert(0, first);
    ids.iter()
        .map(|&i| c.node(i).dlock.expect("dlock").to_string())
        .collect()
}

/// holdfast-client: the node a client is connected to (the raft leader, the harder case) is
/// killed while the client holds a lease; the client moves to another node, keeps the lease
/// (same fence, re-attached by fence and renewed there) and is never told it lost it.
#[test]
fn a_client_keeps_its_lease_when_its_node_is_killed() {
    let cluster = Cluster::start_ready(3, "client-lease", &[]);
    let dead = leader(&cluster);
    let client = holdfast_client::Client::connect(dlock_servers(&cluster, dead)).unwrap();
    let lease = Duration::from_secs(3);
    let g = client.lock("job").lease(lease).acquire().expect("granted");
    let fence = g.fence();
    kill9(cluster.node(dead));
    let survivor = if dead == 1 { 2 } else { 1 };
    let other =
        holdfast_client::Client::connect([cluster.node(survivor).dlock.unwrap().to_string()])
            .unwrap();
    // Held for three lease lengths across the failover.
    let until = Instant::now() + lease * 3;
    while Instant::now() < until {
        assert_eq!(g.loss(), None, "the client was told it lost the lease");
        std::thread::sleep(Duration::from_millis(100));
    }
    let info = match other.get("job") {
        Ok(i) => i,
        Err(e) => panic!("get on a survivor: {e}"),
    };
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert_eq!(info.holders[0].fence, fence, "the same grant");
    assert!(other.check_fence("job", fence).unwrap());
    assert!(matches!(
        other.lock("job").wait(Duration::ZERO).acquire(),
        Err(holdfast_client::Error::AcquireTimeout { .. })
    ));
    g.unlock().expect("unlocked through the new node");
    other
        .lock("job")
        .wait(Duration::from_secs(5))
        .acquire()
        .expect("free again")
        .unlock()
        .unwrap();
}

/// `holdfast-lock --elect` in three processes, each connected to another node first: one leads
/// at a time. The leader is killed (SIGKILL, its command too): the next leads within the lease
/// plus the grace (its lock-delay) plus slack, with a greater fence; then the second steps down
/// by SIGTERM and the third leads. Leader intervals never overlap and fences increase.
#[test]
fn an_election_of_three_holdfast_lock_processes_has_one_leader_at_a_time() {
    let cluster = Cluster::start_ready(3, "client-elect", &[]);
    let dir = std::env::temp_dir().join(format!("holdfast-elect-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("log");
    let _ = std::fs::remove_file(&log);
    let now_ns = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    };
    // "start FENCE NS HOLDFAST_LOCK_PID SH_PID" and "end FENCE NS".
    let script = format!(
        "echo start $HOLDFAST_FENCE $(date +%s%N) $PPID $$ >> {0}; \
         trap 'echo end $HOLDFAST_FENCE $(date +%s%N) >> {0}; exit 0' TERM; \
         while :; do sleep 0.02; done",
        log.display()
    );
    let lines = || -> Vec<Vec<String>> {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(|l| l.split_whitespace().map(String::from).collect())
            .collect()
    };
    let starts =
        || -> Vec<Vec<String>> { lines().into_iter().filter(|l| l[0] == "start").collect() };
    let wait_starts = |n: usize, within: Duration| -> Duration {
        let t = Instant::now();
        while starts().len() < n {
            assert!(
                t.elapsed() < within,
                "no leader {n} within {within:?}: {:?}",
                lines()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        t.elapsed()
    };
    let lease = Duration::from_secs(2);
    let grace = Duration::from_millis(300);
    let (lease_s, grace_s) = (
        format!("{}ms", lease.as_millis()),
        format!("{}ms", grace.as_millis()),
    );
    let mut candidates: Vec<std::process::Child> = (1..=3)
        .map(|first| {
            std::process::Command::new(env!("CARGO_BIN_EXE_holdfast-lock"))
                .args(["--server", &dlock_servers(&cluster, first).join(",")])
                .args(["--elect", "election/svc", "--lease", &lease_s])
                .args(["--grace", &grace_s])
                .args(["--heartbeat", "200ms", "--", "sh", "-c", &script])
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("spawn holdfast-lock")
        })
        .collect();
    wait_starts(1, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(starts().len(), 1, "two leaders: {:?}", lines());
    // Kill the leader and its command at once.
    let first = starts()[0].clone();
    let (lock_pid, sh_pid): (i32, i32) = (first[3].parse().unwrap(), first[4].parse().unwrap());
    let killed = candidates
        .iter()
        .position(|c| c.id() as i32 == lock_pid)
        .expect("the leader is one of ours");
    // SAFETY: SIGKILL to a child we spawned (not reaped) and to its own child, the sh.
    unsafe {
        libc::kill(lock_pid, libc::SIGKILL);
        libc::kill(sh_pid, libc::SIGKILL);
    }
    let killed_ns = now_ns();
    let _ = candidates[killed].wait();
    let took = wait_starts(2, Duration::from_secs(20));
    assert!(
        took <= lease + grace + Duration::from_secs(3),
        "the next leader took {took:?}"
    );
    // The second steps down (SIGTERM, forwarded to its command, which ends; the lock is released).
    let second = starts()[1].clone();
    let pid2: i32 = second[3].parse().unwrap();
    // SAFETY: SIGTERM to a child we spawned and have not reaped.
    unsafe { libc::kill(pid2, libc::SIGTERM) };
    wait_starts(3, Duration::from_secs(10));
    let pid3: i32 = starts()[2][3].parse().unwrap();
    // SAFETY: as above.
    unsafe { libc::kill(pid3, libc::SIGTERM) };
    for c in &mut candidates {
        let _ = c.wait();
    }
    // Intervals: (fence, start, end), the killed leader ending when it was killed.
    let all = lines();
    let mut intervals: Vec<(u64, u128, u128)> = Vec::new();
    for l in all.iter().filter(|l| l[0] == "start") {
        let fence: u64 = l[1].parse().unwrap();
        let start: u128 = l[2].parse().unwrap();
        let end = all
            .iter()
            .find(|e| e[0] == "end" && e[1] == l[1])
            .map(|e| e[2].parse().unwrap())
            .unwrap_or(killed_ns);
        intervals.push((fence, start, end));
    }
    assert_eq!(intervals.len(), 3, "{all:?}");
    for w in intervals.windows(2) {
        assert!(w[1].0 > w[0].0, "fences increase: {intervals:?}");
        assert!(w[1].1 >= w[0].2, "leaders overlap: {intervals:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// holdfast-client: the two other nodes are killed while the client holds a lease through the
/// third, which is left without a quorum: no renewal succeeds on any server, and the client
/// says the lease is lost before its end (measured from the kill, later than the last renewal).
#[test]
fn a_client_that_cannot_renew_anywhere_reports_the_loss_before_the_lease_ends() {
    let cluster = Cluster::start_ready(3, "client-no-quorum", &[]);
    let client = holdfast_client::Client::connect(dlock_servers(&cluster, 1)).unwrap();
    let lease = Duration::from_secs(2);
    let g = client.lock("job").lease(lease).acquire().expect("granted");
    // Renewed a few times first.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(g.loss(), None);
    kill9(cluster.node(2));
    kill9(cluster.node(3));
    let killed = Instant::now();
    let why = g.wait_lost(Some(Duration::from_secs(10))).expect("lost");
    let after = killed.elapsed();
    assert_eq!(why, holdfast_client::Loss::LeaseNotKept);
    assert!(
        after < lease,
        "reported {after:?} after the kill, lease {lease:?}"
    );
    // Dropping the guard now returns (nothing to unlock).
    let start = Instant::now();
    drop(g);
    assert!(start.elapsed() < Duration::from_secs(1));
}
