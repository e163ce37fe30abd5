//! memcached text + binary with yrmcds locks, over TCP against the real daemon (port 0).
//!
//! Every test talks raw bytes and asserts exact replies; waits are bounded by deadlines (the
//! harness's `Client` reads to a byte count or panics after `DEADLINE`; time-based checks poll
//! with their own deadline).

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::mcbin::{call, read as read_resp, request as req, Resp};
use common::{Client, Daemon, DEADLINE};

// ---------------------------------------------------------------------------------------------
// Binary protocol helpers

const GET: u8 = 0x00;
const SET: u8 = 0x01;
const ADD: u8 = 0x02;
const REPLACE: u8 = 0x03;
const DELETE: u8 = 0x04;
const INCREMENT: u8 = 0x05;
const DECREMENT: u8 = 0x06;
const NOOP: u8 = 0x0a;
const GETQ: u8 = 0x09;
const GETK: u8 = 0x0c;
const GETKQ: u8 = 0x0d;
const APPEND: u8 = 0x0e;
const PREPEND: u8 = 0x0f;
const STAT: u8 = 0x10;
const SETQ: u8 = 0x11;
const DELETEQ: u8 = 0x14;
const INCREMENTQ: u8 = 0x15;
const TOUCH: u8 = 0x1c;
const GAT: u8 = 0x1d;
const LOCK: u8 = 0x40;
const LOCKQ: u8 = 0x41;
const UNLOCK: u8 = 0x42;
const UNLOCKQ: u8 = 0x43;
const UNLOCK_ALL: u8 = 0x44;
const UNLOCK_ALLQ: u8 = 0x45;
const LAG: u8 = 0x46;
const LAGQ: u8 = 0x47;
const LAGK: u8 = 0x48;
const LAGKQ: u8 = 0x49;
const RAU: u8 = 0x4a;
const RAUQ: u8 = 0x4b;

const OK: u16 = 0x0000;
const NOT_FOUND: u16 = 0x0001;
const EXISTS: u16 = 0x0002;
const TOO_LARGE: u16 = 0x0003;
const NOT_STORED: u16 = 0x0005;
const LOCKED: u16 = 0x0010;
const NOT_LOCKED: u16 = 0x0011;

/// A request with only a key (Get, Delete, Lock, ...).
fn keyed(opcode: u8, key: &[u8]) -> Vec<u8> {
    req(opcode, &[], key, &[], 0, 0)
}

fn set_extras(flags: u32, exptime: u32) -> Vec<u8> {
    let mut v = flags.to_be_bytes().to_vec();
    v.extend_from_slice(&exptime.to_be_bytes());
    v
}

fn arith_extras(delta: u64, initial: u64, exptime: u32) -> Vec<u8> {
    let mut v = delta.to_be_bytes().to_vec();
    v.extend_from_slice(&initial.to_be_bytes());
    v.extend_from_slice(&exptime.to_be_bytes());
    v
}

impl Resp {
    /// An error response as holdfast words it (no cas, no extras, a text body).
    fn err(opcode: u8, status: u16, opaque: u32) -> Resp {
        let text: &[u8] = match status {
            NOT_FOUND => b"Not found",
            EXISTS => b"Data exists for key.",
            TOO_LARGE => b"Too large.",
            NOT_STORED => b"Not stored.",
            LOCKED => b"Locked",
            NOT_LOCKED => b"Not locked",
            _ => b"",
        };
        Resp {
            opcode,
            status,
            opaque,
            cas: 0,
            extras: vec![],
            key: vec![],
            value: text.to_vec(),
        }
    }

    /// A bare success (no cas, no body): NOOP, Lock, Unlock, Delete, ...
    fn ok(opcode: u8) -> Resp {
        Resp {
            opcode,
            status: OK,
            opaque: 0,
            cas: 0,
            extras: vec![],
            key: vec![],
            value: vec![],
        }
    }
}

/// Send a request and expect exactly this error response.
fn expect_err(c: &mut Client, frame: &[u8], status: u16) {
    let opcode = frame[1];
    let opaque = u32::from_be_bytes(frame[12..16].try_into().unwrap());
    assert_eq!(call(c, frame), Resp::err(opcode, status, opaque));
}

/// Send a request and expect a bare success.
fn expect_ok(c: &mut Client, frame: &[u8]) {
    assert_eq!(call(c, frame), Resp::ok(frame[1]));
}

/// A binary Lock that must succeed: its reply is a bare success whose CAS field carries the
/// lock's fencing token (`docs/protocol.md`, "Fencing tokens"), the same one `lock_token` reports.
fn expect_lock_token(c: &mut Client, key: &[u8]) -> u64 {
    let r = call(c, &keyed(LOCK, key));
    assert_eq!(
        (r.status, &r.value[..], &r.key[..]),
        (OK, &b""[..], &b""[..]),
        "{r:?}"
    );
    assert!(r.cas > 0, "a Lock reply carries its fencing token: {r:?}");
    let mut line = b"lock_token ".to_vec();
    line.extend_from_slice(key);
    line.extend_from_slice(b"\r\n");
    c.send(&line);
    assert_eq!(
        c.line(),
        format!("TOKEN {}\r\n", r.cas),
        "lock_token names the token of the binary Lock"
    );
    r.cas
}

/// A store that must succeed: returns the new CAS (never 0).
fn bin_store(c: &mut Client, opcode: u8, key: &[u8], value: &[u8], flags: u32) -> u64 {
    let r = call(c, &req(opcode, &set_extras(flags, 0), key, value, 0, 0));
    assert_eq!((r.status, &r.value[..]), (OK, &b""[..]), "{r:?}");
    assert!(r.cas != 0);
    r.cas
}

/// Quiet requests, then a NOOP: everything before the NOOP's answer is what the quiet requests
/// said. Returns those responses.
fn quiet_then_noop(c: &mut Client, frames: &[Vec<u8>]) -> Vec<Resp> {
    let mut all = frames.concat();
    all.extend_from_slice(&req(NOOP, &[], &[], &[], 0xfe11ce, 0));
    c.send(&all);
    let mut got = Vec::new();
    loop {
        let r = read_resp(c);
        if r.opcode == NOOP {
            assert_eq!(r.opaque, 0xfe11ce);
            return got;
        }
        got.push(r);
    }
}

/// A found item as Get answers it.
fn hit(opcode: u8, flags: u32, key: &[u8], value: &[u8], cas: u64) -> Resp {
    Resp {
        opcode,
        status: OK,
        opaque: 0,
        cas,
        extras: flags.to_be_bytes().to_vec(),
        key: key.to_vec(),
        value: value.to_vec(),
    }
}

// ---------------------------------------------------------------------------------------------
// Text helpers

fn mc() -> Daemon {
    Daemon::start(&["--lockd", "off", "--dlock", "off"])
}

fn set(c: &mut Client, key: &str, value: &str) {
    let req = format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
    c.expect(req.as_bytes(), b"STORED\r\n");
}

fn get_line(c: &mut Client, key: &str) -> String {
    c.send(format!("get {key}\r\n").as_bytes());
    let mut out = String::new();
    loop {
        let line = c.line();
        out.push_str(&line);
        if line == "END\r\n" {
            return out;
        }
    }
}

fn value(key: &str, flags: u32, data: &str) -> String {
    format!("VALUE {key} {flags} {}\r\n{data}\r\nEND\r\n", data.len())
}

/// `gets` the CAS unique of one key.
fn gets_cas(c: &mut Client, key: &str) -> u64 {
    c.send(format!("gets {key}\r\n").as_bytes());
    let line = c.line();
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words[0], "VALUE", "{line}");
    let len: usize = words[3].parse().unwrap();
    let cas = words[4].parse().unwrap();
    c.take(len + 2);
    assert_eq!(c.line(), "END\r\n");
    cas
}

fn stats(c: &mut Client) -> HashMap<String, String> {
    c.send(b"stats\r\n");
    let mut map = HashMap::new();
    loop {
        let line = c.line();
        if line == "END\r\n" {
            return map;
        }
        let mut w = line.trim_end().splitn(3, ' ');
        assert_eq!(w.next(), Some("STAT"), "{line}");
        map.insert(
            w.next().unwrap().to_string(),
            w.next().unwrap_or("").to_string(),
        );
    }
}

fn stat(c: &mut Client, name: &str) -> u64 {
    stats(c)[name].parse().unwrap()
}

/// Poll `check` every 50 ms until it is true; panic after `limit`.
fn wait_until(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

// ---------------------------------------------------------------------------------------------
// Locks: acquisition

#[test]
fn lock_answers_ok_then_locked_for_everyone_including_the_holder() {
    let d = mc();
    let (mut a, mut b) = (d.memcache(), d.memcache());
    set(&mut a, "k", "v");
    a.expect(b"lock k\r\n", b"OK\r\n");
    a.expect(b"lock k\r\n", b"LOCKED\r\n"); // not re-entrant
    b.expect(b"lock k\r\n", b"LOCKED\r\n");
    b.expect(b"lock missing\r\n", b"NOT_FOUND\r\n");
    // Binary: the same rules.
    expect_err(&mut a, &keyed(LOCK, b"k"), LOCKED);
    expect_err(&mut b, &keyed(LOCK, b"k"), LOCKED);
    expect_err(&mut b, &keyed(LOCK, b"missing"), NOT_FOUND);
    set(&mut b, "k2", "v");
    expect_lock_token(&mut b, b"k2");
    a.expect(b"lock k2\r\n", b"LOCKED\r\n");
}

#[test]
fn one_of_many_connections_racing_for_a_lock_wins() {
    let d = mc();
    let mut first = d.memcache();
    set(&mut first, "race", "v");
    let mut clients: Vec<Client> = (0..16).map(|_| d.memcache()).collect();
    for c in &mut clients {
        c.send(b"lock race\r\n");
    }
    let replies: Vec<String> = clients.iter_mut().map(|c| c.line()).collect();
    assert_eq!(
        replies.iter().filter(|r| *r == "OK\r\n").count(),
        1,
        "{replies:?}"
    );
    assert_eq!(
        replies.iter().filter(|r| *r == "LOCKED\r\n").count(),
        15,
        "{replies:?}"
    );
    // Only the winner can unlock.
    for (c, r) in clients.iter_mut().zip(&replies) {
        if r == "OK\r\n" {
            c.expect(b"unlock race\r\n", b"OK\r\n");
        } else {
            c.expect(
                b"unlock race\r\n",
                b"CLIENT_ERROR object is not locked or not found\r\n",
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Locks: what others may and may not do

#[test]
fn text_writes_by_others_answer_locked_and_change_nothing() {
    let d = mc();
    let (mut a, mut b) = (d.memcache(), d.memcache());
    set(&mut a, "k", "5");
    let cas = gets_cas(&mut a, "k");
    a.expect(b"lock k\r\n", b"OK\r\n");
    for (request, what) in [
        ("set k 0 0 1\r\nx\r\n".to_string(), "set"),
        ("add k 0 0 1\r\nx\r\n".to_string(), "add"),
        ("replace k 0 0 1\r\nx\r\n".to_string(), "replace"),
        ("append k 0 0 1\r\nx\r\n".to_string(), "append"),
        ("prepend k 0 0 1\r\nx\r\n".to_string(), "prepend"),
        (format!("cas k 0 0 1 {cas}\r\nx\r\n"), "cas"),
        ("delete k\r\n".to_string(), "delete"),
        ("incr k 1\r\n".to_string(), "incr"),
        ("decr k 1\r\n".to_string(), "decr"),
    ] {
        b.send(request.as_bytes());
        assert_eq!(b.line(), "LOCKED\r\n", "{what}");
    }
    assert_eq!(get_line(&mut b, "k"), value("k", 0, "5"));
    assert_eq!(
        gets_cas(&mut b, "k"),
        cas,
        "a refused write leaves the CAS alone"
    );
    // noreply: the LOCKED is silent, the item still unchanged.
    b.expect(
        b"set k 0 0 1 noreply\r\nx\r\nincr k 1 noreply\r\ndelete k noreply\r\nversion\r\n",
        common_version(),
    );
    assert_eq!(get_line(&mut a, "k"), value("k", 0, "5"));
}

fn common_version() -> &'static [u8] {
    holdfast::server::VERSION_REPLY
}

#[test]
fn binary_writes_by_others_answer_0x0010_and_change_nothing() {
    let d = mc();
    let (mut a, mut b) = (d.memcache(), d.memcache());
    let cas = bin_store(&mut a, SET, b"k", b"5", 3);
    expect_lock_token(&mut a, b"k");
    let x = set_extras(0, 0);
    for frame in [
        req(SET, &x, b"k", b"x", 1, 0),
        req(SET, &x, b"k", b"x", 2, cas),
        req(ADD, &x, b"k", b"x", 3, 0),
        req(REPLACE, &x, b"k", b"x", 4, 0),
        req(APPEND, &[], b"k", b"x", 5, 0),
        req(PREPEND, &[], b"k", b"x", 6, 0),
        req(DELETE, &[], b"k", &[], 7, 0),
        req(INCREMENT, &arith_extras(1, 0, 0), b"k", &[], 8, 0),
        req(DECREMENT, &arith_extras(1, 0, 0), b"k", &[], 9, 0),
        // Quiet variants answer the error too.
        req(SETQ, &x, b"k", b"x", 10, 0),
        req(DELETEQ, &[], b"k", &[], 11, 0),
        req(INCREMENTQ, &arith_extras(1, 0, 0), b"k", &[], 12, 0),
    ] {
        expect_err(&mut b, &frame, LOCKED);
    }
    assert_eq!(call(&mut b, &keyed(GET, b"k")), hit(GET, 3, b"", b"5", cas));
}

#[test]
fn others_may_get_gets_touch_and_gat_a_locked_item() {
    let d = mc();
    let (mut a, mut b) = (d.memcache(), d.memcache());
    let cas = bin_store(&mut a, SET, b"k", b"val", 9);
    a.expect(b"lock k\r\n", b"OK\r\n");
    assert_eq!(get_line(&mut b, "k"), value("k", 9, "val"));
    b.expect(
        b"gets k\r\n",
        format!("VALUE k 9 3 {cas}\r\nval\r\nEND\r\n").as_bytes(),
    );
    b.expect(b"touch k 100\r\n", b"TOUCHED\r\n");
    b.expect(b"gat 100 k\r\n", b"VALUE k 9 3\r\nval\r\nEND\r\n");
    b.expect(
        b"gats 100 k\r\n",
        format!("VALUE k 9 3 {cas}\r\nval\r\nEND\r\n").as_bytes(),
    );
    assert_eq!(
        call(&mut b, &keyed(GET, b"k")),
        hit(GET, 9, b"", b"val", cas)
    );
    assert_eq!(
        call(&mut b, &keyed(GETK, b"k")),
        hit(GETK, 9, b"k", b"val", cas)
    );
    expect_ok(&mut b, &req(TOUCH, &100u32.to_be_bytes(), b"k", &[], 0, 0));
    assert_eq!(
        call(&mut b, &req(GAT, &100u32.to_be_bytes(), b"k", &[], 0, 0)),
        hit(GAT, 9, b"", b"val", cas)
    );
    // Still locked by a.
    b.expect(b"lock k\r\n", b"LOCKED\r\n");
}

#[test]
fn the_holder_may_modify_and_deleting_drops_the_lock() {
    let d = mc();
    let (mut a, mut b) = (d.memcache(), d.memcache());
    set(&mut a, "k", "1");
    a.expect(b"lock k\r\n", b"OK\r\n");
    a.expect(b"set k 0 0 2\r\n10\r\n", b"STORED\r\n");
    a.expect(b"incr k 5\r\n", b"15\r\n");
    a.expect(b"decr k 1\r\n", b"14\r\n");
    a.expect(b"append k 0 0 1\r\n0\r\n", b"STORED\r\n");
    a.expect(b"prepend k 0 0 1\r\n1\r\n", b"STORED\r\n");
    a.expect(b"replace k 7 0 3\r\nabc\r\n", b"STORED\r\n");
    let cas = gets_cas(&mut a, "k");
    a.expect(
        format!("cas k 8 0 3 {cas}\r\nxyz\r\n").as_bytes(),
        b"STORED\r\n",
    );
    a.expect(b"add k 0 0 1\r\nq\r\n", b"NOT_STORED\r\n");
    // Binary writes by the holder too.
    bin_store(&mut a, SET, b"k", b"bin", 8);
    assert_eq!(get_line(&mut b, "k"), value("k", 8, "bin"));
    // Still locked after every write.
    b.expect(b"lock k\r\n", b"LOCKED\r\n");
    // Deleting drops the lock: the key can be re-created and locked by another.
    a.expect(b"delete k\r\n", b"DELETED\r\n");
    a.expect(
        b"unlock k\r\n",
        b"CLIENT_ERROR object is not locked or not found\r\n",
    );
    set(&mut b, "k", "new");
    b.expect(b"lock k\r\n", b"OK\r\n");
    a.expect(b"set k 0 0 1\r\nx\r\n", b"LOCKED\r\n");
}

// ---------------------------------------------------------------------------------------------
// Locks: release

#[test]
fn unlock_errors_text_one_message_binary_missing_vs_not_held() {
    let d = mc();
    let (mut a, mut b) = (d.memcache(), d.memcache());
    set(&mut a, "k", "v");
    set(&mut a, "free", "v");
    a.expect(b"lock k\r\n", b"OK\r\n");
    let msg: &[u8] = b"CLIENT_ERROR object is not locked or not found\r\n";
    b.expect(b"unlock missing\r\n", msg);
    b.expect(b"unlock free\r\n", msg);
    b.expect(b"unlock k\r\n", msg);
    expect_err(&mut b, &keyed(UNLOCK, b"missing"), NOT_FOUND);
    expect_err(&mut b, &keyed(UNLOCK, b"free"), NOT_LOCKED);
    expect_err(&mut b, &keyed(UNLOCK, b"k"), NOT_LOCKED);
    // The holder's unlock works once.
    a.expect(b"unlock k\r\n", b"OK\r\n");
    a.expect(b"unlock k\r\n", msg);
    expect_lock_token(&mut b, b"k");
    expect_ok(&mut b, &keyed(UNLOCK, b"k"));
    expect_err(&mut b, &keyed(UNLOCK, b"k"), NOT_LOCKED);
}

#[test]
fn unlock_all_releases_only_the_callers_locks() {
    let d = mc();
    let (mut a, mut b, mut c) = (d.memcache(), d.memcache(), d.memcache());
    for k in ["a1", "a2", "b1"] {
        set(&mut a, k, "v");
    }
    a.expect(b"lock a1\r\nlock a2\r\n", b"OK\r\nOK\r\n");
    b.expect(b"lock b1\r\n", b"OK\r\n");
    c.expect(b"unlock_all\r\n", b"OK\r\n"); // holds nothing: still OK
    c.expect(b"lock a1\r\nlock b1\r\n", b"LOCKED\r\nLOCKED\r\n");
    a.expect(b"unlock_all\r\n", b"OK\r\n");
    c.expect(
        b"lock a1\r\nlock a2\r\nlock b1\r\n",
        b"OK\r\nOK\r\nLOCKED\r\n",
    );
    // Binary UnlockAll: c's locks go, b's stay.
    expect_ok(&mut c, &req(UNLOCK_ALL, &[], &[], &[], 0, 0));
    a.expect(b"lock a1\r\nlock b1\r\n", b"OK\r\nLOCKED\r\n");
    assert_eq!(stat(&mut c, "locks_held"), 2);
}

#[test]
fn quiet_lock_commands_are_silent_on_success_and_answer_errors() {
    let d = mc();
    let (mut a, mut b) = (d.memcache(), d.memcache());
    for k in ["k1", "k2", "k3"] {
        set(&mut a, k, "v");
    }
    // Successes: nothing before the NOOP.
    let got = quiet_then_noop(
        &mut a,
        &[
            keyed(LOCKQ, b"k1"),
            keyed(LOCKQ, b"k2"),
            keyed(UNLOCKQ, b"k2"),
            req(UNLOCK_ALLQ, &[], &[], &[], 0, 0),
            keyed(LOCKQ, b"k3"),
        ],
    );
    assert_eq!(got, vec![]);
    b.expect(b"lock k1\r\nlock k3\r\n", b"OK\r\nLOCKED\r\n");
    // Errors are answered, in order, before the NOOP.
    let got = quiet_then_noop(
        &mut a,
        &[
            req(LOCKQ, &[], b"k1", &[], 1, 0),
            req(LOCKQ, &[], b"missing", &[], 2, 0),
            req(UNLOCKQ, &[], b"k1", &[], 3, 0),
            req(UNLOCKQ, &[], b"missing", &[], 4, 0),
            req(RAUQ, &set_extras(0, 0), b"k1", b"x", 5, 0),
        ],
    );
    assert_eq!(
        got,
        vec![
            Resp::err(LOCKQ, LOCKED, 1),
            Resp::err(LOCKQ, NOT_FOUND, 2),
            Resp::err(UNLOCKQ, NOT_LOCKED, 3),
            Resp::err(UNLOCKQ, NOT_FOUND, 4),
            Resp::err(RAUQ, NOT_LOCKED, 5),
        ]
    );
    // RaUQ by the holder: silent, and the value is replaced and the lock released.
    let got = quiet_then_noop(&mut a, &[req(RAUQ, &set_extras(4, 0), b"k3", b"new", 6, 0)]);
    assert_eq!(got, vec![]);
    assert_eq!(get_line(&mut b, "k3"), value("k3", 4, "new"));
    b.expect(b"lock k3\r\n", b"OK\r\n");
}

// ---------------------------------------------------------------------------------------------
// Lock and get, replace and unlock

#[test]
fn lag_and_lagk_lock_and_answer_like_get_and_getk() {
    let d = mc();
    let (mut a, mut b) = (d.memcache(), d.memcache());
    let cas = bin_store(&mut a, SET, b"k", b"val", 5);
    bin_store(&mut a, SET, b"k2", b"v2", 6);
    assert_eq!(
        call(&mut a, &keyed(LAG, b"k")),
        hit(LAG, 5, b"", b"val", cas)
    );
    b.expect(b"lock k\r\n", b"LOCKED\r\n");
    expect_err(&mut b, &keyed(LAG, b"k"), LOCKED);
    expect_err(&mut a, &keyed(LAG, b"k"), LOCKED); // not re-entrant
    let r = call(&mut b, &keyed(LAGK, b"k2"));
    assert_eq!(r, hit(LAGK, 6, b"k2", b"v2", r.cas));
    a.expect(b"lock k2\r\n", b"LOCKED\r\n");
    expect_err(&mut b, &keyed(LAGK, b"k"), LOCKED);
    // A miss: LaG answers "not found"; LaGK as GetK does, with the key.
    expect_err(&mut b, &keyed(LAG, b"none"), NOT_FOUND);
    let mut miss = Resp::err(LAGK, NOT_FOUND, 0);
    miss.key = b"none".to_vec();
    assert_eq!(call(&mut b, &keyed(LAGK, b"none")), miss);
}

#[test]
fn lagq_and_lagkq_are_silent_on_a_miss_and_answer_hits_and_locked() {
    let d = mc();
    let (mut a, mut b) = (d.memcache(), d.memcache());
    let c1 = bin_store(&mut a, SET, b"k1", b"one", 1);
    let c2 = bin_store(&mut a, SET, b"k2", b"two", 2);
    let got = quiet_then_noop(
        &mut a,
        &[
            keyed(LAGQ, b"none"),
            keyed(LAGKQ, b"none"),
            keyed(LAGQ, b"k1"),
            keyed(LAGKQ, b"k2"),
        ],
    );
    assert_eq!(
        got,
        vec![
            hit(LAGQ, 1, b"", b"one", c1),
            hit(LAGKQ, 2, b"k2", b"two", c2)
        ]
    );
    let got = quiet_then_noop(
        &mut b,
        &[
            req(LAGQ, &[], b"k1", &[], 7, 0),
            req(LAGKQ, &[], b"k2", &[], 8, 0),
        ],
    );
    assert_eq!(
        got,
        vec![Resp::err(LAGQ, LOCKED, 7), Resp::err(LAGKQ, LOCKED, 8)]
    );
}

#[test]
fn rau_by_the_holder_replaces_and_unlocks() {
    let d = mc();
    let (mut a, mut b) = (d.memcache(), d.memcache());
    bin_store(&mut a, SET, b"k", b"old", 1);
    expect_lock_token(&mut a, b"k");
    let r = call(&mut a, &req(RAU, &set_extras(7, 0), b"k", b"new", 42, 0));
    assert!(r.cas != 0);
    assert_eq!(
        r,
        Resp {
            opaque: 42,
            cas: r.cas,
            ..Resp::ok(RAU)
        }
    );
    assert_eq!(
        call(&mut b, &keyed(GET, b"k")),
        hit(GET, 7, b"", b"new", r.cas)
    );
    // Released: b may lock it now, and a's RaU is then refused.
    expect_lock_token(&mut b, b"k");
    expect_err(
        &mut a,
        &req(RAU, &set_extras(0, 0), b"k", b"x", 1, 0),
        NOT_LOCKED,
    );
}

#[test]
fn rau_by_others_is_not_locked_and_a_cas_mismatch_is_exists() {
    let d = mc();
    let (mut a, mut b) = (d.memcache(), d.memcache());
    let cas = bin_store(&mut a, SET, b"k", b"old", 1);
    bin_store(&mut a, SET, b"free", b"v", 1);
    expect_lock_token(&mut a, b"k");
    let x = set_extras(0, 0);
    expect_err(&mut b, &req(RAU, &x, b"k", b"x", 1, 0), NOT_LOCKED);
    expect_err(&mut b, &req(RAU, &x, b"free", b"x", 2, 0), NOT_LOCKED);
    expect_err(&mut b, &req(RAU, &x, b"missing", b"x", 3, 0), NOT_FOUND);
    expect_err(&mut a, &req(RAU, &x, b"k", b"x", 4, cas + 1000), EXISTS);
    // The mismatch changed nothing: still a's lock, still the old value.
    b.expect(b"lock k\r\n", b"LOCKED\r\n");
    assert_eq!(get_line(&mut b, "k"), value("k", 1, "old"));
    // The right CAS works.
    let r = call(&mut a, &req(RAU, &x, b"k", b"x", 5, cas));
    assert_eq!((r.status, r.opaque), (OK, 5));
    b.expect(b"lock k\r\n", b"OK\r\n");
}

// ---------------------------------------------------------------------------------------------
// Locked items: expiry, flush, eviction, disconnect

#[test]
fn a_locked_item_outlives_its_expiry_and_goes_when_unlocked() {
    let d = mc();
    let (mut a, mut b) = (d.memcache(), d.memcache());
    a.expect(
        b"set locked 0 1 1\r\nL\r\nset free 0 1 1\r\nF\r\n",
        b"STORED\r\nSTORED\r\n",
    );
    a.expect(b"lock locked\r\n", b"OK\r\n");
    // The unlocked twin expiring proves the time has passed.
    wait_until(DEADLINE, "the unlocked twin expires", || {
        get_line(&mut b, "free") == "END\r\n"
    });
    assert_eq!(get_line(&mut b, "locked"), value("locked", 0, "L"));
    a.expect(b"unlock locked\r\n", b"OK\r\n");
    assert_eq!(get_line(&mut b, "locked"), "END\r\n");
}

#[test]
fn lag_with_an_expiry_extra_sets_a_new_expiration() {
    let d = mc();
    let (mut a, mut b) = (d.memcache(), d.memcache());
    bin_store(&mut a, SET, b"k", b"v", 0); // never expires
    bin_store(&mut a, SET, b"twin", b"v", 0);
    let r = call(&mut a, &req(LAG, &1u32.to_be_bytes(), b"k", &[], 0, 0));
    assert_eq!((r.status, &r.value[..]), (OK, &b"v"[..]));
    b.expect(b"touch twin 1\r\n", b"TOUCHED\r\n");
    wait_until(DEADLINE, "the twin expires", || {
        get_line(&mut b, "twin") == "END\r\n"
    });
    assert_eq!(
        get_line(&mut b, "k"),
        value("k", 0, "v"),
        "locked: still there"
    );
    expect_ok(&mut a, &keyed(UNLOCK, b"k"));
    assert_eq!(
        get_line(&mut b, "k"),
        "END\r\n",
        "its new expiry had passed"
    );
}

#[test]
fn a_locked_item_survives_flush_all() {
    let d = mc();
    let (mut a, mut b) = (d.memcache(), d.memcache());
    set(&mut a, "locked", "L");
    set(&mut a, "free", "F");
    a.expect(b"lock locked\r\n", b"OK\r\n");
    b.expect(b"flush_all\r\n", b"OK\r\n");
    assert_eq!(get_line(&mut b, "free"), "END\r\n");
    assert_eq!(get_line(&mut b, "locked"), value("locked", 0, "L"));
    b.expect(b"set locked 0 0 1\r\nx\r\n", b"LOCKED\r\n");
    // Binary flush too.
    expect_ok(&mut b, &req(0x08, &[], &[], &[], 0, 0));
    assert_eq!(get_line(&mut b, "locked"), value("locked", 0, "L"));
    // It survived the flush for good: still there after the unlock.
    a.expect(b"unlock locked\r\n", b"OK\r\n");
    assert_eq!(get_line(&mut b, "locked"), value("locked", 0, "L"));
}

#[test]
fn a_locked_item_survives_memory_pressure() {
    let d = Daemon::start(&["--lockd", "off", "--dlock", "off", "--memory", "1"]);
    let mut a = d.memcache();
    let big = "x".repeat(8000);
    a.expect(
        format!("set locked 0 0 {}\r\n{big}\r\n", big.len()).as_bytes(),
        b"STORED\r\n",
    );
    a.expect(b"lock locked\r\n", b"OK\r\n");
    // 400 items of 8 KB: three times the 1 MiB limit.
    let mut b = d.memcache();
    for chunk in 0..8 {
        let mut batch = Vec::new();
        for i in 0..50 {
            let n = chunk * 50 + i;
            batch.extend_from_slice(
                format!("set fill{n} 0 0 {}\r\n{big}\r\n", big.len()).as_bytes(),
            );
        }
        b.expect(&batch, "STORED\r\n".repeat(50).as_bytes());
    }
    assert!(stat(&mut b, "evictions") > 0, "the fill must have evicted");
    assert!(stat(&mut b, "bytes") <= 1024 * 1024);
    assert_eq!(
        get_line(&mut b, "fill0"),
        "END\r\n",
        "the oldest unlocked item went"
    );
    assert_eq!(get_line(&mut b, "fill399"), value("fill399", 0, &big));
    assert_eq!(get_line(&mut b, "locked"), value("locked", 0, &big));
    // And it outlives the pressure once unlocked (it is then the most recently used).
    a.expect(b"unlock locked\r\n", b"OK\r\n");
    assert_eq!(get_line(&mut b, "locked"), value("locked", 0, &big));
}

#[test]
fn locked_items_are_never_evicted_even_when_they_fill_the_memory() {
    let d = Daemon::start(&["--lockd", "off", "--dlock", "off", "--memory", "1"]);
    let mut a = d.memcache();
    let big = "x".repeat(8000);
    // About 1 MiB of locked items.
    let mut n = 0;
    loop {
        a.send(format!("set l{n} 0 0 {}\r\n{big}\r\n", big.len()).as_bytes());
        let line = a.line();
        if line != "STORED\r\n" {
            assert_eq!(line, "SERVER_ERROR out of memory storing object\r\n");
            break;
        }
        a.expect(format!("lock l{n}\r\n").as_bytes(), b"OK\r\n");
        n += 1;
        assert!(n < 200, "1 MiB cannot hold 200 items of 8000 bytes");
    }
    assert!(n > 100, "only {n} items fit");
    assert_eq!(stat(&mut a, "evictions"), 0);
    let mut b = d.memcache();
    let set_big = format!("set other 0 0 {}\r\n{big}\r\n", big.len());
    b.expect(
        set_big.as_bytes(),
        b"SERVER_ERROR out of memory storing object\r\n",
    );
    for i in 0..n {
        assert_eq!(
            get_line(&mut b, &format!("l{i}")),
            value(&format!("l{i}"), 0, &big)
        );
    }
    // Unlocking gives the room back to eviction.
    a.expect(b"unlock l0\r\n", b"OK\r\n");
    b.expect(set_big.as_bytes(), b"STORED\r\n");
    assert_eq!(get_line(&mut b, "l0"), "END\r\n", "l0 was evicted for it");
    assert_eq!(get_line(&mut b, "l1"), value("l1", 0, &big));
}

#[test]
fn a_delayed_flush_all_spares_locked_items() {
    let d = mc();
    let (mut a, mut b) = (d.memcache(), d.memcache());
    set(&mut a, "locked", "L");
    set(&mut a, "free", "F");
    a.expect(b"lock locked\r\n", b"OK\r\n");
    b.expect(b"flush_all 1\r\n", b"OK\r\n");
    assert_eq!(get_line(&mut b, "free"), value("free", 0, "F"), "not yet");
    wait_until(DEADLINE, "the delayed flush runs", || {
        get_line(&mut b, "free") == "END\r\n"
    });
    assert_eq!(get_line(&mut b, "locked"), value("locked", 0, "L"));
}

#[test]
fn disconnect_releases_a_thousand_locks_at_once() {
    let d = mc();
    let mut a = d.memcache();
    let mut sets = Vec::new();
    let mut locks = Vec::new();
    for i in 0..1000 {
        sets.extend_from_slice(format!("set k{i} 0 0 1\r\nv\r\n").as_bytes());
        locks.extend_from_slice(format!("lock k{i}\r\n").as_bytes());
    }
    a.expect(&sets, "STORED\r\n".repeat(1000).as_bytes());
    a.expect(&locks, "OK\r\n".repeat(1000).as_bytes());
    let mut b = d.memcache();
    assert_eq!(stat(&mut b, "locks_held"), 1000);
    b.expect(b"lock k0\r\nlock k999\r\n", b"LOCKED\r\nLOCKED\r\n");
    drop(a);
    wait_until(DEADLINE, "the disconnect is seen", || {
        stat(&mut b, "locks_held") == 0
    });
    b.expect(&locks, "OK\r\n".repeat(1000).as_bytes());
    assert_eq!(stat(&mut b, "locks_held"), 1000);
}

#[test]
fn quit_releases_the_locks_of_that_connection() {
    let d = mc();
    let (mut a, mut b) = (d.memcache(), d.memcache());
    set(&mut a, "k", "v");
    a.expect(b"lock k\r\n", b"OK\r\n");
    a.send(b"quit\r\n");
    a.expect_closed();
    // Binary quit too.
    let mut c = d.memcache();
    wait_until(DEADLINE, "quit releases k", || {
        c.send(b"lock k\r\n");
        c.line() == "OK\r\n"
    });
    expect_ok(&mut c, &keyed(UNLOCK, b"k"));
    expect_lock_token(&mut c, b"k");
    expect_ok(&mut c, &req(0x07, &[], &[], &[], 0, 0)); // Quit
    c.expect_closed();
    wait_until(DEADLINE, "binary quit releases k", || {
        b.send(b"lock k\r\n");
        b.line() == "OK\r\n"
    });
}

// ---------------------------------------------------------------------------------------------
// The protocol around the locks

#[test]
fn text_and_binary_mix_on_one_connection() {
    let d = mc();
    let mut a = d.memcache();
    set(&mut a, "t", "text");
    let cas = bin_store(&mut a, SET, b"b", b"binary", 2);
    assert_eq!(get_line(&mut a, "b"), value("b", 2, "binary"));
    assert_eq!(call(&mut a, &keyed(GET, b"t")).value, b"text");
    a.expect(b"lock b\r\n", b"OK\r\n");
    expect_err(&mut a, &keyed(LOCK, b"b"), LOCKED);
    expect_ok(&mut a, &keyed(UNLOCK, b"b"));
    a.expect(
        b"unlock b\r\n",
        b"CLIENT_ERROR object is not locked or not found\r\n",
    );
    // In one write: text, binary, text.
    let mut all = b"gets b\r\n".to_vec();
    all.extend_from_slice(&keyed(GETK, b"t"));
    all.extend_from_slice(b"version\r\n");
    a.send(&all);
    assert_eq!(a.line(), format!("VALUE b 2 6 {cas}\r\n"));
    assert_eq!(a.line(), "binary\r\n");
    assert_eq!(a.line(), "END\r\n");
    let r = read_resp(&mut a);
    assert_eq!((r.key, r.value), (b"t".to_vec(), b"text".to_vec()));
    assert_eq!(a.take(common_version().len()), common_version());
}

#[test]
fn getq_and_getkq_answer_hits_and_are_silent_on_misses() {
    let d = mc();
    let mut a = d.memcache();
    let cas = bin_store(&mut a, SET, b"k", b"v", 1);
    let got = quiet_then_noop(
        &mut a,
        &[
            keyed(GETQ, b"none"),
            keyed(GETQ, b"k"),
            keyed(GETKQ, b"none"),
            keyed(GETKQ, b"k"),
        ],
    );
    assert_eq!(
        got,
        vec![hit(GETQ, 1, b"", b"v", cas), hit(GETKQ, 1, b"k", b"v", cas)]
    );
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let d = mc();
    let mut a = d.memcache();
    let mut request = Vec::new();
    let mut reply = Vec::new();
    for i in 0..300 {
        request.extend_from_slice(
            format!("set p{i} {i} 0 {}\r\n{i}\r\n", i.to_string().len()).as_bytes(),
        );
        reply.extend_from_slice(b"STORED\r\n");
        request.extend_from_slice(format!("incr p{i} 1\r\n").as_bytes());
        reply.extend_from_slice(format!("{}\r\n", i + 1).as_bytes());
        request.extend_from_slice(format!("lock p{i}\r\nlock p{i}\r\n").as_bytes());
        reply.extend_from_slice(b"OK\r\nLOCKED\r\n");
        request.extend_from_slice(format!("get p{i}\r\n").as_bytes());
        let v = (i + 1).to_string();
        reply.extend_from_slice(format!("VALUE p{i} {i} {}\r\n{v}\r\nEND\r\n", v.len()).as_bytes());
        request.extend_from_slice(b"version\r\n");
        reply.extend_from_slice(common_version());
    }
    request.extend_from_slice(b"unlock_all\r\n");
    reply.extend_from_slice(b"OK\r\n");
    a.expect(&request, &reply);
}

#[test]
fn noreply_is_silent_for_every_command_that_takes_it() {
    let d = mc();
    let mut a = d.memcache();
    a.send(
        b"set k 0 0 1 noreply\r\n1\r\n\
          add k2 0 0 1 noreply\r\n2\r\n\
          add k2 0 0 1 noreply\r\n2\r\n\
          replace k 0 0 1 noreply\r\n3\r\n\
          append k 0 0 1 noreply\r\n4\r\n\
          prepend k 0 0 1 noreply\r\n5\r\n\
          incr k 10 noreply\r\n\
          decr k 1 noreply\r\n\
          touch k 100 noreply\r\n\
          delete k2 noreply\r\n\
          delete k2 noreply\r\n\
          verbosity 1 noreply\r\n",
    );
    let cas = {
        a.send(b"version\r\n");
        assert_eq!(a.take(common_version().len()), common_version());
        gets_cas(&mut a, "k")
    };
    assert_eq!(get_line(&mut a, "k"), value("k", 0, "543"));
    a.send(
        format!("cas k 0 0 1 {cas} noreply\r\n9\r\ncas k 0 0 1 {cas} noreply\r\n8\r\n").as_bytes(),
    );
    assert_eq!(get_line(&mut a, "k"), value("k", 0, "9"));
    // Errors are silent with noreply too (memcached's set_noreply_maybe), and the stream stays
    // in sync: a bad data chunk, a non-numeric incr, a bad exptime, a too-long key.
    let long = "k".repeat(251);
    a.send(
        format!(
            "set k 0 0 1 noreply\r\nXYZ\
             set {long} 0 0 1 noreply\r\nv\r\n\
             incr k x noreply\r\n\
             touch k x noreply\r\n\
             flush_all noreply\r\n"
        )
        .as_bytes(),
    );
    assert_eq!(
        get_line(&mut a, "k"),
        "END\r\n",
        "the flush ran, nothing else answered"
    );
}

#[test]
fn expiry_relative_absolute_and_negative() {
    let d = mc();
    let mut a = d.memcache();
    let now = unix_now();
    // Negative and absolute-in-the-past: stored, already gone.
    a.expect(b"set neg 0 -1 1\r\nv\r\n", b"STORED\r\n");
    assert_eq!(get_line(&mut a, "neg"), "END\r\n");
    a.expect(
        format!("set past 0 {} 1\r\nv\r\n", now - 10).as_bytes(),
        b"STORED\r\n",
    );
    assert_eq!(get_line(&mut a, "past"), "END\r\n");
    // 30 days is still relative; an absolute time far ahead is there.
    a.expect(b"set month 0 2592000 1\r\nv\r\n", b"STORED\r\n");
    a.expect(
        format!("set far 0 {} 1\r\nv\r\n", now + 3600).as_bytes(),
        b"STORED\r\n",
    );
    // Relative 1 s and absolute now+2: there now, gone within the deadline.
    a.expect(b"set rel 0 1 1\r\nv\r\n", b"STORED\r\n");
    a.expect(
        format!("set abs 0 {} 1\r\nv\r\n", now + 2).as_bytes(),
        b"STORED\r\n",
    );
    a.expect(b"set never 0 0 1\r\nv\r\n", b"STORED\r\n");
    assert_eq!(get_line(&mut a, "rel"), value("rel", 0, "v"));
    wait_until(DEADLINE, "rel and abs expire", || {
        get_line(&mut a, "rel abs") == "END\r\n"
    });
    assert_eq!(
        get_line(&mut a, "month far never"),
        "VALUE month 0 1\r\nv\r\nVALUE far 0 1\r\nv\r\nVALUE never 0 1\r\nv\r\nEND\r\n"
    );
    // touch with a negative time expires at once.
    a.expect(b"touch never -1\r\n", b"TOUCHED\r\n");
    assert_eq!(get_line(&mut a, "never"), "END\r\n");
}

#[test]
fn incr_and_decr() {
    let d = mc();
    let mut a = d.memcache();
    set(&mut a, "n", "99");
    a.expect(b"incr n 1\r\n", b"100\r\n");
    assert_eq!(get_line(&mut a, "n"), value("n", 0, "100"));
    a.expect(b"decr n 200\r\n", b"0\r\n"); // floors at 0
    set(&mut a, "max", "18446744073709551615");
    a.expect(b"incr max 2\r\n", b"1\r\n"); // wraps at 2^64
    a.expect(b"incr none 1\r\n", b"NOT_FOUND\r\n");
    set(&mut a, "word", "abc");
    a.expect(
        b"incr word 1\r\n",
        b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
    );
    a.expect(
        b"incr n x\r\n",
        b"CLIENT_ERROR invalid numeric delta argument\r\n",
    );
    // Binary: created from `initial` when missing, not created with exptime 0xffffffff.
    let r = call(
        &mut a,
        &req(INCREMENT, &arith_extras(5, 40, 0), b"bin", &[], 0, 0),
    );
    assert_eq!((r.status, r.value), (OK, 40u64.to_be_bytes().to_vec()));
    let r = call(
        &mut a,
        &req(INCREMENT, &arith_extras(5, 40, 0), b"bin", &[], 0, 0),
    );
    assert_eq!((r.status, r.value), (OK, 45u64.to_be_bytes().to_vec()));
    let r = call(
        &mut a,
        &req(DECREMENT, &arith_extras(50, 0, 0), b"bin", &[], 0, 0),
    );
    assert_eq!((r.status, r.value), (OK, 0u64.to_be_bytes().to_vec()));
    expect_err(
        &mut a,
        &req(
            INCREMENT,
            &arith_extras(1, 0, u32::MAX),
            b"nobin",
            &[],
            0,
            0,
        ),
        NOT_FOUND,
    );
    assert_eq!(get_line(&mut a, "bin"), value("bin", 0, "0"));
}

#[test]
fn cas_stores_only_with_the_current_unique() {
    let d = mc();
    let mut a = d.memcache();
    set(&mut a, "k", "v1");
    let cas = gets_cas(&mut a, "k");
    a.expect(
        format!("cas k 0 0 2 {}\r\nv2\r\n", cas + 1).as_bytes(),
        b"EXISTS\r\n",
    );
    a.expect(
        format!("cas k 0 0 2 {cas}\r\nv2\r\n").as_bytes(),
        b"STORED\r\n",
    );
    a.expect(
        format!("cas k 0 0 2 {cas}\r\nv3\r\n").as_bytes(),
        b"EXISTS\r\n",
    );
    a.expect(b"cas none 0 0 2 1\r\nv2\r\n", b"NOT_FOUND\r\n");
    assert_eq!(get_line(&mut a, "k"), value("k", 0, "v2"));
    assert!(gets_cas(&mut a, "k") > cas);
    // Binary CAS mismatch is 0x0002.
    let cas = gets_cas(&mut a, "k");
    expect_err(
        &mut a,
        &req(SET, &set_extras(0, 0), b"k", b"x", 0, cas + 1),
        EXISTS,
    );
    let r = call(&mut a, &req(SET, &set_extras(0, 0), b"k", b"x", 0, cas));
    assert_eq!(r.status, OK);
}

#[test]
fn stats_show_the_lock_counters() {
    let d = mc();
    let (mut a, mut b) = (d.memcache(), d.memcache());
    let s = stats(&mut a);
    for name in ["locks_held", "lock_grants", "lock_conflicts"] {
        assert_eq!(s[name], "0", "{name}");
    }
    for k in ["a", "b", "c"] {
        set(&mut a, k, "v");
    }
    a.expect(
        b"lock a\r\nlock b\r\nlock c\r\nunlock c\r\n",
        b"OK\r\nOK\r\nOK\r\nOK\r\n",
    );
    b.expect(b"lock a\r\nlock b\r\n", b"LOCKED\r\nLOCKED\r\n");
    expect_err(&mut b, &keyed(LAG, b"a"), LOCKED);
    let s = stats(&mut b);
    assert_eq!(
        (
            &s["locks_held"][..],
            &s["lock_grants"][..],
            &s["lock_conflicts"][..]
        ),
        ("2", "3", "3")
    );
    // Binary stats carry the same counters.
    a.send(&req(STAT, &[], &[], &[], 0, 0));
    let mut bin = HashMap::new();
    loop {
        let r = read_resp(&mut a);
        assert_eq!((r.opcode, r.status), (STAT, OK));
        if r.key.is_empty() {
            break;
        }
        bin.insert(
            String::from_utf8(r.key).unwrap(),
            String::from_utf8(r.value).unwrap(),
        );
    }
    assert_eq!(bin["locks_held"], "2");
    assert_eq!(bin["lock_grants"], "3");
}

// ---------------------------------------------------------------------------------------------
// Bad input

#[test]
fn a_key_over_250_bytes_is_a_client_error_text_and_0x0003_binary() {
    let d = mc();
    let mut a = d.memcache();
    let k250 = "k".repeat(250);
    let k251 = "k".repeat(251);
    set(&mut a, &k250, "ok");
    let bad: &[u8] = b"CLIENT_ERROR bad command line format\r\n";
    a.expect(format!("get {k251}\r\n").as_bytes(), bad);
    a.expect(format!("set {k251} 0 0 1\r\nv\r\n").as_bytes(), bad);
    a.expect(format!("lock {k251}\r\n").as_bytes(), bad);
    a.expect(format!("delete {k251}\r\n").as_bytes(), bad);
    // The data block was swallowed: the stream is in sync.
    assert_eq!(get_line(&mut a, &k250), value(&k250, 0, "ok"));
    expect_err(&mut a, &keyed(GET, k251.as_bytes()), TOO_LARGE);
    expect_err(
        &mut a,
        &req(SET, &set_extras(0, 0), k251.as_bytes(), b"v", 9, 0),
        TOO_LARGE,
    );
    expect_err(&mut a, &keyed(LOCK, k251.as_bytes()), TOO_LARGE);
    assert_eq!(call(&mut a, &keyed(GET, k250.as_bytes())).value, b"ok");
}

#[test]
fn a_value_over_max_item_size_is_refused_and_the_stream_stays_in_sync() {
    let d = Daemon::start(&[
        "--lockd",
        "off",
        "--dlock",
        "off",
        "--max-item-size",
        "1024",
    ]);
    let mut a = d.memcache();
    let ok = "x".repeat(1024);
    let big = "x".repeat(1025);
    a.expect(
        format!("set k 0 0 1024\r\n{ok}\r\n").as_bytes(),
        b"STORED\r\n",
    );
    a.expect(
        format!("set k 0 0 1025\r\n{big}\r\nget nothing\r\n").as_bytes(),
        b"SERVER_ERROR object too large for cache\r\nEND\r\n",
    );
    // Sent in pieces: the value is swallowed as it arrives.
    a.send(b"set k 0 0 5000\r\n");
    assert_eq!(a.line(), "SERVER_ERROR object too large for cache\r\n");
    a.send(&vec![b'y'; 3000]);
    a.send(&vec![b'y'; 2000]);
    a.expect(b"\r\nversion\r\n", common_version());
    assert_eq!(get_line(&mut a, "k"), value("k", 0, &ok));
    // Append beyond the limit.
    a.expect(
        b"append k 0 0 1\r\nz\r\n",
        b"SERVER_ERROR object too large for cache\r\n",
    );
    // Binary: 0x0003, the body swallowed, then the next request answered.
    let mut frames = req(SET, &set_extras(0, 0), b"k", big.as_bytes(), 77, 0);
    frames.extend_from_slice(&req(NOOP, &[], &[], &[], 78, 0));
    a.send(&frames);
    assert_eq!(read_resp(&mut a), Resp::err(SET, TOO_LARGE, 77));
    assert_eq!(
        read_resp(&mut a),
        Resp {
            opaque: 78,
            ..Resp::ok(NOOP)
        }
    );
    assert_eq!(get_line(&mut a, "k"), value("k", 0, &ok));
}

#[test]
fn an_unknown_command_answers_error_and_the_connection_goes_on() {
    let d = mc();
    let mut a = d.memcache();
    a.expect(b"bogus\r\n", b"ERROR\r\n");
    a.expect(b"\r\n", b"ERROR\r\n");
    a.expect(
        b"lockx k\r\nversion\r\n",
        &[b"ERROR\r\n", common_version()].concat(),
    );
    // An unknown binary opcode: 0x0081.
    let r = call(&mut a, &req(0x3f, &[], &[], &[], 5, 0));
    assert_eq!((r.opcode, r.status, r.opaque), (0x3f, 0x0081, 5));
    a.expect(b"version\r\n", common_version());
}

#[test]
fn a_line_without_newline_over_2048_bytes_is_too_long_and_closes() {
    let d = mc();
    let mut a = d.memcache();
    a.send(&vec![b'x'; 3000]);
    assert_eq!(a.line(), "CLIENT_ERROR line too long\r\n");
    a.expect_closed();
    // get lines may be longer (up to 64 KiB).
    let mut b = d.memcache();
    let keys: Vec<String> = (0..1000).map(|i| format!("key{i:05}")).collect();
    b.expect(format!("get {}\r\n", keys.join(" ")).as_bytes(), b"END\r\n");
    b.send(format!("get {}", "k ".repeat(40000)).as_bytes());
    assert_eq!(b.line(), "CLIENT_ERROR line too long\r\n");
    b.expect_closed();
    // Others are unaffected.
    d.memcache().expect(b"version\r\n", common_version());
}

#[test]
fn binary_with_a_bad_magic_closes_the_connection() {
    let d = mc();
    let mut a = d.memcache();
    expect_ok(&mut a, &req(NOOP, &[], &[], &[], 0, 0));
    let mut bad = req(GET, &[], b"k", &[], 0, 0);
    bad[0] = 0x81; // a response magic where a request is due
    a.send(&bad);
    a.expect_closed();
    assert!(
        a.pending.is_empty(),
        "closed without an answer: {:?}",
        a.pending
    );
    // Also right after text.
    let mut b = d.memcache();
    b.send(b"version\r\n\xff\xff\xff\xff");
    assert_eq!(b.take(common_version().len()), common_version());
    b.expect_closed();
    d.memcache().expect(b"version\r\n", common_version());
}

#[test]
fn a_binary_body_length_that_lies_is_refused_without_memory_growth() {
    let d = mc();
    let mut a = d.memcache();
    a.expect(b"version\r\n", common_version());
    let before = d.rss_kib();
    // 4 GiB body announced, nothing sent: refused from the header alone.
    let mut huge = req(SET, &set_extras(0, 0), b"k", b"", 31, 0);
    huge[8..12].copy_from_slice(&0xffff_fff0u32.to_be_bytes());
    a.send(&huge);
    assert_eq!(read_resp(&mut a), Resp::err(SET, TOO_LARGE, 31));
    // Keep feeding it some of the announced body: swallowed, not buffered.
    for _ in 0..16 {
        a.send(&vec![0u8; 1 << 20]);
    }
    let mut b = d.memcache();
    b.expect(b"set k 0 0 1\r\nv\r\n", b"STORED\r\n");
    let grew = d.rss_kib().saturating_sub(before);
    assert!(grew < 8 * 1024, "RSS grew by {grew} KiB");
    // A body length shorter than its own extras + key: close.
    let mut c = d.memcache();
    let mut short = req(SET, &set_extras(0, 0), b"key", b"v", 0, 0);
    short[8..12].copy_from_slice(&4u32.to_be_bytes());
    c.send(&short);
    c.expect_closed();
    assert_eq!(get_line(&mut b, "k"), value("k", 0, "v"));
}

#[test]
fn a_client_disconnecting_mid_value_leaves_others_unaffected() {
    let d = mc();
    let mut b = d.memcache();
    set(&mut b, "k", "old");
    {
        let mut a = d.memcache();
        set(&mut a, "mine", "v");
        a.expect(b"lock mine\r\n", b"OK\r\n");
        a.send(b"set k 0 0 100\r\n");
        a.send(&[b'z'; 50]);
    }
    assert_eq!(get_line(&mut b, "k"), value("k", 0, "old"));
    wait_until(DEADLINE, "the dropped client's lock is released", || {
        b.send(b"lock mine\r\n");
        b.line() == "OK\r\n"
    });
    // A client that drops mid binary frame.
    {
        let mut c = d.memcache();
        let frame = req(SET, &set_extras(0, 0), b"k", &[b'q'; 100], 0, 0);
        c.send(&frame[..50]);
    }
    set(&mut b, "k", "new");
    assert_eq!(get_line(&mut b, "k"), value("k", 0, "new"));
    assert_eq!(stat(&mut b, "curr_items"), 2);
}
