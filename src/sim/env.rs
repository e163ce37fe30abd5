//! The simulator's side of the node's environment (`cluster::env`): what the daemon's node
//! runs over, in memory and driven by the seed, so that `sim/mod.rs` runs the daemon's own Raft
//! driver (`cluster::node::RaftNode`).
//!
//! - [`SimStore`]: the log in memory ([`MemLog`]); writing a `Ready` clones it (what a sync of
//!   that write makes durable); a sync on the spot makes it durable at once. Its fault hook
//!   ([`DiskFaults`]) crashes the node between writing a `Ready` and syncing it. Snapshots are
//!   captured when the node starts one and finish when the simulator says so; restores of a
//!   leader's snapshot run when the simulator says so.
//! - [`SimSyncer`]: sync requests the simulator completes a seeded while later; with the
//!   broken-sync mutation it answers some at once without making anything durable.
//! - [`SimLink`]: an outbox the simulator routes through its network.
//! - [`SimClock`]: the node's own skewed clock, set by the simulator before each call.
//! - [`SimMachine`]: the replicated machines behind `cluster::node::Machine`, recording what
//!   each application did for the simulator's checks.
//!
//! All of a node's pieces share its [`Io`]; the simulator reads and empties it after each
//! call into the node.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use raft::prelude::{ConfState, Entry, HardState, Message, Snapshot, SnapshotMetadata};
use raft::{Storage, StorageError};

use super::holdfast::ReplicatedMachine;
use super::{canonical, is_member, Applied, Deduped, SimState};
use crate::cluster::crc32c;
use crate::cluster::env::{Clock, LogStore, LogSyncer, PeerLink, Restore, Restored, Snapshotting};
use crate::cluster::node::Machine;
use crate::cluster::snapchild::Finished;
use crate::cluster::snapfile::Descriptor;
use crate::cluster::storage::{log_state_reads, LogState};
use crate::cluster::transport::PeerEvent;
use crate::rng::Rng;
use crate::server::msg::ConnId;
use crate::server::owner::cluster::OwnerState;
use crate::server::Replicated;

/// Raft storage in memory, cloned whole to model what a sync made durable.
#[derive(Clone, Default)]
pub struct MemLog {
    pub(super) state: LogState,
    pub(super) snapshot_data: Vec<u8>,
}

impl MemLog {
    pub(super) fn new(voters: Vec<u64>) -> MemLog {
        let mut m = MemLog::default();
        m.state.conf_state = ConfState::from((voters, vec![]));
        m
    }

    /// A founder's disk that starts with a snapshot at index 1 (`machine`: the empty state
    /// machine's) instead of an empty log, as the daemon's founders do: a leader's log then
    /// never starts at index 1, so a node that joins always starts from a snapshot carrying
    /// the `ConfState`. Replaying the log from index 1 would apply the first conf change on top
    /// of the joiner's empty `ConfState` and give it a configuration nobody else has.
    pub(super) fn bootstrapped(voters: Vec<u64>, machine: Vec<u8>) -> MemLog {
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
}

/// The disk's fault hooks (mutations and faults injected into the real driver's path).
#[derive(Clone, Copy, Default)]
pub struct DiskFaults {
    /// Per mille of written `Ready`s after which the node crashes before their sync.
    pub crash_before_sync_permille: u64,
    /// The broken sync: half of the requests are answered at once, nothing made durable, so
    /// that the driver sends a `Ready`'s votes and acknowledgements without what they promise.
    pub ack_before_sync: bool,
}

/// What a node's pieces share with the simulator; emptied by it after each call.
pub struct Io {
    /// The node's clock.
    pub now: Instant,
    /// What survives a crash: the log as the last sync made it durable, and the write it came
    /// from (a later write's copy is newer).
    pub durable: MemLog,
    pub durable_write: u64,
    /// Writes so far (numbering each copy a write makes).
    pub writes: u64,
    pub faults: DiskFaults,
    pub rng: Rng,
    /// The fault hook asked for a crash.
    pub crash: bool,
    pub outbox: Vec<Message>,
    /// Sync requests: `Ready` number, write number, the log as written.
    pub sync_requests: Vec<(u64, u64, MemLog)>,
    /// Answers for the driver's syncer.
    pub sync_done: VecDeque<Result<u64, String>>,
    /// Background snapshots running (job id: the state's bytes), those started since the
    /// simulator last looked (job id, metadata), those it says are written, and those the node
    /// dropped unfinished (superseded by a leader's snapshot, or lost in a crash).
    pub jobs: BTreeMap<u64, Vec<u8>>,
    pub jobs_new: Vec<(u64, SnapshotMetadata)>,
    pub jobs_finished: BTreeSet<u64>,
    pub jobs_dropped: u64,
    /// Finished snapshot files not adopted yet, by index.
    tmp: BTreeMap<u64, Vec<u8>>,
    /// Restores started (job id, where the result goes, the restore, the state's bytes, its
    /// index).
    pub restores_started: Vec<RestoreJob>,
    /// Leader's snapshots applied: the configuration before, and the snapshot's metadata.
    pub installed: Vec<(ConfState, SnapshotMetadata)>,
    /// Background snapshots adopted, and those a newer snapshot superseded.
    pub adopted: u64,
    pub superseded: u64,
    next_job: u64,
    /// When the node's transport last had a frame from each peer (its own clock).
    pub heard: BTreeMap<u64, Instant>,
}

pub struct RestoreJob {
    pub id: u64,
    pub tx: Sender<Restored>,
    pub restore: Restore,
    pub data: Vec<u8>,
    pub index: u64,
}

impl Io {
    pub fn new(durable: MemLog, faults: DiskFaults, rng: Rng, now: Instant) -> Io {
        Io {
            now,
            durable,
            durable_write: 0,
            writes: 0,
            faults,
            rng,
            crash: false,
            outbox: Vec::new(),
            sync_requests: Vec::new(),
            sync_done: VecDeque::new(),
            jobs: BTreeMap::new(),
            jobs_new: Vec::new(),
            jobs_finished: BTreeSet::new(),
            jobs_dropped: 0,
            tmp: BTreeMap::new(),
            restores_started: Vec::new(),
            installed: Vec::new(),
            adopted: 0,
            superseded: 0,
            next_job: 0,
            heard: BTreeMap::new(),
        }
    }

    /// A sync of write `write` finished: what it wrote is durable (unless a newer write is).
    pub fn made_durable(&mut self, write: u64, log: MemLog) {
        if write > self.durable_write {
            self.durable_write = write;
            self.durable = log;
        }
    }

    /// The node crashed (or starts): what its process had in flight is gone.
    pub fn reset(&mut self, now: Instant) {
        self.now = now;
        self.crash = false;
        self.outbox.clear();
        self.sync_requests.clear();
        self.sync_done.clear();
        self.jobs.clear();
        self.jobs_new.clear();
        self.jobs_finished.clear();
        self.tmp.clear();
        self.restores_started.clear();
        self.installed.clear();
        self.heard.clear();
    }

    fn job_id(&mut self) -> u64 {
        self.next_job += 1;
        self.next_job
    }
}

pub type Shared = Rc<RefCell<Io>>;

/// The node's log in memory (a [`MemLog`] and the node's [`Io`]).
pub struct SimStore {
    pub(super) state: LogState,
    pub(super) snapshot_data: Vec<u8>,
    pub io: Shared,
}

impl SimStore {
    pub fn new(log: MemLog, io: Shared) -> SimStore {
        SimStore {
            state: log.state,
            snapshot_data: log.snapshot_data,
            io,
        }
    }

    /// The log as it is now.
    pub(super) fn mem(&self) -> MemLog {
        MemLog {
            state: self.state.clone(),
            snapshot_data: self.snapshot_data.clone(),
        }
    }

    /// Everything written so far is durable now.
    fn durable_now(&mut self) {
        let log = self.mem();
        let mut io = self.io.borrow_mut();
        io.writes += 1;
        let w = io.writes;
        io.made_durable(w, log);
    }

    /// Every entry's payload is in memory here.
    fn read_entries(&self, low: u64, high: u64, max_size: Option<u64>) -> raft::Result<Vec<Entry>> {
        self.state.read_entries(low, high, max_size)
    }
}

impl Storage for SimStore {
    log_state_reads!();

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        match &self.state.snapshot {
            // As the disk log: one that does not name `to` would be dropped by it.
            Some(meta)
                if meta.index >= request_index
                    && (to == 0 || is_member(meta.get_conf_state(), to)) =>
            {
                let mut s = Snapshot::default();
                s.set_metadata(meta.clone());
                s.set_data(self.snapshot_data.clone().into());
                Ok(s)
            }
            _ => Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            )),
        }
    }
}

impl LogStore for SimStore {
    type Pending = (u64, MemLog);
    type Syncer = SimSyncer;
    type Snapshotting = SimJob;

    fn append(&mut self, ents: &[Entry]) -> Result<(), String> {
        self.state.check_append(ents)?;
        for e in ents {
            self.state.push(e.clone())?;
        }
        Ok(())
    }

    fn set_hard_state(&mut self, hs: &HardState) -> Result<(), String> {
        self.state.hard_state = hs.clone();
        Ok(())
    }

    fn set_conf_state(&mut self, cs: ConfState) -> Result<(), String> {
        self.state.conf_state = cs;
        Ok(())
    }

    fn apply_snapshot(&mut self, snap: &Snapshot) -> Result<(), String> {
        let meta = snap.get_metadata();
        if meta.index < self.state.base_index() {
            return Err(format!(
                "snapshot at {} older than the compaction point {}",
                meta.index,
                self.state.base_index()
            ));
        }
        let before = self.state.conf_state.clone();
        self.state.install(meta);
        self.snapshot_data = snap.get_data().to_vec();
        self.io.borrow_mut().installed.push((before, meta.clone()));
        Ok(())
    }

    fn write(&mut self) -> Result<(u64, MemLog), String> {
        let mut io = self.io.borrow_mut();
        let p = io.faults.crash_before_sync_permille;
        if p > 0 && io.rng.below(1000) < p {
            // Written, not synced: lost with the process.
            io.crash = true;
            return Err("simulated crash before the sync".into());
        }
        io.writes += 1;
        let w = io.writes;
        drop(io);
        Ok((w, self.mem()))
    }

    fn sync(&mut self) -> Result<(), String> {
        self.durable_now();
        Ok(())
    }

    fn sync_in_background(&mut self) -> Result<(), String> {
        // A sync of the file a little later makes every write so far durable; the simulator
        // takes it as done at once (a crash meanwhile would only lose records nothing needs).
        self.durable_now();
        Ok(())
    }

    fn compact(&mut self, compact_index: u64) -> Result<(), String> {
        match self.state.compaction_point(compact_index)? {
            Some((index, term)) => self.state.compact(index, term),
            None => Ok(()),
        }
    }

    fn compaction_keeping(&self, index: u64, max_entries: u64, max_bytes: u64) -> u64 {
        self.state.compaction_keeping(index, max_entries, max_bytes)
    }

    fn snapshot_metadata_at(
        &self,
        index: u64,
        cs: ConfState,
    ) -> Result<Option<SnapshotMetadata>, String> {
        self.state.snapshot_metadata_at(index, cs)
    }

    fn start_snapshot(
        &mut self,
        meta: SnapshotMetadata,
        _urgent: bool,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> io::Result<SimJob> {
        let mut data = Vec::new();
        write(&mut data);
        let mut io = self.io.borrow_mut();
        let id = io.job_id();
        io.jobs.insert(id, data);
        io.jobs_new.push((id, meta.clone()));
        Ok(SimJob {
            id,
            meta,
            started: io.now,
            io: self.io.clone(),
        })
    }

    fn adopt_snapshot(&mut self, meta: SnapshotMetadata, _d: Descriptor) -> Result<(), String> {
        let mut io = self.io.borrow_mut();
        let data = io
            .tmp
            .remove(&meta.index)
            .ok_or("no snapshot file to adopt")?;
        let newer = self
            .state
            .snapshot
            .as_ref()
            .is_some_and(|m| m.index >= meta.index);
        if meta.index < self.state.base_index() || newer {
            io.superseded += 1;
            return Ok(());
        }
        io.adopted += 1;
        self.state.snapshot = Some(meta);
        self.snapshot_data = data;
        Ok(())
    }

    fn start_restore(&self, old: Box<dyn Send>, restore: Restore) -> (u64, Receiver<Restored>) {
        drop(old);
        let (tx, rx) = crossbeam_channel::bounded(1);
        let data = self.snapshot_data.clone();
        let index = self.state.snapshot.as_ref().map_or(0, |m| m.index);
        let mut io = self.io.borrow_mut();
        let id = io.job_id();
        io.restores_started.push(RestoreJob {
            id,
            tx,
            restore,
            data: data.clone(),
            index,
        });
        (data.len() as u64, rx)
    }

    fn log_file_len(&self) -> u64 {
        0
    }

    fn log_cache(&self) -> (u64, u64) {
        (0, 0)
    }
}

/// A background snapshot: its bytes were captured when it started; it finishes when the
/// simulator says so.
pub struct SimJob {
    id: u64,
    meta: SnapshotMetadata,
    started: Instant,
    io: Shared,
}

impl Snapshotting for SimJob {
    fn poll(&mut self) -> Option<Finished> {
        let mut io = self.io.borrow_mut();
        if !io.jobs_finished.remove(&self.id) {
            return None;
        }
        let data = io.jobs.remove(&self.id)?;
        let d = Descriptor {
            len: data.len() as u64,
            crc: crc32c::checksum(&data),
        };
        io.tmp.insert(self.meta.index, data);
        Some(Finished::Done(d))
    }

    fn meta(&self) -> &SnapshotMetadata {
        &self.meta
    }

    fn started(&self) -> Instant {
        self.started
    }

    fn fork_time(&self) -> Duration {
        Duration::ZERO
    }
}

impl Drop for SimJob {
    fn drop(&mut self) {
        let mut io = self.io.borrow_mut();
        if io.jobs.remove(&self.id).is_some() {
            io.jobs_dropped += 1;
        }
        io.jobs_finished.remove(&self.id);
    }
}

/// The node's syncer: requests the simulator completes later.
pub struct SimSyncer {
    pub io: Shared,
}

impl LogSyncer<(u64, MemLog)> for SimSyncer {
    fn request(&self, number: u64, (write, log): (u64, MemLog)) -> Result<(), String> {
        let mut io = self.io.borrow_mut();
        if io.faults.ack_before_sync && io.rng.chance(50) {
            // The broken sync: "done" at once, nothing durable.
            io.sync_done.push_back(Ok(number));
            return Ok(());
        }
        io.sync_requests.push((number, write, log));
        Ok(())
    }

    fn try_done(&self) -> Option<Result<u64, String>> {
        self.io.borrow_mut().sync_done.pop_front()
    }

    fn wait_done(&self) -> Result<u64, String> {
        let mut io = self.io.borrow_mut();
        if let Some(done) = io.sync_done.pop_front() {
            return done;
        }
        let requests = std::mem::take(&mut io.sync_requests);
        let Some(last) = requests.last().map(|(n, ..)| *n) else {
            return Err("no sync to wait for".into());
        };
        for (_, write, log) in requests {
            io.made_durable(write, log);
        }
        Ok(last)
    }
}

/// The node's transport: its messages wait in the outbox for the simulator's network.
pub struct SimLink {
    pub io: Shared,
}

impl PeerLink for SimLink {
    fn send(&self, m: Message) -> bool {
        self.io.borrow_mut().outbox.push(m);
        true
    }

    fn keepalive(&self) {}

    fn try_event(&self) -> Option<PeerEvent> {
        None
    }

    fn set_peers(&mut self, _peers: &BTreeMap<u64, SocketAddr>) -> io::Result<()> {
        Ok(())
    }

    fn set_removed(&mut self, _removed: &BTreeSet<u64>) {}

    fn heard(&self) -> BTreeMap<u64, Instant> {
        self.io.borrow().heard.clone()
    }
}

/// The node's clock, set by the simulator.
pub struct SimClock {
    pub io: Shared,
}

impl Clock for SimClock {
    fn now(&self) -> Instant {
        self.io.borrow().now
    }

    /// raft reset its election timeout in the last tick (it zeroes the elapsed ticks with it):
    /// the seed's draw instead of the thread's, as the simulator does between calls.
    fn between_ticks<S: raft::Storage>(&self, raft: &mut raft::Raft<S>) {
        if raft.election_elapsed == 0 {
            let t = super::ELECTION_TICKS + self.io.borrow_mut().rng.index(super::ELECTION_TICKS);
            raft.set_randomized_election_timeout(t);
        }
    }
}

/// What applying one entry did, for the simulator's checks.
pub struct Record {
    pub index: u64,
    pub data: Vec<u8>,
    pub applied: Applied,
    /// The state machine's snapshot after it.
    pub snapshot: Vec<u8>,
    /// Liveness mode: for an expiry of a node's sessions, their connections before it.
    pub expired_conns: Vec<ConnId>,
    /// Liveness mode: for each lockd reply in the effects, the token of the lock it names if
    /// its connection's session holds it after the entry.
    pub tokens: Vec<Option<u64>>,
    /// A membership change: the configuration before and after it.
    pub conf: Option<(ConfState, ConfState)>,
}

/// The replicated machine of a simulated node (`cluster::node::Machine`): a [`SimState`]
/// behind the exactly-once client table ([`Deduped`]), or as it is in the liveness mode.
pub struct SimMachine {
    pub state: Deduped,
    pub live: bool,
    /// What each application did since the simulator last looked.
    pub records: Vec<Record>,
    /// Checks that failed inside the node's calls.
    pub errors: Vec<String>,
    /// The last index applied, and whether an install is in progress (the state released).
    last: u64,
    installing: bool,
    /// Installs completed.
    pub installs: u64,
}

impl SimMachine {
    pub fn new(state: SimState, live: bool) -> SimMachine {
        SimMachine {
            state: Deduped::new(state),
            live,
            records: Vec::new(),
            errors: Vec::new(),
            last: 0,
            installing: false,
            installs: 0,
        }
    }

    /// The machine was restored at `index` (a start from the disk's snapshot).
    pub fn restored_at(&mut self, index: u64) {
        self.last = index;
    }

    fn applying(&mut self, index: u64) {
        if self.installing {
            self.errors.push(format!(
                "applies {index} while its install of a snapshot is in progress"
            ));
        }
        if index <= self.last {
            self.errors
                .push(format!("applies {index} after {}", self.last));
        }
        self.last = index;
    }

    fn tokens(&self, effects: &[u8]) -> Vec<Option<u64>> {
        let mut out = Vec::new();
        let mut r = crate::core::codec::Reader::new(effects);
        while r.remaining() > 0 {
            let Ok((to, _close, body)) = super::holdfast::next_effect(&mut r) else {
                break;
            };
            if let (Some(to), [crate::server::effect::tag::LOCKD_FRAME, rest @ ..]) = (to, body) {
                let payload = rest.get(1..).unwrap_or_default();
                out.push(self.state.inner.token_of(to, super::live::name_of(payload)));
            }
        }
        out
    }
}

impl Machine for SimMachine {
    /// The state's bytes (checked when put in place).
    type Restored = Vec<u8>;

    fn apply(&mut self, index: u64, data: &[u8]) {
        self.applying(index);
        let expired_conns = match data {
            [2, node @ ..] if self.live && node.len() == 16 => {
                let id = u64::from_le_bytes(node[..8].try_into().expect("8 bytes"));
                self.state.inner.conns_of_node(id)
            }
            _ => Vec::new(),
        };
        let applied = if self.live {
            Applied::Raw {
                effects: self.state.inner.apply_proposal(data),
            }
        } else {
            self.state.apply(data)
        };
        let tokens = match (&applied, self.live) {
            (Applied::Raw { effects }, true) => self.tokens(effects),
            _ => Vec::new(),
        };
        self.records.push(Record {
            index,
            data: data.to_vec(),
            applied,
            snapshot: self.state.snapshot(),
            expired_conns,
            tokens,
            conf: None,
        });
    }

    fn write_snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.state.snapshot());
    }

    fn restorer(&self) -> Box<dyn FnOnce(&[u8]) -> Result<Vec<u8>, String> + Send> {
        Box::new(|bytes: &[u8]| Ok(bytes.to_vec()))
    }

    fn install(&mut self, restored: Vec<u8>) -> Box<dyn Send> {
        self.installing = false;
        if let Err(e) = self.state.restore(&restored) {
            self.errors.push(format!("snapshot restore: {e}"));
        } else if self.state.snapshot() != restored {
            self.errors
                .push("the state restored from a snapshot is not the snapshot's".into());
        }
        self.installs += 1;
        Box::new(())
    }

    fn release(&mut self) -> Box<dyn Send> {
        self.installing = true;
        Box::new(())
    }

    fn apply_conf_change(
        &mut self,
        index: u64,
        context: &[u8],
        before: &ConfState,
        after: &ConfState,
    ) {
        self.applying(index);
        self.state
            .inner
            .apply_conf_change(index, context, before, after);
        self.records.push(Record {
            index,
            data: Vec::new(),
            applied: Applied::Ignored,
            snapshot: self.state.snapshot(),
            expired_conns: Vec::new(),
            tokens: Vec::new(),
            conf: Some((canonical(before.clone()), canonical(after.clone()))),
        });
    }
}

/// The liveness mode: the owner's loop drives the machine (holdfast's cluster state).
impl OwnerState for SimMachine {
    fn replicated(&self) -> &Replicated {
        match &self.state.inner {
            SimState::Replicated(m) => m.replicated(),
            SimState::Replayer(_) => unreachable!("the liveness mode replicates the cluster state"),
        }
    }

    fn replicated_mut(&mut self) -> &mut Replicated {
        match &mut self.state.inner {
            SimState::Replicated(m) => m.replicated_mut(),
            SimState::Replayer(_) => unreachable!("the liveness mode replicates the cluster state"),
        }
    }
}

/// The kinds of state the simulator replicates.
impl SimState {
    pub fn replayer() -> SimState {
        SimState::Replayer(Box::default())
    }

    pub fn replicated() -> SimState {
        SimState::Replicated(Box::default())
    }

    pub fn live() -> SimState {
        SimState::Replicated(Box::new(ReplicatedMachine::without_orphan_windows()))
    }
}
