//! The simulator's snapshots (`sim.rs`), made, sent and installed as the daemon does them:
//!
//! - **Background snapshots.** When one is due (every [`Options::snapshot_every`] entries, or
//!   in proportion: the log bytes applied since the last one reach max([`Options::
//!   snapshot_floor_bytes`], the last snapshot's size), or raft asked for one the stored
//!   snapshot cannot serve), the node captures its state machine's bytes, index, term and
//!   `ConfState` and goes on driving; a seeded while later the snapshot is recorded in its
//!   storage (served to followers), synced, and the log compacted up to it (keeping
//!   [`KEEP_ENTRIES`]). A crash meanwhile loses it (nothing was compacted); one at a time per
//!   node; one older than a snapshot installed meanwhile is discarded.
//! - **Chunked transfers.** A leader's `MsgSnapshot` carries the file's descriptor
//!   ([`Descriptor`]: length, crc32c) in place of the state; the file travels beside it in
//!   chunks through the simulated network (loss, delay, reordering, duplication, partitions,
//!   and seeded damage), on numbered connections, acknowledged by the receiver's contiguous
//!   offset. A connection resets after a seeded share of the chunks, and the sender's transport
//!   reconnects when a transfer makes no progress for a while; the next connection resumes from
//!   the acknowledged offset (the receiver keeps its partial copy) or, in the other seeds,
//!   starts from 0. The receiver steps the `MsgSnapshot` (with the assembled bytes) only once
//!   every byte arrived and the whole file matches the descriptor; a transfer that fails
//!   (damaged file, receiver down or refusing, too many reconnects) is reported to the
//!   sender's raft as `Failure`, one acknowledged whole as `Finish`.
//! - **Background installs.** A follower whose `Ready` carries a snapshot persists it at once;
//!   its state machine is rebuilt from it a seeded while later, and committed entries handed
//!   out meanwhile are held (raft is told that only the snapshot's index is applied) and
//!   applied in order once the new state is in place. The node ticks and steps meanwhile. A
//!   crash restarts it from the durable snapshot and log.
//!
//! Checked: a node applies no entry while an install is in progress; a background snapshot's
//! bytes are the state every node had at its index; an assembled file is byte for byte that
//! state; no log is compacted past its newest snapshot.

use std::collections::BTreeMap;
use std::rc::Rc;

use super::*;
use crate::cluster::crc32c;
use crate::cluster::snapfile::Descriptor;

/// An outgoing transfer without progress for this long (plus twice the network's largest
/// delay) is stalled: its transport reconnects.
const STALL_US: u64 = 30_000;
/// Reconnects one transfer tries before it fails and raft is told.
const MAX_RECONNECTS: u32 = 6;
/// Chunks of one transfer at most (a large file gets larger chunks).
const MAX_CHUNKS: u64 = 48;

/// A piece of a snapshot file on connection `conn` of transfer `id`.
#[derive(Clone)]
pub(super) struct Chunk {
    id: u64,
    conn: u64,
    /// The offset this connection started from (what the sender resumes from).
    start: u64,
    offset: u64,
    data: Vec<u8>,
    /// The `MsgSnapshot`, its data the file's descriptor.
    msg: Rc<Message>,
}

/// The receiver's answer on connection `conn` of transfer `id`.
#[derive(Clone)]
pub(super) struct Ack {
    id: u64,
    conn: u64,
    /// The receiver holds the file's first `have` bytes.
    have: u64,
    /// The receiver has no partial copy to resume from: start again from 0.
    reset: bool,
    /// The assembled file does not match its descriptor: the transfer failed.
    failed: bool,
}

/// A snapshot being made in the background.
struct Pending {
    id: u64,
    index: u64,
    term: u64,
    conf: ConfState,
    data: Vec<u8>,
}

/// A leader's snapshot being installed in the background (already durable).
struct Install {
    id: u64,
    index: u64,
    data: Vec<u8>,
}

struct Outgoing {
    id: u64,
    to: usize,
    msg: Rc<Message>,
    file: Vec<u8>,
    chunk: u64,
    conn: u64,
    acked: u64,
    /// `acked` at the last stall check.
    checked: u64,
    reconnects: u32,
}

struct Incoming {
    from: usize,
    id: u64,
    conn: u64,
    /// The file's first bytes, contiguous, and the chunks that arrived ahead of them.
    have: Vec<u8>,
    ahead: BTreeMap<u64, Vec<u8>>,
    done: bool,
}

/// One node's snapshot work in flight.
#[derive(Default)]
pub(super) struct NodeSnap {
    pending: Option<Pending>,
    installing: Option<Install>,
    /// Committed entries handed out while an install was in progress.
    held: Vec<Entry>,
    outgoing: Vec<Outgoing>,
    incoming: Vec<Incoming>,
    /// Log bytes applied since the last snapshot, and that snapshot's size.
    bytes_since: u64,
    last_bytes: u64,
}

impl Chunk {
    pub(super) fn id(&self) -> u64 {
        self.id
    }
}

impl NodeSnap {
    pub(super) fn installing(&self) -> Option<u64> {
        self.installing.as_ref().map(|x| x.index)
    }
}

impl<M: StateMachine, W: Workload> Cluster<M, W> {
    fn snap_id(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    /// After an event of node `i`'s: its owner's round.
    pub(super) fn round(&mut self, i: usize) -> Result<(), String> {
        if self.live.is_some() {
            self.live_round(i)
        } else {
            self.drive(i)
        }
    }

    /// Node `i` crashed: what it was making, installing, sending and receiving is lost.
    pub(super) fn snap_crash(&mut self, i: usize) {
        let bg = std::mem::take(&mut self.nodes[i].bg);
        self.report.bg_snapshots_dropped_by_crash += u64::from(bg.pending.is_some());
        self.report.installs_dropped_by_crash += u64::from(bg.installing.is_some());
    }

    /// Node `i` (re)started from its disk.
    pub(super) fn snap_start(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        node.bg = NodeSnap::default();
        if node.durable.state.snapshot.is_some() {
            node.bg.last_bytes = node.durable.snapshot_data.len() as u64;
        }
    }

    /// Node `i` applied an entry of `bytes` log bytes.
    pub(super) fn snap_count(&mut self, i: usize, bytes: usize) {
        self.nodes[i].bg.bytes_since += bytes as u64;
    }

    /// No log is compacted past its newest snapshot (the entries before it would be nowhere).
    pub(super) fn check_compaction(&self, i: usize, log: &MemLog) -> Result<(), String> {
        let snap = log.state.snapshot.as_ref().map_or(0, |m| m.index);
        if log.state.base_index() > snap {
            return Err(format!(
                "node {}: log compacted through {} past its newest snapshot at {}",
                self.nodes[i].id,
                log.state.base_index(),
                snap
            ));
        }
        Ok(())
    }

    /// After a `Ready`: starts a background snapshot if one is due and none is in progress.
    pub(super) fn maybe_snapshot(&mut self, i: usize, raw: &mut RawNode<MemLog>) {
        let node = &mut self.nodes[i];
        if node.bg.pending.is_some() || node.bg.installing.is_some() {
            return;
        }
        let every = node.applied >= node.last_snapshot + self.opts.snapshot_every;
        let proportional =
            node.bg.bytes_since >= self.opts.snapshot_floor_bytes.max(node.bg.last_bytes);
        let wanted = raw.store().snapshot_wanted.get();
        let stored = raw.store().state.snapshot.as_ref().map_or(0, |m| m.index);
        if !(every || proportional || wanted) || node.applied <= stored.max(node.last_snapshot) {
            return;
        }
        raw.store().snapshot_wanted.set(false);
        self.report.proportional_snapshots += u64::from(proportional && !every);
        let index = node.applied;
        let pending = Pending {
            id: 0,
            index,
            term: raw.store().state.term(index).unwrap_or_default(),
            conf: raw.store().state.conf_state.clone(),
            data: node.machine.snapshot(),
        };
        node.last_snapshot = index;
        node.bg.bytes_since = 0;
        let id = self.snap_id();
        self.nodes[i].bg.pending = Some(Pending { id, ..pending });
        let took = 1_000 + self.rng.below(self.opts.snapshot_max_us);
        self.push(took, Ev::SnapshotMade { i, id });
    }

    /// Node `i`'s background snapshot `id` is written: recorded, synced, the log compacted.
    pub(super) fn snapshot_made(&mut self, i: usize, id: u64) -> Result<(), String> {
        let node = &mut self.nodes[i];
        let Some(p) = node.bg.pending.take_if(|p| p.id == id) else {
            return Ok(()); // lost in a crash
        };
        if node.raw.is_none() {
            return Ok(());
        }
        // What the node captured is the state every node had at that index.
        self.check_snapshot(i, p.index, p.data.clone())?;
        let node = &mut self.nodes[i];
        let raw = node.raw.as_mut().expect("checked");
        let stored = raw.store().state.snapshot.as_ref().map_or(0, |m| m.index);
        if stored >= p.index {
            // A leader's snapshot installed meanwhile is newer.
            self.report.bg_snapshots_superseded += 1;
            return Ok(());
        }
        let mut meta = SnapshotMetadata {
            index: p.index,
            term: p.term,
            ..Default::default()
        };
        meta.set_conf_state(p.conf);
        node.bg.last_bytes = p.data.len() as u64;
        let store = raw.mut_store();
        store.state.snapshot = Some(meta);
        store.snapshot_data = p.data;
        store.compact(p.index.saturating_sub(KEEP_ENTRIES))?;
        // The daemon syncs a snapshot on the spot: every Ready written is durable.
        node.durable = store.clone();
        node.syncing.clear();
        let through = node.requested;
        self.report.bg_snapshots_completed += 1;
        let log = self.nodes[i].durable.clone();
        self.check_compaction(i, &log)?;
        self.durable_through(i, through);
        self.round(i)
    }

    /// A `Ready` of node `i` carries a leader's snapshot (already persisted): its state
    /// machine is rebuilt in the background.
    pub(super) fn begin_install(&mut self, i: usize, snap: &Snapshot) {
        let index = snap.get_metadata().index;
        let id = self.snap_id();
        let bg = &mut self.nodes[i].bg;
        if bg.installing.take().is_some() {
            self.report.installs_superseded += 1;
        }
        bg.held.retain(|e| e.index > index);
        bg.installing = Some(Install {
            id,
            index,
            data: snap.get_data().to_vec(),
        });
        self.report.installs_background += 1;
        let took = 1_000 + self.rng.below(self.opts.install_max_us);
        self.push(took, Ev::Installed { i, id });
    }

    /// Committed entries handed out during an install: applied after it.
    pub(super) fn hold(&mut self, i: usize, entries: Vec<Entry>) {
        self.report.entries_held += entries.len() as u64;
        self.nodes[i].bg.held.extend(entries);
    }

    /// Node `i`'s install `id` built the new state: it is in place, then the held entries
    /// apply in order.
    pub(super) fn installed(&mut self, i: usize, id: u64) -> Result<(), String> {
        let node = &mut self.nodes[i];
        if node.raw.is_none() {
            return Ok(());
        }
        let Some(inst) = node.bg.installing.take_if(|x| x.id == id) else {
            return Ok(()); // superseded, or lost in a crash
        };
        node.machine
            .restore(&inst.data)
            .map_err(|e| format!("node {}: snapshot restore: {}", node.id, e))?;
        node.applied = inst.index;
        node.last_snapshot = inst.index;
        node.bg.bytes_since = 0;
        node.bg.last_bytes = inst.data.len() as u64;
        self.report.snapshots_installed += 1;
        self.report.installs_completed += 1;
        self.report.joiner_snapshots += u64::from(node.joiner);
        let s = node.machine.snapshot();
        self.check_snapshot(i, inst.index, s)?;
        let held = std::mem::take(&mut self.nodes[i].bg.held);
        let mut raw = self.nodes[i].raw.take().expect("checked");
        let applied = self.apply_entries(i, &mut raw, held);
        if applied.is_ok() {
            raw.advance_apply_to(self.nodes[i].applied);
        }
        if self.nodes[i].retired {
            // It applied its own removal: what it promised is synced and sent; it stops.
            self.nodes[i].durable = raw.store().clone();
            self.nodes[i].syncing.clear();
            let through = self.nodes[i].requested;
            self.durable_through(i, through);
            return applied;
        }
        self.nodes[i].raw = Some(raw);
        applied?;
        self.round(i)
    }

    /// Leader `from`'s raft sent `m`, a `MsgSnapshot`, to `to`: its transport sends the
    /// descriptor in its place and the file beside it in chunks.
    pub(super) fn start_transfer(&mut self, from: usize, to: usize, mut m: Message) {
        let file = m.get_snapshot().get_data().to_vec();
        let len = file.len() as u64;
        let desc = Descriptor {
            len,
            crc: crc32c::checksum(&file),
        };
        m.mut_snapshot().set_data(desc.encode().into());
        let chunk = self.opts.chunk_bytes.max(len.div_ceil(MAX_CHUNKS)).max(1);
        let id = self.snap_id();
        let out = &mut self.nodes[from].bg.outgoing;
        // One transfer per follower: a new snapshot for it replaces the one on its way.
        out.retain(|o| o.to != to);
        out.push(Outgoing {
            id,
            to,
            msg: Rc::new(m),
            file,
            chunk,
            conn: 1,
            acked: 0,
            checked: 0,
            reconnects: 0,
        });
        self.report.transfers_started += 1;
        self.send_chunks(from, id);
    }

    fn outgoing(&mut self, i: usize, id: u64) -> Option<&mut Outgoing> {
        self.nodes[i].bg.outgoing.iter_mut().find(|o| o.id == id)
    }

    /// Sends transfer `id`'s chunks on its current connection, from where it starts, and
    /// arms the stall check.
    fn send_chunks(&mut self, from: usize, id: u64) {
        let Some(o) = self.outgoing(from, id) else {
            return;
        };
        let (to, conn, start, chunk) = (o.to, o.conn, o.acked, o.chunk);
        let msg = o.msg.clone();
        let pieces: Vec<(u64, Vec<u8>)> = {
            let len = o.file.len() as u64;
            let mut v = Vec::new();
            let mut off = start;
            loop {
                let end = (off + chunk).min(len);
                v.push((off, o.file[off as usize..end as usize].to_vec()));
                off = end;
                if off >= len {
                    break;
                }
            }
            v
        };
        self.report.chunks_sent += pieces.len() as u64;
        for (offset, data) in pieces {
            let c = Chunk {
                id,
                conn,
                start,
                offset,
                data,
                msg: msg.clone(),
            };
            self.send(from, to, Packet::Chunk(c));
        }
        let stall = STALL_US + 2 * self.opts.max_delay_us;
        self.push(stall, Ev::TransferCheck { i: from, id, conn });
    }

    /// The transport's look at transfer `id` on connection `conn`: no progress since the last
    /// look is a stall, and it reconnects.
    pub(super) fn transfer_check(&mut self, i: usize, id: u64, conn: u64) -> Result<(), String> {
        if self.nodes[i].raw.is_none() {
            return Ok(());
        }
        let stall = STALL_US + 2 * self.opts.max_delay_us;
        let Some(o) = self.outgoing(i, id).filter(|o| o.conn == conn) else {
            return Ok(());
        };
        if o.acked > o.checked {
            o.checked = o.acked;
            self.push(stall, Ev::TransferCheck { i, id, conn });
            return Ok(());
        }
        self.report.transfer_stalls += 1;
        self.reconnect(i, id, false);
        self.round(i)
    }

    /// Transfer `id` goes on over a new connection: from the acknowledged offset if this seed
    /// resumes and `from_zero` is not asked, else from 0; failed after too many.
    fn reconnect(&mut self, i: usize, id: u64, from_zero: bool) {
        let resume = self.opts.resume_transfers && !from_zero;
        let Some(o) = self.outgoing(i, id) else {
            return;
        };
        o.reconnects += 1;
        if o.reconnects > MAX_RECONNECTS {
            self.fail_transfer(i, id);
            return;
        }
        o.conn += 1;
        let resumed = resume && o.acked > 0;
        if !resumed {
            o.acked = 0;
        }
        o.checked = o.acked;
        self.report.transfers_resumed += u64::from(resumed);
        self.report.transfers_restarted += u64::from(!resumed);
        self.send_chunks(i, id);
    }

    /// Transfer `id` of node `i` failed: its raft is told, and will send a snapshot again.
    fn fail_transfer(&mut self, i: usize, id: u64) {
        let node = &mut self.nodes[i];
        let Some(k) = node.bg.outgoing.iter().position(|o| o.id == id) else {
            return;
        };
        let o = node.bg.outgoing.remove(k);
        self.report.transfers_failed += 1;
        let to_id = self.nodes[o.to].id;
        if let Some(raw) = self.nodes[i].raw.as_mut() {
            raw.report_snapshot(to_id, SnapshotStatus::Failure);
        }
    }

    /// A chunk of transfer `id` reached a node that is down or refuses its sender: the
    /// connection fails, and so does the transfer.
    pub(super) fn transfer_refused(&mut self, from: usize, id: u64) -> Result<(), String> {
        self.fail_transfer(from, id);
        self.drive(from)
    }

    fn ack(&mut self, from: usize, to: usize, a: Ack) {
        self.send(from, to, Packet::Ack(a));
    }

    /// A chunk from `from` reaches node `to`'s transport.
    pub(super) fn receive_chunk(&mut self, from: usize, to: usize, c: Chunk) -> Result<(), String> {
        let Chunk {
            id,
            conn,
            start,
            offset,
            mut data,
            msg,
        } = c;
        if !data.is_empty() && self.rng.below(1000) < self.opts.chunk_corrupt_permille {
            let k = self.rng.index(data.len());
            data[k] ^= 1 << self.rng.below(8);
        }
        let nack = |reset, failed| Ack {
            id,
            conn,
            have: 0,
            reset,
            failed,
        };
        let bg = &mut self.nodes[to].bg;
        let k = match bg.incoming.iter().position(|x| x.from == from) {
            Some(k) if bg.incoming[k].id == id => k,
            found => {
                if start > 0 {
                    // Nothing here to resume from (a crash lost it).
                    self.ack(to, from, nack(true, false));
                    return Ok(());
                }
                let fresh = Incoming {
                    from,
                    id,
                    conn,
                    have: Vec::new(),
                    ahead: BTreeMap::new(),
                    done: false,
                };
                match found {
                    Some(k) => {
                        bg.incoming[k] = fresh;
                        k
                    }
                    None => {
                        bg.incoming.push(fresh);
                        bg.incoming.len() - 1
                    }
                }
            }
        };
        let inc = &mut bg.incoming[k];
        if conn < inc.conn {
            return Ok(()); // a closed connection's
        }
        let mut grew = false;
        if conn > inc.conn {
            // A new connection: resume at its start, or start over.
            inc.conn = conn;
            inc.ahead.clear();
            grew = true;
            if !inc.done {
                if start as usize > inc.have.len() {
                    self.ack(to, from, nack(true, false));
                    return Ok(());
                }
                inc.have.truncate(start as usize);
            }
        }
        let Some(desc) = Descriptor::decode(msg.get_snapshot().get_data()) else {
            return Err(format!(
                "node {}: a snapshot descriptor does not decode",
                self.nodes[to].id
            ));
        };
        if !inc.done {
            let before = inc.have.len();
            inc.ahead.insert(offset, data);
            while let Some((&off, _)) = inc.ahead.first_key_value() {
                if off as usize > inc.have.len() {
                    break;
                }
                let (off, piece) = inc.ahead.pop_first().expect("checked");
                let skip = inc.have.len() - off as usize;
                if skip < piece.len() {
                    inc.have.extend_from_slice(&piece[skip..]);
                }
            }
            grew |= inc.have.len() > before;
            if self.rng.chance(self.opts.chunk_reset_percent) {
                // The connection resets after this chunk: the receiver keeps its partial copy
                // to resume from, or drops it; the sender reconnects.
                self.report.transfer_resets += 1;
                if !self.opts.resume_transfers {
                    let inc = &mut self.nodes[to].bg.incoming[k];
                    inc.have.clear();
                    inc.ahead.clear();
                }
                self.reconnect(from, id, false);
                return Ok(());
            }
            let inc = &mut self.nodes[to].bg.incoming[k];
            if inc.have.len() as u64 >= desc.len {
                if inc.have.len() as u64 != desc.len || crc32c::checksum(&inc.have) != desc.crc {
                    // Damaged on the way: refused, and the transfer failed.
                    self.nodes[to].bg.incoming.remove(k);
                    self.ack(to, from, nack(false, true));
                    return Ok(());
                }
                inc.done = true;
                let file = inc.have.clone();
                self.step_snapshot(to, &msg, file)?;
            }
        }
        if grew {
            let have = self.nodes[to].bg.incoming[k].have.len() as u64;
            self.ack(
                to,
                from,
                Ack {
                    id,
                    conn,
                    have,
                    reset: false,
                    failed: false,
                },
            );
        }
        Ok(())
    }

    /// Every byte of a snapshot file arrived and checks out: node `i`'s raft sees the
    /// `MsgSnapshot`, with the assembled state.
    fn step_snapshot(&mut self, i: usize, msg: &Message, file: Vec<u8>) -> Result<(), String> {
        let index = msg.get_snapshot().get_metadata().index;
        if self.snaps.get(&index).is_some_and(|s| *s != file) {
            return Err(format!(
                "node {}: the snapshot file assembled for index {} is not the state there",
                self.nodes[i].id, index
            ));
        }
        let mut m = msg.clone();
        m.mut_snapshot().set_data(file.into());
        if let Some(raw) = self.nodes[i].raw.as_mut() {
            // Errors are stale or foreign messages raft refuses; it stays up.
            let _ = raw.step(m);
        }
        Ok(())
    }

    /// Receiver `from`'s acknowledgement reaches the sender `to`.
    pub(super) fn receive_ack(&mut self, to: usize, a: Ack) {
        let Some(o) = self.outgoing(to, a.id).filter(|o| o.conn == a.conn) else {
            return; // done, failed, or an earlier connection's
        };
        if a.failed {
            self.report.transfers_corrupt_caught += 1;
            self.fail_transfer(to, a.id);
            return;
        }
        if a.reset {
            self.reconnect(to, a.id, true);
            return;
        }
        o.acked = o.acked.max(a.have);
        if o.acked < o.file.len() as u64 {
            return;
        }
        let receiver = o.to;
        self.nodes[to].bg.outgoing.retain(|o| o.id != a.id);
        self.report.transfers_completed += 1;
        let id = self.nodes[receiver].id;
        if let Some(raw) = self.nodes[to].raw.as_mut() {
            raw.report_snapshot(id, SnapshotStatus::Finish);
        }
    }
}
