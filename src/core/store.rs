//! The memcached item store with yrmcds server-side locks (`specs/README.md`, "memcached + yrmcds
//! locks"; `specs/yrmcds-locking.md`; memcached's `doc/protocol.txt`).
//!
//! Owns: every item (key, value, flags, CAS unique, expiry), the LRU order, the expiry timers (its own
//! [`Wheel`]), the memory accounting, and the yrmcds lock of each item. Must not: read a clock, do
//! I/O, take a lock, or allocate on the read and lock paths. Time comes in as [`Now`]; the owner
//! thread asks [`Store::next_deadline`] when to call [`Store::advance`].
//!
//! # Layout (memory-bound server: per-item overhead matters)
//!
//! - One heap allocation per item: `Box<[u8]>` holding key ++ value.
//! - One 64-byte [`Item`] record per item in a slab (`Vec<Item>` plus a free list threaded through
//!   `Item::next`), addressed by a `u32` slot index. The LRU is an intrusive doubly linked list of
//!   slot indices (`prev`/`next` in the record).
//! - The key index is a `HashTable<u32>` of slot indices (4 bytes + 1 control byte per bucket),
//!   hashing the key bytes stored in the item (no second copy of the key).
//! - Locks live beside the items, not in them (few items are locked): `locks` maps a slot to its
//!   holder and to its neighbours in the holder's intrusive list of locks, `conns` maps a holder to
//!   the ends of that list. Lock, unlock and the release of one lock are O(1); a disconnect is
//!   O(locks of that connection); neither allocates beyond hash-table growth.
//!
//! [`ITEM_OVERHEAD`] is what every item is charged beyond its key and value bytes.
//!
//! # Choices where the contract is silent (memcached 1.6 behaviour unless said otherwise)
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
//! - LRU: a successful get/gat/touch/store/incr/decr moves an unlocked item to the MRU end; so does
//!   an `add` that fails because the key exists (memcached promotes it). A locked item leaves the
//!   LRU (it can never be evicted) and re-enters at the MRU end when released; a disconnect or
//!   `unlock_all` releases in lock-acquisition order.
//! - Room for an item: the store first checks that the new item fits beside the locked items (else
//!   `OutOfMemory` with nothing evicted), then frees flushed items, then evicts from the LRU end,
//!   never the item being replaced. An unlocked item found expired on the way counts as reclaimed,
//!   not evicted.
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

use std::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashMap, HashTable};

use super::wheel::{TimerKey, Wheel};
use super::{ConnId, Now};

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

/// Longest relative exptime (30 days, protocol.txt); a larger exptime is an absolute Unix time.
pub const RELATIVE_EXPTIME_MAX: i64 = 60 * 60 * 24 * 30;

/// Index bytes per item: a `u32` slot and a control byte per bucket, at hashbrown's load factor
/// (7/8 right before growth, 7/16 right after) rounded up to a typical 5/8.
const INDEX_BYTES_PER_ITEM: usize = 8;

/// Allocator bytes per key+value allocation: the malloc chunk header and the rounding to the next
/// size class (glibc: 8-byte header, 16-byte granularity).
const ALLOC_BYTES_PER_ITEM: usize = 16;

/// Bytes charged per item beyond its key and value: the 64-byte slab record, its share of the key
/// index and the allocator's overhead for the key+value allocation = 88 bytes on 64-bit targets
/// (memcached's own item header is 48 to 56 bytes plus slab-class rounding).
pub const ITEM_OVERHEAD: usize =
    std::mem::size_of::<Item>() + INDEX_BYTES_PER_ITEM + ALLOC_BYTES_PER_ITEM;

/// Flushed items freed per wheel tick, so that a flush of millions of items never stalls the owner
/// thread for long; the rest is freed one millisecond later, or on demand when room is needed.
const RECLAIM_BATCH: usize = 4096;

/// Longest span a single timer is set for. A deadline further away (a far absolute exptime) is
/// re-armed when this timer fires, so the wheel never sees absurd deadlines.
const MAX_TIMER_SPAN_MS: u64 = 1 << 36; // about 2.2 years

/// Deadline of an item that never expires.
const NEVER: u64 = u64::MAX;

/// "No slot": list ends and free-list end.
const NIL: u32 = u32::MAX;

/// `Item::state` bits.
const OCCUPIED: u8 = 1;
const LOCKED: u8 = 2;
const FETCHED: u8 = 4;

/// One slab record. Field order keeps it at 64 bytes.
struct Item {
    /// key ++ value: the item's only allocation.
    data: Box<[u8]>,
    cas: u64,
    /// Monotonic ms; `NEVER` for no expiry.
    deadline: u64,
    timer: Option<TimerKey>,
    flags: u32,
    /// LRU or dead-list neighbours (towards the MRU end / towards the LRU end). In a free slot,
    /// `next` is the next free slot.
    prev: u32,
    next: u32,
    /// The flush epoch the item belongs to: a different epoch than the store's means flushed.
    epoch: u32,
    key_len: u8,
    state: u8,
}

impl Item {
    fn vacant(next_free: u32) -> Item {
        Item {
            data: Box::default(),
            cas: 0,
            deadline: NEVER,
            timer: None,
            flags: 0,
            prev: NIL,
            next: next_free,
            epoch: 0,
            key_len: 0,
            state: 0,
        }
    }

    fn key(&self) -> &[u8] {
        &self.data[..usize::from(self.key_len)]
    }

    fn value(&self) -> &[u8] {
        &self.data[usize::from(self.key_len)..]
    }

    fn charge(&self) -> usize {
        self.data.len() + ITEM_OVERHEAD
    }

    fn is_locked(&self) -> bool {
        self.state & LOCKED != 0
    }
}

/// The two intrusive lists over the slab: live unlocked items in LRU order, and flushed items
/// waiting to be freed.
const LRU: usize = 0;
const DEAD: usize = 1;

/// Ends of an intrusive list; `head` is the most recently used end.
#[derive(Clone, Copy)]
struct Ends {
    head: u32,
    tail: u32,
}

const EMPTY: Ends = Ends {
    head: NIL,
    tail: NIL,
};

/// One held lock: its holder and its neighbours in the holder's list (acquisition order).
struct LockEntry {
    holder: ConnId,
    prev: u32,
    next: u32,
}

/// Ends of one connection's list of held locks.
struct ConnLocks {
    head: u32,
    tail: u32,
    count: u32,
}

/// What the store's wheel holds.
#[derive(Clone, Copy, Debug)]
enum Timer {
    /// The item in this slot may have expired.
    Expire(u32),
    /// The pending delayed `flush_all` may be due.
    Flush,
    /// Free a batch of flushed items.
    Reclaim,
}

pub struct Store {
    config: StoreConfig,
    slots: Vec<Item>,
    free_head: u32,
    index: HashTable<u32>,
    hasher: DefaultHashBuilder,
    lists: [Ends; 2],
    epoch: u32,
    locks: HashMap<u32, LockEntry>,
    conns: HashMap<ConnId, ConnLocks>,
    wheel: Wheel<Timer>,
    /// Scratch for `advance`, reused so that ticking does not allocate.
    fired: Vec<Timer>,
    /// The delayed flush: when (monotonic ms) and its timer.
    pending_flush: Option<(u64, TimerKey)>,
    reclaim_pending: bool,
    last_cas: u64,
    /// Live items (unlocked in the LRU, plus locked ones): count and charged bytes.
    live_count: usize,
    live_bytes: usize,
    /// Flushed items not yet freed.
    dead_bytes: usize,
    /// Charged bytes of locked items (they can never be evicted).
    locked_bytes: usize,
    stats: StoreStats,
}

/// Converts a memcached exptime into a monotonic deadline in ms (see the module header).
fn deadline_of(exptime: i64, now: Now) -> u64 {
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

/// key ++ parts in one exactly sized allocation.
fn make_data(key: &[u8], parts: &[&[u8]]) -> Box<[u8]> {
    let len = key.len() + parts.iter().map(|p| p.len()).sum::<usize>();
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(key);
    for p in parts {
        v.extend_from_slice(p);
    }
    v.into_boxed_slice()
}

impl Store {
    pub fn new(config: StoreConfig, now: Now) -> Self {
        Store {
            config,
            slots: Vec::new(),
            free_head: NIL,
            index: HashTable::new(),
            hasher: DefaultHashBuilder::default(),
            lists: [EMPTY; 2],
            epoch: 0,
            locks: HashMap::new(),
            conns: HashMap::new(),
            wheel: Wheel::new(now.ms),
            fired: Vec::new(),
            pending_flush: None,
            reclaim_pending: false,
            last_cas: 0,
            live_count: 0,
            live_bytes: 0,
            dead_bytes: 0,
            locked_bytes: 0,
            stats: StoreStats::default(),
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

    #[allow(clippy::too_many_arguments)]
    pub fn store(
        &mut self,
        conn: ConnId,
        mode: StoreMode,
        key: &[u8],
        flags: u32,
        exptime: i64,
        value: &[u8],
        cas: Option<u64>,
        now: Now,
    ) -> StoreOutcome {
        self.sync(now);
        if value.len() > self.config.max_item_size {
            return StoreOutcome::TooLarge;
        }
        let found = self.lookup(key, now, false);
        if let Some(i) = found {
            if self.locked_by_other(i, conn) {
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
        conn: ConnId,
        key: &[u8],
        cas: Option<u64>,
        now: Now,
    ) -> DeleteOutcome {
        self.sync(now);
        let Some(i) = self.lookup(key, now, false) else {
            self.stats.delete_misses += 1;
            return DeleteOutcome::NotFound;
        };
        if self.locked_by_other(i, conn) {
            return DeleteOutcome::Locked;
        }
        if cas.is_some_and(|c| c != self.slots[i as usize].cas) {
            return DeleteOutcome::Exists;
        }
        self.stats.delete_hits += 1;
        self.remove(i);
        DeleteOutcome::Deleted
    }

    #[allow(clippy::too_many_arguments)]
    pub fn incr_decr(
        &mut self,
        conn: ConnId,
        key: &[u8],
        incr: bool,
        delta: u64,
        initial: Option<(u64, i64)>,
        cas: Option<u64>,
        now: Now,
    ) -> ArithOutcome {
        self.sync(now);
        let found = self.lookup(key, now, false);
        let Some(i) = found else {
            if incr {
                self.stats.incr_misses += 1;
            } else {
                self.stats.decr_misses += 1;
            }
            let (Some((value, exptime)), None) = (initial, cas) else {
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
        if self.locked_by_other(i, conn) {
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

    pub fn lock(&mut self, conn: ConnId, key: &[u8], now: Now) -> LockOutcome {
        self.sync(now);
        let Some(i) = self.lookup(key, now, false) else {
            return LockOutcome::NotFound;
        };
        if self.slots[i as usize].is_locked() {
            self.stats.lock_conflicts += 1;
            return LockOutcome::Locked;
        }
        self.acquire(i, conn);
        LockOutcome::Ok
    }

    pub fn unlock(&mut self, conn: ConnId, key: &[u8], now: Now) -> UnlockOutcome {
        self.sync(now);
        let Some(i) = self.lookup(key, now, false) else {
            return UnlockOutcome::NotFound;
        };
        if self.holder(i) != Some(conn) {
            return UnlockOutcome::NotLocked;
        }
        self.release(i, now);
        UnlockOutcome::Ok
    }

    pub fn unlock_all(&mut self, conn: ConnId, now: Now) -> usize {
        self.sync(now);
        let mut released = 0;
        while let Some(head) = self.conns.get(&conn).map(|c| c.head) {
            self.release(head, now);
            released += 1;
        }
        released
    }

    pub fn lock_and_get(
        &mut self,
        conn: ConnId,
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
        self.acquire(i, conn);
        if let Some(exptime) = exptime {
            self.set_deadline(i, deadline_of(exptime, now), now);
        }
        self.stats.get_hits += 1;
        self.slots[i as usize].state |= FETCHED;
        Ok(self.view(i))
    }

    #[allow(clippy::too_many_arguments)]
    pub fn replace_and_unlock(
        &mut self,
        conn: ConnId,
        key: &[u8],
        flags: u32,
        exptime: i64,
        value: &[u8],
        cas: Option<u64>,
        now: Now,
    ) -> RauOutcome {
        self.sync(now);
        if value.len() > self.config.max_item_size {
            return RauOutcome::TooLarge;
        }
        let Some(i) = self.lookup(key, now, false) else {
            return RauOutcome::NotFound;
        };
        if self.holder(i) != Some(conn) {
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

    /// Releases every lock `conn` holds (its connection closed); returns how many.
    pub fn disconnect(&mut self, conn: ConnId, now: Now) -> usize {
        self.unlock_all(conn, now)
    }

    pub fn next_deadline(&self) -> Option<u64> {
        self.wheel.next_deadline()
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
                    self.reclaim_pending = false;
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

    /// Who holds the lock on `key`, if it is visible and locked.
    pub fn lock_holder(&self, key: &[u8], now: Now) -> Option<ConnId> {
        let i = self.find(key)?;
        if self.visible(i, now) {
            self.holder(i)
        } else {
            None
        }
    }

    // ---- internals ----

    fn view(&self, i: u32) -> ItemView<'_> {
        let item = &self.slots[i as usize];
        ItemView {
            key: item.key(),
            value: item.value(),
            flags: item.flags,
            cas: item.cas,
        }
    }

    fn next_cas(&mut self) -> u64 {
        self.last_cas += 1;
        self.last_cas
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    fn find(&self, key: &[u8]) -> Option<u32> {
        let slots = &self.slots;
        self.index
            .find(self.hash(key), |&j| slots[j as usize].key() == key)
            .copied()
    }

    /// Would a command see slot `i` at `now`? (Same rule as `lookup`, without its effects.)
    fn visible(&self, i: u32, now: Now) -> bool {
        let item = &self.slots[i as usize];
        if item.is_locked() {
            return true;
        }
        let flushed =
            item.epoch != self.epoch || self.pending_flush.is_some_and(|(at, _)| at <= now.ms);
        !flushed && item.deadline > now.ms
    }

    /// The slot of the live item under `key`; an expired or flushed one found on the way is freed.
    fn lookup(&mut self, key: &[u8], now: Now, get_path: bool) -> Option<u32> {
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

    fn holder(&self, i: u32) -> Option<ConnId> {
        if self.slots[i as usize].is_locked() {
            self.locks.get(&i).map(|e| e.holder)
        } else {
            None
        }
    }

    fn locked_by_other(&self, i: u32, conn: ConnId) -> bool {
        self.holder(i).is_some_and(|h| h != conn)
    }

    /// Runs a delayed flush whose time has come. Called first by every operation, so nothing is
    /// stored after the flush time and before the flush.
    fn sync(&mut self, now: Now) {
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
        if !self.reclaim_pending && self.lists[DEAD].tail != NIL {
            self.wheel.insert(at, Timer::Reclaim);
            self.reclaim_pending = true;
        }
    }

    fn arm(&mut self, deadline: u64, timer: Timer, now: Now) -> TimerKey {
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

    fn set_deadline(&mut self, i: u32, deadline: u64, now: Now) {
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
    fn reap_expired(&mut self, i: u32) {
        self.stats.reclaimed += 1;
        if self.slots[i as usize].state & FETCHED == 0 {
            self.stats.expired_unfetched += 1;
        }
        self.remove(i);
    }

    fn link_head(&mut self, list: usize, i: u32) {
        let old = self.lists[list].head;
        {
            let item = &mut self.slots[i as usize];
            item.prev = NIL;
            item.next = old;
        }
        if old == NIL {
            self.lists[list].tail = i;
        } else {
            self.slots[old as usize].prev = i;
        }
        self.lists[list].head = i;
    }

    fn unlink(&mut self, list: usize, i: u32) {
        let (prev, next) = {
            let item = &self.slots[i as usize];
            (item.prev, item.next)
        };
        if prev == NIL {
            self.lists[list].head = next;
        } else {
            self.slots[prev as usize].next = next;
        }
        if next == NIL {
            self.lists[list].tail = prev;
        } else {
            self.slots[next as usize].prev = prev;
        }
        let item = &mut self.slots[i as usize];
        item.prev = NIL;
        item.next = NIL;
    }

    /// Moves an unlocked live item to the MRU end.
    fn bump(&mut self, i: u32) {
        if !self.slots[i as usize].is_locked() && self.lists[LRU].head != i {
            self.unlink(LRU, i);
            self.link_head(LRU, i);
        }
    }

    /// Ensures `charge` more bytes fit, `target` (the item being rewritten, if any) giving its own
    /// bytes back. False (nothing evicted) when the locked items leave no room for it.
    fn make_room(&mut self, charge: usize, target: Option<u32>, now: Now) -> bool {
        let (target_charge, target_locked) = match target {
            Some(t) => {
                let item = &self.slots[t as usize];
                (item.charge(), item.is_locked())
            }
            None => {
                if self.free_head == NIL && self.slots.len() >= NIL as usize {
                    return false; // 2^32 - 1 slots: the index type is exhausted.
                }
                (0, false)
            }
        };
        let pinned = self.locked_bytes - if target_locked { target_charge } else { 0 };
        let limit = self.config.memory_limit;
        if pinned.saturating_add(charge) > limit {
            return false;
        }
        while self.live_bytes + self.dead_bytes - target_charge + charge > limit {
            let dead = self.lists[DEAD].tail;
            if dead != NIL {
                self.stats.reclaimed += 1;
                self.remove(dead);
                continue;
            }
            let mut victim = self.lists[LRU].tail;
            if Some(victim) == target {
                victim = self.slots[victim as usize].prev;
            }
            if victim == NIL {
                debug_assert!(false, "accounting: nothing left to evict");
                return false;
            }
            if self.slots[victim as usize].deadline <= now.ms {
                self.reap_expired(victim);
            } else {
                self.stats.evictions += 1;
                self.remove(victim);
            }
        }
        true
    }

    /// Puts a new item in a fresh slot at the MRU end. `make_room` has checked that a slot exists.
    fn insert_new(
        &mut self,
        key_len: usize,
        data: Box<[u8]>,
        flags: u32,
        deadline: u64,
        cas: u64,
        now: Now,
    ) -> u32 {
        let charge = data.len() + ITEM_OVERHEAD;
        let item = Item {
            data,
            cas,
            deadline: NEVER,
            timer: None,
            flags,
            prev: NIL,
            next: NIL,
            epoch: self.epoch,
            // Keys are at most 250 bytes (validated by the caller).
            key_len: u8::try_from(key_len).unwrap_or(u8::MAX),
            state: OCCUPIED,
        };
        debug_assert!(key_len <= usize::from(u8::MAX));
        let i = if self.free_head != NIL {
            let i = self.free_head;
            self.free_head = self.slots[i as usize].next;
            self.slots[i as usize] = item;
            i
        } else {
            let i = self.slots.len() as u32;
            self.slots.push(item);
            i
        };
        let hash = self.hash(self.slots[i as usize].key());
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.index
            .insert_unique(hash, i, |&j| hasher.hash_one(slots[j as usize].key()));
        self.link_head(LRU, i);
        self.live_count += 1;
        self.live_bytes += charge;
        self.set_deadline(i, deadline, now);
        i
    }

    /// Replaces the key+value bytes of a live item in place (same slot, same lock, same key).
    fn rewrite(&mut self, i: u32, data: Box<[u8]>) {
        let item = &mut self.slots[i as usize];
        let old = item.charge();
        item.data = data;
        let new = item.charge();
        let locked = item.is_locked();
        self.live_bytes = self.live_bytes - old + new;
        if locked {
            self.locked_bytes = self.locked_bytes - old + new;
        }
    }

    /// Frees the item in slot `i`, wherever it is (LRU, dead list, locked). Counters that say why
    /// are the caller's.
    fn remove(&mut self, i: u32) {
        let idx = i as usize;
        let charge = self.slots[idx].charge();
        if self.slots[idx].is_locked() {
            self.detach_lock(i);
            self.live_bytes -= charge;
            self.live_count -= 1;
        } else if self.slots[idx].epoch == self.epoch {
            self.unlink(LRU, i);
            self.live_bytes -= charge;
            self.live_count -= 1;
        } else {
            self.unlink(DEAD, i);
            self.dead_bytes -= charge;
        }
        if let Some(timer) = self.slots[idx].timer.take() {
            self.wheel.cancel(timer);
        }
        let hash = self.hash(self.slots[idx].key());
        match self.index.find_entry(hash, |&j| j == i) {
            Ok(entry) => {
                entry.remove();
            }
            Err(_) => debug_assert!(false, "item missing from the index"),
        }
        self.slots[idx] = Item::vacant(self.free_head);
        self.free_head = i;
    }

    /// Gives slot `i` (live, unlocked, in the LRU) to `conn`.
    fn acquire(&mut self, i: u32, conn: ConnId) {
        self.unlink(LRU, i);
        let item = &mut self.slots[i as usize];
        item.state |= LOCKED;
        self.locked_bytes += item.charge();
        let list = self.conns.entry(conn).or_insert(ConnLocks {
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
                holder: conn,
                prev,
                next: NIL,
            },
        );
        self.stats.lock_grants += 1;
    }

    /// Drops the lock of slot `i` from the lock tables; the item is then in no list.
    fn detach_lock(&mut self, i: u32) {
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
        if let Some(list) = self.conns.get_mut(&e.holder) {
            if e.prev == NIL {
                list.head = e.next;
            }
            if e.next == NIL {
                list.tail = e.prev;
            }
            list.count -= 1;
            if list.count == 0 {
                self.conns.remove(&e.holder);
            }
        }
        let item = &mut self.slots[i as usize];
        item.state &= !LOCKED;
        self.locked_bytes -= item.charge();
    }

    /// Unlocks slot `i`: back to the MRU end, or gone if its time ran out while it was locked.
    fn release(&mut self, i: u32, now: Now) {
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
