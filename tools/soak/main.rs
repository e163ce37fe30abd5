//! `holdfast-soak`: a bounded run of mixed, partly hostile traffic on all three protocols at
//! once, checking mutual exclusion from the clients' side, then that nothing is left behind.
//!
//! ```text
//! holdfast-soak --holdfast target/release/holdfast [--seconds N] [-- DAEMON FLAGS...]
//! holdfast-soak --memcache ADDR --lockd ADDR --dlock ADDR --pid PID [--seconds N]
//! holdfast-soak --cluster 3 --holdfast target/release/holdfast [--seconds N] [--peer-tls] [-- NODE FLAGS...]
//! ```
//!
//! The first form starts the daemon (every listener on 127.0.0.1 port 0, then DAEMON FLAGS, e.g.
//! `--orphan-timeout 200 --dlock-idle-timeout 2000`) and stops it by its PID at the end; the
//! second attaches to a running one. The orphan and idle timeouts are read from `stats settings`.
//!
//! # Traffic (per protocol `--clients` threads, default 20, each with one connection at a time)
//!
//! - memcache: `lock`/`unlock`/`unlock_all` (text) and Lock, LaG, Unlock, UnlockQ+Noop,
//!   UnlockAll, RaU (binary), text and binary mixed on one connection, on `--names` keys (8);
//!   set/get/touch/delete by non-holders; `version`/Noop; closing while holding.
//! - lockd: ACQ (queued ones ping while they wait and some give up by closing), TRY, REL, ADOPT
//!   of orphans, PING, SYNC; closing while holding makes orphans.
//! - dlock: Lock of 1-3 keys waiting forever (giving up by closing), with a deadline, or trying
//!   once; a quarter as leases; Unlock; Ping; closing while holding or waiting; now and then a
//!   holder goes silent until the idle timeout closes it.
//! - Everywhere: slow requests (a few bytes at a time), closes with SO_LINGER 0 (reset),
//!   reconnects, and a few hostile requests that must get the connection closed.
//!
//! # The mutual-exclusion rules
//!
//! The soak keeps one mark per (protocol, name) (`model.rs`). The server is the only judge of
//! who holds a lock; the marks are the clients' knowledge of it, kept so that every mark
//! transition is causally ordered with the server's decision:
//!
//! 1. **Grant**: a client sets its mark only after reading the server's grant (OK, status 0,
//!    ACQUIRED, ADOPT's ACK, dlock Ok). The server granted before that.
//! 2. **Release**: a client clears its mark *before* sending the release (unlock, UnlockQ,
//!    unlock_all, RaU, holder's delete, REL, dlock Unlock) or before closing a connection whose
//!    close releases at once (memcache, dlock connection-bound locks). The server releases
//!    after that.
//! 3. So with one serial order in the server, a grant read while *another* owner's plain mark
//!    stands is a **double grant**: that owner's grant happened before its mark was set, its
//!    release cannot have happened before its mark was cleared.
//! 4. **Locks the server releases by itself later** carry a bound, a lower bound of the
//!    earliest instant the server may release them on its own:
//!    - lockd orphan: the holder sets `bound = now + orphan_timeout` *before* closing; the
//!      server sees the close later and counts the timeout from then.
//!    - dlock lease: `bound = send time of the Lock + lease`; the lease counts from the grant,
//!      which is after the send.
//!    - dlock connection-bound lock: `bound = send time of the connection's last request +
//!      idle timeout` (moved on by every request); the server's idle clock restarts on receipt
//!      (or at the grant), which is later. This also keeps a client that the overloaded machine
//!      did not schedule for an idle timeout from being a false double grant.
//!
//!    A grant read at `t` over another owner's bounded mark is a double grant only if
//!    `t + tolerance < bound`: the server cannot have released before `bound`, and its reply
//!    reached us after it decided. The tolerance (`--tolerance-ms`, 5 ms) covers the server's
//!    clock: it counts whole milliseconds truncated from a monotonic clock, so a deadline of
//!    `floor(t) + timeout` fires up to 1 ms before `t + timeout`. A bound is not an upper bound:
//!    the server may release later; nothing is checked about "too late" except at the end.
//! 5. **Grants the soak does not see**: a waiter that gives up by closing (lockd ACQ after ACK,
//!    dlock Lock waiting forever) may have been granted as it closed. That grant has no mark:
//!    the lock becomes an orphan (lockd), is released by the close (dlock), or is a lease that
//!    runs out. Missing marks only weaken the checks, never cause a false report; and that is
//!    why an ADOPT's ACK is a double grant only when the name's holder is *connected* (a plain
//!    mark), not when there is no mark. One unseen grant does change a mark: a dlock Lock that
//!    names a key its connection already holds as a lease replaces that key's record ("a
//!    re-lock replaces the old record"), so before giving such a Lock up by closing, the client
//!    clears the key's mark (no lease: the key became connection-bound, the close releases it)
//!    or moves its bound to the earlier of the old one and send time + the new lease.
//! 6. dlock is re-entrant: a grant to the connection that owns the mark is not a conflict.
//! 7. Data checks (memcache): a holder writes a unique value and reads it back (another
//!    value means someone else modified a locked item); a non-holder's set or delete that
//!    succeeds while another owner's plain mark stood from before the request until after the
//!    reply (the same mark epoch at both instants) is counted as a double grant too.
//! 8. lockd SYNC must list every name whose plain mark stood from before the request until
//!    after the reply (an error otherwise).
//!
//! Rule 11 (fencing tokens) holds in every mode; it is listed after the cluster rules below.
//!
//! # Cluster mode (`--cluster N`, `cluster.rs`)
//!
//! N nodes on loopback, each peer link through a proxy of its own (`proxy.rs`), clients
//! picking a node at random for each connection, and a fault thread: every 1.5-4 s one of
//! SIGKILL a random node or the leader (restarted 1-3 s later with its data directory), SIGSTOP
//! a node for the session timeout plus 0.2-1.5 s, SIGTERM and restart, a node cut off both ways
//! (blackhole or refused connections) for 1-3 s, one direction between the leader and a
//! follower cut for 1-3 s. Each fault ends (healed, restarted, continued) and every node serves
//! again (within 30 s, else an error) before the next, so at most one node is down or cut off
//! at a time. With `--peer-tls` every node also gets a certificate of one CA (made in the
//! soak's directory with `holdfast_testkit::pki`) and runs with `--peer-tls-cert`,
//! `--peer-tls-key` and `--peer-tls-ca`; the proxies forward the TLS bytes unchanged, and the
//! soak checks at the start that every node says its peer links are TLS. Cluster mode
//! (`docs/cluster.md`) adds two more rules:
//!
//! 9. A no-quorum answer (`SERVER_ERROR no quorum`, binary status 0x0086, old ERR echoing
//!    the payload, dlock General "no quorum") is an accepted outcome, and the connection must
//!    close after it (an error if it stays open for 15 s). A connection a node closes or
//!    refuses (killed, stopped, fenced, its sessions expired) is accepted too. Either way the
//!    client clears its marks when it sees the close: the cluster releases connection-bound
//!    locks (or makes orphans) only when the session ends, which is later (a node cut off
//!    fences itself, closing its clients, before the majority may expire its sessions). No
//!    grant is assumed from a request answered no quorum (it may still commit; the close
//!    that follows ends its session: an unseen grant, as in rule 5).
//! 10. A mark of a client of node N excludes others only until `alive + session timeout -
//!     election timeout`, where `alive` is the send time of the latest request on that
//!     connection whose reply the client read. That request was committed after it was sent,
//!     so N heard from the leader (and the leader from N) after `alive`. A stopped node cannot
//!     fence itself: the majority expires its sessions after the session timeout. A node that
//!     loses its leader (killed, cut off) fences itself after the session timeout less one
//!     election timeout: it closes its clients' connections, and their closes may commit at
//!     once (a new leader elected with N), while the client thread may read the close only
//!     later (2 loaded cores). The earlier of the two is the bound (send time, not read time,
//!     so that a client thread scheduled late cannot make a false report). A grant after that
//!     bound is not a double grant (counted as past_session_bound), one before it is. The same
//!     bound caps a dlock idle clock; an orphan window left by a close counts from the earlier
//!     of the close and that bound; leases are not tied to sessions. An unsolicited grant
//!     (lockd ACQUIRED after ACK) does not move `alive`. A grant read after its own lease
//!     ended (a reply held up in a stopped node) holds nothing and conflicts with nothing. A
//!     holder's data check that fails after its bound is an error (the node answered a
//!     session that may have ended), not a double grant.
//! 11. **Fencing tokens** (every mode): per name, a grant whose request was *sent* after
//!     another grant of that name was *read* must carry a larger token (`docs/protocol.md`: strictly
//!     greater than every token granted before it). Tokens come from memcached binary Lock's
//!     CAS, `lock_token` after a text lock, dlock's field 7 (every Ok Lock must carry it) and
//!     old's REQ_TOKEN now and then after a grant or ADOPT. Each name keeps its last 64 grants
//!     with a token; older ones are folded into (largest token, latest read time).
//!
//! With `--fill-mb N` (`make soak-cluster` passes SOAK_FILL_MB), N MiB of 1,000-byte items
//! (`fill:<i>`, `fill.rs`) are written through the nodes before the clients and the faults start
//! (the fill's time is not counted in `--seconds`), so that snapshots, compaction and snapshot
//! transfers to restarted or cut-off nodes happen on a real state; at the end a sample of them
//! must be readable, each with its own value, on every node (`fill_checked=` in the last line).
//! The nodes get `--memory` 4 x N MiB (at least 1024) unless the node flags give one.
//!
//! The data-directory sizes and every node's RSS are printed and bounded
//! (`--max-data-dir-kib`, `--max-node-rss-kib`), and at the end (faults stopped, links healed,
//! every node up) every node's `stats` must show nothing held and at most the stats connection,
//! all nodes agreeing. The last line: `soak-cluster: ... faults=kill:..,... result=PASS`.
//!
//! Everything else the protocols promise is checked on the way and counted as an error: every
//! reply's shape and echo, AcquireTimeout not before the wait (minus the tolerance), with busy
//! keys among the requested, idle closes not before the idle timeout, RELEASED for a REL of a
//! held lock, Unlock Ok for held keys, hostile requests closing the connection, no reply
//! missing for 15 s.
//!
//! # At the end
//!
//! Clients stop, release what they hold, close. Then the soak polls `stats` until locks_held,
//! lockd_held, lockd_orphaned, lockd_waiting, dlock_held_keys and dlock_waiting are all 0 (the
//! timeouts have to pass) and curr_connections is 1 (the stats connection), then checks that the
//! daemon's open fds are back to their starting count and its RSS near its starting value, and
//! prints one line: `soak: seconds=... ops=... double_grants=0 errors=0 locks_left=0 ...
//! result=PASS`. Exit status 0 only on PASS. Should connections stay open in the daemon, each is
//! listed with its listener, its TCP state (CLOSE_WAIT: the client closed, the daemon did not)
//! and how the soak's client had ended it, with that connection's last steps.

mod client;
mod cluster;
mod dlock;
mod fill;
mod lockd;
mod mc;
mod model;
mod net;
mod proxy;
mod report;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use client::Ctx;
use model::Model;
use net::{Conn, Res, REPLY_DEADLINE};
use report::Report;

/// The lock counters of `stats` that must all be 0 at the end.
const LOCK_STATS: [&str; 6] = [
    "locks_held",
    "lockd_held",
    "lockd_orphaned",
    "lockd_waiting",
    "dlock_held_keys",
    "dlock_waiting",
];
/// Longest dlock lease the clients take (dlock.rs).
const MAX_LEASE: Duration = Duration::from_millis(500);
const PROGRESS_EVERY: Duration = Duration::from_secs(10);
const SAMPLE_EVERY: Duration = Duration::from_millis(200);

struct Args {
    seconds: u64,
    clients: u32,
    protocols: Vec<String>,
    names: usize,
    seed: u64,
    tolerance: Duration,
    rss_slack_kib: u64,
    assume_orphan_timeout: Option<Duration>,
    holdfast: Option<String>,
    daemon_args: Vec<String>,
    /// Nodes of the cluster to start (0: a single daemon).
    cluster: usize,
    /// Mutual TLS between the nodes (`--peer-tls`).
    peer_tls: bool,
    max_data_dir_kib: u64,
    max_node_rss_kib: u64,
    /// Cluster: MiB of items written before the clients and faults start (`fill.rs`).
    fill_mb: u64,
    memcache: Option<SocketAddr>,
    lockd: Option<SocketAddr>,
    dlock: Option<SocketAddr>,
    pid: Option<u32>,
}

fn parse_args() -> Result<Args, String> {
    let mut o = getopts::Options::new();
    o.optopt(
        "s",
        "seconds",
        "length of the traffic phase (default 600)",
        "N",
    )
    .optopt(
        "c",
        "clients",
        "client threads per protocol (default 20)",
        "N",
    )
    .optopt("n", "names", "lock names per protocol (default 8)", "N")
    .optopt(
        "p",
        "protocols",
        "which clients run (default mc,lockd,dlock)",
        "LIST",
    )
    .optopt(
        "",
        "assume-orphan-timeout-ms",
        "to test the soak itself: believe this orphan timeout instead of the daemon's",
        "MS",
    )
    .optopt("", "seed", "random seed (default: from the clock)", "N")
    .optopt(
        "",
        "tolerance-ms",
        "timer tolerance of the rules (default 5)",
        "MS",
    )
    .optopt(
        "",
        "rss-slack-kib",
        "RSS growth allowed from start to end (default 16384)",
        "KIB",
    )
    .optopt("", "holdfast", "start this daemon binary", "PATH")
    .optopt(
        "",
        "cluster",
        "start this many nodes as one cluster (with --holdfast), with faults",
        "N",
    )
    .optflag(
        "",
        "peer-tls",
        "cluster: mutual TLS between the nodes (a CA and a certificate per node, made in the \
         soak's directory)",
    )
    .optopt(
        "",
        "max-data-dir-kib",
        "cluster: largest data directory allowed at the end (default 262144, plus 4 KiB per \
         KiB of --fill-mb)",
        "KIB",
    )
    .optopt(
        "",
        "max-node-rss-kib",
        "cluster: largest RSS of a node allowed at the end (default 524288, plus 3 KiB per \
         KiB of --fill-mb)",
        "KIB",
    )
    .optopt(
        "",
        "fill-mb",
        "cluster: write this many MiB of 1000-byte items before the clients and the faults \
         start (not counted in --seconds); a sample must be readable on every node at the end \
         (default 0)",
        "MIB",
    )
    .optopt("", "memcache", "attach: memcache address", "ADDR")
    .optopt("", "lockd", "attach: lockd address", "ADDR")
    .optopt("", "dlock", "attach: dlock address", "ADDR")
    .optopt(
        "",
        "pid",
        "attach: the daemon's PID (for RSS and fds)",
        "PID",
    )
    .optflag("h", "help", "this text");
    let m = o
        .parse(std::env::args_os().skip(1))
        .map_err(|e| e.to_string())?;
    if m.opt_present("h") {
        print!(
            "{}",
            o.usage(
                "Usage: holdfast-soak --holdfast PATH [options] [-- DAEMON FLAGS]\n       \
                     holdfast-soak --memcache A --lockd A --dlock A --pid P [options]"
            )
        );
        std::process::exit(0);
    }
    fn num<T: std::str::FromStr>(
        m: &getopts::Matches,
        name: &str,
        default: T,
    ) -> Result<T, String> {
        match m.opt_str(name) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| format!("--{name}: bad value {v:?}")),
        }
    }
    fn addr(m: &getopts::Matches, name: &str) -> Result<Option<SocketAddr>, String> {
        m.opt_str(name)
            .map(|v| {
                v.parse()
                    .map_err(|_| format!("--{name}: bad address {v:?}"))
            })
            .transpose()
    }
    let default_seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let fill_mb: u64 = num(&m, "fill-mb", 0)?;
    let a = Args {
        seconds: num(&m, "seconds", 600)?,
        clients: num(&m, "clients", 20)?,
        protocols: m
            .opt_str("protocols")
            .unwrap_or_else(|| "mc,lockd,dlock".into())
            .split(',')
            .map(str::to_string)
            .collect(),
        names: num(&m, "names", 8)?.max(1),
        seed: num(&m, "seed", default_seed)?,
        tolerance: Duration::from_millis(num(&m, "tolerance-ms", 5)?),
        rss_slack_kib: num(&m, "rss-slack-kib", 16384)?,
        assume_orphan_timeout: m
            .opt_str("assume-orphan-timeout-ms")
            .map(|v| v.parse().map(Duration::from_millis))
            .transpose()
            .map_err(|_| "--assume-orphan-timeout-ms: bad value".to_string())?,
        holdfast: m.opt_str("holdfast"),
        daemon_args: m.free.clone(),
        cluster: num(&m, "cluster", 0)?,
        peer_tls: m.opt_present("peer-tls"),
        max_data_dir_kib: num(&m, "max-data-dir-kib", (256 << 10) + 4 * (fill_mb << 10))?,
        max_node_rss_kib: num(&m, "max-node-rss-kib", (512 << 10) + 3 * (fill_mb << 10))?,
        fill_mb,
        memcache: addr(&m, "memcache")?,
        lockd: addr(&m, "lockd")?,
        dlock: addr(&m, "dlock")?,
        pid: num(&m, "pid", 0)?.into(),
    };
    if a.cluster > 0 && (a.holdfast.is_none() || a.cluster < 3) {
        return Err("--cluster N needs --holdfast PATH and N >= 3".into());
    }
    if a.fill_mb > 0 && a.cluster == 0 {
        return Err("--fill-mb needs --cluster N".into());
    }
    if a.peer_tls && a.cluster == 0 {
        return Err("--peer-tls needs --cluster N".into());
    }
    let attach = a.memcache.is_some() && a.lockd.is_some() && a.dlock.is_some();
    if a.holdfast.is_none() && !(attach && a.pid.is_some_and(|p| p > 0)) {
        return Err("give --holdfast PATH, or --memcache, --lockd, --dlock and --pid".into());
    }
    Ok(a)
}

/// The daemon under test: started by the soak (and stopped by it) or attached to.
struct Daemon {
    child: Option<holdfast_testkit::Daemon>,
    pid: u32,
    memcache: SocketAddr,
    lockd: SocketAddr,
    dlock: SocketAddr,
}

fn start_daemon(path: &str, extra: &[String]) -> Result<Daemon, String> {
    let mut cmd = Command::new(path);
    cmd.args([
        "--memcache",
        "127.0.0.1:0",
        "--lockd",
        "127.0.0.1:0",
        "--dlock",
        "127.0.0.1:0",
        "--counter",
        "off",
    ])
    .args(extra)
    .stderr(Stdio::inherit());
    // SAFETY: prctl is async-signal-safe; between fork and exec it only asks the kernel to send
    // the daemon SIGTERM should the soak die first (panic=abort skips destructors), so that a
    // crashed soak never leaves a daemon behind.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let child = holdfast_testkit::Daemon::spawn(
        &mut cmd,
        &["memcache", "lockd", "dlock"],
        Duration::from_secs(10),
    )
    .map_err(|e| format!("start {path}: {e}"))?;
    let get = |p: &str| child.addr(p).ok_or(format!("no {p} listener line"));
    Ok(Daemon {
        pid: child.pid(),
        memcache: get("memcache")?,
        lockd: get("lockd")?,
        dlock: get("dlock")?,
        child: Some(child),
    })
}

impl Daemon {
    fn alive(&mut self) -> bool {
        match &mut self.child {
            Some(c) => c.is_running(),
            None => std::path::Path::new(&format!("/proc/{}", self.pid)).exists(),
        }
    }

    fn rss_kib(&self) -> u64 {
        holdfast_testkit::rss_kib(self.pid).unwrap_or(0)
    }

    /// The daemon's TCP sockets that are not listeners: "memcache CLOSE_WAIT 127.0.0.1:PORT"
    /// (which listener's port, the kernel's TCP state, the client's address).
    fn connections(&self) -> Vec<(String, u16)> {
        let mut inodes = std::collections::HashSet::new();
        if let Ok(dir) = std::fs::read_dir(format!("/proc/{}/fd", self.pid)) {
            for e in dir.flatten() {
                if let Ok(link) = std::fs::read_link(e.path()) {
                    let link = link.to_string_lossy().into_owned();
                    if let Some(n) = link
                        .strip_prefix("socket:[")
                        .and_then(|l| l.strip_suffix(']'))
                    {
                        inodes.insert(n.to_string());
                    }
                }
            }
        }
        let ports = [
            (self.memcache.port(), "memcache"),
            (self.lockd.port(), "lockd"),
            (self.dlock.port(), "dlock"),
        ];
        let port_of = |hex: &str| {
            hex.rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok())
                .unwrap_or(0)
        };
        let mut out = Vec::new();
        for table in ["tcp", "tcp6"] {
            let text = std::fs::read_to_string(format!("/proc/{}/net/{table}", self.pid))
                .unwrap_or_default();
            for line in text.lines().skip(1) {
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.len() < 10 || !inodes.contains(f[9]) || f[3] == "0A" {
                    continue; // not the daemon's, or a listener
                }
                let state = match f[3] {
                    "01" => "ESTABLISHED",
                    "06" => "TIME_WAIT",
                    "07" => "CLOSE",
                    "08" => "CLOSE_WAIT",
                    "09" => "LAST_ACK",
                    other => other,
                };
                let local = port_of(f[1]);
                let name = ports.iter().find(|p| p.0 == local).map_or("?", |p| p.1);
                let client = port_of(f[2]);
                out.push((format!("{name} {state} client_port={client}"), client));
            }
        }
        out
    }

    fn fds(&self) -> u64 {
        holdfast_testkit::open_fds(self.pid) as u64
    }

    /// SIGTERM by PID, then wait (at most 10 s) for a clean exit. Attached daemons are left
    /// running.
    fn stop(&mut self) -> Result<(), String> {
        let Some(child) = &mut self.child else {
            return Ok(());
        };
        match child.terminate(Duration::from_secs(10)) {
            Ok(st) if st.success() => Ok(()),
            Ok(st) => Err(format!("the daemon exited with {st} on SIGTERM")),
            Err(_) => Err("the daemon did not stop within 10 s of SIGTERM".into()),
        }
    }
}

/// One memcached text `stats [group]` over `conn`.
fn stats(conn: &mut Conn, group: &str) -> Res<HashMap<String, u64>> {
    let req = if group.is_empty() {
        "stats\r\n".to_string()
    } else {
        format!("stats {group}\r\n")
    };
    conn.send(req.as_bytes())?;
    conn.recv(Instant::now() + REPLY_DEADLINE, |buf| {
        let Some(end) = buf.windows(5).position(|w| w == b"END\r\n") else {
            return Ok(None);
        };
        let text = String::from_utf8_lossy(&buf[..end]);
        let mut map = HashMap::new();
        for line in text.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                ["STAT", name, value] => {
                    if let Ok(v) = value.parse() {
                        map.insert(name.to_string(), v);
                    }
                }
                _ => return Err(format!("stats: unexpected line {line:?}")),
            }
        }
        Ok(Some((map, end + 5)))
    })
}

fn locks_left(s: &HashMap<String, u64>) -> u64 {
    LOCK_STATS
        .iter()
        .map(|k| s.get(*k).copied().unwrap_or(0))
        .sum()
}

struct Peaks {
    rss: u64,
    fds: u64,
}

impl Peaks {
    fn sample(&mut self, d: &Daemon) -> (u64, u64) {
        let (rss, fds) = (d.rss_kib(), d.fds());
        self.rss = self.rss.max(rss);
        self.fds = self.fds.max(fds);
        (rss, fds)
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("holdfast-soak: {e}");
            return ExitCode::from(2);
        }
    };
    if args.cluster > 0 {
        return cluster::main(&args, args.holdfast.as_deref().unwrap_or_default());
    }
    let mut daemon = match &args.holdfast {
        Some(path) => match start_daemon(path, &args.daemon_args) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("holdfast-soak: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => Daemon {
            child: None,
            pid: args.pid.unwrap_or(0),
            memcache: args.memcache.expect("checked"),
            lockd: args.lockd.expect("checked"),
            dlock: args.dlock.expect("checked"),
        },
    };
    let pass = run(&args, &mut daemon);
    let stopped = daemon.stop();
    if let Err(e) = &stopped {
        eprintln!("soak: error: {e}");
    }
    if pass && stopped.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The whole soak against a started daemon; prints the report line; true on PASS.
fn run(args: &Args, daemon: &mut Daemon) -> bool {
    let report = Arc::new(Report::new());
    let fds_start = daemon.fds();
    let rss_start = daemon.rss_kib();
    let mut peaks = Peaks {
        rss: rss_start,
        fds: fds_start,
    };
    let mut sc = match Conn::connect(daemon.memcache) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("soak: error: stats connection: {e}");
            return false;
        }
    };
    let stats_port = sc.local_port();
    let settings = match stats(&mut sc, "settings") {
        Ok(s) => s,
        Err(e) => {
            eprintln!("soak: error: stats settings: {e}");
            return false;
        }
    };
    let orphan_timeout = Duration::from_millis(
        settings
            .get("lockd_orphan_timeout_ms")
            .copied()
            .unwrap_or(5000),
    );
    let orphan_timeout = args.assume_orphan_timeout.unwrap_or(orphan_timeout);
    let idle_timeout = Duration::from_millis(
        settings
            .get("dlock_idle_timeout_ms")
            .copied()
            .unwrap_or(60000),
    );
    println!(
        "soak: pid={} memcache={} lockd={} dlock={} seconds={} clients={}x{} names={} seed={} \
         orphan_timeout_ms={} idle_timeout_ms={} tolerance_ms={}",
        daemon.pid,
        daemon.memcache,
        daemon.lockd,
        daemon.dlock,
        args.seconds,
        args.clients,
        args.protocols.join(","),
        args.names,
        args.seed,
        orphan_timeout.as_millis(),
        idle_timeout.as_millis(),
        args.tolerance.as_millis()
    );
    let started = Instant::now();
    let ctx = Arc::new(Ctx {
        memcache: vec![daemon.memcache],
        lockd: vec![daemon.lockd],
        dlock: vec![daemon.dlock],
        session_timeout: None,
        model: Model::new(args.tolerance, report.clone()),
        report: report.clone(),
        stop_at: started + Duration::from_secs(args.seconds),
        orphan_timeout,
        idle_timeout,
        tolerance: args.tolerance,
        names: args.names,
        abort: AtomicBool::new(false),
        closes: Default::default(),
    });

    let threads = spawn_clients(args, &ctx, &report);

    // Traffic phase: sample the daemon, print progress, notice a dead daemon.
    let mut next_progress = started + PROGRESS_EVERY;
    // Clients finish their last operation, release and leave; a wait may take the reply
    // deadline, an idle wait the idle timeout plus that.
    let join_by = ctx.stop_at + idle_timeout + REPLY_DEADLINE + Duration::from_secs(10);
    let mut dead = false;
    while threads.iter().any(|t| !t.is_finished()) {
        std::thread::sleep(SAMPLE_EVERY);
        if !dead && !daemon.alive() {
            report.error("the daemon died".into());
            ctx.abort.store(true, Ordering::Relaxed);
            dead = true;
        }
        let (rss, fds) = peaks.sample(daemon);
        let now = Instant::now();
        if now >= next_progress {
            next_progress += PROGRESS_EVERY;
            progress(&report, started, rss, fds, &ctx.model);
        }
        if now > join_by {
            report.error("client threads still running long after the end".into());
            print_report(args, &report, None, rss_start, &peaks, 0, fds_start, 0);
            return false;
        }
    }
    for t in threads {
        let _ = t.join();
    }
    if dead {
        print_report(args, &report, None, rss_start, &peaks, 0, fds_start, 0);
        return false;
    }
    let traffic = started.elapsed();

    // Drain: every orphan, lease and idle connection must run out, then nothing is left.
    let drain_by =
        Instant::now() + orphan_timeout.max(idle_timeout).max(MAX_LEASE) + Duration::from_secs(10);
    let mut last = HashMap::new();
    loop {
        match stats(&mut sc, "") {
            Ok(s) => last = s,
            Err(e) => {
                report.error(format!("stats after the run: {e}"));
                break;
            }
        }
        peaks.sample(daemon);
        let conns = last.get("curr_connections").copied().unwrap_or(0);
        if locks_left(&last) == 0 && conns <= 1 {
            break;
        }
        if Instant::now() > drain_by {
            leaked_connections(daemon, &ctx, stats_port);
            let left: Vec<String> = LOCK_STATS
                .iter()
                .chain(&["curr_connections"])
                .map(|k| format!("{k}={}", last.get(*k).copied().unwrap_or(0)))
                .collect();
            report.error(format!(
                "{} s after the clients left, still {}",
                (drain_by - started - traffic).as_secs(),
                left.join(" ")
            ));
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let locks = locks_left(&last);
    let summary: Vec<String> = [
        "total_connections",
        "lock_grants",
        "lockd_grants",
        "lockd_orphan_expiries",
        "lockd_adoptions",
        "dlock_grants",
        "dlock_timeouts",
        "dlock_lease_expiries",
        "dlock_idle_disconnects",
    ]
    .iter()
    .map(|k| format!("{k}={}", last.get(*k).copied().unwrap_or(0)))
    .collect();
    println!("soak: server {}", summary.join(" "));
    sc.close(false);

    // The daemon's fds: back to the start once it has seen the stats connection close.
    let fd_by = Instant::now() + Duration::from_secs(5);
    let mut fds_end = daemon.fds();
    while fds_end > fds_start && Instant::now() < fd_by {
        std::thread::sleep(Duration::from_millis(50));
        fds_end = daemon.fds();
    }
    let rss_end = daemon.rss_kib();
    if fds_end > fds_start {
        leaked_connections(daemon, &ctx, stats_port);
        report.error(format!(
            "the daemon has {fds_end} fds open, {fds_start} at the start"
        ));
    }
    if rss_end > rss_start + args.rss_slack_kib {
        report.error(format!(
            "the daemon's RSS grew from {rss_start} KiB to {rss_end} KiB (more than {} KiB)",
            args.rss_slack_kib
        ));
    }
    print_report(
        args,
        &report,
        Some(locks),
        rss_start,
        &peaks,
        rss_end,
        fds_start,
        fds_end,
    )
}

/// Start `--clients` threads per protocol.
fn spawn_clients(args: &Args, ctx: &Arc<Ctx>, report: &Report) -> Vec<std::thread::JoinHandle<()>> {
    let mut threads = Vec::new();
    type Body = fn(Arc<Ctx>, u32, u64);
    let kinds: [(&str, Body); 3] = [
        ("mc", mc::run),
        ("lockd", lockd::run),
        ("dlock", dlock::run),
    ];
    let mut id = 0u32;
    for (kind, body) in kinds {
        if !args.protocols.iter().any(|p| p == kind) {
            continue;
        }
        for _ in 0..args.clients {
            id += 1;
            let (ctx, seed, me) = (ctx.clone(), args.seed, id);
            let t = std::thread::Builder::new()
                .name(format!("{kind}-{me}"))
                .stack_size(256 << 10)
                .spawn(move || body(ctx, me, seed));
            match t {
                Ok(t) => threads.push(t),
                Err(e) => report.error(format!("spawn a client thread: {e}")),
            }
        }
    }
    threads
}

/// Print the daemon's connections still open, with how the soak's client ended each one.
fn leaked_connections(daemon: &Daemon, ctx: &Ctx, stats_port: u16) {
    for (text, port) in daemon.connections() {
        let how = if port == stats_port {
            "the soak's stats connection".into()
        } else {
            ctx.closes
                .get(port)
                .unwrap_or_else(|| "not a client connection of this run".into())
        };
        eprintln!("soak: still open in the daemon: {text}: {how}");
    }
}

fn progress(report: &Report, started: Instant, rss: u64, fds: u64, model: &Model) {
    let secs = started.elapsed().as_secs_f64();
    let ops = report.ops.load(Ordering::Relaxed);
    let counters: Vec<String> = report
        .c
        .snapshot()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let (held, left) = model.counts();
    println!(
        "soak: t={secs:.0}s ops={ops} ops_per_s={:.0} double_grants={} errors={} marks_held={held} \
         marks_left={left} rss_kib={rss} fds={fds} {}",
        ops as f64 / secs,
        report.double_grants.load(Ordering::Relaxed),
        report.errors.load(Ordering::Relaxed),
        counters.join(" ")
    );
}

#[allow(clippy::too_many_arguments)]
fn print_report(
    args: &Args,
    report: &Report,
    locks: Option<u64>,
    rss_start: u64,
    peaks: &Peaks,
    rss_end: u64,
    fds_start: u64,
    fds_end: u64,
) -> bool {
    let pass = report.failures() == 0 && locks == Some(0);
    let counters: Vec<String> = report
        .c
        .snapshot()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    println!("soak: clients {}", counters.join(" "));
    println!(
        "soak: seconds={} ops={} double_grants={} errors={} locks_left={} rss_start_kib={} \
         rss_peak_kib={} rss_end_kib={} fds_start={} fds_peak={} fds_end={} result={}",
        args.seconds,
        report.ops.load(Ordering::Relaxed),
        report.double_grants.load(Ordering::Relaxed),
        report.errors.load(Ordering::Relaxed),
        locks.map_or("?".to_string(), |l| l.to_string()),
        rss_start,
        peaks.rss,
        rss_end,
        fds_start,
        peaks.fds,
        fds_end,
        if pass { "PASS" } else { "FAIL" }
    );
    pass
}
