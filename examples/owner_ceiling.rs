//! The owner's ceiling: lock operations per second that one owner thread sustains when it is the
//! bottleneck, measured without sockets or worker threads. Each turn applies one batch of
//! lock+unlock pairs from 50 sessions (each on its own name, as `holdfast-bench` does), the
//! replies dropped as the owner hands them off. What a node can take when many cores keep its
//! owner busy; `tools/owner_ceiling.py` runs it under callgrind for instructions per operation.
//!
//! usage: owner_ceiling [WORKLOAD|all] [PAIRS_PER_SESSION_PER_TURN] [SECONDS | --pairs N]
//! workloads: mc-binary, mc-text, lockd, dlock

use std::time::{Duration, Instant};

use holdfast::core::store::StoreMode;
use holdfast::proto::memcache::binary::opcode;
use holdfast::server::msg::ConnId;
use holdfast::server::msg::{Batch, DlockKind, DlockOp, LockdOp, McCmd, McForm, McOp, Op, OpMsg};
use holdfast::server::sim::Replayer;

/// Sessions per turn, as the bench's 50 connections.
const SESSIONS: u32 = 50;
/// The Unix time the run starts at (any fixed value: the clock is the commands').
const START_MS: u64 = 1_700_000_000_000;

const WORKLOADS: [&str; 4] = ["mc-binary", "mc-text", "lockd", "dlock"];

fn config() -> holdfast::config::Config {
    match holdfast::config::parse(std::iter::empty::<&str>()) {
        Ok(holdfast::config::Command::Run(c)) => c,
        other => panic!("default config: {other:?}"),
    }
}

fn session(i: u32) -> ConnId {
    ConnId::new(0, i, 1)
}

/// One turn's batch: `depth` lock+unlock pairs for each session, each on the session's own name.
fn turn(workload: &str, depth: usize) -> Batch {
    let mut b = Batch::default();
    for s in 0..SESSIONS {
        let conn = session(s);
        let name = format!("name{s:04}");
        for _ in 0..depth {
            let (lock, unlock) = match workload {
                "mc-binary" => {
                    let key = b.arena.push(name.as_bytes());
                    let bin = |cmd, opcode| McOp {
                        cmd,
                        form: McForm::Binary { opcode, opaque: 0 },
                    };
                    (
                        Op::Mc(bin(McCmd::Lock { key }, opcode::LOCK)),
                        Op::Mc(bin(McCmd::Unlock { key }, opcode::UNLOCK)),
                    )
                }
                "mc-text" => {
                    let key = b.arena.push(name.as_bytes());
                    (
                        Op::Mc(McOp::text(McCmd::Lock { key }, false)),
                        Op::Mc(McOp::text(McCmd::Unlock { key }, false)),
                    )
                }
                "lockd" => {
                    let bytes = format!("{name}\0");
                    let payload = b.arena.push(bytes.as_bytes());
                    (
                        Op::Lockd(LockdOp::new(1, payload, bytes.as_bytes())),
                        Op::Lockd(LockdOp::new(2, payload, bytes.as_bytes())),
                    )
                }
                "dlock" => {
                    // The raw RequestLock message: field 3 (keys), length-delimited, checked
                    // as the worker checks it.
                    let mut raw = vec![0x1a, name.len() as u8];
                    raw.extend_from_slice(name.as_bytes());
                    let lock = holdfast::proto::dlock::decode_lock(&raw).expect("RequestLock");
                    assert_eq!(lock.key_count, 1);
                    let keys = b.arena.push(&raw);
                    let lock = DlockKind::Lock {
                        keys,
                        key_count: 1,
                        wait_us: None,
                        lease_us: None,
                    };
                    let unlock = DlockKind::Unlock { keys, key_count: 1 };
                    (
                        Op::Dlock(DlockOp {
                            id: Some(1),
                            kind: lock,
                        }),
                        Op::Dlock(DlockOp {
                            id: Some(2),
                            kind: unlock,
                        }),
                    )
                }
                other => panic!("unknown workload {other}"),
            };
            b.ops.push(OpMsg { conn, op: lock });
            b.ops.push(OpMsg { conn, op: unlock });
        }
    }
    b
}

/// A state with what the workload needs in place (items to lock, dlock sessions open).
fn prepared(workload: &str) -> Replayer {
    let mut r = Replayer::new(config());
    let mut b = Batch::default();
    for s in 0..SESSIONS {
        let conn = session(s);
        let op = match workload {
            "mc-binary" | "mc-text" => {
                let cmd = McCmd::Store {
                    mode: StoreMode::Set,
                    key: b.arena.push(format!("name{s:04}").as_bytes()),
                    flags: 0,
                    exptime: 0,
                    value: b.arena.push(b"v"),
                    cas: None,
                };
                Op::Mc(McOp::text(cmd, true))
            }
            "dlock" => Op::DlockOpen,
            _ => continue,
        };
        b.ops.push(OpMsg { conn, op });
    }
    r.apply_batch(START_MS, &b);
    r
}

/// Apply one turn through the encoded path and check that every reply is a success (a lock
/// granted, then released): the run measures real grants, not fast refusals.
fn verify(w: &str, r: &mut Replayer, batch: &Batch, now: u64) {
    use holdfast::core::codec::Reader;
    let mut entry = Vec::new();
    holdfast::server::command::encode_entry(now, &batch.ops, &batch.arena.bytes, &mut entry);
    let effects = r.apply(&entry).expect("entry applies");
    let mut rd = Reader::new(&effects);
    let mut replies = 0;
    while rd.remaining() > 0 {
        // The canonical effect (`Effects::encode_canonical`): session, where it was routed,
        // done, close, then the typed body.
        let _session = holdfast::core::Session::decode(&mut rd).expect("session");
        if rd.bool().expect("routed") {
            let _conn = ConnId::decode(&mut rd).expect("conn");
        }
        let (_done, _close) = (rd.u64().expect("done"), rd.bool().expect("close"));
        let body = rd.bytes(usize::MAX).expect("body");
        let mut b = Reader::new(body);
        let tag = b.u8().expect("tag");
        use holdfast::server::effect::tag as t;
        let ok = match w {
            "mc-text" => tag == t::MC_WORDS && b.bytes(usize::MAX) == Ok(&b"OK\r\n"[..]),
            "mc-binary" => tag == t::MC_BIN && b.u8().is_ok() && b.u64() == Ok(0),
            "lockd" => {
                let op = b.u8().unwrap_or(0);
                tag == t::LOCKD_FRAME
                    && (op == holdfast::proto::lockd::op::ACQUIRED
                        || op == holdfast::proto::lockd::op::RELEASED)
            }
            _ => {
                tag == t::DLOCK
                    && b.opt_u64().is_ok()
                    && b.u64() == Ok(u64::from(holdfast::proto::dlock::status::OK))
            }
        };
        assert!(ok, "{w}: a reply is not a success: {body:?}");
        replies += 1;
    }
    assert_eq!(replies, batch.ops.len(), "{w}: one reply per operation");
}

/// Take every session's lock without releasing it: each name must then be held (the stats of
/// the table count them), so a workload that "succeeds" without locking anything is caught.
fn verify_holds(w: &str, r: &mut Replayer) {
    let mut b = turn(w, 1);
    let locks: Vec<OpMsg> = b.ops.iter().step_by(2).copied().collect();
    b.ops = locks;
    r.apply_batch(START_MS, &b);
    let held = r.locks_held();
    assert_eq!(
        held,
        u64::from(SESSIONS),
        "{w}: locks held after a lock-only turn"
    );
    let mut b = turn(w, 1);
    let unlocks: Vec<OpMsg> = b.ops.iter().skip(1).step_by(2).copied().collect();
    b.ops = unlocks;
    r.apply_batch(START_MS, &b);
    assert_eq!(r.locks_held(), 0, "{w}: locks held after the unlocks");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map_or("all", String::as_str);
    let depth: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(16);
    let pairs: Option<u64> = match args.get(2).map(String::as_str) {
        Some("--pairs") => args.get(3).and_then(|a| a.parse().ok()),
        _ => None,
    };
    let seconds: f64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(2.0);
    let workloads: Vec<&str> = match which {
        "all" => WORKLOADS.to_vec(),
        w => vec![w],
    };
    for w in workloads {
        let mut r = prepared(w);
        let batch = turn(w, depth);
        verify(w, &mut r, &batch, START_MS);
        verify_holds(w, &mut r);
        let ops_per_turn = batch.ops.len() as u64;
        let turns = pairs.map(|p| p.div_ceil(ops_per_turn / 2));
        let started = Instant::now();
        let mut done = 0u64;
        let mut now = START_MS + 1;
        loop {
            r.apply_batch(now, &batch);
            done += 1;
            if done.is_multiple_of(64) {
                now += 1;
            }
            match turns {
                Some(t) if done >= t => break,
                Some(_) => {}
                None if done.is_multiple_of(64)
                    && started.elapsed() >= Duration::from_secs_f64(seconds) =>
                {
                    break
                }
                None => {}
            }
        }
        let secs = started.elapsed().as_secs_f64();
        let ops = done * ops_per_turn;
        println!(
            "owner_ceiling workload={w} depth={depth} ops={ops} seconds={secs:.3} ops_per_sec={:.0} ns_per_op={:.1}",
            ops as f64 / secs,
            secs * 1e9 / ops as f64
        );
    }
}
