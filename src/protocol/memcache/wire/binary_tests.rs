use super::*;

const MAX: usize = 1024 * 1024;

/// A request frame; `body_len` overrides the true body length when `Some`.
fn frame(
    opcode: u8,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
    opaque: u32,
    cas: u64,
    body_len: Option<u32>,
) -> Vec<u8> {
    let body = (extras.len() + key.len() + value.len()) as u32;
    let mut v = vec![BINARY_REQUEST_MAGIC, opcode];
    v.extend_from_slice(&(key.len() as u16).to_be_bytes());
    v.push(extras.len() as u8);
    v.push(0);
    v.extend_from_slice(&0x0102u16.to_be_bytes()); // vbucket
    v.extend_from_slice(&body_len.unwrap_or(body).to_be_bytes());
    v.extend_from_slice(&opaque.to_be_bytes());
    v.extend_from_slice(&cas.to_be_bytes());
    v.extend_from_slice(extras);
    v.extend_from_slice(key);
    v.extend_from_slice(value);
    v
}

/// A plausible request for every opcode: (extras, key, value) as protocol-binary.xml and
/// yrmcds-locking.md lay them out.
fn shape(op: u8) -> (&'static [u8], &'static [u8], &'static [u8]) {
    use opcode::*;
    const SET_EXTRAS: &[u8] = &[0xde, 0xad, 0xbe, 0xef, 0, 0, 0x0e, 0x10];
    const EXP: &[u8] = &[0, 0, 0, 60];
    const INCR_EXTRAS: &[u8] = &[0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    match op {
        GET | GETQ | GETK | GETKQ | DELETE | DELETEQ | LOCK | LOCKQ | UNLOCK | UNLOCKQ => {
            (b"", b"key", b"")
        }
        SET | SETQ | ADD | ADDQ | REPLACE | REPLACEQ | RAU | RAUQ => {
            (SET_EXTRAS, b"key", b"value\r\n\x00")
        }
        APPEND | APPENDQ | PREPEND | PREPENDQ => (b"", b"key", b"tail"),
        INCREMENT | INCREMENTQ | DECREMENT | DECREMENTQ => (INCR_EXTRAS, b"counter", b""),
        FLUSH | FLUSHQ | VERBOSITY => (EXP, b"", b""),
        TOUCH | GAT | GATQ | GATK | GATKQ | LAG | LAGQ | LAGK | LAGKQ => (EXP, b"key", b""),
        STAT => (b"", b"settings", b""),
        KEYS => (b"", b"prefix:", b""),
        _ => (b"", b"", b""),
    }
}

#[test]
fn opcode_and_status_numbers_match_the_protocol_texts() {
    use opcode::*;
    // 0x00..=0x1c are memcached's contiguous opcodes.
    assert_eq!(&ALL[..29], &(0x00..=0x1c).collect::<Vec<u8>>()[..]);
    assert_eq!([GAT, GATQ, GATK, GATKQ], [0x1d, 0x1e, 0x23, 0x24]);
    assert_eq!(&ALL[33..45], &(0x40..=0x4b).collect::<Vec<u8>>()[..]);
    assert_eq!(ALL[45], 0x50);
    assert_eq!([TOUCH, VERBOSITY, NOOP, STAT], [0x1c, 0x1b, 0x0a, 0x10]);
    assert_eq!([status::LOCKED, status::NOT_LOCKED], [0x10, 0x11]);
    assert_eq!(
        [status::UNKNOWN_COMMAND, status::OUT_OF_MEMORY],
        [0x81, 0x82]
    );
    let quiet: Vec<u8> = ALL.iter().copied().filter(|&op| is_quiet(op)).collect();
    assert_eq!(
        quiet,
        [
            GETQ,
            GETKQ,
            SETQ,
            ADDQ,
            REPLACEQ,
            DELETEQ,
            INCREMENTQ,
            DECREMENTQ,
            QUITQ,
            FLUSHQ,
            APPENDQ,
            PREPENDQ,
            GATQ,
            GATKQ,
            LOCKQ,
            UNLOCKQ,
            UNLOCK_ALLQ,
            LAGQ,
            LAGKQ,
            RAUQ
        ]
    );
}

#[test]
fn every_opcode_parses_with_all_header_fields() {
    for (i, &op) in opcode::ALL.iter().enumerate() {
        let (extras, key, value) = shape(op);
        let buf = frame(
            op,
            extras,
            key,
            value,
            0xA0B0_C0D0 ^ i as u32,
            u64::MAX - 1,
            None,
        );
        let want = Request {
            opcode: op,
            data_type: 0,
            vbucket: 0x0102,
            opaque: 0xA0B0_C0D0 ^ i as u32,
            cas: u64::MAX - 1,
            extras,
            key,
            value,
        };
        assert_eq!(parse(&buf, MAX), Ok((want, buf.len())), "opcode {op:#04x}");
    }
}

#[test]
fn every_split_point_of_every_request_is_incomplete() {
    for &op in &opcode::ALL {
        let (extras, key, value) = shape(op);
        let buf = frame(op, extras, key, value, 7, 0, None);
        for i in 0..buf.len() {
            assert_eq!(
                parse(&buf[..i], MAX),
                Err(ParseError::Incomplete),
                "{op:#04x} at {i}"
            );
        }
        assert!(matches!(parse(&buf, MAX), Ok((_, n)) if n == buf.len()));
    }
}

#[test]
fn pipelined_requests_parse_back_to_back() {
    let mut all = Vec::new();
    for &op in &opcode::ALL {
        let (extras, key, value) = shape(op);
        all.extend_from_slice(&frame(op, extras, key, value, u32::from(op), 0, None));
    }
    let mut pos = 0;
    for &op in &opcode::ALL {
        let (req, n) = parse(&all[pos..], MAX).expect("pipelined request");
        assert_eq!((req.opcode, req.opaque), (op, u32::from(op)));
        assert_eq!((req.extras, req.key, req.value), shape(op));
        pos += n;
    }
    assert_eq!(pos, all.len());
    assert_eq!(parse(&all[pos..], MAX), Err(ParseError::Incomplete));
}

#[test]
fn bad_magic_is_fatal_from_the_first_byte() {
    for magic in [0x00, 0x81, 0x7f, b'g', 0xff] {
        assert_eq!(parse(&[magic], MAX), Err(ParseError::Fatal));
        let mut buf = frame(opcode::GET, b"", b"k", b"", 0, 0, None);
        buf[0] = magic;
        assert_eq!(parse(&buf, MAX), Err(ParseError::Fatal));
    }
}

#[test]
fn extras_and_key_longer_than_body_is_fatal() {
    let buf = frame(opcode::SET, &[0; 8], b"key", b"", 0, 0, Some(10));
    assert_eq!(parse(&buf, MAX), Err(ParseError::Fatal));
    let buf = frame(opcode::GET, b"", b"key", b"", 0, 0, Some(0));
    assert_eq!(parse(&buf[..HEADER_LEN], MAX), Err(ParseError::Fatal));
    // Exactly equal is fine: no value.
    let buf = frame(opcode::GET, b"", b"key", b"", 0, 0, Some(3));
    assert!(parse(&buf, MAX).is_ok());
}

#[test]
fn key_over_250_bytes_is_refused_with_value_too_large() {
    let key = [b'k'; 251];
    let buf = frame(opcode::GET, b"", &key, b"", 42, 0, None);
    assert_eq!(
        parse(&buf[..HEADER_LEN], MAX),
        Err(ParseError::Refuse {
            opcode: opcode::GET,
            opaque: 42,
            status: status::VALUE_TOO_LARGE,
            skip: buf.len()
        })
    );
    let ok = frame(opcode::GET, b"", &key[..250], b"", 42, 0, None);
    assert!(matches!(parse(&ok, MAX), Ok((r, n)) if r.key.len() == 250 && n == ok.len()));
}

#[test]
fn value_over_max_is_refused_from_the_header_alone() {
    let value = [b'v'; 101];
    let buf = frame(opcode::SETQ, &[0; 8], b"k", &value, 9, 0, None);
    let refuse = Err(ParseError::Refuse {
        opcode: opcode::SETQ,
        opaque: 9,
        status: status::VALUE_TOO_LARGE,
        skip: buf.len(),
    });
    assert_eq!(parse(&buf[..HEADER_LEN], 100), refuse);
    assert_eq!(parse(&buf, 100), refuse);
    assert!(parse(&buf, 101).is_ok());
}

#[test]
fn lying_body_length_is_refused_without_buffering_it() {
    let buf = frame(opcode::SET, &[0; 8], b"k", b"", 1, 0, Some(u32::MAX));
    match parse(&buf, MAX) {
        Err(ParseError::Refuse { status, skip, .. }) => {
            assert_eq!(status, status::VALUE_TOO_LARGE);
            assert_eq!(skip, HEADER_LEN + u32::MAX as usize);
            assert!(skip > buf.len());
        }
        other => panic!("{other:?}"),
    }
    // Just over the cap (max value + 250-byte key + 255 bytes of extras) is refused too.
    let cap = (MAX + MAX_KEY_LEN + 255) as u32;
    let buf = frame(
        opcode::SET,
        &[0; 255],
        &[b'k'; 250],
        b"",
        1,
        0,
        Some(cap + 1),
    );
    assert!(matches!(parse(&buf, MAX), Err(ParseError::Refuse { .. })));
}

#[test]
fn refused_frame_then_valid_request_parses_after_skipping() {
    let mut buf = frame(opcode::GET, b"", &[b'k'; 300], b"", 1, 0, None);
    let next = frame(opcode::NOOP, b"", b"", b"", 2, 0, None);
    buf.extend_from_slice(&next);
    let Err(ParseError::Refuse { skip, .. }) = parse(&buf, MAX) else {
        panic!("not refused");
    };
    assert_eq!(skip, HEADER_LEN + 300);
    let (req, n) = parse(&buf[skip..], MAX).expect("next request");
    assert_eq!((req.opcode, req.opaque, n), (opcode::NOOP, 2, HEADER_LEN));
}

#[test]
fn encode_response_matches_the_protocol_examples() {
    // protocol-binary.xml, "Introduction" example: Get miss with "Not found".
    let mut out = Vec::new();
    encode_response(
        &mut out,
        opcode::GET,
        status::KEY_NOT_FOUND,
        0,
        0,
        b"",
        b"",
        b"Not found",
    );
    let mut want = vec![0x81, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0, 0, 0, 9];
    want.extend_from_slice(&[0; 12]);
    want.extend_from_slice(b"Not found");
    assert_eq!(out, want);
    // "getk/getkq response" example: flags 0xdeadbeef, key Hello, value World, cas 1.
    out.clear();
    encode_response(
        &mut out,
        opcode::GET,
        0,
        0,
        1,
        &[0xde, 0xad, 0xbe, 0xef],
        b"Hello",
        b"World",
    );
    let mut want = vec![
        0x81, 0x00, 0x00, 0x05, 0x04, 0x00, 0x00, 0x00, 0, 0, 0, 0x0e,
    ];
    want.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    want.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
    want.extend_from_slice(b"HelloWorld");
    assert_eq!(out, want);
    // Appends; opaque and status land where a client looks for them.
    encode_response(
        &mut out,
        opcode::LOCK,
        status::LOCKED,
        0x01020304,
        0,
        b"",
        b"",
        b"",
    );
    assert_eq!(
        &out[want.len()..],
        &[0x81, 0x40, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0]
    );
}

#[test]
fn random_bytes_and_mutations_never_panic() {
    let mut gen = crate::rng::Rng(0x2545_F491_4F6C_DD1D);
    let mut rng = move |n: usize| gen.index(n);
    for round in 0..20_000 {
        let mut buf: Vec<u8> = if round % 2 == 0 {
            let len = rng(80);
            let mut v: Vec<u8> = (0..len).map(|_| rng(256) as u8).collect();
            if let Some(b) = v.first_mut() {
                *b = BINARY_REQUEST_MAGIC;
            }
            v
        } else {
            let op = opcode::ALL[rng(opcode::ALL.len())];
            let (e, k, v) = shape(op);
            frame(op, e, k, v, 0, 0, None)
        };
        for _ in 0..rng(4) {
            if buf.is_empty() {
                break;
            }
            match rng(3) {
                0 => {
                    let i = rng(buf.len());
                    buf[i] = rng(256) as u8;
                }
                1 => buf.truncate(rng(buf.len() + 1)),
                _ => {
                    let i = rng(buf.len() + 1);
                    buf.insert(i, rng(256) as u8);
                }
            }
        }
        let max_value = rng(64);
        for i in 0..=buf.len() {
            match parse(&buf[..i], max_value) {
                Ok((r, n)) => {
                    assert!(n >= HEADER_LEN && n <= i);
                    assert_eq!(r.extras.len() + r.key.len() + r.value.len(), n - HEADER_LEN);
                }
                Err(ParseError::Refuse { skip, .. }) => assert!(skip >= HEADER_LEN),
                Err(_) => {}
            }
        }
    }
}

#[test]
fn encode_request_parses_back_with_every_field() {
    let mut out = vec![0xaa]; // encode appends
    encode_request(
        &mut out,
        opcode::SET,
        7,
        9,
        &[1, 2, 3, 4, 0, 0, 0, 0],
        b"key",
        b"val",
    );
    assert_eq!(out[0], 0xaa);
    let (req, used) = parse(&out[1..], MAX).expect("complete");
    assert_eq!(used, out.len() - 1);
    assert_eq!(
        req,
        Request {
            opcode: opcode::SET,
            data_type: 0,
            vbucket: 0,
            opaque: 7,
            cas: 9,
            extras: &[1, 2, 3, 4, 0, 0, 0, 0],
            key: b"key",
            value: b"val",
        }
    );
    // Matches the hand-built frame of the tests above (vbucket aside).
    let mut expected = frame(opcode::LOCK, b"", b"k", b"", 1, 0, None);
    expected[6..8].copy_from_slice(&[0, 0]);
    let mut out = Vec::new();
    encode_request(&mut out, opcode::LOCK, 1, 0, b"", b"k", b"");
    assert_eq!(out, expected);
}

#[test]
fn parse_response_reads_what_encode_response_wrote() {
    let mut out = Vec::new();
    encode_response(
        &mut out,
        opcode::GET,
        status::NO_ERROR,
        5,
        77,
        &[0, 0, 0, 1],
        b"",
        b"v",
    );
    encode_response(
        &mut out,
        opcode::UNLOCK,
        status::NOT_LOCKED,
        6,
        0,
        b"",
        b"",
        b"Not locked",
    );
    let (first, used) = parse_response(&out).expect("first");
    assert_eq!(
        first,
        Response {
            opcode: opcode::GET,
            data_type: 0,
            status: status::NO_ERROR,
            opaque: 5,
            cas: 77,
            extras: &[0, 0, 0, 1],
            key: b"",
            value: b"v",
        }
    );
    let (second, used2) = parse_response(&out[used..]).expect("second");
    assert_eq!(used + used2, out.len());
    assert_eq!(
        (second.opcode, second.status, second.opaque, second.value),
        (opcode::UNLOCK, status::NOT_LOCKED, 6, &b"Not locked"[..])
    );
    for cut in 0..used {
        assert_eq!(
            parse_response(&out[..cut]),
            Err(ParseError::Incomplete),
            "cut {cut}"
        );
    }
}

#[test]
fn parse_response_refuses_request_magic_and_lying_lengths() {
    let mut out = Vec::new();
    encode_request(&mut out, opcode::GET, 0, 0, b"", b"k", b"");
    assert_eq!(parse_response(&out), Err(ParseError::Fatal));
    let mut out = Vec::new();
    encode_response(&mut out, opcode::GET, 0, 0, 0, &[0; 4], b"key", b"");
    out[8..12].copy_from_slice(&2u32.to_be_bytes()); // body shorter than extras + key
    assert_eq!(parse_response(&out), Err(ParseError::Fatal));
}
