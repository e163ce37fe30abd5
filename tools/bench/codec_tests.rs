use super::*;

fn expect(req: Req, id: u64) -> Expect {
    Expect { req, id }
}

/// Every split point of `whole` is incomplete; the whole is one reply of its full length.
fn assert_one_reply(proto: Protocol, e: Expect, whole: &[u8], ok: bool) {
    for cut in 0..whole.len() {
        assert_eq!(
            check_reply(proto, e, &whole[..cut]),
            Ok(Checked::Incomplete),
            "{proto:?} {e:?} cut {cut} of {}",
            describe(whole)
        );
    }
    let mut pipelined = whole.to_vec();
    pipelined.extend_from_slice(whole);
    assert_eq!(
        check_reply(proto, e, &pipelined),
        Ok(Checked::Reply {
            ok,
            len: whole.len()
        }),
        "{proto:?} {e:?} {}",
        describe(whole)
    );
}

#[test]
fn memcache_text_replies_are_matched_to_their_request() {
    use Protocol::McText as P;
    let cases: &[(Req, &[u8], bool)] = &[
        (Req::Lock, b"OK\r\n", true),
        (Req::Lock, b"LOCKED\r\n", false),
        (Req::Unlock, b"OK\r\n", true),
        (
            Req::Unlock,
            b"CLIENT_ERROR object is not locked or not found\r\n",
            false,
        ),
        (Req::Add, b"STORED\r\n", true),
        (Req::Add, b"NOT_STORED\r\n", false),
        (Req::Set, b"STORED\r\n", true),
        (Req::Delete, b"DELETED\r\n", true),
        (Req::Delete, b"NOT_FOUND\r\n", false),
        (Req::Clear, b"NOT_FOUND\r\n", true),
        (Req::Clear, b"DELETED\r\n", true),
        (Req::Get, b"VALUE key:1 0 3\r\nabc\r\nEND\r\n", true),
        // A value may hold CRLF: its length says where it ends.
        (Req::Get, b"VALUE key:1 0 3 99\r\na\r\n\r\nEND\r\n", true),
        (Req::Get, b"VALUE k 5 0\r\n\r\nEND\r\n", true),
        (Req::Get, b"END\r\n", false),
        (Req::Set, b"ERROR\r\n", false),
        (Req::Lock, b"VALUE k 0 1\r\nx\r\nEND\r\n", false),
    ];
    for &(req, whole, ok) in cases {
        assert_one_reply(P, expect(req, 0), whole, ok);
    }
    assert_eq!(
        parse_text(b"VALUE key:1 0 3\r\nabc\r\nEND\r\n"),
        Ok(Some((
            TextReply::Value {
                key: b"key:1",
                data: b"abc"
            },
            27
        )))
    );
}

#[test]
fn memcache_text_broken_streams_are_errors() {
    for bad in [
        &b"VALUE k 0\r\n"[..],
        b"VALUE k 0 x\r\n",
        b"VALUE k 0 1\r\nxyEND\r\n",
        b"VALUE k 0 1\r\nx\r\nENX",
    ] {
        assert!(parse_text(bad).is_err(), "{}", describe(bad));
    }
    assert!(parse_text(&[b'x'; MAX_REPLY_LINE]).is_err(), "no CRLF");
    assert_eq!(parse_text(&[b'x'; MAX_REPLY_LINE - 1]), Ok(None));
}

#[test]
fn memcache_binary_replies_check_status_and_opaque() {
    use binary::{opcode, status};
    use Protocol::McBinary as P;
    let reply = |op, st, opaque, extras: &[u8], value: &[u8]| {
        let mut out = Vec::new();
        binary::encode_response(&mut out, op, st, opaque, 0, extras, b"", value);
        out
    };
    let e = expect(Req::Lock, 9);
    assert_one_reply(P, e, &reply(opcode::LOCK, 0, 9, b"", b""), true);
    assert_one_reply(
        P,
        e,
        &reply(opcode::LOCK, status::LOCKED, 9, b"", b"Locked"),
        false,
    );
    assert_one_reply(P, e, &reply(opcode::LOCK, 0, 8, b"", b""), false);
    let e = expect(Req::Get, 1);
    assert_one_reply(P, e, &reply(opcode::GET, 0, 1, &[0; 4], b"v"), true);
    assert_one_reply(
        P,
        e,
        &reply(opcode::GET, status::KEY_NOT_FOUND, 1, b"", b"Not found"),
        false,
    );
    let e = expect(Req::Clear, 2);
    assert_one_reply(
        P,
        e,
        &reply(opcode::DELETE, status::KEY_NOT_FOUND, 2, b"", b""),
        true,
    );
    let e = expect(Req::Delete, 2);
    assert_one_reply(
        P,
        e,
        &reply(opcode::DELETE, status::KEY_NOT_FOUND, 2, b"", b""),
        false,
    );
    assert!(
        check_reply(P, e, b"STORED\r\n").is_err(),
        "text where binary was expected"
    );
    // The opaque echoes the low 32 bits of a wider id.
    let e = expect(Req::Set, (1 << 32) + 5);
    assert_one_reply(P, e, &reply(opcode::SET, 0, 5, b"", b""), true);
}

#[test]
fn counter_requests_parse_and_replies_check_status_and_opaque() {
    use counter::{op, status};
    use Protocol::Counter as P;
    let mut out = Vec::new();
    encode(P, Req::Lock, b"key:1", b"", 9, &mut out);
    let (r, n) = counter::parse(&out).expect("a valid Acquire");
    assert_eq!((n, r.opaque), (out.len(), 9));
    assert_eq!(
        r.command,
        counter::Command::Acquire {
            resources: 1,
            maximum: u32::MAX,
            name: b"key:1"
        }
    );
    let reply = |opcode, st, opaque, body: &[u8]| {
        let mut v = Vec::new();
        counter::encode(&mut v, opcode, st, opaque, body);
        v
    };
    let e = expect(Req::Lock, 9);
    assert_one_reply(
        P,
        e,
        &reply(op::ACQUIRE, status::OK, 9, &[0, 0, 0, 1]),
        true,
    );
    assert_one_reply(
        P,
        e,
        &reply(op::ACQUIRE, status::OK, 8, &[0, 0, 0, 1]),
        false,
    );
    assert_one_reply(
        P,
        e,
        &reply(op::ACQUIRE, status::NOT_AVAILABLE, 9, b"x"),
        false,
    );
    let e = expect(Req::Unlock, 3);
    assert_one_reply(P, e, &reply(op::RELEASE, status::OK, 3, b""), true);
    assert!(check_reply(P, e, b"STORED\r\n").is_err());
}

#[test]
fn lockd_replies_check_the_opcode() {
    use lockd::op;
    use Protocol::Lockd as P;
    let frame = |opcode| {
        let mut out = Vec::new();
        lockd::encode(&mut out, opcode, b"key:1\0");
        out
    };
    assert_one_reply(P, expect(Req::Lock, 0), &frame(op::ACQUIRED), true);
    assert_one_reply(P, expect(Req::Lock, 0), &frame(op::ACK), false);
    assert_one_reply(P, expect(Req::Unlock, 0), &frame(op::RELEASED), true);
    assert_one_reply(P, expect(Req::Unlock, 0), &frame(op::ERR), false);
    // And the requests are what the daemon's parser reads.
    let mut out = Vec::new();
    encode(P, Req::Lock, b"key:1", b"", 0, &mut out);
    encode(P, Req::Unlock, b"key:1", b"", 0, &mut out);
    let (acq, used) = lockd::parse(&out).expect("ACQ");
    assert_eq!((acq.opcode, acq.name()), (op::ACQ, Some(&b"key:1"[..])));
    let (rel, _) = lockd::parse(&out[used..]).expect("REL");
    assert_eq!((rel.opcode, rel.name()), (op::REL, Some(&b"key:1"[..])));
}

#[test]
fn dlock_replies_check_status_and_request_id() {
    use Protocol::Dlock as P;
    let resp = |id, st| {
        let mut out = Vec::new();
        dlock::encode_response(&mut out, Some(id), st, None, [], 1_700_000_000);
        out
    };
    assert_one_reply(P, expect(Req::Lock, 3), &resp(3, dlock::status::OK), true);
    assert_one_reply(P, expect(Req::Lock, 3), &resp(4, dlock::status::OK), false);
    assert_one_reply(
        P,
        expect(Req::Unlock, 3),
        &resp(3, dlock::status::GENERAL),
        false,
    );
    assert!(check_reply(P, expect(Req::Lock, 1), &[0, 0, 0, 2, 0x18, 0x80]).is_err());
    // The requests decode with the daemon's decoder: Lock type 2, Unlock type 3, key in 51.
    let mut out = Vec::new();
    encode(P, Req::Unlock, b"key:7", b"", 12, &mut out);
    let (body, used) = dlock::parse_frame(&out, 1 << 20).expect("frame");
    assert_eq!(used, out.len());
    let req = dlock::decode_request(body).expect("decodes");
    assert_eq!(
        (req.id, req.req_type),
        (Some(12), Some(dlock::req_type::UNLOCK))
    );
    let keys: Vec<&[u8]> = req.lock.expect("field 51").keys.collect();
    assert_eq!(keys, [b"key:7"]);
}

#[test]
fn native_requests_carry_version_3_and_their_mode() {
    for (p, shared, limit) in [
        (Protocol::Native, false, None),
        (Protocol::NativeShared, true, None),
        (
            Protocol::NativeSemaphore,
            false,
            Some(u64::from(SEMAPHORE_LIMIT)),
        ),
    ] {
        let mut out = Vec::new();
        encode(p, Req::Lock, b"key:2", b"", 5, &mut out);
        let (body, _) = dlock::parse_frame(&out, 1 << 20).expect("frame");
        let req = dlock::decode_request(body).expect("decodes");
        assert_eq!((req.version, req.id), (Some(3), Some(5)), "{p:?}");
        let lock = dlock::decode_native(req.lock.expect("field 51").keys.raw);
        assert_eq!((lock.is_shared(), lock.limit), (shared, limit), "{p:?}");
        // Its replies are checked as dlock's: request id and status.
        let mut r = Vec::new();
        let reply = dlock::NativeReply {
            request_id: Some(5),
            status: dlock::status::OK,
            ..Default::default()
        };
        dlock::encode_native_response(&mut r, &reply);
        assert_one_reply(p, expect(Req::Lock, 5), &r, true);
        assert_one_reply(p, expect(Req::Lock, 6), &r, false);
    }
}

#[test]
fn memcache_requests_parse_with_the_daemon_parser() {
    use holdfast::proto::memcache::text;
    let mut out = Vec::new();
    encode(Protocol::McText, Req::Add, b"key:1", b"vvv", 0, &mut out);
    let mut scanned = 0;
    let (req, used) = text::parse(&out, &mut scanned, 1 << 20).expect("add parses");
    assert_eq!(used, out.len());
    assert!(matches!(
        req,
        text::Request::Store {
            cmd: text::StoreCmd::Add,
            key: b"key:1",
            value: b"vvv",
            ..
        }
    ));
    let mut out = Vec::new();
    encode(Protocol::McBinary, Req::Unlock, b"key:1", b"", 77, &mut out);
    let (req, _) = binary::parse(&out, 1 << 20).expect("unlock parses");
    assert_eq!(
        (req.opcode, req.key, req.opaque),
        (binary::opcode::UNLOCK, &b"key:1"[..], 77)
    );
}

#[test]
fn redis_replies_and_requests() {
    use Protocol::Redis as P;
    assert_one_reply(P, expect(Req::Add, 0), b"+OK\r\n", true);
    assert_one_reply(P, expect(Req::Add, 0), b"$-1\r\n", false);
    assert_one_reply(P, expect(Req::Delete, 0), b":1\r\n", true);
    assert_one_reply(P, expect(Req::Delete, 0), b":0\r\n", false);
    assert_one_reply(P, expect(Req::Clear, 0), b":0\r\n", true);
    assert_one_reply(P, expect(Req::Get, 0), b"$3\r\nabc\r\n", true);
    assert_one_reply(P, expect(Req::Get, 0), b"$0\r\n\r\n", true);
    assert_one_reply(P, expect(Req::Set, 0), b"-ERR wrong\r\n", false);
    assert_eq!(parse_resp(b":-12\r\n"), Ok(Some((Resp::Int(-12), 6))));
    assert!(parse_resp(b"*1\r\n").is_err());
    assert!(parse_resp(b"$3\r\nabcX\r\n").is_err());
    let mut out = Vec::new();
    encode(P, Req::Add, b"k", b"vv", 0, &mut out);
    assert_eq!(
        out,
        b"*6\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nvv\r\n$2\r\nNX\r\n$2\r\nPX\r\n$5\r\n30000\r\n"
    );
}

#[test]
fn decimal_helpers() {
    for n in [0, 7, 10, 12345, u64::MAX] {
        let mut out = Vec::new();
        push_decimal(&mut out, n);
        assert_eq!(out, n.to_string().as_bytes());
    }
    assert_eq!(parse_decimal(b""), None);
    assert_eq!(parse_decimal(b"12a"), None);
    assert_eq!(parse_signed(b"-1"), Some(-1));
}
