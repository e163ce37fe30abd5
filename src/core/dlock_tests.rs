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

fn c(n: u32) -> Session {
    Session(u64::from(n))
}

fn table(idle_timeout_ms: u64) -> DlockTable {
    DlockTable::new(DlockConfig { idle_timeout_ms }, 0)
}

fn boxed(keys: &[&[u8]]) -> Vec<Box<[u8]>> {
    keys.iter().map(|k| Box::from(*k)).collect()
}

/// Lock that is expected to be answered at once or to wait, with no side events.
fn lock(
    t: &mut DlockTable,
    session: Session,
    keys: &[&[u8]],
    wait_us: Option<u64>,
    lease_us: Option<u64>,
    now: u64,
) -> LockResult {
    let mut ev = Vec::new();
    let r = t.lock(
        session,
        LockRequest {
            token: 0,
            keys,
            wait_us,
            lease_us,
        },
        now,
        &mut ev,
    );
    assert_eq!(ev, []);
    t.check_invariants();
    r
}

fn advance(t: &mut DlockTable, now: u64) -> Vec<DlockEvent> {
    let mut ev = Vec::new();
    t.advance(now, &mut ev);
    t.check_invariants();
    ev
}

fn unlock(t: &mut DlockTable, session: Session, keys: &[&[u8]], now: u64) -> Vec<DlockEvent> {
    let mut ev = Vec::new();
    assert_eq!(t.unlock(session, keys, now, &mut ev), Ok(()));
    t.check_invariants();
    ev
}

fn granted(session: Session) -> DlockEvent {
    DlockEvent::Granted {
        session,
        token: 0,
        fence: 0,
    }
}

/// Events with their fencing tokens blanked, for comparing with [`granted`] (the tokens are
/// checked by the fencing tests).
fn unfenced(ev: &[DlockEvent]) -> Vec<DlockEvent> {
    ev.iter()
        .map(|e| match e {
            DlockEvent::Granted { session, token, .. } => DlockEvent::Granted {
                session: *session,
                token: *token,
                fence: 0,
            },
            DlockEvent::TimedOut {
                session,
                token,
                busy,
            } => DlockEvent::TimedOut {
                session: *session,
                token: *token,
                busy: busy.clone(),
            },
            DlockEvent::Idle { session } => DlockEvent::Idle { session: *session },
            e @ (DlockEvent::Key { .. } | DlockEvent::Notice { .. }) => {
                panic!("a version-3 event from version-2 requests: {e:?}")
            }
        })
        .collect()
}

#[test]
fn queue_and_held_since_show_the_holder_and_its_waiters_in_order() {
    let mut t = table(0);
    lock(&mut t, c(1), &[b"k"], None, None, 5_300);
    lock(&mut t, c(2), &[b"k"], None, None, 6_000);
    lock(&mut t, c(3), &[b"k"], None, None, 7_000);
    assert_eq!(t.held_since(b"k"), Some(5_000), "whole seconds");
    assert_eq!(t.queue(b"k").collect::<Vec<_>>(), [c(2), c(3)]);
    assert_eq!(t.held_since(b"free"), None);
    assert_eq!(t.queue(b"free").count(), 0);
    // The next holder's time is its grant, not its request.
    unlock(&mut t, c(1), &[b"k"], 9_999);
    assert_eq!(t.held_since(b"k"), Some(9_000));
    assert_eq!(t.queue(b"k").collect::<Vec<_>>(), [c(3)]);
}

#[test]
fn lock_is_all_or_nothing() {
    let mut t = table(0);
    assert_eq!(
        lock(&mut t, c(1), &[b"b"], None, None, 0),
        LockResult::Granted
    );
    assert_eq!(
        lock(&mut t, c(2), &[b"a", b"b"], Some(0), None, 0),
        LockResult::Timeout {
            busy: boxed(&[b"b"])
        }
    );
    assert_eq!(t.holder(b"a"), None);
    assert_eq!(
        lock(&mut t, c(2), &[b"a", b"b"], None, None, 0),
        LockResult::Waiting
    );
    assert_eq!(t.holder(b"a"), None, "a waiter holds no partial set");
    assert_eq!(unfenced(&unlock(&mut t, c(1), &[b"b"], 1)), [granted(c(2))]);
    assert_eq!(t.holder(b"a"), Some((c(2), None)));
    assert_eq!(t.holder(b"b"), Some((c(2), None)));
}

#[test]
fn relock_by_holder_replaces_lease_with_connection_bound_and_back() {
    let mut t = table(0);
    assert_eq!(
        lock(&mut t, c(1), &[b"a"], Some(0), Some(5000), 0),
        LockResult::Granted
    );
    assert_eq!(t.holder(b"a"), Some((c(1), Some(5))));
    assert_eq!(
        lock(&mut t, c(1), &[b"a"], Some(0), None, 1),
        LockResult::Granted
    );
    assert_eq!(t.holder(b"a"), Some((c(1), None)));
    assert_eq!(advance(&mut t, 10), []);
    assert_eq!(
        t.holder(b"a"),
        Some((c(1), None)),
        "the old lease timer was cancelled"
    );
    assert_eq!(
        lock(&mut t, c(1), &[b"a"], Some(0), Some(2001), 10),
        LockResult::Granted
    );
    assert_eq!(t.holder(b"a"), Some((c(1), Some(13))));
    assert_eq!(t.stats().leases, 1);
    assert_eq!(advance(&mut t, 12), []);
    assert_eq!(advance(&mut t, 13), []);
    assert_eq!(t.holder(b"a"), None);
    assert_eq!(t.stats().lease_expiries, 1);
    assert_eq!(t.stats().held_keys, 0);
}

/// The sequence behind the soak's one "DOUBLE GRANT" (a lease released ~100 ms before its
/// deadline): the holder of a lease re-locks the key together with a busy one, without a
/// lease, and closes while that Lock waits; granted just before the close, the re-lock made
/// the key connection-bound, so the close releases it at once. The rule: "a re-lock replaces
/// the old record"; "Absent or 0: held until the connection closes or Unlock".
#[test]
fn waiting_relock_granted_before_a_close_ends_the_lease_with_the_connection() {
    let mut t = table(0);
    lock(&mut t, c(1), &[b"k"], None, Some(200_000), 0);
    lock(&mut t, c(2), &[b"busy"], None, None, 0);
    assert_eq!(
        lock(&mut t, c(1), &[b"k", b"busy"], None, None, 10),
        LockResult::Waiting
    );
    assert_eq!(
        lock(&mut t, c(3), &[b"k"], None, None, 20),
        LockResult::Waiting
    );
    assert_eq!(
        unfenced(&unlock(&mut t, c(2), &[b"busy"], 50)),
        [granted(c(1))]
    );
    assert_eq!(t.holder(b"k"), Some((c(1), None)), "no longer a lease");
    let mut ev = Vec::new();
    t.disconnect(c(1), 60, &mut ev);
    t.check_invariants();
    assert_eq!(
        unfenced(&ev),
        [granted(c(3))],
        "140 ms before the old deadline"
    );
    assert_eq!(t.holder(b"k"), Some((c(3), None)));
}

/// The same with a shorter lease on the re-lock: the new lease counts from its grant and
/// replaces the longer one.
#[test]
fn waiting_relock_with_a_shorter_lease_replaces_the_longer_one() {
    let mut t = table(0);
    lock(&mut t, c(1), &[b"k"], None, Some(500_000), 0);
    lock(&mut t, c(2), &[b"busy"], None, None, 0);
    assert_eq!(
        lock(&mut t, c(1), &[b"k", b"busy"], None, Some(50_000), 10),
        LockResult::Waiting
    );
    lock(&mut t, c(3), &[b"k"], None, None, 20);
    assert_eq!(
        unfenced(&unlock(&mut t, c(2), &[b"busy"], 30)),
        [granted(c(1))]
    );
    assert_eq!(t.holder(b"k"), Some((c(1), Some(80))));
    let mut ev = Vec::new();
    t.disconnect(c(1), 31, &mut ev);
    assert_eq!(ev, [], "a lease survives the close");
    assert_eq!(advance(&mut t, 79), []);
    assert_eq!(unfenced(&advance(&mut t, 80)), [granted(c(3))]);
}

#[test]
fn relock_replaces_only_the_records_of_the_keys_it_names() {
    let mut t = table(0);
    lock(&mut t, c(1), &[b"a", b"b"], None, Some(10_000), 0);
    lock(&mut t, c(1), &[b"b"], None, Some(0), 1);
    assert_eq!(t.holder(b"a"), Some((c(1), Some(10))));
    assert_eq!(t.holder(b"b"), Some((c(1), None)));
    assert_eq!(t.stats().leases, 1);
}

#[test]
fn relock_of_own_key_is_granted_even_with_others_queued_on_it() {
    let mut t = table(0);
    lock(&mut t, c(1), &[b"a"], None, None, 0);
    assert_eq!(
        lock(&mut t, c(2), &[b"a"], None, None, 0),
        LockResult::Waiting
    );
    assert_eq!(
        lock(&mut t, c(1), &[b"a"], Some(0), None, 0),
        LockResult::Granted
    );
    // Holding `a` while waiting for `b` too: `a` does not block its own holder.
    lock(&mut t, c(3), &[b"b"], None, None, 0);
    assert_eq!(
        lock(&mut t, c(1), &[b"a", b"b"], None, None, 0),
        LockResult::Waiting
    );
    assert_eq!(unfenced(&unlock(&mut t, c(3), &[b"b"], 1)), [granted(c(1))]);
    assert_eq!(
        unfenced(&unlock(&mut t, c(1), &[b"a", b"b"], 2)),
        [granted(c(2))]
    );
}

#[test]
fn duplicate_keys_in_one_request_are_one_key() {
    let mut t = table(0);
    assert_eq!(
        lock(&mut t, c(1), &[b"a", b"a"], None, None, 0),
        LockResult::Granted
    );
    assert_eq!(t.stats().held_keys, 1);
    assert_eq!(
        lock(&mut t, c(2), &[b"a", b"b", b"a"], Some(0), None, 0),
        LockResult::Timeout {
            busy: boxed(&[b"a"])
        }
    );
    assert_eq!(unlock(&mut t, c(1), &[b"a", b"a"], 0), []);
    // Above the small-set threshold the hash-set path dedupes the same way.
    let many: Vec<Vec<u8>> = (0..40).map(|i| vec![i % 20]).collect();
    let many: Vec<&[u8]> = many.iter().map(Vec::as_slice).collect();
    assert_eq!(
        lock(&mut t, c(1), &many, None, None, 0),
        LockResult::Granted
    );
    assert_eq!(t.stats().held_keys, 20);
}

#[test]
fn try_once_fails_on_keys_held_by_others_or_queued_for() {
    let mut t = table(0);
    lock(&mut t, c(1), &[b"a"], None, None, 0);
    // c2 waits for {b, a}: b is free but now queued for.
    assert_eq!(
        lock(&mut t, c(2), &[b"b", b"a"], None, None, 0),
        LockResult::Waiting
    );
    assert_eq!(
        lock(&mut t, c(3), &[b"c", b"b", b"a"], Some(0), None, 0),
        LockResult::Timeout {
            busy: boxed(&[b"b", b"a"])
        }
    );
    assert_eq!(t.holder(b"c"), None);
    assert_eq!(t.stats().timeouts, 1);
    assert_eq!(t.stats().waiting, 1);
}

#[test]
fn wait_deadline_fires_exactly_at_deadline_not_before() {
    let mut t = table(0);
    lock(&mut t, c(1), &[b"a"], None, None, 0);
    let mut ev = Vec::new();
    assert_eq!(
        t.lock(
            c(2),
            LockRequest {
                token: 7,
                keys: &[b"a", b"b"],
                wait_us: Some(2500),
                lease_us: None
            },
            10,
            &mut ev
        ),
        LockResult::Waiting
    );
    assert_next_deadline_by(t.next_deadline(), 13);
    assert_eq!(advance(&mut t, 12), []);
    assert_eq!(
        advance(&mut t, 13),
        [DlockEvent::TimedOut {
            session: c(2),
            token: 7,
            busy: boxed(&[b"a"])
        }]
    );
    assert_eq!(t.holder(b"b"), None);
    assert_eq!(t.stats().waiting, 0);
    assert_eq!(t.next_deadline(), None);
}

#[test]
fn wait_of_one_microsecond_rounds_up_to_one_millisecond() {
    let mut t = table(0);
    lock(&mut t, c(1), &[b"a"], None, None, 0);
    lock(&mut t, c(2), &[b"a"], Some(1), None, 5);
    assert_eq!(advance(&mut t, 5), []);
    assert_eq!(advance(&mut t, 6).len(), 1);
}

#[test]
fn multi_key_requests_in_opposite_key_orders_do_not_deadlock() {
    let mut t = table(0);
    // Both free: the first wins, the second waits holding nothing.
    assert_eq!(
        lock(&mut t, c(1), &[b"a", b"b"], None, None, 0),
        LockResult::Granted
    );
    assert_eq!(
        lock(&mut t, c(2), &[b"b", b"a"], None, None, 0),
        LockResult::Waiting
    );
    assert_eq!(
        unfenced(&unlock(&mut t, c(1), &[b"a", b"b"], 1)),
        [granted(c(2))]
    );
    unlock(&mut t, c(2), &[b"a", b"b"], 1);
    // Held by two others; waiters in both orders.
    lock(&mut t, c(3), &[b"a"], None, None, 2);
    lock(&mut t, c(4), &[b"b"], None, None, 2);
    assert_eq!(
        lock(&mut t, c(1), &[b"a", b"b"], None, None, 2),
        LockResult::Waiting
    );
    assert_eq!(
        lock(&mut t, c(2), &[b"b", b"a"], None, None, 2),
        LockResult::Waiting
    );
    assert_eq!(unlock(&mut t, c(3), &[b"a"], 3), []);
    assert_eq!(t.holder(b"a"), None, "nobody takes a partial set");
    assert_eq!(unfenced(&unlock(&mut t, c(4), &[b"b"], 4)), [granted(c(1))]);
    assert_eq!(
        unfenced(&unlock(&mut t, c(1), &[b"b", b"a"], 5)),
        [granted(c(2))]
    );
}

#[test]
fn multi_key_waiter_is_not_overtaken_by_later_single_key_requests() {
    let mut t = table(0);
    lock(&mut t, c(1), &[b"a"], None, None, 0);
    assert_eq!(
        lock(&mut t, c(2), &[b"a", b"b"], None, None, 0),
        LockResult::Waiting
    );
    // b is free, but c2 queued for it first.
    assert_eq!(
        lock(&mut t, c(3), &[b"b"], Some(0), None, 0),
        LockResult::Timeout {
            busy: boxed(&[b"b"])
        }
    );
    assert_eq!(
        lock(&mut t, c(3), &[b"b"], None, None, 0),
        LockResult::Waiting
    );
    assert_eq!(
        lock(&mut t, c(4), &[b"b"], None, None, 0),
        LockResult::Waiting
    );
    assert_eq!(unfenced(&unlock(&mut t, c(1), &[b"a"], 1)), [granted(c(2))]);
    assert_eq!(
        unfenced(&unlock(&mut t, c(2), &[b"a", b"b"], 2)),
        [granted(c(3))]
    );
    assert_eq!(t.queue_conns(b"b"), [c(4)]);
}

#[test]
fn lease_expiry_wakes_the_waiter_at_the_lease_deadline_exactly() {
    let mut t = table(0);
    assert_eq!(
        lock(&mut t, c(1), &[b"a"], None, Some(10_000), 0),
        LockResult::Granted
    );
    assert_eq!(
        lock(&mut t, c(2), &[b"a"], None, Some(5_000), 1),
        LockResult::Waiting
    );
    assert_next_deadline_by(t.next_deadline(), 10);
    assert_eq!(advance(&mut t, 9), []);
    assert_eq!(unfenced(&advance(&mut t, 10)), [granted(c(2))]);
    // The new lease counts from the grant.
    assert_eq!(t.holder(b"a"), Some((c(2), Some(15))));
}

#[test]
fn key_freed_exactly_at_the_wait_deadline_goes_to_the_waiter() {
    let mut t = table(0);
    lock(&mut t, c(1), &[b"a"], None, Some(10_000), 0);
    lock(&mut t, c(2), &[b"a"], Some(10_000), None, 0);
    assert_eq!(unfenced(&advance(&mut t, 50)), [granted(c(2))]);
}

#[test]
fn lock_expires_due_leases_before_looking_at_its_keys() {
    let mut t = table(0);
    lock(&mut t, c(1), &[b"a"], None, Some(10_000), 0);
    // No advance by the caller: the lock itself runs the due timer.
    assert_eq!(
        lock(&mut t, c(2), &[b"a"], Some(0), None, 10),
        LockResult::Granted
    );
}

/// A turn that runs late walks the deadlines it passed one at a time, and stages the wheel's
/// next cascades once for the whole walk, not once per deadline: a walk that staged per step
/// emptied a crowded slot in one stretch, the stall the stages are there to spread.
#[test]
fn a_walk_through_a_late_turns_deadlines_stages_the_wheel_once() {
    let mut t = table(0);
    let mut ev = Vec::new();
    let keys: Vec<Vec<u8>> = (0..100_200u32)
        .map(|i| format!("k{i}").into_bytes())
        .collect();
    // 100,000 leases due 4-8 s from now (a slot above level 1, staged ahead of time) and one
    // due every millisecond of the first 200.
    for (i, key) in keys.iter().enumerate() {
        let lease_ms = if i < 100_000 {
            4096 + i as u64 % 4096
        } else {
            i as u64 - 99_999
        };
        let r = t.lock(
            c(1),
            LockRequest {
                token: 0,
                keys: &[key.as_slice()],
                wait_us: None,
                lease_us: Some(lease_ms * 1000),
            },
            0,
            &mut ev,
        );
        assert_eq!(r, LockResult::Granted);
    }
    assert_eq!(ev, []);
    let before = t.timers_staged();
    // One turn, 200 ms late: 200 deadlines walked, one `advance`.
    t.advance(200, &mut ev);
    assert_eq!(t.stats().lease_expiries, 200, "every short lease ended");
    let staged = t.timers_staged() - before;
    assert!(
        staged <= 2 * crate::core::wheel::STAGE_BUDGET,
        "{staged} timers staged in one late turn"
    );
    t.check_invariants();
}

#[test]
fn leases_survive_disconnect_and_expire_on_time() {
    let mut t = table(0);
    lock(&mut t, c(1), &[b"a"], None, Some(50_000), 0);
    lock(&mut t, c(1), &[b"b"], None, None, 0);
    assert_eq!(
        lock(&mut t, c(2), &[b"a", b"b"], None, None, 1),
        LockResult::Waiting
    );
    let mut ev = Vec::new();
    t.disconnect(c(1), 2, &mut ev);
    assert_eq!(ev, []);
    t.check_invariants();
    assert_eq!(t.holder(b"a"), Some((c(1), Some(50))));
    assert_eq!(t.holder(b"b"), None);
    assert_eq!(advance(&mut t, 49), []);
    assert_eq!(unfenced(&advance(&mut t, 50)), [granted(c(2))]);
}

#[test]
fn idle_connection_loses_its_connection_bound_locks_but_not_its_leases() {
    let mut t = table(100);
    t.connect(c(1), 0);
    lock(&mut t, c(1), &[b"a"], None, None, 0);
    lock(&mut t, c(1), &[b"b"], None, Some(500_000), 0);
    assert_eq!(advance(&mut t, 99), []);
    assert_eq!(advance(&mut t, 100), [DlockEvent::Idle { session: c(1) }]);
    assert_eq!(t.holder(b"a"), None);
    assert_eq!(t.holder(b"b"), Some((c(1), Some(500))));
    assert_eq!(t.stats().idle_disconnects, 1);
    // The daemon closes it; the disconnect finds nothing left.
    let mut ev = Vec::new();
    t.disconnect(c(1), 101, &mut ev);
    assert_eq!(ev, []);
}

#[test]
fn touches_postpone_the_idle_timeout() {
    let mut t = table(100);
    t.connect(c(1), 0);
    t.touch(c(1), 50);
    assert_eq!(advance(&mut t, 100), []);
    t.touch(c(1), 120);
    assert_eq!(advance(&mut t, 219), []);
    assert_eq!(advance(&mut t, 220), [DlockEvent::Idle { session: c(1) }]);
}

#[test]
fn pending_lock_is_not_idle_and_the_idle_clock_restarts_when_it_finishes() {
    let mut t = table(100);
    t.connect(c(1), 0);
    t.connect(c(2), 0);
    lock(&mut t, c(1), &[b"a"], None, Some(300_000), 0);
    assert_eq!(
        lock(&mut t, c(2), &[b"a"], None, None, 0),
        LockResult::Waiting
    );
    assert_eq!(advance(&mut t, 100), [DlockEvent::Idle { session: c(1) }]);
    assert_eq!(advance(&mut t, 299), []);
    assert_eq!(unfenced(&advance(&mut t, 300)), [granted(c(2))]);
    assert_eq!(advance(&mut t, 399), []);
    assert_eq!(advance(&mut t, 400), [DlockEvent::Idle { session: c(2) }]);
    assert_eq!(t.holder(b"a"), None);
    // Same after a wait deadline.
    lock(&mut t, c(3), &[b"k"], None, Some(1_000_000), 400);
    lock(&mut t, c(4), &[b"k"], Some(50_000), None, 400);
    let ev = advance(&mut t, 500);
    assert_eq!(ev.len(), 2); // c3 idle at 500 (lease stays); c4 timed out at 450
    assert_eq!(advance(&mut t, 549), []);
    assert_eq!(advance(&mut t, 550), [DlockEvent::Idle { session: c(4) }]);
}

#[test]
fn touch_newer_than_a_deadline_run_late_keeps_the_idle_clock() {
    // Regression (model test, seed 3): the model restarted the idle clock at a wait deadline
    // run after a newer touch, moving it backwards; the clock only ever moves forwards.
    let mut t = table(100);
    t.connect(c(1), 0);
    lock(&mut t, c(1), &[b"a"], None, None, 0);
    lock(&mut t, c(2), &[b"a"], Some(10_000), None, 0);
    t.touch(c(2), 50);
    assert_eq!(advance(&mut t, 50).len(), 1); // timed out at 10
    assert_eq!(advance(&mut t, 149), [DlockEvent::Idle { session: c(1) }]);
    assert_eq!(advance(&mut t, 150), [DlockEvent::Idle { session: c(2) }]);
}

#[test]
fn idle_timeout_zero_disables_idle_disconnects() {
    let mut t = table(0);
    t.connect(c(1), 0);
    lock(&mut t, c(1), &[b"a"], None, None, 0);
    assert_eq!(t.next_deadline(), None);
    assert_eq!(advance(&mut t, u64::MAX / 2), []);
    assert_eq!(t.holder(b"a"), Some((c(1), None)));
}

#[test]
fn disconnecting_waiter_lets_the_next_waiter_through() {
    let mut t = table(0);
    lock(&mut t, c(1), &[b"a"], None, None, 0);
    assert_eq!(
        lock(&mut t, c(2), &[b"a", b"b"], None, None, 0),
        LockResult::Waiting
    );
    assert_eq!(
        lock(&mut t, c(3), &[b"b"], None, None, 0),
        LockResult::Waiting
    );
    let mut ev = Vec::new();
    t.disconnect(c(2), 1, &mut ev);
    assert_eq!(unfenced(&ev), [granted(c(3))]);
    t.check_invariants();
    assert_eq!(t.queue_conns(b"a"), []);
}

#[test]
fn timed_out_waiter_lets_the_next_waiter_through() {
    let mut t = table(0);
    lock(&mut t, c(1), &[b"a"], None, None, 0);
    lock(&mut t, c(2), &[b"a", b"b"], Some(5_000), None, 0);
    lock(&mut t, c(3), &[b"b"], None, None, 0);
    let ev = advance(&mut t, 5);
    assert_eq!(
        unfenced(&ev),
        [
            DlockEvent::TimedOut {
                session: c(2),
                token: 0,
                busy: boxed(&[b"a"])
            },
            granted(c(3))
        ]
    );
}

#[test]
fn waiters_timing_out_at_one_instant_go_in_arrival_order() {
    // c3 waits behind c2 on b; both deadlines at 5. c2 leaves first, which frees b for c3
    // at its very deadline: granted, not timed out.
    let mut t = table(0);
    lock(&mut t, c(1), &[b"a"], None, None, 0);
    lock(&mut t, c(2), &[b"a", b"b"], Some(5_000), None, 0);
    lock(&mut t, c(3), &[b"b"], Some(5_000), None, 0);
    let ev = advance(&mut t, 100);
    assert_eq!(ev.len(), 2);
    assert_eq!(unfenced(&ev)[1], granted(c(3)));
}

#[test]
fn unlock_of_keys_not_held_reports_them_and_releases_the_rest() {
    let mut t = table(0);
    lock(&mut t, c(1), &[b"a"], None, Some(1_000_000), 0);
    lock(&mut t, c(2), &[b"b"], None, None, 0);
    let mut ev = Vec::new();
    assert_eq!(
        t.unlock(c(1), &[b"a", b"b", b"c", b"b"], 1, &mut ev),
        Err(boxed(&[b"b", b"c"]))
    );
    t.check_invariants();
    assert_eq!(t.holder(b"a"), None, "the lease is released too");
    assert_eq!(t.holder(b"b"), Some((c(2), None)));
    assert_eq!(t.next_deadline(), None);
}

#[test]
fn stats_count_holders_leases_waiters_and_outcomes() {
    let mut t = table(10);
    t.connect(c(1), 0);
    lock(&mut t, c(1), &[b"a", b"b"], None, Some(20_000), 0);
    lock(&mut t, c(2), &[b"a"], Some(0), None, 0);
    lock(&mut t, c(2), &[b"a"], None, None, 0);
    assert_eq!(
        t.stats(),
        DlockStats {
            held_keys: 2,
            leases: 2,
            waiting: 1,
            grants: 1,
            timeouts: 1,
            lease_expiries: 0,
            idle_disconnects: 0,
        }
    );
    advance(&mut t, 20);
    assert_eq!(
        t.stats(),
        DlockStats {
            held_keys: 1,
            leases: 0,
            waiting: 0,
            grants: 2,
            timeouts: 1,
            lease_expiries: 2,
            idle_disconnects: 1,
        }
    );
}

/// A naive model of the protocol's rules: waiters in a Vec in arrival order, re-scanned from the
/// start after every change; time walked one millisecond at a time.
mod model {
    use super::super::*;
    use std::collections::BTreeMap;

    struct MWaiter {
        session: Session,
        token: u64,
        keys: Vec<Vec<u8>>,
        deadline: Option<u64>,
        lease_ms: Option<u64>,
    }

    struct MConn {
        last_active: u64,
        pending: bool,
    }

    pub struct Model {
        idle: u64,
        now: u64,
        /// key -> (holder, lease deadline)
        pub holders: BTreeMap<Vec<u8>, (Session, Option<u64>)>,
        waiters: Vec<MWaiter>,
        sessions: BTreeMap<Session, MConn>,
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

    fn ms(us: Option<u64>) -> Option<u64> {
        us.filter(|&u| u > 0).map(|u| u.div_ceil(1000))
    }

    impl Model {
        pub fn new(idle: u64) -> Self {
            Model {
                idle,
                now: 0,
                holders: BTreeMap::new(),
                waiters: Vec::new(),
                sessions: BTreeMap::new(),
            }
        }

        pub fn queue(&self, key: &[u8]) -> Vec<Session> {
            self.waiters
                .iter()
                .filter(|w| w.keys.iter().any(|k| k == key))
                .map(|w| w.session)
                .collect()
        }

        pub fn waiting(&self) -> usize {
            self.waiters.len()
        }

        pub fn finite_waiters(&self) -> usize {
            self.waiters.iter().filter(|w| w.deadline.is_some()).count()
        }

        pub fn touch(&mut self, session: Session, now: u64) {
            let c = self.sessions.entry(session).or_insert(MConn {
                last_active: now,
                pending: false,
            });
            c.last_active = c.last_active.max(now);
        }

        fn busy(&self, i: usize, key: &[u8]) -> bool {
            let w = &self.waiters[i];
            match self.holders.get(key) {
                Some((h, _)) => *h != w.session,
                None => self.waiters[..i]
                    .iter()
                    .any(|e| e.keys.iter().any(|k| k == key)),
            }
        }

        fn settle(&mut self, t: u64, ev: &mut Vec<DlockEvent>) {
            while let Some(i) = (0..self.waiters.len())
                .find(|&i| self.waiters[i].keys.iter().all(|k| !self.busy(i, k)))
            {
                let w = self.waiters.remove(i);
                for k in &w.keys {
                    self.holders
                        .insert(k.clone(), (w.session, w.lease_ms.map(|l| t + l)));
                }
                let c = self.sessions.get_mut(&w.session).expect("waiter's session");
                c.pending = false;
                // A touch may be newer than a deadline the table runs late.
                c.last_active = c.last_active.max(t);
                ev.push(DlockEvent::Granted {
                    session: w.session,
                    token: w.token,
                    fence: 0,
                });
            }
        }

        fn release_bound(&mut self, session: Session) {
            self.holders
                .retain(|_, (h, lease)| !(*h == session && lease.is_none()));
        }

        fn instant(&mut self, t: u64, ev: &mut Vec<DlockEvent>) {
            self.holders
                .retain(|_, (_, lease)| lease.is_none_or(|d| d > t));
            let idle: Vec<Session> = self
                .sessions
                .iter()
                .filter(|(_, c)| self.idle > 0 && !c.pending && c.last_active + self.idle <= t)
                .map(|(id, _)| *id)
                .collect();
            for session in idle {
                self.release_bound(session);
                self.sessions.remove(&session);
                ev.push(DlockEvent::Idle { session });
            }
            self.settle(t, ev);
            while let Some(i) = self
                .waiters
                .iter()
                .position(|w| w.deadline.is_some_and(|d| d <= t))
            {
                let busy = self.waiters[i]
                    .keys
                    .iter()
                    .filter(|k| self.busy(i, k))
                    .map(|k| k.clone().into_boxed_slice())
                    .collect();
                let w = self.waiters.remove(i);
                let c = self.sessions.get_mut(&w.session).expect("waiter's session");
                c.pending = false;
                // A touch may be newer than a deadline the table runs late.
                c.last_active = c.last_active.max(t);
                ev.push(DlockEvent::TimedOut {
                    session: w.session,
                    token: w.token,
                    busy,
                });
                self.settle(t, ev);
            }
        }

        pub fn advance(&mut self, to: u64, ev: &mut Vec<DlockEvent>) {
            while self.now < to {
                self.now += 1;
                self.instant(self.now, ev);
            }
        }

        #[allow(clippy::too_many_arguments)]
        pub fn lock(
            &mut self,
            session: Session,
            token: u64,
            keys: &[&[u8]],
            wait_us: Option<u64>,
            lease_us: Option<u64>,
            now: u64,
            ev: &mut Vec<DlockEvent>,
        ) -> LockResult {
            self.touch(session, now);
            self.advance(now, ev);
            let keys = dedup(keys);
            self.waiters.push(MWaiter {
                session,
                token,
                keys,
                deadline: ms(wait_us).map(|w| now + w),
                lease_ms: ms(lease_us),
            });
            let i = self.waiters.len() - 1;
            let busy: Vec<Box<[u8]>> = self.waiters[i]
                .keys
                .iter()
                .filter(|k| self.busy(i, k))
                .map(|k| k.clone().into_boxed_slice())
                .collect();
            if busy.is_empty() {
                let w = self.waiters.pop().expect("just pushed");
                for k in w.keys {
                    self.holders
                        .insert(k, (session, w.lease_ms.map(|l| now + l)));
                }
                LockResult::Granted
            } else if wait_us == Some(0) {
                self.waiters.pop();
                LockResult::Timeout { busy }
            } else {
                self.sessions.get_mut(&session).expect("touched").pending = true;
                LockResult::Waiting
            }
        }

        pub fn unlock(
            &mut self,
            session: Session,
            keys: &[&[u8]],
            now: u64,
            ev: &mut Vec<DlockEvent>,
        ) -> Result<(), Vec<Box<[u8]>>> {
            self.touch(session, now);
            self.advance(now, ev);
            let mut not_held = Vec::new();
            for k in dedup(keys) {
                if self.holders.get(&k).is_some_and(|(h, _)| *h == session) {
                    self.holders.remove(&k);
                } else {
                    not_held.push(k.into_boxed_slice());
                }
            }
            self.settle(now, ev);
            if not_held.is_empty() {
                Ok(())
            } else {
                Err(not_held)
            }
        }

        pub fn disconnect(&mut self, session: Session, now: u64, ev: &mut Vec<DlockEvent>) {
            self.advance(now, ev);
            if self.sessions.remove(&session).is_none() {
                return;
            }
            self.waiters.retain(|w| w.session != session);
            self.release_bound(session);
            self.settle(now, ev);
        }
    }
}

use crate::rng::Rng as XorShift;

const KEY_SPACE: [&[u8]; 6] = [b"k0", b"k1", b"k2", b"k3", b"k4", b"k5"];

/// Events of one call, in a canonical order (several grants at one instant may come out in
/// any order; which ones and at which time is what matters).
fn canon(ev: Vec<DlockEvent>) -> Vec<String> {
    let mut out: Vec<String> = super::tests::unfenced(&ev)
        .iter()
        .map(|e| format!("{e:?}"))
        .collect();
    out.sort();
    out
}

fn compare(t: &DlockTable, m: &model::Model, ctx: &str) {
    t.check_invariants();
    for k in KEY_SPACE {
        assert_eq!(
            t.holder(k),
            m.holders.get(k).copied(),
            "holder of {k:?}; {ctx}"
        );
        assert_eq!(t.queue_conns(k), m.queue(k), "queue of {k:?}; {ctx}");
    }
    let s = t.stats();
    assert_eq!(s.held_keys, m.holders.len() as u64, "{ctx}");
    assert_eq!(
        s.leases,
        m.holders.values().filter(|h| h.1.is_some()).count() as u64,
        "{ctx}"
    );
    assert_eq!(s.waiting, m.waiting() as u64, "{ctx}");
}

fn run_model(seed: u64, steps: usize, idle: u64) {
    run_model_restoring(seed, steps, idle, None)
}

/// With `restore_every`, the table is replaced by a restored copy of its snapshot every that
/// many steps and must go on matching the model exactly, events in the same order.
fn run_model_restoring(seed: u64, steps: usize, idle: u64, restore_every: Option<usize>) {
    let mut rng = XorShift(seed);
    let mut t = table(idle);
    let mut m = model::Model::new(idle);
    let mut now = 0u64;
    let mut live: Vec<Session> = Vec::new();
    // session -> token of its waiting Lock
    let mut pending: hashbrown::HashMap<Session, u64> = hashbrown::HashMap::new();
    let mut next_slot = 0u32;
    let mut next_token = 0u64;
    let (mut ev_t, mut ev_m) = (Vec::new(), Vec::new());

    let settle_events = |ev: &[DlockEvent],
                         live: &mut Vec<Session>,
                         pending: &mut hashbrown::HashMap<Session, u64>| {
        for e in ev {
            match e {
                DlockEvent::Granted { session, token, .. }
                | DlockEvent::TimedOut { session, token, .. } => {
                    assert_eq!(
                        pending.remove(session),
                        Some(*token),
                        "answer without a wait"
                    );
                }
                DlockEvent::Idle { session } => {
                    assert!(!pending.contains_key(session), "idle while waiting");
                    live.retain(|c| c != session);
                }
                DlockEvent::Key { .. } | DlockEvent::Notice { .. } => {
                    panic!("a version-3 event from version-2 requests: {e:?}")
                }
            }
        }
    };

    for step in 0..steps {
        if rng.chance(30) {
            now += rng.below(4);
        }
        let ctx = format!("seed {seed} step {step} now {now}");
        let op = rng.below(100);
        let idle_conns: Vec<Session> = live
            .iter()
            .copied()
            .filter(|c| !pending.contains_key(c))
            .collect();
        let random_keys = |rng: &mut XorShift, max: u64| -> Vec<&'static [u8]> {
            (0..1 + rng.below(max))
                .map(|_| KEY_SPACE[rng.below(KEY_SPACE.len() as u64) as usize])
                .collect()
        };
        if op < 8 || live.is_empty() {
            if live.len() < 12 {
                let session = Session(u64::from(next_slot));
                next_slot += 1;
                t.connect(session, now);
                m.touch(session, now);
                live.push(session);
            }
        } else if op < 50 {
            if idle_conns.is_empty() {
                continue;
            }
            let session = idle_conns[rng.below(idle_conns.len() as u64) as usize];
            let keys = random_keys(&mut rng, 4);
            let wait = match rng.below(10) {
                0 | 1 => None,
                2..=4 => Some(0),
                _ => Some(rng.below(30_000)),
            };
            let lease = match rng.below(10) {
                0..=3 => None,
                4 => Some(0),
                _ => Some(1 + rng.below(40_000)),
            };
            next_token += 1;
            let rt = t.lock(
                session,
                LockRequest {
                    token: next_token,
                    keys: &keys,
                    wait_us: wait,
                    lease_us: lease,
                },
                now,
                &mut ev_t,
            );
            let rm = m.lock(session, next_token, &keys, wait, lease, now, &mut ev_m);
            assert_eq!(rt, rm, "lock {keys:?} {wait:?} {lease:?}; {ctx}");
            if rt == LockResult::Waiting {
                pending.insert(session, next_token);
            }
        } else if op < 62 {
            if idle_conns.is_empty() {
                continue;
            }
            let session = idle_conns[rng.below(idle_conns.len() as u64) as usize];
            // Mostly keys it holds (so that connection-bound locks come free), sometimes not.
            let mine: Vec<&'static [u8]> = KEY_SPACE
                .into_iter()
                .filter(|k| m.holders.get(*k).is_some_and(|h| h.0 == session))
                .collect();
            let mut keys: Vec<&[u8]> = mine.into_iter().filter(|_| rng.chance(70)).collect();
            if keys.is_empty() || rng.chance(20) {
                keys.extend(random_keys(&mut rng, 3));
            }
            let rt = t.unlock(session, &keys, now, &mut ev_t);
            let rm = m.unlock(session, &keys, now, &mut ev_m);
            assert_eq!(rt, rm, "unlock {keys:?}; {ctx}");
        } else if op < 70 {
            let session = live[rng.below(live.len() as u64) as usize];
            t.touch(session, now);
            m.touch(session, now);
        } else if op < 76 || (idle == 0 && op < 80) {
            let session = live.remove(rng.below(live.len() as u64) as usize);
            t.disconnect(session, now, &mut ev_t);
            m.disconnect(session, now, &mut ev_m);
            // Its due timers ran first (maybe answering its Lock); then its waiter left.
            settle_events(&ev_t, &mut live, &mut pending);
            pending.remove(&session);
            assert_eq!(canon(ev_t.split_off(0)), canon(ev_m.split_off(0)), "{ctx}");
        } else {
            now += if rng.chance(10) {
                rng.below(200)
            } else {
                rng.below(6)
            };
            t.advance(now, &mut ev_t);
            m.advance(now, &mut ev_m);
        }
        settle_events(&ev_t, &mut live, &mut pending);
        let idled: Vec<Session> = ev_t
            .iter()
            .filter_map(|e| match e {
                DlockEvent::Idle { session } => Some(*session),
                _ => None,
            })
            .collect();
        assert_eq!(
            canon(ev_t.split_off(0)),
            canon(ev_m.split_off(0)),
            "events; {ctx}"
        );
        // The daemon closes idle connections: that disconnect finds nothing.
        for session in idled {
            t.disconnect(session, now, &mut ev_t);
            m.disconnect(session, now, &mut ev_m);
            assert_eq!(ev_t, []);
            assert_eq!(ev_m, []);
        }
        compare(&t, &m, &ctx);
        if restore_every.is_some_and(|n| step % n == n - 1) {
            let before = t.stats();
            t = crate::core::codec::testing::round_trip(&t, t.config, seed ^ step as u64, |c| {
                c.check_invariants()
            });
            assert_eq!(t.stats(), before);
        }
    }

    // Far past every finite deadline: whoever still waits waits without a deadline.
    now += 1_000_000;
    t.advance(now, &mut ev_t);
    m.advance(now, &mut ev_m);
    settle_events(&ev_t, &mut live, &mut pending);
    assert_eq!(canon(ev_t.split_off(0)), canon(ev_m.split_off(0)));
    compare(&t, &m, "end");
    assert_eq!(m.finite_waiters(), 0);

    // Everybody leaves: nothing but unexpired leases is held, and nobody waits.
    for session in live.drain(..) {
        t.disconnect(session, now, &mut ev_t);
        m.disconnect(session, now, &mut ev_m);
    }
    assert_eq!(canon(ev_t.split_off(0)), canon(ev_m.split_off(0)));
    compare(&t, &m, "all disconnected");
    assert_eq!(t.stats().waiting, 0);
    assert!(m
        .holders
        .values()
        .all(|(_, lease)| lease.is_some_and(|d| d > now)));
    now += 1_000_000;
    t.advance(now, &mut ev_t);
    m.advance(now, &mut ev_m);
    assert_eq!(ev_t, []);
    compare(&t, &m, "all expired");
    assert_eq!(t.stats().held_keys, 0);
    assert!(
        t.recs.is_empty() && t.index.is_empty() && t.sessions.is_empty() && t.waiters.is_empty()
    );
    assert_eq!(t.next_deadline(), None);
    assert!(t.wheel.is_empty());
}

#[test]
fn a_table_restored_from_its_snapshot_goes_on_exactly_like_the_original() {
    for seed in 21..=24u64 {
        let idle = if seed % 2 == 0 { 0 } else { 10 + 7 * seed };
        run_model_restoring(
            seed.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            10_000,
            idle,
            Some(31),
        );
    }
}

#[test]
fn grants_after_a_disconnect_go_out_in_arrival_order_whatever_the_hash_seed() {
    // One session holds 40 keys, each awaited by another session: its disconnect grants
    // all 40 at once, and the events (hence replies and fencing tokens) must come out in
    // the waiters' arrival order under any hash seed, not in the hash set's order.
    let keys: Vec<Vec<u8>> = (0..40).map(|i| format!("key{i}").into_bytes()).collect();
    let order_under = |seed: u64| {
        crate::core::hash::with_seed(seed, || {
            let mut t = DlockTable::new(DlockConfig { idle_timeout_ms: 0 }, 0);
            let c = |n: u32| Session(u64::from(n));
            let mut ev = Vec::new();
            let all: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            t.lock(
                c(0),
                LockRequest {
                    token: 0,
                    keys: &all,
                    wait_us: None,
                    lease_us: None,
                },
                0,
                &mut ev,
            );
            // Waiters arrive in reverse key order, so arrival order is not key order.
            for (i, k) in keys.iter().enumerate().rev() {
                let w = t.lock(
                    c(1 + i as u32),
                    LockRequest {
                        token: i as u64,
                        keys: &[k],
                        wait_us: None,
                        lease_us: None,
                    },
                    1,
                    &mut ev,
                );
                assert_eq!(w, LockResult::Waiting);
            }
            t.disconnect(c(0), 2, &mut ev);
            ev.iter()
                .map(|e| match e {
                    DlockEvent::Granted { token, .. } => *token,
                    other => panic!("{other:?}"),
                })
                .collect::<Vec<u64>>()
        })
    };
    let want: Vec<u64> = (0..40).rev().collect();
    for seed in [1, 2, 3, 0xFEED] {
        assert_eq!(order_under(seed), want, "hash seed {seed}");
    }
}

#[test]
fn truncated_or_corrupt_dlock_snapshots_are_errors_not_panics() {
    let config = DlockConfig {
        idle_timeout_ms: 50,
    };
    let mut t = DlockTable::new(config, 0);
    let c = |n: u32| Session(u64::from(n));
    let mut ev = Vec::new();
    t.connect(c(1), 0);
    t.connect(c(2), 0);
    t.lock(
        c(1),
        LockRequest {
            token: 1,
            keys: &[b"a", b"b"],
            wait_us: None,
            lease_us: None,
        },
        0,
        &mut ev,
    );
    t.lock(
        c(1),
        LockRequest {
            token: 2,
            keys: &[b"l"],
            wait_us: None,
            lease_us: Some(900_000),
        },
        0,
        &mut ev,
    );
    t.lock(
        c(2),
        LockRequest {
            token: 3,
            keys: &[b"b", b"c"],
            wait_us: Some(40_000),
            lease_us: Some(5_000),
        },
        1,
        &mut ev,
    );
    crate::core::codec::testing::damage_is_refused(&t, config, 2000, |c| c.check_invariants());
}

#[test]
fn random_operations_match_the_naive_model() {
    for seed in 1..=8u64 {
        let idle = if seed % 2 == 0 { 0 } else { 10 + 7 * seed };
        run_model(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 15_000, idle);
    }
}

#[test]
fn a_new_cluster_leader_restarts_every_running_lease_with_its_remaining_time_and_more() {
    let mut t = table(0);
    lock(&mut t, c(1), &[b"a"], None, Some(10_000), 0);
    lock(&mut t, c(2), &[b"b"], None, None, 0);
    assert_eq!(
        lock(&mut t, c(3), &[b"a"], None, None, 1),
        LockResult::Waiting
    );
    t.extend_leases(300);
    t.check_invariants();
    assert_eq!(t.holder(b"a"), Some((c(1), Some(310))));
    assert_eq!(
        t.holder(b"b"),
        Some((c(2), None)),
        "connection-bound: untouched"
    );
    assert_eq!(advance(&mut t, 309), [], "the old deadline no longer fires");
    assert_eq!(unfenced(&advance(&mut t, 310)), [granted(c(3))]);
    assert_eq!(t.stats().lease_expiries, 1);
}

/// The table keeps one record per key in a slab and finds it through an index of (record,
/// hash) slots that grows by rehashing the stored hashes: through several doublings, every key
/// stays findable by its name, each connection's list holds exactly its keys, a disconnect
/// releases the connection-bound ones and unlinks the leases, and freed records are reused.
#[test]
fn thousands_of_keys_stay_findable_as_the_name_index_grows() {
    const N: usize = 20_000;
    let mut t = table(0);
    let name = |i: usize| format!("key-{i:06}-{}", "x".repeat(i % 40)).into_bytes();
    let mut ev = Vec::new();
    for i in 0..N {
        let k = name(i);
        let keys: [&[u8]; 1] = [&k];
        let lease_us = (i % 3 == 0).then_some(1_000_000);
        let req = LockRequest {
            token: 0,
            keys: &keys,
            wait_us: None,
            lease_us,
        };
        assert_eq!(
            t.lock(c(1 + (i % 3) as u32), req, 0, &mut ev),
            LockResult::Granted
        );
    }
    t.check_invariants();
    for i in (0..N).step_by(7) {
        let lease = (i % 3 == 0).then_some(1000);
        assert_eq!(t.holder(&name(i)), Some((c(1 + (i % 3) as u32), lease)));
    }
    // Session 1 holds only leases (i % 3 == 0), session 2 only connection-bound keys.
    for s in [1, 2] {
        t.disconnect(c(s), 1, &mut ev);
    }
    assert_eq!(ev, []);
    t.check_invariants();
    for i in 0..N {
        let want = match i % 3 {
            0 => Some((c(1), Some(1000))),
            1 => None,
            _ => Some((c(3), None)),
        };
        assert_eq!(t.holder(&name(i)), want, "key {i}");
    }
    let slots = t.recs.capacity();
    // Freed records are reused: taking the released keys again grows nothing.
    for i in (1..N).step_by(3) {
        let k = name(i);
        let keys: [&[u8]; 1] = [&k];
        let req = LockRequest {
            token: 0,
            keys: &keys,
            wait_us: None,
            lease_us: None,
        };
        assert_eq!(t.lock(c(4), req, 2, &mut ev), LockResult::Granted);
    }
    assert_eq!(t.recs.capacity(), slots);
    t.check_invariants();
    assert_eq!(advance(&mut t, 1000), []);
    assert_eq!(t.stats().leases, 0);
    assert_eq!(t.stats().held_keys, (2 * N / 3) as u64);
}

/// Lease timers name their key's record, not the key; leases ending at one instant still
/// release in key order (what every replica shares), not in the order the records were made.
#[test]
fn leases_ending_at_one_instant_release_in_key_order_not_record_order() {
    let mut t = table(0);
    // Records made in the order z, m, a; each key with a waiter of its own.
    for (s, k) in [(1, b"z"), (2, b"m"), (3, b"a")] {
        lock(&mut t, c(s), &[k], None, Some(10_000), 0);
    }
    for (s, k) in [(4, b"z"), (5, b"m"), (6, b"a")] {
        assert_eq!(lock(&mut t, c(s), &[k], None, None, 1), LockResult::Waiting);
    }
    let ev = advance(&mut t, 10);
    assert_eq!(unfenced(&ev), [granted(c(6)), granted(c(5)), granted(c(4))]);
}
