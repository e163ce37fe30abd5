//! The simulator's snapshots (`sim/mod.rs`): the daemon's driver makes and installs them
//! (`cluster::node`); the simulator times its background work and carries the files.
//!
//! - **Background snapshots.** When the driver's rule says one is due it starts one through
//!   the log ([`env::SimStore`] captures the state's bytes, index, term and `ConfState`) and
//!   goes on; a seeded while later the file is written, and the driver adopts it when it next
//!   looks (served to followers from then on) and compacts its log behind it. A crash
//!   meanwhile loses it; a leader's snapshot installed meanwhile supersedes it.
//! - **Chunked transfers** (the transport's, modelled here). A leader's `MsgSnapshot` carries
//!   the file's descriptor ([`Descriptor`]: length, crc32c) in place of the state; the file
//!   travels beside it in chunks through the simulated network (loss, delay, reordering,
//!   duplication, partitions, and seeded damage), on numbered connections, acknowledged by the
//!   receiver's contiguous offset. A connection resets after a seeded share of the chunks, and
//!   the sender's transport reconnects when a transfer makes no progress for a while; the next
//!   connection resumes from the acknowledged offset (the receiver keeps its partial copy) or,
//!   in the other seeds, starts from 0. The receiver steps the `MsgSnapshot` (with the
//!   assembled bytes) only once every byte arrived and the whole file matches the descriptor;
//!   a transfer that fails (damaged file, receiver down or refusing, too many reconnects) is
//!   reported to the sender's driver as `SnapshotFailed`, one acknowledged whole as
//!   `SnapshotSent`.
//! - **Background installs.** The driver persists a leader's snapshot at once and starts
//!   rebuilding its state from it; the rebuild finishes a seeded while later, and the driver
//!   puts the new state in place and applies the committed entries it held meanwhile. A crash
//!   restarts the node from the durable snapshot and log.
//!
//! Checked: a background snapshot's bytes are the state every node had at its index; an
//! assembled file is byte for byte that state; a restored state is the one at its index; no
//! log is compacted past its newest snapshot.

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

/// One node's snapshot transfers in flight (its transport's): lost in a crash.
#[derive(Default)]
pub(super) struct Transfers {
    outgoing: Vec<Outgoing>,
    incoming: Vec<Incoming>,
}

impl Chunk {
    pub(super) fn id(&self) -> u64 {
        self.id
    }
}

impl<W: Workload> Cluster<W> {
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

    /// After a call into node `i`'s driver: the background snapshots it started (each
    /// written a seeded while later) and dropped, the ones it adopted, and the restores of a
    /// leader's snapshot it started (each done a seeded while later).
    pub(super) fn snap_after(&mut self, i: usize) -> Result<(), String> {
        let (new_jobs, dropped, adopted, superseded) = {
            let mut io = self.nodes[i].io.borrow_mut();
            let new_jobs: Vec<(u64, u64, Vec<u8>)> = std::mem::take(&mut io.jobs_new)
                .into_iter()
                .map(|(id, meta)| {
                    (
                        id,
                        meta.index,
                        io.jobs.get(&id).cloned().unwrap_or_default(),
                    )
                })
                .collect();
            let counts = (
                std::mem::take(&mut io.jobs_dropped),
                std::mem::take(&mut io.adopted),
                std::mem::take(&mut io.superseded),
            );
            (new_jobs, counts.0, counts.1, counts.2)
        };
        self.report.bg_snapshots_completed += adopted;
        self.report.bg_snapshots_superseded += dropped + superseded;
        for (id, index, data) in new_jobs {
            // What the node captured is the state every node had at that index.
            self.check_snapshot(i, index, data)?;
            let node = &mut self.nodes[i];
            let every = index >= node.last_snapshot + self.opts.snapshot_every;
            self.report.proportional_snapshots += u64::from(!every);
            node.last_snapshot = index;
            node.bytes_since = 0;
            let took = 1_000 + self.rng.below(self.opts.snapshot_max_us);
            self.push(took, Ev::SnapshotMade { i, id });
        }
        let restores = std::mem::take(&mut self.nodes[i].io.borrow_mut().restores_started);
        for job in restores {
            let id = job.id;
            let node = &mut self.nodes[i];
            // A newer snapshot replaces one still being restored.
            self.report.installs_superseded += node.restores.len() as u64;
            node.restores.clear();
            node.restores.push(job);
            self.report.installs_background += 1;
            let took = 1_000 + self.rng.below(self.opts.install_max_us);
            self.push(took, Ev::Installed { i, id });
        }
        Ok(())
    }

    /// No log is compacted past its newest snapshot (the entries before it would be nowhere).
    pub(super) fn check_compaction(&self, i: usize) -> Result<(), String> {
        let Some(raft) = self.nodes[i].raft.as_ref() else {
            return Ok(());
        };
        let log = raft.raw().store();
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

    /// Node `i`'s background snapshot `id` is written: its driver adopts it (and compacts the
    /// log) when it next looks.
    pub(super) fn snapshot_made(&mut self, i: usize, id: u64) -> Result<(), String> {
        if self.nodes[i].raft.is_none() {
            return Ok(());
        }
        {
            let mut io = self.nodes[i].io.borrow_mut();
            if !io.jobs.contains_key(&id) {
                return Ok(()); // lost in a crash, or dropped by the node
            }
            io.jobs_finished.insert(id);
        }
        self.round(i)
    }

    /// Node `i`'s restore `id` of a leader's snapshot built the new state: the driver puts it
    /// in place, and applies the entries it held, when it next looks.
    pub(super) fn installed(&mut self, i: usize, id: u64) -> Result<(), String> {
        let node = &mut self.nodes[i];
        let Some(k) = node.restores.iter().position(|j| j.id == id) else {
            return Ok(()); // superseded, or lost in a crash
        };
        let job = node.restores.remove(k);
        self.check_snapshot(i, job.index, job.data.clone())?;
        let restored = (job.restore)(&job.data);
        // The driver dropped its end if a newer snapshot replaced this one.
        let _ = job.tx.send(restored);
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
        let out = &mut self.nodes[from].transfers.outgoing;
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
        self.nodes[i]
            .transfers
            .outgoing
            .iter_mut()
            .find(|o| o.id == id)
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
        if self.nodes[i].raft.is_none() {
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
        let Some(k) = node.transfers.outgoing.iter().position(|o| o.id == id) else {
            return;
        };
        let o = node.transfers.outgoing.remove(k);
        self.report.transfers_failed += 1;
        let to_id = self.nodes[o.to].id;
        let now = self.instant(i);
        if let Some(raft) = self.nodes[i].raft.as_mut() {
            raft.peer_event(PeerEvent::SnapshotFailed(to_id), now);
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
        let bg = &mut self.nodes[to].transfers;
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
                    let inc = &mut self.nodes[to].transfers.incoming[k];
                    inc.have.clear();
                    inc.ahead.clear();
                }
                self.reconnect(from, id, false);
                return Ok(());
            }
            let inc = &mut self.nodes[to].transfers.incoming[k];
            if inc.have.len() as u64 >= desc.len {
                if inc.have.len() as u64 != desc.len || crc32c::checksum(&inc.have) != desc.crc {
                    // Damaged on the way: refused, and the transfer failed.
                    self.nodes[to].transfers.incoming.remove(k);
                    self.ack(to, from, nack(false, true));
                    return Ok(());
                }
                inc.done = true;
                let file = inc.have.clone();
                self.step_snapshot(to, &msg, file)?;
            }
        }
        if grew {
            let have = self.nodes[to].transfers.incoming[k].have.len() as u64;
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
        if let Some(raft) = self.nodes[i].raft.as_mut() {
            // A stale or foreign message is ignored, as raft-rs decides.
            raft.step(m);
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
        self.nodes[to].transfers.outgoing.retain(|o| o.id != a.id);
        self.report.transfers_completed += 1;
        let id = self.nodes[receiver].id;
        let now = self.instant(to);
        if let Some(raft) = self.nodes[to].raft.as_mut() {
            raft.peer_event(PeerEvent::SnapshotSent(id), now);
        }
    }
}
