use super::*;
use crate::config::{self, Command};
use crate::core::lockd::LockState;
use crate::proto::lockd as ld;
use crate::server::msg::LockdOp;

const T0: u64 = 1_700_000_000_000;

/// The replicas' process-wide values: the simulator's (the state's clock comes from the entries).
fn shared() -> Arc<Shared> {
    let config = match config::parse(["--orphan-timeout", "100"]) {
        Ok(Command::Run(c)) => c,
        other => panic!("{other:?}"),
    };
    Arc::new(crate::server::sim::sim_shared(config))
}

fn replica(me: u64) -> Replicated {
    replica_run(me, 1)
}

/// The replica of node `me` in its run `incarnation`.
fn replica_run(me: u64, incarnation: u64) -> Replicated {
    Replicated::new(shared(), 1, me, incarnation)
}

/// A commands proposal of `node` (run `inc`, number `seq`) at `time`: old-protocol requests.
fn proposal(node: u64, inc: u64, seq: u64, time: u64, reqs: &[(ConnId, u8, &[u8])]) -> Vec<u8> {
    let mut batch = Batch::default();
    for &(conn, opcode, name) in reqs {
        let payload = batch.arena.push(name);
        batch.ops.push(OpMsg {
            conn,
            op: Op::Lockd(LockdOp::new(opcode, payload, name)),
        });
    }
    let mut data = vec![KIND_COMMANDS];
    for v in [node, inc, seq] {
        data.extend_from_slice(&v.to_le_bytes());
    }
    command::encode_entry_of_batches(time, std::iter::once(&batch), &mut data);
    data
}

fn expiry(node: u64, time: u64) -> Vec<u8> {
    let mut data = vec![KIND_EXPIRE];
    data.extend_from_slice(&node.to_le_bytes());
    data.extend_from_slice(&time.to_le_bytes());
    data
}

/// What this replica would send its own connections: (connection, opcode, close); opcode 0
/// for an effect with no frame (a close).
fn replies(r: &mut Replicated) -> Vec<(ConnId, u8, bool)> {
    let out = std::mem::take(&mut r.outbox.per_worker[0]);
    out.effects
        .iter()
        .filter_map(|e| {
            let opcode = match e.body {
                Body::Lockd(crate::server::effect::LockdReply::Frame { opcode, .. }) => opcode,
                _ => 0,
            };
            e.conn.map(|c| (c, opcode, e.close))
        })
        .collect()
}

fn state(r: &Replicated) -> Vec<u8> {
    r.snapshot()
}

const JOB: &[u8] = b"job\0";

#[test]
fn replicas_of_every_node_reach_the_same_state_and_each_answers_only_its_own_connections() {
    let (a, b) = (ConnId::on_node(1, 0, 5, 0), ConnId::on_node(2, 0, 5, 0));
    let log = [
        proposal(1, 1, 1, T0, &[(a, ld::op::ACQ, JOB)]),
        proposal(2, 1, 1, T0 + 1, &[(b, ld::op::ACQ, JOB)]),
        proposal(1, 1, 2, T0 + 2, &[(a, ld::op::REL, JOB)]),
    ];
    let (mut one, mut two) = (replica(1), replica(2));
    for e in &log {
        one.apply(0, e);
        two.apply(0, e);
    }
    assert_eq!(state(&one), state(&two));
    assert_eq!(
        replies(&mut one),
        [(a, ld::op::ACQUIRED, false), (a, ld::op::RELEASED, false)]
    );
    assert_eq!(
        replies(&mut two),
        [(b, ld::op::ACK, false), (b, ld::op::ACQUIRED, false)]
    );
    assert_eq!(one.mine_applied, 2);
    assert_eq!(two.mine_applied, 1);
    let s = one.tables.sessions.find(b).expect("b's session");
    assert_eq!(one.tables.lockd.state(b"job"), LockState::Held(s));
}

#[test]
fn a_proposal_is_applied_once_and_an_earlier_run_of_its_node_not_at_all() {
    let a = ConnId::on_node(1, 0, 5, 0);
    let mut r = replica_run(1, 7);
    let acq = proposal(1, 7, 1, T0, &[(a, ld::op::ACQ, JOB)]);
    r.apply(0, &acq);
    // Proposed again after a leader change, and committed twice: applied once.
    r.apply(0, &acq);
    assert_eq!(replies(&mut r).len(), 1);
    // A late proposal of the node's earlier run (incarnation 6) does nothing.
    let stale = proposal(1, 6, 9, T0, &[(a, ld::op::REL, JOB)]);
    let before = state(&r);
    r.apply(0, &stale);
    assert_eq!(state(&r), before);
    assert!(replies(&mut r).is_empty());
}

#[test]
fn a_new_run_of_a_node_ends_the_sessions_of_its_last_and_their_old_locks_become_orphans() {
    let a = ConnId::on_node(1, 0, 5, 0);
    let mut r = replica(2);
    r.apply(0, &proposal(1, 1, 1, T0, &[(a, ld::op::ACQ, JOB)]));
    assert!(matches!(r.tables.lockd.state(b"job"), LockState::Held(_)));
    // Node 1 restarts: its first proposal (empty) comes from run 2.
    r.apply(0, &proposal(1, 2, 1, T0 + 10, &[]));
    assert_eq!(
        r.tables.lockd.state(b"job"),
        LockState::Orphaned {
            deadline_ms: T0 + 10 + 100
        }
    );
    assert!(!r.has_sessions_of(1));
    // The orphan times out when the log's clock passes its deadline.
    r.apply(0, &proposal(3, 1, 1, T0 + 110, &[]));
    assert_eq!(r.tables.lockd.state(b"job"), LockState::Free);
}

#[test]
fn an_expiry_ends_a_nodes_sessions_and_closes_the_connections_on_that_node() {
    let (a, b) = (ConnId::on_node(1, 0, 5, 0), ConnId::on_node(2, 0, 5, 0));
    let (mut one, mut two) = (replica(1), replica(2));
    for e in [
        proposal(1, 1, 1, T0, &[(a, ld::op::ACQ, JOB)]),
        proposal(2, 1, 1, T0, &[(b, ld::op::ACQ, b"other\0")]),
        expiry(1, T0 + 50),
    ] {
        one.apply(0, &e);
        two.apply(0, &e);
    }
    assert_eq!(state(&one), state(&two));
    assert_eq!(
        replies(&mut one),
        [(a, ld::op::ACQUIRED, false), (a, 0, true)],
        "node 1 closes its own connection"
    );
    assert_eq!(replies(&mut two), [(b, ld::op::ACQUIRED, false)]);
    assert!(matches!(
        two.tables.lockd.state(b"job"),
        LockState::Orphaned { .. }
    ));
    assert!(two.has_sessions_of(2), "only node 1's sessions end");
    assert_eq!(one.expired, 1);
    assert!(one.clock_ms() >= T0 + 50);
}

/// A cut-off node proposed a client's REL before it knew it was cut off, and the log carries it
/// after the expiry of that node's sessions: the connection is dead (its client was told so
/// by the close), its REL must not start a new session and free the lock of whoever was
/// granted it since (an old-protocol REL frees any lock: a double grant). Its close, when it
/// comes, ends that; the set is replicated state, in the snapshot.
#[test]
fn requests_of_a_connection_whose_session_an_expiry_ended_are_dropped_until_its_close() {
    let (a, b) = (ConnId::on_node(1, 0, 5, 0), ConnId::on_node(2, 0, 5, 0));
    let log = [
        proposal(1, 1, 1, T0, &[(a, ld::op::ACQ, JOB)]),
        expiry(1, T0 + 50),
        // The orphan's window ends (100 ms) and node 2's client takes the lock.
        proposal(2, 1, 1, T0 + 200, &[(b, ld::op::ACQ, JOB)]),
        // Node 1's stale REL, proposed before it was cut off.
        proposal(1, 1, 2, T0 + 210, &[(a, ld::op::REL, JOB)]),
    ];
    let (mut one, mut two) = (replica(1), replica(2));
    for e in &log {
        one.apply(0, e);
        two.apply(0, e);
    }
    assert_eq!(state(&one), state(&two));
    assert!(
        matches!(two.tables.lockd.state(b"job"), LockState::Held(_)),
        "{:?}",
        two.tables.lockd.state(b"job")
    );
    assert_eq!(replies(&mut two), [(b, ld::op::ACQUIRED, false)]);
    assert!(!one.has_sessions_of(1), "the stale REL started no session");
    // Through a snapshot: the dead connection is remembered.
    let mut three = replica(3);
    three.restore(&state(&two)).unwrap();
    let rel_again = proposal(1, 1, 3, T0 + 220, &[(a, ld::op::REL, JOB)]);
    three.apply(0, &rel_again);
    two.apply(0, &rel_again);
    assert!(matches!(
        three.tables.lockd.state(b"job"),
        LockState::Held(_)
    ));
    assert_eq!(state(&two), state(&three));
    // Its close ends that: the same connection number is a live one again.
    let mut close = Batch::default();
    close.ops.push(OpMsg {
        conn: a,
        op: Op::Close,
    });
    let mut data = vec![KIND_COMMANDS];
    for v in [1u64, 1, 4] {
        data.extend_from_slice(&v.to_le_bytes());
    }
    command::encode_entry_of_batches(T0 + 230, std::iter::once(&close), &mut data);
    two.apply(0, &data);
    two.apply(
        0,
        &proposal(1, 1, 5, T0 + 240, &[(a, ld::op::TRY, b"other\0")]),
    );
    assert!(two.has_sessions_of(1));
}

#[test]
fn hostile_proposals_are_refused_the_same_way_on_every_replica_and_never_panic() {
    let a = ConnId::on_node(1, 0, 5, 0);
    let good = proposal(1, 1, 1, T0, &[(a, ld::op::ACQ, JOB)]);
    let mut bad: Vec<Vec<u8>> = (0..good.len()).map(|n| good[..n].to_vec()).collect();
    for i in 0..good.len() {
        let mut flipped = good.clone();
        flipped[i] ^= 0x80;
        bad.push(flipped);
    }
    bad.push(vec![KIND_EXPIRE; 40]);
    bad.push(vec![9; 30]);
    // A proposal of node 2 naming node 1's connection.
    bad.push(proposal(2, 1, 1, T0, &[(a, ld::op::ACQ, JOB)]));
    let (mut one, mut two) = (replica(1), replica(2));
    for e in &bad {
        one.apply(0, e);
        two.apply(0, e);
    }
    assert_eq!(state(&one), state(&two));
    assert!(one.refused as usize >= good.len(), "{}", one.refused);
    // Every strict prefix alone is refused and changes nothing.
    let mut fresh = replica(1);
    for e in &bad[..good.len()] {
        fresh.apply(0, e);
    }
    assert_eq!(fresh.refused as usize, good.len());
    assert_eq!(fresh.tables.sessions.len(), 0);
    assert_eq!(fresh.tables.lockd.state(b"job"), LockState::Free);
    assert!(replies(&mut fresh).is_empty());
}

#[test]
fn a_snapshot_restores_to_the_same_bytes_and_a_damaged_one_is_an_error() {
    let a = ConnId::on_node(1, 0, 5, 0);
    let mut r = replica(1);
    r.apply(0, &proposal(1, 1, 1, T0, &[(a, ld::op::ACQ, JOB)]));
    r.apply(0, &proposal(2, 3, 4, T0 + 5, &[]));
    let snap = state(&r);
    let mut s = replica(3);
    s.restore(&snap).expect("restore");
    assert_eq!(state(&s), snap);
    // The restored replica goes on exactly as the original.
    let next = proposal(1, 1, 2, T0 + 6, &[(a, ld::op::REL, JOB)]);
    r.apply(0, &next);
    s.apply(0, &next);
    assert_eq!(state(&s), state(&r));
    for cut in 0..snap.len() {
        assert!(replica(3).restore(&snap[..cut]).is_err(), "cut at {cut}");
    }
}

fn leader(term: u64, extend: u64, time: u64) -> Vec<u8> {
    let mut data = vec![KIND_LEADER];
    for v in [term, 1, extend, time] {
        data.extend_from_slice(&v.to_le_bytes());
    }
    data
}

#[test]
fn a_new_leader_restarts_orphan_windows_with_an_election_timeout_more_once_per_term() {
    let a = ConnId::on_node(1, 0, 5, 0);
    let mut r = replica(2);
    r.apply(0, &proposal(1, 1, 1, T0, &[(a, ld::op::ACQ, JOB)]));
    // Node 1 restarts at T0 + 10: the orphan would end at T0 + 110.
    r.apply(0, &proposal(1, 2, 1, T0 + 10, &[]));
    r.apply(0, &leader(2, 300, T0 + 20));
    // The same term again (a re-proposal) changes nothing.
    r.apply(0, &leader(2, 300, T0 + 20));
    assert_eq!(
        r.tables.lockd.state(b"job"),
        LockState::Orphaned {
            deadline_ms: T0 + 410
        }
    );
    r.apply(0, &proposal(3, 1, 1, T0 + 409, &[]));
    assert!(matches!(
        r.tables.lockd.state(b"job"),
        LockState::Orphaned { .. }
    ));
    r.apply(0, &proposal(3, 1, 2, T0 + 410, &[]));
    assert_eq!(r.tables.lockd.state(b"job"), LockState::Free);
    // An older term's entry, committed late, extends nothing.
    let mut s = replica(2);
    s.apply(0, &leader(5, 0, T0));
    s.apply(0, &proposal(1, 1, 1, T0, &[(a, ld::op::ACQ, JOB)]));
    s.apply(0, &proposal(1, 2, 1, T0 + 10, &[]));
    s.apply(0, &leader(4, 300, T0 + 20));
    assert_eq!(
        s.tables.lockd.state(b"job"),
        LockState::Orphaned {
            deadline_ms: T0 + 110
        }
    );
}

#[test]
fn a_restarted_node_replaying_its_log_sends_nothing_to_its_new_connections_until_its_run_begins() {
    // The earlier run (1) of node 1 held "job" through connection a; the new run (2) has a
    // connection with the very same number, and replays the log before its first proposal.
    let a = ConnId::on_node(1, 0, 5, 0);
    let b = ConnId::on_node(2, 0, 5, 0);
    let mut r = replica_run(1, 2);
    r.apply(0, &proposal(1, 1, 1, T0, &[(a, ld::op::ACQ, JOB)]));
    r.apply(0, &proposal(2, 1, 1, T0, &[(b, ld::op::ACQ, JOB)]));
    r.apply(0, &proposal(1, 1, 2, T0, &[(a, ld::op::REL, JOB)]));
    assert!(replies(&mut r).is_empty(), "an earlier run's answers");
    // The new run's first proposal ends the earlier run's sessions; its own requests on a
    // connection numbered like the old one start a new session and are answered.
    r.apply(0, &proposal(1, 2, 1, T0 + 5, &[]));
    r.apply(0, &proposal(1, 2, 2, T0 + 6, &[(a, ld::op::TRY, JOB)]));
    assert_eq!(replies(&mut r), [(a, ld::op::WBLOCK, false)]);
}

#[test]
fn an_expiry_of_this_very_node_closes_its_connections_but_a_new_run_closes_none() {
    let a = ConnId::on_node(1, 0, 5, 0);
    let mut r = replica_run(1, 1);
    r.apply(0, &proposal(1, 1, 1, T0, &[(a, ld::op::ACQ, JOB)]));
    let _ = replies(&mut r);
    r.apply(0, &expiry(1, T0 + 1));
    assert_eq!(replies(&mut r), [(a, 0, true)]);
    let mut s = replica_run(1, 2);
    s.apply(0, &proposal(1, 1, 1, T0, &[(a, ld::op::ACQ, JOB)]));
    s.apply(0, &proposal(1, 2, 1, T0 + 5, &[]));
    assert!(
        replies(&mut s).is_empty(),
        "the earlier run's connection is not this run's"
    );
}

/// Membership: an added node's address (the change's context) and every id that leaves are
/// replicated, identical on every replica, kept in the snapshot; a context that does not parse,
/// or names a node the configuration does not have, adds nothing; a removed id stays removed.
#[test]
fn membership_changes_replicate_added_addresses_and_removed_ids_through_snapshots() {
    use raft::prelude::ConfState;
    let cs = |voters: &[u64], outgoing: &[u64]| {
        let mut c = ConfState::from((voters.to_vec(), vec![]));
        c.voters_outgoing = outgoing.to_vec();
        c
    };
    let mut replicas = [replica(1), replica(2)];
    for r in &mut replicas {
        // Joint: 4 added, then the joint configuration left.
        r.apply_conf_change(
            5,
            b"4=127.0.0.1:2700",
            &cs(&[1, 2, 3], &[]),
            &cs(&[1, 2, 3, 4], &[1, 2, 3]),
        );
        r.apply_conf_change(
            6,
            b"",
            &cs(&[1, 2, 3, 4], &[1, 2, 3]),
            &cs(&[1, 2, 3, 4], &[]),
        );
        // Hostile or stray contexts add nothing.
        r.apply_conf_change(
            7,
            b"5=not-an-address",
            &cs(&[1, 2, 3, 4], &[]),
            &cs(&[1, 2, 3, 4], &[]),
        );
        r.apply_conf_change(
            8,
            b"9=127.0.0.1:9",
            &cs(&[1, 2, 3, 4], &[]),
            &cs(&[1, 2, 3, 4], &[]),
        );
        r.apply_conf_change(
            9,
            &[0xff; 400],
            &cs(&[1, 2, 3, 4], &[]),
            &cs(&[1, 2, 3, 4], &[]),
        );
        // 3 removed, then 4 removed.
        r.apply_conf_change(
            10,
            b"",
            &cs(&[1, 2, 3, 4], &[]),
            &cs(&[1, 2, 4], &[1, 2, 3, 4]),
        );
        r.apply_conf_change(
            11,
            b"",
            &cs(&[1, 2, 4], &[1, 2, 3, 4]),
            &cs(&[1, 2, 4], &[]),
        );
    }
    let m = replicas[0].membership();
    assert_eq!(m, replicas[1].membership());
    assert_eq!(
        m.addrs.into_iter().collect::<Vec<_>>(),
        vec![(4, "127.0.0.1:2700".parse().unwrap())]
    );
    assert_eq!(m.removed.into_iter().collect::<Vec<_>>(), vec![3]);
    let r = &mut replicas[0];
    r.apply_conf_change(12, b"", &cs(&[1, 2, 4], &[]), &cs(&[1, 2], &[1, 2, 4]));
    r.apply_conf_change(13, b"", &cs(&[1, 2], &[1, 2, 4]), &cs(&[1, 2], &[]));
    // A removed id named again (an operator's mistake the owner refuses) gets no address.
    r.apply_conf_change(
        14,
        b"3=127.0.0.1:3",
        &cs(&[1, 2], &[]),
        &cs(&[1, 2, 3], &[1, 2]),
    );
    let m = r.membership();
    assert!(m.addrs.is_empty(), "{m:?}");
    assert_eq!(m.removed.iter().copied().collect::<Vec<_>>(), vec![3, 4]);
    let snap = r.snapshot();
    let mut back = replica(2);
    back.restore(&snap).expect("restore");
    assert_eq!(back.membership(), m);
    assert_eq!(back.snapshot(), snap);
}

/// With several proposals in flight, a node's proposals apply in the order it made them: one
/// whose predecessor was dropped (committed first after a leader change) is ignored, and both,
/// proposed again in order, apply once each. A new run starts at its first proposal.
#[test]
fn a_nodes_proposals_apply_in_sequence_order_and_a_gap_waits_for_the_proposals_again() {
    let a = ConnId::on_node(1, 0, 5, 0);
    let mut r = replica(1);
    r.apply(0, &proposal(1, 1, 1, T0, &[]));
    let acq = proposal(1, 1, 2, T0, &[(a, ld::op::ACQ, JOB)]);
    let rel = proposal(1, 1, 3, T0, &[(a, ld::op::REL, JOB)]);
    // 2 was dropped: 3 alone does nothing.
    r.apply(0, &rel);
    assert_eq!(r.mine_applied, 1);
    assert!(replies(&mut r).is_empty());
    assert_eq!(r.tables.lockd.state(b"job"), LockState::Free);
    // Proposed again, in order; the late original 3 after them does nothing more.
    for e in [&acq, &rel, &rel] {
        r.apply(0, e);
    }
    assert_eq!(r.mine_applied, 3);
    assert_eq!(
        replies(&mut r),
        [(a, ld::op::ACQUIRED, false), (a, ld::op::RELEASED, false)]
    );
    // A new run's second proposal before its first: ignored, the old run's sessions kept.
    let b = ConnId::on_node(2, 0, 6, 0);
    r.apply(0, &proposal(2, 1, 1, T0, &[(b, ld::op::ACQ, JOB)]));
    let before = state(&r);
    r.apply(0, &proposal(2, 2, 2, T0 + 1, &[]));
    assert_eq!(state(&r), before);
    assert!(r.has_sessions_of(2));
}

/// The owner of node 3 of a three-node cluster whose other nodes never answer (their ports
/// accept, and nothing reads), with a 100 ms election timeout, driven by hand: batches and
/// proposal rounds at the times a test gives, no tick (so no election, no leader), its
/// replies read out of its outbox.
impl ClusterOwner {
    /// Let the owner propose (and give up) at `now`, as its round does.
    fn propose(&mut self, now: Instant) {
        let wall = clock_at(&self.core.shared, now).ms;
        self.core
            .propose(&mut self.node, &mut self.state, now, wall);
    }
}

struct Lone {
    owner: ClusterOwner,
    _silent_peers: [std::net::TcpListener; 2],
    _poll: mio::Poll,
    _to_owner: Sender<ToOwner>,
    _replies: Receiver<Replies>,
    dir: std::path::PathBuf,
}

impl Lone {
    fn start(what: &str) -> Lone {
        let dir =
            std::env::temp_dir().join(format!("holdfast-lone-owner-{}-{what}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("data directory");
        let silent = || std::net::TcpListener::bind("127.0.0.1:0").expect("a silent peer");
        let silent_peers = [silent(), silent()];
        let addr = |l: &std::net::TcpListener| l.local_addr().expect("address");
        let peers = BTreeMap::from([
            (1, addr(&silent_peers[0])),
            (2, addr(&silent_peers[1])),
            (3, "127.0.0.1:0".parse().expect("address")),
        ]);
        let cfg = crate::config::ClusterConfig {
            node_id: 3,
            peer_hosts: peers.keys().map(|&id| (id, "127.0.0.1".into())).collect(),
            peers,
            data_dir: dir.clone(),
            election_timeout_ms: 100,
            session_timeout_ms: 300,
            join: false,
            on_quorum_loss: None,
        };
        let (to_owner, rx) = crossbeam_channel::unbounded();
        let (reply_tx, replies) = crossbeam_channel::unbounded();
        let poll = mio::Poll::new().expect("poll");
        let waker = Arc::new(Waker::new(poll.registry(), mio::Token(0)).expect("waker"));
        let owner = ClusterOwner::start(shared(), rx, vec![(reply_tx, waker)], &cfg)
            .expect("the owner starts");
        Lone {
            owner,
            _silent_peers: silent_peers,
            _poll: poll,
            _to_owner: to_owner,
            _replies: replies,
            dir,
        }
    }

    /// Hand the owner a worker's batch at `now`, then let it propose (and give up) at `now`.
    fn round(&mut self, now: Instant, b: Batch) {
        if !b.ops.is_empty() {
            assert!(self.owner.take(ToOwner::Batch(b), now));
        }
        self.owner.propose(now);
        assert!(self.owner.core.inflight.len() <= MAX_INFLIGHT_PROPOSALS);
    }

    /// The answers written since the last call: (connection, old-protocol opcode and payload,
    /// close).
    fn answers(&mut self) -> Vec<(ConnId, u8, Vec<u8>, bool)> {
        let out = std::mem::take(&mut self.owner.state.outbox.per_worker[0]);
        out.effects
            .iter()
            .map(|e| {
                let Body::Literal(span) = e.body else {
                    panic!("not a no-quorum answer: {e:?}")
                };
                let (frame, _) = ld::parse(span.get(&out.arena.bytes)).expect("a frame");
                let conn = e.conn.expect("addressed");
                (conn, frame.opcode, frame.payload.to_vec(), e.close)
            })
            .collect()
    }

    /// Connection events waiting to be proposed.
    fn queued_ops(&self) -> Vec<OpMsg> {
        let q = self.owner.core.queued.iter();
        q.flat_map(|q| q.batch.ops.iter().copied()).collect()
    }

    /// Whether every queued op is the close of a connection opened in a proposal in flight:
    /// nothing else of a node without a quorum waits for the log once its requests are
    /// answered.
    fn only_closes_of_proposed_connections_wait(&self) -> bool {
        let proposed: HashSet<ConnId> = (self.owner.core.inflight.iter())
            .flat_map(|f| f.batches.iter().flat_map(|b| b.ops.iter()))
            .filter(|m| matches!(m.op, Op::Open { .. }))
            .map(|m| m.conn)
            .collect();
        (self.queued_ops().iter()).all(|m| matches!(m.op, Op::Close) && proposed.contains(&m.conn))
    }
}

impl Drop for Lone {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn open(b: &mut Batch, conn: ConnId) {
    let peer = "127.0.0.1:9".parse().expect("address");
    let proto = crate::server::Proto::Lockd;
    b.ops.push(OpMsg {
        conn,
        op: Op::Open { proto, peer },
    });
}

fn request(b: &mut Batch, conn: ConnId, opcode: u8, payload: &[u8]) {
    let span = b.arena.push(payload);
    b.ops.push(OpMsg {
        conn,
        op: Op::Lockd(LockdOp::new(opcode, span, payload)),
    });
}

fn close(b: &mut Batch, conn: ConnId) {
    b.ops.push(OpMsg {
        conn,
        op: Op::Close,
    });
}

/// An answer a test saw: how long after its request, the opcode and payload, and close.
type Answer = (Duration, u8, Vec<u8>, bool);

/// A node with no quorum answers every request "no quorum" within two election timeouts of
/// its arrival, in order per connection, however many arrive: far more than its proposals in
/// flight at most, which fill up with proposals given up that cannot commit. A client's
/// connection closes after its answers (the answer closes it), or before them (a client that
/// gave up first).
#[test]
fn a_node_without_a_quorum_answers_every_request_within_two_election_timeouts_in_order() {
    let mut lone = Lone::start("answers");
    let limit = 2 * lone.owner.core.election;
    let t0 = Instant::now();
    let step = Duration::from_millis(5);
    let mut asked: BTreeMap<ConnId, (Instant, Vec<Vec<u8>>)> = BTreeMap::new();
    let mut answered: BTreeMap<ConnId, Vec<Answer>> = BTreeMap::new();
    let mut closing = Vec::new();
    let mut gave_up = HashSet::new();
    // 4 s, twenty election timeouts; a new connection with two requests every 40 ms for 3 s.
    for s in 0..800u32 {
        let now = t0 + step * s;
        let mut b = Batch::default();
        for conn in closing.drain(..) {
            close(&mut b, conn);
        }
        if s % 8 == 0 && s < 600 {
            let conn = ConnId::on_node(3, 0, s, 1);
            open(&mut b, conn);
            let payloads = vec![
                format!("a{s}\0").into_bytes(),
                format!("b{s}\0").into_bytes(),
            ];
            request(&mut b, conn, ld::op::ACQ, &payloads[0]);
            request(&mut b, conn, ld::op::TRY, &payloads[1]);
            asked.insert(conn, (now, payloads));
            if s % 24 == 0 {
                gave_up.insert(conn);
                closing.push(conn);
            }
        }
        lone.round(now, b);
        for (conn, opcode, payload, close) in lone.answers() {
            let at = now.duration_since(asked[&conn].0);
            let got = answered.entry(conn).or_default();
            got.push((at, opcode, payload, close));
            if got.len() == 2 && !gave_up.contains(&conn) {
                closing.push(conn);
            }
        }
    }
    assert_eq!(asked.len(), 75);
    for (conn, (_, payloads)) in &asked {
        let got = answered
            .get(conn)
            .unwrap_or_else(|| panic!("{conn:?} unanswered"));
        let sent: Vec<_> = payloads
            .iter()
            .map(|p| (ld::op::ERR, p.clone(), true))
            .collect();
        let seen: Vec<_> = got.iter().map(|(_, o, p, c)| (*o, p.clone(), *c)).collect();
        assert_eq!(seen, sent, "{conn:?}: each request once, in order, closing");
        for (at, ..) in got {
            assert!(*at <= limit, "{conn:?} answered {at:?} after it asked");
        }
    }
    // Their closes came through: nothing is poisoned any more, and what waits for the log is
    // the closes of the connections opened by the proposals in flight.
    assert!(lone.owner.core.poisoned.is_empty());
    assert_eq!(lone.owner.core.inflight.len(), MAX_INFLIGHT_PROPOSALS);
    assert!(lone.only_closes_of_proposed_connections_wait());
}

/// What a node without a quorum keeps for the log stays bounded however long it lasts: a
/// client pipelining thousands of requests on one connection has each answered once, in
/// order (those after the first answer at once), and thousands of connections that open, ask
/// and close leave nothing behind.
#[test]
fn what_a_node_without_a_quorum_keeps_for_the_log_stays_bounded() {
    let mut lone = Lone::start("bounded");
    let t0 = Instant::now();
    let step = Duration::from_millis(5);
    let steps_per_give_up = (2 * lone.owner.core.election).as_millis() as usize / 5;
    let pipeline = ConnId::on_node(3, 0, 0, 1);
    let mut b = Batch::default();
    open(&mut b, pipeline);
    lone.round(t0, b);
    let mut pipelined = Vec::new();
    let mut pipeline_answers = Vec::new();
    let mut live: HashSet<ConnId> = HashSet::new();
    let mut closing = Vec::new();
    let (mut most_queued, mut most_ops, mut most_poisoned) = (0, 0, 0);
    // 20 s, a hundred election timeouts, a new connection every step; then the last ones'
    // answers and closes.
    let (last, mut most_live) = (4000u32, 0);
    for s in 1..last + 50 {
        let now = t0 + step * s;
        let mut b = Batch::default();
        for conn in closing.drain(..) {
            close(&mut b, conn);
            live.remove(&conn);
        }
        if s == last {
            close(&mut b, pipeline);
        }
        if s < last {
            let conn = ConnId::on_node(3, 0, s, 1);
            open(&mut b, conn);
            request(&mut b, conn, ld::op::TRY, b"job\0");
            live.insert(conn);
        }
        if s <= 100 {
            for _ in 0..20 {
                let p = format!("p{}\0", pipelined.len()).into_bytes();
                request(&mut b, pipeline, ld::op::TRY, &p);
                pipelined.push(p);
            }
        }
        lone.round(now, b);
        for (c, opcode, payload, close) in lone.answers() {
            assert_eq!((opcode, close), (ld::op::ERR, true));
            if c == pipeline {
                pipeline_answers.push(payload);
            } else {
                assert_eq!(payload, b"job\0");
                assert!(live.contains(&c), "{c:?} answered twice");
                closing.push(c);
            }
        }
        most_live = most_live.max(live.len());
        most_queued = most_queued.max(lone.owner.core.queued.len());
        most_ops = most_ops.max(lone.queued_ops().len());
        most_poisoned = most_poisoned.max(lone.owner.core.poisoned.len());
    }
    assert_eq!(pipelined.len(), 2000);
    assert_eq!(pipeline_answers, pipelined, "each once, in order");
    // A connection waits two election timeouts at most, and closes the step after its answer;
    // what waits for the log is at most what arrives in two election timeouts.
    assert!(live.is_empty());
    assert!(
        most_live <= steps_per_give_up + 2,
        "{most_live} connections"
    );
    let batches = steps_per_give_up + 2;
    assert!(most_queued <= 2 * batches, "{most_queued} batches queued");
    assert!(most_ops <= 24 * batches, "{most_ops} ops queued");
    assert!(most_poisoned <= batches, "{most_poisoned} poisoned");
    assert!(lone.owner.core.poisoned.is_empty());
    assert!(lone.only_closes_of_proposed_connections_wait());
}

/// A worker's batch far larger than an entry goes out as entries of about
/// [`MAX_ENTRY_BYTES`] (one request more at most), its requests in their order, and no more
/// than [`MAX_INFLIGHT_BYTES`] of them are in flight: a request that comes after waits behind a
/// bounded number of bytes, not behind the whole batch.
#[test]
fn a_large_batch_goes_out_in_capped_entries_in_order_and_in_flight_bytes_are_capped() {
    let mut lone = Lone::start("entry-cap");
    let t0 = Instant::now();
    let conn = ConnId::on_node(3, 0, 1, 1);
    let mut b = Batch::default();
    open(&mut b, conn);
    // A few requests to an entry, so that entries hold more than one.
    let value = vec![b'v'; MAX_ENTRY_BYTES / 4];
    let mut sent = Vec::new();
    for i in 0..400 {
        let mut p = format!("k{i}\0").into_bytes();
        p.extend_from_slice(&value);
        request(&mut b, conn, ld::op::TRY, &p);
        sent.push(p);
    }
    lone.round(t0, b);
    for _ in 0..40 {
        lone.owner.propose(t0);
    }
    let inflight = &lone.owner.core.inflight;
    let bytes: usize = inflight.iter().map(|f| f.data.len()).sum();
    assert!(inflight.len() >= 3, "{} proposals", inflight.len());
    assert!(
        bytes < MAX_INFLIGHT_BYTES + MAX_ENTRY_BYTES + value.len(),
        "{bytes} bytes in flight"
    );
    let mut seen = Vec::new();
    for f in inflight {
        assert!(
            f.data.len() <= MAX_ENTRY_BYTES + value.len() + 1024,
            "an entry of {} bytes",
            f.data.len()
        );
        let mut decoded = Batch::default();
        command::decode_entry(&f.data[HEADER_LEN..], Default::default(), &mut decoded)
            .expect("an entry");
        for m in &decoded.ops {
            if let Op::Lockd(op) = m.op {
                seen.push(op.payload.get(&decoded.arena.bytes).to_vec());
            }
        }
    }
    assert!(seen.len() < sent.len(), "not all of it is in flight");
    assert!(
        seen.len() > inflight.len(),
        "{} requests in {} entries: entries of one request each",
        seen.len(),
        inflight.len()
    );
    assert_eq!(seen, sent[..seen.len()], "in order, each once");
    let queued: Vec<Vec<u8>> = lone
        .owner
        .core
        .queued
        .iter()
        .flat_map(|q| {
            q.batch.ops.iter().filter_map(|m| match m.op {
                Op::Lockd(op) => Some(op.payload.get(&q.batch.arena.bytes).to_vec()),
                _ => None,
            })
        })
        .collect();
    assert_eq!(queued, sent[seen.len()..], "the rest waits, in order");
}

/// A proposal of `node` (run 1, number `seq`) at `time`: each connection's version-3 frame
/// (request `id`, `ty` on `key`) as the worker parses it, after the `DlockOpen` of its accept.
fn native_proposal(node: u64, seq: u64, time: u64, reqs: &[(ConnId, u64, u64, &[u8])]) -> Vec<u8> {
    use crate::proto::dlock as dl;
    let config = match config::parse(std::iter::empty::<&str>()) {
        Ok(Command::Run(c)) => c,
        other => panic!("{other:?}"),
    };
    let secrets = Default::default();
    let cx = crate::server::worker::decode::Cx {
        config: &config,
        secrets: &secrets,
    };
    let mut batch = Batch::default();
    for &(conn, id, ty, key) in reqs {
        batch.ops.push(OpMsg {
            conn,
            op: Op::DlockOpen,
        });
        let keys = [key];
        let lock = dl::LockFields {
            keys: &keys,
            ..Default::default()
        };
        let mut frame = Vec::new();
        dl::encode_request_version(
            &mut frame,
            dl::NATIVE_VERSION,
            Some(id),
            None,
            ty,
            Some(lock),
        );
        crate::server::worker::conn::Conn::new(crate::server::Proto::Dlock)
            .receive(&frame, conn, cx, &mut batch);
    }
    let mut data = vec![KIND_COMMANDS];
    for v in [node, 1, seq] {
        data.extend_from_slice(&v.to_le_bytes());
    }
    command::encode_entry_of_batches(time, std::iter::once(&batch), &mut data);
    data
}

#[test]
fn installing_a_snapshot_closes_this_nodes_watchers_and_no_other_connection() {
    use crate::cluster::node::Machine;
    use crate::proto::dlock::req_type;
    // On node 1: `w` watches "db", `h` holds it; on node 2, `v` watches it too.
    let (w, h) = (ConnId::on_node(1, 0, 5, 1), ConnId::on_node(1, 0, 6, 1));
    let v = ConnId::on_node(2, 0, 7, 1);
    let mut r = replica(1);
    let mut leader = replica(2);
    for p in [
        native_proposal(1, 1, T0, &[(w, 1, req_type::WATCH, b"db")]),
        native_proposal(1, 2, T0 + 1, &[(h, 1, req_type::LOCK, b"db")]),
        native_proposal(2, 1, T0 + 2, &[(v, 1, req_type::WATCH, b"db")]),
    ] {
        r.apply(0, &p);
        leader.apply(0, &p);
    }
    replies(&mut r);
    // The leader went on without this node: a Release it never applied.
    leader.apply(
        0,
        &native_proposal(1, 3, T0 + 3, &[(h, 2, req_type::UNLOCK, b"db")]),
    );
    let restored = r.restorer()(&leader.snapshot()).expect("restore");
    drop(r.install(restored));
    // The watcher missed the Released event: its connection closes; the holder's stays.
    assert_eq!(replies(&mut r), vec![(w, 0, true)]);
    assert_eq!(r.snapshot(), leader.snapshot());
    // A later change reaches no watcher of this node (none is left), nor the other node's.
    r.apply(
        0,
        &native_proposal(1, 4, T0 + 4, &[(h, 3, req_type::LOCK, b"db")]),
    );
    let after = replies(&mut r);
    assert!(after.iter().all(|(c, _, _)| *c == h), "{after:?}");
    assert!(!after.is_empty());
}
