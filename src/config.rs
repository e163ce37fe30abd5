//! Command-line flags, parsed raw with getopts and then validated into a typed [`Config`].
//!
//! The flags and their defaults: `holdfast --help`, and "Flags" in the README.

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

/// Everything the daemon needs to start, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// memcached text + binary listener; `None` when `off`.
    pub memcache: Option<SocketAddr>,
    /// old lock-daemon listener.
    pub lockd: Option<SocketAddr>,
    /// dlock listener.
    pub dlock: Option<SocketAddr>,
    /// yrmcds counter-protocol listener.
    pub counter: Option<SocketAddr>,
    pub threads: usize,
    pub memory_limit: usize,
    pub max_item_size: usize,
    pub max_connections: usize,
    pub orphan_timeout_ms: u64,
    pub dlock_idle_timeout_ms: u64,
    pub dlock_max_keys: usize,
    pub dlock_max_message: usize,
    pub dlock_token: Option<String>,
    /// Close a connection whose unread output has stayed at or above the high-water mark with no
    /// write progress for this long; 0: never (the hard output cap still applies).
    pub client_stall_timeout_ms: u64,
    /// The admin HTTP port; `None` when `off`.
    pub admin: Option<SocketAddr>,
    /// Whether `--admin` was given: a default admin address that cannot be bound (another
    /// daemon has it) is a warning, an explicit one an error.
    pub admin_explicit: bool,
    pub log_level: crate::log::Level,
    /// Which server the memcached port answers like where memcached and yrmcds differ
    /// (`docs/compat.md`).
    pub compat: Compat,
    /// Cluster mode (`--peers`); `None`: the single-node daemon.
    pub cluster: Option<ClusterConfig>,
    /// Certificates, keys and token files (`--tls-*`, `--peer-tls-*`, `--*-token-file`,
    /// `--memcache-auth-file`); loaded and checked at start by [`crate::tls::SecretStore`].
    pub secrets: crate::tls::SecretFiles,
    /// Listeners given with the `notls:` prefix: plain TCP even with `--tls-cert`.
    pub notls: NoTls,
    /// A TLS connection that has not finished its handshake this long after it was accepted is
    /// closed.
    pub tls_handshake_timeout_ms: u64,
}

/// Which listeners were given as `notls:ADDR`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoTls {
    pub memcache: bool,
    pub lockd: bool,
    pub dlock: bool,
    pub counter: bool,
    pub admin: bool,
}

/// A flag that the daemon could only find wrong once it started (a `--data-dir` in use, a
/// `--peers` that disagrees with the data directory): reported in one line, exit status 2,
/// like a flag refused at parsing.
#[derive(Debug)]
pub struct BadFlag(pub String);

impl std::fmt::Display for BadFlag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadFlag {}

/// The cluster flags, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// This node's id, one of `peers`' (1 to 65535).
    pub node_id: u16,
    /// Every node of the initial cluster, this one included, and where it listens for peers.
    pub peers: BTreeMap<u64, SocketAddr>,
    /// The host of each `--peers` entry as given (an IP address or a DNS name, without
    /// brackets): with peer TLS, the name that node's certificate must carry.
    pub peer_hosts: BTreeMap<u64, String>,
    pub data_dir: PathBuf,
    pub election_timeout_ms: u64,
    pub session_timeout_ms: u64,
    /// Start outside the cluster, as a node that `cluster add` will add (an empty data directory
    /// then waits for the leader's snapshot instead of founding a cluster).
    pub join: bool,
    pub on_quorum_loss: Option<String>,
}

/// `--compat`: whose answers the memcached port gives where memcached and yrmcds differ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compat {
    #[default]
    Memcached,
    Yrmcds,
}

/// What the command line asked for.
#[derive(Debug)]
// Built once at startup and matched at once: boxing the config would only cost every caller.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    Run(Config),
    Help(String),
    Version,
}

const DEFAULT_MEMCACHE: &str = "127.0.0.1:11211";
const DEFAULT_LOCKD: &str = "127.0.0.1:2626";
const DEFAULT_DLOCK: &str = "127.0.0.1:2627";
const DEFAULT_ADMIN: &str = "127.0.0.1:2629";
/// yrmcds's `counter.port` default.
const DEFAULT_COUNTER: &str = "127.0.0.1:11215";
/// memcached's default `-m 64` is small for a lock server: 1 GiB.
const DEFAULT_MEMORY_MIB: usize = 1024;
const DEFAULT_MAX_ITEM_SIZE: usize = 1024 * 1024;
const DEFAULT_MAX_CONNECTIONS: usize = 65536;
const DEFAULT_ORPHAN_TIMEOUT_MS: u64 = 5000;
const DEFAULT_DLOCK_IDLE_TIMEOUT_MS: u64 = 60_000;
const DEFAULT_DLOCK_MAX_KEYS: usize = 100;
const DEFAULT_DLOCK_MAX_MESSAGE: usize = 1024 * 1024;
/// A client that takes none of its replies for 10 s is gone or hostile; one that reads at all,
/// however slowly, resets the clock. Long enough for a paused process or a congested link.
const DEFAULT_CLIENT_STALL_TIMEOUT_MS: u64 = 10_000;
/// `--tls-handshake-timeout`'s default (a handshake takes a few round trips).
const DEFAULT_TLS_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// The smallest item limit that still holds a key and a useful value; memcached's own minimum
/// (`-I`) is 1 KiB.
const MIN_ITEM_SIZE: usize = 1024;
/// The binary protocol's 32-bit body length bounds the item size.
const MAX_ITEM_SIZE_LIMIT: usize = 1 << 30;
/// The largest `--max-item-size` in cluster mode: an entry holds up to its cap of requests
/// and one more (`cluster::node::MAX_ENTRY_BYTES`), and must fit one log record
/// (64 MiB) and one peer frame (the node's frame cap grows with it).
pub const MAX_CLUSTER_ITEM_SIZE: usize = 32 << 20;

fn options() -> getopts::Options {
    let mut o = getopts::Options::new();
    o.optopt(
        "m",
        "memcache",
        "memcached text+binary listener (or off)",
        "ADDR",
    )
    .optopt("l", "lockd", "old lock-daemon listener (or off)", "ADDR")
    .optopt("d", "dlock", "dlock listener (or off)", "ADDR")
    .optopt("", "counter", "yrmcds counter listener (or off)", "ADDR")
    .optopt(
        "t",
        "threads",
        "I/O threads; 1 runs the owner in the one I/O thread (default: 1 up to 2 cores, else cores-1)",
        "N",
    )
    .optopt(
        "M",
        "memory",
        "item store memory limit (default 1024)",
        "MIB",
    )
    .optopt(
        "I",
        "max-item-size",
        "largest memcached value (default 1048576)",
        "BYTES",
    )
    .optopt(
        "c",
        "max-connections",
        "connection limit (default 65536)",
        "N",
    )
    .optopt(
        "",
        "orphan-timeout",
        "lockd orphan timeout (default 5000)",
        "MS",
    )
    .optopt(
        "",
        "dlock-idle-timeout",
        "dlock idle disconnect (default 60000)",
        "MS",
    )
    .optopt(
        "",
        "dlock-max-keys",
        "dlock keys per request (default 100)",
        "N",
    )
    .optopt(
        "",
        "dlock-max-message",
        "dlock largest frame (default 1048576)",
        "BYTES",
    )
    .optopt(
        "",
        "dlock-token",
        "dlock access token (default none)",
        "TOKEN",
    )
    .optopt(
        "",
        "client-stall-timeout",
        "close a client that reads none of its pending replies this long (default 10000, 0: never)",
        "MS",
    )
    .optopt(
        "",
        "admin",
        "admin HTTP port: /metrics /locks /healthz / (default 127.0.0.1:2629, or off)",
        "ADDR",
    )
    .optopt(
        "",
        "log-level",
        "error, warn, info or debug (default info)",
        "LEVEL",
    )
    .optopt(
        "",
        "compat",
        "answer like memcached or yrmcds where they differ (default memcached)",
        "memcached|yrmcds",
    )
    .optopt(
        "",
        "node-id",
        "cluster mode: this node's id, one of --peers' (1 to 65535)",
        "N",
    )
    .optopt(
        "",
        "peers",
        "cluster mode: every node, this one included: 1=HOST:PORT,2=HOST:PORT,3=HOST:PORT",
        "LIST",
    )
    .optopt(
        "",
        "data-dir",
        "cluster mode: this node's Raft log and snapshots (required with --peers)",
        "DIR",
    )
    .optopt(
        "",
        "election-timeout",
        "cluster mode: Raft election timeout (default 1000)",
        "MS",
    )
    .optopt(
        "",
        "session-timeout",
        "cluster mode: how long the majority waits for an unreachable node's sessions (default 3 x election timeout)",
        "MS",
    )
    .optflag(
        "",
        "join",
        "cluster mode: start as a node that `cluster add` will add",
    )
    .optopt(
        "",
        "on-quorum-loss",
        "cluster mode: program run when this node loses and regains the quorum",
        "PROGRAM",
    )
    .optopt(
        "",
        "tls-cert",
        "PEM certificate chain: every client listener not given as notls:ADDR speaks TLS",
        "FILE",
    )
    .optopt(
        "",
        "tls-key",
        "PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1; mode 600)",
        "FILE",
    )
    .optopt(
        "",
        "tls-client-ca",
        "TLS clients must present a certificate signed by one of these CAs",
        "FILE",
    )
    .optopt(
        "",
        "tls-handshake-timeout",
        "close a TLS connection whose handshake has not finished this long (default 10000)",
        "MS",
    )
    .optopt(
        "",
        "peer-tls-cert",
        "cluster mode: this node's certificate for its peers (mutual TLS)",
        "FILE",
    )
    .optopt(
        "",
        "peer-tls-key",
        "cluster mode: the private key of --peer-tls-cert (mode 600)",
        "FILE",
    )
    .optopt(
        "",
        "peer-tls-ca",
        "cluster mode: peers must present a certificate signed by this CA",
        "FILE",
    )
    .optopt(
        "",
        "memcache-auth-file",
        "memcached clients must authenticate (SASL PLAIN or text auth) as a user:password line of FILE",
        "FILE",
    )
    .optopt(
        "",
        "dlock-token-file",
        "dlock access token, the first line of FILE (mode 600)",
        "FILE",
    )
    .optopt(
        "",
        "admin-token-file",
        "admin requests but /healthz and /metrics need this token (Bearer, or Basic password)",
        "FILE",
    )
    .optflag("h", "help", "print this help")
    .optflag("V", "version", "print the version");
    o
}

/// The default `--threads` for a machine with `cores` cores. Measured on 2 cores (make bench,
/// 2026-11-23): one I/O thread running the owner itself (run to completion) beats two workers
/// plus the owner thread on every row, depth 1 and 16, by 7-45%: with the load generator on the
/// same machine, a third busy thread only adds hand-offs and wake-ups. With more cores, the
/// owner's ceiling (millions of operations a second, `make owner-ceiling`) leaves room for
/// parallel I/O: one worker per core but the one the owner thread needs (not measured here, a
/// machine with more cores was not available).
pub fn default_threads(cores: usize) -> usize {
    if cores <= 2 {
        1
    } else {
        cores - 1
    }
}

/// Parse the arguments after the program name.
pub fn parse<I, S>(args: I) -> Result<Command, String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let opts = options();
    let m = opts.parse(args).map_err(|e| e.to_string())?;
    if m.opt_present("help") {
        let brief = "Usage: holdfast [options]\n       holdfast cluster status|add ID=HOST:PORT|remove ID [--admin HOST:PORT]\n\n\
                     A lock server: memcached (with yrmcds locks), the old lock-daemon protocol, \
                     dlock and yrmcds counters; one node, or a 3-5 node cluster (--peers).";
        return Ok(Command::Help(opts.usage(brief)));
    }
    if m.opt_present("version") {
        return Ok(Command::Version);
    }
    if let Some(extra) = m.free.first() {
        return Err(format!("unexpected argument '{extra}'"));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let default_threads = default_threads(cores);
    let memory_mib: usize = number(&m, "memory", DEFAULT_MEMORY_MIB, 1, 1 << 30)?;
    let mut notls = NoTls::default();
    let config = Config {
        memcache: address(&m, "memcache", DEFAULT_MEMCACHE, &mut notls.memcache)?,
        lockd: address(&m, "lockd", DEFAULT_LOCKD, &mut notls.lockd)?,
        dlock: address(&m, "dlock", DEFAULT_DLOCK, &mut notls.dlock)?,
        counter: address(&m, "counter", DEFAULT_COUNTER, &mut notls.counter)?,
        threads: number(&m, "threads", default_threads, 1, 1024)?,
        memory_limit: memory_mib.saturating_mul(1024 * 1024),
        max_item_size: number(
            &m,
            "max-item-size",
            DEFAULT_MAX_ITEM_SIZE,
            MIN_ITEM_SIZE,
            MAX_ITEM_SIZE_LIMIT,
        )?,
        max_connections: number(&m, "max-connections", DEFAULT_MAX_CONNECTIONS, 1, 1 << 24)?,
        orphan_timeout_ms: number(
            &m,
            "orphan-timeout",
            DEFAULT_ORPHAN_TIMEOUT_MS,
            0,
            u32::MAX as u64,
        )?,
        dlock_idle_timeout_ms: number(
            &m,
            "dlock-idle-timeout",
            DEFAULT_DLOCK_IDLE_TIMEOUT_MS,
            0,
            u32::MAX as u64,
        )?,
        dlock_max_keys: number(&m, "dlock-max-keys", DEFAULT_DLOCK_MAX_KEYS, 1, 1 << 20)?,
        dlock_max_message: number(
            &m,
            "dlock-max-message",
            DEFAULT_DLOCK_MAX_MESSAGE,
            64,
            1 << 30,
        )?,
        dlock_token: m.opt_str("dlock-token"),
        client_stall_timeout_ms: number(
            &m,
            "client-stall-timeout",
            DEFAULT_CLIENT_STALL_TIMEOUT_MS,
            0,
            u32::MAX as u64,
        )?,
        admin: address(&m, "admin", DEFAULT_ADMIN, &mut notls.admin)?,
        admin_explicit: m.opt_present("admin"),
        log_level: match m.opt_str("log-level") {
            None => crate::log::Level::Info,
            Some(l) => crate::log::Level::parse(&l)
                .ok_or_else(|| format!("--log-level {l}: one of error, warn, info, debug"))?,
        },
        compat: match m.opt_str("compat").as_deref() {
            None | Some("memcached") => Compat::Memcached,
            Some("yrmcds") => Compat::Yrmcds,
            Some(other) => return Err(format!("--compat {other}: must be memcached or yrmcds")),
        },
        cluster: cluster(&m)?,
        secrets: secret_files(&m)?,
        notls,
        tls_handshake_timeout_ms: number(
            &m,
            "tls-handshake-timeout",
            DEFAULT_TLS_HANDSHAKE_TIMEOUT_MS,
            1,
            u32::MAX as u64,
        )?,
    };
    if config.dlock_token.is_some() && config.secrets.dlock_token.is_some() {
        return Err("--dlock-token and --dlock-token-file: give one".into());
    }
    if config.cluster.is_some() && config.max_item_size > MAX_CLUSTER_ITEM_SIZE {
        return Err(format!(
            "--max-item-size {} is over {} with --peers: a value travels in one Raft entry, \
             which a peer frame and a log record must hold",
            config.max_item_size, MAX_CLUSTER_ITEM_SIZE
        ));
    }
    if config.cluster.is_some() && config.dlock_max_message > MAX_CLUSTER_ITEM_SIZE {
        return Err(format!(
            "--dlock-max-message {} is over {} with --peers: a dlock request travels in one \
             Raft entry, which a peer frame and a log record must hold",
            config.dlock_max_message, MAX_CLUSTER_ITEM_SIZE
        ));
    }
    if config.secrets.peer.is_some() && config.cluster.is_none() {
        return Err("--peer-tls-cert needs --peers (cluster mode)".into());
    }
    if config.memcache.is_none()
        && config.lockd.is_none()
        && config.dlock.is_none()
        && config.counter.is_none()
    {
        return Err("every listener is off: nothing to serve".into());
    }
    Ok(Command::Run(config))
}

/// Default `--election-timeout`.
const DEFAULT_ELECTION_TIMEOUT_MS: u64 = 1000;

/// The cluster flags: all or none (without `--peers` every other cluster flag is an error, so
/// that a typo cannot start a single node that the operator believes replicated).
fn cluster(m: &getopts::Matches) -> Result<Option<ClusterConfig>, String> {
    let Some(list) = m.opt_str("peers") else {
        for flag in [
            "node-id",
            "data-dir",
            "election-timeout",
            "session-timeout",
            "join",
            "on-quorum-loss",
        ] {
            if m.opt_present(flag) {
                return Err(format!("--{flag} needs --peers (cluster mode)"));
            }
        }
        return Ok(None);
    };
    let peers = parse_peers(&list)?;
    let node_id: u16 = number(m, "node-id", 0, 1, u16::MAX)?;
    if node_id == 0 {
        return Err("--peers needs --node-id".into());
    }
    if !peers.contains_key(&u64::from(node_id)) {
        return Err(format!("--node-id {node_id} is not one of --peers"));
    }
    let data_dir = m
        .opt_str("data-dir")
        .map(PathBuf::from)
        .ok_or("--peers needs --data-dir")?;
    let election_timeout_ms = number(
        m,
        "election-timeout",
        DEFAULT_ELECTION_TIMEOUT_MS,
        10,
        600_000,
    )?;
    let session_timeout_ms = number(
        m,
        "session-timeout",
        3 * election_timeout_ms,
        election_timeout_ms,
        u32::MAX as u64,
    )?;
    Ok(Some(ClusterConfig {
        node_id,
        peer_hosts: peer_hosts(&list),
        peers,
        data_dir,
        election_timeout_ms,
        session_timeout_ms,
        join: m.opt_present("join"),
        on_quorum_loss: m.opt_str("on-quorum-loss"),
    }))
}

/// `1=HOST:PORT,2=HOST:PORT,...`: ids 1 to 65535, each once, each with an address.
pub fn parse_peers(list: &str) -> Result<BTreeMap<u64, SocketAddr>, String> {
    let mut peers = BTreeMap::new();
    for item in list.split(',').filter(|s| !s.is_empty()) {
        let (id, addr) = item
            .split_once('=')
            .ok_or_else(|| format!("--peers {item}: expected ID=HOST:PORT"))?;
        let id: u16 = id
            .parse()
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| format!("--peers {item}: the id must be 1 to 65535"))?;
        let addr = addr
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| format!("--peers {item}: not an address"))?;
        if peers.insert(u64::from(id), addr).is_some() {
            return Err(format!("--peers: id {id} given twice"));
        }
    }
    if peers.is_empty() {
        return Err("--peers: no nodes".into());
    }
    Ok(peers)
}

/// The host part of each `ID=HOST:PORT` of a list that [`parse_peers`] accepted: `[::1]:2628`
/// gives `::1`, `node2.example:2628` gives `node2.example`.
pub fn peer_hosts(list: &str) -> BTreeMap<u64, String> {
    list.split(',')
        .filter_map(|item| {
            let (id, addr) = item.split_once('=')?;
            let (host, _port) = addr.rsplit_once(':')?;
            let host = host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(host);
            Some((id.parse().ok()?, host.to_string()))
        })
        .collect()
}

/// The line a cluster node logs at start when its peer traffic crosses a network in the clear:
/// without peer TLS, a `--peers` address that is not loopback. None otherwise.
pub fn plaintext_peers_warning(cluster: &ClusterConfig, peer_tls: bool) -> Option<String> {
    if peer_tls {
        return None;
    }
    let exposed: Vec<String> = cluster
        .peers
        .iter()
        .filter(|(_, a)| !a.ip().to_canonical().is_loopback())
        .map(|(id, a)| format!("{id}={a}"))
        .collect();
    (!exposed.is_empty()).then(|| {
        format!(
            "peer traffic is neither encrypted nor authenticated: --peers names {} (not \
             loopback) without --peer-tls-cert/--peer-tls-key/--peer-tls-ca",
            exposed.join(",")
        )
    })
}

/// The secret and certificate files: pairs that go together must come together.
fn secret_files(m: &getopts::Matches) -> Result<crate::tls::SecretFiles, String> {
    let path = |name: &str| m.opt_str(name).map(PathBuf::from);
    let tls = match (path("tls-cert"), path("tls-key")) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        (Some(_), None) => return Err("--tls-cert needs --tls-key".into()),
        (None, Some(_)) => return Err("--tls-key needs --tls-cert".into()),
    };
    let tls_client_ca = path("tls-client-ca");
    if tls_client_ca.is_some() && tls.is_none() {
        return Err("--tls-client-ca needs --tls-cert and --tls-key".into());
    }
    let peer = match (
        path("peer-tls-cert"),
        path("peer-tls-key"),
        path("peer-tls-ca"),
    ) {
        (Some(cert), Some(key), Some(ca)) => Some(crate::tls::PeerFiles { cert, key, ca }),
        (None, None, None) => None,
        _ => return Err("--peer-tls-cert, --peer-tls-key and --peer-tls-ca go together".into()),
    };
    Ok(crate::tls::SecretFiles {
        tls,
        tls_client_ca,
        peer,
        memcache_auth: path("memcache-auth-file"),
        dlock_token: path("dlock-token-file"),
        admin_token: path("admin-token-file"),
    })
}

/// A listener's address: `off`, `HOST:PORT`, or `notls:HOST:PORT` (plain TCP even with
/// `--tls-cert`, memcached's convention), which sets `notls`.
fn address(
    m: &getopts::Matches,
    name: &str,
    default: &str,
    notls: &mut bool,
) -> Result<Option<SocketAddr>, String> {
    let given = m.opt_str(name).unwrap_or_else(|| default.to_string());
    let text = match given.strip_prefix("notls:") {
        Some(rest) => {
            *notls = true;
            rest.to_string()
        }
        None => given,
    };
    if text == "off" {
        return Ok(None);
    }
    let mut addrs = text
        .to_socket_addrs()
        .map_err(|e| format!("--{name} {text}: not an address ({e})"))?;
    addrs
        .next()
        .map(Some)
        .ok_or_else(|| format!("--{name} {text}: resolves to no address"))
}

fn number<T>(m: &getopts::Matches, name: &str, default: T, min: T, max: T) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    let Some(text) = m.opt_str(name) else {
        return Ok(default);
    };
    let v: T = text
        .parse()
        .map_err(|_| format!("--{name} {text}: not a number"))?;
    if v < min || v > max {
        return Err(format!("--{name} {text}: must be between {min} and {max}"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Config, String> {
        match parse(args)? {
            Command::Run(c) => Ok(c),
            other => Err(format!("{other:?}")),
        }
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = run(&[]).unwrap();
        assert_eq!(c.memcache, Some("127.0.0.1:11211".parse().unwrap()));
        assert_eq!(c.lockd, Some("127.0.0.1:2626".parse().unwrap()));
        assert_eq!(c.dlock, Some("127.0.0.1:2627".parse().unwrap()));
        assert_eq!(c.counter, Some("127.0.0.1:11215".parse().unwrap()));
        assert_eq!(c.memory_limit, 1024 << 20);
        assert_eq!(c.max_item_size, 1 << 20);
        assert_eq!(c.max_connections, 65536);
        assert_eq!(c.orphan_timeout_ms, 5000);
        assert_eq!(c.dlock_idle_timeout_ms, 60000);
        assert_eq!(c.dlock_max_keys, 100);
        assert_eq!(c.dlock_max_message, 1 << 20);
        assert_eq!(c.dlock_token, None);
        assert_eq!(c.client_stall_timeout_ms, 10_000);
        assert!(c.threads >= 1);
        assert_eq!(c.admin, Some("127.0.0.1:2629".parse().unwrap()));
        assert!(!c.admin_explicit);
        assert_eq!(c.log_level, crate::log::Level::Info);
        assert_eq!(c.cluster, None);
    }

    /// A request travels in one Raft entry: in cluster mode neither a value nor a dlock
    /// message may be larger than an entry's cap allows.
    #[test]
    fn cluster_mode_caps_the_largest_request() {
        let peers = [
            "--peers",
            "1=127.0.0.1:2628",
            "--node-id",
            "1",
            "--data-dir",
            "d",
        ];
        let with = |extra: &[&str]| {
            let mut a = peers.to_vec();
            a.extend_from_slice(extra);
            run(&a)
        };
        let over = (MAX_CLUSTER_ITEM_SIZE + 1).to_string();
        let at = MAX_CLUSTER_ITEM_SIZE.to_string();
        assert!(with(&["--dlock-max-message", &at]).is_ok());
        let e = with(&["--dlock-max-message", &over]).unwrap_err();
        assert!(e.contains("--dlock-max-message"), "{e}");
        assert!(with(&["--max-item-size", &over]).is_err());
        assert!(
            run(&["--dlock-max-message", &over]).is_ok(),
            "alone, no cap"
        );
    }

    #[test]
    fn cluster_flags_and_their_defaults() {
        let c = run(&[
            "--peers",
            "1=127.0.0.1:2628,2=127.0.0.1:3628,3=127.0.0.1:4628",
            "--node-id",
            "2",
            "--data-dir",
            "/var/lib/holdfast",
        ])
        .unwrap();
        let k = c.cluster.unwrap();
        assert_eq!(k.node_id, 2);
        assert_eq!(k.peers.len(), 3);
        assert_eq!(k.peers[&3], "127.0.0.1:4628".parse().unwrap());
        assert_eq!(k.data_dir, PathBuf::from("/var/lib/holdfast"));
        assert_eq!(k.election_timeout_ms, 1000);
        assert_eq!(k.session_timeout_ms, 3000, "3 x the election timeout");
        assert!(!k.join);
        let c = run(&[
            "--peers",
            "1=127.0.0.1:2628",
            "--node-id",
            "1",
            "--data-dir",
            "d",
            "--election-timeout",
            "200",
        ])
        .unwrap();
        assert_eq!(c.cluster.unwrap().session_timeout_ms, 600);
    }

    #[test]
    fn peer_hosts_keep_the_names_given() {
        let c = run(&[
            "--peers",
            "1=127.0.0.1:2628,2=localhost:3628,3=[::1]:4628",
            "--node-id",
            "1",
            "--data-dir",
            "d",
        ])
        .unwrap();
        let k = c.cluster.unwrap();
        let hosts: Vec<(u64, &str)> = k.peer_hosts.iter().map(|(&i, h)| (i, h.as_str())).collect();
        assert_eq!(hosts, [(1, "127.0.0.1"), (2, "localhost"), (3, "::1")]);
    }

    #[test]
    fn plain_peer_traffic_off_loopback_is_warned_about_once() {
        let cluster = |list: &str| {
            run(&["--peers", list, "--node-id", "1", "--data-dir", "d"])
                .unwrap()
                .cluster
                .unwrap()
        };
        let local = cluster("1=127.0.0.1:2628,2=127.0.0.2:3628,3=[::1]:4628");
        assert_eq!(plaintext_peers_warning(&local, false), None);
        let remote = cluster("1=127.0.0.1:2628,2=192.0.2.7:2628,3=[2001:db8::1]:2628");
        let line = plaintext_peers_warning(&remote, false).expect("a warning");
        assert!(
            line.starts_with("peer traffic is neither encrypted nor authenticated: "),
            "{line}"
        );
        assert!(
            line.contains("2=192.0.2.7:2628,3=[2001:db8::1]:2628"),
            "{line}"
        );
        assert!(!line.contains('\n'));
        assert_eq!(plaintext_peers_warning(&remote, true), None, "peer TLS on");
    }

    #[test]
    fn admin_and_log_level_flags() {
        let c = run(&["--admin", "off", "--log-level", "debug"]).unwrap();
        assert_eq!(c.admin, None);
        assert!(c.admin_explicit);
        assert_eq!(c.log_level, crate::log::Level::Debug);
        let c = run(&["--admin", "127.0.0.1:0"]).unwrap();
        assert_eq!(c.admin, Some("127.0.0.1:0".parse().unwrap()));
        assert!(run(&["--log-level", "loud"]).is_err());
        assert!(run(&["--admin", "nowhere"]).is_err());
    }

    #[test]
    fn off_disables_a_listener_and_port_zero_is_accepted() {
        let c = run(&["--lockd", "off", "--dlock", "127.0.0.1:0", "-t", "3"]).unwrap();
        assert_eq!(c.lockd, None);
        assert_eq!(c.dlock, Some("127.0.0.1:0".parse().unwrap()));
        assert_eq!(c.threads, 3);
    }

    #[test]
    fn bad_flags_are_errors() {
        assert_eq!(super::default_threads(1), 1);
        assert_eq!(super::default_threads(2), 1, "run to completion on 2 cores");
        assert_eq!(super::default_threads(8), 7, "a core for the owner thread");
        assert!(run(&["--threads", "0"]).is_err());
        assert!(run(&["--threads", "x"]).is_err());
        assert!(run(&["--memcache", "nonsense"]).is_err());
        assert!(run(&["--bogus"]).is_err());
        assert!(run(&["--compat", "redis"]).is_err());
        assert_eq!(run(&["--compat", "yrmcds"]).unwrap().compat, Compat::Yrmcds);
        assert_eq!(run(&[]).unwrap().compat, Compat::Memcached);
        assert!(run(&["stray"]).is_err());
        assert!(run(&[
            "--memcache",
            "off",
            "--lockd",
            "off",
            "--dlock",
            "off",
            "--counter",
            "off"
        ])
        .is_err());
        // Cluster flags come all together or not at all.
        assert!(run(&["--node-id", "1"]).is_err());
        assert!(run(&["--peers", "1=127.0.0.1:2628", "--data-dir", "/tmp/x"]).is_err());
        assert!(run(&["--peers", "1=127.0.0.1:2628", "--node-id", "1"]).is_err());
        assert!(run(&[
            "--peers",
            "1=127.0.0.1:2628",
            "--node-id",
            "2",
            "--data-dir",
            "d"
        ])
        .is_err());
        assert!(run(&[
            "--peers",
            "1=127.0.0.1:2628,1=127.0.0.1:2629",
            "--node-id",
            "1",
            "--data-dir",
            "d"
        ])
        .is_err());
        assert!(run(&[
            "--peers",
            "0=127.0.0.1:2628",
            "--node-id",
            "1",
            "--data-dir",
            "d"
        ])
        .is_err());
        assert!(run(&["--peers", "1=nowhere", "--node-id", "1", "--data-dir", "d"]).is_err());
        // The counter listener alone is something to serve.
        assert!(run(&["--memcache", "off", "--lockd", "off", "--dlock", "off"]).is_ok());
    }
}
