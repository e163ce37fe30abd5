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
//!
//! A cascade moves all of a slot's timers at once: a level-2 slot spans 4,096 ms, and with a
//! million leases of a few seconds it holds hundreds of thousands (12-21 ms of work in one
//! `advance_to`, every lease due meanwhile late by as much); a level-1 slot spans 64 ms and
//! holds tens of thousands of them. So the next slot of level 1 and the next slot above level 1
//! to cascade are each emptied ahead of time ([`Stage`]), up to [`STAGE_BUDGET`] timers per
//! `advance_to` that moves the clock, into lists by their digit of the level below, which become
//! that level's when the slot starts: the cascade itself then re-files only the timers of its
//! first sub-slot. Staging needs calls: `next_staging` names the next millisecond while a stage
//! has timers left to move, and an owner with nothing else to do wakes then too.

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

/// Timers moved ahead of time into each of the two stages (see [`Stage`]) when the clock
/// advances: 0.1-0.3 ms of work each (a cache miss or two per timer). Advanced every
/// millisecond, that is a million timers a second into each, so a level-2 slot (4,096 ms) of
/// up to four million and a level-1 slot (64 ms) of up to 64,000 are ready before they start.
pub(crate) const STAGE_BUDGET: usize = 1024;

/// The stage of the next level-1 slot to cascade (into level 0).
const NEAR: usize = 0;

/// The stage of the next slot above level 1 to cascade.
const FAR: usize = 1;
/// The levels each stage takes its slots from (a bitmap): level 1 for [`NEAR`], the levels
/// above it for [`FAR`].
const STAGE_LEVELS: [u16; 2] = [0b10, !0b11];

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

impl Stage {
    const NONE: Stage = Stage {
        level: 0,
        slot: 0,
        start: 0,
        lists: Level::EMPTY,
    };
}

/// A slot to cascade next, emptied ahead of time: its timers, a bounded number per
/// `advance_to`, are sorted into the lists of the level below by their digit of that level.
/// There are two: [`NEAR`] for level 1, [`FAR`] for the levels above. Their timers never
/// share a level (NEAR's are at level 0, FAR's at level 1 or above), and NEAR's slot always
/// starts before FAR's (it lies within the current revolution of level 2).
/// When the clock reaches the slot's start, every lower level is empty (their timers were all
/// due before it), so the lists become that level's at once, and only the timers of its first
/// slot (digit 0: due within that level's first span) are re-filed one by one. A cascade of a
/// level-2 slot, up to a few million timers in one go, then costs 64 list heads and a 64th of
/// its timers.
struct Stage {
    /// The staged slot's level (1 for [`NEAR`], 2 and above for [`FAR`]); 0: none is staged.
    level: usize,
    slot: usize,
    /// When the clock reaches the staged slot.
    start: u64,
    /// The staged timers by their digit `level - 1`. Their `Entry::level` is already
    /// `level - 1`; [`Wheel::in_stage`] tells them from that level's own timers.
    lists: Level,
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
    /// The next cascades of level 1 ([`NEAR`]) and above ([`FAR`]), prepared ahead of time.
    stages: Box<[Stage; 2]>,
    /// Timers staged per millisecond into each stage ([`STAGE_BUDGET`]; smaller in tests).
    stage_budget: usize,
    /// The clock when timers were last staged. An owner calls `advance_to` before every
    /// request, thousands of times in one millisecond of a busy turn: a budget per call
    /// emptied a slot of half a million timers into the stage in one 20 ms stretch, the very
    /// stall the stage is there to spread. So staging follows the clock, not the calls.
    staged_at: u64,
    /// Timers moved into a stage (tests measure the pace).
    #[cfg(test)]
    staged: usize,
    /// Timers re-filed or fired one by one by cascades (tests measure a cascade's work).
    #[cfg(test)]
    refiled: usize,
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
            stages: Box::new([Stage::NONE, Stage::NONE]),
            stage_budget: STAGE_BUDGET,
            staged_at: now_ms,
            #[cfg(test)]
            staged: 0,
            #[cfg(test)]
            refiled: 0,
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
        self.step_to(now_ms, fired);
        // One budget per call that moves the clock, however far: catching up on a long turn's
        // milliseconds would make the next turn long in turn.
        if self.now > self.staged_at {
            self.staged_at = self.now;
            self.stage_ahead(self.stage_budget);
        }
    }

    /// [`Wheel::advance_to`] without staging: for a caller that walks through a turn's
    /// deadlines one at a time and then calls `advance_to` for the turn's time, which stages
    /// once for all of them.
    pub fn step_to(&mut self, now_ms: u64, fired: &mut Vec<T>) {
        let target = now_ms.max(self.now);
        // Everything in the due list is at or before the old `now`, and every timer in the levels
        // is after it, so the due list goes first.
        self.fire_due(fired);
        loop {
            let next = self.next_expiration();
            // A staged slot's timers join the level below before anything else happens at its
            // start (every lower level is empty then). NEAR's slot starts before FAR's.
            let stage = [NEAR, FAR]
                .into_iter()
                .find(|&i| self.stages[i].level != 0)
                .map(|i| (i, &self.stages[i]));
            if let Some((i, st)) =
                stage.filter(|(_, st)| st.start <= target && next.is_none_or(|n| st.start <= n.2))
            {
                // Nothing else starts then: a level-`l` slot past 0 is no higher level's start.
                let (level, slot) = (st.level, st.slot);
                self.now = st.start;
                self.unstage(i, fired);
                if self.levels[level].occupied & (1 << slot) != 0 {
                    // Timers filed there after the stage was last topped up.
                    self.expire_slot(level, slot, fired);
                }
                continue;
            }
            match next {
                Some((level, slot, start)) if start <= target => {
                    self.now = start;
                    self.expire_slot(level, slot, fired);
                }
                _ => break,
            }
        }
        self.now = target;
    }

    /// Move up to `budget` timers of the next slot of level 1, and as many of the next slot
    /// above level 1, to cascade into their stages (choosing those slots if none is staged).
    fn stage_ahead(&mut self, budget: usize) {
        for i in [NEAR, FAR] {
            self.stage_one(i, STAGE_LEVELS[i], budget);
        }
    }

    /// When an idle owner should call `advance_to` to stage more: the next millisecond while a
    /// stage has timers left to move, `None` when both are complete (until a staged slot
    /// starts, which `next_deadline` names) or have nothing to take. An owner that only woke
    /// at `next_deadline` would stage nothing while idle, and a crowded slot would cascade at
    /// once when it starts.
    pub fn next_staging(&self) -> Option<u64> {
        let pending = |i: usize| {
            let st = &self.stages[i];
            if st.level == 0 {
                self.nonempty_levels & STAGE_LEVELS[i] != 0
            } else {
                self.levels[st.level].head[st.slot] != NIL
            }
        };
        (pending(NEAR) || pending(FAR)).then(|| self.now + 1)
    }

    /// [`Wheel::stage_ahead`] for stage `i`, which takes the earliest occupied slot of the
    /// levels in the bitmap `of_levels`.
    fn stage_one(&mut self, i: usize, of_levels: u16, budget: usize) {
        if self.stages[i].level == 0 {
            let mut best: Option<(u64, usize, usize)> = None;
            let mut levels = self.nonempty_levels & of_levels;
            while levels != 0 {
                let level = levels.trailing_zeros() as usize;
                levels &= levels - 1;
                let slot = self.levels[level].occupied.trailing_zeros() as usize;
                let start = slot_start(self.now, level, slot);
                if best.is_none_or(|b| start < b.0) {
                    best = Some((start, level, slot));
                }
            }
            let Some((start, level, slot)) = best else {
                return;
            };
            let st = &mut self.stages[i];
            st.level = level;
            st.slot = slot;
            st.start = start;
        }
        let (level, slot) = (self.stages[i].level, self.stages[i].slot);
        for _ in 0..budget {
            let idx = self.levels[level].head[slot];
            if idx == NIL {
                return;
            }
            #[cfg(test)]
            {
                self.staged += 1;
            }
            self.unlink(idx);
            let below = level - 1;
            let s = digit(self.entries[idx].deadline, below);
            let lists = &mut self.stages[i].lists;
            let old_head = std::mem::replace(&mut lists.head[s], idx);
            lists.occupied |= 1 << s;
            if old_head != NIL {
                self.entries[old_head].prev = idx;
            }
            let e = &mut self.entries[idx];
            e.level = below as u8;
            e.prev = NIL;
            e.next = old_head;
        }
    }

    /// Whether a timer at `level` due at `deadline` is in a stage rather than in the level: a
    /// stage holds the level's timers due within the staged slot, which the level itself
    /// cannot hold before the clock reaches that slot.
    fn in_stage(&self, level: u8, deadline: u64) -> bool {
        let st = &self.stages[Self::stage_of(level)];
        st.level != 0
            && usize::from(level) + 1 == st.level
            && deadline >= st.start
            && (deadline - st.start) >> (st.level * LEVEL_BITS) == 0
    }

    /// The stage that may hold timers at `level` (a staged timer is at the level below its slot's).
    fn stage_of(level: u8) -> usize {
        if level == 0 {
            NEAR
        } else {
            FAR
        }
    }

    /// The clock is at stage `i`'s slot's start: its timers become the level below's, those of
    /// that level's first slot re-filed lower (or fired, due now).
    fn unstage(&mut self, i: usize, fired: &mut Vec<T>) {
        let below = self.stages[i].level - 1;
        self.stages[i].level = 0;
        let mut lists = std::mem::replace(&mut self.stages[i].lists, Level::EMPTY);
        let mut first = std::mem::replace(&mut lists.head[0], NIL);
        lists.occupied &= !1;
        debug_assert_eq!(
            self.levels[below].occupied, 0,
            "a level below a cascade is empty"
        );
        self.levels[below] = lists;
        if lists.occupied != 0 {
            self.nonempty_levels |= 1 << below;
        }
        while first != NIL {
            let (next, deadline) = {
                let e = &self.entries[first];
                (e.next, e.deadline)
            };
            #[cfg(test)]
            {
                self.refiled += 1;
            }
            if deadline <= self.now {
                fired.push(self.entries.remove(first).value);
            } else {
                self.push(first, level_for(self.now, deadline));
            }
            first = next;
        }
    }

    /// When `advance_to` should next be called: never later than the earliest pending deadline,
    /// possibly earlier (the start of a higher-level slot that must cascade). It is at or before
    /// `now()` only if a timer was inserted already due, otherwise strictly later. `None` when
    /// empty.
    pub fn next_deadline(&self) -> Option<u64> {
        if self.due != NIL {
            return Some(self.due_earliest);
        }
        let next = self.next_expiration().map(|(_, _, start)| start);
        let staged = self
            .stages
            .iter()
            .filter(|st| st.level != 0 && st.lists.occupied != 0)
            .map(|st| st.start)
            .min();
        match (next, staged) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
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
            #[cfg(test)]
            {
                self.refiled += 1;
            }
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
        } else if self.in_stage(level, deadline) {
            let slot = digit(deadline, level as usize);
            let lists = &mut self.stages[Self::stage_of(level)].lists;
            lists.head[slot] = next;
            if next == NIL {
                lists.occupied &= !(1 << slot);
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
    /// Timers moved into a stage so far.
    pub(crate) fn timers_staged(&self) -> usize {
        self.staged
    }

    /// Timers staged per `advance_to` (tests make it small, so that stages stay partial).
    fn set_stage_budget(&mut self, n: usize) {
        self.stage_budget = n;
    }

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
        for (i, st) in self.stages.iter().enumerate() {
            if st.level == 0 {
                assert_eq!(st.lists.occupied, 0, "lists of no stage");
                continue;
            }
            assert!(
                (st.level == 1) == (i == NEAR) && st.start > self.now,
                "stage {i} of level {} at {}",
                st.level,
                st.start
            );
            for (s, &head) in st.lists.head.iter().enumerate() {
                assert_eq!(
                    st.lists.occupied & (1 << s) != 0,
                    head != NIL,
                    "stage bit {s}"
                );
                let (mut prev, mut idx) = (NIL, head);
                while idx != NIL {
                    let e = &self.entries[idx];
                    assert_eq!(e.prev, prev, "prev link of staged {idx}");
                    assert!(
                        self.in_stage(e.level, e.deadline),
                        "staged {idx} not in the stage"
                    );
                    assert_eq!(digit(e.deadline, st.level - 1), s, "staged {idx} list");
                    seen += 1;
                    (prev, idx) = (idx, e.next);
                }
            }
        }
        if self.stages[NEAR].level != 0 && self.stages[FAR].level != 0 {
            assert!(
                self.stages[NEAR].start < self.stages[FAR].start,
                "NEAR's slot starts first"
            );
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
#[path = "wheel_tests.rs"]
mod tests;
