//! STUB (API fixed, body to be written): dlock frames and a hand-written protobuf codec.

/// RequestType values of dlock.proto (Unlock is the contract's extension).
pub mod req_type {
    pub const PING: u64 = 1;
    pub const LOCK: u64 = 2;
    pub const UNLOCK: u64 = 3;
}

/// ResponseStatus values of dlock.proto.
pub mod status {
    pub const OK: u32 = 0;
    pub const GENERAL: u32 = 1;
    pub const VERSION: u32 = 2;
    pub const INVALID_TYPE: u32 = 3;
    pub const TOO_MANY_KEYS: u32 = 100;
    pub const ACQUIRE_TIMEOUT: u32 = 120;
}

/// Keys of a RequestLock, borrowed: iterates the `keys` fields (3) of the embedded message.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Keys<'a> {
    /// The RequestLock message bytes (already validated by `decode_request`).
    pub raw: &'a [u8],
}

impl<'a> Iterator for Keys<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        unimplemented!()
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct LockRequest<'a> {
    pub wait_micro: Option<u64>,
    pub release_micro: Option<u64>,
    pub keys: Keys<'a>,
    /// Number of keys (counted while validating).
    pub key_count: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Request<'a> {
    pub version: Option<u64>,
    pub id: Option<u64>,
    pub access_token: Option<&'a [u8]>,
    /// Raw enum value of `type` (field 4).
    pub req_type: Option<u64>,
    /// Field 51.
    pub lock: Option<LockRequest<'a>>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FrameError {
    Incomplete,
    /// The length prefix exceeds the limit: close the connection.
    TooLarge,
}

/// Split one length-prefixed frame off `buf`: its protobuf body and the bytes consumed.
#[allow(unused_variables)]
pub fn parse_frame(buf: &[u8], max_message: usize) -> Result<(&[u8], usize), FrameError> {
    unimplemented!()
}

/// Decode a Request body without allocating. `Err` carries a reason for logs.
#[allow(unused_variables)]
pub fn decode_request(body: &[u8]) -> Result<Request<'_>, &'static str> {
    unimplemented!()
}

/// Append one length-prefixed Response frame to `out` (version = 2 always).
#[allow(unused_variables)]
pub fn encode_response<'k>(
    out: &mut Vec<u8>,
    request_id: Option<u64>,
    status: u32,
    error_text: Option<&str>,
    keys: impl IntoIterator<Item = &'k [u8]>,
    server_unix_time: i64,
) {
    unimplemented!()
}
