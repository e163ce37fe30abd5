//! The dlock multi-key lock table (`docs/protocol.md`, "dlock").
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
//! # Choices the protocol leaves open
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
//!
//! # Version 3 (the native protocol)
//!
//! The same table serves version 3's requests on the same keys (`native.rs`): holds per grant
//! rather than per connection, shared mode, semaphores, values, lock-delay, unlock and extend
//! by fence, Get and CheckFence. A key's version-2 hold is its record's `holder`; its
//! version-3 grants live beside the record in `natives` (so a key only version 2 uses costs
//! what it always did), and both kinds queue in the record's one FIFO queue.

use super::codec::{self, DecodeError, Reader, Snapshot};
use super::fence::Fence;
use super::hash::{HashMap, HashSet, Seeded};
use super::small::SmallBytes;
use super::wheel::{TimerKey, Wheel};
use super::Session;
use hashbrown::HashTable;
use slab::Slab;
use std::borrow::Cow;
use std::collections::BTreeSet;

#[path = "dlock_native.rs"]
mod native;
pub use native::{
    HolderInfo, KeyEventKind, KeyInfo, NativeError, NativeLock, NativeStats, MAX_LIMIT,
    MAX_LOCK_DELAY_US, MAX_VALUE,
};
use native::{NativeKey, NativeWait};
use std::hash::BuildHasher;

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
    /// The waiting Lock of `session` (tagged `token`) now holds all its keys, under the fencing
    /// token `fence`.
    Granted {
        session: Session,
        token: u64,
        fence: u64,
    },
    /// The waiting Lock of `session` hit its wait deadline: nothing is held; `busy` lists the keys
    /// that were still busy.
    TimedOut {
        session: Session,
        token: u64,
        busy: Vec<Box<[u8]>>,
    },
    /// `session` sent nothing for the idle timeout and has no pending Lock: the table has already
    /// released its connection-bound locks; the daemon must close the connection.
    Idle { session: Session },
    /// A grant of `key` began or ended (for watchers; only while [`DlockTable::set_key_events`]
    /// is on): every one, version 2's too, in the order they happened.
    Key {
        key: Box<[u8]>,
        kind: KeyEventKind,
        fence: u64,
        value: Option<Box<[u8]>>,
    },
    /// A version-3 grant of `session` ended while `session` was open, for any reason but its own
    /// Unlock: `kind` is `Expired` for a lease that ran out, else `Lost`. `request_id` is that
    /// of the Lock that took it or the Extend that moved it to `session`.
    Notice {
        session: Session,
        request_id: u64,
        key: Box<[u8]>,
        kind: KeyEventKind,
        fence: u64,
        value: Option<Box<[u8]>>,
    },
}

#[derive(Debug, PartialEq, Eq)]
pub enum LockResult {
    Granted,
    Waiting,
    Timeout {
        busy: Vec<Box<[u8]>>,
    },
    /// Refused, nothing changed: a version-2 Lock on a key that version-3 clients use with
    /// another limit than 1 (a semaphore).
    Invalid {
        why: &'static str,
    },
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

/// A Lock as the table takes it: the caller's tag for its answer (`token`, echoed by the
/// `Granted` or `TimedOut` event of a Lock that waits), its keys, how long it may wait (`None`:
/// until granted or the session ends; `Some(0)`: not at all) and its lease (`None`: held until
/// Unlock or the session ends), in microseconds as dlock sends them.
#[derive(Clone, Copy, Debug)]
pub struct LockRequest<'k> {
    pub token: u64,
    pub keys: &'k [&'k [u8]],
    pub wait_us: Option<u64>,
    pub lease_us: Option<u64>,
}

/// A key's name, stored once, in its record: inline when short (no allocation per held key),
/// else on the heap.
type Key = SmallBytes;

/// "No record" in the holder lists' links. Records are numbered in u32 (half the links of
/// usize): 2^32 - 1 records of some 112 bytes would be 480 GB, far past any memory limit.
const NIL: u32 = u32::MAX;

/// A pending timer: what to do when it fires.
enum Timer {
    /// The lease on record `rec` runs out, if the record's lease still has generation `gen` (a
    /// re-lock cancels the old timer; the generation also guards against any stale one, even if
    /// the record was freed and reused for another key: generations are never reused).
    Lease { rec: u32, gen: u64 },
    /// `session` may have been idle long enough; checked against its last activity when it fires.
    Idle { session: Session },
    /// The wait deadline of waiter `seq`, if it is still waiting.
    Wait { seq: u64 },
    /// The lock-delay of record `rec` ends, if its delay still ends by then.
    Delay { rec: u32 },
}

impl Timer {
    /// Order of timers due at the same instant: releases first, then wait deadlines in arrival
    /// order (see the module docs).
    ///
    /// Within a class the order is one every replica shares (a lease's key, an idle session, a
    /// waiter's arrival number), never the wheel's insertion order nor a record's index, so a
    /// state restored from a snapshot fires its timers exactly as the original would. `recs`:
    /// the records the lease timers name (all live: a released lease's timer is cancelled).
    fn order(&self, other: &Timer, recs: &Slab<KeyRec>) -> std::cmp::Ordering {
        fn class(t: &Timer) -> u8 {
            match t {
                Timer::Lease { .. } | Timer::Delay { .. } => 0,
                Timer::Idle { .. } => 1,
                Timer::Wait { .. } => 2,
            }
        }
        // Releases and lock-delay ends by key, then a key's leases by generation, then its
        // delay.
        fn release(t: &Timer) -> Option<(u32, u64)> {
            match t {
                Timer::Lease { rec, gen } => Some((*rec, *gen)),
                Timer::Delay { rec } => Some((*rec, u64::MAX)),
                _ => None,
            }
        }
        match (self, other) {
            (
                Timer::Lease { .. } | Timer::Delay { .. },
                Timer::Lease { .. } | Timer::Delay { .. },
            ) => {
                let (Some((a, ga)), Some((b, gb))) = (release(self), release(other)) else {
                    unreachable!()
                };
                let name = |r: &u32| recs.get(*r as usize).map(|r| &*r.key);
                name(&a).cmp(&name(&b)).then(ga.cmp(&gb))
            }
            (Timer::Idle { session: a }, Timer::Idle { session: b }) => a.cmp(b),
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

impl Lease {
    /// Its snapshot form: a tag (0 none), then the deadline and the generation.
    fn put(lease: Option<&Lease>, out: &mut Vec<u8>) {
        match lease {
            None => codec::put_u8(out, 0),
            Some(l) => {
                codec::put_u8(out, 1);
                codec::put_u64(out, l.deadline);
                codec::put_u64(out, l.gen);
            }
        }
    }
}

struct Hold {
    session: Session,
    lease: Option<Lease>,
    /// When it was granted, in whole seconds of the table's clock (for the admin port's
    /// listing): 4 bytes fit in the padding after `session`, where 8 made every held key 8 bytes
    /// larger.
    since_s: u32,
    /// The fencing token of the grant that gave this key to `session` (one per Lock).
    token: u64,
}

/// One key: its name (the table's one copy of it), its holder and its waiters in arrival
/// order, and its place in its holder's list. Removed from the table when it has neither
/// holder nor waiter. Records live in one slab and point at each other by u32 index: a held key
/// costs this record and one 8-byte slot of the name index, no allocation of its own (a short
/// name is inline) and no entry in any per-connection map.
struct KeyRec {
    key: Key,
    holder: Option<Hold>,
    /// Arrival numbers of the waiters (`DlockTable::waiters`); the first one is the head.
    queue: BTreeSet<u64>,
    /// The holder's list of held records (while the holder's session is in `sessions`), else
    /// both NIL.
    prev: u32,
    next: u32,
}

/// A slot of the name index: the record's index and its name's hash (kept so that growing the
/// index rehashes 8-byte slots without touching a record: a resize at 1M keys takes
/// milliseconds, where a map of whole records stopped the owner for tens of them).
#[derive(Clone, Copy)]
struct Slot {
    rec: u32,
    hash: u32,
}

/// The index's 64-bit hash from a slot's 32 bits: spread so that hashbrown's bucket bits (low)
/// and tag bits (top 7) both depend on all 32.
#[inline]
fn widen(h: u32) -> u64 {
    u64::from(h).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

struct Waiter {
    session: Session,
    token: u64,
    /// Distinct keys, in request order.
    keys: Box<[Box<[u8]>]>,
    lease_us: Option<u64>,
    /// The wait deadline (ms) and its timer, if the Lock has one.
    deadline: Option<u64>,
    timer: Option<TimerKey>,
    /// A version-3 Lock's own fields (`token` is its request id); `None`: version 2.
    native: Option<Box<NativeWait>>,
}

struct Conn {
    /// The first record of the list of every key this connection holds, leases included
    /// (linked through `KeyRec::prev/next`), or NIL.
    head: u32,
    /// Arrival number of its waiting Lock.
    pending: Option<u64>,
    last_active: u64,
    /// Armed while idle tracking is on and no Lock is pending (lazily: it may fire early, then
    /// it is re-armed at `last_active + idle_timeout_ms`).
    idle_timer: Option<TimerKey>,
    /// Its version-3 waits and grants, boxed: a connection that never speaks version 3 (most,
    /// and every idle one) pays 8 bytes for them, not 48.
    native: Option<Box<ConnNative>>,
}

#[derive(Default)]
struct ConnNative {
    /// Its waiting version-3 Locks, by arrival number (any number of them).
    waits: Vec<u64>,
    /// Its version-3 grants: (fencing token, record), one per key of a grant.
    grants: BTreeSet<(u64, u32)>,
}

impl Conn {
    fn new(last_active: u64) -> Conn {
        Conn {
            head: NIL,
            pending: None,
            last_active,
            idle_timer: None,
            native: None,
        }
    }

    /// Whether a Lock of this connection waits (then it is not idle).
    fn waiting(&self) -> bool {
        self.pending.is_some() || !self.waits().is_empty()
    }

    /// Its waiting version-3 Locks.
    fn waits(&self) -> &[u64] {
        self.native.as_ref().map_or(&[], |n| &n.waits)
    }

    /// Its version-3 grants: (fencing token, record).
    fn grants(&self) -> impl Iterator<Item = &(u64, u32)> {
        self.native.iter().flat_map(|n| n.grants.iter())
    }

    fn has_grant(&self, g: &(u64, u32)) -> bool {
        self.native.as_ref().is_some_and(|n| n.grants.contains(g))
    }

    /// Its version-3 part, made if it had none.
    fn native_mut(&mut self) -> &mut ConnNative {
        self.native.get_or_insert_with(Default::default)
    }
}

pub struct DlockTable {
    config: DlockConfig,
    /// Every key with a holder or a waiter.
    recs: Slab<KeyRec>,
    /// Name -> record.
    index: HashTable<Slot>,
    hasher: Seeded,
    sessions: HashMap<Session, Conn>,
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
    /// The version-3 state of a record (its grants, limit, lock-delay), by record index; no
    /// entry for a key that only version 2 uses.
    natives: HashMap<u32, NativeKey>,
    nstats: NativeStats,
    /// Whether [`DlockEvent::Key`] events are made.
    key_events: bool,
}

/// A waiter's head in a snapshot: its arrival number (after `last`, which it becomes, and
/// below `next_seq`; else the error `order`), session, token, lease and wait deadline.
fn read_waiter_head(
    r: &mut Reader<'_>,
    last: &mut Option<u64>,
    next_seq: u64,
    order: &'static str,
) -> Result<WaiterHead, DecodeError> {
    let seq = r.u64()?;
    if last.is_some_and(|l| l >= seq) || seq >= next_seq {
        return Err(DecodeError::Invalid(order));
    }
    *last = Some(seq);
    Ok(WaiterHead {
        seq,
        session: Session::decode(r)?,
        token: r.u64()?,
        lease_us: r.opt_u64()?,
        deadline: r.opt_u64()?,
    })
}

/// What [`read_waiter_head`] reads.
struct WaiterHead {
    seq: u64,
    session: Session,
    token: u64,
    lease_us: Option<u64>,
    deadline: Option<u64>,
}

/// A waiter's keys in a snapshot: at least one, all distinct.
fn read_waiter_keys(r: &mut Reader<'_>) -> Result<Vec<Box<[u8]>>, DecodeError> {
    let nkeys = r.count(1)?;
    if nkeys == 0 {
        return Err(DecodeError::Invalid("dlock waiter with no keys"));
    }
    let mut keys: Vec<Box<[u8]>> = Vec::with_capacity(nkeys);
    for _ in 0..nkeys {
        let k = r.bytes(DlockTable::MAX_KEY)?;
        if keys.iter().any(|o| **o == *k) {
            return Err(DecodeError::Invalid("dlock waiter names a key twice"));
        }
        keys.push(k.into());
    }
    Ok(keys)
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
            recs: Slab::new(),
            index: HashTable::new(),
            hasher: Seeded::default(),
            sessions: HashMap::default(),
            waiters: HashMap::default(),
            wheel: Wheel::new(now_ms),
            next_seq: 0,
            next_lease_gen: 0,
            fired: Vec::new(),
            heads: Vec::new(),
            fence: Fence::default(),
            stats: DlockStats::default(),
            natives: HashMap::default(),
            nstats: NativeStats::default(),
            key_events: false,
        }
    }

    /// A new connection: its idle clock starts now.
    pub fn connect(&mut self, session: Session, now_ms: u64) {
        self.touch(session, now_ms);
    }

    /// Any request of `session` restarts its idle clock.
    pub fn touch(&mut self, session: Session, now_ms: u64) {
        self.sessions
            .entry(session)
            .or_insert_with(|| Conn::new(now_ms));
        self.activity(session, now_ms);
    }

    /// Lock `keys` for `session` (see the module docs for the rule). `Waiting`: the answer comes
    /// later as a `Granted` or `TimedOut` event tagged `token`.
    pub fn lock(
        &mut self,
        session: Session,
        req: LockRequest<'_>,
        now_ms: u64,
        events: &mut Vec<DlockEvent>,
    ) -> LockResult {
        let LockRequest {
            token,
            keys,
            wait_us,
            lease_us,
        } = req;
        self.touch(session, now_ms);
        self.advance(now_ms, events);
        let old = self.sessions.get(&session).and_then(|c| c.pending);
        if let Some(old) = old {
            // The daemon answers a connection's requests in order, so a second Lock cannot
            // arrive while one waits. Should it anyway, the old one is dropped, not leaked.
            debug_assert!(false, "second pending Lock on {session:?}");
            if let Some(w) = self.take_waiter(old, false) {
                self.check_heads(&w.keys, now_ms, events);
            }
        }
        let keys = distinct(keys);
        if !self.natives.is_empty()
            && keys
                .iter()
                .any(|k| self.limit_of(k).is_some_and(|l| l != 1))
        {
            return LockResult::Invalid {
                why: "the key is a semaphore of another limit",
            };
        }
        let busy: Vec<&[u8]> = keys
            .iter()
            .copied()
            .filter(|k| self.busy_for_new(session, k))
            .collect();
        if busy.is_empty() {
            let lease_ms = ms_from_us(lease_us);
            let token = self.fence.next();
            for k in keys.iter() {
                self.set_holder(k, session, lease_ms, now_ms, token, events);
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
            let r = self.find_or_insert(k);
            self.recs[r].queue.insert(seq);
        }
        let deadline = ms_from_us(wait_us).map(|ms| now_ms.saturating_add(ms));
        let timer = deadline.map(|d| self.wheel.insert(d, (d, Timer::Wait { seq })));
        self.waiters.insert(
            seq,
            Waiter {
                session,
                token,
                keys: keys.iter().map(|k| Box::from(*k)).collect(),
                lease_us,
                deadline,
                timer,
                native: None,
            },
        );
        if let Some(c) = self.sessions.get_mut(&session) {
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
        session: Session,
        keys: &[&[u8]],
        now_ms: u64,
        events: &mut Vec<DlockEvent>,
    ) -> Result<(), Vec<Box<[u8]>>> {
        self.touch(session, now_ms);
        self.advance(now_ms, events);
        let keys = distinct(keys);
        let mut not_held: Vec<Box<[u8]>> = Vec::new();
        for &k in keys.iter() {
            let mine = self
                .rec(k)
                .and_then(|s| s.holder.as_ref())
                .is_some_and(|h| h.session == session);
            if mine {
                self.release(k, events);
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

    /// `session` is gone: its waiting Lock leaves the queues, its connection-bound locks are
    /// released; its leases stay until their deadlines.
    pub fn disconnect(&mut self, session: Session, now_ms: u64, events: &mut Vec<DlockEvent>) {
        self.advance(now_ms, events);
        let Some(c) = self.sessions.remove(&session) else {
            return;
        };
        let mut affected: Vec<Key> = Vec::new();
        if let Some(seq) = c.pending {
            if let Some(w) = self.take_waiter(seq, false) {
                affected.extend(w.keys.iter().map(|k| Key::from(&**k)));
            }
        }
        self.drop_conn(session, c, now_ms, affected, events);
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
            // The `advance_to` below stages once for the whole walk.
            self.wheel.step_to(at, &mut fired);
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
    /// Restart every running lease with its remaining time plus `extra_ms` (a new cluster
    /// leader does, so that no lease ends early because of a failover).
    pub fn extend_leases(&mut self, extra_ms: u64) {
        for (r, rec) in self.recs.iter_mut() {
            let Some(lease) = rec.holder.as_mut().and_then(|h| h.lease.as_mut()) else {
                continue;
            };
            self.wheel.cancel(lease.timer);
            lease.deadline = lease.deadline.saturating_add(extra_ms);
            let timer = Timer::Lease {
                rec: r as u32,
                gen: lease.gen,
            };
            lease.timer = self.wheel.insert(lease.deadline, (lease.deadline, timer));
        }
        self.extend_native_leases(extra_ms);
    }

    pub fn next_deadline(&self) -> Option<u64> {
        self.wheel.next_deadline()
    }

    /// See [`crate::core::wheel::Wheel::next_staging`].
    pub fn next_staging(&self) -> Option<u64> {
        self.wheel.next_staging()
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

    /// The version-3 Locks of `session` waiting now, and whether one of them is tagged
    /// `request_id`.
    pub fn native_waits(&self, session: Session, request_id: u64) -> (usize, bool) {
        let Some(c) = self.sessions.get(&session) else {
            return (0, false);
        };
        let tagged = c
            .waits()
            .iter()
            .any(|seq| self.waiters.get(seq).is_some_and(|w| w.token == request_id));
        (c.waits().len(), tagged)
    }

    /// A lease of record `r` ending at `deadline`, its timer armed under a new generation.
    /// A lease of record `rec` read back from a snapshot ([`Lease::put`]), its timer armed.
    fn read_lease(&mut self, r: &mut Reader<'_>, rec: usize) -> Result<Option<Lease>, DecodeError> {
        match r.u8()? {
            0 => Ok(None),
            1 => {
                let deadline = r.u64()?;
                let gen = r.u64()?;
                if gen >= self.next_lease_gen {
                    return Err(DecodeError::Invalid(
                        "dlock lease generation not yet issued",
                    ));
                }
                let timer = Timer::Lease {
                    rec: rec as u32,
                    gen,
                };
                Ok(Some(Lease {
                    deadline,
                    timer: self.wheel.insert(deadline, (deadline, timer)),
                    gen,
                }))
            }
            _ => Err(DecodeError::Invalid("dlock lease tag")),
        }
    }

    fn arm_lease(&mut self, r: usize, deadline: u64) -> Lease {
        let gen = self.next_lease_gen;
        self.next_lease_gen += 1;
        let timer = Timer::Lease { rec: r as u32, gen };
        Lease {
            deadline,
            timer: self.wheel.insert(deadline, (deadline, timer)),
            gen,
        }
    }

    /// The fencing token under which `session` holds `key`.
    pub fn token_of(&self, session: Session, key: &[u8]) -> Option<u64> {
        let h = self.rec(key)?.holder.as_ref()?;
        (h.session == session).then_some(h.token)
    }

    /// Share the service's fencing counter (see [`Fence`]).
    pub fn with_fence(mut self, fence: &Fence) -> Self {
        self.fence.join(fence);
        self
    }

    /// Who holds `key`, and the lease deadline (ms) if it is a lease.
    pub fn holder(&self, key: &[u8]) -> Option<(Session, Option<u64>)> {
        let hold = self.rec(key)?.holder.as_ref()?;
        Some((hold.session, hold.lease.as_ref().map(|l| l.deadline)))
    }

    // ---- internals ----

    fn hash(&self, key: &[u8]) -> u32 {
        (self.hasher.hash_one(key) >> 32) as u32
    }

    /// The record of `key`, if it has one.
    fn find(&self, key: &[u8]) -> Option<usize> {
        let h = self.hash(key);
        let recs = &self.recs;
        self.index
            .find(widen(h), |s| {
                s.hash == h && *recs[s.rec as usize].key == *key
            })
            .map(|s| s.rec as usize)
    }

    fn rec(&self, key: &[u8]) -> Option<&KeyRec> {
        self.find(key).map(|r| &self.recs[r])
    }

    /// The record of `key`, made empty (no holder, no waiter) if it had none.
    fn find_or_insert(&mut self, key: &[u8]) -> usize {
        let h = self.hash(key);
        let recs = &mut self.recs;
        let entry = self.index.entry(
            widen(h),
            |s| s.hash == h && *recs[s.rec as usize].key == *key,
            |s| widen(s.hash),
        );
        match entry {
            hashbrown::hash_table::Entry::Occupied(o) => o.get().rec as usize,
            hashbrown::hash_table::Entry::Vacant(v) => {
                let r = recs.insert(KeyRec {
                    key: Key::from(key),
                    holder: None,
                    queue: BTreeSet::new(),
                    prev: NIL,
                    next: NIL,
                });
                v.insert(Slot {
                    rec: r as u32,
                    hash: h,
                });
                r
            }
        }
    }

    /// Drop record `r` (no holder, no waiter) from the table.
    fn remove_rec(&mut self, r: usize) {
        let h = self.hash(&self.recs[r].key);
        if let Ok(o) = self.index.find_entry(widen(h), |s| s.rec as usize == r) {
            o.remove();
        }
        self.recs.remove(r);
    }

    /// Put record `r` at the head of `session`'s list, if the session is known.
    fn link(&mut self, session: Session, r: usize) {
        let Some(c) = self.sessions.get_mut(&session) else {
            return;
        };
        let old = c.head;
        c.head = r as u32;
        let rec = &mut self.recs[r];
        rec.prev = NIL;
        rec.next = old;
        if old != NIL {
            self.recs[old as usize].prev = r as u32;
        }
    }

    /// Take record `r` out of `session`'s list (nothing if the session is gone: its list went
    /// with it).
    fn unlink(&mut self, session: Session, r: usize) {
        let Some(c) = self.sessions.get_mut(&session) else {
            return;
        };
        let (prev, next) = (self.recs[r].prev, self.recs[r].next);
        if prev == NIL {
            c.head = next;
        } else {
            self.recs[prev as usize].next = next;
        }
        if next != NIL {
            self.recs[next as usize].prev = prev;
        }
        self.recs[r].prev = NIL;
        self.recs[r].next = NIL;
    }

    /// Whether `key` keeps a new Lock of `session` from being granted at once.
    fn busy_for_new(&self, session: Session, key: &[u8]) -> bool {
        match self.rec(key) {
            None => false,
            Some(s) => match &s.holder {
                Some(h) => h.session != session,
                None => !s.queue.is_empty() || self.native_blocks_key(key),
            },
        }
    }

    /// Whether `key` still keeps waiter `seq` of `session` from being granted.
    fn busy_for_waiter(&self, session: Session, seq: u64, key: &[u8]) -> bool {
        match self.find(key) {
            None => {
                debug_assert!(false, "a waiter's key has no state");
                false
            }
            Some(r) => match &self.recs[r].holder {
                Some(h) => h.session != session,
                None => self.recs[r].queue.first() != Some(&seq) || self.native_blocks(r),
            },
        }
    }

    /// Whether `key` still keeps waiter `seq` (`w`) from being granted, whatever its version.
    fn waiter_busy(&self, w: &Waiter, seq: u64, key: &[u8]) -> bool {
        match &w.native {
            None => self.busy_for_waiter(w.session, seq, key),
            Some(n) => self.busy_for_native_waiter(seq, n.shared, key),
        }
    }

    fn grantable(&self, seq: u64) -> bool {
        self.waiters
            .get(&seq)
            .is_some_and(|w| w.keys.iter().all(|k| !self.waiter_busy(w, seq, k)))
    }

    /// Restart the idle clock of `session` at `now_ms`, arming its timer if it has none.
    fn activity(&mut self, session: Session, now_ms: u64) {
        let idle = self.config.idle_timeout_ms;
        let Some(c) = self.sessions.get_mut(&session) else {
            return;
        };
        c.last_active = c.last_active.max(now_ms);
        if idle > 0 && !c.waiting() && c.idle_timer.is_none() {
            let due = c.last_active.saturating_add(idle);
            c.idle_timer = Some(self.wheel.insert(due, (due, Timer::Idle { session })));
        }
    }

    /// Make `session` the holder of `key`, replacing its own earlier record if any.
    fn set_holder(
        &mut self,
        key: &[u8],
        session: Session,
        lease_ms: Option<u64>,
        now_ms: u64,
        token: u64,
        events: &mut Vec<DlockEvent>,
    ) {
        let r = self.find_or_insert(key);
        // Held by `session` already (a re-lock): it is in its list already.
        let newly_held = self.recs[r].holder.is_none();
        match self.recs[r].holder.take() {
            Some(old) => {
                debug_assert_eq!(old.session, session, "grant over another holder");
                if let Some(lease) = old.lease {
                    self.wheel.cancel(lease.timer);
                    self.stats.leases -= 1;
                }
                // The re-lock's grant replaces the old one.
                self.key_event(events, r, KeyEventKind::Released, old.token, None);
            }
            None => self.stats.held_keys += 1,
        }
        self.key_event(events, r, KeyEventKind::Acquired, token, None);
        let lease = lease_ms.map(|ms| {
            self.stats.leases += 1;
            self.arm_lease(r, now_ms.saturating_add(ms))
        });
        self.recs[r].holder = Some(Hold {
            session,
            lease,
            since_s: (now_ms / 1000) as u32,
            token,
        });
        if newly_held {
            self.link(session, r);
        }
    }

    /// Free `key` from its holder (whoever it is) by an Unlock; the caller checks the queue's
    /// head.
    fn release(&mut self, key: &[u8], events: &mut Vec<DlockEvent>) {
        if let Some(r) = self.find(key) {
            self.v2_ended(r, KeyEventKind::Released, events);
            self.release_rec(r);
        }
    }

    /// The `Key` event of the end of record `r`'s version-2 hold, if such events are on.
    #[inline]
    fn v2_ended(&self, r: usize, kind: KeyEventKind, events: &mut Vec<DlockEvent>) {
        if self.key_events {
            if let Some(h) = &self.recs[r].holder {
                self.key_event(events, r, kind, h.token, None);
            }
        }
    }

    /// Free record `r` from its holder; the record goes too when no one waits for its key.
    fn release_rec(&mut self, r: usize) {
        let Some(hold) = self.recs[r].holder.take() else {
            return;
        };
        self.stats.held_keys -= 1;
        if let Some(lease) = hold.lease {
            self.wheel.cancel(lease.timer);
            self.stats.leases -= 1;
        }
        self.unlink(hold.session, r);
        if self.recs[r].queue.is_empty() && !self.has_native(r) {
            self.remove_rec(r);
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
            if let Some(r) = self.find(k) {
                let state = &mut self.recs[r];
                state.queue.remove(&seq);
                if w.native.is_some() {
                    self.native_unqueued(r);
                }
                if !granting {
                    self.tidy(r);
                }
            }
        }
        if let Some(c) = self.sessions.get_mut(&w.session) {
            if c.pending == Some(seq) {
                c.pending = None;
            } else if w.native.is_some() {
                c.native_mut().waits.retain(|&s| s != seq);
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
        heads.extend(
            keys.iter()
                .filter_map(|k| self.rec(k.as_ref()).and_then(|s| s.queue.first().copied())),
        );
        if heads.is_empty() {
            self.heads = heads;
            return;
        }
        heads.sort_unstable();
        heads.dedup();
        // A shared or semaphore grant may let the next waiters of its keys through as well
        // (always later arrivals): they join the pass, still in arrival order.
        let mut i = 0;
        while i < heads.len() {
            let seq = heads[i];
            i += 1;
            if !self.grantable(seq) {
                continue;
            }
            let Some(keys) = self.grant(seq, now_ms, events) else {
                continue;
            };
            for k in keys.iter() {
                if let Some(&h) = self.rec(k).and_then(|s| s.queue.first()) {
                    if let Err(p) = heads[i..].binary_search(&h) {
                        heads.insert(i + p, h);
                    }
                }
            }
        }
        heads.clear();
        self.heads = heads;
    }

    /// Grant waiter `seq`. `Some`: its keys, when the grant may let others through too (shared
    /// or a semaphore).
    fn grant(
        &mut self,
        seq: u64,
        now_ms: u64,
        events: &mut Vec<DlockEvent>,
    ) -> Option<Box<[Box<[u8]>]>> {
        let mut w = self.take_waiter(seq, true)?;
        let lease_ms = ms_from_us(w.lease_us);
        let fence = self.fence.next();
        let native = w.native.take();
        match &native {
            None => {
                for k in w.keys.iter() {
                    self.set_holder(k, w.session, lease_ms, now_ms, fence, events);
                }
            }
            Some(n) => {
                for k in w.keys.iter() {
                    self.add_grant(k, w.session, w.token, fence, lease_ms, n, now_ms, events);
                }
            }
        }
        self.stats.grants += 1;
        self.activity(w.session, now_ms);
        events.push(DlockEvent::Granted {
            session: w.session,
            token: w.token,
            fence,
        });
        native.filter(|n| n.shared || n.limit > 1).map(|_| w.keys)
    }

    /// Remove `session` (already taken out of `sessions`): release its connection-bound
    /// keys, keep its leases, and settle the heads of every affected key.
    fn drop_conn(
        &mut self,
        session: Session,
        c: Conn,
        now_ms: u64,
        mut affected: Vec<Key>,
        events: &mut Vec<DlockEvent>,
    ) {
        if let Some(t) = c.idle_timer {
            self.wheel.cancel(t);
        }
        // The list goes with the session: its leases stay, unlinked.
        let mut r = c.head;
        while r != NIL {
            let rec = &mut self.recs[r as usize];
            let next = rec.next;
            rec.prev = NIL;
            rec.next = NIL;
            let bound = rec
                .holder
                .as_ref()
                .is_some_and(|h| h.session == session && h.lease.is_none());
            if bound {
                affected.push(rec.key.clone());
                self.v2_ended(r as usize, KeyEventKind::Lost, events);
                self.release_rec(r as usize);
            }
            r = next;
        }
        if c.native.is_some() {
            self.drop_native(c, now_ms, &mut affected, events);
        }
        self.check_heads(&affected, now_ms, events);
    }

    fn run_fired(&mut self, at: u64, fired: &mut Vec<(u64, Timer)>, events: &mut Vec<DlockEvent>) {
        let recs = &self.recs;
        fired.sort_unstable_by(|(da, a), (db, b)| da.cmp(db).then_with(|| a.order(b, recs)));
        for (_, timer) in fired.drain(..) {
            self.fire(at, timer, events);
        }
    }

    fn fire(&mut self, at: u64, timer: Timer, events: &mut Vec<DlockEvent>) {
        match timer {
            Timer::Lease { rec, gen } => {
                let r = rec as usize;
                let current = self
                    .recs
                    .get(r)
                    .and_then(|s| s.holder.as_ref())
                    .and_then(|h| h.lease.as_ref())
                    .is_some_and(|l| l.gen == gen);
                if current {
                    self.stats.lease_expiries += 1;
                    self.v2_ended(r, KeyEventKind::Expired, events);
                    if self.recs[r].queue.is_empty() && !self.has_native(r) {
                        // No one to grant: the record goes, nothing else to look at.
                        self.release_rec(r);
                    } else {
                        let key = self.recs[r].key.clone();
                        self.release_rec(r);
                        self.check_heads(&[key], at, events);
                    }
                } else {
                    self.native_lease_ends(r, gen, at, events);
                }
            }
            Timer::Delay { rec } => self.delay_ends(rec as usize, at, events),
            Timer::Idle { session } => {
                let idle = self.config.idle_timeout_ms;
                let Some(c) = self.sessions.get_mut(&session) else {
                    return;
                };
                c.idle_timer = None;
                if c.waiting() {
                    return;
                }
                let due = c.last_active.saturating_add(idle);
                if due > at {
                    c.idle_timer = Some(self.wheel.insert(due, (due, Timer::Idle { session })));
                    return;
                }
                if let Some(c) = self.sessions.remove(&session) {
                    self.stats.idle_disconnects += 1;
                    events.push(DlockEvent::Idle { session });
                    self.drop_conn(session, c, at, Vec::new(), events);
                }
            }
            Timer::Wait { seq } => {
                let Some(w) = self.waiters.get(&seq) else {
                    return; // granted or gone meanwhile
                };
                let busy: Vec<Box<[u8]>> = w
                    .keys
                    .iter()
                    .filter(|k| self.waiter_busy(w, seq, k))
                    .cloned()
                    .collect();
                let Some(w) = self.take_waiter(seq, false) else {
                    return;
                };
                self.stats.timeouts += 1;
                self.activity(w.session, at);
                events.push(DlockEvent::TimedOut {
                    session: w.session,
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
    pub fn for_each_held(&self, mut f: impl FnMut(&[u8], Session, Option<u64>)) {
        for (_, s) in &self.recs {
            if let Some(h) = &s.holder {
                f(&s.key, h.session, h.lease.as_ref().map(|l| l.deadline));
            }
        }
    }

    /// When `key` was granted to its holder (ms, rounded down to a whole second), if it is held.
    pub fn held_since(&self, key: &[u8]) -> Option<u64> {
        Some(u64::from(self.rec(key)?.holder.as_ref()?.since_s) * 1000)
    }

    /// The connections queued on `key`, first come first (the admin port's listing).
    pub fn queue<'a>(&'a self, key: &[u8]) -> impl Iterator<Item = Session> + 'a {
        let queue = self.rec(key).map(|s| &s.queue);
        queue
            .into_iter()
            .flatten()
            .filter_map(|q| self.waiters.get(q))
            .map(|w| w.session)
    }

    /// The connections queued on `key`, first come first.
    #[cfg(test)]
    fn queue_conns(&self, key: &[u8]) -> Vec<Session> {
        self.rec(key).map_or_else(Vec::new, |s| {
            s.queue
                .iter()
                .filter_map(|q| self.waiters.get(q))
                .map(|w| w.session)
                .collect()
        })
    }

    /// Timers the lease wheel has moved into its stages so far.
    #[cfg(test)]
    fn timers_staged(&self) -> usize {
        self.wheel.timers_staged()
    }

    /// Every internal index agrees with every other, and nobody grantable is left waiting;
    /// panics otherwise.
    pub fn check_invariants(&self) {
        let (mut held, mut leases, mut listed) = (0, 0, 0);
        assert_eq!(
            self.index.len(),
            self.recs.len(),
            "name index and records differ"
        );
        for (r, s) in &self.recs {
            let k = &*s.key;
            assert!(
                s.holder.is_some() || !s.queue.is_empty() || self.natives.contains_key(&(r as u32)),
                "empty key state {k:?}"
            );
            assert_eq!(self.find(k), Some(r), "{k:?} not found by its name");
            if let Some(h) = &s.holder {
                held += 1;
                leases += u64::from(h.lease.is_some());
                listed += u64::from(self.sessions.contains_key(&h.session));
            } else {
                assert!(s.prev == NIL && s.next == NIL, "{k:?} linked but not held");
            }
            for seq in &s.queue {
                let w = self.waiters.get(seq).expect("queued waiter exists");
                assert!(w.keys.iter().any(|wk| **wk == *k));
            }
        }
        assert_eq!(held, self.stats.held_keys);
        assert_eq!(leases, self.stats.leases);
        for (seq, w) in &self.waiters {
            for k in w.keys.iter() {
                assert!(self.rec(k).expect("a waiter's key").queue.contains(seq));
            }
            let c = &self.sessions[&w.session];
            if w.native.is_some() {
                assert!(
                    c.waits().contains(seq),
                    "native waiter {seq} not in its session"
                );
            } else {
                assert_eq!(c.pending, Some(*seq));
            }
            assert!(!self.grantable(*seq), "waiter {seq} could be granted");
        }
        let mut in_lists = 0;
        for (id, c) in &self.sessions {
            let (mut r, mut prev) = (c.head, NIL);
            while r != NIL {
                let rec = &self.recs[r as usize];
                assert_eq!(rec.prev, prev, "broken holder list of {id:?}");
                assert_eq!(rec.holder.as_ref().map(|h| h.session), Some(*id));
                in_lists += 1;
                assert!(in_lists <= held, "holder list of {id:?} loops");
                (prev, r) = (r, rec.next);
            }
            if let Some(seq) = c.pending {
                assert!(self.waiters.contains_key(&seq));
            }
            for seq in c.waits() {
                assert!(self.waiters.get(seq).is_some_and(|w| w.native.is_some()));
            }
            if self.config.idle_timeout_ms > 0 && !c.waiting() {
                assert!(c.idle_timer.is_some(), "{id:?} has no idle timer");
            }
        }
        assert_eq!(
            in_lists, listed,
            "a held key missing from its holder's list"
        );
        self.check_native_invariants();
    }
}

/// Snapshot and restore, in a canonical form: sessions by id, keys in byte order with their
/// holder, lease and queue, waiters by arrival number.
impl DlockTable {
    /// `HFdlock1`, or `HFdlock2` when version-3 state follows the same fields (a table that
    /// only version 2 uses writes the format it always did).
    const SNAPSHOT_MAGIC: &'static [u8] = b"HFdlock";
    /// dlock's own cap on a frame is a megabyte; a key cannot be longer.
    const MAX_KEY: usize = 1 << 20;
}

impl Snapshot for DlockTable {
    type Config = DlockConfig;

    fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(Self::SNAPSHOT_MAGIC);
        let native = self.has_native_state();
        out.push(if native { b'2' } else { b'1' });
        codec::put_u64(out, self.wheel.now());
        codec::put_u64(out, self.next_seq);
        codec::put_u64(out, self.next_lease_gen);
        codec::put_u64(out, self.fence.last());
        let s = &self.stats;
        for v in [s.grants, s.timeouts, s.lease_expiries, s.idle_disconnects] {
            codec::put_u64(out, v);
        }
        let mut sessions: Vec<(&Session, &Conn)> = self.sessions.iter().collect();
        sessions.sort_unstable_by_key(|(c, _)| **c);
        codec::put_u64(out, sessions.len() as u64);
        for (id, c) in sessions {
            id.encode(out);
            codec::put_u64(out, c.last_active);
        }
        let mut keys: Vec<&KeyRec> = self.recs.iter().map(|(_, s)| s).collect();
        keys.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        codec::put_u64(out, keys.len() as u64);
        for s in keys {
            codec::put_bytes(out, &s.key);
            match &s.holder {
                None => codec::put_u8(out, 0),
                Some(h) => {
                    codec::put_u8(out, 1);
                    h.session.encode(out);
                    codec::put_u64(out, h.token);
                    codec::put_u64(out, u64::from(h.since_s));
                    Lease::put(h.lease.as_ref(), out);
                }
            }
            codec::spill(out);
        }
        let mut waiters: Vec<(&u64, &Waiter)> = self
            .waiters
            .iter()
            .filter(|(_, w)| w.native.is_none())
            .collect();
        waiters.sort_unstable_by_key(|(seq, _)| **seq);
        codec::put_u64(out, waiters.len() as u64);
        for (seq, w) in waiters {
            codec::put_u64(out, *seq);
            w.session.encode(out);
            codec::put_u64(out, w.token);
            codec::put_opt_u64(out, w.lease_us);
            codec::put_opt_u64(out, w.deadline);
            codec::put_u64(out, w.keys.len() as u64);
            for k in w.keys.iter() {
                codec::put_bytes(out, k);
            }
            codec::spill(out);
        }
        if native {
            self.snapshot_native(out);
        }
    }

    /// A table from bytes written by [`DlockTable::snapshot`]; untrusted: anything out of
    /// order, duplicated, dangling (a waiter of an unknown session, a queued key with no state)
    /// or against the table's rules (a waiter that could be granted) is an error.
    fn restore(config: DlockConfig, r: &mut Reader<'_>) -> Result<DlockTable, DecodeError> {
        use DecodeError::Invalid;
        r.expect(Self::SNAPSHOT_MAGIC, "dlock snapshot magic")?;
        let native = match r.u8()? {
            b'1' => false,
            b'2' => true,
            _ => return Err(Invalid("dlock snapshot magic")),
        };
        let mut t = DlockTable::new(config, r.u64()?);
        t.next_seq = r.u64()?;
        t.next_lease_gen = r.u64()?;
        t.fence.raise_to(r.u64()?);
        t.stats.grants = r.u64()?;
        t.stats.timeouts = r.u64()?;
        t.stats.lease_expiries = r.u64()?;
        t.stats.idle_disconnects = r.u64()?;
        let n = r.count(2)?;
        let mut last: Option<Session> = None;
        for _ in 0..n {
            let id = Session::decode_next(r, &mut last, "dlock sessions out of order")?;
            let last_active = r.u64()?;
            t.sessions.insert(id, Conn::new(last_active));
        }
        let n = r.count(2)?;
        let mut last_key: Option<Key> = None;
        for _ in 0..n {
            codec::consumed(r);
            let key: Key = Key::from(r.bytes(Self::MAX_KEY)?);
            if last_key.as_ref().is_some_and(|l| **l >= *key) {
                return Err(Invalid("dlock keys out of order"));
            }
            let rec = t.find_or_insert(&key);
            last_key = Some(key);
            let holder = match r.u8()? {
                0 => None,
                1 => {
                    let session = Session::decode(r)?;
                    let token = r.u64()?;
                    if token > t.fence.last() {
                        return Err(Invalid("dlock token not yet issued"));
                    }
                    let since_s = r.u32()?;
                    let lease = t.read_lease(r, rec)?;
                    t.stats.leases += u64::from(lease.is_some());
                    if t.sessions.contains_key(&session) {
                        t.link(session, rec);
                    } else if lease.is_none() {
                        return Err(Invalid("dlock connection-bound key of no session"));
                    }
                    t.stats.held_keys += 1;
                    Some(Hold {
                        session,
                        lease,
                        since_s,
                        token,
                    })
                }
                _ => return Err(Invalid("dlock holder tag")),
            };
            t.recs[rec].holder = holder;
        }
        let n = r.count(4)?;
        let mut last_seq: Option<u64> = None;
        for _ in 0..n {
            codec::consumed(r);
            let order = "dlock waiters out of order";
            let WaiterHead {
                seq,
                session,
                token,
                lease_us,
                deadline,
            } = read_waiter_head(r, &mut last_seq, t.next_seq, order)?;
            let keys = read_waiter_keys(r)?;
            match t.sessions.get_mut(&session) {
                Some(c) if c.pending.is_none() => c.pending = Some(seq),
                _ => return Err(Invalid("dlock waiter of no session or a second one")),
            }
            for k in &keys {
                let rec = t.find_or_insert(k);
                t.recs[rec].queue.insert(seq);
            }
            let timer = deadline.map(|d| t.wheel.insert(d, (d, Timer::Wait { seq })));
            t.waiters.insert(
                seq,
                Waiter {
                    session,
                    token,
                    keys: keys.into_boxed_slice(),
                    lease_us,
                    deadline,
                    timer,
                    native: None,
                },
            );
        }
        if native {
            t.restore_native(r)?;
        }
        if t.recs.iter().any(|(i, s)| {
            s.holder.is_none() && s.queue.is_empty() && !t.natives.contains_key(&(i as u32))
        }) {
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
            let ids: Vec<Session> = t.sessions.keys().copied().collect();
            for session in ids {
                if let Some(c) = t.sessions.get_mut(&session) {
                    if !c.waiting() {
                        let due = c.last_active.saturating_add(idle);
                        c.idle_timer = Some(t.wheel.insert(due, (due, Timer::Idle { session })));
                    }
                }
            }
        }
        Ok(t)
    }
}

#[cfg(test)]
#[path = "dlock_tests.rs"]
mod tests;
