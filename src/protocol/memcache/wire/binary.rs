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
//! | key length > 250 | `Refuse { status: VALUE_TOO_LARGE, skip: 24 + body }` (`docs/protocol.md`) |
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
        st::AUTH_ERROR => b"Auth failure.",
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
    /// Authentication required or failed (`--memcache-auth-file`).
    pub const AUTH_ERROR: u16 = 0x0020;
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
#[path = "binary_tests.rs"]
mod tests;
