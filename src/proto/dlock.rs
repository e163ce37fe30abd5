//! dlock frames and a hand-written protobuf (proto2) codec for `Request` and `Response`
//! (`dlock.txt`, `dlock.proto`, and the "dlock protocol" section of the contract).
//!
//! Owns: splitting a byte stream into 4-byte big-endian length-prefixed frames, decoding a
//! `Request` body into a [`Request`] that borrows from the body (no allocation), and appending
//! `Response` frames to an output buffer (no intermediate allocation).
//!
//! Must not: read a clock, allocate while decoding, panic on any input, or decide what a request
//! means (version checks, key limits and the access token belong to the daemon).
//!
//! Decoding rules (protobuf's, with the choices the contract left open):
//! - Unknown fields of wire types 0 (varint), 1 (64-bit), 2 (length-delimited) and 5 (32-bit) are
//!   skipped. Groups (wire types 3 and 4, deprecated since proto2 and absent from dlock.proto) and
//!   the undefined wire types 6 and 7 are invalid.
//! - A known field with the wrong wire type is invalid (as prost and protobuf-go decide).
//! - The body is a complete frame, so a varint, a tag or a length that runs past its end is
//!   invalid, never "incomplete". Varints longer than 10 bytes or over 64 bits are invalid; field
//!   number 0 and tags over `u32::MAX` (field numbers over 2^29 - 1) are invalid.
//! - Repeated occurrences of a scalar field: the last one wins (protobuf's rule).
//! - A second `lock` field (51) is rejected: protobuf would merge the two embedded messages, but
//!   no encoder emits a singular message field twice, and merged keys could not be borrowed as
//!   one contiguous slice.
//! - Integer fields keep their raw 64-bit value: `version` (declared uint32) is not truncated, so
//!   a version of 2^32 + 2 is not mistaken for 2; `type` keeps the raw enum value.
//! - `access_token` and `keys` are `string` in dlock.proto, but their UTF-8 is not validated:
//!   locks are names compared byte for byte, and rejecting a client's odd bytes would gain
//!   nothing.

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

/// Size of the big-endian length prefix of every frame (dlock.txt: "Length prefix is 4 bytes").
pub const PREFIX_LEN: usize = 4;

/// The API version this server speaks; every Response carries it.
pub const API_VERSION: u64 = 2;

/// Longest valid varint: 64 bits in 7-bit groups.
const MAX_VARINT_LEN: usize = 10;

// Protobuf wire types.
const WT_VARINT: u8 = 0;
const WT_I64: u8 = 1;
const WT_LEN: u8 = 2;
const WT_SGROUP: u8 = 3;
const WT_EGROUP: u8 = 4;
const WT_I32: u8 = 5;

// Field numbers of dlock.proto.
const F_REQ_VERSION: u32 = 1;
const F_REQ_ID: u32 = 2;
const F_REQ_TOKEN: u32 = 3;
const F_REQ_TYPE: u32 = 4;
const F_REQ_LOCK: u32 = 51;
const F_LOCK_WAIT: u32 = 1;
const F_LOCK_RELEASE: u32 = 2;
const F_LOCK_KEYS: u32 = 3;
const F_RESP_VERSION: u32 = 1;
const F_RESP_REQUEST_ID: u32 = 2;
const F_RESP_STATUS: u32 = 3;
const F_RESP_ERROR_TEXT: u32 = 4;
const F_RESP_KEYS: u32 = 5;
const F_RESP_TIME: u32 = 6;
/// holdfast's extension (contract: "Fencing tokens"): `optional uint64 fence = 7`, set on every
/// Ok Lock reply. Clients built from the original dlock.proto skip it as an unknown field.
const F_RESP_FENCE: u32 = 7;

/// A checked cursor over untrusted protobuf bytes: every read is bounds-checked and advances.
struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Cursor { rest: buf }
    }

    fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    /// LEB128 varint, at most 10 bytes, at most 64 bits (the 10th byte may only be 0 or 1).
    fn varint(&mut self) -> Result<u64, &'static str> {
        let mut value: u64 = 0;
        for i in 0..MAX_VARINT_LEN {
            let Some((&byte, rest)) = self.rest.split_first() else {
                return Err("truncated varint");
            };
            self.rest = rest;
            if i == MAX_VARINT_LEN - 1 && byte > 1 {
                return Err("varint longer than 10 bytes or over 64 bits");
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                return Ok(value);
            }
        }
        // Unreachable: the 10th byte either ends the varint or is rejected above.
        Err("varint longer than 10 bytes")
    }

    /// A field key: (field number, wire type).
    fn tag(&mut self) -> Result<(u32, u8), &'static str> {
        let key = self.varint()?;
        let key = u32::try_from(key).map_err(|_| "field number out of range")?;
        let field = key >> 3;
        if field == 0 {
            return Err("field number 0");
        }
        // Lossless: masked to 3 bits.
        Ok((field, (key & 7) as u8))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if n > self.rest.len() {
            return Err("truncated field");
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    /// The payload of a length-delimited field.
    fn bytes(&mut self) -> Result<&'a [u8], &'static str> {
        let len = self.varint()?;
        let len = usize::try_from(len).map_err(|_| "length out of range")?;
        if len > self.rest.len() {
            return Err("truncated length-delimited field");
        }
        self.take(len)
    }

    /// Skip the value of an unknown field.
    fn skip(&mut self, wire: u8) -> Result<(), &'static str> {
        match wire {
            WT_VARINT => self.varint().map(drop),
            WT_I64 => self.take(8).map(drop),
            WT_LEN => self.bytes().map(drop),
            WT_I32 => self.take(4).map(drop),
            WT_SGROUP | WT_EGROUP => Err("groups are not supported"),
            _ => Err("invalid wire type"),
        }
    }
}

/// Keys of a RequestLock, borrowed: iterates the `keys` fields (3) of the embedded message.
///
/// `raw` is the not yet iterated rest of the RequestLock message. `decode_request` validates the
/// whole message first, so the iteration cannot meet an error; should `raw` have been built by
/// hand from invalid bytes, the iteration simply ends there.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Keys<'a> {
    /// The RequestLock message bytes (already validated by `decode_request`).
    pub raw: &'a [u8],
}

impl<'a> Keys<'a> {
    fn next_key(&mut self) -> Result<Option<&'a [u8]>, &'static str> {
        let mut c = Cursor::new(self.raw);
        while !c.is_empty() {
            let (field, wire) = c.tag()?;
            if field == F_LOCK_KEYS && wire == WT_LEN {
                let key = c.bytes()?;
                self.raw = c.rest;
                return Ok(Some(key));
            }
            c.skip(wire)?;
        }
        self.raw = c.rest;
        Ok(None)
    }
}

impl<'a> Iterator for Keys<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        match self.next_key() {
            Ok(key) => key,
            Err(_) => {
                debug_assert!(false, "Keys over a RequestLock that was not validated");
                self.raw = &[];
                None
            }
        }
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
///
/// The length is checked against `max_message` as soon as the prefix is complete, so an
/// oversized frame is refused before its body is buffered.
pub fn parse_frame(buf: &[u8], max_message: usize) -> Result<(&[u8], usize), FrameError> {
    let Some((prefix, rest)) = buf.split_first_chunk::<PREFIX_LEN>() else {
        return Err(FrameError::Incomplete);
    };
    let len = usize::try_from(u32::from_be_bytes(*prefix)).map_err(|_| FrameError::TooLarge)?;
    if len > max_message {
        return Err(FrameError::TooLarge);
    }
    match rest.get(..len) {
        Some(body) => Ok((body, PREFIX_LEN + len)),
        None => Err(FrameError::Incomplete),
    }
}

/// Decode a Request body without allocating. `Err` carries a reason for logs.
pub fn decode_request(body: &[u8]) -> Result<Request<'_>, &'static str> {
    let mut req = Request::default();
    let mut c = Cursor::new(body);
    while !c.is_empty() {
        let (field, wire) = c.tag()?;
        match (field, wire) {
            (F_REQ_VERSION, WT_VARINT) => req.version = Some(c.varint()?),
            (F_REQ_ID, WT_VARINT) => req.id = Some(c.varint()?),
            (F_REQ_TOKEN, WT_LEN) => req.access_token = Some(c.bytes()?),
            (F_REQ_TYPE, WT_VARINT) => req.req_type = Some(c.varint()?),
            (F_REQ_LOCK, WT_LEN) => {
                if req.lock.is_some() {
                    return Err("field lock (51) repeated");
                }
                req.lock = Some(decode_lock(c.bytes()?)?);
            }
            (F_REQ_VERSION | F_REQ_ID | F_REQ_TOKEN | F_REQ_TYPE | F_REQ_LOCK, _) => {
                return Err("wrong wire type for a known field");
            }
            (_, wire) => c.skip(wire)?,
        }
    }
    Ok(req)
}

/// Validate a whole RequestLock message and count its keys, so that iterating [`Keys`] later
/// cannot fail. Public for the owner's command decoder: a Lock read back from a log is checked
/// again, not trusted.
pub fn decode_lock(raw: &[u8]) -> Result<LockRequest<'_>, &'static str> {
    let mut lock = LockRequest {
        keys: Keys { raw },
        ..LockRequest::default()
    };
    let mut c = Cursor::new(raw);
    while !c.is_empty() {
        let (field, wire) = c.tag()?;
        match (field, wire) {
            (F_LOCK_WAIT, WT_VARINT) => lock.wait_micro = Some(c.varint()?),
            (F_LOCK_RELEASE, WT_VARINT) => lock.release_micro = Some(c.varint()?),
            (F_LOCK_KEYS, WT_LEN) => {
                c.bytes()?;
                lock.key_count += 1;
            }
            (F_LOCK_WAIT | F_LOCK_RELEASE | F_LOCK_KEYS, _) => {
                return Err("wrong wire type for a known field of lock");
            }
            (_, wire) => c.skip(wire)?,
        }
    }
    Ok(lock)
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        // Lossless: the low 7 bits plus the continuation bit.
        out.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    // Lossless: value < 0x80 here.
    out.push(value as u8);
}

fn put_tag(out: &mut Vec<u8>, field: u32, wire: u8) {
    put_varint(out, u64::from(field) << 3 | u64::from(wire));
}

fn put_varint_field(out: &mut Vec<u8>, field: u32, value: u64) {
    put_tag(out, field, WT_VARINT);
    put_varint(out, value);
}

fn put_bytes_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_tag(out, field, WT_LEN);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Append one length-prefixed Response frame to `out` (version = 2 always).
///
/// `version`, `status` (even Ok = 0) and `server_unix_time` are always written; `request_id` and
/// `error_text` only when given. The 4-byte prefix is reserved first and patched once the body
/// is written. A body over 4 GiB cannot be framed; the keys echo a request bounded by
/// `--dlock-max-message`, so that never happens (the prefix would saturate).
pub fn encode_response<'k>(
    out: &mut Vec<u8>,
    request_id: Option<u64>,
    status: u32,
    error_text: Option<&str>,
    keys: impl IntoIterator<Item = &'k [u8]>,
    server_unix_time: i64,
) {
    encode_response_fenced(
        out,
        request_id,
        status,
        error_text,
        keys,
        server_unix_time,
        None,
    )
}

/// [`encode_response`] with the fencing token of a granted Lock (field 7, after every field of
/// the original message, so that the bytes before it are exactly the original reply's).
pub fn encode_response_fenced<'k>(
    out: &mut Vec<u8>,
    request_id: Option<u64>,
    status: u32,
    error_text: Option<&str>,
    keys: impl IntoIterator<Item = &'k [u8]>,
    server_unix_time: i64,
    fence: Option<u64>,
) {
    let start = out.len();
    out.extend_from_slice(&[0; PREFIX_LEN]);
    put_varint_field(out, F_RESP_VERSION, API_VERSION);
    if let Some(id) = request_id {
        put_varint_field(out, F_RESP_REQUEST_ID, id);
    }
    // An enum is an int32 on the wire: sign-extended as protobuf does (every defined status is
    // non-negative, so this is the plain value).
    put_varint_field(out, F_RESP_STATUS, i64::from(status as i32) as u64);
    if let Some(text) = error_text {
        put_bytes_field(out, F_RESP_ERROR_TEXT, text.as_bytes());
    }
    for key in keys {
        put_bytes_field(out, F_RESP_KEYS, key);
    }
    // int64: two's complement, so a negative time is a 10-byte varint.
    put_varint_field(out, F_RESP_TIME, server_unix_time as u64);
    if let Some(fence) = fence {
        put_varint_field(out, F_RESP_FENCE, fence);
    }
    let body_len = out.len() - start - PREFIX_LEN;
    debug_assert!(u32::try_from(body_len).is_ok(), "response body over 4 GiB");
    let prefix = u32::try_from(body_len).unwrap_or(u32::MAX);
    out[start..start + PREFIX_LEN].copy_from_slice(&prefix.to_be_bytes());
}

/// Append one length-prefixed Request frame to `out` (the client side: `holdfast-bench` and
/// tests). `version` = 2 and `type` are always written, `id` when given; the `lock` field (51) is
/// written when `lock` is given, with its `keys` in order; `access_token` when given.
pub fn encode_request(
    out: &mut Vec<u8>,
    id: Option<u64>,
    access_token: Option<&[u8]>,
    req_type: u64,
    lock: Option<LockFields<'_>>,
) {
    let start = out.len();
    out.extend_from_slice(&[0; PREFIX_LEN]);
    put_varint_field(out, F_REQ_VERSION, API_VERSION);
    if let Some(id) = id {
        put_varint_field(out, F_REQ_ID, id);
    }
    if let Some(token) = access_token {
        put_bytes_field(out, F_REQ_TOKEN, token);
    }
    put_varint_field(out, F_REQ_TYPE, req_type);
    if let Some(lock) = lock {
        put_tag(out, F_REQ_LOCK, WT_LEN);
        put_varint(out, lock.encoded_len() as u64);
        let body = out.len();
        if let Some(wait) = lock.wait_micro {
            put_varint_field(out, F_LOCK_WAIT, wait);
        }
        if let Some(release) = lock.release_micro {
            put_varint_field(out, F_LOCK_RELEASE, release);
        }
        for key in lock.keys {
            put_bytes_field(out, F_LOCK_KEYS, key);
        }
        debug_assert_eq!(out.len() - body, lock.encoded_len());
    }
    let body_len = out.len() - start - PREFIX_LEN;
    debug_assert!(u32::try_from(body_len).is_ok(), "request body over 4 GiB");
    let prefix = u32::try_from(body_len).unwrap_or(u32::MAX);
    out[start..start + PREFIX_LEN].copy_from_slice(&prefix.to_be_bytes());
}

/// The `RequestLock` message of a request to encode.
#[derive(Clone, Copy, Debug, Default)]
pub struct LockFields<'a> {
    pub wait_micro: Option<u64>,
    pub release_micro: Option<u64>,
    pub keys: &'a [&'a [u8]],
}

impl LockFields<'_> {
    /// Bytes of the encoded RequestLock message (its length prefix is written first).
    fn encoded_len(&self) -> usize {
        let field = |v: Option<u64>| v.map_or(0, |v| 1 + varint_len(v));
        field(self.wait_micro)
            + field(self.release_micro)
            + self
                .keys
                .iter()
                .map(|k| 1 + varint_len(k.len() as u64) + k.len())
                .sum::<usize>()
    }
}

/// Bytes `put_varint` writes for `value`.
fn varint_len(value: u64) -> usize {
    // 1 byte per started group of 7 significant bits; 0 still takes one byte.
    (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
}

/// A decoded Response borrowing from the frame body, for clients on a hot path (the bench
/// tool): no allocation, keys only counted. [`decode_response`] gives an owned one with keys.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ResponseView<'a> {
    pub version: Option<u64>,
    pub request_id: Option<u64>,
    /// The raw enum value (an int32 on the wire, sign-extended to 64 bits).
    pub status: Option<i64>,
    pub error_text: Option<&'a [u8]>,
    /// Number of `keys` fields (5).
    pub key_count: usize,
    pub server_unix_time: Option<i64>,
    /// holdfast's fencing token (field 7) on a granted Lock.
    pub fence: Option<u64>,
}

impl ResponseView<'_> {
    /// Whether the status is `status` (an absent status is protobuf's default, Ok).
    pub fn status_is(&self, status: u32) -> bool {
        self.status.unwrap_or(0) == i64::from(status)
    }
}

/// Decode a Response body without allocating (the same rules as [`decode_request`]).
pub fn decode_response_view(body: &[u8]) -> Result<ResponseView<'_>, &'static str> {
    let mut resp = ResponseView::default();
    let mut c = Cursor::new(body);
    while !c.is_empty() {
        let (field, wire) = c.tag()?;
        match (field, wire) {
            (F_RESP_VERSION, WT_VARINT) => resp.version = Some(c.varint()?),
            (F_RESP_REQUEST_ID, WT_VARINT) => resp.request_id = Some(c.varint()?),
            // Two's complement reinterpretation: int32 and int64 are sign-extended varints.
            (F_RESP_STATUS, WT_VARINT) => resp.status = Some(c.varint()? as i64),
            (F_RESP_ERROR_TEXT, WT_LEN) => resp.error_text = Some(c.bytes()?),
            (F_RESP_KEYS, WT_LEN) => {
                c.bytes()?;
                resp.key_count += 1;
            }
            (F_RESP_TIME, WT_VARINT) => resp.server_unix_time = Some(c.varint()? as i64),
            (F_RESP_FENCE, WT_VARINT) => resp.fence = Some(c.varint()?),
            (
                F_RESP_VERSION | F_RESP_REQUEST_ID | F_RESP_STATUS | F_RESP_ERROR_TEXT
                | F_RESP_KEYS | F_RESP_TIME | F_RESP_FENCE,
                _,
            ) => return Err("wrong wire type for a known field"),
            (_, wire) => c.skip(wire)?,
        }
    }
    Ok(resp)
}

/// A Response as a client sees it (owned: this is not the server's hot path).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Response {
    pub version: Option<u64>,
    pub request_id: Option<u64>,
    pub status: Option<u32>,
    pub error_text: Option<Vec<u8>>,
    pub keys: Vec<Vec<u8>>,
    pub server_unix_time: Option<i64>,
    /// holdfast's fencing token (field 7) on a granted Lock.
    pub fence: Option<u64>,
}

/// Decode a Response body (the bytes after the length prefix).
pub fn decode_response(body: &[u8]) -> Result<Response, &'static str> {
    let mut c = Cursor::new(body);
    let mut r = Response::default();
    while !c.is_empty() {
        match c.tag()? {
            (F_RESP_VERSION, WT_VARINT) => r.version = Some(c.varint()?),
            (F_RESP_REQUEST_ID, WT_VARINT) => r.request_id = Some(c.varint()?),
            // int32 enum: the low 32 bits carry the value.
            (F_RESP_STATUS, WT_VARINT) => r.status = Some(c.varint()? as u32),
            (F_RESP_ERROR_TEXT, WT_LEN) => r.error_text = Some(c.bytes()?.to_vec()),
            (F_RESP_KEYS, WT_LEN) => r.keys.push(c.bytes()?.to_vec()),
            (F_RESP_TIME, WT_VARINT) => r.server_unix_time = Some(c.varint()? as i64),
            (F_RESP_FENCE, WT_VARINT) => r.fence = Some(c.varint()?),
            (_, wire) => c.skip(wire)?,
        }
    }
    Ok(r)
}

#[cfg(test)]
mod client_tests {
    use super::*;

    #[test]
    fn encoded_lock_request_decodes_to_the_same_fields() {
        let keys: [&[u8]; 3] = [b"a", b"", &[0xff; 300]];
        for (wait, lease) in [
            (None, None),
            (Some(0), Some(1)),
            (Some(u64::MAX), Some(300)),
        ] {
            let mut out = Vec::new();
            let lock = LockFields {
                wait_micro: wait,
                release_micro: lease,
                keys: &keys,
            };
            encode_request(&mut out, Some(77), Some(b"tok"), req_type::LOCK, Some(lock));
            let (body, n) = parse_frame(&out, 1 << 20).expect("one whole frame");
            assert_eq!(n, out.len());
            let req = decode_request(body).expect("valid");
            assert_eq!(req.version, Some(2));
            assert_eq!(req.id, Some(77));
            assert_eq!(req.access_token, Some(&b"tok"[..]));
            assert_eq!(req.req_type, Some(req_type::LOCK));
            let l = req.lock.expect("lock field");
            assert_eq!(
                (l.wait_micro, l.release_micro, l.key_count),
                (wait, lease, 3)
            );
            assert_eq!(l.keys.collect::<Vec<_>>(), keys.to_vec());
        }
    }

    #[test]
    fn ping_request_has_no_lock_field() {
        let mut out = Vec::new();
        encode_request(&mut out, None, None, req_type::PING, None);
        let (body, _) = parse_frame(&out, 1 << 20).expect("frame");
        let req = decode_request(body).expect("valid");
        assert_eq!(
            (req.id, req.req_type, req.lock.is_none()),
            (None, Some(req_type::PING), true)
        );
    }

    #[test]
    fn encoded_response_decodes_to_the_same_fields() {
        let mut out = Vec::new();
        let keys: [&[u8]; 2] = [b"k1", b"k2"];
        encode_response(
            &mut out,
            Some(9),
            status::ACQUIRE_TIMEOUT,
            Some("busy"),
            keys,
            -5,
        );
        let (body, _) = parse_frame(&out, 1 << 20).expect("frame");
        let r = decode_response(body).expect("valid");
        assert_eq!(r.version, Some(2));
        assert_eq!(r.request_id, Some(9));
        assert_eq!(r.status, Some(status::ACQUIRE_TIMEOUT));
        assert_eq!(r.error_text.as_deref(), Some(&b"busy"[..]));
        assert_eq!(r.keys, vec![b"k1".to_vec(), b"k2".to_vec()]);
        assert_eq!(r.server_unix_time, Some(-5));
        assert!(
            decode_response(&body[..body.len() - 1]).is_err(),
            "truncated"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// dlock.proto's Request, mirrored by hand for prost (strings as bytes: no UTF-8 checks),
    /// plus fields unknown to our decoder of every skippable wire type.
    #[derive(Clone, PartialEq, prost::Message)]
    struct PRequest {
        #[prost(uint32, optional, tag = "1")]
        version: Option<u32>,
        #[prost(uint64, optional, tag = "2")]
        id: Option<u64>,
        #[prost(bytes = "vec", optional, tag = "3")]
        access_token: Option<Vec<u8>>,
        #[prost(int32, optional, tag = "4")]
        r#type: Option<i32>,
        #[prost(message, optional, tag = "51")]
        lock: Option<PRequestLock>,
        #[prost(uint64, optional, tag = "7")]
        x_varint: Option<u64>,
        #[prost(fixed64, optional, tag = "8")]
        x_fixed64: Option<u64>,
        #[prost(bytes = "vec", optional, tag = "52")]
        x_bytes: Option<Vec<u8>>,
        #[prost(fixed32, optional, tag = "536870911")]
        x_fixed32: Option<u32>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct PRequestLock {
        #[prost(uint64, optional, tag = "1")]
        wait_micro: Option<u64>,
        #[prost(uint64, optional, tag = "2")]
        release_micro: Option<u64>,
        #[prost(bytes = "vec", repeated, tag = "3")]
        keys: Vec<Vec<u8>>,
        #[prost(sint64, optional, tag = "4")]
        x_varint: Option<i64>,
        #[prost(bytes = "vec", repeated, tag = "1000")]
        x_bytes: Vec<Vec<u8>>,
        #[prost(fixed32, optional, tag = "5")]
        x_fixed32: Option<u32>,
    }

    /// dlock.proto's Request exactly (no extra fields): what prost makes of bytes on the wire.
    #[derive(Clone, PartialEq, prost::Message)]
    struct PlainRequest {
        #[prost(uint32, optional, tag = "1")]
        version: Option<u32>,
        #[prost(uint64, optional, tag = "2")]
        id: Option<u64>,
        #[prost(bytes = "vec", optional, tag = "3")]
        access_token: Option<Vec<u8>>,
        #[prost(int32, optional, tag = "4")]
        r#type: Option<i32>,
        #[prost(message, optional, tag = "51")]
        lock: Option<PlainRequestLock>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct PlainRequestLock {
        #[prost(uint64, optional, tag = "1")]
        wait_micro: Option<u64>,
        #[prost(uint64, optional, tag = "2")]
        release_micro: Option<u64>,
        #[prost(bytes = "vec", repeated, tag = "3")]
        keys: Vec<Vec<u8>>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct PResponse {
        #[prost(uint32, optional, tag = "1")]
        version: Option<u32>,
        #[prost(uint64, optional, tag = "2")]
        request_id: Option<u64>,
        #[prost(int32, optional, tag = "3")]
        status: Option<i32>,
        #[prost(string, optional, tag = "4")]
        error_text: Option<String>,
        #[prost(bytes = "vec", repeated, tag = "5")]
        keys: Vec<Vec<u8>>,
        #[prost(int64, optional, tag = "6")]
        server_unix_time: Option<i64>,
    }

    use crate::rng::Rng as XorShift;

    fn random_request(rng: &mut XorShift) -> PRequest {
        let lock = rng.chance(70).then(|| {
            let key_count = match rng.below(10) {
                0 => 0,
                1 => 100 + rng.below(200),
                _ => 1 + rng.below(5),
            };
            PRequestLock {
                wait_micro: rng.chance(60).then(|| rng.wide()),
                release_micro: rng.chance(60).then(|| rng.wide()),
                keys: (0..key_count).map(|_| rng.bytes(20)).collect(),
                x_varint: rng.chance(20).then(|| rng.wide() as i64),
                x_bytes: (0..rng.below(3)).map(|_| rng.bytes(10)).collect(),
                x_fixed32: rng.chance(20).then(|| rng.next() as u32),
            }
        });
        PRequest {
            version: rng.chance(70).then(|| rng.wide() as u32),
            id: rng.chance(80).then(|| rng.wide()),
            access_token: rng.chance(30).then(|| rng.bytes(40)),
            r#type: rng.chance(90).then(|| rng.wide() as i32),
            lock,
            x_varint: rng.chance(20).then(|| rng.wide()),
            x_fixed64: rng.chance(20).then(|| rng.next()),
            x_bytes: rng.chance(20).then(|| rng.bytes(30)),
            x_fixed32: rng.chance(20).then(|| rng.next() as u32),
        }
    }

    /// Our decoding must agree with prost's on every field dlock.proto defines.
    fn assert_same(ours: &Request<'_>, theirs: &PlainRequest) {
        assert_eq!(ours.version.map(|v| v as u32), theirs.version);
        assert_eq!(ours.id, theirs.id);
        assert_eq!(ours.access_token, theirs.access_token.as_deref());
        assert_eq!(ours.req_type.map(|v| v as i32), theirs.r#type);
        match (&ours.lock, &theirs.lock) {
            (None, None) => {}
            (Some(ours), Some(theirs)) => {
                assert_eq!(ours.wait_micro, theirs.wait_micro);
                assert_eq!(ours.release_micro, theirs.release_micro);
                assert_eq!(ours.key_count, theirs.keys.len());
                let keys: Vec<&[u8]> = ours.keys.collect();
                let expected: Vec<&[u8]> = theirs.keys.iter().map(Vec::as_slice).collect();
                assert_eq!(keys, expected);
            }
            (ours, theirs) => panic!("lock differs: {ours:?} vs {theirs:?}"),
        }
    }

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut out = (body.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn decodes_every_field() {
        let msg = PRequest {
            version: Some(2),
            id: Some(u64::MAX),
            access_token: Some(b"secret".to_vec()),
            r#type: Some(2),
            lock: Some(PRequestLock {
                wait_micro: Some(1_000_000),
                release_micro: Some(0),
                keys: vec![b"a".to_vec(), Vec::new(), b"\xff\xfe not utf-8".to_vec()],
                ..Default::default()
            }),
            ..Default::default()
        };
        let body = msg.encode_to_vec();
        let req = decode_request(&body).expect("valid request");
        assert_eq!(req.version, Some(2));
        assert_eq!(req.id, Some(u64::MAX));
        assert_eq!(req.access_token, Some(&b"secret"[..]));
        assert_eq!(req.req_type, Some(req_type::LOCK));
        let lock = req.lock.expect("lock field");
        assert_eq!(lock.wait_micro, Some(1_000_000));
        assert_eq!(lock.release_micro, Some(0));
        assert_eq!(lock.key_count, 3);
        let keys: Vec<&[u8]> = lock.keys.collect();
        assert_eq!(keys, [&b"a"[..], b"", b"\xff\xfe not utf-8"]);
    }

    #[test]
    fn empty_body_is_a_request_with_no_fields() {
        assert_eq!(decode_request(&[]), Ok(Request::default()));
    }

    #[test]
    fn ping_without_lock_field_has_no_lock() {
        // type = Ping (field 4, varint 1), id = 7.
        let req = decode_request(&[0x20, 0x01, 0x10, 0x07]).expect("valid");
        assert_eq!(req.req_type, Some(req_type::PING));
        assert_eq!(req.id, Some(7));
        assert_eq!(req.lock, None);
    }

    #[test]
    fn unknown_fields_of_every_skippable_wire_type_are_skipped() {
        let mut body = Vec::new();
        put_varint_field(&mut body, 9, 300); // varint
        put_tag(&mut body, 10, WT_I64);
        body.extend_from_slice(&[1; 8]);
        put_bytes_field(&mut body, 11, b"skip me");
        put_tag(&mut body, 12, WT_I32);
        body.extend_from_slice(&[2; 4]);
        put_varint_field(&mut body, F_REQ_ID, 5);
        // And inside the lock message.
        let mut lock = Vec::new();
        put_tag(&mut lock, 99, WT_I32);
        lock.extend_from_slice(&[3; 4]);
        put_bytes_field(&mut lock, F_LOCK_KEYS, b"k");
        put_varint_field(&mut lock, 98, u64::MAX);
        put_bytes_field(&mut body, F_REQ_LOCK, &lock);
        let req = decode_request(&body).expect("valid");
        assert_eq!(req.id, Some(5));
        let lock = req.lock.expect("lock");
        assert_eq!(lock.key_count, 1);
        assert_eq!(lock.keys.collect::<Vec<_>>(), [&b"k"[..]]);
    }

    #[test]
    fn groups_and_undefined_wire_types_are_invalid() {
        for wire in [WT_SGROUP, WT_EGROUP, 6, 7] {
            let mut body = Vec::new();
            put_tag(&mut body, 9, wire);
            body.push(0);
            assert!(decode_request(&body).is_err(), "wire type {wire}");
            let mut lock = Vec::new();
            put_tag(&mut lock, 9, wire);
            lock.push(0);
            let mut body = Vec::new();
            put_bytes_field(&mut body, F_REQ_LOCK, &lock);
            assert!(decode_request(&body).is_err(), "wire type {wire} in lock");
        }
    }

    #[test]
    fn known_field_with_wrong_wire_type_is_invalid() {
        let mut body = Vec::new();
        put_bytes_field(&mut body, F_REQ_ID, b"12345678");
        assert!(decode_request(&body).is_err());
        let mut body = Vec::new();
        put_varint_field(&mut body, F_REQ_LOCK, 1);
        assert!(decode_request(&body).is_err());
        let mut lock = Vec::new();
        put_varint_field(&mut lock, F_LOCK_KEYS, 1);
        let mut body = Vec::new();
        put_bytes_field(&mut body, F_REQ_LOCK, &lock);
        assert!(decode_request(&body).is_err());
    }

    #[test]
    fn field_number_zero_and_out_of_range_tags_are_invalid() {
        assert!(decode_request(&[0x00, 0x01]).is_err());
        // Key 2^32 (field 2^29, wire type 0): over u32.
        let mut body = Vec::new();
        put_varint(&mut body, 1 << 32);
        body.push(0);
        assert!(decode_request(&body).is_err());
        // The largest field number, 2^29 - 1, is fine.
        let mut body = Vec::new();
        put_varint_field(&mut body, (1 << 29) - 1, 1);
        assert!(decode_request(&body).is_ok());
    }

    #[test]
    fn truncated_varint_inside_body_is_invalid() {
        assert!(decode_request(&[0x10]).is_err()); // tag of id, no value
        assert!(decode_request(&[0x10, 0x80]).is_err()); // value's continuation bit, no more
        assert!(decode_request(&[0x80]).is_err()); // truncated tag
        assert!(decode_request(&[0x1a, 0x05, b'a']).is_err()); // length past the end
        assert!(decode_request(&[0x1a]).is_err()); // no length
    }

    #[test]
    fn varints_longer_than_ten_bytes_or_over_64_bits_are_invalid() {
        let mut max = vec![0x10];
        put_varint(&mut max, u64::MAX);
        assert_eq!(max.len(), 11);
        assert_eq!(decode_request(&max).map(|r| r.id), Ok(Some(u64::MAX)));
        let mut overflow = max.clone();
        overflow[10] = 0x02;
        assert!(decode_request(&overflow).is_err());
        let mut eleven = max.clone();
        eleven[10] = 0x81;
        eleven.push(0x00);
        assert!(decode_request(&eleven).is_err());
        // A non-canonical but valid 10-byte zero.
        let mut zero = vec![0x10];
        zero.extend_from_slice(&[0x80; 9]);
        zero.push(0x00);
        assert_eq!(decode_request(&zero).map(|r| r.id), Ok(Some(0)));
    }

    #[test]
    fn repeated_scalar_fields_last_value_wins() {
        let mut body = Vec::new();
        put_varint_field(&mut body, F_REQ_ID, 1);
        put_bytes_field(&mut body, F_REQ_TOKEN, b"first");
        put_varint_field(&mut body, F_REQ_ID, 2);
        put_bytes_field(&mut body, F_REQ_TOKEN, b"second");
        let mut lock = Vec::new();
        put_varint_field(&mut lock, F_LOCK_WAIT, 10);
        put_varint_field(&mut lock, F_LOCK_WAIT, 20);
        put_bytes_field(&mut body, F_REQ_LOCK, &lock);
        let req = decode_request(&body).expect("valid");
        assert_eq!(req.id, Some(2));
        assert_eq!(req.access_token, Some(&b"second"[..]));
        assert_eq!(req.lock.and_then(|l| l.wait_micro), Some(20));
    }

    #[test]
    fn second_lock_field_is_invalid() {
        let mut body = Vec::new();
        put_bytes_field(&mut body, F_REQ_LOCK, &[]);
        put_bytes_field(&mut body, F_REQ_LOCK, &[]);
        assert_eq!(decode_request(&body), Err("field lock (51) repeated"));
    }

    #[test]
    fn version_keeps_its_raw_value() {
        let mut body = Vec::new();
        put_varint_field(&mut body, F_REQ_VERSION, (1 << 32) + 2);
        assert_eq!(
            decode_request(&body).map(|r| r.version),
            Ok(Some((1 << 32) + 2))
        );
    }

    #[test]
    fn frame_is_incomplete_at_every_split_point() {
        let body = PRequest {
            id: Some(42),
            r#type: Some(1),
            ..Default::default()
        }
        .encode_to_vec();
        let framed = frame(&body);
        for split in 0..framed.len() {
            assert_eq!(
                parse_frame(&framed[..split], 1024),
                Err(FrameError::Incomplete),
                "split at {split}"
            );
        }
        assert_eq!(parse_frame(&framed, 1024), Ok((&body[..], framed.len())));
    }

    #[test]
    fn pipelined_frames_are_split_one_at_a_time() {
        let mut stream = frame(b"\x10\x01");
        stream.extend_from_slice(&frame(b""));
        stream.extend_from_slice(&frame(b"\x10\x03"));
        stream.extend_from_slice(&[0, 0]); // start of a fourth
        let mut bodies = Vec::new();
        let mut at = 0;
        loop {
            match parse_frame(&stream[at..], 16) {
                Ok((body, used)) => {
                    bodies.push(body.to_vec());
                    at += used;
                }
                Err(e) => {
                    assert_eq!(e, FrameError::Incomplete);
                    break;
                }
            }
        }
        assert_eq!(
            bodies,
            [b"\x10\x01".to_vec(), Vec::new(), b"\x10\x03".to_vec()]
        );
        assert_eq!(at, stream.len() - 2);
    }

    #[test]
    fn oversized_frame_is_too_large_from_its_prefix_alone() {
        assert_eq!(parse_frame(&[0, 0, 0, 11], 10), Err(FrameError::TooLarge));
        assert_eq!(
            parse_frame(&[0xff, 0xff, 0xff, 0xff], usize::MAX >> 1),
            Err(FrameError::Incomplete)
        );
        assert_eq!(
            parse_frame(&[0xff, 0xff, 0xff, 0xff], 1 << 20),
            Err(FrameError::TooLarge)
        );
        // Exactly the limit is fine.
        let mut buf = vec![0, 0, 0, 10];
        buf.extend_from_slice(&[0; 10]);
        assert_eq!(parse_frame(&buf, 10), Ok((&[0u8; 10][..], 14)));
    }

    #[test]
    fn response_always_has_version_status_and_time() {
        let mut out = vec![0xaa]; // bytes already queued stay untouched
        encode_response(&mut out, None, status::OK, None, [], 0);
        assert_eq!(out[0], 0xaa);
        let (body, used) = parse_frame(&out[1..], 1024).expect("one frame");
        assert_eq!(used, out.len() - 1);
        // version = 2, status = 0, server_unix_time = 0.
        assert_eq!(body, [0x08, 0x02, 0x18, 0x00, 0x30, 0x00]);
        let resp = PResponse::decode(body).expect("prost decodes");
        assert_eq!(resp.version, Some(2));
        assert_eq!(resp.request_id, None);
        assert_eq!(resp.status, Some(0));
        assert_eq!(resp.error_text, None);
        assert_eq!(resp.server_unix_time, Some(0));
    }

    #[test]
    fn response_with_every_field_decodes_with_prost() {
        let mut out = Vec::new();
        let keys: [&[u8]; 3] = [b"a", b"", b"\xff"];
        encode_response(
            &mut out,
            Some(u64::MAX),
            status::ACQUIRE_TIMEOUT,
            Some("busy"),
            keys,
            -1,
        );
        let (body, _) = parse_frame(&out, 1 << 20).expect("frame");
        let resp = PResponse::decode(body).expect("prost decodes");
        assert_eq!(
            resp,
            PResponse {
                version: Some(2),
                request_id: Some(u64::MAX),
                status: Some(120),
                error_text: Some("busy".into()),
                keys: vec![b"a".to_vec(), Vec::new(), b"\xff".to_vec()],
                server_unix_time: Some(-1),
            }
        );
    }

    #[test]
    fn random_prost_requests_decode_identically() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        for case in 0..3000 {
            let msg = random_request(&mut rng);
            let body = msg.encode_to_vec();
            let req = decode_request(&body).unwrap_or_else(|e| panic!("case {case}: {e}"));
            let theirs = PlainRequest::decode(&body[..]).expect("prost decodes");
            assert_same(&req, &theirs);
            // prost drops the unknown extras; what is left is what the message was built with.
            assert_eq!(theirs.id, msg.id);
            assert_eq!(theirs.version, msg.version);
            assert_eq!(
                theirs
                    .lock
                    .as_ref()
                    .map(|l| (&l.keys, l.wait_micro, l.release_micro)),
                msg.lock
                    .as_ref()
                    .map(|l| (&l.keys, l.wait_micro, l.release_micro))
            );
            // And through a frame.
            let framed = frame(&body);
            assert_eq!(
                parse_frame(&framed, body.len()),
                Ok((&body[..], framed.len()))
            );
        }
    }

    #[test]
    fn concatenated_prost_requests_merge_like_prost() {
        // Concatenating encodings is protobuf's merge: the last scalar wins. At most one side
        // carries `lock`, which we never merge.
        let mut rng = XorShift(77);
        for _ in 0..1000 {
            let first = random_request(&mut rng);
            let mut second = random_request(&mut rng);
            if first.lock.is_some() {
                second.lock = None;
            }
            let mut body = first.encode_to_vec();
            body.extend_from_slice(&second.encode_to_vec());
            let theirs = PlainRequest::decode(&body[..]).expect("prost decodes");
            let ours = decode_request(&body).expect("we decode");
            assert_same(&ours, &theirs);
        }
    }

    #[test]
    fn truncated_bodies_are_rejected_exactly_when_prost_rejects_them() {
        let mut rng = XorShift(12345);
        for _ in 0..300 {
            let body = random_request(&mut rng).encode_to_vec();
            for cut in 0..body.len() {
                let prefix = &body[..cut];
                let theirs = PlainRequest::decode(prefix);
                let ours = decode_request(prefix);
                assert_eq!(ours.is_ok(), theirs.is_ok(), "cut {cut} of {body:?}");
                if let (Ok(ours), Ok(theirs)) = (ours, theirs) {
                    assert_same(&ours, &theirs);
                }
            }
        }
    }

    #[test]
    fn mutated_bodies_that_we_accept_prost_reads_the_same() {
        let mut rng = XorShift(0xdead_beef);
        for _ in 0..3000 {
            let mut body = random_request(&mut rng).encode_to_vec();
            if body.is_empty() {
                continue;
            }
            for _ in 0..1 + rng.below(3) {
                let at = rng.below(body.len() as u64) as usize;
                body[at] = rng.next() as u8;
            }
            if let Ok(ours) = decode_request(&body) {
                let theirs = PlainRequest::decode(&body[..]).expect("prost accepts what we accept");
                assert_same(&ours, &theirs);
            }
        }
    }

    #[test]
    fn random_responses_round_trip_through_prost() {
        let mut rng = XorShift(4242);
        let mut out = Vec::new();
        for _ in 0..3000 {
            let keys: Vec<Vec<u8>> = (0..rng.below(6)).map(|_| rng.bytes(12)).collect();
            let request_id = rng.chance(80).then(|| rng.wide());
            let st = [0, 1, 2, 3, 100, 120][rng.below(6) as usize];
            let text = rng.chance(30).then(|| "access denied".to_string());
            let time = rng.wide() as i64;
            out.clear();
            encode_response(
                &mut out,
                request_id,
                st,
                text.as_deref(),
                keys.iter().map(Vec::as_slice),
                time,
            );
            let (body, used) = parse_frame(&out, usize::MAX).expect("frame");
            assert_eq!(used, out.len());
            let resp = PResponse::decode(body).expect("prost decodes");
            assert_eq!(
                resp,
                PResponse {
                    version: Some(2),
                    request_id,
                    status: Some(st as i32),
                    error_text: text,
                    keys,
                    server_unix_time: Some(time),
                }
            );
        }
    }

    #[test]
    fn varint_len_matches_put_varint() {
        for v in [
            0,
            1,
            127,
            128,
            16383,
            16384,
            u64::from(u32::MAX),
            u64::MAX >> 1,
            u64::MAX,
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(varint_len(v), out.len(), "{v}");
        }
    }

    #[test]
    fn encoded_requests_decode_with_ours_and_prost() {
        let mut rng = XorShift(0x5eed);
        let mut out = Vec::new();
        for _ in 0..2000 {
            let keys: Vec<Vec<u8>> = (0..rng.below(5)).map(|_| rng.bytes(200)).collect();
            let key_refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            let id = rng.chance(80).then(|| rng.wide());
            let req_type = rng.below(4);
            let lock = rng.chance(70).then(|| LockFields {
                wait_micro: rng.chance(50).then(|| rng.wide()),
                release_micro: rng.chance(50).then(|| rng.wide()),
                keys: &key_refs,
            });
            out.clear();
            encode_request(&mut out, id, None, req_type, lock);
            let (body, used) = parse_frame(&out, usize::MAX).expect("frame");
            assert_eq!(used, out.len());
            let ours = decode_request(body).expect("we decode our own encoding");
            assert_eq!(ours.version, Some(API_VERSION));
            assert_eq!(ours.id, id);
            assert_eq!(ours.req_type, Some(req_type));
            let theirs = PlainRequest::decode(body).expect("prost decodes");
            assert_same(&ours, &theirs);
            match (lock, ours.lock) {
                (None, None) => {}
                (Some(sent), Some(got)) => {
                    assert_eq!(
                        (got.wait_micro, got.release_micro),
                        (sent.wait_micro, sent.release_micro)
                    );
                    assert_eq!(got.keys.collect::<Vec<_>>(), key_refs);
                }
                (sent, got) => panic!("lock sent {sent:?}, decoded {got:?}"),
            }
        }
    }

    #[test]
    fn unlock_request_carries_its_keys_in_field_51() {
        let mut out = Vec::new();
        let keys: [&[u8]; 1] = [b"k"];
        let lock = LockFields {
            keys: &keys,
            ..LockFields::default()
        };
        encode_request(&mut out, Some(1), None, req_type::UNLOCK, Some(lock));
        // version 2, id 1, type 3, field 51 (tag 0x9a 0x03) holding keys = "k".
        assert_eq!(
            out,
            [0, 0, 0, 12, 0x08, 2, 0x10, 1, 0x20, 3, 0x9a, 0x03, 3, 0x1a, 1, b'k']
        );
    }

    #[test]
    fn decode_response_reads_what_encode_response_wrote() {
        let mut rng = XorShift(99);
        let mut out = Vec::new();
        for _ in 0..2000 {
            let keys: Vec<Vec<u8>> = (0..rng.below(4)).map(|_| rng.bytes(8)).collect();
            let request_id = rng.chance(80).then(|| rng.wide());
            let st = [0, 1, 2, 3, 100, 120][rng.below(6) as usize];
            let text = rng.chance(30).then_some("access denied");
            let time = rng.wide() as i64;
            out.clear();
            encode_response(
                &mut out,
                request_id,
                st,
                text,
                keys.iter().map(Vec::as_slice),
                time,
            );
            let (body, _) = parse_frame(&out, usize::MAX).expect("frame");
            let resp = decode_response_view(body).expect("decodes");
            assert_eq!(
                resp,
                ResponseView {
                    version: Some(API_VERSION),
                    request_id,
                    status: Some(i64::from(st)),
                    error_text: text.map(str::as_bytes),
                    key_count: keys.len(),
                    server_unix_time: Some(time),
                    fence: None,
                }
            );
            assert!(resp.status_is(st));
        }
    }

    #[test]
    fn decode_response_of_prost_encoding_and_garbage() {
        let msg = PResponse {
            version: Some(2),
            request_id: Some(3),
            status: Some(-1),
            error_text: None,
            keys: vec![b"x".to_vec()],
            server_unix_time: Some(-5),
        };
        let body = msg.encode_to_vec();
        let resp = decode_response_view(&body).expect("decodes");
        assert_eq!(
            (resp.status, resp.key_count, resp.server_unix_time),
            (Some(-1), 1, Some(-5))
        );
        assert!(
            ResponseView::default().status_is(status::OK),
            "absent status is Ok"
        );
        assert!(decode_response_view(&[0x18]).is_err(), "truncated varint");
        assert!(
            decode_response_view(&[0x1a, 0]).is_err(),
            "status with a length-delimited type"
        );
    }
}
