//! The dlock protocol over TCP against the real daemon (`docs/protocol.md`, "dlock").

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Client, Daemon};
use holdfast::proto::dlock::{self as dl, req_type, status, LockFields, Response};

fn frame(id: u64, t: u64, lock: Option<LockFields<'_>>) -> Vec<u8> {
    let mut out = Vec::new();
    dl::encode_request(&mut out, Some(id), None, t, lock);
    out
}

fn lock_frame(id: u64, keys: &[&[u8]], wait_us: Option<u64>, lease_us: Option<u64>) -> Vec<u8> {
    frame(
        id,
        req_type::LOCK,
        Some(LockFields {
            wait_micro: wait_us,
            release_micro: lease_us,
            keys,
            native: Default::default(),
        }),
    )
}

fn unlock_frame(id: u64, keys: &[&[u8]]) -> Vec<u8> {
    frame(
        id,
        req_type::UNLOCK,
        Some(LockFields {
            keys,
            ..Default::default()
        }),
    )
}

fn read_response(c: &mut Client) -> Response {
    c.fill(4);
    let len = u32::from_be_bytes([c.pending[0], c.pending[1], c.pending[2], c.pending[3]]) as usize;
    let bytes = c.take(4 + len);
    dl::decode_response(&bytes[4..]).expect("a valid Response")
}

fn expect_status(c: &mut Client, id: u64, want: u32) -> Response {
    let r = read_response(c);
    assert_eq!(r.request_id, Some(id), "request id echoed");
    assert_eq!(r.status, Some(want), "status of request {id}: {r:?}");
    assert_eq!(r.version, Some(2));
    r
}

fn lock(
    c: &mut Client,
    id: u64,
    keys: &[&[u8]],
    wait_us: Option<u64>,
    lease_us: Option<u64>,
) -> Response {
    c.send(&lock_frame(id, keys, wait_us, lease_us));
    read_response(c)
}

#[test]
fn ping_answers_ok_with_version_request_id_and_server_time() {
    let d = Daemon::start(&[]);
    let mut c = d.dlock();
    c.send(&frame(42, req_type::PING, None));
    let r = expect_status(&mut c, 42, status::OK);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let t = r.server_unix_time.expect("server_unix_time present");
    assert!((t - now).abs() <= 5, "server time {t} vs {now}");
}

#[test]
fn lock_is_exclusive_and_unlock_hands_it_to_the_waiter() {
    let d = Daemon::start(&[]);
    let (mut a, mut b) = (d.dlock(), d.dlock());
    assert_eq!(
        lock(&mut a, 1, &[b"k"], None, None).status,
        Some(status::OK)
    );
    b.send(&lock_frame(2, &[b"k"], None, None)); // waits forever
    b.expect_silence(Duration::from_millis(150));
    a.send(&unlock_frame(3, &[b"k"]));
    expect_status(&mut a, 3, status::OK);
    expect_status(&mut b, 2, status::OK);
}

#[test]
fn wait_zero_tries_once_and_reports_the_busy_keys() {
    let d = Daemon::start(&[]);
    let (mut a, mut b) = (d.dlock(), d.dlock());
    assert_eq!(
        lock(&mut a, 1, &[b"x", b"y"], None, None).status,
        Some(status::OK)
    );
    let r = lock(&mut b, 2, &[b"y", b"z"], Some(0), None);
    assert_eq!(r.status, Some(status::ACQUIRE_TIMEOUT));
    assert_eq!(r.keys, vec![b"y".to_vec()]);
    // All or nothing: z was not taken by the failed request.
    assert_eq!(
        lock(&mut a, 3, &[b"z"], Some(0), None).status,
        Some(status::OK)
    );
}

#[test]
fn wait_deadline_times_out_no_earlier_than_asked() {
    let d = Daemon::start(&[]);
    let (mut a, mut b) = (d.dlock(), d.dlock());
    lock(&mut a, 1, &[b"k"], None, None);
    let start = Instant::now();
    let r = lock(&mut b, 2, &[b"k"], Some(200_000), None);
    let waited = start.elapsed();
    assert_eq!(r.status, Some(status::ACQUIRE_TIMEOUT));
    assert_eq!(r.keys, vec![b"k".to_vec()]);
    // Timers tick in whole milliseconds: the deadline may fall up to 1 ms before the exact
    // microsecond ("wait at most that long").
    assert!(
        waited >= Duration::from_millis(199),
        "timed out after {waited:?}"
    );
    // Nothing is held by b after the timeout.
    a.send(&unlock_frame(3, &[b"k"]));
    expect_status(&mut a, 3, status::OK);
    assert_eq!(
        lock(&mut a, 4, &[b"k"], Some(0), None).status,
        Some(status::OK)
    );
}

#[test]
fn the_same_connection_may_lock_its_keys_again() {
    let d = Daemon::start(&[]);
    let mut a = d.dlock();
    assert_eq!(
        lock(&mut a, 1, &[b"k"], None, None).status,
        Some(status::OK)
    );
    assert_eq!(
        lock(&mut a, 2, &[b"k", b"j"], Some(0), None).status,
        Some(status::OK)
    );
}

#[test]
fn a_multi_key_waiter_is_not_overtaken_by_later_single_key_requests() {
    let d = Daemon::start(&[]);
    let (mut a, mut b, mut c) = (d.dlock(), d.dlock(), d.dlock());
    lock(&mut a, 1, &[b"a"], None, None);
    b.send(&lock_frame(2, &[b"a", b"b"], None, None)); // waits on a, queued on b
    b.expect_silence(Duration::from_millis(100));
    // c wants only b, which is free, but b is promised to the earlier waiter.
    let r = lock(&mut c, 3, &[b"b"], Some(0), None);
    assert_eq!(r.status, Some(status::ACQUIRE_TIMEOUT));
    a.send(&unlock_frame(4, &[b"a"]));
    expect_status(&mut a, 4, status::OK);
    expect_status(&mut b, 2, status::OK);
}

#[test]
fn overlapping_key_sets_in_opposite_orders_never_deadlock() {
    let d = Daemon::start(&[]);
    let (mut a, mut b) = (d.dlock(), d.dlock());
    for i in 0..200u64 {
        a.send(&lock_frame(i * 4, &[b"p", b"q"], None, None));
        b.send(&lock_frame(i * 4 + 1, &[b"q", b"p"], None, None));
        a.send(&unlock_frame(i * 4 + 2, &[b"p", b"q"]));
        b.send(&unlock_frame(i * 4 + 3, &[b"q", b"p"]));
        // Each connection's answers come in request order, whoever got the keys first.
        expect_status(&mut a, i * 4, status::OK);
        expect_status(&mut a, i * 4 + 2, status::OK);
        expect_status(&mut b, i * 4 + 1, status::OK);
        expect_status(&mut b, i * 4 + 3, status::OK);
    }
}

#[test]
fn a_lease_survives_disconnect_and_expiry_wakes_the_waiter_on_time() {
    let d = Daemon::start(&[]);
    let mut a = d.dlock();
    let taken = Instant::now();
    assert_eq!(
        lock(&mut a, 1, &[b"lease"], None, Some(300_000)).status,
        Some(status::OK)
    );
    drop(a);
    let mut b = d.dlock();
    assert_eq!(
        lock(&mut b, 2, &[b"lease"], Some(0), None).status,
        Some(status::ACQUIRE_TIMEOUT),
        "lease outlives its connection"
    );
    let r = lock(&mut b, 3, &[b"lease"], None, None);
    let at = taken.elapsed();
    assert_eq!(r.status, Some(status::OK));
    assert!(
        at >= Duration::from_millis(300),
        "granted at {at:?}, before the lease ended"
    );
    assert!(
        at < Duration::from_millis(300 + 250),
        "granted at {at:?}: expiry is by timer, not lazy"
    );
}

#[test]
fn a_connection_bound_lock_is_released_on_disconnect() {
    let d = Daemon::start(&[]);
    let (mut a, mut b) = (d.dlock(), d.dlock());
    lock(&mut a, 1, &[b"k"], None, None);
    b.send(&lock_frame(2, &[b"k"], None, None));
    b.expect_silence(Duration::from_millis(100));
    drop(a);
    expect_status(&mut b, 2, status::OK);
}

#[test]
fn a_waiter_that_disconnects_is_skipped() {
    let d = Daemon::start(&[]);
    let (mut a, mut b, mut c) = (d.dlock(), d.dlock(), d.dlock());
    lock(&mut a, 1, &[b"k"], None, None);
    b.send(&lock_frame(2, &[b"k"], None, None));
    c.send(&lock_frame(3, &[b"k"], None, None));
    b.expect_silence(Duration::from_millis(100));
    drop(b);
    // Make sure the daemon saw b go before the release.
    a.send(&frame(9, req_type::PING, None));
    expect_status(&mut a, 9, status::OK);
    std::thread::sleep(Duration::from_millis(50));
    a.send(&unlock_frame(4, &[b"k"]));
    expect_status(&mut a, 4, status::OK);
    expect_status(&mut c, 3, status::OK);
}

#[test]
fn idle_clients_are_disconnected_unless_they_ping_or_wait() {
    let d = Daemon::start(&["--dlock-idle-timeout", "300"]);
    let (mut silent, mut pinger, mut holder, mut waiter) =
        (d.dlock(), d.dlock(), d.dlock(), d.dlock());
    lock(&mut holder, 1, &[b"k"], None, None);
    waiter.send(&lock_frame(2, &[b"k"], None, None)); // pending Lock: not idle
    let start = Instant::now();
    for i in 0..8 {
        std::thread::sleep(Duration::from_millis(100));
        pinger.send(&frame(10 + i, req_type::PING, None));
        expect_status(&mut pinger, 10 + i, status::OK);
    }
    silent.expect_closed();
    assert!(start.elapsed() >= Duration::from_millis(250));
    // The silent holder was closed too, and its lock released to the waiter, which was kept.
    expect_status(&mut waiter, 2, status::OK);
}

#[test]
fn bad_version_type_token_and_key_counts_get_their_statuses() {
    let d = Daemon::start(&["--dlock-max-keys", "3", "--dlock-token", "sesame"]);
    let mut c = d.dlock();
    let send =
        |c: &mut Client, version: Option<u64>, token: Option<&[u8]>, t: u64, keys: &[&[u8]]| {
            let mut out = Vec::new();
            let lock = (!keys.is_empty()).then_some(LockFields {
                keys,
                ..Default::default()
            });
            dl::encode_request(&mut out, Some(5), token, t, lock);
            if let Some(v) = version {
                // Append a second version field: protobuf's last value wins.
                let body_len = out.len() - 4 + 2;
                out.extend_from_slice(&[0x08, v as u8]);
                out[..4].copy_from_slice(&(body_len as u32).to_be_bytes());
            }
            c.send(&out);
            read_response(c)
        };
    let ok_token = Some(&b"sesame"[..]);
    assert_eq!(
        send(&mut c, None, ok_token, req_type::PING, &[]).status,
        Some(status::OK)
    );
    assert_eq!(
        send(&mut c, Some(0), ok_token, req_type::PING, &[]).status,
        Some(status::OK)
    );
    assert_eq!(
        send(&mut c, Some(3), ok_token, req_type::PING, &[]).status,
        Some(status::VERSION)
    );
    let r = send(&mut c, None, Some(b"wrong"), req_type::PING, &[]);
    assert_eq!(
        (r.status, r.error_text.as_deref()),
        (Some(status::GENERAL), Some(&b"access denied"[..]))
    );
    assert_eq!(
        send(&mut c, None, None, req_type::PING, &[]).status,
        Some(status::GENERAL)
    );
    assert_eq!(
        send(&mut c, None, ok_token, 9, &[]).status,
        Some(status::INVALID_TYPE)
    );
    assert_eq!(
        send(&mut c, None, ok_token, req_type::LOCK, &[]).status,
        Some(status::GENERAL)
    );
    let four: [&[u8]; 4] = [b"1", b"2", b"3", b"4"];
    assert_eq!(
        send(&mut c, None, ok_token, req_type::LOCK, &four).status,
        Some(status::TOO_MANY_KEYS)
    );
    assert_eq!(
        send(&mut c, None, ok_token, req_type::LOCK, &four[..3]).status,
        Some(status::OK)
    );
    // A request with no type at all.
    let mut out = Vec::new();
    dl::encode_request(&mut out, Some(6), ok_token, req_type::PING, None);
    let body_len = out.len() - 4 - 2; // drop the trailing type field (0x20 0x01)
    out.truncate(out.len() - 2);
    out[..4].copy_from_slice(&(body_len as u32).to_be_bytes());
    c.send(&out);
    assert_eq!(read_response(&mut c).status, Some(status::INVALID_TYPE));
}

#[test]
fn unlock_of_keys_not_held_is_general_and_lists_them() {
    let d = Daemon::start(&[]);
    let (mut a, mut b) = (d.dlock(), d.dlock());
    lock(&mut a, 1, &[b"mine"], None, None);
    b.send(&unlock_frame(2, &[b"mine", b"nobodys"]));
    let r = expect_status(&mut b, 2, status::GENERAL);
    let mut keys = r.keys.clone();
    keys.sort();
    assert_eq!(keys, vec![b"mine".to_vec(), b"nobodys".to_vec()]);
    a.send(&unlock_frame(3, &[b"mine"]));
    expect_status(&mut a, 3, status::OK);
}

#[test]
fn a_waiting_lock_delays_the_connections_later_answers() {
    let d = Daemon::start(&[]);
    let (mut a, mut b) = (d.dlock(), d.dlock());
    lock(&mut a, 1, &[b"k"], None, None);
    let mut burst = lock_frame(2, &[b"k"], None, None);
    burst.extend(frame(3, req_type::PING, None));
    burst.extend(lock_frame(4, &[b"other"], Some(0), None));
    b.send(&burst);
    b.expect_silence(Duration::from_millis(150));
    a.send(&unlock_frame(5, &[b"k"]));
    expect_status(&mut b, 2, status::OK);
    expect_status(&mut b, 3, status::OK);
    expect_status(&mut b, 4, status::OK);
}

#[test]
fn pipelined_requests_split_at_every_byte_are_answered_in_order() {
    let d = Daemon::start(&[]);
    let mut c = d.dlock();
    let mut burst = Vec::new();
    for i in 0..5 {
        burst.extend(lock_frame(i * 2, &[b"a", b"b"], Some(0), None));
        burst.extend(unlock_frame(i * 2 + 1, &[b"a", b"b"]));
    }
    for byte in &burst[..60] {
        c.send(std::slice::from_ref(byte));
        std::thread::sleep(Duration::from_millis(1));
    }
    c.send(&burst[60..]);
    for i in 0..10 {
        expect_status(&mut c, i, status::OK);
    }
}

#[test]
fn an_oversized_frame_closes_only_that_connection() {
    let d = Daemon::start(&["--dlock-max-message", "1024"]);
    let (mut bad, mut good) = (d.dlock(), d.dlock());
    bad.send(&(1_000_000u32).to_be_bytes());
    bad.expect_closed();
    good.send(&frame(1, req_type::PING, None));
    expect_status(&mut good, 1, status::OK);
}

#[test]
fn invalid_protobuf_gets_general_then_close() {
    let d = Daemon::start(&[]);
    let (mut bad, mut good) = (d.dlock(), d.dlock());
    lock(&mut bad, 1, &[b"held-by-bad"], None, None);
    // A field with wire type 7 (invalid).
    bad.send(&[0, 0, 0, 2, 0x0f, 0x00]);
    let r = read_response(&mut bad);
    assert_eq!(r.status, Some(status::GENERAL));
    bad.expect_closed();
    // Its connection-bound lock was released.
    assert_eq!(
        lock(&mut good, 2, &[b"held-by-bad"], None, None).status,
        Some(status::OK)
    );
}

/// One memcached `stats` counter.
fn stat(d: &Daemon, name: &str) -> u64 {
    let mut m = d.memcache();
    m.send(b"stats\r\n");
    loop {
        let line = m.line();
        assert_ne!(line, "END\r\n", "no stat {name}");
        let mut w = line.split_whitespace();
        if w.nth(1) == Some(name) {
            return w.next().expect("value").parse().expect("number");
        }
    }
}

#[test]
fn a_waiter_that_closes_its_socket_leaves_the_queue_at_once() {
    let d = Daemon::start(&[]);
    let (mut a, mut b) = (d.dlock(), d.dlock());
    lock(&mut a, 1, &[b"k"], None, None);
    b.send(&lock_frame(2, &[b"k"], None, None)); // waits forever
    b.expect_silence(Duration::from_millis(100));
    assert_eq!(stat(&d, "dlock_waiting"), 1);
    // A normal close (FIN), not a reset: the client is gone, so its Lock must not wait on.
    b.stream.shutdown(std::net::Shutdown::Both).unwrap();
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(5);
    while stat(&d, "dlock_waiting") != 0 {
        assert!(
            Instant::now() < deadline,
            "the closed waiter is still queued"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        stat(&d, "curr_connections"),
        2,
        "a and the stats connection only"
    );
    // The key stays with a, untouched.
    assert_eq!(stat(&d, "dlock_held_keys"), 1);
}

/// The sequence behind the soak's one "DOUBLE GRANT" (a lease released ~100 ms early), end to
/// end: `a` holds `k` as a lease and sends a Lock of `k` and a busy key without a lease; that
/// Lock is granted (its answer left unread) and `a` closes. The re-lock replaced `k`'s record
/// ("a re-lock replaces the old record"), so `k` was connection-bound and the close releases it
/// at once, long before the lease would have ended.
#[test]
fn a_lease_relocked_without_lease_ends_when_its_connection_closes() {
    let d = Daemon::start(&[]);
    let (mut a, mut b, mut c) = (d.dlock(), d.dlock(), d.dlock());
    let lease_us = 30_000_000; // 30 s: far beyond the clients' read deadline
    assert_eq!(
        lock(&mut a, 1, &[b"k"], None, Some(lease_us)).status,
        Some(status::OK)
    );
    assert_eq!(
        lock(&mut b, 2, &[b"busy"], None, None).status,
        Some(status::OK)
    );
    a.send(&lock_frame(3, &[b"k", b"busy"], None, None));
    a.expect_silence(Duration::from_millis(100));
    c.send(&lock_frame(4, &[b"k"], None, None));
    c.expect_silence(Duration::from_millis(100));
    // The Unlock's answer comes after the grant of a's Lock, which the same release decided.
    b.send(&unlock_frame(5, &[b"busy"]));
    expect_status(&mut b, 5, status::OK);
    c.expect_silence(Duration::from_millis(100));
    let closed = Instant::now();
    drop(a);
    expect_status(&mut c, 4, status::OK);
    assert!(
        closed.elapsed() < Duration::from_secs(5),
        "k was released by the close, not by the lease"
    );
}

/// Run to completion (`--threads 1`) must not go on serving a connection that always has more
/// requests buffered before it polls again: behind a pipelined flood, every other connection's
/// request would wait for the whole flood (1.6 s behind 1M leases in `make scale`). A second
/// connection's round trips complete while the flood is still being answered.
#[test]
fn a_connection_is_answered_while_another_floods_the_daemon() {
    let d = Daemon::start(&["--threads", "1"]);
    let flood = d.dlock();
    // Lock+Unlock pairs on one key: far more than the daemon takes in one poll round, written
    // by one thread (the socket fills and it blocks) and read by another (so that the replies
    // never fill the daemon's output and hold the flood back).
    const PAIRS: u64 = 200_000;
    let mut bytes = Vec::new();
    for i in 0..PAIRS {
        bytes.extend(lock_frame(2 * i, &[b"flood"], None, None));
        bytes.extend(unlock_frame(2 * i + 1, &[b"flood"]));
    }
    let mut writer = flood.stream.try_clone().expect("clone");
    let write = std::thread::spawn(move || writer.write_all(&bytes).expect("flood write"));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood_done = done.clone();
    let read = std::thread::spawn(move || {
        // Frames read in big reads and decoded in place: this reader must keep up with the
        // daemon, or the replies piling up would hold the flood back (and let the daemon poll
        // anyway).
        let mut s = flood.stream;
        let mut buf = vec![0u8; 1 << 20];
        let (mut have, mut frames, mut not_ok) = (0usize, 0u64, 0u64);
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        while frames < 2 * PAIRS {
            let n = s.read(&mut buf[have..]).expect("flood read");
            assert!(n > 0, "the daemon closed the flood connection");
            have += n;
            let mut at = 0;
            while have - at >= 4 {
                let len = u32::from_be_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
                let end = at + 4 + len as usize;
                if end > have {
                    break;
                }
                let r = dl::decode_response_view(&buf[at + 4..end]).expect("a flood reply");
                not_ok += u64::from(!r.status_is(status::OK));
                frames += 1;
                at = end;
            }
            buf.copy_within(at..have, 0);
            have -= at;
        }
        flood_done.store(true, std::sync::atomic::Ordering::SeqCst);
        not_ok
    });
    // Wait until the flood is being served, then take round trips on a second connection.
    let mut probe = d.dlock();
    let mut served_during_flood = 0;
    for i in 0..20u64 {
        lock(&mut probe, 2 * i, &[b"probe"], None, None);
        probe.send(&unlock_frame(2 * i + 1, &[b"probe"]));
        expect_status(&mut probe, 2 * i + 1, status::OK);
        if !done.load(std::sync::atomic::Ordering::SeqCst) {
            served_during_flood += 1;
        }
    }
    let probe_finished_early = !done.load(std::sync::atomic::Ordering::SeqCst);
    write.join().expect("writer");
    let not_ok = read.join().expect("reader");
    assert_eq!(not_ok, 0, "flood replies that were not OK");
    assert!(
        probe_finished_early,
        "20 round trips of a second connection waited for the flood of {PAIRS} pairs to end \
         ({served_during_flood} served during it)"
    );
}
