//! Expiry: memcached's exptime rules, what a command sees at a time, `flush_all`, and the
//! store's timing wheel.
//!
//! Owns: the conversion of an exptime into a deadline, the visibility rule (expired, flushed or
//! locked), the delayed flush and the batched freeing of flushed items, and every timer of the
//! store. Must not: read a clock (time comes in as [`Now`]), or expire a locked item.
//!
//! # Choices the protocol leaves open (memcached 1.6 behaviour unless said otherwise)
//!
//! - Expiry is kept as a monotonic deadline in ms, computed once when the exptime is given:
//!   relative seconds (1..=30 days) from `now.ms`; an absolute Unix time from `now.unix`. An item is
//!   expired when `deadline <= now.ms`. Absolute times at or before `now.unix` and negative values
//!   are "already expired": the command succeeds, the item is invisible at once and reaped by the
//!   wheel at the next `advance`.
//! - `flush_all` takes its delay like an exptime (memcached passes it through `realtime()`): `<= 0`
//!   flushes now; relative up to 30 days; larger is a Unix time. Only one flush is ever pending: a
//!   later `flush_all` (delayed or not) replaces an earlier pending one, as memcached's single
//!   `oldest_live` does. When the flush time comes, every item then existing and unlocked becomes
//!   invalid (so items stored while the flush was pending die too, as in memcached); locked items
//!   survive it, also after their later unlock. A flush is O(locks): the unlocked items are moved as
//!   one list onto a "dead" list (an epoch number tells dead from live) and their memory is freed in
//!   batches by the wheel, or first of all when room is needed. `curr_items` and `bytes` drop at
//!   once.

use super::slab::{DEAD, EMPTY, FETCHED, LRU, NEVER, NIL, OCCUPIED};
use super::Store;
use crate::core::wheel::TimerKey;
use crate::core::Now;

/// Longest relative exptime (30 days, protocol.txt); a larger exptime is an absolute Unix time.
pub const RELATIVE_EXPTIME_MAX: i64 = 60 * 60 * 24 * 30;

/// Flushed items freed per wheel tick, so that a flush of millions of items never stalls the owner
/// thread for long; the rest is freed one millisecond later, or on demand when room is needed.
pub(super) const RECLAIM_BATCH: usize = 4096;

/// Longest span a single timer is set for. A deadline further away (a far absolute exptime) is
/// re-armed when this timer fires, so the wheel never sees absurd deadlines.
const MAX_TIMER_SPAN_MS: u64 = 1 << 36; // about 2.2 years

/// What the store's wheel holds.
#[derive(Clone, Copy, Debug)]
pub(super) enum Timer {
    /// The item in this slot may have expired.
    Expire(u32),
    /// The pending delayed `flush_all` may be due.
    Flush,
    /// Free a batch of flushed items.
    Reclaim,
}

/// Converts a memcached exptime into a monotonic deadline in ms (see the module header).
pub(super) fn deadline_of(exptime: i64, now: Now) -> u64 {
    match exptime {
        0 => NEVER,
        e if e < 0 => now.ms,
        e if e <= RELATIVE_EXPTIME_MAX => now.ms.saturating_add(e.unsigned_abs() * 1000),
        e => {
            let at = e.unsigned_abs();
            if at <= now.unix {
                now.ms
            } else {
                now.ms.saturating_add((at - now.unix).saturating_mul(1000))
            }
        }
    }
}

impl Store {
    pub fn flush_all(&mut self, delay: i64, now: Now) {
        self.sync(now);
        if let Some((_, timer)) = self.pending_flush.take() {
            self.wheel.cancel(timer);
        }
        let at = if delay <= 0 {
            now.ms
        } else {
            deadline_of(delay, now)
        };
        if at <= now.ms {
            self.flush_now(now);
        } else {
            let timer = self.arm(at, Timer::Flush, now);
            self.pending_flush = Some((at, timer));
        }
    }

    pub fn next_deadline(&self) -> Option<u64> {
        self.wheel.next_deadline()
    }

    /// See [`crate::core::wheel::Wheel::next_staging`].
    pub fn next_staging(&self) -> Option<u64> {
        self.wheel.next_staging()
    }

    /// Runs every timer due at `now`: expiry of unlocked items, a due delayed flush, and the
    /// freeing of flushed items.
    pub fn advance(&mut self, now: Now) {
        self.sync(now);
        let mut fired = std::mem::take(&mut self.fired);
        self.wheel.advance_to(now.ms, &mut fired);
        for timer in fired.drain(..) {
            match timer {
                Timer::Expire(i) => self.on_expire(i, now),
                Timer::Flush => {
                    // `sync` above has run a due flush and cancelled its timer; a timer that fires
                    // early (or was clamped to MAX_TIMER_SPAN_MS) is re-armed.
                    if let Some((at, _)) = self.pending_flush {
                        if at <= now.ms {
                            self.sync(now);
                        } else {
                            let timer = self.arm(at, Timer::Flush, now);
                            self.pending_flush = Some((at, timer));
                        }
                    }
                }
                Timer::Reclaim => {
                    self.reclaim_at = None;
                    for _ in 0..RECLAIM_BATCH {
                        let tail = self.lists[DEAD].tail;
                        if tail == NIL {
                            break;
                        }
                        self.stats.reclaimed += 1;
                        self.remove(tail);
                    }
                    self.schedule_reclaim(now.ms.saturating_add(1));
                }
            }
        }
        self.fired = fired;
    }
}

impl Store {
    /// Would a command see slot `i` at `now`? (Same rule as `lookup`, without its effects.)
    pub(super) fn visible(&self, i: u32, now: Now) -> bool {
        let item = &self.slots[i as usize];
        if item.is_locked() {
            return true;
        }
        let flushed =
            item.epoch != self.epoch || self.pending_flush.is_some_and(|(at, _)| at <= now.ms);
        !flushed && item.deadline > now.ms
    }

    /// The slot of the live item under `key`; an expired or flushed one found on the way is freed.
    pub(super) fn lookup(&mut self, key: &[u8], now: Now, get_path: bool) -> Option<u32> {
        let i = self.find(key)?;
        let item = &self.slots[i as usize];
        if item.is_locked() {
            return Some(i);
        }
        if item.epoch != self.epoch {
            self.stats.reclaimed += 1;
            self.remove(i);
            return None;
        }
        if item.deadline <= now.ms {
            if get_path {
                self.stats.get_expired += 1;
            }
            self.reap_expired(i);
            return None;
        }
        Some(i)
    }

    /// Runs a delayed flush whose time has come. Called first by every operation, so nothing is
    /// stored after the flush time and before the flush.
    pub(super) fn sync(&mut self, now: Now) {
        if let Some((at, timer)) = self.pending_flush {
            if at <= now.ms {
                self.pending_flush = None;
                self.wheel.cancel(timer);
                self.flush_now(now);
            }
        }
    }

    fn flush_now(&mut self, now: Now) {
        if self.epoch == u32::MAX {
            // Once per 2^32 flushes: free every dead item, so that no item of an old epoch can
            // ever look live again after the wrap.
            while self.lists[DEAD].tail != NIL {
                self.stats.reclaimed += 1;
                self.remove(self.lists[DEAD].tail);
            }
        }
        self.epoch = self.epoch.wrapping_add(1);
        for &i in self.locks.keys() {
            self.slots[i as usize].epoch = self.epoch;
        }
        let lru = self.lists[LRU];
        if lru.head != NIL {
            let dead = self.lists[DEAD];
            if dead.head == NIL {
                self.lists[DEAD] = lru;
            } else {
                self.slots[lru.tail as usize].next = dead.head;
                self.slots[dead.head as usize].prev = lru.tail;
                self.lists[DEAD].head = lru.head;
            }
            self.lists[LRU] = EMPTY;
        }
        self.dead_bytes += self.live_bytes - self.locked_bytes;
        self.live_bytes = self.locked_bytes;
        self.live_count = self.locks.len();
        self.schedule_reclaim(now.ms);
    }

    fn schedule_reclaim(&mut self, at: u64) {
        if self.reclaim_at.is_none() && self.lists[DEAD].tail != NIL {
            self.wheel.insert(at, Timer::Reclaim);
            self.reclaim_at = Some(at);
        }
    }

    pub(super) fn arm(&mut self, deadline: u64, timer: Timer, now: Now) -> TimerKey {
        let at = deadline.min(now.ms.saturating_add(MAX_TIMER_SPAN_MS));
        self.wheel.insert(at, timer)
    }

    fn on_expire(&mut self, i: u32, now: Now) {
        let Some(item) = self.slots.get_mut(i as usize) else {
            return;
        };
        // A slot freed earlier in this same batch (a reclaim) has no timer to honour.
        if item.state & OCCUPIED == 0 {
            return;
        }
        item.timer = None;
        if item.is_locked() {
            // Locked items never expire; `release` looks at the deadline again.
            return;
        }
        if item.epoch != self.epoch {
            self.stats.reclaimed += 1;
            self.remove(i);
        } else if item.deadline <= now.ms {
            self.reap_expired(i);
        } else if item.deadline != NEVER {
            let deadline = item.deadline;
            let key = self.arm(deadline, Timer::Expire(i), now);
            self.slots[i as usize].timer = Some(key);
        }
    }

    pub(super) fn set_deadline(&mut self, i: u32, deadline: u64, now: Now) {
        if let Some(old) = self.slots[i as usize].timer.take() {
            self.wheel.cancel(old);
        }
        self.slots[i as usize].deadline = deadline;
        if deadline != NEVER {
            let key = self.arm(deadline, Timer::Expire(i), now);
            self.slots[i as usize].timer = Some(key);
        }
    }

    /// Frees an unlocked item whose time ran out.
    pub(super) fn reap_expired(&mut self, i: u32) {
        self.stats.reclaimed += 1;
        if self.slots[i as usize].state & FETCHED == 0 {
            self.stats.expired_unfetched += 1;
        }
        self.remove(i);
    }
}
