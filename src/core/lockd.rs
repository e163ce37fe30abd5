//! The old lock-daemon lock table (`specs/README.md`, "old lock-daemon protocol").
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
//! - `conns`: per connection, the slab keys of the locks it holds and of its queued ACQs; every
//!   lock and waiter records its position in that vector, so removal is a `swap_remove`.
//!   Disconnect walks only these two vectors.
//! - `orphan_timers`: one timer per orphan in the wheel, cancelled by ADOPT and REL.
//!
//! Invariant: a name has a queue only while it is locked (a release with waiters hands the lock
//! straight to the first of them), so "free" never has waiters and never needs a wake-up scan.

use std::hash::BuildHasher;

use super::hash::{HashMap, Seeded};
use hashbrown::hash_table::HashTable;
use slab::Slab;

use super::codec::{self, DecodeError, Reader, Snapshot};
use super::fence::Fence;
use super::wheel::{TimerKey, Wheel};
use super::ConnId;

#[derive(Clone, Copy, Debug)]
pub struct LockdConfig {
    pub orphan_timeout_ms: u64,
}

/// An asynchronous grant: `conn` now holds the lock it queued for with ACQ; the daemon answers
/// ACQUIRED echoing `payload` (the queued request's payload, byte for byte).
#[derive(Debug, PartialEq, Eq)]
pub struct Grant {
    pub conn: ConnId,
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
    Held(ConnId),
    /// Its holder disconnected; released at `deadline_ms` unless adopted before.
    Orphaned {
        deadline_ms: u64,
    },
}

pub struct LockdTable {
    config: LockdConfig,
    locks: Slab<Lock>,
    /// Slab keys of `locks`, found by the hash of the name stored in the entry.
    by_name: HashTable<usize>,
    hasher: Seeded,
    waiters: Slab<Waiter>,
    conns: HashMap<ConnId, ConnLocks>,
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
    name: Box<[u8]>,
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
    /// `pos` is this lock's index in `conns[conn].held`.
    Held { conn: ConnId, pos: usize },
    Orphan {
        timer: TimerKey,
        seq: u64,
        deadline_ms: u64,
    },
}

struct Waiter {
    conn: ConnId,
    /// Slab key of the lock this ACQ waits for.
    lock: usize,
    /// The ACQ's payload, echoed in its ACQUIRED.
    payload: Box<[u8]>,
    prev: Option<usize>,
    next: Option<usize>,
    /// This waiter's index in `conns[conn].waits`.
    pos: usize,
}

/// What one connection is involved in. Present only while non-empty.
#[derive(Default)]
struct ConnLocks {
    held: Vec<usize>,
    waits: Vec<usize>,
}

impl ConnLocks {
    fn is_empty(&self) -> bool {
        self.held.is_empty() && self.waits.is_empty()
    }
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
            by_name: HashTable::new(),
            hasher: Seeded::default(),
            waiters: Slab::new(),
            conns: HashMap::default(),
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

    /// ACQ: a free name is taken at once; a locked one (held by anybody, `conn` included, or
    /// orphaned) queues this request, `payload` and all, at the end of the name's FIFO.
    pub fn acquire(
        &mut self,
        conn: ConnId,
        name: &[u8],
        payload: &[u8],
        now_ms: u64,
    ) -> AcquireOutcome {
        let hash = self.hasher.hash_one(name);
        match self.find_hashed(name, hash) {
            None => {
                self.insert_lock(conn, name, hash, now_ms);
                AcquireOutcome::Acquired
            }
            Some(key) => {
                self.enqueue(key, conn, payload);
                AcquireOutcome::Queued
            }
        }
    }

    /// How many ACQs `conn` has queued (O(1)).
    pub fn queued_by(&self, conn: ConnId) -> usize {
        self.conns.get(&conn).map_or(0, |c| c.waits.len())
    }

    /// TRY: a free name is taken (true); a locked one, also by `conn` itself or an orphan, is
    /// not (false). Never queues.
    pub fn try_lock(&mut self, conn: ConnId, name: &[u8], now_ms: u64) -> bool {
        let hash = self.hasher.hash_one(name);
        if self.find_hashed(name, hash).is_some() {
            return false;
        }
        self.insert_lock(conn, name, hash, now_ms);
        true
    }

    /// REL: anybody may release any lock, held or orphaned (old-protocol.txt: "nobody 'owns' a
    /// lock"). The first queued ACQ, if any, becomes the holder and is pushed to `grants`.
    /// False if the name is not locked.
    pub fn release(
        &mut self,
        _conn: ConnId,
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

    /// ADOPT: an orphan becomes `conn`'s (its timer cancelled); true. Anything else (free, held,
    /// or an orphan whose deadline is at or before `now_ms`, which the next `advance` will
    /// release) is false: an orphan is adoptable only strictly *within* the timeout, whether or
    /// not the caller has advanced the table to `now_ms` yet.
    pub fn adopt(&mut self, conn: ConnId, name: &[u8], now_ms: u64) -> bool {
        let Some(key) = self.find(name) else {
            return false;
        };
        match self.locks[key].holder {
            Holder::Orphan { deadline_ms, .. } if now_ms < deadline_ms => {}
            _ => return false,
        }
        self.detach_holder(key);
        self.locks[key].holder = self.index_held(conn, key);
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
    pub fn disconnect(&mut self, conn: ConnId, now_ms: u64) {
        let Some(state) = self.conns.remove(&conn) else {
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
                matches!(self.locks[key].holder, Holder::Held { conn: c, .. } if c == conn)
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
    pub fn next_deadline(&self) -> Option<u64> {
        self.orphan_timers.next_deadline()
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
    pub fn for_each_lock(&self, mut f: impl FnMut(&[u8], Option<ConnId>, Option<u64>, u64)) {
        for (_, lock) in &self.locks {
            match lock.holder {
                Holder::Held { conn, .. } => f(&lock.name, Some(conn), None, lock.token),
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

    /// The fencing token of `name`'s lock if `conn` holds it (old's REQ_TOKEN).
    pub fn token_of(&self, conn: ConnId, name: &[u8]) -> Option<u64> {
        let lock = &self.locks[self.find(name)?];
        match lock.holder {
            Holder::Held { conn: c, .. } if c == conn => Some(lock.token),
            _ => None,
        }
    }

    /// The state of one name.
    pub fn state(&self, name: &[u8]) -> LockState {
        match self.find(name).map(|k| &self.locks[k].holder) {
            None => LockState::Free,
            Some(Holder::Held { conn, .. }) => LockState::Held(*conn),
            Some(Holder::Orphan { deadline_ms, .. }) => LockState::Orphaned {
                deadline_ms: *deadline_ms,
            },
        }
    }

    /// The queued ACQs of one name, next to be granted first: connection and payload.
    pub fn waiters<'a>(&'a self, name: &[u8]) -> impl Iterator<Item = (ConnId, &'a [u8])> + 'a {
        let head = self.find(name).and_then(|k| self.locks[k].head.get());
        std::iter::successors(head, move |&w| self.waiters[w].next).map(move |w| {
            let waiter = &self.waiters[w];
            (waiter.conn, &*waiter.payload)
        })
    }

    // ---- internals ----

    fn find(&self, name: &[u8]) -> Option<usize> {
        self.find_hashed(name, self.hasher.hash_one(name))
    }

    fn find_hashed(&self, name: &[u8], hash: u64) -> Option<usize> {
        let locks = &self.locks;
        self.by_name
            .find(hash, |&k| *locks[k].name == *name)
            .copied()
    }

    /// Lock a free name for `conn`: an immediate grant.
    fn insert_lock(&mut self, conn: ConnId, name: &[u8], hash: u64, now_ms: u64) {
        let key = self.locks.vacant_key();
        let holder = self.index_held(conn, key);
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
        let locks = &self.locks;
        self.by_name.insert_unique(hash, key, |&k| locks[k].hash);
        self.grants += 1;
    }

    /// A lock with no waiters left and no holder leaves the table.
    fn remove_lock(&mut self, key: usize) {
        let lock = self.locks.remove(key);
        debug_assert!(lock.head == Link::NONE && lock.tail == Link::NONE);
        match self.by_name.find_entry(lock.hash, |&k| k == key) {
            Ok(entry) => {
                entry.remove();
            }
            Err(_) => debug_assert!(false, "lock {key} missing from by_name"),
        }
    }

    /// Record that `conn` holds lock `key`; returns the holder to store in the lock.
    fn index_held(&mut self, conn: ConnId, key: usize) -> Holder {
        let held = &mut self.conns.entry(conn).or_default().held;
        let pos = held.len();
        held.push(key);
        self.held += 1;
        Holder::Held { conn, pos }
    }

    /// Undo the bookkeeping of the lock's current holder (connection index or orphan timer).
    /// The caller then stores a new holder or removes the lock.
    fn detach_holder(&mut self, key: usize) {
        match self.locks[key].holder {
            Holder::Held { conn, pos } => {
                self.held -= 1;
                let Some(state) = self.conns.get_mut(&conn) else {
                    debug_assert!(false, "holder {conn:?} has no index");
                    return;
                };
                debug_assert_eq!(state.held.get(pos), Some(&key));
                state.held.swap_remove(pos);
                if let Some(&moved) = state.held.get(pos) {
                    if let Holder::Held { pos: p, .. } = &mut self.locks[moved].holder {
                        *p = pos;
                    }
                }
                if state.is_empty() {
                    self.conns.remove(&conn);
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
        self.locks[key].holder = self.index_held(waiter.conn, key);
        self.locks[key].since = now_ms;
        self.unindex_wait(waiter.conn, waiter.pos);
        self.grants += 1;
        let token = self.fence.next();
        self.locks[key].token = token;
        grants.push(Grant {
            conn: waiter.conn,
            payload: waiter.payload,
            fence: token,
        });
    }

    fn enqueue(&mut self, key: usize, conn: ConnId, payload: &[u8]) {
        let waits = &mut self.conns.entry(conn).or_default().waits;
        let tail = self.locks[key].tail.get();
        let w = self.waiters.insert(Waiter {
            conn,
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

    /// Remove the wait at `pos` from `conn`'s index.
    fn unindex_wait(&mut self, conn: ConnId, pos: usize) {
        let Some(state) = self.conns.get_mut(&conn) else {
            debug_assert!(false, "waiter {conn:?} has no index");
            return;
        };
        state.waits.swap_remove(pos);
        if let Some(&moved) = state.waits.get(pos) {
            self.waiters[moved].pos = pos;
        }
        if state.is_empty() {
            self.conns.remove(&conn);
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
                Holder::Held { conn, pos } => {
                    held += 1;
                    assert_eq!(self.conns[&conn].held[pos], key);
                }
                Holder::Orphan { .. } => orphaned += 1,
            }
            let mut prev = None;
            let mut cur = lock.head.get();
            while let Some(w) = cur {
                let waiter = &self.waiters[w];
                assert_eq!(waiter.lock, key);
                assert_eq!(waiter.prev, prev);
                assert_eq!(self.conns[&waiter.conn].waits[waiter.pos], w);
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
        for (conn, state) in &self.conns {
            assert!(!state.is_empty(), "empty index kept for {conn:?}");
            for (pos, &key) in state.held.iter().enumerate() {
                assert!(
                    matches!(self.locks[key].holder, Holder::Held { conn: c, pos: p } if c == *conn && p == pos)
                );
            }
            for (pos, &w) in state.waits.iter().enumerate() {
                assert_eq!((self.waiters[w].conn, self.waiters[w].pos), (*conn, pos));
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
                Holder::Held { conn, .. } => {
                    codec::put_u8(out, 0);
                    conn.encode(out);
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
            for (conn, payload) in waiters {
                conn.encode(out);
                codec::put_bytes(out, payload);
            }
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
                0 => t.index_held(ConnId::decode(r)?, key),
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
            let locks = &t.locks;
            t.by_name.insert_unique(hash, key, |&k| locks[k].hash);
            let waiters = r.count(4)?;
            for _ in 0..waiters {
                let conn = ConnId::decode(r)?;
                let payload = r.bytes(MAX_PAYLOAD)?;
                t.enqueue(key, conn, payload);
            }
        }
        t.grants = grants;
        t.orphan_expiries = orphan_expiries;
        t.adoptions = adoptions;
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

    const TIMEOUT: u64 = 100;

    fn table() -> LockdTable {
        LockdTable::new(
            LockdConfig {
                orphan_timeout_ms: TIMEOUT,
            },
            0,
        )
    }

    fn c(slot: u32) -> ConnId {
        ConnId::new(0, slot, 0)
    }

    fn queue(t: &LockdTable, name: &[u8]) -> Vec<(ConnId, Vec<u8>)> {
        t.waiters(name).map(|(c, p)| (c, p.to_vec())).collect()
    }

    fn grant(conn: ConnId, payload: &[u8], fence: u64) -> Grant {
        Grant {
            conn,
            payload: payload.into(),
            fence,
        }
    }

    fn locked_names(t: &LockdTable) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        t.for_each_locked(|n| v.push(n.to_vec()));
        v.sort();
        v
    }

    #[test]
    fn held_since_is_the_time_the_holder_got_the_lock() {
        let mut t = table();
        assert_eq!(t.acquire(c(1), b"a", b"a\0", 5), AcquireOutcome::Acquired);
        assert!(t.try_lock(c(1), b"t", 6));
        assert_eq!(t.held_since(b"a"), Some(5));
        assert_eq!(t.held_since(b"t"), Some(6));
        assert_eq!(t.held_since(b"free"), None);
        t.disconnect(c(1), 10);
        assert_eq!(
            t.held_since(b"a"),
            Some(5),
            "an orphan keeps its holder's time"
        );
        assert!(t.adopt(c(2), b"a", 20));
        assert_eq!(t.held_since(b"a"), Some(20), "adopting is getting it");
        assert_eq!(t.acquire(c(3), b"a", b"a\0", 25), AcquireOutcome::Queued);
        assert!(t.release(c(2), b"a", 30, &mut Vec::new()));
        assert_eq!(t.held_since(b"a"), Some(30), "a waiter's time is its grant");
        t.check_invariants();
    }

    #[test]
    fn for_each_lock_names_the_holder_or_the_orphan_deadline() {
        let mut t = table();
        assert_eq!(t.acquire(c(1), b"a", b"a\0", 0), AcquireOutcome::Acquired);
        assert_eq!(t.acquire(c(2), b"b", b"b\0", 0), AcquireOutcome::Acquired);
        t.disconnect(c(2), 10);
        let mut seen = Vec::new();
        t.for_each_lock(|n, holder, orphan, _| seen.push((n.to_vec(), holder, orphan)));
        seen.sort();
        assert_eq!(
            seen,
            [
                (b"a".to_vec(), Some(c(1)), None),
                (b"b".to_vec(), None, Some(10 + TIMEOUT)),
            ]
        );
    }

    #[test]
    fn acquire_of_free_name_is_acquired_at_once() {
        let mut t = table();
        assert_eq!(t.acquire(c(1), b"a", b"a\0", 0), AcquireOutcome::Acquired);
        assert_eq!(t.state(b"a"), LockState::Held(c(1)));
        assert_eq!(t.last_fence(), 1);
        assert_eq!(
            t.stats(),
            LockdStats {
                held: 1,
                grants: 1,
                ..Default::default()
            }
        );
        t.check_invariants();
    }

    #[test]
    fn holder_acquiring_again_is_queued_and_granted_to_itself_after_release() {
        let mut t = table();
        let mut g = Vec::new();
        assert_eq!(t.acquire(c(1), b"a", b"a\0", 0), AcquireOutcome::Acquired);
        assert_eq!(
            t.acquire(c(1), b"a", b"a\0first", 0),
            AcquireOutcome::Queued
        );
        assert_eq!(
            t.acquire(c(1), b"a", b"a\0second", 0),
            AcquireOutcome::Queued
        );
        t.check_invariants();
        assert!(t.release(c(1), b"a", 0, &mut g));
        assert_eq!(g, vec![grant(c(1), b"a\0first", 2)]);
        assert_eq!(t.state(b"a"), LockState::Held(c(1)));
        assert_eq!(queue(&t, b"a"), vec![(c(1), b"a\0second".to_vec())]);
        t.check_invariants();
    }

    #[test]
    fn waiters_are_granted_in_fifo_order_with_their_own_payload() {
        let mut t = table();
        let mut g = Vec::new();
        t.acquire(c(9), b"a", b"a\0", 0);
        for i in 1..=4 {
            let payload = [b'a', 0, b'0' + i as u8];
            assert_eq!(t.acquire(c(i), b"a", &payload, 0), AcquireOutcome::Queued);
        }
        for i in 1..=4u32 {
            assert!(t.release(t_holder(&t, b"a"), b"a", 0, &mut g));
            assert_eq!(
                g.pop(),
                Some(grant(c(i), &[b'a', 0, b'0' + i as u8], 1 + u64::from(i)))
            );
            assert!(g.is_empty(), "exactly one grant per release");
            assert_eq!(t.state(b"a"), LockState::Held(c(i)));
            t.check_invariants();
        }
        assert!(t.release(c(4), b"a", 0, &mut g));
        assert!(g.is_empty());
        assert_eq!(t.state(b"a"), LockState::Free);
        t.check_invariants();
    }

    fn t_holder(t: &LockdTable, name: &[u8]) -> ConnId {
        match t.state(name) {
            LockState::Held(c) => c,
            other => panic!("not held: {other:?}"),
        }
    }

    #[test]
    fn anybody_may_release_any_lock() {
        let mut t = table();
        let mut g = Vec::new();
        t.acquire(c(1), b"a", b"a\0", 0);
        t.acquire(c(2), b"a", b"a\0", 0);
        // c(3) neither holds nor waits.
        assert!(t.release(c(3), b"a", 0, &mut g));
        assert_eq!(g, vec![grant(c(2), b"a\0", 2)]);
        assert_eq!(t.state(b"a"), LockState::Held(c(2)));
        // The former holder's index no longer lists the lock: its disconnect orphans nothing.
        t.disconnect(c(1), 0);
        assert_eq!(t.state(b"a"), LockState::Held(c(2)));
        t.check_invariants();
    }

    #[test]
    fn release_of_unlocked_name_fails() {
        let mut t = table();
        let mut g = Vec::new();
        assert!(!t.release(c(1), b"a", 0, &mut g));
        t.acquire(c(1), b"a", b"a\0", 0);
        assert!(t.release(c(1), b"a", 0, &mut g));
        assert!(!t.release(c(1), b"a", 0, &mut g), "second release");
        assert!(g.is_empty());
        assert_eq!(t.stats().held, 0);
        t.check_invariants();
    }

    #[test]
    fn try_lock_takes_a_free_name_and_never_queues() {
        let mut t = table();
        assert!(t.try_lock(c(1), b"a", 0));
        assert_eq!(t.state(b"a"), LockState::Held(c(1)));
        assert!(!t.try_lock(c(2), b"a", 0), "held by another");
        assert!(!t.try_lock(c(1), b"a", 0), "held by self");
        t.disconnect(c(1), 0);
        assert!(!t.try_lock(c(2), b"a", 0), "orphan");
        assert_eq!(t.stats().waiting, 0);
        assert_eq!(t.stats().grants, 1);
        t.check_invariants();
    }

    #[test]
    fn adopt_takes_an_orphan_and_cancels_its_timer() {
        let mut t = table();
        let mut g = Vec::new();
        t.acquire(c(1), b"a", b"a\0", 0);
        t.acquire(c(3), b"a", b"a\0w", 0);
        t.disconnect(c(1), 10);
        assert_eq!(
            t.state(b"a"),
            LockState::Orphaned {
                deadline_ms: 10 + TIMEOUT
            }
        );
        assert_next_deadline_by(t.next_deadline(), 10 + TIMEOUT);
        assert!(t.adopt(c(2), b"a", 50));
        assert_eq!(t.state(b"a"), LockState::Held(c(2)));
        assert_eq!(t.next_deadline(), None);
        t.advance(10_000, &mut g);
        assert!(g.is_empty(), "the cancelled timer never fires");
        assert_eq!(t.state(b"a"), LockState::Held(c(2)));
        assert_eq!(queue(&t, b"a"), vec![(c(3), b"a\0w".to_vec())]);
        let s = t.stats();
        assert_eq!(
            (s.held, s.orphaned, s.adoptions, s.orphan_expiries),
            (1, 0, 1, 0)
        );
        t.check_invariants();
    }

    #[test]
    fn adopt_of_free_or_held_name_fails() {
        let mut t = table();
        assert!(!t.adopt(c(1), b"a", 0), "free");
        t.acquire(c(1), b"a", b"a\0", 0);
        assert!(!t.adopt(c(2), b"a", 0), "held by another");
        assert!(!t.adopt(c(1), b"a", 0), "held by self");
        t.disconnect(c(1), 0);
        assert!(t.adopt(c(2), b"a", 0));
        assert!(!t.adopt(c(3), b"a", 0), "already adopted");
        assert_eq!(t.stats().adoptions, 1);
        t.check_invariants();
    }

    #[test]
    fn orphan_expires_exactly_at_its_deadline() {
        let mut t = table();
        let mut g = Vec::new();
        t.acquire(c(1), b"a", b"a\0", 0);
        t.disconnect(c(1), 5);
        t.advance(5 + TIMEOUT - 1, &mut g);
        assert_eq!(
            t.state(b"a"),
            LockState::Orphaned {
                deadline_ms: 5 + TIMEOUT
            }
        );
        t.advance(5 + TIMEOUT, &mut g);
        assert_eq!(t.state(b"a"), LockState::Free);
        assert!(g.is_empty());
        assert_eq!(t.next_deadline(), None);
        let s = t.stats();
        assert_eq!((s.orphaned, s.orphan_expiries), (0, 1));
        t.check_invariants();
    }

    #[test]
    fn adopt_one_ms_before_the_deadline_wins_the_race() {
        let mut t = table();
        let mut g = Vec::new();
        t.acquire(c(1), b"a", b"a\0", 0);
        t.acquire(c(3), b"a", b"a\0w", 0);
        t.disconnect(c(1), 0);
        t.advance(TIMEOUT - 1, &mut g);
        assert!(t.adopt(c(2), b"a", TIMEOUT - 1));
        t.advance(TIMEOUT, &mut g);
        assert!(g.is_empty());
        assert_eq!(t.state(b"a"), LockState::Held(c(2)));
        t.check_invariants();
    }

    #[test]
    fn adopt_at_the_deadline_after_advance_finds_the_lock_granted() {
        let mut t = table();
        let mut g = Vec::new();
        t.acquire(c(1), b"a", b"a\0", 0);
        t.acquire(c(3), b"a", b"a\0w", 0);
        t.disconnect(c(1), 0);
        t.advance(TIMEOUT, &mut g);
        assert_eq!(g, vec![grant(c(3), b"a\0w", 2)]);
        assert!(!t.adopt(c(2), b"a", TIMEOUT));
        assert_eq!(t.state(b"a"), LockState::Held(c(3)));
        t.check_invariants();
    }

    #[test]
    fn adopt_at_the_deadline_before_advance_is_refused() {
        // The owner may run a command at the deadline before the timer turn: the orphan is
        // already expired in time, so adoption must not resurrect it.
        let mut t = table();
        let mut g = Vec::new();
        t.acquire(c(1), b"a", b"a\0", 0);
        t.disconnect(c(1), 0);
        assert!(!t.adopt(c(2), b"a", TIMEOUT));
        t.advance(TIMEOUT, &mut g);
        assert_eq!(t.state(b"a"), LockState::Free);
        t.check_invariants();
    }

    #[test]
    fn waiter_disconnecting_before_its_turn_is_skipped() {
        let mut t = table();
        let mut g = Vec::new();
        t.acquire(c(1), b"a", b"a\0", 0);
        t.acquire(c(2), b"a", b"a\x002", 0);
        t.acquire(c(3), b"a", b"a\x003", 0);
        t.acquire(c(2), b"a", b"a\x002bis", 0);
        t.disconnect(c(2), 0);
        assert_eq!(queue(&t, b"a"), vec![(c(3), b"a\x003".to_vec())]);
        assert!(t.release(c(1), b"a", 0, &mut g));
        assert_eq!(g, vec![grant(c(3), b"a\x003", 2)]);
        t.check_invariants();
    }

    #[test]
    fn holder_disconnect_grants_the_waiter_only_after_the_orphan_timeout() {
        let mut t = table();
        let mut g = Vec::new();
        t.acquire(c(1), b"a", b"a\0", 0);
        t.acquire(c(2), b"a", b"a\x002", 0);
        t.acquire(c(3), b"a", b"a\x003", 0);
        t.disconnect(c(1), 7);
        t.advance(7, &mut g);
        t.advance(7 + TIMEOUT - 1, &mut g);
        assert!(g.is_empty());
        assert!(matches!(t.state(b"a"), LockState::Orphaned { .. }));
        t.advance(7 + TIMEOUT, &mut g);
        assert_eq!(g, vec![grant(c(2), b"a\x002", 2)], "only the first waiter");
        assert_eq!(queue(&t, b"a"), vec![(c(3), b"a\x003".to_vec())]);
        t.check_invariants();
    }

    #[test]
    fn each_orphan_times_out_from_its_own_disconnect() {
        let mut t = table();
        let mut g = Vec::new();
        t.acquire(c(1), b"a", b"a\0", 0);
        t.acquire(c(1), b"b", b"b\0", 0);
        t.acquire(c(2), b"c", b"c\0", 0);
        t.disconnect(c(1), 10);
        t.disconnect(c(2), 30);
        assert_eq!(t.stats().orphaned, 3);
        t.advance(10 + TIMEOUT, &mut g);
        assert_eq!(t.state(b"a"), LockState::Free);
        assert_eq!(t.state(b"b"), LockState::Free);
        assert!(
            matches!(t.state(b"c"), LockState::Orphaned { deadline_ms } if deadline_ms == 30 + TIMEOUT)
        );
        assert_next_deadline_by(t.next_deadline(), 30 + TIMEOUT);
        t.advance(30 + TIMEOUT, &mut g);
        assert_eq!(t.state(b"c"), LockState::Free);
        assert_eq!(t.stats().orphan_expiries, 3);
        t.check_invariants();
    }

    #[test]
    fn release_of_an_orphan_cancels_its_timer_and_grants_the_next_waiter() {
        let mut t = table();
        let mut g = Vec::new();
        t.acquire(c(1), b"a", b"a\0", 0);
        t.acquire(c(2), b"a", b"a\x002", 0);
        t.disconnect(c(1), 0);
        assert!(t.release(c(3), b"a", 1, &mut g));
        assert_eq!(g, vec![grant(c(2), b"a\x002", 2)]);
        assert_eq!(t.next_deadline(), None);
        g.clear();
        t.advance(TIMEOUT, &mut g);
        assert!(g.is_empty());
        assert_eq!(t.state(b"a"), LockState::Held(c(2)));
        t.check_invariants();
    }

    #[test]
    fn disconnect_of_a_holder_that_also_waits_orphans_and_dequeues() {
        let mut t = table();
        let mut g = Vec::new();
        t.acquire(c(1), b"a", b"a\0", 0);
        t.acquire(c(1), b"a", b"a\0again", 0);
        t.acquire(c(2), b"a", b"a\x002", 0);
        t.acquire(c(1), b"a", b"a\0again2", 0);
        t.acquire(c(2), b"b", b"b\0", 0);
        t.acquire(c(1), b"b", b"b\0", 0);
        t.disconnect(c(1), 0);
        assert_eq!(queue(&t, b"a"), vec![(c(2), b"a\x002".to_vec())]);
        assert_eq!(queue(&t, b"b"), vec![]);
        assert_eq!(t.stats().waiting, 1);
        t.advance(TIMEOUT, &mut g);
        assert_eq!(g, vec![grant(c(2), b"a\x002", 3)]);
        t.check_invariants();
    }

    #[test]
    fn a_new_generation_of_a_slot_is_a_different_connection() {
        let mut t = table();
        let mut g = Vec::new();
        let old = ConnId::new(0, 1, 0);
        let new = ConnId::new(0, 1, 1);
        t.acquire(c(5), b"a", b"a\0", 0);
        t.acquire(old, b"a", b"a\0old", 0);
        t.acquire(old, b"b", b"b\0", 0);
        t.disconnect(old, 0);
        t.acquire(new, b"a", b"a\0new", 0);
        assert!(t.release(c(5), b"a", 0, &mut g));
        assert_eq!(g, vec![grant(new, b"a\0new", 3)]);
        assert!(
            !t.try_lock(new, b"b", 0),
            "old generation's lock is an orphan"
        );
        assert!(t.adopt(new, b"b", 0));
        t.check_invariants();
    }

    #[test]
    fn sync_lists_held_and_orphaned_names() {
        let mut t = table();
        t.acquire(c(1), b"held", b"held\0", 0);
        t.acquire(c(2), b"orphan", b"orphan\0", 0);
        t.acquire(c(1), b"gone", b"gone\0", 0);
        t.acquire(c(1), b"", b"\0", 0);
        t.disconnect(c(2), 0);
        let mut g = Vec::new();
        t.release(c(1), b"gone", 0, &mut g);
        assert_eq!(
            locked_names(&t),
            vec![b"".to_vec(), b"held".to_vec(), b"orphan".to_vec()]
        );
    }

    #[test]
    fn fences_strictly_increase_over_grants_and_adoptions() {
        let mut t = table();
        let mut g = Vec::new();
        t.acquire(c(1), b"a", b"a\0", 0);
        assert_eq!(t.last_fence(), 1);
        assert!(t.try_lock(c(1), b"b", 0));
        assert_eq!(t.last_fence(), 2);
        t.acquire(c(2), b"a", b"a\0", 0);
        assert_eq!(t.last_fence(), 2, "queueing grants nothing");
        t.release(c(1), b"a", 0, &mut g);
        assert_eq!(g[0].fence, 3);
        t.disconnect(c(1), 0);
        assert!(t.adopt(c(3), b"b", 0));
        assert_eq!(t.last_fence(), 4);
        assert_eq!(t.stats().grants, 3, "adoption is not a grant");
    }

    #[test]
    fn thousand_waiters_on_one_name_are_each_granted_once_in_order() {
        const N: u32 = 1000;
        let mut t = table();
        let mut g = Vec::new();
        t.acquire(c(N), b"hot", b"hot\0", 0);
        for i in 0..N {
            let payload = format!("hot\0{i}");
            assert_eq!(
                t.acquire(c(i), b"hot", payload.as_bytes(), 0),
                AcquireOutcome::Queued
            );
        }
        assert_eq!(t.stats().waiting, u64::from(N));
        let mut holder = c(N);
        for i in 0..N {
            assert!(t.release(holder, b"hot", 0, &mut g));
            assert_eq!(g.len(), 1, "exactly one grant per release");
            let got = g.pop().expect("one grant");
            assert_eq!(got.conn, c(i));
            assert_eq!(&*got.payload, format!("hot\0{i}").as_bytes());
            holder = got.conn;
        }
        assert!(t.release(holder, b"hot", 0, &mut g));
        assert!(g.is_empty());
        let s = t.stats();
        assert_eq!((s.held, s.waiting, s.grants), (0, 0, u64::from(N) + 1));
        assert!(t.conns.is_empty() && t.locks.is_empty() && t.waiters.is_empty());
        t.check_invariants();
    }

    #[test]
    fn orphan_timeout_of_zero_expires_at_the_next_advance() {
        let mut t = LockdTable::new(
            LockdConfig {
                orphan_timeout_ms: 0,
            },
            0,
        );
        let mut g = Vec::new();
        t.acquire(c(1), b"a", b"a\0", 3);
        t.disconnect(c(1), 3);
        assert!(!t.adopt(c(2), b"a", 3));
        t.advance(3, &mut g);
        assert_eq!(t.state(b"a"), LockState::Free);
    }
}

/// The table against a naive model (Vec queues, a BTreeMap of names, a fake clock), after every
/// step of seeded random command sequences.
#[cfg(test)]
mod model_tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap as StdHashMap};

    const TIMEOUT: u64 = 20;
    const SLOTS: u32 = 5;
    const NAMES: [&[u8]; 4] = [b"a", b"b", b"", b"long name \xff"];

    use crate::rng::Rng;

    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum MHolder {
        Held(ConnId),
        Orphan(u64),
    }

    struct MLock {
        holder: MHolder,
        queue: Vec<(ConnId, Vec<u8>)>,
    }

    #[derive(Default)]
    struct Model {
        locks: BTreeMap<Vec<u8>, MLock>,
        grants: u64,
        expiries: u64,
        adoptions: u64,
        fence: u64,
    }

    impl Model {
        fn acquire(&mut self, conn: ConnId, name: &[u8], payload: &[u8]) -> AcquireOutcome {
            match self.locks.get_mut(name) {
                Some(lock) => {
                    lock.queue.push((conn, payload.to_vec()));
                    AcquireOutcome::Queued
                }
                None => {
                    self.take(conn, name);
                    AcquireOutcome::Acquired
                }
            }
        }
        fn take(&mut self, conn: ConnId, name: &[u8]) {
            self.locks.insert(
                name.to_vec(),
                MLock {
                    holder: MHolder::Held(conn),
                    queue: Vec::new(),
                },
            );
            self.grants += 1;
            self.fence += 1;
        }
        fn try_lock(&mut self, conn: ConnId, name: &[u8]) -> bool {
            if self.locks.contains_key(name) {
                return false;
            }
            self.take(conn, name);
            true
        }
        fn pass_on(&mut self, name: &[u8], out: &mut Vec<(ConnId, Vec<u8>)>) {
            let Some(lock) = self.locks.get_mut(name) else {
                panic!("model: pass_on of a free name");
            };
            if lock.queue.is_empty() {
                self.locks.remove(name);
                return;
            }
            let (conn, payload) = lock.queue.remove(0);
            lock.holder = MHolder::Held(conn);
            self.grants += 1;
            self.fence += 1;
            out.push((conn, payload));
        }
        fn release(&mut self, name: &[u8], out: &mut Vec<(ConnId, Vec<u8>)>) -> bool {
            if !self.locks.contains_key(name) {
                return false;
            }
            self.pass_on(name, out);
            true
        }
        fn adopt(&mut self, conn: ConnId, name: &[u8], now: u64) -> bool {
            match self.locks.get_mut(name) {
                Some(lock) if matches!(lock.holder, MHolder::Orphan(d) if now < d) => {
                    lock.holder = MHolder::Held(conn);
                    self.adoptions += 1;
                    self.fence += 1;
                    true
                }
                _ => false,
            }
        }
        fn disconnect(&mut self, conn: ConnId, now: u64) {
            for lock in self.locks.values_mut() {
                if lock.holder == MHolder::Held(conn) {
                    lock.holder = MHolder::Orphan(now + TIMEOUT);
                }
                lock.queue.retain(|(c, _)| *c != conn);
            }
        }
        fn advance(&mut self, now: u64, out: &mut Vec<(ConnId, Vec<u8>)>) {
            let mut due: Vec<(u64, Vec<u8>)> = self
                .locks
                .iter()
                .filter_map(|(n, l)| match l.holder {
                    MHolder::Orphan(d) if d <= now => Some((d, n.clone())),
                    _ => None,
                })
                .collect();
            due.sort();
            for (_, name) in due {
                self.expiries += 1;
                self.pass_on(&name, out);
            }
        }
        fn stats(&self) -> LockdStats {
            let mut s = LockdStats {
                grants: self.grants,
                orphan_expiries: self.expiries,
                adoptions: self.adoptions,
                ..Default::default()
            };
            for lock in self.locks.values() {
                match lock.holder {
                    MHolder::Held(_) => s.held += 1,
                    MHolder::Orphan(_) => s.orphaned += 1,
                }
                s.waiting += lock.queue.len() as u64;
            }
            s
        }
    }

    /// Counts of interesting events, to show the random walk actually reaches them.
    #[derive(Default, Debug)]
    struct Coverage {
        async_grants: u64,
        self_grants: u64,
        adoptions: u64,
        expiries: u64,
        queued_leaving_on_disconnect: u64,
        max_queue: usize,
    }

    fn compare(t: &LockdTable, m: &Model, step: u64) {
        t.check_invariants();
        for name in NAMES {
            let want = match m.locks.get(name).map(|l| l.holder) {
                None => LockState::Free,
                Some(MHolder::Held(c)) => LockState::Held(c),
                Some(MHolder::Orphan(d)) => LockState::Orphaned { deadline_ms: d },
            };
            assert_eq!(t.state(name), want, "step {step}: state of {name:?}");
            let got: Vec<(ConnId, Vec<u8>)> =
                t.waiters(name).map(|(c, p)| (c, p.to_vec())).collect();
            let want = m
                .locks
                .get(name)
                .map(|l| l.queue.clone())
                .unwrap_or_default();
            assert_eq!(got, want, "step {step}: queue of {name:?}");
        }
        let mut locked = Vec::new();
        t.for_each_locked(|n| locked.push(n.to_vec()));
        locked.sort();
        let want: Vec<Vec<u8>> = m.locks.keys().cloned().collect();
        assert_eq!(locked, want, "step {step}: locked names");
        assert_eq!(t.stats(), m.stats(), "step {step}: stats");
        assert_eq!(t.last_fence(), m.fence, "step {step}: fence");
    }

    /// The connections alive now (one per slot), and every queued ACQ's payload (unique: it
    /// carries a serial number) with its connection, until it is granted or its conn leaves.
    struct Clients {
        live: Vec<ConnId>,
        outstanding: StdHashMap<Vec<u8>, ConnId>,
    }

    /// Grants of one step: the same set as the model's (their order across different names
    /// may differ when orphans expire at the same instant), fences strictly increasing and
    /// ending at the model's counter; every grant goes to a live connection and was queued.
    fn check_grants(
        step: u64,
        got: &mut Vec<Grant>,
        want: &mut Vec<(ConnId, Vec<u8>)>,
        fence_before: u64,
        m: &Model,
        clients: &mut Clients,
        cov: &mut Coverage,
    ) {
        let Clients { live, outstanding } = clients;
        let mut fence = fence_before;
        for g in got.iter() {
            assert!(g.fence > fence, "step {step}: fence not increasing");
            fence = g.fence;
            assert!(live.contains(&g.conn), "step {step}: grant to a dead conn");
            assert_eq!(
                outstanding.remove(&*g.payload),
                Some(g.conn),
                "step {step}: granted an ACQ that was not waiting"
            );
        }
        if !got.is_empty() {
            // Asynchronous grants never share a step with an immediate one or an adoption.
            assert_eq!(fence, m.fence, "step {step}: last grant fence");
        }
        let mut got_set: Vec<(ConnId, Vec<u8>)> = got
            .drain(..)
            .map(|g| (g.conn, g.payload.to_vec()))
            .collect();
        got_set.sort();
        want.sort();
        assert_eq!(&got_set, want, "step {step}: grants");
        cov.async_grants += want.len() as u64;
        want.clear();
    }

    fn run(seed: u64, steps: u64, cov: &mut Coverage) {
        run_restoring(seed, steps, cov, None)
    }

    /// With `restore_every`, the table is replaced by a restored copy of its snapshot every that
    /// many steps and must go on matching the model exactly.
    fn run_restoring(seed: u64, steps: u64, cov: &mut Coverage, restore_every: Option<u64>) {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut t = LockdTable::new(
            LockdConfig {
                orphan_timeout_ms: TIMEOUT,
            },
            0,
        );
        let mut m = Model::default();
        let mut clients = Clients {
            live: (0..SLOTS)
                .map(|s| ConnId::new((s % 2) as u16, s, 0))
                .collect(),
            outstanding: StdHashMap::new(),
        };
        let mut now = 0u64;
        let mut serial = 0u64;
        let mut got = Vec::new();
        let mut want = Vec::new();
        for step in 0..steps {
            let conn = clients.live[rng.below(u64::from(SLOTS)) as usize];
            let name = NAMES[rng.below(NAMES.len() as u64) as usize];
            let fence_before = m.fence;
            match rng.below(100) {
                0..=29 => {
                    serial += 1;
                    let mut payload = name.to_vec();
                    payload.push(0);
                    payload.extend_from_slice(serial.to_string().as_bytes());
                    let out = t.acquire(conn, name, &payload, now);
                    assert_eq!(out, m.acquire(conn, name, &payload), "step {step}: acquire");
                    if out == AcquireOutcome::Queued {
                        clients.outstanding.insert(payload, conn);
                    }
                }
                30..=39 => {
                    assert_eq!(
                        t.try_lock(conn, name, now),
                        m.try_lock(conn, name),
                        "step {step}: try"
                    );
                }
                40..=57 => {
                    let before = t.state(name);
                    let ok = t.release(conn, name, now, &mut got);
                    assert_eq!(ok, m.release(name, &mut want), "step {step}: release");
                    assert!(
                        got.len() <= 1,
                        "step {step}: more than one grant per release"
                    );
                    if let (LockState::Held(h), Some(g)) = (before, got.first()) {
                        if g.conn == h {
                            cov.self_grants += 1;
                        }
                    }
                }
                58..=65 => {
                    let ok = t.adopt(conn, name, now);
                    assert_eq!(ok, m.adopt(conn, name, now), "step {step}: adopt");
                    cov.adoptions += u64::from(ok);
                }
                66..=71 => {
                    let waits = t.conns.get(&conn).map_or(0, |s| s.waits.len());
                    cov.queued_leaving_on_disconnect += waits as u64;
                    t.disconnect(conn, now);
                    m.disconnect(conn, now);
                    clients.outstanding.retain(|_, c| *c != conn);
                    // Reconnect in the same slot as a new generation.
                    let slot = conn.slot as usize;
                    clients.live[slot] = ConnId::new(conn.worker, conn.slot, conn.gen + 1);
                }
                72..=89 => {
                    now += rng.below(TIMEOUT / 2);
                    let before = m.expiries;
                    t.advance(now, &mut got);
                    m.advance(now, &mut want);
                    cov.expiries += m.expiries - before;
                }
                _ => now += rng.below(TIMEOUT / 3 + 1),
            }
            check_grants(
                step,
                &mut got,
                &mut want,
                fence_before,
                &m,
                &mut clients,
                cov,
            );
            compare(&t, &m, step);
            if restore_every.is_some_and(|n| step % n == n - 1) {
                let before = t.stats();
                t = crate::core::codec::testing::round_trip(&t, t.config, seed ^ step, |c| {
                    c.check_invariants()
                });
                assert_eq!(t.stats(), before);
            }
            for l in m.locks.values() {
                cov.max_queue = cov.max_queue.max(l.queue.len());
            }
        }

        // Drain: release everything until nothing is locked; every ACQ still waiting must be
        // granted exactly once on the way (none lost).
        now += TIMEOUT;
        let fence_before = m.fence;
        t.advance(now, &mut got);
        m.advance(now, &mut want);
        check_grants(
            steps,
            &mut got,
            &mut want,
            fence_before,
            &m,
            &mut clients,
            cov,
        );
        while let Some(name) = m.locks.keys().next().cloned() {
            let fence_before = m.fence;
            assert!(t.release(clients.live[0], &name, now, &mut got));
            assert!(m.release(&name, &mut want));
            check_grants(
                steps,
                &mut got,
                &mut want,
                fence_before,
                &m,
                &mut clients,
                cov,
            );
            compare(&t, &m, steps);
        }
        assert!(
            clients.outstanding.is_empty(),
            "seed {seed}: waiters lost: {:?}",
            clients.outstanding
        );
        assert!(t.locks.is_empty() && t.waiters.is_empty() && t.by_name.is_empty());
        assert_eq!(t.next_deadline(), None);
    }

    #[test]
    fn a_table_restored_from_its_snapshot_goes_on_exactly_like_the_original() {
        let mut cov = Coverage::default();
        for seed in 11..=13 {
            run_restoring(seed, 20_000, &mut cov, Some(29));
        }
        assert!(cov.async_grants > 100 && cov.expiries > 10, "{cov:?}");
    }

    #[test]
    fn truncated_or_corrupt_lockd_snapshots_are_errors_not_panics() {
        let config = LockdConfig {
            orphan_timeout_ms: 100,
        };
        let mut t = LockdTable::new(config, 0);
        let c = |slot| ConnId::new(0, slot, 0);
        let mut g = Vec::new();
        t.acquire(c(1), b"a", b"a\0", 0);
        t.acquire(c(2), b"a", b"a\0x", 0);
        t.acquire(c(1), b"b", b"b\0", 0);
        t.disconnect(c(1), 5);
        t.acquire(c(3), b"c", b"c\0", 6);
        t.advance(6, &mut g);
        crate::core::codec::testing::damage_is_refused(&t, config, 2000, |c| c.check_invariants());
    }

    #[test]
    fn random_commands_match_the_naive_model() {
        let mut cov = Coverage::default();
        for seed in 1..=8 {
            run(seed, 30_000, &mut cov);
        }
        eprintln!("coverage: {cov:?}");
        // The walk must have reached every interesting transition, many times.
        assert!(cov.async_grants > 1000, "{cov:?}");
        assert!(cov.self_grants > 100, "{cov:?}");
        assert!(cov.adoptions > 100, "{cov:?}");
        assert!(cov.expiries > 100, "{cov:?}");
        assert!(cov.queued_leaving_on_disconnect > 100, "{cov:?}");
        assert!(cov.max_queue >= 5, "{cov:?}");
    }
}
