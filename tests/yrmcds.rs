//! yrmcds parity on the memcached port, over TCP against the real daemon (port 0): every case
//! where `--compat yrmcds` answers otherwise than the default, in both modes (`docs/compat.md`
//! lists them with the yrmcds source they come from), the key dump (`keys`, opcode 0x50) over
//! tables that take many owner steps, and `stats ops` / `stats sizes`.
//!
//! Replies are asserted byte for byte; waits are bounded by the harness's deadlines. Where a test
//! needs "B was served in the middle of A's dump" it proves it by ordering (a key stored by B
//! after A's dump started shows up in that dump), never by timing.

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::mcbin::{self, call, read as read_resp, Resp};
use common::{Client, Daemon};

const GET: u8 = 0x00;
const SET: u8 = 0x01;
const ADD: u8 = 0x02;
const DELETE: u8 = 0x04;
const INCREMENT: u8 = 0x05;
const NOOP: u8 = 0x0a;
const GETK: u8 = 0x0c;
const GETKQ: u8 = 0x0d;
const APPEND: u8 = 0x0e;
const PREPEND: u8 = 0x0f;
const STAT: u8 = 0x10;
const DELETEQ: u8 = 0x14;
const INCREMENTQ: u8 = 0x15;
const APPENDQ: u8 = 0x19;
const VERBOSITY: u8 = 0x1b;
const TOUCH: u8 = 0x1c;
const GAT: u8 = 0x1d;
const LOCK: u8 = 0x40;
const LAGQ: u8 = 0x47;
const LAGKQ: u8 = 0x49;
const KEYS: u8 = 0x50;

const OK: u16 = 0x0000;
const NOT_FOUND: u16 = 0x0001;
const EXISTS: u16 = 0x0002;
const INVALID: u16 = 0x0004;
const NOT_STORED: u16 = 0x0005;
const NON_NUMERIC: u16 = 0x0006;
const LOCKED: u16 = 0x0010;
const UNKNOWN: u16 = 0x0081;

const SILENCE: Duration = Duration::from_millis(200);

fn req(opcode: u8, extras: &[u8], key: &[u8], value: &[u8], opaque: u32) -> Vec<u8> {
    mcbin::request(opcode, extras, key, value, opaque, 0)
}

fn set_extras() -> Vec<u8> {
    vec![0; 8]
}

fn arith_extras(delta: u64, initial: u64, exptime: u32) -> Vec<u8> {
    let mut v = delta.to_be_bytes().to_vec();
    v.extend_from_slice(&initial.to_be_bytes());
    v.extend_from_slice(&exptime.to_be_bytes());
    v
}

/// (status, key, body) of an answer: what differs between the modes.
fn skv(r: &Resp) -> (u16, &[u8], &[u8]) {
    (r.status, &r.key[..], &r.value[..])
}

/// Send a (quiet) request then a Noop: true when the request was answered before the Noop.
fn answered_before_noop(c: &mut Client, request: &[u8]) -> Option<Resp> {
    let mut both = request.to_vec();
    both.extend_from_slice(&req(NOOP, &[], &[], &[], 0xfeed));
    c.send(&both);
    let first = read_resp(c);
    if first.opcode == NOOP && first.opaque == 0xfeed {
        return None;
    }
    let noop = read_resp(c);
    assert_eq!((noop.opcode, noop.opaque), (NOOP, 0xfeed));
    Some(first)
}

fn daemons() -> [(Daemon, bool); 2] {
    [
        (Daemon::start(&[]), false),
        (Daemon::start(&["--compat", "yrmcds"]), true),
    ]
}

fn set(c: &mut Client, key: &[u8], value: &[u8]) -> u64 {
    let r = call(c, &req(SET, &set_extras(), key, value, 0));
    assert_eq!(r.status, OK);
    r.cas
}

// ---------------------------------------------------------------------------------------------
// The flag

#[test]
fn compat_flag_refuses_another_mode_with_one_line_and_exit_2() {
    let out = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(["--compat", "redis", "--memcache", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .output()
        .expect("run holdfast");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--compat redis"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Binary differences

#[test]
fn deleteq_of_a_missing_key_is_silent_only_in_yrmcds_mode() {
    for (d, y) in daemons() {
        let mut c = d.memcache();
        let got = answered_before_noop(&mut c, &req(DELETEQ, &[], b"nope", &[], 7));
        if y {
            assert_eq!(got, None);
        } else {
            let r = got.expect("memcached answers a DeleteQ miss");
            assert_eq!(skv(&r), (NOT_FOUND, &b""[..], &b"Not found"[..]));
        }
        // A DeleteQ of a present key is silent in both; a plain Delete miss answers in both.
        set(&mut c, b"k", b"v");
        assert_eq!(
            answered_before_noop(&mut c, &req(DELETEQ, &[], b"k", &[], 0)),
            None
        );
        let r = call(&mut c, &req(DELETE, &[], b"k", &[], 0));
        assert_eq!(r.status, NOT_FOUND);
    }
}

#[test]
fn quiet_errors_other_than_a_delete_miss_answer_in_both_modes() {
    for (d, _) in daemons() {
        let mut c = d.memcache();
        // IncrementQ of a missing key without create.
        let r = answered_before_noop(
            &mut c,
            &req(INCREMENTQ, &arith_extras(1, 0, u32::MAX), b"nope", &[], 1),
        )
        .expect("IncrementQ miss answers");
        assert_eq!(r.status, NOT_FOUND);
        // AppendQ of a missing key answers (the status differs, see below).
        let r = answered_before_noop(&mut c, &req(APPENDQ, &[], b"nope", b"x", 2))
            .expect("AppendQ miss answers");
        assert!(r.status == NOT_FOUND || r.status == NOT_STORED);
        // A DeleteQ of a key another connection locked answers Locked.
        set(&mut c, b"held", b"v");
        let mut other = d.memcache();
        assert_eq!(
            call(&mut other, &req(LOCK, &[], b"held", &[], 0)).status,
            OK
        );
        let r = answered_before_noop(&mut c, &req(DELETEQ, &[], b"held", &[], 3))
            .expect("locked DeleteQ answers");
        assert_eq!(r.status, LOCKED);
    }
}

#[test]
fn lagq_miss_answers_not_found_only_in_yrmcds_mode_and_lagkq_stays_silent() {
    for (d, y) in daemons() {
        let mut c = d.memcache();
        let got = answered_before_noop(&mut c, &req(LAGQ, &[], b"nope", &[], 9));
        if y {
            let r = got.expect("yrmcds answers a LaGQ miss");
            assert_eq!((r.opcode, r.opaque), (LAGQ, 9));
            assert_eq!(skv(&r), (NOT_FOUND, &b""[..], &b"Not found"[..]));
        } else {
            assert_eq!(got, None);
        }
        assert_eq!(
            answered_before_noop(&mut c, &req(LAGKQ, &[], b"nope", &[], 9)),
            None
        );
    }
}

#[test]
fn getk_miss_carries_the_key_only_in_memcached_mode() {
    for (d, y) in daemons() {
        let mut c = d.memcache();
        let r = call(&mut c, &req(GETK, &[], b"absent", &[], 0));
        let key: &[u8] = if y { b"" } else { b"absent" };
        assert_eq!(skv(&r), (NOT_FOUND, key, &b"Not found"[..]));
        // The quiet one is silent on a miss in both.
        assert_eq!(
            answered_before_noop(&mut c, &req(GETKQ, &[], b"absent", &[], 0)),
            None
        );
    }
}

#[test]
fn append_and_prepend_to_a_missing_key_answer_not_found_in_yrmcds_mode() {
    for (d, y) in daemons() {
        let mut c = d.memcache();
        for op in [APPEND, PREPEND] {
            let r = call(&mut c, &req(op, &[], b"absent", b"x", 0));
            if y {
                assert_eq!(skv(&r), (NOT_FOUND, &b""[..], &b"Not found"[..]));
            } else {
                assert_eq!(skv(&r), (NOT_STORED, &b""[..], &b"Not stored."[..]));
            }
        }
    }
}

#[test]
fn binary_verbosity_is_an_unknown_command_in_yrmcds_mode() {
    for (d, y) in daemons() {
        let mut c = d.memcache();
        let r = call(&mut c, &req(VERBOSITY, &[0, 0, 0, 1], &[], &[], 5));
        if y {
            assert_eq!(skv(&r), (UNKNOWN, &b""[..], &b"Unknown command"[..]));
        } else {
            assert_eq!(skv(&r), (OK, &b""[..], &b""[..]));
        }
    }
}

/// The stat pairs of a binary Stat, up to its empty terminator.
fn binary_stats(c: &mut Client, group: &[u8]) -> Result<Vec<(String, String)>, u16> {
    c.send(&req(STAT, &[], group, &[], 0));
    let mut pairs = Vec::new();
    loop {
        let r = read_resp(c);
        if r.status != OK {
            return Err(r.status);
        }
        if r.key.is_empty() {
            return Ok(pairs);
        }
        pairs.push((
            String::from_utf8(r.key).unwrap(),
            String::from_utf8(r.value).unwrap(),
        ));
    }
}

#[test]
fn binary_stat_of_an_unknown_group_gives_the_general_stats_in_yrmcds_mode() {
    for (d, y) in daemons() {
        let mut c = d.memcache();
        let got = binary_stats(&mut c, b"nonsense");
        if y {
            let pairs = got.expect("general stats");
            assert!(pairs.iter().any(|(k, _)| k == "pid"), "{pairs:?}");
        } else {
            assert_eq!(got, Err(NOT_FOUND));
        }
    }
}

#[test]
fn binary_touch_answers_the_items_cas_in_yrmcds_mode() {
    for (d, y) in daemons() {
        let mut c = d.memcache();
        let cas = set(&mut c, b"t", b"v");
        assert_ne!(cas, 0);
        let r = call(&mut c, &req(TOUCH, &[0, 0, 0, 100], b"t", &[], 0));
        assert_eq!(r.status, OK);
        assert_eq!(r.cas, if y { cas } else { 0 });
        assert_eq!(
            call(&mut c, &req(TOUCH, &[0, 0, 0, 100], b"gone", &[], 0)).status,
            NOT_FOUND
        );
    }
}

#[test]
fn binary_error_bodies_are_worded_as_each_server_words_them() {
    for (d, y) in daemons() {
        let mut c = d.memcache();
        set(&mut c, b"word", b"abc");
        let r = call(&mut c, &req(ADD, &set_extras(), b"word", b"x", 0));
        let exists: &[u8] = if y {
            b"Exists"
        } else {
            b"Data exists for key."
        };
        assert_eq!(skv(&r), (EXISTS, &b""[..], exists));
        let r = call(
            &mut c,
            &req(INCREMENT, &arith_extras(1, 0, 0), b"word", &[], 0),
        );
        let nn: &[u8] = if y {
            b"Non-numeric value"
        } else {
            b"Non-numeric server-side value for incr or decr"
        };
        assert_eq!(skv(&r), (NON_NUMERIC, &b""[..], nn));
        // Bad shape: a Delete with extras.
        let r = call(&mut c, &req(DELETE, &[0, 0, 0, 0], b"word", &[], 0));
        let inv: &[u8] = if y {
            b"Invalid request"
        } else {
            b"Invalid arguments"
        };
        assert_eq!(skv(&r), (INVALID, &b""[..], inv));
    }
}

#[test]
fn an_empty_value_is_invalid_for_stores_only_in_yrmcds_mode() {
    for (d, y) in daemons() {
        let mut c = d.memcache();
        let r = call(&mut c, &req(SET, &set_extras(), b"empty", b"", 0));
        if y {
            assert_eq!(r.status, INVALID);
        } else {
            assert_eq!(r.status, OK);
        }
    }
}

#[test]
fn a_get_with_an_expiration_touches_in_yrmcds_mode_and_is_invalid_in_memcached_mode() {
    for (d, y) in daemons() {
        let mut c = d.memcache();
        set(&mut c, b"g", b"val");
        let r = call(&mut c, &req(GET, &[0, 0, 0, 100], b"g", &[], 0));
        if y {
            assert_eq!((r.status, &r.value[..]), (OK, &b"val"[..]));
            // A GaT without one is a plain get there.
            let r = call(&mut c, &req(GAT, &[], b"g", &[], 0));
            assert_eq!((r.status, &r.value[..]), (OK, &b"val"[..]));
        } else {
            assert_eq!(r.status, INVALID);
            assert_eq!(call(&mut c, &req(GAT, &[], b"g", &[], 0)).status, INVALID);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Text differences

#[test]
fn text_gat_is_an_unknown_command_in_yrmcds_mode() {
    for (d, y) in daemons() {
        let mut c = d.memcache();
        c.expect(b"set a 1 0 1\r\nx\r\n", b"STORED\r\n");
        if y {
            c.expect(b"gat 100 a\r\n", b"ERROR\r\n");
            c.expect(b"gats 100 a\r\n", b"ERROR\r\n");
        } else {
            c.expect(b"gat 100 a\r\n", b"VALUE a 1 1\r\nx\r\nEND\r\n");
        }
    }
}

#[test]
fn text_request_errors_are_a_bare_error_in_yrmcds_mode() {
    for (d, y) in daemons() {
        let mut c = d.memcache();
        let cases: [(&[u8], &[u8]); 4] = [
            (
                b"incr k x\r\n",
                b"CLIENT_ERROR invalid numeric delta argument\r\n",
            ),
            (
                b"touch k x\r\n",
                b"CLIENT_ERROR invalid exptime argument\r\n",
            ),
            (
                b"set k x 0 1\r\n",
                b"CLIENT_ERROR bad command line format\r\n",
            ),
            (b"bogus\r\n", b"ERROR\r\n"),
        ];
        for (request, memcached) in cases {
            c.expect(request, if y { b"ERROR\r\n" } else { memcached });
        }
        // The connection is still in step.
        c.expect(b"set k 0 0 1\r\nv\r\n", b"STORED\r\n");
    }
}

#[test]
fn slabs_is_ignored_with_ok_in_yrmcds_mode() {
    for (d, y) in daemons() {
        let mut c = d.memcache();
        c.expect(
            b"slabs automove 1\r\n",
            if y { b"OK\r\n" } else { b"ERROR\r\n" },
        );
        c.expect(b"slabs\r\n", if y { b"OK\r\n" } else { b"ERROR\r\n" });
    }
}

#[test]
fn stats_slabs_and_conns_are_errors_in_yrmcds_mode() {
    for (d, y) in daemons() {
        let mut c = d.memcache();
        for group in ["slabs", "conns"] {
            c.send(format!("stats {group}\r\n").as_bytes());
            let first = c.line();
            if y {
                assert_eq!(first, "ERROR\r\n");
            } else {
                assert!(first.starts_with("STAT "), "{first}");
                while c.line() != "END\r\n" {}
            }
        }
    }
}

#[test]
fn text_answers_that_agree_stay_the_same_in_both_modes() {
    for (d, _) in daemons() {
        let mut c = d.memcache();
        c.expect(b"incr nope 1\r\n", b"NOT_FOUND\r\n");
        c.expect(b"set n 0 0 1\r\nx\r\n", b"STORED\r\n");
        c.expect(
            b"incr n 1\r\n",
            b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
        );
        c.expect(b"touch nope 10\r\n", b"NOT_FOUND\r\n");
        c.expect(b"touch n 10\r\n", b"TOUCHED\r\n");
        c.expect(b"append nope 0 0 1\r\nx\r\n", b"NOT_STORED\r\n");
        c.expect(b"flush_all\r\n", b"OK\r\n");
        c.expect(b"verbosity 1\r\n", b"OK\r\n");
        c.expect(b"get n\r\n", b"END\r\n");
        // Locked items: another connection's lock refuses changes, not reads.
        c.expect(b"set l 0 0 1\r\nv\r\n", b"STORED\r\n");
        let mut other = d.memcache();
        other.expect(b"lock l\r\n", b"OK\r\n");
        c.expect(b"delete l\r\n", b"LOCKED\r\n");
        c.expect(b"set l 0 0 1\r\nw\r\n", b"LOCKED\r\n");
        c.expect(b"get l\r\n", b"VALUE l 0 1\r\nv\r\nEND\r\n");
        c.expect(
            b"unlock l\r\n",
            b"CLIENT_ERROR object is not locked or not found\r\n",
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Key dump

/// Store `n` keys `<prefix><i>` with noreply, then wait for them with a round trip.
fn load(c: &mut Client, prefix: &str, n: usize) {
    let mut batch = Vec::new();
    for i in 0..n {
        batch.extend_from_slice(format!("set {prefix}{i} 0 0 1 noreply\r\nv\r\n").as_bytes());
        if batch.len() > 1 << 20 {
            c.send(&batch);
            batch.clear();
        }
    }
    c.send(&batch);
    c.expect(b"version\r\n", b"VERSION ");
    c.line();
}

/// Every key of a text `keys` listing, up to its END.
fn text_keys(c: &mut Client, request: &[u8]) -> Vec<String> {
    c.send(request);
    let mut keys = Vec::new();
    loop {
        let line = c.line();
        if line == "END\r\n" {
            return keys;
        }
        let key = line
            .strip_prefix("VALUE ")
            .and_then(|l| l.strip_suffix("\r\n"))
            .unwrap_or_else(|| panic!("bad keys line {line:?}"));
        keys.push(key.to_string());
    }
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    sorted((0..n).map(|i| format!("{prefix}{i}")).collect())
}

#[test]
fn text_keys_lists_every_key_or_those_with_the_prefix_over_many_steps() {
    for (d, _) in daemons() {
        let mut c = d.memcache();
        load(&mut c, "alpha:", 60_000);
        load(&mut c, "beta:", 40_000);
        assert_eq!(
            sorted(text_keys(&mut c, b"keys beta:\r\n")),
            names("beta:", 40_000)
        );
        let mut all = names("alpha:", 60_000);
        all.extend(names("beta:", 40_000));
        assert_eq!(sorted(text_keys(&mut c, b"keys\r\n")), sorted(all));
        assert_eq!(text_keys(&mut c, b"keys gamma\r\n"), Vec::<String>::new());
        // The connection goes on normally after a dump.
        c.expect(b"get beta:7\r\n", b"VALUE beta:7 0 1\r\nv\r\nEND\r\n");
    }
}

#[test]
fn keys_skips_expired_and_flushed_items_and_lists_locked_ones() {
    for (d, _) in daemons() {
        let mut c = d.memcache();
        c.expect(b"set live 0 0 1\r\nv\r\n", b"STORED\r\n");
        c.expect(b"set dead 0 -1 1\r\nv\r\n", b"STORED\r\n");
        c.expect(b"set held 0 0 1\r\nv\r\n", b"STORED\r\n");
        c.expect(b"lock held\r\n", b"OK\r\n");
        assert_eq!(
            sorted(text_keys(&mut c, b"keys\r\n")),
            vec!["held".to_string(), "live".to_string()]
        );
        c.expect(b"flush_all\r\n", b"OK\r\n");
        // A locked item survives a flush (yrmcds-locking.md); the others are gone.
        assert_eq!(text_keys(&mut c, b"keys\r\n"), vec!["held".to_string()]);
    }
}

#[test]
fn keys_with_a_bad_line_is_a_client_error() {
    for (d, y) in daemons() {
        let mut c = d.memcache();
        let long = format!("keys {}\r\n", "k".repeat(251));
        let want: &[u8] = if y {
            b"ERROR\r\n"
        } else {
            b"CLIENT_ERROR bad command line format\r\n"
        };
        c.expect(long.as_bytes(), want);
        c.expect(b"keys a b\r\n", want);
    }
}

#[test]
fn binary_keys_answers_one_response_per_key_then_an_empty_one() {
    for (d, _) in daemons() {
        let mut c = d.memcache();
        load(&mut c, "bin:", 10_000);
        load(&mut c, "other:", 100);
        c.send(&req(KEYS, &[], b"bin:", &[], 0xabcd));
        let mut keys = Vec::new();
        loop {
            let r = read_resp(&mut c);
            assert_eq!((r.opcode, r.status, r.opaque), (KEYS, OK, 0xabcd));
            assert!(r.extras.is_empty() && r.value.is_empty());
            if r.key.is_empty() {
                break;
            }
            keys.push(String::from_utf8(r.key).unwrap());
        }
        assert_eq!(sorted(keys), names("bin:", 10_000));
        // No prefix: everything; a value is refused.
        c.send(&req(KEYS, &[], &[], &[], 1));
        let mut n = 0;
        while !read_resp(&mut c).key.is_empty() {
            n += 1;
        }
        assert_eq!(n, 10_100);
        assert_eq!(call(&mut c, &req(KEYS, &[], b"x", b"v", 0)).status, INVALID);
    }
}

/// A client socket with a small receive buffer, so that a dump it does not read stops at the
/// daemon's write high-water mark instead of filling large kernel buffers.
fn small_window_client(addr: SocketAddr) -> Client {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).expect("socket");
    s.set_recv_buffer_size(16 * 1024).expect("rcvbuf");
    s.connect(&addr.into()).expect("connect");
    let stream: std::net::TcpStream = s.into();
    stream.set_nodelay(true).expect("nodelay");
    Client {
        stream,
        pending: Vec::new(),
    }
}

#[test]
fn other_connections_are_served_while_a_dump_waits_for_its_reader() {
    let d = Daemon::start(&[]);
    let mut loader = d.memcache();
    // 120,000 keys of 200 bytes: a listing of about 25 MB, far more than the daemon's 4 MiB
    // high-water mark plus the kernel's buffers, so the dump must pause for its reader.
    let pad = "p".repeat(190);
    let n = 120_000;
    load(&mut loader, &format!("{pad}:"), n);

    let mut a = small_window_client(d.memcache.expect("memcache"));
    a.send(b"keys\r\n");
    let first = a.line();
    assert!(first.starts_with("VALUE "), "{first}");

    // While A reads nothing more, B is served, and a key B stores now lands in a slot beyond
    // every loaded one: A's dump lists it only if it was stored while the dump was under way.
    let mut b = d.memcache();
    b.expect(b"set locked 0 0 1\r\nv\r\n", b"STORED\r\n");
    b.expect(b"lock locked\r\n", b"OK\r\n");
    b.expect(b"set late 0 0 1\r\nv\r\n", b"STORED\r\n");
    b.expect(b"unlock locked\r\n", b"OK\r\n");

    let mut keys = vec![first["VALUE ".len()..first.len() - 2].to_string()];
    keys.extend(text_keys(&mut a, b""));
    assert!(keys.iter().any(|k| k == "late"), "B's key stored mid-dump");
    assert!(keys.iter().any(|k| k == "locked"));
    let loaded = keys.iter().filter(|k| k.starts_with(&pad)).count();
    assert_eq!(loaded, n, "every loaded key exactly once");
    // A is usable again.
    a.expect(b"get late\r\n", b"VALUE late 0 1\r\nv\r\nEND\r\n");
}

#[test]
fn requests_pipelined_behind_keys_are_answered_after_its_end() {
    let d = Daemon::start(&[]);
    let mut c = d.memcache();
    load(&mut c, "k", 20_000);
    c.send(b"keys\r\nset after 0 0 1\r\nv\r\nget after\r\n");
    let keys = text_keys(&mut c, b"");
    // The set was not applied before the dump ended: "after" is not listed.
    assert_eq!(keys.len(), 20_000);
    assert!(!keys.iter().any(|k| k == "after"));
    assert_eq!(c.line(), "STORED\r\n");
    assert_eq!(c.line(), "VALUE after 0 1\r\n");
}

#[test]
fn a_client_that_leaves_mid_dump_does_not_disturb_the_others() {
    let d = Daemon::start(&[]);
    let mut c = d.memcache();
    load(&mut c, "x", 30_000);
    for _ in 0..5 {
        let mut a = d.memcache();
        a.send(b"keys\r\n");
        assert!(a.line().starts_with("VALUE "));
        drop(a);
    }
    assert_eq!(text_keys(&mut c, b"keys x1\r\n").len(), 11_111);
    c.expect_silence(SILENCE);
}

// ---------------------------------------------------------------------------------------------
// stats ops / sizes

fn text_stats(c: &mut Client, group: &str) -> Vec<(String, String)> {
    c.send(format!("stats {group}\r\n").as_bytes());
    let mut pairs = Vec::new();
    loop {
        let line = c.line();
        if line == "END\r\n" {
            return pairs;
        }
        let mut it = line.trim_end().splitn(3, ' ');
        assert_eq!(it.next(), Some("STAT"), "{line}");
        pairs.push((
            it.next().unwrap().to_string(),
            it.next().unwrap_or_default().to_string(),
        ));
    }
}

fn value_of(pairs: &[(String, String)], name: &str) -> u64 {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no {name}"))
        .1
        .parse()
        .unwrap()
}

#[test]
fn stats_ops_names_every_yrmcds_command_and_counts_them() {
    for (d, _) in daemons() {
        let mut c = d.memcache();
        c.expect(b"set a 0 0 1\r\nv\r\n", b"STORED\r\n");
        c.expect(b"set b 0 0 1\r\nv\r\n", b"STORED\r\n");
        c.expect(
            b"get a b\r\n",
            b"VALUE a 0 1\r\nv\r\nVALUE b 0 1\r\nv\r\nEND\r\n",
        );
        text_keys(&mut c, b"keys\r\n");
        set(&mut c, b"c", b"v");
        call(&mut c, &req(GET, &[], b"c", &[], 0));
        call(&mut c, &req(GET, &[], b"zz", &[], 0));
        let pairs = text_stats(&mut c, "ops");
        let names: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names.len(), 22 + 45);
        assert_eq!(&names[..3], &["text:set", "text:add", "text:replace"]);
        assert_eq!(names[21], "text:keys");
        assert_eq!(names[22], "binary:Get");
        assert_eq!(names[66], "binary:Keys");
        assert!(names.contains(&"binary:LaGKQ") && names.contains(&"binary:RaUQ"));
        assert_eq!(value_of(&pairs, "text:set"), 2);
        assert_eq!(value_of(&pairs, "text:get"), 1);
        assert_eq!(value_of(&pairs, "text:keys"), 1);
        assert_eq!(value_of(&pairs, "text:stats"), 1);
        assert_eq!(value_of(&pairs, "binary:Set"), 1);
        assert_eq!(value_of(&pairs, "binary:Get"), 2);
        assert_eq!(value_of(&pairs, "binary:Delete"), 0);
        // Binary Stat "ops": the same names.
        let bin = binary_stats(&mut c, b"ops").expect("binary stats ops");
        let bin_names: Vec<&str> = bin.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(bin_names, names);
        assert_eq!(value_of(&bin, "binary:Stat"), 1);
    }
}

#[test]
fn stats_sizes_counts_values_by_yrmcds_size_class() {
    for (d, _) in daemons() {
        let mut c = d.memcache();
        set(&mut c, b"s1", &[b'x'; 10]);
        set(&mut c, b"s2", &[b'x'; 1023]);
        set(&mut c, b"s3", &[b'x'; 1024]);
        set(&mut c, b"s4", &[b'x'; 70_000]);
        let pairs = text_stats(&mut c, "sizes");
        let names: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            ["1024", "4096", "16384", "65536", "262144", "1048576", "4194304", "huge"]
        );
        let counts: Vec<u64> = names.iter().map(|n| value_of(&pairs, n)).collect();
        assert_eq!(counts, [2, 1, 0, 0, 1, 0, 0, 0]);
        // Replacing and deleting move the counts.
        set(&mut c, b"s1", &[b'x'; 2000]);
        assert_eq!(call(&mut c, &req(DELETE, &[], b"s4", &[], 0)).status, OK);
        let bin = binary_stats(&mut c, b"sizes").expect("binary stats sizes");
        let counts: Vec<u64> = bin.iter().map(|(_, v)| v.parse().unwrap()).collect();
        assert_eq!(counts, [1, 2, 0, 0, 0, 0, 0, 0]);
    }
}
