//! The owner thread: the only reader and writer of every lock table and of the item store.
//!
//! It takes the workers' batches in arrival order, applies each operation with the time of this
//! turn, fires the tables' timers, and sends each worker one batch of replies per turn (one wake
//! per worker per turn). Because everything that changes lock state passes through here in one
//! serial order, two holders of one lock cannot exist. The tables themselves never read a clock:
//! this loop reads it once per turn (and again every [`OPS_PER_CLOCK`] operations of a long
//! turn) and passes it in.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use mio::Waker;

use crate::core::Now;
use crate::server::effect::Effects;
use crate::server::msg::{Arena, Batch, OpMsg, Pool, Replies, ToOwner};
use crate::server::{Live, Shared};

mod admin_state;
mod apply;
pub mod cluster;
pub mod command;
mod exec_admin;
mod outbox;
pub mod sessions;
pub(crate) mod stats;
mod tables;

pub use crate::protocol::dlock::LEASE_CLOCK_SLACK_MS;
pub use crate::protocol::lockd::MAX_QUEUED_PER_CONN as LOCKD_MAX_QUEUED_PER_CONN;
#[cfg(test)]
pub use crate::protocol::memcache::KEYS_SLOTS_PER_STEP;
pub use apply::{apply_op, apply_turn, fire_timers};
pub use outbox::Outbox;
pub use tables::Tables;

/// Batches taken in one turn before the owner answers and fires timers: bounds how long replies
/// wait when workers keep the channel full.
const MAX_BATCHES_PER_TURN: usize = 64;
/// Operations applied between two clock reads within a turn (the clock is read between batches
/// too). A turn can hold many thousands of operations (64 batches, each of up to 1024 per
/// connection from up to 1024 connections with events): timers due meanwhile fire here, between
/// operations, not after the whole turn, their replies leave at once, and the operations after
/// this point see the new time. Equivalent to ending the turn here and
/// starting another (the same `apply_turn` order: timers, operations, timers), so the state
/// machine stays one serial order with time passed in. 256 operations take some 50-250 us, far
/// under the 10 ms lease accuracy; one vDSO clock read per 256 costs nothing measurable.
const OPS_PER_CLOCK: usize = 256;
/// Longest sleep with no timer pending (the owner wakes for messages anyway).
const IDLE_SLEEP: Duration = Duration::from_secs(1);

/// Buffers that circulate with one worker (see [`Batch::spare_effects`]).
#[derive(Default)]
struct Pools {
    ops: Pool<OpMsg>,
    batch_arena: Pool<u8>,
    effects: Pool<crate::server::effect::Effect>,
    reply_arena: Pool<u8>,
}

pub struct Owner {
    shared: Arc<Shared>,
    rx: Receiver<ToOwner>,
    workers: Vec<(Sender<Replies>, Arc<Waker>)>,
    tables: Tables,
    /// This turn's effects, routed into `outbox` when the turn's replies go out.
    fx: Effects,
    outbox: Outbox,
    pools: Vec<Pools>,
    /// This turn's messages, taken from the channel before the turn's time is read.
    turn: Vec<ToOwner>,
    /// This turn's batches' start stamps and lock-request counts, for the latency histograms.
    stamps: Vec<(std::time::Instant, [u32; crate::server::query::PROTOCOLS])>,
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
            fx: Effects::default(),
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
            self.next_wake().is_some_and(|d| d <= now.ms)
        };
        if self.turn.is_empty() && !due() {
            return true;
        }
        self.turn()
    }

    /// How long the worker running this owner may sleep before a timer is due.
    pub fn until_due(&self) -> Option<Duration> {
        let now = clock(&self.shared);
        self.next_wake()
            .map(|d| Duration::from_millis(d.saturating_sub(now.ms)))
    }

    pub fn run(mut self) {
        crate::slice::request_for_this_thread(crate::slice::SERVING_THREAD_NANOS);
        loop {
            let now = clock(&self.shared);
            let wait = match self.next_wake() {
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
        let mut now = now;
        self.fire_timers_mid_turn(now);
        let mut turn = std::mem::take(&mut self.turn);
        for (i, msg) in turn.drain(..).enumerate() {
            match msg {
                ToOwner::Shutdown => return false,
                ToOwner::Batch(batch) => {
                    if i > 0 {
                        now = self.tick(now);
                    }
                    if !self.inline {
                        let n = batch.ops.len() as u64;
                        self.shared
                            .owner_queue
                            .fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
                    }
                    now = self.apply(batch, now)
                }
                ToOwner::Admin(query, reply) => {
                    let answer = exec_admin::answer(&self.tables, &self.shared, now, query);
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

    /// When the tables must next be advanced: a deadline, or a cascade to prepare.
    fn next_wake(&self) -> Option<u64> {
        self.tables.next_wake()
    }

    /// Apply one batch from `now` on; returns the time its last operations saw (later than
    /// `now` when the batch was long enough to read the clock again).
    fn apply(&mut self, mut batch: Batch, mut now: Now) -> Now {
        Live::stamp_if_wanted(&self.shared, &mut batch);
        if let Some(stamp) = batch.stamp {
            let ops = batch.ops.iter().map(|m| &m.op);
            let counts = exec_admin::count_lock_requests(ops);
            if counts != [0; crate::server::query::PROTOCOLS] {
                self.stamps.push((stamp, counts));
            }
        }
        let arena = &batch.arena.bytes;
        for (i, chunk) in batch.ops.chunks(OPS_PER_CLOCK).enumerate() {
            if i > 0 {
                now = self.tick(now);
            }
            self.apply_ops(chunk, arena, now);
        }
        recycle(&mut self.pools, batch);
        now
    }

    /// Between batches and every [`OPS_PER_CLOCK`] operations of a turn: a new "turn" starts
    /// here, with its time and the timers due by it. Returns the time from here on.
    fn tick(&mut self, now: Now) -> Now {
        let later = clock(&self.shared);
        if later.ms <= now.ms {
            return now;
        }
        self.fire_timers_mid_turn(later);
        later
    }

    fn apply_ops(&mut self, ops: &[OpMsg], arena: &[u8], now: Now) {
        for msg in ops {
            apply_op(
                &mut self.tables,
                &mut self.fx,
                &self.shared,
                msg.conn,
                msg.op,
                arena,
                now,
            );
            if Outbox::should_send_early(&self.fx) {
                self.send_replies();
            }
        }
    }

    /// Fire what is due, and stage what a wheel has to prepare; most turns neither is, and the
    /// check is one look at each wheel. True when a timer was due: staging alone answers
    /// nothing, so it gives no reason to send replies early.
    fn fire_timers(&mut self, now: Now) -> bool {
        let due = self.tables.next_deadline().is_some_and(|d| d <= now.ms);
        if due || self.next_wake().is_some_and(|d| d <= now.ms) {
            fire_timers(&mut self.tables, &mut self.fx, now);
        }
        due
    }

    /// Fire what is due before more operations of this turn, and send what that answered at
    /// once: a grant by an expiry must not wait for the rest of a long turn (64 batches of up
    /// to thousands of operations each) before it leaves. Replies of one connection stay in
    /// order (one channel per worker, sent in order).
    fn fire_timers_mid_turn(&mut self, now: Now) {
        if self.fire_timers(now) {
            self.send_replies();
        }
    }

    fn send_replies(&mut self) {
        self.outbox.route(&mut self.fx, &self.tables.sessions);
        send_replies(
            &mut self.outbox,
            &self.workers,
            &mut self.pools,
            self.inline,
        );
    }
}

/// Keep an applied batch's buffers for its worker's next replies.
fn recycle(pools: &mut [Pools], batch: Batch) {
    let Batch {
        worker,
        ops,
        arena,
        spare_effects,
        spare_reply_arena,
        ..
    } = batch;
    if let Some(p) = pools.get_mut(worker as usize) {
        p.ops.give(ops);
        p.batch_arena.give(arena.bytes);
        p.effects.give(spare_effects);
        p.reply_arena.give(spare_reply_arena);
    }
}

/// Send each worker its routed effects gathered so far (one message and one wake-up per worker
/// with anything to send), with buffers from its pool to fill next. `inline`: the one worker
/// runs the owner itself and reads its channel next, so it is not woken.
fn send_replies<K: Wake>(
    outbox: &mut Outbox,
    workers: &[(Sender<Replies>, K)],
    pools: &mut [Pools],
    inline: bool,
) {
    let links = outbox.per_worker.iter_mut().zip(workers).zip(pools);
    for ((replies, (tx, waker)), pool) in links {
        if replies.effects.is_empty() {
            continue;
        }
        let next = Replies {
            effects: pool.effects.take(),
            arena: Arena {
                bytes: pool.reply_arena.take(),
            },
            ..Replies::default()
        };
        let mut full = std::mem::replace(replies, next);
        full.spare_ops = pool.ops.take();
        full.spare_batch_arena = pool.batch_arena.take();
        if tx.send(full).is_ok() && !inline {
            waker.wake();
        }
    }
}

/// How the owner tells a worker that replies wait in its channel: the daemon's workers sleep
/// in mio's poll and are woken; the simulator's read their channels when it drives them.
pub trait Wake {
    fn wake(&self);
}

impl Wake for Arc<Waker> {
    #[inline]
    fn wake(&self) {
        let _ = Waker::wake(self);
    }
}

impl Wake for () {
    #[inline]
    fn wake(&self) {}
}

/// The time of this turn.
pub fn clock(shared: &Shared) -> Now {
    let elapsed = shared.started.elapsed().as_millis() as u64;
    Now::from_unix_ms(shared.started_unix_ms + elapsed)
}

/// The state machine's clock at the monotonic instant `now` (what [`clock`] reads at `now`).
pub fn clock_at(shared: &Shared, now: std::time::Instant) -> Now {
    let elapsed = now.saturating_duration_since(shared.started).as_millis() as u64;
    Now::from_unix_ms(shared.started_unix_ms + elapsed)
}
