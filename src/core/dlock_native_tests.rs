use super::super::*;
use super::*;
use crate::core::codec::Reader;

fn c(n: u32) -> Session {
    Session(u64::from(n))
}

fn table() -> DlockTable {
    let mut t = DlockTable::new(DlockConfig { idle_timeout_ms: 0 }, 0);
    t.set_key_events(true);
    t
}

fn req<'k>(id: u64, keys: &'k [&'k [u8]]) -> NativeLock<'k> {
    NativeLock {
        request_id: id,
        keys,
        ..NativeLock::default()
    }
}

fn shared<'k>(id: u64, keys: &'k [&'k [u8]]) -> NativeLock<'k> {
    NativeLock {
        shared: true,
        ..req(id, keys)
    }
}

fn sem<'k>(id: u64, keys: &'k [&'k [u8]], limit: u32) -> NativeLock<'k> {
    NativeLock {
        limit: Some(limit),
        ..req(id, keys)
    }
}

/// A version-3 Lock; its result and the events it made (the table's invariants hold after).
fn lock3(
    t: &mut DlockTable,
    s: Session,
    r: NativeLock<'_>,
    now: u64,
) -> (Result<LockResult, NativeError>, Vec<DlockEvent>) {
    let mut ev = Vec::new();
    let res = t.lock_native(s, r, now, &mut ev);
    t.check_invariants();
    (res, ev)
}

/// A version-3 Lock that must be granted at once; its token.
fn take(t: &mut DlockTable, s: Session, r: NativeLock<'_>, now: u64) -> u64 {
    let (res, _) = lock3(t, s, r, now);
    assert_eq!(res, Ok(LockResult::Granted));
    t.last_fence()
}

/// A version-3 Lock that must wait.
fn wait(t: &mut DlockTable, s: Session, r: NativeLock<'_>, now: u64) {
    let (res, ev) = lock3(t, s, r, now);
    assert_eq!(res, Ok(LockResult::Waiting));
    assert_eq!(ev, []);
}

fn lock2(t: &mut DlockTable, s: Session, keys: &[&[u8]], now: u64) -> LockResult {
    let mut ev = Vec::new();
    let res = t.lock(
        s,
        LockRequest {
            token: 0,
            keys,
            wait_us: None,
            lease_us: None,
        },
        now,
        &mut ev,
    );
    t.check_invariants();
    res
}

fn advance(t: &mut DlockTable, now: u64) -> Vec<DlockEvent> {
    let mut ev = Vec::new();
    t.advance(now, &mut ev);
    t.check_invariants();
    ev
}

/// The (session, request id, fence) of each `Granted` event.
fn grants(ev: &[DlockEvent]) -> Vec<(Session, u64, u64)> {
    ev.iter()
        .filter_map(|e| match e {
            DlockEvent::Granted {
                session,
                token,
                fence,
            } => Some((*session, *token, *fence)),
            _ => None,
        })
        .collect()
}

/// The `Key` events: (key, kind, fence).
fn key_events(ev: &[DlockEvent]) -> Vec<(String, KeyEventKind, u64)> {
    ev.iter()
        .filter_map(|e| match e {
            DlockEvent::Key {
                key, kind, fence, ..
            } => Some((String::from_utf8_lossy(key).into_owned(), *kind, *fence)),
            _ => None,
        })
        .collect()
}

/// The `Notice` events: (session, request id, key, kind, fence).
fn notices(ev: &[DlockEvent]) -> Vec<(Session, u64, String, KeyEventKind, u64)> {
    ev.iter()
        .filter_map(|e| match e {
            DlockEvent::Notice {
                session,
                request_id,
                key,
                kind,
                fence,
                ..
            } => Some((
                *session,
                *request_id,
                String::from_utf8_lossy(key).into_owned(),
                *kind,
                *fence,
            )),
            _ => None,
        })
        .collect()
}

fn fences(t: &DlockTable, key: &[u8], now: u64) -> Vec<u64> {
    t.get(key, now).holders.iter().map(|h| h.fence).collect()
}

use KeyEventKind::{Acquired, Expired, Lost, Released};

#[test]
fn shared_holders_coexist_and_a_waiting_exclusive_lock_is_not_overtaken_by_later_shared_ones() {
    let mut t = table();
    let f1 = take(&mut t, c(1), shared(1, &[b"k"]), 0);
    let f2 = take(&mut t, c(2), shared(2, &[b"k"]), 0);
    assert_ne!(f1, f2, "each shared grant has its own token");
    wait(&mut t, c(3), req(3, &[b"k"]), 0);
    // A later shared Lock waits behind the exclusive one.
    wait(&mut t, c(4), shared(4, &[b"k"]), 0);
    let info = t.get(b"k", 0);
    assert!(info.shared);
    assert_eq!(info.holders.len(), 2);
    assert_eq!(info.waiters, 2);
    let mut ev = Vec::new();
    t.unlock_native(c(1), &[b"k"], None, 1, &mut ev).unwrap();
    assert_eq!(grants(&ev), []);
    t.unlock_native(c(2), &[b"k"], None, 2, &mut ev).unwrap();
    t.check_invariants();
    let g = grants(&ev);
    assert_eq!(g.len(), 1);
    assert_eq!((g[0].0, g[0].1), (c(3), 3));
    assert_eq!(
        key_events(&ev),
        [
            ("k".into(), Released, f1),
            ("k".into(), Released, f2),
            ("k".into(), Acquired, g[0].2)
        ]
    );
    assert!(!t.get(b"k", 2).shared);
}

#[test]
fn shared_locks_at_the_head_of_a_queue_are_granted_together_each_with_its_own_token() {
    let mut t = table();
    let f0 = take(&mut t, c(1), req(1, &[b"k"]), 0);
    wait(&mut t, c(2), shared(2, &[b"k"]), 0);
    wait(&mut t, c(3), shared(3, &[b"k", b"j"]), 0);
    wait(&mut t, c(4), req(4, &[b"k"]), 0);
    wait(&mut t, c(5), shared(5, &[b"k"]), 0);
    let mut ev = Vec::new();
    t.unlock_native(c(1), &[b"k"], None, 5, &mut ev).unwrap();
    t.check_invariants();
    let g = grants(&ev);
    assert_eq!(
        g.iter().map(|g| (g.0, g.1)).collect::<Vec<_>>(),
        [(c(2), 2), (c(3), 3)]
    );
    assert_eq!(g[0].2, f0 + 1);
    assert_eq!(g[1].2, f0 + 2);
    assert_eq!(fences(&t, b"k", 5), [f0 + 1, f0 + 2]);
    assert_eq!(t.get(b"k", 5).waiters, 2);
    assert!(t.check_fence(b"j", f0 + 2));
}

#[test]
fn a_version3_connection_that_holds_a_key_and_asks_again_waits_like_anyone_else() {
    let mut t = table();
    take(&mut t, c(1), req(1, &[b"k"]), 0);
    wait(&mut t, c(1), req(2, &[b"k"]), 0);
    // And several Locks of one connection wait at once.
    wait(&mut t, c(1), req(3, &[b"k"]), 0);
    let mut ev = Vec::new();
    t.unlock_native(c(1), &[b"k"], None, 1, &mut ev).unwrap();
    assert_eq!(
        grants(&ev).iter().map(|g| g.1).collect::<Vec<_>>(),
        [2],
        "one at a time"
    );
}

#[test]
fn out_of_range_fields_are_invalid_and_change_nothing() {
    let mut t = table();
    let big = vec![0u8; MAX_VALUE + 1];
    let ok = vec![0u8; MAX_VALUE];
    let bad: Vec<NativeLock<'_>> = vec![
        NativeLock {
            shared: true,
            limit: Some(2),
            ..req(1, &[b"k"])
        },
        sem(1, &[b"k"], 0),
        sem(1, &[b"k"], MAX_LIMIT + 1),
        NativeLock {
            value: Some(&big),
            ..req(1, &[b"k"])
        },
        NativeLock {
            lock_delay_us: Some(MAX_LOCK_DELAY_US + 1),
            ..req(1, &[b"k"])
        },
    ];
    for r in bad {
        let (res, ev) = lock3(&mut t, c(1), r, 0);
        assert!(matches!(res, Err(NativeError::InvalidArgument(_))), "{r:?}");
        assert_eq!(ev, []);
        assert_eq!(t.get(b"k", 0).holders, []);
    }
    let full = NativeLock {
        value: Some(&ok),
        limit: Some(MAX_LIMIT),
        lock_delay_us: Some(MAX_LOCK_DELAY_US),
        ..req(1, &[b"k"])
    };
    take(&mut t, c(1), full, 0);
    assert_eq!(t.get(b"k", 0).holders[0].value.as_deref(), Some(&ok[..]));
    assert_eq!(t.get(b"k", 0).limit, MAX_LIMIT);
}

#[test]
fn a_semaphore_grants_up_to_its_limit_then_queues_first_come_first_served() {
    let mut t = table();
    let f1 = take(&mut t, c(1), sem(1, &[b"s"], 2), 0);
    take(&mut t, c(2), sem(2, &[b"s"], 2), 0);
    wait(&mut t, c(3), sem(3, &[b"s"], 2), 0);
    wait(&mut t, c(4), sem(4, &[b"s"], 2), 0);
    // Another limit while the key has holders or waiters: refused, nothing changed.
    let (res, ev) = lock3(&mut t, c(5), sem(5, &[b"s", b"x"], 3), 0);
    assert!(matches!(res, Err(NativeError::InvalidArgument(_))));
    assert_eq!(ev, []);
    assert_eq!(t.get(b"x", 0), t.get(b"never", 0));
    assert!(matches!(
        lock3(&mut t, c(5), req(5, &[b"s"]), 0).0,
        Err(NativeError::InvalidArgument(_))
    ));
    // A version-2 Lock implies limit 1.
    assert!(matches!(
        lock2(&mut t, c(7), &[b"s"], 0),
        LockResult::Invalid { .. }
    ));
    let mut ev = Vec::new();
    t.unlock_native(c(2), &[b"s"], None, 1, &mut ev).unwrap();
    assert_eq!(grants(&ev).iter().map(|g| g.0).collect::<Vec<_>>(), [c(3)]);
    let f3 = grants(&ev)[0].2;
    assert_eq!(fences(&t, b"s", 1), [f1, f3]);
    assert_eq!(t.get(b"s", 1).limit, 2);
    // Once nobody holds or waits, another limit is fine.
    t.disconnect(c(4), 1, &mut ev);
    t.disconnect(c(1), 1, &mut ev);
    t.disconnect(c(3), 1, &mut ev);
    t.check_invariants();
    take(&mut t, c(5), sem(5, &[b"s"], 3), 2);
}

#[test]
fn version2_and_version3_on_one_key_wait_for_each_other_in_arrival_order() {
    let mut t = table();
    assert_eq!(lock2(&mut t, c(1), &[b"k"], 0), LockResult::Granted);
    let v2 = t.last_fence();
    wait(&mut t, c(2), shared(2, &[b"k"]), 0);
    assert_eq!(lock2(&mut t, c(3), &[b"k"], 0), LockResult::Waiting);
    wait(&mut t, c(4), shared(4, &[b"k"]), 0);
    // The version-2 holder is re-entrant, even with others queued.
    assert_eq!(lock2(&mut t, c(1), &[b"k"], 0), LockResult::Granted);
    let v2b = t.last_fence();
    assert!(v2b > v2);
    assert!(t.check_fence(b"k", v2b) && !t.check_fence(b"k", v2));
    let mut ev = Vec::new();
    t.unlock(c(1), &[b"k"], 1, &mut ev).unwrap();
    t.check_invariants();
    assert_eq!(grants(&ev).iter().map(|g| g.0).collect::<Vec<_>>(), [c(2)]);
    let mut ev = Vec::new();
    t.unlock_native(c(2), &[b"k"], None, 2, &mut ev).unwrap();
    assert_eq!(grants(&ev).iter().map(|g| g.0).collect::<Vec<_>>(), [c(3)]);
    let mut ev = Vec::new();
    t.unlock(c(3), &[b"k"], 3, &mut ev).unwrap();
    assert_eq!(grants(&ev).iter().map(|g| g.0).collect::<Vec<_>>(), [c(4)]);
    // Version 2's unlock does not reach a version-3 grant.
    assert_eq!(
        t.unlock(c(4), &[b"k"], 4, &mut ev),
        Err(vec![Box::from(&b"k"[..])])
    );
}

#[test]
fn unlock_by_fence_works_from_any_connection_and_tells_the_holder() {
    let mut t = table();
    let f = take(&mut t, c(1), req(7, &[b"k", b"j"]), 0);
    let mut ev = Vec::new();
    // Not that token, or two keys with a fence: nothing released.
    assert_eq!(
        t.unlock_native(c(2), &[b"k"], Some(f + 1), 1, &mut ev),
        Err(NativeError::NotHeld(vec![Box::from(&b"k"[..])]))
    );
    assert!(matches!(
        t.unlock_native(c(2), &[b"k", b"j"], Some(f), 1, &mut ev),
        Err(NativeError::InvalidArgument(_))
    ));
    assert_eq!(ev, []);
    t.unlock_native(c(2), &[b"k"], Some(f), 1, &mut ev).unwrap();
    t.check_invariants();
    assert_eq!(key_events(&ev), [("k".into(), Released, f)]);
    assert_eq!(notices(&ev), [(c(1), 7, "k".into(), Lost, f)]);
    assert!(t.check_fence(b"j", f) && !t.check_fence(b"k", f));
    // The holder's own Unlock by fence: no notice, and no lock-delay ever after an Unlock.
    let mut ev = Vec::new();
    t.unlock_native(c(1), &[b"j"], Some(f), 2, &mut ev).unwrap();
    assert_eq!(notices(&ev), []);
    assert_eq!(t.get(b"j", 2).delayed_us, 0);
    // A version-2 hold by its token.
    lock2(&mut t, c(3), &[b"v"], 3);
    let v = t.last_fence();
    t.unlock_native(c(2), &[b"v"], Some(v), 3, &mut ev).unwrap();
    t.check_invariants();
    assert_eq!(t.holder(b"v"), None);
}

#[test]
fn unlock_without_fence_releases_every_hold_of_the_connection_on_the_keys_or_nothing() {
    let mut t = table();
    let a = take(&mut t, c(1), sem(1, &[b"s"], 3), 0);
    take(&mut t, c(2), sem(2, &[b"s"], 3), 0);
    let b = take(&mut t, c(1), sem(3, &[b"s"], 3), 0);
    take(&mut t, c(1), req(4, &[b"x"]), 0);
    let mut ev = Vec::new();
    assert_eq!(
        t.unlock_native(c(1), &[b"s", b"x", b"y"], None, 1, &mut ev),
        Err(NativeError::NotHeld(vec![Box::from(&b"y"[..])]))
    );
    assert_eq!(ev, []);
    assert_eq!(t.get(b"s", 1).holders.len(), 3);
    t.unlock_native(c(1), &[b"s"], None, 1, &mut ev).unwrap();
    t.check_invariants();
    assert_eq!(
        key_events(&ev),
        [("s".into(), Released, a), ("s".into(), Released, b)]
    );
    assert_eq!(t.get(b"s", 1).holders.len(), 1);
}

#[test]
fn extend_makes_leases_keeps_the_token_and_by_fence_moves_the_hold() {
    let mut t = table();
    let f = take(&mut t, c(1), req(1, &[b"k"]), 0);
    let mut ev = Vec::new();
    assert!(matches!(
        t.extend(c(1), &[b"k"], 0, None, 9, 0, &mut ev),
        Err(NativeError::InvalidArgument(_))
    ));
    assert_eq!(
        t.extend(c(1), &[b"k", b"z"], 5_000, None, 9, 0, &mut ev),
        Err(NativeError::NotHeld(vec![Box::from(&b"z"[..])]))
    );
    assert_eq!(
        t.get(b"k", 0).holders[0].lease_left_us,
        0,
        "nothing changed"
    );
    t.extend(c(1), &[b"k"], 5_000, None, 9, 0, &mut ev).unwrap();
    t.check_invariants();
    assert_eq!(t.get(b"k", 0).holders[0].lease_left_us, 5_000);
    // The lease outlives its connection; another one takes it over by its token.
    t.disconnect(c(1), 1, &mut ev);
    assert_eq!(ev, []);
    t.extend(c(2), &[b"k"], 10_000, Some(f), 42, 2, &mut ev)
        .unwrap();
    t.check_invariants();
    let h = &t.get(b"k", 2).holders[0];
    assert_eq!((h.fence, h.session, h.lease_left_us), (f, c(2), 10_000));
    // Its notices go to the new connection, with the Extend's id.
    let ev = advance(&mut t, 12);
    assert_eq!(notices(&ev), [(c(2), 42, "k".into(), Expired, f)]);
    assert_eq!(key_events(&ev), [("k".into(), Expired, f)]);
    // A connection's own Unlock reaches a hold moved to it.
    let f = take(&mut t, c(3), req(5, &[b"m"]), 20);
    let mut ev = Vec::new();
    t.extend(c(4), &[b"m"], 1_000_000, Some(f), 6, 20, &mut ev)
        .unwrap();
    assert_eq!(
        t.unlock_native(c(3), &[b"m"], None, 20, &mut ev),
        Err(NativeError::NotHeld(vec![Box::from(&b"m"[..])]))
    );
    t.unlock_native(c(4), &[b"m"], None, 20, &mut ev).unwrap();
    assert_eq!(notices(&ev), []);
    // Extend by fence does not reach a version-2 hold.
    lock2(&mut t, c(5), &[b"v"], 20);
    let v = t.last_fence();
    assert!(matches!(
        t.extend(c(4), &[b"v"], 1_000, Some(v), 7, 20, &mut ev),
        Err(NativeError::NotHeld(_))
    ));
}

#[test]
fn lock_delay_follows_loss_and_expiry_never_unlock_and_waiters_keep_waiting() {
    let mut t = table();
    let delayed = |id, keys| NativeLock {
        lock_delay_us: Some(100_000),
        ..req(id, keys)
    };
    // Lost: the connection closed.
    let f = take(&mut t, c(1), delayed(1, &[b"k"]), 0);
    wait(&mut t, c(2), req(2, &[b"k"]), 0);
    let mut ev = Vec::new();
    t.disconnect(c(1), 10, &mut ev);
    t.check_invariants();
    assert_eq!(key_events(&ev), [("k".into(), Lost, f)]);
    assert_eq!(grants(&ev), []);
    assert_eq!(t.get(b"k", 10).delayed_us, 100_000);
    assert_eq!(t.get(b"k", 60).delayed_us, 50_000);
    // Nobody gets it meanwhile, version 2 neither, and newcomers queue.
    assert_eq!(
        lock3(
            &mut t,
            c(3),
            NativeLock {
                wait_us: Some(0),
                ..req(3, &[b"k"])
            },
            50
        )
        .0,
        Ok(LockResult::Timeout {
            busy: vec![Box::from(&b"k"[..])]
        })
    );
    assert_eq!(lock2(&mut t, c(4), &[b"k"], 50), LockResult::Waiting);
    assert_eq!(grants(&advance(&mut t, 109)), []);
    let ev = advance(&mut t, 110);
    assert_eq!(grants(&ev).iter().map(|g| g.0).collect::<Vec<_>>(), [c(2)]);
    // Expired: a lease ran out (the holder is told).
    let mut t = table();
    let f = take(
        &mut t,
        c(1),
        NativeLock {
            lease_us: Some(20_000),
            ..delayed(1, &[b"k"])
        },
        0,
    );
    let ev = advance(&mut t, 20);
    assert_eq!(notices(&ev), [(c(1), 1, "k".into(), Expired, f)]);
    assert_eq!(t.get(b"k", 20).delayed_us, 100_000);
    // A delay on a key nobody waits for ends by itself, and the key is gone.
    advance(&mut t, 120);
    assert_eq!(t.get(b"k", 120), t.get(b"never", 120));
    assert!(t.recs.is_empty() && t.natives.is_empty());
    // Unlock: no delay.
    let mut t = table();
    take(&mut t, c(1), delayed(1, &[b"k"]), 0);
    let mut ev = Vec::new();
    t.unlock_native(c(1), &[b"k"], None, 1, &mut ev).unwrap();
    take(&mut t, c(2), req(2, &[b"k"]), 1);
}

#[test]
fn a_semaphore_slot_lost_with_a_delay_keeps_the_whole_key_from_everyone() {
    let mut t = table();
    let delayed = NativeLock {
        lock_delay_us: Some(30_000),
        ..sem(1, &[b"s"], 3)
    };
    take(&mut t, c(1), delayed, 0);
    take(&mut t, c(2), sem(2, &[b"s"], 3), 0);
    let mut ev = Vec::new();
    t.disconnect(c(1), 5, &mut ev);
    wait(&mut t, c(3), sem(3, &[b"s"], 3), 6);
    assert_eq!(t.get(b"s", 6).limit, 3);
    let ev = advance(&mut t, 35);
    assert_eq!(grants(&ev).iter().map(|g| g.0).collect::<Vec<_>>(), [c(3)]);
}

#[test]
fn get_and_check_fence_show_holders_in_grant_order_with_values_and_leases() {
    let mut t = table();
    assert_eq!(
        t.get(b"k", 0),
        KeyInfo {
            limit: 1,
            ..KeyInfo::default()
        }
    );
    let f1 = take(
        &mut t,
        c(1),
        NativeLock {
            value: Some(b"10.0.0.1:80"),
            lease_us: Some(3_000_000),
            ..shared(1, &[b"k"])
        },
        1000,
    );
    let f2 = take(&mut t, c(2), shared(2, &[b"k"]), 1500);
    wait(&mut t, c(3), req(3, &[b"k"]), 1500);
    assert_eq!(
        t.get(b"k", 2000),
        KeyInfo {
            shared: true,
            limit: 1,
            holders: vec![
                HolderInfo {
                    fence: f1,
                    session: c(1),
                    value: Some(Box::from(&b"10.0.0.1:80"[..])),
                    lease_left_us: 2_000_000,
                },
                HolderInfo {
                    fence: f2,
                    session: c(2),
                    value: None,
                    lease_left_us: 0,
                },
            ],
            waiters: 1,
            delayed_us: 0,
        }
    );
    assert!(t.check_fence(b"k", f1) && t.check_fence(b"k", f2));
    assert!(!t.check_fence(b"k", f2 + 1) && !t.check_fence(b"other", f1));
}

#[test]
fn only_a_version3_hold_ending_otherwise_than_by_its_own_unlock_is_noticed() {
    let mut t = table();
    // Version 2 never gets notices.
    lock2(&mut t, c(1), &[b"a"], 0);
    let mut ev = Vec::new();
    t.unlock_native(c(9), &[b"a"], Some(t.last_fence()), 0, &mut ev)
        .unwrap();
    assert_eq!(notices(&ev), []);
    // A closed connection is not told.
    let lease = NativeLock {
        lease_us: Some(5_000),
        ..req(2, &[b"b"])
    };
    take(&mut t, c(2), lease, 0);
    t.disconnect(c(2), 1, &mut ev);
    assert_eq!(notices(&advance(&mut t, 10)), []);
    // Without key events, notices still come.
    t.set_key_events(false);
    let f = take(&mut t, c(3), req(3, &[b"c"]), 10);
    let mut ev = Vec::new();
    t.unlock_native(c(4), &[b"c"], Some(f), 10, &mut ev)
        .unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!(notices(&ev), [(c(3), 3, "c".into(), Lost, f)]);
}

#[test]
fn a_version2_relock_ends_its_grant_and_begins_another_for_watchers() {
    let mut t = table();
    let mut ev = Vec::new();
    lock2(&mut t, c(1), &[b"k"], 0);
    let a = t.last_fence();
    t.lock(
        c(1),
        LockRequest {
            token: 1,
            keys: &[b"k"],
            wait_us: None,
            lease_us: Some(5_000),
        },
        1,
        &mut ev,
    );
    let b = t.last_fence();
    let ev2 = advance(&mut t, 6);
    ev.extend(ev2);
    assert_eq!(
        key_events(&ev),
        [
            ("k".into(), Released, a),
            ("k".into(), Acquired, b),
            ("k".into(), Expired, b)
        ]
    );
}

#[test]
fn a_version2_only_table_writes_the_format_it_always_did() {
    let mut t = table();
    lock2(&mut t, c(1), &[b"k"], 0);
    let mut out = Vec::new();
    t.snapshot(&mut out);
    assert!(out.starts_with(b"HFdlock1"));
    take(&mut t, c(2), shared(2, &[b"j"]), 0);
    let mut out = Vec::new();
    t.snapshot(&mut out);
    assert!(out.starts_with(b"HFdlock2"));
}

/// A table with every version-3 feature in use at once (and version 2 beside it).
fn busy_table() -> DlockTable {
    let mut t = table();
    let mut ev = Vec::new();
    lock2(&mut t, c(1), &[b"v2"], 0);
    t.lock(
        c(1),
        LockRequest {
            token: 5,
            keys: &[b"v2", b"w"],
            wait_us: None,
            lease_us: Some(9_000),
        },
        0,
        &mut ev,
    );
    take(
        &mut t,
        c(2),
        NativeLock {
            value: Some(b"leader-a"),
            lease_us: Some(7_000),
            lock_delay_us: Some(4_000),
            ..shared(1, &[b"sh"])
        },
        0,
    );
    take(&mut t, c(3), shared(2, &[b"sh"]), 0);
    take(&mut t, c(5), sem(4, &[b"s"], 2), 1);
    take(
        &mut t,
        c(6),
        NativeLock {
            lease_us: Some(3_000),
            lock_delay_us: Some(2_000),
            ..sem(5, &[b"s"], 2)
        },
        1,
    );
    wait(&mut t, c(4), req(3, &[b"sh", b"x"]), 1);
    wait(
        &mut t,
        c(6),
        NativeLock {
            wait_us: Some(20_000),
            value: Some(b"v"),
            ..sem(6, &[b"s"], 2)
        },
        1,
    );
    let lost = NativeLock {
        lock_delay_us: Some(50_000),
        ..req(7, &[b"d"])
    };
    take(&mut t, c(7), lost, 1);
    t.disconnect(c(7), 2, &mut ev);
    t.check_invariants();
    t
}

#[test]
fn a_table_with_every_feature_restored_from_its_snapshot_goes_on_exactly_like_the_original() {
    let mut a = busy_table();
    let mut bytes = Vec::new();
    a.snapshot(&mut bytes);
    let mut b = DlockTable::restore(a.config, &mut Reader::new(&bytes)).unwrap();
    b.set_key_events(true);
    b.check_invariants();
    let mut again = Vec::new();
    b.snapshot(&mut again);
    assert_eq!(bytes, again);
    for now in [3, 4, 5, 8, 10, 30, 60] {
        let (ea, eb) = (advance(&mut a, now), advance(&mut b, now));
        assert_eq!(format!("{ea:?}"), format!("{eb:?}"), "at {now}");
        for k in [&b"sh"[..], b"s", b"d", b"v2"] {
            assert_eq!(a.get(k, now), b.get(k, now));
        }
    }
    assert!(a.native_stats().holds > 0);
}

#[test]
fn truncated_or_corrupt_native_snapshots_are_errors_not_panics() {
    let t = busy_table();
    crate::core::codec::testing::damage_is_refused(&t, t.config, 3000, |c| c.check_invariants());
}

#[test]
fn lease_ends_and_lock_delay_ends_at_one_instant_go_in_key_order_whatever_the_insertion_order() {
    // The same state built in two orders: the events at the shared instant are the same.
    let build = |order: &[u32]| {
        let mut t = table();
        for &i in order {
            let key: &[u8] = [&b"a"[..], b"b", b"c"][i as usize];
            let keys = [key];
            let r = NativeLock {
                lease_us: Some(10_000),
                lock_delay_us: Some(5_000),
                ..req(u64::from(i), &keys)
            };
            let (res, _) = lock3(&mut t, c(i), r, 0);
            assert_eq!(res, Ok(LockResult::Granted));
            wait(&mut t, c(10 + i), req(10 + u64::from(i), &keys), 0);
        }
        let mut ev = advance(&mut t, 10);
        ev.extend(advance(&mut t, 15));
        // Tokens differ with the order of the grants; the keys and kinds must not.
        ev.iter()
            .map(|e| match e {
                DlockEvent::Key { key, kind, .. } => format!("{key:?} {kind:?}"),
                DlockEvent::Granted { session, .. } => format!("granted {session:?}"),
                DlockEvent::Notice { key, kind, .. } => format!("notice {key:?} {kind:?}"),
                e => format!("{e:?}"),
            })
            .collect::<Vec<_>>()
    };
    let want = build(&[0, 1, 2]);
    assert_eq!(build(&[2, 0, 1]), want);
    assert_eq!(build(&[1, 2, 0]), want);
}

#[test]
fn a_new_cluster_leader_moves_native_leases_and_lock_delays_by_its_margin() {
    let mut t = table();
    let r = NativeLock {
        lease_us: Some(10_000),
        lock_delay_us: Some(10_000),
        ..req(1, &[b"a"])
    };
    take(&mut t, c(1), r, 0);
    let lost = NativeLock {
        lock_delay_us: Some(10_000),
        ..req(2, &[b"b"])
    };
    take(&mut t, c(2), lost, 0);
    let mut ev = Vec::new();
    t.disconnect(c(2), 0, &mut ev);
    t.extend_leases(5);
    assert_eq!(t.get(b"a", 0).holders[0].lease_left_us, 15_000);
    assert_eq!(t.get(b"b", 0).delayed_us, 15_000);
    t.check_invariants();
}

/// Per-held-key memory: a key that only version 2 uses costs its record, as before (version 3's
/// state lives beside it). A key held by one version-3 grant adds its `natives` entry (a u32 and
/// a `NativeKey`), its `Grant` (on the heap) and a 16-byte entry in its session's grant set.
#[test]
fn a_held_key_costs_what_it_did() {
    assert_eq!(std::mem::size_of::<KeyRec>(), 112);
    assert_eq!(std::mem::size_of::<NativeKey>(), 56);
    assert_eq!(std::mem::size_of::<Grant>(), 88);
}

// ---------------------------------------------------------------------------------------------
// A naive model of both versions' rules, checked against the table over seeded schedules.

mod model {
    use super::super::super::{DlockEvent, KeyEventKind, LockResult, Session};
    use super::super::{NativeError, MAX_VALUE};
    use std::collections::{BTreeMap, BTreeSet};

    #[derive(Clone, Debug)]
    pub struct Hold {
        pub fence: u64,
        pub session: Session,
        pub v2: bool,
        pub shared: bool,
        /// (deadline, generation)
        pub lease: Option<(u64, u64)>,
        pub delay_ms: u64,
        pub value: Option<Vec<u8>>,
        pub req: u64,
    }

    #[derive(Default, Debug)]
    pub struct Key {
        /// In grant order; a version-2 hold is alone.
        pub holds: Vec<Hold>,
        pub limit: u16,
        pub delay: Option<u64>,
    }

    pub struct Native {
        pub shared: bool,
        pub limit: u16,
        pub value: Option<Vec<u8>>,
        pub delay_ms: u64,
    }

    pub struct Waiter {
        pub session: Session,
        pub token: u64,
        pub keys: Vec<Vec<u8>>,
        pub lease_ms: Option<u64>,
        pub deadline: Option<u64>,
        pub native: Option<Native>,
    }

    #[derive(Default)]
    pub struct Model {
        pub keys: BTreeMap<Vec<u8>, Key>,
        /// In arrival order.
        pub waiters: Vec<Waiter>,
        pub open: BTreeSet<Session>,
        fence: u64,
        gen: u64,
        pub now: u64,
    }

    fn ms(us: Option<u64>) -> Option<u64> {
        us.filter(|&u| u > 0).map(|u| u.div_ceil(1000))
    }

    fn dedup(keys: &[&[u8]]) -> Vec<Vec<u8>> {
        let mut out: Vec<Vec<u8>> = Vec::new();
        for k in keys {
            if !out.iter().any(|o| o == k) {
                out.push(k.to_vec());
            }
        }
        out
    }

    fn ev_key(ev: &mut Vec<DlockEvent>, k: &[u8], kind: KeyEventKind, h: &Hold) {
        ev.push(DlockEvent::Key {
            key: k.into(),
            kind,
            fence: h.fence,
            value: h.value.as_deref().map(Box::from),
        });
    }

    impl Model {
        pub fn new() -> Self {
            Model::default()
        }

        fn native_waiters<'a>(&'a self, k: &'a [u8]) -> impl Iterator<Item = &'a Waiter> + 'a {
            self.waiters
                .iter()
                .filter(move |w| w.native.is_some() && w.keys.iter().any(|x| x == k))
        }

        pub fn limit(&self, k: &[u8]) -> Option<u16> {
            let key = self.keys.get(k);
            let native_holds = key.is_some_and(|s| s.holds.iter().any(|h| !h.v2));
            if native_holds {
                return key.map(|s| s.limit);
            }
            if let Some(w) = self.native_waiters(k).next() {
                return w.native.as_ref().map(|n| n.limit);
            }
            let v2 = key.is_some_and(|s| !s.holds.is_empty())
                || self.waiters.iter().any(|w| w.keys.iter().any(|x| x == k));
            v2.then_some(1)
        }

        fn first_waiter(&self, k: &[u8]) -> Option<usize> {
            self.waiters
                .iter()
                .position(|w| w.keys.iter().any(|x| x == k))
        }

        fn fits(&self, k: &[u8], shared: bool) -> bool {
            let Some(s) = self.keys.get(k) else {
                return true;
            };
            if s.delay.is_some() {
                return false;
            }
            if s.holds.iter().any(|h| h.v2) {
                return false;
            }
            if s.holds.is_empty() {
                return true;
            }
            if s.limit > 1 {
                s.holds.len() < usize::from(s.limit)
            } else {
                shared && s.holds.iter().all(|h| h.shared)
            }
        }

        /// Whether `k` keeps waiter `i` (or, with `None`, a new Lock) from a grant.
        fn busy(&self, session: Session, native: Option<bool>, i: Option<usize>, k: &[u8]) -> bool {
            let first = self.first_waiter(k);
            let ahead = match i {
                None => first.is_some(),
                Some(i) => first != Some(i),
            };
            match native {
                Some(shared) => ahead || !self.fits(k, shared),
                None => {
                    let s = self.keys.get(k);
                    if let Some(h) = s.and_then(|s| s.holds.iter().find(|h| h.v2)) {
                        return h.session != session;
                    }
                    let blocked = s.is_some_and(|s| !s.holds.is_empty() || s.delay.is_some());
                    ahead || blocked
                }
            }
        }

        fn grantable(&self, i: usize) -> bool {
            let w = &self.waiters[i];
            let mode = w.native.as_ref().map(|n| n.shared);
            w.keys
                .iter()
                .all(|k| !self.busy(w.session, mode, Some(i), k))
        }

        #[allow(clippy::too_many_arguments)]
        fn add(
            &mut self,
            k: &[u8],
            session: Session,
            fence: u64,
            lease_ms: Option<u64>,
            native: Option<&Native>,
            req: u64,
            ev: &mut Vec<DlockEvent>,
        ) {
            let now = self.now;
            let lease = lease_ms.map(|ms| {
                let g = self.gen;
                self.gen += 1;
                (now + ms, g)
            });
            let s = self.keys.entry(k.to_vec()).or_default();
            let h = Hold {
                fence,
                session,
                v2: native.is_none(),
                shared: native.is_some_and(|n| n.shared),
                lease,
                delay_ms: native.map_or(0, |n| n.delay_ms),
                value: native.and_then(|n| n.value.clone()),
                req,
            };
            match native {
                None => {
                    if let Some(old) = s.holds.pop() {
                        ev_key(ev, k, KeyEventKind::Released, &old);
                    }
                    s.limit = 1;
                }
                Some(n) => s.limit = n.limit,
            }
            ev_key(ev, k, KeyEventKind::Acquired, &h);
            s.holds.push(h);
        }

        fn settle(&mut self, ev: &mut Vec<DlockEvent>) {
            while let Some(i) = (0..self.waiters.len()).find(|&i| self.grantable(i)) {
                let w = self.waiters.remove(i);
                self.fence += 1;
                let fence = self.fence;
                for k in &w.keys {
                    self.add(
                        k,
                        w.session,
                        fence,
                        w.lease_ms,
                        w.native.as_ref(),
                        w.token,
                        ev,
                    );
                }
                ev.push(DlockEvent::Granted {
                    session: w.session,
                    token: w.token,
                    fence,
                });
            }
        }

        /// End hold `i` of `k`; `by`: an Unlock of that session.
        fn end(
            &mut self,
            k: &[u8],
            i: usize,
            kind: KeyEventKind,
            by: Option<Session>,
            ev: &mut Vec<DlockEvent>,
        ) {
            let now = self.now;
            let open = {
                let s = self.keys.get_mut(k).unwrap();
                let h = s.holds.remove(i);
                ev_key(ev, k, kind, &h);
                let open = self.open.contains(&h.session);
                if !h.v2 && open && by != Some(h.session) {
                    ev.push(DlockEvent::Notice {
                        session: h.session,
                        request_id: h.req,
                        key: k.into(),
                        kind: if kind == KeyEventKind::Expired {
                            KeyEventKind::Expired
                        } else {
                            KeyEventKind::Lost
                        },
                        fence: h.fence,
                        value: h.value.as_deref().map(Box::from),
                    });
                }
                if by.is_none() && h.delay_ms > 0 {
                    let until = now + h.delay_ms;
                    if s.delay.is_none_or(|d| d < until) {
                        s.delay = Some(until);
                    }
                }
                open
            };
            let _ = open;
            self.tidy(k);
        }

        fn tidy(&mut self, k: &[u8]) {
            if self
                .keys
                .get(k)
                .is_some_and(|s| s.holds.is_empty() && s.delay.is_none())
            {
                self.keys.remove(k);
            }
        }

        fn instant(&mut self, t: u64, ev: &mut Vec<DlockEvent>) {
            self.now = t;
            // Releases by key, then generation, then the key's delay.
            let mut due: Vec<(Vec<u8>, u64)> = Vec::new();
            for (k, s) in &self.keys {
                for h in &s.holds {
                    if let Some((d, g)) = h.lease {
                        if d == t {
                            due.push((k.clone(), g));
                        }
                    }
                }
                if s.delay == Some(t) {
                    due.push((k.clone(), u64::MAX));
                }
            }
            due.sort();
            for (k, g) in due {
                if g == u64::MAX {
                    if let Some(s) = self.keys.get_mut(&k) {
                        if s.delay.is_some_and(|d| d <= t) {
                            s.delay = None;
                            self.tidy(&k);
                            self.settle(ev);
                        }
                    }
                    continue;
                }
                let i = self.keys.get(&k).and_then(|s| {
                    s.holds
                        .iter()
                        .position(|h| h.lease.is_some_and(|l| l.1 == g))
                });
                if let Some(i) = i {
                    self.end(&k, i, KeyEventKind::Expired, None, ev);
                    self.settle(ev);
                }
            }
            // Wait deadlines in arrival order.
            while let Some(i) = self.waiters.iter().position(|w| w.deadline == Some(t)) {
                let w = &self.waiters[i];
                let mode = w.native.as_ref().map(|n| n.shared);
                let busy: Vec<Box<[u8]>> = w
                    .keys
                    .iter()
                    .filter(|k| self.busy(w.session, mode, Some(i), k))
                    .map(|k| Box::from(&k[..]))
                    .collect();
                let w = self.waiters.remove(i);
                ev.push(DlockEvent::TimedOut {
                    session: w.session,
                    token: w.token,
                    busy,
                });
                self.settle(ev);
            }
        }

        fn next_due(&self) -> Option<u64> {
            let leases = self.keys.values().flat_map(|s| {
                s.holds
                    .iter()
                    .filter_map(|h| h.lease.map(|l| l.0))
                    .chain(s.delay)
            });
            let waits = self.waiters.iter().filter_map(|w| w.deadline);
            leases.chain(waits).min()
        }

        pub fn advance(&mut self, to: u64, ev: &mut Vec<DlockEvent>) {
            while let Some(t) = self.next_due() {
                if t > to {
                    break;
                }
                self.instant(t, ev);
            }
            self.now = self.now.max(to);
        }

        pub fn touch(&mut self, s: Session) {
            self.open.insert(s);
        }

        #[allow(clippy::too_many_arguments)]
        pub fn lock(
            &mut self,
            session: Session,
            token: u64,
            keys: &[&[u8]],
            wait_us: Option<u64>,
            lease_us: Option<u64>,
            native: Option<Native>,
            now: u64,
            ev: &mut Vec<DlockEvent>,
        ) -> Result<LockResult, NativeError> {
            if let Some(n) = &native {
                if n.shared && n.limit > 1 {
                    return Err(NativeError::InvalidArgument(""));
                }
                if n.value.as_ref().is_some_and(|v| v.len() > MAX_VALUE) {
                    return Err(NativeError::InvalidArgument(""));
                }
            }
            self.touch(session);
            self.advance(now, ev);
            let keys = dedup(keys);
            let limit = native.as_ref().map_or(1, |n| n.limit);
            if keys
                .iter()
                .any(|k| self.limit(k).is_some_and(|l| l != limit))
            {
                return match native {
                    None => Ok(LockResult::Invalid { why: "" }),
                    Some(_) => Err(NativeError::InvalidArgument("")),
                };
            }
            let mode = native.as_ref().map(|n| n.shared);
            let busy: Vec<Box<[u8]>> = keys
                .iter()
                .filter(|k| self.busy(session, mode, None, k))
                .map(|k| Box::from(&k[..]))
                .collect();
            if busy.is_empty() {
                self.fence += 1;
                let fence = self.fence;
                for k in &keys {
                    self.add(k, session, fence, ms(lease_us), native.as_ref(), token, ev);
                }
                return Ok(LockResult::Granted);
            }
            if wait_us == Some(0) {
                return Ok(LockResult::Timeout { busy });
            }
            self.waiters.push(Waiter {
                session,
                token,
                keys,
                lease_ms: ms(lease_us),
                deadline: ms(wait_us).map(|m| now + m),
                native,
            });
            Ok(LockResult::Waiting)
        }

        pub fn unlock2(
            &mut self,
            session: Session,
            keys: &[&[u8]],
            now: u64,
            ev: &mut Vec<DlockEvent>,
        ) -> Result<(), Vec<Box<[u8]>>> {
            self.touch(session);
            self.advance(now, ev);
            let mut not_held = Vec::new();
            for k in dedup(keys) {
                let i = self
                    .keys
                    .get(&k)
                    .and_then(|s| s.holds.iter().position(|h| h.v2 && h.session == session));
                match i {
                    Some(i) => self.end(&k, i, KeyEventKind::Released, Some(session), ev),
                    None => not_held.push(Box::from(&k[..])),
                }
            }
            self.settle(ev);
            if not_held.is_empty() {
                Ok(())
            } else {
                Err(not_held)
            }
        }

        pub fn unlock3(
            &mut self,
            session: Session,
            keys: &[&[u8]],
            fence: Option<u64>,
            now: u64,
            ev: &mut Vec<DlockEvent>,
        ) -> Result<(), NativeError> {
            let keys = dedup(keys);
            if fence.is_some() && keys.len() != 1 {
                return Err(NativeError::InvalidArgument(""));
            }
            self.touch(session);
            self.advance(now, ev);
            let pick = |h: &Hold| match fence {
                Some(f) => h.fence == f,
                None => !h.v2 && h.session == session,
            };
            let not_held: Vec<Box<[u8]>> = keys
                .iter()
                .filter(|k| !self.keys.get(*k).is_some_and(|s| s.holds.iter().any(pick)))
                .map(|k| Box::from(&k[..]))
                .collect();
            if !not_held.is_empty() {
                return Err(NativeError::NotHeld(not_held));
            }
            for k in &keys {
                while let Some(i) = self.keys.get(k).and_then(|s| s.holds.iter().position(pick)) {
                    self.end(k, i, KeyEventKind::Released, Some(session), ev);
                }
            }
            self.settle(ev);
            Ok(())
        }

        #[allow(clippy::too_many_arguments)]
        pub fn extend(
            &mut self,
            session: Session,
            keys: &[&[u8]],
            release_us: u64,
            fence: Option<u64>,
            req: u64,
            now: u64,
            ev: &mut Vec<DlockEvent>,
        ) -> Result<(), NativeError> {
            let keys = dedup(keys);
            if release_us == 0 || (fence.is_some() && keys.len() != 1) {
                return Err(NativeError::InvalidArgument(""));
            }
            self.touch(session);
            self.advance(now, ev);
            let pick = |h: &Hold| {
                !h.v2
                    && match fence {
                        Some(f) => h.fence == f,
                        None => h.session == session,
                    }
            };
            let not_held: Vec<Box<[u8]>> = keys
                .iter()
                .filter(|k| !self.keys.get(*k).is_some_and(|s| s.holds.iter().any(pick)))
                .map(|k| Box::from(&k[..]))
                .collect();
            if !not_held.is_empty() {
                return Err(NativeError::NotHeld(not_held));
            }
            let deadline = now + ms(Some(release_us)).unwrap();
            for k in &keys {
                let s = self.keys.get_mut(k).unwrap();
                for h in s.holds.iter_mut().filter(|h| pick(h)) {
                    h.lease = Some((deadline, self.gen));
                    self.gen += 1;
                    if fence.is_some() {
                        h.session = session;
                        h.req = req;
                    }
                }
            }
            Ok(())
        }

        pub fn disconnect(&mut self, session: Session, now: u64, ev: &mut Vec<DlockEvent>) {
            self.advance(now, ev);
            if !self.open.remove(&session) {
                return;
            }
            self.waiters.retain(|w| w.session != session);
            // Version 2's connection-bound holds, then version 3's in token order.
            let v2: Vec<Vec<u8>> = self
                .keys
                .iter()
                .filter(|(_, s)| {
                    s.holds
                        .iter()
                        .any(|h| h.v2 && h.session == session && h.lease.is_none())
                })
                .map(|(k, _)| k.clone())
                .collect();
            for k in v2 {
                self.end(&k, 0, KeyEventKind::Lost, None, ev);
            }
            let mut v3: Vec<(u64, Vec<u8>)> = Vec::new();
            for (k, s) in &self.keys {
                for h in &s.holds {
                    if !h.v2 && h.session == session && h.lease.is_none() {
                        v3.push((h.fence, k.clone()));
                    }
                }
            }
            v3.sort();
            for (f, k) in v3 {
                let i = self.keys[&k]
                    .holds
                    .iter()
                    .position(|h| h.fence == f)
                    .unwrap();
                self.end(&k, i, KeyEventKind::Lost, None, ev);
            }
            self.settle(ev);
        }

        pub fn queue(&self, k: &[u8]) -> Vec<Session> {
            self.waiters
                .iter()
                .filter(|w| w.keys.iter().any(|x| x == k))
                .map(|w| w.session)
                .collect()
        }
    }
}

const KEYS: [&[u8]; 4] = [b"k0", b"k1", b"k2", b"k3"];

/// Events in a comparable order: every `Key` event grouped by key (in the order they came),
/// the others as they came.
fn canon(ev: Vec<DlockEvent>) -> (Vec<String>, Vec<String>) {
    let mut keyed: Vec<(Vec<u8>, String)> = Vec::new();
    let mut rest = Vec::new();
    for e in ev {
        match &e {
            DlockEvent::Key { key, .. } => keyed.push((key.to_vec(), format!("{e:?}"))),
            _ => rest.push(format!("{e:?}")),
        }
    }
    keyed.sort_by(|a, b| a.0.cmp(&b.0));
    (keyed.into_iter().map(|(_, s)| s).collect(), rest)
}

fn compare(t: &DlockTable, m: &model::Model, now: u64, ctx: &str) {
    t.check_invariants();
    for k in KEYS {
        let info = t.get(k, now);
        let want: Vec<(u64, Session, u64)> = m
            .keys
            .get(k)
            .map(|s| {
                s.holds
                    .iter()
                    .map(|h| {
                        (
                            h.fence,
                            h.session,
                            h.lease.map_or(0, |l| l.0.saturating_sub(now).max(1) * 1000),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let got: Vec<(u64, Session, u64)> = info
            .holders
            .iter()
            .map(|h| (h.fence, h.session, h.lease_left_us))
            .collect();
        assert_eq!(got, want, "holders of {k:?}; {ctx}");
        let delay = m
            .keys
            .get(k)
            .and_then(|s| s.delay)
            .map_or(0, |d| d.saturating_sub(now) * 1000);
        assert_eq!(info.delayed_us, delay, "delay of {k:?}; {ctx}");
        assert_eq!(t.queue_conns(k), m.queue(k), "queue of {k:?}; {ctx}");
        assert_eq!(
            Some(info.limit as u16),
            Some(m.limit(k).unwrap_or(1)),
            "limit of {k:?}; {ctx}"
        );
    }
}

/// Random schedules of both versions' requests on a few keys, checked step by step against
/// the model (holders and their order, tokens, leases, queues, lock-delays, every event).
fn run_native_model(seed: u64, steps: usize, restore_every: Option<usize>) {
    use crate::rng::Rng;
    let mut rng = Rng::new(seed);
    let mut t = table();
    let mut m = model::Model::new();
    let mut now = 0u64;
    // Odd sessions speak version 2 (one Lock at a time), even ones version 3.
    let mut live: Vec<u32> = Vec::new();
    let mut next_session = 1u32;
    let mut v2_pending: BTreeSet<u32> = BTreeSet::new();
    let mut token = 0u64;
    let pick_keys = |rng: &mut Rng| -> Vec<&'static [u8]> {
        let few = rng.chance(70);
        let n = 1 + rng.below(if few { 1 } else { 3 }) as usize;
        (0..n).map(|_| KEYS[rng.index(KEYS.len())]).collect()
    };
    let settle_v2 = |ev: &[DlockEvent], pending: &mut BTreeSet<u32>| {
        for e in ev {
            if let DlockEvent::Granted { session, .. } | DlockEvent::TimedOut { session, .. } = e {
                pending.remove(&(session.0 as u32));
            }
        }
    };
    for step in 0..steps {
        let ctx = format!("seed {seed} step {step}");
        if rng.chance(25) {
            now += rng.below(6);
        }
        if live.len() < 2 || rng.chance(4) {
            live.push(next_session);
            next_session += 1;
        }
        let s = live[rng.index(live.len())];
        let session = c(s);
        let v2 = s % 2 == 1;
        let (mut et, mut em) = (Vec::new(), Vec::new());
        let roll = rng.below(100);
        token += 1;
        let wait_us = match rng.below(4) {
            0 => Some(0),
            1 => Some(rng.range(1, 30_000)),
            _ => None,
        };
        let lease_us = rng.chance(40).then(|| rng.range(1, 25_000));
        if roll < 5 {
            t.disconnect(session, now, &mut et);
            m.disconnect(session, now, &mut em);
            live.retain(|&x| x != s);
            v2_pending.remove(&s);
        } else if v2 && v2_pending.contains(&s) {
            // A version-2 connection sends nothing while its Lock waits.
            t.advance(now, &mut et);
            m.advance(now, &mut em);
        } else if roll < 55 {
            let keys = pick_keys(&mut rng);
            if v2 {
                let got = t.lock(
                    session,
                    LockRequest {
                        token,
                        keys: &keys,
                        wait_us,
                        lease_us,
                    },
                    now,
                    &mut et,
                );
                let want = m.lock(session, token, &keys, wait_us, lease_us, None, now, &mut em);
                let want = want.unwrap();
                assert_eq!(
                    std::mem::discriminant(&got),
                    std::mem::discriminant(&want),
                    "{ctx}"
                );
                if got == LockResult::Waiting {
                    v2_pending.insert(s);
                }
            } else {
                let shared = rng.chance(40);
                let limit = if shared || rng.chance(60) {
                    None
                } else {
                    Some(rng.range(1, 4) as u32)
                };
                let value = rng.chance(30).then(|| rng.bytes(6));
                let lock_delay_us = rng.chance(30).then(|| rng.range(1, 15_000));
                let r = NativeLock {
                    request_id: token,
                    keys: &keys,
                    wait_us,
                    lease_us,
                    shared,
                    limit,
                    value: value.as_deref(),
                    lock_delay_us,
                };
                let got = t.lock_native(session, r, now, &mut et);
                let n = model::Native {
                    shared,
                    limit: limit.unwrap_or(1) as u16,
                    value: value.clone(),
                    delay_ms: lock_delay_us.map_or(0, |d| d.div_ceil(1000)),
                };
                let want = m.lock(
                    session,
                    token,
                    &keys,
                    wait_us,
                    lease_us,
                    Some(n),
                    now,
                    &mut em,
                );
                match (&got, &want) {
                    (
                        Err(NativeError::InvalidArgument(_)),
                        Err(NativeError::InvalidArgument(_)),
                    ) => {}
                    _ => assert_eq!(got, want, "{ctx}"),
                }
            }
        } else if roll < 75 {
            let keys = pick_keys(&mut rng);
            if v2 {
                let got = t.unlock(session, &keys, now, &mut et);
                let want = m.unlock2(session, &keys, now, &mut em);
                assert_eq!(got, want, "{ctx}");
            } else {
                // By fence: some current grant of the key (of anyone), or a stale token.
                let fence = rng.chance(40).then(|| {
                    let hs = t.get(keys[0], now).holders;
                    if hs.is_empty() || rng.chance(20) {
                        rng.below(t.last_fence() + 2)
                    } else {
                        hs[rng.index(hs.len())].fence
                    }
                });
                let keys = if fence.is_some() && rng.chance(90) {
                    &keys[..1]
                } else {
                    &keys[..]
                };
                let got = t.unlock_native(session, keys, fence, now, &mut et);
                let want = m.unlock3(session, keys, fence, now, &mut em);
                match (&got, &want) {
                    (
                        Err(NativeError::InvalidArgument(_)),
                        Err(NativeError::InvalidArgument(_)),
                    ) => {}
                    _ => assert_eq!(got, want, "{ctx}"),
                }
            }
        } else if roll < 88 && !v2 {
            let keys = pick_keys(&mut rng);
            let fence = rng.chance(50).then(|| {
                let hs = t.get(keys[0], now).holders;
                if hs.is_empty() {
                    rng.below(t.last_fence() + 2)
                } else {
                    hs[rng.index(hs.len())].fence
                }
            });
            let keys = if fence.is_some() {
                &keys[..1]
            } else {
                &keys[..]
            };
            let release = if rng.chance(5) {
                0
            } else {
                rng.range(1, 25_000)
            };
            let got = t.extend(session, keys, release, fence, token, now, &mut et);
            let want = m.extend(session, keys, release, fence, token, now, &mut em);
            match (&got, &want) {
                (Err(NativeError::InvalidArgument(_)), Err(NativeError::InvalidArgument(_))) => {}
                _ => assert_eq!(got, want, "{ctx}"),
            }
        } else {
            t.advance(now, &mut et);
            m.advance(now, &mut em);
        }
        settle_v2(&et, &mut v2_pending);
        assert_eq!(canon(et), canon(em), "events; {ctx}");
        compare(&t, &m, now, &ctx);
        if restore_every.is_some_and(|n| step % n == n - 1) {
            let mut bytes = Vec::new();
            t.snapshot(&mut bytes);
            t = DlockTable::restore(t.config, &mut Reader::new(&bytes)).expect(&ctx);
            t.set_key_events(true);
            let mut again = Vec::new();
            t.snapshot(&mut again);
            assert_eq!(bytes, again, "{ctx}");
        }
    }
}

#[test]
fn random_schedules_of_both_versions_match_the_naive_model() {
    for seed in 1..=12u64 {
        run_native_model(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 4000, None);
    }
}

#[test]
fn restored_tables_go_on_matching_the_naive_model() {
    for seed in 40..=43u64 {
        run_native_model(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 4000, Some(17));
    }
}

use std::collections::BTreeSet;
