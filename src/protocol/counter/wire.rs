//! yrmcds's counter protocol (cybozu/yrmcds `docs/counter.md`): framing, request bodies, replies.
//!
//! Owns: the 12-byte header (request magic 0x90, response magic 0x91), the caps on names and
//! bodies, the decoding of each opcode's body and the encoding of responses.
//!
//! Must not: touch counter state, allocate while parsing, or panic on any input.

/// Request magic byte.
pub const REQ_MAGIC: u8 = 0x90;
/// Response magic byte.
pub const RES_MAGIC: u8 = 0x91;
/// Bytes in every header.
pub const HEADER_LEN: usize = 12;
/// Longest name: the name length field is 16 bits (docs/counter.md: "up to 65535 bytes").
pub const MAX_NAME: usize = u16::MAX as usize;
/// Longest legal body: Acquire's 10 fixed bytes and the longest name. A header announcing more is
/// a lying or hostile client; waiting for that many bytes would let it make us buffer without
/// bound, so the connection is closed at once.
pub const MAX_BODY: usize = 10 + MAX_NAME;

pub mod op {
    pub const NOOP: u8 = 0x00;
    pub const GET: u8 = 0x01;
    pub const ACQUIRE: u8 = 0x02;
    pub const RELEASE: u8 = 0x03;
    pub const STATS: u8 = 0x10;
    pub const DUMP: u8 = 0x11;
}

pub mod status {
    pub const OK: u8 = 0x00;
    pub const NOT_FOUND: u8 = 0x01;
    pub const INVALID: u8 = 0x04;
    pub const NOT_AVAILABLE: u8 = 0x21;
    pub const NOT_ACQUIRED: u8 = 0x22;
    pub const UNKNOWN_COMMAND: u8 = 0x81;
    pub const OUT_OF_MEMORY: u8 = 0x82;
}

/// The message an error response carries in its body ("Error messages are accompanied in the
/// message body").
pub fn status_text(status: u8) -> &'static [u8] {
    match status {
        status::NOT_FOUND => b"Not found",
        status::INVALID => b"Invalid arguments",
        status::NOT_AVAILABLE => b"Resource not available",
        status::NOT_ACQUIRED => b"Not acquired",
        status::UNKNOWN_COMMAND => b"Unknown command",
        status::OUT_OF_MEMORY => b"Out of memory",
        _ => b"",
    }
}

/// What one request asks for, its body decoded.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Command<'a> {
    Noop,
    Get {
        name: &'a [u8],
    },
    Acquire {
        resources: u32,
        maximum: u32,
        name: &'a [u8],
    },
    Release {
        resources: u32,
        name: &'a [u8],
    },
    Stats,
    Dump,
    /// A well-framed request whose body does not fit its opcode (too short, a name length that
    /// disagrees with the body, an empty name, zero resources, resources over the maximum):
    /// answered with `Invalid arguments`.
    Invalid,
    /// An opcode docs/counter.md does not define: answered with `Unknown command`.
    Unknown,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Request<'a> {
    pub opcode: u8,
    pub opaque: u32,
    pub command: Command<'a>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ParseError {
    /// Not a whole request yet.
    Incomplete,
    /// The first byte is not 0x90: the stream is not this protocol, close.
    BadMagic,
    /// The header announces a body longer than [`MAX_BODY`]: close.
    TooLarge,
}

/// A bounds-checked reader over a request body.
struct Cursor<'a> {
    buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.buf.len() {
            return None;
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(head)
    }
    fn u16(&mut self) -> Option<u16> {
        let b = self.take(2)?;
        Some(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        let b = self.take(4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// A length-prefixed name that must end the body exactly and must not be empty.
    fn name(&mut self) -> Option<&'a [u8]> {
        let len = self.u16()? as usize;
        let name = self.take(len)?;
        (!name.is_empty() && self.buf.is_empty()).then_some(name)
    }
}

/// Parse one request from the start of `buf`: the request and the bytes it used.
pub fn parse(buf: &[u8]) -> Result<(Request<'_>, usize), ParseError> {
    match buf.first() {
        None => return Err(ParseError::Incomplete),
        Some(&m) if m != REQ_MAGIC => return Err(ParseError::BadMagic),
        Some(_) => {}
    }
    let Some(header) = buf.first_chunk::<HEADER_LEN>() else {
        return Err(ParseError::Incomplete);
    };
    let opcode = header[1];
    let body_len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
    let opaque = u32::from_be_bytes([header[8], header[9], header[10], header[11]]);
    if body_len > MAX_BODY {
        return Err(ParseError::TooLarge);
    }
    let Some(body) = buf.get(HEADER_LEN..HEADER_LEN + body_len) else {
        return Err(ParseError::Incomplete);
    };
    let command = decode_body(opcode, body).unwrap_or(Command::Invalid);
    Ok((
        Request {
            opcode,
            opaque,
            command,
        },
        HEADER_LEN + body_len,
    ))
}

fn decode_body(opcode: u8, body: &[u8]) -> Option<Command<'_>> {
    let mut c = Cursor { buf: body };
    Some(match opcode {
        // Noop, Stats and Dump have no body; one that comes with bytes anyway is tolerated (the
        // bytes are read and ignored), as yrmcds does.
        op::NOOP => Command::Noop,
        op::STATS => Command::Stats,
        op::DUMP => Command::Dump,
        op::GET => Command::Get { name: c.name()? },
        op::ACQUIRE => {
            let resources = c.u32()?;
            let maximum = c.u32()?;
            let name = c.name()?;
            if resources == 0 || maximum < resources {
                return None;
            }
            Command::Acquire {
                resources,
                maximum,
                name,
            }
        }
        op::RELEASE => {
            let resources = c.u32()?;
            Command::Release {
                resources,
                name: c.name()?,
            }
        }
        _ => Command::Unknown,
    })
}

/// Append one response: header and body.
pub fn encode(out: &mut Vec<u8>, opcode: u8, status: u8, opaque: u32, body: &[u8]) {
    encode_header(out, opcode, status, opaque, body.len() as u32);
    out.extend_from_slice(body);
}

/// Append a response header alone (the caller writes `body_len` bytes after it).
pub fn encode_header(out: &mut Vec<u8>, opcode: u8, status: u8, opaque: u32, body_len: u32) {
    out.extend_from_slice(&[RES_MAGIC, opcode, status, 0]);
    out.extend_from_slice(&body_len.to_be_bytes());
    out.extend_from_slice(&opaque.to_be_bytes());
}

/// Write a response header into a fixed buffer (no allocation for header-only replies).
pub fn encode_header_into(out: &mut [u8], opcode: u8, status: u8, opaque: u32, body_len: u32) {
    if let Some(h) = out.first_chunk_mut::<HEADER_LEN>() {
        h[..4].copy_from_slice(&[RES_MAGIC, opcode, status, 0]);
        h[4..8].copy_from_slice(&body_len.to_be_bytes());
        h[8..].copy_from_slice(&opaque.to_be_bytes());
    }
}

/// Append an error response carrying its status text.
pub fn encode_error(out: &mut Vec<u8>, opcode: u8, status: u8, opaque: u32) {
    encode(out, opcode, status, opaque, status_text(status));
}

/// Append one Dump entry.
pub fn encode_dump_entry(out: &mut Vec<u8>, opaque: u32, current: u32, max: u32, name: &[u8]) {
    let len = name.len().min(MAX_NAME);
    encode_header(out, op::DUMP, status::OK, opaque, 10 + len as u32);
    out.extend_from_slice(&current.to_be_bytes());
    out.extend_from_slice(&max.to_be_bytes());
    out.extend_from_slice(&(len as u16).to_be_bytes());
    out.extend_from_slice(&name[..len]);
}

/// Append one Stats name-value pair to a Stats body.
pub fn encode_stat(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(&(name.len() as u16).to_be_bytes());
    out.extend_from_slice(&(value.len() as u16).to_be_bytes());
    out.extend_from_slice(name);
    out.extend_from_slice(value);
}

/// Build a request (for tests, the bench tool and holdfast-lock).
pub fn encode_request(out: &mut Vec<u8>, opcode: u8, opaque: u32, body: &[u8]) {
    out.extend_from_slice(&[REQ_MAGIC, opcode, 0, 0]);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&opaque.to_be_bytes());
    out.extend_from_slice(body);
}

/// The body of an Acquire request.
pub fn acquire_body(out: &mut Vec<u8>, resources: u32, maximum: u32, name: &[u8]) {
    out.extend_from_slice(&resources.to_be_bytes());
    out.extend_from_slice(&maximum.to_be_bytes());
    out.extend_from_slice(&(name.len() as u16).to_be_bytes());
    out.extend_from_slice(name);
}

/// The body of a Release request.
pub fn release_body(out: &mut Vec<u8>, resources: u32, name: &[u8]) {
    out.extend_from_slice(&resources.to_be_bytes());
    out.extend_from_slice(&(name.len() as u16).to_be_bytes());
    out.extend_from_slice(name);
}

/// The body of a Get request.
pub fn get_body(out: &mut Vec<u8>, name: &[u8]) {
    out.extend_from_slice(&(name.len() as u16).to_be_bytes());
    out.extend_from_slice(name);
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
