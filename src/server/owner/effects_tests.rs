//! Applying commands yields typed effects addressed to sessions (never wire bytes), and the
//! routing step delivers only those whose session has a connection in this process.

use super::*;
use crate::config::{self, Config};
use crate::core::store::StoreMode;
use crate::core::Session;
use crate::proto::counter::{op as ct_op, status as ct_status};
use crate::proto::dlock::status as dl_status;
use crate::proto::lockd::op as ld_op;
use crate::proto::memcache::binary::{opcode as opc, status as st};
use crate::server::effect::{self, BinHead, CounterReply, DlockReply, Effect, LockdReply, McReply};
use crate::server::msg::{
    Arena, Batch, CounterKind, CounterOp, DlockKind, DlockOp, LockdOp, McCmd, McForm, McOp, Span,
};
use crate::server::owner::Outbox;
use crate::server::Proto;

fn config() -> Config {
    match config::parse(["--dlock-idle-timeout", "0"]) {
        Ok(config::Command::Run(c)) => c,
        other => panic!("{other:?}"),
    }
}

const T0: u64 = 1_700_000_000_000;

/// One state machine fed turns built by hand.
struct Machine {
    t: Tables,
    shared: Shared,
    fx: Effects,
    batch: Batch,
}

impl Machine {
    fn new() -> Machine {
        let shared = crate::server::sim::sim_shared(config());
        Machine {
            t: Tables::new(&shared.config, Now::from_unix_ms(T0)),
            shared,
            fx: Effects::default(),
            batch: Batch::default(),
        }
    }

    fn span(&mut self, bytes: &[u8]) -> Span {
        self.batch.arena.push(bytes)
    }

    fn op(&mut self, conn: ConnId, op: Op) {
        self.batch.ops.push(OpMsg { conn, op });
    }

    fn open(&mut self, conn: ConnId, proto: Proto) {
        let peer = std::net::SocketAddr::from(([127, 0, 0, 1], 1));
        self.op(conn, Op::Open { proto, peer });
    }

    /// Apply the ops queued so far as one turn; the effects are left in `self.fx`.
    fn turn(&mut self) {
        self.fx.clear();
        let batch = std::mem::take(&mut self.batch);
        apply_turn(
            &mut self.t,
            &mut self.fx,
            &self.shared,
            Now::from_unix_ms(T0),
            &batch.ops,
            &batch.arena.bytes,
        );
    }

    /// The turn's effects with every span replaced by the bytes it names (so that effects
    /// compare by content, whatever the arena layout).
    fn effects(&self) -> Vec<(Effect, Vec<Vec<u8>>)> {
        resolve(&self.fx)
    }
}

fn resolve(fx: &Effects) -> Vec<(Effect, Vec<Vec<u8>>)> {
    fx.list
        .iter()
        .map(|e| {
            let mut e = *e;
            let mut bytes = Vec::new();
            e.body.spans_mut(|s| {
                bytes.push(s.get(&fx.arena.bytes).to_vec());
                *s = Span::EMPTY;
            });
            (e, bytes)
        })
        .collect()
}

fn reply(to: Session, body: Body) -> Effect {
    Effect {
        to,
        done: 1,
        close: false,
        body,
        conn: None,
    }
}

fn text(cmd: McCmd) -> Op {
    Op::Mc(McOp::text(cmd, false))
}

fn bin(cmd: McCmd, opcode: u8, opaque: u32) -> Op {
    Op::Mc(McOp {
        cmd,
        form: McForm::Binary { opcode, opaque },
    })
}

const E: Span = Span::EMPTY;

#[test]
fn memcached_commands_yield_typed_replies_to_the_sessions_that_sent_them() {
    let mut m = Machine::new();
    let (a, b) = (ConnId::new(0, 1, 0), ConnId::new(0, 2, 0));
    m.open(a, Proto::Memcache);
    m.open(b, Proto::Memcache);
    let (key, value) = (m.span(b"k"), m.span(b"v"));
    let store = McCmd::Store {
        mode: StoreMode::Set,
        key,
        flags: 5,
        exptime: 0,
        value,
        cas: None,
    };
    m.op(a, text(store));
    m.op(a, text(McCmd::Lock { key }));
    m.op(b, bin(McCmd::Lock { key }, opc::LOCK, 7));
    m.op(a, text(McCmd::LockToken { key }));
    let keys = m.span(b"k missing");
    let get = McCmd::Get {
        keys,
        cas: false,
        touch: None,
    };
    m.op(b, text(get));
    m.op(b, bin(get_one(key), opc::GETK, 9));
    m.op(b, bin(McCmd::Noop, opc::NOOP, 3));
    m.turn();
    let (sa, sb) = (Session(1), Session(2));
    let got = m.effects();
    let words = |w: &'static [u8]| Body::Mc(McReply::Words(w));
    assert_eq!(got[0], (reply(sa, words(b"STORED\r\n")), vec![]));
    assert_eq!(got[1], (reply(sa, words(b"OK\r\n")), vec![]));
    let locked = BinHead {
        opcode: opc::LOCK,
        status: st::LOCKED,
        opaque: 7,
    };
    let body = Body::Mc(McReply::Bin {
        head: locked,
        cas: 0,
        value: b"Locked",
    });
    assert_eq!(got[2], (reply(sb, body), vec![]));
    assert!(
        matches!(got[3].0.body, Body::Mc(McReply::Token(n)) if n > 0),
        "{:?}",
        got[3]
    );
    let Body::Mc(McReply::Items { cas: false, .. }) = got[4].0.body else {
        panic!("{:?}", got[4]);
    };
    let mut item = Arena::default();
    let cas =
        m.t.store
            .peek(b"k", Now::from_unix_ms(T0))
            .expect("stored")
            .cas;
    effect::put_item(&mut item, b"k", 5, cas, b"v");
    assert_eq!(
        got[4].1,
        vec![item.bytes],
        "one hit: the missing key lists nothing"
    );
    let hit = Body::Mc(McReply::BinItem {
        head: BinHead {
            opcode: opc::GETK,
            status: st::NO_ERROR,
            opaque: 9,
        },
        cas,
        flags: 5,
        key: E,
        value: E,
    });
    assert_eq!(got[5], (reply(sb, hit), vec![b"k".to_vec(), b"v".to_vec()]));
    let noop = Body::Mc(McReply::Bin {
        head: BinHead {
            opcode: opc::NOOP,
            status: st::NO_ERROR,
            opaque: 3,
        },
        cas: 0,
        value: b"",
    });
    assert_eq!(got[6], (reply(sb, noop), vec![]));
    assert_eq!(got.len(), 7);
}

fn get_one(key: Span) -> McCmd {
    McCmd::Get {
        keys: key,
        cas: false,
        touch: None,
    }
}

#[test]
fn a_lockd_release_answers_its_sender_and_grants_the_waiter_unsolicited() {
    let mut m = Machine::new();
    let (a, b) = (ConnId::new(0, 1, 0), ConnId::new(0, 2, 0));
    m.open(a, Proto::Lockd);
    m.open(b, Proto::Lockd);
    let name = m.span(b"n\0");
    let lockd = |opcode| Op::Lockd(LockdOp::new(opcode, name, b"n\0"));
    m.op(a, lockd(ld_op::ACQ));
    m.op(b, lockd(ld_op::ACQ));
    m.op(a, lockd(ld_op::REL));
    m.op(b, lockd(ld_op::SYNC));
    m.turn();
    let frame = |opcode| Body::Lockd(LockdReply::Frame { opcode, payload: E });
    let n = vec![b"n\0".to_vec()];
    let (sa, sb) = (Session(1), Session(2));
    let grant = Effect {
        to: sb,
        done: 0,
        close: false,
        body: frame(ld_op::ACQUIRED),
        conn: None,
    };
    let sync = Body::Lockd(LockdReply::Sync { names: E });
    assert_eq!(
        m.effects(),
        vec![
            (reply(sa, frame(ld_op::ACQUIRED)), n.clone()),
            (reply(sb, frame(ld_op::ACK)), n.clone()),
            (reply(sa, frame(ld_op::RELEASED)), n.clone()),
            (grant, n.clone()),
            (reply(sb, sync), n),
        ]
    );
}

/// A RequestLock message naming `keys` (field 3, as dlock.proto numbers it).
fn request_lock(keys: &[&[u8]]) -> Vec<u8> {
    let mut raw = Vec::new();
    for k in keys {
        raw.push(0x1a);
        raw.push(k.len() as u8);
        raw.extend_from_slice(k);
    }
    raw
}

#[test]
fn dlock_and_counter_requests_yield_typed_responses() {
    let mut m = Machine::new();
    let (a, b, c) = (
        ConnId::new(0, 1, 0),
        ConnId::new(0, 2, 0),
        ConnId::new(0, 3, 0),
    );
    m.open(a, Proto::Dlock);
    m.open(b, Proto::Dlock);
    m.open(c, Proto::Counter);
    let keys = m.span(&request_lock(&[b"x"]));
    let lock = |wait_us| DlockKind::Lock {
        keys,
        key_count: 1,
        wait_us,
        lease_us: None,
    };
    m.op(
        a,
        Op::Dlock(DlockOp {
            id: Some(1),
            kind: lock(None),
        }),
    );
    m.op(
        b,
        Op::Dlock(DlockOp {
            id: Some(2),
            kind: lock(Some(0)),
        }),
    );
    let name = m.span(b"c");
    let acquire = CounterKind::Acquire {
        resources: 1,
        maximum: 2,
        name,
    };
    m.op(
        c,
        Op::Counter(CounterOp {
            opaque: 4,
            kind: acquire,
        }),
    );
    m.turn();
    let got = m.effects();
    let time = (T0 / 1000) as i64;
    let Body::Dlock(DlockReply {
        fence: Some(fence), ..
    }) = got[0].0.body
    else {
        panic!("{:?}", got[0]);
    };
    let granted = DlockReply {
        id: Some(1),
        status: dl_status::OK,
        text: None,
        keys: E,
        time,
        fence: Some(fence),
        native: false,
        extra: E,
    };
    assert_eq!(
        got[0],
        (
            reply(Session(1), Body::Dlock(granted)),
            vec![vec![], vec![]]
        )
    );
    let busy = DlockReply {
        id: Some(2),
        status: dl_status::ACQUIRE_TIMEOUT,
        text: None,
        keys: E,
        time,
        fence: None,
        native: false,
        extra: E,
    };
    let mut x = Arena::default();
    effect::put_entry(&mut x, b"x");
    assert_eq!(
        got[1],
        (reply(Session(2), Body::Dlock(busy)), vec![x.bytes, vec![]])
    );
    let acquired = CounterReply::Status {
        opcode: ct_op::ACQUIRE,
        status: ct_status::OK,
        opaque: 4,
        value: Some(1),
    };
    assert_eq!(got[2], (reply(Session(3), Body::Counter(acquired)), vec![]));
    assert_eq!(got.len(), 3);
}

/// Ops of connections on workers 0 and 3, over all lock protocols: session 1 (worker 3) takes
/// a lockd name, a dlock key and a memcached lock; session 2 (worker 0) queues for the first
/// two; then session 1 releases the name and closes, which grants both to session 2.
fn mixed_turns() -> Vec<Batch> {
    let (far, near) = (ConnId::new(3, 1, 0), ConnId::new(0, 1, 0));
    let mut turns = Vec::new();
    let mut b = Batch::default();
    let name = b.arena.push(b"n\0");
    let keys = b.arena.push(&request_lock(&[b"x"]));
    let (key, value) = (b.arena.push(b"k"), b.arena.push(b"v"));
    let acq = Op::Lockd(LockdOp::new(ld_op::ACQ, name, b"n\0"));
    let lock = Op::Dlock(DlockOp {
        id: Some(1),
        kind: DlockKind::Lock {
            keys,
            key_count: 1,
            wait_us: None,
            lease_us: None,
        },
    });
    let store = McCmd::Store {
        mode: StoreMode::Set,
        key,
        flags: 0,
        exptime: 0,
        value,
        cas: None,
    };
    for (conn, op) in [
        (far, acq),
        (far, lock),
        (far, text(store)),
        (far, text(McCmd::Lock { key })),
        (near, acq),
        (near, lock),
    ] {
        b.ops.push(OpMsg { conn, op });
    }
    turns.push(b);
    let mut b = Batch::default();
    let name = b.arena.push(b"n\0");
    let rel = Op::Lockd(LockdOp::new(ld_op::REL, name, b"n\0"));
    b.ops.push(OpMsg { conn: far, op: rel });
    b.ops.push(OpMsg {
        conn: far,
        op: Op::Close,
    });
    turns.push(b);
    turns
}

#[test]
fn effects_for_sessions_without_a_connection_here_are_produced_then_dropped_by_routing() {
    // `here` is a process with one worker: session 1's connection (worker 3) is another
    // process's. `everywhere` has four workers and delivers to both sessions.
    let (mut here, mut everywhere) = (Machine::new(), Machine::new());
    let (mut out_here, mut out_everywhere) = (Outbox::new(1), Outbox::new(4));
    let turns = mixed_turns();
    let mut delivered_here = Vec::new();
    let mut dropped = 0;
    for batch in &turns {
        let mut canonical = Vec::new();
        for (m, out) in [
            (&mut here, &mut out_here),
            (&mut everywhere, &mut out_everywhere),
        ] {
            m.batch = Batch {
                ops: batch.ops.clone(),
                arena: Arena {
                    bytes: batch.arena.bytes.clone(),
                },
                ..Batch::default()
            };
            m.turn();
            let mut bytes = Vec::new();
            m.fx.encode_canonical(|s| m.t.sessions.conn(s), &mut bytes);
            canonical.push((resolve(&m.fx), bytes));
            out.route(&mut m.fx, &m.t.sessions);
            assert!(m.fx.is_empty(), "routing takes every effect");
        }
        assert_eq!(
            canonical[0], canonical[1],
            "the same effects, whatever is local"
        );
        // Effects whose session still has a connection when the turn's effects are routed (a
        // session that closed during the turn has none: its connection is gone).
        let live = |worker: u16| {
            let routed = canonical[0]
                .0
                .iter()
                .map(|(e, _)| here.t.sessions.conn(e.to));
            routed
                .filter(|c| c.is_some_and(|c| c.worker == worker))
                .count()
        };
        let far_count = canonical[0]
            .0
            .iter()
            .filter(|(e, _)| e.to == Session(1))
            .count();
        // Effects routed to a worker's connections.
        let named =
            |r: &crate::server::msg::Replies| r.effects.iter().filter(|e| e.conn.is_some()).count();
        let here = &out_here.per_worker[0];
        assert!(here
            .effects
            .iter()
            .flat_map(|e| e.conn)
            .all(|c| c.worker == 0));
        assert_eq!(named(here), live(0));
        let all = out_everywhere.per_worker.iter().map(named);
        assert_eq!(all.sum::<usize>(), live(0) + live(3));
        assert_eq!(
            named(&out_everywhere.per_worker[3]),
            live(3),
            "delivered where the connection is"
        );
        // Worker 0 gets the same records, encoded to the same bytes, in both processes.
        let content = |out: &Outbox| {
            let r = &out.per_worker[0];
            let mut w = Vec::new();
            for e in &r.effects {
                let Some(conn) = e.conn else { continue };
                let mut bytes = Vec::new();
                crate::server::worker::encode::write(&mut bytes, &e.body, &r.arena.bytes);
                w.push((conn, e.done, e.close, bytes));
            }
            w
        };
        let here_content = content(&out_here);
        assert_eq!(here_content, content(&out_everywhere));
        delivered_here.push(here_content);
        dropped += far_count;
        for out in [&mut out_here, &mut out_everywhere] {
            for r in &mut out.per_worker {
                r.effects.clear();
                r.arena.bytes.clear();
            }
        }
    }
    assert!(dropped >= 4, "session 1's replies were produced: {dropped}");
    // The grants that session 1's release and close caused reached session 2, here too: a
    // lockd ACQUIRED (unsolicited) and a dlock Ok (completing the waiting Lock).
    let near = ConnId::new(0, 1, 0);
    let grants = &delivered_here[1];
    let mut acquired = crate::proto::lockd::header(ld_op::ACQUIRED, 2).to_vec();
    acquired.extend_from_slice(b"n\0");
    assert_eq!(grants[0], (near, 0, false, acquired));
    assert_eq!((grants[1].0, grants[1].1), (near, 1), "{grants:?}");
    assert_eq!(grants.len(), 2);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    here.t.snapshot(&mut a);
    everywhere.t.snapshot(&mut b);
    assert_eq!(
        a, b,
        "the state does not depend on where the connections are"
    );
}

#[test]
fn routing_again_before_the_batch_goes_out_keeps_every_effects_bytes() {
    // The owner routes once per send, but an early send's batch may meet a second route before
    // it leaves: the second turn's effects land after the first's, their spans moved.
    for workers in [1, 3] {
        let mut m = Machine::new();
        let a = ConnId::new(0, 1, 0);
        m.open(a, Proto::Lockd);
        let mut out = Outbox::new(workers);
        let mut want = Vec::new();
        for name in [&b"first\0"[..], b"second\0", b"third\0"] {
            let payload = m.span(name);
            let acq = Op::Lockd(LockdOp::new(ld_op::ACQ, payload, name));
            m.op(a, acq);
            m.turn();
            let mut frame = crate::proto::lockd::header(ld_op::ACQUIRED, name.len()).to_vec();
            frame.extend_from_slice(name);
            want.push(frame);
            out.route(&mut m.fx, &m.t.sessions);
        }
        let r = &out.per_worker[0];
        let got: Vec<Vec<u8>> = r
            .effects
            .iter()
            .filter(|e| e.conn == Some(a))
            .map(|e| {
                let mut bytes = Vec::new();
                crate::server::worker::encode::write(&mut bytes, &e.body, &r.arena.bytes);
                bytes
            })
            .collect();
        assert_eq!(got, want, "{workers} workers");
    }
}

/// `stats` reports the connection counters the owner loop stamped into the request, not the
/// process's counters at the time of apply (rule 1 of `docs/state-machine.md`).
#[test]
fn stats_reports_the_stamped_connection_counters_not_the_live_ones() {
    let stats_of = |live: crate::server::Live, curr_now: u64| {
        let mut m = Machine::new();
        let c = ConnId::new(0, 1, 1);
        m.open(c, Proto::Memcache);
        m.batch.wants_live = true;
        let arg = Some(m.span(b"conns"));
        m.op(
            c,
            text(McCmd::Stats {
                arg,
                live: Span::EMPTY,
            }),
        );
        live.stamp(&mut m.batch);
        assert!(!m.batch.wants_live);
        m.shared
            .curr_connections
            .store(curr_now, std::sync::atomic::Ordering::Relaxed);
        m.turn();
        m.effects()
    };
    let live = |curr_connections| crate::server::Live {
        curr_connections,
        total_connections: 9,
        rejected_connections: 1,
    };
    let seven = stats_of(live(7), 100);
    assert_eq!(seven, stats_of(live(7), 5));
    assert_ne!(seven, stats_of(live(8), 100));
    let bytes: Vec<u8> = seven.iter().flat_map(|(_, b)| b.concat()).collect();
    let needle = b"curr_connections";
    assert!(bytes.windows(needle.len()).any(|w| w == needle));
}
