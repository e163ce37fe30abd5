//! A deterministic simulator of a raft cluster: 3 to 5 nodes in one thread, each running the
//! daemon's own Raft driver (`cluster::node::RaftNode`, its `tick`/`step`/`ready`/persist/sync
//! path, background snapshots and installs included) over an in-memory log, transport and
//! clock (`env.rs`), with their disks, their network and their clocks all driven from one
//! seed (after tigerbeetle's VOPR and FoundationDB's simulation testing).
//!
//! Owns: the simulated world (an event queue in simulated microseconds), the owner's side of
//! each node (when it ticks, steps, calls `ready`, hears of a sync), and the invariant checks.
//! It must not read a clock, a socket or a file: everything comes from the seed, so a failing
//! seed replays exactly (the instant the nodes' clocks start from is read once; only
//! differences of instants matter).
//!
//! - **Disks** ([`env::SimStore`]): the node's raft storage in memory; each `Ready` the driver
//!   writes is made durable by a sync that finishes a seeded 0.2-3.2 ms later (the daemon's sync
//!   thread), and a crash keeps only what the last sync made durable. The disk's fault hook
//!   crashes a node between writing a `Ready` and syncing it.
//! - **Network**: seeded loss, delay (hence reordering) and duplication; symmetric and one-way
//!   partitions.
//! - **Snapshots** (`snap.rs`), made and installed by the driver: *made in the background*
//!   when the driver's rule says so (its [`SnapshotPolicy`] with every
//!   [`Options::snapshot_every`] entries in some seeds; in all, in proportion: log bytes
//!   applied since the last one >= max([`Options::snapshot_floor_bytes`], the last snapshot's
//!   size); and when a node was added), the state captured when the driver starts it and the
//!   file written a seeded 1-300 ms later, when the driver adopts it and compacts its log
//!   (keeping a few entries) while the node goes on; a crash meanwhile loses it. *Sent in
//!   chunks* by the simulated transport: a `MsgSnapshot` carries the file's descriptor
//!   (length, crc32c) and the file travels beside it in chunks through the lossy network, on
//!   numbered connections with acknowledged offsets; seeded connection resets and the
//!   transport's stall timeout reconnect, resuming from the acknowledged offset or (other
//!   seeds) restarting from 0; chunks are sometimes damaged; the receiver's raft sees the
//!   `MsgSnapshot` only once the whole file arrived and checks out; the sender's driver hears
//!   `SnapshotSent` when the receiver acknowledged it all and `SnapshotFailed` when the
//!   transfer failed (receiver down or refusing, file damaged, too many reconnects).
//!   *Installed in the background* by the driver: it persists a leader's snapshot at once,
//!   the state is rebuilt from it a seeded while later (the daemon's install thread), and the
//!   driver holds the committed entries handed out meanwhile and applies them after, in order;
//!   it ticks and steps meanwhile; a crash restarts it from disk.
//! - **Clocks**: each node ticks at its own rate (±5%) and reads its own offset wall clock; the
//!   leader stamps each command with its clock, so log time is the leader's. raft-rs's
//!   randomized election timeout is redrawn from the seed whenever raft resets it.
//! - **Membership** (seeds with [`Options::membership`]): an operator adds a fresh node (ids
//!   10, 11, …, empty disk, empty `ConfState`), removes a voter, or replaces one by a fresh node,
//!   one change in flight, 3 to 5 voters, always through joint consensus (`ConfChangeV2`,
//!   `Implicit`: raft-rs's leader leaves the joint configuration by itself; the operator
//!   proposes the empty leave-joint entry when no leader did, and always in the seeds that use
//!   `Explicit`). The driver applies committed conf entries; a node stops once it applied its
//!   own removal; a node's transport refuses traffic from the nodes it saw removed.
//! - **Clients** propose `(client, seq, request)` through any node; a follower forwards to the
//!   leader it knows, and nothing tells a client that a proposal was dropped: it retries the
//!   same `(client, seq)` until it sees it applied. [`Deduped`] (replicated, in the snapshot)
//!   applies each `(client, seq)` once.
//!
//! Checked after every entry the driver applies, on every node: the entry at each index is the
//! same everywhere (log matching on what was applied), its effects are the same, the state
//! machine's snapshot at each applied index is byte-identical (also right after a restore),
//! entries apply in increasing order and none while an install is in progress, each client's
//! requests apply once and in order, and the workload's own check (for locks: never two
//! holders), every node that applied a conf entry got the same `ConfState` from it and has the
//! configuration the conf entries it applied made (a snapshot carries the `ConfState` of its
//! index), a removed node never becomes leader once a majority of the new configuration applied
//! its removal, and no leader is outside its own configuration. Of snapshots: a background
//! snapshot's bytes are the state every node had at its index, an assembled file is byte for
//! byte that state, and no log is compacted past its newest snapshot. At the end of the run the
//! faults stop and every member of the final configuration (no longer joint) must converge and
//! every client's request must have been applied (liveness); removed nodes are ignored.
//!
//! What the simulator models rather than runs: the TCP transport (its queues, connections and
//! chunked snapshot files: `snap.rs`), the disk log's file format and its sync thread, the
//! forked snapshot child and the install thread (their timing and results), and, in the
//! liveness mode, the owner's thread around its cluster loop and the workers (`live.rs`:
//! the loop itself, `server::owner::cluster::OwnerCore`, runs).

use std::cell::RefCell;
use std::cmp::Ordering as CmpOrdering;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use raft::prelude::{
    ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, ConfState, Message,
    MessageType,
};
use raft::StateRole;

use crate::cluster::node::{Parts, RaftNode, SnapshotPolicy};
use crate::cluster::transport::PeerEvent;
use crate::rng::Rng;
use crate::server::msg::ConnId;

mod env;
mod live;
pub mod native;
mod snap;
use env::{DiskFaults, Io, MemLog, Record, RestoreJob, Shared, SimClock, SimLink, SimMachine};
use env::{SimStore, SimSyncer};
pub use live::{ELECTION_US, SESSION_TIMEOUT_US};

/// The state the simulator replicates (behind [`SimMachine`], the `cluster::node::Machine` the
/// driver applies entries to): holdfast's `Replayer`, or its cluster state (`Replicated`).
pub enum SimState {
    Replayer(Box<holdfast::HoldfastMachine>),
    Replicated(Box<holdfast::ReplicatedMachine>),
}

impl From<holdfast::HoldfastMachine> for SimState {
    fn from(m: holdfast::HoldfastMachine) -> SimState {
        SimState::Replayer(Box::new(m))
    }
}

impl From<holdfast::ReplicatedMachine> for SimState {
    fn from(m: holdfast::ReplicatedMachine) -> SimState {
        SimState::Replicated(Box::new(m))
    }
}

impl SimState {
    /// Apply client `client`'s request number `seq`; returns its effects (replies, grants) as
    /// bytes.
    pub fn apply_from(&mut self, client: u64, seq: u64, command: &[u8]) -> Vec<u8> {
        match self {
            SimState::Replayer(m) => m.apply(command),
            SimState::Replicated(m) => m.apply_from(client, seq, command),
        }
    }

    /// The whole state as canonical bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        match self {
            SimState::Replayer(m) => m.snapshot(),
            SimState::Replicated(m) => m.snapshot(),
        }
    }

    /// Replace the state by one restored from `snapshot` (hostile input: an error, no panic).
    pub fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        match self {
            SimState::Replayer(m) => m.restore(snapshot),
            SimState::Replicated(m) => m.restore(snapshot),
        }
    }

    /// Liveness mode ([`Options::liveness`]): apply a cluster proposal as it is (the machine's
    /// own exactly-once rules apply).
    pub fn apply_proposal(&mut self, proposal: &[u8]) -> Vec<u8> {
        match self {
            SimState::Replayer(m) => m.apply(proposal),
            SimState::Replicated(m) => m.apply_proposal(proposal),
        }
    }

    fn cluster_state(&self) -> Option<&holdfast::ReplicatedMachine> {
        match self {
            SimState::Replicated(m) => Some(m),
            SimState::Replayer(_) => None,
        }
    }

    /// Liveness mode: whether any session of cluster node `node` is live.
    pub fn has_sessions_of(&self, node: u64) -> bool {
        self.cluster_state()
            .is_some_and(|m| m.has_sessions_of(node))
    }

    /// Liveness mode: the connections of `node`'s sessions.
    pub fn conns_of_node(&self, node: u64) -> Vec<ConnId> {
        self.cluster_state()
            .map(|m| m.conns_of_node(node))
            .unwrap_or_default()
    }

    /// Liveness mode: `node`'s latest run applied and its last sequence number applied.
    pub fn run_of(&self, node: u64) -> Option<(u64, u64)> {
        self.cluster_state()?.run_of(node)
    }

    /// Liveness mode: the fencing token of lockd lock `name` if `conn`'s session holds it.
    pub fn token_of(&self, conn: ConnId, name: &[u8]) -> Option<u64> {
        self.cluster_state()?.token_of(conn, name)
    }

    /// A committed membership change (the cluster state keeps its book of members).
    pub fn apply_conf_change(
        &mut self,
        index: u64,
        context: &[u8],
        before: &ConfState,
        after: &ConfState,
    ) {
        if let SimState::Replicated(m) = self {
            m.apply_conf_change(index, context, before, after);
        }
    }

    /// The ids removed from the cluster, as the cluster state's book has them.
    pub fn removed(&self) -> Vec<u64> {
        self.cluster_state()
            .map(|m| m.removed())
            .unwrap_or_default()
    }

    /// The Replayer's locks held (0 for the cluster state).
    pub fn locks_held(&self) -> u64 {
        match self {
            SimState::Replayer(m) => m.locks_held(),
            SimState::Replicated(_) => 0,
        }
    }
}

/// What clients do against the replicated state, and what must hold of its effects.
pub trait Workload {
    /// The next request of `client`, chosen from what the applied log has shown so far.
    fn request(&mut self, client: u64, rng: &mut Rng) -> Vec<u8>;
    /// The command the leader proposes for `request`, stamped with the leader's clock.
    fn command(&self, client: u64, request: &[u8], now_ms: u64) -> Vec<u8>;
    /// Called once per applied command, in log order, with its effects.
    fn check(&mut self, client: u64, command: &[u8], effects: &[u8]) -> Result<(), String>;
}

/// Exactly-once application of client commands: the replicated `(client → last seq)` table in
/// front of the state. A proposal is `client(u64 LE) seq(u64 LE) command`.
pub struct Deduped {
    pub inner: SimState,
    last_seq: BTreeMap<u64, u64>,
}

/// What applying one log entry did.
#[derive(Debug, PartialEq)]
pub enum Applied {
    /// A first application: the client, its sequence number and the effects.
    Command {
        client: u64,
        seq: u64,
        effects: Vec<u8>,
    },
    /// A re-proposal of a request already applied: nothing happened.
    Duplicate { client: u64, seq: u64 },
    /// Liveness mode: a cluster proposal, applied by the machine's own rules.
    Raw { effects: Vec<u8> },
    /// Not a proposal (too short): ignored on every replica alike.
    Ignored,
}

pub fn encode_proposal(client: u64, seq: u64, command: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + command.len());
    out.extend_from_slice(&client.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(command);
    out
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

impl Deduped {
    pub fn new(inner: impl Into<SimState>) -> Deduped {
        Deduped {
            inner: inner.into(),
            last_seq: BTreeMap::new(),
        }
    }

    pub fn apply(&mut self, proposal: &[u8]) -> Applied {
        if proposal.len() < 16 {
            return Applied::Ignored;
        }
        let (client, seq) = (le_u64(&proposal[..8]), le_u64(&proposal[8..16]));
        let last = self.last_seq.entry(client).or_insert(0);
        if seq <= *last {
            return Applied::Duplicate { client, seq };
        }
        *last = seq;
        Applied::Command {
            client,
            seq,
            effects: self.inner.apply_from(client, seq, &proposal[16..]),
        }
    }

    pub fn snapshot(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(self.last_seq.len() as u64).to_le_bytes());
        for (c, s) in &self.last_seq {
            out.extend_from_slice(&c.to_le_bytes());
            out.extend_from_slice(&s.to_le_bytes());
        }
        out.extend_from_slice(&self.inner.snapshot());
        out
    }

    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), String> {
        if bytes.len() < 8 {
            return Err("dedup table truncated".into());
        }
        let n = le_u64(bytes);
        let table_len = n
            .checked_mul(16)
            .filter(|&l| l <= (bytes.len() - 8) as u64)
            .ok_or("dedup table truncated")?;
        let mut last_seq = BTreeMap::new();
        for pair in bytes[8..8 + table_len as usize].chunks_exact(16) {
            last_seq.insert(le_u64(pair), le_u64(&pair[8..]));
        }
        self.inner.restore(&bytes[8 + table_len as usize..])?;
        self.last_seq = last_seq;
        Ok(())
    }
}

/// The disk's fault hooks for `opts`.
fn disk_faults(opts: &Options) -> DiskFaults {
    DiskFaults {
        crash_before_sync_permille: opts.crash_before_sync_permille,
        ack_before_sync: opts.bug_ack_before_sync,
    }
}

/// The generator of node `id`'s disk faults.
fn disk_rng(seed: u64, id: u64) -> Rng {
    Rng::new(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ id.wrapping_mul(0x6469_736b))
}

/// Every node `cs` names: voters (incoming and outgoing) and learners.
fn members(cs: &ConfState) -> Vec<u64> {
    let mut m: Vec<u64> = cs
        .voters
        .iter()
        .chain(&cs.voters_outgoing)
        .chain(&cs.learners)
        .chain(&cs.learners_next)
        .copied()
        .collect();
    m.sort_unstable();
    m.dedup();
    m
}

fn is_member(cs: &ConfState, id: u64) -> bool {
    [
        &cs.voters,
        &cs.voters_outgoing,
        &cs.learners,
        &cs.learners_next,
    ]
    .iter()
    .any(|l| l.contains(&id))
}

fn is_joint(cs: &ConfState) -> bool {
    !cs.voters_outgoing.is_empty()
}

/// `cs` with every list sorted: raft-rs builds them from hash sets, so two equal
/// configurations may list their members in different orders.
fn canonical(mut cs: ConfState) -> ConfState {
    cs.voters.sort_unstable();
    cs.voters_outgoing.sort_unstable();
    cs.learners.sort_unstable();
    cs.learners_next.sort_unstable();
    cs
}

/// The knobs of one run; [`Options::for_seed`] draws them from the seed.
#[derive(Clone, Debug)]
pub struct Options {
    pub nodes: usize,
    pub clients: u64,
    /// Simulated time with faults, then time without them (liveness), in ms.
    pub chaos_ms: u64,
    pub quiet_ms: u64,
    pub loss_percent: u64,
    pub dup_percent: u64,
    pub max_delay_us: u64,
    pub crashes: bool,
    pub partitions: bool,
    /// Per mille of `Ready`s during which the node crashes before its sync.
    pub crash_before_sync_permille: u64,
    /// Each node snapshots its state machine (and compacts its log) every this many entries
    /// (the frequent small-snapshot mode; `u64::MAX / 2` in the seeds that compact only in
    /// proportion).
    pub snapshot_every: u64,
    /// Compaction in proportion, as the daemon's: a snapshot is also due when the log bytes
    /// applied since the last one reach max(this floor, the last snapshot's size).
    pub snapshot_floor_bytes: u64,
    /// A background snapshot takes 1 ms to this long (simulated) before it is recorded.
    pub snapshot_max_us: u64,
    /// A follower's background install of a leader's snapshot takes 1 ms to this long.
    pub install_max_us: u64,
    /// A snapshot travels beside its `MsgSnapshot` in chunks of this many bytes.
    pub chunk_bytes: u64,
    /// After a reconnect a transfer resumes from the acknowledged offset (the receiver keeps
    /// its partial copy); without it, it restarts from 0 (the receiver drops it).
    pub resume_transfers: bool,
    /// Per cent of delivered chunks after which the transfer's connection resets.
    pub chunk_reset_percent: u64,
    /// Per mille of delivered chunks damaged on the way (the receiver's checksum must catch it).
    pub chunk_corrupt_permille: u64,
    /// A deliberately broken driver, to show the checks catch it: half of the time it sends a
    /// `Ready`'s votes and acknowledgements without having synced what they promise.
    pub bug_ack_before_sync: bool,
    /// Membership changes under load: adds, removals and replacements of voters.
    pub membership: bool,
    /// Changes use `ConfChangeTransition::Explicit` (as TiKV does): raft-rs does not leave the
    /// joint configuration by itself, the operator proposes the leave-joint entry.
    pub explicit_leave: bool,
    /// Founders start from a snapshot at index 1 ([`MemLog::bootstrapped`]); without it a node
    /// that joins may replay the log from index 1 on an empty `ConfState`.
    pub bootstrap_snapshot: bool,
    /// Liveness mode (`live.rs`): each node runs the owner's cluster loop (`OwnerCore`);
    /// lockd clients on the nodes through a simulated worker; the client-view checks.
    pub liveness: bool,
    /// Liveness mode: nodes are paused (not driven, their timers and messages held).
    pub pauses: bool,
    /// Liveness mode: just after a failover, a node stops being heard (its outgoing links
    /// fail; it goes on hearing the others) for one to three session timeouts
    /// ([`Cluster::maybe_cut_sends`]).
    pub send_cuts: bool,
    /// Mutations that the client-view checks must catch: a node fences a session timeout
    /// plus an election timeout after its last contact (after the majority expired it,
    /// `Liveness::fence_after`), and a node's worker that writes replies past its write
    /// deadline (the simulated worker's check skipped).
    pub bug_late_fence: bool,
    pub bug_ignore_write_deadline: bool,
    /// A mutation: a new leader expires nodes a session timeout after it last heard from
    /// them, without waiting a session timeout from its own election.
    pub bug_leader_does_not_wait: bool,
    /// A mutation: a node forgets the requests of its proposals that came in a leader's
    /// snapshot it installed (their replies were never made) instead of answering them.
    pub bug_forget_installed_requests: bool,
}

impl Options {
    pub fn for_seed(seed: u64) -> Options {
        Options::drawn(seed, true)
    }

    /// [`Options::for_seed`] without membership changes: the knobs every seed had before
    /// there were any.
    pub fn for_seed_without_membership(seed: u64) -> Options {
        Options::drawn(seed, false)
    }

    /// No snapshot is made, sent or installed: a node that restarts applies its whole log
    /// again. For what a snapshot does not carry (the native protocol's watches).
    pub fn without_compaction(mut self) -> Options {
        self.snapshot_every = u64::MAX / 2;
        self.snapshot_floor_bytes = u64::MAX / 2;
        self
    }

    fn drawn(seed: u64, membership: bool) -> Options {
        let mut r = Rng::new(seed ^ 0x006f_7074_696f_6e73);
        let mut o = Options {
            nodes: if r.chance(50) { 3 } else { 5 },
            clients: 2 + r.below(4),
            chaos_ms: 4_000,
            quiet_ms: 5_000,
            loss_percent: r.below(15),
            dup_percent: r.below(10),
            max_delay_us: 500 + r.below(20_000),
            crashes: r.chance(70),
            partitions: r.chance(70),
            crash_before_sync_permille: if r.chance(50) { 2 } else { 0 },
            snapshot_every: 5 + r.below(40),
            bug_ack_before_sync: false,
            membership: false,
            explicit_leave: false,
            bootstrap_snapshot: false,
            liveness: false,
            pauses: false,
            send_cuts: false,
            bug_late_fence: false,
            bug_ignore_write_deadline: false,
            bug_leader_does_not_wait: false,
            bug_forget_installed_requests: false,
            snapshot_floor_bytes: u64::MAX / 2,
            snapshot_max_us: 1_000,
            install_max_us: 1_000,
            chunk_bytes: 1 << 20,
            resume_transfers: false,
            chunk_reset_percent: 0,
            chunk_corrupt_permille: 0,
        };
        // Drawn last, so that the knobs above stay what they were for every seed.
        if r.chance(MEMBERSHIP_PERCENT) && membership {
            o.membership = true;
            o.bootstrap_snapshot = true;
            // Compact often, so that a node that joins needs a snapshot and some followers
            // fall behind the leader's log.
            o.snapshot_every = 3 + r.below(12);
            o.explicit_leave = r.chance(EXPLICIT_LEAVE_PERCENT);
        }
        // Snapshots and their transfers, from a generator of their own (the knobs above keep
        // their values).
        let mut s = Rng::new(seed ^ 0x736e_6170_7368_6f74);
        o.snapshot_floor_bytes = 256 + s.below(4_096);
        if !o.membership && s.chance(PROPORTIONAL_ONLY_PERCENT) {
            o.snapshot_every = u64::MAX / 2;
        }
        o.snapshot_max_us = 2_000 + s.below(300_000);
        o.install_max_us = 2_000 + s.below(200_000);
        o.chunk_bytes = 16 + s.below(112);
        o.resume_transfers = s.chance(50);
        o.chunk_reset_percent = if s.chance(60) { 1 + s.below(8) } else { 0 };
        o.chunk_corrupt_permille = if s.chance(30) { 1 + s.below(20) } else { 0 };
        o
    }
}

/// What a run did, for reports and for tests that the faults happened.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub events: u64,
    pub applied: u64,
    pub commands: u64,
    pub duplicates: u64,
    pub leaders: u64,
    pub crashes: u64,
    pub crashes_before_sync: u64,
    pub partitions: u64,
    pub snapshots_installed: u64,
    pub messages_dropped: u64,
    /// Membership changes completed (the configuration reached the target, out of joint).
    pub conf_changes: u64,
    /// Nodes added and removed by completed changes.
    pub nodes_added: u64,
    pub nodes_removed: u64,
    /// Snapshots installed by nodes that joined after the start.
    pub joiner_snapshots: u64,
    /// Packets a node's transport refused because their sender was removed.
    pub refused_from_removed: u64,
    /// Leave-joint entries the operator proposed because no leader left the joint
    /// configuration by itself (an `Explicit` change, or raft-rs's auto-leave lost).
    pub leave_joint_proposed: u64,
    /// Liveness mode: grants clients received, tokens compared, claims that lapsed by the
    /// lease rule, open claims of paused nodes' clients excused in the connection view, pauses,
    /// fences, expiries proposed, connections closed at the write deadline, clients that gave
    /// up on a request.
    pub live_grants: u64,
    pub tokens_checked: u64,
    pub claims_lapsed: u64,
    pub conn_view_excused: u64,
    pub pauses: u64,
    /// Liveness mode: nodes whose sends failed just after a failover ([`Options::send_cuts`]).
    pub send_cuts: u64,
    pub fences: u64,
    pub expiries: u64,
    pub deadline_closes: u64,
    pub client_give_ups: u64,
    /// Liveness mode: requests the nodes answered "no quorum" (the owner's rule), closes of a
    /// crashed node's connections its peers saw, and leaders elected within an election timeout
    /// of the previous leader's crash (fast failover).
    pub no_quorum_answers: u64,
    pub peer_closes: u64,
    pub fast_failovers: u64,
    /// Releases in the log by connections whose sessions an expiry had ended (the state drops
    /// them; applied, each would free whoever held the lock then).
    pub stale_releases: u64,
    /// Background snapshots: recorded (and the log compacted), lost in a crash while being
    /// made, discarded at completion because a newer installed snapshot superseded them, and
    /// made because the log grew in proportion to the last snapshot.
    pub bg_snapshots_completed: u64,
    pub bg_snapshots_dropped_by_crash: u64,
    pub bg_snapshots_superseded: u64,
    pub proportional_snapshots: u64,
    /// Chunked transfers: started, acknowledged whole (Finish reported), failed (Failure
    /// reported), reconnected resuming from the acknowledged offset, reconnected from 0;
    /// connection resets, stalls (no progress within the transport's timeout), damaged files
    /// the receiver's checksum refused, and chunks sent.
    pub transfers_started: u64,
    pub transfers_completed: u64,
    pub transfers_failed: u64,
    pub transfers_resumed: u64,
    pub transfers_restarted: u64,
    pub transfer_resets: u64,
    pub transfer_stalls: u64,
    pub transfers_corrupt_caught: u64,
    pub chunks_sent: u64,
    /// Background installs of a leader's snapshot: started, completed, lost in a crash,
    /// superseded by a newer snapshot; committed entries held while one was in progress and
    /// applied after it.
    pub installs_background: u64,
    pub installs_completed: u64,
    pub installs_dropped_by_crash: u64,
    pub installs_superseded: u64,
    pub entries_held: u64,
}

/// Ticks: every 10 ms of a node's clock; elections after 10 to 20 ticks, heartbeats every
/// tick (a tenth of the election timeout, as `--election-timeout` specifies).
const TICK_US: u64 = 10_000;
/// How long a log sync takes: an fdatasync of a few hundred microseconds to a few
/// milliseconds, as measured on this kind of machine under load.
const SYNC_MIN_US: u64 = 200;
const SYNC_SPREAD_US: u64 = 3_000;
pub(crate) const ELECTION_TICKS: usize = 10;
/// A client re-proposes after this long without seeing its request applied.
const RETRY_US: u64 = 300_000;
/// Log entries kept behind a snapshot for followers slightly behind.
const KEEP_ENTRIES: u64 = 5;
/// Simulated Unix time at start (ms), so commands carry realistic timestamps.
const EPOCH_MS: u64 = 1_700_000_000_000;
/// Share of seeds with membership changes: half, so the long runs cover both kinds alike.
const MEMBERSHIP_PERCENT: u64 = 50;
/// Liveness-mode seeds with the send-cut fault ([`Options::send_cuts`]).
const SEND_CUTS_PERCENT: u64 = 35;
/// Liveness-mode seeds that may change the membership (half of them do, as in the others).
const LIVE_MEMBERSHIP_PERCENT: u64 = 60;
/// Share of those whose changes leave the joint configuration explicitly (holdfast's
/// default is raft-rs's automatic leave; TiKV leaves explicitly): both paths run.
const EXPLICIT_LEAVE_PERCENT: u64 = 20;
/// The first id of a node that joins (founders are 1..=5), so ids are never reused.
const FIRST_JOINER_ID: u64 = 10;
/// Nodes that may join in one run, and changes one run may start: enough for an add, a
/// removal and a replacement within 4 s of chaos.
const MAX_JOINERS: u64 = 3;
const MAX_CHANGES: u64 = 4;
/// The operator looks at a change in flight this often (re-proposes it, leaves joint).
const OPERATOR_US: u64 = 100_000;
/// Voters a configuration keeps (three or five, as the README recommends, and the four in between).
const MIN_VOTERS: usize = 3;
const MAX_VOTERS: usize = 5;
/// Share of the seeds without membership changes whose nodes snapshot only in proportion to
/// the log (no every-N rule): few, large snapshots.
const PROPORTIONAL_ONLY_PERCENT: u64 = 30;

enum Packet {
    Raft(Message),
    Forward {
        client: u64,
        seq: u64,
        request: Vec<u8>,
    },
    /// A piece of a snapshot file ([`snap::Chunk`]).
    Chunk(snap::Chunk),
    /// The receiver's acknowledgement of a transfer ([`snap::Ack`]).
    Ack(snap::Ack),
}

enum Ev {
    Tick(usize),
    Deliver {
        from: usize,
        to: usize,
        packet: Packet,
    },
    Client(u64),
    Fault,
    Restart(usize),
    Heal,
    /// The send-cut fault ([`Options::send_cuts`]): node `i`'s outgoing links fail; its
    /// incoming ones fail too; all of them work again.
    CutSends(usize),
    CutReceives(usize),
    HealCut(usize),
    /// The operator's look at a membership change in flight.
    Operator,
    /// Node `i`'s log sync through `Ready` `number` finished (in its run `life`).
    Synced {
        i: usize,
        life: u64,
        number: u64,
    },
    /// Node `i`'s background snapshot `id` was written.
    SnapshotMade {
        i: usize,
        id: u64,
    },
    /// Node `i`'s background install `id` of a leader's snapshot built the new state.
    Installed {
        i: usize,
        id: u64,
    },
    /// Liveness mode: node `to`'s transport sees node `from`'s connection close (its process
    /// exited).
    PeerClosed {
        to: usize,
        from: usize,
    },
    /// The transport of node `i` looks at outgoing transfer `id` on connection `conn`.
    TransferCheck {
        i: usize,
        id: u64,
        conn: u64,
    },
}

struct Queued {
    at: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    // Earliest first out of a max-heap.
    fn cmp(&self, o: &Self) -> CmpOrdering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// A simulated node running the daemon's Raft driver.
type SimNode = RaftNode<SimStore, SimLink, SimClock>;

struct Node {
    id: u64,
    /// The daemon's driver while the node runs.
    raft: Option<SimNode>,
    machine: SimMachine,
    /// What the node's log, transport, syncer and clock share with the simulator; its disk
    /// (`Io::durable`) survives crashes.
    io: Shared,
    /// Clock rate in per mille of real time, and wall-clock offset.
    rate: u64,
    offset_ms: u64,
    /// Role and term when last driven (a change means raft redrew its election timeout), and
    /// the election timeout drawn from the seed.
    seen: Option<(StateRole, u64)>,
    timeout: usize,
    /// The `ConfState` raft starts from without a snapshot: the founders' voters, or none for
    /// a node that joined (not a voter: raft-rs will not let it campaign).
    initial_conf: ConfState,
    /// The peers whose traffic this node's transport refuses: every node it saw leave its
    /// applied configuration (by a conf entry or a snapshot), kept across restarts as etcd
    /// keeps its removed members. Not "every node outside the applied configuration": a
    /// lagging member must still hear a leader that joined after what it applied.
    refuses: Vec<u64>,
    /// Joined after the start (its snapshots are counted apart).
    joiner: bool,
    /// Applied a configuration without itself: stopped for good, as the daemon's owner stops
    /// a node that applied its own removal (raft-rs 0.7 cannot keep a removed leader running).
    retired: bool,
    /// This run of the process (a sync of an earlier run is lost with it), and the syncs in
    /// flight: `Ready` number, write number, the log as written.
    life: u64,
    syncing: VecDeque<(u64, u64, MemLog)>,
    /// Restores of a leader's snapshot in flight (the node's install threads).
    restores: Vec<RestoreJob>,
    /// Entries the driver held behind an install when last looked at.
    held: usize,
    /// Log bytes applied since the node's last snapshot, and its index (to tell snapshots made
    /// in proportion to the log from those made every so many entries).
    bytes_since: u64,
    last_snapshot: u64,
    /// Snapshot files its transport sends and receives (`snap.rs`).
    transfers: snap::Transfers,
}

impl Node {
    fn new(id: u64, rng: &mut Rng, initial_conf: ConfState, io: Io) -> Node {
        Node {
            id,
            raft: None,
            machine: SimMachine::new(SimState::replayer(), false),
            io: Rc::new(RefCell::new(io)),
            rate: 950 + rng.below(101),
            offset_ms: rng.below(2_000),
            seen: None,
            timeout: 0,
            initial_conf,
            refuses: Vec::new(),
            joiner: false,
            retired: false,
            life: 0,
            syncing: VecDeque::new(),
            restores: Vec::new(),
            held: 0,
            bytes_since: 0,
            last_snapshot: 0,
            transfers: Default::default(),
        }
    }

    /// The node's configuration went from `before` to `after`: who left is refused from now on.
    fn note_removed(&mut self, before: &ConfState, after: &ConfState) {
        for id in members(before) {
            if !is_member(after, id) && !self.refuses.contains(&id) {
                self.refuses.push(id);
            }
        }
    }

    fn applied(&self) -> u64 {
        self.raft.as_ref().map_or(0, |r| r.applied())
    }
}

/// A membership change the operator started: the voters it leads to, and the joint-consensus
/// proposal that gets there.
struct Change {
    target: Vec<u64>,
    cc: ConfChangeV2,
    added: Option<u64>,
    removed: Option<u64>,
}

struct Client {
    home: usize,
    seq: u64,
    request: Vec<u8>,
    /// The current `seq` was applied.
    done: bool,
}

/// An applied entry: its term (where the node's log still had it), data and effects.
type Logged = (Option<u64>, Vec<u8>, Vec<u8>);

/// One simulated cluster.
pub struct Cluster<W> {
    opts: Options,
    seed: u64,
    rng: Rng,
    now: u64,
    /// The instant the nodes' clocks start from (only differences of instants matter).
    epoch: Instant,
    next_seq: u64,
    queue: BinaryHeap<Queued>,
    nodes: Vec<Node>,
    new_state: fn() -> SimState,
    workload: W,
    clients: Vec<Client>,
    /// blocked[a][b]: packets from a to b are lost.
    blocked: Vec<Vec<bool>>,
    /// The send-cut fault ([`Options::send_cuts`]): per node index, the node it last forwarded
    /// a proposal to; per new leader, the first index of its term (until it tells the
    /// followers that it committed it); the node whose sends fail now.
    forwarded_to: BTreeMap<usize, usize>,
    cut_armed: BTreeMap<usize, u64>,
    sends_cut: Option<usize>,
    /// The applied log: per index, the entry's term (where the node's log still had it), data
    /// and effects.
    log: BTreeMap<u64, Logged>,
    /// Per applied index, the state machine's snapshot there.
    snaps: BTreeMap<u64, Vec<u8>>,
    client_applied: BTreeMap<u64, u64>,
    leader_terms: BTreeMap<u64, u64>,
    /// The founders' configuration, and the `ConfState` after each applied conf entry by
    /// index (applied somewhere, hence committed): the last one is the committed configuration.
    initial_conf: ConfState,
    confs: BTreeMap<u64, ConfState>,
    /// Removed node id -> index of the conf entry that left it out.
    removed: BTreeMap<u64, u64>,
    change: Option<Change>,
    changes_started: u64,
    joiners: u64,
    pub report: Report,
    /// Liveness mode's world ([`Options::liveness`]).
    live: Option<live::LiveWorld>,
}

impl<W: Workload> Cluster<W> {
    pub fn new(seed: u64, opts: Options, new_state: fn() -> SimState, workload: W) -> Cluster<W> {
        let mut rng = Rng::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5eed);
        let voters: Vec<u64> = (1..=opts.nodes as u64).collect();
        let epoch = Instant::now();
        let mut nodes = Vec::new();
        let initial_conf = canonical(ConfState::from((voters.clone(), vec![])));
        for i in 0..opts.nodes {
            let durable = if opts.bootstrap_snapshot {
                MemLog::bootstrapped(voters.clone(), Deduped::new(new_state()).snapshot())
            } else {
                MemLog::new(voters.clone())
            };
            let id = i as u64 + 1;
            let io = Io::new(durable, disk_faults(&opts), disk_rng(seed, id), epoch);
            nodes.push(Node::new(id, &mut rng, initial_conf.clone(), io));
        }
        let clients = (0..opts.clients)
            .map(|_| Client {
                home: rng.index(opts.nodes),
                seq: 0,
                request: Vec::new(),
                done: true,
            })
            .collect();
        let n = opts.nodes;
        let live = opts.liveness.then(|| live::LiveWorld::new(n, opts.clients));
        let mut c = Cluster {
            opts,
            seed,
            rng,
            now: 0,
            epoch,
            next_seq: 0,
            queue: BinaryHeap::new(),
            nodes,
            new_state,
            workload,
            clients,
            blocked: vec![vec![false; n]; n],
            forwarded_to: BTreeMap::new(),
            cut_armed: BTreeMap::new(),
            sends_cut: None,
            log: BTreeMap::new(),
            snaps: BTreeMap::new(),
            client_applied: BTreeMap::new(),
            leader_terms: BTreeMap::new(),
            initial_conf,
            confs: BTreeMap::new(),
            removed: BTreeMap::new(),
            change: None,
            changes_started: 0,
            joiners: 0,
            report: Report::default(),
            live,
        };
        for i in 0..n {
            c.start_node(i);
            let first = c.rng.below(TICK_US);
            c.push(first, Ev::Tick(i));
        }
        for k in 0..c.opts.clients {
            let at = 1_000 + c.rng.below(50_000);
            c.push(at, Ev::Client(k));
        }
        if c.opts.crashes || c.opts.partitions || c.opts.membership || c.opts.pauses {
            let at = 300_000 + c.rng.below(500_000);
            c.push(at, Ev::Fault);
        }
        if c.opts.membership {
            c.push(OPERATOR_US, Ev::Operator);
        }
        c
    }

    fn index_of(&self, id: u64) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }

    /// The committed configuration: the one the last applied conf entry made.
    fn committed_conf(&self) -> &ConfState {
        self.confs
            .values()
            .next_back()
            .unwrap_or(&self.initial_conf)
    }

    /// The configuration in force at log index `index`.
    fn conf_at(&self, index: u64) -> &ConfState {
        self.confs
            .range(..=index)
            .next_back()
            .map_or(&self.initial_conf, |(_, cs)| cs)
    }

    fn push(&mut self, delay_us: u64, ev: Ev) {
        self.next_seq += 1;
        self.queue.push(Queued {
            at: self.now + delay_us,
            seq: self.next_seq,
            ev,
        });
    }

    fn local_ms(&self, i: usize) -> u64 {
        let n = &self.nodes[i];
        EPOCH_MS + n.offset_ms + self.now * n.rate / 1_000_000
    }

    /// Node `i`'s clock as an instant (its own rate).
    fn instant(&self, i: usize) -> Instant {
        self.epoch + Duration::from_micros(self.local_us(i))
    }

    /// (Re)starts node `i` from what its disk holds, as the daemon's node starts: the state
    /// restored from the snapshot, raft told that its index is applied, the log after it
    /// applied again.
    fn start_node(&mut self, i: usize) -> Option<String> {
        let now = self.instant(i);
        let policy = SnapshotPolicy {
            every: self.opts.snapshot_every,
            log_bytes: self.opts.snapshot_floor_bytes,
            keep_entries: KEEP_ENTRIES,
            keep_bytes: u64::MAX / 2,
            child_timeout: crate::cluster::node::SNAPSHOT_CHILD_TIMEOUT,
        };
        let live = self.opts.liveness;
        let state = if live {
            // This run's state, of this node (its replies' routing) and its process.
            let shared = self.live_shared(i);
            let id = self.nodes[i].id;
            // Later runs have larger incarnations (the daemon's: its start in Unix µs).
            let m = holdfast::ReplicatedMachine::for_node(shared, id, self.now + 1);
            SimState::Replicated(Box::new(m))
        } else {
            (self.new_state)()
        };
        let node = &mut self.nodes[i];
        node.machine = SimMachine::new(state, live);
        let mut log = node.io.borrow().durable.clone();
        // Raft must start from the configuration at the index it is told is applied: the conf
        // entries after it are applied again (re-applying one on a configuration that already
        // holds it fails: "config is already joint").
        log.state.conf_state = node.initial_conf.clone();
        let (mut applied, mut snapshot_bytes) = (0, 0);
        if let Some(meta) = log.state.snapshot.clone() {
            if let Err(e) = node.machine.state.restore(&log.snapshot_data) {
                return Some(format!("node {} restart: restore failed: {}", node.id, e));
            }
            applied = meta.index;
            snapshot_bytes = log.snapshot_data.len() as u64;
            log.state.conf_state = meta.get_conf_state().clone();
            node.machine.restored_at(applied);
        }
        node.io.borrow_mut().reset(now);
        node.life += 1;
        node.seen = None;
        node.syncing.clear();
        node.restores.clear();
        node.transfers = Default::default();
        node.held = 0;
        node.bytes_since = 0;
        node.last_snapshot = applied;
        let io = &node.io;
        let parts = Parts {
            id: node.id,
            storage: SimStore::new(log, io.clone()),
            transport: SimLink { io: io.clone() },
            syncer: SimSyncer { io: io.clone() },
            clock: SimClock { io: io.clone() },
            local_peers: BTreeMap::new(),
            applied,
            snapshot_bytes,
            tick: Duration::from_micros(TICK_US),
            sync_times: Default::default(),
            dir_lock: None,
        };
        match RaftNode::assemble(parts, now) {
            Ok(mut raft) => {
                raft.set_snapshot_policy(policy);
                node.raft = Some(raft);
            }
            Err(e) => return Some(format!("node {} restart: {}", node.id, e)),
        }
        let snap = node.machine.state.snapshot();
        if self.live.is_some() {
            self.live_start(i);
        }
        if applied > 0 {
            return self.check_snapshot(i, applied, snap).err();
        }
        None
    }

    /// Node `i`'s process dies: its driver, its syncs, snapshots and restores in flight, and
    /// what its disk had not made durable are lost.
    fn crash(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let (jobs, restores) = {
            let io = node.io.borrow();
            (
                io.jobs.len(),
                node.restores.len() + io.restores_started.len(),
            )
        };
        node.raft = None;
        node.life += 1;
        node.syncing.clear();
        node.restores.clear();
        node.transfers = Default::default();
        let now = self.epoch;
        node.io.borrow_mut().reset(now);
        node.io.borrow_mut().jobs_dropped = 0;
        self.report.bg_snapshots_dropped_by_crash += jobs as u64;
        self.report.installs_dropped_by_crash += restores as u64;
        if self.live.is_some() {
            self.live_crash(i);
        }
        self.report.crashes += 1;
        let after = 100_000 + self.rng.below(2_000_000);
        self.push(after, Ev::Restart(i));
    }

    /// Runs to the end; `Err` names the first broken invariant. The nodes' log lines are
    /// silenced unless HOLDFAST_SIM_TRACE=1.
    pub fn run(&mut self) -> Result<Report, String> {
        let trace = std::env::var("HOLDFAST_SIM_TRACE").is_ok_and(|v| v == "1");
        crate::log::mute_thread(!trace);
        let result = self.run_quietly();
        crate::log::mute_thread(false);
        result
    }

    fn run_quietly(&mut self) -> Result<Report, String> {
        let end = (self.opts.chaos_ms + self.opts.quiet_ms) * 1000;
        let chaos_end = self.opts.chaos_ms * 1000;
        let mut healed = false;
        while let Some(q) = self.queue.pop() {
            if q.at > end {
                break;
            }
            self.now = q.at;
            if !healed && self.now >= chaos_end {
                healed = true;
                self.heal_all()?;
            }
            self.report.events += 1;
            self.event(q.ev, self.now >= chaos_end)?;
        }
        self.finish()
    }

    fn heal_all(&mut self) -> Result<(), String> {
        for row in &mut self.blocked {
            row.iter_mut().for_each(|b| *b = false);
        }
        self.opts.loss_percent = 0;
        self.opts.crash_before_sync_permille = 0;
        self.opts.chunk_reset_percent = 0;
        self.opts.chunk_corrupt_permille = 0;
        let faults = disk_faults(&self.opts);
        for i in 0..self.nodes.len() {
            self.nodes[i].io.borrow_mut().faults = faults;
            if self.nodes[i].raft.is_none() && !self.nodes[i].retired {
                if let Some(e) = self.start_node(i) {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn event(&mut self, ev: Ev, quiet: bool) -> Result<(), String> {
        let Some(ev) = self.live_held(ev) else {
            return Ok(()); // for a paused node: held until it resumes
        };
        match ev {
            Ev::Tick(i) => {
                let now = self.instant(i);
                if let Some(raft) = self.nodes[i].raft.as_mut() {
                    let id = raft.id();
                    raft.tick(now)
                        .map_err(|e| format!("node {id}: tick: {e}"))?;
                }
                let jitter = self.rng.below(TICK_US / 20);
                let every = TICK_US * 1000 / self.nodes[i].rate + jitter;
                self.push(every, Ev::Tick(i));
                self.round(i)?;
            }
            Ev::Deliver { from, to, packet } => {
                // The receiver's transport refuses a sender it saw removed.
                let refused = self.nodes[to].refuses.contains(&self.nodes[from].id);
                if refused && self.nodes[to].raft.is_some() {
                    self.report.refused_from_removed += 1;
                }
                if self.nodes[to].raft.is_none() || refused {
                    // A transport learns that a snapshot did not arrive (its connection failed):
                    // the leader must hear it, or it waits for that snapshot forever.
                    if let Packet::Chunk(c) = &packet {
                        return self.transfer_refused(from, c.id());
                    }
                    return Ok(());
                }
                // The receiver's transport notes the frame's arrival.
                let at = self.instant(to);
                let from_id = self.nodes[from].id;
                self.nodes[to].io.borrow_mut().heard.insert(from_id, at);
                match packet {
                    // The owner's loop steps it (liveness mode).
                    Packet::Raft(m) if self.live.is_some() => self.live_step(to, m),
                    Packet::Raft(m) => {
                        if let Some(raft) = self.nodes[to].raft.as_mut() {
                            // A stale or foreign message is ignored, as raft-rs decides.
                            raft.step(m);
                        }
                    }
                    Packet::Forward {
                        client,
                        seq,
                        request,
                    } => self.propose_at(to, client, seq, &request),
                    Packet::Chunk(c) => self.receive_chunk(from, to, c)?,
                    Packet::Ack(a) => self.receive_ack(to, a),
                }
                self.round(to)?;
            }
            Ev::Client(k) if self.live.is_some() => self.live_client_event(k)?,
            Ev::Client(k) => self.client_event(k, quiet)?,
            Ev::Fault => {
                if !quiet {
                    self.fault()?;
                    let next = 200_000 + self.rng.below(1_000_000);
                    self.push(next, Ev::Fault);
                }
            }
            Ev::Restart(i) => {
                if self.nodes[i].raft.is_none() && !self.nodes[i].retired {
                    if let Some(e) = self.start_node(i) {
                        return Err(e);
                    }
                    self.round(i)?;
                }
            }
            Ev::Heal => {
                for row in &mut self.blocked {
                    row.iter_mut().for_each(|b| *b = false);
                }
            }
            Ev::CutSends(i) => self.cut_sends(i),
            Ev::CutReceives(i) => {
                if self.sends_cut == Some(i) {
                    for a in 0..self.nodes.len() {
                        self.blocked[a][i] = a != i;
                    }
                }
            }
            Ev::HealCut(i) => {
                self.blocked[i].iter_mut().for_each(|b| *b = false);
                self.blocked.iter_mut().for_each(|row| row[i] = false);
                if self.sends_cut == Some(i) {
                    self.sends_cut = None;
                }
            }
            Ev::Operator => {
                self.operator()?;
                self.push(OPERATOR_US, Ev::Operator);
            }
            Ev::Synced { i, life, number } => {
                let node = &mut self.nodes[i];
                if node.life != life || node.raft.is_none() {
                    return Ok(());
                }
                while node.syncing.front().is_some_and(|(n, ..)| *n <= number) {
                    let (_, write, log) = node.syncing.pop_front().expect("checked");
                    node.io.borrow_mut().made_durable(write, log);
                }
                // The owner's answer from the sync thread.
                if let Some(raft) = node.raft.as_mut() {
                    let id = raft.id();
                    raft.on_synced(Ok(number))
                        .map_err(|e| format!("node {id}: {e}"))?;
                }
                // The daemon's owner runs a round on waking for it.
                if self.live.is_some() {
                    self.round(i)?;
                } else {
                    self.drive(i)?;
                }
            }
            Ev::SnapshotMade { i, id } => self.snapshot_made(i, id)?,
            Ev::Installed { i, id } => self.installed(i, id)?,
            Ev::PeerClosed { to, from } => self.live_peer_closed(to, from)?,
            Ev::TransferCheck { i, id, conn } => self.transfer_check(i, id, conn)?,
        }
        Ok(())
    }

    fn fault(&mut self) -> Result<(), String> {
        let n = self.nodes.len();
        let kinds = match (self.opts.membership, self.opts.pauses) {
            (true, true) => 8,
            (false, false) => 4,
            _ => 6,
        };
        match self.rng.below(kinds) {
            4 | 5 if self.opts.pauses => self.live_pause(),
            0 | 1 if self.opts.crashes => {
                let i = self.rng.index(n);
                if self.nodes[i].raft.is_some() {
                    self.crash(i);
                }
            }
            2 if self.opts.partitions => {
                // Symmetric: a random side cut off from the rest.
                let side: Vec<bool> = (0..n).map(|_| self.rng.chance(50)).collect();
                for a in 0..n {
                    for b in 0..n {
                        self.blocked[a][b] = side[a] != side[b];
                    }
                }
                self.report.partitions += 1;
                let heal = 200_000 + self.rng.below(2_000_000);
                self.push(heal, Ev::Heal);
            }
            3 if self.opts.partitions => {
                // One-way: a node stops hearing another (or being heard).
                let (a, b) = (self.rng.index(n), self.rng.index(n));
                if a != b {
                    self.blocked[a][b] = true;
                    self.report.partitions += 1;
                    let heal = 200_000 + self.rng.below(2_000_000);
                    self.push(heal, Ev::Heal);
                }
            }
            4..=7 => return self.start_change(),
            _ => {}
        }
        Ok(())
    }

    /// The membership fault: an operator adds a fresh node, removes a voter or replaces one,
    /// through joint consensus, when no change is in flight. The configuration keeps 3 to 5
    /// voters, and a majority of both the old and the new one is up when the change starts.
    fn start_change(&mut self) -> Result<(), String> {
        let conf = self.committed_conf().clone();
        if self.change.is_some() || self.changes_started >= MAX_CHANGES || is_joint(&conf) {
            return Ok(());
        }
        let voters = conf.voters.clone();
        let can_add = voters.len() < MAX_VOTERS && self.joiners < MAX_JOINERS;
        let can_remove = voters.len() > MIN_VOTERS;
        let can_replace = self.joiners < MAX_JOINERS;
        let kinds: Vec<(bool, bool)> = [
            (can_add, (true, false)),
            (can_remove, (false, true)),
            (can_replace, (true, true)),
        ]
        .iter()
        .filter(|(ok, _)| *ok)
        .map(|(_, k)| *k)
        .collect();
        if kinds.is_empty() {
            return Ok(());
        }
        let (add, remove) = kinds[self.rng.index(kinds.len())];
        let removed = remove.then(|| voters[self.rng.index(voters.len())]);
        let added = add.then_some(FIRST_JOINER_ID + self.joiners);
        let mut target: Vec<u64> = voters
            .iter()
            .copied()
            .filter(|v| Some(*v) != removed)
            .chain(added)
            .collect();
        target.sort_unstable();
        // A node that joins is up; never leave a majority of the old or new voters down.
        let up = |c: &Self, ids: &[u64]| {
            ids.iter()
                .filter(|id| {
                    Some(**id) == added
                        || c.index_of(**id).is_some_and(|i| c.nodes[i].raft.is_some())
                })
                .count()
        };
        if up(self, &voters) * 2 <= voters.len() || up(self, &target) * 2 <= target.len() {
            return Ok(());
        }
        let mut cc = ConfChangeV2::default();
        cc.set_transition(if self.opts.explicit_leave {
            ConfChangeTransition::Explicit
        } else {
            ConfChangeTransition::Implicit
        });
        for (id, ty) in [
            (added, ConfChangeType::AddNode),
            (removed, ConfChangeType::RemoveNode),
        ] {
            if let Some(id) = id {
                let mut single = ConfChangeSingle {
                    node_id: id,
                    ..Default::default()
                };
                single.set_change_type(ty);
                cc.mut_changes().push(single);
            }
        }
        if let Some(id) = added {
            self.add_node(id)?;
        }
        self.changes_started += 1;
        self.change = Some(Change {
            target,
            cc,
            added,
            removed,
        });
        self.operator()
    }

    /// Starts a fresh node `id` with an empty disk (the operator starts it with `--join` before
    /// asking the leader to add it).
    fn add_node(&mut self, id: u64) -> Result<(), String> {
        self.joiners += 1;
        let io = Io::new(
            MemLog::default(),
            disk_faults(&self.opts),
            disk_rng(self.seed, id),
            self.epoch,
        );
        let mut node = Node::new(id, &mut self.rng, ConfState::default(), io);
        node.joiner = true;
        self.nodes.push(node);
        if let Some(l) = self.live.as_mut() {
            l.add_node();
        }
        for row in &mut self.blocked {
            row.push(false);
        }
        self.blocked.push(vec![false; self.nodes.len()]);
        let i = self.nodes.len() - 1;
        if let Some(e) = self.start_node(i) {
            return Err(e);
        }
        let first = self.rng.below(TICK_US);
        self.push(first, Ev::Tick(i));
        Ok(())
    }

    /// The operator's look at the change in flight: done once the committed configuration is
    /// the target and not joint; otherwise, at the leader, proposes the change again (a
    /// proposal is dropped silently when the leader changes) or, if the leader is in the joint
    /// configuration with no conf change pending, the leave-joint entry.
    fn operator(&mut self) -> Result<(), String> {
        let Some(change) = &self.change else {
            return Ok(());
        };
        let conf = self.committed_conf();
        if !is_joint(conf) && conf.voters == change.target {
            self.report.conf_changes += 1;
            self.report.nodes_added += u64::from(change.added.is_some());
            self.report.nodes_removed += u64::from(change.removed.is_some());
            self.change = None;
            return Ok(());
        }
        let leader = (0..self.nodes.len())
            .filter_map(|i| {
                let raft = self.nodes[i].raft.as_ref()?;
                raft.is_leader().then_some((raft.term(), i))
            })
            .max();
        let Some((_, l)) = leader else {
            return Ok(());
        };
        let Some(raft) = self.nodes[l].raft.as_mut() else {
            return Ok(());
        };
        if raft.raw().raft.has_pending_conf() {
            return Ok(());
        }
        let at_leader = canonical(raft.conf_state());
        if is_joint(&at_leader) {
            // Refused (and counted for nothing) by a leader that is not a member any more.
            if raft.propose_conf_change(ConfChangeV2::default()).is_ok() {
                self.report.leave_joint_proposed += 1;
            }
        } else if at_leader.voters != change.target {
            // Refused by a leader that is not a member any more; the next look retries.
            let _ = raft.propose_conf_change(change.cc.clone());
        }
        self.drive(l)
    }

    fn client_event(&mut self, k: u64, quiet: bool) -> Result<(), String> {
        let late = self.now + 2 * RETRY_US > (self.opts.chaos_ms + self.opts.quiet_ms) * 1000;
        let c = &self.clients[k as usize];
        if c.done {
            if quiet && late {
                return Ok(());
            }
            let request = self.workload.request(k, &mut self.rng);
            let c = &mut self.clients[k as usize];
            c.seq += 1;
            c.request = request;
            c.done = false;
        }
        // Send (or resend) through the home node; a client whose node is down moves, and so
        // does one whose node was removed (it closes its clients' connections).
        let home = self.clients[k as usize].home;
        if self.opts.membership {
            let id = self.nodes[home].id;
            if self.nodes[home].raft.is_none() || !is_member(self.committed_conf(), id) {
                let voters = self.committed_conf().voters.clone();
                let id = voters[self.rng.index(voters.len())];
                if let Some(i) = self.index_of(id) {
                    self.clients[k as usize].home = i;
                }
            }
        } else if self.nodes[home].raft.is_none() {
            self.clients[k as usize].home = self.rng.index(self.nodes.len());
        }
        let (home, seq, request) = {
            let c = &self.clients[k as usize];
            (c.home, c.seq, c.request.clone())
        };
        if self.nodes[home].raft.is_some() {
            self.propose_at(home, k, seq, &request);
            self.drive(home)?;
        }
        self.push(RETRY_US, Ev::Client(k));
        Ok(())
    }

    /// A proposal reaching node `i`: proposed if it leads, forwarded to the leader it knows,
    /// dropped otherwise (the client retries).
    fn propose_at(&mut self, i: usize, client: u64, seq: u64, request: &[u8]) {
        let now_ms = self.local_ms(i);
        let Some(raft) = self.nodes[i].raft.as_mut() else {
            return;
        };
        if raft.is_leader() {
            let command = self.workload.command(client, request, now_ms);
            // A leader stepping down refuses; the client retries.
            raft.propose(encode_proposal(client, seq, &command));
        } else if raft.leader() != 0 {
            let leader = raft.leader();
            let Some(to) = self.index_of(leader) else {
                return;
            };
            self.send(
                i,
                to,
                Packet::Forward {
                    client,
                    seq,
                    request: request.to_vec(),
                },
            );
        }
    }

    fn send(&mut self, from: usize, to: usize, packet: Packet) {
        let lost = self.blocked[from][to] || self.rng.chance(self.opts.loss_percent);
        if lost {
            self.report.messages_dropped += 1;
            return;
        }
        if self.rng.chance(self.opts.dup_percent) {
            let delay = 50 + self.rng.below(self.opts.max_delay_us);
            self.push(
                delay,
                Ev::Deliver {
                    from,
                    to,
                    packet: packet_clone(&packet),
                },
            );
        }
        let raft_msg = match &packet {
            Packet::Raft(m) => Some((m.get_msg_type(), m.get_commit())),
            _ => None,
        };
        let delay = 50 + self.rng.below(self.opts.max_delay_us);
        self.push(delay, Ev::Deliver { from, to, packet });
        if let Some((kind, commit)) = raft_msg.filter(|_| self.opts.send_cuts) {
            self.maybe_cut_sends(from, to, kind, commit);
        }
    }

    /// The send-cut fault ([`Options::send_cuts`]): just after a failover, a node stops being
    /// heard (its outgoing links fail; it goes on hearing the others):
    /// - a new leader, as soon as it tells the followers that it committed the first entry of
    ///   its term (which it applied);
    /// - a follower, a few milliseconds after it first forwards a proposal to a leader new to
    ///   it (once the acknowledgements it sends after its log sync went out), and an election
    ///   timeout later it stops hearing the others too.
    ///
    /// Such a node had no quorum probe answered since the old leader went away (a new leader
    /// answers none before it commits in its term), so it may apply its clients' first
    /// requests past its write deadline, in entries it proposed during the election; and the
    /// leader that no longer hears it expires its sessions a session timeout later. Its links
    /// work again one to three session timeouts after they failed. One node at a time, so that
    /// a majority goes on hearing each other.
    fn maybe_cut_sends(&mut self, from: usize, to: usize, kind: MessageType, commit: u64) {
        let cut = match kind {
            MessageType::MsgPropose => {
                let before = self.forwarded_to.insert(from, to);
                before != Some(to)
            }
            MessageType::MsgAppend => {
                let first = self.cut_armed.get(&from).copied();
                if first.is_none_or(|first| commit < first) {
                    return;
                }
                self.cut_armed.remove(&from);
                true
            }
            _ => false,
        };
        if cut && kind == MessageType::MsgPropose {
            let after = SYNC_MIN_US + SYNC_SPREAD_US + self.rng.below(SYNC_SPREAD_US);
            self.push(after, Ev::CutSends(from));
            self.push(after + ELECTION_US, Ev::CutReceives(from));
        } else if cut {
            self.cut_sends(from);
        }
    }

    /// Node `i`'s outgoing links fail now, unless another node's have or the chaos is over.
    fn cut_sends(&mut self, i: usize) {
        if self.sends_cut.is_some()
            || self.now >= self.opts.chaos_ms * 1000
            || self.nodes[i].raft.is_none()
        {
            return;
        }
        self.sends_cut = Some(i);
        for b in 0..self.nodes.len() {
            self.blocked[i][b] = b != i;
        }
        self.report.send_cuts += 1;
        let session = live::SESSION_TIMEOUT_US;
        let heal = session + self.rng.below(2 * session);
        self.push(heal, Ev::HealCut(i));
    }

    /// The node's owner handles what raft has ready: the daemon's `RaftNode::ready` (persist,
    /// apply, sync, send), again while its syncer has answers waiting; then the simulator
    /// looks at what it did.
    fn drive(&mut self, i: usize) -> Result<(), String> {
        loop {
            let now = self.instant(i);
            let node = &mut self.nodes[i];
            let Some(raft) = node.raft.as_mut() else {
                return Ok(());
            };
            node.io.borrow_mut().now = now;
            let result = raft.ready(&mut node.machine);
            match self.after_call(i, result)? {
                Some(((), true)) => {}
                _ => return Ok(()),
            }
        }
    }

    /// What follows a call into node `i` that may have written its log: if the disk's fault
    /// hook crashed it (written, not synced, lost with the process, and whatever the call
    /// would have sent or answered with it), the crash and `None`; else the call's result and
    /// whether its syncer has answers waiting (call again). [`Self::after`] either way.
    pub(super) fn after_call<T>(
        &mut self,
        i: usize,
        result: Result<T, String>,
    ) -> Result<Option<(T, bool)>, String> {
        let (crashed, again) = {
            let io = self.nodes[i].io.borrow();
            (io.crash, !io.sync_done.is_empty())
        };
        if crashed {
            self.report.crashes_before_sync += 1;
            self.after(i)?;
            self.crash(i);
            return Ok(None);
        }
        let id = self.nodes[i].id;
        let out = result.map_err(|e| format!("node {id}: {e}"))?;
        self.after(i)?;
        Ok(Some((out, again)))
    }

    /// After a call into node `i`'s driver: check what it applied, route what it sent, and
    /// schedule what it started (syncs, snapshots, restores).
    fn after(&mut self, i: usize) -> Result<(), String> {
        let id = self.nodes[i].id;
        if let Some(e) = self.nodes[i].machine.errors.first() {
            return Err(format!("node {id}: {e}"));
        }
        let records = std::mem::take(&mut self.nodes[i].machine.records);
        for r in records {
            self.check_record(i, r)?;
        }
        let installs = std::mem::take(&mut self.nodes[i].machine.installs);
        self.report.snapshots_installed += installs;
        self.report.installs_completed += installs;
        if self.nodes[i].joiner {
            self.report.joiner_snapshots += installs;
        }
        let installed = std::mem::take(&mut self.nodes[i].io.borrow_mut().installed);
        for (before, meta) in installed {
            let cs = canonical(meta.get_conf_state().clone());
            if cs != *self.conf_at(meta.index) {
                return Err(format!(
                    "node {id}: a snapshot at {} carries {cs:?}, the configuration there is {:?}",
                    meta.index,
                    self.conf_at(meta.index)
                ));
            }
            self.nodes[i].note_removed(&before, &cs);
            self.nodes[i].bytes_since = 0;
            self.nodes[i].last_snapshot = meta.index;
        }
        let outbox = std::mem::take(&mut self.nodes[i].io.borrow_mut().outbox);
        self.send_all(i, outbox);
        self.schedule_syncs(i);
        self.snap_after(i)?;
        self.draw_election_timeout(i);
        let node = &mut self.nodes[i];
        let Some(raft) = node.raft.as_mut() else {
            return Ok(());
        };
        let seen = Some((raft.role(), raft.term()));
        if seen != node.seen {
            node.seen = seen;
            if raft.is_leader() {
                self.note_leader(i)?;
            }
        }
        let node = &mut self.nodes[i];
        let held = node.raft.as_ref().map_or(0, |r| r.held_entries());
        self.report.entries_held += held.saturating_sub(node.held) as u64;
        node.held = held;
        if node.raft.as_ref().is_some_and(|r| r.is_removed()) {
            // It applied its own removal: the owner stops it (its process exits).
            node.retired = true;
            node.raft = None;
            if self.live.is_some() {
                self.live_crash(i);
            }
        }
        self.check_conf(i)?;
        self.check_compaction(i)
    }

    /// Draw node `i`'s election timeout from the seed whenever raft may have reset it (raft-rs
    /// draws it from a thread's generator, and zeroes the elapsed ticks with it): after a
    /// change of role or term, or with no tick elapsed (also after a message from the leader:
    /// the timeout after the last one is a fresh draw either way). Before the node ticks again.
    pub(super) fn draw_election_timeout(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let Some(raft) = node.raft.as_mut() else {
            return;
        };
        let seen = Some((raft.role(), raft.term()));
        let r = &raft.raw().raft;
        let reset = r.election_elapsed == 0 || r.randomized_election_timeout() != node.timeout;
        if seen != node.seen || reset {
            let t = ELECTION_TICKS + self.rng.index(ELECTION_TICKS);
            raft.raw_mut().raft.set_randomized_election_timeout(t);
            node.timeout = t;
        }
    }

    /// A node's configuration is the one the conf entries it applied made (its driver applies
    /// each through raft, which may refuse one: then it differs), except while a leader's
    /// snapshot is being installed (raft has the snapshot's, the machine not yet) and before a
    /// node that joined has anything.
    fn check_conf(&self, i: usize) -> Result<(), String> {
        let Some(raft) = self.nodes[i].raft.as_ref() else {
            return Ok(());
        };
        let applied = raft.applied();
        if applied == 0 || raft.snapshot_stats().installing {
            return Ok(());
        }
        let cs = canonical(raft.conf_state());
        let want = self.conf_at(applied);
        if cs != *want {
            return Err(format!(
                "node {}: configuration {cs:?} after applying through {applied}, the conf entry \
                 there made {want:?}",
                self.nodes[i].id
            ));
        }
        Ok(())
    }

    /// Syncs node `i` asked for: each done a seeded while later.
    fn schedule_syncs(&mut self, i: usize) {
        let requests = std::mem::take(&mut self.nodes[i].io.borrow_mut().sync_requests);
        for (number, write, log) in requests {
            let life = self.nodes[i].life;
            self.nodes[i].syncing.push_back((number, write, log));
            let took = SYNC_MIN_US + self.rng.below(SYNC_SPREAD_US);
            self.push(took, Ev::Synced { i, life, number });
        }
    }

    /// A node became leader: one per term, a voter of its own configuration, and not a node
    /// whose removal a majority of the new configuration applied (they refuse its traffic
    /// since, restarts included, so it cannot have had their votes).
    fn note_leader(&mut self, i: usize) -> Result<(), String> {
        let Some(raft) = self.nodes[i].raft.as_ref() else {
            return Ok(());
        };
        let raw = raft.raw();
        let (id, term) = (raw.raft.id, raw.raft.term);
        if self.opts.send_cuts {
            self.cut_armed.insert(i, raw.raft.raft_log.last_index());
        }
        if !raw.raft.prs().conf().voters().contains(id) {
            return Err(format!(
                "node {} leads term {} outside its configuration {:?}",
                id,
                term,
                raw.raft.prs().conf().to_conf_state()
            ));
        }
        if let Some(&at) = self.removed.get(&id) {
            let new_voters = &self.confs[&at].voters;
            let applied = new_voters
                .iter()
                .filter(|v| {
                    self.index_of(**v)
                        .is_some_and(|k| self.nodes[k].refuses.contains(&id))
                })
                .count();
            if applied * 2 > new_voters.len() {
                return Err(format!(
                    "removed node {} became leader of term {} after {} of the voters {:?} applied \
                     its removal at {}",
                    id, term, applied, new_voters, at
                ));
            }
        }
        self.report.leaders += 1;
        if self.live.is_some() {
            self.live_new_leader();
        }
        match self.leader_terms.insert(term, id) {
            Some(other) if other != id => Err(format!(
                "two leaders in term {}: {} and {}",
                term, other, id
            )),
            _ => Ok(()),
        }
    }

    fn send_all(&mut self, from: usize, msgs: Vec<Message>) {
        for m in msgs {
            if let Some(to) = self.index_of(m.to) {
                if m.get_msg_type() == MessageType::MsgSnapshot {
                    self.start_transfer(from, to, m);
                } else {
                    self.send(from, to, Packet::Raft(m));
                }
            }
        }
    }

    /// The checks of one entry node `i`'s machine applied (in log order), made as the driver
    /// applied it.
    fn check_record(&mut self, i: usize, r: Record) -> Result<(), String> {
        let id = self.nodes[i].id;
        let live = self.live.is_some();
        if live && !self.log.contains_key(&r.index) {
            self.live_first(r.index, &r.data, &r.expired_conns);
        }
        if let Some((before, after)) = &r.conf {
            self.conf_applied(i, r.index, before, after)?;
        }
        self.nodes[i].bytes_since += r.data.len() as u64;
        let effect_bytes = match &r.applied {
            Applied::Command { effects, .. } | Applied::Raw { effects } => effects.clone(),
            _ => Vec::new(),
        };
        self.live_applied(i, &effect_bytes, &r.tokens)?;
        let term = self.nodes[i]
            .raft
            .as_ref()
            .and_then(|raft| raft.raw().raft.raft_log.term(r.index).ok());
        match self.log.get(&r.index) {
            Some((t, data, eff)) => {
                let terms_differ = matches!((t, term), (Some(a), Some(b)) if *a != b);
                if terms_differ || *data != r.data {
                    return Err(format!(
                        "node {} applied a different entry at {}",
                        id, r.index
                    ));
                }
                if *eff != effect_bytes {
                    return Err(format!("node {}: different effects at {}", id, r.index));
                }
            }
            None => {
                self.log
                    .insert(r.index, (term, r.data.clone(), effect_bytes));
                self.first_application(r.applied, &r.data)?;
            }
        }
        self.report.applied = self.report.applied.max(r.index);
        self.check_snapshot(i, r.index, r.snapshot)
    }

    /// A committed conf entry node `i`'s driver applied (`RawNode::apply_conf_change`, the
    /// `ConfState` kept in its storage): who left is refused from now on, and every node must
    /// get the same `ConfState` from the same entry.
    fn conf_applied(
        &mut self,
        i: usize,
        index: u64,
        before: &ConfState,
        after: &ConfState,
    ) -> Result<(), String> {
        let id = self.nodes[i].id;
        self.nodes[i].note_removed(before, after);
        match self.confs.get(&index) {
            Some(other) if other != after => Err(format!(
                "node {id}: conf entry at {index}: gave {after:?}, another node got {other:?}"
            )),
            Some(_) => Ok(()),
            None => {
                for gone in members(self.conf_at(index)) {
                    if !is_member(after, gone) {
                        self.removed.insert(gone, index);
                    }
                }
                self.confs.insert(index, after.clone());
                Ok(())
            }
        }
    }

    /// The checks made once per log index, in log order.
    fn first_application(&mut self, applied: Applied, proposal: &[u8]) -> Result<(), String> {
        match applied {
            Applied::Command {
                client,
                seq,
                effects,
            } => {
                self.report.commands += 1;
                let last = self.client_applied.entry(client).or_insert(0);
                if seq != *last + 1 {
                    return Err(format!(
                        "client {} request {} applied after {}",
                        client, seq, last
                    ));
                }
                *last = seq;
                if let Some(c) = self.clients.get_mut(client as usize) {
                    if c.seq == seq {
                        c.done = true;
                    }
                }
                self.workload.check(client, &proposal[16..], &effects)
            }
            Applied::Duplicate { .. } => {
                self.report.duplicates += 1;
                Ok(())
            }
            Applied::Raw { .. } => {
                self.report.commands += 1;
                Ok(())
            }
            Applied::Ignored => Ok(()),
        }
    }

    fn check_snapshot(&mut self, i: usize, index: u64, snap: Vec<u8>) -> Result<(), String> {
        match self.snaps.get(&index) {
            Some(s) if *s != snap => Err(format!(
                "node {}: state at applied index {} differs from another node's ({} vs {} bytes)",
                i + 1,
                index,
                snap.len(),
                s.len()
            )),
            Some(_) => Ok(()),
            None => {
                self.snaps.insert(index, snap);
                Ok(())
            }
        }
    }

    fn finish(&mut self) -> Result<Report, String> {
        let conf = self.committed_conf().clone();
        if is_joint(&conf) {
            return Err(format!(
                "the configuration is still joint at the end: {:?}",
                conf
            ));
        }
        // Removed nodes are ignored: only the final voters must converge.
        let live: Vec<&Node> = self
            .nodes
            .iter()
            .filter(|n| conf.voters.contains(&n.id))
            .collect();
        if live.len() != conf.voters.len() {
            return Err(format!("voters {:?} are not all nodes", conf.voters));
        }
        let applied: Vec<u64> = live.iter().map(|n| n.applied()).collect();
        if applied.iter().any(|&a| a != applied[0]) {
            let mut why = String::new();
            for n in &live {
                if let Some(r) = n.raft.as_ref().map(|r| r.raw()) {
                    let st = r.status();
                    why += &format!(
                        "\n node {} {:?} term {} commit {} last {} first {} snap {:?} progress {:?}",
                        n.id,
                        r.raft.state,
                        r.raft.term,
                        r.raft.raft_log.committed,
                        r.raft.raft_log.last_index(),
                        r.store().state.base_index() + 1,
                        r.store().state.snapshot.as_ref().map(|m| m.index),
                        st.progress.map(|p| p.iter().map(|(id, pr)| (*id, pr.matched, pr.next_idx, pr.state)).collect::<Vec<_>>())
                    );
                }
            }
            return Err(format!(
                "nodes did not converge: applied {:?}{}",
                applied, why
            ));
        }
        for (k, c) in self.clients.iter().enumerate() {
            if !c.done {
                return Err(format!("client {} request {} never applied", k, c.seq));
            }
        }
        let first = live[0].machine.state.snapshot();
        for n in &live[1..] {
            if n.machine.state.snapshot() != first {
                return Err(format!("node {} state differs at the end", n.id));
            }
        }
        Ok(self.report.clone())
    }
}

fn packet_clone(p: &Packet) -> Packet {
    match p {
        Packet::Raft(m) => Packet::Raft(m.clone()),
        Packet::Forward {
            client,
            seq,
            request,
        } => Packet::Forward {
            client: *client,
            seq: *seq,
            request: request.clone(),
        },
        Packet::Chunk(c) => Packet::Chunk(c.clone()),
        Packet::Ack(a) => Packet::Ack(a.clone()),
    }
}

/// One seeded run of holdfast's own state machine under a lockd lock workload.
pub fn run_holdfast_seed(seed: u64) -> Result<Report, String> {
    run_holdfast(seed, Options::for_seed(seed))
}

/// [`run_holdfast_seed`] with other options.
pub fn run_holdfast(seed: u64, opts: Options) -> Result<Report, String> {
    let mut c = Cluster::new(
        seed,
        opts,
        SimState::replayer,
        holdfast::LockWorkload::default(),
    );
    c.run().map_err(|e| format!("seed {}: {}", seed, e))
}

/// [`run_holdfast_seed`] with holdfast's cluster state (`Replicated`) as the machine.
pub fn run_replicated_seed(seed: u64) -> Result<Report, String> {
    let mut c = Cluster::new(
        seed,
        Options::for_seed(seed),
        SimState::replicated,
        holdfast::LockWorkload::default(),
    );
    c.run()
        .map_err(|e| format!("seed {} (cluster state): {}", seed, e))
}

/// One seeded run of the native protocol's workload (`native.rs`) over `state` (holdfast's
/// `Replayer` or its cluster state): the run's report and what the clients' requests reached.
pub fn run_native(
    seed: u64,
    opts: Options,
    state: fn() -> SimState,
    workload: native::NativeWorkload,
) -> Result<(Report, native::NativeCounts), String> {
    let mut c = Cluster::new(seed, opts, state, workload);
    let report = c.run().map_err(|e| format!("seed {seed} (native): {e}"))?;
    Ok((report, c.workload.counts))
}

/// Liveness mode ([`Options::liveness`], `live.rs`) over holdfast's cluster state: seed's
/// faults without membership changes, pauses in 70% of the seeds.
pub fn run_live_seed(seed: u64) -> Result<Report, String> {
    run_live(seed, live_options(seed))
}

/// The liveness mode's options for `seed`.
pub fn live_options(seed: u64) -> Options {
    // Membership changes in about a third of the seeds (drawn as the other modes draw them).
    let membership = Rng::new(seed ^ 0x6c69_7665_6d65_6d62).chance(LIVE_MEMBERSHIP_PERCENT);
    let mut opts = Options::drawn(seed, membership);
    opts.liveness = true;
    opts.pauses = Rng::new(seed ^ 0x7061_7573_6573).chance(70);
    opts.send_cuts = Rng::new(seed ^ 0x7365_6e64_6375_7473).chance(SEND_CUTS_PERCENT);
    opts
}

/// [`run_live_seed`] with other options.
pub fn run_live(seed: u64, opts: Options) -> Result<Report, String> {
    let mut c = Cluster::new(
        seed,
        opts,
        SimState::live,
        holdfast::LockWorkload::default(),
    );
    c.run()
        .map_err(|e| format!("seed {} (liveness mode): {}", seed, e))
}

/// holdfast's `Replayer` as the replicated state machine, with lockd ACQ/TRY/REL clients.
pub mod holdfast {
    use std::collections::BTreeMap;

    use super::Workload;
    use crate::config::{self, Command, Config};
    use crate::core::codec::{self, Reader};
    use crate::proto::lockd::op;
    use crate::rng::Rng;
    use crate::server::command::{self, Limits};
    use crate::server::effect::tag;
    use crate::server::msg::ConnId;
    use crate::server::msg::{Arena, Batch, LockdOp, Op, OpMsg};
    use crate::server::sim::Replayer;
    use crate::server::Replicated;

    /// Lock names clients fight over: few, so that they collide.
    const NAMES: u64 = 3;

    fn config() -> Config {
        match config::parse(["--orphan-timeout", "2000"]) {
            Ok(Command::Run(c)) => c,
            _ => unreachable!("fixed flags parse"),
        }
    }

    /// The replayer plus the log's clock: a command's time never runs backwards, even when a new
    /// leader's clock is behind the old one's (the command is re-stamped on every replica alike).
    pub struct HoldfastMachine {
        replayer: Replayer,
        last_ms: u64,
        batch: Batch,
        buf: Vec<u8>,
    }

    impl HoldfastMachine {
        pub fn new() -> HoldfastMachine {
            HoldfastMachine {
                replayer: Replayer::new(config()),
                last_ms: 0,
                batch: Batch::default(),
                buf: Vec::new(),
            }
        }

        pub fn locks_held(&self) -> u64 {
            self.replayer.locks_held()
        }
    }

    impl Default for HoldfastMachine {
        fn default() -> Self {
            HoldfastMachine::new()
        }
    }

    impl HoldfastMachine {
        /// Apply one committed command; returns its effects (replies, grants) as bytes.
        pub fn apply(&mut self, cmd: &[u8]) -> Vec<u8> {
            let Ok(now) = command::decode_entry(cmd, Limits::default(), &mut self.batch) else {
                // Refused alike on every replica.
                return b"bad command".to_vec();
            };
            // Every replica reports the same connection counters: none.
            crate::server::Live::default().stamp(&mut self.batch);
            self.last_ms = self.last_ms.max(now);
            self.buf.clear();
            command::encode_entry(
                self.last_ms,
                &self.batch.ops,
                &self.batch.arena.bytes,
                &mut self.buf,
            );
            self.replayer
                .apply(&self.buf)
                .unwrap_or_else(|_| b"bad command".to_vec())
        }

        /// The whole state as canonical bytes.
        pub fn snapshot(&self) -> Vec<u8> {
            let mut out = Vec::new();
            codec::put_u64(&mut out, self.last_ms);
            out.extend_from_slice(&self.replayer.snapshot());
            out
        }

        /// Replace the state by one restored from `bytes` (hostile: an error, no panic).
        pub fn restore(&mut self, bytes: &[u8]) -> Result<(), String> {
            let mut r = Reader::new(bytes);
            let last_ms = r.u64().map_err(|e| format!("{:?}", e))?;
            let rest = &bytes[bytes.len() - r.remaining()..];
            self.replayer
                .restore(rest)
                .map_err(|e| format!("{:?}", e))?;
            self.last_ms = last_ms;
            Ok(())
        }
    }

    /// Client `client`'s connection: on cluster node `client` (each client stands for a node
    /// of its own in [`ReplicatedMachine`]'s proposals).
    fn conn(client: u64) -> ConnId {
        ConnId::on_node(client as u16, 0, client as u32, 1)
    }

    /// holdfast's cluster state itself (`server::owner::cluster::Replicated`, what a `--peers`
    /// node applies) as the replicated machine: each client's command becomes a proposal of
    /// node `client` (run 1, number `seq`), applied with its own exactly-once table, new-run
    /// and clock rules; the effects are every session's, in canonical form.
    pub struct ReplicatedMachine {
        state: Replicated,
        buf: Vec<u8>,
    }

    impl ReplicatedMachine {
        pub fn new() -> ReplicatedMachine {
            ReplicatedMachine::with_config(config())
        }

        /// The liveness mode's machine: a lockd lock whose session ends is free at once (no
        /// orphan window), so the next holder's grant comes as early as the expiry allows.
        pub fn without_orphan_windows() -> ReplicatedMachine {
            ReplicatedMachine::with_config(ReplicatedMachine::live_config())
        }

        /// The liveness mode's machine of node `me`'s run `incarnation`, over the process
        /// state `shared` (its clocks' origin and write deadline): what the owner's loop drives.
        pub fn for_node(
            shared: std::sync::Arc<crate::server::Shared>,
            me: u64,
            incarnation: u64,
        ) -> ReplicatedMachine {
            ReplicatedMachine {
                state: Replicated::new(shared, 1, me, incarnation),
                buf: Vec::new(),
            }
        }

        /// The liveness mode's configuration (see [`Self::without_orphan_windows`]).
        pub fn live_config() -> Config {
            match config::parse(["--orphan-timeout", "0"]) {
                Ok(Command::Run(c)) => c,
                _ => unreachable!("fixed flags parse"),
            }
        }

        pub fn replicated(&self) -> &Replicated {
            &self.state
        }

        pub fn replicated_mut(&mut self) -> &mut Replicated {
            &mut self.state
        }

        fn with_config(config: Config) -> ReplicatedMachine {
            let shared = std::sync::Arc::new(crate::server::sim::sim_shared(config));
            ReplicatedMachine {
                state: Replicated::new(shared, 1, 0, 1),
                buf: Vec::new(),
            }
        }
    }

    impl Default for ReplicatedMachine {
        fn default() -> Self {
            ReplicatedMachine::new()
        }
    }

    impl ReplicatedMachine {
        /// Client `client`'s request number `seq`, applied as node `client`'s proposal.
        pub fn apply_from(&mut self, client: u64, seq: u64, command: &[u8]) -> Vec<u8> {
            self.buf.clear();
            Replicated::encode_commands(client, 1, seq, command, &mut self.buf);
            let mut effects = Vec::new();
            self.state.apply_canonical(&self.buf, &mut effects);
            effects
        }

        pub fn snapshot(&self) -> Vec<u8> {
            crate::cluster::node::Machine::snapshot(&self.state)
        }

        pub fn restore(&mut self, bytes: &[u8]) -> Result<(), String> {
            crate::cluster::node::Machine::restore(&mut self.state, bytes)
        }

        /// A committed membership change, as the daemon's node hands it to the state.
        pub fn apply_conf_change(
            &mut self,
            index: u64,
            context: &[u8],
            before: &raft::prelude::ConfState,
            after: &raft::prelude::ConfState,
        ) {
            crate::cluster::node::Machine::apply_conf_change(
                &mut self.state,
                index,
                context,
                before,
                after,
            );
        }

        /// The ids its book says were removed.
        pub fn removed(&self) -> Vec<u64> {
            crate::cluster::node::Machine::membership(&self.state)
                .removed
                .into_iter()
                .collect()
        }

        /// A cluster proposal as it is (the state's own exactly-once rules apply), its
        /// effects routed to this node's connections as the daemon's node routes them.
        pub fn apply_proposal(&mut self, proposal: &[u8]) -> Vec<u8> {
            let mut effects = Vec::new();
            self.state.apply_recorded(proposal, &mut effects);
            effects
        }

        pub fn has_sessions_of(&self, node: u64) -> bool {
            u16::try_from(node).is_ok_and(|n| self.state.has_sessions_of(n))
        }

        pub fn conns_of_node(&self, node: u64) -> Vec<ConnId> {
            match u16::try_from(node) {
                Ok(n) => self.state.tables.sessions.conns_of_node(n),
                Err(_) => Vec::new(),
            }
        }

        pub fn run_of(&self, node: u64) -> Option<(u64, u64)> {
            self.state.run_of(node)
        }

        pub fn token_of(&self, conn: ConnId, name: &[u8]) -> Option<u64> {
            let session = self.state.tables.sessions.find(conn)?;
            self.state.tables.lockd.token_of(session, name)
        }
    }

    /// The next effect of an entry's effects in canonical form (`server::effect`): session,
    /// the connection it routes to, completions, close, then its body. Returns the
    /// connection, the close and the body.
    pub fn next_effect<'a>(r: &mut Reader<'a>) -> Result<(Option<ConnId>, bool, &'a [u8]), String> {
        let e = next_effect_of_session(r)?;
        Ok((e.to, e.close, e.body))
    }

    /// One effect in canonical form, with the session it is for.
    pub struct SessionEffect<'a> {
        pub session: u64,
        /// The connection it routes to: none for a session whose connection closed in the
        /// same turn, after the effect was made.
        pub to: Option<ConnId>,
        pub close: bool,
        pub body: &'a [u8],
    }

    /// [`next_effect`] with the session it is for.
    pub fn next_effect_of_session<'a>(r: &mut Reader<'a>) -> Result<SessionEffect<'a>, String> {
        let err = |e| format!("effects: {:?}", e);
        let session = r.u64().map_err(err)?;
        let to = match r.bool().map_err(err)? {
            true => Some(ConnId::decode(r).map_err(err)?),
            false => None,
        };
        let _done = r.u64().map_err(err)?;
        let close = r.bool().map_err(err)?;
        let body = r.bytes(usize::MAX).map_err(err)?;
        Ok(SessionEffect {
            session,
            to,
            close,
            body,
        })
    }

    fn name(i: u64) -> Vec<u8> {
        format!("lock-{}\0", i).into_bytes()
    }

    /// Clients acquiring, trying and releasing a few lockd names; the check keeps who holds
    /// each name from the ACQUIRED and RELEASED replies in the applied log (never two
    /// holders), and who waits for it from the ACK replies (a queued ACQ is granted in the
    /// order it was queued: FIFO).
    #[derive(Default)]
    pub struct LockWorkload {
        holder: BTreeMap<Vec<u8>, u64>,
        waiting: BTreeMap<Vec<u8>, std::collections::VecDeque<u64>>,
        pub grants: u64,
    }

    impl Workload for LockWorkload {
        fn request(&mut self, client: u64, rng: &mut Rng) -> Vec<u8> {
            let held: Vec<&Vec<u8>> = self
                .holder
                .iter()
                .filter(|(_, &c)| c == client)
                .map(|(n, _)| n)
                .collect();
            let mut req = Vec::new();
            if !held.is_empty() && rng.chance(70) {
                req.push(op::REL);
                req.extend_from_slice(held[rng.index(held.len())]);
            } else {
                req.push(match rng.below(10) {
                    0 => op::REL,
                    1 | 2 => op::TRY,
                    _ => op::ACQ,
                });
                req.extend_from_slice(&name(rng.below(NAMES)));
            }
            req
        }

        fn command(&self, client: u64, request: &[u8], now_ms: u64) -> Vec<u8> {
            let mut arena = Arena::default();
            let payload = arena.push(&request[1..]);
            let ops = [OpMsg {
                conn: conn(client),
                op: Op::Lockd(LockdOp::new(request[0], payload, &request[1..])),
            }];
            let mut out = Vec::new();
            command::encode_entry(now_ms, &ops, &arena.bytes, &mut out);
            out
        }

        fn check(&mut self, _client: u64, _command: &[u8], effects: &[u8]) -> Result<(), String> {
            // Each effect (`server::effect`, canonical form): session, the connection it
            // routes to, completions, close, then its body; lockd frames are
            // `LOCKD_FRAME opcode payload`.
            let mut r = Reader::new(effects);
            while r.remaining() > 0 {
                let (to, _close, body) = next_effect(&mut r)?;
                let (Some(to), [tag::LOCKD_FRAME, opcode, payload @ ..]) = (to, body) else {
                    continue;
                };
                let who = u64::from(to.slot);
                match *opcode {
                    op::ACQUIRED => {
                        if let Some(other) = self.holder.get(payload) {
                            return Err(format!(
                                "{} granted to client {} while client {} holds it",
                                String::from_utf8_lossy(payload),
                                who,
                                other
                            ));
                        }
                        // A name with waiters goes to the one that waited longest (a free name
                        // has none: a release hands it to the first waiter at once).
                        if let Some(q) = self.waiting.get_mut(payload) {
                            match q.pop_front() {
                                Some(first) if first != who => {
                                    return Err(format!(
                                        "{} granted to client {} while client {} waited longer",
                                        String::from_utf8_lossy(payload),
                                        who,
                                        first
                                    ))
                                }
                                _ => {}
                            }
                        }
                        self.holder.insert(payload.to_vec(), who);
                        self.grants += 1;
                    }
                    op::ACK => {
                        self.waiting
                            .entry(payload.to_vec())
                            .or_default()
                            .push_back(who);
                    }
                    op::RELEASED if self.holder.remove(payload).is_none() => {
                        return Err(format!(
                            "{} released but held by nobody",
                            String::from_utf8_lossy(payload)
                        ));
                    }
                    _ => {}
                }
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests;
