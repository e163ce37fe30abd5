//! The dlock multi-key lock table ("dlock protocol" of the contract; `dlock.txt`).
//!
//! Owns: which connection holds which key (connection-bound or as a lease), the FIFO queue of
//! waiters of every key, the pending Lock of every connection, idle tracking, and the timers of
//! all of that (wait deadlines, lease expiries, idle timeouts) in its own [`Wheel`].
//!
//! Must not: read a clock, touch a socket, or answer requests; time comes in as `now_ms`, effects
//! that concern other requests than the current one go out as [`DlockEvent`]s.
//!
//! # The rule
//!
//! A Lock is all or nothing. A waiter `W` of connection `C` is granted exactly when, for every one
//! of its keys, the key is held by `C` itself, or it is free and `W` is the first waiter in its
//! queue. A new Lock is granted at once by the same rule, as if appended to every queue: a key
//! held by someone else, or free with a waiter queued, makes it wait (no barging past queued
//! waiters). Hence first come, first served per key; a multi-key waiter is never overtaken by
//! later requests; waiters never hold a partial set, so waiting alone cannot deadlock.
//!
//! Granting is checked only where it can change: when a key is released (its queue's head) and
//! when a waiter leaves without a grant (the new heads of its keys). A grant never makes another
//! waiter grantable (its keys become held), and two grantable waiters never share a key (both
//! would head the same queue), so one pass over the affected heads settles everything and the
//! outcome does not depend on the order of releases that happen at the same instant.
//!
//! # Choices where the contract is silent
//!
//! - Records are per key: a re-lock replaces the record (holder, lease or not, lease deadline) of
//!   each key it names; other keys of an earlier Lock keep theirs.
//! - A key held by the requester never blocks it, even with other connections queued on it
//!   (they wait for that very holder; making the holder queue behind them would deadlock).
//! - A connection that holds keys and asks for more can deadlock with another one doing the
//!   same (hold and wait, by the clients' choice); wait deadlines and disconnects resolve it.
//! - Lease and wait durations are microseconds rounded up to whole milliseconds, counted from the
//!   grant (lease) or from the request (wait).
//! - At one instant, releases (lease expiries, idle disconnects) go first, then wait deadlines in
//!   arrival order: a waiter whose keys come free exactly at its deadline gets them.
//! - Idle: `idle_timeout_ms == 0` disables idle disconnects. `lock` and `unlock` count as
//!   activity themselves (the daemon also calls `touch`). A connection unknown to the table is
//!   registered by `touch` and `lock`; `disconnect` of an unknown one does nothing.
//! - `lock`, `unlock` and `disconnect` first run [`DlockTable::advance`] to `now_ms`, so a lease
//!   whose deadline passed is gone before the request sees the key, whatever the caller's timer
//!   tick. `connect` and `touch` have no event output and do not.
//! - Stats count keys: `lease_expiries` is the number of keys whose lease ran out; `timeouts`
//!   counts Locks (try-once failures and wait deadlines); `grants` counts Locks granted.

use super::codec::{self, DecodeError, Reader, Snapshot};
use super::fence::Fence;
use super::hash::{HashMap, HashSet};
use super::wheel::{TimerKey, Wheel};
use super::ConnId;
use hashbrown::hash_map::EntryRef;
use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::Arc;

/// Dedupe a request's keys with a quadratic scan up to this many keys (no allocation for a hash
/// set); above it a hash set keeps the cost linear.
const SMALL_KEY_SET: usize = 16;

#[derive(Clone, Copy, Debug)]
pub struct DlockConfig {
    pub idle_timeout_ms: u64,
}

/// What happened to a connection later than the request that caused it.
#[derive(Debug, PartialEq, Eq)]
pub enum DlockEvent {
    /// The waiting Lock of `conn` (tagged `token`) now holds all its keys, under the fencing
    /// token `fence`.
    Granted {
        conn: ConnId,
        token: u64,
        fence: u64,
    },
    /// The waiting Lock of `conn` hit its wait deadline: nothing is held; `busy` lists the keys
    /// that were still busy.
    TimedOut {
        conn: ConnId,
        token: u64,
        busy: Vec<Box<[u8]>>,
    },
    /// `conn` sent nothing for the idle timeout and has no pending Lock: the table has already
    /// released its connection-bound locks; the daemon must close the connection.
    Idle { conn: ConnId },
}

#[derive(Debug, PartialEq, Eq)]
pub enum LockResult {
    Granted,
    Waiting,
    Timeout { busy: Vec<Box<[u8]>> },
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DlockStats {
    pub held_keys: u64,
    pub leases: u64,
    pub waiting: u64,
    pub grants: u64,
    pub timeouts: u64,
    pub lease_expiries: u64,
    pub idle_disconnects: u64,
}

/// A held key's name, stored once and shared by the key table, its holder's index and its lease
/// timer (one allocation per held key). Arc rather than Rc only so the table may move to the
/// owner thread; it is never shared across threads.
type Key = Arc<[u8]>;

/// A pending timer: what to do when it fires.
enum Timer {
    /// The lease on `key` runs out, if the key's lease still has generation `gen` (a re-lock
    /// cancels the old timer; the generation also guards against any stale one).
    Lease { key: Key, gen: u64 },
    /// `conn` may have been idle long enough; checked against its last activity when it fires.
    Idle { conn: ConnId },
    /// The wait deadline of waiter `seq`, if it is still waiting.
    Wait { seq: u64 },
}

impl Timer {
    /// Order of timers due at the same instant: releases first, then wait deadlines in arrival
    /// order (see the module docs).
    ///
    /// Within a class the order is one every replica shares (a lease's key, an idle session, a
    /// waiter's arrival number), never the wheel's insertion order, so a state restored from a
    /// snapshot fires its timers exactly as the original would.
    fn order(&self, other: &Timer) -> std::cmp::Ordering {
        fn class(t: &Timer) -> u8 {
            match t {
                Timer::Lease { .. } => 0,
                Timer::Idle { .. } => 1,
                Timer::Wait { .. } => 2,
            }
        }
        match (self, other) {
            (Timer::Lease { key: a, .. }, Timer::Lease { key: b, .. }) => a.cmp(b),
            (Timer::Idle { conn: a }, Timer::Idle { conn: b }) => a.cmp(b),
            (Timer::Wait { seq: a }, Timer::Wait { seq: b }) => a.cmp(b),
            _ => class(self).cmp(&class(other)),
        }
    }
}

struct Lease {
    deadline: u64,
    timer: TimerKey,
    gen: u64,
}

struct Hold {
    conn: ConnId,
    lease: Option<Lease>,
    /// When it was granted, in whole seconds of the table's clock (for the admin port's
    /// listing): 4 bytes fit in the padding after `conn`, where 8 made every held key 8 bytes
    /// larger.
    since_s: u32,
    /// The fencing token of the grant that gave this key to `conn` (one per Lock).
    token: u64,
}

/// One key: its holder and its waiters in arrival order. Removed from the table when it has
/// neither.
#[derive(Default)]
struct KeyState {
    holder: Option<Hold>,
    /// Arrival numbers of the waiters (`DlockTable::waiters`); the first one is the head.
    queue: BTreeSet<u64>,
}

struct Waiter {
    conn: ConnId,
    token: u64,
    /// Distinct keys, in request order.
    keys: Box<[Box<[u8]>]>,
    lease_us: Option<u64>,
    /// The wait deadline (ms) and its timer, if the Lock has one.
    deadline: Option<u64>,
    timer: Option<TimerKey>,
}

struct Conn {
    /// Every key this connection holds, leases included.
    held: HashSet<Key>,
    /// Arrival number of its waiting Lock.
    pending: Option<u64>,
    last_active: u64,
    /// Armed while idle tracking is on and no Lock is pending (lazily: it may fire early, then
    /// it is re-armed at `last_active + idle_timeout_ms`).
    idle_timer: Option<TimerKey>,
}

pub struct DlockTable {
    config: DlockConfig,
    keys: HashMap<Key, KeyState>,
    conns: HashMap<ConnId, Conn>,
    /// Waiting Locks by arrival number (strictly increasing, so per-key FIFO = number order).
    waiters: HashMap<u64, Waiter>,
    wheel: Wheel<(u64, Timer)>,
    next_seq: u64,
    next_lease_gen: u64,
    /// Scratch for fired timers, reused across `advance` calls.
    fired: Vec<(u64, Timer)>,
    /// Scratch for the queue heads `check_heads` looks at.
    heads: Vec<u64>,
    /// The service's fencing counter (shared with the other tables of a state).
    fence: Fence,
    stats: DlockStats,
}

/// Milliseconds from microseconds, rounded up; `None` for absent or zero.
fn ms_from_us(us: Option<u64>) -> Option<u64> {
    match us {
        Some(us) if us > 0 => Some(us.div_ceil(1000)),
        _ => None,
    }
}

/// The distinct keys of a request, first occurrences in order.
fn distinct<'a, 'k>(keys: &'a [&'k [u8]]) -> Cow<'a, [&'k [u8]]> {
    // Almost every request names distinct keys: then the request's own slice is used as is.
    let has_duplicate = if keys.len() <= SMALL_KEY_SET {
        (1..keys.len()).any(|i| keys[..i].contains(&keys[i]))
    } else {
        let mut seen: HashSet<&[u8]> =
            HashSet::with_capacity_and_hasher(keys.len(), Default::default());
        !keys.iter().all(|k| seen.insert(*k))
    };
    if !has_duplicate {
        return Cow::Borrowed(keys);
    }
    let mut out: Vec<&[u8]> = Vec::with_capacity(keys.len());
    for &k in keys {
        if !out.contains(&k) {
            out.push(k);
        }
    }
    Cow::Owned(out)
}

impl DlockTable {
    pub fn new(config: DlockConfig, now_ms: u64) -> Self {
        DlockTable {
            config,
            keys: HashMap::default(),
            conns: HashMap::default(),
            waiters: HashMap::default(),
            wheel: Wheel::new(now_ms),
            next_seq: 0,
            next_lease_gen: 0,
            fired: Vec::new(),
            heads: Vec::new(),
            fence: Fence::default(),
            stats: DlockStats::default(),
        }
    }

    /// A new connection: its idle clock starts now.
    pub fn connect(&mut self, conn: ConnId, now_ms: u64) {
        self.touch(conn, now_ms);
    }

    /// Any request of `conn` restarts its idle clock.
    pub fn touch(&mut self, conn: ConnId, now_ms: u64) {
        self.conns.entry(conn).or_insert_with(|| Conn {
            held: HashSet::default(),
            pending: None,
            last_active: now_ms,
            idle_timer: None,
        });
        self.activity(conn, now_ms);
    }

    /// Lock `keys` for `conn` (see the module docs for the rule). `Waiting`: the answer comes
    /// later as a `Granted` or `TimedOut` event tagged `token`.
    #[allow(clippy::too_many_arguments)]
    pub fn lock(
        &mut self,
        conn: ConnId,
        token: u64,
        keys: &[&[u8]],
        wait_us: Option<u64>,
        lease_us: Option<u64>,
        now_ms: u64,
        events: &mut Vec<DlockEvent>,
    ) -> LockResult {
        self.touch(conn, now_ms);
        self.advance(now_ms, events);
        let old = self.conns.get(&conn).and_then(|c| c.pending);
        if let Some(old) = old {
            // The daemon answers a connection's requests in order, so a second Lock cannot
            // arrive while one waits. Should it anyway, the old one is dropped, not leaked.
            debug_assert!(false, "second pending Lock on {conn:?}");
            if let Some(w) = self.take_waiter(old, false) {
                self.check_heads(&w.keys, now_ms, events);
            }
        }
        let keys = distinct(keys);
        let busy: Vec<&[u8]> = keys
            .iter()
            .copied()
            .filter(|k| self.busy_for_new(conn, k))
            .collect();
        if busy.is_empty() {
            let lease_ms = ms_from_us(lease_us);
            let token = self.fence.next();
            for k in keys.iter() {
                self.set_holder(k, conn, lease_ms, now_ms, token);
            }
            self.stats.grants += 1;
            return LockResult::Granted;
        }
        if wait_us == Some(0) {
            self.stats.timeouts += 1;
            return LockResult::Timeout {
                busy: busy.into_iter().map(Box::from).collect(),
            };
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        for k in keys.iter() {
            self.keys.entry_ref(*k).or_default().queue.insert(seq);
        }
        let deadline = ms_from_us(wait_us).map(|ms| now_ms.saturating_add(ms));
        let timer = deadline.map(|d| self.wheel.insert(d, (d, Timer::Wait { seq })));
        self.waiters.insert(
            seq,
            Waiter {
                conn,
                token,
                keys: keys.iter().map(|k| Box::from(*k)).collect(),
                lease_us,
                deadline,
                timer,
            },
        );
        if let Some(c) = self.conns.get_mut(&conn) {
            c.pending = Some(seq);
            // A pending Lock is not idle: the clock restarts when it finishes.
            if let Some(t) = c.idle_timer.take() {
                self.wheel.cancel(t);
            }
        }
        LockResult::Waiting
    }

    /// Release the caller's own `keys` (leases too). `Err` lists the keys it did not hold; the
    /// others are released all the same.
    pub fn unlock(
        &mut self,
        conn: ConnId,
        keys: &[&[u8]],
        now_ms: u64,
        events: &mut Vec<DlockEvent>,
    ) -> Result<(), Vec<Box<[u8]>>> {
        self.touch(conn, now_ms);
        self.advance(now_ms, events);
        let keys = distinct(keys);
        let mut not_held: Vec<Box<[u8]>> = Vec::new();
        for &k in keys.iter() {
            let mine = self
                .keys
                .get(k)
                .and_then(|s| s.holder.as_ref())
                .is_some_and(|h| h.conn == conn);
            if mine {
                self.release(k);
            } else {
                not_held.push(Box::from(k));
            }
        }
        if not_held.is_empty() {
            self.check_heads(&keys, now_ms, events);
            return Ok(());
        }
        let released: Vec<&[u8]> = keys
            .iter()
            .copied()
            .filter(|k| !not_held.iter().any(|n| **n == **k))
            .collect();
        self.check_heads(&released, now_ms, events);
        Err(not_held)
    }

    /// `conn` is gone: its waiting Lock leaves the queues, its connection-bound locks are
    /// released; its leases stay until their deadlines.
    pub fn disconnect(&mut self, conn: ConnId, now_ms: u64, events: &mut Vec<DlockEvent>) {
        self.advance(now_ms, events);
        let Some(c) = self.conns.remove(&conn) else {
            return;
        };
        let mut affected: Vec<Key> = Vec::new();
        if let Some(seq) = c.pending {
            if let Some(w) = self.take_waiter(seq, false) {
                affected.extend(w.keys.iter().map(|k| Key::from(&**k)));
            }
        }
        self.drop_conn(conn, c, now_ms, affected, events);
    }

    /// Run every timer due at or before `now_ms`, in time order.
    pub fn advance(&mut self, now_ms: u64, events: &mut Vec<DlockEvent>) {
        let mut fired = std::mem::take(&mut self.fired);
        // One instant at a time, so that what happens at one deadline (a grant restarting an
        // idle clock, a waiter leaving) is in place before the next deadline is looked at.
        while let Some(next) = self.wheel.next_deadline() {
            if next > now_ms {
                break;
            }
            let at = next.max(self.wheel.now());
            self.wheel.advance_to(at, &mut fired);
            if fired.is_empty() {
                // A hierarchical wheel may report a cascade point; it must make progress.
                if self.wheel.next_deadline().is_some_and(|n| n <= at) {
                    debug_assert!(false, "timer wheel reports a deadline it does not fire");
                    break;
                }
                continue;
            }
            self.run_fired(at, &mut fired, events);
        }
        self.wheel.advance_to(now_ms, &mut fired);
        let at = self.wheel.now();
        self.run_fired(at, &mut fired, events);
        self.fired = fired;
    }

    /// When `advance` should next be called (`None`: no timer pending).
    pub fn next_deadline(&self) -> Option<u64> {
        self.wheel.next_deadline()
    }

    pub fn stats(&self) -> DlockStats {
        DlockStats {
            waiting: self.waiters.len() as u64,
            ..self.stats
        }
    }

    /// The fencing token of the most recent grant (an immediate `Granted` reads its token here
    /// right after the call; a waiter's grant carries its own in [`DlockEvent::Granted`]).
    pub fn last_fence(&self) -> u64 {
        self.fence.last()
    }

    /// The fencing token under which `conn` holds `key`.
    pub fn token_of(&self, conn: ConnId, key: &[u8]) -> Option<u64> {
        let h = self.keys.get(key)?.holder.as_ref()?;
        (h.conn == conn).then_some(h.token)
    }

    /// Share the service's fencing counter (see [`Fence`]).
    pub fn with_fence(mut self, fence: &Fence) -> Self {
        self.fence.join(fence);
        self
    }

    /// Who holds `key`, and the lease deadline (ms) if it is a lease.
    pub fn holder(&self, key: &[u8]) -> Option<(ConnId, Option<u64>)> {
        let hold = self.keys.get(key)?.holder.as_ref()?;
        Some((hold.conn, hold.lease.as_ref().map(|l| l.deadline)))
    }

    // ---- internals ----

    /// Whether `key` keeps a new Lock of `conn` from being granted at once.
    fn busy_for_new(&self, conn: ConnId, key: &[u8]) -> bool {
        match self.keys.get(key) {
            None => false,
            Some(s) => match &s.holder {
                Some(h) => h.conn != conn,
                None => !s.queue.is_empty(),
            },
        }
    }

    /// Whether `key` still keeps waiter `seq` of `conn` from being granted.
    fn busy_for_waiter(&self, conn: ConnId, seq: u64, key: &[u8]) -> bool {
        match self.keys.get(key) {
            None => {
                debug_assert!(false, "a waiter's key has no state");
                false
            }
            Some(s) => match &s.holder {
                Some(h) => h.conn != conn,
                None => s.queue.first() != Some(&seq),
            },
        }
    }

    fn grantable(&self, seq: u64) -> bool {
        self.waiters
            .get(&seq)
            .is_some_and(|w| w.keys.iter().all(|k| !self.busy_for_waiter(w.conn, seq, k)))
    }

    /// Restart the idle clock of `conn` at `now_ms`, arming its timer if it has none.
    fn activity(&mut self, conn: ConnId, now_ms: u64) {
        let idle = self.config.idle_timeout_ms;
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.last_active = c.last_active.max(now_ms);
        if idle > 0 && c.pending.is_none() && c.idle_timer.is_none() {
            let due = c.last_active.saturating_add(idle);
            c.idle_timer = Some(self.wheel.insert(due, (due, Timer::Idle { conn })));
        }
    }

    /// Make `conn` the holder of `key`, replacing its own earlier record if any.
    fn set_holder(
        &mut self,
        key: &[u8],
        conn: ConnId,
        lease_ms: Option<u64>,
        now_ms: u64,
        token: u64,
    ) {
        let (key, state) = match self.keys.entry_ref(key) {
            EntryRef::Occupied(o) => (o.key().clone(), o.into_mut()),
            EntryRef::Vacant(v) => {
                let o = v.insert_entry(KeyState::default());
                (o.key().clone(), o.into_mut())
            }
        };
        match state.holder.take() {
            Some(old) => {
                debug_assert_eq!(old.conn, conn, "grant over another holder");
                if let Some(lease) = old.lease {
                    self.wheel.cancel(lease.timer);
                    self.stats.leases -= 1;
                }
            }
            None => self.stats.held_keys += 1,
        }
        let lease = lease_ms.map(|ms| {
            let deadline = now_ms.saturating_add(ms);
            let gen = self.next_lease_gen;
            self.next_lease_gen += 1;
            self.stats.leases += 1;
            let timer = self.wheel.insert(
                deadline,
                (
                    deadline,
                    Timer::Lease {
                        key: key.clone(),
                        gen,
                    },
                ),
            );
            Lease {
                deadline,
                timer,
                gen,
            }
        });
        state.holder = Some(Hold {
            conn,
            lease,
            since_s: (now_ms / 1000) as u32,
            token,
        });
        if let Some(c) = self.conns.get_mut(&conn) {
            c.held.insert(key);
        }
    }

    /// Free `key` from its holder (whoever it is); the caller checks the queue's head.
    fn release(&mut self, key: &[u8]) {
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        let Some(hold) = state.holder.take() else {
            return;
        };
        self.stats.held_keys -= 1;
        if let Some(lease) = hold.lease {
            self.wheel.cancel(lease.timer);
            self.stats.leases -= 1;
        }
        if state.queue.is_empty() {
            self.keys.remove(key);
        }
        if let Some(c) = self.conns.get_mut(&hold.conn) {
            c.held.remove(key);
        }
    }

    /// Take waiter `seq` out of every queue, cancel its deadline and clear its connection's
    /// `pending`. The caller checks the new heads of its keys. Keys left with neither holder nor
    /// waiter are dropped from the table unless `granting` (they are about to be held).
    fn take_waiter(&mut self, seq: u64, granting: bool) -> Option<Waiter> {
        let w = self.waiters.remove(&seq)?;
        if let Some(t) = w.timer {
            self.wheel.cancel(t);
        }
        for k in w.keys.iter() {
            if let Some(state) = self.keys.get_mut(&**k) {
                state.queue.remove(&seq);
                if !granting && state.holder.is_none() && state.queue.is_empty() {
                    self.keys.remove(&**k);
                }
            }
        }
        if let Some(c) = self.conns.get_mut(&w.conn) {
            if c.pending == Some(seq) {
                c.pending = None;
            }
        }
        Some(w)
    }

    /// Grant the head waiter of each of `keys` if it can now have all its keys.
    fn check_heads<K: AsRef<[u8]>>(
        &mut self,
        keys: &[K],
        now_ms: u64,
        events: &mut Vec<DlockEvent>,
    ) {
        // Grants go out in arrival order, whatever the order of `keys` (a disconnect releases
        // keys in hash order): the events, and the fencing tokens they carry, must come out the
        // same on every replica.
        let mut heads = std::mem::take(&mut self.heads);
        heads.extend(keys.iter().filter_map(|k| {
            self.keys
                .get(k.as_ref())
                .and_then(|s| s.queue.first().copied())
        }));
        heads.sort_unstable();
        heads.dedup();
        for &seq in &heads {
            if self.grantable(seq) {
                self.grant(seq, now_ms, events);
            }
        }
        heads.clear();
        self.heads = heads;
    }

    fn grant(&mut self, seq: u64, now_ms: u64, events: &mut Vec<DlockEvent>) {
        let Some(w) = self.take_waiter(seq, true) else {
            return;
        };
        let lease_ms = ms_from_us(w.lease_us);
        let fence = self.fence.next();
        for k in w.keys.iter() {
            self.set_holder(k, w.conn, lease_ms, now_ms, fence);
        }
        self.stats.grants += 1;
        self.activity(w.conn, now_ms);
        events.push(DlockEvent::Granted {
            conn: w.conn,
            token: w.token,
            fence,
        });
    }

    /// Remove connection `conn` (already taken out of `conns`): release its connection-bound
    /// keys, keep its leases, and settle the heads of every affected key.
    fn drop_conn(
        &mut self,
        conn: ConnId,
        c: Conn,
        now_ms: u64,
        mut affected: Vec<Key>,
        events: &mut Vec<DlockEvent>,
    ) {
        if let Some(t) = c.idle_timer {
            self.wheel.cancel(t);
        }
        for k in c.held {
            let bound = self
                .keys
                .get(&*k)
                .and_then(|s| s.holder.as_ref())
                .is_some_and(|h| h.conn == conn && h.lease.is_none());
            if bound {
                self.release(&k);
                affected.push(k);
            }
        }
        self.check_heads(&affected, now_ms, events);
    }

    fn run_fired(&mut self, at: u64, fired: &mut Vec<(u64, Timer)>, events: &mut Vec<DlockEvent>) {
        fired.sort_unstable_by(|(da, a), (db, b)| da.cmp(db).then_with(|| a.order(b)));
        for (_, timer) in fired.drain(..) {
            self.fire(at, timer, events);
        }
    }

    fn fire(&mut self, at: u64, timer: Timer, events: &mut Vec<DlockEvent>) {
        match timer {
            Timer::Lease { key, gen } => {
                let current = self
                    .keys
                    .get(&*key)
                    .and_then(|s| s.holder.as_ref())
                    .and_then(|h| h.lease.as_ref())
                    .is_some_and(|l| l.gen == gen);
                if current {
                    self.release(&key);
                    self.stats.lease_expiries += 1;
                    self.check_heads(&[key], at, events);
                }
            }
            Timer::Idle { conn } => {
                let idle = self.config.idle_timeout_ms;
                let Some(c) = self.conns.get_mut(&conn) else {
                    return;
                };
                c.idle_timer = None;
                if c.pending.is_some() {
                    return;
                }
                let due = c.last_active.saturating_add(idle);
                if due > at {
                    c.idle_timer = Some(self.wheel.insert(due, (due, Timer::Idle { conn })));
                    return;
                }
                if let Some(c) = self.conns.remove(&conn) {
                    self.stats.idle_disconnects += 1;
                    events.push(DlockEvent::Idle { conn });
                    self.drop_conn(conn, c, at, Vec::new(), events);
                }
            }
            Timer::Wait { seq } => {
                let Some(w) = self.waiters.get(&seq) else {
                    return; // granted or gone meanwhile
                };
                let busy: Vec<Box<[u8]>> = w
                    .keys
                    .iter()
                    .filter(|k| self.busy_for_waiter(w.conn, seq, k))
                    .cloned()
                    .collect();
                let Some(w) = self.take_waiter(seq, false) else {
                    return;
                };
                self.stats.timeouts += 1;
                self.activity(w.conn, at);
                events.push(DlockEvent::TimedOut {
                    conn: w.conn,
                    token: w.token,
                    busy,
                });
                self.check_heads(&w.keys, at, events);
            }
        }
    }
}

/// Read-only inspection for tests, fuzzing and invariant checks: O(table), never on the
/// daemon's path.
impl DlockTable {
    /// Every held key: its holder and, for a lease, the lease deadline (ms). No order.
    pub fn for_each_held(&self, mut f: impl FnMut(&[u8], ConnId, Option<u64>)) {
        for (k, s) in &self.keys {
            if let Some(h) = &s.holder {
                f(k, h.conn, h.lease.as_ref().map(|l| l.deadline));
            }
        }
    }

    /// When `key` was granted to its holder (ms, rounded down to a whole second), if it is held.
    pub fn held_since(&self, key: &[u8]) -> Option<u64> {
        Some(u64::from(self.keys.get(key)?.holder.as_ref()?.since_s) * 1000)
    }

    /// The connections queued on `key`, first come first (the admin port's listing).
    pub fn queue<'a>(&'a self, key: &[u8]) -> impl Iterator<Item = ConnId> + 'a {
        let queue = self.keys.get(key).map(|s| &s.queue);
        queue
            .into_iter()
            .flatten()
            .filter_map(|q| self.waiters.get(q))
            .map(|w| w.conn)
    }

    /// The connections queued on `key`, first come first.
    #[cfg(test)]
    fn queue_conns(&self, key: &[u8]) -> Vec<ConnId> {
        self.keys.get(key).map_or_else(Vec::new, |s| {
            s.queue
                .iter()
                .filter_map(|q| self.waiters.get(q))
                .map(|w| w.conn)
                .collect()
        })
    }

    /// Every internal index agrees with every other, and nobody grantable is left waiting;
    /// panics otherwise.
    pub fn check_invariants(&self) {
        let (mut held, mut leases) = (0, 0);
        for (k, s) in &self.keys {
            assert!(
                s.holder.is_some() || !s.queue.is_empty(),
                "empty key state {k:?}"
            );
            if let Some(h) = &s.holder {
                held += 1;
                leases += u64::from(h.lease.is_some());
                if let Some(c) = self.conns.get(&h.conn) {
                    assert!(c.held.contains(k), "{k:?} missing from its holder's index");
                }
            }
            for seq in &s.queue {
                let w = self.waiters.get(seq).expect("queued waiter exists");
                assert!(w.keys.iter().any(|wk| **wk == **k));
            }
        }
        assert_eq!(held, self.stats.held_keys);
        assert_eq!(leases, self.stats.leases);
        for (seq, w) in &self.waiters {
            for k in w.keys.iter() {
                assert!(self.keys[&**k].queue.contains(seq));
            }
            assert_eq!(self.conns[&w.conn].pending, Some(*seq));
            assert!(!self.grantable(*seq), "waiter {seq} could be granted");
        }
        for (id, c) in &self.conns {
            for k in &c.held {
                assert_eq!(self.holder(k).map(|h| h.0), Some(*id));
            }
            if let Some(seq) = c.pending {
                assert!(self.waiters.contains_key(&seq));
            }
            if self.config.idle_timeout_ms > 0 && c.pending.is_none() {
                assert!(c.idle_timer.is_some(), "{id:?} has no idle timer");
            }
        }
    }
}

/// Snapshot and restore, in a canonical form: sessions by id, keys in byte order with their
/// holder, lease and queue, waiters by arrival number.
impl DlockTable {
    const SNAPSHOT_MAGIC: &'static [u8] = b"HFdlock1";
    /// dlock's own cap on a frame is a megabyte; a key cannot be longer.
    const MAX_KEY: usize = 1 << 20;
}

impl Snapshot for DlockTable {
    type Config = DlockConfig;

    fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(Self::SNAPSHOT_MAGIC);
        codec::put_u64(out, self.wheel.now());
        codec::put_u64(out, self.next_seq);
        codec::put_u64(out, self.next_lease_gen);
        codec::put_u64(out, self.fence.last());
        let s = &self.stats;
        for v in [s.grants, s.timeouts, s.lease_expiries, s.idle_disconnects] {
            codec::put_u64(out, v);
        }
        let mut conns: Vec<(&ConnId, &Conn)> = self.conns.iter().collect();
        conns.sort_unstable_by_key(|(c, _)| **c);
        codec::put_u64(out, conns.len() as u64);
        for (id, c) in conns {
            id.encode(out);
            codec::put_u64(out, c.last_active);
        }
        let mut keys: Vec<(&Key, &KeyState)> = self.keys.iter().collect();
        keys.sort_unstable_by(|a, b| a.0.cmp(b.0));
        codec::put_u64(out, keys.len() as u64);
        for (k, s) in keys {
            codec::put_bytes(out, k);
            match &s.holder {
                None => codec::put_u8(out, 0),
                Some(h) => {
                    codec::put_u8(out, 1);
                    h.conn.encode(out);
                    codec::put_u64(out, h.token);
                    codec::put_u64(out, u64::from(h.since_s));
                    match &h.lease {
                        None => codec::put_u8(out, 0),
                        Some(l) => {
                            codec::put_u8(out, 1);
                            codec::put_u64(out, l.deadline);
                            codec::put_u64(out, l.gen);
                        }
                    }
                }
            }
        }
        let mut waiters: Vec<(&u64, &Waiter)> = self.waiters.iter().collect();
        waiters.sort_unstable_by_key(|(seq, _)| **seq);
        codec::put_u64(out, waiters.len() as u64);
        for (seq, w) in waiters {
            codec::put_u64(out, *seq);
            w.conn.encode(out);
            codec::put_u64(out, w.token);
            codec::put_opt_u64(out, w.lease_us);
            codec::put_opt_u64(out, w.deadline);
            codec::put_u64(out, w.keys.len() as u64);
            for k in w.keys.iter() {
                codec::put_bytes(out, k);
            }
        }
    }

    /// A table from bytes written by [`DlockTable::snapshot`]; untrusted: anything out of
    /// order, duplicated, dangling (a waiter of an unknown session, a queued key with no state)
    /// or against the table's rules (a waiter that could be granted) is an error.
    fn restore(config: DlockConfig, r: &mut Reader<'_>) -> Result<DlockTable, DecodeError> {
        use DecodeError::Invalid;
        r.expect(Self::SNAPSHOT_MAGIC, "dlock snapshot magic")?;
        let mut t = DlockTable::new(config, r.u64()?);
        t.next_seq = r.u64()?;
        t.next_lease_gen = r.u64()?;
        t.fence.raise_to(r.u64()?);
        t.stats.grants = r.u64()?;
        t.stats.timeouts = r.u64()?;
        t.stats.lease_expiries = r.u64()?;
        t.stats.idle_disconnects = r.u64()?;
        let n = r.count(4)?;
        let mut last: Option<ConnId> = None;
        for _ in 0..n {
            let id = ConnId::decode(r)?;
            if last.is_some_and(|l| l >= id) {
                return Err(Invalid("dlock sessions out of order"));
            }
            last = Some(id);
            let last_active = r.u64()?;
            t.conns.insert(
                id,
                Conn {
                    held: HashSet::default(),
                    pending: None,
                    last_active,
                    idle_timer: None,
                },
            );
        }
        let n = r.count(2)?;
        let mut last_key: Option<Key> = None;
        for _ in 0..n {
            let key: Key = Key::from(r.bytes(Self::MAX_KEY)?);
            if last_key.as_ref().is_some_and(|l| **l >= *key) {
                return Err(Invalid("dlock keys out of order"));
            }
            last_key = Some(key.clone());
            let holder = match r.u8()? {
                0 => None,
                1 => {
                    let conn = ConnId::decode(r)?;
                    let token = r.u64()?;
                    if token > t.fence.last() {
                        return Err(Invalid("dlock token not yet issued"));
                    }
                    let since_s = r.u32()?;
                    let lease = match r.u8()? {
                        0 => None,
                        1 => {
                            let deadline = r.u64()?;
                            let gen = r.u64()?;
                            if gen >= t.next_lease_gen {
                                return Err(Invalid("dlock lease generation not yet issued"));
                            }
                            let timer = t.wheel.insert(
                                deadline,
                                (
                                    deadline,
                                    Timer::Lease {
                                        key: key.clone(),
                                        gen,
                                    },
                                ),
                            );
                            t.stats.leases += 1;
                            Some(Lease {
                                deadline,
                                timer,
                                gen,
                            })
                        }
                        _ => return Err(Invalid("dlock lease tag")),
                    };
                    if let Some(c) = t.conns.get_mut(&conn) {
                        c.held.insert(key.clone());
                    } else if lease.is_none() {
                        return Err(Invalid("dlock connection-bound key of no session"));
                    }
                    t.stats.held_keys += 1;
                    Some(Hold {
                        conn,
                        lease,
                        since_s,
                        token,
                    })
                }
                _ => return Err(Invalid("dlock holder tag")),
            };
            t.keys.insert(
                key,
                KeyState {
                    holder,
                    queue: BTreeSet::new(),
                },
            );
        }
        let n = r.count(6)?;
        let mut last_seq: Option<u64> = None;
        for _ in 0..n {
            let seq = r.u64()?;
            if last_seq.is_some_and(|l| l >= seq) || seq >= t.next_seq {
                return Err(Invalid("dlock waiters out of order"));
            }
            last_seq = Some(seq);
            let conn = ConnId::decode(r)?;
            let token = r.u64()?;
            let lease_us = r.opt_u64()?;
            let deadline = r.opt_u64()?;
            let nkeys = r.count(1)?;
            if nkeys == 0 {
                return Err(Invalid("dlock waiter with no keys"));
            }
            let mut keys: Vec<Box<[u8]>> = Vec::with_capacity(nkeys);
            for _ in 0..nkeys {
                let k = r.bytes(Self::MAX_KEY)?;
                if keys.iter().any(|o| **o == *k) {
                    return Err(Invalid("dlock waiter names a key twice"));
                }
                keys.push(k.into());
            }
            match t.conns.get_mut(&conn) {
                Some(c) if c.pending.is_none() => c.pending = Some(seq),
                _ => return Err(Invalid("dlock waiter of no session or a second one")),
            }
            for k in &keys {
                t.keys.entry_ref(&**k).or_default().queue.insert(seq);
            }
            let timer = deadline.map(|d| t.wheel.insert(d, (d, Timer::Wait { seq })));
            t.waiters.insert(
                seq,
                Waiter {
                    conn,
                    token,
                    keys: keys.into_boxed_slice(),
                    lease_us,
                    deadline,
                    timer,
                },
            );
        }
        if t.keys
            .values()
            .any(|s| s.holder.is_none() && s.queue.is_empty())
        {
            return Err(Invalid("dlock key with neither holder nor waiter"));
        }
        if t.waiters.keys().any(|&seq| t.grantable(seq)) {
            return Err(Invalid("dlock waiter that could be granted"));
        }
        // Idle timers: armed for every session with no Lock pending, at its last activity plus
        // the timeout (an original armed earlier fires, finds the session active, re-arms: the
        // same outcome).
        let idle = t.config.idle_timeout_ms;
        if idle > 0 {
            let ids: Vec<ConnId> = t.conns.keys().copied().collect();
            for conn in ids {
                if let Some(c) = t.conns.get_mut(&conn) {
                    if c.pending.is_none() {
                        let due = c.last_active.saturating_add(idle);
                        c.idle_timer = Some(t.wheel.insert(due, (due, Timer::Idle { conn })));
                    }
                }
            }
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wheel promises a wake-up time no later than the earliest deadline (a hierarchical
    /// wheel may name an earlier cascade point); the tests of firing times check the rest.
    #[track_caller]
    fn assert_next_deadline_by(next: Option<u64>, deadline: u64) {
        assert!(
            matches!(next, Some(d) if d <= deadline),
            "next_deadline {next:?} is not by {deadline}"
        );
    }

    fn c(n: u32) -> ConnId {
        ConnId::new(0, n, 0)
    }

    fn table(idle_timeout_ms: u64) -> DlockTable {
        DlockTable::new(DlockConfig { idle_timeout_ms }, 0)
    }

    fn boxed(keys: &[&[u8]]) -> Vec<Box<[u8]>> {
        keys.iter().map(|k| Box::from(*k)).collect()
    }

    /// Lock that is expected to be answered at once or to wait, with no side events.
    fn lock(
        t: &mut DlockTable,
        conn: ConnId,
        keys: &[&[u8]],
        wait_us: Option<u64>,
        lease_us: Option<u64>,
        now: u64,
    ) -> LockResult {
        let mut ev = Vec::new();
        let r = t.lock(conn, 0, keys, wait_us, lease_us, now, &mut ev);
        assert_eq!(ev, []);
        t.check_invariants();
        r
    }

    fn advance(t: &mut DlockTable, now: u64) -> Vec<DlockEvent> {
        let mut ev = Vec::new();
        t.advance(now, &mut ev);
        t.check_invariants();
        ev
    }

    fn unlock(t: &mut DlockTable, conn: ConnId, keys: &[&[u8]], now: u64) -> Vec<DlockEvent> {
        let mut ev = Vec::new();
        assert_eq!(t.unlock(conn, keys, now, &mut ev), Ok(()));
        t.check_invariants();
        ev
    }

    fn granted(conn: ConnId) -> DlockEvent {
        DlockEvent::Granted {
            conn,
            token: 0,
            fence: 0,
        }
    }

    /// Events with their fencing tokens blanked, for comparing with [`granted`] (the tokens are
    /// checked by the fencing tests).
    fn unfenced(ev: &[DlockEvent]) -> Vec<DlockEvent> {
        ev.iter()
            .map(|e| match e {
                DlockEvent::Granted { conn, token, .. } => DlockEvent::Granted {
                    conn: *conn,
                    token: *token,
                    fence: 0,
                },
                DlockEvent::TimedOut { conn, token, busy } => DlockEvent::TimedOut {
                    conn: *conn,
                    token: *token,
                    busy: busy.clone(),
                },
                DlockEvent::Idle { conn } => DlockEvent::Idle { conn: *conn },
            })
            .collect()
    }

    #[test]
    fn queue_and_held_since_show_the_holder_and_its_waiters_in_order() {
        let mut t = table(0);
        lock(&mut t, c(1), &[b"k"], None, None, 5_300);
        lock(&mut t, c(2), &[b"k"], None, None, 6_000);
        lock(&mut t, c(3), &[b"k"], None, None, 7_000);
        assert_eq!(t.held_since(b"k"), Some(5_000), "whole seconds");
        assert_eq!(t.queue(b"k").collect::<Vec<_>>(), [c(2), c(3)]);
        assert_eq!(t.held_since(b"free"), None);
        assert_eq!(t.queue(b"free").count(), 0);
        // The next holder's time is its grant, not its request.
        unlock(&mut t, c(1), &[b"k"], 9_999);
        assert_eq!(t.held_since(b"k"), Some(9_000));
        assert_eq!(t.queue(b"k").collect::<Vec<_>>(), [c(3)]);
    }

    #[test]
    fn lock_is_all_or_nothing() {
        let mut t = table(0);
        assert_eq!(
            lock(&mut t, c(1), &[b"b"], None, None, 0),
            LockResult::Granted
        );
        assert_eq!(
            lock(&mut t, c(2), &[b"a", b"b"], Some(0), None, 0),
            LockResult::Timeout {
                busy: boxed(&[b"b"])
            }
        );
        assert_eq!(t.holder(b"a"), None);
        assert_eq!(
            lock(&mut t, c(2), &[b"a", b"b"], None, None, 0),
            LockResult::Waiting
        );
        assert_eq!(t.holder(b"a"), None, "a waiter holds no partial set");
        assert_eq!(unfenced(&unlock(&mut t, c(1), &[b"b"], 1)), [granted(c(2))]);
        assert_eq!(t.holder(b"a"), Some((c(2), None)));
        assert_eq!(t.holder(b"b"), Some((c(2), None)));
    }

    #[test]
    fn relock_by_holder_replaces_lease_with_connection_bound_and_back() {
        let mut t = table(0);
        assert_eq!(
            lock(&mut t, c(1), &[b"a"], Some(0), Some(5000), 0),
            LockResult::Granted
        );
        assert_eq!(t.holder(b"a"), Some((c(1), Some(5))));
        assert_eq!(
            lock(&mut t, c(1), &[b"a"], Some(0), None, 1),
            LockResult::Granted
        );
        assert_eq!(t.holder(b"a"), Some((c(1), None)));
        assert_eq!(advance(&mut t, 10), []);
        assert_eq!(
            t.holder(b"a"),
            Some((c(1), None)),
            "the old lease timer was cancelled"
        );
        assert_eq!(
            lock(&mut t, c(1), &[b"a"], Some(0), Some(2001), 10),
            LockResult::Granted
        );
        assert_eq!(t.holder(b"a"), Some((c(1), Some(13))));
        assert_eq!(t.stats().leases, 1);
        assert_eq!(advance(&mut t, 12), []);
        assert_eq!(advance(&mut t, 13), []);
        assert_eq!(t.holder(b"a"), None);
        assert_eq!(t.stats().lease_expiries, 1);
        assert_eq!(t.stats().held_keys, 0);
    }

    /// The sequence behind the soak's one "DOUBLE GRANT" (a lease released ~100 ms before its
    /// deadline): the holder of a lease re-locks the key together with a busy one, without a
    /// lease, and closes while that Lock waits; granted just before the close, the re-lock made
    /// the key connection-bound, so the close releases it at once. Contract: "a re-lock replaces
    /// the old record"; "Absent or 0: held until the connection closes or Unlock".
    #[test]
    fn waiting_relock_granted_before_a_close_ends_the_lease_with_the_connection() {
        let mut t = table(0);
        lock(&mut t, c(1), &[b"k"], None, Some(200_000), 0);
        lock(&mut t, c(2), &[b"busy"], None, None, 0);
        assert_eq!(
            lock(&mut t, c(1), &[b"k", b"busy"], None, None, 10),
            LockResult::Waiting
        );
        assert_eq!(
            lock(&mut t, c(3), &[b"k"], None, None, 20),
            LockResult::Waiting
        );
        assert_eq!(
            unfenced(&unlock(&mut t, c(2), &[b"busy"], 50)),
            [granted(c(1))]
        );
        assert_eq!(t.holder(b"k"), Some((c(1), None)), "no longer a lease");
        let mut ev = Vec::new();
        t.disconnect(c(1), 60, &mut ev);
        t.check_invariants();
        assert_eq!(
            unfenced(&ev),
            [granted(c(3))],
            "140 ms before the old deadline"
        );
        assert_eq!(t.holder(b"k"), Some((c(3), None)));
    }

    /// The same with a shorter lease on the re-lock: the new lease counts from its grant and
    /// replaces the longer one.
    #[test]
    fn waiting_relock_with_a_shorter_lease_replaces_the_longer_one() {
        let mut t = table(0);
        lock(&mut t, c(1), &[b"k"], None, Some(500_000), 0);
        lock(&mut t, c(2), &[b"busy"], None, None, 0);
        assert_eq!(
            lock(&mut t, c(1), &[b"k", b"busy"], None, Some(50_000), 10),
            LockResult::Waiting
        );
        lock(&mut t, c(3), &[b"k"], None, None, 20);
        assert_eq!(
            unfenced(&unlock(&mut t, c(2), &[b"busy"], 30)),
            [granted(c(1))]
        );
        assert_eq!(t.holder(b"k"), Some((c(1), Some(80))));
        let mut ev = Vec::new();
        t.disconnect(c(1), 31, &mut ev);
        assert_eq!(ev, [], "a lease survives the close");
        assert_eq!(advance(&mut t, 79), []);
        assert_eq!(unfenced(&advance(&mut t, 80)), [granted(c(3))]);
    }

    #[test]
    fn relock_replaces_only_the_records_of_the_keys_it_names() {
        let mut t = table(0);
        lock(&mut t, c(1), &[b"a", b"b"], None, Some(10_000), 0);
        lock(&mut t, c(1), &[b"b"], None, Some(0), 1);
        assert_eq!(t.holder(b"a"), Some((c(1), Some(10))));
        assert_eq!(t.holder(b"b"), Some((c(1), None)));
        assert_eq!(t.stats().leases, 1);
    }

    #[test]
    fn relock_of_own_key_is_granted_even_with_others_queued_on_it() {
        let mut t = table(0);
        lock(&mut t, c(1), &[b"a"], None, None, 0);
        assert_eq!(
            lock(&mut t, c(2), &[b"a"], None, None, 0),
            LockResult::Waiting
        );
        assert_eq!(
            lock(&mut t, c(1), &[b"a"], Some(0), None, 0),
            LockResult::Granted
        );
        // Holding `a` while waiting for `b` too: `a` does not block its own holder.
        lock(&mut t, c(3), &[b"b"], None, None, 0);
        assert_eq!(
            lock(&mut t, c(1), &[b"a", b"b"], None, None, 0),
            LockResult::Waiting
        );
        assert_eq!(unfenced(&unlock(&mut t, c(3), &[b"b"], 1)), [granted(c(1))]);
        assert_eq!(
            unfenced(&unlock(&mut t, c(1), &[b"a", b"b"], 2)),
            [granted(c(2))]
        );
    }

    #[test]
    fn duplicate_keys_in_one_request_are_one_key() {
        let mut t = table(0);
        assert_eq!(
            lock(&mut t, c(1), &[b"a", b"a"], None, None, 0),
            LockResult::Granted
        );
        assert_eq!(t.stats().held_keys, 1);
        assert_eq!(
            lock(&mut t, c(2), &[b"a", b"b", b"a"], Some(0), None, 0),
            LockResult::Timeout {
                busy: boxed(&[b"a"])
            }
        );
        assert_eq!(unlock(&mut t, c(1), &[b"a", b"a"], 0), []);
        // Above the small-set threshold the hash-set path dedupes the same way.
        let many: Vec<Vec<u8>> = (0..40).map(|i| vec![i % 20]).collect();
        let many: Vec<&[u8]> = many.iter().map(Vec::as_slice).collect();
        assert_eq!(
            lock(&mut t, c(1), &many, None, None, 0),
            LockResult::Granted
        );
        assert_eq!(t.stats().held_keys, 20);
    }

    #[test]
    fn try_once_fails_on_keys_held_by_others_or_queued_for() {
        let mut t = table(0);
        lock(&mut t, c(1), &[b"a"], None, None, 0);
        // c2 waits for {b, a}: b is free but now queued for.
        assert_eq!(
            lock(&mut t, c(2), &[b"b", b"a"], None, None, 0),
            LockResult::Waiting
        );
        assert_eq!(
            lock(&mut t, c(3), &[b"c", b"b", b"a"], Some(0), None, 0),
            LockResult::Timeout {
                busy: boxed(&[b"b", b"a"])
            }
        );
        assert_eq!(t.holder(b"c"), None);
        assert_eq!(t.stats().timeouts, 1);
        assert_eq!(t.stats().waiting, 1);
    }

    #[test]
    fn wait_deadline_fires_exactly_at_deadline_not_before() {
        let mut t = table(0);
        lock(&mut t, c(1), &[b"a"], None, None, 0);
        let mut ev = Vec::new();
        assert_eq!(
            t.lock(c(2), 7, &[b"a", b"b"], Some(2500), None, 10, &mut ev),
            LockResult::Waiting
        );
        assert_next_deadline_by(t.next_deadline(), 13);
        assert_eq!(advance(&mut t, 12), []);
        assert_eq!(
            advance(&mut t, 13),
            [DlockEvent::TimedOut {
                conn: c(2),
                token: 7,
                busy: boxed(&[b"a"])
            }]
        );
        assert_eq!(t.holder(b"b"), None);
        assert_eq!(t.stats().waiting, 0);
        assert_eq!(t.next_deadline(), None);
    }

    #[test]
    fn wait_of_one_microsecond_rounds_up_to_one_millisecond() {
        let mut t = table(0);
        lock(&mut t, c(1), &[b"a"], None, None, 0);
        lock(&mut t, c(2), &[b"a"], Some(1), None, 5);
        assert_eq!(advance(&mut t, 5), []);
        assert_eq!(advance(&mut t, 6).len(), 1);
    }

    #[test]
    fn multi_key_requests_in_opposite_key_orders_do_not_deadlock() {
        let mut t = table(0);
        // Both free: the first wins, the second waits holding nothing.
        assert_eq!(
            lock(&mut t, c(1), &[b"a", b"b"], None, None, 0),
            LockResult::Granted
        );
        assert_eq!(
            lock(&mut t, c(2), &[b"b", b"a"], None, None, 0),
            LockResult::Waiting
        );
        assert_eq!(
            unfenced(&unlock(&mut t, c(1), &[b"a", b"b"], 1)),
            [granted(c(2))]
        );
        unlock(&mut t, c(2), &[b"a", b"b"], 1);
        // Held by two others; waiters in both orders.
        lock(&mut t, c(3), &[b"a"], None, None, 2);
        lock(&mut t, c(4), &[b"b"], None, None, 2);
        assert_eq!(
            lock(&mut t, c(1), &[b"a", b"b"], None, None, 2),
            LockResult::Waiting
        );
        assert_eq!(
            lock(&mut t, c(2), &[b"b", b"a"], None, None, 2),
            LockResult::Waiting
        );
        assert_eq!(unlock(&mut t, c(3), &[b"a"], 3), []);
        assert_eq!(t.holder(b"a"), None, "nobody takes a partial set");
        assert_eq!(unfenced(&unlock(&mut t, c(4), &[b"b"], 4)), [granted(c(1))]);
        assert_eq!(
            unfenced(&unlock(&mut t, c(1), &[b"b", b"a"], 5)),
            [granted(c(2))]
        );
    }

    #[test]
    fn multi_key_waiter_is_not_overtaken_by_later_single_key_requests() {
        let mut t = table(0);
        lock(&mut t, c(1), &[b"a"], None, None, 0);
        assert_eq!(
            lock(&mut t, c(2), &[b"a", b"b"], None, None, 0),
            LockResult::Waiting
        );
        // b is free, but c2 queued for it first.
        assert_eq!(
            lock(&mut t, c(3), &[b"b"], Some(0), None, 0),
            LockResult::Timeout {
                busy: boxed(&[b"b"])
            }
        );
        assert_eq!(
            lock(&mut t, c(3), &[b"b"], None, None, 0),
            LockResult::Waiting
        );
        assert_eq!(
            lock(&mut t, c(4), &[b"b"], None, None, 0),
            LockResult::Waiting
        );
        assert_eq!(unfenced(&unlock(&mut t, c(1), &[b"a"], 1)), [granted(c(2))]);
        assert_eq!(
            unfenced(&unlock(&mut t, c(2), &[b"a", b"b"], 2)),
            [granted(c(3))]
        );
        assert_eq!(t.queue_conns(b"b"), [c(4)]);
    }

    #[test]
    fn lease_expiry_wakes_the_waiter_at_the_lease_deadline_exactly() {
        let mut t = table(0);
        assert_eq!(
            lock(&mut t, c(1), &[b"a"], None, Some(10_000), 0),
            LockResult::Granted
        );
        assert_eq!(
            lock(&mut t, c(2), &[b"a"], None, Some(5_000), 1),
            LockResult::Waiting
        );
        assert_next_deadline_by(t.next_deadline(), 10);
        assert_eq!(advance(&mut t, 9), []);
        assert_eq!(unfenced(&advance(&mut t, 10)), [granted(c(2))]);
        // The new lease counts from the grant.
        assert_eq!(t.holder(b"a"), Some((c(2), Some(15))));
    }

    #[test]
    fn key_freed_exactly_at_the_wait_deadline_goes_to_the_waiter() {
        let mut t = table(0);
        lock(&mut t, c(1), &[b"a"], None, Some(10_000), 0);
        lock(&mut t, c(2), &[b"a"], Some(10_000), None, 0);
        assert_eq!(unfenced(&advance(&mut t, 50)), [granted(c(2))]);
    }

    #[test]
    fn lock_expires_due_leases_before_looking_at_its_keys() {
        let mut t = table(0);
        lock(&mut t, c(1), &[b"a"], None, Some(10_000), 0);
        // No advance by the caller: the lock itself runs the due timer.
        assert_eq!(
            lock(&mut t, c(2), &[b"a"], Some(0), None, 10),
            LockResult::Granted
        );
    }

    #[test]
    fn leases_survive_disconnect_and_expire_on_time() {
        let mut t = table(0);
        lock(&mut t, c(1), &[b"a"], None, Some(50_000), 0);
        lock(&mut t, c(1), &[b"b"], None, None, 0);
        assert_eq!(
            lock(&mut t, c(2), &[b"a", b"b"], None, None, 1),
            LockResult::Waiting
        );
        let mut ev = Vec::new();
        t.disconnect(c(1), 2, &mut ev);
        assert_eq!(ev, []);
        t.check_invariants();
        assert_eq!(t.holder(b"a"), Some((c(1), Some(50))));
        assert_eq!(t.holder(b"b"), None);
        assert_eq!(advance(&mut t, 49), []);
        assert_eq!(unfenced(&advance(&mut t, 50)), [granted(c(2))]);
    }

    #[test]
    fn idle_connection_loses_its_connection_bound_locks_but_not_its_leases() {
        let mut t = table(100);
        t.connect(c(1), 0);
        lock(&mut t, c(1), &[b"a"], None, None, 0);
        lock(&mut t, c(1), &[b"b"], None, Some(500_000), 0);
        assert_eq!(advance(&mut t, 99), []);
        assert_eq!(advance(&mut t, 100), [DlockEvent::Idle { conn: c(1) }]);
        assert_eq!(t.holder(b"a"), None);
        assert_eq!(t.holder(b"b"), Some((c(1), Some(500))));
        assert_eq!(t.stats().idle_disconnects, 1);
        // The daemon closes it; the disconnect finds nothing left.
        let mut ev = Vec::new();
        t.disconnect(c(1), 101, &mut ev);
        assert_eq!(ev, []);
    }

    #[test]
    fn touches_postpone_the_idle_timeout() {
        let mut t = table(100);
        t.connect(c(1), 0);
        t.touch(c(1), 50);
        assert_eq!(advance(&mut t, 100), []);
        t.touch(c(1), 120);
        assert_eq!(advance(&mut t, 219), []);
        assert_eq!(advance(&mut t, 220), [DlockEvent::Idle { conn: c(1) }]);
    }

    #[test]
    fn pending_lock_is_not_idle_and_the_idle_clock_restarts_when_it_finishes() {
        let mut t = table(100);
        t.connect(c(1), 0);
        t.connect(c(2), 0);
        lock(&mut t, c(1), &[b"a"], None, Some(300_000), 0);
        assert_eq!(
            lock(&mut t, c(2), &[b"a"], None, None, 0),
            LockResult::Waiting
        );
        assert_eq!(advance(&mut t, 100), [DlockEvent::Idle { conn: c(1) }]);
        assert_eq!(advance(&mut t, 299), []);
        assert_eq!(unfenced(&advance(&mut t, 300)), [granted(c(2))]);
        assert_eq!(advance(&mut t, 399), []);
        assert_eq!(advance(&mut t, 400), [DlockEvent::Idle { conn: c(2) }]);
        assert_eq!(t.holder(b"a"), None);
        // Same after a wait deadline.
        lock(&mut t, c(3), &[b"k"], None, Some(1_000_000), 400);
        lock(&mut t, c(4), &[b"k"], Some(50_000), None, 400);
        let ev = advance(&mut t, 500);
        assert_eq!(ev.len(), 2); // c3 idle at 500 (lease stays); c4 timed out at 450
        assert_eq!(advance(&mut t, 549), []);
        assert_eq!(advance(&mut t, 550), [DlockEvent::Idle { conn: c(4) }]);
    }

    #[test]
    fn touch_newer_than_a_deadline_run_late_keeps_the_idle_clock() {
        // Regression (model test, seed 3): the model restarted the idle clock at a wait deadline
        // run after a newer touch, moving it backwards; the clock only ever moves forwards.
        let mut t = table(100);
        t.connect(c(1), 0);
        lock(&mut t, c(1), &[b"a"], None, None, 0);
        lock(&mut t, c(2), &[b"a"], Some(10_000), None, 0);
        t.touch(c(2), 50);
        assert_eq!(advance(&mut t, 50).len(), 1); // timed out at 10
        assert_eq!(advance(&mut t, 149), [DlockEvent::Idle { conn: c(1) }]);
        assert_eq!(advance(&mut t, 150), [DlockEvent::Idle { conn: c(2) }]);
    }

    #[test]
    fn idle_timeout_zero_disables_idle_disconnects() {
        let mut t = table(0);
        t.connect(c(1), 0);
        lock(&mut t, c(1), &[b"a"], None, None, 0);
        assert_eq!(t.next_deadline(), None);
        assert_eq!(advance(&mut t, u64::MAX / 2), []);
        assert_eq!(t.holder(b"a"), Some((c(1), None)));
    }

    #[test]
    fn disconnecting_waiter_lets_the_next_waiter_through() {
        let mut t = table(0);
        lock(&mut t, c(1), &[b"a"], None, None, 0);
        assert_eq!(
            lock(&mut t, c(2), &[b"a", b"b"], None, None, 0),
            LockResult::Waiting
        );
        assert_eq!(
            lock(&mut t, c(3), &[b"b"], None, None, 0),
            LockResult::Waiting
        );
        let mut ev = Vec::new();
        t.disconnect(c(2), 1, &mut ev);
        assert_eq!(unfenced(&ev), [granted(c(3))]);
        t.check_invariants();
        assert_eq!(t.queue_conns(b"a"), []);
    }

    #[test]
    fn timed_out_waiter_lets_the_next_waiter_through() {
        let mut t = table(0);
        lock(&mut t, c(1), &[b"a"], None, None, 0);
        lock(&mut t, c(2), &[b"a", b"b"], Some(5_000), None, 0);
        lock(&mut t, c(3), &[b"b"], None, None, 0);
        let ev = advance(&mut t, 5);
        assert_eq!(
            unfenced(&ev),
            [
                DlockEvent::TimedOut {
                    conn: c(2),
                    token: 0,
                    busy: boxed(&[b"a"])
                },
                granted(c(3))
            ]
        );
    }

    #[test]
    fn waiters_timing_out_at_one_instant_go_in_arrival_order() {
        // c3 waits behind c2 on b; both deadlines at 5. c2 leaves first, which frees b for c3
        // at its very deadline: granted, not timed out.
        let mut t = table(0);
        lock(&mut t, c(1), &[b"a"], None, None, 0);
        lock(&mut t, c(2), &[b"a", b"b"], Some(5_000), None, 0);
        lock(&mut t, c(3), &[b"b"], Some(5_000), None, 0);
        let ev = advance(&mut t, 100);
        assert_eq!(ev.len(), 2);
        assert_eq!(unfenced(&ev)[1], granted(c(3)));
    }

    #[test]
    fn unlock_of_keys_not_held_reports_them_and_releases_the_rest() {
        let mut t = table(0);
        lock(&mut t, c(1), &[b"a"], None, Some(1_000_000), 0);
        lock(&mut t, c(2), &[b"b"], None, None, 0);
        let mut ev = Vec::new();
        assert_eq!(
            t.unlock(c(1), &[b"a", b"b", b"c", b"b"], 1, &mut ev),
            Err(boxed(&[b"b", b"c"]))
        );
        t.check_invariants();
        assert_eq!(t.holder(b"a"), None, "the lease is released too");
        assert_eq!(t.holder(b"b"), Some((c(2), None)));
        assert_eq!(t.next_deadline(), None);
    }

    #[test]
    fn stats_count_holders_leases_waiters_and_outcomes() {
        let mut t = table(10);
        t.connect(c(1), 0);
        lock(&mut t, c(1), &[b"a", b"b"], None, Some(20_000), 0);
        lock(&mut t, c(2), &[b"a"], Some(0), None, 0);
        lock(&mut t, c(2), &[b"a"], None, None, 0);
        assert_eq!(
            t.stats(),
            DlockStats {
                held_keys: 2,
                leases: 2,
                waiting: 1,
                grants: 1,
                timeouts: 1,
                lease_expiries: 0,
                idle_disconnects: 0,
            }
        );
        advance(&mut t, 20);
        assert_eq!(
            t.stats(),
            DlockStats {
                held_keys: 1,
                leases: 0,
                waiting: 0,
                grants: 2,
                timeouts: 1,
                lease_expiries: 2,
                idle_disconnects: 1,
            }
        );
    }

    /// A naive model of the contract: waiters in a Vec in arrival order, re-scanned from the
    /// start after every change; time walked one millisecond at a time.
    mod model {
        use super::super::*;
        use std::collections::BTreeMap;

        struct MWaiter {
            conn: ConnId,
            token: u64,
            keys: Vec<Vec<u8>>,
            deadline: Option<u64>,
            lease_ms: Option<u64>,
        }

        struct MConn {
            last_active: u64,
            pending: bool,
        }

        pub struct Model {
            idle: u64,
            now: u64,
            /// key -> (holder, lease deadline)
            pub holders: BTreeMap<Vec<u8>, (ConnId, Option<u64>)>,
            waiters: Vec<MWaiter>,
            conns: BTreeMap<ConnId, MConn>,
        }

        fn dedup(keys: &[&[u8]]) -> Vec<Vec<u8>> {
            let mut out: Vec<Vec<u8>> = Vec::new();
            for k in keys {
                if !out.iter().any(|o| o == k) {
                    out.push(k.to_vec());
                }
            }
            out
        }

        fn ms(us: Option<u64>) -> Option<u64> {
            us.filter(|&u| u > 0).map(|u| u.div_ceil(1000))
        }

        impl Model {
            pub fn new(idle: u64) -> Self {
                Model {
                    idle,
                    now: 0,
                    holders: BTreeMap::new(),
                    waiters: Vec::new(),
                    conns: BTreeMap::new(),
                }
            }

            pub fn queue(&self, key: &[u8]) -> Vec<ConnId> {
                self.waiters
                    .iter()
                    .filter(|w| w.keys.iter().any(|k| k == key))
                    .map(|w| w.conn)
                    .collect()
            }

            pub fn waiting(&self) -> usize {
                self.waiters.len()
            }

            pub fn finite_waiters(&self) -> usize {
                self.waiters.iter().filter(|w| w.deadline.is_some()).count()
            }

            pub fn touch(&mut self, conn: ConnId, now: u64) {
                let c = self.conns.entry(conn).or_insert(MConn {
                    last_active: now,
                    pending: false,
                });
                c.last_active = c.last_active.max(now);
            }

            fn busy(&self, i: usize, key: &[u8]) -> bool {
                let w = &self.waiters[i];
                match self.holders.get(key) {
                    Some((h, _)) => *h != w.conn,
                    None => self.waiters[..i]
                        .iter()
                        .any(|e| e.keys.iter().any(|k| k == key)),
                }
            }

            fn settle(&mut self, t: u64, ev: &mut Vec<DlockEvent>) {
                while let Some(i) = (0..self.waiters.len())
                    .find(|&i| self.waiters[i].keys.iter().all(|k| !self.busy(i, k)))
                {
                    let w = self.waiters.remove(i);
                    for k in &w.keys {
                        self.holders
                            .insert(k.clone(), (w.conn, w.lease_ms.map(|l| t + l)));
                    }
                    let c = self.conns.get_mut(&w.conn).expect("waiter's conn");
                    c.pending = false;
                    // A touch may be newer than a deadline the table runs late.
                    c.last_active = c.last_active.max(t);
                    ev.push(DlockEvent::Granted {
                        conn: w.conn,
                        token: w.token,
                        fence: 0,
                    });
                }
            }

            fn release_bound(&mut self, conn: ConnId) {
                self.holders
                    .retain(|_, (h, lease)| !(*h == conn && lease.is_none()));
            }

            fn instant(&mut self, t: u64, ev: &mut Vec<DlockEvent>) {
                self.holders
                    .retain(|_, (_, lease)| lease.is_none_or(|d| d > t));
                let idle: Vec<ConnId> = self
                    .conns
                    .iter()
                    .filter(|(_, c)| self.idle > 0 && !c.pending && c.last_active + self.idle <= t)
                    .map(|(id, _)| *id)
                    .collect();
                for conn in idle {
                    self.release_bound(conn);
                    self.conns.remove(&conn);
                    ev.push(DlockEvent::Idle { conn });
                }
                self.settle(t, ev);
                while let Some(i) = self
                    .waiters
                    .iter()
                    .position(|w| w.deadline.is_some_and(|d| d <= t))
                {
                    let busy = self.waiters[i]
                        .keys
                        .iter()
                        .filter(|k| self.busy(i, k))
                        .map(|k| k.clone().into_boxed_slice())
                        .collect();
                    let w = self.waiters.remove(i);
                    let c = self.conns.get_mut(&w.conn).expect("waiter's conn");
                    c.pending = false;
                    // A touch may be newer than a deadline the table runs late.
                    c.last_active = c.last_active.max(t);
                    ev.push(DlockEvent::TimedOut {
                        conn: w.conn,
                        token: w.token,
                        busy,
                    });
                    self.settle(t, ev);
                }
            }

            pub fn advance(&mut self, to: u64, ev: &mut Vec<DlockEvent>) {
                while self.now < to {
                    self.now += 1;
                    self.instant(self.now, ev);
                }
            }

            #[allow(clippy::too_many_arguments)]
            pub fn lock(
                &mut self,
                conn: ConnId,
                token: u64,
                keys: &[&[u8]],
                wait_us: Option<u64>,
                lease_us: Option<u64>,
                now: u64,
                ev: &mut Vec<DlockEvent>,
            ) -> LockResult {
                self.touch(conn, now);
                self.advance(now, ev);
                let keys = dedup(keys);
                self.waiters.push(MWaiter {
                    conn,
                    token,
                    keys,
                    deadline: ms(wait_us).map(|w| now + w),
                    lease_ms: ms(lease_us),
                });
                let i = self.waiters.len() - 1;
                let busy: Vec<Box<[u8]>> = self.waiters[i]
                    .keys
                    .iter()
                    .filter(|k| self.busy(i, k))
                    .map(|k| k.clone().into_boxed_slice())
                    .collect();
                if busy.is_empty() {
                    let w = self.waiters.pop().expect("just pushed");
                    for k in w.keys {
                        self.holders.insert(k, (conn, w.lease_ms.map(|l| now + l)));
                    }
                    LockResult::Granted
                } else if wait_us == Some(0) {
                    self.waiters.pop();
                    LockResult::Timeout { busy }
                } else {
                    self.conns.get_mut(&conn).expect("touched").pending = true;
                    LockResult::Waiting
                }
            }

            pub fn unlock(
                &mut self,
                conn: ConnId,
                keys: &[&[u8]],
                now: u64,
                ev: &mut Vec<DlockEvent>,
            ) -> Result<(), Vec<Box<[u8]>>> {
                self.touch(conn, now);
                self.advance(now, ev);
                let mut not_held = Vec::new();
                for k in dedup(keys) {
                    if self.holders.get(&k).is_some_and(|(h, _)| *h == conn) {
                        self.holders.remove(&k);
                    } else {
                        not_held.push(k.into_boxed_slice());
                    }
                }
                self.settle(now, ev);
                if not_held.is_empty() {
                    Ok(())
                } else {
                    Err(not_held)
                }
            }

            pub fn disconnect(&mut self, conn: ConnId, now: u64, ev: &mut Vec<DlockEvent>) {
                self.advance(now, ev);
                if self.conns.remove(&conn).is_none() {
                    return;
                }
                self.waiters.retain(|w| w.conn != conn);
                self.release_bound(conn);
                self.settle(now, ev);
            }
        }
    }

    use crate::rng::Rng as XorShift;

    const KEY_SPACE: [&[u8]; 6] = [b"k0", b"k1", b"k2", b"k3", b"k4", b"k5"];

    /// Events of one call, in a canonical order (several grants at one instant may come out in
    /// any order; which ones and at which time is what matters).
    fn canon(ev: Vec<DlockEvent>) -> Vec<String> {
        let mut out: Vec<String> = super::tests::unfenced(&ev)
            .iter()
            .map(|e| format!("{e:?}"))
            .collect();
        out.sort();
        out
    }

    fn compare(t: &DlockTable, m: &model::Model, ctx: &str) {
        t.check_invariants();
        for k in KEY_SPACE {
            assert_eq!(
                t.holder(k),
                m.holders.get(k).copied(),
                "holder of {k:?}; {ctx}"
            );
            assert_eq!(t.queue_conns(k), m.queue(k), "queue of {k:?}; {ctx}");
        }
        let s = t.stats();
        assert_eq!(s.held_keys, m.holders.len() as u64, "{ctx}");
        assert_eq!(
            s.leases,
            m.holders.values().filter(|h| h.1.is_some()).count() as u64,
            "{ctx}"
        );
        assert_eq!(s.waiting, m.waiting() as u64, "{ctx}");
    }

    fn run_model(seed: u64, steps: usize, idle: u64) {
        run_model_restoring(seed, steps, idle, None)
    }

    /// With `restore_every`, the table is replaced by a restored copy of its snapshot every that
    /// many steps and must go on matching the model exactly, events in the same order.
    fn run_model_restoring(seed: u64, steps: usize, idle: u64, restore_every: Option<usize>) {
        let mut rng = XorShift(seed);
        let mut t = table(idle);
        let mut m = model::Model::new(idle);
        let mut now = 0u64;
        let mut live: Vec<ConnId> = Vec::new();
        // conn -> token of its waiting Lock
        let mut pending: hashbrown::HashMap<ConnId, u64> = hashbrown::HashMap::new();
        let mut next_slot = 0u32;
        let mut next_token = 0u64;
        let (mut ev_t, mut ev_m) = (Vec::new(), Vec::new());

        let settle_events =
            |ev: &[DlockEvent],
             live: &mut Vec<ConnId>,
             pending: &mut hashbrown::HashMap<ConnId, u64>| {
                for e in ev {
                    match e {
                        DlockEvent::Granted { conn, token, .. }
                        | DlockEvent::TimedOut { conn, token, .. } => {
                            assert_eq!(pending.remove(conn), Some(*token), "answer without a wait");
                        }
                        DlockEvent::Idle { conn } => {
                            assert!(!pending.contains_key(conn), "idle while waiting");
                            live.retain(|c| c != conn);
                        }
                    }
                }
            };

        for step in 0..steps {
            if rng.chance(30) {
                now += rng.below(4);
            }
            let ctx = format!("seed {seed} step {step} now {now}");
            let op = rng.below(100);
            let idle_conns: Vec<ConnId> = live
                .iter()
                .copied()
                .filter(|c| !pending.contains_key(c))
                .collect();
            let random_keys = |rng: &mut XorShift, max: u64| -> Vec<&'static [u8]> {
                (0..1 + rng.below(max))
                    .map(|_| KEY_SPACE[rng.below(KEY_SPACE.len() as u64) as usize])
                    .collect()
            };
            if op < 8 || live.is_empty() {
                if live.len() < 12 {
                    let conn = ConnId::new(0, next_slot % 16, next_slot);
                    next_slot += 1;
                    t.connect(conn, now);
                    m.touch(conn, now);
                    live.push(conn);
                }
            } else if op < 50 {
                if idle_conns.is_empty() {
                    continue;
                }
                let conn = idle_conns[rng.below(idle_conns.len() as u64) as usize];
                let keys = random_keys(&mut rng, 4);
                let wait = match rng.below(10) {
                    0 | 1 => None,
                    2..=4 => Some(0),
                    _ => Some(rng.below(30_000)),
                };
                let lease = match rng.below(10) {
                    0..=3 => None,
                    4 => Some(0),
                    _ => Some(1 + rng.below(40_000)),
                };
                next_token += 1;
                let rt = t.lock(conn, next_token, &keys, wait, lease, now, &mut ev_t);
                let rm = m.lock(conn, next_token, &keys, wait, lease, now, &mut ev_m);
                assert_eq!(rt, rm, "lock {keys:?} {wait:?} {lease:?}; {ctx}");
                if rt == LockResult::Waiting {
                    pending.insert(conn, next_token);
                }
            } else if op < 62 {
                if idle_conns.is_empty() {
                    continue;
                }
                let conn = idle_conns[rng.below(idle_conns.len() as u64) as usize];
                // Mostly keys it holds (so that connection-bound locks come free), sometimes not.
                let mine: Vec<&'static [u8]> = KEY_SPACE
                    .into_iter()
                    .filter(|k| m.holders.get(*k).is_some_and(|h| h.0 == conn))
                    .collect();
                let mut keys: Vec<&[u8]> = mine.into_iter().filter(|_| rng.chance(70)).collect();
                if keys.is_empty() || rng.chance(20) {
                    keys.extend(random_keys(&mut rng, 3));
                }
                let rt = t.unlock(conn, &keys, now, &mut ev_t);
                let rm = m.unlock(conn, &keys, now, &mut ev_m);
                assert_eq!(rt, rm, "unlock {keys:?}; {ctx}");
            } else if op < 70 {
                let conn = live[rng.below(live.len() as u64) as usize];
                t.touch(conn, now);
                m.touch(conn, now);
            } else if op < 76 || (idle == 0 && op < 80) {
                let conn = live.remove(rng.below(live.len() as u64) as usize);
                t.disconnect(conn, now, &mut ev_t);
                m.disconnect(conn, now, &mut ev_m);
                // Its due timers ran first (maybe answering its Lock); then its waiter left.
                settle_events(&ev_t, &mut live, &mut pending);
                pending.remove(&conn);
                assert_eq!(canon(ev_t.split_off(0)), canon(ev_m.split_off(0)), "{ctx}");
            } else {
                now += if rng.chance(10) {
                    rng.below(200)
                } else {
                    rng.below(6)
                };
                t.advance(now, &mut ev_t);
                m.advance(now, &mut ev_m);
            }
            settle_events(&ev_t, &mut live, &mut pending);
            let idled: Vec<ConnId> = ev_t
                .iter()
                .filter_map(|e| match e {
                    DlockEvent::Idle { conn } => Some(*conn),
                    _ => None,
                })
                .collect();
            assert_eq!(
                canon(ev_t.split_off(0)),
                canon(ev_m.split_off(0)),
                "events; {ctx}"
            );
            // The daemon closes idle connections: that disconnect finds nothing.
            for conn in idled {
                t.disconnect(conn, now, &mut ev_t);
                m.disconnect(conn, now, &mut ev_m);
                assert_eq!(ev_t, []);
                assert_eq!(ev_m, []);
            }
            compare(&t, &m, &ctx);
            if restore_every.is_some_and(|n| step % n == n - 1) {
                let before = t.stats();
                t = crate::core::codec::testing::round_trip(
                    &t,
                    t.config,
                    seed ^ step as u64,
                    |c| c.check_invariants(),
                );
                assert_eq!(t.stats(), before);
            }
        }

        // Far past every finite deadline: whoever still waits waits without a deadline.
        now += 1_000_000;
        t.advance(now, &mut ev_t);
        m.advance(now, &mut ev_m);
        settle_events(&ev_t, &mut live, &mut pending);
        assert_eq!(canon(ev_t.split_off(0)), canon(ev_m.split_off(0)));
        compare(&t, &m, "end");
        assert_eq!(m.finite_waiters(), 0);

        // Everybody leaves: nothing but unexpired leases is held, and nobody waits.
        for conn in live.drain(..) {
            t.disconnect(conn, now, &mut ev_t);
            m.disconnect(conn, now, &mut ev_m);
        }
        assert_eq!(canon(ev_t.split_off(0)), canon(ev_m.split_off(0)));
        compare(&t, &m, "all disconnected");
        assert_eq!(t.stats().waiting, 0);
        assert!(m
            .holders
            .values()
            .all(|(_, lease)| lease.is_some_and(|d| d > now)));
        now += 1_000_000;
        t.advance(now, &mut ev_t);
        m.advance(now, &mut ev_m);
        assert_eq!(ev_t, []);
        compare(&t, &m, "all expired");
        assert_eq!(t.stats().held_keys, 0);
        assert!(t.keys.is_empty() && t.conns.is_empty() && t.waiters.is_empty());
        assert_eq!(t.next_deadline(), None);
        assert!(t.wheel.is_empty());
    }

    #[test]
    fn a_table_restored_from_its_snapshot_goes_on_exactly_like_the_original() {
        for seed in 21..=24u64 {
            let idle = if seed % 2 == 0 { 0 } else { 10 + 7 * seed };
            run_model_restoring(
                seed.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                10_000,
                idle,
                Some(31),
            );
        }
    }

    #[test]
    fn grants_after_a_disconnect_go_out_in_arrival_order_whatever_the_hash_seed() {
        // One session holds 40 keys, each awaited by another session: its disconnect grants
        // all 40 at once, and the events (hence replies and fencing tokens) must come out in
        // the waiters' arrival order under any hash seed, not in the hash set's order.
        let keys: Vec<Vec<u8>> = (0..40).map(|i| format!("key{i}").into_bytes()).collect();
        let order_under = |seed: u64| {
            crate::core::hash::with_seed(seed, || {
                let mut t = DlockTable::new(DlockConfig { idle_timeout_ms: 0 }, 0);
                let c = |n| ConnId::new(0, n, 0);
                let mut ev = Vec::new();
                let all: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
                t.lock(c(0), 0, &all, None, None, 0, &mut ev);
                // Waiters arrive in reverse key order, so arrival order is not key order.
                for (i, k) in keys.iter().enumerate().rev() {
                    let w = t.lock(c(1 + i as u32), i as u64, &[k], None, None, 1, &mut ev);
                    assert_eq!(w, LockResult::Waiting);
                }
                t.disconnect(c(0), 2, &mut ev);
                ev.iter()
                    .map(|e| match e {
                        DlockEvent::Granted { token, .. } => *token,
                        other => panic!("{other:?}"),
                    })
                    .collect::<Vec<u64>>()
            })
        };
        let want: Vec<u64> = (0..40).rev().collect();
        for seed in [1, 2, 3, 0xFEED] {
            assert_eq!(order_under(seed), want, "hash seed {seed}");
        }
    }

    #[test]
    fn truncated_or_corrupt_dlock_snapshots_are_errors_not_panics() {
        let config = DlockConfig {
            idle_timeout_ms: 50,
        };
        let mut t = DlockTable::new(config, 0);
        let c = |n| ConnId::new(0, n, 0);
        let mut ev = Vec::new();
        t.connect(c(1), 0);
        t.connect(c(2), 0);
        t.lock(c(1), 1, &[b"a", b"b"], None, None, 0, &mut ev);
        t.lock(c(1), 2, &[b"l"], None, Some(900_000), 0, &mut ev);
        t.lock(
            c(2),
            3,
            &[b"b", b"c"],
            Some(40_000),
            Some(5_000),
            1,
            &mut ev,
        );
        crate::core::codec::testing::damage_is_refused(&t, config, 2000, |c| c.check_invariants());
    }

    #[test]
    fn random_operations_match_the_naive_model() {
        for seed in 1..=8u64 {
            let idle = if seed % 2 == 0 { 0 } else { 10 + 7 * seed };
            run_model(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 15_000, idle);
        }
    }
}
