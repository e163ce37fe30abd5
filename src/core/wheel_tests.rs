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
    model_check_staging(seed, start, steps, STAGE_BUDGET);
}

fn model_check_staging(seed: u64, start: u64, steps: usize, budget: usize) {
    let mut rng = Rng(seed);
    let mut w: Wheel<u64> = Wheel::new(start);
    w.set_stage_budget(budget);
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
                if rng.below(4) == 0 {
                    w.step_to(target, &mut fired);
                } else {
                    w.advance_to(target, &mut fired);
                }
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

/// Stages left partial (a few timers moved per advance) and none at all: every operation still
/// matches the model.
#[test]
fn random_operations_match_btreemap_model_with_partial_stages() {
    for (i, budget) in [0, 1, 7].into_iter().enumerate() {
        let seed = 0x5851_f42d_4c95_7f2d ^ i as u64;
        model_check_staging(seed, 0, 50_000, budget);
        model_check_staging(seed, (1 << 40) + 777, 50_000, budget);
        model_check_staging(seed, u64::MAX - (1 << 38), 50_000, budget);
    }
}

/// An owner with nothing else to do sleeps until the wheel asks to be advanced. Woken at
/// `next_staging` too, it prepares a crowded slot of level 1 or 2 before the slot starts, a
/// budget per wake; woken only at `next_deadline`, it staged nothing and the slot cascaded at
/// once. Either way every timer fires at its deadline.
#[test]
fn an_idle_owner_woken_to_stage_cascades_crowded_slots_a_budget_at_a_time() {
    // A level-1 slot starts 64 ms after the one before: 64 budgets are ready by then.
    for (start, span, n) in [(64, 64, 30_000), (4096, 4096, 100_000)] {
        for wake_to_stage in [true, false] {
            let mut w: Wheel<u64> = Wheel::new(0);
            let mut rng = Rng(start);
            let mut deadlines: Vec<u64> = (0..n).map(|_| start + rng.below(span)).collect();
            for (i, &d) in deadlines.iter().enumerate() {
                w.insert(d, i as u64);
            }
            deadlines.sort_unstable();
            let (mut fired, mut worst, mut got, mut wakes) = (Vec::new(), 0, Vec::new(), 0);
            loop {
                let next = w.next_deadline();
                let next = match (next, w.next_staging().filter(|_| wake_to_stage)) {
                    (Some(a), Some(b)) => a.min(b),
                    (a, b) => match a.or(b) {
                        Some(t) => t,
                        None => break,
                    },
                };
                let before = w.refiled;
                fired.clear();
                w.advance_to(next, &mut fired);
                wakes += 1;
                worst = worst.max(w.refiled - before);
                got.extend(fired.iter().map(|_| next));
            }
            w.check_invariants();
            assert_eq!(got, deadlines, "every timer at its deadline");
            if wake_to_stage {
                assert!(worst <= n / 64 + 200, "{worst} re-filed in one wake");
                assert!(
                    wakes <= 2 * (span as usize + n / STAGE_BUDGET + 10),
                    "{wakes} wakes"
                );
            } else {
                assert_eq!(worst, n, "not woken to stage, the slot cascades at once");
            }
        }
    }
}

/// `n` timers spread over the slot `[start, start + span)` (one slot of level 1 or 2), the
/// clock then run a millisecond at a time to `2 * (start + span)`: staged ahead with the full
/// budget, its cascade re-files at most `n / 64` and a margin in one advance (the timers of its
/// first sub-slot); with nothing staged, all `n` at once. Every timer fires at its deadline.
fn crowded_slot(n: usize, start: u64, span: u64, seed: u64) {
    for (budget, most) in [(STAGE_BUDGET, n / 64 + 200), (0, n)] {
        let mut w: Wheel<u64> = Wheel::new(0);
        w.set_stage_budget(budget);
        let mut rng = Rng(seed);
        let mut deadlines: Vec<u64> = (0..n).map(|_| start + rng.below(span)).collect();
        for (i, &d) in deadlines.iter().enumerate() {
            w.insert(d, i as u64);
        }
        deadlines.sort_unstable();
        let (mut fired, mut worst, mut got) = (Vec::new(), 0, Vec::new());
        for t in 1..=2 * (start + span) {
            let before = w.refiled;
            fired.clear();
            w.advance_to(t, &mut fired);
            worst = worst.max(w.refiled - before);
            got.extend(fired.iter().map(|_| t));
            if t % 64 == 0 {
                w.check_invariants();
            }
        }
        assert_eq!(
            got, deadlines,
            "budget {budget}: every timer at its deadline"
        );
        assert!(
            worst <= most,
            "budget {budget}: {worst} timers re-filed in one advance (at most {most})"
        );
        if budget == 0 {
            assert_eq!(
                worst, n,
                "without a stage the cascade takes them all at once"
            );
        }
    }
}

/// A level-2 slot (4,096 ms) of 100,000 timers.
#[test]
fn a_crowded_level_2_slot_is_staged_before_it_starts() {
    crowded_slot(100_000, 4096, 4096, 42);
}

/// A level-1 slot (64 ms) of 30,000 timers: a few hundred thousand leases a second of one TTL
/// fill one.
#[test]
fn a_crowded_level_1_slot_is_staged_before_it_starts() {
    crowded_slot(30_000, 128, 64, 7);
}

/// Staging follows the clock, not the calls: an owner advances the wheel before every request,
/// thousands of times within one millisecond, and each call that moves the clock stages one
/// budget.
#[test]
fn staging_is_paced_by_the_clock_not_by_calls() {
    let mut w: Wheel<u64> = Wheel::new(0);
    for i in 0..100_000u64 {
        w.insert(4096 + i % 4096, i);
    }
    let mut fired = Vec::new();
    for _ in 0..10_000 {
        w.advance_to(1, &mut fired);
    }
    assert_eq!(w.staged, STAGE_BUDGET, "one millisecond, one budget");
    w.advance_to(2, &mut fired);
    assert_eq!(w.staged, 2 * STAGE_BUDGET);
    // A jump stages one budget too: catching up would lengthen the turn after a long one.
    w.advance_to(1000, &mut fired);
    assert_eq!(w.staged, 3 * STAGE_BUDGET);
    // So does a walk through a turn's deadlines one at a time (`step_to`) that ends with the
    // turn's `advance_to`.
    for t in 1001..1020 {
        w.step_to(t, &mut fired);
    }
    assert_eq!(w.staged, 3 * STAGE_BUDGET);
    w.advance_to(1020, &mut fired);
    assert_eq!(w.staged, 4 * STAGE_BUDGET);
    assert!(fired.is_empty());
    w.check_invariants();
}
