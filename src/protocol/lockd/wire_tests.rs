use super::*;

fn frame_bytes(version: u8, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let word = (u32::from(version) << 28) | (u32::from(opcode) << 20) | payload.len() as u32;
    let mut v = word.to_be_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

#[test]
fn header_fields_are_big_endian_4_8_20_bits() {
    let buf = [0x10, 0x10, 0x00, 0x02, b'a', 0];
    let (f, used) = parse(&buf).expect("complete");
    assert_eq!(used, 6);
    assert_eq!(
        f,
        Frame {
            version: 1,
            opcode: op::ACQ,
            payload: b"a\0"
        }
    );
    // Every field at its extreme: version 15, opcode 255, length 0.
    let (f, used) = parse(&[0xff, 0xf0, 0, 0]).expect("complete");
    assert_eq!(
        (f.version, f.opcode, f.payload, used),
        (15, 255, &b""[..], 4)
    );
}

#[test]
fn incomplete_at_every_split_point_then_complete() {
    let whole = frame_bytes(1, op::TRY, b"some lock\0");
    for cut in 0..whole.len() {
        assert_eq!(parse(&whole[..cut]), None, "cut at {cut}");
    }
    let (f, used) = parse(&whole).expect("complete");
    assert_eq!(used, whole.len());
    assert_eq!(f.opcode, op::TRY);
    assert_eq!(f.payload, b"some lock\0");
}

#[test]
fn version_is_known_from_the_first_byte() {
    assert_eq!(peek_version(&[]), None);
    for version in 0..16u8 {
        let whole = frame_bytes(version, op::ACQ, b"x\0");
        assert_eq!(peek_version(&whole[..1]), Some(version));
        assert_eq!(parse(&whole).map(|(f, _)| f.version), Some(version));
    }
}

#[test]
fn empty_payload_frame_is_just_the_header() {
    let buf = frame_bytes(1, op::SYNC, b"");
    assert_eq!(parse(&buf[..3]), None);
    let (f, used) = parse(&buf).expect("complete");
    assert_eq!((f.opcode, f.payload, used), (op::SYNC, &b""[..], 4));
}

#[test]
fn pipelined_frames_parse_one_after_another() {
    let mut buf = frame_bytes(1, op::ACQ, b"a\0");
    buf.extend(frame_bytes(1, op::PING, b"xyz"));
    buf.extend(frame_bytes(2, op::REL, b"a\0"));
    buf.extend(frame_bytes(1, op::SYNC, b""));
    buf.extend_from_slice(&[0x10, 0x20]); // a partial fifth header
    let mut at = 0;
    let mut seen = Vec::new();
    while let Some((f, used)) = parse(&buf[at..]) {
        seen.push((f.version, f.opcode, f.payload.to_vec()));
        at += used;
    }
    assert_eq!(
        seen,
        vec![
            (1, op::ACQ, b"a\0".to_vec()),
            (1, op::PING, b"xyz".to_vec()),
            (2, op::REL, b"a\0".to_vec()),
            (1, op::SYNC, vec![]),
        ]
    );
    assert_eq!(buf.len() - at, 2, "the partial header stays unconsumed");
}

#[test]
fn max_20_bit_length_is_accepted() {
    let payload = vec![b'x'; MAX_PAYLOAD];
    let buf = frame_bytes(1, op::PING, &payload);
    assert_eq!(&buf[..4], &[0x10, 0x4f, 0xff, 0xff]);
    assert_eq!(parse(&buf[..buf.len() - 1]), None);
    let (f, used) = parse(&buf).expect("complete");
    assert_eq!(used, 4 + MAX_PAYLOAD);
    assert_eq!(f.payload.len(), MAX_PAYLOAD);
    // A header announcing the maximum with nothing behind it is simply incomplete.
    assert_eq!(parse(&[0x10, 0x4f, 0xff, 0xff]), None);
}

#[test]
fn name_is_bytes_before_first_nul() {
    let f = |payload: &'static [u8]| Frame {
        version: 1,
        opcode: op::ACQ,
        payload,
    };
    assert_eq!(f(b"").name(), None, "empty payload");
    assert_eq!(f(b"abc").name(), None, "no NUL");
    assert_eq!(f(b"\0").name(), Some(&b""[..]), "NUL first");
    assert_eq!(
        f(b"\0abc\0").name(),
        Some(&b""[..]),
        "NUL first, more after"
    );
    assert_eq!(f(b"abc\0").name(), Some(&b"abc"[..]));
    assert_eq!(f(b"abc\0def").name(), Some(&b"abc"[..]), "bytes after NUL");
    assert_eq!(f(b"a\0b\0").name(), Some(&b"a"[..]), "first NUL wins");
    assert_eq!(f(b"\xff\xfe\0").name(), Some(&b"\xff\xfe"[..]), "not UTF-8");
}

#[test]
fn encode_then_parse_round_trips() {
    let payloads: [&[u8]; 4] = [b"", b"lock\0", b"\0\0\xff", &[7; 300]];
    for opcode in [op::ACQUIRED, op::WBLOCK, op::ERR, op::SYNC_REPLY, 0, 255] {
        for payload in payloads {
            let mut out = vec![0xaa]; // encode appends
            encode(&mut out, opcode, payload);
            assert_eq!(out[0], 0xaa);
            let (f, used) = parse(&out[1..]).expect("complete");
            assert_eq!(used, out.len() - 1);
            assert_eq!((f.version, f.opcode, f.payload), (VERSION, opcode, payload));
        }
    }
    let mut out = Vec::new();
    encode(&mut out, op::PONG, &vec![1; MAX_PAYLOAD]);
    let (f, used) = parse(&out).expect("complete");
    assert_eq!((f.payload.len(), used), (MAX_PAYLOAD, out.len()));
}

#[test]
fn header_matches_encode() {
    let mut out = Vec::new();
    encode(&mut out, op::SYNC_REPLY, b"a\0bc\0");
    assert_eq!(&out[..4], &header(op::SYNC_REPLY, 5));
    assert_eq!(header(op::ACK, 0), [0x18, 0x40, 0, 0]);
}
