//! The old lock-daemon lock table (`docs/protocol.md`, "old, the Open Lock Daemon protocol").
//!
//! Owns: every lockd lock name, its holder (a connection, or an orphan waiting for ADOPT), its
//! strict FIFO queue of pending ACQs, the orphan timers, and a fencing-token counter.
//!
//! Must not: read a clock, touch a socket, or know about frames. Every operation is a command
//! with the current time passed in; asynchronous effects (grants to queued ACQs) come back as
//! values appended to a caller's `Vec<Grant>`. The same commands, applied in the same order with
//! the same times, give the same state and the same grants, which is what a replicated log needs
//! later (cluster mode).
//!
//! Layout, chosen so that every operation costs O(what it touches), never O(table):
//! - `locks`: a slab with one entry per *locked* name (held or orphaned); a name that is free has
//!   no entry at all. A name is stored once, in its entry; `by_name` is a hash table of slab keys
//!   (names may be up to a MiB, so no second copy as a map key).
//! - `waiters`: a slab of queued ACQs. Each name's queue is a doubly linked list through it
//!   (head/tail in the lock), so the next waiter is found in O(1) and a disconnecting waiter is
//!   unlinked from the middle in O(1).
//! - `sessions`: per session, the slab keys of the locks it holds and of its queued ACQs; every
//!   lock and waiter records its position in that vector, so removal is a `swap_remove`.
//!   Disconnect walks only these two vectors.
//! - `orphan_timers`: one timer per orphan in the wheel, cancelled by ADOPT and REL.
//!
//! Invariant: a name has a queue only while it is locked (a release with waiters hands the lock
//! straight to the first of them), so "free" never has waiters and never needs a wake-up scan.

use std::hash::BuildHasher;

use super::hash::{HashMap, Seeded, Sharded};
use slab::Slab;

use super::codec::{self, DecodeError, Reader, Snapshot};
use super::fence::Fence;
use super::small::SmallBytes;
use super::wheel::{TimerKey, Wheel};
use super::Session;

#[derive(Clone, Copy, Debug)]
pub struct LockdConfig {
    pub orphan_timeout_ms: u64,
}

/// An asynchronous grant: `session` now holds the lock it queued for with ACQ; the daemon answers
/// ACQUIRED echoing `payload` (the queued request's payload, byte for byte).
#[derive(Debug, PartialEq, Eq)]
pub struct Grant {
    pub session: Session,
    pub payload: Box<[u8]>,
    /// The fencing token of this grant (see [`LockdTable::last_fence`]).
    pub fence: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AcquireOutcome {
    Acquired,
    Queued,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockdStats {
    pub held: u64,
    pub orphaned: u64,
    pub waiting: u64,
    pub grants: u64,
    pub orphan_expiries: u64,
    pub adoptions: u64,
}

/// What a name looks like from outside (inspection, tests, stats commands).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LockState {
    Free,
    Held(Session),
    /// Its holder disconnected; released at `deadline_ms` unless adopted before.
    Orphaned {
        deadline_ms: u64,
    },
}

pub struct LockdTable {
    config: LockdConfig,
    locks: Slab<Lock>,
    /// Slab keys of `locks`, found by the hash of the name stored in the entry.
    by_name: Sharded,
    hasher: Seeded,
    waiters: Slab<Waiter>,
    sessions: HashMap<Session, ConnLocks>,
    orphan_timers: Wheel<OrphanTimer>,
    /// Scratch for `advance`, kept to reuse its allocation.
    fired: Vec<OrphanTimer>,
    /// Tells a live orphan timer from a stale one should a wheel ever report one.
    next_orphan_seq: u64,
    /// The service's fencing counter (shared with the other tables of a state).
    fence: Fence,
    held: u64,
    orphaned: u64,
    grants: u64,
    orphan_expiries: u64,
    adoptions: u64,
}

struct Lock {
    /// Inline when short: taking and releasing a short name allocates nothing.
    name: SmallBytes,
    /// `hasher.hash_one(name)`, cached so that growing `by_name` never rehashes long names.
    hash: u64,
    holder: Holder,
    /// The fencing token of the current (or, for an orphan, the last) holder's grant.
    token: u64,
    /// When its holder got it (ms; adoption counts as getting it), for the admin port.
    since: u64,
    /// Oldest queued ACQ (the next to be granted) and newest, in `waiters`.
    head: Link,
    tail: Link,
}

/// A slab key of `waiters` in 4 bytes, or none: the queue ends of a lock, which exists once per
/// locked name, so its size is paid a million times over at scale (`Option<usize>` is 16 bytes;
/// two of them took a `Lock` from 64 to 88 bytes).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Link(u32);

impl Link {
    const NONE: Link = Link(u32::MAX);

    fn new(key: Option<usize>) -> Link {
        match key {
            // 2^32 - 1 queued ACQs would take hundreds of GiB; the limit is never reached.
            Some(k) => Link(
                u32::try_from(k)
                    .ok()
                    .filter(|&k| k != u32::MAX)
                    .expect("waiter key over 32 bits"),
            ),
            None => Link::NONE,
        }
    }

    fn get(self) -> Option<usize> {
        (self != Link::NONE).then_some(self.0 as usize)
    }
}

enum Holder {
    /// `pos` is this lock's index in `sessions[session].held`.
    Held { session: Session, pos: usize },
    Orphan {
        timer: TimerKey,
        seq: u64,
        deadline_ms: u64,
    },
}

struct Waiter {
    session: Session,
    /// Slab key of the lock this ACQ waits for.
    lock: usize,
    /// The ACQ's payload, echoed in its ACQUIRED.
    payload: Box<[u8]>,
    prev: Option<usize>,
    next: Option<usize>,
    /// This waiter's index in `sessions[session].waits`.
    pos: usize,
}

/// What one session is involved in. Kept while the session lives once it has locked or queued
/// (emptied, not removed, when its last lock goes), so that a session that takes and releases
/// one lock after another allocates nothing; removed when it disconnects.
#[derive(Default)]
struct ConnLocks {
    held: Vec<usize>,
    waits: Vec<usize>,
}

#[derive(Clone, Copy, Debug)]
struct OrphanTimer {
    deadline_ms: u64,
    seq: u64,
    lock: usize,
}

impl LockdTable {
    pub fn new(config: LockdConfig, now_ms: u64) -> Self {
        LockdTable {
            config,
            locks: Slab::new(),
            by_name: Sharded::default(),
            hasher: Seeded::default(),
            waiters: Slab::new(),
            sessions: HashMap::default(),
            orphan_timers: Wheel::new(now_ms),
            fired: Vec::new(),
            next_orphan_seq: 0,
            fence: Fence::default(),
            held: 0,
            orphaned: 0,
            grants: 0,
            orphan_expiries: 0,
            adoptions: 0,
        }
    }

    /// ACQ: a free name is taken at once; a locked one (held by anybody, `session` included, or
    /// orphaned) queues this request, `payload` and all, at the end of the name's FIFO.
    pub fn acquire(
        &mut self,
        session: Session,
        name: &[u8],
        payload: &[u8],
        now_ms: u64,
    ) -> AcquireOutcome {
        let hash = self.hasher.hash_one(name);
        match self.find_hashed(name, hash) {
            None => {
                self.insert_lock(session, name, hash, now_ms);
                AcquireOutcome::Acquired
            }
            Some(key) => {
                self.enqueue(key, session, payload);
                AcquireOutcome::Queued
            }
        }
    }

    /// How many ACQs `session` has queued (O(1)).
    pub fn queued_by(&self, session: Session) -> usize {
        self.sessions.get(&session).map_or(0, |c| c.waits.len())
    }

    /// TRY: a free name is taken (true); a locked one, also by `session` itself or an orphan, is
    /// not (false). Never queues.
    pub fn try_lock(&mut self, session: Session, name: &[u8], now_ms: u64) -> bool {
        let hash = self.hasher.hash_one(name);
        if self.find_hashed(name, hash).is_some() {
            return false;
        }
        self.insert_lock(session, name, hash, now_ms);
        true
    }

    /// REL: anybody may release any lock, held or orphaned (old-protocol.txt: "nobody 'owns' a
    /// lock"). The first queued ACQ, if any, becomes the holder and is pushed to `grants`.
    /// False if the name is not locked.
    pub fn release(
        &mut self,
        _session: Session,
        name: &[u8],
        now_ms: u64,
        grants: &mut Vec<Grant>,
    ) -> bool {
        let Some(key) = self.find(name) else {
            return false;
        };
        self.detach_holder(key);
        self.pass_on(key, now_ms, grants);
        true
    }

    /// ADOPT: an orphan becomes `session`'s (its timer cancelled); true. Anything else (free, held,
    /// or an orphan whose deadline is at or before `now_ms`, which the next `advance` will
    /// release) is false: an orphan is adoptable only strictly *within* the timeout, whether or
    /// not the caller has advanced the table to `now_ms` yet.
    pub fn adopt(&mut self, session: Session, name: &[u8], now_ms: u64) -> bool {
        let Some(key) = self.find(name) else {
            return false;
        };
        match self.locks[key].holder {
            Holder::Orphan { deadline_ms, .. } if now_ms < deadline_ms => {}
            _ => return false,
        }
        self.detach_holder(key);
        self.locks[key].holder = self.index_held(session, key);
        self.locks[key].since = now_ms;
        self.adoptions += 1;
        // A new holder gets a new token, so that anything the vanished holder still has in
        // flight is fenced off. An adoption is not counted in `grants`.
        self.locks[key].token = self.fence.next();
        true
    }

    /// A connection closed: every lock it holds becomes an orphan with its own timer at
    /// `now_ms + orphan_timeout_ms`; every ACQ it has queued leaves its queue. O(its locks + its
    /// waits).
    pub fn disconnect(&mut self, session: Session, now_ms: u64) {
        let Some(state) = self.sessions.remove(&session) else {
            return;
        };
        let deadline_ms = now_ms.saturating_add(self.config.orphan_timeout_ms);
        // Orphaned in name order, not in the order of the connection's index (which depends on
        // the history of its releases): the orphans' numbers decide the order in which they
        // expire at one instant, and every replica must agree on it.
        let mut held = state.held;
        let locks = &self.locks;
        held.sort_unstable_by(|&a, &b| locks[a].name.cmp(&locks[b].name));
        for key in held {
            let seq = self.next_orphan_seq;
            self.next_orphan_seq += 1;
            let timer = self.orphan_timers.insert(
                deadline_ms,
                OrphanTimer {
                    deadline_ms,
                    seq,
                    lock: key,
                },
            );
            debug_assert!(
                matches!(self.locks[key].holder, Holder::Held { session: c, .. } if c == session)
            );
            self.locks[key].holder = Holder::Orphan {
                timer,
                seq,
                deadline_ms,
            };
            self.held -= 1;
            self.orphaned += 1;
        }
        for w in state.waits {
            // The lock stays locked (it has a holder or is an orphan), so it stays in the table
            // even when this was its last waiter.
            self.unlink(w);
            self.waiters.remove(w);
        }
    }

    /// Release every orphan whose deadline is at or before `now_ms`, granting each one's first
    /// waiter, in deadline order.
    pub fn advance(&mut self, now_ms: u64, grants: &mut Vec<Grant>) {
        let mut fired = std::mem::take(&mut self.fired);
        self.orphan_timers.advance_to(now_ms, &mut fired);
        // The wheel fires in deadline order, one millisecond's timers in any order; the orphans'
        // numbers settle ties the same way on every replica.
        fired.sort_unstable_by_key(|t| (t.deadline_ms, t.seq));
        for t in fired.drain(..) {
            let live = matches!(
                self.locks.get(t.lock),
                Some(Lock { holder: Holder::Orphan { seq, .. }, .. }) if *seq == t.seq
            );
            if !live {
                // Adopt and release cancel the timer, so this cannot happen; if a wheel ever
                // reports a cancelled timer, ignoring it is the only safe answer.
                debug_assert!(false, "stale orphan timer {t:?}");
                continue;
            }
            // The timer has fired: nothing to cancel, only the count to move.
            self.orphaned -= 1;
            self.orphan_expiries += 1;
            self.pass_on(t.lock, now_ms, grants);
        }
        self.fired = fired;
    }

    /// When `advance` should next be called (never later than the earliest orphan deadline).
    /// Restart every orphan window with its remaining time plus `extra_ms` (a new cluster
    /// leader does, so that no window ends early because of a failover).
    pub fn extend_orphans(&mut self, extra_ms: u64) {
        for (key, lock) in self.locks.iter_mut() {
            if let Holder::Orphan {
                timer,
                seq,
                deadline_ms,
            } = &mut lock.holder
            {
                let cancelled = self.orphan_timers.cancel(*timer);
                debug_assert!(cancelled.is_some(), "orphan timer already gone");
                *deadline_ms = deadline_ms.saturating_add(extra_ms);
                *timer = self.orphan_timers.insert(
                    *deadline_ms,
                    OrphanTimer {
                        deadline_ms: *deadline_ms,
                        seq: *seq,
                        lock: key,
                    },
                );
            }
        }
    }

    pub fn next_deadline(&self) -> Option<u64> {
        self.orphan_timers.next_deadline()
    }

    /// See [`crate::core::wheel::Wheel::next_staging`].
    pub fn next_staging(&self) -> Option<u64> {
        self.orphan_timers.next_staging()
    }

    /// Every locked name, held or orphaned (SYNC), in byte order: the SYNC reply is an effect,
    /// and the table's slot order depends on its history, which a restored replica does not
    /// share. O(n log n); SYNC is rare.
    pub fn for_each_locked(&self, mut f: impl FnMut(&[u8])) {
        for key in self.sorted_keys() {
            f(&self.locks[key].name);
        }
    }

    fn sorted_keys(&self) -> Vec<usize> {
        let mut keys: Vec<usize> = self.locks.iter().map(|(k, _)| k).collect();
        keys.sort_unstable_by(|&a, &b| self.locks[a].name.cmp(&self.locks[b].name));
        keys
    }

    /// When `name`'s holder got it (ms), if it is locked (an orphan keeps its holder's time).
    pub fn held_since(&self, name: &[u8]) -> Option<u64> {
        self.find(name).map(|k| self.locks[k].since)
    }

    /// Every lock with its holder (`None`: orphaned), for an orphan when it expires (ms), and
    /// the fencing token of its (last) holder's grant: for the admin port's listing.
    pub fn for_each_lock(&self, mut f: impl FnMut(&[u8], Option<Session>, Option<u64>, u64)) {
        for (_, lock) in &self.locks {
            match lock.holder {
                Holder::Held { session, .. } => f(&lock.name, Some(session), None, lock.token),
                Holder::Orphan { deadline_ms, .. } => {
                    f(&lock.name, None, Some(deadline_ms), lock.token)
                }
            }
        }
    }

    pub fn stats(&self) -> LockdStats {
        LockdStats {
            held: self.held,
            orphaned: self.orphaned,
            waiting: self.waiters.len() as u64,
            grants: self.grants,
            orphan_expiries: self.orphan_expiries,
            adoptions: self.adoptions,
        }
    }

    /// The fencing token of the most recent grant or adoption (0 before the first). Tokens
    /// strictly increase; an immediate ACQUIRED (acquire, try_lock) reads its token here right
    /// after the call, an asynchronous grant carries its own in [`Grant::fence`].
    pub fn last_fence(&self) -> u64 {
        self.fence.last()
    }

    /// Share the service's fencing counter (see [`Fence`]).
    pub fn with_fence(mut self, fence: &Fence) -> Self {
        self.fence.join(fence);
        self
    }

    /// The fencing token of `name`'s lock if `session` holds it (old's REQ_TOKEN).
    pub fn token_of(&self, session: Session, name: &[u8]) -> Option<u64> {
        let lock = &self.locks[self.find(name)?];
        match lock.holder {
            Holder::Held { session: c, .. } if c == session => Some(lock.token),
            _ => None,
        }
    }

    /// The state of one name.
    pub fn state(&self, name: &[u8]) -> LockState {
        match self.find(name).map(|k| &self.locks[k].holder) {
            None => LockState::Free,
            Some(Holder::Held { session, .. }) => LockState::Held(*session),
            Some(Holder::Orphan { deadline_ms, .. }) => LockState::Orphaned {
                deadline_ms: *deadline_ms,
            },
        }
    }

    /// The queued ACQs of one name, next to be granted first: connection and payload.
    pub fn waiters<'a>(&'a self, name: &[u8]) -> impl Iterator<Item = (Session, &'a [u8])> + 'a {
        let head = self.find(name).and_then(|k| self.locks[k].head.get());
        std::iter::successors(head, move |&w| self.waiters[w].next).map(move |w| {
            let waiter = &self.waiters[w];
            (waiter.session, &*waiter.payload)
        })
    }

    // ---- internals ----

    fn find(&self, name: &[u8]) -> Option<usize> {
        self.find_hashed(name, self.hasher.hash_one(name))
    }

    fn find_hashed(&self, name: &[u8], hash: u64) -> Option<usize> {
        let locks = &self.locks;
        self.by_name
            .find(hash, |k| *locks[k as usize].name == *name)
            .map(|k| k as usize)
    }

    /// Lock a free name for `session`: an immediate grant.
    fn insert_lock(&mut self, session: Session, name: &[u8], hash: u64, now_ms: u64) {
        let key = self.locks.vacant_key();
        let holder = self.index_held(session, key);
        let inserted = self.locks.insert(Lock {
            name: name.into(),
            hash,
            holder,
            token: self.fence.next(),
            since: now_ms,
            head: Link::NONE,
            tail: Link::NONE,
        });
        debug_assert_eq!(inserted, key);
        self.by_name.insert_unique(hash, slab_id(key));
        self.grants += 1;
    }

    /// A lock with no waiters left and no holder leaves the table.
    fn remove_lock(&mut self, key: usize) {
        let lock = self.locks.remove(key);
        debug_assert!(lock.head == Link::NONE && lock.tail == Link::NONE);
        let found = self.by_name.remove(lock.hash, slab_id(key));
        debug_assert!(found, "lock {key} missing from by_name");
    }

    /// Record that `session` holds lock `key`; returns the holder to store in the lock.
    fn index_held(&mut self, session: Session, key: usize) -> Holder {
        let held = &mut self.sessions.entry(session).or_default().held;
        let pos = held.len();
        held.push(key);
        self.held += 1;
        Holder::Held { session, pos }
    }

    /// Undo the bookkeeping of the lock's current holder (connection index or orphan timer).
    /// The caller then stores a new holder or removes the lock.
    fn detach_holder(&mut self, key: usize) {
        match self.locks[key].holder {
            Holder::Held { session, pos } => {
                self.held -= 1;
                let Some(state) = self.sessions.get_mut(&session) else {
                    debug_assert!(false, "holder {session:?} has no index");
                    return;
                };
                debug_assert_eq!(state.held.get(pos), Some(&key));
                state.held.swap_remove(pos);
                if let Some(&moved) = state.held.get(pos) {
                    if let Holder::Held { pos: p, .. } = &mut self.locks[moved].holder {
                        *p = pos;
                    }
                }
            }
            Holder::Orphan { timer, .. } => {
                self.orphaned -= 1;
                let cancelled = self.orphan_timers.cancel(timer);
                debug_assert!(cancelled.is_some(), "orphan timer already gone");
            }
        }
    }

    /// The lock `key` has just lost its holder: hand it to the first waiter (one grant, nobody
    /// else touched), or drop it from the table when nobody waits.
    fn pass_on(&mut self, key: usize, now_ms: u64, grants: &mut Vec<Grant>) {
        let Some(w) = self.locks[key].head.get() else {
            self.remove_lock(key);
            return;
        };
        self.unlink(w);
        let waiter = self.waiters.remove(w);
        // Index the new holding before removing the wait, so that the connection's entry is
        // never dropped and recreated in between.
        self.locks[key].holder = self.index_held(waiter.session, key);
        self.locks[key].since = now_ms;
        self.unindex_wait(waiter.session, waiter.pos);
        self.grants += 1;
        let token = self.fence.next();
        self.locks[key].token = token;
        grants.push(Grant {
            session: waiter.session,
            payload: waiter.payload,
            fence: token,
        });
    }

    fn enqueue(&mut self, key: usize, session: Session, payload: &[u8]) {
        let waits = &mut self.sessions.entry(session).or_default().waits;
        let tail = self.locks[key].tail.get();
        let w = self.waiters.insert(Waiter {
            session,
            lock: key,
            payload: payload.into(),
            prev: tail,
            next: None,
            pos: waits.len(),
        });
        waits.push(w);
        match tail {
            Some(t) => self.waiters[t].next = Some(w),
            None => self.locks[key].head = Link::new(Some(w)),
        }
        self.locks[key].tail = Link::new(Some(w));
    }

    /// Take waiter `w` out of its lock's queue (it stays in `waiters`).
    fn unlink(&mut self, w: usize) {
        let Waiter {
            prev, next, lock, ..
        } = self.waiters[w];
        match prev {
            Some(p) => self.waiters[p].next = next,
            None => self.locks[lock].head = Link::new(next),
        }
        match next {
            Some(n) => self.waiters[n].prev = prev,
            None => self.locks[lock].tail = Link::new(prev),
        }
    }

    /// Remove the wait at `pos` from `session`'s index.
    fn unindex_wait(&mut self, session: Session, pos: usize) {
        let Some(state) = self.sessions.get_mut(&session) else {
            debug_assert!(false, "waiter {session:?} has no index");
            return;
        };
        state.waits.swap_remove(pos);
        if let Some(&moved) = state.waits.get(pos) {
            self.waiters[moved].pos = pos;
        }
    }

    /// Check every index against the data it indexes; panics on a mismatch. O(table): for
    /// tests and fuzzing, never on the daemon's path.
    pub fn check_invariants(&self) {
        assert_eq!(self.by_name.len(), self.locks.len());
        let (mut held, mut orphaned, mut queued) = (0, 0, 0);
        for (key, lock) in &self.locks {
            assert_eq!(self.find(&lock.name), Some(key));
            assert_eq!(lock.hash, self.hasher.hash_one(&*lock.name));
            match lock.holder {
                Holder::Held { session, pos } => {
                    held += 1;
                    assert_eq!(self.sessions[&session].held[pos], key);
                }
                Holder::Orphan { .. } => orphaned += 1,
            }
            let mut prev = None;
            let mut cur = lock.head.get();
            while let Some(w) = cur {
                let waiter = &self.waiters[w];
                assert_eq!(waiter.lock, key);
                assert_eq!(waiter.prev, prev);
                assert_eq!(self.sessions[&waiter.session].waits[waiter.pos], w);
                queued += 1;
                prev = cur;
                cur = waiter.next;
            }
            assert_eq!(lock.tail.get(), prev);
        }
        assert_eq!((held, orphaned), (self.held, self.orphaned));
        assert_eq!(queued, self.waiters.len());
        assert_eq!(self.orphan_timers.len() as u64, self.orphaned);
        let (mut indexed_held, mut indexed_waits) = (0, 0);
        for (session, state) in &self.sessions {
            for (pos, &key) in state.held.iter().enumerate() {
                assert!(
                    matches!(self.locks[key].holder, Holder::Held { session: c, pos: p } if c == *session && p == pos)
                );
            }
            for (pos, &w) in state.waits.iter().enumerate() {
                assert_eq!(
                    (self.waiters[w].session, self.waiters[w].pos),
                    (*session, pos)
                );
            }
            indexed_held += state.held.len() as u64;
            indexed_waits += state.waits.len();
        }
        assert_eq!(indexed_held, self.held);
        assert_eq!(indexed_waits, self.waiters.len());
    }
}

/// Snapshot and restore, in a canonical form: locks in name order, each with its holder (or its
/// orphan number and deadline) and its queue in FIFO order.
impl LockdTable {
    const SNAPSHOT_MAGIC: &'static [u8] = b"HFlockd1";
}

impl Snapshot for LockdTable {
    type Config = LockdConfig;

    fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(Self::SNAPSHOT_MAGIC);
        codec::put_u64(out, self.orphan_timers.now());
        for v in [
            self.next_orphan_seq,
            self.fence.last(),
            self.grants,
            self.orphan_expiries,
            self.adoptions,
        ] {
            codec::put_u64(out, v);
        }
        let keys = self.sorted_keys();
        codec::put_u64(out, keys.len() as u64);
        for key in keys {
            let lock = &self.locks[key];
            codec::put_bytes(out, &lock.name);
            codec::put_u64(out, lock.token);
            codec::put_u64(out, lock.since);
            match lock.holder {
                Holder::Held { session, .. } => {
                    codec::put_u8(out, 0);
                    session.encode(out);
                }
                Holder::Orphan {
                    seq, deadline_ms, ..
                } => {
                    codec::put_u8(out, 1);
                    codec::put_u64(out, seq);
                    codec::put_u64(out, deadline_ms);
                }
            }
            let waiters: Vec<_> = self.waiters(&lock.name).collect();
            codec::put_u64(out, waiters.len() as u64);
            for (session, payload) in waiters {
                session.encode(out);
                codec::put_bytes(out, payload);
            }
            codec::spill(out);
        }
    }

    /// A table from bytes written by [`LockdTable::snapshot`]; untrusted (names out of order or
    /// twice, an orphan number not below the next one, payloads over old's 1 MiB frame limit are
    /// errors).
    fn restore(config: LockdConfig, r: &mut Reader<'_>) -> Result<LockdTable, DecodeError> {
        /// old's largest payload: the 20-bit length of its header.
        const MAX_PAYLOAD: usize = (1 << 20) - 1;
        r.expect(Self::SNAPSHOT_MAGIC, "lockd snapshot magic")?;
        let mut t = LockdTable::new(config, r.u64()?);
        t.next_orphan_seq = r.u64()?;
        t.fence.raise_to(r.u64()?);
        let (grants, orphan_expiries, adoptions) = (r.u64()?, r.u64()?, r.u64()?);
        let n = r.count(3)?;
        let mut last: Option<&[u8]> = None;
        for _ in 0..n {
            codec::consumed(r);
            let name = r.bytes(MAX_PAYLOAD)?;
            if last.is_some_and(|l| l >= name) {
                return Err(DecodeError::Invalid("lockd names out of order"));
            }
            last = Some(name);
            let token = r.u64()?;
            if token > t.fence.last() {
                return Err(DecodeError::Invalid("lockd token not yet issued"));
            }
            let since = r.u64()?;
            let hash = t.hasher.hash_one(name);
            let key = t.locks.vacant_key();
            let holder = match r.u8()? {
                0 => t.index_held(Session::decode(r)?, key),
                1 => {
                    let seq = r.u64()?;
                    let deadline_ms = r.u64()?;
                    if seq >= t.next_orphan_seq {
                        return Err(DecodeError::Invalid("lockd orphan number not yet issued"));
                    }
                    t.orphaned += 1;
                    let timer = t.orphan_timers.insert(
                        deadline_ms,
                        OrphanTimer {
                            deadline_ms,
                            seq,
                            lock: key,
                        },
                    );
                    Holder::Orphan {
                        timer,
                        seq,
                        deadline_ms,
                    }
                }
                _ => return Err(DecodeError::Invalid("lockd holder tag")),
            };
            let inserted = t.locks.insert(Lock {
                name: name.into(),
                hash,
                holder,
                token,
                since,
                head: Link::NONE,
                tail: Link::NONE,
            });
            debug_assert_eq!(inserted, key);
            t.by_name.insert_unique(hash, slab_id(key));
            let waiters = r.count(2)?;
            for _ in 0..waiters {
                let session = Session::decode(r)?;
                let payload = r.bytes(MAX_PAYLOAD)?;
                t.enqueue(key, session, payload);
            }
        }
        t.grants = grants;
        t.orphan_expiries = orphan_expiries;
        t.adoptions = adoptions;
        Ok(t)
    }
}

/// A lock's slab key as its id in `by_name`: a table holds far fewer than 2^32 locks (each
/// takes a hundred bytes and more, its name included).
#[inline]
fn slab_id(key: usize) -> u32 {
    debug_assert!(u32::try_from(key).is_ok());
    key as u32
}

#[cfg(test)]
#[path = "lockd_tests.rs"]
mod tests;

/// The table against a naive model (Vec queues, a BTreeMap of names, a fake clock), after every
/// step of seeded random command sequences.
#[cfg(test)]
#[path = "lockd_model_tests.rs"]
mod model_tests;
