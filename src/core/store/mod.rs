//! The memcached item store with yrmcds server-side locks (`docs/protocol.md`, "memcached text
//! and binary, with yrmcds locks"; memcached's `doc/protocol.txt`).
//!
//! Owns: every item (key, value, flags, CAS unique, expiry), the LRU order, the expiry timers (its own
//! [`Wheel`]), the memory accounting, and the yrmcds lock of each item. Must not: read a clock, do
//! I/O, take a lock, or allocate on the read and lock paths. Time comes in as [`Now`]; the owner
//! thread asks [`Store::next_deadline`] when to call [`Store::advance`].
//!
//! This file holds the [`Store`] value, its public types and the memcached storage commands
//! (get/gat/touch, set/add/replace/append/prepend/cas, delete, incr/decr). One concern per file
//! beside it, each an `impl Store` block over the same fields:
//!
//! - `slab`: the item records, the key index, the intrusive LRU and dead lists; insert, rewrite
//!   and free one item.
//! - `memory`: the charge of an item, making room (eviction), `stats sizes` classes.
//! - `locks`: yrmcds's locks, the per-holder lock lists and the fencing token of each grant.
//! - `expiry`: memcached's exptime rules, what is visible at a time, `flush_all`, the wheel.
//! - `snapshot`: the whole store as canonical bytes and back.
//! - `check`: the structural invariant check (tests and fuzzing).
//!
//! # Choices the protocol leaves open (memcached 1.6 behaviour unless said otherwise)
//!
//! Expiry and `flush_all`: see `expiry`; the LRU: see `slab`; room and eviction: see `memory`.
//!
//! - `TooLarge` (the request's own size) is answered before any lock, CAS or mode check; `append`/
//!   `prepend` whose result exceeds `max_item_size` is `TooLarge` too. A failed store leaves the old
//!   item untouched (memcached unlinks it on a failed `set`; we keep it).
//! - incr/decr: the value must be ASCII digits, optionally followed by spaces (memcached's
//!   `safe_strtoull` accepts trailing whitespace, and memcached itself space-pads a decremented
//!   value in place), and must fit a u64 (leading zeros allowed). Leading spaces, signs and empty
//!   values are `NonNumeric`. The result is stored as plain decimal, in place when the length is
//!   unchanged. Flags and expiry are kept. With `initial` a missing key is created with flags 0;
//!   `cas: Some` on a missing key is `NotFound` even with `initial`.
//! - Counters: get/gat/lock_and_get count `get_expired` when they find an expired item;
//!   get and lock_and_get count `get_hits/get_misses`; gat and touch count `touch_hits/misses` (as
//!   memcached's gat does); `cas_*` count stores with a CAS; `total_items` counts every successful
//!   store, replace_and_unlock and incr/decr creation; `reclaimed` counts expired or flushed items
//!   whose memory was freed; `expired_unfetched` counts expired items freed that no get/gat/LaG
//!   ever returned.
//! - touch/gat keep the CAS unique (memcached does); lock/unlock do too.

mod check;
mod expiry;
mod locks;
mod memory;
mod slab;
mod snapshot;

use super::fence::Fence;
use super::hash::{HashMap, Seeded, Sharded};
use super::wheel::{TimerKey, Wheel};
use super::{Now, Session};

pub use self::expiry::RELATIVE_EXPTIME_MAX;
pub use self::slab::{ITEM_OVERHEAD, SIZE_CLASSES};

use self::expiry::{deadline_of, Timer};
use self::locks::{ConnLocks, LockEntry};
use self::slab::{make_data, Ends, Item, EMPTY, FETCHED, NIL, OCCUPIED};

/// Sizes the store is built with (`--memory`, `--max-item-size`).
#[derive(Clone, Copy, Debug)]
pub struct StoreConfig {
    pub memory_limit: usize,
    pub max_item_size: usize,
}

/// A borrowed view of one item, valid until the next mutation of the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemView<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub flags: u32,
    pub cas: u64,
}

/// What a storage command writes: the item's key, client flags, expiry (memcached's exptime
/// rules) and value.
#[derive(Clone, Copy, Debug)]
pub struct Write<'a> {
    pub key: &'a [u8],
    pub flags: u32,
    pub exptime: i64,
    pub value: &'a [u8],
}

/// An incr or decr: its direction and amount, the item to create when it is missing (initial
/// value and expiry; binary only), and the CAS the item must have (binary only).
#[derive(Clone, Copy, Debug)]
pub struct Arith {
    pub incr: bool,
    pub delta: u64,
    pub create: Option<(u64, i64)>,
    pub cas: Option<u64>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum StoreMode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum StoreOutcome {
    Stored { cas: u64 },
    NotStored,
    Exists,
    NotFound,
    Locked,
    TooLarge,
    OutOfMemory,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DeleteOutcome {
    Deleted,
    NotFound,
    Exists,
    Locked,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ArithOutcome {
    Value { value: u64, cas: u64 },
    NotFound,
    NonNumeric,
    Exists,
    Locked,
    OutOfMemory,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LockOutcome {
    Ok,
    Locked,
    NotFound,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum UnlockOutcome {
    Ok,
    NotFound,
    NotLocked,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RauOutcome {
    Stored { cas: u64 },
    NotFound,
    NotLocked,
    Exists,
    TooLarge,
    OutOfMemory,
}

/// Counters reported by memcached `stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub curr_items: u64,
    pub total_items: u64,
    pub bytes: u64,
    pub evictions: u64,
    pub expired_unfetched: u64,
    pub reclaimed: u64,
    pub get_hits: u64,
    pub get_misses: u64,
    pub get_expired: u64,
    pub touch_hits: u64,
    pub touch_misses: u64,
    pub delete_hits: u64,
    pub delete_misses: u64,
    pub incr_hits: u64,
    pub incr_misses: u64,
    pub decr_hits: u64,
    pub decr_misses: u64,
    pub cas_hits: u64,
    pub cas_misses: u64,
    pub cas_badval: u64,
    pub locks_held: u64,
    pub lock_grants: u64,
    pub lock_conflicts: u64,
}

/// Longest key (protocol.txt). The caller validates keys; the store refuses to create an item
/// under a longer key (`NotStored` / `NotFound`) rather than trust it.
pub const MAX_KEY_LEN: usize = 250;

pub struct Store {
    config: StoreConfig,
    slots: Vec<Item>,
    free_head: u32,
    index: Sharded,
    hasher: Seeded,
    lists: [Ends; 2],
    epoch: u32,
    locks: HashMap<u32, LockEntry>,
    sessions: HashMap<Session, ConnLocks>,
    wheel: Wheel<Timer>,
    /// Scratch for `advance`, reused so that ticking does not allocate.
    fired: Vec<Timer>,
    /// The delayed flush: when (monotonic ms) and its timer.
    pending_flush: Option<(u64, TimerKey)>,
    /// When the pending batch of frees of flushed items runs (one at a time).
    reclaim_at: Option<u64>,
    last_cas: u64,
    /// The service's fencing counter (shared with the other tables of a state).
    fence: Fence,
    /// Live items (unlocked in the LRU, plus locked ones): count and charged bytes.
    live_count: usize,
    live_bytes: usize,
    /// Flushed items not yet freed.
    dead_bytes: usize,
    /// Charged bytes of locked items (they can never be evicted).
    locked_bytes: usize,
    stats: StoreStats,
    /// Stored values by size, yrmcds's `stats sizes` classes ([`SIZE_CLASSES`]); every occupied
    /// slot counts (flushed ones until they are freed), as yrmcds counts what its GC last saw.
    sizes: [u64; SIZE_CLASSES.len() + 1],
}

/// Parses a counter value for incr/decr: ASCII digits, then optional spaces; must fit a u64.
fn parse_counter(value: &[u8]) -> Option<u64> {
    let end = value.iter().rposition(|&b| b != b' ').map_or(0, |p| p + 1);
    let digits = &value[..end];
    if digits.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(n)
}

/// Decimal digits of `n` into `buf`; returns the used tail of `buf`.
fn format_u64(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

impl Store {
    pub fn new(config: StoreConfig, now: Now) -> Self {
        Store {
            config,
            slots: Vec::new(),
            free_head: NIL,
            index: Sharded::default(),
            hasher: Seeded::default(),
            lists: [EMPTY; 2],
            epoch: 0,
            locks: HashMap::default(),
            sessions: HashMap::default(),
            wheel: Wheel::new(now.ms),
            fired: Vec::new(),
            pending_flush: None,
            reclaim_at: None,
            last_cas: 0,
            fence: Fence::default(),
            live_count: 0,
            live_bytes: 0,
            dead_bytes: 0,
            locked_bytes: 0,
            stats: StoreStats::default(),
            sizes: [0; SIZE_CLASSES.len() + 1],
        }
    }

    pub fn config(&self) -> StoreConfig {
        self.config
    }

    pub fn get(&mut self, key: &[u8], now: Now) -> Option<ItemView<'_>> {
        self.sync(now);
        match self.lookup(key, now, true) {
            Some(i) => {
                self.stats.get_hits += 1;
                self.bump(i);
                self.slots[i as usize].state |= FETCHED;
                Some(self.view(i))
            }
            None => {
                self.stats.get_misses += 1;
                None
            }
        }
    }

    pub fn get_and_touch(&mut self, key: &[u8], exptime: i64, now: Now) -> Option<ItemView<'_>> {
        self.sync(now);
        match self.lookup(key, now, true) {
            Some(i) => {
                self.stats.touch_hits += 1;
                self.set_deadline(i, deadline_of(exptime, now), now);
                self.bump(i);
                self.slots[i as usize].state |= FETCHED;
                Some(self.view(i))
            }
            None => {
                self.stats.touch_misses += 1;
                None
            }
        }
    }

    pub fn touch(&mut self, key: &[u8], exptime: i64, now: Now) -> bool {
        self.sync(now);
        match self.lookup(key, now, false) {
            Some(i) => {
                self.stats.touch_hits += 1;
                self.set_deadline(i, deadline_of(exptime, now), now);
                self.bump(i);
                true
            }
            None => {
                self.stats.touch_misses += 1;
                false
            }
        }
    }

    pub fn store(
        &mut self,
        session: Session,
        mode: StoreMode,
        w: Write<'_>,
        cas: Option<u64>,
        now: Now,
    ) -> StoreOutcome {
        let Write {
            key,
            flags,
            exptime,
            value,
        } = w;
        self.sync(now);
        if value.len() > self.config.max_item_size {
            return StoreOutcome::TooLarge;
        }
        let found = self.lookup(key, now, false);
        if let Some(i) = found {
            if self.locked_by_other(i, session) {
                return StoreOutcome::Locked;
            }
        }
        if let Some(want) = cas {
            match found {
                None => {
                    self.stats.cas_misses += 1;
                    return StoreOutcome::NotFound;
                }
                Some(i) if self.slots[i as usize].cas != want => {
                    self.stats.cas_badval += 1;
                    return StoreOutcome::Exists;
                }
                Some(_) => {}
            }
        }
        let data = match (mode, found) {
            _ if key.len() > MAX_KEY_LEN => return StoreOutcome::NotStored,
            (StoreMode::Add, Some(i)) => {
                self.bump(i);
                return StoreOutcome::NotStored;
            }
            (StoreMode::Replace | StoreMode::Append | StoreMode::Prepend, None) => {
                return StoreOutcome::NotStored;
            }
            (StoreMode::Append | StoreMode::Prepend, Some(i)) => {
                let old = self.slots[i as usize].value();
                if old.len().saturating_add(value.len()) > self.config.max_item_size {
                    return StoreOutcome::TooLarge;
                }
                if mode == StoreMode::Append {
                    make_data(key, &[old, value])
                } else {
                    make_data(key, &[value, old])
                }
            }
            _ => make_data(key, &[value]),
        };
        if !self.make_room(data.len() + ITEM_OVERHEAD, found, now) {
            return StoreOutcome::OutOfMemory;
        }
        let new_cas = self.next_cas();
        match found {
            Some(i) => {
                self.rewrite(i, data);
                let item = &mut self.slots[i as usize];
                item.cas = new_cas;
                if !matches!(mode, StoreMode::Append | StoreMode::Prepend) {
                    item.flags = flags;
                    self.set_deadline(i, deadline_of(exptime, now), now);
                }
                self.bump(i);
            }
            None => {
                self.insert_new(
                    key.len(),
                    data,
                    flags,
                    deadline_of(exptime, now),
                    new_cas,
                    now,
                );
            }
        }
        if cas.is_some() {
            self.stats.cas_hits += 1;
        }
        self.stats.total_items += 1;
        StoreOutcome::Stored { cas: new_cas }
    }

    pub fn delete(
        &mut self,
        session: Session,
        key: &[u8],
        cas: Option<u64>,
        now: Now,
    ) -> DeleteOutcome {
        self.sync(now);
        let Some(i) = self.lookup(key, now, false) else {
            self.stats.delete_misses += 1;
            return DeleteOutcome::NotFound;
        };
        if self.locked_by_other(i, session) {
            return DeleteOutcome::Locked;
        }
        if cas.is_some_and(|c| c != self.slots[i as usize].cas) {
            return DeleteOutcome::Exists;
        }
        self.stats.delete_hits += 1;
        self.remove(i);
        DeleteOutcome::Deleted
    }

    pub fn incr_decr(&mut self, session: Session, key: &[u8], a: Arith, now: Now) -> ArithOutcome {
        let Arith {
            incr,
            delta,
            create: initial,
            cas,
        } = a;
        self.sync(now);
        let found = self.lookup(key, now, false);
        let Some(i) = found else {
            if incr {
                self.stats.incr_misses += 1;
            } else {
                self.stats.decr_misses += 1;
            }
            let (Some((value, exptime)), None, true) = (initial, cas, key.len() <= MAX_KEY_LEN)
            else {
                return ArithOutcome::NotFound;
            };
            let mut buf = [0u8; 20];
            let data = make_data(key, &[format_u64(value, &mut buf)]);
            if !self.make_room(data.len() + ITEM_OVERHEAD, None, now) {
                return ArithOutcome::OutOfMemory;
            }
            let new_cas = self.next_cas();
            self.insert_new(key.len(), data, 0, deadline_of(exptime, now), new_cas, now);
            self.stats.total_items += 1;
            return ArithOutcome::Value {
                value,
                cas: new_cas,
            };
        };
        if self.locked_by_other(i, session) {
            return ArithOutcome::Locked;
        }
        if cas.is_some_and(|c| c != self.slots[i as usize].cas) {
            return ArithOutcome::Exists;
        }
        let Some(old) = parse_counter(self.slots[i as usize].value()) else {
            return ArithOutcome::NonNumeric;
        };
        let value = if incr {
            old.wrapping_add(delta)
        } else {
            old.saturating_sub(delta)
        };
        let mut buf = [0u8; 20];
        let digits = format_u64(value, &mut buf);
        let item = &mut self.slots[i as usize];
        let key_len = usize::from(item.key_len);
        if item.data.len() - key_len == digits.len() {
            item.data[key_len..].copy_from_slice(digits);
        } else {
            let data = make_data(key, &[digits]);
            if !self.make_room(data.len() + ITEM_OVERHEAD, Some(i), now) {
                return ArithOutcome::OutOfMemory;
            }
            self.rewrite(i, data);
        }
        let new_cas = self.next_cas();
        self.slots[i as usize].cas = new_cas;
        self.bump(i);
        if incr {
            self.stats.incr_hits += 1;
        } else {
            self.stats.decr_hits += 1;
        }
        ArithOutcome::Value {
            value,
            cas: new_cas,
        }
    }

    pub fn stats(&self) -> StoreStats {
        let mut s = self.stats;
        s.curr_items = self.live_count as u64;
        s.bytes = self.live_bytes as u64;
        s.locks_held = self.locks.len() as u64;
        s
    }

    /// The item as a get would see it, without any effect (no LRU bump, no counters, no lazy
    /// removal). For `stats cachedump`-like uses and tests.
    pub fn peek(&self, key: &[u8], now: Now) -> Option<ItemView<'_>> {
        let i = self.find(key)?;
        self.visible(i, now).then(|| self.view(i))
    }

    /// One step of a key dump (yrmcds's `keys`): the keys of visible items (locked ones
    /// included, expired and flushed ones not) that start with `prefix`, in slot order, from
    /// slot `from`, looking at no more than `budget` slots. Calls `emit` for each; returns the
    /// slot to continue from, or `None` once every slot was looked at. No effect on the store.
    ///
    /// Consistency, as memcached's `lru_crawler metadump`: an item present and unchanged for
    /// the whole dump is listed once; one stored, deleted or expiring meanwhile may or may not
    /// be (a key deleted and stored again may land in a slot already passed, or in one still
    /// ahead and so be listed twice if its old slot was already listed).
    pub fn keys_step(
        &self,
        from: u32,
        prefix: &[u8],
        budget: usize,
        now: Now,
        mut emit: impl FnMut(&[u8]),
    ) -> Option<u32> {
        let start = from as usize;
        let end = self.slots.len().min(start.saturating_add(budget.max(1)));
        for i in start..end {
            let item = &self.slots[i];
            if item.state & OCCUPIED != 0
                && item.key().starts_with(prefix)
                && self.visible(i as u32, now)
            {
                emit(item.key());
            }
        }
        (end < self.slots.len()).then_some(end as u32)
    }

    /// Stored values per `stats sizes` class: one count per bound of [`SIZE_CLASSES`], then the
    /// larger ones.
    pub fn size_counts(&self) -> [u64; SIZE_CLASSES.len() + 1] {
        self.sizes
    }

    /// A new CAS unique (every modification gets one).
    fn next_cas(&mut self) -> u64 {
        self.last_cas += 1;
        self.last_cas
    }
}

#[cfg(test)]
mod tests;
