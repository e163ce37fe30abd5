//! The old lock-daemon wire format (`old-protocol.txt`, "Protocol specification").
//!
//! Owns: framing only. One big-endian `u32` header, `version(4) << 28 | opcode(8) << 20 |
//! length(20)`, then `length` payload bytes. Every header is well formed (any 20-bit length is
//! legal), so parsing has no error case: a frame is either complete or not yet.
//!
//! Must not: decide what an unknown opcode or a wrong version means (the worker's decode does, as
//! `docs/protocol.md` says), allocate while parsing, or panic on any input.

/// Opcodes of old-protocol.txt.
pub mod op {
    pub const ACQ: u8 = 1;
    pub const REL: u8 = 2;
    pub const TRY: u8 = 3;
    pub const PING: u8 = 4;
    pub const ADOPT: u8 = 5;
    pub const SYNC: u8 = 6;
    /// holdfast's extension (`docs/protocol.md`, "Fencing tokens"): the caller's fencing token for the
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
    /// A payload that starts with NUL yields `Some(b"")`: the name is "the bytes before the
    /// first NUL", so the empty name is a name like any other.
    pub fn name(&self) -> Option<&'a [u8]> {
        let payload: &'a [u8] = self.payload;
        payload.get(..name_len(payload)?)
    }
}

/// The length of the object name at the start of `payload` (see [`Frame::name`]).
#[inline]
pub fn name_len(payload: &[u8]) -> Option<usize> {
    payload.iter().position(|&b| b == 0)
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
#[path = "wire_tests.rs"]
mod tests;
