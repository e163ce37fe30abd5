//! PLACEHOLDER with the final API: a correct but slow timer set (BTreeMap). It is being replaced by a
//! hierarchical timing wheel with the same API; code written against it needs no change.

use std::collections::BTreeMap;

/// Handle to a pending timer. Stale handles (timer already fired or cancelled) are detected.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct TimerKey {
    idx: u32,
    gen: u32,
}

pub struct Wheel<T> {
    now: u64,
    next_id: u32,
    map: BTreeMap<(u64, u32), T>,
    keys: hashbrown::HashMap<u32, u64>,
}

impl<T> Wheel<T> {
    /// A wheel whose clock starts at `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Wheel {
            now: now_ms,
            next_id: 0,
            map: BTreeMap::new(),
            keys: Default::default(),
        }
    }

    /// The wheel's current time (the last `advance_to`, or the start).
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Number of pending timers.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Schedule `value` at `deadline_ms`. A deadline at or before `now()` fires at the next
    /// `advance_to`. O(1).
    pub fn insert(&mut self, deadline_ms: u64, value: T) -> TimerKey {
        let id = self.next_id;
        self.next_id += 1;
        self.map.insert((deadline_ms, id), value);
        self.keys.insert(id, deadline_ms);
        TimerKey { idx: id, gen: 0 }
    }

    /// Cancel a pending timer and return its value; `None` if it already fired or was cancelled.
    /// O(1).
    pub fn cancel(&mut self, key: TimerKey) -> Option<T> {
        let d = self.keys.remove(&key.idx)?;
        self.map.remove(&(d, key.idx))
    }

    /// Move the clock to `now_ms` (never backwards) and append every timer whose deadline is
    /// `<= now_ms` to `fired`, earliest deadline first.
    pub fn advance_to(&mut self, now_ms: u64, fired: &mut Vec<T>) {
        if now_ms > self.now {
            self.now = now_ms;
        }
        while let Some(entry) = self.map.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            let ((_, id), v) = entry.remove_entry();
            self.keys.remove(&id);
            fired.push(v);
        }
    }

    /// When `advance_to` should next be called: never later than the earliest pending deadline
    /// (it may be earlier, e.g. a cascade point of a hierarchical wheel). `None` when empty.
    pub fn next_deadline(&self) -> Option<u64> {
        self.map.keys().next().map(|k| k.0)
    }
}
