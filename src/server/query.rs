//! What the admin port asks the owner and what the owner answers: plain data, built on the
//! owner thread in one bounded pass and formatted (Prometheus text, JSON) on the admin thread.
//! The admin port (`crate::admin`) imports these types; the server never imports the admin port.
//!
//! It owns no state and must not reach into the tables: only `owner::exec_admin` does, on the
//! owner thread.

use std::net::SocketAddr;

/// The lock protocols, in the order of the per-protocol arrays: memcache, lockd, dlock, counter.
pub const PROTOCOLS: usize = super::Proto::ALL.len();

use crate::core::Session;

/// Locks listed per request at most, whatever `limit` asks: one listing costs the owner a few
/// milliseconds at most (one pass, a copy of each listed name), so grants are never held up by
/// a big one.
pub const MAX_LIST: usize = 10_000;
/// Locks listed when the request names no `limit`.
pub const DEFAULT_LIST: usize = 1000;
/// Waiters listed per lock at most (the count is always exact).
pub const MAX_WAITERS_LISTED: usize = 100;
/// Holders of a dlock key listed at most (a semaphore's slots; the count is always exact).
pub const MAX_HOLDERS_LISTED: usize = 100;
/// Holders of the native protocol's grants listed per listing at most, all keys together: with
/// their values, a listing copies at most a few MiB on the owner thread.
pub const MAX_GRANTS_LISTED: usize = 10_000;
/// Bytes of a grant's value copied into a listing at most (values are up to 4096 bytes).
pub const MAX_VALUE_LISTED: usize = 256;

/// The lock tables, as `/locks?table=` names them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Table {
    Memcache,
    Lockd,
    Dlock,
    /// yrmcds counters (semaphores): one row per counter and holder, with what it holds.
    Counter,
}

impl Table {
    pub const ALL: [Table; 4] = [Table::Memcache, Table::Lockd, Table::Dlock, Table::Counter];

    pub fn parse(s: &[u8]) -> Option<Table> {
        match s {
            b"memcache" => Some(Table::Memcache),
            b"lockd" => Some(Table::Lockd),
            b"dlock" => Some(Table::Dlock),
            b"counter" => Some(Table::Counter),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Table::Memcache => "memcache",
            Table::Lockd => "lockd",
            Table::Dlock => "dlock",
            Table::Counter => "counter",
        }
    }
}

#[derive(Clone, Debug)]
pub enum Query {
    /// Counters, gauges, histograms.
    Metrics,
    /// Held locks of one table whose name starts with `prefix`, at most `limit` (≤ [`MAX_LIST`]).
    Locks {
        table: Table,
        prefix: Vec<u8>,
        limit: usize,
    },
    /// Metrics plus the first `limit` locks of every table (the status page).
    Status { limit: usize },
    /// Is the owner turning? (`/healthz`)
    Ping,
    /// This node's view of its cluster (`/cluster`).
    Cluster,
    /// `POST /cluster/add` or `/cluster/remove`: propose a membership change.
    ClusterChange(MemberChange),
}

/// A membership change an operator asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberChange {
    Add(u64, std::net::SocketAddr),
    Remove(u64),
}

/// One cluster node's view, for `/cluster` and `holdfast cluster status`.
#[derive(Clone, Debug)]
pub struct ClusterStatus {
    pub node: u64,
    /// leader, follower, candidate or precandidate.
    pub role: String,
    /// The leader this node knows (0: none).
    pub leader: u64,
    pub term: u64,
    /// The last log index applied here.
    pub applied: u64,
    /// The log's clock (Unix ms).
    pub log_time_ms: u64,
    /// Whether this node has fenced itself (cut off from a quorum).
    pub fenced: bool,
    /// Every member: id, peer address, milliseconds since this node last heard from it.
    pub peers: Vec<(u64, String, Option<u64>)>,
    /// The voters; while a change is under way, also the old configuration's (joint consensus).
    pub voters: Vec<u64>,
    pub voters_outgoing: Vec<u64>,
    /// Whether the peer links are mutual TLS.
    pub peer_tls: bool,
    /// Inbound peer connections refused since start (a failed TLS handshake, a bad frame, a
    /// sender that is not a member).
    pub peer_refused: u64,
    /// The commit index this node knows.
    pub commit: u64,
    /// The other members heard from within one election timeout (any frame: raft traffic or a
    /// keepalive), in id order.
    pub reachable: Vec<u64>,
    /// Whether this node can grant locks (`/healthz`): `Err` says why not.
    pub health: Result<(), String>,
}

/// A cluster node's figures for `/metrics`, beyond [`ClusterStatus`].
#[derive(Clone, Debug)]
pub struct ClusterMetrics {
    pub status: ClusterStatus,
    /// From a proposal's first sending to its being applied on this node.
    pub proposal_apply: Histogram,
    /// Each fdatasync of the Raft log (and the syncs done on the spot for snapshots).
    pub log_sync: Histogram,
    /// The size of the latest snapshot made or installed (bytes of state).
    pub snapshot_bytes: u64,
    /// The size of the current log file.
    pub log_file_bytes: u64,
    /// Record bytes of the log entries whose payloads memory keeps; entries read back from the
    /// log files (a far-behind follower's catch-up, a restart).
    pub log_cached_bytes: u64,
    pub log_entries_read: u64,
    /// Snapshots made, failed, installed, and their durations (`cluster/node.rs`).
    pub snapshots: crate::cluster::node::SnapshotStats,
    /// Times this node lost contact with a quorum of the voters (reachable within one election
    /// timeout), fenced itself, and learned of a new leader (another node, or a new term).
    pub quorum_losses: u64,
    pub fences: u64,
    pub leader_changes: u64,
    /// Requests this node answered no quorum (`docs/cluster.md`).
    pub no_quorum_answers: u64,
    /// Snapshot transfers (the peer transport's counters).
    pub snapshot_transfer: SnapshotTransfer,
}

/// The peer transport's snapshot transfer figures.
#[derive(Clone, Debug, Default)]
pub struct SnapshotTransfer {
    /// Per peer: bytes sent and not yet acknowledged.
    pub in_flight: Vec<(u64, u64)>,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub completed: u64,
    pub failed: u64,
    pub resumed: u64,
}

#[derive(Debug)]
pub enum Answer {
    Metrics(Snapshot),
    Locks(LockList),
    Status(Snapshot, Vec<LockList>),
    Pong,
    /// The owner turns, but this cluster node cannot grant locks now: why.
    Unhealthy(String),
    /// `None` on a single node.
    Cluster(Option<ClusterStatus>),
    /// A membership change proposed, or why not (an HTTP status and a reason).
    ClusterChange(Result<String, (u16, String)>),
}

pub use crate::histogram::{Histogram, CLUSTER_BOUNDS, LATENCY_BOUNDS};

/// Everything `/metrics` shows, copied out of the owner.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Every `stats` pair, in `stats` order, values as text.
    pub stats: Vec<(String, String)>,
    /// This process's open client sockets per listener: memcache, lockd, dlock, counter.
    pub open: [u64; PROTOCOLS],
    /// Lock-request latency per protocol: memcache, lockd, dlock.
    pub latency: [Histogram; PROTOCOLS],
    /// A cluster node's figures; `None` on a single node.
    pub cluster: Option<Box<ClusterMetrics>>,
}

/// A session, as the lock listing names it: its id and its client's address.
#[derive(Clone, Copy, Debug)]
pub struct Who {
    pub session: Session,
    pub peer: Option<SocketAddr>,
    /// The node that accepted the session's connection (cluster mode only).
    pub node: Option<u16>,
}

impl Who {
    /// The session id shown to operators: the state machine's number for it.
    pub fn session(&self) -> String {
        self.session.0.to_string()
    }
}

#[derive(Clone, Debug)]
pub struct LockInfo {
    pub name: Vec<u8>,
    /// `None`: an orphaned lockd lock (its holder closed; it waits for adoption or expiry).
    pub holder: Option<Who>,
    /// How long ago the current holder got the lock (ms).
    pub held_for_ms: Option<u64>,
    /// The fencing token of the grant, when the table records it.
    pub fence: Option<u64>,
    /// Milliseconds until a dlock lease or a lockd orphan expires.
    pub expires_in_ms: Option<u64>,
    /// First come first; at most [`MAX_WAITERS_LISTED`].
    pub waiters: Vec<Who>,
    pub waiters_total: usize,
    /// For a counter: the resources this holder has acquired (`None` for a lock).
    pub resources: Option<u32>,
    /// For a dlock key: its mode, limit, every holder, lock-delay and watchers (`None` for the
    /// other tables).
    pub dlock: Option<DlockKey>,
}

/// A dlock key as the listing shows it: a version-2 hold (exclusive, limit 1, one holder) or the
/// version-3 grants of the native protocol (shared holders, a semaphore's slots).
#[derive(Clone, Debug)]
pub struct DlockKey {
    pub shared: bool,
    pub limit: u32,
    /// In grant order; at most [`MAX_HOLDERS_LISTED`].
    pub holders: Vec<Holder>,
    pub holders_total: usize,
    /// Milliseconds left of its lock-delay (0: none).
    pub lock_delay_ms: u64,
    /// This node's connections watching the key.
    pub watchers: usize,
}

/// One holder of a dlock key.
#[derive(Clone, Debug)]
pub struct Holder {
    pub who: Who,
    pub fence: u64,
    pub held_for_ms: u64,
    /// Milliseconds left of its lease; `None`: connection-bound.
    pub expires_in_ms: Option<u64>,
    /// The grant's value: its first [`MAX_VALUE_LISTED`] bytes, and its length.
    pub value: Option<(Vec<u8>, usize)>,
}

#[derive(Clone, Debug)]
pub struct LockList {
    pub table: Table,
    pub locks: Vec<LockInfo>,
    /// Held locks matching the prefix, listed or not.
    pub matched: usize,
    pub limit: usize,
}
