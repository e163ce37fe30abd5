//! A deterministic simulator of a raft cluster: 3 or 5 raft-rs `RawNode`s in one thread, their
//! disks, their network and their clocks, all driven from one seed (after tigerbeetle's VOPR
//! and FoundationDB's simulation testing).
//!
//! Owns: the simulated world (an event queue in simulated microseconds), the driving loop that
//! a real node will run (ready → send → apply → persist → sync → send persisted → advance),
//! and the invariant checks. It must not read a clock, a socket or a file: everything comes
//! from the seed, so a failing seed replays exactly.
//!
//! - **Disks** ([`MemLog`]): the node's raft storage in memory; a crash keeps only what the
//!   last sync made durable. A node may crash between persisting a `Ready` and syncing it.
//! - **Network**: seeded loss, delay (hence reordering) and duplication; symmetric and one-way
//!   partitions.
//! - **Snapshots** (`sim_snap.rs`), as the daemon makes, sends and installs them: *made in the
//!   background* when due (every [`Options::snapshot_every`] entries in some seeds; in all, in
//!   proportion: log bytes applied since the last one >= max([`Options::snapshot_floor_bytes`],
//!   the last snapshot's size); or on raft's demand), the state captured at the applied index
//!   and recorded (then the log compacted, keeping a few entries) a seeded 1-300 ms later while
//!   the node goes on; a crash meanwhile loses it; one at a time. *Sent in chunks*: a
//!   `MsgSnapshot` carries the file's descriptor (length, crc32c) and the file travels beside
//!   it in chunks through the lossy network, on numbered connections with acknowledged
//!   offsets; seeded connection resets and the transport's stall timeout reconnect, resuming
//!   from the acknowledged offset or (other seeds) restarting from 0; chunks are sometimes
//!   damaged; the receiver's raft sees the `MsgSnapshot` only once the whole file arrived and
//!   checks out; the sender's raft hears `Finish` when the receiver acknowledged it all and
//!   `Failure` when the transfer failed (receiver down or refusing, file damaged, too many
//!   reconnects). *Installed in the background*: a follower persists a leader's snapshot at
//!   once and rebuilds its state from it a seeded while later, holding the committed entries
//!   handed out meanwhile (raft is told only the snapshot's index is applied) and applying
//!   them after, in order; it ticks and steps meanwhile; a crash restarts it from disk.
//! - **Clocks**: each node ticks at its own rate (±5%) and reads its own offset wall clock; the
//!   leader stamps each command with its clock, so log time is the leader's.
//! - **Membership** (seeds with [`Options::membership`]): an operator adds a fresh node (ids
//!   10, 11, …, empty disk, empty `ConfState`), removes a voter, or replaces one by a fresh node,
//!   one change in flight, 3 to 5 voters, always through joint consensus (`ConfChangeV2`,
//!   `Implicit`: raft-rs's leader leaves the joint configuration by itself; the operator
//!   proposes the empty leave-joint entry when no leader did, and always in the seeds that use
//!   `Explicit`). Each node applies committed conf entries with `RawNode::apply_conf_change`
//!   and keeps the `ConfState` in its [`MemLog`]; a node stops once it applied its own
//!   removal; a node's transport refuses traffic from the nodes it saw removed.
//! - **Clients** propose `(client, seq, request)` through any node; a follower forwards to the
//!   leader it knows, and nothing tells a client that a proposal was dropped: it retries the
//!   same `(client, seq)` until it sees it applied. [`Deduped`] (replicated, in the snapshot)
//!   applies each `(client, seq)` once.
//!
//! Checked after every applied entry, on every node: the entry at each index is the same
//! everywhere (log matching on what was applied), its effects are the same, the state
//! machine's snapshot at each applied index is byte-identical (also right after a restore),
//! each client's requests apply once and in order, and the workload's own check (for locks:
//! never two holders), every node that applied a conf entry got the same `ConfState` from it (a
//! snapshot carries the `ConfState` of its index), a removed node never becomes leader once a
//! majority of the new configuration applied its removal, and no leader is outside its own
//! configuration. Of snapshots: no entry is applied while an install is in progress, a
//! background snapshot's bytes are the state every node had at its index, an assembled file is
//! byte for byte that state, and no log is compacted past its newest snapshot. At the end of
//! the run the faults stop and every member of the final configuration (no longer joint) must
//! converge and every client's request must have been applied (liveness); removed nodes are
//! ignored.

use std::cell::Cell;
use std::cmp::Ordering as CmpOrdering;
use std::collections::{BTreeMap, BinaryHeap};

use protobuf::Message as _;
use raft::prelude::{
    ConfChange, ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, ConfState,
    Entry, EntryType, Message, MessageType, Snapshot, SnapshotMetadata,
};
use raft::{Config, RawNode, SnapshotStatus, StateRole, Storage, StorageError};

use super::storage::{log_state_reads, LogState};
use crate::rng::Rng;
use crate::server::msg::ConnId;

#[path = "sim_live.rs"]
mod live;
#[path = "sim_snap.rs"]
mod snap;
pub use live::{ELECTION_US, SESSION_TIMEOUT_US};

/// A replicated state machine: deterministic, fed committed commands in log order.
pub trait StateMachine {
    /// Apply one committed command; returns its effects (replies, grants) as bytes.
    fn apply(&mut self, command: &[u8]) -> Vec<u8>;
    /// [`StateMachine::apply`] of client `client`'s request number `seq` (a machine that keeps
    /// its own exactly-once table, as holdfast's cluster state does, needs them).
    fn apply_from(&mut self, client: u64, seq: u64, command: &[u8]) -> Vec<u8> {
        let _ = (client, seq);
        self.apply(command)
    }
    /// The whole state as canonical bytes.
    fn snapshot(&self) -> Vec<u8>;
    /// Replace the state by one restored from `snapshot` (hostile input: an error, no panic).
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String>;
    /// Liveness mode ([`Options::liveness`]): apply a cluster proposal as it is (the machine's
    /// own exactly-once rules apply).
    fn apply_proposal(&mut self, proposal: &[u8]) -> Vec<u8> {
        self.apply(proposal)
    }
    /// Liveness mode: whether any session of cluster node `node` is live.
    fn has_sessions_of(&self, _node: u64) -> bool {
        false
    }
    /// Liveness mode: the connections of `node`'s sessions.
    fn conns_of_node(&self, _node: u64) -> Vec<ConnId> {
        Vec::new()
    }
    /// Liveness mode: `node`'s latest run applied and its last sequence number applied.
    fn run_of(&self, _node: u64) -> Option<(u64, u64)> {
        None
    }
    /// Liveness mode: the fencing token of lockd lock `name` if `conn`'s session holds it.
    fn token_of(&self, _conn: ConnId, _name: &[u8]) -> Option<u64> {
        None
    }
}

/// What clients do against a [`StateMachine`], and what must hold of its effects.
pub trait Workload {
    /// The next request of `client`, chosen from what the applied log has shown so far.
    fn request(&mut self, client: u64, rng: &mut Rng) -> Vec<u8>;
    /// The command the leader proposes for `request`, stamped with the leader's clock.
    fn command(&self, client: u64, request: &[u8], now_ms: u64) -> Vec<u8>;
    /// Called once per applied command, in log order, with its effects.
    fn check(&mut self, client: u64, command: &[u8], effects: &[u8]) -> Result<(), String>;
}

/// Exactly-once application of client commands: the replicated `(client → last seq)` table in
/// front of a state machine. A proposal is `client(u64 LE) seq(u64 LE) command`.
pub struct Deduped<M> {
    pub inner: M,
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

impl<M: StateMachine> Deduped<M> {
    pub fn new(inner: M) -> Deduped<M> {
        Deduped {
            inner,
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

/// Raft storage in memory, cloned whole to model what a sync made durable.
#[derive(Clone, Default)]
pub struct MemLog {
    state: LogState,
    snapshot_data: Vec<u8>,
    /// Raft asked for a snapshot the stored one cannot serve (older than asked, or made before
    /// the receiver joined: raft-rs's receiver refuses a snapshot whose `ConfState` lacks it);
    /// the driver starts a fresh one in the background, as TiKV generates them on demand.
    snapshot_wanted: Cell<bool>,
}

impl MemLog {
    fn new(voters: Vec<u64>) -> MemLog {
        let mut m = MemLog::default();
        m.state.conf_state = ConfState::from((voters, vec![]));
        m
    }

    /// A founder's disk that starts with a snapshot at index 1 (`machine`: the empty state
    /// machine's) instead of an empty log, as TiKV bootstraps at index 5: a leader's log then
    /// never starts at index 1, so a node that joins always starts from a snapshot carrying
    /// the `ConfState`. Replaying the log from index 1 would apply the first conf change on top
    /// of the joiner's empty `ConfState` and give it a configuration nobody else has.
    fn bootstrapped(voters: Vec<u64>, machine: Vec<u8>) -> MemLog {
        let mut m = MemLog::default();
        let mut meta = SnapshotMetadata {
            index: 1,
            term: 1,
            ..Default::default()
        };
        meta.set_conf_state(ConfState::from((voters, vec![])));
        m.state.install(&meta);
        m.snapshot_data = machine;
        m
    }

    fn append(&mut self, ents: &[Entry]) -> Result<(), String> {
        for e in ents {
            self.state.push(e.clone())?;
        }
        Ok(())
    }

    fn apply_snapshot(&mut self, snap: &Snapshot) {
        self.state.install(snap.get_metadata());
        self.snapshot_data = snap.get_data().to_vec();
    }

    fn compact(&mut self, compact_index: u64) -> Result<(), String> {
        let Some(index) = compact_index.checked_sub(1) else {
            return Ok(());
        };
        match self.state.term(index) {
            Some(term) if index > self.state.base_index() => self.state.compact(index, term),
            _ => Ok(()),
        }
    }
}

impl Storage for MemLog {
    log_state_reads!();

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        match &self.state.snapshot {
            Some(meta) if meta.index >= request_index && is_member(meta.get_conf_state(), to) => {
                let mut s = Snapshot::default();
                s.set_metadata(meta.clone());
                s.set_data(self.snapshot_data.clone().into());
                Ok(s)
            }
            _ => {
                self.snapshot_wanted.set(true);
                Err(raft::Error::Store(
                    StorageError::SnapshotTemporarilyUnavailable,
                ))
            }
        }
    }
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
    /// Liveness mode (`sim_live.rs`): nodes run the daemon's liveness decisions and propose
    /// real cluster proposals; lockd clients on the nodes; the client-view checks.
    pub liveness: bool,
    /// Liveness mode: nodes are paused (not driven, their timers and messages held).
    pub pauses: bool,
    /// Mutations that the client-view checks must catch: a node fences a session timeout
    /// plus an election timeout after its last contact (after the majority expired it), and a
    /// node that writes replies past its write deadline.
    pub bug_late_fence: bool,
    pub bug_ignore_write_deadline: bool,
    /// A mutation: a new leader expires nodes a session timeout after it last heard from
    /// them, without waiting a session timeout from its own election.
    pub bug_leader_does_not_wait: bool,
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
            bug_late_fence: false,
            bug_ignore_write_deadline: false,
            bug_leader_does_not_wait: false,
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
    pub fences: u64,
    pub expiries: u64,
    pub deadline_closes: u64,
    pub client_give_ups: u64,
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
const ELECTION_TICKS: usize = 10;
/// A client re-proposes after this long without seeing its request applied.
const RETRY_US: u64 = 300_000;
/// Log entries kept behind a snapshot for followers slightly behind.
const KEEP_ENTRIES: u64 = 5;
/// Simulated Unix time at start (ms), so commands carry realistic timestamps.
const EPOCH_MS: u64 = 1_700_000_000_000;
/// Share of seeds with membership changes: half, so the long runs cover both kinds alike.
const MEMBERSHIP_PERCENT: u64 = 50;
/// Share of those whose changes leave the joint configuration explicitly (the contract's
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
/// Voters a configuration keeps (the contract's 3 or 5, and the 4 in between).
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

struct Node<M> {
    id: u64,
    raw: Option<RawNode<MemLog>>,
    durable: MemLog,
    machine: Deduped<M>,
    applied: u64,
    last_snapshot: u64,
    /// Clock rate in per mille of real time, and wall-clock offset.
    rate: u64,
    offset_ms: u64,
    /// Role and term when last driven: a change means raft redrew its election timeout.
    seen: Option<(StateRole, u64)>,
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
    /// Applied a configuration without itself: stopped for good. raft-rs 0.7 cannot keep a
    /// removed leader running (the next acknowledgement panics: its own progress is gone), so
    /// a node stops as soon as it applies its own removal, as TiKV destroys a removed peer.
    retired: bool,
    /// The node's asynchronous log sync, as the daemon's (`cluster::node`): this run of the
    /// process (a sync of an earlier run is lost with it), the last `Ready` handed to the
    /// sync, the last one durable, what each sync in flight will make durable, and the
    /// messages each `Ready` promised, held until the `Ready` they need is durable.
    life: u64,
    requested: u64,
    synced: u64,
    syncing: std::collections::VecDeque<(u64, MemLog)>,
    promised: std::collections::VecDeque<(u64, Vec<Message>)>,
    /// Background snapshots, installs and chunked transfers (`sim_snap.rs`).
    bg: snap::NodeSnap,
}

impl<M> Node<M> {
    /// The node's configuration went from `before` to `after`: who left is refused from now on.
    fn note_removed(&mut self, before: &ConfState, after: &ConfState) {
        for id in members(before) {
            if !is_member(after, id) && !self.refuses.contains(&id) {
                self.refuses.push(id);
            }
        }
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

/// One simulated cluster.
pub struct Cluster<M, W> {
    opts: Options,
    rng: Rng,
    now: u64,
    next_seq: u64,
    queue: BinaryHeap<Queued>,
    nodes: Vec<Node<M>>,
    new_machine: Box<dyn Fn() -> M>,
    workload: W,
    clients: Vec<Client>,
    /// blocked[a][b]: packets from a to b are lost.
    blocked: Vec<Vec<bool>>,
    /// The applied log: per index, the entry's term and data and its effects.
    log: BTreeMap<u64, (u64, Vec<u8>, Vec<u8>)>,
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
    logger: slog::Logger,
    pub report: Report,
    /// Liveness mode's world ([`Options::liveness`]).
    live: Option<live::LiveWorld>,
}

fn raft_config(id: u64, applied: u64) -> Config {
    Config {
        id,
        election_tick: ELECTION_TICKS,
        heartbeat_tick: 1,
        // raft-rs 0.7 draws the randomized timeout from `thread_rng` whenever it changes role or
        // term; the simulator overwrites it from its seed right after (see `drive`).
        min_election_tick: ELECTION_TICKS,
        max_election_tick: 2 * ELECTION_TICKS,
        applied,
        pre_vote: true,
        check_quorum: true,
        max_size_per_msg: 1 << 20,
        max_inflight_msgs: 64,
        ..Default::default()
    }
}

impl<M: StateMachine, W: Workload> Cluster<M, W> {
    pub fn new(
        seed: u64,
        opts: Options,
        new_machine: Box<dyn Fn() -> M>,
        workload: W,
    ) -> Cluster<M, W> {
        let mut rng = Rng::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5eed);
        let voters: Vec<u64> = (1..=opts.nodes as u64).collect();
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let mut nodes = Vec::new();
        let initial_conf = canonical(ConfState::from((voters.clone(), vec![])));
        for i in 0..opts.nodes {
            let durable = if opts.bootstrap_snapshot {
                MemLog::bootstrapped(voters.clone(), Deduped::new(new_machine()).snapshot())
            } else {
                MemLog::new(voters.clone())
            };
            nodes.push(Node {
                id: i as u64 + 1,
                raw: None,
                durable,
                machine: Deduped::new(new_machine()),
                applied: 0,
                last_snapshot: 0,
                rate: 950 + rng.below(101),
                offset_ms: rng.below(2_000),
                seen: None,
                initial_conf: initial_conf.clone(),
                refuses: Vec::new(),
                joiner: false,
                retired: false,
                life: 0,
                requested: 0,
                synced: 0,
                syncing: Default::default(),
                promised: Default::default(),
                bg: Default::default(),
            });
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
            rng,
            now: 0,
            next_seq: 0,
            queue: BinaryHeap::new(),
            nodes,
            new_machine,
            workload,
            clients,
            blocked: vec![vec![false; n]; n],
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
            logger,
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

    /// (Re)starts node `i` from what its disk holds.
    fn start_node(&mut self, i: usize) -> Option<String> {
        let node = &mut self.nodes[i];
        node.machine = Deduped::new((self.new_machine)());
        node.applied = 0;
        // Raft must start from the configuration at the index it is told is applied: the conf
        // entries after it are applied again (re-applying one on a configuration that already
        // holds it fails: "config is already joint").
        node.durable.state.conf_state = node.initial_conf.clone();
        if let Some(meta) = node.durable.state.snapshot.clone() {
            if let Err(e) = node.machine.restore(&node.durable.snapshot_data) {
                return Some(format!("node {} restart: restore failed: {}", node.id, e));
            }
            node.applied = meta.index;
            node.durable.state.conf_state = meta.get_conf_state().clone();
        }
        node.last_snapshot = node.applied;
        let cfg = raft_config(node.id, node.applied);
        match RawNode::new(&cfg, node.durable.clone(), &self.logger) {
            Ok(raw) => node.raw = Some(raw),
            Err(e) => return Some(format!("node {} restart: {}", node.id, e)),
        }
        node.seen = None;
        node.life += 1;
        node.requested = 0;
        node.synced = 0;
        node.syncing.clear();
        node.promised.clear();
        let (idx, snap) = (node.applied, node.machine.snapshot());
        self.snap_start(i);
        if self.live.is_some() {
            self.live_start(i);
        }
        if idx > 0 {
            return self.check_snapshot(i, idx, snap).err();
        }
        None
    }

    fn crash(&mut self, i: usize) {
        self.nodes[i].raw = None;
        self.forget_syncs(i);
        self.snap_crash(i);
        if self.live.is_some() {
            self.live_crash(i);
        }
        self.report.crashes += 1;
        let after = 100_000 + self.rng.below(2_000_000);
        self.push(after, Ev::Restart(i));
    }

    /// Runs to the end; `Err` names the first broken invariant.
    pub fn run(&mut self) -> Result<Report, String> {
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
        for i in 0..self.nodes.len() {
            if self.nodes[i].raw.is_none() && !self.nodes[i].retired {
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
                if let Some(raw) = self.nodes[i].raw.as_mut() {
                    raw.tick();
                }
                let jitter = self.rng.below(TICK_US / 20);
                let every = TICK_US * 1000 / self.nodes[i].rate + jitter;
                self.push(every, Ev::Tick(i));
                if self.live.is_some() {
                    self.live_round(i)?;
                } else {
                    self.drive(i)?;
                }
            }
            Ev::Deliver { from, to, packet } => {
                // The receiver's transport refuses a sender it saw removed.
                let refused = self.nodes[to].refuses.contains(&self.nodes[from].id);
                if refused && self.nodes[to].raw.is_some() {
                    self.report.refused_from_removed += 1;
                }
                if self.nodes[to].raw.is_none() || refused {
                    // A transport learns that a snapshot did not arrive (its connection failed):
                    // the leader must hear it, or it waits for that snapshot forever.
                    if let Packet::Chunk(c) = &packet {
                        return self.transfer_refused(from, c.id());
                    }
                    return Ok(());
                }
                if self.live.is_some() && matches!(packet, Packet::Raft(_) | Packet::Forward { .. })
                {
                    self.live_heard(to, from)?;
                }
                match packet {
                    Packet::Raft(m) => {
                        if let Some(raw) = self.nodes[to].raw.as_mut() {
                            // Errors here are stale or foreign messages raft refuses; it stays up.
                            let _ = raw.step(m);
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
                if self.nodes[i].raw.is_none() && !self.nodes[i].retired {
                    if let Some(e) = self.start_node(i) {
                        return Err(e);
                    }
                    if self.live.is_some() {
                        self.live_round(i)?;
                    } else {
                        self.drive(i)?;
                    }
                }
            }
            Ev::Heal => {
                for row in &mut self.blocked {
                    row.iter_mut().for_each(|b| *b = false);
                }
            }
            Ev::Operator => {
                self.operator()?;
                self.push(OPERATOR_US, Ev::Operator);
            }
            Ev::Synced { i, life, number } => {
                let node = &mut self.nodes[i];
                if node.life != life || node.raw.is_none() || number <= node.synced {
                    return Ok(());
                }
                while node.syncing.front().is_some_and(|(n, _)| *n <= number) {
                    let (_, log) = node.syncing.pop_front().expect("checked");
                    node.durable = log;
                }
                self.durable_through(i, number);
                self.drive(i)?;
            }
            Ev::SnapshotMade { i, id } => self.snapshot_made(i, id)?,
            Ev::Installed { i, id } => self.installed(i, id)?,
            Ev::TransferCheck { i, id, conn } => self.transfer_check(i, id, conn)?,
        }
        Ok(())
    }

    /// A crash: the syncs in flight and the messages waiting for them are lost.
    fn forget_syncs(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        node.life += 1;
        node.syncing.clear();
        node.promised.clear();
    }

    /// Every `Ready` of node `i` through `number` is durable: tell raft, send what waited.
    fn durable_through(&mut self, i: usize, number: u64) {
        let node = &mut self.nodes[i];
        if number > node.synced {
            node.synced = number;
            // Not on a node that applied its own removal: raft-rs 0.7 looks up a leader's own
            // progress there, which the removal took away (it stops right after, see
            // `retired`).
            if let Some(raw) = node.raw.as_mut().filter(|_| !node.retired) {
                raw.on_persist_ready(number);
            }
        }
        let mut out = Vec::new();
        while node
            .promised
            .front()
            .is_some_and(|(n, _)| *n <= node.synced)
        {
            out.extend(node.promised.pop_front().expect("checked").1);
        }
        self.send_all(i, out);
    }

    fn fault(&mut self) -> Result<(), String> {
        let n = self.nodes.len();
        let kinds = if self.opts.membership || self.opts.pauses {
            6
        } else {
            4
        };
        match self.rng.below(kinds) {
            4 | 5 if self.opts.pauses => self.live_pause(),
            0 | 1 if self.opts.crashes => {
                let i = self.rng.index(n);
                if self.nodes[i].raw.is_some() {
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
            4 | 5 => return self.start_change(),
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
                        || c.index_of(**id).is_some_and(|i| c.nodes[i].raw.is_some())
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
        self.nodes.push(Node {
            id,
            raw: None,
            durable: MemLog::default(),
            machine: Deduped::new((self.new_machine)()),
            applied: 0,
            last_snapshot: 0,
            rate: 950 + self.rng.below(101),
            offset_ms: self.rng.below(2_000),
            seen: None,
            initial_conf: ConfState::default(),
            refuses: Vec::new(),
            joiner: true,
            retired: false,
            life: 0,
            requested: 0,
            synced: 0,
            syncing: Default::default(),
            promised: Default::default(),
            bg: Default::default(),
        });
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
                let raw = self.nodes[i].raw.as_ref()?;
                (raw.raft.state == StateRole::Leader).then_some((raw.raft.term, i))
            })
            .max();
        let Some((_, l)) = leader else {
            return Ok(());
        };
        let Some(raw) = self.nodes[l].raw.as_mut() else {
            return Ok(());
        };
        if raw.raft.has_pending_conf() {
            return Ok(());
        }
        let at_leader = canonical(raw.raft.prs().conf().to_conf_state());
        if is_joint(&at_leader) {
            // Refused (and counted for nothing) by a leader that is not a member any more.
            if raw
                .propose_conf_change(Vec::new(), ConfChangeV2::default())
                .is_ok()
            {
                self.report.leave_joint_proposed += 1;
            }
        } else if at_leader.voters != change.target {
            // Refused by a leader that is not a member any more; the next look retries.
            let _ = raw.propose_conf_change(Vec::new(), change.cc.clone());
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
            if self.nodes[home].raw.is_none() || !is_member(self.committed_conf(), id) {
                let voters = self.committed_conf().voters.clone();
                let id = voters[self.rng.index(voters.len())];
                if let Some(i) = self.index_of(id) {
                    self.clients[k as usize].home = i;
                }
            }
        } else if self.nodes[home].raw.is_none() {
            self.clients[k as usize].home = self.rng.index(self.nodes.len());
        }
        let (home, seq, request) = {
            let c = &self.clients[k as usize];
            (c.home, c.seq, c.request.clone())
        };
        if self.nodes[home].raw.is_some() {
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
        let Some(raw) = self.nodes[i].raw.as_mut() else {
            return;
        };
        if raw.raft.state == StateRole::Leader {
            let command = self.workload.command(client, request, now_ms);
            // A leader stepping down refuses; the client retries.
            let _ = raw.propose(Vec::new(), encode_proposal(client, seq, &command));
        } else if raw.raft.leader_id != 0 {
            let leader = raw.raft.leader_id;
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
        let delay = 50 + self.rng.below(self.opts.max_delay_us);
        self.push(delay, Ev::Deliver { from, to, packet });
    }

    /// The node's driving loop: handle every `Ready`.
    fn drive(&mut self, i: usize) -> Result<(), String> {
        loop {
            let Some(mut raw) = self.nodes[i].raw.take() else {
                return Ok(());
            };
            // Randomize the election timeout from the seed whenever raft reset it.
            let seen = Some((raw.raft.state, raw.raft.term));
            if seen != self.nodes[i].seen {
                self.nodes[i].seen = seen;
                let t = ELECTION_TICKS + self.rng.index(ELECTION_TICKS);
                raw.raft.set_randomized_election_timeout(t);
                if raw.raft.state == StateRole::Leader {
                    self.note_leader(&raw)?;
                }
            }
            if !raw.has_ready() {
                self.nodes[i].raw = Some(raw);
                if self.live.is_some() {
                    self.live_count(i);
                }
                return Ok(());
            }
            let mut rd = raw.ready();
            let msgs = rd.take_messages();
            self.send_all(i, msgs);
            for rs in rd.take_read_states() {
                self.live_read_state(i, &rs.request_ctx, rs.index);
            }
            let installed = !rd.snapshot().is_empty();
            if installed {
                let snap = rd.snapshot().clone();
                let before = raw.store().state.conf_state.clone();
                raw.mut_store().apply_snapshot(&snap);
                let meta = snap.get_metadata();
                let cs = canonical(meta.get_conf_state().clone());
                if cs != *self.conf_at(meta.index) {
                    return Err(format!(
                        "node {}: a snapshot at {} carries {:?}, the configuration there is {:?}",
                        self.nodes[i].id,
                        meta.index,
                        cs,
                        self.conf_at(meta.index)
                    ));
                }
                self.nodes[i].note_removed(&before, &cs);
                // Persisted now; the state machine is rebuilt in the background.
                self.begin_install(i, &snap);
            }
            let committed = rd.take_committed_entries();
            if self.nodes[i].bg.installing().is_some() {
                self.hold(i, committed);
            } else {
                self.apply_entries(i, &mut raw, committed)?;
            }
            raw.mut_store()
                .append(rd.entries())
                .map_err(|e| format!("node {}: append: {}", self.nodes[i].id, e))?;
            if let Some(hs) = rd.hs() {
                raw.mut_store().state.hard_state = hs.clone();
            }
            if self.opts.crash_before_sync_permille > 0
                && self.rng.below(1000) < self.opts.crash_before_sync_permille
            {
                // Persisted but not synced: lost with the process.
                self.report.crashes_before_sync += 1;
                self.crash(i);
                return Ok(());
            }
            // The daemon's asynchronous sync: the Ready's records are written now, a sync
            // thread makes them durable a little later (every Ready written meanwhile with
            // them), and what the Ready promised waits for that; raft goes on meanwhile.
            let number = rd.number();
            let must_sync = rd.must_sync();
            let promised = rd.take_persisted_messages();
            raw.advance_append_async(rd);
            let node = &mut self.nodes[i];
            let needs = if must_sync { number } else { node.requested };
            if !promised.is_empty() {
                node.promised.push_back((needs, promised));
            }
            self.nodes[i].raw = Some(raw);
            if installed {
                // Synced on the spot, as the daemon does.
                self.nodes[i].durable = self.nodes[i].raw.as_ref().expect("set").store().clone();
                self.nodes[i].syncing.clear();
                self.durable_through(i, number);
            } else if must_sync {
                self.nodes[i].requested = number;
                if self.opts.bug_ack_before_sync && self.rng.chance(50) {
                    // The broken driver: acknowledges what it has not synced.
                    self.durable_through(i, number);
                } else {
                    let log = self.nodes[i].raw.as_ref().expect("set").store().clone();
                    let life = self.nodes[i].life;
                    self.nodes[i].syncing.push_back((number, log));
                    let took = SYNC_MIN_US + self.rng.below(SYNC_SPREAD_US);
                    self.push(took, Ev::Synced { i, life, number });
                }
            }
            self.durable_through(i, self.nodes[i].synced);
            let mut raw = self.nodes[i].raw.take().expect("set");
            // During an install raft is told that only the snapshot is applied: the entries it
            // handed out since are held.
            match self.nodes[i].bg.installing() {
                Some(index) => raw.advance_apply_to(index),
                None => raw.advance_apply(),
            }
            if self.nodes[i].retired {
                // What this `Ready` promised is synced and sent; the node stops here.
                self.nodes[i].durable = raw.store().clone();
                self.nodes[i].syncing.clear();
                let through = self.nodes[i].requested;
                self.durable_through(i, through);
                return Ok(());
            }
            self.maybe_snapshot(i, &mut raw);
            self.nodes[i].raw = Some(raw);
        }
    }

    /// A node became leader: one per term, a voter of its own configuration, and not a node
    /// whose removal a majority of the new configuration applied (they refuse its traffic
    /// since, restarts included, so it cannot have had their votes).
    fn note_leader(&mut self, raw: &RawNode<MemLog>) -> Result<(), String> {
        let (id, term) = (raw.raft.id, raw.raft.term);
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

    fn apply_entries(
        &mut self,
        i: usize,
        raw: &mut RawNode<MemLog>,
        entries: Vec<Entry>,
    ) -> Result<(), String> {
        for e in entries {
            let node = &mut self.nodes[i];
            if e.index <= node.applied {
                continue;
            }
            if let Some(index) = node.bg.installing() {
                return Err(format!(
                    "node {} applies {} while its install of the snapshot at {} is in progress",
                    node.id, e.index, index
                ));
            }
            if e.index != node.applied + 1 {
                return Err(format!(
                    "node {} applies {} after {}",
                    node.id, e.index, node.applied
                ));
            }
            let closed = self.live_closed_by(i, e.get_data());
            if self.live.is_some() && !self.log.contains_key(&e.index) {
                self.live_first(i, e.index, e.get_data());
            }
            let node = &mut self.nodes[i];
            let effects = match e.get_entry_type() {
                // Liveness mode: the machine's own exactly-once rules, not the client table.
                EntryType::EntryNormal if !e.get_data().is_empty() && self.live.is_some() => {
                    Applied::Raw {
                        effects: node.machine.inner.apply_proposal(e.get_data()),
                    }
                }
                EntryType::EntryNormal if !e.get_data().is_empty() => {
                    node.machine.apply(e.get_data())
                }
                EntryType::EntryNormal => Applied::Ignored,
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => {
                    self.apply_conf_entry(i, raw, &e)?;
                    Applied::Ignored
                }
            };
            self.snap_count(i, e.get_data().len());
            let node = &mut self.nodes[i];
            node.applied = e.index;
            let snap = node.machine.snapshot();
            let effect_bytes = match &effects {
                Applied::Command { effects, .. } | Applied::Raw { effects } => effects.clone(),
                _ => Vec::new(),
            };
            let id = node.id;
            self.live_applied(i, &effect_bytes, closed)?;
            match self.log.get(&e.index) {
                Some((term, data, eff)) => {
                    if *term != e.term || data[..] != e.get_data()[..] {
                        return Err(format!(
                            "node {} applied a different entry at {}",
                            id, e.index
                        ));
                    }
                    if *eff != effect_bytes {
                        return Err(format!("node {}: different effects at {}", id, e.index));
                    }
                }
                None => {
                    self.log
                        .insert(e.index, (e.term, e.get_data().to_vec(), effect_bytes));
                    self.first_application(effects, e.get_data())?;
                }
            }
            self.report.applied = self.report.applied.max(e.index);
            self.check_snapshot(i, e.index, snap)?;
        }
        Ok(())
    }

    /// A committed conf entry: raft applies it (`apply_conf_change`), the node keeps the new
    /// `ConfState` in its storage (a snapshot made after it carries it) and as its transport's
    /// peers, and every node must get the same `ConfState` from the same entry.
    fn apply_conf_entry(
        &mut self,
        i: usize,
        raw: &mut RawNode<MemLog>,
        e: &Entry,
    ) -> Result<(), String> {
        let id = self.nodes[i].id;
        let bad = |what: String| format!("node {}: conf entry at {}: {}", id, e.index, what);
        let result = if e.get_entry_type() == EntryType::EntryConfChange {
            let cc = ConfChange::parse_from_bytes(e.get_data()).map_err(|x| bad(x.to_string()))?;
            raw.apply_conf_change(&cc)
        } else {
            let cc =
                ConfChangeV2::parse_from_bytes(e.get_data()).map_err(|x| bad(x.to_string()))?;
            raw.apply_conf_change(&cc)
        };
        let cs = canonical(result.map_err(|x| bad(format!("refused by raft: {}", x)))?);
        let before = std::mem::replace(&mut raw.mut_store().state.conf_state, cs.clone());
        self.nodes[i].note_removed(&before, &cs);
        if !is_member(&cs, id) {
            self.nodes[i].retired = true;
        }
        match self.confs.get(&e.index) {
            Some(other) if *other != cs => {
                Err(bad(format!("gave {:?}, another node got {:?}", cs, other)))
            }
            Some(_) => Ok(()),
            None => {
                for gone in members(self.conf_at(e.index)) {
                    if !is_member(&cs, gone) {
                        self.removed.insert(gone, e.index);
                    }
                }
                self.confs.insert(e.index, cs);
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
        let live: Vec<&Node<M>> = self
            .nodes
            .iter()
            .filter(|n| conf.voters.contains(&n.id))
            .collect();
        if live.len() != conf.voters.len() {
            return Err(format!("voters {:?} are not all nodes", conf.voters));
        }
        let applied: Vec<u64> = live.iter().map(|n| n.applied).collect();
        if applied.iter().any(|&a| a != applied[0]) {
            let mut why = String::new();
            for n in &live {
                if let Some(r) = &n.raw {
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
        let first = live[0].machine.snapshot();
        for n in &live[1..] {
            if n.machine.snapshot() != first {
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
        Box::new(holdfast::HoldfastMachine::new),
        holdfast::LockWorkload::default(),
    );
    c.run().map_err(|e| format!("seed {}: {}", seed, e))
}

/// [`run_holdfast_seed`] with holdfast's cluster state (`Replicated`) as the machine.
pub fn run_replicated_seed(seed: u64) -> Result<Report, String> {
    let mut c = Cluster::new(
        seed,
        Options::for_seed(seed),
        Box::new(holdfast::ReplicatedMachine::new),
        holdfast::LockWorkload::default(),
    );
    c.run()
        .map_err(|e| format!("seed {} (cluster state): {}", seed, e))
}

/// Liveness mode ([`Options::liveness`], `sim_live.rs`) over holdfast's cluster state: seed's
/// faults without membership changes, pauses in 70% of the seeds.
pub fn run_live_seed(seed: u64) -> Result<Report, String> {
    run_live(seed, live_options(seed))
}

/// The liveness mode's options for `seed`.
pub fn live_options(seed: u64) -> Options {
    let mut opts = Options::for_seed_without_membership(seed);
    opts.liveness = true;
    opts.pauses = Rng::new(seed ^ 0x7061_7573_6573).chance(70);
    opts
}

/// [`run_live_seed`] with other options.
pub fn run_live(seed: u64, opts: Options) -> Result<Report, String> {
    let mut c = Cluster::new(
        seed,
        opts,
        Box::new(holdfast::ReplicatedMachine::without_orphan_windows),
        holdfast::LockWorkload::default(),
    );
    c.run()
        .map_err(|e| format!("seed {} (liveness mode): {}", seed, e))
}

/// holdfast's `Replayer` as the replicated state machine, with lockd ACQ/TRY/REL clients.
pub mod holdfast {
    use std::collections::BTreeMap;

    use super::{StateMachine, Workload};
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

    impl StateMachine for HoldfastMachine {
        fn apply(&mut self, cmd: &[u8]) -> Vec<u8> {
            let Ok(now) = command::decode_entry(cmd, Limits::default(), &mut self.batch) else {
                // Refused alike on every replica.
                return b"bad command".to_vec();
            };
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

        fn snapshot(&self) -> Vec<u8> {
            let mut out = Vec::new();
            codec::put_u64(&mut out, self.last_ms);
            out.extend_from_slice(&self.replayer.snapshot());
            out
        }

        fn restore(&mut self, bytes: &[u8]) -> Result<(), String> {
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
            match config::parse(["--orphan-timeout", "0"]) {
                Ok(Command::Run(c)) => ReplicatedMachine::with_config(c),
                _ => unreachable!("fixed flags parse"),
            }
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

    impl StateMachine for ReplicatedMachine {
        fn apply(&mut self, command: &[u8]) -> Vec<u8> {
            self.apply_from(0, 0, command)
        }

        fn apply_from(&mut self, client: u64, seq: u64, command: &[u8]) -> Vec<u8> {
            self.buf.clear();
            Replicated::encode_commands(client, 1, seq, command, &mut self.buf);
            let mut effects = Vec::new();
            self.state.apply_canonical(&self.buf, &mut effects);
            effects
        }

        fn snapshot(&self) -> Vec<u8> {
            crate::cluster::node::Machine::snapshot(&self.state)
        }

        fn restore(&mut self, bytes: &[u8]) -> Result<(), String> {
            crate::cluster::node::Machine::restore(&mut self.state, bytes)
        }

        fn apply_proposal(&mut self, proposal: &[u8]) -> Vec<u8> {
            let mut effects = Vec::new();
            self.state.apply_canonical(proposal, &mut effects);
            effects
        }

        fn has_sessions_of(&self, node: u64) -> bool {
            u16::try_from(node).is_ok_and(|n| self.state.has_sessions_of(n))
        }

        fn conns_of_node(&self, node: u64) -> Vec<ConnId> {
            match u16::try_from(node) {
                Ok(n) => self.state.tables.sessions.conns_of_node(n),
                Err(_) => Vec::new(),
            }
        }

        fn run_of(&self, node: u64) -> Option<(u64, u64)> {
            self.state.run_of(node)
        }

        fn token_of(&self, conn: ConnId, name: &[u8]) -> Option<u64> {
            let session = self.state.tables.sessions.find(conn)?;
            self.state.tables.lockd.token_of(session, name)
        }
    }

    /// The next effect of an entry's effects in canonical form (`server::effect`): session,
    /// the connection it routes to, completions, close, then its body. Returns the
    /// connection, the close and the body.
    pub fn next_effect<'a>(r: &mut Reader<'a>) -> Result<(Option<ConnId>, bool, &'a [u8]), String> {
        let err = |e| format!("effects: {:?}", e);
        let _session = r.u64().map_err(err)?;
        let to = match r.bool().map_err(err)? {
            true => Some(ConnId::decode(r).map_err(err)?),
            false => None,
        };
        let _done = r.u64().map_err(err)?;
        let close = r.bool().map_err(err)?;
        let body = r.bytes(usize::MAX).map_err(err)?;
        Ok((to, close, body))
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
#[path = "sim_tests.rs"]
mod tests;
