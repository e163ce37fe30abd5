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

const TIMEOUT: u64 = 100;

fn table() -> LockdTable {
    LockdTable::new(
        LockdConfig {
            orphan_timeout_ms: TIMEOUT,
        },
        0,
    )
}

fn c(slot: u32) -> Session {
    Session(u64::from(slot))
}

fn queue(t: &LockdTable, name: &[u8]) -> Vec<(Session, Vec<u8>)> {
    t.waiters(name).map(|(c, p)| (c, p.to_vec())).collect()
}

fn grant(session: Session, payload: &[u8], fence: u64) -> Grant {
    Grant {
        session,
        payload: payload.into(),
        fence,
    }
}

fn locked_names(t: &LockdTable) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    t.for_each_locked(|n| v.push(n.to_vec()));
    v.sort();
    v
}

#[test]
fn held_since_is_the_time_the_holder_got_the_lock() {
    let mut t = table();
    assert_eq!(t.acquire(c(1), b"a", b"a\0", 5), AcquireOutcome::Acquired);
    assert!(t.try_lock(c(1), b"t", 6));
    assert_eq!(t.held_since(b"a"), Some(5));
    assert_eq!(t.held_since(b"t"), Some(6));
    assert_eq!(t.held_since(b"free"), None);
    t.disconnect(c(1), 10);
    assert_eq!(
        t.held_since(b"a"),
        Some(5),
        "an orphan keeps its holder's time"
    );
    assert!(t.adopt(c(2), b"a", 20));
    assert_eq!(t.held_since(b"a"), Some(20), "adopting is getting it");
    assert_eq!(t.acquire(c(3), b"a", b"a\0", 25), AcquireOutcome::Queued);
    assert!(t.release(c(2), b"a", 30, &mut Vec::new()));
    assert_eq!(t.held_since(b"a"), Some(30), "a waiter's time is its grant");
    t.check_invariants();
}

#[test]
fn for_each_lock_names_the_holder_or_the_orphan_deadline() {
    let mut t = table();
    assert_eq!(t.acquire(c(1), b"a", b"a\0", 0), AcquireOutcome::Acquired);
    assert_eq!(t.acquire(c(2), b"b", b"b\0", 0), AcquireOutcome::Acquired);
    t.disconnect(c(2), 10);
    let mut seen = Vec::new();
    t.for_each_lock(|n, holder, orphan, _| seen.push((n.to_vec(), holder, orphan)));
    seen.sort();
    assert_eq!(
        seen,
        [
            (b"a".to_vec(), Some(c(1)), None),
            (b"b".to_vec(), None, Some(10 + TIMEOUT)),
        ]
    );
}

#[test]
fn acquire_of_free_name_is_acquired_at_once() {
    let mut t = table();
    assert_eq!(t.acquire(c(1), b"a", b"a\0", 0), AcquireOutcome::Acquired);
    assert_eq!(t.state(b"a"), LockState::Held(c(1)));
    assert_eq!(t.last_fence(), 1);
    assert_eq!(
        t.stats(),
        LockdStats {
            held: 1,
            grants: 1,
            ..Default::default()
        }
    );
    t.check_invariants();
}

#[test]
fn holder_acquiring_again_is_queued_and_granted_to_itself_after_release() {
    let mut t = table();
    let mut g = Vec::new();
    assert_eq!(t.acquire(c(1), b"a", b"a\0", 0), AcquireOutcome::Acquired);
    assert_eq!(
        t.acquire(c(1), b"a", b"a\0first", 0),
        AcquireOutcome::Queued
    );
    assert_eq!(
        t.acquire(c(1), b"a", b"a\0second", 0),
        AcquireOutcome::Queued
    );
    t.check_invariants();
    assert!(t.release(c(1), b"a", 0, &mut g));
    assert_eq!(g, vec![grant(c(1), b"a\0first", 2)]);
    assert_eq!(t.state(b"a"), LockState::Held(c(1)));
    assert_eq!(queue(&t, b"a"), vec![(c(1), b"a\0second".to_vec())]);
    t.check_invariants();
}

#[test]
fn waiters_are_granted_in_fifo_order_with_their_own_payload() {
    let mut t = table();
    let mut g = Vec::new();
    t.acquire(c(9), b"a", b"a\0", 0);
    for i in 1..=4 {
        let payload = [b'a', 0, b'0' + i as u8];
        assert_eq!(t.acquire(c(i), b"a", &payload, 0), AcquireOutcome::Queued);
    }
    for i in 1..=4u32 {
        assert!(t.release(t_holder(&t, b"a"), b"a", 0, &mut g));
        assert_eq!(
            g.pop(),
            Some(grant(c(i), &[b'a', 0, b'0' + i as u8], 1 + u64::from(i)))
        );
        assert!(g.is_empty(), "exactly one grant per release");
        assert_eq!(t.state(b"a"), LockState::Held(c(i)));
        t.check_invariants();
    }
    assert!(t.release(c(4), b"a", 0, &mut g));
    assert!(g.is_empty());
    assert_eq!(t.state(b"a"), LockState::Free);
    t.check_invariants();
}

fn t_holder(t: &LockdTable, name: &[u8]) -> Session {
    match t.state(name) {
        LockState::Held(c) => c,
        other => panic!("not held: {other:?}"),
    }
}

#[test]
fn anybody_may_release_any_lock() {
    let mut t = table();
    let mut g = Vec::new();
    t.acquire(c(1), b"a", b"a\0", 0);
    t.acquire(c(2), b"a", b"a\0", 0);
    // c(3) neither holds nor waits.
    assert!(t.release(c(3), b"a", 0, &mut g));
    assert_eq!(g, vec![grant(c(2), b"a\0", 2)]);
    assert_eq!(t.state(b"a"), LockState::Held(c(2)));
    // The former holder's index no longer lists the lock: its disconnect orphans nothing.
    t.disconnect(c(1), 0);
    assert_eq!(t.state(b"a"), LockState::Held(c(2)));
    t.check_invariants();
}

#[test]
fn release_of_unlocked_name_fails() {
    let mut t = table();
    let mut g = Vec::new();
    assert!(!t.release(c(1), b"a", 0, &mut g));
    t.acquire(c(1), b"a", b"a\0", 0);
    assert!(t.release(c(1), b"a", 0, &mut g));
    assert!(!t.release(c(1), b"a", 0, &mut g), "second release");
    assert!(g.is_empty());
    assert_eq!(t.stats().held, 0);
    t.check_invariants();
}

#[test]
fn try_lock_takes_a_free_name_and_never_queues() {
    let mut t = table();
    assert!(t.try_lock(c(1), b"a", 0));
    assert_eq!(t.state(b"a"), LockState::Held(c(1)));
    assert!(!t.try_lock(c(2), b"a", 0), "held by another");
    assert!(!t.try_lock(c(1), b"a", 0), "held by self");
    t.disconnect(c(1), 0);
    assert!(!t.try_lock(c(2), b"a", 0), "orphan");
    assert_eq!(t.stats().waiting, 0);
    assert_eq!(t.stats().grants, 1);
    t.check_invariants();
}

#[test]
fn adopt_takes_an_orphan_and_cancels_its_timer() {
    let mut t = table();
    let mut g = Vec::new();
    t.acquire(c(1), b"a", b"a\0", 0);
    t.acquire(c(3), b"a", b"a\0w", 0);
    t.disconnect(c(1), 10);
    assert_eq!(
        t.state(b"a"),
        LockState::Orphaned {
            deadline_ms: 10 + TIMEOUT
        }
    );
    assert_next_deadline_by(t.next_deadline(), 10 + TIMEOUT);
    assert!(t.adopt(c(2), b"a", 50));
    assert_eq!(t.state(b"a"), LockState::Held(c(2)));
    assert_eq!(t.next_deadline(), None);
    t.advance(10_000, &mut g);
    assert!(g.is_empty(), "the cancelled timer never fires");
    assert_eq!(t.state(b"a"), LockState::Held(c(2)));
    assert_eq!(queue(&t, b"a"), vec![(c(3), b"a\0w".to_vec())]);
    let s = t.stats();
    assert_eq!(
        (s.held, s.orphaned, s.adoptions, s.orphan_expiries),
        (1, 0, 1, 0)
    );
    t.check_invariants();
}

#[test]
fn adopt_of_free_or_held_name_fails() {
    let mut t = table();
    assert!(!t.adopt(c(1), b"a", 0), "free");
    t.acquire(c(1), b"a", b"a\0", 0);
    assert!(!t.adopt(c(2), b"a", 0), "held by another");
    assert!(!t.adopt(c(1), b"a", 0), "held by self");
    t.disconnect(c(1), 0);
    assert!(t.adopt(c(2), b"a", 0));
    assert!(!t.adopt(c(3), b"a", 0), "already adopted");
    assert_eq!(t.stats().adoptions, 1);
    t.check_invariants();
}

#[test]
fn orphan_expires_exactly_at_its_deadline() {
    let mut t = table();
    let mut g = Vec::new();
    t.acquire(c(1), b"a", b"a\0", 0);
    t.disconnect(c(1), 5);
    t.advance(5 + TIMEOUT - 1, &mut g);
    assert_eq!(
        t.state(b"a"),
        LockState::Orphaned {
            deadline_ms: 5 + TIMEOUT
        }
    );
    t.advance(5 + TIMEOUT, &mut g);
    assert_eq!(t.state(b"a"), LockState::Free);
    assert!(g.is_empty());
    assert_eq!(t.next_deadline(), None);
    let s = t.stats();
    assert_eq!((s.orphaned, s.orphan_expiries), (0, 1));
    t.check_invariants();
}

#[test]
fn adopt_one_ms_before_the_deadline_wins_the_race() {
    let mut t = table();
    let mut g = Vec::new();
    t.acquire(c(1), b"a", b"a\0", 0);
    t.acquire(c(3), b"a", b"a\0w", 0);
    t.disconnect(c(1), 0);
    t.advance(TIMEOUT - 1, &mut g);
    assert!(t.adopt(c(2), b"a", TIMEOUT - 1));
    t.advance(TIMEOUT, &mut g);
    assert!(g.is_empty());
    assert_eq!(t.state(b"a"), LockState::Held(c(2)));
    t.check_invariants();
}

#[test]
fn adopt_at_the_deadline_after_advance_finds_the_lock_granted() {
    let mut t = table();
    let mut g = Vec::new();
    t.acquire(c(1), b"a", b"a\0", 0);
    t.acquire(c(3), b"a", b"a\0w", 0);
    t.disconnect(c(1), 0);
    t.advance(TIMEOUT, &mut g);
    assert_eq!(g, vec![grant(c(3), b"a\0w", 2)]);
    assert!(!t.adopt(c(2), b"a", TIMEOUT));
    assert_eq!(t.state(b"a"), LockState::Held(c(3)));
    t.check_invariants();
}

#[test]
fn adopt_at_the_deadline_before_advance_is_refused() {
    // The owner may run a command at the deadline before the timer turn: the orphan is
    // already expired in time, so adoption must not resurrect it.
    let mut t = table();
    let mut g = Vec::new();
    t.acquire(c(1), b"a", b"a\0", 0);
    t.disconnect(c(1), 0);
    assert!(!t.adopt(c(2), b"a", TIMEOUT));
    t.advance(TIMEOUT, &mut g);
    assert_eq!(t.state(b"a"), LockState::Free);
    t.check_invariants();
}

#[test]
fn waiter_disconnecting_before_its_turn_is_skipped() {
    let mut t = table();
    let mut g = Vec::new();
    t.acquire(c(1), b"a", b"a\0", 0);
    t.acquire(c(2), b"a", b"a\x002", 0);
    t.acquire(c(3), b"a", b"a\x003", 0);
    t.acquire(c(2), b"a", b"a\x002bis", 0);
    t.disconnect(c(2), 0);
    assert_eq!(queue(&t, b"a"), vec![(c(3), b"a\x003".to_vec())]);
    assert!(t.release(c(1), b"a", 0, &mut g));
    assert_eq!(g, vec![grant(c(3), b"a\x003", 2)]);
    t.check_invariants();
}

#[test]
fn holder_disconnect_grants_the_waiter_only_after_the_orphan_timeout() {
    let mut t = table();
    let mut g = Vec::new();
    t.acquire(c(1), b"a", b"a\0", 0);
    t.acquire(c(2), b"a", b"a\x002", 0);
    t.acquire(c(3), b"a", b"a\x003", 0);
    t.disconnect(c(1), 7);
    t.advance(7, &mut g);
    t.advance(7 + TIMEOUT - 1, &mut g);
    assert!(g.is_empty());
    assert!(matches!(t.state(b"a"), LockState::Orphaned { .. }));
    t.advance(7 + TIMEOUT, &mut g);
    assert_eq!(g, vec![grant(c(2), b"a\x002", 2)], "only the first waiter");
    assert_eq!(queue(&t, b"a"), vec![(c(3), b"a\x003".to_vec())]);
    t.check_invariants();
}

#[test]
fn each_orphan_times_out_from_its_own_disconnect() {
    let mut t = table();
    let mut g = Vec::new();
    t.acquire(c(1), b"a", b"a\0", 0);
    t.acquire(c(1), b"b", b"b\0", 0);
    t.acquire(c(2), b"c", b"c\0", 0);
    t.disconnect(c(1), 10);
    t.disconnect(c(2), 30);
    assert_eq!(t.stats().orphaned, 3);
    t.advance(10 + TIMEOUT, &mut g);
    assert_eq!(t.state(b"a"), LockState::Free);
    assert_eq!(t.state(b"b"), LockState::Free);
    assert!(
        matches!(t.state(b"c"), LockState::Orphaned { deadline_ms } if deadline_ms == 30 + TIMEOUT)
    );
    assert_next_deadline_by(t.next_deadline(), 30 + TIMEOUT);
    t.advance(30 + TIMEOUT, &mut g);
    assert_eq!(t.state(b"c"), LockState::Free);
    assert_eq!(t.stats().orphan_expiries, 3);
    t.check_invariants();
}

#[test]
fn release_of_an_orphan_cancels_its_timer_and_grants_the_next_waiter() {
    let mut t = table();
    let mut g = Vec::new();
    t.acquire(c(1), b"a", b"a\0", 0);
    t.acquire(c(2), b"a", b"a\x002", 0);
    t.disconnect(c(1), 0);
    assert!(t.release(c(3), b"a", 1, &mut g));
    assert_eq!(g, vec![grant(c(2), b"a\x002", 2)]);
    assert_eq!(t.next_deadline(), None);
    g.clear();
    t.advance(TIMEOUT, &mut g);
    assert!(g.is_empty());
    assert_eq!(t.state(b"a"), LockState::Held(c(2)));
    t.check_invariants();
}

#[test]
fn disconnect_of_a_holder_that_also_waits_orphans_and_dequeues() {
    let mut t = table();
    let mut g = Vec::new();
    t.acquire(c(1), b"a", b"a\0", 0);
    t.acquire(c(1), b"a", b"a\0again", 0);
    t.acquire(c(2), b"a", b"a\x002", 0);
    t.acquire(c(1), b"a", b"a\0again2", 0);
    t.acquire(c(2), b"b", b"b\0", 0);
    t.acquire(c(1), b"b", b"b\0", 0);
    t.disconnect(c(1), 0);
    assert_eq!(queue(&t, b"a"), vec![(c(2), b"a\x002".to_vec())]);
    assert_eq!(queue(&t, b"b"), vec![]);
    assert_eq!(t.stats().waiting, 1);
    t.advance(TIMEOUT, &mut g);
    assert_eq!(g, vec![grant(c(2), b"a\x002", 3)]);
    t.check_invariants();
}

#[test]
fn a_new_generation_of_a_slot_is_a_different_connection() {
    let mut t = table();
    let mut g = Vec::new();
    let old = Session(1);
    let new = Session(1001);
    t.acquire(c(5), b"a", b"a\0", 0);
    t.acquire(old, b"a", b"a\0old", 0);
    t.acquire(old, b"b", b"b\0", 0);
    t.disconnect(old, 0);
    t.acquire(new, b"a", b"a\0new", 0);
    assert!(t.release(c(5), b"a", 0, &mut g));
    assert_eq!(g, vec![grant(new, b"a\0new", 3)]);
    assert!(
        !t.try_lock(new, b"b", 0),
        "old generation's lock is an orphan"
    );
    assert!(t.adopt(new, b"b", 0));
    t.check_invariants();
}

#[test]
fn sync_lists_held_and_orphaned_names() {
    let mut t = table();
    t.acquire(c(1), b"held", b"held\0", 0);
    t.acquire(c(2), b"orphan", b"orphan\0", 0);
    t.acquire(c(1), b"gone", b"gone\0", 0);
    t.acquire(c(1), b"", b"\0", 0);
    t.disconnect(c(2), 0);
    let mut g = Vec::new();
    t.release(c(1), b"gone", 0, &mut g);
    assert_eq!(
        locked_names(&t),
        vec![b"".to_vec(), b"held".to_vec(), b"orphan".to_vec()]
    );
}

#[test]
fn fences_strictly_increase_over_grants_and_adoptions() {
    let mut t = table();
    let mut g = Vec::new();
    t.acquire(c(1), b"a", b"a\0", 0);
    assert_eq!(t.last_fence(), 1);
    assert!(t.try_lock(c(1), b"b", 0));
    assert_eq!(t.last_fence(), 2);
    t.acquire(c(2), b"a", b"a\0", 0);
    assert_eq!(t.last_fence(), 2, "queueing grants nothing");
    t.release(c(1), b"a", 0, &mut g);
    assert_eq!(g[0].fence, 3);
    t.disconnect(c(1), 0);
    assert!(t.adopt(c(3), b"b", 0));
    assert_eq!(t.last_fence(), 4);
    assert_eq!(t.stats().grants, 3, "adoption is not a grant");
}

#[test]
fn thousand_waiters_on_one_name_are_each_granted_once_in_order() {
    const N: u32 = 1000;
    let mut t = table();
    let mut g = Vec::new();
    t.acquire(c(N), b"hot", b"hot\0", 0);
    for i in 0..N {
        let payload = format!("hot\0{i}");
        assert_eq!(
            t.acquire(c(i), b"hot", payload.as_bytes(), 0),
            AcquireOutcome::Queued
        );
    }
    assert_eq!(t.stats().waiting, u64::from(N));
    let mut holder = c(N);
    for i in 0..N {
        assert!(t.release(holder, b"hot", 0, &mut g));
        assert_eq!(g.len(), 1, "exactly one grant per release");
        let got = g.pop().expect("one grant");
        assert_eq!(got.session, c(i));
        assert_eq!(&*got.payload, format!("hot\0{i}").as_bytes());
        holder = got.session;
    }
    assert!(t.release(holder, b"hot", 0, &mut g));
    assert!(g.is_empty());
    let s = t.stats();
    assert_eq!((s.held, s.waiting, s.grants), (0, 0, u64::from(N) + 1));
    assert!(t.locks.is_empty() && t.waiters.is_empty());
    // Sessions keep their (empty) index while they live, so that the next lock allocates
    // nothing; their disconnects take it away.
    assert!(t
        .sessions
        .values()
        .all(|s| s.held.is_empty() && s.waits.is_empty()));
    t.check_invariants();
    for i in 0..=N {
        t.disconnect(c(i), 0);
    }
    assert!(t.sessions.is_empty());
    t.check_invariants();
}

#[test]
fn orphan_timeout_of_zero_expires_at_the_next_advance() {
    let mut t = LockdTable::new(
        LockdConfig {
            orphan_timeout_ms: 0,
        },
        0,
    );
    let mut g = Vec::new();
    t.acquire(c(1), b"a", b"a\0", 3);
    t.disconnect(c(1), 3);
    assert!(!t.adopt(c(2), b"a", 3));
    t.advance(3, &mut g);
    assert_eq!(t.state(b"a"), LockState::Free);
}
