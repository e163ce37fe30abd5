//! Hostile clients, faults and limits against the real daemon (`docs/operations.md`,
//! "What each failure does to clients"): slow writers, clients that never read, resets mid-frame, half-closes, lying length
//! fields, connection churn, connection and file-descriptor limits, SIGTERM and SIGPIPE.
//!
//! Every wait is bounded by a deadline; sleeps only pace slow clients or measure CPU over a fixed
//! window. Tests that measure time, memory or CPU, or load the two shared cores hard, hold
//! [`serial`] so that they measure the daemon, not each other.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use common::{mcbin, Client, Daemon, DEADLINE};
use holdfast::proto::dlock::{self as dl, req_type, status, LockFields, Response};
use holdfast::proto::memcache::binary::{opcode, status as bin_status};
use holdfast::server::VERSION_REPLY;

// ---- shared helpers ----

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// One memcached binary request (protocol-binary.xml, "Request header").
fn bin_req(op: u8, key: &[u8], extras: &[u8], value: &[u8], opaque: u32) -> Vec<u8> {
    mcbin::request(op, extras, key, value, opaque, 0)
}

/// One binary response: (opcode, status, opaque, body after the header).
fn bin_resp(c: &mut Client) -> (u8, u16, u32, Vec<u8>) {
    let r = mcbin::read(c);
    (r.opcode, r.status, r.opaque, r.body())
}

const ACQ: u8 = 1;
const REL: u8 = 2;
const TRY: u8 = 3;
const PING: u8 = 4;
const ADOPT: u8 = 5;
const ACQUIRED: u8 = 128;
const WBLOCK: u8 = 129;
const RELEASED: u8 = 130;
const PONG: u8 = 131;
const ACK: u8 = 132;
const ERR: u8 = 133;

/// One old lock-daemon frame of version 1; `len` may lie about the payload.
fn lockd_frame_len(opcode: u8, len: usize, payload: &[u8]) -> Vec<u8> {
    let word = (1u32 << 28) | (u32::from(opcode) << 20) | len as u32;
    let mut out = word.to_be_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

fn lockd_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    lockd_frame_len(opcode, payload.len(), payload)
}

/// The next lockd reply: (opcode, payload).
fn lockd_reply(c: &mut Client) -> (u8, Vec<u8>) {
    let h = c.take(4);
    let word = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
    assert_eq!(word >> 28, 1, "reply version");
    ((word >> 20) as u8, c.take((word & 0xf_ffff) as usize))
}

fn dlock_lock(id: u64, keys: &[&[u8]], wait_us: Option<u64>, lease_us: Option<u64>) -> Vec<u8> {
    let mut out = Vec::new();
    let lock = LockFields {
        wait_micro: wait_us,
        release_micro: lease_us,
        keys,
        native: Default::default(),
    };
    dl::encode_request(&mut out, Some(id), None, req_type::LOCK, Some(lock));
    out
}

fn dlock_ping(id: u64) -> Vec<u8> {
    let mut out = Vec::new();
    dl::encode_request(&mut out, Some(id), None, req_type::PING, None);
    out
}

fn dlock_resp(c: &mut Client) -> Response {
    c.fill(4);
    let len = u32::from_be_bytes([c.pending[0], c.pending[1], c.pending[2], c.pending[3]]) as usize;
    let bytes = c.take(4 + len);
    dl::decode_response(&bytes[4..]).expect("a valid Response")
}

fn dlock_expect(c: &mut Client, id: u64, want: u32) {
    let r = dlock_resp(c);
    assert_eq!(
        (r.request_id, r.status),
        (Some(id), Some(want)),
        "dlock response {r:?}"
    );
}

/// `set key` with `value` over text, expecting STORED.
fn set(c: &mut Client, key: &str, value: &[u8]) {
    let mut req = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
    req.extend_from_slice(value);
    req.extend_from_slice(b"\r\n");
    c.expect(&req, b"STORED\r\n");
}

/// Close with SO_LINGER 0: the kernel sends RST and drops anything unsent.
fn reset(c: Client) {
    socket2::SockRef::from(&c.stream)
        .set_linger(Some(Duration::ZERO))
        .expect("linger");
    drop(c);
}

/// Read until EOF; panics after DEADLINE or on a reset (replies would have been lost).
fn read_to_eof(c: &mut Client) -> Vec<u8> {
    let deadline = Instant::now() + DEADLINE;
    let mut buf = [0u8; 65536];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "no EOF; have {:?}",
            String::from_utf8_lossy(&c.pending)
        );
        c.stream.set_read_timeout(Some(left)).expect("timeout");
        match c.stream.read(&mut buf) {
            Ok(0) => return std::mem::take(&mut c.pending),
            Ok(k) => c.pending.extend_from_slice(&buf[..k]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("read failed before EOF: {e}"),
        }
    }
}

/// Poll `f` until it returns true; panics after DEADLINE with `what`.
fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// Whether any byte (or EOF) is already waiting on `c`, without waiting.
fn something_arrived(c: &Client) -> bool {
    c.stream.set_nonblocking(true).expect("nonblocking");
    let mut buf = [0u8; 1];
    let got = match c.stream.peek(&mut buf) {
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::WouldBlock => false,
        Err(_) => true,
    };
    c.stream.set_nonblocking(false).expect("blocking");
    got
}

/// User + system CPU time of a process in clock ticks (/proc/PID/stat fields 14 and 15).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // The command name may hold spaces; the fields we want follow the last ')'.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime field 15.
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

/// How many of a process's open descriptors are numbered below `limit`.
fn fds_below(pid: u32, limit: u64) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd dir")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .filter(|&fd| fd < limit)
        .count() as u64
}

/// The process state letter of /proc/PID/stat ('Z' once it exited and awaits its parent).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..].chars().next()
}

fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// The daemon must still answer on every protocol.
fn assert_serves(d: &Daemon) {
    d.memcache().expect(b"version\r\n", VERSION_REPLY);
    let mut l = d.lockd();
    l.send(&lockd_frame(PING, b"alive"));
    assert_eq!(lockd_reply(&mut l), (PONG, b"alive".to_vec()));
    let mut k = d.dlock();
    k.send(&dlock_ping(7));
    dlock_expect(&mut k, 7, status::OK);
}

// ---- slow writers ----

/// Send `bytes` one at a time, `PACE` apart.
fn trickle(c: &mut Client, bytes: &[u8]) {
    const PACE: Duration = Duration::from_millis(30);
    for b in bytes {
        c.send(std::slice::from_ref(b));
        thread::sleep(PACE);
    }
}

#[test]
fn clients_sending_one_byte_at_a_time_are_served_on_every_protocol_and_others_meanwhile() {
    let _g = serial();
    let d = Daemon::start(&[]);
    let mut setup = d.memcache();
    set(&mut setup, "k", b"hello");

    let mc = d.memcache.unwrap();
    let lk = d.lockd.unwrap();
    let dk = d.dlock.unwrap();
    let slow = [
        thread::spawn(move || {
            let mut c = Client::connect(mc);
            let req = b"set s 0 0 2\r\nab\r\nget s\r\n";
            trickle(&mut c, req);
            let want = b"STORED\r\nVALUE s 0 2\r\nab\r\nEND\r\n";
            assert_eq!(c.take(want.len()), want, "slow text client");
        }),
        thread::spawn(move || {
            let mut c = Client::connect(mc);
            trickle(&mut c, &bin_req(opcode::GET, b"k", &[], &[], 77));
            let (op, st, opaque, body) = bin_resp(&mut c);
            assert_eq!((op, st, opaque), (opcode::GET, 0, 77), "slow binary client");
            assert_eq!(&body[4..], b"hello", "value after the 4-byte flags");
        }),
        thread::spawn(move || {
            let mut c = Client::connect(lk);
            let mut req = lockd_frame(ACQ, b"slow\0");
            req.extend_from_slice(&lockd_frame(REL, b"slow\0"));
            trickle(&mut c, &req);
            assert_eq!(lockd_reply(&mut c), (ACQUIRED, b"slow\0".to_vec()));
            assert_eq!(lockd_reply(&mut c), (RELEASED, b"slow\0".to_vec()));
        }),
        thread::spawn(move || {
            let mut c = Client::connect(dk);
            trickle(&mut c, &dlock_lock(5, &[b"slow"], Some(0), None));
            dlock_expect(&mut c, 5, status::OK);
        }),
    ];

    // Meanwhile every protocol keeps answering others, each round trip within the deadline.
    let mut fast_mc = d.memcache();
    let mut fast_lk = d.lockd();
    let mut fast_dk = d.dlock();
    let mut rounds = 0u64;
    while slow.iter().any(|t| !t.is_finished()) {
        fast_mc.expect(b"get k\r\n", b"VALUE k 0 5\r\nhello\r\nEND\r\n");
        fast_lk.send(&lockd_frame(PING, b"x"));
        assert_eq!(lockd_reply(&mut fast_lk), (PONG, b"x".to_vec()));
        fast_dk.send(&dlock_ping(rounds));
        dlock_expect(&mut fast_dk, rounds, status::OK);
        rounds += 1;
        thread::sleep(Duration::from_millis(5));
    }
    for t in slow {
        t.join().expect("slow client thread");
    }
    assert!(
        rounds > 10,
        "others were served meanwhile ({rounds} rounds)"
    );
}

// ---- clients that do not read ----

/// A client thread that pipelines `request` forever without reading, until the daemon closes
/// the connection or `limit` passes. Returns (bytes written, closed by the daemon).
fn flood(
    addr: SocketAddr,
    request: Vec<u8>,
    blocked: Arc<AtomicBool>,
    limit: Duration,
) -> thread::JoinHandle<(usize, bool)> {
    thread::spawn(move || {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_write_timeout(Some(Duration::from_millis(100)))
            .expect("write timeout");
        let chunk: Vec<u8> = request
            .iter()
            .copied()
            .cycle()
            .take(request.len() * (65536 / request.len()))
            .collect();
        let end = Instant::now() + limit;
        let mut written = 0;
        while Instant::now() < end {
            match s.write(&chunk) {
                Ok(n) => written += n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    // The daemon stopped reading: its output for us is at the high-water mark.
                    blocked.store(true, Ordering::Release);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return (written, true),
            }
        }
        (written, false)
    })
}

#[test]
fn clients_that_never_read_are_closed_after_the_stall_timeout_and_memory_stays_bounded() {
    let _g = serial();
    let d = Daemon::start(&["--client-stall-timeout", "500"]);
    let mut good = d.memcache();
    let value = vec![b'v'; 1024];
    set(&mut good, "kib", &value);
    let rss_before = d.rss_kib();
    let fds_before = d.open_fds();

    let addr = d.memcache.unwrap();
    let (text_blocked, bin_blocked) = (Arc::new(AtomicBool::new(false)), Arc::default());
    let limit = Duration::from_secs(15);
    let text = flood(addr, b"get kib\r\n".to_vec(), text_blocked.clone(), limit);
    let bin = flood(
        addr,
        bin_req(opcode::GET, b"kib", &[], &[], 1),
        Arc::clone(&bin_blocked),
        limit,
    );
    let mut want = b"VALUE kib 0 1024\r\n".to_vec();
    want.extend_from_slice(&value);
    want.extend_from_slice(b"\r\nEND\r\n");
    let mut peak = 0;
    let mut served_while_blocked = 0;
    while !(text.is_finished() && bin.is_finished()) {
        // Others are served while the two hog their buffers.
        good.expect(b"get kib\r\n", &want);
        if text_blocked.load(Ordering::Acquire) && bin_blocked.load(Ordering::Acquire) {
            served_while_blocked += 1;
        }
        peak = peak.max(d.rss_kib());
        thread::sleep(Duration::from_millis(20));
    }
    let (text_sent, text_closed) = text.join().expect("text flood");
    let (bin_sent, bin_closed) = bin.join().expect("binary flood");
    assert!(text_closed, "text flooder closed ({text_sent} bytes sent)");
    assert!(bin_closed, "binary flooder closed ({bin_sent} bytes sent)");
    assert!(
        served_while_blocked > 0,
        "a reader was served while both were stalled"
    );
    // Each flooder may hold about WBUF_HIGH (4 MiB) plus the replies in flight (1024 x 1 KiB),
    // with allocator slack on top; answering everything they sent would take hundreds of MiB.
    let grown = peak.saturating_sub(rss_before);
    let owed = (text_sent / 9 + bin_sent / 27) * 1024;
    eprintln!(
        "never-read: sent {} + {} MiB of gets (replies: {} MiB); RSS {rss_before} KiB, peak +{grown} KiB",
        text_sent >> 20,
        bin_sent >> 20,
        owed >> 20
    );
    assert!(
        grown < 40 * 1024,
        "RSS grew {grown} KiB for two stalled clients"
    );
    wait_until("the flooders' descriptors are closed", || {
        d.open_fds() == fds_before
    });
    assert_serves(&d);
}

#[test]
fn a_slow_reader_that_keeps_taking_replies_is_not_closed() {
    let _g = serial();
    let d = Daemon::start(&["--client-stall-timeout", "500"]);
    let mut c = d.memcache();
    let value = vec![b'r'; 1024];
    set(&mut c, "kib", &value);
    // 16,000 gets of 1 KiB: about 16 MiB of replies, more than the kernel buffers on both sides
    // plus the daemon's 4 MiB high-water mark, so the daemon's output sits near the mark for most
    // of the read, longer than the stall timeout.
    const GETS: usize = 16_000;
    let writer = {
        let mut s = c.stream.try_clone().expect("clone");
        thread::spawn(move || {
            let reqs = b"get kib\r\n".repeat(GETS);
            s.write_all(&reqs).expect("send the gets");
        })
    };
    let mut one = b"VALUE kib 0 1024\r\n".to_vec();
    one.extend_from_slice(&value);
    one.extend_from_slice(b"\r\nEND\r\n");
    let expected = one.repeat(GETS);
    let total = expected.len();
    let rss_before = d.rss_kib();
    let mut peak = 0;
    let started = Instant::now();
    let mut got = 0;
    while got < total {
        peak = peak.max(d.rss_kib());
        // Take 1 MiB, then pause well under the stall timeout.
        let n = (1 << 20).min(total - got);
        let chunk = c.take(n);
        assert!(chunk == expected[got..got + n], "replies at {got}");
        got += n;
        thread::sleep(Duration::from_millis(50));
    }
    writer.join().expect("writer");
    let took = started.elapsed();
    let grown = peak.saturating_sub(rss_before);
    eprintln!("slow reader: {total} bytes in {took:?}, RSS {rss_before} KiB, peak +{grown} KiB");
    // About the high-water mark plus the replies in flight; not the 16 MiB that went through.
    assert!(
        grown < 16 * 1024,
        "RSS grew {grown} KiB for one slow reader"
    );
    // 16 pauses of 50 ms: the read outlasts the 500 ms stall timeout whatever the machine.
    assert!(
        took > Duration::from_millis(750),
        "the read took {took:?}, longer than the stall timeout"
    );
    c.expect(b"version\r\n", VERSION_REPLY);
}

#[test]
fn output_past_the_hard_cap_closes_the_connection_at_once() {
    let _g = serial();
    // The stall timeout is left at its 10 s default: the close must come from the cap.
    let d = Daemon::start(&[]);
    // Replies to requests are bounded by the reply budget; unsolicited ones are not: every lockd
    // grant echoes its ACQ's payload. A client queues 140 ACQs with 512 KiB payloads on names
    // someone else holds, reads the ACKs, then stops reading; the releases then owe it 70 MiB
    // of ACQUIRED, past the 64 MiB cap.
    let (mut holder, mut greedy) = (d.lockd(), d.lockd());
    let name = |i: usize| {
        let mut p = format!("n{i}").into_bytes();
        p.push(0);
        p.resize(512 * 1024, b'p');
        p
    };
    for i in 0..140 {
        holder.send(&lockd_frame(ACQ, &name(i)[..format!("n{i}").len() + 1]));
        assert_eq!(lockd_reply(&mut holder).0, ACQUIRED);
        greedy.send(&lockd_frame(ACQ, &name(i)));
        assert_eq!(lockd_reply(&mut greedy).0, ACK);
    }
    let fds_before = d.open_fds();
    let started = Instant::now();
    let mut releases = Vec::new();
    for i in 0..140 {
        releases.extend(lockd_frame(REL, &name(i)[..format!("n{i}").len() + 1]));
    }
    holder.send(&releases);
    wait_until("the daemon closed the capped connection", || {
        d.open_fds() < fds_before
    });
    let closed_after = started.elapsed();
    assert!(
        closed_after < Duration::from_secs(5),
        "closed by the cap, not the stall timeout"
    );
    let mut received = 0usize;
    let mut buf = vec![0u8; 1 << 20];
    greedy
        .stream
        .set_read_timeout(Some(DEADLINE))
        .expect("timeout");
    loop {
        match greedy.stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => received += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                panic!("connection still open after the daemon's close")
            }
            Err(_) => break,
        }
    }
    assert!(received < 70 * 1024 * 1024, "not every grant was sent");
    assert_serves(&d);
}

// ---- resets and half-closes ----

#[test]
fn a_reset_mid_frame_releases_or_orphans_locks_as_each_protocol_says() {
    let d = Daemon::start(&[]);

    // memcached text: the reset connection's lock is released; its partial set never applies.
    let mut a = d.memcache();
    set(&mut a, "rt", b"v");
    a.expect(b"lock rt\r\n", b"OK\r\n");
    a.send(b"set rt 0 0 10\r\nabc");
    let mut b = d.memcache();
    b.expect(b"lock rt\r\n", b"LOCKED\r\n");
    reset(a);
    wait_until("the text lock is released", || {
        b.send(b"lock rt\r\n");
        b.line() == "OK\r\n"
    });
    b.expect(b"get rt\r\n", b"VALUE rt 0 1\r\nv\r\nEND\r\n");

    // memcached binary: the same, cut inside a header.
    let mut a = d.memcache();
    set(&mut a, "rb", b"v");
    a.send(&bin_req(opcode::LOCK, b"rb", &[], &[], 1));
    assert_eq!(bin_resp(&mut a).1, bin_status::NO_ERROR);
    a.send(&bin_req(opcode::SET, b"rb", &[0; 8], b"new", 2)[..10]);
    reset(a);
    let mut b = d.memcache();
    wait_until("the binary lock is released", || {
        b.send(&bin_req(opcode::LOCK, b"rb", &[], &[], 3));
        bin_resp(&mut b).1 == bin_status::NO_ERROR
    });

    // old: the lock becomes an orphan (still locked, adoptable).
    let mut a = d.lockd();
    a.send(&lockd_frame(ACQ, b"ro\0"));
    assert_eq!(lockd_reply(&mut a), (ACQUIRED, b"ro\0".to_vec()));
    a.send(&lockd_frame(ACQ, b"other\0")[..2]);
    reset(a);
    let mut b = d.lockd();
    wait_until("the old lock is an orphan", || {
        b.send(&lockd_frame(ADOPT, b"ro\0"));
        match lockd_reply(&mut b) {
            (ACK, _) => true,
            (ERR, _) => false,
            other => panic!("ADOPT answered {other:?}"),
        }
    });
    b.send(&lockd_frame(TRY, b"ro\0"));
    assert_eq!(lockd_reply(&mut b), (WBLOCK, b"ro\0".to_vec()), "held");
    b.send(&lockd_frame(REL, b"ro\0"));
    assert_eq!(lockd_reply(&mut b), (RELEASED, b"ro\0".to_vec()));

    // dlock: connection-bound keys are released, a lease survives.
    let mut a = d.dlock();
    a.send(&dlock_lock(1, &[b"bound"], None, None));
    dlock_expect(&mut a, 1, status::OK);
    a.send(&dlock_lock(2, &[b"lease"], None, Some(60_000_000)));
    dlock_expect(&mut a, 2, status::OK);
    let partial = dlock_lock(3, &[b"more"], None, None);
    a.send(&partial[..partial.len() - 3]);
    let mut b = d.dlock();
    b.send(&dlock_lock(10, &[b"bound"], None, None)); // waits until acquired
    reset(a);
    dlock_expect(&mut b, 10, status::OK);
    b.send(&dlock_lock(11, &[b"lease"], Some(0), None));
    dlock_expect(&mut b, 11, status::ACQUIRE_TIMEOUT);
}

#[test]
fn half_closed_clients_get_every_reply_then_the_daemon_closes() {
    let d = Daemon::start(&[]);

    let mut c = d.memcache();
    c.send(b"set h 0 0 2\r\nhi\r\nget h\r\nversion\r\n");
    c.stream.shutdown(Shutdown::Write).expect("shutdown");
    let mut want = b"STORED\r\nVALUE h 0 2\r\nhi\r\nEND\r\n".to_vec();
    want.extend_from_slice(VERSION_REPLY);
    assert_eq!(
        String::from_utf8_lossy(&read_to_eof(&mut c)),
        String::from_utf8_lossy(&want)
    );

    let mut c = d.memcache();
    let mut req = bin_req(opcode::GET, b"missing", &[], &[], 1);
    req.extend_from_slice(&bin_req(opcode::NOOP, b"", &[], &[], 2));
    c.send(&req);
    c.stream.shutdown(Shutdown::Write).expect("shutdown");
    c.pending = read_to_eof(&mut c);
    assert_eq!(bin_resp(&mut c).1, bin_status::KEY_NOT_FOUND);
    assert_eq!(bin_resp(&mut c).2, 2, "NOOP answered");
    assert!(c.pending.is_empty());

    let mut c = d.lockd();
    let mut req = lockd_frame(ACQ, b"h\0");
    req.extend_from_slice(&lockd_frame(PING, b"p"));
    c.send(&req);
    c.stream.shutdown(Shutdown::Write).expect("shutdown");
    c.pending = read_to_eof(&mut c);
    assert_eq!(lockd_reply(&mut c), (ACQUIRED, b"h\0".to_vec()));
    assert_eq!(lockd_reply(&mut c), (PONG, b"p".to_vec()));
    assert!(c.pending.is_empty());

    let mut c = d.dlock();
    let mut req = dlock_lock(1, &[b"h"], None, None);
    req.extend_from_slice(&dlock_ping(2));
    c.send(&req);
    c.stream.shutdown(Shutdown::Write).expect("shutdown");
    c.pending = read_to_eof(&mut c);
    dlock_expect(&mut c, 1, status::OK);
    dlock_expect(&mut c, 2, status::OK);
    assert!(c.pending.is_empty());
}

// ---- lying length fields ----

#[test]
fn lying_length_fields_get_an_error_or_a_close_and_memory_does_not_follow_the_lie() {
    let _g = serial();
    let d = Daemon::start(&["--dlock-max-message", "65536"]);
    let rss_before = d.rss_kib();
    let junk = vec![0u8; 1 << 20];

    // memcached binary, body length 4 GiB - 1: refused at once; what follows is swallowed.
    let mut c = d.memcache();
    let mut h = bin_req(opcode::SET, b"k", &[0; 8], b"", 9);
    h[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
    c.send(&h);
    let (op, st, opaque, _) = bin_resp(&mut c);
    assert_eq!(
        (op, st, opaque),
        (opcode::SET, bin_status::VALUE_TOO_LARGE, 9)
    );
    for _ in 0..8 {
        c.send(&junk);
    }

    // memcached text, a 2 GiB value: refused at once, swallowed likewise.
    let mut c = d.memcache();
    c.send(b"set k 0 0 2147483000\r\n");
    assert_eq!(c.line(), "SERVER_ERROR object too large for cache\r\n");
    for _ in 0..8 {
        c.send(&junk);
    }

    // dlock, a prefix over --dlock-max-message (and one of 4 GiB): closed at once.
    for len in [65537u32, u32::MAX] {
        let mut c = d.dlock();
        c.send(&len.to_be_bytes());
        c.send(&[0x08, 0x01]);
        c.expect_closed();
    }

    // Lies within the limits (each announces 1 MiB, sends a few bytes): 100 connections of each
    // kind hold only what they sent, then close when their clients do.
    let mut liars = Vec::new();
    for _ in 0..100 {
        let mut c = d.memcache();
        let mut h = bin_req(opcode::SET, b"k", &[0; 8], b"abc", 1);
        h[8..12].copy_from_slice(&((1u32 << 20) - 8).to_be_bytes());
        c.send(&h);
        liars.push(c);
        let mut c = d.lockd();
        c.send(&lockd_frame_len(ACQ, (1 << 20) - 1, b"name\0"));
        liars.push(c);
        let mut c = d.dlock();
        c.send(&65536u32.to_be_bytes());
        c.send(&[0x08, 0x01, 0x10, 0x01]);
        liars.push(c);
    }
    // Everyone else is served meanwhile.
    assert_serves(&d);
    let rss_during = d.rss_kib();
    for c in &mut liars {
        assert!(!something_arrived(c), "no answer to an incomplete frame");
        c.stream.shutdown(Shutdown::Write).expect("shutdown");
    }
    for c in &mut liars {
        assert!(read_to_eof(c).is_empty(), "closed without a reply");
    }
    let grown = rss_during.saturating_sub(rss_before);
    eprintln!("lying lengths: RSS {rss_before} KiB, +{grown} KiB with 300 liars open");
    // The lies add up to over 4 GiB + 2 GiB + 300 MiB; what was really sent is 16 MiB.
    assert!(grown < 24 * 1024, "RSS grew {grown} KiB");
}

// ---- connection churn and limits ----

#[test]
fn ten_thousand_connections_opened_and_closed_leave_fds_and_memory_at_baseline() {
    let _g = serial();
    let d = Daemon::start(&[]);
    const BATCH: usize = 500;
    let batch = |round: usize| {
        let mut conns: Vec<Client> = (0..BATCH)
            .map(|i| {
                let mut c = match (round + i) % 3 {
                    0 => d.memcache(),
                    1 => d.lockd(),
                    _ => d.dlock(),
                };
                match (round + i) % 3 {
                    0 => c.send(b"version\r\n"),
                    1 => c.send(&lockd_frame(PING, b"p")),
                    _ => c.send(&dlock_ping(i as u64)),
                }
                c
            })
            .collect();
        for (i, c) in conns.iter_mut().enumerate() {
            match (round + i) % 3 {
                0 => assert_eq!(c.take(VERSION_REPLY.len()), VERSION_REPLY),
                1 => assert_eq!(lockd_reply(c), (PONG, b"p".to_vec())),
                _ => dlock_expect(c, i as u64, status::OK),
            }
        }
    };
    // One batch first, so that the baseline includes the daemon's warmed-up slabs and allocator.
    let fds_idle = d.open_fds();
    batch(0);
    wait_until("the warm-up connections are closed", || {
        d.open_fds() == fds_idle
    });
    let fds_before = d.open_fds();
    let rss_before = d.rss_kib();
    let started = Instant::now();
    for round in 1..=10_000 / BATCH {
        batch(round);
    }
    let took = started.elapsed();
    wait_until("every connection is closed", || d.open_fds() == fds_before);
    let rss_after = d.rss_kib();
    eprintln!(
        "10k connections in {took:?}: fds {fds_before} -> {}, RSS {rss_before} -> {rss_after} KiB",
        d.open_fds()
    );
    assert!(
        rss_after <= rss_before + 8 * 1024,
        "RSS {rss_before} -> {rss_after} KiB"
    );
    let mut s = d.memcache();
    s.send(b"stats conns\r\n");
    assert_eq!(s.line(), "STAT curr_connections 1\r\n");
}

#[test]
fn connections_over_max_connections_are_closed_at_once_and_the_others_served() {
    let d = Daemon::start(&["--max-connections", "50"]);
    let mut held: Vec<Client> = (0..50)
        .map(|i| {
            // All three listeners count against the one limit.
            let mut c = match i % 3 {
                0 => d.memcache(),
                1 => d.lockd(),
                _ => d.dlock(),
            };
            match i % 3 {
                0 => c.expect(b"version\r\n", VERSION_REPLY),
                1 => {
                    c.send(&lockd_frame(PING, b"p"));
                    assert_eq!(lockd_reply(&mut c), (PONG, b"p".to_vec()));
                }
                _ => {
                    c.send(&dlock_ping(1));
                    dlock_expect(&mut c, 1, status::OK);
                }
            }
            c
        })
        .collect();
    for _ in 0..10 {
        d.memcache().expect_closed();
        d.lockd().expect_closed();
        d.dlock().expect_closed();
    }
    for (i, c) in held.iter_mut().enumerate() {
        match i % 3 {
            0 => c.expect(b"version\r\n", VERSION_REPLY),
            1 => {
                c.send(&lockd_frame(PING, b"q"));
                assert_eq!(lockd_reply(c), (PONG, b"q".to_vec()));
            }
            _ => {
                c.send(&dlock_ping(2));
                dlock_expect(c, 2, status::OK);
            }
        }
    }
    // One leaves: a newcomer gets its place (once the daemon has counted the close).
    held.remove(0);
    wait_until("a newcomer is served", || {
        let mut c = d.memcache();
        c.send(b"version\r\n");
        let mut buf = [0u8; 64];
        c.stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
        matches!(c.stream.read(&mut buf), Ok(n) if buf[..n] == *VERSION_REPLY)
    });
}

#[test]
fn running_out_of_file_descriptors_does_not_spin_and_recovers() {
    let _g = serial();
    let d = Daemon::start(&[]);
    // The daemon raised its soft limit to the hard limit at start; lower both to 64 now, as if it
    // had been started under `ulimit -n 64`.
    const LIMIT: u64 = 64;
    let lim = libc::rlimit {
        rlim_cur: LIMIT,
        rlim_max: LIMIT,
    };
    // SAFETY: prlimit on our own child's PID with a valid new limit and no old-limit output.
    let rc = unsafe {
        libc::prlimit(
            d.pid() as libc::pid_t,
            libc::RLIMIT_NOFILE,
            &lim,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());

    // Fill every descriptor number the daemon may use, each connection served. (It may have
    // inherited descriptors numbered above the limit, such as cargo's jobserver pipe: those do not
    // take a number below it.)
    let mut served = Vec::new();
    while fds_below(d.pid(), LIMIT) < LIMIT {
        let mut c = d.memcache();
        c.expect(b"version\r\n", VERSION_REPLY);
        served.push(c);
    }
    // These wait in the kernel's backlog: accept fails with EMFILE.
    let mut waiting: Vec<Client> = (0..3).map(|_| d.memcache()).collect();
    for c in &mut waiting {
        c.send(b"version\r\n");
    }
    // Let the daemon meet EMFILE (each connect wakes a listener), then measure its CPU over 1 s.
    thread::sleep(Duration::from_millis(100));
    let ticks = clock_ticks_per_second();
    let before = cpu_ticks(d.pid());
    let t0 = Instant::now();
    thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks(d.pid()) - before;
    let window = t0.elapsed();
    eprintln!(
        "fd exhaustion: {} served, CPU {used} ticks ({} ms) in {window:?}",
        served.len(),
        used * 1000 / ticks
    );
    assert!(
        used * 1000 / ticks <= 100,
        "the daemon used {used} ticks in 1 s at its fd limit: busy loop"
    );
    for c in &waiting {
        assert!(!something_arrived(c), "not accepted yet");
    }
    // Recovery: free a few descriptors; the waiting connections are accepted and served.
    served.truncate(served.len() - 5);
    for c in &mut waiting {
        assert_eq!(c.take(VERSION_REPLY.len()), VERSION_REPLY);
    }
    served[0].expect(b"version\r\n", VERSION_REPLY);
}

// ---- signals ----

#[test]
fn sigterm_closes_every_connection_and_exits_zero_within_a_second() {
    let _g = serial();
    let d = Daemon::start(&[]);
    // Connections in every state: a lock holder, a queued old waiter, a waiting dlock Lock, a
    // partial frame.
    let mut mc = d.memcache();
    set(&mut mc, "t", b"v");
    mc.expect(b"lock t\r\n", b"OK\r\n");
    let mut l1 = d.lockd();
    l1.send(&lockd_frame(ACQ, b"t\0"));
    assert_eq!(lockd_reply(&mut l1), (ACQUIRED, b"t\0".to_vec()));
    let mut l2 = d.lockd();
    l2.send(&lockd_frame(ACQ, b"t\0"));
    assert_eq!(lockd_reply(&mut l2), (ACK, b"t\0".to_vec()));
    let mut k1 = d.dlock();
    k1.send(&dlock_lock(1, &[b"t"], None, None));
    dlock_expect(&mut k1, 1, status::OK);
    let mut k2 = d.dlock();
    k2.send(&dlock_lock(2, &[b"t"], None, None));
    let mut partial = d.memcache();
    partial.send(b"set p 0 0 10\r\nab");
    let addr = d.memcache.unwrap();
    let pid = d.pid();

    let started = Instant::now();
    // SAFETY: kill(2) on the PID of our own child, not yet reaped.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    wait_until("the daemon exits", || {
        matches!(proc_state(pid), Some('Z') | None)
    });
    let took = started.elapsed();
    let status = d.terminate(); // reaps it
    eprintln!("SIGTERM: exited in {took:?} with {status}");
    assert!(status.success(), "exit status {status}");
    assert!(took < Duration::from_secs(1), "exit took {took:?}");
    for c in [&mut mc, &mut l1, &mut l2, &mut k1, &mut k2, &mut partial] {
        c.expect_closed();
    }
    assert!(TcpStream::connect(addr).is_err(), "no longer accepting");
}

#[test]
fn a_client_closing_while_the_daemon_writes_a_large_reply_does_not_kill_it() {
    let _g = serial();
    let d = Daemon::start(&[]);
    let mut c = d.memcache();
    set(&mut c, "large", &vec![b'l'; 512 * 1024]);
    for _ in 0..5 {
        // 40 gets of 512 KiB: 20 MiB of replies, most still being written when the client goes.
        let mut c = d.memcache();
        c.send(&b"get large\r\n".repeat(40));
        c.fill(1024);
        drop(c); // unread data: the kernel answers the daemon's next writes with a reset
    }
    let mut c = d.memcache();
    c.send(&b"get large\r\n".repeat(40));
    c.fill(1024);
    reset(c);
    assert_serves(&d);
    assert_ne!(proc_state(d.pid()), Some('Z'), "still running");
}

// ---- the open-file limit ----

#[test]
fn the_daemon_raises_its_open_file_limit_to_the_hard_limit() {
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    let (_, want_hard) = holdfast::fdlimit::limits().expect("getrlimit");
    let soft = 256.min(want_hard);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_holdfast"));
    cmd.args([
        "--memcache",
        "127.0.0.1:0",
        "--lockd",
        "off",
        "--dlock",
        "off",
        "--counter",
        "off",
        "--threads",
        "1",
    ]);
    // SAFETY: the closure runs in the forked child before exec and only calls setrlimit, which
    // is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: soft,
                rlim_max: want_hard,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let d = holdfast_testkit::Daemon::spawn(&mut cmd, &["memcache"], DEADLINE)
        .unwrap_or_else(|e| panic!("start holdfast: {e}"));
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", d.pid())).expect("limits");
    drop(d);
    let row = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files row");
    let nums: Vec<&str> = row.split_whitespace().skip(3).take(2).collect();
    let want = if want_hard == libc::RLIM_INFINITY {
        "unlimited".to_string()
    } else {
        want_hard.to_string()
    };
    assert_eq!(nums, [want.as_str(), want.as_str()], "{row}");
}

#[test]
fn a_client_that_floods_requests_answered_by_nothing_does_not_starve_the_others() {
    let _g = serial();
    let d = Daemon::start(&[]);
    // The flooder's own `version` between floods must be answered too: its connection is the
    // one sure to share the flooder's worker (the others may be on the other one).
    let mut flooder = d.memcache();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let mut s = flooder.stream.try_clone().expect("clone");
        s.set_write_timeout(Some(DEADLINE)).expect("write timeout");
        thread::spawn(move || {
            // `verbosity noreply` is answered by the worker itself, with nothing: no reply to
            // hold the connection back, nothing at the owner.
            let mut chunk = b"verbosity 1 noreply\r\n".repeat(8192);
            chunk.extend_from_slice(b"version\r\n");
            let mut rounds = 0usize;
            while !stop.load(Ordering::Acquire) {
                s.write_all(&chunk).expect("flood");
                rounds += 1;
            }
            rounds
        })
    };
    let mut others: Vec<Client> = (0..4).map(|_| d.memcache()).collect();
    let mut worst = Duration::ZERO;
    for _ in 0..5 {
        let t = Instant::now();
        assert_eq!(flooder.take(VERSION_REPLY.len()), VERSION_REPLY);
        for c in &mut others {
            c.expect(b"version\r\n", VERSION_REPLY);
        }
        worst = worst.max(t.elapsed());
    }
    stop.store(true, Ordering::Release);
    let rounds = writer.join().expect("flooder");
    eprintln!(
        "flood: {} MiB sent; worst round of replies {worst:?}",
        (rounds * (21 * 8192 + 9)) >> 20
    );
    // Before reads were bounded per turn, nothing came back at all while the flood went on.
    assert!(worst < Duration::from_secs(3), "starved for {worst:?}");
}

#[test]
fn unread_pipelined_gets_of_a_large_item_stay_within_the_reply_budget() {
    let _serial = serial();
    let d = Daemon::start(&[]);
    let mut c = d.memcache();
    let value = vec![b'x'; 512 * 1024];
    set(&mut c, "big", &value);
    let before = d.rss_kib();
    // 1024 gets owe 512 MiB of replies; the worker must stop parsing at the reply budget
    // (32 MiB of possible replies in flight), not let the owner build them all.
    let mut greedy = TcpStream::connect(d.memcache.unwrap()).unwrap();
    greedy.write_all(&b"get big\r\n".repeat(1024)).unwrap();
    let mut peak = before;
    let until = Instant::now() + Duration::from_millis(800);
    while Instant::now() < until {
        peak = peak.max(d.rss_kib());
        thread::sleep(Duration::from_millis(20));
    }
    let grown_mib = peak.saturating_sub(before) / 1024;
    // About 32 MiB measured (one budget of replies); 194 MiB without the budget.
    assert!(
        grown_mib < 96,
        "unread gets grew the daemon by {grown_mib} MiB"
    );
    // Others are served meanwhile.
    c.expect(b"get nothing\r\n", b"END\r\n");
}

#[test]
fn a_multi_get_whose_reply_outgrows_the_budget_fails_and_closes() {
    let _serial = serial();
    let d = Daemon::start(&[]);
    let mut c = d.memcache();
    let value = vec![b'y'; 1000 * 1000];
    set(&mut c, "huge", &value);
    // 100 copies of a 1 MB item: 100 MB, past the 32 MiB cap of one reply.
    let mut line = b"get".to_vec();
    for _ in 0..100 {
        line.extend_from_slice(b" huge");
    }
    line.extend_from_slice(b"\r\n");
    let mut greedy = d.memcache();
    greedy.send(&line);
    greedy.expect_closed();
    assert_eq!(
        String::from_utf8_lossy(&greedy.pending),
        "SERVER_ERROR out of memory writing get response\r\n"
    );
    // The daemon is fine and the item still there.
    c.send(b"get huge\r\n");
    assert!(c.line().starts_with("VALUE huge 0 1000000"));
}

/// The admin port's `/metrics` value of `name` (no labels).
fn metric(d: &Daemon, name: &str) -> f64 {
    let mut s = TcpStream::connect(d.admin.expect("admin port")).expect("connect admin");
    s.set_read_timeout(Some(DEADLINE)).expect("timeout");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("ask");
    let mut all = Vec::new();
    s.read_to_end(&mut all).expect("metrics");
    let text = String::from_utf8(all).expect("text");
    let body = &text[text.find("\r\n\r\n").expect("head") + 4..];
    common::sample(&common::check_exposition(body), name, "")
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

#[test]
fn a_flood_of_ten_thousand_pipelining_connections_keeps_the_owners_queue_bounded() {
    let _g = serial();
    // A separate owner thread: the queue is the channel between it and the workers.
    let d = Daemon::start(&["--threads", "2"]);
    const CONNS: usize = 10_000;
    const DEPTH: usize = 100;
    let mut conns: Vec<Client> = (0..CONNS).map(|_| d.memcache()).collect();
    // Every connection sends its whole pipeline before anyone reads a reply: a million
    // requests, about 30 MB, arrive at once.
    let started = Instant::now();
    for (i, c) in conns.iter_mut().enumerate() {
        let mut p = Vec::with_capacity(DEPTH * 32);
        for j in 0..DEPTH {
            p.extend_from_slice(format!("add f{i}.{j} 0 0 1\r\nx\r\n").as_bytes());
        }
        c.send(&p);
    }
    // Another client is answered meanwhile.
    let mut probe = d.memcache();
    let t = Instant::now();
    probe.expect(b"add probe 0 0 1\r\np\r\n", b"STORED\r\n");
    let probe_wait = t.elapsed();
    for c in conns.iter_mut() {
        assert_eq!(c.take(DEPTH * 8), b"STORED\r\n".repeat(DEPTH));
    }
    let took = started.elapsed();
    let peak = metric(&d, "holdfast_owner_queue_requests_peak");
    let now = metric(&d, "holdfast_owner_queue_requests");
    eprintln!(
        "flood of {CONNS} x {DEPTH}: answered in {took:?}; the probe waited {probe_wait:?}; \
         the owner's queue peaked at {peak} requests"
    );
    // 4 batches in the channel and the 64 of the owner's turn, each at most a turn's 4,096
    // requests plus one connection's share of 256 and a poll's 1,024 accepts: far below the
    // million requests of the flood.
    assert!(
        peak > 0.0 && peak <= (4.0 + 64.0) * (4096.0 + 256.0 + 1024.0),
        "{peak}"
    );
    assert_eq!(now, 0.0);
    probe.expect(b"get f9999.99\r\n", b"VALUE f9999.99 0 1\r\nx\r\nEND\r\n");
}

/// The threads that serve requests (the I/O workers and the owner) ask the scheduler for its
/// shortest slice (`holdfast::slice`), so that they run as soon as they wake beside busy
/// processes; the daemon's other threads keep the default. Checked on a kernel that grants
/// such a request to this process.
#[test]
fn the_serving_threads_ask_for_the_shortest_scheduler_slice() {
    if !common::kernel_grants_slices() {
        eprintln!("this kernel grants no slice requests: nothing to check");
        return;
    }
    let d = Daemon::start(&["--threads", "2"]);
    let expected = ["holdfast-owner", "holdfast-worker", "holdfast-worker"]
        .map(|c| (c.to_string(), holdfast::slice::SERVING_THREAD_NANOS))
        .to_vec();
    let (serving, others) = common::serving_threads_once_they_are(d.pid(), &expected);
    assert_eq!(serving, expected);
    for (comm, slice) in others {
        assert_ne!(slice, holdfast::slice::SERVING_THREAD_NANOS, "{comm}");
    }
}
