//! The native protocol (version 3 of dlock, `holdfast.proto`) over TCP against the real daemon
//! (`docs/protocol.md`, "The native protocol").

mod common;

use std::time::{Duration, Instant};

use common::{Client, Daemon};
use holdfast::proto::dlock::{
    self as dl, event_kind, req_type, status, LockFields, NativeFields, Response,
};

/// A version-3 request frame.
fn frame(id: u64, t: u64, keys: &[&[u8]], f: impl FnOnce(&mut LockFields<'_>)) -> Vec<u8> {
    let mut lock = LockFields {
        keys,
        ..Default::default()
    };
    f(&mut lock);
    let mut out = Vec::new();
    let lock = (!keys.is_empty()).then_some(lock);
    dl::encode_request_version(&mut out, dl::NATIVE_VERSION, Some(id), None, t, lock);
    out
}

fn read(c: &mut Client) -> Response {
    c.fill(4);
    let len = u32::from_be_bytes([c.pending[0], c.pending[1], c.pending[2], c.pending[3]]) as usize;
    let bytes = c.take(4 + len);
    let r = dl::decode_response(&bytes[4..]).expect("a valid Response");
    assert_eq!(r.version, Some(3), "a version-3 Response: {r:?}");
    r
}

/// Reads the next frame, which must answer request `id` with `want`.
fn expect(c: &mut Client, id: u64, want: u32) -> Response {
    let r = read(c);
    assert_eq!(
        (r.request_id, r.status, r.event.is_none()),
        (Some(id), Some(want), true),
        "{r:?}"
    );
    r
}

fn lock(c: &mut Client, id: u64, keys: &[&[u8]], f: impl FnOnce(&mut LockFields<'_>)) -> Response {
    c.send(&frame(id, req_type::LOCK, keys, f));
    read(c)
}

fn with(n: NativeFields<'static>) -> impl FnOnce(&mut LockFields<'_>) {
    move |l| l.native = n
}

fn none(_: &mut LockFields<'_>) {}

/// Reads an event frame for request `id`.
fn expect_event(c: &mut Client, id: u64, key: &[u8], kind: u32, fence: u64) -> dl::Event {
    let r = read(c);
    assert_eq!(
        (r.request_id, r.status),
        (Some(id), Some(status::OK)),
        "{r:?}"
    );
    let ev = r.event.expect("an event frame");
    assert_eq!(
        (&ev.key[..], ev.kind, ev.fence),
        (key, kind, fence),
        "{ev:?}"
    );
    ev
}

#[test]
fn a_connection_keeps_the_version_of_its_first_request() {
    let d = Daemon::start(&[]);
    let mut c = d.dlock();
    c.send(&frame(1, req_type::PING, &[], none));
    expect(&mut c, 1, status::OK);
    let mut v2 = Vec::new();
    dl::encode_request(&mut v2, Some(2), None, req_type::PING, None);
    c.send(&v2);
    let r = expect(&mut c, 2, status::VERSION);
    assert!(r.error_text.is_some());
    // And a version-2 connection refuses version 3, in version 2.
    let mut c2 = d.dlock();
    c2.send(&v2);
    c2.fill(4);
    c2.send(&frame(3, req_type::PING, &[], none));
    let mut seen = Vec::new();
    for _ in 0..2 {
        c2.fill(4);
        let len = u32::from_be_bytes([c2.pending[0], c2.pending[1], c2.pending[2], c2.pending[3]]);
        let bytes = c2.take(4 + len as usize);
        let r = dl::decode_response(&bytes[4..]).unwrap();
        seen.push((r.version, r.request_id, r.status));
    }
    assert_eq!(
        seen,
        vec![
            (Some(2), Some(2), Some(status::OK)),
            (Some(2), Some(3), Some(status::VERSION))
        ]
    );
}

#[test]
fn a_waiting_lock_delays_nothing_else_on_its_connection() {
    let d = Daemon::start(&[]);
    let (mut a, mut b) = (d.dlock(), d.dlock());
    let f1 = lock(&mut a, 1, &[b"k"], none);
    assert_eq!(f1.status, Some(status::OK));
    let f1 = f1.fence.expect("a fence on every grant");
    b.send(&frame(2, req_type::LOCK, &[b"k"], none));
    b.send(&frame(3, req_type::PING, &[], none));
    expect(&mut b, 3, status::OK);
    // Holds are per grant: the holder asking again waits like anyone else.
    a.send(&frame(4, req_type::LOCK, &[b"k"], |l| {
        l.wait_micro = Some(100_000)
    }));
    let r = expect(&mut a, 4, status::ACQUIRE_TIMEOUT);
    assert_eq!(r.keys, vec![b"k".to_vec()]);
    a.send(&frame(5, req_type::UNLOCK, &[b"k"], none));
    expect(&mut a, 5, status::OK);
    let r = expect(&mut b, 2, status::OK);
    assert!(r.fence.unwrap() > f1);
}

#[test]
fn shared_holders_coexist_and_a_waiting_exclusive_is_not_starved() {
    let d = Daemon::start(&[]);
    let shared = NativeFields {
        shared: true,
        ..Default::default()
    };
    let (mut r1, mut w, mut r2) = (d.dlock(), d.dlock(), d.dlock());
    assert_eq!(
        lock(&mut r1, 1, &[b"s"], with(shared)).status,
        Some(status::OK)
    );
    w.send(&frame(2, req_type::LOCK, &[b"s"], none));
    w.expect_silence(Duration::from_millis(100));
    // A later shared request waits behind the waiting exclusive one.
    r2.send(&frame(3, req_type::LOCK, &[b"s"], with(shared)));
    r2.expect_silence(Duration::from_millis(100));
    r1.send(&frame(4, req_type::UNLOCK, &[b"s"], none));
    expect(&mut r1, 4, status::OK);
    expect(&mut w, 2, status::OK);
    r2.expect_silence(Duration::from_millis(100));
    w.send(&frame(5, req_type::UNLOCK, &[b"s"], none));
    expect(&mut w, 5, status::OK);
    expect(&mut r2, 3, status::OK);
}

#[test]
fn a_semaphore_grants_its_limit_and_refuses_another_limit() {
    let d = Daemon::start(&[]);
    let two = NativeFields {
        limit: Some(2),
        ..Default::default()
    };
    let mut cs: Vec<Client> = (0..3).map(|_| d.dlock()).collect();
    for (i, c) in cs.iter_mut().enumerate().take(2) {
        assert_eq!(
            lock(c, i as u64, &[b"pool"], with(two)).status,
            Some(status::OK)
        );
    }
    let r = lock(&mut cs[2], 9, &[b"pool"], |l| {
        l.native = two;
        l.wait_micro = Some(0);
    });
    assert_eq!(r.status, Some(status::ACQUIRE_TIMEOUT));
    let three = NativeFields {
        limit: Some(3),
        ..Default::default()
    };
    let r = lock(&mut cs[2], 10, &[b"pool"], with(three));
    assert_eq!(r.status, Some(status::INVALID_ARGUMENT), "{r:?}");
    // Get shows both holders, in grant order.
    cs[2].send(&frame(11, req_type::GET, &[b"pool"], none));
    let r = expect(&mut cs[2], 11, status::OK);
    assert_eq!(r.info.len(), 1);
    let info = &r.info[0];
    assert_eq!(
        (&info.key[..], info.limit, info.holders.len()),
        (&b"pool"[..], Some(2), 2)
    );
    assert!(info.holders[0].fence < info.holders[1].fence);
}

#[test]
fn unlock_by_fence_from_another_connection_tells_the_holder_it_lost() {
    let d = Daemon::start(&[]);
    let (mut a, mut b) = (d.dlock(), d.dlock());
    let value = NativeFields {
        value: Some(b"host-a"),
        ..Default::default()
    };
    let fence = lock(&mut a, 7, &[b"job"], with(value)).fence.unwrap();
    b.send(&frame(1, req_type::CHECK_FENCE, &[b"job"], |l| {
        l.native.fence = Some(fence)
    }));
    expect(&mut b, 1, status::OK);
    b.send(&frame(2, req_type::UNLOCK, &[b"job"], |l| {
        l.native.fence = Some(fence + 1)
    }));
    let r = expect(&mut b, 2, status::NOT_HELD);
    assert_eq!(r.keys, vec![b"job".to_vec()]);
    b.send(&frame(3, req_type::UNLOCK, &[b"job"], |l| {
        l.native.fence = Some(fence)
    }));
    expect(&mut b, 3, status::OK);
    let ev = expect_event(&mut a, 7, b"job", event_kind::LOST, fence);
    assert_eq!(ev.value.as_deref(), Some(&b"host-a"[..]));
    b.send(&frame(4, req_type::CHECK_FENCE, &[b"job"], |l| {
        l.native.fence = Some(fence)
    }));
    expect(&mut b, 4, status::STALE_FENCE);
}

#[test]
fn a_lease_expiry_is_told_to_its_holder_and_watchers_and_lock_delay_follows() {
    let d = Daemon::start(&[]);
    let (mut holder, mut watcher, mut other) = (d.dlock(), d.dlock(), d.dlock());
    watcher.send(&frame(50, req_type::WATCH, &[b"lease"], none));
    let r = expect(&mut watcher, 50, status::OK);
    assert_eq!(r.info.len(), 1);
    assert!(r.info[0].holders.is_empty());
    let fence = lock(&mut holder, 1, &[b"lease"], |l| {
        l.release_micro = Some(200_000);
        l.native.lock_delay_micro = Some(400_000);
    })
    .fence
    .unwrap();
    expect_event(&mut watcher, 50, b"lease", event_kind::ACQUIRED, fence);
    let start = Instant::now();
    expect_event(&mut holder, 1, b"lease", event_kind::EXPIRED, fence);
    expect_event(&mut watcher, 50, b"lease", event_kind::EXPIRED, fence);
    assert!(start.elapsed() < Duration::from_secs(2));
    // The lock-delay: nobody gets the key for 400 ms after the expiry.
    let r = lock(&mut other, 2, &[b"lease"], |l| l.wait_micro = Some(0));
    assert_eq!(r.status, Some(status::ACQUIRE_TIMEOUT));
    other.send(&frame(3, req_type::GET, &[b"lease"], none));
    let r = expect(&mut other, 3, status::OK);
    assert!(r.info[0].delayed_micro > 0, "{r:?}");
    let r = lock(&mut other, 4, &[b"lease"], |l| {
        l.wait_micro = Some(2_000_000)
    });
    assert_eq!(r.status, Some(status::OK));
    expect_event(
        &mut watcher,
        50,
        b"lease",
        event_kind::ACQUIRED,
        r.fence.unwrap(),
    );
    // Unwatch ends the events.
    watcher.send(&frame(51, req_type::UNWATCH, &[b"lease"], none));
    expect(&mut watcher, 51, status::OK);
    other.send(&frame(5, req_type::UNLOCK, &[b"lease"], none));
    expect(&mut other, 5, status::OK);
    watcher.expect_silence(Duration::from_millis(150));
}

#[test]
fn extend_by_fence_moves_a_lease_to_a_new_connection() {
    let d = Daemon::start(&[]);
    let mut a = d.dlock();
    let fence = lock(&mut a, 1, &[b"l"], |l| l.release_micro = Some(5_000_000))
        .fence
        .unwrap();
    drop(a);
    let mut b = d.dlock();
    b.send(&frame(2, req_type::EXTEND, &[b"l"], |l| {
        l.release_micro = Some(300_000);
        l.native.fence = Some(fence);
    }));
    expect(&mut b, 2, status::OK);
    // Its notices now come to b, with the Extend's id; the token did not change.
    expect_event(&mut b, 2, b"l", event_kind::EXPIRED, fence);
}

#[test]
fn bounds_are_refused_with_invalid_argument() {
    let d = Daemon::start(&[]);
    let mut c = d.dlock();
    let big = vec![b'v'; 4097];
    let big: &'static [u8] = Box::leak(big.into_boxed_slice());
    let cases: [NativeFields<'static>; 4] = [
        NativeFields {
            value: Some(big),
            ..Default::default()
        },
        NativeFields {
            limit: Some(65536),
            ..Default::default()
        },
        NativeFields {
            lock_delay_micro: Some(60_000_001),
            ..Default::default()
        },
        NativeFields {
            shared: true,
            limit: Some(2),
            ..Default::default()
        },
    ];
    for (i, n) in cases.into_iter().enumerate() {
        let r = lock(&mut c, i as u64, &[b"b"], with(n));
        assert_eq!(r.status, Some(status::INVALID_ARGUMENT), "case {i}: {r:?}");
    }
    let keys: Vec<Vec<u8>> = (0..1025).map(|i| format!("w{i}").into_bytes()).collect();
    let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
    for (i, chunk) in refs.chunks(100).enumerate() {
        c.send(&frame(100 + i as u64, req_type::WATCH, chunk, none));
        let want = if i < 10 {
            status::OK
        } else {
            status::INVALID_ARGUMENT
        };
        expect(&mut c, 100 + i as u64, want);
    }
    // The same Lock id while the first still waits: General.
    let mut h = d.dlock();
    lock(&mut h, 1, &[b"q"], none);
    c.send(&frame(500, req_type::LOCK, &[b"q"], none));
    c.send(&frame(500, req_type::LOCK, &[b"q"], none));
    expect(&mut c, 500, status::GENERAL);
}

/// The ids in flight that the server checks are its waiting Locks': a Lock or a Watch with one
/// is General. A Watch's id is the client's to keep apart (every node of a cluster applies a
/// Lock alike, and only the watcher's node knows the Watch): a Lock with it is served.
#[test]
fn request_ids_in_flight_are_those_of_waiting_locks() {
    let d = Daemon::start(&[]);
    let (mut h, mut c) = (d.dlock(), d.dlock());
    assert_eq!(lock(&mut h, 1, &[b"busy"], none).status, Some(status::OK));
    c.send(&frame(7, req_type::LOCK, &[b"busy"], none)); // waits
    c.send(&frame(7, req_type::WATCH, &[b"other"], none));
    expect(&mut c, 7, status::GENERAL);
    c.send(&frame(7, req_type::LOCK, &[b"free"], none));
    expect(&mut c, 7, status::GENERAL);
    c.send(&frame(8, req_type::WATCH, &[b"other"], none));
    expect(&mut c, 8, status::OK);
    c.send(&frame(8, req_type::LOCK, &[b"free"], none));
    expect(&mut c, 8, status::OK);
    // The same Watch id again: more keys on the same stream.
    c.send(&frame(8, req_type::WATCH, &[b"third"], none));
    expect(&mut c, 8, status::OK);
}

/// A watcher that stops reading is a slow reader like any other: closed once it has left 4 MiB
/// of events unread for the stall timeout, and what it did receive is a prefix of the events
/// with no gap (each grant's Acquired then Released, tokens increasing), then the end.
#[test]
fn a_watcher_that_stops_reading_is_closed_never_left_with_a_gap() {
    use std::io::Read;
    let d = Daemon::start(&["--client-stall-timeout", "500"]);
    let mut watcher = d.dlock();
    watcher.send(&frame(1, req_type::WATCH, &[b"hot"], none));
    expect(&mut watcher, 1, status::OK);
    let mut locker = d.dlock();
    let value: &'static [u8] = Box::leak(vec![b'v'; 4000].into_boxed_slice());
    let big = NativeFields {
        value: Some(value),
        ..Default::default()
    };
    // 2,000 grants of a 4,000-byte value: 16 MB of events, the watcher reading none.
    let mut id = 10;
    for _ in 0..20 {
        let mut batch = Vec::new();
        for _ in 0..100 {
            batch.extend(frame(id, req_type::LOCK, &[b"hot"], with(big)));
            batch.extend(frame(id + 1, req_type::UNLOCK, &[b"hot"], none));
            id += 2;
        }
        locker.send(&batch);
        for _ in 0..200 {
            assert_eq!(
                read(&mut locker).status,
                Some(status::OK),
                "the locker is served"
            );
        }
    }
    // Three stall timeouts without reading a byte.
    std::thread::sleep(Duration::from_millis(1500));
    // Everything the watcher gets, until the daemon closes it.
    let mut got = std::mem::take(&mut watcher.pending);
    watcher
        .stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut chunk = vec![0u8; 1 << 16];
    let closed = loop {
        match watcher.stream.read(&mut chunk) {
            Ok(0) => break true,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    assert!(
        closed,
        "the stalled watcher was not closed ({} bytes read)",
        got.len()
    );
    let (mut at, mut expect_kind, mut last) = (0, event_kind::ACQUIRED, 0u64);
    let mut events = 0;
    while let Ok((body, n)) = dl::parse_frame(&got[at..], usize::MAX) {
        let r = dl::decode_response(body).expect("a whole frame decodes");
        let ev = r.event.expect("only events after the Watch's answer");
        assert_eq!(ev.kind, expect_kind, "event {events}: {ev:?}");
        if ev.kind == event_kind::ACQUIRED {
            assert!(ev.fence > last, "event {events}: a gap or a repeat");
            last = ev.fence;
            expect_kind = event_kind::RELEASED;
        } else {
            assert_eq!(ev.fence, last, "event {events}: Released of another grant");
            expect_kind = event_kind::ACQUIRED;
        }
        events += 1;
        at += n;
    }
    assert!(
        events < 4000,
        "all {events} events fit: the watcher was not slow enough"
    );
}
