use super::*;

const MS: Micros = 1_000;
const ET: Micros = 1_000 * MS;

#[test]
fn fence_after_leaves_half_an_election_timeout_or_half_the_session_timeout() {
    // (session timeout, election timeout, fence after)
    let table = [
        (3 * ET, ET, 3 * ET - ET / 2),
        (2 * ET, ET, 2 * ET - ET / 2),
        (2 * ET - 1, ET, (2 * ET - 1) / 2),
        (ET, ET, ET / 2),
        (10 * ET, ET, 10 * ET - ET / 2),
        (0, ET, 0),
        (3 * 100 * MS, 100 * MS, 250 * MS),
    ];
    for (session, election, want) in table {
        assert_eq!(fence_after(session, election), want, "{session} {election}");
        // Always strictly inside the session timeout the majority waits (when there is one).
        assert!(want < session || session == 0);
    }
}

fn ctx(node: u64, seq: u64) -> Vec<u8> {
    let mut c = node.to_le_bytes().to_vec();
    c.extend_from_slice(&seq.to_le_bytes());
    c
}

#[test]
fn probes_go_once_per_tick_and_only_with_a_leader() {
    let mut p = Probes::new(100 * MS);
    assert_eq!(p.due(1, false, 0), None, "no leader to ask");
    assert_eq!(p.due(1, true, 0).map(|c| c.to_vec()), Some(ctx(1, 1)));
    assert_eq!(p.due(1, true, 99 * MS), None, "within the tick");
    assert_eq!(
        p.due(1, true, 100 * MS).map(|c| c.to_vec()),
        Some(ctx(1, 2))
    );
    assert_eq!(p.confirmed(), None);
}

#[test]
fn a_probe_counts_only_once_its_read_index_is_applied() {
    let mut p = Probes::new(10);
    p.due(1, true, 100);
    p.due(1, true, 200);
    p.answered(1, &ctx(1, 1), 50);
    p.count(49);
    assert_eq!(
        p.confirmed(),
        None,
        "the log up to 50 may end this node's sessions"
    );
    p.count(50);
    assert_eq!(p.confirmed(), Some(100));
    p.answered(1, &ctx(1, 2), 60);
    p.count(70);
    assert_eq!(p.confirmed(), Some(200));
}

#[test]
fn foreign_stale_and_malformed_probe_answers_are_ignored() {
    let mut p = Probes::new(10);
    p.due(1, true, 100);
    p.due(1, true, 200);
    p.due(1, true, 300);
    // (context, index, confirmed after counting everything)
    let table: [(Vec<u8>, Option<Micros>); 5] = [
        (ctx(2, 1), None),     // another node's probe
        (ctx(1, 9), None),     // never sent: forgets the earlier ones, confirms nothing
        (vec![1, 0, 0], None), // truncated
        (Vec::new(), None),
        (ctx(1, 3), None), // forgotten by the answer to 9
    ];
    for (c, want) in table {
        p.answered(1, &c, 1);
        p.count(u64::MAX);
        assert_eq!(p.confirmed(), want, "{c:?}");
    }
}

#[test]
fn an_answer_forgets_the_earlier_probes_and_a_late_one_proves_nothing_newer() {
    let mut p = Probes::new(10);
    for t in [100, 200, 300] {
        p.due(1, true, t);
    }
    p.answered(1, &ctx(1, 2), 5);
    p.answered(1, &ctx(1, 1), 5); // dropped with the answer to 2
    p.count(5);
    assert_eq!(p.confirmed(), Some(200));
    p.answered(1, &ctx(1, 3), 5);
    p.count(5);
    assert_eq!(p.confirmed(), Some(300));
}

#[test]
fn probes_in_flight_are_bounded() {
    let mut p = Probes::new(1);
    for t in 0..10 * MAX_PROBES as u64 {
        p.due(1, true, t);
    }
    assert!(p.sent.len() <= MAX_PROBES);
    // The oldest are forgotten: their answers confirm nothing.
    p.answered(1, &ctx(1, 1), 0);
    p.count(0);
    assert_eq!(p.confirmed(), None);
    let last = 10 * MAX_PROBES as u64;
    p.answered(1, &ctx(1, last), 0);
    p.count(0);
    assert_eq!(p.confirmed(), Some(last - 1));
}

fn node(now: Micros) -> Liveness {
    Liveness::new(1, vec![1, 2, 3], 3 * ET, ET, now)
}

#[test]
fn a_node_fences_when_cut_off_for_fence_after_and_unfences_on_contact() {
    let mut l = node(0);
    let fa = l.fence_after;
    assert_eq!(l.write_deadline(), fa);
    // (now, confirmation, transition, may write at now)
    let table = [
        (fa - 1, None, None, true),
        (fa, None, Some(Fence::Lost { for_us: fa }), false),
        (fa + 5, None, None, false),
        // A confirmation of a probe sent before the cut-off moves contact, not enough.
        (fa + 10, Some(1), None, false),
        // One sent now.
        (fa + 20, Some(fa + 20), Some(Fence::Regained), true),
        // An older confirmation never moves contact back.
        (fa + 30, Some(5), None, true),
        (2 * fa + 20, None, Some(Fence::Lost { for_us: fa }), false),
    ];
    for (now, confirmed, want, write) in table {
        l.confirmed(confirmed);
        assert_eq!(l.fence_check(now), want, "at {now}");
        assert_eq!(l.may_write(now), write, "at {now}");
    }
}

#[test]
fn a_confirmation_returns_the_new_write_deadline_only_when_contact_moves() {
    let mut l = node(1_000);
    assert_eq!(l.confirmed(None), None);
    assert_eq!(l.confirmed(Some(999)), None);
    assert_eq!(l.confirmed(Some(1_000)), None);
    assert_eq!(l.confirmed(Some(2_000)), Some(2_000 + l.fence_after));
    assert_eq!(l.contact, 2_000);
}

#[test]
fn the_leader_expires_a_node_a_session_timeout_after_it_last_heard_from_it() {
    let mut l = node(0);
    let st = l.session_timeout;
    let all = |_: u64| true;
    // Elected at 10: nobody is expired before 10 + st, however long ago it was heard.
    assert!(l.expiries(true, 10, all).is_empty());
    l.heard(2, 5 * ET);
    // (now, due)
    let table: [(Micros, Vec<Expiry>); 5] = [
        (10 + st - 1, vec![]),
        (
            10 + st,
            vec![Expiry {
                node: 3,
                unheard_us: st,
            }],
        ),
        // Looked at again only an election timeout later.
        (10 + st + ET - 1, vec![]),
        // Node 3 again (its sessions were not expired yet); node 2 was heard at 5 ET.
        (
            5 * ET + st - 1,
            vec![Expiry {
                node: 3,
                unheard_us: 5 * ET + st - 11,
            }],
        ),
        (
            5 * ET + st,
            vec![Expiry {
                node: 2,
                unheard_us: st,
            }],
        ),
    ];
    for (now, want) in table {
        assert_eq!(l.expiries(true, now, all), want, "at {now}");
    }
}

#[test]
fn a_new_leader_waits_a_session_timeout_from_its_election() {
    let mut l = node(0);
    let st = l.session_timeout;
    l.heard(2, 0);
    assert!(l.expiries(false, 0, |_| true).is_empty());
    // Elected at 7 ET: node 2 was unheard from for 7 ET already, but this leader cannot know
    // when the last leader heard from it.
    assert!(l.expiries(true, 7 * ET, |_| true).is_empty());
    assert!(l.expiries(true, 7 * ET + st - 1, |_| true).is_empty());
    assert_eq!(l.expiries(true, 7 * ET + st, |_| true).len(), 2);
    // Losing the leadership forgets the election.
    assert!(l.expiries(false, 20 * ET, |_| true).is_empty());
    assert_eq!(l.leader_since, None);
    assert!(l.expiries(true, 21 * ET, |_| true).is_empty());
}

#[test]
fn nodes_without_sessions_are_not_expired_and_departed_ones_are_forgotten() {
    let mut l = node(0);
    l.departed.insert(7);
    assert_eq!(l.others(), vec![2, 3, 7]);
    l.expiries(true, 0, |_| true);
    let due = l.expiries(true, l.session_timeout, |n| n == 3);
    assert_eq!(due.iter().map(|e| e.node).collect::<Vec<_>>(), vec![3]);
    assert!(l.departed.is_empty());
    assert_eq!(l.others(), vec![2, 3]);
}

#[test]
fn reachable_lists_the_nodes_heard_within_and_this_one() {
    let mut l = node(0);
    l.heard(3, 100);
    l.heard(2, 900);
    assert_eq!(l.reachable(1_000, 200), "1,2");
    assert_eq!(l.reachable(1_000, 900), "1,2,3");
    assert_eq!(l.reachable(50, 0), "1,2,3", "heard later than now: within");
}
