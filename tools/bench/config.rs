//! `holdfast-bench` flags: parsed raw with getopts, then validated into a typed [`Config`].
//!
//! Owns: defaults, which protocol can run which workload, and the limits that keep a run bounded.
//! Must not: touch the network.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use holdfast::tls::rustls;

use crate::codec::{supports, Protocol, Req};

const DEFAULT_CONNECTIONS: usize = 50;
const DEFAULT_PIPELINE: usize = 1;
const DEFAULT_THREADS: usize = 1;
const DEFAULT_DURATION_S: f64 = 10.0;
const DEFAULT_WARMUP_S: f64 = 1.0;
const DEFAULT_KEYS: u64 = 10_000;
const DEFAULT_VALUE_SIZE: usize = 32;
/// A bench is a bounded measurement, not a soak test: one hour at most per run.
const MAX_DURATION_S: f64 = 3600.0;
/// Far more than this many connections is a file-limit problem, not a benchmark.
const MAX_CONNECTIONS: usize = 100_000;
/// Requests in flight per connection; the daemon stops parsing a connection at 1024 anyway.
const MAX_PIPELINE: usize = 1024;
const MAX_THREADS: usize = 256;
/// `--server` addresses: a cluster has a handful of nodes.
const MAX_SERVERS: usize = 64;
/// Well under every server's item limit (memcached's default 1 MiB).
const MAX_VALUE_SIZE: usize = 512 * 1024;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Workload {
    /// lock + unlock pairs with the protocol's own locks.
    Lock,
    /// memcached add + delete (how memcached users lock).
    AddDelete,
    /// Redis SET NX PX + DEL.
    Setnx,
    Get,
    Set,
    /// Many connections blocking on few names with old's ACQ.
    Contended,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Lock => "lock",
            Workload::AddDelete => "add-delete",
            Workload::Setnx => "setnx",
            Workload::Get => "get",
            Workload::Set => "set",
            Workload::Contended => "contended",
        }
    }

    fn parse(s: &str) -> Option<Workload> {
        [
            Workload::Lock,
            Workload::AddDelete,
            Workload::Setnx,
            Workload::Get,
            Workload::Set,
            Workload::Contended,
        ]
        .into_iter()
        .find(|w| w.name() == s)
    }

    /// The requests of one operation, in the order they are sent; a pair counts as one op.
    pub fn requests(self) -> &'static [Req] {
        match self {
            Workload::Lock | Workload::Contended => &[Req::Lock, Req::Unlock],
            Workload::AddDelete | Workload::Setnx => &[Req::Add, Req::Delete],
            Workload::Get => &[Req::Get],
            Workload::Set => &[Req::Set],
        }
    }

    /// Whether each connection works on its own disjoint slice of the key space (pairs never
    /// conflict), rather than on random keys of the whole space.
    pub fn disjoint_keys(self) -> bool {
        matches!(self, Workload::Lock | Workload::AddDelete | Workload::Setnx)
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    /// `--server`, one or more: connections go round-robin over them (a cluster's nodes).
    pub servers: Vec<SocketAddr>,
    pub protocol: Protocol,
    pub workload: Workload,
    /// Sockets opened in all (`--connections` times `sockets_per_connection`).
    pub connections: usize,
    /// Operations in flight per socket.
    pub pipeline: usize,
    /// etcd without `--http-pipelining`: each of `--connections` is this many HTTP/1.1 sockets
    /// (the `--pipeline` depth), each with one operation in flight, as one gRPC connection
    /// carries that many concurrent streams; 1 everywhere else.
    pub sockets_per_connection: usize,
    pub threads: usize,
    pub duration: Duration,
    pub warmup: Duration,
    /// Key space (names for `contended`).
    pub keys: u64,
    pub value_size: usize,
    /// Open-loop target in ops/s over all threads; `None`: closed loop.
    pub rate: Option<f64>,
    /// `--tls`: every connection speaks TLS, with this client configuration.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// `--handshakes`: instead of the workload, open connections (with `--tls`, a full handshake, no
    /// session resumption) and one `version` round trip each, as fast as `--threads` allow.
    pub handshakes: bool,
}

impl Config {
    /// The server of socket `global`: the sockets of one `--connections` connection share a
    /// server, and connections go round-robin over the servers.
    pub fn server_for(&self, global: u64) -> SocketAddr {
        let conn = global / self.sockets_per_connection as u64;
        self.servers[(conn % self.servers.len() as u64) as usize]
    }

    /// `--connections` and `--pipeline` as given (etcd's depth may be carried by sockets).
    pub fn requested(&self) -> (usize, usize) {
        (
            self.connections / self.sockets_per_connection,
            self.pipeline * self.sockets_per_connection,
        )
    }

    /// What must be done to the key space before the run: `Some(Req::Set)` to make every key
    /// exist (yrmcds locks need the item; gets should hit), `Some(Req::Clear)` to make sure none
    /// does (add and SET NX must find the key free), `None` for the lock tables.
    pub fn prepare(&self) -> Option<Req> {
        match (self.workload, self.protocol) {
            (Workload::Lock, Protocol::McText | Protocol::McBinary) | (Workload::Get, _) => {
                Some(Req::Set)
            }
            (Workload::AddDelete | Workload::Setnx, _) => Some(Req::Clear),
            _ => None,
        }
    }
}

pub enum Command {
    Run(Config),
    Help(String),
}

fn options() -> getopts::Options {
    let mut o = getopts::Options::new();
    o.optopt(
        "s",
        "server",
        "server address, or several separated by commas: connections go round-robin over them \
         (default: 127.0.0.1 and the protocol's port)",
        "HOST:PORT[,HOST:PORT...]",
    )
    .optopt(
        "p",
        "protocol",
        "memcache-text | memcache-binary | lockd | dlock | redis | counter | etcd (default memcache-text)",
        "NAME",
    )
    .optopt(
        "w",
        "workload",
        "lock | add-delete | setnx | get | set | contended (default lock; setnx for redis)",
        "NAME",
    )
    .optopt(
        "c",
        "connections",
        "client connections in all (default 50)",
        "N",
    )
    .optopt(
        "P",
        "pipeline",
        "operations in flight per connection (default 1)",
        "N",
    )
    .optopt(
        "t",
        "threads",
        "client threads, each with its own event loop (default 1)",
        "N",
    )
    .optopt("d", "duration", "measured seconds (default 10)", "SECONDS")
    .optopt(
        "",
        "warmup",
        "unmeasured seconds before that (default 1)",
        "SECONDS",
    )
    .optopt(
        "k",
        "keys",
        "key space; names for contended (default 10000)",
        "N",
    )
    .optopt(
        "",
        "value-size",
        "value bytes for set/add (default 32)",
        "BYTES",
    )
    .optopt(
        "r",
        "rate",
        "open loop: target ops/s over all threads (default: closed loop)",
        "OPS",
    )
    .optflag(
        "",
        "http-pipelining",
        "etcd: pipeline --pipeline requests on each HTTP/1.1 connection (etcd answers them one \
         after another) instead of opening --pipeline connections per connection",
    )
    .optflag(
        "",
        "tls",
        "speak TLS to the server (the system's CAs unless --tls-ca)",
    )
    .optopt("", "tls-ca", "trust the server certificates this CA signs", "FILE")
    .optopt("", "tls-cert", "client certificate for mutual TLS", "FILE")
    .optopt("", "tls-key", "private key of --tls-cert", "FILE")
    .optflag(
        "",
        "handshakes",
        "measure new connections per second (each with a full TLS handshake under --tls, and \
         one version request) instead of the workload",
    )
    .optflag("h", "help", "print this help");
    o
}

/// `--tls` and its files: the client configuration, or `None` without any of them.
fn tls(m: &getopts::Matches) -> Result<Option<Arc<rustls::ClientConfig>>, String> {
    let path = |f: &str| m.opt_str(f).map(std::path::PathBuf::from);
    let (ca, cert, key) = (path("tls-ca"), path("tls-cert"), path("tls-key"));
    holdfast::tls::client_flags(
        m.opt_present("tls"),
        ca.as_deref(),
        cert.as_deref(),
        key.as_deref(),
    )
}

fn number<T: std::str::FromStr>(m: &getopts::Matches, name: &str, default: T) -> Result<T, String> {
    match m.opt_str(name) {
        None => Ok(default),
        Some(s) => s
            .parse()
            .map_err(|_| format!("--{name}: not a valid number: {s:?}")),
    }
}

fn seconds(m: &getopts::Matches, name: &str, default: f64, min: f64) -> Result<Duration, String> {
    let s: f64 = number(m, name, default)?;
    if !(min..=MAX_DURATION_S).contains(&s) {
        return Err(format!(
            "--{name}: {s} is outside {min}..={MAX_DURATION_S} seconds"
        ));
    }
    Ok(Duration::from_secs_f64(s))
}

fn in_range<T: PartialOrd + std::fmt::Display>(
    name: &str,
    v: T,
    lo: T,
    hi: T,
) -> Result<T, String> {
    if v < lo || v > hi {
        return Err(format!("--{name}: {v} is outside {lo}..={hi}"));
    }
    Ok(v)
}

pub fn parse<I: IntoIterator<Item = std::ffi::OsString>>(args: I) -> Result<Command, String> {
    let opts = options();
    let m = opts.parse(args).map_err(|e| e.to_string())?;
    if m.opt_present("help") {
        let brief = "Usage: holdfast-bench [options]\n\nLoad generator for holdfast, memcached and redis-server \
                     (loopback benchmarks: keep runs short and bounded).";
        return Ok(Command::Help(opts.usage(brief)));
    }
    if let Some(extra) = m.free.first() {
        return Err(format!("unexpected argument {extra:?}"));
    }
    let protocol = match m.opt_str("protocol") {
        None => Protocol::McText,
        Some(s) => Protocol::parse(&s).ok_or_else(|| format!("--protocol: unknown {s:?}"))?,
    };
    let workload = match m.opt_str("workload") {
        None if protocol == Protocol::Redis => Workload::Setnx,
        None => Workload::Lock,
        Some(s) => Workload::parse(&s).ok_or_else(|| format!("--workload: unknown {s:?}"))?,
    };
    let fits = match workload {
        Workload::Setnx => protocol == Protocol::Redis,
        Workload::AddDelete => matches!(protocol, Protocol::McText | Protocol::McBinary),
        Workload::Contended => protocol == Protocol::Lockd,
        w => w.requests().iter().all(|&r| supports(protocol, r)),
    };
    if !fits {
        return Err(format!(
            "--workload {} does not run over --protocol {}",
            workload.name(),
            protocol.name()
        ));
    }
    let servers = match m.opt_str("server") {
        None => vec![SocketAddr::from(([127, 0, 0, 1], protocol.default_port()))],
        Some(list) => {
            let mut servers = Vec::new();
            for s in list.split(',') {
                if servers.len() == MAX_SERVERS {
                    return Err(format!("--server: more than {MAX_SERVERS} addresses"));
                }
                let addr = s
                    .to_socket_addrs()
                    .map_err(|e| format!("--server {s}: {e}"))?
                    .next()
                    .ok_or_else(|| format!("--server {s}: no address"))?;
                servers.push(addr);
            }
            servers
        }
    };
    let mut connections = in_range(
        "connections",
        number(&m, "connections", DEFAULT_CONNECTIONS)?,
        1,
        MAX_CONNECTIONS,
    )?;
    let mut pipeline = in_range(
        "pipeline",
        number(&m, "pipeline", DEFAULT_PIPELINE)?,
        1,
        MAX_PIPELINE,
    )?;
    let http_pipelining = m.opt_present("http-pipelining");
    if http_pipelining && protocol != Protocol::Etcd {
        return Err("--http-pipelining is for --protocol etcd".into());
    }
    let mut sockets_per_connection = 1;
    if protocol == Protocol::Etcd && !http_pipelining {
        // etcd's Go HTTP/1.1 server answers a connection's pipelined requests one at a time;
        // a gRPC client would run `pipeline` concurrent streams on one connection instead.
        sockets_per_connection = pipeline;
        connections = in_range("connections", connections * pipeline, 1, MAX_CONNECTIONS)?;
        pipeline = 1;
    }
    let threads = in_range(
        "threads",
        number(&m, "threads", DEFAULT_THREADS)?,
        1,
        MAX_THREADS,
    )?;
    let keys = in_range(
        "keys",
        number(&m, "keys", DEFAULT_KEYS)?,
        1,
        u64::from(u32::MAX),
    )?;
    let value_size = in_range(
        "value-size",
        number(&m, "value-size", DEFAULT_VALUE_SIZE)?,
        1,
        MAX_VALUE_SIZE,
    )?;
    let rate = match m.opt_str("rate") {
        None => None,
        Some(_) => Some(in_range("rate", number(&m, "rate", 0.0f64)?, 1.0, 1e9)?),
    };
    if threads > connections {
        return Err(format!(
            "--threads {threads} is more than --connections {connections}"
        ));
    }
    if workload.disjoint_keys() && keys < connections as u64 {
        return Err(format!(
            "--keys {keys} is fewer than --connections {connections}: {} gives each connection its own keys",
            workload.name()
        ));
    }
    if workload == Workload::Contended {
        if rate.is_some() {
            return Err(
                "--rate: contended is a closed loop (each holder releases when granted)".into(),
            );
        }
        if pipeline != 1 {
            return Err("--pipeline: contended holds one ACQ per connection".into());
        }
    }
    Ok(Command::Run(Config {
        servers,
        protocol,
        workload,
        connections,
        pipeline,
        sockets_per_connection,
        threads,
        duration: seconds(&m, "duration", DEFAULT_DURATION_S, 0.1)?,
        warmup: seconds(&m, "warmup", DEFAULT_WARMUP_S, 0.0)?,
        keys,
        value_size,
        rate,
        tls: tls(&m)?,
        handshakes: {
            let on = m.opt_present("handshakes");
            if on && !matches!(protocol, Protocol::McText) {
                return Err("--handshakes runs over --protocol memcache-text".into());
            }
            on
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Config, String> {
        match parse(args.iter().map(Into::into))? {
            Command::Run(c) => Ok(c),
            Command::Help(_) => Err("help".into()),
        }
    }

    #[test]
    fn defaults_follow_the_protocol() {
        let c = run(&[]).expect("defaults");
        assert_eq!((c.protocol, c.workload), (Protocol::McText, Workload::Lock));
        assert_eq!(c.servers, ["127.0.0.1:11211".parse().unwrap()]);
        assert_eq!(
            (c.connections, c.pipeline, c.threads, c.keys),
            (50, 1, 1, 10_000)
        );
        assert_eq!(
            (c.duration, c.warmup),
            (Duration::from_secs(10), Duration::from_secs(1))
        );
        assert_eq!(c.rate, None);
        let c = run(&["--protocol", "redis"]).expect("redis");
        assert_eq!((c.workload, c.servers[0].port()), (Workload::Setnx, 6379));
        let c =
            run(&["-p", "lockd", "-w", "contended", "-c", "1000", "-k", "10"]).expect("contended");
        assert_eq!(
            (c.servers[0].port(), c.connections, c.keys),
            (2626, 1000, 10)
        );
    }

    #[test]
    fn workloads_only_run_where_they_mean_something() {
        for (proto, workload) in [
            ("lockd", "get"),
            ("dlock", "add-delete"),
            ("redis", "lock"),
            ("memcache-text", "setnx"),
            ("memcache-binary", "contended"),
        ] {
            assert!(
                run(&["-p", proto, "-w", workload]).is_err(),
                "{proto} {workload}"
            );
        }
        for (proto, workload) in [
            ("lockd", "lock"),
            ("dlock", "lock"),
            ("memcache-binary", "add-delete"),
            ("redis", "get"),
            ("redis", "set"),
        ] {
            assert!(
                run(&["-p", proto, "-w", workload]).is_ok(),
                "{proto} {workload}"
            );
        }
    }

    #[test]
    fn bad_values_are_refused() {
        for args in [
            &["--connections", "0"][..],
            &["--pipeline", "x"],
            &["--duration", "0"],
            &["--rate", "0"],
            &["--threads", "4", "--connections", "2"],
            &["--keys", "10"],
            &["-p", "lockd", "-w", "contended", "--rate", "100"],
            &["--protocol", "http"],
            &["--http-pipelining"],
            &["--server", "127.0.0.1:1,"],
            &["-p", "etcd", "-c", "60000", "-P", "2"],
            &["-p", "etcd", "-w", "add-delete"],
            &["stray"],
        ] {
            assert!(run(args).is_err(), "{args:?}");
        }
    }

    #[test]
    fn prepare_sets_or_clears_the_key_space() {
        let prep = |args: &[&str]| run(args).expect("valid").prepare();
        assert_eq!(prep(&["-p", "memcache-binary"]), Some(Req::Set));
        assert_eq!(prep(&["-p", "lockd"]), None);
        assert_eq!(prep(&["-p", "redis", "-w", "get"]), Some(Req::Set));
        assert_eq!(prep(&["-w", "add-delete"]), Some(Req::Clear));
        assert_eq!(prep(&["-p", "redis"]), Some(Req::Clear));
    }

    #[test]
    fn connections_go_round_robin_over_the_servers() {
        let c = run(&["--server", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "-c", "7"]).unwrap();
        let ports: Vec<u16> = (0..7).map(|g| c.server_for(g).port()).collect();
        assert_eq!(ports, [1, 2, 3, 1, 2, 3, 1]);
        assert_eq!(c.requested(), (7, 1));
    }

    #[test]
    fn etcd_depth_is_carried_by_sockets_unless_http_pipelining() {
        let c = run(&[
            "-p",
            "etcd",
            "-s",
            "127.0.0.1:1,127.0.0.1:2",
            "-c",
            "3",
            "-P",
            "4",
        ])
        .unwrap();
        assert_eq!(
            (c.connections, c.pipeline, c.sockets_per_connection),
            (12, 1, 4)
        );
        assert_eq!(c.requested(), (3, 4));
        // The four sockets of one connection go to one server, like one gRPC connection.
        let ports: Vec<u16> = (0..12).map(|g| c.server_for(g).port()).collect();
        assert_eq!(ports, [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1, 1]);
        let c = run(&["-p", "etcd", "-c", "3", "-P", "4", "--http-pipelining"]).unwrap();
        assert_eq!(
            (c.connections, c.pipeline, c.sockets_per_connection),
            (3, 4, 1)
        );
        assert_eq!((c.servers[0].port(), c.workload), (2379, Workload::Lock));
    }
}
