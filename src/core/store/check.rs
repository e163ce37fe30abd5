//! The store's structural invariant check, for tests and fuzzing.
//!
//! Owns: [`Store::check_invariants`], which walks every list, the slab, the index, the lock
//! tables and the accounting. Must not: change the store, or run on the daemon's path (it is
//! O(table)).

use super::slab::{size_class, DEAD, LRU, NEVER, NIL, OCCUPIED};
use super::{Store, SIZE_CLASSES};

/// Read-only inspection for tests, fuzzing and invariant checks: O(table), never on the
/// daemon's path.
impl Store {
    /// Checks every structural invariant: lists, slab, index, lock tables, accounting, timers;
    /// panics on a mismatch.
    pub fn check_invariants(&self) {
        let mut sizes = [0u64; SIZE_CLASSES.len() + 1];
        for item in self.slots.iter().filter(|s| s.state & OCCUPIED != 0) {
            sizes[size_class(item.value().len())] += 1;
        }
        assert_eq!(sizes, self.sizes, "size classes");
        let mut seen = vec![false; self.slots.len()];
        let mut mark = |i: u32| {
            assert!(!seen[i as usize], "slot {i} reachable twice");
            seen[i as usize] = true;
        };
        let (mut lru_count, mut lru_bytes, mut dead_bytes) = (0usize, 0usize, 0usize);
        for list in [LRU, DEAD] {
            let mut prev = NIL;
            let mut i = self.lists[list].head;
            while i != NIL {
                let item = &self.slots[i as usize];
                assert_eq!(item.state & OCCUPIED, OCCUPIED);
                assert!(!item.is_locked());
                assert_eq!(item.prev, prev, "broken prev link");
                assert_eq!(item.epoch == self.epoch, list == LRU);
                if list == LRU {
                    lru_count += 1;
                    lru_bytes += item.charge();
                    assert_eq!(item.timer.is_some(), item.deadline != NEVER);
                } else {
                    dead_bytes += item.charge();
                }
                mark(i);
                prev = i;
                i = item.next;
            }
            assert_eq!(self.lists[list].tail, prev);
        }
        let mut locked_bytes = 0;
        let mut via_conns = 0;
        for (session, list) in &self.sessions {
            let (mut prev, mut i, mut n) = (NIL, list.head, 0);
            while i != NIL {
                let e = &self.locks[&i];
                assert_eq!(e.holder, *session);
                assert_eq!(e.prev, prev);
                let item = &self.slots[i as usize];
                assert!(item.is_locked() && item.state & OCCUPIED != 0);
                assert_eq!(item.epoch, self.epoch);
                locked_bytes += item.charge();
                mark(i);
                n += 1;
                prev = i;
                i = e.next;
            }
            assert_eq!(list.tail, prev);
            assert_eq!(list.count, n);
            assert!(n > 0, "empty connection entry kept");
            via_conns += n as usize;
        }
        assert_eq!(via_conns, self.locks.len());
        let occupied = self
            .slots
            .iter()
            .filter(|s| s.state & OCCUPIED != 0)
            .count();
        for (i, item) in self.slots.iter().enumerate() {
            assert_eq!(seen[i], item.state & OCCUPIED != 0, "slot {i} orphaned");
            if item.state & OCCUPIED != 0 {
                assert_eq!(self.find(item.key()), Some(i as u32));
            }
        }
        let mut free = 0;
        let mut f = self.free_head;
        while f != NIL {
            assert_eq!(self.slots[f as usize].state, 0);
            free += 1;
            f = self.slots[f as usize].next;
        }
        assert_eq!(free + occupied, self.slots.len());
        assert_eq!(self.index.len(), occupied);
        assert_eq!(self.live_count, lru_count + self.locks.len());
        assert_eq!(self.locked_bytes, locked_bytes);
        assert_eq!(self.live_bytes, lru_bytes + locked_bytes);
        assert_eq!(self.dead_bytes, dead_bytes);
        assert!(self.live_bytes + self.dead_bytes <= self.config.memory_limit);
    }

    /// Keys of the unlocked live items, most recently used first.
    #[cfg(test)]
    pub(super) fn lru_keys(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut i = self.lists[LRU].head;
        while i != NIL {
            out.push(self.slots[i as usize].key().to_vec());
            i = self.slots[i as usize].next;
        }
        out
    }
}
