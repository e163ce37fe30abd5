//! The item slab, the key index and the intrusive LRU: where an item lives and in which list.
//!
//! Owns: the 64-byte [`Item`] record and its slot, the free list, the key index, the two
//! intrusive lists (live unlocked items in LRU order; flushed items waiting to be freed), and the
//! insertion, in-place rewrite and freeing of one item. Must not: decide what is visible or
//! expired (`expiry`), what to evict (`memory`), or who holds a lock (`locks`); it keeps their
//! counters and timers consistent when an item comes or goes.
//!
//! # Layout (memory-bound server: per-item overhead matters)
//!
//! - One heap allocation per item: `Box<[u8]>` holding key ++ value.
//! - One 64-byte [`Item`] record per item in a slab (`Vec<Item>` plus a free list threaded through
//!   `Item::next`), addressed by a `u32` slot index. The LRU is an intrusive doubly linked list of
//!   slot indices (`prev`/`next` in the record).
//! - The key index is a `HashTable<u32>` of slot indices (4 bytes + 1 control byte per bucket),
//!   hashing the key bytes stored in the item (no second copy of the key).
//!
//! # The LRU (memcached 1.6 behaviour)
//!
//! A successful get/gat/touch/store/incr/decr moves an unlocked item to the MRU end; so does an
//! `add` that fails because the key exists (memcached promotes it). A locked item leaves the LRU
//! (it can never be evicted) and re-enters at the MRU end when released; a disconnect or
//! `unlock_all` releases in lock-acquisition order.

use std::hash::BuildHasher;

use super::{ItemView, Store, MAX_KEY_LEN};
use crate::core::wheel::TimerKey;
use crate::core::Now;

/// An item's deadline when it never expires.
pub(super) const NEVER: u64 = u64::MAX;

/// Index bytes per item: an 8-byte entry (the slot and half its hash) and a control byte per
/// bucket, at hashbrown's load factor (7/8 right before growth, 7/16 right after) at a typical
/// 5/8.
const INDEX_BYTES_PER_ITEM: usize = 14;

/// Allocator bytes per key+value allocation: the malloc chunk header and the rounding to the next
/// size class (glibc: 8-byte header, 16-byte granularity).
const ALLOC_BYTES_PER_ITEM: usize = 16;

/// Bytes charged per item beyond its key and value: the 64-byte slab record, its share of the key
/// index and the allocator's overhead for the key+value allocation = 94 bytes on 64-bit targets
/// (memcached's own item header is 48 to 56 bytes plus slab-class rounding).
pub const ITEM_OVERHEAD: usize =
    std::mem::size_of::<Item>() + INDEX_BYTES_PER_ITEM + ALLOC_BYTES_PER_ITEM;

/// Upper bounds (exclusive) of yrmcds's `stats sizes` classes, in value bytes; larger values
/// are "huge" (cybozu/yrmcds src/memcache/gc.cpp).
pub const SIZE_CLASSES: [usize; 7] = [
    1 << 10,
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
];

pub(super) fn size_class(value_len: usize) -> usize {
    SIZE_CLASSES
        .iter()
        .position(|&bound| value_len < bound)
        .unwrap_or(SIZE_CLASSES.len())
}

/// "No slot": list ends and free-list end.
pub(super) const NIL: u32 = u32::MAX;

/// `Item::state` bits.
pub(super) const OCCUPIED: u8 = 1;
pub(super) const LOCKED: u8 = 2;
pub(super) const FETCHED: u8 = 4;

/// One slab record. Field order keeps it at 64 bytes.
pub(super) struct Item {
    /// key ++ value: the item's only allocation.
    pub(super) data: Box<[u8]>,
    pub(super) cas: u64,
    /// Monotonic ms; `NEVER` for no expiry.
    pub(super) deadline: u64,
    pub(super) timer: Option<TimerKey>,
    pub(super) flags: u32,
    /// LRU or dead-list neighbours (towards the MRU end / towards the LRU end). In a free slot,
    /// `next` is the next free slot.
    pub(super) prev: u32,
    pub(super) next: u32,
    /// The flush epoch the item belongs to: a different epoch than the store's means flushed.
    pub(super) epoch: u32,
    pub(super) key_len: u8,
    pub(super) state: u8,
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

    pub(super) fn key(&self) -> &[u8] {
        &self.data[..usize::from(self.key_len)]
    }

    pub(super) fn value(&self) -> &[u8] {
        &self.data[usize::from(self.key_len)..]
    }

    pub(super) fn charge(&self) -> usize {
        self.data.len() + ITEM_OVERHEAD
    }

    pub(super) fn is_locked(&self) -> bool {
        self.state & LOCKED != 0
    }
}

/// The two intrusive lists over the slab: live unlocked items in LRU order, and flushed items
/// waiting to be freed.
pub(super) const LRU: usize = 0;
pub(super) const DEAD: usize = 1;

/// Ends of an intrusive list; `head` is the most recently used end.
#[derive(Clone, Copy)]
pub(super) struct Ends {
    pub(super) head: u32,
    pub(super) tail: u32,
}

pub(super) const EMPTY: Ends = Ends {
    head: NIL,
    tail: NIL,
};

/// key ++ parts in one exactly sized allocation.
pub(super) fn make_data(key: &[u8], parts: &[&[u8]]) -> Box<[u8]> {
    let len = key.len() + parts.iter().map(|p| p.len()).sum::<usize>();
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(key);
    for p in parts {
        v.extend_from_slice(p);
    }
    v.into_boxed_slice()
}

impl Store {
    pub(super) fn view(&self, i: u32) -> ItemView<'_> {
        let item = &self.slots[i as usize];
        ItemView {
            key: item.key(),
            value: item.value(),
            flags: item.flags,
            cas: item.cas,
        }
    }

    pub(super) fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    pub(super) fn find(&self, key: &[u8]) -> Option<u32> {
        let slots = &self.slots;
        self.index
            .find(self.hash(key), |j| slots[j as usize].key() == key)
    }

    pub(super) fn link_head(&mut self, list: usize, i: u32) {
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

    pub(super) fn unlink(&mut self, list: usize, i: u32) {
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
    pub(super) fn bump(&mut self, i: u32) {
        if !self.slots[i as usize].is_locked() && self.lists[LRU].head != i {
            self.unlink(LRU, i);
            self.link_head(LRU, i);
        }
    }

    /// Puts a new item in a fresh slot at the MRU end. `make_room` has checked that a slot exists.
    pub(super) fn insert_new(
        &mut self,
        key_len: usize,
        data: Box<[u8]>,
        flags: u32,
        deadline: u64,
        cas: u64,
        now: Now,
    ) -> u32 {
        let charge = data.len() + ITEM_OVERHEAD;
        self.sizes[size_class(data.len().saturating_sub(key_len))] += 1;
        let item = Item {
            data,
            cas,
            deadline: NEVER,
            timer: None,
            flags,
            prev: NIL,
            next: NIL,
            epoch: self.epoch,
            // Callers refuse keys over MAX_KEY_LEN (250) before they get here.
            key_len: u8::try_from(key_len).unwrap_or(u8::MAX),
            state: OCCUPIED,
        };
        debug_assert!(key_len <= MAX_KEY_LEN);
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
        self.index.insert_unique(hash, i);
        self.link_head(LRU, i);
        self.live_count += 1;
        self.live_bytes += charge;
        self.set_deadline(i, deadline, now);
        i
    }

    /// Replaces the key+value bytes of a live item in place (same slot, same lock, same key).
    pub(super) fn rewrite(&mut self, i: u32, data: Box<[u8]>) {
        let item = &mut self.slots[i as usize];
        let old = item.charge();
        self.sizes[size_class(item.value().len())] -= 1;
        item.data = data;
        self.sizes[size_class(item.value().len())] += 1;
        let new = item.charge();
        let locked = item.is_locked();
        self.live_bytes = self.live_bytes - old + new;
        if locked {
            self.locked_bytes = self.locked_bytes - old + new;
        }
    }

    /// Frees the item in slot `i`, wherever it is (LRU, dead list, locked). Counters that say why
    /// are the caller's.
    pub(super) fn remove(&mut self, i: u32) {
        let idx = i as usize;
        let charge = self.slots[idx].charge();
        self.sizes[size_class(self.slots[idx].value().len())] -= 1;
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
        let found = self.index.remove(hash, i);
        debug_assert!(found, "item missing from the index");
        self.slots[idx] = Item::vacant(self.free_head);
        self.free_head = i;
    }
}
