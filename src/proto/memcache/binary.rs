//! STUB (API fixed, body to be written): memcached binary protocol framing.

/// Length of a binary request or response header.
pub const HEADER_LEN: usize = 24;

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

/// Parse one binary request. `max_value` is `--max-item-size`.
#[allow(unused_variables)]
pub fn parse(buf: &[u8], max_value: usize) -> Result<(Request<'_>, usize), ParseError> {
    unimplemented!()
}

/// Append a response header and body to `out`.
#[allow(unused_variables, clippy::too_many_arguments)]
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
    unimplemented!()
}
