//! STUB (API fixed, body to be written): the old lock-daemon wire format.

/// Opcodes of old-protocol.txt.
pub mod op {
    pub const ACQ: u8 = 1;
    pub const REL: u8 = 2;
    pub const TRY: u8 = 3;
    pub const PING: u8 = 4;
    pub const ADOPT: u8 = 5;
    pub const SYNC: u8 = 6;
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

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Frame<'a> {
    pub version: u8,
    pub opcode: u8,
    pub payload: &'a [u8],
}

impl<'a> Frame<'a> {
    /// The object name: the payload bytes before the first NUL; `None` if the payload is empty
    /// or holds no NUL.
    pub fn name(&self) -> Option<&'a [u8]> {
        unimplemented!()
    }
}

/// Parse one frame; `Err(())` never happens for a 20-bit length, so the result is the frame and
/// the bytes consumed, or `None` when incomplete.
#[allow(unused_variables)]
pub fn parse(buf: &[u8]) -> Option<(Frame<'_>, usize)> {
    unimplemented!()
}

/// Append a version-1 frame to `out`. `payload.len()` must be <= MAX_PAYLOAD.
#[allow(unused_variables)]
pub fn encode(out: &mut Vec<u8>, opcode: u8, payload: &[u8]) {
    unimplemented!()
}
