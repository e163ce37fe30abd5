//! Data written by an earlier build must load in this one: a committed fixture holds what a
//! fixed script of requests of all four protocols produced (the reply bytes of every
//! connection, every owner turn as a command entry with its canonical effects, a snapshot
//! taken midway and the final one). This build must restore the midway snapshot and replay the
//! log after it to the same effects and the same final snapshot, decode every entry and encode
//! it back to the same bytes, and, running the script itself, write the same replies, entries
//! and snapshots byte for byte.
//!
//! The requests are written out by hand here, not with the daemon's own encoders, so that the
//! script stays the same whatever the daemon's code looks like. To write the fixture again (only
//! when the stored formats change on purpose, `docs/state-machine.md`):
//! `HOLDFAST_WRITE_FIXTURE=1 cargo test --test stored_state -- --ignored`.

use holdfast::config::{self, Command, Config};
use holdfast::server::command::{self, Limits};
use holdfast::server::msg::{Batch, ConnId};
use holdfast::server::sim::{Replayer, Sim};
use holdfast::server::Proto;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/stored_state.bin"
);
const MAGIC: &[u8] = b"holdfast stored-state fixture 1\n";

fn config() -> Config {
    let args = [
        "--memory",
        "1",
        "--max-item-size",
        "65536",
        "--orphan-timeout",
        "40",
        "--dlock-idle-timeout",
        "300",
    ];
    match config::parse(args) {
        Ok(Command::Run(c)) => c,
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Requests, by hand.

fn mc_bin(opcode: u8, extras: &[u8], key: &[u8], value: &[u8], opaque: u32, cas: u64) -> Vec<u8> {
    let mut v = vec![0x80, opcode];
    v.extend_from_slice(&(key.len() as u16).to_be_bytes());
    v.push(extras.len() as u8);
    v.extend_from_slice(&[0, 0, 0]);
    v.extend_from_slice(&((extras.len() + key.len() + value.len()) as u32).to_be_bytes());
    v.extend_from_slice(&opaque.to_be_bytes());
    v.extend_from_slice(&cas.to_be_bytes());
    v.extend_from_slice(extras);
    v.extend_from_slice(key);
    v.extend_from_slice(value);
    v
}

fn lockd(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = ((1u32 << 28) | (u32::from(opcode) << 20) | payload.len() as u32)
        .to_be_bytes()
        .to_vec();
    v.extend_from_slice(payload);
    v
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn field_varint(out: &mut Vec<u8>, field: u64, v: u64) {
    varint(out, field << 3);
    varint(out, v);
}

fn field_bytes(out: &mut Vec<u8>, field: u64, b: &[u8]) {
    varint(out, field << 3 | 2);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// A dlock Request frame: version, id, type, and a lock message with its wait, lease and keys.
fn dlock(
    version: u64,
    id: u64,
    req_type: u64,
    keys: &[&str],
    wait_us: Option<u64>,
    lease_us: Option<u64>,
) -> Vec<u8> {
    let mut body = Vec::new();
    field_varint(&mut body, 1, version);
    field_varint(&mut body, 2, id);
    field_varint(&mut body, 4, req_type);
    if !keys.is_empty() {
        let mut lock = Vec::new();
        if let Some(w) = wait_us {
            field_varint(&mut lock, 1, w);
        }
        if let Some(l) = lease_us {
            field_varint(&mut lock, 2, l);
        }
        for k in keys {
            field_bytes(&mut lock, 3, k.as_bytes());
        }
        field_bytes(&mut body, 51, &lock);
    }
    let mut v = (body.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(&body);
    v
}

fn counter(opcode: u8, opaque: u32, body: &[u8]) -> Vec<u8> {
    let mut v = vec![0x90, opcode, 0, 0];
    v.extend_from_slice(&(body.len() as u32).to_be_bytes());
    v.extend_from_slice(&opaque.to_be_bytes());
    v.extend_from_slice(body);
    v
}

fn counter_name(resources: Option<(u32, Option<u32>)>, name: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    if let Some((r, m)) = resources {
        v.extend_from_slice(&r.to_be_bytes());
        if let Some(m) = m {
            v.extend_from_slice(&m.to_be_bytes());
        }
    }
    v.extend_from_slice(&(name.len() as u16).to_be_bytes());
    v.extend_from_slice(name);
    v
}

// ---------------------------------------------------------------------------------------------
// The script.

/// What one run of the script wrote.
#[derive(Default, PartialEq, Eq)]
struct Run {
    /// Every reply byte, per connection (slot order), in the order the daemon wrote them.
    replies: Vec<Vec<u8>>,
    /// One command entry per owner turn, and its canonical effects.
    entries: Vec<Vec<u8>>,
    effects: Vec<Vec<u8>>,
    /// The snapshot after the first `midway` entries, and the final one.
    midway: usize,
    midway_snapshot: Vec<u8>,
    final_snapshot: Vec<u8>,
}

/// The sim, and every reply byte each connection got so far (taken after each step, so that
/// a connection's replies are kept when it closes).
struct Script {
    sim: Sim,
    conns: Vec<ConnId>,
    replies: Vec<Vec<u8>>,
}

impl Script {
    fn open(&mut self, p: Proto) -> ConnId {
        let c = self.sim.connect(p);
        self.conns.push(c);
        self.replies.push(Vec::new());
        c
    }

    fn collect(&mut self) {
        for (i, &c) in self.conns.iter().enumerate() {
            let out = self.sim.output(c);
            self.replies[i].extend_from_slice(&out);
        }
    }

    fn send(&mut self, c: ConnId, bytes: &[u8]) {
        self.sim.send(c, bytes);
        self.collect();
    }

    fn disconnect(&mut self, c: ConnId) {
        self.collect();
        self.sim.disconnect(c);
        self.collect();
    }

    fn advance_to(&mut self, ms: u64) {
        self.sim.advance_to(ms);
        self.collect();
    }
}

fn script() -> Run {
    let mut sim = Script {
        sim: Sim::new(config()),
        conns: Vec::new(),
        replies: Vec::new(),
    };
    sim.sim.record();
    let (m1, m2) = (sim.open(Proto::Memcache), sim.open(Proto::Memcache));
    let (l1, l2) = (sim.open(Proto::Lockd), sim.open(Proto::Lockd));
    let (d1, d2) = (sim.open(Proto::Dlock), sim.open(Proto::Dlock));
    let (c1, c2) = (sim.open(Proto::Counter), sim.open(Proto::Counter));

    // memcached text.
    sim.send(
        m1,
        b"set a 5 0 3\r\nabc\r\nset b 0 100 2\r\nxy\r\nadd a 0 0 1\r\nz\r\n",
    );
    sim.send(
        m1,
        b"get a b c\r\ngets a\r\nappend a 0 0 2\r\nde\r\nprepend b 0 0 1\r\nw\r\n",
    );
    sim.send(
        m1,
        b"replace c 0 0 1\r\nq\r\nincr n 1\r\nset n 0 0 2\r\n10\r\nincr n 5\r\n",
    );
    sim.send(
        m1,
        b"decr n 100\r\ntouch a 50\r\ngat 60 a b\r\ndelete b\r\ndelete b noreply\r\n",
    );
    sim.send(
        m1,
        b"cas a 0 0 1 999\r\nq\r\nlock a\r\nlock_token a\r\nbogus\r\n",
    );
    sim.send(
        m2,
        b"lock a\r\nunlock a\r\nset k1 0 0 1\r\n1\r\nset k2 0 0 1\r\n2\r\nkeys k\r\n",
    );
    sim.send(
        m2,
        b"keys\r\nstats settings\r\nstats nosuch\r\nverbosity 1\r\n",
    );
    // memcached binary.
    sim.send(m2, &mc_bin(0x01, &[], b"a", &[], 7, 0));
    sim.send(
        m2,
        &mc_bin(0x01, &[0, 0, 0, 9, 0, 0, 0, 0], b"bin", b"val", 8, 0),
    );
    sim.send(m2, &mc_bin(0x00, &[], b"bin", &[], 9, 0));
    sim.send(m2, &mc_bin(0x0c, &[], b"bin", &[], 10, 0));
    sim.send(m2, &mc_bin(0x09, &[], b"nosuch", &[], 11, 0));
    sim.send(m2, &mc_bin(0x0a, &[], &[], &[], 12, 0));
    let mut arith = Vec::new();
    arith.extend_from_slice(&3u64.to_be_bytes());
    arith.extend_from_slice(&40u64.to_be_bytes());
    arith.extend_from_slice(&0u32.to_be_bytes());
    sim.send(m2, &mc_bin(0x05, &arith, b"ctr", &[], 13, 0));
    sim.send(m2, &mc_bin(0x05, &arith, b"ctr", &[], 14, 0));
    sim.send(m2, &mc_bin(0x40, &[], b"bin", &[], 15, 0));
    sim.send(m1, &mc_bin(0x40, &[], b"bin", &[], 16, 0));
    sim.send(m2, &mc_bin(0x42, &[], b"bin", &[], 17, 0));
    sim.send(m2, &mc_bin(0x46, &[], b"bin", &[], 18, 0));
    sim.send(
        m2,
        &mc_bin(0x48, &[0, 0, 0, 1, 0, 0, 0, 0], b"bin", b"new", 19, 0),
    );
    sim.send(m2, &mc_bin(0x04, &[], b"bin", &[], 20, 0));
    sim.send(m2, &mc_bin(0x1c, &[0, 0, 0, 30], b"a", &[], 21, 0));
    sim.send(m2, &mc_bin(0x10, &[], b"settings", &[], 22, 0));
    sim.send(m2, &mc_bin(0x44, &[], &[], &[], 24, 0));
    sim.send(m2, &mc_bin(0x77, &[], b"x", &[], 25, 0));
    sim.send(m2, &mc_bin(0x01, &[], b"", &[], 26, 0));

    // The old lock daemon.
    sim.send(l1, &lockd(1, b"n1\0payload"));
    sim.send(l2, &lockd(1, b"n1\0other"));
    sim.send(l2, &lockd(3, b"n1\0"));
    sim.send(l2, &lockd(1, b"n2\0"));
    sim.send(l1, &lockd(7, b"n1\0"));
    sim.send(l1, &lockd(6, b""));
    sim.send(l1, &lockd(4, b"ping"));
    sim.send(l1, &lockd(9, b"n1\0"));
    sim.send(l1, &lockd(1, b""));
    sim.send(l1, &lockd(1, b"no-nul"));
    sim.send(l1, &lockd(2, b"n2\0"));
    sim.send(l1, &lockd(1, b"n3\0"));

    // dlock.
    sim.send(d1, &dlock(2, 1, 1, &[], None, None));
    sim.send(d1, &dlock(2, 2, 2, &["x", "y"], None, Some(5_000_000)));
    sim.send(d2, &dlock(2, 3, 2, &["y"], Some(0), None));
    sim.send(
        d2,
        &dlock(2, 4, 2, &["y", "z"], Some(2_000_000), Some(1_000_000)),
    );
    sim.send(d1, &dlock(7, 5, 1, &[], None, None));
    sim.send(d1, &dlock(2, 6, 9, &[], None, None));

    // Counters.
    sim.send(
        c1,
        &counter(0x02, 1, &counter_name(Some((2, Some(5))), b"cnt")),
    );
    sim.send(
        c2,
        &counter(0x02, 2, &counter_name(Some((4, Some(5))), b"cnt")),
    );
    sim.send(
        c2,
        &counter(0x02, 3, &counter_name(Some((3, Some(5))), b"cnt")),
    );
    sim.send(c2, &counter(0x01, 4, &counter_name(None, b"cnt")));
    sim.send(c2, &counter(0x00, 5, &[]));
    sim.send(
        c2,
        &counter(0x02, 6, &counter_name(Some((0, Some(5))), b"cnt")),
    );
    sim.send(c2, &counter(0x55, 7, &[]));
    sim.send(c1, &counter(0x11, 9, &[]));

    sim.advance_to(5);
    let midway = sim.sim.take_recording();
    let midway_snapshot = sim.sim.snapshot();
    sim.sim.record();

    // After the snapshot: releases, grants, orphans, timers, disconnects.
    sim.send(l1, &lockd(2, b"n1\0"));
    sim.disconnect(l1);
    sim.advance_to(20);
    sim.send(l2, &lockd(5, b"n3\0"));
    sim.send(l2, &lockd(6, b""));
    sim.send(d1, &dlock(2, 7, 3, &["x"], None, None));
    sim.advance_to(1_200);
    sim.send(d2, &dlock(2, 8, 3, &["y", "z"], None, None));
    sim.send(d2, &dlock(2, 9, 2, &["q"], Some(10_000_000), None));
    sim.send(d1, &dlock(2, 10, 2, &["q"], Some(10_000_000), None));
    sim.disconnect(d2);
    sim.send(
        c1,
        &counter(0x03, 10, &counter_name(Some((2, None)), b"cnt")),
    );
    sim.send(
        c1,
        &counter(0x03, 11, &counter_name(Some((2, None)), b"cnt")),
    );
    sim.disconnect(c2);
    sim.send(c1, &counter(0x11, 12, &[]));
    sim.send(m1, b"unlock_all\r\nflush_all\r\nget a\r\n");
    sim.send(m2, &mc_bin(0x40, &[], b"ctr", &[], 30, 0));
    sim.disconnect(m2);
    sim.advance_to(5_000);
    sim.send(m1, b"stats settings\r\n");
    sim.send(l2, &lockd(6, b""));

    let rest = sim.sim.take_recording();
    let mut run = Run {
        midway: midway.entries.len(),
        midway_snapshot,
        final_snapshot: sim.sim.snapshot(),
        ..Run::default()
    };
    run.entries = midway.entries;
    run.entries.extend(rest.entries);
    run.effects = midway.effects;
    run.effects.extend(rest.effects);
    sim.collect();
    run.replies = sim.replies;
    run
}

// ---------------------------------------------------------------------------------------------
// The fixture file: the magic, then length-prefixed lists of byte strings.

fn put(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_list(out: &mut Vec<u8>, l: &[Vec<u8>]) {
    out.extend_from_slice(&(l.len() as u64).to_le_bytes());
    for b in l {
        put(out, b);
    }
}

fn take<'a>(b: &mut &'a [u8]) -> &'a [u8] {
    let (n, rest) = b.split_at(8);
    let n = u64::from_le_bytes(n.try_into().unwrap()) as usize;
    let (x, rest) = rest.split_at(n);
    *b = rest;
    x
}

fn take_list(b: &mut &[u8]) -> Vec<Vec<u8>> {
    let (n, rest) = b.split_at(8);
    *b = rest;
    (0..u64::from_le_bytes(n.try_into().unwrap()))
        .map(|_| take(b).to_vec())
        .collect()
}

fn write(run: &Run) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    put_list(&mut out, &run.replies);
    put_list(&mut out, &run.entries);
    put_list(&mut out, &run.effects);
    put(&mut out, &(run.midway as u64).to_le_bytes());
    put(&mut out, &run.midway_snapshot);
    put(&mut out, &run.final_snapshot);
    out
}

fn read(bytes: &[u8]) -> Run {
    let mut b = bytes.strip_prefix(MAGIC).expect("fixture magic");
    let replies = take_list(&mut b);
    let entries = take_list(&mut b);
    let effects = take_list(&mut b);
    let midway = u64::from_le_bytes(take(&mut b).try_into().unwrap()) as usize;
    let midway_snapshot = take(&mut b).to_vec();
    let final_snapshot = take(&mut b).to_vec();
    assert!(b.is_empty(), "bytes after the fixture");
    Run {
        replies,
        entries,
        effects,
        midway,
        midway_snapshot,
        final_snapshot,
    }
}

fn stored() -> Run {
    read(&std::fs::read(FIXTURE).expect("the fixture (see this file's header to write it)"))
}

#[test]
#[ignore]
fn write_fixture() {
    if std::env::var_os("HOLDFAST_WRITE_FIXTURE").is_none() {
        return;
    }
    std::fs::write(FIXTURE, write(&script())).unwrap();
}

#[test]
fn the_stored_snapshot_restores_and_the_stored_log_replays_to_the_same_effects_and_state() {
    let run = stored();
    assert!(run.midway > 0 && run.midway < run.entries.len());
    let mut r = Replayer::new(config());
    r.restore(&run.midway_snapshot)
        .expect("the stored snapshot loads");
    assert!(r.snapshot() == run.midway_snapshot, "restored snapshot");
    for (i, entry) in run.entries.iter().enumerate().skip(run.midway) {
        let got = r.apply(entry).expect("a stored entry decodes");
        assert!(got == run.effects[i], "effects of stored entry {i}");
    }
    assert!(r.snapshot() == run.final_snapshot, "final state");
}

#[test]
fn the_stored_log_replays_from_the_start_to_the_stored_snapshots() {
    let run = stored();
    let mut r = Replayer::new(config());
    for (i, entry) in run.entries.iter().enumerate() {
        if i == run.midway {
            assert!(r.snapshot() == run.midway_snapshot, "midway state");
        }
        let got = r.apply(entry).expect("a stored entry decodes");
        assert!(got == run.effects[i], "effects of stored entry {i}");
    }
    assert!(r.snapshot() == run.final_snapshot, "final state");
}

#[test]
fn stored_entries_decode_and_encode_back_to_the_same_bytes() {
    let run = stored();
    let mut batch = Batch::default();
    for (i, entry) in run.entries.iter().enumerate() {
        let now = command::decode_entry(entry, Limits::default(), &mut batch).expect("decodes");
        let mut again = Vec::new();
        command::encode_entry(now, &batch.ops, &batch.arena.bytes, &mut again);
        assert!(again == *entry, "entry {i} encodes back to other bytes");
    }
}

#[test]
fn the_script_writes_the_stored_replies_entries_and_snapshots() {
    let (now, run) = (script(), stored());
    assert_eq!(now.replies.len(), run.replies.len());
    for (i, (a, b)) in now.replies.iter().zip(&run.replies).enumerate() {
        assert!(a == b, "replies of connection {i}: {a:?} against {b:?}");
    }
    assert_eq!(now.entries.len(), run.entries.len());
    for i in 0..run.entries.len() {
        assert!(now.entries[i] == run.entries[i], "entry {i}");
        assert!(now.effects[i] == run.effects[i], "effects of entry {i}");
    }
    assert!(now.midway == run.midway, "midway");
    assert!(
        now.midway_snapshot == run.midway_snapshot,
        "midway snapshot"
    );
    assert!(now.final_snapshot == run.final_snapshot, "final snapshot");
}
