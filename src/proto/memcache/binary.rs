//! memcached binary protocol framing (memcached's doc/protocol-binary.xml and protocol_binary.h)
//! with yrmcds's lock opcodes 0x40..=0x4b and statuses 0x0010/0x0011 (yrmcds-locking.md).
//!
//! Owns: cutting one request frame out of the receive buffer and writing response frames.
//! Must not: interpret opcodes (the server glue does: unknown opcodes are its
//! `UNKNOWN_COMMAND`), allocate while parsing, panic on any input, or wait for a body it is
//! going to refuse: a header announcing a key or value over the limits is refused from the
//! header alone, with `skip` telling the caller how much to swallow as it arrives.
//!
//! Every field is read through [`Cursor`], a bounds-checked reader, never by indexing into the
//! untrusted buffer (aws/s2n-quic's s2n-codec README explains why).
//!
//! | header | result |
//! |---|---|
//! | magic != 0x80 | `Fatal` (close) |
//! | extras length + key length > total body | `Fatal`: the frame cannot be delimited safely |
//! | key length > 250 | `Refuse { status: VALUE_TOO_LARGE, skip: 24 + body }` (the contract) |
//! | body - extras - key > `max_value` | `Refuse { status: VALUE_TOO_LARGE, skip: 24 + body }` |
//! | otherwise | `Incomplete` until 24 + body bytes are there, then the request |

use super::{BINARY_REQUEST_MAGIC, MAX_KEY_LEN};

/// Length of a binary request or response header.
pub const HEADER_LEN: usize = 24;

/// The binary response magic byte.
pub const BINARY_RESPONSE_MAGIC: u8 = 0x81;

/// Command opcodes: memcached's (protocol-binary.xml "Command Opcodes", protocol_binary.h for
/// 0x1b..=0x24) and yrmcds's (yrmcds-locking.md "New opcodes").
pub mod opcode {
    pub const GET: u8 = 0x00;
    pub const SET: u8 = 0x01;
    pub const ADD: u8 = 0x02;
    pub const REPLACE: u8 = 0x03;
    pub const DELETE: u8 = 0x04;
    pub const INCREMENT: u8 = 0x05;
    pub const DECREMENT: u8 = 0x06;
    pub const QUIT: u8 = 0x07;
    pub const FLUSH: u8 = 0x08;
    pub const GETQ: u8 = 0x09;
    pub const NOOP: u8 = 0x0a;
    pub const VERSION: u8 = 0x0b;
    pub const GETK: u8 = 0x0c;
    pub const GETKQ: u8 = 0x0d;
    pub const APPEND: u8 = 0x0e;
    pub const PREPEND: u8 = 0x0f;
    pub const STAT: u8 = 0x10;
    pub const SETQ: u8 = 0x11;
    pub const ADDQ: u8 = 0x12;
    pub const REPLACEQ: u8 = 0x13;
    pub const DELETEQ: u8 = 0x14;
    pub const INCREMENTQ: u8 = 0x15;
    pub const DECREMENTQ: u8 = 0x16;
    pub const QUITQ: u8 = 0x17;
    pub const FLUSHQ: u8 = 0x18;
    pub const APPENDQ: u8 = 0x19;
    pub const PREPENDQ: u8 = 0x1a;
    pub const VERBOSITY: u8 = 0x1b;
    pub const TOUCH: u8 = 0x1c;
    pub const GAT: u8 = 0x1d;
    pub const GATQ: u8 = 0x1e;
    pub const GATK: u8 = 0x23;
    pub const GATKQ: u8 = 0x24;

    // yrmcds server-side locks.
    pub const LOCK: u8 = 0x40;
    pub const LOCKQ: u8 = 0x41;
    pub const UNLOCK: u8 = 0x42;
    pub const UNLOCKQ: u8 = 0x43;
    pub const UNLOCK_ALL: u8 = 0x44;
    pub const UNLOCK_ALLQ: u8 = 0x45;
    /// Lock and get.
    pub const LAG: u8 = 0x46;
    pub const LAGQ: u8 = 0x47;
    /// Lock and get with key.
    pub const LAGK: u8 = 0x48;
    pub const LAGKQ: u8 = 0x49;
    /// Replace and unlock.
    pub const RAU: u8 = 0x4a;
    pub const RAUQ: u8 = 0x4b;
    /// yrmcds's key dump (cybozu/yrmcds docs/keys.md).
    pub const KEYS: u8 = 0x50;

    /// Every opcode holdfast serves, for tables and tests.
    pub const ALL: [u8; 46] = [
        GET,
        SET,
        ADD,
        REPLACE,
        DELETE,
        INCREMENT,
        DECREMENT,
        QUIT,
        FLUSH,
        GETQ,
        NOOP,
        VERSION,
        GETK,
        GETKQ,
        APPEND,
        PREPEND,
        STAT,
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
        VERBOSITY,
        TOUCH,
        GAT,
        GATQ,
        GATK,
        GATKQ,
        LOCK,
        LOCKQ,
        UNLOCK,
        UNLOCKQ,
        UNLOCK_ALL,
        UNLOCK_ALLQ,
        LAG,
        LAGQ,
        LAGK,
        LAGKQ,
        RAU,
        RAUQ,
        KEYS,
    ];

    /// A quiet variant: silent on the uninteresting outcome (success, or a miss for the get
    /// family), still answers errors.
    pub fn is_quiet(op: u8) -> bool {
        matches!(
            op,
            GETQ | GETKQ
                | SETQ
                | ADDQ
                | REPLACEQ
                | DELETEQ
                | INCREMENTQ
                | DECREMENTQ
                | QUITQ
                | FLUSHQ
                | APPENDQ
                | PREPENDQ
                | GATQ
                | GATKQ
                | LOCKQ
                | UNLOCKQ
                | UNLOCK_ALLQ
                | LAGQ
                | LAGKQ
                | RAUQ
        )
    }
}

/// The body of an error response, as memcached words it (yrmcds's words where they differ, when
/// `yrmcds` is set: cybozu/yrmcds src/memcache/memcache.cpp, the STATUS_* texts).
pub fn status_text(code: u16, yrmcds: bool) -> &'static [u8] {
    use status as st;
    if yrmcds {
        match code {
            st::KEY_EXISTS => return b"Exists",
            st::VALUE_TOO_LARGE => return b"Too large value",
            st::INVALID_ARGUMENTS => return b"Invalid request",
            st::ITEM_NOT_STORED => return b"Not stored",
            st::NON_NUMERIC => return b"Non-numeric value",
            _ => {}
        }
    }
    match code {
        st::KEY_NOT_FOUND => b"Not found",
        st::KEY_EXISTS => b"Data exists for key.",
        st::VALUE_TOO_LARGE => b"Too large.",
        st::INVALID_ARGUMENTS => b"Invalid arguments",
        st::ITEM_NOT_STORED => b"Not stored.",
        st::NON_NUMERIC => b"Non-numeric server-side value for incr or decr",
        st::LOCKED => b"Locked",
        st::NOT_LOCKED => b"Not locked",
        st::UNKNOWN_COMMAND => b"Unknown command",
        st::OUT_OF_MEMORY => b"Out of memory",
        _ => b"",
    }
}

/// Response statuses (protocol-binary.xml "Response Status", yrmcds-locking.md).
pub mod status {
    pub const NO_ERROR: u16 = 0x0000;
    pub const KEY_NOT_FOUND: u16 = 0x0001;
    pub const KEY_EXISTS: u16 = 0x0002;
    pub const VALUE_TOO_LARGE: u16 = 0x0003;
    pub const INVALID_ARGUMENTS: u16 = 0x0004;
    pub const ITEM_NOT_STORED: u16 = 0x0005;
    /// Incr/Decr on a non-numeric value.
    pub const NON_NUMERIC: u16 = 0x0006;
    /// yrmcds: locked by another connection.
    pub const LOCKED: u16 = 0x0010;
    /// yrmcds: not locked by the caller.
    pub const NOT_LOCKED: u16 = 0x0011;
    pub const UNKNOWN_COMMAND: u16 = 0x0081;
    pub const OUT_OF_MEMORY: u16 = 0x0082;
}

/// One binary request, every field borrowed from the receive buffer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Request<'a> {
    pub opcode: u8,
    pub data_type: u8,
    pub vbucket: u16,
    pub opaque: u32,
    pub cas: u64,
    pub extras: &'a [u8],
    pub key: &'a [u8],
    pub value: &'a [u8],
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ParseError {
    /// Need more bytes.
    Incomplete,
    /// The frame is well formed but must be refused with `status` (for example key or body too
    /// long). Its header is still valid: answer with `opcode` and `opaque`, then discard `skip`
    /// bytes (header and body; may exceed the bytes received so far).
    Refuse {
        opcode: u8,
        opaque: u32,
        status: u16,
        skip: usize,
    },
    /// Not a binary request (bad magic) or a header that cannot be trusted: close the connection.
    Fatal,
}

/// A bounds-checked big-endian reader over untrusted bytes: every read either returns whole
/// bytes that are there or `None`, and never moves past the end.
struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Cursor { rest: buf }
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.rest.len() {
            return None;
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|[b]| b)
    }

    fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_be_bytes)
    }

    fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_be_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_be_bytes)
    }
}

/// The fixed 24-byte request header (protocol-binary.xml "Request header").
struct Header {
    magic: u8,
    opcode: u8,
    key_len: u16,
    extras_len: u8,
    data_type: u8,
    vbucket: u16,
    body_len: u32,
    opaque: u32,
    cas: u64,
}

impl Header {
    fn read(cur: &mut Cursor<'_>) -> Option<Header> {
        Some(Header {
            magic: cur.u8()?,
            opcode: cur.u8()?,
            key_len: cur.u16()?,
            extras_len: cur.u8()?,
            data_type: cur.u8()?,
            vbucket: cur.u16()?,
            body_len: cur.u32()?,
            opaque: cur.u32()?,
            cas: cur.u64()?,
        })
    }
}

/// Parse one binary request. `max_value` is `--max-item-size`.
///
/// `Ok((request, consumed))` with `consumed == 24 + body length <= buf.len()`. A bad magic byte
/// is reported as soon as the first byte is there; everything else needs the whole header.
/// A `Refuse` never waits for the body: its `skip` (24 + body) may be far beyond `buf.len()`
/// (a body length of 4 GiB is refused from its header). On a 32-bit target a body length whose
/// `24 + body` does not fit in `usize` is `Fatal`.
pub fn parse(buf: &[u8], max_value: usize) -> Result<(Request<'_>, usize), ParseError> {
    match buf.first() {
        None => return Err(ParseError::Incomplete),
        Some(&m) if m != BINARY_REQUEST_MAGIC => return Err(ParseError::Fatal),
        Some(_) => {}
    }
    let mut cur = Cursor::new(buf);
    let Some(h) = Header::read(&mut cur) else {
        return Err(ParseError::Incomplete);
    };
    debug_assert_eq!(h.magic, BINARY_REQUEST_MAGIC);
    let extras_len = usize::from(h.extras_len);
    let key_len = usize::from(h.key_len);
    let body_len = usize::try_from(h.body_len).map_err(|_| ParseError::Fatal)?;
    let frame_len = HEADER_LEN.checked_add(body_len).ok_or(ParseError::Fatal)?;
    // extras_len + key_len <= 255 + 65535: no overflow.
    let Some(value_len) = body_len.checked_sub(extras_len + key_len) else {
        return Err(ParseError::Fatal);
    };
    if key_len > MAX_KEY_LEN || value_len > max_value {
        return Err(ParseError::Refuse {
            opcode: h.opcode,
            opaque: h.opaque,
            status: status::VALUE_TOO_LARGE,
            skip: frame_len,
        });
    }
    let (Some(extras), Some(key), Some(value)) =
        (cur.take(extras_len), cur.take(key_len), cur.take(value_len))
    else {
        return Err(ParseError::Incomplete);
    };
    Ok((
        Request {
            opcode: h.opcode,
            data_type: h.data_type,
            vbucket: h.vbucket,
            opaque: h.opaque,
            cas: h.cas,
            extras,
            key,
            value,
        },
        frame_len,
    ))
}

/// Append a response header and body to `out`.
///
/// Magic 0x81, data type 0 (raw bytes). The lengths must fit their fields (extras <= 255 bytes,
/// key <= 65535 bytes, whole body < 4 GiB); holdfast's own replies always do.
#[allow(clippy::too_many_arguments)]
pub fn encode_response(
    out: &mut Vec<u8>,
    opcode: u8,
    status: u16,
    opaque: u32,
    cas: u64,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
) {
    let body_len = extras.len() + key.len() + value.len();
    debug_assert!(extras.len() <= usize::from(u8::MAX));
    debug_assert!(key.len() <= usize::from(u16::MAX));
    debug_assert!(u32::try_from(body_len).is_ok());
    // The header is built on the stack and appended once: one capacity check, not ten.
    let mut h = [0u8; HEADER_LEN];
    h[0] = BINARY_RESPONSE_MAGIC;
    h[1] = opcode;
    h[2..4].copy_from_slice(&(key.len() as u16).to_be_bytes());
    h[4] = extras.len() as u8;
    // h[5]: data type, raw bytes (0)
    h[6..8].copy_from_slice(&status.to_be_bytes());
    h[8..12].copy_from_slice(&(body_len as u32).to_be_bytes());
    h[12..16].copy_from_slice(&opaque.to_be_bytes());
    h[16..24].copy_from_slice(&cas.to_be_bytes());
    if body_len == 0 {
        // Most answers to lock requests: the header alone.
        out.extend_from_slice(&h);
        return;
    }
    out.reserve(HEADER_LEN + body_len);
    out.extend_from_slice(&h);
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// Append a request frame to `out` (the client side: `holdfast-bench` and tests).
///
/// Magic 0x80, data type 0, vbucket 0. The lengths must fit their fields (extras <= 255 bytes,
/// key <= 65535 bytes, whole body < 4 GiB).
pub fn encode_request(
    out: &mut Vec<u8>,
    opcode: u8,
    opaque: u32,
    cas: u64,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
) {
    let body_len = extras.len() + key.len() + value.len();
    debug_assert!(extras.len() <= usize::from(u8::MAX));
    debug_assert!(key.len() <= usize::from(u16::MAX));
    debug_assert!(u32::try_from(body_len).is_ok());
    out.reserve(HEADER_LEN + body_len);
    out.push(BINARY_REQUEST_MAGIC);
    out.push(opcode);
    out.extend_from_slice(&(key.len() as u16).to_be_bytes());
    out.push(extras.len() as u8);
    out.push(0); // data type: raw bytes
    out.extend_from_slice(&0u16.to_be_bytes()); // vbucket
    out.extend_from_slice(&(body_len as u32).to_be_bytes());
    out.extend_from_slice(&opaque.to_be_bytes());
    out.extend_from_slice(&cas.to_be_bytes());
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// One binary response, every field borrowed from the receive buffer (the client side).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Response<'a> {
    pub opcode: u8,
    pub data_type: u8,
    pub status: u16,
    pub opaque: u32,
    pub cas: u64,
    pub extras: &'a [u8],
    pub key: &'a [u8],
    pub value: &'a [u8],
}

/// Parse one binary response (the header of protocol-binary.xml "Response header": the request
/// layout with the status where the vbucket was).
///
/// `Err(Incomplete)` until the whole frame is there; `Err(Fatal)` for a magic other than 0x81
/// or extras + key longer than the body (a stream that cannot be followed any further). Never
/// returns `Refuse`: a client has no size limit to enforce.
pub fn parse_response(buf: &[u8]) -> Result<(Response<'_>, usize), ParseError> {
    match buf.first() {
        None => return Err(ParseError::Incomplete),
        Some(&m) if m != BINARY_RESPONSE_MAGIC => return Err(ParseError::Fatal),
        Some(_) => {}
    }
    let mut cur = Cursor::new(buf);
    let Some(h) = Header::read(&mut cur) else {
        return Err(ParseError::Incomplete);
    };
    let extras_len = usize::from(h.extras_len);
    let key_len = usize::from(h.key_len);
    let body_len = usize::try_from(h.body_len).map_err(|_| ParseError::Fatal)?;
    let frame_len = HEADER_LEN.checked_add(body_len).ok_or(ParseError::Fatal)?;
    let Some(value_len) = body_len.checked_sub(extras_len + key_len) else {
        return Err(ParseError::Fatal);
    };
    let (Some(extras), Some(key), Some(value)) =
        (cur.take(extras_len), cur.take(key_len), cur.take(value_len))
    else {
        return Err(ParseError::Incomplete);
    };
    Ok((
        Response {
            opcode: h.opcode,
            data_type: h.data_type,
            // The response header keeps the status where a request keeps the vbucket.
            status: h.vbucket,
            opaque: h.opaque,
            cas: h.cas,
            extras,
            key,
            value,
        },
        frame_len,
    ))
}

#[cfg(test)]
mod tests {
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
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut rng = move |n: usize| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) % n as u64) as usize
        };
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
}
