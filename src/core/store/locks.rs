//! yrmcds's server-side locks on items, and the fencing token of every grant.
//!
//! Owns: the lock table (`locks`: slot to holder, grant time, fencing token and neighbours in the
//! holder's list), the per-holder lists (`sessions`), the lock commands (lock, unlock, unlock_all,
//! lock_and_get, replace_and_unlock, disconnect) and the lock queries (holder, token, since).
//! Must not: keep a locked item in the LRU, let a locked item expire or be evicted, or issue a
//! token other than from the shared [`Fence`].
//!
//! Locks live beside the items, not in them (few items are locked): `locks` maps a slot to its
//! holder and to its neighbours in the holder's intrusive list of locks, `sessions` maps a holder to
//! the ends of that list. Lock, unlock and the release of one lock are O(1); a disconnect is
//! O(locks of that connection); neither allocates beyond hash-table growth.

use super::expiry::{deadline_of, Timer};
use super::slab::NEVER;
use super::slab::{make_data, FETCHED, LOCKED, LRU, NIL};
use super::{ItemView, LockOutcome, RauOutcome, Store, UnlockOutcome, Write, ITEM_OVERHEAD};
use crate::core::fence::Fence;
use crate::core::{Now, Session};

/// One held lock: its holder and its neighbours in the holder's list (acquisition order).
pub(super) struct LockEntry {
    pub(super) holder: Session,
    /// When it was taken, in whole seconds of `Now::ms` (for the admin port's listing): 4 bytes
    /// keep the entry at 24 bytes, where a u64 of milliseconds cost 16 more per lock (alignment).
    pub(super) since_s: u32,
    /// The fencing token of this grant, as two halves (high, low): a u64 would align the entry
    /// to 8 bytes and cost 4 more per lock in the lock table.
    pub(super) token: [u32; 2],
    pub(super) prev: u32,
    pub(super) next: u32,
}

impl LockEntry {
    pub(super) fn token(&self) -> u64 {
        (u64::from(self.token[0]) << 32) | u64::from(self.token[1])
    }
}

/// Ends of one connection's list of held locks.
pub(super) struct ConnLocks {
    pub(super) head: u32,
    pub(super) tail: u32,
    pub(super) count: u32,
}

impl Store {
    pub fn lock(&mut self, session: Session, key: &[u8], now: Now) -> LockOutcome {
        match self.lock_for_token(session, key, now) {
            Ok(_) => LockOutcome::Ok,
            Err(e) => e,
        }
    }

    /// [`Store::lock`] that also answers the grant's fencing token (the binary Lock reply's CAS),
    /// without a second lookup.
    pub fn lock_for_token(
        &mut self,
        session: Session,
        key: &[u8],
        now: Now,
    ) -> Result<u64, LockOutcome> {
        self.sync(now);
        let Some(i) = self.lookup(key, now, false) else {
            return Err(LockOutcome::NotFound);
        };
        if self.slots[i as usize].is_locked() {
            self.stats.lock_conflicts += 1;
            return Err(LockOutcome::Locked);
        }
        self.acquire(i, session, now);
        Ok(self.fence.last())
    }

    pub fn unlock(&mut self, session: Session, key: &[u8], now: Now) -> UnlockOutcome {
        self.sync(now);
        let Some(i) = self.lookup(key, now, false) else {
            return UnlockOutcome::NotFound;
        };
        if self.holder(i) != Some(session) {
            return UnlockOutcome::NotLocked;
        }
        self.release(i, now);
        UnlockOutcome::Ok
    }

    pub fn unlock_all(&mut self, session: Session, now: Now) -> usize {
        self.sync(now);
        let mut released = 0;
        while let Some(head) = self.sessions.get(&session).map(|c| c.head) {
            self.release(head, now);
            released += 1;
        }
        released
    }

    pub fn lock_and_get(
        &mut self,
        session: Session,
        key: &[u8],
        exptime: Option<i64>,
        now: Now,
    ) -> Result<ItemView<'_>, LockOutcome> {
        self.sync(now);
        let Some(i) = self.lookup(key, now, true) else {
            self.stats.get_misses += 1;
            return Err(LockOutcome::NotFound);
        };
        if self.slots[i as usize].is_locked() {
            self.stats.lock_conflicts += 1;
            return Err(LockOutcome::Locked);
        }
        self.acquire(i, session, now);
        if let Some(exptime) = exptime {
            self.set_deadline(i, deadline_of(exptime, now), now);
        }
        self.stats.get_hits += 1;
        self.slots[i as usize].state |= FETCHED;
        Ok(self.view(i))
    }

    pub fn replace_and_unlock(
        &mut self,
        session: Session,
        w: Write<'_>,
        cas: Option<u64>,
        now: Now,
    ) -> RauOutcome {
        let Write {
            key,
            flags,
            exptime,
            value,
        } = w;
        self.sync(now);
        if value.len() > self.config.max_item_size {
            return RauOutcome::TooLarge;
        }
        let Some(i) = self.lookup(key, now, false) else {
            return RauOutcome::NotFound;
        };
        if self.holder(i) != Some(session) {
            return RauOutcome::NotLocked;
        }
        if cas.is_some_and(|c| c != self.slots[i as usize].cas) {
            return RauOutcome::Exists;
        }
        let data = make_data(key, &[value]);
        if !self.make_room(data.len() + ITEM_OVERHEAD, Some(i), now) {
            return RauOutcome::OutOfMemory;
        }
        self.rewrite(i, data);
        let new_cas = self.next_cas();
        let item = &mut self.slots[i as usize];
        item.cas = new_cas;
        item.flags = flags;
        self.set_deadline(i, deadline_of(exptime, now), now);
        self.release(i, now);
        self.stats.total_items += 1;
        RauOutcome::Stored { cas: new_cas }
    }

    /// Releases every lock `session` holds (its connection closed); returns how many.
    pub fn disconnect(&mut self, session: Session, now: Now) -> usize {
        self.unlock_all(session, now)
    }

    /// The fencing token of `key`'s lock if `session` holds it (text `lock_token`; the binary Lock
    /// reply's CAS field).
    pub fn lock_token(&self, session: Session, key: &[u8], now: Now) -> Option<u64> {
        let i = self.find(key)?;
        let e = self.locks.get(&i)?;
        (self.visible(i, now) && e.holder == session).then_some(e.token())
    }

    /// Share the service's fencing counter (see [`Fence`]).
    pub fn with_fence(mut self, fence: &Fence) -> Self {
        self.fence.join(fence);
        self
    }

    /// Who holds the lock on `key`, if it is visible and locked.
    pub fn lock_holder(&self, key: &[u8], now: Now) -> Option<Session> {
        let i = self.find(key)?;
        if self.visible(i, now) {
            self.holder(i)
        } else {
            None
        }
    }
}

impl Store {
    pub(super) fn holder(&self, i: u32) -> Option<Session> {
        if self.slots[i as usize].is_locked() {
            self.locks.get(&i).map(|e| e.holder)
        } else {
            None
        }
    }

    pub(super) fn locked_by_other(&self, i: u32, session: Session) -> bool {
        self.holder(i).is_some_and(|h| h != session)
    }

    /// Gives slot `i` (live, unlocked, in the LRU) to `session` with a new fencing token.
    fn acquire(&mut self, i: u32, session: Session, now: Now) {
        let token = self.fence.next();
        self.acquire_with(i, session, token, (now.ms / 1000) as u32);
    }

    pub(super) fn acquire_with(&mut self, i: u32, session: Session, token: u64, since_s: u32) {
        self.unlink(LRU, i);
        let item = &mut self.slots[i as usize];
        item.state |= LOCKED;
        self.locked_bytes += item.charge();
        let list = self.sessions.entry(session).or_insert(ConnLocks {
            head: NIL,
            tail: NIL,
            count: 0,
        });
        let prev = list.tail;
        list.tail = i;
        list.count += 1;
        if prev == NIL {
            list.head = i;
        } else if let Some(e) = self.locks.get_mut(&prev) {
            e.next = i;
        }
        self.locks.insert(
            i,
            LockEntry {
                holder: session,
                since_s,
                token: [(token >> 32) as u32, token as u32],
                prev,
                next: NIL,
            },
        );
        self.stats.lock_grants += 1;
    }

    /// Drops the lock of slot `i` from the lock tables; the item is then in no list.
    pub(super) fn detach_lock(&mut self, i: u32) {
        let Some(e) = self.locks.remove(&i) else {
            debug_assert!(false, "locked item without a lock entry");
            return;
        };
        if e.prev != NIL {
            if let Some(p) = self.locks.get_mut(&e.prev) {
                p.next = e.next;
            }
        }
        if e.next != NIL {
            if let Some(n) = self.locks.get_mut(&e.next) {
                n.prev = e.prev;
            }
        }
        if let Some(list) = self.sessions.get_mut(&e.holder) {
            if e.prev == NIL {
                list.head = e.next;
            }
            if e.next == NIL {
                list.tail = e.prev;
            }
            list.count -= 1;
            if list.count == 0 {
                self.sessions.remove(&e.holder);
            }
        }
        let item = &mut self.slots[i as usize];
        item.state &= !LOCKED;
        self.locked_bytes -= item.charge();
    }

    /// Unlocks slot `i`: back to the MRU end, or gone if its time ran out while it was locked.
    pub(super) fn release(&mut self, i: u32, now: Now) {
        self.detach_lock(i);
        self.link_head(LRU, i);
        let item = &self.slots[i as usize];
        if item.deadline <= now.ms {
            self.reap_expired(i);
        } else if item.deadline != NEVER && item.timer.is_none() {
            let deadline = item.deadline;
            let key = self.arm(deadline, Timer::Expire(i), now);
            self.slots[i as usize].timer = Some(key);
        }
    }
}

/// Read-only inspection for the admin port, tests and fuzzing: O(locks), never on the lock path.
impl Store {
    /// When `key`'s lock was taken (`Now::ms`, rounded down to a whole second), if it is locked.
    pub fn lock_since(&self, key: &[u8]) -> Option<u64> {
        let i = self.find(key)?;
        self.locks.get(&i).map(|e| u64::from(e.since_s) * 1000)
    }

    /// Every locked item's key and its holder. No order.
    pub fn for_each_lock(&self, mut f: impl FnMut(&[u8], Session)) {
        for (&i, e) in &self.locks {
            f(self.slots[i as usize].key(), e.holder);
        }
    }
}
