//! Memory accounting and eviction.
//!
//! Owns: what an item is charged ([`ITEM_OVERHEAD`] beyond its key and value bytes), the rule
//! that makes room for a new or grown item, and yrmcds's `stats sizes` classes. Must not: free an
//! item any other way than through the slab's `remove`, or evict a locked item.
//!
//! # Room for an item (the protocol leaves it open)
//!
//! The store first checks that the new item fits beside the locked items (else `OutOfMemory`
//! with nothing evicted), then frees flushed items, then evicts from the LRU end, never the item
//! being replaced. An unlocked item found expired on the way counts as reclaimed, not evicted.

use super::slab::{Item, DEAD, LRU, NIL};
use super::Store;
use crate::core::Now;

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

impl Store {
    /// Ensures `charge` more bytes fit, `target` (the item being rewritten, if any) giving its own
    /// bytes back. False (nothing evicted) when the locked items leave no room for it.
    pub(super) fn make_room(&mut self, charge: usize, target: Option<u32>, now: Now) -> bool {
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
}
