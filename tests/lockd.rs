//! The old lock-daemon protocol against the real daemon, over TCP, in raw bytes.
//!
//! The protocol is `docs/protocol.md`, "old, the Open Lock Daemon protocol". Every reply is checked whole: version 1, the opcode, and the request's
//! payload echoed byte for byte. Asynchronous effects (a disconnect turning locks into orphans, a
//! waiter leaving its queue) are awaited through the memcached `stats` counters with a deadline,
//! never by sleeping; "nothing arrives" is checked with a bounded read.

mod common;

use std::collections::BTreeSet;
use std::io::{ErrorKind, Read};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{Client, Daemon, DEADLINE};

// ---- the wire format, written independently of src/proto/lockd.rs ----

const ACQ: u8 = 1;
const REL: u8 = 2;
const TRY: u8 = 3;
const PING: u8 = 4;
const ADOPT: u8 = 5;
const SYNC: u8 = 6;
const ACQUIRED: u8 = 128;
const WBLOCK: u8 = 129;
const RELEASED: u8 = 130;
const PONG: u8 = 131;
const ACK: u8 = 132;
const ERR: u8 = 133;
const SYNC_REPLY: u8 = 134;

/// Largest payload the 20-bit length field can carry.
const MAX_PAYLOAD: usize = (1 << 20) - 1;

/// How long "nothing arrives" is watched for where no timer is involved: long enough for a
/// wrong reply to show up on a loaded machine, short enough to keep the suite quick.
const QUIET: Duration = Duration::from_millis(100);

/// The orphan timeout of the timing tests, and the slack allowed on top of it for a shared,
/// noisy two-core machine (the daemon fires the timer within a millisecond when idle).
const ORPHAN_MS: u64 = 300;
const SLACK_MS: u64 = 500;

/// One frame: header = big-endian u32 version(4) << 28 | opcode(8) << 20 | length(20).
fn frame(version: u8, opcode: u8, payload: &[u8]) -> Vec<u8> {
    assert!(version < 16 && payload.len() <= MAX_PAYLOAD);
    let word = (u32::from(version) << 28) | (u32::from(opcode) << 20) | payload.len() as u32;
    let mut out = word.to_be_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

/// A version-1 request.
fn req(opcode: u8, payload: &[u8]) -> Vec<u8> {
    frame(1, opcode, payload)
}

/// A name as a lock payload: the name, then its NUL.
fn nul(name: &[u8]) -> Vec<u8> {
    let mut p = name.to_vec();
    p.push(0);
    p
}

#[derive(PartialEq, Eq)]
struct Reply {
    version: u8,
    opcode: u8,
    payload: Vec<u8>,
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Payloads may be a MiB: show the length and a prefix.
        let shown = &self.payload[..self.payload.len().min(64)];
        write!(
            f,
            "v{} {} [{} bytes] {:?}",
            self.version,
            opname(self.opcode),
            self.payload.len(),
            String::from_utf8_lossy(shown)
        )
    }
}

fn opname(op: u8) -> String {
    match op {
        ACQ => "ACQ".into(),
        REL => "REL".into(),
        TRY => "TRY".into(),
        PING => "PING".into(),
        ADOPT => "ADOPT".into(),
        SYNC => "SYNC".into(),
        ACQUIRED => "ACQUIRED".into(),
        WBLOCK => "WBLOCK".into(),
        RELEASED => "RELEASED".into(),
        PONG => "PONG".into(),
        ACK => "ACK".into(),
        ERR => "ERR".into(),
        SYNC_REPLY => "SYNC_REPLY".into(),
        other => format!("opcode {other}"),
    }
}

/// The old protocol on top of the shared deadline-bound client.
trait Lockd {
    fn req(&mut self, opcode: u8, payload: &[u8]);
    /// The next whole frame; panics after the harness deadline.
    fn recv(&mut self) -> Reply;
    /// The next frame must be exactly this version-1 reply.
    fn want(&mut self, opcode: u8, payload: &[u8]);
    /// Send a request and expect exactly this reply.
    fn ask(&mut self, opcode: u8, payload: &[u8], reply: u8, reply_payload: &[u8]);
    /// True when a byte arrived (left pending) within `wait`, false on silence.
    fn something_within(&mut self, wait: Duration) -> bool;
}

impl Lockd for Client {
    fn req(&mut self, opcode: u8, payload: &[u8]) {
        self.send(&req(opcode, payload));
    }

    fn recv(&mut self) -> Reply {
        let h = self.take(4);
        let word = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
        let len = (word & 0xf_ffff) as usize;
        Reply {
            version: (word >> 28) as u8,
            opcode: (word >> 20) as u8,
            payload: self.take(len),
        }
    }

    fn want(&mut self, opcode: u8, payload: &[u8]) {
        let got = self.recv();
        let want = Reply {
            version: 1,
            opcode,
            payload: payload.to_vec(),
        };
        assert_eq!(got, want);
    }

    fn ask(&mut self, opcode: u8, payload: &[u8], reply: u8, reply_payload: &[u8]) {
        self.req(opcode, payload);
        self.want(reply, reply_payload);
    }

    fn something_within(&mut self, wait: Duration) -> bool {
        if !self.pending.is_empty() {
            return true;
        }
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.stream.set_read_timeout(Some(left)).expect("timeout");
            let mut buf = [0u8; 4096];
            match self.stream.read(&mut buf) {
                Ok(0) => panic!("connection closed while watching for silence"),
                Ok(k) => {
                    self.pending.extend_from_slice(&buf[..k]);
                    return true;
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => panic!("read failed: {e}"),
            }
        }
    }
}

/// Nothing may arrive on `c` within `wait`; shows what did arrive otherwise.
fn assert_silent(c: &mut Client, wait: Duration, what: &str) {
    if c.something_within(wait) {
        panic!("{what}: expected silence, got {:?}", c.recv());
    }
}

/// Bytes that are already here, without waiting (for "nobody else got anything" sweeps).
fn arrived_now(c: &mut Client) -> bool {
    if !c.pending.is_empty() {
        return true;
    }
    c.stream.set_nonblocking(true).expect("nonblocking");
    let mut buf = [0u8; 1];
    let got = match c.stream.peek(&mut buf) {
        Ok(_) => true, // data, or EOF: both are "something happened"
        Err(e) if e.kind() == ErrorKind::WouldBlock => false,
        Err(e) => panic!("peek failed: {e}"),
    };
    c.stream.set_nonblocking(false).expect("blocking");
    got
}

// ---- daemon-side observations ----

/// The memcached `stats` counters of a daemon.
struct Stats {
    mc: Client,
}

impl Stats {
    fn of(d: &Daemon) -> Stats {
        Stats { mc: d.memcache() }
    }

    fn get(&mut self, name: &str) -> u64 {
        self.mc.send(b"stats\r\n");
        let mut value = None;
        loop {
            let line = self.mc.line();
            if line == "END\r\n" {
                break;
            }
            let mut words = line.split_whitespace();
            assert_eq!(words.next(), Some("STAT"), "stats line {line:?}");
            if words.next() == Some(name) {
                value = words.next().and_then(|v| v.parse().ok());
            }
        }
        value.unwrap_or_else(|| panic!("no stat {name}"))
    }

    /// The lockd counters in the order held, orphaned, waiting, grants, expiries, adoptions.
    fn lockd(&mut self) -> [u64; 6] {
        [
            "lockd_held",
            "lockd_orphaned",
            "lockd_waiting",
            "lockd_grants",
            "lockd_orphan_expiries",
            "lockd_adoptions",
        ]
        .map(|n| self.get(n))
    }

    /// Poll until `name` reads `want` (the daemon applies disconnects asynchronously).
    fn wait_for(&mut self, name: &str, want: u64) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let got = self.get(name);
            if got == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{name} stayed {got}, expected {want}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Tests that measure time, or load the two shared cores hard, run one at a time: a timing test
/// beside a thousand-connection test would measure the other test, not the daemon.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn orphan_daemon() -> Daemon {
    Daemon::start(&["--orphan-timeout", &ORPHAN_MS.to_string()])
}

/// Read every SYNC reply up to the end of the answer, the way a client of the protocol must:
/// a non-empty reply under the maximum is the whole answer; a reply at the maximum or any reply
/// after it continues until an empty one. Here the test knows how many frames to expect, so it
/// reads that many and returns them.
fn sync_frames(c: &mut Client, frames: usize) -> Vec<Vec<u8>> {
    (0..frames)
        .map(|_| {
            let r = c.recv();
            assert_eq!((r.version, r.opcode), (1, SYNC_REPLY), "{r:?}");
            r.payload
        })
        .collect()
}

/// Names of one SYNC payload: each NUL-terminated, nothing after the last NUL.
fn sync_names(payload: &[u8]) -> Vec<Vec<u8>> {
    assert_eq!(payload.last(), Some(&0), "SYNC payload ends with a NUL");
    payload[..payload.len() - 1]
        .split(|&b| b == 0)
        .map(<[u8]>::to_vec)
        .collect()
}

// ---- the protocol's table, row by row ----

#[test]
fn acq_of_a_free_name_is_acquired_at_once_without_ack() {
    let d = Daemon::start(&[]);
    let mut a = d.lockd();
    a.ask(ACQ, b"free\0", ACQUIRED, b"free\0");
    // No ACK before or after: the next frame answers the next request.
    a.ask(PING, b"after", PONG, b"after");
    assert_silent(&mut a, QUIET, "nothing more after an immediate grant");
}

#[test]
fn acq_of_a_name_held_by_another_is_acked_now_and_acquired_after_release() {
    let d = Daemon::start(&[]);
    let (mut a, mut b) = (d.lockd(), d.lockd());
    a.ask(ACQ, b"x\0", ACQUIRED, b"x\0");
    b.ask(ACQ, b"x\0from b", ACK, b"x\0from b");
    assert_silent(&mut b, QUIET, "the waiter before the release");
    a.ask(REL, b"x\0", RELEASED, b"x\0");
    b.want(ACQUIRED, b"x\0from b");
    // b holds it now: a TRY by a would block.
    a.ask(TRY, b"x\0", WBLOCK, b"x\0");
    assert_silent(&mut a, QUIET, "the releaser gets nothing more");
}

#[test]
fn acq_by_the_holder_itself_queues_behind_its_own_lock() {
    let d = Daemon::start(&[]);
    let (mut a, mut other) = (d.lockd(), d.lockd());
    a.ask(ACQ, b"self\0first", ACQUIRED, b"self\0first");
    a.ask(ACQ, b"self\0second", ACK, b"self\0second");
    assert_silent(&mut a, QUIET, "a self-queued ACQ before the release");
    // Its own REL grants its own queued ACQ: RELEASED, then the ACQUIRED of the second request.
    a.req(REL, b"self\0");
    a.want(RELEASED, b"self\0");
    a.want(ACQUIRED, b"self\0second");
    other.ask(TRY, b"self\0", WBLOCK, b"self\0");
    a.ask(REL, b"self\0", RELEASED, b"self\0");
    other.ask(TRY, b"self\0", ACQUIRED, b"self\0");
    assert_silent(&mut a, QUIET, "one grant per queued ACQ");
}

#[test]
fn queued_acqs_are_granted_in_strict_fifo_order() {
    let d = Daemon::start(&[]);
    let mut holder = d.lockd();
    holder.ask(ACQ, b"q\0", ACQUIRED, b"q\0");
    let mut waiters: Vec<Client> = (0..5).map(|_| d.lockd()).collect();
    for (i, w) in waiters.iter_mut().enumerate() {
        let p = format!("q\0waiter {i}").into_bytes();
        w.ask(ACQ, &p, ACK, &p);
    }
    // Each release (by whoever: here always the first connection, never the holder) hands the
    // lock to the next waiter in arrival order, and to nobody else.
    for i in 0..waiters.len() {
        holder.ask(REL, b"q\0", RELEASED, b"q\0");
        waiters[i].want(ACQUIRED, format!("q\0waiter {i}").as_bytes());
        if let Some(next) = waiters.get_mut(i + 1) {
            assert_silent(next, QUIET, "the next waiter before its turn");
        }
        for (j, w) in waiters.iter_mut().enumerate() {
            assert!(!arrived_now(w), "waiter {j} got something at grant {i}");
        }
    }
    holder.ask(REL, b"q\0", RELEASED, b"q\0");
    holder.ask(REL, b"q\0", ERR, b"q\0");
}

#[test]
fn try_of_a_free_name_acquires_it() {
    let d = Daemon::start(&[]);
    let (mut a, mut b) = (d.lockd(), d.lockd());
    a.ask(TRY, b"t\0", ACQUIRED, b"t\0");
    b.ask(TRY, b"t\0", WBLOCK, b"t\0");
    // It is a real lock: an ACQ queues behind it and is granted on release.
    b.ask(ACQ, b"t\0", ACK, b"t\0");
    a.ask(REL, b"t\0", RELEASED, b"t\0");
    b.want(ACQUIRED, b"t\0");
}

#[test]
fn try_of_a_name_held_by_another_would_block_and_never_queues() {
    let d = Daemon::start(&[]);
    let (mut a, mut b) = (d.lockd(), d.lockd());
    a.ask(ACQ, b"t\0", ACQUIRED, b"t\0");
    b.ask(TRY, b"t\0b", WBLOCK, b"t\0b");
    a.ask(REL, b"t\0", RELEASED, b"t\0");
    assert_silent(&mut b, QUIET, "a failed TRY is not a waiter");
    // The name is free, not handed to b.
    a.ask(REL, b"t\0", ERR, b"t\0");
}

#[test]
fn try_of_a_name_held_by_the_caller_would_block() {
    let d = Daemon::start(&[]);
    let mut a = d.lockd();
    a.ask(ACQ, b"mine\0", ACQUIRED, b"mine\0");
    a.ask(TRY, b"mine\0", WBLOCK, b"mine\0");
    a.ask(REL, b"mine\0", RELEASED, b"mine\0");
    assert_silent(&mut a, QUIET, "a TRY never queues, also not behind itself");
}

#[test]
fn try_of_an_orphan_would_block() {
    let d = Daemon::start(&[]);
    let mut stats = Stats::of(&d);
    let mut a = d.lockd();
    a.ask(ACQ, b"orphan\0", ACQUIRED, b"orphan\0");
    drop(a);
    stats.wait_for("lockd_orphaned", 1);
    let mut b = d.lockd();
    b.ask(TRY, b"orphan\0", WBLOCK, b"orphan\0");
    assert_eq!(stats.lockd()[..3], [0, 1, 0], "held, orphaned, waiting");
}

#[test]
fn rel_by_a_connection_that_does_not_hold_the_lock_releases_it() {
    let d = Daemon::start(&[]);
    let (mut a, mut b, mut c) = (d.lockd(), d.lockd(), d.lockd());
    a.ask(ACQ, b"shared\0", ACQUIRED, b"shared\0");
    c.ask(ACQ, b"shared\0c", ACK, b"shared\0c");
    // "nobody 'owns' a lock, so anybody can unlock somebody else's lock"
    b.ask(REL, b"shared\0by b", RELEASED, b"shared\0by b");
    c.want(ACQUIRED, b"shared\0c");
    assert_silent(&mut a, QUIET, "the former holder is not told");
    assert_silent(&mut b, QUIET, "the releaser gets only RELEASED");
}

#[test]
fn rel_of_an_unlocked_name_is_an_error_echoing_the_payload() {
    let d = Daemon::start(&[]);
    let mut a = d.lockd();
    a.ask(REL, b"never\0tail", ERR, b"never\0tail");
    a.ask(ACQ, b"once\0", ACQUIRED, b"once\0");
    a.ask(REL, b"once\0", RELEASED, b"once\0");
    a.ask(REL, b"once\0", ERR, b"once\0");
}

#[test]
fn ping_echoes_any_bytes_without_needing_a_nul() {
    let d = Daemon::start(&[]);
    let mut a = d.lockd();
    let all_bytes: Vec<u8> = (0..=255).collect();
    let big: Vec<u8> = (0..MAX_PAYLOAD).map(|i| (i % 251) as u8).collect();
    let payloads: [&[u8]; 6] = [b"", b"no nul", b"\0", b"a\0b\0c", &all_bytes, &big];
    for p in payloads {
        a.ask(PING, p, PONG, p);
    }
}

#[test]
fn adopt_of_an_orphan_makes_the_caller_its_holder() {
    let d = orphan_daemon();
    let mut stats = Stats::of(&d);
    let mut a = d.lockd();
    a.ask(ACQ, b"adoptee\0", ACQUIRED, b"adoptee\0");
    drop(a);
    stats.wait_for("lockd_orphaned", 1);
    let mut b = d.lockd();
    b.ask(ADOPT, b"adoptee\0b", ACK, b"adoptee\0b");
    assert_eq!(stats.lockd()[..3], [1, 0, 0], "held, orphaned, waiting");
    // b holds it like any holder: adopting again fails, and its own REL frees it.
    b.ask(ADOPT, b"adoptee\0", ERR, b"adoptee\0");
    b.ask(REL, b"adoptee\0", RELEASED, b"adoptee\0");
    b.ask(TRY, b"adoptee\0", ACQUIRED, b"adoptee\0");
}

#[test]
fn adopt_of_a_held_or_free_name_is_an_error() {
    let d = Daemon::start(&[]);
    let (mut a, mut b) = (d.lockd(), d.lockd());
    b.ask(ADOPT, b"free\0", ERR, b"free\0");
    a.ask(ACQ, b"held\0", ACQUIRED, b"held\0");
    b.ask(ADOPT, b"held\0x", ERR, b"held\0x");
    a.ask(ADOPT, b"held\0", ERR, b"held\0");
    // The failed ADOPTs took nothing: a still holds it.
    b.ask(TRY, b"held\0", WBLOCK, b"held\0");
    a.ask(REL, b"held\0", RELEASED, b"held\0");
}

#[test]
fn sync_lists_every_held_and_orphaned_name_nul_terminated_in_one_reply() {
    let d = orphan_daemon();
    let mut stats = Stats::of(&d);
    let (mut a, mut b, mut c) = (d.lockd(), d.lockd(), d.lockd());
    c.ask(SYNC, b"", SYNC_REPLY, b""); // empty table: one empty reply
    a.ask(ACQ, b"held by a\0", ACQUIRED, b"held by a\0");
    a.ask(ACQ, b"\xff\xfe binary\0", ACQUIRED, b"\xff\xfe binary\0");
    a.ask(ACQ, b"\0", ACQUIRED, b"\0"); // the empty name is a name
    b.ask(ACQ, b"orphan\0", ACQUIRED, b"orphan\0");
    b.ask(ACQ, b"held by a\0", ACK, b"held by a\0");
    drop(b);
    stats.wait_for("lockd_orphaned", 1);
    stats.wait_for("lockd_waiting", 0);
    c.req(SYNC, b"");
    let frames = sync_frames(&mut c, 1);
    let mut got = sync_names(&frames[0]);
    got.sort();
    let want: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"held by a".to_vec(),
        b"orphan".to_vec(),
        b"\xff\xfe binary".to_vec(),
    ];
    assert_eq!(got, want);
    // Exactly one reply for a small table: the next frame answers the next request.
    c.ask(PING, b"next", PONG, b"next");
}

#[test]
fn sync_over_the_frame_limit_is_split_into_whole_names_and_ended_by_an_empty_reply() {
    let _serial = serial();
    let d = Daemon::start(&[]);
    let mut a = d.lockd();
    const NAMES: usize = 1100;
    const LEN: usize = 1000; // 1100 * 1001 bytes = 1_101_100 > 1_048_575
    let name = |i: usize| {
        let mut n = format!("{i:06}-").into_bytes();
        n.resize(LEN, b'a' + (i % 26) as u8);
        n
    };
    // Pipelined in chunks (bounded buffers on both sides), every grant checked.
    for chunk in (0..NAMES).collect::<Vec<_>>().chunks(100) {
        let mut bytes = Vec::new();
        for &i in chunk {
            bytes.extend(req(ACQ, &nul(&name(i))));
        }
        a.send(&bytes);
        for &i in chunk {
            a.want(ACQUIRED, &nul(&name(i)));
        }
    }
    let mut c = d.lockd();
    c.req(SYNC, b"");
    // Replies up to the empty one that ends the answer. At most 1047 whole names fit in
    // 1_048_575 bytes (1047 * 1001 = 1_048_047), so there are at least two before it.
    let mut frames = Vec::new();
    loop {
        let f = sync_frames(&mut c, 1).remove(0);
        if f.is_empty() {
            break;
        }
        frames.push(f);
        assert!(frames.len() <= NAMES, "no end to the SYNC answer");
    }
    assert!(
        frames.len() >= 2,
        "{} bytes of names in one reply",
        NAMES * (LEN + 1)
    );
    let mut seen = BTreeSet::new();
    for f in &frames {
        assert!(f.len() <= MAX_PAYLOAD);
        for n in sync_names(f) {
            assert_eq!(n.len(), LEN, "a whole name per NUL");
            assert!(seen.insert(n), "a name listed twice");
        }
    }
    let want: BTreeSet<Vec<u8>> = (0..NAMES).map(name).collect();
    assert_eq!(seen, want);
    c.ask(PING, b"", PONG, b"");
}

#[test]
fn sync_exactly_filling_one_frame_is_one_reply_and_one_byte_more_splits() {
    let d = Daemon::start(&[]);
    let (mut a, mut c) = (d.lockd(), d.lockd());
    // One name whose NUL-terminated form is exactly the maximum payload.
    let big = vec![b'n'; MAX_PAYLOAD - 1];
    a.ask(ACQ, &nul(&big), ACQUIRED, &nul(&big));
    c.req(SYNC, b"");
    assert_eq!(sync_frames(&mut c, 1), vec![nul(&big)]);
    c.ask(PING, b"one reply", PONG, b"one reply");
    // Add the empty name (one byte listed): now it cannot fit one frame.
    a.ask(ACQ, b"\0", ACQUIRED, b"\0");
    c.req(SYNC, b"");
    let mut frames = sync_frames(&mut c, 3);
    assert_eq!(frames.pop(), Some(Vec::new()), "ended by an empty reply");
    frames.sort_by_key(Vec::len);
    assert_eq!(frames, vec![b"\0".to_vec(), nul(&big)]);
    c.ask(PING, b"", PONG, b"");
}

#[test]
fn unknown_opcode_is_an_error_echoing_the_payload() {
    let d = Daemon::start(&[]);
    let mut a = d.lockd();
    for opcode in [0, 7, 100, ACQUIRED, SYNC_REPLY, 255] {
        a.ask(opcode, b"what\0ever", ERR, b"what\0ever");
        a.ask(opcode, b"", ERR, b"");
    }
    // The connection is still usable and nothing was locked.
    a.ask(REL, b"what\0", ERR, b"what\0");
    a.ask(PING, b"ok", PONG, b"ok");
}

// ---- the protocol's rules, one by one ----

#[test]
fn lock_operation_with_an_empty_payload_is_an_empty_error_and_the_connection_stays_open() {
    let d = Daemon::start(&[]);
    let mut a = d.lockd();
    for opcode in [ACQ, REL, TRY, ADOPT] {
        a.ask(opcode, b"", ERR, b"");
        a.ask(PING, b"still open", PONG, b"still open");
    }
    a.ask(SYNC, b"", SYNC_REPLY, b""); // nothing was locked
}

#[test]
fn lock_operation_without_a_nul_is_an_error_echoing_it_and_the_connection_stays_open() {
    let d = Daemon::start(&[]);
    let mut a = d.lockd();
    for opcode in [ACQ, REL, TRY, ADOPT] {
        a.ask(opcode, b"no terminator", ERR, b"no terminator");
        a.ask(PING, b"still open", PONG, b"still open");
    }
    a.ask(SYNC, b"", SYNC_REPLY, b"");
    a.ask(TRY, b"no terminator\0", ACQUIRED, b"no terminator\0");
}

#[test]
fn bad_version_gets_an_empty_error_then_the_connection_closes() {
    let d = Daemon::start(&[]);
    let mut other = d.lockd();
    other.ask(ACQ, b"kept\0", ACQUIRED, b"kept\0");
    for version in [0u8, 2, 15] {
        let name = nul(format!("v{version}").as_bytes());
        let mut bad = d.lockd();
        bad.ask(ACQ, &name, ACQUIRED, &name);
        // The bad frame, with a valid request behind it that must not be answered.
        let mut bytes = frame(version, PING, b"bad");
        bytes.extend(req(PING, b"never"));
        bad.send(&bytes);
        bad.want(ERR, b"");
        bad.expect_closed();
        assert!(
            bad.pending.is_empty(),
            "nothing after the ERR: {:?}",
            bad.pending
        );
        // Closing made its lock an orphan; the other connection is unaffected.
        other.ask(TRY, &name, WBLOCK, &name);
        other.ask(PING, b"fine", PONG, b"fine");
    }
    other.ask(REL, b"kept\0", RELEASED, b"kept\0");
}

#[test]
fn bad_version_behind_a_pending_request_is_answered_in_order_then_closes() {
    let d = Daemon::start(&[]);
    let (mut holder, mut bad) = (d.lockd(), d.lockd());
    holder.ask(ACQ, b"p\0", ACQUIRED, b"p\0");
    let mut bytes = req(ACQ, b"p\0");
    bytes.extend(req(PING, b"first"));
    bytes.extend(frame(3, ACQ, b"p\0"));
    bad.send(&bytes);
    bad.want(ACK, b"p\0");
    bad.want(PONG, b"first");
    bad.want(ERR, b"");
    bad.expect_closed();
    // Its queued ACQ left the queue with it: the release frees the name.
    let mut stats = Stats::of(&d);
    stats.wait_for("lockd_waiting", 0);
    holder.ask(REL, b"p\0", RELEASED, b"p\0");
    holder.ask(TRY, b"p\0", ACQUIRED, b"p\0");
}

#[test]
fn holder_disconnect_turns_its_locks_into_orphans() {
    let d = Daemon::start(&[]);
    let mut stats = Stats::of(&d);
    let (mut a, mut b) = (d.lockd(), d.lockd());
    a.ask(ACQ, b"one\0", ACQUIRED, b"one\0");
    a.ask(TRY, b"two\0", ACQUIRED, b"two\0");
    b.ask(ACQ, b"three\0", ACQUIRED, b"three\0");
    // a also waits for b's lock: that wait leaves with a.
    a.ask(ACQ, b"three\0", ACK, b"three\0");
    assert_eq!(stats.lockd()[..3], [3, 0, 1]);
    drop(a);
    stats.wait_for("lockd_orphaned", 2);
    assert_eq!(stats.lockd()[..3], [1, 2, 0], "held, orphaned, waiting");
    // Still locked (default timeout is 5 s): TRY blocks, ACQ queues, SYNC lists them.
    b.ask(TRY, b"one\0", WBLOCK, b"one\0");
    b.ask(ACQ, b"two\0", ACK, b"two\0");
    b.req(SYNC, b"");
    let mut names = sync_names(&sync_frames(&mut b, 1)[0]);
    names.sort();
    assert_eq!(names, [b"one".to_vec(), b"three".to_vec(), b"two".to_vec()]);
    // The departed waiter is skipped: b's release of "three" frees it.
    b.ask(REL, b"three\0", RELEASED, b"three\0");
    b.ask(REL, b"three\0", ERR, b"three\0");
}

#[test]
fn waiter_is_granted_an_orphan_only_after_the_orphan_timeout() {
    let _serial = serial();
    let d = orphan_daemon();
    let (mut a, mut b) = (d.lockd(), d.lockd());
    a.ask(ACQ, b"slow\0", ACQUIRED, b"slow\0");
    b.ask(ACQ, b"slow\0b", ACK, b"slow\0b");
    let closed = Instant::now();
    drop(a);
    // Halfway through the timeout: nothing yet.
    assert_silent(
        &mut b,
        Duration::from_millis(ORPHAN_MS / 2),
        "the waiter halfway through the orphan timeout",
    );
    b.want(ACQUIRED, b"slow\0b");
    let took = closed.elapsed();
    eprintln!("orphan hand-off: --orphan-timeout {ORPHAN_MS} ms, ACQUIRED after {took:?}");
    // The timer starts when the daemon sees the close (after `closed`); the daemon's clock has
    // millisecond resolution, hence the 1 ms allowance below the timeout.
    assert!(
        took >= Duration::from_millis(ORPHAN_MS - 1),
        "granted before the timeout: {took:?}"
    );
    assert!(
        took <= Duration::from_millis(ORPHAN_MS + SLACK_MS),
        "granted late: {took:?}"
    );
    let mut stats = Stats::of(&d);
    assert_eq!(stats.lockd(), [1, 0, 0, 2, 1, 0]);
}

#[test]
fn orphan_without_waiters_is_freed_after_the_timeout() {
    let _serial = serial();
    let d = orphan_daemon();
    let mut stats = Stats::of(&d);
    let mut a = d.lockd();
    a.ask(ACQ, b"gone\0", ACQUIRED, b"gone\0");
    // A self-queued ACQ of the departing holder must not be granted to anybody.
    a.ask(ACQ, b"gone\0again", ACK, b"gone\0again");
    drop(a);
    stats.wait_for("lockd_orphan_expiries", 1);
    assert_eq!(stats.lockd(), [0, 0, 0, 1, 1, 0]);
    let mut b = d.lockd();
    b.ask(ADOPT, b"gone\0", ERR, b"gone\0");
    b.ask(TRY, b"gone\0", ACQUIRED, b"gone\0");
}

#[test]
fn waiter_that_disconnects_before_its_turn_is_skipped() {
    let d = Daemon::start(&[]);
    let mut stats = Stats::of(&d);
    let (mut a, mut b, mut c) = (d.lockd(), d.lockd(), d.lockd());
    a.ask(ACQ, b"turn\0", ACQUIRED, b"turn\0");
    b.ask(ACQ, b"turn\0b", ACK, b"turn\0b");
    c.ask(ACQ, b"turn\0c", ACK, b"turn\0c");
    drop(b);
    stats.wait_for("lockd_waiting", 1);
    // A newcomer, perhaps in b's old slot: waiters are connections, not slots or descriptors.
    let mut newcomer = d.lockd();
    newcomer.ask(PING, b"hi", PONG, b"hi");
    a.ask(REL, b"turn\0", RELEASED, b"turn\0");
    c.want(ACQUIRED, b"turn\0c");
    assert_silent(
        &mut newcomer,
        QUIET,
        "b's turn is not given to its successor",
    );
    assert_eq!(stats.lockd()[..4], [1, 0, 0, 2]);
}

#[test]
fn adopt_well_before_the_orphan_timeout_keeps_the_waiter_waiting() {
    let _serial = serial();
    let d = orphan_daemon();
    let mut stats = Stats::of(&d);
    let (mut a, mut b, mut c) = (d.lockd(), d.lockd(), d.lockd());
    a.ask(ACQ, b"race\0", ACQUIRED, b"race\0");
    b.ask(ACQ, b"race\0b", ACK, b"race\0b");
    let closed = Instant::now();
    drop(a);
    stats.wait_for("lockd_orphaned", 1);
    let adopt_at = closed.elapsed();
    assert!(
        adopt_at < Duration::from_millis(ORPHAN_MS / 2),
        "the orphan was seen too late to race the timer: {adopt_at:?}"
    );
    c.ask(ADOPT, b"race\0c", ACK, b"race\0c");
    // Well past the old deadline, b still waits: the adopted lock has no timer any more.
    let past = Duration::from_millis(ORPHAN_MS + ORPHAN_MS / 2).saturating_sub(closed.elapsed());
    assert_silent(&mut b, past, "the waiter after an adoption");
    assert_eq!(stats.lockd(), [1, 0, 1, 1, 0, 1]);
    c.ask(REL, b"race\0", RELEASED, b"race\0");
    b.want(ACQUIRED, b"race\0b");
}

#[test]
fn adopt_after_the_orphan_timeout_is_an_error() {
    let _serial = serial();
    let d = orphan_daemon();
    let (mut a, mut b, mut c) = (d.lockd(), d.lockd(), d.lockd());
    a.ask(ACQ, b"late\0", ACQUIRED, b"late\0");
    b.ask(ACQ, b"late\0b", ACK, b"late\0b");
    drop(a);
    // The timer expired and granted b: the name is held now, not an orphan.
    b.want(ACQUIRED, b"late\0b");
    c.ask(ADOPT, b"late\0", ERR, b"late\0");
    b.ask(REL, b"late\0", RELEASED, b"late\0");
    // Free now: still nothing to adopt.
    c.ask(ADOPT, b"late\0", ERR, b"late\0");
}

#[test]
fn rel_of_an_orphan_frees_it_and_cancels_its_timer() {
    let _serial = serial();
    let d = orphan_daemon();
    let mut stats = Stats::of(&d);
    let (mut a, mut b, mut c) = (d.lockd(), d.lockd(), d.lockd());
    a.ask(ACQ, b"cut\0", ACQUIRED, b"cut\0");
    b.ask(ACQ, b"cut\0b", ACK, b"cut\0b");
    drop(a);
    stats.wait_for("lockd_orphaned", 1);
    c.ask(REL, b"cut\0", RELEASED, b"cut\0");
    b.want(ACQUIRED, b"cut\0b");
    // The old timer must not fire on b's lock.
    assert_silent(
        &mut b,
        Duration::from_millis(ORPHAN_MS + ORPHAN_MS / 2),
        "after the released orphan's deadline",
    );
    assert_eq!(stats.lockd(), [1, 0, 0, 2, 0, 0]);
    c.ask(TRY, b"cut\0", WBLOCK, b"cut\0");
}

#[test]
fn pipelined_requests_in_one_write_are_answered_in_order() {
    let d = Daemon::start(&[]);
    let mut a = d.lockd();
    let mut bytes = Vec::new();
    for (op, p) in [
        (ACQ, &b"pipe\0"[..]),
        (TRY, b"pipe\0"),
        (PING, b"ping 1"),
        (ACQ, b"pipe\0second"),
        (TRY, b"other\0"),
        (REL, b"pipe\0"),
        (SYNC, b""),
        (9, b"unknown"),
        (REL, b""),
        (REL, b"pipe\0"),
        (REL, b"other\0"),
        (PING, b"ping 2"),
    ] {
        bytes.extend(req(op, p));
    }
    a.send(&bytes);
    a.want(ACQUIRED, b"pipe\0");
    a.want(WBLOCK, b"pipe\0");
    a.want(PONG, b"ping 1");
    a.want(ACK, b"pipe\0second");
    a.want(ACQUIRED, b"other\0");
    a.want(RELEASED, b"pipe\0");
    a.want(ACQUIRED, b"pipe\0second"); // the queued ACQ, granted by the REL before it
    let mut names = sync_names(&sync_frames(&mut a, 1)[0]);
    names.sort();
    assert_eq!(names, [b"other".to_vec(), b"pipe".to_vec()]);
    a.want(ERR, b"unknown");
    a.want(ERR, b"");
    a.want(RELEASED, b"pipe\0");
    a.want(RELEASED, b"other\0");
    a.want(PONG, b"ping 2");
    assert_silent(&mut a, QUIET, "one reply per request");
}

#[test]
fn pending_acq_does_not_block_the_connection() {
    let d = Daemon::start(&[]);
    let (mut a, mut b) = (d.lockd(), d.lockd());
    a.ask(ACQ, b"busy\0", ACQUIRED, b"busy\0");
    b.ask(ACQ, b"busy\0", ACK, b"busy\0");
    b.ask(PING, b"meanwhile", PONG, b"meanwhile");
    b.ask(TRY, b"busy\0", WBLOCK, b"busy\0");
    b.ask(TRY, b"idle\0", ACQUIRED, b"idle\0");
    b.ask(ACQ, b"idle2\0", ACQUIRED, b"idle2\0");
    b.ask(REL, b"idle\0", RELEASED, b"idle\0");
    b.req(SYNC, b"");
    let mut names = sync_names(&sync_frames(&mut b, 1)[0]);
    names.sort();
    assert_eq!(names, [b"busy".to_vec(), b"idle2".to_vec()]);
    a.ask(REL, b"busy\0", RELEASED, b"busy\0");
    b.want(ACQUIRED, b"busy\0");
}

#[test]
fn unsolicited_acquired_arrives_when_the_grant_happens_between_other_replies() {
    let d = Daemon::start(&[]);
    let (mut a, mut b) = (d.lockd(), d.lockd());
    a.ask(ACQ, b"u\0", ACQUIRED, b"u\0");
    b.ask(ACQ, b"u\0", ACK, b"u\0");
    // b asks nothing: the grant alone wakes it.
    a.ask(REL, b"u\0", RELEASED, b"u\0");
    b.want(ACQUIRED, b"u\0");
    // Now with b busy: its PONGs before and after the grant, the ACQUIRED between them,
    // exactly once.
    a.ask(ACQ, b"w\0", ACQUIRED, b"w\0");
    b.ask(ACQ, b"w\0", ACK, b"w\0");
    b.ask(PING, b"before", PONG, b"before");
    a.ask(REL, b"w\0", RELEASED, b"w\0");
    b.want(ACQUIRED, b"w\0");
    b.ask(PING, b"after", PONG, b"after");
    assert_silent(&mut b, QUIET, "one ACQUIRED per grant");
}

#[test]
fn frames_arriving_one_byte_at_a_time_are_parsed() {
    let d = Daemon::start(&[]);
    let mut a = d.lockd();
    let mut bytes = req(ACQ, b"frag\0mented");
    bytes.extend(req(PING, b""));
    bytes.extend(req(PING, b"xyz"));
    bytes.extend(req(REL, b"frag\0"));
    for (i, byte) in bytes.iter().enumerate() {
        a.send(&[*byte]);
        // A pause now and then lets the daemon see most single bytes in separate reads.
        if i % 2 == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    a.want(ACQUIRED, b"frag\0mented");
    a.want(PONG, b"");
    a.want(PONG, b"xyz");
    a.want(RELEASED, b"frag\0");
    assert_silent(&mut a, QUIET, "one reply per frame");
}

#[test]
fn bytes_after_the_nul_are_echoed_and_ignored_for_the_name() {
    let d = Daemon::start(&[]);
    let (mut a, mut b) = (d.lockd(), d.lockd());
    a.ask(ACQ, b"n\0a's tail\0\xff", ACQUIRED, b"n\0a's tail\0\xff");
    b.ask(TRY, b"n\0other tail", WBLOCK, b"n\0other tail");
    b.ask(ACQ, b"n\0b's tail", ACK, b"n\0b's tail");
    a.ask(REL, b"n\0yet another", RELEASED, b"n\0yet another");
    b.want(ACQUIRED, b"n\0b's tail");
    b.req(SYNC, b"");
    assert_eq!(sync_frames(&mut b, 1), vec![b"n\0".to_vec()]);
    a.ask(ADOPT, b"n\0tail", ERR, b"n\0tail");
}

// ---- scale ----

#[test]
fn thousand_waiters_on_one_name_are_granted_one_at_a_time_in_fifo_order() {
    let _serial = serial();
    const N: usize = 1000;
    let d = Daemon::start(&[]);
    let mut stats = Stats::of(&d);
    let payload = |i: usize| format!("hot\0client {i}").into_bytes();
    let mut clients: Vec<Client> = (0..N).map(|_| d.lockd()).collect();
    let started = Instant::now();
    clients[0].ask(ACQ, &payload(0), ACQUIRED, &payload(0));
    // One at a time, so that the queue order is the client order.
    for (i, c) in clients.iter_mut().enumerate().skip(1) {
        c.ask(ACQ, &payload(i), ACK, &payload(i));
    }
    assert_eq!(stats.lockd()[..4], [1, 0, N as u64 - 1, 1]);
    // Each holder releases in turn: exactly one ACQUIRED, to the next client.
    for i in 0..N - 1 {
        clients[i].ask(REL, b"hot\0", RELEASED, b"hot\0");
        clients[i + 1].want(ACQUIRED, &payload(i + 1));
    }
    clients[N - 1].ask(REL, b"hot\0", RELEASED, b"hot\0");
    // No herd: nobody got anything extra. A TRY on a name of its own goes through the owner
    // after every grant above, so anything stray would arrive before its answer.
    for (i, c) in clients.iter_mut().enumerate() {
        let own = format!("own {i}\0").into_bytes();
        c.ask(TRY, &own, ACQUIRED, &own);
        assert!(!arrived_now(c), "client {i} got something extra");
    }
    eprintln!(
        "1000 waiters queued and granted in turn in {:?}",
        started.elapsed()
    );
    assert_eq!(stats.lockd(), [N as u64, 0, 0, 2 * N as u64, 0, 0]);
}

// ---- stats ----

#[test]
fn lockd_counters_in_memcached_stats_follow_the_table() {
    let _serial = serial();
    let d = orphan_daemon();
    let mut s = Stats::of(&d);
    // [held, orphaned, waiting, grants, orphan_expiries, adoptions]
    assert_eq!(s.lockd(), [0, 0, 0, 0, 0, 0]);
    let (mut a, mut b, mut c) = (d.lockd(), d.lockd(), d.lockd());
    a.ask(ACQ, b"s\0", ACQUIRED, b"s\0");
    assert_eq!(s.lockd(), [1, 0, 0, 1, 0, 0]);
    b.ask(ACQ, b"s\0", ACK, b"s\0");
    c.ask(ACQ, b"s\0", ACK, b"s\0");
    assert_eq!(s.lockd(), [1, 0, 2, 1, 0, 0]);
    c.ask(TRY, b"s\0", WBLOCK, b"s\0");
    assert_eq!(s.lockd(), [1, 0, 2, 1, 0, 0], "a failed TRY counts nothing");
    drop(a);
    s.wait_for("lockd_orphaned", 1);
    assert_eq!(s.lockd(), [0, 1, 2, 1, 0, 0]);
    let mut adopter = d.lockd();
    adopter.ask(ADOPT, b"s\0", ACK, b"s\0");
    assert_eq!(s.lockd(), [1, 0, 2, 1, 0, 1], "an adoption is not a grant");
    drop(adopter);
    s.wait_for("lockd_orphaned", 1);
    b.want(ACQUIRED, b"s\0"); // after the timeout
    s.wait_for("lockd_orphan_expiries", 1);
    assert_eq!(s.lockd(), [1, 0, 1, 2, 1, 1]);
    drop(c); // the last waiter leaves
    s.wait_for("lockd_waiting", 0);
    b.ask(REL, b"s\0", RELEASED, b"s\0");
    assert_eq!(s.lockd(), [0, 0, 0, 2, 1, 1]);
    b.ask(REL, b"s\0", ERR, b"s\0");
    assert_eq!(s.lockd(), [0, 0, 0, 2, 1, 1], "a failed REL counts nothing");
}

// ---- edges the rules imply ----

#[test]
fn bad_version_is_refused_without_waiting_for_the_payload_it_announces() {
    let d = Daemon::start(&[]);
    let mut bad = d.lockd();
    // A header of version 2 that announces 1000 payload bytes, and nothing behind it: the length
    // of a frame in an unknown version means nothing, so the answer cannot depend on it.
    let header = frame(2, ACQ, &[b'x'; 1000])[..4].to_vec();
    bad.send(&header);
    bad.want(ERR, b"");
    bad.expect_closed();
}

#[test]
fn pipeline_deeper_than_the_in_flight_cap_is_answered_completely_and_in_order() {
    let _serial = serial();
    let d = Daemon::start(&[]);
    let mut a = d.lockd();
    // 5000 requests in one write (the worker lets 1024 be at the owner at once), mixing those
    // the worker answers itself (PING, unknown opcodes) with those the owner answers.
    const ROUNDS: usize = 1000;
    let mut bytes = Vec::new();
    for i in 0..ROUNDS {
        let name = nul(format!("deep {}", i % 7).as_bytes());
        bytes.extend(req(TRY, &name));
        bytes.extend(req(PING, format!("{i}").as_bytes()));
        bytes.extend(req(REL, &name));
        bytes.extend(req(200, &name));
        bytes.extend(req(REL, &name));
    }
    a.send(&bytes);
    for i in 0..ROUNDS {
        let name = nul(format!("deep {}", i % 7).as_bytes());
        a.want(ACQUIRED, &name);
        a.want(PONG, format!("{i}").as_bytes());
        a.want(RELEASED, &name);
        a.want(ERR, &name);
        a.want(ERR, &name);
    }
    assert_silent(&mut a, QUIET, "one reply per request");
}

#[test]
fn each_orphan_times_out_from_its_own_disconnect() {
    let _serial = serial();
    let d = orphan_daemon();
    let mut stats = Stats::of(&d);
    let (mut first, mut second, mut w1, mut w2) = (d.lockd(), d.lockd(), d.lockd(), d.lockd());
    first.ask(ACQ, b"early\0", ACQUIRED, b"early\0");
    second.ask(ACQ, b"late\0", ACQUIRED, b"late\0");
    w1.ask(ACQ, b"early\0w", ACK, b"early\0w");
    w2.ask(ACQ, b"late\0w", ACK, b"late\0w");
    let t0 = Instant::now();
    drop(first);
    stats.wait_for("lockd_orphaned", 1);
    // The second holder leaves half a timeout later (the pause is the test's input, not a wait
    // for the daemon).
    std::thread::sleep(Duration::from_millis(ORPHAN_MS / 2));
    let t1 = Instant::now();
    drop(second);
    w1.want(ACQUIRED, b"early\0w");
    let early = t0.elapsed();
    assert_silent(
        &mut w2,
        Duration::from_millis(ORPHAN_MS / 4),
        "the later orphan when the earlier one expires",
    );
    w2.want(ACQUIRED, b"late\0w");
    let late = t1.elapsed();
    eprintln!("per-orphan timeouts: {early:?} from the first close, {late:?} from the second");
    for took in [early, late] {
        assert!(took >= Duration::from_millis(ORPHAN_MS - 1), "{took:?}");
        assert!(
            took <= Duration::from_millis(ORPHAN_MS + SLACK_MS),
            "{took:?}"
        );
    }
}

#[test]
fn rel_by_the_first_waiter_grants_the_lock_to_that_waiter() {
    let d = Daemon::start(&[]);
    let (mut a, mut b) = (d.lockd(), d.lockd());
    a.ask(ACQ, b"r\0", ACQUIRED, b"r\0");
    b.ask(ACQ, b"r\0b", ACK, b"r\0b");
    b.req(REL, b"r\0");
    b.want(RELEASED, b"r\0");
    b.want(ACQUIRED, b"r\0b");
    a.ask(TRY, b"r\0", WBLOCK, b"r\0");
    assert_silent(&mut a, QUIET, "the released holder is not told");
}

#[test]
fn departed_waiters_grant_never_reaches_connections_opened_after_it() {
    let d = Daemon::start(&[]);
    let mut stats = Stats::of(&d);
    let mut holder = d.lockd();
    holder.ask(ACQ, b"id\0", ACQUIRED, b"id\0");
    // Several waiters leave, several newcomers arrive (some of them in the freed slots of the
    // workers, as a descriptor-number design would confuse them): nobody is granted.
    let mut leavers: Vec<Client> = (0..4).map(|_| d.lockd()).collect();
    for w in &mut leavers {
        w.ask(ACQ, b"id\0", ACK, b"id\0");
    }
    drop(leavers);
    stats.wait_for("lockd_waiting", 0);
    let mut newcomers: Vec<Client> = (0..8).map(|_| d.lockd()).collect();
    for n in &mut newcomers {
        n.ask(PING, b"", PONG, b"");
    }
    holder.ask(REL, b"id\0", RELEASED, b"id\0");
    holder.ask(TRY, b"id\0", ACQUIRED, b"id\0");
    for n in &mut newcomers {
        assert!(!arrived_now(n), "a newcomer got a departed waiter's grant");
    }
    assert_silent(&mut newcomers[0], QUIET, "newcomers");
}

#[test]
fn acq_sent_just_before_closing_leaves_no_waiter_behind() {
    let d = Daemon::start(&[]);
    let mut stats = Stats::of(&d);
    let mut holder = d.lockd();
    holder.ask(ACQ, b"gone\0", ACQUIRED, b"gone\0");
    for _ in 0..20 {
        let mut c = d.lockd();
        c.req(ACQ, b"gone\0");
        drop(c); // perhaps before the daemon read the ACQ, perhaps after it queued it
    }
    stats.wait_for("curr_connections", 2); // the holder and the stats connection
    stats.wait_for("lockd_waiting", 0);
    holder.ask(REL, b"gone\0", RELEASED, b"gone\0");
    holder.ask(REL, b"gone\0", ERR, b"gone\0");
}

#[test]
fn largest_payload_is_echoed_whole_in_ack_and_in_the_later_acquired() {
    let d = Daemon::start(&[]);
    let (mut a, mut b) = (d.lockd(), d.lockd());
    let mut big = b"big\0".to_vec();
    big.extend((0..MAX_PAYLOAD - 4).map(|i| (i % 253) as u8));
    a.ask(ACQ, &big, ACQUIRED, &big);
    b.ask(ACQ, &big, ACK, &big);
    a.ask(REL, &big, RELEASED, &big);
    b.want(ACQUIRED, &big);
    a.ask(TRY, &big, WBLOCK, &big);
}

// ---- hostile clients ----

#[test]
fn unread_sync_replies_do_not_grow_daemon_memory_without_bound() {
    let _serial = serial();
    let d = Daemon::start(&[]);
    let mut a = d.lockd();
    const NAMES: usize = 1000;
    let name = |i: usize| {
        let mut n = format!("{i:06}").into_bytes();
        n.resize(999, b'a');
        nul(&n)
    };
    for chunk in (0..NAMES).collect::<Vec<_>>().chunks(100) {
        let bytes: Vec<u8> = chunk.iter().flat_map(|&i| req(ACQ, &name(i))).collect();
        a.send(&bytes);
        for &i in chunk {
            a.want(ACQUIRED, &name(i));
        }
    }
    let before = d.rss_kib();
    let mut c = d.lockd();
    const SYNCS: usize = 200;
    c.send(&req(SYNC, b"").repeat(SYNCS));
    // Watch the daemon's memory while the replies go unread (the window is the observation,
    // not a wait for the daemon).
    let mut peak = before;
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        peak = peak.max(d.rss_kib());
        std::thread::sleep(Duration::from_millis(10));
    }
    let grown_mib = peak.saturating_sub(before) / 1024;
    // One table copy (1 MB) per SYNC would be ~200 MiB; the write-buffer limit is 4 MiB.
    assert!(
        grown_mib < 64,
        "{SYNCS} unread SYNCs grew the daemon by {grown_mib} MiB"
    );
    for _ in 0..SYNCS {
        let f = sync_frames(&mut c, 1).remove(0);
        assert_eq!(f.len(), NAMES * 1000);
    }
}

#[test]
fn acqs_queued_past_the_per_connection_cap_get_err_and_the_connection_stays_usable() {
    let d = Daemon::start(&[]);
    let (mut holder, mut greedy) = (d.lockd(), d.lockd());
    let cap = holdfast::server::LOCKD_MAX_QUEUED_PER_CONN;
    holder.send(&req(ACQ, &nul(b"busy")));
    holder.want(ACQUIRED, &nul(b"busy"));
    // Queue `cap` ACQs on the held name: each is acknowledged.
    greedy.send(&req(ACQ, &nul(b"busy")).repeat(cap));
    for _ in 0..cap {
        greedy.want(ACK, &nul(b"busy"));
    }
    // One more that would queue is refused; one that need not queue still works.
    greedy.send(&req(ACQ, &nul(b"busy")));
    greedy.want(ERR, &nul(b"busy"));
    greedy.send(&req(ACQ, &nul(b"free")));
    greedy.want(ACQUIRED, &nul(b"free"));
    // The queued ones are intact: a release grants the first of them.
    holder.send(&req(REL, &nul(b"busy")));
    holder.want(RELEASED, &nul(b"busy"));
    greedy.want(ACQUIRED, &nul(b"busy"));
}

/// A client that sends SYNC and closes its side at once (as the soak's clients do). The SYNC
/// stops parsing (barrier) before the worker reads the EOF behind it; when the reply lifts the
/// barrier, the worker reads the EOF while it rechecks the connection at the end of its turn, and
/// it must still close the connection then, not leave its socket in CLOSE_WAIT forever.
#[test]
fn sync_then_an_immediate_close_closes_the_connection() {
    let _g = serial();
    let d = Daemon::start(&[]);
    let mut stats = Stats::of(&d);
    for _ in 0..20 {
        let mut c = d.lockd();
        c.send(&req(SYNC, b""));
        c.stream
            .shutdown(std::net::Shutdown::Write)
            .expect("shutdown");
        assert_eq!(c.recv().opcode, SYNC_REPLY);
        c.expect_closed();
    }
    stats.wait_for("curr_connections", 1);
}
