use super::expiry::RECLAIM_BATCH;
use super::*;

/// The wheel promises a wake-up time no later than the earliest deadline (a hierarchical
/// wheel may name an earlier cascade point); the tests of firing times check the rest.
#[track_caller]
fn assert_next_deadline_by(next: Option<u64>, deadline: u64) {
    assert!(
        matches!(next, Some(d) if d <= deadline),
        "next_deadline {next:?} is not by {deadline}"
    );
}

const A: Session = Session(1);
const B: Session = Session(2);
const C: Session = Session(3);
const UNIX0: u64 = 1_700_000_000;

fn at(ms: u64) -> Now {
    Now {
        ms,
        unix: UNIX0 + ms / 1000,
    }
}

fn store_with(memory_limit: usize, max_item_size: usize) -> Store {
    Store::new(
        StoreConfig {
            memory_limit,
            max_item_size,
        },
        at(0),
    )
}

fn big() -> Store {
    store_with(1 << 20, 1024)
}

fn set(
    s: &mut Store,
    session: Session,
    key: &[u8],
    value: &[u8],
    exptime: i64,
    now: Now,
) -> StoreOutcome {
    s.store(
        session,
        StoreMode::Set,
        Write {
            key,
            flags: 0,
            exptime,
            value,
        },
        None,
        now,
    )
}

fn put(s: &mut Store, mode: StoreMode, key: &[u8], value: &[u8], now: Now) -> StoreOutcome {
    s.store(
        A,
        mode,
        Write {
            key,
            flags: 0,
            exptime: 0,
            value,
        },
        None,
        now,
    )
}

fn val(s: &mut Store, key: &[u8], now: Now) -> Option<Vec<u8>> {
    s.get(key, now).map(|v| v.value.to_vec())
}

fn cas_of(s: &Store, key: &[u8], now: Now) -> u64 {
    s.peek(key, now).map_or(0, |v| v.cas)
}

fn stored(o: StoreOutcome) -> u64 {
    match o {
        StoreOutcome::Stored { cas } => cas,
        other => panic!("expected Stored, got {other:?}"),
    }
}

/// Charge of an item, as the memory limit counts it.
fn charge(key: &[u8], value_len: usize) -> usize {
    key.len() + value_len + ITEM_OVERHEAD
}

#[test]
fn per_item_overhead_is_94_bytes_on_64_bit() {
    if cfg!(target_pointer_width = "64") {
        assert_eq!(std::mem::size_of::<Item>(), 64);
        assert_eq!(ITEM_OVERHEAD, 94);
    }
}

#[test]
fn set_then_get_returns_value_flags_and_cas() {
    let mut s = big();
    let cas = stored(s.store(
        A,
        StoreMode::Set,
        Write {
            key: b"k",
            flags: 42,
            exptime: 0,
            value: b"hello",
        },
        None,
        at(0),
    ));
    let v = s.get(b"k", at(1)).expect("hit");
    assert_eq!(
        (v.key, v.value, v.flags, v.cas),
        (&b"k"[..], &b"hello"[..], 42, cas)
    );
    assert_eq!(val(&mut s, b"other", at(1)), None);
    let st = s.stats();
    assert_eq!(
        (st.get_hits, st.get_misses, st.curr_items, st.total_items),
        (1, 1, 1, 1)
    );
    assert_eq!(st.bytes as usize, charge(b"k", 5));
    s.check_invariants();
}

#[test]
fn every_modification_gets_a_new_cas_unique() {
    let mut s = big();
    let c1 = stored(set(&mut s, A, b"k", b"1", 0, at(0)));
    let c2 = stored(put(&mut s, StoreMode::Append, b"k", b"2", at(0)));
    let ArithOutcome::Value { cas: c3, value: 13 } = s.incr_decr(
        A,
        b"k",
        Arith {
            incr: true,
            delta: 1,
            create: None,
            cas: None,
        },
        at(0),
    ) else {
        panic!("incr")
    };
    let c4 = stored(set(&mut s, A, b"other", b"x", 0, at(0)));
    assert!(c1 < c2 && c2 < c3 && c3 < c4);
    // touch, lock and unlock keep it.
    assert!(s.touch(b"k", 100, at(0)));
    assert_eq!(s.lock(A, b"k", at(0)), LockOutcome::Ok);
    assert_eq!(s.unlock(A, b"k", at(0)), UnlockOutcome::Ok);
    assert_eq!(cas_of(&s, b"k", at(0)), c3);
}

#[test]
fn lock_since_is_the_time_of_the_lock() {
    let mut s = big();
    stored(set(&mut s, A, b"k", b"1", 0, at(0)));
    assert_eq!(s.lock_since(b"k"), None);
    assert_eq!(s.lock(A, b"k", at(42_500)), LockOutcome::Ok);
    assert_eq!(s.lock_since(b"k"), Some(42_000), "whole seconds");
    assert_eq!(s.unlock(A, b"k", at(50)), UnlockOutcome::Ok);
    assert_eq!(s.lock_since(b"k"), None);
}

#[test]
fn add_on_present_key_is_not_stored() {
    let mut s = big();
    stored(put(&mut s, StoreMode::Add, b"k", b"1", at(0)));
    assert_eq!(
        put(&mut s, StoreMode::Add, b"k", b"2", at(0)),
        StoreOutcome::NotStored
    );
    assert_eq!(val(&mut s, b"k", at(0)).as_deref(), Some(&b"1"[..]));
}

#[test]
fn replace_append_prepend_on_missing_key_are_not_stored() {
    let mut s = big();
    for mode in [StoreMode::Replace, StoreMode::Append, StoreMode::Prepend] {
        assert_eq!(
            put(&mut s, mode, b"k", b"x", at(0)),
            StoreOutcome::NotStored
        );
    }
    assert_eq!(s.stats().curr_items, 0);
    stored(put(&mut s, StoreMode::Set, b"k", b"1", at(0)));
    stored(put(&mut s, StoreMode::Replace, b"k", b"2", at(0)));
    assert_eq!(val(&mut s, b"k", at(0)).as_deref(), Some(&b"2"[..]));
}

#[test]
fn append_and_prepend_keep_flags_and_expiry() {
    let mut s = big();
    stored(s.store(
        A,
        StoreMode::Set,
        Write {
            key: b"k",
            flags: 7,
            exptime: 10,
            value: b"mid",
        },
        None,
        at(0),
    ));
    stored(s.store(
        A,
        StoreMode::Append,
        Write {
            key: b"k",
            flags: 99,
            exptime: 0,
            value: b">",
        },
        None,
        at(1000),
    ));
    stored(s.store(
        A,
        StoreMode::Prepend,
        Write {
            key: b"k",
            flags: 98,
            exptime: 0,
            value: b"<",
        },
        None,
        at(2000),
    ));
    let v = s.get(b"k", at(9999)).expect("hit");
    assert_eq!((v.value, v.flags), (&b"<mid>"[..], 7));
    assert_eq!(s.get(b"k", at(10_000)), None, "original 10 s expiry kept");
}

#[test]
fn cas_on_missing_mismatching_and_matching_item() {
    let mut s = big();
    assert_eq!(
        s.store(
            A,
            StoreMode::Set,
            Write {
                key: b"k",
                flags: 0,
                exptime: 0,
                value: b"v"
            },
            Some(1),
            at(0)
        ),
        StoreOutcome::NotFound
    );
    let c = stored(set(&mut s, A, b"k", b"v", 0, at(0)));
    assert_eq!(
        s.store(
            A,
            StoreMode::Set,
            Write {
                key: b"k",
                flags: 0,
                exptime: 0,
                value: b"w"
            },
            Some(c + 1),
            at(0)
        ),
        StoreOutcome::Exists
    );
    let c2 = stored(s.store(
        A,
        StoreMode::Set,
        Write {
            key: b"k",
            flags: 0,
            exptime: 0,
            value: b"w",
        },
        Some(c),
        at(0),
    ));
    // CAS checks apply with every mode: a stale unique fails an append too.
    assert_eq!(
        s.store(
            A,
            StoreMode::Append,
            Write {
                key: b"k",
                flags: 0,
                exptime: 0,
                value: b"!"
            },
            Some(c),
            at(0)
        ),
        StoreOutcome::Exists
    );
    stored(s.store(
        A,
        StoreMode::Append,
        Write {
            key: b"k",
            flags: 0,
            exptime: 0,
            value: b"!",
        },
        Some(c2),
        at(0),
    ));
    assert_eq!(val(&mut s, b"k", at(0)).as_deref(), Some(&b"w!"[..]));
    let st = s.stats();
    assert_eq!((st.cas_misses, st.cas_badval, st.cas_hits), (1, 2, 2));
}

#[test]
fn delete_answers_deleted_not_found_and_exists_on_cas_mismatch() {
    let mut s = big();
    assert_eq!(s.delete(A, b"k", None, at(0)), DeleteOutcome::NotFound);
    let c = stored(set(&mut s, A, b"k", b"v", 0, at(0)));
    assert_eq!(s.delete(A, b"k", Some(c + 1), at(0)), DeleteOutcome::Exists);
    assert_eq!(s.delete(A, b"k", Some(c), at(0)), DeleteOutcome::Deleted);
    assert_eq!(s.delete(A, b"k", None, at(0)), DeleteOutcome::NotFound);
    let st = s.stats();
    assert_eq!(
        (st.delete_hits, st.delete_misses, st.curr_items, st.bytes),
        (1, 2, 0, 0)
    );
    s.check_invariants();
}

#[test]
fn too_large_values_are_refused() {
    let mut s = store_with(1 << 20, 4);
    assert_eq!(
        set(&mut s, A, b"k", b"12345", 0, at(0)),
        StoreOutcome::TooLarge
    );
    stored(set(&mut s, A, b"k", b"1234", 0, at(0)));
    assert_eq!(
        put(&mut s, StoreMode::Append, b"k", b"5", at(0)),
        StoreOutcome::TooLarge
    );
    assert_eq!(
        s.replace_and_unlock(
            A,
            Write {
                key: b"k",
                flags: 0,
                exptime: 0,
                value: b"12345"
            },
            None,
            at(0)
        ),
        RauOutcome::TooLarge
    );
    assert_eq!(val(&mut s, b"k", at(0)).as_deref(), Some(&b"1234"[..]));
}

#[test]
fn incr_wraps_at_2_pow_64() {
    let mut s = big();
    stored(set(&mut s, A, b"n", b"18446744073709551615", 0, at(0)));
    let r = s.incr_decr(
        A,
        b"n",
        Arith {
            incr: true,
            delta: 2,
            create: None,
            cas: None,
        },
        at(0),
    );
    assert!(matches!(r, ArithOutcome::Value { value: 1, .. }), "{r:?}");
    assert_eq!(val(&mut s, b"n", at(0)).as_deref(), Some(&b"1"[..]));
    assert_eq!(s.stats().bytes as usize, charge(b"n", 1));
}

#[test]
fn decr_floors_at_zero() {
    let mut s = big();
    stored(set(&mut s, A, b"n", b"10", 0, at(0)));
    assert!(matches!(
        s.incr_decr(
            A,
            b"n",
            Arith {
                incr: false,
                delta: 3,
                create: None,
                cas: None
            },
            at(0)
        ),
        ArithOutcome::Value { value: 7, .. }
    ));
    assert!(matches!(
        s.incr_decr(
            A,
            b"n",
            Arith {
                incr: false,
                delta: 100,
                create: None,
                cas: None
            },
            at(0)
        ),
        ArithOutcome::Value { value: 0, .. }
    ));
    assert_eq!(val(&mut s, b"n", at(0)).as_deref(), Some(&b"0"[..]));
    let st = s.stats();
    assert_eq!((st.decr_hits, st.decr_misses), (2, 0));
}

#[test]
fn incr_on_non_numeric_values_answers_non_numeric() {
    let mut s = big();
    for bad in [
        &b""[..],
        b"abc",
        b"12a",
        b" 12",
        b"-1",
        b"+1",
        b"18446744073709551616",
        b"1 2",
    ] {
        stored(set(&mut s, A, b"n", bad, 0, at(0)));
        assert_eq!(
            s.incr_decr(
                A,
                b"n",
                Arith {
                    incr: true,
                    delta: 1,
                    create: None,
                    cas: None
                },
                at(0)
            ),
            ArithOutcome::NonNumeric,
            "{bad:?}"
        );
        assert_eq!(val(&mut s, b"n", at(0)).as_deref(), Some(bad));
    }
}

#[test]
fn incr_accepts_trailing_spaces_and_leading_zeros() {
    let mut s = big();
    stored(set(&mut s, A, b"n", b"41  ", 0, at(0)));
    assert!(matches!(
        s.incr_decr(
            A,
            b"n",
            Arith {
                incr: true,
                delta: 1,
                create: None,
                cas: None
            },
            at(0)
        ),
        ArithOutcome::Value { value: 42, .. }
    ));
    assert_eq!(val(&mut s, b"n", at(0)).as_deref(), Some(&b"42"[..]));
    stored(set(&mut s, A, b"n", b"0009", 0, at(0)));
    assert!(matches!(
        s.incr_decr(
            A,
            b"n",
            Arith {
                incr: true,
                delta: 1,
                create: None,
                cas: None
            },
            at(0)
        ),
        ArithOutcome::Value { value: 10, .. }
    ));
}

#[test]
fn incr_keeps_flags_and_expiry_and_checks_cas() {
    let mut s = big();
    let c = stored(s.store(
        A,
        StoreMode::Set,
        Write {
            key: b"n",
            flags: 5,
            exptime: 2,
            value: b"1",
        },
        None,
        at(0),
    ));
    assert_eq!(
        s.incr_decr(
            A,
            b"n",
            Arith {
                incr: true,
                delta: 1,
                create: None,
                cas: Some(c + 1)
            },
            at(0)
        ),
        ArithOutcome::Exists
    );
    assert!(matches!(
        s.incr_decr(
            A,
            b"n",
            Arith {
                incr: true,
                delta: 1,
                create: None,
                cas: Some(c)
            },
            at(0)
        ),
        ArithOutcome::Value { value: 2, .. }
    ));
    assert_eq!(s.peek(b"n", at(1999)).map(|v| v.flags), Some(5));
    assert_eq!(s.peek(b"n", at(2000)), None);
}

#[test]
fn incr_on_missing_key_creates_it_only_with_an_initial_value() {
    let mut s = big();
    assert_eq!(
        s.incr_decr(
            A,
            b"n",
            Arith {
                incr: true,
                delta: 1,
                create: None,
                cas: None
            },
            at(0)
        ),
        ArithOutcome::NotFound
    );
    assert_eq!(
        s.incr_decr(
            A,
            b"n",
            Arith {
                incr: true,
                delta: 1,
                create: Some((10, 0)),
                cas: Some(3)
            },
            at(0)
        ),
        ArithOutcome::NotFound
    );
    let r = s.incr_decr(
        A,
        b"n",
        Arith {
            incr: false,
            delta: 1,
            create: Some((10, 1)),
            cas: None,
        },
        at(0),
    );
    assert!(matches!(r, ArithOutcome::Value { value: 10, .. }), "{r:?}");
    let v = s.get(b"n", at(999)).expect("created");
    assert_eq!((v.value, v.flags), (&b"10"[..], 0));
    assert_eq!(
        s.get(b"n", at(1000)),
        None,
        "created with the initial exptime"
    );
    let st = s.stats();
    assert_eq!((st.incr_misses, st.decr_misses, st.total_items), (2, 1, 1));
}

#[test]
fn relative_expiry_boundary_is_exact_to_the_millisecond() {
    let mut s = big();
    stored(set(&mut s, A, b"k", b"v", 5, at(1_500)));
    assert!(s.get(b"k", at(6_499)).is_some());
    assert!(s.get(b"k", at(6_500)).is_none());
    assert_eq!(s.stats().get_expired, 1);
    assert_eq!(s.stats().curr_items, 0, "lazily removed on access");
}

#[test]
fn thirty_days_is_relative_and_one_second_more_is_an_absolute_time() {
    let mut s = big();
    stored(set(&mut s, A, b"rel", b"v", RELATIVE_EXPTIME_MAX, at(0)));
    let day30 = RELATIVE_EXPTIME_MAX as u64 * 1000;
    assert!(s.peek(b"rel", at(day30 - 1)).is_some());
    assert!(s.peek(b"rel", at(day30)).is_none());
    // 2592001 as a Unix time is in 1970: already expired.
    stored(set(
        &mut s,
        A,
        b"abs",
        b"v",
        RELATIVE_EXPTIME_MAX + 1,
        at(0),
    ));
    assert!(s.get(b"abs", at(0)).is_none());
}

#[test]
fn absolute_expiry_counts_from_the_wall_clock() {
    let mut s = big();
    let now = Now {
        ms: 500,
        unix: UNIX0,
    };
    stored(set(&mut s, A, b"k", b"v", (UNIX0 + 3) as i64, now));
    assert!(s
        .peek(
            b"k",
            Now {
                ms: 3_499,
                unix: UNIX0 + 2
            }
        )
        .is_some());
    assert!(s
        .peek(
            b"k",
            Now {
                ms: 3_500,
                unix: UNIX0 + 3
            }
        )
        .is_none());
    stored(set(&mut s, A, b"now", b"v", UNIX0 as i64, now));
    assert!(
        s.get(b"now", now).is_none(),
        "an absolute time equal to now is past"
    );
}

#[test]
fn negative_exptime_stores_an_already_invisible_item() {
    let mut s = big();
    stored(set(&mut s, A, b"k", b"old", 0, at(0)));
    stored(set(&mut s, A, b"k", b"v", -1, at(0)));
    assert!(s.get(b"k", at(0)).is_none());
    assert_eq!(
        put(&mut s, StoreMode::Replace, b"k", b"x", at(0)),
        StoreOutcome::NotStored
    );
    stored(put(&mut s, StoreMode::Add, b"k", b"new", at(0)));
    assert_eq!(val(&mut s, b"k", at(0)).as_deref(), Some(&b"new"[..]));
}

#[test]
fn keys_step_lists_visible_keys_with_the_prefix_in_bounded_steps() {
    let mut s = big();
    for i in 0..100u32 {
        stored(set(&mut s, A, format!("p{i}").as_bytes(), b"v", 0, at(0)));
    }
    stored(set(&mut s, A, b"q", b"v", 0, at(0)));
    stored(set(&mut s, A, b"p-soon", b"v", 1, at(0)));
    stored(set(&mut s, A, b"p-held", b"v", 1, at(0)));
    assert_eq!(s.lock(B, b"p-held", at(0)), LockOutcome::Ok);
    let now = at(5000); // p-soon has expired (not yet reclaimed); p-held is locked
    let (mut listed, mut from, mut steps) = (Vec::new(), Some(0), 0);
    while let Some(f) = from {
        from = s.keys_step(f, b"p", 7, now, |k| listed.push(k.to_vec()));
        steps += 1;
    }
    assert_eq!(steps, 103usize.div_ceil(7));
    listed.sort();
    let mut want: Vec<Vec<u8>> = (0..100).map(|i| format!("p{i}").into_bytes()).collect();
    want.push(b"p-held".to_vec());
    want.sort();
    assert_eq!(listed, want);
    // A step past the end lists nothing and ends.
    assert_eq!(
        s.keys_step(10_000, b"", 7, now, |_| panic!("nothing")),
        None
    );
}

#[test]
fn size_classes_follow_stores_rewrites_and_removals() {
    let mut s = store_with(1 << 24, 1 << 16);
    stored(set(&mut s, A, b"a", &[0; 10], 0, at(0)));
    stored(set(&mut s, A, b"b", &[0; 1024], 0, at(0)));
    assert_eq!(s.size_counts(), [1, 1, 0, 0, 0, 0, 0, 0]);
    stored(put(&mut s, StoreMode::Append, b"a", &[0; 2000], at(0)));
    assert_eq!(s.size_counts(), [0, 2, 0, 0, 0, 0, 0, 0]);
    assert_eq!(s.delete(A, b"b", None, at(0)), DeleteOutcome::Deleted);
    assert_eq!(s.size_counts(), [0, 1, 0, 0, 0, 0, 0, 0]);
    s.check_invariants();
}

#[test]
fn expired_items_are_removed_by_the_wheel() {
    let mut s = big();
    stored(set(&mut s, A, b"a", b"v", 1, at(0)));
    stored(set(&mut s, A, b"b", b"v", 2, at(0)));
    stored(set(&mut s, A, b"c", b"v", 0, at(0)));
    assert_next_deadline_by(s.next_deadline(), 1000);
    s.advance(at(999));
    assert_eq!(s.stats().curr_items, 3);
    s.advance(at(1000));
    assert_eq!(s.stats().curr_items, 2);
    assert_next_deadline_by(s.next_deadline(), 2000);
    s.advance(at(5000));
    let st = s.stats();
    assert_eq!(
        (st.curr_items, st.reclaimed, st.expired_unfetched),
        (1, 2, 2)
    );
    assert_eq!(s.next_deadline(), None);
    s.check_invariants();
}

#[test]
fn touch_and_gat_replace_the_expiry_timer() {
    let mut s = big();
    stored(set(&mut s, A, b"k", b"v", 1, at(0)));
    assert!(s.touch(b"k", 10, at(500)));
    s.advance(at(1000));
    assert!(s.peek(b"k", at(1000)).is_some(), "old timer cancelled");
    let v = s.get_and_touch(b"k", 0, at(2000)).expect("hit");
    assert_eq!(v.value, b"v");
    s.advance(at(1_000_000));
    assert!(s.peek(b"k", at(1_000_000)).is_some(), "0 means never");
    assert!(!s.touch(b"missing", 1, at(0)));
    assert!(s.get_and_touch(b"missing", 1, at(0)).is_none());
    let st = s.stats();
    assert_eq!((st.touch_hits, st.touch_misses), (2, 2));
    assert_eq!(s.next_deadline(), None);
}

#[test]
fn flush_all_invalidates_unlocked_items_now() {
    let mut s = big();
    stored(set(&mut s, A, b"a", b"v", 0, at(0)));
    stored(set(&mut s, A, b"b", b"v", 0, at(0)));
    s.flush_all(0, at(10));
    assert!(s.get(b"a", at(10)).is_none());
    assert_eq!(s.stats().curr_items, 0);
    assert_eq!(s.stats().bytes, 0);
    stored(set(&mut s, A, b"a", b"new", 0, at(10)));
    assert_eq!(val(&mut s, b"a", at(10)).as_deref(), Some(&b"new"[..]));
    s.advance(at(10));
    s.check_invariants();
    assert_eq!(s.stats().curr_items, 1);
}

#[test]
fn flush_all_with_delay_invalidates_items_existing_at_that_time() {
    let mut s = big();
    stored(set(&mut s, A, b"before", b"v", 0, at(0)));
    s.flush_all(2, at(0));
    stored(set(&mut s, A, b"during", b"v", 0, at(1_000)));
    assert!(s.get(b"before", at(1_999)).is_some());
    assert_next_deadline_by(s.next_deadline(), 2_000);
    // No advance yet: the first command at or after the flush time sees it done.
    assert!(s.get(b"before", at(2_000)).is_none());
    assert!(s.get(b"during", at(2_000)).is_none());
    stored(set(&mut s, A, b"after", b"v", 0, at(2_000)));
    s.advance(at(3_000));
    assert!(s.get(b"after", at(3_000)).is_some());
    s.check_invariants();
}

#[test]
fn later_flush_all_replaces_a_pending_delayed_one() {
    let mut s = big();
    s.flush_all(2, at(0));
    s.flush_all(5, at(0));
    stored(set(&mut s, A, b"k", b"v", 0, at(0)));
    assert!(s.peek(b"k", at(2_000)).is_some());
    s.advance(at(2_000));
    assert!(s.get(b"k", at(4_999)).is_some());
    assert!(s.get(b"k", at(5_000)).is_none());
    // And an immediate flush cancels a pending delayed one.
    s.flush_all(3, at(5_000));
    s.flush_all(0, at(5_000));
    stored(set(&mut s, A, b"k", b"v", 0, at(5_000)));
    s.advance(at(9_000));
    assert!(s.get(b"k", at(9_000)).is_some());
    assert_eq!(s.next_deadline(), None);
}

#[test]
fn flush_all_spares_locked_items_even_after_unlock() {
    let mut s = big();
    stored(set(&mut s, A, b"locked", b"v", 0, at(0)));
    stored(set(&mut s, A, b"free", b"v", 0, at(0)));
    assert_eq!(s.lock(B, b"locked", at(0)), LockOutcome::Ok);
    s.flush_all(0, at(0));
    assert!(s.get(b"locked", at(0)).is_some());
    assert!(s.get(b"free", at(0)).is_none());
    assert_eq!(s.unlock(B, b"locked", at(1)), UnlockOutcome::Ok);
    assert!(s.get(b"locked", at(1)).is_some());
    assert_eq!(s.stats().curr_items, 1);
    s.check_invariants();
}

#[test]
fn flushed_memory_is_freed_before_any_live_item_is_evicted() {
    let c = charge(b"k0", 10);
    let mut s = store_with(3 * c, 100);
    for k in [b"k0", b"k1", b"k2"] {
        stored(set(&mut s, A, k, b"0123456789", 0, at(0)));
    }
    s.flush_all(0, at(0));
    for k in [b"k3", b"k4", b"k5"] {
        stored(set(&mut s, A, k, b"0123456789", 0, at(0)));
    }
    let st = s.stats();
    assert_eq!((st.evictions, st.reclaimed, st.curr_items), (0, 3, 3));
    s.check_invariants();
}

#[test]
fn flushed_items_are_freed_in_batches_by_the_wheel() {
    let mut s = big();
    for i in 0..(RECLAIM_BATCH + 10) {
        stored(set(&mut s, A, format!("k{i}").as_bytes(), b"v", 0, at(0)));
    }
    s.flush_all(0, at(0));
    assert_next_deadline_by(s.next_deadline(), 0);
    s.advance(at(0));
    assert_eq!(s.dead_bytes, 10 * charge(b"k1000", 1));
    assert_next_deadline_by(s.next_deadline(), 1);
    s.advance(at(1));
    assert_eq!(s.dead_bytes, 0);
    assert_eq!(s.stats().reclaimed as usize, RECLAIM_BATCH + 10);
    assert_eq!(s.next_deadline(), None);
    s.check_invariants();
}

#[test]
fn keys_over_250_bytes_are_never_stored() {
    let mut s = big();
    let long = [b'k'; MAX_KEY_LEN + 1];
    assert_eq!(
        set(&mut s, A, &long, b"v", 0, at(0)),
        StoreOutcome::NotStored
    );
    assert_eq!(
        s.incr_decr(
            A,
            &long,
            Arith {
                incr: true,
                delta: 1,
                create: Some((1, 0)),
                cas: None
            },
            at(0)
        ),
        ArithOutcome::NotFound
    );
    stored(set(&mut s, A, &long[..MAX_KEY_LEN], b"v", 0, at(0)));
    assert!(s.get(&long[..MAX_KEY_LEN], at(0)).is_some());
    s.check_invariants();
}

#[test]
fn failed_add_promotes_the_existing_item() {
    let mut s = big();
    for k in [b"a", b"b", b"c"] {
        stored(set(&mut s, A, k, b"v", 0, at(0)));
    }
    assert_eq!(
        put(&mut s, StoreMode::Add, b"a", b"w", at(0)),
        StoreOutcome::NotStored
    );
    assert_eq!(
        s.lru_keys(),
        vec![b"a".to_vec(), b"c".to_vec(), b"b".to_vec()]
    );
}

#[test]
fn an_expired_item_met_by_eviction_counts_as_reclaimed() {
    let c = charge(b"k0", 1);
    let mut s = store_with(2 * c, 100);
    stored(set(&mut s, A, b"k0", b"v", 1, at(0)));
    stored(set(&mut s, A, b"k1", b"v", 0, at(0)));
    stored(set(&mut s, A, b"k2", b"v", 0, at(1_000)));
    let st = s.stats();
    assert_eq!(
        (st.evictions, st.reclaimed, st.expired_unfetched),
        (0, 1, 1)
    );
    stored(set(&mut s, A, b"k3", b"v", 0, at(1_000)));
    assert_eq!(s.stats().evictions, 1);
    assert!(s.peek(b"k1", at(1_000)).is_none());
    s.check_invariants();
}

#[test]
fn lru_evicts_the_least_recently_used_item_first() {
    let c = charge(b"k0", 1);
    let mut s = store_with(3 * c, 100);
    for k in [b"k0", b"k1", b"k2"] {
        stored(set(&mut s, A, k, b"v", 0, at(0)));
    }
    assert!(s.get(b"k0", at(0)).is_some()); // k1 is now the LRU
    stored(set(&mut s, A, b"k3", b"v", 0, at(0)));
    assert!(s.peek(b"k1", at(0)).is_none());
    assert!(s.touch(b"k2", 0, at(0))); // k0 is now the LRU
    stored(set(&mut s, A, b"k4", b"v", 0, at(0)));
    assert!(s.peek(b"k0", at(0)).is_none());
    assert_eq!(
        s.lru_keys(),
        vec![b"k4".to_vec(), b"k2".to_vec(), b"k3".to_vec()]
    );
    // Replacing the LRU item itself never evicts it.
    stored(set(&mut s, A, b"k3", b"w", 0, at(0)));
    assert_eq!(
        s.lru_keys(),
        vec![b"k3".to_vec(), b"k4".to_vec(), b"k2".to_vec()]
    );
    assert_eq!(s.stats().evictions, 2);
    s.check_invariants();
}

#[test]
fn locked_items_are_never_evicted() {
    let c = charge(b"k10", 1);
    let mut s = store_with(4 * c, 100);
    for k in [b"k0", b"k1", b"k2", b"k3"] {
        stored(set(&mut s, A, k, b"v", 0, at(0)));
    }
    // All but k3 locked, k0 (the LRU end) by A, the others by B.
    assert_eq!(s.lock(A, b"k0", at(0)), LockOutcome::Ok);
    assert_eq!(s.lock(B, b"k1", at(0)), LockOutcome::Ok);
    assert_eq!(s.lock(B, b"k2", at(0)), LockOutcome::Ok);
    for i in 4..20 {
        stored(set(&mut s, C, format!("k{i}").as_bytes(), b"v", 0, at(0)));
    }
    for k in [b"k0", b"k1", b"k2"] {
        assert!(s.peek(k, at(0)).is_some());
    }
    assert_eq!(s.stats().curr_items, 4);
    assert_eq!(s.stats().evictions, 16);
    s.check_invariants();
}

#[test]
fn out_of_memory_when_every_item_is_locked() {
    let c = charge(b"k0", 1);
    let mut s = store_with(3 * c, 100);
    for k in [b"k0", b"k1", b"k2"] {
        stored(set(&mut s, A, k, b"v", 0, at(0)));
        assert_eq!(s.lock(A, k, at(0)), LockOutcome::Ok);
    }
    assert_eq!(
        set(&mut s, B, b"k3", b"v", 0, at(0)),
        StoreOutcome::OutOfMemory
    );
    assert_eq!(
        s.incr_decr(
            B,
            b"n",
            Arith {
                incr: true,
                delta: 1,
                create: Some((1, 0)),
                cas: None
            },
            at(0)
        ),
        ArithOutcome::OutOfMemory
    );
    // The holder may rewrite at the same size, not grow.
    stored(set(&mut s, A, b"k0", b"w", 0, at(0)));
    assert_eq!(
        set(&mut s, A, b"k0", b"ww", 0, at(0)),
        StoreOutcome::OutOfMemory
    );
    assert_eq!(
        s.replace_and_unlock(
            A,
            Write {
                key: b"k1",
                flags: 0,
                exptime: 0,
                value: b"ww"
            },
            None,
            at(0)
        ),
        RauOutcome::OutOfMemory
    );
    assert_eq!(s.stats().evictions, 0);
    assert_eq!(s.unlock(A, b"k2", at(0)), UnlockOutcome::Ok);
    stored(set(&mut s, B, b"k3", b"v", 0, at(0)));
    assert!(s.peek(b"k2", at(0)).is_none());
    s.check_invariants();
}

#[test]
fn lock_by_other_connection_answers_locked() {
    let mut s = big();
    stored(set(&mut s, A, b"k", b"v", 0, at(0)));
    assert_eq!(s.lock(A, b"k", at(0)), LockOutcome::Ok);
    assert_eq!(s.lock(B, b"k", at(0)), LockOutcome::Locked);
    assert_eq!(
        s.lock_and_get(B, b"k", None, at(0)),
        Err(LockOutcome::Locked)
    );
    let st = s.stats();
    assert_eq!(
        (st.locks_held, st.lock_grants, st.lock_conflicts),
        (1, 1, 2)
    );
    assert_eq!(s.lock_holder(b"k", at(0)), Some(A));
}

#[test]
fn lock_is_not_reentrant() {
    let mut s = big();
    stored(set(&mut s, A, b"k", b"v", 0, at(0)));
    assert_eq!(s.lock(A, b"k", at(0)), LockOutcome::Ok);
    assert_eq!(s.lock(A, b"k", at(0)), LockOutcome::Locked);
    assert_eq!(
        s.lock_and_get(A, b"k", None, at(0)),
        Err(LockOutcome::Locked)
    );
    assert_eq!(s.unlock(A, b"k", at(0)), UnlockOutcome::Ok);
    assert_eq!(s.unlock(A, b"k", at(0)), UnlockOutcome::NotLocked);
}

#[test]
fn lock_of_missing_or_expired_item_is_not_found() {
    let mut s = big();
    assert_eq!(s.lock(A, b"k", at(0)), LockOutcome::NotFound);
    stored(set(&mut s, A, b"k", b"v", 1, at(0)));
    assert_eq!(s.lock(A, b"k", at(1000)), LockOutcome::NotFound);
    assert_eq!(
        s.lock_and_get(A, b"k", None, at(1000)),
        Err(LockOutcome::NotFound)
    );
    assert_eq!(s.stats().lock_grants, 0);
}

#[test]
fn others_may_get_gets_touch_and_gat_a_locked_item() {
    let mut s = big();
    stored(set(&mut s, A, b"k", b"v", 0, at(0)));
    assert_eq!(s.lock(A, b"k", at(0)), LockOutcome::Ok);
    assert_eq!(val(&mut s, b"k", at(0)).as_deref(), Some(&b"v"[..]));
    assert!(s.touch(b"k", 5, at(0)));
    assert!(s.get_and_touch(b"k", 6, at(0)).is_some());
    assert_eq!(
        s.lock_holder(b"k", at(0)),
        Some(A),
        "reads leave the lock alone"
    );
}

#[test]
fn every_modification_by_another_connection_answers_locked() {
    let mut s = big();
    let c = stored(set(&mut s, A, b"k", b"5", 0, at(0)));
    assert_eq!(s.lock(A, b"k", at(0)), LockOutcome::Ok);
    for mode in [
        StoreMode::Set,
        StoreMode::Add,
        StoreMode::Replace,
        StoreMode::Append,
        StoreMode::Prepend,
    ] {
        assert_eq!(
            s.store(
                B,
                mode,
                Write {
                    key: b"k",
                    flags: 0,
                    exptime: 0,
                    value: b"x"
                },
                None,
                at(0)
            ),
            StoreOutcome::Locked,
            "{mode:?}"
        );
        // The lock is checked before the CAS.
        assert_eq!(
            s.store(
                B,
                mode,
                Write {
                    key: b"k",
                    flags: 0,
                    exptime: 0,
                    value: b"x"
                },
                Some(c + 9),
                at(0)
            ),
            StoreOutcome::Locked
        );
    }
    assert_eq!(s.delete(B, b"k", None, at(0)), DeleteOutcome::Locked);
    assert_eq!(s.delete(B, b"k", Some(c + 9), at(0)), DeleteOutcome::Locked);
    assert_eq!(
        s.incr_decr(
            B,
            b"k",
            Arith {
                incr: true,
                delta: 1,
                create: None,
                cas: None
            },
            at(0)
        ),
        ArithOutcome::Locked
    );
    assert_eq!(
        s.incr_decr(
            B,
            b"k",
            Arith {
                incr: false,
                delta: 1,
                create: None,
                cas: Some(c + 9)
            },
            at(0)
        ),
        ArithOutcome::Locked
    );
    assert_eq!(
        s.replace_and_unlock(
            B,
            Write {
                key: b"k",
                flags: 0,
                exptime: 0,
                value: b"x"
            },
            None,
            at(0)
        ),
        RauOutcome::NotLocked
    );
    assert_eq!(s.unlock(B, b"k", at(0)), UnlockOutcome::NotLocked);
    assert_eq!(s.unlock_all(B, at(0)), 0);
    let v = s.peek(b"k", at(0)).expect("still there");
    assert_eq!((v.value, v.cas), (&b"5"[..], c));
    assert_eq!(s.lock_holder(b"k", at(0)), Some(A));
}

#[test]
fn holder_may_modify_and_keeps_the_lock() {
    let mut s = big();
    stored(set(&mut s, A, b"k", b"1", 0, at(0)));
    assert_eq!(s.lock(A, b"k", at(0)), LockOutcome::Ok);
    stored(set(&mut s, A, b"k", b"2", 0, at(0)));
    stored(put(&mut s, StoreMode::Append, b"k", b"0", at(0)));
    assert!(matches!(
        s.incr_decr(
            A,
            b"k",
            Arith {
                incr: true,
                delta: 1,
                create: None,
                cas: None
            },
            at(0)
        ),
        ArithOutcome::Value { value: 21, .. }
    ));
    assert_eq!(
        put(&mut s, StoreMode::Add, b"k", b"x", at(0)),
        StoreOutcome::NotStored
    );
    assert_eq!(s.lock_holder(b"k", at(0)), Some(A));
    assert_eq!(set(&mut s, B, b"k", b"x", 0, at(0)), StoreOutcome::Locked);
    assert_eq!(s.stats().locks_held, 1);
    s.check_invariants();
}

#[test]
fn holder_deleting_the_item_drops_the_lock() {
    let mut s = big();
    stored(set(&mut s, A, b"k", b"v", 0, at(0)));
    assert_eq!(s.lock(A, b"k", at(0)), LockOutcome::Ok);
    assert_eq!(s.delete(A, b"k", None, at(0)), DeleteOutcome::Deleted);
    assert_eq!(s.stats().locks_held, 0);
    stored(set(&mut s, B, b"k", b"w", 0, at(0)));
    assert_eq!(s.lock(B, b"k", at(0)), LockOutcome::Ok);
    assert_eq!(s.unlock_all(A, at(0)), 0);
    assert_eq!(s.lock_holder(b"k", at(0)), Some(B));
    s.check_invariants();
}

#[test]
fn unlock_answers_not_found_not_locked_or_ok() {
    let mut s = big();
    assert_eq!(s.unlock(A, b"k", at(0)), UnlockOutcome::NotFound);
    stored(set(&mut s, A, b"k", b"v", 0, at(0)));
    assert_eq!(s.unlock(A, b"k", at(0)), UnlockOutcome::NotLocked);
    assert_eq!(s.lock(B, b"k", at(0)), LockOutcome::Ok);
    assert_eq!(s.unlock(A, b"k", at(0)), UnlockOutcome::NotLocked);
    assert_eq!(s.unlock(B, b"k", at(0)), UnlockOutcome::Ok);
    assert_eq!(s.lock(A, b"k", at(0)), LockOutcome::Ok);
    assert_eq!(s.stats().locks_held, 1);
}

#[test]
fn unlock_all_releases_only_the_callers_locks() {
    let mut s = big();
    for k in [b"a", b"b", b"c", b"d"] {
        stored(set(&mut s, A, k, b"v", 0, at(0)));
    }
    assert_eq!(s.lock(A, b"a", at(0)), LockOutcome::Ok);
    assert_eq!(s.lock(B, b"b", at(0)), LockOutcome::Ok);
    assert_eq!(s.lock(A, b"c", at(0)), LockOutcome::Ok);
    assert_eq!(s.unlock_all(A, at(0)), 2);
    assert_eq!(s.unlock_all(A, at(0)), 0);
    assert_eq!(s.lock_holder(b"b", at(0)), Some(B));
    assert_eq!(s.lock_holder(b"a", at(0)), None);
    // Released in acquisition order, each to the MRU end.
    assert_eq!(
        s.lru_keys(),
        vec![b"c".to_vec(), b"a".to_vec(), b"d".to_vec()]
    );
    s.check_invariants();
}

#[test]
fn lock_and_get_locks_returns_the_item_and_renews_expiry() {
    let mut s = big();
    let c = stored(s.store(
        A,
        StoreMode::Set,
        Write {
            key: b"k",
            flags: 3,
            exptime: 1,
            value: b"v",
        },
        None,
        at(0),
    ));
    let v = s.lock_and_get(A, b"k", Some(10), at(0)).expect("locked");
    assert_eq!((v.value, v.flags, v.cas), (&b"v"[..], 3, c));
    assert_eq!(s.unlock(A, b"k", at(5_000)), UnlockOutcome::Ok);
    assert!(s.peek(b"k", at(9_999)).is_some());
    assert!(s.peek(b"k", at(10_000)).is_none());
    let st = s.stats();
    assert_eq!((st.get_hits, st.lock_grants), (1, 1));
}

#[test]
fn replace_and_unlock_answers_like_replace_for_the_holder_only() {
    let mut s = big();
    assert_eq!(
        s.replace_and_unlock(
            A,
            Write {
                key: b"k",
                flags: 0,
                exptime: 0,
                value: b"x"
            },
            None,
            at(0)
        ),
        RauOutcome::NotFound
    );
    let c = stored(set(&mut s, A, b"k", b"v", 0, at(0)));
    assert_eq!(
        s.replace_and_unlock(
            A,
            Write {
                key: b"k",
                flags: 0,
                exptime: 0,
                value: b"x"
            },
            None,
            at(0)
        ),
        RauOutcome::NotLocked
    );
    assert_eq!(s.lock(A, b"k", at(0)), LockOutcome::Ok);
    assert_eq!(
        s.replace_and_unlock(
            B,
            Write {
                key: b"k",
                flags: 0,
                exptime: 0,
                value: b"x"
            },
            None,
            at(0)
        ),
        RauOutcome::NotLocked
    );
    assert_eq!(
        s.replace_and_unlock(
            A,
            Write {
                key: b"k",
                flags: 0,
                exptime: 0,
                value: b"x"
            },
            Some(c + 1),
            at(0)
        ),
        RauOutcome::Exists
    );
    let RauOutcome::Stored { cas } = s.replace_and_unlock(
        A,
        Write {
            key: b"k",
            flags: 9,
            exptime: 2,
            value: b"x",
        },
        Some(c),
        at(0),
    ) else {
        panic!("rau")
    };
    let v = s.peek(b"k", at(0)).expect("replaced");
    assert_eq!((v.value, v.flags, v.cas), (&b"x"[..], 9, cas));
    assert_eq!(s.lock_holder(b"k", at(0)), None);
    assert!(s.peek(b"k", at(2_000)).is_none(), "new exptime applied");
    s.check_invariants();
}

#[test]
fn locked_item_outlives_its_expiry_and_vanishes_on_unlock() {
    let mut s = big();
    stored(set(&mut s, A, b"k", b"v", 1, at(0)));
    assert_eq!(s.lock(A, b"k", at(0)), LockOutcome::Ok);
    s.advance(at(5_000));
    assert_eq!(val(&mut s, b"k", at(5_000)).as_deref(), Some(&b"v"[..]));
    assert_eq!(s.stats().curr_items, 1);
    s.check_invariants();
    assert_eq!(s.unlock(A, b"k", at(5_000)), UnlockOutcome::Ok);
    assert!(s.get(b"k", at(5_000)).is_none());
    assert_eq!(s.stats().curr_items, 0);
    // The same through a disconnect, and for an expiry given while locked.
    stored(set(&mut s, A, b"k", b"v", 0, at(5_000)));
    assert_eq!(s.lock(B, b"k", at(5_000)), LockOutcome::Ok);
    assert!(s.touch(b"k", -1, at(5_000)));
    assert!(s.peek(b"k", at(6_000)).is_some());
    assert_eq!(s.disconnect(B, at(6_000)), 1);
    assert!(s.peek(b"k", at(6_000)).is_none());
    assert_eq!(s.stats().curr_items, 0);
    s.check_invariants();
}

#[test]
fn disconnect_releases_a_thousand_locks_at_once() {
    let mut s = big();
    for i in 0..1001 {
        let key = format!("key{i}");
        stored(set(&mut s, A, key.as_bytes(), b"v", 0, at(0)));
        let holder = if i == 1000 { B } else { A };
        assert_eq!(s.lock(holder, key.as_bytes(), at(0)), LockOutcome::Ok);
    }
    assert_eq!(s.unlock(A, b"key500", at(0)), UnlockOutcome::Ok);
    assert_eq!(s.stats().locks_held, 1000);
    assert_eq!(s.disconnect(A, at(0)), 999);
    assert_eq!(s.disconnect(A, at(0)), 0);
    let st = s.stats();
    assert_eq!((st.locks_held, st.curr_items), (1, 1001));
    assert_eq!(s.lock_holder(b"key1000", at(0)), Some(B));
    stored(set(&mut s, C, b"key7", b"w", 0, at(0)));
    s.check_invariants();
}

// ---- the store against a naive model, after every step of seeded random sequences ----

use crate::rng::Rng;

#[derive(Clone, Debug)]
struct MItem {
    value: Vec<u8>,
    flags: u32,
    deadline: u64,
    cas: u64,
    holder: Option<Session>,
}

/// The store's rules written the obvious way: a sorted map, an LRU vector (front = LRU end), a
/// vector of keys per lock holder, linear scans everywhere.
struct Model {
    items: std::collections::BTreeMap<Vec<u8>, MItem>,
    lru: Vec<Vec<u8>>,
    held: std::collections::BTreeMap<Session, Vec<Vec<u8>>>,
    pending_flush: Option<u64>,
    last_cas: u64,
    limit: usize,
    max: usize,
}

fn m_deadline(exptime: i64, now: Now) -> u64 {
    if exptime == 0 {
        u64::MAX
    } else if exptime < 0 {
        now.ms
    } else if exptime <= 2_592_000 {
        now.ms + exptime as u64 * 1000
    } else if exptime as u64 <= now.unix {
        now.ms
    } else {
        now.ms + (exptime as u64 - now.unix) * 1000
    }
}

fn m_counter(v: &[u8]) -> Option<u64> {
    let mut t = v;
    while let [rest @ .., b' '] = t {
        t = rest;
    }
    if t.is_empty() || !t.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(t).ok()?.parse().ok()
}

impl Model {
    fn charge(key: &[u8], value: &[u8]) -> usize {
        key.len() + value.len() + ITEM_OVERHEAD
    }

    fn sync(&mut self, now: Now) {
        if self.pending_flush.is_some_and(|at| at <= now.ms) {
            self.pending_flush = None;
            self.flush();
        }
    }

    fn flush(&mut self) {
        self.items.retain(|_, it| it.holder.is_some());
        self.lru.clear();
    }

    fn drop_key(&mut self, key: &[u8]) {
        if let Some(it) = self.items.remove(key) {
            match it.holder {
                Some(h) => {
                    let list = self.held.get_mut(&h).expect("holder list");
                    list.retain(|k| k != key);
                    if list.is_empty() {
                        self.held.remove(&h);
                    }
                }
                None => self.lru.retain(|k| k != key),
            }
        }
    }

    /// Unlocked expired items go (what `advance` does).
    fn reap(&mut self, now: Now) {
        self.sync(now);
        let dead: Vec<Vec<u8>> = self
            .items
            .iter()
            .filter(|(_, it)| it.holder.is_none() && it.deadline <= now.ms)
            .map(|(k, _)| k.clone())
            .collect();
        for k in dead {
            self.drop_key(&k);
        }
    }

    fn present(&mut self, key: &[u8], now: Now) -> bool {
        match self.items.get(key) {
            None => false,
            Some(it) if it.holder.is_none() && it.deadline <= now.ms => {
                self.drop_key(key);
                false
            }
            Some(_) => true,
        }
    }

    fn holder(&self, key: &[u8]) -> Option<Session> {
        self.items.get(key).and_then(|it| it.holder)
    }

    fn bump(&mut self, key: &[u8]) {
        if self.holder(key).is_none() {
            self.lru.retain(|k| k != key);
            self.lru.push(key.to_vec());
        }
    }

    fn room(&mut self, charge: usize, target: Option<&[u8]>) -> bool {
        let target_charge = target.map_or(0, |k| Self::charge(k, &self.items[k].value));
        let pinned: usize = self
            .items
            .iter()
            .filter(|(k, it)| it.holder.is_some() && Some(k.as_slice()) != target)
            .map(|(k, it)| Self::charge(k, &it.value))
            .sum();
        if pinned + charge > self.limit {
            return false;
        }
        loop {
            let total: usize = self
                .items
                .iter()
                .map(|(k, it)| Self::charge(k, &it.value))
                .sum();
            if total - target_charge + charge <= self.limit {
                return true;
            }
            let victim = self
                .lru
                .iter()
                .find(|k| Some(k.as_slice()) != target)
                .expect("a victim")
                .clone();
            self.drop_key(&victim);
        }
    }

    fn next_cas(&mut self) -> u64 {
        self.last_cas += 1;
        self.last_cas
    }

    fn view(&self, key: &[u8]) -> (Vec<u8>, u32, u64) {
        let it = &self.items[key];
        (it.value.clone(), it.flags, it.cas)
    }

    #[allow(clippy::too_many_arguments)]
    fn store(
        &mut self,
        session: Session,
        mode: StoreMode,
        key: &[u8],
        flags: u32,
        exptime: i64,
        value: &[u8],
        cas: Option<u64>,
        now: Now,
    ) -> StoreOutcome {
        self.sync(now);
        if value.len() > self.max {
            return StoreOutcome::TooLarge;
        }
        let present = self.present(key, now);
        if present && self.holder(key).is_some_and(|h| h != session) {
            return StoreOutcome::Locked;
        }
        if let Some(c) = cas {
            if !present {
                return StoreOutcome::NotFound;
            }
            if self.items[key].cas != c {
                return StoreOutcome::Exists;
            }
        }
        let new_value = match mode {
            StoreMode::Add if present => {
                self.bump(key);
                return StoreOutcome::NotStored;
            }
            StoreMode::Replace | StoreMode::Append | StoreMode::Prepend if !present => {
                return StoreOutcome::NotStored;
            }
            StoreMode::Append => [&self.items[key].value[..], value].concat(),
            StoreMode::Prepend => [value, &self.items[key].value[..]].concat(),
            _ => value.to_vec(),
        };
        if new_value.len() > self.max {
            return StoreOutcome::TooLarge;
        }
        if !self.room(Self::charge(key, &new_value), present.then_some(key)) {
            return StoreOutcome::OutOfMemory;
        }
        let cas = self.next_cas();
        if present {
            let it = self.items.get_mut(key).expect("present");
            it.value = new_value;
            it.cas = cas;
            if !matches!(mode, StoreMode::Append | StoreMode::Prepend) {
                it.flags = flags;
                it.deadline = m_deadline(exptime, now);
            }
            self.bump(key);
        } else {
            let it = MItem {
                value: new_value,
                flags,
                deadline: m_deadline(exptime, now),
                cas,
                holder: None,
            };
            self.items.insert(key.to_vec(), it);
            self.lru.push(key.to_vec());
        }
        StoreOutcome::Stored { cas }
    }

    fn get(&mut self, key: &[u8], touch: Option<i64>, now: Now) -> Option<(Vec<u8>, u32, u64)> {
        self.sync(now);
        if !self.present(key, now) {
            return None;
        }
        if let Some(e) = touch {
            self.items.get_mut(key).expect("present").deadline = m_deadline(e, now);
        }
        self.bump(key);
        Some(self.view(key))
    }

    fn delete(
        &mut self,
        session: Session,
        key: &[u8],
        cas: Option<u64>,
        now: Now,
    ) -> DeleteOutcome {
        self.sync(now);
        if !self.present(key, now) {
            return DeleteOutcome::NotFound;
        }
        if self.holder(key).is_some_and(|h| h != session) {
            return DeleteOutcome::Locked;
        }
        if cas.is_some_and(|c| c != self.items[key].cas) {
            return DeleteOutcome::Exists;
        }
        self.drop_key(key);
        DeleteOutcome::Deleted
    }

    #[allow(clippy::too_many_arguments)]
    fn arith(
        &mut self,
        session: Session,
        key: &[u8],
        incr: bool,
        delta: u64,
        initial: Option<(u64, i64)>,
        cas: Option<u64>,
        now: Now,
    ) -> ArithOutcome {
        self.sync(now);
        if !self.present(key, now) {
            let (Some((value, exptime)), None) = (initial, cas) else {
                return ArithOutcome::NotFound;
            };
            let digits = value.to_string().into_bytes();
            if !self.room(Self::charge(key, &digits), None) {
                return ArithOutcome::OutOfMemory;
            }
            let cas = self.next_cas();
            let it = MItem {
                value: digits,
                flags: 0,
                deadline: m_deadline(exptime, now),
                cas,
                holder: None,
            };
            self.items.insert(key.to_vec(), it);
            self.lru.push(key.to_vec());
            return ArithOutcome::Value { value, cas };
        }
        if self.holder(key).is_some_and(|h| h != session) {
            return ArithOutcome::Locked;
        }
        if cas.is_some_and(|c| c != self.items[key].cas) {
            return ArithOutcome::Exists;
        }
        let Some(old) = m_counter(&self.items[key].value) else {
            return ArithOutcome::NonNumeric;
        };
        let value = if incr {
            old.wrapping_add(delta)
        } else {
            old.saturating_sub(delta)
        };
        let digits = value.to_string().into_bytes();
        if !self.room(Self::charge(key, &digits), Some(key)) {
            return ArithOutcome::OutOfMemory;
        }
        let cas = self.next_cas();
        let it = self.items.get_mut(key).expect("present");
        it.value = digits;
        it.cas = cas;
        self.bump(key);
        ArithOutcome::Value { value, cas }
    }

    fn lock(&mut self, session: Session, key: &[u8], now: Now) -> LockOutcome {
        self.sync(now);
        if !self.present(key, now) {
            return LockOutcome::NotFound;
        }
        if self.holder(key).is_some() {
            return LockOutcome::Locked;
        }
        self.items.get_mut(key).expect("present").holder = Some(session);
        self.lru.retain(|k| k != key);
        self.held.entry(session).or_default().push(key.to_vec());
        LockOutcome::Ok
    }

    fn release(&mut self, key: &[u8], now: Now) {
        let it = self.items.get_mut(key).expect("locked item");
        let holder = it.holder.take().expect("holder");
        let expired = it.deadline <= now.ms;
        let list = self.held.get_mut(&holder).expect("holder list");
        list.retain(|k| k != key);
        if list.is_empty() {
            self.held.remove(&holder);
        }
        self.lru.push(key.to_vec());
        if expired {
            self.drop_key(key);
        }
    }

    fn unlock(&mut self, session: Session, key: &[u8], now: Now) -> UnlockOutcome {
        self.sync(now);
        if !self.present(key, now) {
            return UnlockOutcome::NotFound;
        }
        if self.holder(key) != Some(session) {
            return UnlockOutcome::NotLocked;
        }
        self.release(key, now);
        UnlockOutcome::Ok
    }

    fn unlock_all(&mut self, session: Session, now: Now) -> usize {
        self.sync(now);
        let keys = self.held.get(&session).cloned().unwrap_or_default();
        for k in &keys {
            self.release(k, now);
        }
        keys.len()
    }

    #[allow(clippy::too_many_arguments)]
    fn rau(
        &mut self,
        session: Session,
        key: &[u8],
        flags: u32,
        exptime: i64,
        value: &[u8],
        cas: Option<u64>,
        now: Now,
    ) -> RauOutcome {
        self.sync(now);
        if value.len() > self.max {
            return RauOutcome::TooLarge;
        }
        if !self.present(key, now) {
            return RauOutcome::NotFound;
        }
        if self.holder(key) != Some(session) {
            return RauOutcome::NotLocked;
        }
        if cas.is_some_and(|c| c != self.items[key].cas) {
            return RauOutcome::Exists;
        }
        if !self.room(Self::charge(key, value), Some(key)) {
            return RauOutcome::OutOfMemory;
        }
        let cas = self.next_cas();
        let it = self.items.get_mut(key).expect("present");
        it.value = value.to_vec();
        it.flags = flags;
        it.deadline = m_deadline(exptime, now);
        it.cas = cas;
        self.release(key, now);
        RauOutcome::Stored { cas }
    }

    fn flush_all(&mut self, delay: i64, now: Now) {
        self.sync(now);
        let at = if delay <= 0 {
            now.ms
        } else {
            m_deadline(delay, now)
        };
        if at <= now.ms {
            self.pending_flush = None;
            self.flush();
        } else {
            self.pending_flush = Some(at);
        }
    }
}

const MODEL_KEYS: [&[u8]; 7] = [b"a", b"bb", b"ccc", b"key4", b"k5", b"counter", b"x"];
const MODEL_CONNS: [Session; 3] = [A, B, C];

fn random_value(rng: &mut Rng, max: usize) -> Vec<u8> {
    match rng.below(10) {
        0 => rng.below(1000).to_string().into_bytes(),
        1 => b"18446744073709551614".to_vec(),
        2 => b"18446744073709551616".to_vec(),
        3 => format!("{}  ", rng.below(100)).into_bytes(),
        4 => b" 7".to_vec(),
        5 => Vec::new(),
        6 => vec![b'z'; max + 1 + rng.below(5) as usize],
        _ => (0..rng.below(max as u64 / 2))
            .map(|_| b'a' + rng.below(26) as u8)
            .collect(),
    }
}

fn random_exptime(rng: &mut Rng, now: Now) -> i64 {
    match rng.below(24) {
        0 => -1,
        1 => 1 + rng.below(3) as i64,
        2 => RELATIVE_EXPTIME_MAX,
        3 => RELATIVE_EXPTIME_MAX + 1,
        4 => (now.unix + rng.below(4)) as i64,
        5 => now.unix as i64 - 1,
        _ => 0,
    }
}

fn random_cas(rng: &mut Rng, m: &Model, key: &[u8]) -> Option<u64> {
    match rng.below(10) {
        0..=1 => Some(m.items.get(key).map_or(1, |it| it.cas)),
        2 => Some(rng.below(m.last_cas + 2)),
        _ => None,
    }
}

fn run_model(seed: u64, steps: usize) {
    run_model_restoring(seed, steps, None)
}

/// The model run; with `restore_every`, the store is replaced by a restored copy of its
/// snapshot every that many steps, and must go on matching the model exactly.
fn run_model_restoring(seed: u64, steps: usize, restore_every: Option<usize>) {
    let mut rng = Rng(seed | 1);
    let max = 24;
    // Room for four to six items: eviction and OutOfMemory both happen often.
    let limit = 5 * ITEM_OVERHEAD + 40;
    let mut s = store_with(limit, max);
    let mut m = Model {
        items: Default::default(),
        lru: Vec::new(),
        held: Default::default(),
        pending_flush: None,
        last_cas: 0,
        limit,
        max,
    };
    let mut now = at(0);
    for step in 0..steps {
        let key = MODEL_KEYS[rng.below(MODEL_KEYS.len() as u64) as usize];
        let session = MODEL_CONNS[rng.below(3) as usize];
        let ctx = || {
            format!(
                "seed {seed} step {step} key {:?} session {session:?}",
                String::from_utf8_lossy(key)
            )
        };
        match rng.below(20) {
            0..=5 => {
                let mode = match rng.below(20) {
                    0..=7 => StoreMode::Set,
                    8..=10 => StoreMode::Add,
                    11..=13 => StoreMode::Replace,
                    14..=16 => StoreMode::Append,
                    _ => StoreMode::Prepend,
                };
                let value = random_value(&mut rng, max);
                let flags = rng.below(4) as u32;
                let exptime = random_exptime(&mut rng, now);
                let cas = random_cas(&mut rng, &m, key);
                let want = m.store(session, mode, key, flags, exptime, &value, cas, now);
                let got = s.store(
                    session,
                    mode,
                    Write {
                        key,
                        flags,
                        exptime,
                        value: &value,
                    },
                    cas,
                    now,
                );
                assert_eq!(got, want, "store {mode:?} {cas:?}: {}", ctx());
            }
            6 | 7 => {
                let touch = rng.chance(30).then(|| random_exptime(&mut rng, now));
                let want = m.get(key, touch, now);
                let got = match touch {
                    Some(e) => s.get_and_touch(key, e, now),
                    None => s.get(key, now),
                };
                let got = got.map(|v| (v.value.to_vec(), v.flags, v.cas));
                assert_eq!(got, want, "get/gat: {}", ctx());
            }
            8 => {
                let e = random_exptime(&mut rng, now);
                let want = m.get(key, Some(e), now).is_some();
                assert_eq!(s.touch(key, e, now), want, "touch: {}", ctx());
            }
            9 => {
                let cas = random_cas(&mut rng, &m, key);
                assert_eq!(
                    s.delete(session, key, cas, now),
                    m.delete(session, key, cas, now),
                    "delete: {}",
                    ctx()
                );
            }
            10 | 11 => {
                let incr = rng.chance(60);
                let delta = if rng.chance(10) {
                    u64::MAX - rng.below(3)
                } else {
                    rng.below(20)
                };
                let initial = rng
                    .chance(30)
                    .then(|| (rng.below(200), random_exptime(&mut rng, now)));
                let cas = random_cas(&mut rng, &m, key);
                let want = m.arith(session, key, incr, delta, initial, cas, now);
                let got = s.incr_decr(
                    session,
                    key,
                    Arith {
                        incr,
                        delta,
                        create: initial,
                        cas,
                    },
                    now,
                );
                assert_eq!(got, want, "incr_decr: {}", ctx());
            }
            12 | 13 => {
                if rng.chance(70) {
                    assert_eq!(
                        s.lock(session, key, now),
                        m.lock(session, key, now),
                        "lock: {}",
                        ctx()
                    );
                } else {
                    let e = rng.chance(50).then(|| random_exptime(&mut rng, now));
                    let want = match m.lock(session, key, now) {
                        LockOutcome::Ok => {
                            if let Some(e) = e {
                                m.items.get_mut(key).expect("locked").deadline = m_deadline(e, now);
                            }
                            Ok(m.view(key))
                        }
                        other => Err(other),
                    };
                    let got = s
                        .lock_and_get(session, key, e, now)
                        .map(|v| (v.value.to_vec(), v.flags, v.cas));
                    assert_eq!(got, want, "lock_and_get: {}", ctx());
                }
            }
            14 => {
                assert_eq!(
                    s.unlock(session, key, now),
                    m.unlock(session, key, now),
                    "unlock: {}",
                    ctx()
                );
            }
            15 => {
                let value = random_value(&mut rng, max);
                let exptime = random_exptime(&mut rng, now);
                let cas = random_cas(&mut rng, &m, key);
                let want = m.rau(session, key, 5, exptime, &value, cas, now);
                let got = s.replace_and_unlock(
                    session,
                    Write {
                        key,
                        flags: 5,
                        exptime,
                        value: &value,
                    },
                    cas,
                    now,
                );
                assert_eq!(got, want, "replace_and_unlock: {}", ctx());
            }
            16 => {
                let want = m.unlock_all(session, now);
                let got = if rng.chance(50) {
                    s.unlock_all(session, now)
                } else {
                    s.disconnect(session, now)
                };
                assert_eq!(got, want, "unlock_all/disconnect: {}", ctx());
            }
            17 if rng.chance(15) => {
                let delay = [-1, 0, 1, 2, 3][rng.below(5) as usize];
                m.flush_all(delay, now);
                s.flush_all(delay, now);
            }
            _ => {
                let ms = now.ms + rng.below(700);
                now = at(ms);
            }
        }
        // Half the steps run the timers; in the others expired items linger until a lookup or
        // an eviction meets them (the lazy paths).
        if rng.chance(50) {
            m.reap(now);
            s.advance(now);
        }
        s.check_invariants();
        if restore_every.is_some_and(|n| step % n == n - 1) {
            let st_before = s.stats();
            s = crate::core::codec::testing::round_trip(&s, s.config(), seed ^ step as u64, |c| {
                c.check_invariants()
            });
            assert_eq!(s.stats(), st_before);
        }
        let st = s.stats();
        assert_eq!(
            st.curr_items as usize,
            m.items.len(),
            "curr_items: {}",
            ctx()
        );
        let held: usize = m.held.values().map(Vec::len).sum();
        assert_eq!(st.locks_held as usize, held, "locks_held: {}", ctx());
        let mut want_lru = m.lru.clone();
        want_lru.reverse();
        assert_eq!(s.lru_keys(), want_lru, "LRU order: {}", ctx());
        for k in MODEL_KEYS {
            let got = s.peek(k, now).map(|v| (v.value.to_vec(), v.flags, v.cas));
            let flushed = m.pending_flush.is_some_and(|at| at <= now.ms);
            let want = m
                .items
                .get(k)
                .filter(|it| it.holder.is_some() || (it.deadline > now.ms && !flushed))
                .map(|it| (it.value.clone(), it.flags, it.cas));
            assert_eq!(
                got,
                want,
                "item {:?}: {}",
                String::from_utf8_lossy(k),
                ctx()
            );
            assert_eq!(s.lock_holder(k, now), m.holder(k), "holder: {}", ctx());
        }
    }
}

#[test]
fn a_store_restored_from_its_snapshot_goes_on_exactly_like_the_original() {
    for seed in [3, 0x5EED, 0xC0FFEE] {
        run_model_restoring(seed, 20_000, Some(37));
    }
}

#[test]
fn truncated_or_corrupt_store_snapshots_are_errors_not_panics() {
    let mut s = store_with(1 << 20, 64);
    let now = at(0);
    s.store(
        A,
        StoreMode::Set,
        Write {
            key: b"k1",
            flags: 1,
            exptime: 100,
            value: b"v1",
        },
        None,
        now,
    );
    s.store(
        A,
        StoreMode::Set,
        Write {
            key: b"k2",
            flags: 2,
            exptime: 0,
            value: b"v2",
        },
        None,
        now,
    );
    assert_eq!(s.lock(A, b"k2", now), LockOutcome::Ok);
    s.flush_all(0, now);
    s.store(
        B,
        StoreMode::Set,
        Write {
            key: b"k3",
            flags: 0,
            exptime: 0,
            value: b"v3",
        },
        None,
        now,
    );
    crate::core::codec::testing::damage_is_refused(&s, s.config(), 2000, |c| c.check_invariants());
}

#[test]
fn random_operations_match_the_naive_model() {
    for seed in [1, 0x9E37_79B9_7F4A_7C15, 42, 0xDEAD_BEEF, 7_777_777] {
        run_model(seed, 50_000);
    }
}
