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

use super::slab::{DEAD, LRU, NIL};
use super::Store;
use crate::core::Now;

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
