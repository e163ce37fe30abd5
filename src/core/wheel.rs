//! A hierarchical timing wheel: every lock table's expiries (lease timeouts, orphan timeouts, item
//! TTLs) live here.
//!
//! # What it owns
//!
//! The pending timers and their values, and a clock that only moves when the owner calls
//! [`Wheel::advance_to`]. It never reads a clock itself, allocates nothing per timer (entries
//! live in one [`Slab`], linked into per-slot lists by slab index), and has no `unsafe`.
//!
//! # Shape
//!
//! Time is counted in 1 ms ticks. There are `NUM_LEVELS` (11) levels of `SLOTS` (64) slots; a
//! slot of level `l` spans `64^l` ms, so level `l` sees the 6-bit "digit" `l` of a deadline. A
//! timer is filed at the level of the highest digit in which its deadline differs from `now` (so
//! less than one revolution of that level ahead), in the slot named by that digit. When the clock
//! reaches the start of an occupied slot above level 0, the slot's timers are re-filed
//! ("cascaded") against the new `now` into lower levels; a level-0 slot holds the timers of a
//! single millisecond, which all fire.
//!
//! Why 64 slots: a level's occupancy fits one `u64`, so "next occupied slot" is one
//! `trailing_zeros`, and a level's span is a shift, not a division. Eleven levels of 6 bits cover
//! all 64 bits of a `u64` deadline, so nothing is ever clamped and no slot is ever "behind" `now`
//! (tokio's 6-level wheel must wrap its top level around; this one needs no rotate).
//!
//! # Invariants
//!
//! * A timer at level `l` has `deadline > now`, agrees with `now` on every digit above `l`, and its
//!   digit `l` is strictly greater than `now`'s. So a level's bitmap never has a bit at or below
//!   `now`'s digit, and the first occupied slot of the lowest non-empty level is the earliest
//!   point at which anything must happen.
//! * Timers inserted with `deadline <= now` sit in a separate "due" list and fire at the next
//!   `advance_to`.
//!
//! # Complexity
//!
//! `insert` and `cancel` are O(1) (slab insert/remove plus a list splice). `next_deadline` is
//! O(`NUM_LEVELS`). `advance_to` does O(`NUM_LEVELS`) work per occupied slot it passes plus
//! O(`NUM_LEVELS`) per timer over that timer's whole life (each cascade moves it down a level),
//! independent of how many milliseconds elapse: a 10^12 ms idle gap is a few bitmap lookups.
//! Timers inserted already due are sorted by deadline when they fire (O(k log k) for k of them,
//! usually k <= 1).

use slab::Slab;

/// Bits of the deadline each level resolves: 6, because 2^6 = 64 slots make one `u64` bitmap.
const LEVEL_BITS: usize = 6;

/// Slots per level (see [`LEVEL_BITS`]).
const SLOTS: usize = 1 << LEVEL_BITS;

/// Mask for one level's digit of a deadline.
const SLOT_MASK: u64 = SLOTS as u64 - 1;

/// ceil(64 / 6) = 11 levels: together they resolve every bit of a `u64` millisecond deadline, so a
/// deadline is never clamped and the top level never wraps (it uses only 16 of its 64 slots).
const NUM_LEVELS: usize = (u64::BITS as usize).div_ceil(LEVEL_BITS);

/// "No entry" in the slab-index links. A slab can never hold `usize::MAX` entries (each entry is
/// larger than one byte of address space), so this index is never a real entry.
const NIL: usize = usize::MAX;

/// `Entry::level` of a timer in the due list rather than in a level (no level has this number).
const DUE: u8 = u8::MAX;

/// Handle to a pending timer: its slab index plus the generation it was inserted with. A handle
/// whose timer fired or was cancelled, even if the slab slot now holds another timer, is stale and
/// is detected by the generation mismatch. 8 bytes, because tables keep one per item or lease.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct TimerKey {
    idx: u32,
    gen: u32,
}

/// One timer, linked into exactly one list: a level slot's or the due list.
struct Entry<T> {
    deadline: u64,
    /// The wheel's insert counter when this entry was inserted (wrapping). A stale key could only
    /// match again if its slot were reused by exactly the 2^32-th insert after it, while the
    /// table still held that key: tables drop a key when its timer fires or is cancelled.
    gen: u32,
    /// Level holding this entry, or [`DUE`]. With `deadline` it names the list.
    level: u8,
    prev: usize,
    next: usize,
    value: T,
}

/// One level: a list head per slot and a bitmap of the non-empty slots.
#[derive(Clone, Copy)]
struct Level {
    /// Bit `s` set iff `head[s] != NIL`.
    occupied: u64,
    head: [usize; SLOTS],
}

impl Level {
    const EMPTY: Level = Level {
        occupied: 0,
        head: [NIL; SLOTS],
    };
}

/// A hierarchical timing wheel with 1 ms resolution over the whole `u64` range. See the module
/// documentation for the design.
///
/// Every index stored in a list head or an entry's `prev`/`next` names an occupied slab entry;
/// indexing the slab with them cannot panic unless that invariant is broken.
pub struct Wheel<T> {
    now: u64,
    next_gen: u32,
    entries: Slab<Entry<T>>,
    /// Boxed so a table embedding a wheel stays small (the heads are ~5.6 KiB).
    levels: Box<[Level; NUM_LEVELS]>,
    /// Bit `l` set iff level `l` has an occupied slot: the next expiration without a scan.
    nonempty_levels: u16,
    /// Head of the list of timers inserted with `deadline <= now`.
    due: usize,
    /// No later than the earliest deadline in the due list (exact unless that timer was
    /// cancelled), so `next_deadline` honours its "never later" promise for overdue timers too.
    due_earliest: u64,
    /// Reused buffer for ordering the due list by deadline when it fires.
    scratch: Vec<(u64, usize)>,
}

impl<T> Wheel<T> {
    /// A wheel whose clock starts at `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Wheel {
            now: now_ms,
            next_gen: 0,
            entries: Slab::new(),
            levels: Box::new([Level::EMPTY; NUM_LEVELS]),
            nonempty_levels: 0,
            due: NIL,
            due_earliest: u64::MAX,
            scratch: Vec::new(),
        }
    }

    /// The wheel's current time (the last `advance_to`, or the start).
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Number of pending timers.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Schedule `value` at `deadline_ms`. A deadline at or before `now()` fires at the next
    /// `advance_to`. O(1) (amortised over slab growth).
    pub fn insert(&mut self, deadline_ms: u64, value: T) -> TimerKey {
        let gen = self.next_gen;
        self.next_gen = self.next_gen.wrapping_add(1);
        let idx = self.entries.insert(Entry {
            deadline: deadline_ms,
            gen,
            level: DUE,
            prev: NIL,
            next: NIL,
            value,
        });
        let level = if deadline_ms <= self.now {
            DUE
        } else {
            level_for(self.now, deadline_ms)
        };
        self.push(idx, level);
        debug_assert!(u32::try_from(idx).is_ok(), "over 2^32 pending timers");
        TimerKey {
            idx: idx as u32,
            gen,
        }
    }

    /// Cancel a pending timer and return its value; `None` if it already fired, was cancelled, or
    /// the key is stale. O(1).
    pub fn cancel(&mut self, key: TimerKey) -> Option<T> {
        let idx = key.idx as usize;
        if self.entries.get(idx)?.gen != key.gen {
            return None;
        }
        self.unlink(idx);
        Some(self.entries.remove(idx).value)
    }

    /// Move the clock to `now_ms` and append every timer whose deadline is `<= now_ms` to `fired`,
    /// earliest deadline first (timers of one millisecond in any order).
    ///
    /// The clock never goes backwards: an earlier `now_ms` leaves it where it is, but still fires
    /// the timers that were inserted already due. Work is proportional to the occupied slots
    /// passed, not to the milliseconds elapsed.
    pub fn advance_to(&mut self, now_ms: u64, fired: &mut Vec<T>) {
        let target = now_ms.max(self.now);
        // Everything in the due list is at or before the old `now`, and every timer in the levels
        // is after it, so the due list goes first.
        self.fire_due(fired);
        while let Some((level, slot, start)) = self.next_expiration() {
            if start > target {
                break;
            }
            self.now = start;
            self.expire_slot(level, slot, fired);
        }
        self.now = target;
    }

    /// When `advance_to` should next be called: never later than the earliest pending deadline,
    /// possibly earlier (the start of a higher-level slot that must cascade). It is at or before
    /// `now()` only if a timer was inserted already due, otherwise strictly later. `None` when
    /// empty.
    pub fn next_deadline(&self) -> Option<u64> {
        if self.due != NIL {
            return Some(self.due_earliest);
        }
        self.next_expiration().map(|(_, _, start)| start)
    }

    /// The first occupied slot of the lowest non-empty level, and the time it starts: by the
    /// invariants, no timer in a higher level is earlier than anything in a lower one.
    fn next_expiration(&self) -> Option<(usize, usize, u64)> {
        if self.nonempty_levels == 0 {
            return None;
        }
        let level = self.nonempty_levels.trailing_zeros() as usize;
        let slot = self.levels[level].occupied.trailing_zeros() as usize;
        debug_assert!(slot > digit(self.now, level), "slot behind now");
        Some((level, slot, slot_start(self.now, level, slot)))
    }

    /// Fire the due list, ordered by deadline.
    fn fire_due(&mut self, fired: &mut Vec<T>) {
        if self.due == NIL {
            return;
        }
        let mut order = std::mem::take(&mut self.scratch);
        let mut idx = self.due;
        while idx != NIL {
            let e = &self.entries[idx];
            order.push((e.deadline, idx));
            idx = e.next;
        }
        self.due = NIL;
        self.due_earliest = u64::MAX;
        order.sort_unstable();
        fired.extend(
            order
                .drain(..)
                .map(|(_, idx)| self.entries.remove(idx).value),
        );
        self.scratch = order;
    }

    /// The clock has reached the start of `slot` at `level`: fire its timers that are due now and
    /// re-file the rest into lower levels.
    fn expire_slot(&mut self, level: usize, slot: usize, fired: &mut Vec<T>) {
        let lvl = &mut self.levels[level];
        let mut idx = std::mem::replace(&mut lvl.head[slot], NIL);
        lvl.occupied &= !(1 << slot);
        if lvl.occupied == 0 {
            self.nonempty_levels &= !(1 << level);
        }
        // The list is detached, so re-filing an entry (which rewrites its links) is safe once its
        // `next` has been read; no entry can land back in this slot (it goes to a lower level).
        while idx != NIL {
            let (next, deadline) = {
                let e = &self.entries[idx];
                (e.next, e.deadline)
            };
            if deadline <= self.now {
                debug_assert_eq!(deadline, self.now, "a timer was passed over");
                fired.push(self.entries.remove(idx).value);
            } else {
                let to = level_for(self.now, deadline);
                debug_assert!((to as usize) < level, "cascade must go down");
                self.push(idx, to);
            }
            idx = next;
        }
    }

    /// Link entry `idx` at the front of its list at `level` (or the due list).
    fn push(&mut self, idx: usize, level: u8) {
        let deadline = self.entries[idx].deadline;
        let old_head = if level == DUE {
            self.due_earliest = self.due_earliest.min(deadline);
            std::mem::replace(&mut self.due, idx)
        } else {
            let slot = digit(deadline, level as usize);
            let lvl = &mut self.levels[level as usize];
            lvl.occupied |= 1 << slot;
            self.nonempty_levels |= 1 << level;
            std::mem::replace(&mut lvl.head[slot], idx)
        };
        if old_head != NIL {
            self.entries[old_head].prev = idx;
        }
        let e = &mut self.entries[idx];
        e.level = level;
        e.prev = NIL;
        e.next = old_head;
    }

    /// Unlink entry `idx` from its list, clearing the slot's bit if the list empties.
    fn unlink(&mut self, idx: usize) {
        let (prev, next, level, deadline) = {
            let e = &self.entries[idx];
            (e.prev, e.next, e.level, e.deadline)
        };
        if next != NIL {
            self.entries[next].prev = prev;
        }
        if prev != NIL {
            // Not the head: the list keeps `prev`, so the slot stays occupied.
            self.entries[prev].next = next;
        } else if level == DUE {
            self.due = next;
            if next == NIL {
                self.due_earliest = u64::MAX;
            }
        } else {
            let slot = digit(deadline, level as usize);
            let lvl = &mut self.levels[level as usize];
            lvl.head[slot] = next;
            if next == NIL {
                lvl.occupied &= !(1 << slot);
                if lvl.occupied == 0 {
                    self.nonempty_levels &= !(1 << level);
                }
            }
        }
    }
}

#[cfg(test)]
impl<T> Wheel<T> {
    /// Walk every list and check the links, the bitmaps and the module invariants.
    fn check_invariants(&self) {
        let mut seen = 0;
        let mut walk = |head: usize, level: u8| {
            let (mut prev, mut idx) = (NIL, head);
            while idx != NIL {
                let e = &self.entries[idx];
                assert_eq!(e.prev, prev, "prev link of {idx}");
                assert_eq!(e.level, level, "level of {idx}");
                if level == DUE {
                    assert!(e.deadline <= self.now, "due entry {idx} in the future");
                    assert!(self.due_earliest <= e.deadline, "due_earliest too late");
                } else {
                    assert_eq!(
                        level_for(self.now, e.deadline),
                        level,
                        "entry {idx} deadline {} at wrong level, now {}",
                        e.deadline,
                        self.now
                    );
                }
                seen += 1;
                (prev, idx) = (idx, e.next);
            }
        };
        walk(self.due, DUE);
        for (l, lvl) in self.levels.iter().enumerate() {
            assert_eq!(
                self.nonempty_levels & (1 << l) != 0,
                lvl.occupied != 0,
                "level bit {l}"
            );
            for (s, &head) in lvl.head.iter().enumerate() {
                assert_eq!(lvl.occupied & (1 << s) != 0, head != NIL, "bit {l}/{s}");
                if head != NIL {
                    assert_eq!(digit(self.entries[head].deadline, l), s, "slot {l}/{s}");
                }
                walk(head, l as u8);
            }
        }
        assert_eq!(seen, self.entries.len(), "entries off every list");
    }
}

/// The level for a timer at `deadline` seen from `now` (`deadline > now`): the level of the
/// highest 6-bit digit in which they differ.
fn level_for(now: u64, deadline: u64) -> u8 {
    debug_assert!(deadline > now);
    // `| SLOT_MASK` makes differences within digit 0 count as level 0 rather than needing a
    // special case; `now ^ deadline != 0` so the highest set bit exists.
    let highest_bit = u64::BITS - 1 - ((now ^ deadline) | SLOT_MASK).leading_zeros();
    // At most 63 / 6 = 10 < NUM_LEVELS, which fits a u8.
    (highest_bit as usize / LEVEL_BITS) as u8
}

/// Digit `level` of `t`: the slot `t` falls in at that level.
fn digit(t: u64, level: usize) -> usize {
    ((t >> (level * LEVEL_BITS)) & SLOT_MASK) as usize
}

/// The first millisecond of `slot` at `level` within the revolution of that level containing
/// `now` (every digit above `level` taken from `now`).
fn slot_start(now: u64, level: usize, slot: usize) -> u64 {
    let shift = level * LEVEL_BITS;
    let above = shift + LEVEL_BITS;
    let base = if above >= u64::BITS as usize {
        0
    } else {
        (now >> above) << above
    };
    debug_assert!(
        ((slot as u64) << shift) >> shift == slot as u64,
        "slot past u64"
    );
    base | ((slot as u64) << shift)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap};

    /// Advance to `t`, returning what fired.
    fn fire<T>(w: &mut Wheel<T>, t: u64) -> Vec<T> {
        let mut out = Vec::new();
        w.advance_to(t, &mut out);
        out
    }

    /// Deadlines around every power of 64 that fits a u64: 64^k - 1, 64^k, 64^k + 1.
    fn power_of_64_offsets() -> Vec<u64> {
        let mut v = vec![1, 2];
        let mut p: u64 = 64;
        loop {
            v.extend([p - 1, p, p + 1]);
            match p.checked_mul(64) {
                Some(n) => p = n,
                None => break,
            }
        }
        v
    }

    const STARTS: [u64; 7] = [
        0,
        1,
        63,
        4095,
        123_456_789,
        (1 << 40) + 17,
        u64::MAX - (1 << 50),
    ];

    #[test]
    fn deadline_at_each_power_of_64_fires_exactly_then_relative_to_any_start() {
        for start in STARTS {
            for off in power_of_64_offsets() {
                let Some(deadline) = start.checked_add(off) else {
                    continue;
                };
                let mut w = Wheel::new(start);
                w.insert(deadline, off);
                assert!(fire(&mut w, deadline - 1).is_empty(), "{start}+{off} early");
                assert_eq!(w.next_deadline(), Some(deadline), "{start}+{off}");
                assert_eq!(fire(&mut w, deadline), vec![off], "{start}+{off}");
                assert!(w.is_empty());
                assert_eq!(w.next_deadline(), None);
            }
        }
    }

    #[test]
    fn cascades_step_through_next_deadline_and_fire_exactly_at_deadline() {
        for start in STARTS {
            for off in power_of_64_offsets() {
                let Some(deadline) = start.checked_add(off) else {
                    continue;
                };
                let mut w = Wheel::new(start);
                w.insert(deadline, ());
                let mut hops = 0;
                loop {
                    let nd = w.next_deadline().expect("pending timer");
                    assert!(nd > w.now() && nd <= deadline, "{start}+{off}: {nd}");
                    let fired = fire(&mut w, nd);
                    hops += 1;
                    if nd == deadline {
                        assert_eq!(fired.len(), 1);
                        break;
                    }
                    assert!(fired.is_empty(), "{start}+{off} fired early at {nd}");
                }
                // Each cascade moves the timer down at least one level.
                assert!(hops <= NUM_LEVELS, "{start}+{off}: {hops} hops");
            }
        }
    }

    #[test]
    fn absolute_power_of_64_deadlines_fire_in_order_from_nonzero_start() {
        let mut w = Wheel::new(5);
        let mut expect = Vec::new();
        let mut p: u64 = 64;
        loop {
            for d in [p - 1, p, p + 1] {
                w.insert(d, d);
                expect.push(d);
            }
            match p.checked_mul(64) {
                Some(n) => p = n,
                None => break,
            }
        }
        w.insert(u64::MAX, u64::MAX);
        expect.push(u64::MAX);
        for &d in &expect {
            assert!(fire(&mut w, d - 1).is_empty(), "{d} early");
            assert_eq!(fire(&mut w, d), vec![d]);
        }
        assert!(w.is_empty());
    }

    #[test]
    fn many_timers_fire_earliest_first_in_one_advance() {
        let mut w = Wheel::new(1000);
        let deadlines = [
            1000 + 4096,
            1001,
            1000 + 63,
            1000 + 262_144,
            1064,
            1000 + 64,
        ];
        for d in deadlines {
            w.insert(d, d);
        }
        let mut sorted = deadlines.to_vec();
        sorted.sort_unstable();
        assert_eq!(fire(&mut w, 10_000_000), sorted);
    }

    #[test]
    fn cancel_before_fire_returns_value_and_it_never_fires() {
        let mut w = Wheel::new(0);
        let k = w.insert(5000, "a");
        let other = w.insert(5000, "b");
        assert_eq!(w.cancel(k), Some("a"));
        assert_eq!(w.len(), 1);
        assert_eq!(fire(&mut w, 5000), vec!["b"]);
        assert_eq!(w.cancel(other), None);
    }

    #[test]
    fn cancel_after_fire_returns_none() {
        let mut w = Wheel::new(0);
        let k = w.insert(70, 1);
        assert_eq!(fire(&mut w, 70), vec![1]);
        assert_eq!(w.cancel(k), None);
    }

    #[test]
    fn cancel_twice_returns_none_the_second_time() {
        let mut w = Wheel::new(0);
        let k = w.insert(10, 1);
        assert_eq!(w.cancel(k), Some(1));
        assert_eq!(w.cancel(k), None);
        assert!(w.is_empty());
        assert_eq!(w.next_deadline(), None);
    }

    #[test]
    fn stale_key_after_slot_reuse_returns_none_and_leaves_new_timer() {
        let mut w = Wheel::new(0);
        let old = w.insert(10, "old");
        assert_eq!(w.cancel(old), Some("old"));
        let new = w.insert(10, "new");
        assert_eq!(old.idx, new.idx, "test needs the slab slot reused");
        assert_eq!(w.cancel(old), None);
        assert_eq!(w.len(), 1);
        assert_eq!(fire(&mut w, 10), vec!["new"]);
        // And a key stale because its timer fired, with the slot reused again.
        let newer = w.insert(20, "newer");
        assert_eq!(new.idx, newer.idx);
        assert_eq!(w.cancel(new), None);
        assert_eq!(w.cancel(newer), Some("newer"));
    }

    #[test]
    fn cancel_from_middle_and_head_of_a_slot_keeps_the_rest() {
        let mut w = Wheel::new(0);
        let keys: Vec<_> = (0..5).map(|i| w.insert(4100, i)).collect();
        assert_eq!(w.cancel(keys[2]), Some(2)); // middle
        assert_eq!(w.cancel(keys[4]), Some(4)); // head (pushed last)
        assert_eq!(w.cancel(keys[0]), Some(0)); // tail
        let mut got = fire(&mut w, 4100);
        got.sort_unstable();
        assert_eq!(got, vec![1, 3]);
    }

    #[test]
    fn insert_in_the_past_or_at_now_fires_at_next_advance() {
        let mut w = Wheel::new(100);
        w.insert(100, "now");
        w.insert(3, "past");
        w.insert(0, "zero");
        assert_eq!(w.next_deadline(), Some(0));
        assert_eq!(fire(&mut w, 100), vec!["zero", "past", "now"]);
        assert_eq!(w.next_deadline(), None);
    }

    #[test]
    fn due_timers_fire_before_later_wheel_timers() {
        let mut w = Wheel::new(100);
        w.insert(101, "later");
        w.insert(50, "past");
        assert_eq!(fire(&mut w, 200), vec!["past", "later"]);
    }

    #[test]
    fn advance_backwards_is_a_noop() {
        let mut w = Wheel::new(1000);
        w.insert(1010, 1);
        assert!(fire(&mut w, 10).is_empty());
        assert_eq!(w.now(), 1000);
        assert_eq!(w.next_deadline(), Some(1010));
        assert_eq!(fire(&mut w, 1010), vec![1]);
    }

    #[test]
    fn huge_gap_jump_does_not_loop_per_millisecond() {
        let started = std::time::Instant::now();
        let mut w = Wheel::new(7);
        let mut now = 7u64;
        for round in 0..1000u64 {
            let gap = 1_000_000_000_000;
            w.insert(now + gap / 2, round);
            w.insert(now + gap, round);
            w.insert(now + 3 * gap, round);
            now += gap;
            // Each round fires its own first two; from round 2 on, also the third of round - 2.
            assert_eq!(fire(&mut w, now).len(), if round < 2 { 2 } else { 3 });
        }
        // 10^15 ms elapsed in total; a per-millisecond loop would take days. The bound is loose
        // so a loaded test machine cannot make it flaky.
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }

    #[test]
    fn next_deadline_is_none_when_empty_and_after_now_otherwise() {
        let mut w: Wheel<()> = Wheel::new(500);
        assert_eq!(w.next_deadline(), None);
        w.insert(500 + 100_000, ());
        let nd = w.next_deadline().expect("pending");
        assert!(nd > 500 && nd <= 500 + 100_000);
    }

    use crate::rng::Rng;

    /// Random inserts, cancels (live and stale keys) and advances, checked against a BTreeMap
    /// after every step: identical fired sets, nothing early, earliest first within a call,
    /// `next_deadline` never after the true earliest and after `now` unless something is due.
    fn model_check(seed: u64, start: u64, steps: usize) {
        let mut rng = Rng(seed);
        let mut w: Wheel<u64> = Wheel::new(start);
        let mut model: BTreeMap<(u64, u64), ()> = BTreeMap::new();
        let mut deadlines: HashMap<u64, u64> = HashMap::new();
        let mut live: Vec<(TimerKey, u64)> = Vec::new();
        let mut stale: Vec<TimerKey> = Vec::new();
        let mut next_id = 0u64;
        let mut fired = Vec::new();

        for step in 0..steps {
            let now = w.now();
            match rng.below(100) {
                0..=44 => {
                    let deadline = match rng.below(10) {
                        0 => now.saturating_sub(rng.below(100)),
                        1..=3 => now.saturating_add(rng.below(70)),
                        4..=5 => now.saturating_add(rng.below(5000)),
                        6..=7 => now.saturating_add(rng.below(300_000)),
                        8 => now.saturating_add(rng.below(1 << 40)),
                        _ => match rng.below(4) {
                            0 => u64::MAX,
                            _ => now.saturating_add(1 << rng.below(64)),
                        },
                    };
                    let id = next_id;
                    next_id += 1;
                    live.push((w.insert(deadline, id), id));
                    model.insert((deadline, id), ());
                    deadlines.insert(id, deadline);
                }
                45..=59 if !live.is_empty() => {
                    let i = rng.below(live.len() as u64) as usize;
                    let (key, id) = live.swap_remove(i);
                    let d = deadlines.remove(&id).expect("live id has a deadline");
                    model.remove(&(d, id));
                    assert_eq!(w.cancel(key), Some(id), "step {step}");
                    stale.push(key);
                }
                60..=64 if !stale.is_empty() => {
                    let i = rng.below(stale.len() as u64) as usize;
                    assert_eq!(w.cancel(stale[i]), None, "step {step}: stale key");
                }
                _ => {
                    let target = match rng.below(10) {
                        0 => now.saturating_sub(rng.below(1000)),
                        1..=4 => now.saturating_add(rng.below(100)),
                        5..=6 => now.saturating_add(rng.below(10_000)),
                        7 => now.saturating_add(rng.below(1 << 20)),
                        8 => now.saturating_add(rng.below(1 << 36)),
                        _ => w.next_deadline().unwrap_or(now),
                    };
                    fired.clear();
                    w.advance_to(target, &mut fired);
                    assert_eq!(w.now(), target.max(now), "step {step}");
                    let order: Vec<u64> = fired.iter().map(|id| deadlines[id]).collect();
                    assert!(order.windows(2).all(|p| p[0] <= p[1]), "step {step}: order");
                    for &d in &order {
                        assert!(d <= w.now(), "step {step}: fired early");
                    }
                    let mut expect: Vec<u64> = Vec::new();
                    while let Some(e) = model.first_entry() {
                        if e.key().0 > w.now() {
                            break;
                        }
                        expect.push(e.key().1);
                        e.remove();
                    }
                    let mut got = fired.clone();
                    got.sort_unstable();
                    expect.sort_unstable();
                    assert_eq!(got, expect, "step {step}: fired set");
                    for id in &got {
                        deadlines.remove(id);
                    }
                    let ids: std::collections::HashSet<u64> = got.into_iter().collect();
                    live.retain(|(key, id)| {
                        let gone = ids.contains(id);
                        if gone {
                            stale.push(*key);
                        }
                        !gone
                    });
                }
            }
            w.check_invariants();
            assert_eq!(w.len(), model.len(), "step {step}: len");
            let earliest = model.keys().next().map(|k| k.0);
            match (w.next_deadline(), earliest) {
                (None, None) => {}
                (Some(nd), Some(e)) => {
                    assert!(nd <= e, "step {step}: next_deadline {nd} after {e}");
                    if e > w.now() {
                        assert!(nd > w.now(), "step {step}: next_deadline not after now");
                    }
                }
                (nd, e) => panic!("step {step}: next_deadline {nd:?}, earliest {e:?}"),
            }
        }
    }

    #[test]
    fn random_operations_match_btreemap_model_from_zero() {
        model_check(0x9e37_79b9_7f4a_7c15, 0, 100_000);
    }

    #[test]
    fn random_operations_match_btreemap_model_from_unaligned_start() {
        model_check(0xdead_beef_cafe_f00d, (1 << 40) + 12_345, 100_000);
    }

    #[test]
    fn random_operations_match_btreemap_model_near_u64_max() {
        model_check(0x0123_4567_89ab_cdef, u64::MAX - (1 << 38), 100_000);
    }
}
