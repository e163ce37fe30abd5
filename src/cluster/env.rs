//! What a node's Raft driver ([`super::node::RaftNode`]) works through: its durable log
//! ([`LogStore`], which also makes snapshots and restores them in the background, and whose
//! [`LogSyncer`] makes written records durable), its peers ([`PeerLink`]) and its clock
//! ([`Clock`]). The daemon's are the disk log in `--data-dir` ([`DiskStorage`], a forked
//! [`SnapshotChild`] and the sync thread [`Syncer`]), the TCP transport ([`Transport`]) and
//! [`SystemClock`]; the simulator (`crate::sim`) has in-memory ones that its seed drives.
//!
//! The driver is generic over them (monomorphised: no dynamic dispatch on the daemon's path).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use raft::prelude::{ConfState, Entry, HardState, Message, Snapshot, SnapshotMetadata};
use raft::Storage;

use super::snapchild::{Finished, SnapshotChild};
use super::snapfile::{self, Descriptor, MappedState};
use super::storage::{DiskStorage, PendingLog};
use super::transport::{PeerEvent, Transport};
use crate::core::codec;
use crate::histogram::{Histogram, CLUSTER_BOUNDS};

/// Hands the allocator's free pages back to the kernel (glibc keeps what a thread freed in its
/// arenas; `malloc_trim` returns their whole free pages, wherever they are in the heap).
fn give_back_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases memory the allocator holds free.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// What a restore of a leader's snapshot built, or why it failed.
pub type Restored = Result<Box<dyn std::any::Any + Send>, String>;
/// Builds a state from a snapshot's bytes (hostile bytes: an error), off the owner's thread.
pub type Restore = Box<dyn FnOnce(&[u8]) -> Restored + Send>;

/// The durable Raft log a node drives: raft's [`Storage`] plus what the driver writes, and
/// the node's snapshots (made and restored in the background).
pub trait LogStore: Storage {
    /// Records written and not yet durable (a sync of them makes them so).
    type Pending: Send + 'static;
    /// Makes written records durable off the owner's thread.
    type Syncer: LogSyncer<Self::Pending>;
    /// A snapshot of the state machine being written in the background.
    type Snapshotting: Snapshotting;

    fn append(&mut self, ents: &[Entry]) -> Result<(), String>;
    fn set_hard_state(&mut self, hs: &HardState) -> Result<(), String>;
    fn set_conf_state(&mut self, cs: ConfState) -> Result<(), String>;
    /// A leader's snapshot from a `Ready`.
    fn apply_snapshot(&mut self, snap: &Snapshot) -> Result<(), String>;
    /// Writes what was recorded so far, without waiting for the disk.
    fn write(&mut self) -> Result<Self::Pending, String>;
    /// Makes every record so far durable, now.
    fn sync(&mut self) -> Result<(), String>;
    /// Makes every record so far durable later; nothing waits for it.
    fn sync_in_background(&mut self) -> Result<(), String>;
    /// Drops every entry before `compact_index` (covered by a snapshot).
    fn compact(&mut self, compact_index: u64) -> Result<(), String>;
    /// The compaction index that keeps `index` and at most so many entries and bytes behind it.
    fn compaction_keeping(&self, index: u64, max_entries: u64, max_bytes: u64) -> u64;
    /// The metadata of a snapshot through `index`; `None` when a newer one is stored.
    fn snapshot_metadata_at(
        &self,
        index: u64,
        cs: ConfState,
    ) -> Result<Option<SnapshotMetadata>, String>;
    /// Starts writing a snapshot with `meta` of the state `write` appends (as of now); an
    /// `urgent` one (a node waits for it) is written as fast as the disk takes it.
    fn start_snapshot(
        &mut self,
        meta: SnapshotMetadata,
        urgent: bool,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> io::Result<Self::Snapshotting>;
    /// Takes a finished snapshot as the newest one (ignored when a newer one arrived).
    fn adopt_snapshot(&mut self, meta: SnapshotMetadata, d: Descriptor) -> Result<(), String>;
    /// Starts restoring the newest snapshot (a leader's, just applied) with `restore`, off the
    /// owner's thread, once `old` (the state it replaces) is freed there: its size in bytes,
    /// and where the result comes.
    fn start_restore(&self, old: Box<dyn Send>, restore: Restore) -> (u64, Receiver<Restored>);
    /// The size of the current log file.
    fn log_file_len(&self) -> u64;
    /// Record bytes of the entries whose payloads memory keeps, and entries read back from the
    /// log files so far.
    fn log_cache(&self) -> (u64, u64);
}

/// A snapshot being written in the background.
pub trait Snapshotting {
    /// Whether it has ended, and how; `None` while it runs. Never blocks.
    fn poll(&mut self) -> Option<Finished>;
    fn meta(&self) -> &SnapshotMetadata;
    /// When it started, and how long the owner spent starting it.
    fn started(&self) -> Instant;
    fn fork_time(&self) -> Duration;
}

/// Makes written records durable off the owner's thread, one request per `Ready` that must
/// be durable; answers with the last `Ready` covered.
pub trait LogSyncer<P> {
    fn request(&self, number: u64, log: P) -> Result<(), String>;
    /// The next answer, if one came.
    fn try_done(&self) -> Option<Result<u64, String>>;
    /// The next answer, waiting for it.
    fn wait_done(&self) -> Result<u64, String>;
}

/// The node's peers: where its messages go and what the connections report.
pub trait PeerLink {
    /// Queues `m` for `m.to`; never blocks; false when it was dropped.
    fn send(&self, m: Message) -> bool;
    /// A keepalive to every peer.
    fn keepalive(&self);
    /// The next event for raft, if any.
    fn try_event(&self) -> Option<PeerEvent>;
    fn set_peers(&mut self, peers: &BTreeMap<u64, SocketAddr>) -> io::Result<()>;
    fn set_removed(&mut self, removed: &BTreeSet<u64>);
    /// When each peer's latest frame arrived (raft traffic or a keepalive).
    fn heard(&self) -> BTreeMap<u64, Instant>;
}

/// The node's monotonic clock.
pub trait Clock {
    fn now(&self) -> Instant;

    /// Called between two of raft's ticks in one [`RaftNode::tick`](super::node::RaftNode::tick)
    /// (a node that was held up ticks several times at once). raft-rs draws its randomized
    /// election timeout from a thread's generator whenever it resets it (a campaign in one of
    /// those ticks): the simulator replaces that draw with the seed's here, before the next tick
    /// can act on it. The daemon's clock leaves raft's own draw.
    #[inline]
    fn between_ticks<S: raft::Storage>(&self, _raft: &mut raft::Raft<S>) {}
}

/// The daemon's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Instant {
        Instant::now()
    }
}

impl LogStore for DiskStorage {
    type Pending = PendingLog;
    type Syncer = Syncer;
    type Snapshotting = SnapshotChild;

    fn append(&mut self, ents: &[Entry]) -> Result<(), String> {
        DiskStorage::append(self, ents).map_err(|e| e.to_string())
    }

    fn set_hard_state(&mut self, hs: &HardState) -> Result<(), String> {
        DiskStorage::set_hard_state(self, hs).map_err(|e| e.to_string())
    }

    fn set_conf_state(&mut self, cs: ConfState) -> Result<(), String> {
        DiskStorage::set_conf_state(self, cs).map_err(|e| e.to_string())
    }

    fn apply_snapshot(&mut self, snap: &Snapshot) -> Result<(), String> {
        DiskStorage::apply_snapshot(self, snap).map_err(|e| e.to_string())
    }

    fn write(&mut self) -> Result<PendingLog, String> {
        DiskStorage::write(self).map_err(|e| e.to_string())
    }

    fn sync(&mut self) -> Result<(), String> {
        DiskStorage::sync(self).map_err(|e| e.to_string())
    }

    fn sync_in_background(&mut self) -> Result<(), String> {
        DiskStorage::sync_in_background(self).map_err(|e| e.to_string())
    }

    fn compact(&mut self, compact_index: u64) -> Result<(), String> {
        DiskStorage::compact(self, compact_index).map_err(|e| e.to_string())
    }

    fn compaction_keeping(&self, index: u64, max_entries: u64, max_bytes: u64) -> u64 {
        DiskStorage::compaction_keeping(self, index, max_entries, max_bytes)
    }

    fn snapshot_metadata_at(
        &self,
        index: u64,
        cs: ConfState,
    ) -> Result<Option<SnapshotMetadata>, String> {
        DiskStorage::snapshot_metadata_at(self, index, cs).map_err(|e| e.to_string())
    }

    fn start_snapshot(
        &mut self,
        meta: SnapshotMetadata,
        urgent: bool,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> io::Result<SnapshotChild> {
        let tmp = self.snapshot_tmp_path(&meta);
        let rate = if urgent {
            0
        } else {
            super::snapchild::CHILD_WRITE_RATE
        };
        SnapshotChild::spawn(meta, tmp, rate, write)
    }

    fn adopt_snapshot(&mut self, meta: SnapshotMetadata, d: Descriptor) -> Result<(), String> {
        DiskStorage::adopt_snapshot(self, meta, d).map_err(|e| e.to_string())
    }

    fn start_restore(&self, old: Box<dyn Send>, restore: Restore) -> (u64, Receiver<Restored>) {
        let path = self.snapshot_path().unwrap_or_default();
        let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let (tx, rx) = crossbeam_channel::bounded(1);
        // The old state is freed on the install thread before the new one is built, and its
        // memory given back: freed on another thread meanwhile, into another allocator arena
        // than the one the new state grows in, the two would be held at once.
        let spawned = std::thread::Builder::new()
            .name("holdfast-install".into())
            .spawn(move || {
                drop(old);
                give_back_free_memory();
                let restored = snapfile::check(&path)
                    .and_then(|c| MappedState::open(&path, &c))
                    .map_err(|e| e.to_string())
                    .and_then(|state| codec::release_as_read(state.releaser(), || restore(&state)));
                let _ = tx.send(restored);
            });
        let done = match spawned {
            Ok(_) => rx,
            Err(e) => {
                let (tx, rx) = crossbeam_channel::bounded(1);
                let _ = tx.send(Err(format!("cannot start the install thread: {e}")));
                rx
            }
        };
        (bytes, done)
    }

    fn log_file_len(&self) -> u64 {
        DiskStorage::log_file_len(self)
    }

    fn log_cache(&self) -> (u64, u64) {
        (self.cached_bytes(), self.entries_read())
    }
}

impl Snapshotting for SnapshotChild {
    fn poll(&mut self) -> Option<Finished> {
        SnapshotChild::poll(self)
    }

    fn meta(&self) -> &SnapshotMetadata {
        &self.meta
    }

    fn started(&self) -> Instant {
        self.started
    }

    fn fork_time(&self) -> Duration {
        self.fork_time
    }
}

impl PeerLink for Transport {
    #[inline]
    fn send(&self, m: Message) -> bool {
        Transport::send(self, m)
    }

    fn keepalive(&self) {
        Transport::keepalive(self)
    }

    fn try_event(&self) -> Option<PeerEvent> {
        Transport::try_event(self)
    }

    fn set_peers(&mut self, peers: &BTreeMap<u64, SocketAddr>) -> io::Result<()> {
        Transport::set_peers(self, peers)
    }

    fn set_removed(&mut self, removed: &BTreeSet<u64>) {
        Transport::set_removed(self, removed)
    }

    fn heard(&self) -> BTreeMap<u64, Instant> {
        Transport::heard(self)
    }
}

/// The node's sync thread: makes written log records durable while the owner works on. Each
/// request names a `Ready` and the file it was written to; the thread takes every request
/// queued, syncs each file once (one fdatasync covers every write before it) and answers with
/// the last `Ready` covered.
pub struct Syncer {
    requests: crossbeam_channel::Sender<(u64, PendingLog)>,
    pub(crate) done: Receiver<Result<u64, String>>,
}

/// Count one sync of `took` in `times`.
pub(crate) fn observe_sync(times: &Mutex<Histogram>, took: Duration) {
    let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
    times
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .observe_in(&CLUSTER_BOUNDS, ns, 1);
}

impl Syncer {
    /// `times`: where each sync's duration is counted.
    pub fn start(times: Arc<Mutex<Histogram>>) -> Result<Syncer, String> {
        let (requests, rx) = crossbeam_channel::unbounded::<(u64, PendingLog)>();
        let (tx, done) = crossbeam_channel::unbounded();
        std::thread::Builder::new()
            .name("holdfast-sync".into())
            .spawn(move || {
                let mut files: Vec<PendingLog> = Vec::new();
                while let Ok((mut number, log)) = rx.recv() {
                    files.clear();
                    files.push(log);
                    while let Ok((n, log)) = rx.try_recv() {
                        number = n;
                        if !files.iter().any(|f| f.same_file(&log)) {
                            files.push(log);
                        }
                    }
                    let started = Instant::now();
                    let synced = files.iter().try_for_each(PendingLog::sync);
                    observe_sync(&times, started.elapsed());
                    let failed = synced.is_err();
                    if tx
                        .send(synced.map(|()| number).map_err(|e| e.to_string()))
                        .is_err()
                        || failed
                    {
                        return;
                    }
                }
            })
            .map_err(|e| format!("cannot start the sync thread: {e}"))?;
        Ok(Syncer { requests, done })
    }
}

impl LogSyncer<PendingLog> for Syncer {
    fn request(&self, number: u64, log: PendingLog) -> Result<(), String> {
        self.requests
            .send((number, log))
            .map_err(|_| "the sync thread has stopped".to_string())
    }

    fn try_done(&self) -> Option<Result<u64, String>> {
        self.done.try_recv().ok()
    }

    fn wait_done(&self) -> Result<u64, String> {
        self.done
            .recv()
            .unwrap_or_else(|_| Err("the sync thread has stopped".into()))
    }
}
