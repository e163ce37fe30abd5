use super::*;
use prost::Message;

/// dlock.proto's Request, mirrored by hand for prost (strings as bytes: no UTF-8 checks),
/// plus fields unknown to our decoder of every skippable wire type.
#[derive(Clone, PartialEq, prost::Message)]
struct PRequest {
    #[prost(uint32, optional, tag = "1")]
    version: Option<u32>,
    #[prost(uint64, optional, tag = "2")]
    id: Option<u64>,
    #[prost(bytes = "vec", optional, tag = "3")]
    access_token: Option<Vec<u8>>,
    #[prost(int32, optional, tag = "4")]
    r#type: Option<i32>,
    #[prost(message, optional, tag = "51")]
    lock: Option<PRequestLock>,
    #[prost(uint64, optional, tag = "7")]
    x_varint: Option<u64>,
    #[prost(fixed64, optional, tag = "8")]
    x_fixed64: Option<u64>,
    #[prost(bytes = "vec", optional, tag = "52")]
    x_bytes: Option<Vec<u8>>,
    #[prost(fixed32, optional, tag = "536870911")]
    x_fixed32: Option<u32>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PRequestLock {
    #[prost(uint64, optional, tag = "1")]
    wait_micro: Option<u64>,
    #[prost(uint64, optional, tag = "2")]
    release_micro: Option<u64>,
    #[prost(bytes = "vec", repeated, tag = "3")]
    keys: Vec<Vec<u8>>,
    #[prost(sint64, optional, tag = "4")]
    x_varint: Option<i64>,
    #[prost(bytes = "vec", repeated, tag = "1000")]
    x_bytes: Vec<Vec<u8>>,
    #[prost(fixed32, optional, tag = "5")]
    x_fixed32: Option<u32>,
}

/// dlock.proto's Request exactly (no extra fields): what prost makes of bytes on the wire.
#[derive(Clone, PartialEq, prost::Message)]
struct PlainRequest {
    #[prost(uint32, optional, tag = "1")]
    version: Option<u32>,
    #[prost(uint64, optional, tag = "2")]
    id: Option<u64>,
    #[prost(bytes = "vec", optional, tag = "3")]
    access_token: Option<Vec<u8>>,
    #[prost(int32, optional, tag = "4")]
    r#type: Option<i32>,
    #[prost(message, optional, tag = "51")]
    lock: Option<PlainRequestLock>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PlainRequestLock {
    #[prost(uint64, optional, tag = "1")]
    wait_micro: Option<u64>,
    #[prost(uint64, optional, tag = "2")]
    release_micro: Option<u64>,
    #[prost(bytes = "vec", repeated, tag = "3")]
    keys: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PResponse {
    #[prost(uint32, optional, tag = "1")]
    version: Option<u32>,
    #[prost(uint64, optional, tag = "2")]
    request_id: Option<u64>,
    #[prost(int32, optional, tag = "3")]
    status: Option<i32>,
    #[prost(string, optional, tag = "4")]
    error_text: Option<String>,
    #[prost(bytes = "vec", repeated, tag = "5")]
    keys: Vec<Vec<u8>>,
    #[prost(int64, optional, tag = "6")]
    server_unix_time: Option<i64>,
}

use holdfast::rng::Rng as XorShift;

fn random_request(rng: &mut XorShift) -> PRequest {
    let lock = rng.chance(70).then(|| {
        let key_count = match rng.below(10) {
            0 => 0,
            1 => 100 + rng.below(200),
            _ => 1 + rng.below(5),
        };
        PRequestLock {
            wait_micro: rng.chance(60).then(|| rng.wide()),
            release_micro: rng.chance(60).then(|| rng.wide()),
            keys: (0..key_count).map(|_| rng.bytes(20)).collect(),
            x_varint: rng.chance(20).then(|| rng.wide() as i64),
            x_bytes: (0..rng.below(3)).map(|_| rng.bytes(10)).collect(),
            x_fixed32: rng.chance(20).then(|| rng.next() as u32),
        }
    });
    PRequest {
        version: rng.chance(70).then(|| rng.wide() as u32),
        id: rng.chance(80).then(|| rng.wide()),
        access_token: rng.chance(30).then(|| rng.bytes(40)),
        r#type: rng.chance(90).then(|| rng.wide() as i32),
        lock,
        x_varint: rng.chance(20).then(|| rng.wide()),
        x_fixed64: rng.chance(20).then(|| rng.next()),
        x_bytes: rng.chance(20).then(|| rng.bytes(30)),
        x_fixed32: rng.chance(20).then(|| rng.next() as u32),
    }
}

/// Our decoding must agree with prost's on every field dlock.proto defines.
fn assert_same(ours: &Request<'_>, theirs: &PlainRequest) {
    assert_eq!(ours.version.map(|v| v as u32), theirs.version);
    assert_eq!(ours.id, theirs.id);
    assert_eq!(ours.access_token, theirs.access_token.as_deref());
    assert_eq!(ours.req_type.map(|v| v as i32), theirs.r#type);
    match (&ours.lock, &theirs.lock) {
        (None, None) => {}
        (Some(ours), Some(theirs)) => {
            assert_eq!(ours.wait_micro, theirs.wait_micro);
            assert_eq!(ours.release_micro, theirs.release_micro);
            assert_eq!(ours.key_count, theirs.keys.len());
            let keys: Vec<&[u8]> = ours.keys.collect();
            let expected: Vec<&[u8]> = theirs.keys.iter().map(Vec::as_slice).collect();
            assert_eq!(keys, expected);
        }
        (ours, theirs) => panic!("lock differs: {ours:?} vs {theirs:?}"),
    }
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

#[test]
fn decodes_every_field() {
    let msg = PRequest {
        version: Some(2),
        id: Some(u64::MAX),
        access_token: Some(b"secret".to_vec()),
        r#type: Some(2),
        lock: Some(PRequestLock {
            wait_micro: Some(1_000_000),
            release_micro: Some(0),
            keys: vec![b"a".to_vec(), Vec::new(), b"\xff\xfe not utf-8".to_vec()],
            ..Default::default()
        }),
        ..Default::default()
    };
    let body = msg.encode_to_vec();
    let req = decode_request(&body).expect("valid request");
    assert_eq!(req.version, Some(2));
    assert_eq!(req.id, Some(u64::MAX));
    assert_eq!(req.access_token, Some(&b"secret"[..]));
    assert_eq!(req.req_type, Some(req_type::LOCK));
    let lock = req.lock.expect("lock field");
    assert_eq!(lock.wait_micro, Some(1_000_000));
    assert_eq!(lock.release_micro, Some(0));
    assert_eq!(lock.key_count, 3);
    let keys: Vec<&[u8]> = lock.keys.collect();
    assert_eq!(keys, [&b"a"[..], b"", b"\xff\xfe not utf-8"]);
}

#[test]
fn empty_body_is_a_request_with_no_fields() {
    assert_eq!(decode_request(&[]), Ok(Request::default()));
}

#[test]
fn ping_without_lock_field_has_no_lock() {
    // type = Ping (field 4, varint 1), id = 7.
    let req = decode_request(&[0x20, 0x01, 0x10, 0x07]).expect("valid");
    assert_eq!(req.req_type, Some(req_type::PING));
    assert_eq!(req.id, Some(7));
    assert_eq!(req.lock, None);
}

#[test]
fn unknown_fields_of_every_skippable_wire_type_are_skipped() {
    let mut body = Vec::new();
    put_varint_field(&mut body, 9, 300); // varint
    put_tag(&mut body, 10, WT_I64);
    body.extend_from_slice(&[1; 8]);
    put_bytes_field(&mut body, 11, b"skip me");
    put_tag(&mut body, 12, WT_I32);
    body.extend_from_slice(&[2; 4]);
    put_varint_field(&mut body, F_REQ_ID, 5);
    // And inside the lock message.
    let mut lock = Vec::new();
    put_tag(&mut lock, 99, WT_I32);
    lock.extend_from_slice(&[3; 4]);
    put_bytes_field(&mut lock, F_LOCK_KEYS, b"k");
    put_varint_field(&mut lock, 98, u64::MAX);
    put_bytes_field(&mut body, F_REQ_LOCK, &lock);
    let req = decode_request(&body).expect("valid");
    assert_eq!(req.id, Some(5));
    let lock = req.lock.expect("lock");
    assert_eq!(lock.key_count, 1);
    assert_eq!(lock.keys.collect::<Vec<_>>(), [&b"k"[..]]);
}

#[test]
fn groups_and_undefined_wire_types_are_invalid() {
    for wire in [WT_SGROUP, WT_EGROUP, 6, 7] {
        let mut body = Vec::new();
        put_tag(&mut body, 9, wire);
        body.push(0);
        assert!(decode_request(&body).is_err(), "wire type {wire}");
        let mut lock = Vec::new();
        put_tag(&mut lock, 9, wire);
        lock.push(0);
        let mut body = Vec::new();
        put_bytes_field(&mut body, F_REQ_LOCK, &lock);
        assert!(decode_request(&body).is_err(), "wire type {wire} in lock");
    }
}

#[test]
fn known_field_with_wrong_wire_type_is_invalid() {
    let mut body = Vec::new();
    put_bytes_field(&mut body, F_REQ_ID, b"12345678");
    assert!(decode_request(&body).is_err());
    let mut body = Vec::new();
    put_varint_field(&mut body, F_REQ_LOCK, 1);
    assert!(decode_request(&body).is_err());
    let mut lock = Vec::new();
    put_varint_field(&mut lock, F_LOCK_KEYS, 1);
    let mut body = Vec::new();
    put_bytes_field(&mut body, F_REQ_LOCK, &lock);
    assert!(decode_request(&body).is_err());
}

#[test]
fn field_number_zero_and_out_of_range_tags_are_invalid() {
    assert!(decode_request(&[0x00, 0x01]).is_err());
    // Key 2^32 (field 2^29, wire type 0): over u32.
    let mut body = Vec::new();
    put_varint(&mut body, 1 << 32);
    body.push(0);
    assert!(decode_request(&body).is_err());
    // The largest field number, 2^29 - 1, is fine.
    let mut body = Vec::new();
    put_varint_field(&mut body, (1 << 29) - 1, 1);
    assert!(decode_request(&body).is_ok());
}

#[test]
fn truncated_varint_inside_body_is_invalid() {
    assert!(decode_request(&[0x10]).is_err()); // tag of id, no value
    assert!(decode_request(&[0x10, 0x80]).is_err()); // value's continuation bit, no more
    assert!(decode_request(&[0x80]).is_err()); // truncated tag
    assert!(decode_request(&[0x1a, 0x05, b'a']).is_err()); // length past the end
    assert!(decode_request(&[0x1a]).is_err()); // no length
}

#[test]
fn varints_longer_than_ten_bytes_or_over_64_bits_are_invalid() {
    let mut max = vec![0x10];
    put_varint(&mut max, u64::MAX);
    assert_eq!(max.len(), 11);
    assert_eq!(decode_request(&max).map(|r| r.id), Ok(Some(u64::MAX)));
    let mut overflow = max.clone();
    overflow[10] = 0x02;
    assert!(decode_request(&overflow).is_err());
    let mut eleven = max.clone();
    eleven[10] = 0x81;
    eleven.push(0x00);
    assert!(decode_request(&eleven).is_err());
    // A non-canonical but valid 10-byte zero.
    let mut zero = vec![0x10];
    zero.extend_from_slice(&[0x80; 9]);
    zero.push(0x00);
    assert_eq!(decode_request(&zero).map(|r| r.id), Ok(Some(0)));
}

#[test]
fn repeated_scalar_fields_last_value_wins() {
    let mut body = Vec::new();
    put_varint_field(&mut body, F_REQ_ID, 1);
    put_bytes_field(&mut body, F_REQ_TOKEN, b"first");
    put_varint_field(&mut body, F_REQ_ID, 2);
    put_bytes_field(&mut body, F_REQ_TOKEN, b"second");
    let mut lock = Vec::new();
    put_varint_field(&mut lock, F_LOCK_WAIT, 10);
    put_varint_field(&mut lock, F_LOCK_WAIT, 20);
    put_bytes_field(&mut body, F_REQ_LOCK, &lock);
    let req = decode_request(&body).expect("valid");
    assert_eq!(req.id, Some(2));
    assert_eq!(req.access_token, Some(&b"second"[..]));
    assert_eq!(req.lock.and_then(|l| l.wait_micro), Some(20));
}

#[test]
fn second_lock_field_is_invalid() {
    let mut body = Vec::new();
    put_bytes_field(&mut body, F_REQ_LOCK, &[]);
    put_bytes_field(&mut body, F_REQ_LOCK, &[]);
    assert_eq!(decode_request(&body), Err("field lock (51) repeated"));
}

#[test]
fn version_keeps_its_raw_value() {
    let mut body = Vec::new();
    put_varint_field(&mut body, F_REQ_VERSION, (1 << 32) + 2);
    assert_eq!(
        decode_request(&body).map(|r| r.version),
        Ok(Some((1 << 32) + 2))
    );
}

#[test]
fn frame_is_incomplete_at_every_split_point() {
    let body = PRequest {
        id: Some(42),
        r#type: Some(1),
        ..Default::default()
    }
    .encode_to_vec();
    let framed = frame(&body);
    for split in 0..framed.len() {
        assert_eq!(
            parse_frame(&framed[..split], 1024),
            Err(FrameError::Incomplete),
            "split at {split}"
        );
    }
    assert_eq!(parse_frame(&framed, 1024), Ok((&body[..], framed.len())));
}

#[test]
fn pipelined_frames_are_split_one_at_a_time() {
    let mut stream = frame(b"\x10\x01");
    stream.extend_from_slice(&frame(b""));
    stream.extend_from_slice(&frame(b"\x10\x03"));
    stream.extend_from_slice(&[0, 0]); // start of a fourth
    let mut bodies = Vec::new();
    let mut at = 0;
    loop {
        match parse_frame(&stream[at..], 16) {
            Ok((body, used)) => {
                bodies.push(body.to_vec());
                at += used;
            }
            Err(e) => {
                assert_eq!(e, FrameError::Incomplete);
                break;
            }
        }
    }
    assert_eq!(
        bodies,
        [b"\x10\x01".to_vec(), Vec::new(), b"\x10\x03".to_vec()]
    );
    assert_eq!(at, stream.len() - 2);
}

#[test]
fn oversized_frame_is_too_large_from_its_prefix_alone() {
    assert_eq!(parse_frame(&[0, 0, 0, 11], 10), Err(FrameError::TooLarge));
    assert_eq!(
        parse_frame(&[0xff, 0xff, 0xff, 0xff], usize::MAX >> 1),
        Err(FrameError::Incomplete)
    );
    assert_eq!(
        parse_frame(&[0xff, 0xff, 0xff, 0xff], 1 << 20),
        Err(FrameError::TooLarge)
    );
    // Exactly the limit is fine.
    let mut buf = vec![0, 0, 0, 10];
    buf.extend_from_slice(&[0; 10]);
    assert_eq!(parse_frame(&buf, 10), Ok((&[0u8; 10][..], 14)));
}

#[test]
fn response_always_has_version_status_and_time() {
    let mut out = vec![0xaa]; // bytes already queued stay untouched
    encode_response(&mut out, None, status::OK, None, [], 0);
    assert_eq!(out[0], 0xaa);
    let (body, used) = parse_frame(&out[1..], 1024).expect("one frame");
    assert_eq!(used, out.len() - 1);
    // version = 2, status = 0, server_unix_time = 0.
    assert_eq!(body, [0x08, 0x02, 0x18, 0x00, 0x30, 0x00]);
    let resp = PResponse::decode(body).expect("prost decodes");
    assert_eq!(resp.version, Some(2));
    assert_eq!(resp.request_id, None);
    assert_eq!(resp.status, Some(0));
    assert_eq!(resp.error_text, None);
    assert_eq!(resp.server_unix_time, Some(0));
}

#[test]
fn response_with_every_field_decodes_with_prost() {
    let mut out = Vec::new();
    let keys: [&[u8]; 3] = [b"a", b"", b"\xff"];
    encode_response(
        &mut out,
        Some(u64::MAX),
        status::ACQUIRE_TIMEOUT,
        Some("busy"),
        keys,
        -1,
    );
    let (body, _) = parse_frame(&out, 1 << 20).expect("frame");
    let resp = PResponse::decode(body).expect("prost decodes");
    assert_eq!(
        resp,
        PResponse {
            version: Some(2),
            request_id: Some(u64::MAX),
            status: Some(120),
            error_text: Some("busy".into()),
            keys: vec![b"a".to_vec(), Vec::new(), b"\xff".to_vec()],
            server_unix_time: Some(-1),
        }
    );
}

#[test]
fn random_prost_requests_decode_identically() {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    for case in 0..3000 {
        let msg = random_request(&mut rng);
        let body = msg.encode_to_vec();
        let req = decode_request(&body).unwrap_or_else(|e| panic!("case {case}: {e}"));
        let theirs = PlainRequest::decode(&body[..]).expect("prost decodes");
        assert_same(&req, &theirs);
        // prost drops the unknown extras; what is left is what the message was built with.
        assert_eq!(theirs.id, msg.id);
        assert_eq!(theirs.version, msg.version);
        assert_eq!(
            theirs
                .lock
                .as_ref()
                .map(|l| (&l.keys, l.wait_micro, l.release_micro)),
            msg.lock
                .as_ref()
                .map(|l| (&l.keys, l.wait_micro, l.release_micro))
        );
        // And through a frame.
        let framed = frame(&body);
        assert_eq!(
            parse_frame(&framed, body.len()),
            Ok((&body[..], framed.len()))
        );
    }
}

#[test]
fn concatenated_prost_requests_merge_like_prost() {
    // Concatenating encodings is protobuf's merge: the last scalar wins. At most one side
    // carries `lock`, which we never merge.
    let mut rng = XorShift(77);
    for _ in 0..1000 {
        let first = random_request(&mut rng);
        let mut second = random_request(&mut rng);
        if first.lock.is_some() {
            second.lock = None;
        }
        let mut body = first.encode_to_vec();
        body.extend_from_slice(&second.encode_to_vec());
        let theirs = PlainRequest::decode(&body[..]).expect("prost decodes");
        let ours = decode_request(&body).expect("we decode");
        assert_same(&ours, &theirs);
    }
}

#[test]
fn truncated_bodies_are_rejected_exactly_when_prost_rejects_them() {
    let mut rng = XorShift(12345);
    for _ in 0..300 {
        let body = random_request(&mut rng).encode_to_vec();
        for cut in 0..body.len() {
            let prefix = &body[..cut];
            let theirs = PlainRequest::decode(prefix);
            let ours = decode_request(prefix);
            assert_eq!(ours.is_ok(), theirs.is_ok(), "cut {cut} of {body:?}");
            if let (Ok(ours), Ok(theirs)) = (ours, theirs) {
                assert_same(&ours, &theirs);
            }
        }
    }
}

#[test]
fn mutated_bodies_that_we_accept_prost_reads_the_same() {
    let mut rng = XorShift(0xdead_beef);
    for _ in 0..3000 {
        let mut body = random_request(&mut rng).encode_to_vec();
        if body.is_empty() {
            continue;
        }
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(body.len() as u64) as usize;
            body[at] = rng.next() as u8;
        }
        if let Ok(ours) = decode_request(&body) {
            let theirs = PlainRequest::decode(&body[..]).expect("prost accepts what we accept");
            assert_same(&ours, &theirs);
        }
    }
}

#[test]
fn random_responses_round_trip_through_prost() {
    let mut rng = XorShift(4242);
    let mut out = Vec::new();
    for _ in 0..3000 {
        let keys: Vec<Vec<u8>> = (0..rng.below(6)).map(|_| rng.bytes(12)).collect();
        let request_id = rng.chance(80).then(|| rng.wide());
        let st = [0, 1, 2, 3, 100, 120][rng.below(6) as usize];
        let text = rng.chance(30).then(|| "access denied".to_string());
        let time = rng.wide() as i64;
        out.clear();
        encode_response(
            &mut out,
            request_id,
            st,
            text.as_deref(),
            keys.iter().map(Vec::as_slice),
            time,
        );
        let (body, used) = parse_frame(&out, usize::MAX).expect("frame");
        assert_eq!(used, out.len());
        let resp = PResponse::decode(body).expect("prost decodes");
        assert_eq!(
            resp,
            PResponse {
                version: Some(2),
                request_id,
                status: Some(st as i32),
                error_text: text,
                keys,
                server_unix_time: Some(time),
            }
        );
    }
}

#[test]
fn varint_len_matches_put_varint() {
    for v in [
        0,
        1,
        127,
        128,
        16383,
        16384,
        u64::from(u32::MAX),
        u64::MAX >> 1,
        u64::MAX,
    ] {
        let mut out = Vec::new();
        put_varint(&mut out, v);
        assert_eq!(varint_len(v), out.len(), "{v}");
    }
}

#[test]
fn encoded_requests_decode_with_ours_and_prost() {
    let mut rng = XorShift(0x5eed);
    let mut out = Vec::new();
    for _ in 0..2000 {
        let keys: Vec<Vec<u8>> = (0..rng.below(5)).map(|_| rng.bytes(200)).collect();
        let key_refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let id = rng.chance(80).then(|| rng.wide());
        let req_type = rng.below(4);
        let lock = rng.chance(70).then(|| LockFields {
            wait_micro: rng.chance(50).then(|| rng.wide()),
            release_micro: rng.chance(50).then(|| rng.wide()),
            keys: &key_refs,
            native: Default::default(),
        });
        out.clear();
        encode_request(&mut out, id, None, req_type, lock);
        let (body, used) = parse_frame(&out, usize::MAX).expect("frame");
        assert_eq!(used, out.len());
        let ours = decode_request(body).expect("we decode our own encoding");
        assert_eq!(ours.version, Some(API_VERSION));
        assert_eq!(ours.id, id);
        assert_eq!(ours.req_type, Some(req_type));
        let theirs = PlainRequest::decode(body).expect("prost decodes");
        assert_same(&ours, &theirs);
        match (lock, ours.lock) {
            (None, None) => {}
            (Some(sent), Some(got)) => {
                assert_eq!(
                    (got.wait_micro, got.release_micro),
                    (sent.wait_micro, sent.release_micro)
                );
                assert_eq!(got.keys.collect::<Vec<_>>(), key_refs);
            }
            (sent, got) => panic!("lock sent {sent:?}, decoded {got:?}"),
        }
    }
}

#[test]
fn unlock_request_carries_its_keys_in_field_51() {
    let mut out = Vec::new();
    let keys: [&[u8]; 1] = [b"k"];
    let lock = LockFields {
        keys: &keys,
        ..LockFields::default()
    };
    encode_request(&mut out, Some(1), None, req_type::UNLOCK, Some(lock));
    // version 2, id 1, type 3, field 51 (tag 0x9a 0x03) holding keys = "k".
    assert_eq!(
        out,
        [0, 0, 0, 12, 0x08, 2, 0x10, 1, 0x20, 3, 0x9a, 0x03, 3, 0x1a, 1, b'k']
    );
}

#[test]
fn decode_response_reads_what_encode_response_wrote() {
    let mut rng = XorShift(99);
    let mut out = Vec::new();
    for _ in 0..2000 {
        let keys: Vec<Vec<u8>> = (0..rng.below(4)).map(|_| rng.bytes(8)).collect();
        let request_id = rng.chance(80).then(|| rng.wide());
        let st = [0, 1, 2, 3, 100, 120][rng.below(6) as usize];
        let text = rng.chance(30).then_some("access denied");
        let time = rng.wide() as i64;
        out.clear();
        encode_response(
            &mut out,
            request_id,
            st,
            text,
            keys.iter().map(Vec::as_slice),
            time,
        );
        let (body, _) = parse_frame(&out, usize::MAX).expect("frame");
        let resp = decode_response_view(body).expect("decodes");
        assert_eq!(
            resp,
            ResponseView {
                version: Some(API_VERSION),
                request_id,
                status: Some(i64::from(st)),
                error_text: text.map(str::as_bytes),
                key_count: keys.len(),
                server_unix_time: Some(time),
                fence: None,
            }
        );
        assert!(resp.status_is(st));
    }
}

#[test]
fn decode_response_of_prost_encoding_and_garbage() {
    let msg = PResponse {
        version: Some(2),
        request_id: Some(3),
        status: Some(-1),
        error_text: None,
        keys: vec![b"x".to_vec()],
        server_unix_time: Some(-5),
    };
    let body = msg.encode_to_vec();
    let resp = decode_response_view(&body).expect("decodes");
    assert_eq!(
        (resp.status, resp.key_count, resp.server_unix_time),
        (Some(-1), 1, Some(-5))
    );
    assert!(
        ResponseView::default().status_is(status::OK),
        "absent status is Ok"
    );
    assert!(decode_response_view(&[0x18]).is_err(), "truncated varint");
    assert!(
        decode_response_view(&[0x1a, 0]).is_err(),
        "status with a length-delimited type"
    );
}

/// `holdfast.proto`'s messages, mirrored by hand for prost: the native protocol's frames must
/// read the same to any protobuf implementation.
mod native {
    use super::*;

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct NRequest {
        #[prost(uint32, optional, tag = "1")]
        pub version: Option<u32>,
        #[prost(uint64, optional, tag = "2")]
        pub id: Option<u64>,
        #[prost(bytes = "vec", optional, tag = "3")]
        pub access_token: Option<Vec<u8>>,
        #[prost(int32, optional, tag = "4")]
        pub r#type: Option<i32>,
        #[prost(message, optional, tag = "51")]
        pub lock: Option<NRequestLock>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct NRequestLock {
        #[prost(uint64, optional, tag = "1")]
        pub wait_micro: Option<u64>,
        #[prost(uint64, optional, tag = "2")]
        pub release_micro: Option<u64>,
        #[prost(bytes = "vec", repeated, tag = "3")]
        pub keys: Vec<Vec<u8>>,
        #[prost(bool, optional, tag = "100")]
        pub shared: Option<bool>,
        #[prost(uint32, optional, tag = "101")]
        pub limit: Option<u32>,
        #[prost(bytes = "vec", optional, tag = "102")]
        pub value: Option<Vec<u8>>,
        #[prost(uint64, optional, tag = "103")]
        pub lock_delay_micro: Option<u64>,
        #[prost(uint64, optional, tag = "104")]
        pub fence: Option<u64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct NResponse {
        #[prost(uint32, optional, tag = "1")]
        pub version: Option<u32>,
        #[prost(uint64, optional, tag = "2")]
        pub request_id: Option<u64>,
        #[prost(int32, optional, tag = "3")]
        pub status: Option<i32>,
        #[prost(string, optional, tag = "4")]
        pub error_text: Option<String>,
        #[prost(bytes = "vec", repeated, tag = "5")]
        pub keys: Vec<Vec<u8>>,
        #[prost(int64, optional, tag = "6")]
        pub server_unix_time: Option<i64>,
        #[prost(uint64, optional, tag = "7")]
        pub fence: Option<u64>,
        #[prost(message, repeated, tag = "100")]
        pub info: Vec<NKeyInfo>,
        #[prost(message, optional, tag = "101")]
        pub event: Option<NEvent>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct NKeyInfo {
        #[prost(bytes = "vec", optional, tag = "1")]
        pub key: Option<Vec<u8>>,
        #[prost(bool, optional, tag = "2")]
        pub shared: Option<bool>,
        #[prost(uint32, optional, tag = "3")]
        pub limit: Option<u32>,
        #[prost(message, repeated, tag = "4")]
        pub holders: Vec<NHolder>,
        #[prost(uint32, optional, tag = "5")]
        pub waiters: Option<u32>,
        #[prost(uint64, optional, tag = "6")]
        pub delayed_micro: Option<u64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct NHolder {
        #[prost(uint64, optional, tag = "1")]
        pub fence: Option<u64>,
        #[prost(bytes = "vec", optional, tag = "2")]
        pub value: Option<Vec<u8>>,
        #[prost(uint64, optional, tag = "3")]
        pub lease_left_micro: Option<u64>,
        #[prost(uint32, optional, tag = "4")]
        pub node: Option<u32>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct NEvent {
        #[prost(bytes = "vec", optional, tag = "1")]
        pub key: Option<Vec<u8>>,
        #[prost(int32, optional, tag = "2")]
        pub kind: Option<i32>,
        #[prost(uint64, optional, tag = "3")]
        pub fence: Option<u64>,
        #[prost(bytes = "vec", optional, tag = "4")]
        pub value: Option<Vec<u8>>,
    }

    fn some_bytes(rng: &mut XorShift, max: u64) -> Vec<u8> {
        let n = rng.below(max + 1) as usize;
        (0..n).map(|_| rng.below(256) as u8).collect()
    }

    #[test]
    fn native_requests_read_the_same_to_prost_and_to_us() {
        let mut rng = XorShift::new(7);
        for _ in 0..2000 {
            let keys: Vec<Vec<u8>> = (0..rng.below(4))
                .map(|_| some_bytes(&mut rng, 20))
                .collect();
            let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
            let value = rng.chance(50).then(|| some_bytes(&mut rng, 300));
            let native = NativeFields {
                shared: rng.chance(50),
                limit: rng.chance(50).then(|| rng.wide() as u32),
                value: value.as_deref(),
                lock_delay_micro: rng.chance(50).then(|| rng.wide()),
                fence: rng.chance(50).then(|| rng.wide()),
            };
            let lock = LockFields {
                wait_micro: rng.chance(50).then(|| rng.wide()),
                release_micro: rng.chance(50).then(|| rng.wide()),
                keys: &refs,
                native,
            };
            let ty = 1 + rng.below(8);
            let mut out = Vec::new();
            encode_request_version(&mut out, NATIVE_VERSION, Some(5), None, ty, Some(lock));
            let (body, n) = parse_frame(&out, 1 << 20).expect("one frame");
            assert_eq!(n, out.len());
            let p = NRequest::decode(body).expect("prost reads it");
            assert_eq!(
                (p.version, p.id, p.r#type),
                (Some(3), Some(5), Some(ty as i32))
            );
            let pl = p.lock.expect("lock");
            assert_eq!(pl.keys, keys);
            assert_eq!(pl.shared, native.shared.then_some(true));
            assert_eq!(pl.limit, native.limit);
            assert_eq!(pl.value.as_deref(), native.value);
            assert_eq!(pl.lock_delay_micro, native.lock_delay_micro);
            assert_eq!(pl.fence, native.fence);

            let ours = decode_request(body).expect("we read it");
            let l = ours.lock.expect("lock");
            let n = decode_native(l.keys.raw);
            assert_eq!(n.is_shared(), native.shared);
            assert_eq!(n.limit, native.limit.map(u64::from));
            assert_eq!(n.value, native.value);
            assert_eq!(n.lock_delay_micro, native.lock_delay_micro);
            assert_eq!(n.fence, native.fence);
            assert_eq!(n.malformed, 0);
            assert_eq!(l.keys.collect::<Vec<_>>(), refs);
        }
    }

    #[test]
    fn a_dlock_request_without_native_fields_is_byte_for_byte_what_it_was() {
        let keys: [&[u8]; 1] = [b"k"];
        let lock = LockFields {
            keys: &keys,
            ..LockFields::default()
        };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        encode_request(&mut a, Some(1), None, req_type::LOCK, Some(lock));
        encode_request_version(
            &mut b,
            API_VERSION,
            Some(1),
            None,
            req_type::LOCK,
            Some(lock),
        );
        assert_eq!(a, b);
        // version 2, id 1, type 2, field 51 holding keys = "k": nothing else.
        assert_eq!(
            a,
            [0, 0, 0, 12, 0x08, 2, 0x10, 1, 0x20, 2, 0x9a, 0x03, 3, 0x1a, 1, b'k']
        );
    }

    #[test]
    fn native_fields_of_the_wrong_wire_type_are_skipped_and_counted() {
        // RequestLock: keys = "k", then field 100 as bytes and field 104 as fixed32.
        let lock = [
            0x1a, 1, b'k', 0xa2, 0x06, 2, b'x', b'y', 0xc5, 0x06, 1, 2, 3, 4,
        ];
        let l = decode_lock(&lock).expect("skippable, as any unknown field");
        assert_eq!(l.key_count, 1);
        let n = decode_native(l.keys.raw);
        assert_eq!(n.malformed, 2);
        assert_eq!((n.shared, n.fence), (None, None));
    }

    #[test]
    fn native_responses_with_every_field_read_the_same_to_prost_and_to_us() {
        let mut rng = XorShift::new(11);
        for _ in 0..500 {
            let values: Vec<Option<Vec<u8>>> = (0..6)
                .map(|_| rng.chance(60).then(|| some_bytes(&mut rng, 5000)))
                .collect();
            let holders: Vec<HolderOut<'_>> = values
                .iter()
                .map(|v| HolderOut {
                    fence: rng.wide(),
                    value: v.as_deref(),
                    lease_left_micro: rng.wide(),
                    node: rng.chance(50).then(|| rng.wide() as u32),
                })
                .collect();
            let split = rng.below(7) as usize;
            let keys: Vec<Vec<u8>> = (0..2).map(|_| some_bytes(&mut rng, 300)).collect();
            let info = [
                KeyInfoOut {
                    key: &keys[0],
                    shared: true,
                    limit: rng.wide() as u32,
                    holders: &holders[..split],
                    waiters: rng.wide() as u32,
                    delayed_micro: rng.wide(),
                },
                KeyInfoOut {
                    key: &keys[1],
                    shared: false,
                    limit: 1,
                    holders: &holders[split..],
                    waiters: 0,
                    delayed_micro: 0,
                },
            ];
            let event = rng.chance(50).then(|| EventOut {
                key: &keys[1],
                kind: 1 + rng.below(4) as u32,
                fence: rng.wide(),
                value: values[0].as_deref(),
            });
            let key_refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
            let reply = NativeReply {
                request_id: Some(rng.wide()),
                status: status::NOT_HELD,
                error_text: Some("not held"),
                keys: &key_refs,
                server_unix_time: 1_800_000_000,
                fence: Some(rng.wide()),
                info: &info[..rng.below(3) as usize],
                event,
            };
            let mut out = vec![9, 9];
            encode_native_response(&mut out, &reply);
            let (body, n) = parse_frame(&out[2..], 1 << 24).expect("one frame");
            assert_eq!(n, out.len() - 2);
            let p = NResponse::decode(body).expect("prost reads it");
            assert_eq!(p.version, Some(3));
            assert_eq!(p.request_id, reply.request_id);
            assert_eq!(p.status, Some(status::NOT_HELD as i32));
            assert_eq!(p.error_text.as_deref(), Some("not held"));
            assert_eq!(p.keys, keys);
            assert_eq!(p.fence, reply.fence);
            assert_eq!(p.info.len(), reply.info.len());
            for (pi, i) in p.info.iter().zip(reply.info) {
                assert_eq!(pi.key.as_deref(), Some(i.key));
                assert_eq!(pi.shared, Some(i.shared));
                assert_eq!(pi.limit, Some(i.limit));
                assert_eq!(pi.waiters, Some(i.waiters));
                assert_eq!(pi.delayed_micro, Some(i.delayed_micro));
                assert_eq!(pi.holders.len(), i.holders.len());
                for (ph, h) in pi.holders.iter().zip(i.holders) {
                    assert_eq!(ph.fence, Some(h.fence));
                    assert_eq!(ph.value.as_deref(), h.value);
                    assert_eq!(ph.lease_left_micro, Some(h.lease_left_micro));
                    assert_eq!(ph.node, h.node);
                }
            }
            match (&p.event, &reply.event) {
                (None, None) => {}
                (Some(pe), Some(e)) => {
                    assert_eq!(pe.key.as_deref(), Some(e.key));
                    assert_eq!(pe.kind, Some(e.kind as i32));
                    assert_eq!(pe.fence, Some(e.fence));
                    assert_eq!(pe.value.as_deref(), e.value);
                }
                other => panic!("event {:?}", other),
            }

            let ours = decode_response(body).expect("we read it");
            assert_eq!(ours.info.len(), reply.info.len());
            for (oi, i) in ours.info.iter().zip(reply.info) {
                assert_eq!(oi.key, i.key);
                assert_eq!((oi.shared, oi.limit), (i.shared, Some(i.limit)));
                let hs: Vec<_> = oi
                    .holders
                    .iter()
                    .map(|h| (h.fence, h.value.as_deref(), h.lease_left_micro, h.node))
                    .collect();
                let want: Vec<_> = i
                    .holders
                    .iter()
                    .map(|h| (h.fence, h.value, h.lease_left_micro, h.node))
                    .collect();
                assert_eq!(hs, want);
            }
            assert_eq!(
                ours.event.as_ref().map(|e| (&e.key[..], e.kind, e.fence)),
                reply.event.map(|e| (e.key, e.kind, e.fence))
            );
        }
    }
}
