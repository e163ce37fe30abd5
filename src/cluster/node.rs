//! One cluster node's Raft driver: raft-rs's `RawNode` over a durable log ([`LogStore`]) and
//! the peers ([`PeerLink`]), ticked by the caller's clock ([`Clock`]). The daemon's node runs
//! over the log in `--data-dir` ([`DiskStorage`]), the TCP [`Transport`] and the system clock;
//! the simulator (`crate::sim`) runs this same driver over in-memory ones (`cluster::env`).
//!
//! Owns: the order of a `Ready` (send what may go before persisting, persist, apply, sync,
//! then send what promised that state), ticking, forwarding proposals to the leader, making
//! snapshots and compacting the log. Must not: interpret an entry (the [`Machine`] does), read
//! a clock (the caller passes instants), or block (the transport only enqueues).
//!
//! Proposals: the leader appends them; a follower that knows the leader forwards them as a
//! `MsgPropose` message (what raft-rs itself does); with no leader, [`RaftNode::propose`]
//! says no. raft-rs drops proposals silently on a leader change, so the caller must remember
//! what it proposed and propose it again, and the machine must apply each proposal once.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use protobuf::Message as PbMessage;
use raft::prelude::{
    ConfChange, ConfChangeSingle, ConfChangeV2, ConfState, Entry, EntryType, Message, MessageType,
    Snapshot,
};
use raft::{Config, RawNode, SnapshotStatus, StateRole, Storage};

use super::env::{observe_sync, Clock, LogStore, LogSyncer, PeerLink, Restore, Restored};
use super::env::{Snapshotting, Syncer, SystemClock};
use super::liveness::{Micros, Probes};
use super::snapchild::Finished;
use super::snapfile::{self, MappedState};
use super::storage::{claim_dir, DirLock, DiskStorage};
use super::transport::{PeerEvent, PeerTls, Transport, TransportConfig, TransportStats};
use crate::core::codec;
use crate::histogram::{Histogram, CLUSTER_BOUNDS};

pub use super::liveness::TICKS_PER_ELECTION;
/// Applied entries between two snapshots, at least (each snapshot lets the log be compacted);
/// with a large state, one entry per 1 KiB of the last snapshot.
pub const SNAPSHOT_EVERY: u64 = 10_000;
/// Log bytes applied between two snapshots, at least; with a larger state, as many bytes as
/// the last snapshot had, so that snapshots write no more than the log does (write
/// amplification at most 2x) and the data directory holds at most about three states' worth:
/// the snapshot, the log since it, and the next snapshot while it is written.
pub const SNAPSHOT_LOG_BYTES: u64 = 16 << 20;
/// After a snapshot child failed, the next attempt waits this long.
const SNAPSHOT_RETRY: Duration = Duration::from_secs(5);
/// A snapshot child still running this long after its start, plus a second for every 10 MiB of
/// the last snapshot (a healthy child writes 100 MiB a second), is killed and counted failed, and
/// the snapshot is tried again after [`SNAPSHOT_RETRY`]: a child stuck in the file system must
/// not hold off every later snapshot while the log grows without bound.
pub const SNAPSHOT_CHILD_TIMEOUT: Duration = Duration::from_secs(600);
const CHILD_TIMEOUT_BYTES_PER_SECOND: u64 = 10 << 20;
/// Entries kept behind a snapshot, so that a follower a little behind catches up from the
/// log instead of a whole snapshot.
pub const KEEP_ENTRIES: u64 = 1_000;
/// Entry bytes kept behind a snapshot at most (beyond one entry): they stay in memory, and a
/// follower further behind is better served by the snapshot.
pub const KEEP_BYTES: u64 = 4 << 20;
/// The largest append message (raft-rs's `max_size_per_msg`): one owner turn's entry fits.
const MAX_MSG_BYTES: u64 = 1 << 20;
/// The committed entries one `Ready` hands to the state machine, at most (raft-rs's
/// `max_committed_size_per_ready`; at least one entry): a node that restarts behind a long log,
/// or catches up on one, applies it in slices instead of reading it all back at once.
const MAX_APPLY_BYTES: u64 = 16 << 20;
/// Appends sent to a follower and not yet acknowledged, at most (raft-rs's flow control): with
/// [`MAX_MSG_BYTES`], at most 32 MiB per follower waits in the transport's queue or on the way,
/// which keeps a leader's memory in proportion to its state when a follower is slow or gone
/// (256 let a leader hold a quarter of a GiB per follower), and is far more than a link needs
/// to stay busy for the few milliseconds an acknowledgement takes.
const MAX_INFLIGHT_MSGS: usize = 32;
/// Campaigns after a leader's connection closed, a tick apart: half an election timeout's
/// worth, then the ordinary election timeout takes over.
const FAST_CAMPAIGNS: u32 = TICKS_PER_ELECTION as u32 / 2;
/// A keepalive to every peer every this many ticks (a fifth of an election timeout), so that
/// each node hears from every other member well within an election timeout (`transport.rs`).
const KEEPALIVE_TICKS: u32 = 2;

/// Why a node did not start.
#[derive(Debug)]
pub enum StartError {
    /// A flag that does not fit what is on disk or around it (`--data-dir`, `--peers`): the
    /// daemon says so in one line and exits with status 2, as for any bad flag.
    Flag(String),
    /// Anything else (storage damage, a peer port in use).
    Failed(String),
}

impl From<String> for StartError {
    fn from(e: String) -> StartError {
        StartError::Failed(e)
    }
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Flag(e) | StartError::Failed(e) => f.write_str(e),
        }
    }
}

/// The replicated state machine a node drives: fed committed entries in log order.
pub trait Machine {
    /// What [`Machine::restorer`] builds, off the owner's thread.
    type Restored: Send + 'static;
    /// Apply the data of the committed normal entry at `index` (never empty).
    fn apply(&mut self, index: u64, data: &[u8]);
    /// Appends the whole state, as applied so far, to `out`, calling
    /// [`crate::core::codec::spill`] between records: in a forked snapshot child that streams
    /// the bytes to the file as they come.
    fn write_snapshot(&self, out: &mut Vec<u8>);
    /// The whole state, as applied so far.
    fn snapshot(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_snapshot(&mut out);
        out
    }
    /// Builds a state from a snapshot's bytes (hostile bytes: an error, no panic); it runs on
    /// another thread while the node goes on.
    #[allow(clippy::type_complexity)]
    fn restorer(&self) -> Box<dyn FnOnce(&[u8]) -> Result<Self::Restored, String> + Send>;
    /// Puts a restored state in place of the current one, which it hands back, so that the
    /// caller can free it off the owner's thread.
    fn install(&mut self, restored: Self::Restored) -> Box<dyn Send>;
    /// Gives up the bulk of the state before an install replaces it (the node applies nothing
    /// until then), so that a node never holds two whole states; hands it back to be freed
    /// off the owner's thread. By default nothing is given up.
    fn release(&mut self) -> Box<dyn Send> {
        Box::new(())
    }
    /// Replace the state by a snapshot's, on this thread (hostile bytes: an error, no panic).
    fn restore(&mut self, data: &[u8]) -> Result<(), String> {
        let restored = self.restorer()(data)?;
        drop(self.install(restored));
        Ok(())
    }
    /// A committed membership change at `index`, as raft applied it: `context` is the change's
    /// context (an added node's `ID=HOST:PORT`), `before` and `after` the configurations.
    fn apply_conf_change(
        &mut self,
        _index: u64,
        _context: &[u8],
        _before: &ConfState,
        _after: &ConfState,
    ) {
    }
    /// The replicated membership: where added nodes listen, and the ids removed.
    fn membership(&self) -> Membership {
        Membership::default()
    }
}

/// What the replicated state knows of the members beyond raft's configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    /// Nodes added by `cluster add`, and where they listen for peers.
    pub addrs: BTreeMap<u64, SocketAddr>,
    /// Ids removed from the cluster (never to come back: a node re-added takes a new id).
    pub removed: BTreeSet<u64>,
}

/// The log index of a new cluster's first snapshot: every founding node starts from the same
/// snapshot (the empty state and the founding members) instead of an empty log, so that a node
/// added later, whose log is empty, cannot be sent the log from its start (which would not
/// tell it the founding members) and is sent a snapshot instead (as TiKV starts its regions).
pub const BOOTSTRAP_INDEX: u64 = 1;

/// Every id in a configuration, joint ones included.
pub fn conf_members(cs: &ConfState) -> BTreeSet<u64> {
    cs.voters
        .iter()
        .chain(&cs.voters_outgoing)
        .chain(&cs.learners)
        .chain(&cs.learners_next)
        .copied()
        .collect()
}

pub struct NodeConfig {
    pub id: u64,
    /// Every member, this node included, and where it listens for peers.
    pub peers: BTreeMap<u64, SocketAddr>,
    pub data_dir: PathBuf,
    pub election_timeout: Duration,
    /// Start outside the cluster, to be added by `cluster add` (`--join`).
    pub join: bool,
    /// Mutual TLS between the nodes (`--peer-tls-*`); None: plain TCP.
    pub peer_tls: Option<PeerTls>,
    /// The host of each `--peers` entry as given (an IP address or a DNS name): the name a
    /// peer's certificate must carry.
    pub peer_names: BTreeMap<u64, String>,
    /// The largest entry the machine proposes (the transport's frame cap follows from it).
    pub max_entry: usize,
}

/// The bytes of one entry the owner proposes: it gathers batches until they reach this, and
/// splits a batch larger than it alone (at least one request per entry: one with a value of
/// `--max-item-size` is larger). A peer frame holds an append of entries up to 1 MiB or one
/// entry, so no frame is larger than a few MiB. Two of them fill what the owner keeps in flight
/// (`MAX_INFLIGHT_BYTES`), so one commits while the next is on its way.
pub const MAX_ENTRY_BYTES: usize = 48 << 10;

/// The largest entry a node proposes: [`MAX_ENTRY_BYTES`] of requests and one more, whose
/// value is at most `max_item_size` (with its key and the op's fields).
pub fn max_entry_bytes(max_item_size: usize) -> usize {
    MAX_ENTRY_BYTES + max_item_size + (64 << 10)
}

/// The largest peer frame for entries of at most `max_entry` bytes: raft-rs packs entries into
/// an append up to [`MAX_MSG_BYTES`] but always sends one, so an append is at most the larger
/// of the two plus its other fields; never below the transport's default.
pub fn max_frame(max_entry: usize) -> usize {
    (max_entry.max(MAX_MSG_BYTES as usize) + (1 << 20)).max(super::transport::DEFAULT_MAX_FRAME)
}

/// When a node snapshots and what it keeps behind a snapshot: the daemon's are
/// [`SNAPSHOT_EVERY`], [`SNAPSHOT_LOG_BYTES`], [`KEEP_ENTRIES`] and [`KEEP_BYTES`] (the
/// simulator's are smaller, so that its short runs snapshot and compact often).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotPolicy {
    pub every: u64,
    pub log_bytes: u64,
    pub keep_entries: u64,
    pub keep_bytes: u64,
    /// [`SNAPSHOT_CHILD_TIMEOUT`].
    pub child_timeout: Duration,
}

impl Default for SnapshotPolicy {
    fn default() -> SnapshotPolicy {
        SnapshotPolicy {
            every: SNAPSHOT_EVERY,
            log_bytes: SNAPSHOT_LOG_BYTES,
            keep_entries: KEEP_ENTRIES,
            keep_bytes: KEEP_BYTES,
            child_timeout: SNAPSHOT_CHILD_TIMEOUT,
        }
    }
}

/// The node's parts, as [`RaftNode::assemble`] takes them.
pub struct Parts<S: LogStore, T, C> {
    pub id: u64,
    pub storage: S,
    pub transport: T,
    pub syncer: S::Syncer,
    pub clock: C,
    /// Where this node's `--peers` says its peers listen.
    pub local_peers: BTreeMap<u64, SocketAddr>,
    /// The index of the snapshot the machine was restored from (0: none), and its size.
    pub applied: u64,
    pub snapshot_bytes: u64,
    pub tick: Duration,
    pub sync_times: Arc<Mutex<Histogram>>,
    pub dir_lock: Option<DirLock>,
}

pub struct RaftNode<S: LogStore = DiskStorage, T = Transport, C = SystemClock> {
    raw: RawNode<S>,
    transport: T,
    clock: C,
    /// When to snapshot, and what to keep behind a snapshot.
    policy: SnapshotPolicy,
    /// Where this node's `--peers` says its peers listen (these win over the replicated book).
    local_peers: BTreeMap<u64, SocketAddr>,
    /// A membership change was applied since the caller last asked ([`RaftNode::take_conf_changed`]).
    conf_changed: bool,
    /// A node was added: snapshot now, so that it can be sent one that names it.
    snapshot_due: bool,
    /// The snapshot due is one a node waits for (one added): written unpaced.
    snapshot_urgent: bool,
    /// This node applied its own removal: it only finishes the `Ready` at hand.
    removed: bool,
    /// Entry bytes applied since the last snapshot.
    bytes_since_snapshot: u64,
    /// Quorum probes (raft ReadIndex requests): sent, answered, confirmed (`liveness.rs`).
    probes: Probes,
    /// The leader's connection closed: campaign then, and so many more times a tick apart
    /// while there is no leader ([`RaftNode::peer_closed`]).
    campaign_at: Option<(Instant, u32)>,
    /// Makes written `Ready`s durable off the owner's thread.
    syncer: S::Syncer,
    /// The last `Ready` handed to the sync thread, and the last one known durable.
    requested: u64,
    durable: u64,
    /// Messages that promise a `Ready`'s state (votes, acknowledgements), each batch behind
    /// the number of the `Ready` that must be durable first.
    promised: std::collections::VecDeque<(u64, Vec<Message>)>,
    tick: Duration,
    next_tick: Instant,
    /// Ticks until the next keepalive.
    keepalive_in: u32,
    applied: u64,
    last_snapshot: u64,
    /// The size of the latest snapshot's state, made, installed or started from.
    snapshot_bytes: u64,
    /// The snapshot being written by a child process, if any.
    snapshot_child: Option<S::Snapshotting>,
    /// After a failed snapshot child: no new one before then.
    snapshot_retry_at: Option<Instant>,
    /// A leader's snapshot being restored off the owner's thread; committed entries after it
    /// wait in `held` until it is in place.
    installing: Option<Installing>,
    held: std::collections::VecDeque<Entry>,
    snapshot_stats: SnapshotStats,
    /// How long each log sync took (the sync thread's and those made on the spot).
    sync_times: Arc<Mutex<Histogram>>,
    /// The data directory's lock, held while the node runs.
    _dir_lock: Option<DirLock>,
}

/// One tick of a follower that must not campaign: its election clock advances to the end of
/// the leader's lease and stops there. (Standing still, with check_quorum, a follower that
/// last heard the leader recently turns down every vote until it ticks again: a leader that
/// died during a long install would leave a cluster that needs this node's vote leaderless.)
fn tick_lease_only<S: Storage>(r: &mut raft::Raft<S>) {
    if r.state != StateRole::Leader && r.election_elapsed < r.election_timeout() {
        r.election_elapsed += 1;
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A leader's snapshot being restored on a thread of its own.
struct Installing {
    index: u64,
    bytes: u64,
    started: Instant,
    done: Receiver<Restored>,
}

/// What the node's snapshots cost (for `/metrics`).
#[derive(Clone, Debug, Default)]
pub struct SnapshotStats {
    /// Snapshots this node made (written by a child and adopted), and children that failed.
    pub made: u64,
    pub failed: u64,
    /// Leader's snapshots installed.
    pub installed: u64,
    /// Seconds: the owner's part of the last snapshot (the fork), the child's whole run, and
    /// the last install's restore (off the owner's thread).
    pub last_fork_seconds: f64,
    pub last_write_seconds: f64,
    pub last_install_seconds: f64,
    /// The owner's part of each snapshot (the fork), and each child's run.
    pub fork_times: Histogram,
    pub write_times: Histogram,
    /// A snapshot is being written, or installed, now.
    pub writing: bool,
    pub installing: bool,
}

fn raft_config(id: u64, applied: u64) -> Config {
    Config {
        id,
        election_tick: TICKS_PER_ELECTION,
        heartbeat_tick: 1,
        applied,
        pre_vote: true,
        check_quorum: true,
        max_size_per_msg: MAX_MSG_BYTES,
        max_inflight_msgs: MAX_INFLIGHT_MSGS,
        max_committed_size_per_ready: MAX_APPLY_BYTES,
        ..Default::default()
    }
}

fn logger() -> slog::Logger {
    slog::Logger::root(slog::Discard, slog::o!())
}

impl RaftNode {
    /// Open the data directory (a new cluster's members if it is empty), restore `machine`
    /// from its snapshot, and start serving peers on this node's address in `peers`.
    pub fn start(
        cfg: &NodeConfig,
        machine: &mut impl Machine,
        now: Instant,
    ) -> Result<RaftNode, StartError> {
        let addr = *cfg
            .peers
            .get(&cfg.id)
            .ok_or_else(|| format!("node {} is not one of the peers", cfg.id))?;
        let dir_lock = claim_dir(&cfg.data_dir).map_err(StartError::Flag)?;
        let mut storage = DiskStorage::open(&cfg.data_dir).map_err(|e| e.to_string())?;
        let fresh = storage.initial_state().map_err(|e| e.to_string())?;
        let empty = fresh.conf_state == ConfState::default()
            && storage.snapshot_metadata().is_none()
            && storage.last_index().unwrap_or(0) == 0;
        if empty && !cfg.join {
            // A founding node: the snapshot every founder starts from.
            let voters: Vec<u64> = cfg.peers.keys().copied().collect();
            let mut snap = Snapshot::default();
            let meta = snap.mut_metadata();
            meta.index = BOOTSTRAP_INDEX;
            meta.term = 1;
            meta.set_conf_state(ConfState::from((voters, vec![])));
            snap.set_data(machine.snapshot().into());
            storage
                .apply_snapshot(&snap)
                .and_then(|()| storage.sync())
                .map_err(|e| e.to_string())?;
        }
        let mut applied = 0;
        let mut snapshot_bytes = 0;
        storage.rewind_conf_state_to_snapshot();
        if let Some(meta) = storage.snapshot_metadata().cloned() {
            let path = storage.snapshot_path().unwrap_or_default();
            let state = snapfile::check(&path)
                .and_then(|c| MappedState::open(&path, &c))
                .map_err(|e| format!("the snapshot in {}: {e}", cfg.data_dir.display()))?;
            codec::release_as_read(state.releaser(), || machine.restore(&state))
                .map_err(|e| format!("the snapshot in {}: {e}", cfg.data_dir.display()))?;
            applied = meta.index;
            snapshot_bytes = state.len() as u64;
        }
        if !empty {
            let changed = ids_in_conf_changes(&storage, &machine.membership());
            let stored = conf_members(&fresh.conf_state);
            match peers_against_stored(&cfg.peers, &stored, &changed, &cfg.data_dir) {
                Ok(Some(warning)) => crate::log_warn!("{warning}"),
                Ok(None) => {}
                Err(e) => return Err(StartError::Flag(e)),
            }
        }
        let listener = TcpListener::bind(addr)
            .map_err(|e| format!("cannot listen for peers on {addr}: {e}"))?;
        let peers = effective_peers(
            &conf_members(
                &storage
                    .initial_state()
                    .map_err(|e| e.to_string())?
                    .conf_state,
            ),
            &cfg.peers,
            &machine.membership(),
        );
        let mut tcfg = TransportConfig::new(cfg.id, peers);
        tcfg.tls = cfg.peer_tls.clone();
        tcfg.names = cfg.peer_names.clone();
        tcfg.data_dir = Some(cfg.data_dir.clone());
        tcfg.max_frame = max_frame(cfg.max_entry);
        let mut transport =
            Transport::start(tcfg, listener).map_err(|e| format!("peer transport: {e}"))?;
        transport.set_removed(&machine.membership().removed);
        let tick = (cfg.election_timeout / TICKS_PER_ELECTION as u32).max(Duration::from_millis(1));
        let sync_times = Arc::new(Mutex::new(Histogram::default()));
        let syncer = Syncer::start(sync_times.clone())?;
        let parts = Parts {
            id: cfg.id,
            storage,
            transport,
            syncer,
            clock: SystemClock,
            local_peers: cfg.peers.clone(),
            applied,
            snapshot_bytes,
            tick,
            sync_times,
            dir_lock: Some(dir_lock),
        };
        Ok(RaftNode::assemble(parts, now)?)
    }

    /// The peers the transport sends to, and where.
    pub fn peers(&self) -> BTreeMap<u64, SocketAddr> {
        self.transport.peers()
    }

    /// The peer transport's counters.
    pub fn transport_stats(&self) -> &TransportStats {
        self.transport.stats()
    }

    /// Whether the peer links are mutual TLS.
    pub fn peer_tls(&self) -> bool {
        self.transport.tls()
    }

    /// Peer messages for [`RaftNode::step`] (to `select!` on).
    pub fn inbound(&self) -> &Receiver<Message> {
        self.transport.inbound()
    }

    pub fn peer_addr(&self) -> SocketAddr {
        self.transport.local_addr()
    }

    /// Peer events (to `select!` on, so that a leader's closed connection is seen at once).
    pub fn events(&self) -> &Receiver<PeerEvent> {
        self.transport.events()
    }

    /// The sync thread's answers (to `select!` on).
    pub fn synced(&self) -> &Receiver<Result<u64, String>> {
        &self.syncer.done
    }
}

impl<S: LogStore, T: PeerLink, C: Clock> RaftNode<S, T, C> {
    /// The node's clock now (the daemon's: the monotonic clock).
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// When each peer's latest frame arrived (raft traffic or a keepalive).
    pub fn heard(&self) -> BTreeMap<u64, Instant> {
        self.transport.heard()
    }

    /// A node over `parts`: the machine is already restored from the snapshot at
    /// `parts.applied`, and the storage holds the log after it.
    pub fn assemble(parts: Parts<S, T, C>, now: Instant) -> Result<Self, String> {
        let raw = RawNode::new(
            &raft_config(parts.id, parts.applied),
            parts.storage,
            &logger(),
        )
        .map_err(|e| format!("raft: {e}"))?;
        let tick = parts.tick;
        Ok(RaftNode {
            raw,
            transport: parts.transport,
            clock: parts.clock,
            policy: SnapshotPolicy::default(),
            local_peers: parts.local_peers,
            conf_changed: false,
            snapshot_due: false,
            snapshot_urgent: false,
            removed: false,
            bytes_since_snapshot: 0,
            probes: Probes::new(tick.as_micros() as Micros),
            campaign_at: None,
            syncer: parts.syncer,
            requested: 0,
            durable: 0,
            promised: std::collections::VecDeque::new(),
            tick,
            next_tick: now + tick,
            keepalive_in: 0,
            applied: parts.applied,
            last_snapshot: parts.applied,
            snapshot_bytes: parts.snapshot_bytes,
            snapshot_child: None,
            snapshot_retry_at: None,
            installing: None,
            held: std::collections::VecDeque::new(),
            snapshot_stats: SnapshotStats::default(),
            sync_times: parts.sync_times,
            _dir_lock: parts.dir_lock,
        })
    }

    /// When this node snapshots, and what it keeps behind a snapshot.
    pub fn set_snapshot_policy(&mut self, policy: SnapshotPolicy) {
        self.policy = policy;
    }

    /// This node applied its own removal: its owner stops it.
    pub fn is_removed(&self) -> bool {
        self.removed
    }

    /// raft-rs's node, for the simulator (which draws raft's randomized election timeout from
    /// its seed, and inspects the node's raft state).
    pub(crate) fn raw_mut(&mut self) -> &mut RawNode<S> {
        &mut self.raw
    }

    pub(crate) fn raw(&self) -> &RawNode<S> {
        &self.raw
    }

    /// Committed entries held behind a snapshot being installed.
    pub(crate) fn held_entries(&self) -> usize {
        self.held.len()
    }

    /// Ask the leader to confirm, with a quorum, that it still leads (raft's ReadIndex, which
    /// writes nothing): at most one probe per tick. A confirmed probe proves that the leader
    /// received it, so the leader heard from this node no earlier than the probe was sent;
    /// see [`RaftNode::quorum_confirmed`]. `now`: the caller's monotonic clock in microseconds.
    pub fn probe_quorum(&mut self, now: Micros) {
        let (me, has_leader) = (self.id(), self.leader() != 0);
        if let Some(ctx) = self.probes.due(me, has_leader, now) {
            self.raw.read_index(ctx.to_vec());
        }
    }

    /// When (on the clock of [`RaftNode::probe_quorum`]) the latest probe a leader confirmed
    /// with a quorum was sent: the leader heard from this node, and a quorum from the leader,
    /// no earlier than that.
    pub fn quorum_confirmed(&self) -> Option<Micros> {
        self.probes.confirmed()
    }

    fn probe_answered(&mut self, ctx: &[u8], index: u64) {
        let me = self.id();
        self.probes.answered(me, ctx, index);
    }

    /// Count the confirmed probes whose read index this node has applied.
    fn count_confirmations(&mut self) {
        self.probes.count(self.applied);
    }

    /// The configuration (joint while a membership change is under way).
    pub fn conf_state(&self) -> ConfState {
        self.raw.raft.prs().conf().to_conf_state()
    }

    /// Whether a membership change was applied since the last call.
    pub fn take_conf_changed(&mut self) -> bool {
        std::mem::take(&mut self.conf_changed)
    }

    /// Propose a membership change (through the leader, as raft-rs forwards it). Raft turns a
    /// change into a no-op when another is still under way; the caller checks the result in
    /// the configuration.
    pub fn propose_conf_change(&mut self, cc: ConfChangeV2) -> Result<(), String> {
        if self.leader() == 0 {
            return Err("no leader".into());
        }
        self.raw
            .propose_conf_change(Vec::new(), cc)
            .map_err(|e| e.to_string())
    }

    /// Point the transport at the members of the configuration now applied.
    fn refresh_peers(&mut self, machine: &impl Machine) {
        let book = machine.membership();
        let peers = effective_peers(&conf_members(&self.conf_state()), &self.local_peers, &book);
        if let Err(e) = self.transport.set_peers(&peers) {
            crate::log_error!("peer transport: cannot start a writer: {e}");
        }
        self.transport.set_removed(&book.removed);
    }

    pub fn id(&self) -> u64 {
        self.raw.raft.id
    }

    pub fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    /// The leader this node knows of (0: none).
    pub fn leader(&self) -> u64 {
        self.raw.raft.leader_id
    }

    pub fn term(&self) -> u64 {
        self.raw.raft.term
    }

    pub fn role(&self) -> StateRole {
        self.raw.raft.state
    }

    /// The role as the admin port and the metrics name it: `learner` for a learner of the
    /// configuration, else raft's role (`leader`, `follower`, `candidate`, `precandidate`).
    pub fn role_name(&self) -> &'static str {
        let cs = self.raw.raft.prs().conf().to_conf_state();
        if cs.learners.contains(&self.id()) || cs.learners_next.contains(&self.id()) {
            return "learner";
        }
        match self.role() {
            StateRole::Leader => "leader",
            StateRole::Follower => "follower",
            StateRole::Candidate => "candidate",
            StateRole::PreCandidate => "precandidate",
        }
    }

    /// The commit index this node knows.
    pub fn commit_index(&self) -> u64 {
        self.raw.raft.raft_log.committed
    }

    /// The size of the latest snapshot's state (made, installed, or started from).
    pub fn snapshot_bytes(&self) -> u64 {
        self.snapshot_bytes
    }

    /// The size of the current log file.
    pub fn log_file_bytes(&self) -> u64 {
        self.raw.store().log_file_len()
    }

    /// Record bytes of the log entries whose payloads memory keeps, and entries read back from
    /// the log files so far.
    pub fn log_cache(&self) -> (u64, u64) {
        self.raw.store().log_cache()
    }

    /// How long the log syncs took so far.
    pub fn log_sync_times(&self) -> Histogram {
        self.sync_times
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A sync made on the owner's thread (a snapshot's), timed like the sync thread's.
    fn sync_now(&mut self) -> Result<(), String> {
        let started = self.clock.now();
        self.raw.mut_store().sync()?;
        observe_sync(&self.sync_times, self.clock.now() - started);
        Ok(())
    }

    /// Propose `data`: appended if this node leads, forwarded to the leader it knows, refused
    /// (false) otherwise. True means only "sent": raft-rs may still drop it.
    pub fn propose(&mut self, data: Vec<u8>) -> bool {
        if self.is_leader() {
            return self.raw.propose(Vec::new(), data).is_ok();
        }
        let leader = self.leader();
        if leader == 0 {
            return false;
        }
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgPropose);
        m.from = self.id();
        m.to = leader;
        let e = Entry {
            data: data.into(),
            ..Default::default()
        };
        m.entries = vec![e].into();
        self.transport.send(m)
    }

    /// A message from a peer (a stale or odd one is ignored, as raft-rs decides).
    pub fn step(&mut self, m: Message) {
        let _ = self.raw.step(m);
    }

    /// Tick raft for every tick interval that has passed by `now`.
    pub fn tick(&mut self, now: Instant) -> Result<(), String> {
        if now >= self.next_tick && !self.is_leader() && self.sole_voter() {
            // A sole voter elects itself within a tick, and raft-rs requires a new leader's
            // own log to be durable first: wait for the sync thread (it takes milliseconds).
            while self.requested > self.durable {
                let done = self.syncer.wait_done();
                self.on_synced(done)?;
            }
        }
        let mut first = true;
        while now >= self.next_tick {
            if !first {
                self.clock.between_ticks(&mut self.raw.raft);
            }
            first = false;
            // A node installing a snapshot does not campaign (its state is not in place yet):
            // its election clock runs only as far as the leader's lease, so that it still
            // grants votes once the leader has been silent for an election timeout; it still
            // answers every message.
            if self.installing.is_none() {
                self.raw.tick();
            } else {
                tick_lease_only(&mut self.raw.raft);
            }
            self.next_tick += self.tick;
            if self.keepalive_in == 0 {
                self.transport.keepalive();
                self.keepalive_in = KEEPALIVE_TICKS;
            }
            self.keepalive_in -= 1;
        }
        while let Some(ev) = self.transport_event() {
            self.peer_event(ev, now);
        }
        self.fast_campaign(now);
        Ok(())
    }

    fn sole_voter(&self) -> bool {
        let cs = self.conf_state();
        cs.voters == [self.id()] && cs.voters_outgoing.is_empty()
    }

    /// A peer event from [`RaftNode::events`] (or drained by [`RaftNode::tick`]).
    pub fn peer_event(&mut self, ev: PeerEvent, now: Instant) {
        match ev {
            PeerEvent::Unreachable(id) => self.raw.report_unreachable(id),
            PeerEvent::SnapshotFailed(id) => self.raw.report_snapshot(id, SnapshotStatus::Failure),
            PeerEvent::SnapshotSent(id) => self.raw.report_snapshot(id, SnapshotStatus::Finish),
            PeerEvent::Closed(id) => self.peer_closed(id, now),
        }
    }

    fn fast_campaign(&mut self, now: Instant) {
        if let Some((at, left)) = self.campaign_at {
            // Not without its state: a node installing a snapshot waits for another leader.
            if self.leader() != 0 || left == 0 || self.installing.is_some() {
                self.campaign_at = None;
            } else if now >= at {
                // Again each tick while there is no leader: a voter that had not yet seen the
                // close turned down the last pre-vote (pre-votes change no term).
                let _ = self.raw.campaign();
                self.campaign_at = Some((now + self.tick, left - 1));
            }
        }
    }

    /// Fast failover: the leader's connection to us closed, so its process has most likely
    /// exited. Rather than wait out an election timeout (one to two of them, randomized) for a
    /// leader that will not speak again, every follower forgets it (so that it no longer turns
    /// down votes inside the old leader's lease) and campaigns: the voter with the lowest id
    /// among the others a tick later (once they have all seen the close), the next one a tick
    /// after that, and so on, each again every tick while there is no leader. Raft is safe
    /// whatever the timing: if the leader lives after all (a connection closed for another
    /// reason), the election costs one term; if every campaign fails, the ordinary election
    /// timeout follows.
    fn peer_closed(&mut self, id: u64, now: Instant) {
        if id != self.leader() || self.is_leader() {
            return;
        }
        let cs = self.conf_state();
        if !cs.voters_outgoing.is_empty() || !cs.voters.contains(&self.id()) {
            return;
        }
        let term = self.raw.raft.term;
        self.raw.raft.become_follower(term, raft::INVALID_ID);
        // Staggered by id: if the first one's log is behind (its pre-votes fail and change
        // nothing), the next one campaigns a tick later.
        let rank = cs
            .voters
            .iter()
            .filter(|&&v| v != id && v < self.id())
            .count() as u32;
        self.campaign_at = Some((now + self.tick * (1 + rank), FAST_CAMPAIGNS));
    }

    fn transport_event(&self) -> Option<PeerEvent> {
        self.transport.try_event()
    }

    /// When the next tick is due.
    pub fn next_tick(&self) -> Instant {
        self.next_tick
    }

    /// Handle every `Ready`: persist what raft asks, apply what is committed, send messages.
    ///
    /// The log is synced by the node's sync thread ([`Syncer`]), not here: each `Ready`'s
    /// records are written to the file at once (one `write`), then the thread makes them
    /// durable with one fdatasync for every `Ready` written meanwhile (group commit), and
    /// [`RaftNode::on_synced`] tells raft (`on_persist_ready`). Meanwhile the owner goes on:
    /// it applies what is committed, answers clients, takes in peers' acknowledgements and
    /// proposes the next batch. What a `Ready` promises about this node's disk (a vote, a
    /// follower's acknowledgement) is held until that `Ready` is durable; a leader's own
    /// entries count for the quorum only once durable; committed entries are applied only up
    /// to what is durable here (raft-rs bounds them by its persisted index). A snapshot, and
    /// a snapshot installed from the leader, are synced on the spot (they are rare).
    ///
    /// An error is a storage failure: the node must stop acknowledging (the caller stops it).
    pub fn ready(&mut self, machine: &mut impl Machine) -> Result<(), String> {
        while let Some(done) = self.syncer.try_done() {
            self.on_synced(done)?;
        }
        self.poll_install(machine)?;
        self.poll_snapshot_child()?;
        while self.raw.has_ready() {
            let mut rd = self.raw.ready();
            let number = rd.number();
            // Messages that promise nothing about our disk (a leader's appends) go at once.
            for m in rd.take_messages() {
                self.transport.send(m);
            }
            for rs in rd.take_read_states() {
                self.probe_answered(&rs.request_ctx, rs.index);
            }
            let installed = !rd.snapshot().is_empty();
            if installed {
                let snap = rd.snapshot().clone();
                self.raw.mut_store().apply_snapshot(&snap)?;
                self.begin_install(machine, snap.get_metadata().index);
            }
            self.apply(machine, rd.take_committed_entries())?;
            let store = self.raw.mut_store();
            store.append(rd.entries())?;
            if let Some(hs) = rd.hs() {
                store.set_hard_state(hs)?;
            }
            let must_sync = rd.must_sync();
            let promised = rd.take_persisted_messages();
            self.raw.advance_append_async(rd);
            // What this Ready's messages wait for: itself if it wrote what must be durable,
            // else only the Readies before it.
            let needs = if must_sync { number } else { self.requested };
            if !promised.is_empty() {
                self.promised.push_back((needs, promised));
            }
            if installed {
                self.sync_now()?;
                self.durable_through(number);
            } else {
                let log = self.raw.mut_store().write()?;
                if must_sync {
                    self.requested = number;
                    self.syncer.request(number, log)?;
                }
            }
            // (After an installed snapshot is durable: raft-rs checks that what is applied
            // is persisted.) Entries held behind a snapshot being installed are not applied:
            // raft must not count them (its guard against campaigning with a membership
            // change committed and not applied looks at what it believes applied).
            match &self.installing {
                Some(i) => self.raw.advance_apply_to(i.index),
                None => self.raw.advance_apply(),
            }
            self.send_promised();
            if self.removed {
                // The owner stops this node as soon as this returns.
                break;
            }
            self.maybe_snapshot(machine);
        }
        self.count_confirmations();
        Ok(())
    }

    /// The sync thread made every `Ready` through `done` durable (or failed: the caller stops).
    pub fn on_synced(&mut self, done: Result<u64, String>) -> Result<(), String> {
        let number = done?;
        if number > self.durable {
            self.durable_through(number);
            self.send_promised();
        }
        Ok(())
    }

    /// Every `Ready` through `number` is durable.
    fn durable_through(&mut self, number: u64) {
        if number > self.durable {
            self.durable = number;
            // Not once this node applied its own removal: raft-rs 0.7 looks up a leader's own
            // progress there, which the removal took away (the owner stops the node as soon
            // as `ready` returns).
            if !self.removed {
                self.raw.on_persist_ready(number);
            }
        }
    }

    /// Send, in order, the messages whose `Ready` is durable.
    fn send_promised(&mut self) {
        while let Some((needs, _)) = self.promised.front() {
            if *needs > self.durable {
                break;
            }
            let (_, msgs) = self.promised.pop_front().expect("checked");
            for m in msgs {
                self.transport.send(m);
            }
        }
    }

    fn apply(&mut self, machine: &mut impl Machine, entries: Vec<Entry>) -> Result<(), String> {
        for e in entries {
            if let Some(i) = &self.installing {
                // After the snapshot being installed: applied once it is in place.
                if e.index > i.index {
                    self.held.push_back(e);
                }
                continue;
            }
            if e.index <= self.applied {
                continue;
            }
            self.applied = e.index;
            self.bytes_since_snapshot += e.data.len() as u64;
            match e.get_entry_type() {
                EntryType::EntryNormal if !e.data.is_empty() => machine.apply(e.index, &e.data),
                // A new leader's empty entry.
                EntryType::EntryNormal => {}
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => {
                    self.apply_conf_change(machine, &e)?
                }
            }
        }
        Ok(())
    }

    /// A committed membership change: raft's configuration, the durable copy of it, the
    /// replicated book of addresses, and the transport's peers, in that order.
    fn apply_conf_change(&mut self, machine: &mut impl Machine, e: &Entry) -> Result<(), String> {
        let cc = if e.get_entry_type() == EntryType::EntryConfChange {
            ConfChange::parse_from_bytes(&e.data).map(v1_to_v2)
        } else {
            ConfChangeV2::parse_from_bytes(&e.data)
        };
        let Ok(cc) = cc else {
            // The leader checked it before proposing; every replica skips it alike.
            crate::log_error!("cluster: membership change {} does not decode", e.index);
            return Ok(());
        };
        let before = self.conf_state();
        let after = match self.raw.apply_conf_change(&cc) {
            Ok(cs) => cs,
            Err(err) => {
                crate::log_error!("cluster: membership change {} refused: {err}", e.index);
                return Ok(());
            }
        };
        self.raw.mut_store().set_conf_state(after.clone())?;
        machine.apply_conf_change(e.index, cc.get_context(), &before, &after);
        if !conf_members(&after).contains(&self.id()) {
            self.removed = true;
        }
        if conf_members(&after)
            .difference(&conf_members(&before))
            .next()
            .is_some()
        {
            // Its first snapshot must name it: the new node waits for this one.
            self.snapshot_due = true;
            self.snapshot_urgent = true;
        }
        self.refresh_peers(machine);
        self.conf_changed = true;
        crate::log_info!(
            "cluster: membership at {}: voters {:?}{}",
            e.index,
            after.voters,
            if after.voters_outgoing.is_empty() {
                String::new()
            } else {
                format!(" (joint with {:?})", after.voters_outgoing)
            }
        );
        Ok(())
    }

    /// Starts restoring the leader's snapshot at `index` (just made durable in storage) on a
    /// thread of its own; committed entries after it are held until it is in place. A newer
    /// snapshot replaces one still being restored.
    fn begin_install(&mut self, machine: &mut impl Machine, index: u64) {
        self.held.retain(|e| e.index > index);
        // The old state goes to the restore, which frees it before it builds the new one.
        let old = machine.release();
        self.snapshot_child = None;
        self.snapshot_stats.writing = false;
        let restorer = machine.restorer();
        let restore: Restore = Box::new(move |state: &[u8]| {
            restorer(state).map(|r| Box::new(r) as Box<dyn std::any::Any + Send>)
        });
        let (bytes, done) = self.raw.store().start_restore(old, restore);
        self.installing = Some(Installing {
            index,
            bytes,
            started: self.clock.now(),
            done,
        });
        self.snapshot_stats.installing = true;
        crate::log_info!(
            "cluster node {}: installing the leader's snapshot at index {} ({} bytes)",
            self.id(),
            index,
            bytes
        );
    }

    /// A snapshot restored off the owner's thread is put in place, and the entries held
    /// behind it are applied. A snapshot that does not restore is a storage failure.
    fn poll_install(&mut self, machine: &mut impl Machine) -> Result<(), String> {
        let Some(i) = &self.installing else {
            return Ok(());
        };
        let restored = match i.done.try_recv() {
            Ok(r) => r.map_err(|e| format!("a leader's snapshot: {e}"))?,
            Err(crossbeam_channel::TryRecvError::Empty) => return Ok(()),
            Err(crossbeam_channel::TryRecvError::Disconnected) => {
                return Err("a leader's snapshot: the install thread stopped".into())
            }
        };
        let i = self.installing.take().expect("checked");
        let restored = restored
            .downcast()
            .map_err(|_| "a leader's snapshot: restored as another type".to_string())?;
        let old = machine.install(*restored);
        // Freeing a large state takes time: not on the owner's thread.
        let _ = std::thread::Builder::new()
            .name("holdfast-free".into())
            .spawn(move || drop(old));
        let took = self.clock.now() - i.started;
        self.applied = i.index;
        self.last_snapshot = i.index;
        self.bytes_since_snapshot = 0;
        self.snapshot_bytes = i.bytes;
        self.snapshot_stats.installed += 1;
        self.snapshot_stats.installing = false;
        self.snapshot_stats.last_install_seconds = took.as_secs_f64();
        crate::log_info!(
            "cluster node {}: installed the leader's snapshot at index {} ({} bytes) in {} ms",
            self.id(),
            i.index,
            i.bytes,
            took.as_millis()
        );
        self.refresh_peers(machine);
        self.conf_changed = true;
        let held: Vec<Entry> = self.held.drain(..).collect();
        self.apply(machine, held)?;
        self.raw.advance_apply_to(self.applied);
        Ok(())
    }

    /// Starts a snapshot when the log since the last one has grown as large as the state (or
    /// past the floors, or a node was added), in a child process, unless one is running or
    /// the state is being replaced.
    fn maybe_snapshot(&mut self, machine: &impl Machine) {
        let bytes_due = self.bytes_since_snapshot >= self.policy.log_bytes.max(self.snapshot_bytes);
        let entries_due =
            self.applied >= self.last_snapshot + self.policy.every.max(self.snapshot_bytes >> 10);
        if !(bytes_due || entries_due || self.snapshot_due)
            || self.snapshot_child.is_some()
            || self.installing.is_some()
            || self
                .snapshot_retry_at
                .is_some_and(|at| self.clock.now() < at)
        {
            return;
        }
        let cs = self.raw.raft.prs().conf().to_conf_state();
        let store = self.raw.store();
        let meta = match store.snapshot_metadata_at(self.applied, cs) {
            Ok(Some(meta)) => meta,
            Ok(None) => return,
            Err(e) => {
                crate::log_error!("cluster node {}: cannot snapshot: {e}", self.id());
                return;
            }
        };
        match self
            .raw
            .mut_store()
            .start_snapshot(meta, self.snapshot_urgent, |out| {
                machine.write_snapshot(out)
            }) {
            Ok(child) => {
                self.snapshot_due = false;
                self.snapshot_urgent = false;
                self.bytes_since_snapshot = 0;
                self.last_snapshot = self.applied;
                let secs = child.fork_time().as_secs_f64();
                self.snapshot_stats.last_fork_seconds = secs;
                self.snapshot_stats.fork_times.observe_in(
                    &CLUSTER_BOUNDS,
                    nanos(child.fork_time()),
                    1,
                );
                self.snapshot_stats.writing = true;
                self.snapshot_child = Some(child);
            }
            Err(e) => {
                crate::log_error!("cluster node {}: cannot fork a snapshot: {e}", self.id());
                self.snapshot_retry_at = Some(self.clock.now() + SNAPSHOT_RETRY);
            }
        }
    }

    /// A snapshot child that has finished: its file becomes the newest snapshot and the log is
    /// compacted behind it. A failed child is logged and retried later; the log is intact.
    fn poll_snapshot_child(&mut self) -> Result<(), String> {
        let Some(child) = &mut self.snapshot_child else {
            return Ok(());
        };
        let limit = self.policy.child_timeout
            + Duration::from_secs(self.snapshot_bytes / CHILD_TIMEOUT_BYTES_PER_SECOND);
        let finished = match child.poll() {
            Some(finished) => finished,
            None if self.clock.now().saturating_duration_since(child.started()) > limit => {
                // Dropping the child kills it, reaps it and removes its file (off this thread).
                Finished::Failed(format!("still running after {} s: killed", limit.as_secs()))
            }
            None => return Ok(()),
        };
        let child = self.snapshot_child.take().expect("checked");
        self.snapshot_stats.writing = false;
        let took = self.clock.now() - child.started();
        let d = match finished {
            Finished::Done(d) => d,
            Finished::Failed(why) => {
                crate::log_error!(
                    "cluster node {}: snapshot at index {} failed: {why}",
                    self.id(),
                    child.meta().index
                );
                self.snapshot_stats.failed += 1;
                self.snapshot_retry_at = Some(self.clock.now() + SNAPSHOT_RETRY);
                // Its start reset the counters that made it due: it is due again (after the
                // wait), not once the log has grown by another snapshot's worth.
                self.snapshot_due = true;
                return Ok(());
            }
        };
        self.snapshot_retry_at = None;
        let index = child.meta().index;
        let adopting = self.clock.now();
        let store = self.raw.mut_store();
        let upto =
            store.compaction_keeping(index, self.policy.keep_entries, self.policy.keep_bytes);
        // Nothing waits for these records: their sync, and the removal of the files they make
        // useless, happen off the owner's thread.
        store
            .adopt_snapshot(child.meta().clone(), d)
            .and_then(|()| store.compact(upto))
            .and_then(|()| store.sync_in_background())?;
        self.snapshot_bytes = d.len;
        crate::log_info!(
            "cluster node {}: snapshot at index {} ({} bytes): fork {} ms, written in {} ms, \
             adopted in {} ms",
            self.id(),
            index,
            d.len,
            child.fork_time().as_millis(),
            took.as_millis(),
            (self.clock.now() - adopting).as_millis()
        );
        let st = &mut self.snapshot_stats;
        st.made += 1;
        st.last_write_seconds = took.as_secs_f64();
        st.write_times.observe_in(&CLUSTER_BOUNDS, nanos(took), 1);
        Ok(())
    }

    /// What this node's snapshots cost.
    pub fn snapshot_stats(&self) -> &SnapshotStats {
        &self.snapshot_stats
    }

    /// The index of the last applied entry.
    pub fn applied(&self) -> u64 {
        self.applied
    }
}

/// Where to reach each member of a configuration: this node's `--peers` first (an operator's
/// local override, and what a founding node knows), then the replicated book. A node outside
/// any configuration (one started with `--join`, not added yet) knows only its `--peers`.
fn effective_peers(
    members: &BTreeSet<u64>,
    local: &BTreeMap<u64, SocketAddr>,
    book: &Membership,
) -> BTreeMap<u64, SocketAddr> {
    if members.is_empty() {
        return local.clone();
    }
    members
        .iter()
        .filter_map(|id| Some((*id, *local.get(id).or_else(|| book.addrs.get(id))?)))
        .collect()
}

/// Every node id that a membership change has touched, as far as the data directory knows:
/// the replicated book of the snapshot (nodes added, nodes removed) and the changes in the log
/// after it.
fn ids_in_conf_changes(storage: &DiskStorage, book: &Membership) -> BTreeSet<u64> {
    let mut ids: BTreeSet<u64> = book.addrs.keys().copied().collect();
    ids.extend(&book.removed);
    let (first, last) = (
        storage.first_index().unwrap_or(1),
        storage.last_index().unwrap_or(0),
    );
    let mut at = first;
    while at <= last {
        // In slices: the log since the snapshot may be as large as the state.
        let entries = storage
            .entries(
                at,
                last + 1,
                Some(MAX_APPLY_BYTES),
                raft::GetEntriesContext::empty(false),
            )
            .unwrap_or_default();
        let Some(next) = entries.last().map(|e| e.index + 1) else {
            break;
        };
        at = next;
        for e in entries {
            let cc = match e.get_entry_type() {
                EntryType::EntryConfChange => ConfChange::parse_from_bytes(&e.data).map(v1_to_v2),
                EntryType::EntryConfChangeV2 => ConfChangeV2::parse_from_bytes(&e.data),
                EntryType::EntryNormal => continue,
            };
            if let Ok(cc) = cc {
                ids.extend(cc.get_changes().iter().map(|c| c.node_id));
            }
        }
    }
    ids
}

/// The rule for `--peers` against the configuration stored in the data directory (see
/// `docs/cluster.md`, "Start and restart"): every id that one names and the other does not must
/// be explained by a membership change (`cluster add` or `cluster remove`): then the stored
/// configuration is in force and the answer is a warning to log; anything else is an error
/// (such a node would never find a quorum, or would count nodes that are not there).
fn peers_against_stored(
    given: &BTreeMap<u64, SocketAddr>,
    stored: &BTreeSet<u64>,
    changed: &BTreeSet<u64>,
    dir: &std::path::Path,
) -> Result<Option<String>, String> {
    let given: BTreeSet<u64> = given.keys().copied().collect();
    if stored.is_empty() || *stored == given {
        // Nothing stored yet (a node started with --join, not added yet), or agreement.
        return Ok(None);
    }
    let list = |ids: &BTreeSet<u64>| ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let unexplained: BTreeSet<u64> = stored
        .symmetric_difference(&given)
        .filter(|id| !changed.contains(id))
        .copied()
        .collect();
    if unexplained.is_empty() {
        return Ok(Some(format!(
            "--peers names nodes {}; the configuration stored in {} (changed by cluster \
             add/remove since) has nodes {}: the stored one is in force",
            list(&given),
            dir.display(),
            list(stored)
        )));
    }
    Err(format!(
        "--peers names nodes {} but the cluster stored in --data-dir {} has nodes {}, and no \
         membership change explains the difference ({}): give --peers the stored nodes, or \
         found a new cluster with an empty --data-dir",
        list(&given),
        dir.display(),
        list(stored),
        list(&unexplained)
    ))
}

/// An old-style membership change as the one-step `ConfChangeV2` it means (holdfast proposes
/// only V2; raft-rs itself may write V1 entries).
fn v1_to_v2(c: ConfChange) -> ConfChangeV2 {
    let mut v2 = ConfChangeV2::default();
    let mut single = ConfChangeSingle::default();
    single.set_change_type(c.get_change_type());
    single.node_id = c.node_id;
    v2.mut_changes().push(single);
    v2.context = c.context;
    v2
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u64]) -> BTreeSet<u64> {
        v.iter().copied().collect()
    }

    fn peers(v: &[u64]) -> BTreeMap<u64, SocketAddr> {
        v.iter()
            .map(|&id| (id, SocketAddr::from(([127, 0, 0, 1], 2600 + id as u16))))
            .collect()
    }

    #[test]
    fn peers_that_disagree_with_the_stored_cluster_are_refused_unless_a_change_explains_it() {
        let dir = std::path::Path::new("/var/lib/holdfast");
        let check = |given: &[u64], stored: &[u64], changed: &[u64]| {
            peers_against_stored(&peers(given), &ids(stored), &ids(changed), dir)
        };
        // Agreement, or nothing stored yet (a node that waits to be added).
        assert_eq!(check(&[1, 2, 3], &[1, 2, 3], &[]), Ok(None));
        assert_eq!(check(&[1, 2, 3], &[], &[]), Ok(None));
        // Node 4 added and node 2 removed since the cluster was founded with 1, 2, 3.
        let w = check(&[1, 2, 3], &[1, 3, 4], &[2, 4])
            .unwrap()
            .expect("a warning");
        assert!(
            w.contains("nodes 1,2,3") && w.contains("has nodes 1,3,4"),
            "{w}"
        );
        // A node named that the stored cluster never had, or a stored one left out.
        let e = check(&[1, 2, 4], &[1, 2, 3], &[]).unwrap_err();
        assert_eq!(
            e,
            "--peers names nodes 1,2,4 but the cluster stored in --data-dir /var/lib/holdfast \
             has nodes 1,2,3, and no membership change explains the difference (3,4): give \
             --peers the stored nodes, or found a new cluster with an empty --data-dir"
        );
        assert!(check(&[1, 2], &[1], &[]).is_err());
        // Only the unexplained ids are named.
        let e = check(&[1, 2, 5], &[1, 2, 3, 4], &[4]).unwrap_err();
        assert!(e.contains("difference (3,5)"), "{e}");
    }
}

#[cfg(test)]
#[path = "node_snapshot_tests.rs"]
mod snapshot_tests;
