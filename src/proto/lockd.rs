//! The old lock-daemon wire format (`old-protocol.txt`, "Protocol specification").
//!
//! Owns: framing only. One big-endian `u32` header, `version(4) << 28 | opcode(8) << 20 |
//! length(20)`, then `length` payload bytes. Every header is well formed (any 20-bit length is
//! legal), so parsing has no error case: a frame is either complete or not yet.
//!
//! Must not: decide what an unknown opcode or a wrong version means (the connection does, per the
//! contract in `specs/README.md`), allocate while parsing, or panic on any input.

/// Opcodes of old-protocol.txt.
pub mod op {
    pub const ACQ: u8 = 1;
    pub const REL: u8 = 2;
    pub const TRY: u8 = 3;
    pub const PING: u8 = 4;
    pub const ADOPT: u8 = 5;
    pub const SYNC: u8 = 6;
    /// holdfast's extension (contract: "Fencing tokens"): the caller's fencing token for the
    /// named lock, answered with ACK (name, NUL, 8-byte big-endian token) or ERR.
    pub const REQ_TOKEN: u8 = 7;
    pub const ACQUIRED: u8 = 128;
    pub const WBLOCK: u8 = 129;
    pub const RELEASED: u8 = 130;
    pub const PONG: u8 = 131;
    pub const ACK: u8 = 132;
    pub const ERR: u8 = 133;
    pub const SYNC_REPLY: u8 = 134;
}

/// The only protocol version.
pub const VERSION: u8 = 1;
/// Largest payload the 20-bit length field can carry.
pub const MAX_PAYLOAD: usize = (1 << 20) - 1;
/// Bytes in a frame header: one `u32`.
pub const HEADER_LEN: usize = 4;

/// Field layout of the header word (old-protocol.txt, the header diagram).
const VERSION_SHIFT: u32 = 28;
const OPCODE_SHIFT: u32 = 20;
const LENGTH_MASK: u32 = (1 << OPCODE_SHIFT) - 1;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Frame<'a> {
    pub version: u8,
    pub opcode: u8,
    pub payload: &'a [u8],
}

impl<'a> Frame<'a> {
    /// The object name: the payload bytes before the first NUL; `None` if the payload is empty
    /// or holds no NUL.
    ///
    /// A payload that starts with NUL yields `Some(b"")`: the contract defines the name as "the
    /// bytes before the first NUL", so the empty name is a name like any other.
    pub fn name(&self) -> Option<&'a [u8]> {
        let payload: &'a [u8] = self.payload;
        let nul = payload.iter().position(|&b| b == 0)?;
        payload.get(..nul)
    }
}

/// Parse one frame; `Err(())` never happens for a 20-bit length, so the result is the frame and
/// the bytes consumed, or `None` when incomplete.
pub fn parse(buf: &[u8]) -> Option<(Frame<'_>, usize)> {
    let (header, rest) = buf.split_first_chunk::<HEADER_LEN>()?;
    let word = u32::from_be_bytes(*header);
    // Both casts are exact: the shifts leave 4 and 8 significant bits.
    let version = (word >> VERSION_SHIFT) as u8;
    let opcode = ((word >> OPCODE_SHIFT) & 0xff) as u8;
    let len = (word & LENGTH_MASK) as usize;
    let payload = rest.get(..len)?;
    Some((
        Frame {
            version,
            opcode,
            payload,
        },
        HEADER_LEN + len,
    ))
}

/// The version of the frame that starts `buf`, known from its first byte (the top nibble of the
/// header), before the rest of the header or any payload: `None` when `buf` is empty.
pub fn peek_version(buf: &[u8]) -> Option<u8> {
    // The shift leaves the 4 version bits of the first (most significant) header byte.
    buf.first().map(|&b| b >> (VERSION_SHIFT - 24))
}

/// The header of a version-1 frame with `opcode` and a payload of `len` bytes, for callers that
/// write the payload themselves (a SYNC reply assembled name by name). `len` must be
/// <= MAX_PAYLOAD; a larger one is clamped (see [`encode`]).
pub fn header(opcode: u8, len: usize) -> [u8; HEADER_LEN] {
    debug_assert!(len <= MAX_PAYLOAD, "lockd payload of {len} bytes");
    let len = len.min(MAX_PAYLOAD) as u32;
    let word = (u32::from(VERSION) << VERSION_SHIFT) | (u32::from(opcode) << OPCODE_SHIFT) | len;
    word.to_be_bytes()
}

/// Append a version-1 frame to `out`. `payload.len()` must be <= MAX_PAYLOAD.
///
/// A longer payload is a caller bug (debug builds assert). Release builds send only its first
/// MAX_PAYLOAD bytes, so that the header always matches the bytes that follow and the client's
/// stream stays in sync: a truncated reply is wrong, a desynchronised stream is worse.
pub fn encode(out: &mut Vec<u8>, opcode: u8, payload: &[u8]) {
    let payload = payload.get(..MAX_PAYLOAD).unwrap_or(payload);
    out.reserve(HEADER_LEN + payload.len());
    out.extend_from_slice(&header(opcode, payload.len()));
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
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
}
