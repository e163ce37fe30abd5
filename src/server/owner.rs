//! The owner thread: the only reader and writer of every lock table and of the item store.
//!
//! It takes the workers' batches in arrival order, applies each operation with the time of this
//! turn, fires the tables' timers, and sends each worker one batch of replies per turn (one wake
//! per worker per turn). Because everything that changes lock state passes through here in one
//! serial order, two holders of one lock cannot exist. The tables themselves never read a clock:
//! this loop reads it once per turn and passes it in.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use mio::Waker;

use super::exec_dlock::DlockSessions;
use super::msg::{Arena, Batch, Op, OpMsg, Pool, Record, Replies, Span, ToOwner};
use super::Shared;
use crate::core::codec::{self, DecodeError, Reader, Snapshot};
use crate::core::counter::CounterTable;
use crate::core::dlock::{DlockConfig, DlockEvent, DlockTable};
use crate::core::fence::Fence;
use crate::core::lockd::{Grant, LockdConfig, LockdTable};
use crate::core::store::{Store, StoreConfig};
use crate::core::{Now, Session};
use crate::server::msg::ConnId;

/// Batches taken in one turn before the owner answers and fires timers: bounds how long replies
/// wait when workers keep the channel full.
const MAX_BATCHES_PER_TURN: usize = 64;
/// Longest sleep with no timer pending (the owner wakes for messages anyway).
const IDLE_SLEEP: Duration = Duration::from_secs(1);

/// Everything the owner holds.
pub struct Tables {
    pub store: Store,
    pub lockd: LockdTable,
    pub dlock: DlockTable,
    pub dlock_sessions: DlockSessions,
    pub counters: Counters,
    /// The one fencing counter every table's grants draw from.
    pub fence: Fence,
    /// Key dumps under way and `stats ops` counters of the memcached port.
    pub mc: super::exec_mc::McState,
    /// yrmcds counters (the fourth namespace) and their per-opcode counts.
    pub counter: CounterTable,
    /// Scratch for lockd grants and dlock events.
    pub grants: Vec<Grant>,
    pub dlock_events: Vec<DlockEvent>,
    /// Peers of open connections and latency histograms, for the admin port.
    pub admin: super::exec_admin::AdminState,
    /// Which session each connection is (the tables know sessions only).
    pub sessions: super::sessions::Sessions,
}

impl Tables {
    pub fn new(c: &crate::config::Config, now: Now) -> Tables {
        let store = StoreConfig {
            memory_limit: c.memory_limit,
            max_item_size: c.max_item_size,
        };
        let lockd = LockdConfig {
            orphan_timeout_ms: c.orphan_timeout_ms,
        };
        let dlock = DlockConfig {
            idle_timeout_ms: c.dlock_idle_timeout_ms,
        };
        let fence = Fence::default();
        Tables {
            store: Store::new(store, now).with_fence(&fence),
            lockd: LockdTable::new(lockd, now.ms).with_fence(&fence),
            dlock: DlockTable::new(dlock, now.ms).with_fence(&fence),
            dlock_sessions: DlockSessions::default(),
            counters: Counters::default(),
            fence,
            mc: super::exec_mc::McState::default(),
            counter: CounterTable::new(super::exec_counter::STATS_INTERVAL_MS),
            grants: Vec::new(),
            dlock_events: Vec::new(),
            admin: Default::default(),
            sessions: Default::default(),
        }
    }
}

impl Tables {
    const SNAPSHOT_MAGIC: &'static [u8] = b"HFstate2";

    /// The whole state as bytes, in a canonical form: equal states give equal bytes, whatever
    /// their history or hash seeds (tests/determinism.rs compares replicas this way).
    pub fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(Self::SNAPSHOT_MAGIC);
        self.store.snapshot(out);
        self.lockd.snapshot(out);
        self.dlock.snapshot(out);
        self.dlock_sessions.snapshot(out);
        self.counter.snapshot(out);
        let c = &self.counters;
        for v in [c.cmd_get, c.cmd_set, c.cmd_flush, c.cmd_touch] {
            codec::put_u64(out, v);
        }
        self.mc.snapshot(out);
        self.sessions.snapshot(out);
    }

    /// The state from bytes written by [`Tables::snapshot`], with this daemon's configuration.
    /// Untrusted input: truncated or corrupt bytes are an error, never a panic.
    pub fn restore(c: &crate::config::Config, bytes: &[u8]) -> Result<Tables, DecodeError> {
        let mut t = Tables::new(c, Now::default());
        let r = &mut Reader::new(bytes);
        r.expect(Self::SNAPSHOT_MAGIC, "state snapshot magic")?;
        // Each table restores its holders' tokens and the counter's value; they share one
        // counter again, at the largest value any of them saw.
        let fence = t.fence.clone();
        t.store = Store::restore(t.store.config(), r)?.with_fence(&fence);
        let lockd = LockdConfig {
            orphan_timeout_ms: c.orphan_timeout_ms,
        };
        t.lockd = LockdTable::restore(lockd, r)?.with_fence(&fence);
        let dlock = DlockConfig {
            idle_timeout_ms: c.dlock_idle_timeout_ms,
        };
        t.dlock = DlockTable::restore(dlock, r)?.with_fence(&fence);
        let limits = super::command::Limits {
            max_field: c.dlock_max_message,
            ..Default::default()
        };
        t.dlock_sessions = DlockSessions::restore(r, limits)?;
        t.counter = CounterTable::restore(super::exec_counter::STATS_INTERVAL_MS, r)?;
        t.counters = Counters {
            cmd_get: r.u64()?,
            cmd_set: r.u64()?,
            cmd_flush: r.u64()?,
            cmd_touch: r.u64()?,
        };
        t.mc = super::exec_mc::McState::restore(r)?;
        t.sessions = super::sessions::Sessions::restore(r)?;
        r.finish()?;
        Ok(t)
    }
}

/// memcached command counters kept by the owner (the store keeps hit/miss counters).
#[derive(Default, Debug)]
pub struct Counters {
    pub cmd_get: u64,
    pub cmd_set: u64,
    pub cmd_flush: u64,
    pub cmd_touch: u64,
}

/// Replies being gathered this turn, one batch per worker.
pub struct Outbox {
    pub per_worker: Vec<Replies>,
    /// The largest reply arena of this turn so far.
    pub bytes_this_turn: usize,
}

/// Reply bytes for one worker after which the owner sends them at once instead of at the end of
/// its turn.
const SEND_EARLY_BYTES: usize = 64 * 1024 * 1024;

impl Outbox {
    pub fn new(workers: usize) -> Outbox {
        Outbox {
            per_worker: (0..workers).map(|_| Replies::default()).collect(),
            bytes_this_turn: 0,
        }
    }

    /// Write one reply record for `conn`: `done` is 1 when it answers an operation the worker
    /// sent, 0 for an unsolicited message.
    #[inline]
    pub fn record(
        &mut self,
        conn: ConnId,
        done: u32,
        close: bool,
        write: impl FnOnce(&mut Vec<u8>),
    ) {
        self.record_then(conn, done, |o| {
            write(o);
            close
        });
    }

    /// Like [`Outbox::record`], with the writer deciding whether the connection closes after it.
    pub fn record_then(
        &mut self,
        conn: ConnId,
        done: u32,
        write: impl FnOnce(&mut Vec<u8>) -> bool,
    ) {
        let Some(replies) = self.per_worker.get_mut(conn.worker as usize) else {
            return;
        };
        let start = replies.arena.bytes.len();
        let close = write(&mut replies.arena.bytes);
        let len = replies.arena.bytes.len() - start;
        debug_assert!(
            replies.arena.bytes.len() <= u32::MAX as usize,
            "reply arena over 4 GiB"
        );
        let bytes = Span {
            start: start as u32,
            len: len as u32,
        };
        replies.records.push(Record {
            conn,
            bytes,
            done,
            close,
        });
        self.bytes_this_turn = self.bytes_this_turn.max(replies.arena.bytes.len());
    }

    /// Whether some worker's replies are large enough to be sent before the turn ends (keeps
    /// every reply arena far below the 4 GiB its 32-bit spans can address).
    pub fn should_send_early(&self) -> bool {
        self.bytes_this_turn >= SEND_EARLY_BYTES
    }
}

/// Buffers that circulate with one worker (see [`Batch::spare_records`]).
#[derive(Default)]
struct Pools {
    ops: Pool<OpMsg>,
    batch_arena: Pool<u8>,
    records: Pool<Record>,
    reply_arena: Pool<u8>,
}

pub struct Owner {
    shared: Arc<Shared>,
    rx: Receiver<ToOwner>,
    workers: Vec<(Sender<Replies>, Arc<Waker>)>,
    tables: Tables,
    outbox: Outbox,
    pools: Vec<Pools>,
    /// This turn's messages, taken from the channel before the turn's time is read.
    turn: Vec<ToOwner>,
    /// This turn's batches' start stamps and lock-request counts, for the latency histograms.
    stamps: Vec<(std::time::Instant, [u32; crate::admin::data::PROTOCOLS])>,
    /// Run by the one worker's own thread (run to completion) instead of a thread of its own:
    /// replies go to that worker's channel without waking it, since it reads them next.
    inline: bool,
}

impl Owner {
    pub fn new(
        shared: Arc<Shared>,
        rx: Receiver<ToOwner>,
        workers: Vec<(Sender<Replies>, Arc<Waker>)>,
    ) -> Owner {
        let tables = Tables::new(&shared.config, clock(&shared));
        let outbox = Outbox::new(workers.len());
        let pools = workers.iter().map(|_| Pools::default()).collect();
        Owner {
            shared,
            rx,
            workers,
            tables,
            outbox,
            pools,
            turn: Vec::with_capacity(MAX_BATCHES_PER_TURN),
            stamps: Vec::with_capacity(MAX_BATCHES_PER_TURN),
            inline: false,
        }
    }

    /// An owner that the one worker runs in its own loop (see [`Owner::step_inline`]).
    pub fn new_inline(
        shared: Arc<Shared>,
        rx: Receiver<ToOwner>,
        worker: (Sender<Replies>, Arc<Waker>),
    ) -> Owner {
        let mut owner = Owner::new(shared, rx, vec![worker]);
        owner.inline = true;
        owner
    }

    /// Run to completion: the worker hands over its turn's batch (if any) and the owner runs a
    /// turn at once, with whatever else is queued (admin questions, a shutdown), or only its
    /// due timers. The replies are in the worker's channel when this returns. False on shutdown.
    pub fn step_inline(&mut self, batch: Option<Batch>) -> bool {
        debug_assert!(self.inline);
        if let Some(b) = batch {
            self.turn.push(ToOwner::Batch(b));
        }
        while self.turn.len() < MAX_BATCHES_PER_TURN {
            match self.rx.try_recv() {
                Ok(msg) => self.turn.push(msg),
                Err(_) => break,
            }
        }
        let due = || {
            let now = clock(&self.shared);
            self.next_deadline().is_some_and(|d| d <= now.ms)
        };
        if self.turn.is_empty() && !due() {
            return true;
        }
        self.turn()
    }

    /// How long the worker running this owner may sleep before a timer is due.
    pub fn until_due(&self) -> Option<Duration> {
        let now = clock(&self.shared);
        self.next_deadline()
            .map(|d| Duration::from_millis(d.saturating_sub(now.ms)))
    }

    pub fn run(mut self) {
        loop {
            let now = clock(&self.shared);
            let wait = match self.next_deadline() {
                Some(d) if d <= now.ms => Duration::ZERO,
                Some(d) => Duration::from_millis(d - now.ms).min(IDLE_SLEEP),
                None => IDLE_SLEEP,
            };
            match self.rx.recv_timeout(wait) {
                Ok(msg) => self.turn.push(msg),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            if !self.turn.is_empty() {
                while self.turn.len() < MAX_BATCHES_PER_TURN {
                    match self.rx.try_recv() {
                        Ok(msg) => self.turn.push(msg),
                        Err(_) => break,
                    }
                }
            }
            if !self.turn() {
                return;
            }
        }
    }

    /// One turn over the messages taken (`self.turn`): read the clock, fire due timers, apply
    /// the batches and admin questions in arrival order, fire timers again, send the replies.
    /// False when a shutdown was among the messages.
    fn turn(&mut self) -> bool {
        // The turn's time is read after its messages are taken, so it is never earlier than
        // anything they report: a disconnect, a Lock, a request that restarts an idle clock
        // all happened before their batch was sent. Read before the last batch arrived, it
        // could date an event before it happened, and every timer counted from it (orphan,
        // lease, idle, wait) would fire early by as long as the turn took.
        let now = clock(&self.shared);
        // Timers due by now fire before this turn's requests see the tables (an orphan whose
        // time is up is released before anyone can TRY or ADOPT it), and again after them
        // for timers the requests set at or before now (a zero orphan timeout).
        self.fire_timers(now);
        let mut turn = std::mem::take(&mut self.turn);
        for msg in turn.drain(..) {
            match msg {
                ToOwner::Shutdown => return false,
                ToOwner::Batch(batch) => self.apply(batch, now),
                ToOwner::Admin(query, reply) => {
                    let answer = super::exec_admin::answer(&self.tables, &self.shared, now, query);
                    let _ = reply.send(answer);
                }
            }
        }
        self.turn = turn;
        self.fire_timers(now);
        self.send_replies();
        if !self.stamps.is_empty() {
            let sent = std::time::Instant::now();
            for (stamp, counts) in self.stamps.drain(..) {
                self.tables.admin.observe(stamp, counts, sent);
            }
        }
        true
    }

    fn next_deadline(&self) -> Option<u64> {
        let t = &self.tables;
        [
            t.store.next_deadline(),
            t.lockd.next_deadline(),
            t.dlock.next_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn apply(&mut self, batch: Batch, now: Now) {
        if let Some(stamp) = batch.stamp {
            let ops = batch.ops.iter().map(|m| &m.op);
            let counts = super::exec_admin::count_lock_requests(ops);
            if counts != [0; crate::admin::data::PROTOCOLS] {
                self.stamps.push((stamp, counts));
            }
        }
        let arena = &batch.arena.bytes;
        for msg in &batch.ops {
            apply_op(
                &mut self.tables,
                &mut self.outbox,
                &self.shared,
                msg.conn,
                msg.op,
                arena,
                now,
            );
            if self.outbox.should_send_early() {
                self.send_replies();
            }
        }
        let Batch {
            worker,
            ops,
            arena,
            spare_records,
            spare_reply_arena,
            ..
        } = batch;
        if let Some(p) = self.pools.get_mut(worker as usize) {
            p.ops.give(ops);
            p.batch_arena.give(arena.bytes);
            p.records.give(spare_records);
            p.reply_arena.give(spare_reply_arena);
        }
    }

    /// Fire what is due; most turns nothing is, and the check is one look at each wheel.
    fn fire_timers(&mut self, now: Now) {
        if self.next_deadline().is_some_and(|d| d <= now.ms) {
            fire_timers(&mut self.tables, &mut self.outbox, now);
        }
    }

    fn send_replies(&mut self) {
        self.outbox.bytes_this_turn = 0;
        let links = self
            .outbox
            .per_worker
            .iter_mut()
            .zip(&self.workers)
            .zip(&mut self.pools);
        for ((replies, (tx, waker)), pool) in links {
            if replies.records.is_empty() {
                continue;
            }
            let next = Replies {
                records: pool.records.take(),
                arena: Arena {
                    bytes: pool.reply_arena.take(),
                },
                ..Replies::default()
            };
            let mut full = std::mem::replace(replies, next);
            full.spare_ops = pool.ops.take();
            full.spare_batch_arena = pool.batch_arena.take();
            if tx.send(full).is_ok() && !self.inline {
                let _ = waker.wake();
            }
        }
    }
}

/// One owner turn, the state machine's one entry point: timers due by `now` fire first (an
/// orphan whose time is up is released before anyone can TRY or ADOPT it), then the operations
/// apply in order, then timers they set at or before `now` fire (a zero orphan timeout). The
/// owner thread, the sim and a replayed command log all go through here, so that the same
/// entries (`server::command`) give the same state and the same replies.
pub fn apply_turn(
    t: &mut Tables,
    out: &mut Outbox,
    shared: &Shared,
    now: Now,
    ops: &[OpMsg],
    arena: &[u8],
) {
    fire_timers(t, out, now);
    for msg in ops {
        apply_op(t, out, shared, msg.conn, msg.op, arena, now);
    }
    fire_timers(t, out, now);
}

/// Fire every timer due by `now` in every table and deliver what that caused.
pub fn fire_timers(t: &mut Tables, out: &mut Outbox, now: Now) {
    t.store.advance(now);
    t.lockd.advance(now.ms, &mut t.grants);
    super::exec_lockd::deliver_grants(t, out);
    t.dlock.advance(now.ms, &mut t.dlock_events);
    super::exec_dlock::deliver_events(t, out, now);
}

/// Apply one operation of one connection.
pub fn apply_op(
    t: &mut Tables,
    out: &mut Outbox,
    shared: &Shared,
    conn: ConnId,
    op: Op,
    arena: &[u8],
    now: Now,
) {
    // The tables see sessions; replies go to the connection. A connection's first command
    // (its Open, or its first request when no Open came) starts its session.
    let session = t.sessions.session(conn);
    let who = Who { conn, session };
    match op {
        Op::Mc(op) => super::exec_mc::apply(t, out, shared, who, op, arena, now),
        Op::Lockd(op) => super::exec_lockd::apply(t, out, who, op, arena, now),
        Op::Dlock(op) => super::exec_dlock::receive(t, out, who, op, arena, now),
        Op::Counter(op) => super::exec_counter::apply(t, out, shared, who, op, arena, now),
        Op::DlockOpen => super::exec_dlock::open(t, session, now),
        Op::Open { proto, peer } => t.admin.opened(session, proto, peer),
        Op::Literal { bytes, close } => {
            if t.dlock_sessions.is_waiting(session) {
                t.dlock_sessions
                    .defer_literal(session, bytes.get(arena), close);
            } else {
                out.record(conn, 1, close, |o| o.extend_from_slice(bytes.get(arena)));
            }
        }
        Op::Eof => super::exec_dlock::eof(t, out, who, now),
        Op::Close => {
            t.mc.disconnect(session);
            t.store.disconnect(session, now);
            t.lockd.disconnect(session, now.ms);
            t.counter.disconnect(session, now.ms);
            t.dlock_sessions.remove(session);
            t.admin.closed(session);
            t.dlock.disconnect(session, now.ms, &mut t.dlock_events);
            super::exec_dlock::deliver_events(t, out, now);
            t.sessions.close(conn);
        }
    }
}

/// Who sent a command: the connection its answer goes to, and the session the tables know.
#[derive(Clone, Copy, Debug)]
pub struct Who {
    pub conn: ConnId,
    pub session: Session,
}

/// The time of this turn.
pub fn clock(shared: &Shared) -> Now {
    let elapsed = shared.started.elapsed().as_millis() as u64;
    Now::from_unix_ms(shared.started_unix_ms + elapsed)
}

/// Append a decimal number without going through `fmt`.
#[inline]
pub fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}
