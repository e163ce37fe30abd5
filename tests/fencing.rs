//! Fencing tokens on all four paths (`docs/protocol.md`, "Fencing tokens"): every grant gets a token
//! strictly greater than every token before it anywhere in the daemon; memcached binary carries
//! it in a Lock reply's CAS, memcached text answers `lock_token KEY`, dlock sets Response field
//! 7 on an Ok Lock, old answers REQ_TOKEN (7). Replies that existed before stay byte-identical.

mod common;

use common::{mcbin, Client, Daemon};
use holdfast::proto::dlock::{self as dl, req_type, status, LockFields};
use holdfast::proto::lockd::{self as ld, op};

// ---- memcached ----

/// Binary Lock of `key`: (status, CAS) of the reply.
fn bin_lock(c: &mut Client, key: &[u8]) -> (u16, u64) {
    let r = mcbin::call(c, &mcbin::request(0x40, &[], key, &[], 0, 0));
    (r.status, r.cas)
}

fn lock_token(c: &mut Client, key: &str) -> Option<u64> {
    c.send(format!("lock_token {key}\r\n").as_bytes());
    let line = c.line();
    match line.strip_prefix("TOKEN ") {
        Some(n) => Some(n.trim_end().parse().expect("a number")),
        None => {
            assert_eq!(line, "CLIENT_ERROR object is not locked by you\r\n");
            None
        }
    }
}

// ---- old ----

fn ld_req(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    ld::encode(&mut f, opcode, payload);
    f
}

/// One old reply: (opcode, payload).
fn ld_reply(c: &mut Client) -> (u8, Vec<u8>) {
    let h = u32::from_be_bytes(c.take(4).try_into().unwrap());
    ((h >> 20) as u8, c.take((h & 0xF_FFFF) as usize))
}

fn req_token(c: &mut Client, name: &[u8]) -> Option<u64> {
    let mut payload = name.to_vec();
    payload.push(0);
    c.send(&ld_req(op::REQ_TOKEN, &payload));
    let (opcode, body) = ld_reply(c);
    match opcode {
        op::ACK => {
            assert_eq!(
                &body[..payload.len()],
                &payload[..],
                "name, NUL, then the token"
            );
            assert_eq!(body.len(), payload.len() + 8);
            Some(u64::from_be_bytes(
                body[payload.len()..].try_into().unwrap(),
            ))
        }
        op::ERR => {
            assert_eq!(body, payload, "ERR echoes the payload");
            None
        }
        other => panic!("unexpected reply {other}"),
    }
}

// ---- dlock ----

fn dl_lock_frame(id: u64, key: &[u8]) -> Vec<u8> {
    let keys = [key];
    let lock = LockFields {
        keys: &keys,
        ..Default::default()
    };
    let mut f = Vec::new();
    dl::encode_request(&mut f, Some(id), None, req_type::LOCK, Some(lock));
    f
}

fn dl_unlock_frame(id: u64, key: &[u8]) -> Vec<u8> {
    let keys = [key];
    let lock = LockFields {
        keys: &keys,
        ..Default::default()
    };
    let mut f = Vec::new();
    dl::encode_request(&mut f, Some(id), None, req_type::UNLOCK, Some(lock));
    f
}

/// One dlock reply: the raw body and its decoding.
fn dl_reply(c: &mut Client) -> (Vec<u8>, dl::Response) {
    let len = u32::from_be_bytes(c.take(4).try_into().unwrap()) as usize;
    let body = c.take(len);
    let r = dl::decode_response(&body).expect("response decodes");
    (body, r)
}

#[test]
fn tokens_strictly_increase_across_every_protocol_of_one_daemon() {
    let d = Daemon::start(&[]);
    let (mut mc, mut lk, mut dk) = (d.memcache(), d.lockd(), d.dlock());
    mc.expect(
        b"set a 0 0 1\r\nv\r\nset b 0 0 1\r\nv\r\n",
        b"STORED\r\nSTORED\r\n",
    );
    let mut seen = Vec::new();
    for round in 0..3u64 {
        let (st, cas) = bin_lock(&mut mc, b"a");
        assert_eq!(st, 0);
        seen.push(cas);
        mc.expect(b"lock b\r\n", b"OK\r\n");
        seen.push(lock_token(&mut mc, "b").expect("holder"));
        lk.send(&ld_req(op::ACQ, b"n\0"));
        assert_eq!(ld_reply(&mut lk), (op::ACQUIRED, b"n\0".to_vec()));
        seen.push(req_token(&mut lk, b"n").expect("holder"));
        dk.send(&dl_lock_frame(round, b"k"));
        let (_, r) = dl_reply(&mut dk);
        assert_eq!(r.status, Some(status::OK));
        seen.push(r.fence.expect("an Ok Lock carries field 7"));
        // Release everything for the next round.
        mc.expect(b"unlock_all\r\n", b"OK\r\n");
        lk.send(&ld_req(op::REL, b"n\0"));
        assert_eq!(ld_reply(&mut lk).0, op::RELEASED);
        dk.send(&dl_unlock_frame(100 + round, b"k"));
        let (_, r) = dl_reply(&mut dk);
        assert_eq!(
            (r.status, r.fence),
            (Some(status::OK), None),
            "no token on Unlock"
        );
    }
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
}

#[test]
fn asking_for_the_token_of_a_lock_not_held_is_an_error() {
    let d = Daemon::start(&[]);
    let (mut a, mut b) = (d.memcache(), d.memcache());
    a.expect(b"set k 0 0 1\r\nv\r\nlock k\r\n", b"STORED\r\nOK\r\n");
    assert!(lock_token(&mut a, "k").is_some());
    assert_eq!(lock_token(&mut b, "k"), None, "held by another connection");
    assert_eq!(lock_token(&mut b, "missing"), None, "no such item");
    a.expect(b"unlock k\r\n", b"OK\r\n");
    assert_eq!(lock_token(&mut a, "k"), None, "released");
    // No key: refused like `lock` with no key.
    a.send(b"lock\r\n");
    let for_lock = a.line();
    assert!(for_lock.starts_with("CLIENT_ERROR"), "{for_lock:?}");
    a.send(b"lock_token\r\n");
    assert_eq!(a.line(), for_lock);

    let (mut x, mut y) = (d.lockd(), d.lockd());
    x.send(&ld_req(op::ACQ, b"n\0extra"));
    assert_eq!(ld_reply(&mut x).0, op::ACQUIRED);
    assert!(req_token(&mut x, b"n").is_some());
    assert_eq!(req_token(&mut y, b"n"), None, "held by another connection");
    assert_eq!(req_token(&mut y, b"free"), None, "not locked");
    y.send(&ld_req(op::REQ_TOKEN, b""));
    assert_eq!(
        ld_reply(&mut y),
        (op::ERR, vec![]),
        "empty payload: ERR, empty"
    );
    y.send(&ld_req(op::REQ_TOKEN, b"no-nul"));
    assert_eq!(
        ld_reply(&mut y),
        (op::ERR, b"no-nul".to_vec()),
        "no NUL: ERR echo"
    );
    // An orphan is held by nobody.
    drop(x);
    assert_eq!(req_token(&mut y, b"n"), None);
}

#[test]
fn a_waiter_granted_later_gets_a_larger_token_than_the_holder_before_it() {
    let d = Daemon::start(&[]);
    // old: B queues behind A; A's release grants B.
    let (mut a, mut b) = (d.lockd(), d.lockd());
    a.send(&ld_req(op::ACQ, b"n\0"));
    assert_eq!(ld_reply(&mut a).0, op::ACQUIRED);
    let first = req_token(&mut a, b"n").expect("holder");
    b.send(&ld_req(op::ACQ, b"n\0"));
    assert_eq!(ld_reply(&mut b).0, op::ACK);
    a.send(&ld_req(op::REL, b"n\0"));
    assert_eq!(ld_reply(&mut a).0, op::RELEASED);
    assert_eq!(ld_reply(&mut b).0, op::ACQUIRED);
    let second = req_token(&mut b, b"n").expect("the granted waiter holds it");
    assert!(second > first, "{second} after {first}");
    assert_eq!(
        req_token(&mut a, b"n"),
        None,
        "the old holder's token is gone"
    );

    // dlock: B waits on k; A's unlock grants B, whose deferred Ok carries a larger fence.
    let (mut a, mut b) = (d.dlock(), d.dlock());
    a.send(&dl_lock_frame(1, b"k"));
    let first = dl_reply(&mut a).1.fence.expect("fence");
    b.send(&dl_lock_frame(2, b"k"));
    a.send(&dl_unlock_frame(3, b"k"));
    assert_eq!(dl_reply(&mut a).1.status, Some(status::OK));
    let (_, granted) = dl_reply(&mut b);
    assert_eq!(
        (granted.request_id, granted.status),
        (Some(2), Some(status::OK))
    );
    assert!(granted.fence.expect("fence") > first);
}

#[test]
fn dlock_replies_other_than_a_granted_lock_are_byte_identical_to_the_original() {
    let d = Daemon::start(&[]);
    let mut c = d.dlock();
    let mut ping = Vec::new();
    dl::encode_request(&mut ping, Some(9), None, req_type::PING, None);
    c.send(&ping);
    let (body, r) = dl_reply(&mut c);
    let mut want = Vec::new();
    dl::encode_response(
        &mut want,
        Some(9),
        status::OK,
        None,
        [],
        r.server_unix_time.expect("time"),
    );
    assert_eq!(body, want[4..], "a Ping reply has no field 7");
    // A granted Lock: the original fields, then field 7 last, so a client built from the
    // original dlock.proto reads the same message and skips the unknown field.
    c.send(&dl_lock_frame(10, b"k"));
    let (body, r) = dl_reply(&mut c);
    let mut original = Vec::new();
    dl::encode_response(
        &mut original,
        Some(10),
        status::OK,
        None,
        [],
        r.server_unix_time.expect("time"),
    );
    assert!(
        body.starts_with(&original[4..]),
        "the original reply, then field 7"
    );
    assert_eq!(body[original.len() - 4], 7 << 3, "field 7, varint");
}
