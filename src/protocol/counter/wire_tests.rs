use super::*;

fn req(opcode: u8, opaque: u32, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    encode_request(&mut v, opcode, opaque, body);
    v
}

fn acquire(r: u32, m: u32, name: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    acquire_body(&mut b, r, m, name);
    req(op::ACQUIRE, 7, &b)
}

#[test]
fn complete_requests_parse_to_their_commands() {
    let mut rel = Vec::new();
    release_body(&mut rel, 0, b"n");
    let mut get = Vec::new();
    get_body(&mut get, b"name");
    let cases: Vec<(Vec<u8>, Command<'static>)> = vec![
        (req(op::NOOP, 1, b""), Command::Noop),
        (req(op::STATS, 1, b""), Command::Stats),
        (req(op::DUMP, 1, b""), Command::Dump),
        (req(op::GET, 1, &get), Command::Get { name: b"name" }),
        (
            acquire(2, 5, b"x"),
            Command::Acquire {
                resources: 2,
                maximum: 5,
                name: b"x",
            },
        ),
        (
            req(op::RELEASE, 1, &rel),
            Command::Release {
                resources: 0,
                name: b"n",
            },
        ),
        (acquire(0, 5, b"x"), Command::Invalid),
        (acquire(6, 5, b"x"), Command::Invalid),
        (acquire(1, 5, b""), Command::Invalid),
        (req(op::GET, 1, &[0, 5, b'a']), Command::Invalid),
        (req(op::GET, 1, &[0, 1, b'a', b'b']), Command::Invalid),
        (req(op::RELEASE, 1, &[0, 0]), Command::Invalid),
        (req(0x42, 1, b"whatever"), Command::Unknown),
    ];
    for (bytes, want) in cases {
        let (r, n) = parse(&bytes).expect("complete");
        assert_eq!(n, bytes.len());
        assert_eq!(r.command, want, "{bytes:?}");
    }
}

#[test]
fn every_split_point_is_incomplete_then_whole() {
    let whole = acquire(1, 3, b"some-name");
    for cut in 0..whole.len() {
        assert_eq!(
            parse(&whole[..cut]),
            Err(ParseError::Incomplete),
            "cut {cut}"
        );
    }
    let (r, n) = parse(&whole).expect("whole");
    assert_eq!(n, whole.len());
    assert_eq!(r.opaque, 7);
}

#[test]
fn pipelined_requests_parse_one_after_another() {
    let mut buf = acquire(1, 3, b"a");
    buf.extend(req(op::NOOP, 9, b""));
    buf.extend(req(op::DUMP, 10, b""));
    let mut pos = 0;
    let mut ops = Vec::new();
    while pos < buf.len() {
        let (r, n) = parse(&buf[pos..]).expect("pipelined");
        ops.push(r.opcode);
        pos += n;
    }
    assert_eq!(ops, vec![op::ACQUIRE, op::NOOP, op::DUMP]);
}

#[test]
fn oversized_body_and_bad_magic_close() {
    let mut big = req(op::GET, 1, b"");
    big[4..8].copy_from_slice(&((MAX_BODY as u32) + 1).to_be_bytes());
    assert_eq!(parse(&big), Err(ParseError::TooLarge));
    big[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(parse(&big), Err(ParseError::TooLarge));
    assert_eq!(parse(b"\x80\x00"), Err(ParseError::BadMagic));
    assert_eq!(parse(b"get x\r\n"), Err(ParseError::BadMagic));
    // The largest legal body is only incomplete.
    big[4..8].copy_from_slice(&(MAX_BODY as u32).to_be_bytes());
    assert_eq!(parse(&big), Err(ParseError::Incomplete));
}

#[test]
fn garbage_before_a_valid_request_is_a_bad_magic() {
    let mut buf = b"\x00junk".to_vec();
    buf.extend(req(op::NOOP, 1, b""));
    assert_eq!(parse(&buf), Err(ParseError::BadMagic));
    assert!(parse(&buf[5..]).is_ok());
}

#[test]
fn responses_carry_magic_opcode_status_opaque_and_length() {
    let mut out = Vec::new();
    encode_error(&mut out, op::GET, status::NOT_FOUND, 0xdead_beef);
    assert_eq!(&out[..4], &[RES_MAGIC, op::GET, status::NOT_FOUND, 0]);
    assert_eq!(&out[4..8], &9u32.to_be_bytes());
    assert_eq!(&out[8..12], &0xdead_beefu32.to_be_bytes());
    assert_eq!(&out[12..], b"Not found");
    out.clear();
    encode_dump_entry(&mut out, 3, 2, 4, b"ab");
    assert_eq!(out.len(), 12 + 12);
    assert_eq!(&out[12..22], &[0, 0, 0, 2, 0, 0, 0, 4, 0, 2]);
}
