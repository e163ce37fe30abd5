use super::*;
use crate::core::codec::testing::{damage_is_refused, round_trip};
use crate::rng::Rng;
use std::collections::{HashMap as StdHashMap, HashSet as StdHashSet};

fn valid(t: &CounterTable) {
    t.check_invariants().expect("invariants");
}

fn c(n: u32) -> Session {
    Session(u64::from(n))
}

#[test]
fn acquire_respects_the_maximum_each_request_gives() {
    let mut t = CounterTable::new(60);
    assert_eq!(t.acquire(c(1), b"x", 2, 3, 0), Ok(()));
    assert_eq!(
        t.acquire(c(2), b"x", 2, 3, 0),
        Err(CounterError::NotAvailable)
    );
    // A larger maximum in a later request is honoured: capacity is per request.
    assert_eq!(t.acquire(c(2), b"x", 2, 4, 0), Ok(()));
    assert_eq!(t.get(b"x"), Ok(4));
    // A smaller maximum than the current consumption refuses anything.
    assert_eq!(
        t.acquire(c(3), b"x", 1, 1, 0),
        Err(CounterError::NotAvailable)
    );
}

#[test]
fn release_of_more_than_held_is_not_acquired() {
    let mut t = CounterTable::new(60);
    assert_eq!(t.release(c(1), b"x", 0, 0), Err(CounterError::NotFound));
    t.acquire(c(1), b"x", 2, 5, 0).unwrap();
    assert_eq!(t.release(c(2), b"x", 1, 0), Err(CounterError::NotAcquired));
    assert_eq!(t.release(c(1), b"x", 3, 0), Err(CounterError::NotAcquired));
    assert_eq!(t.release(c(1), b"x", 0, 0), Ok(()));
    assert_eq!(t.release(c(1), b"x", 2, 0), Ok(()));
    assert_eq!(t.get(b"x"), Ok(0));
    // Holding nothing any more: even zero is not acquired.
    assert_eq!(t.release(c(1), b"x", 0, 0), Err(CounterError::NotAcquired));
}

#[test]
fn disconnect_releases_thousands_at_once() {
    let mut t = CounterTable::new(60);
    for i in 0..5000u32 {
        t.acquire(c(1), &i.to_be_bytes(), 1, 1, 0).unwrap();
    }
    t.acquire(c(2), b"keep", 1, 9, 0).unwrap();
    assert_eq!(t.disconnect(c(1), 0), 5000);
    for i in 0..5000u32 {
        assert_eq!(t.get(&i.to_be_bytes()), Ok(0));
    }
    assert_eq!(t.get(b"keep"), Ok(1));
    assert_eq!(t.disconnect(c(1), 0), 0);
}

#[test]
fn dump_max_is_the_peak_of_the_interval() {
    let mut t = CounterTable::new(100);
    t.acquire(c(1), b"x", 3, 9, 10).unwrap();
    t.release(c(1), b"x", 2, 20).unwrap();
    let mut seen = Vec::new();
    t.dump(30, |n, cur, max| seen.push((n.to_vec(), cur, max)));
    assert_eq!(seen, vec![(b"x".to_vec(), 1, 3)]);
    // Next interval: the peak restarts from the current consumption.
    seen.clear();
    t.dump(150, |n, cur, max| seen.push((n.to_vec(), cur, max)));
    assert_eq!(seen, vec![(b"x".to_vec(), 1, 1)]);
    // Idle zero counters are collected after their interval, busy ones are not.
    t.release(c(1), b"x", 1, 150).unwrap();
    assert_eq!(t.collect(199), 0);
    assert_eq!(t.collect(200), 1);
    assert_eq!(t.get(b"x"), Err(CounterError::NotFound));
}

#[test]
fn dump_lists_counters_in_name_order_whatever_the_seed() {
    for seed in 0..4 {
        let names = crate::core::hash::with_seed(seed, || {
            let mut t = CounterTable::new(1000);
            for n in [&b"m"[..], b"a", b"zz", b"b", b"\xff", b"ab"] {
                t.acquire(c(1), n, 1, 1, 5).unwrap();
            }
            let mut names = Vec::new();
            t.dump(5, |n, _, _| names.push(n.to_vec()));
            names
        });
        let want: Vec<Vec<u8>> = [&b"a"[..], b"ab", b"b", b"m", b"zz", b"\xff"]
            .iter()
            .map(|n| n.to_vec())
            .collect();
        assert_eq!(names, want);
    }
}

fn busy_table() -> CounterTable {
    let mut t = CounterTable::new(1000);
    for i in 0..40u32 {
        let name = format!("n{}", i % 7);
        let _ = t.acquire(c(i % 5), name.as_bytes(), 1 + i % 3, 9, u64::from(i) * 97);
        if i % 4 == 0 {
            let _ = t.release(c(i % 5), name.as_bytes(), 1, u64::from(i) * 97 + 1);
        }
    }
    t.stats.cmd_dump = 3;
    t.collect_due(2500);
    t
}

#[test]
fn snapshot_round_trips_under_another_seed() {
    let t = busy_table();
    valid(&t);
    let copy = round_trip(&t, t.interval_ms(), 99, valid);
    assert_eq!(copy.stats, t.stats);
    assert_eq!(copy.collected_at, t.collected_at);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    t.dump(2600, |n, cur, max| a.push((n.to_vec(), cur, max)));
    copy.dump(2600, |n, cur, max| b.push((n.to_vec(), cur, max)));
    assert_eq!(a, b);
    assert!(!a.is_empty());
    round_trip(&CounterTable::new(5), 5, 1, valid);
}

#[test]
fn damaged_snapshots_are_refused() {
    let t = busy_table();
    damage_is_refused(&t, t.interval_ms(), 3000, valid);
}

#[test]
fn inconsistent_snapshots_are_refused() {
    // A consumption that holders do not account for.
    let mut t = CounterTable::new(10);
    t.acquire(c(1), b"x", 2, 5, 0).unwrap();
    t.held.get_mut(&c(1)).unwrap().insert(
        b"x"[..].into(),
        Holding {
            resources: 1,
            token: 1,
        },
    );
    let mut bytes = Vec::new();
    t.snapshot(&mut bytes);
    assert!(CounterTable::restore(10, &mut Reader::new(&bytes)).is_err());
}

/// Seeded random operations checked against a naive model after every step.
#[test]
fn random_operations_match_a_naive_model() {
    for seed in 0..40 {
        run(seed, None);
    }
}

/// The same, with the table replaced every ~30 steps by a copy restored from its snapshot
/// under another hash seed.
#[test]
fn random_operations_match_the_model_across_restores() {
    for seed in 0..40 {
        run(seed, Some(30));
    }
}

fn run(seed: u64, restore_every: Option<u64>) {
    let mut rng = Rng::new(seed);
    let mut t = CounterTable::new(1000);
    // model: per (session, name) held; consumption is the sum.
    let mut model: StdHashMap<(u32, u8), u32> = StdHashMap::new();
    let mut exists: StdHashSet<u8> = StdHashSet::new();
    let mut now = 0u64;
    for step in 0..600u64 {
        now += rng.below(40);
        let session = rng.below(4) as u32;
        let name = rng.below(5) as u8;
        let total = |m: &StdHashMap<(u32, u8), u32>, n: u8| -> u32 {
            m.iter().filter(|(k, _)| k.1 == n).map(|(_, v)| *v).sum()
        };
        match rng.below(4) {
            0 | 1 => {
                let r = 1 + rng.below(3) as u32;
                let max = r + rng.below(5) as u32;
                let got = t.acquire(c(session), &[name], r, max, now);
                let cur = total(&model, name);
                let want = if exists.contains(&name) && cur + r > max {
                    Err(CounterError::NotAvailable)
                } else {
                    Ok(())
                };
                assert_eq!(got, want, "seed {seed} step {step}");
                if got.is_ok() {
                    exists.insert(name);
                    *model.entry((session, name)).or_default() += r;
                }
            }
            2 => {
                let r = rng.below(4) as u32;
                let have = model.get(&(session, name)).copied();
                let want = if !exists.contains(&name) {
                    Err(CounterError::NotFound)
                } else {
                    match have {
                        Some(h) if h >= r => Ok(()),
                        _ => Err(CounterError::NotAcquired),
                    }
                };
                assert_eq!(t.release(c(session), &[name], r, now), want);
                if want.is_ok() {
                    let h = model.entry((session, name)).or_default();
                    *h -= r;
                    if *h == 0 {
                        model.remove(&(session, name));
                    }
                }
            }
            _ => {
                t.disconnect(c(session), now);
                model.retain(|k, _| k.0 != session);
            }
        }
        // yrmcds's GC: zero counters untouched for a whole interval go.
        if rng.below(50) == 0 {
            now += 1000;
            t.collect_due(now);
            exists.retain(|n| total(&model, *n) > 0);
        }
        for n in 0..5u8 {
            let want = if exists.contains(&n) {
                Ok(total(&model, n))
            } else {
                Err(CounterError::NotFound)
            };
            assert_eq!(t.get(&[n]), want, "seed {seed} step {step}");
            for k in 0..4 {
                assert_eq!(
                    t.held_by(c(k), &[n]),
                    model.get(&(k, n)).copied().unwrap_or(0)
                );
            }
        }
        valid(&t);
        if restore_every.is_some_and(|every| step % every == every - 1) {
            t = round_trip(&t, t.interval_ms(), seed ^ step, valid);
        }
    }
}

#[test]
fn every_acquire_is_a_grant_with_a_fencing_token_from_the_shared_counter() {
    let fence = crate::core::fence::Fence::default();
    fence.raise_to(40);
    let mut t = CounterTable::new(10).with_fence(&fence);
    t.acquire(c(1), b"sem", 1, 3, 0).unwrap();
    assert_eq!(t.token_of(c(1), b"sem"), Some(41));
    t.acquire(c(2), b"sem", 1, 3, 0).unwrap();
    assert_eq!(t.token_of(c(2), b"sem"), Some(42));
    // A refused acquire is no grant; a later one by the same holder takes a new token.
    assert_eq!(
        t.acquire(c(3), b"sem", 2, 3, 0),
        Err(CounterError::NotAvailable)
    );
    assert_eq!(fence.last(), 42);
    t.acquire(c(1), b"sem", 1, 3, 0).unwrap();
    assert_eq!(t.token_of(c(1), b"sem"), Some(43));
    // Releasing all of it ends the holding and its token.
    t.release(c(2), b"sem", 1, 0).unwrap();
    assert_eq!(t.token_of(c(2), b"sem"), None);
    let mut seen = Vec::new();
    t.for_each_holding(|name, holder, n, token| seen.push((name.to_vec(), holder, n, token)));
    assert_eq!(seen, [(b"sem".to_vec(), c(1), 2, 43)]);
    // The token survives a snapshot, and the restored table never hands out a lower one.
    let copy = round_trip(&t, t.interval_ms(), 7, valid);
    assert_eq!(copy.token_of(c(1), b"sem"), Some(43));
    assert_eq!(copy.last_fence(), 43);
}
