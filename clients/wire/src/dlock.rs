//! dlock frames and a hand-written protobuf (proto2) codec for `Request` and `Response`
//! (`dlock.txt`, `dlock.proto`, and the dlock section of `docs/protocol.md`).
//!
//! Owns: splitting a byte stream into 4-byte big-endian length-prefixed frames, decoding a
//! `Request` body into a [`Request`] that borrows from the body (no allocation), and appending
//! `Response` frames to an output buffer (no intermediate allocation).
//!
//! Must not: read a clock, allocate while decoding, panic on any input, or decide what a request
//! means (version checks, key limits and the access token belong to the daemon).
//!
//! Decoding rules (protobuf's, with the choices `dlock.txt` left open):
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

/// RequestType values of dlock.proto (Unlock is holdfast's extension; 4 and above are the
/// native protocol's, `holdfast.proto`).
pub mod req_type {
    pub const PING: u64 = 1;
    pub const LOCK: u64 = 2;
    pub const UNLOCK: u64 = 3;
    pub const EXTEND: u64 = 4;
    pub const WATCH: u64 = 5;
    pub const UNWATCH: u64 = 6;
    pub const GET: u64 = 7;
    pub const CHECK_FENCE: u64 = 8;
}

/// ResponseStatus values of dlock.proto, and the native protocol's (`holdfast.proto`), which a
/// version-2 request never gets.
pub mod status {
    pub const OK: u32 = 0;
    pub const GENERAL: u32 = 1;
    pub const VERSION: u32 = 2;
    pub const INVALID_TYPE: u32 = 3;
    pub const TOO_MANY_KEYS: u32 = 100;
    pub const INVALID_ARGUMENT: u32 = 101;
    pub const ACQUIRE_TIMEOUT: u32 = 120;
    pub const NOT_HELD: u32 = 121;
    pub const STALE_FENCE: u32 = 122;
}

/// EventKind values of `holdfast.proto`.
pub mod event_kind {
    pub const ACQUIRED: u32 = 1;
    pub const RELEASED: u32 = 2;
    pub const EXPIRED: u32 = 3;
    pub const LOST: u32 = 4;
}

/// Size of the big-endian length prefix of every frame (dlock.txt: "Length prefix is 4 bytes").
pub const PREFIX_LEN: usize = 4;

/// dlock's API version: every Response to a version-2 request carries it.
pub const API_VERSION: u64 = 2;
/// The native protocol's version (`holdfast.proto`): its requests and replies carry it.
pub const NATIVE_VERSION: u64 = 3;

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
/// holdfast's extension (`docs/protocol.md`, "Fencing tokens"): `optional uint64 fence = 7`, set on every
/// Ok Lock reply. Clients built from the original dlock.proto skip it as an unknown field.
const F_RESP_FENCE: u32 = 7;
// The native protocol's fields (`holdfast.proto`): numbers dlock never used.
const F_LOCK_SHARED: u32 = 100;
const F_LOCK_LIMIT: u32 = 101;
const F_LOCK_VALUE: u32 = 102;
const F_LOCK_DELAY: u32 = 103;
const F_LOCK_FENCE: u32 = 104;
const F_RESP_INFO: u32 = 100;
const F_RESP_EVENT: u32 = 101;
const F_INFO_KEY: u32 = 1;
const F_INFO_SHARED: u32 = 2;
const F_INFO_LIMIT: u32 = 3;
const F_INFO_HOLDERS: u32 = 4;
const F_INFO_WAITERS: u32 = 5;
const F_INFO_DELAYED: u32 = 6;
const F_HOLDER_FENCE: u32 = 1;
const F_HOLDER_VALUE: u32 = 2;
const F_HOLDER_LEASE_LEFT: u32 = 3;
const F_HOLDER_NODE: u32 = 4;
const F_EVENT_KEY: u32 = 1;
const F_EVENT_KIND: u32 = 2;
const F_EVENT_FENCE: u32 = 3;
const F_EVENT_VALUE: u32 = 4;

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
    #[inline]
    fn varint(&mut self) -> Result<u64, &'static str> {
        // Tags, ids, types and short lengths are one byte: no loop for them.
        if let Some((&byte, rest)) = self.rest.split_first() {
            if byte < 0x80 {
                self.rest = rest;
                return Ok(u64::from(byte));
            }
        }
        self.varint_long()
    }

    #[inline(never)]
    fn varint_long(&mut self) -> Result<u64, &'static str> {
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

/// The fields of `RequestLock` that `holdfast.proto` adds ([`decode_native`]; a version-2
/// request never reads them: to it they are unknown fields). A field of the wrong wire type is
/// skipped and counted in `malformed` (an error for a version-3 request).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct NativeLock<'a> {
    /// Raw varint: any value but 0 is true (protobuf's rule for bool).
    pub shared: Option<u64>,
    /// Raw 64-bit value (uint32 in the proto: a larger value is out of range, not truncated).
    pub limit: Option<u64>,
    pub value: Option<&'a [u8]>,
    pub lock_delay_micro: Option<u64>,
    pub fence: Option<u64>,
    pub malformed: u32,
}

impl NativeLock<'_> {
    pub fn is_shared(&self) -> bool {
        self.shared.is_some_and(|v| v != 0)
    }
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

/// The native protocol's fields of a RequestLock message that [`decode_lock`] validated (read
/// apart, so that a dlock request's decoding costs nothing for them).
pub fn decode_native(raw: &[u8]) -> NativeLock<'_> {
    let mut n = NativeLock::default();
    let mut c = Cursor::new(raw);
    let mut field = || -> Result<bool, &'static str> {
        if c.is_empty() {
            return Ok(false);
        }
        match c.tag()? {
            (F_LOCK_SHARED, WT_VARINT) => n.shared = Some(c.varint()?),
            (F_LOCK_LIMIT, WT_VARINT) => n.limit = Some(c.varint()?),
            (F_LOCK_VALUE, WT_LEN) => n.value = Some(c.bytes()?),
            (F_LOCK_DELAY, WT_VARINT) => n.lock_delay_micro = Some(c.varint()?),
            (F_LOCK_FENCE, WT_VARINT) => n.fence = Some(c.varint()?),
            (F_LOCK_SHARED..=F_LOCK_FENCE, wire) => {
                c.skip(wire)?;
                n.malformed += 1;
            }
            (_, wire) => c.skip(wire)?,
        }
        Ok(true)
    };
    // `raw` was validated whole: an error cannot happen, and would only end the reading.
    while let Ok(true) = field() {}
    n
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
    encode_request_version(out, API_VERSION, id, access_token, req_type, lock)
}

/// [`encode_request`] with the given `version` ([`NATIVE_VERSION`] for the native protocol,
/// whose fields `lock.native` carries).
pub fn encode_request_version(
    out: &mut Vec<u8>,
    version: u64,
    id: Option<u64>,
    access_token: Option<&[u8]>,
    req_type: u64,
    lock: Option<LockFields<'_>>,
) {
    let start = out.len();
    out.extend_from_slice(&[0; PREFIX_LEN]);
    put_varint_field(out, F_REQ_VERSION, version);
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
        let n = &lock.native;
        if n.shared {
            put_varint_field(out, F_LOCK_SHARED, 1);
        }
        if let Some(limit) = n.limit {
            put_varint_field(out, F_LOCK_LIMIT, u64::from(limit));
        }
        if let Some(value) = n.value {
            put_bytes_field(out, F_LOCK_VALUE, value);
        }
        if let Some(delay) = n.lock_delay_micro {
            put_varint_field(out, F_LOCK_DELAY, delay);
        }
        if let Some(fence) = n.fence {
            put_varint_field(out, F_LOCK_FENCE, fence);
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
    /// The native protocol's fields (none by default: a dlock request).
    pub native: NativeFields<'a>,
}

/// The fields `holdfast.proto` adds to `RequestLock`, to encode.
#[derive(Clone, Copy, Debug, Default)]
pub struct NativeFields<'a> {
    pub shared: bool,
    pub limit: Option<u32>,
    pub value: Option<&'a [u8]>,
    pub lock_delay_micro: Option<u64>,
    pub fence: Option<u64>,
}

impl LockFields<'_> {
    /// Bytes of the encoded RequestLock message (its length prefix is written first).
    fn encoded_len(&self) -> usize {
        let field = |f: u32, v: Option<u64>| v.map_or(0, |v| varint_field_len(f, v));
        let n = &self.native;
        field(F_LOCK_WAIT, self.wait_micro)
            + field(F_LOCK_RELEASE, self.release_micro)
            + self
                .keys
                .iter()
                .map(|k| bytes_field_len(F_LOCK_KEYS, k))
                .sum::<usize>()
            + field(F_LOCK_SHARED, n.shared.then_some(1))
            + field(F_LOCK_LIMIT, n.limit.map(u64::from))
            + n.value.map_or(0, |v| bytes_field_len(F_LOCK_VALUE, v))
            + field(F_LOCK_DELAY, n.lock_delay_micro)
            + field(F_LOCK_FENCE, n.fence)
    }
}

/// Bytes of a varint field.
fn varint_field_len(field: u32, value: u64) -> usize {
    varint_len(u64::from(field) << 3) + varint_len(value)
}

/// Bytes of a length-delimited field.
fn bytes_field_len(field: u32, bytes: &[u8]) -> usize {
    varint_len(u64::from(field) << 3) + varint_len(bytes.len() as u64) + bytes.len()
}

/// One holder in a native reply's `KeyInfo` (`holdfast.proto`'s `Holder`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HolderOut<'a> {
    pub fence: u64,
    pub value: Option<&'a [u8]>,
    /// 0: held until its connection closes or it unlocks.
    pub lease_left_micro: u64,
    /// Cluster mode: the node whose client holds it.
    pub node: Option<u32>,
}

impl HolderOut<'_> {
    fn encoded_len(&self) -> usize {
        varint_field_len(F_HOLDER_FENCE, self.fence)
            + self.value.map_or(0, |v| bytes_field_len(F_HOLDER_VALUE, v))
            + varint_field_len(F_HOLDER_LEASE_LEFT, self.lease_left_micro)
            + self
                .node
                .map_or(0, |n| varint_field_len(F_HOLDER_NODE, u64::from(n)))
    }

    fn put(&self, out: &mut Vec<u8>) {
        put_varint_field(out, F_HOLDER_FENCE, self.fence);
        if let Some(v) = self.value {
            put_bytes_field(out, F_HOLDER_VALUE, v);
        }
        put_varint_field(out, F_HOLDER_LEASE_LEFT, self.lease_left_micro);
        if let Some(n) = self.node {
            put_varint_field(out, F_HOLDER_NODE, u64::from(n));
        }
    }
}

/// A key's state in a native reply (Get, and the Ok answer to Watch): `KeyInfo`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyInfoOut<'a> {
    pub key: &'a [u8],
    pub shared: bool,
    pub limit: u32,
    /// In grant order; empty when the key is free.
    pub holders: &'a [HolderOut<'a>],
    pub waiters: u32,
    /// Lock-delay left before the key can be granted again.
    pub delayed_micro: u64,
}

impl KeyInfoOut<'_> {
    fn encoded_len(&self) -> usize {
        bytes_field_len(F_INFO_KEY, self.key)
            + varint_field_len(F_INFO_SHARED, u64::from(self.shared))
            + varint_field_len(F_INFO_LIMIT, u64::from(self.limit))
            + self
                .holders
                .iter()
                .map(|h| nested_len(F_INFO_HOLDERS, h.encoded_len()))
                .sum::<usize>()
            + varint_field_len(F_INFO_WAITERS, u64::from(self.waiters))
            + varint_field_len(F_INFO_DELAYED, self.delayed_micro)
    }

    fn put(&self, out: &mut Vec<u8>) {
        put_bytes_field(out, F_INFO_KEY, self.key);
        put_varint_field(out, F_INFO_SHARED, u64::from(self.shared));
        put_varint_field(out, F_INFO_LIMIT, u64::from(self.limit));
        for h in self.holders {
            put_tag(out, F_INFO_HOLDERS, WT_LEN);
            put_varint(out, h.encoded_len() as u64);
            h.put(out);
        }
        put_varint_field(out, F_INFO_WAITERS, u64::from(self.waiters));
        put_varint_field(out, F_INFO_DELAYED, self.delayed_micro);
    }
}

/// A pushed event (`holdfast.proto`'s `Event`): a grant that began or ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventOut<'a> {
    pub key: &'a [u8],
    /// An [`event_kind`] value.
    pub kind: u32,
    pub fence: u64,
    pub value: Option<&'a [u8]>,
}

impl EventOut<'_> {
    fn encoded_len(&self) -> usize {
        bytes_field_len(F_EVENT_KEY, self.key)
            + varint_field_len(F_EVENT_KIND, u64::from(self.kind))
            + varint_field_len(F_EVENT_FENCE, self.fence)
            + self.value.map_or(0, |v| bytes_field_len(F_EVENT_VALUE, v))
    }

    fn put(&self, out: &mut Vec<u8>) {
        put_bytes_field(out, F_EVENT_KEY, self.key);
        put_varint_field(out, F_EVENT_KIND, u64::from(self.kind));
        put_varint_field(out, F_EVENT_FENCE, self.fence);
        if let Some(v) = self.value {
            put_bytes_field(out, F_EVENT_VALUE, v);
        }
    }
}

/// Bytes of an embedded message field whose body is `len` bytes.
fn nested_len(field: u32, len: usize) -> usize {
    varint_len(u64::from(field) << 3) + varint_len(len as u64) + len
}

/// A native (version 3) Response to encode.
#[derive(Clone, Copy, Debug, Default)]
pub struct NativeReply<'a> {
    pub request_id: Option<u64>,
    pub status: u32,
    pub error_text: Option<&'a str>,
    pub keys: &'a [&'a [u8]],
    pub server_unix_time: i64,
    /// An Ok Lock's fencing token.
    pub fence: Option<u64>,
    /// Get, and the Ok answer to Watch: one per key.
    pub info: &'a [KeyInfoOut<'a>],
    /// A pushed event.
    pub event: Option<EventOut<'a>>,
}

/// Append one length-prefixed native Response frame (version 3) to `out`: the fields of
/// [`encode_response_fenced`] in the same order, then `info` and `event`.
pub fn encode_native_response(out: &mut Vec<u8>, r: &NativeReply<'_>) {
    let start = out.len();
    out.extend_from_slice(&[0; PREFIX_LEN]);
    put_native_head(
        out,
        r.request_id,
        r.status,
        r.error_text,
        r.keys.iter().copied(),
    );
    put_varint_field(out, F_RESP_TIME, r.server_unix_time as u64);
    if let Some(fence) = r.fence {
        put_varint_field(out, F_RESP_FENCE, fence);
    }
    for info in r.info {
        put_info_field(out, info);
    }
    if let Some(ev) = &r.event {
        put_event_field(out, ev);
    }
    patch_prefix(out, start);
}

/// [`encode_native_response`] with its `info` and `event` fields already encoded in `extra`
/// ([`put_info_field`], [`put_event_field`]): how the daemon's workers write what the owner
/// prepared.
#[allow(clippy::too_many_arguments)]
pub fn encode_native_response_with<'k>(
    out: &mut Vec<u8>,
    request_id: Option<u64>,
    status: u32,
    error_text: Option<&str>,
    keys: impl IntoIterator<Item = &'k [u8]>,
    server_unix_time: i64,
    fence: Option<u64>,
    extra: &[u8],
) {
    let start = out.len();
    out.extend_from_slice(&[0; PREFIX_LEN]);
    put_native_head(out, request_id, status, error_text, keys);
    put_varint_field(out, F_RESP_TIME, server_unix_time as u64);
    if let Some(fence) = fence {
        put_varint_field(out, F_RESP_FENCE, fence);
    }
    out.extend_from_slice(extra);
    patch_prefix(out, start);
}

/// A native Response's fields before its time: version 3, id, status, text, keys.
fn put_native_head<'k>(
    out: &mut Vec<u8>,
    request_id: Option<u64>,
    status: u32,
    error_text: Option<&str>,
    keys: impl IntoIterator<Item = &'k [u8]>,
) {
    put_varint_field(out, F_RESP_VERSION, NATIVE_VERSION);
    if let Some(id) = request_id {
        put_varint_field(out, F_RESP_REQUEST_ID, id);
    }
    put_varint_field(out, F_RESP_STATUS, u64::from(status));
    if let Some(text) = error_text {
        put_bytes_field(out, F_RESP_ERROR_TEXT, text.as_bytes());
    }
    for key in keys {
        put_bytes_field(out, F_RESP_KEYS, key);
    }
}

/// Appends `info` as one `info` field (100) of a Response.
pub fn put_info_field(out: &mut Vec<u8>, info: &KeyInfoOut<'_>) {
    put_tag(out, F_RESP_INFO, WT_LEN);
    put_varint(out, info.encoded_len() as u64);
    info.put(out);
}

/// Appends `ev` as the `event` field (101) of a Response.
pub fn put_event_field(out: &mut Vec<u8>, ev: &EventOut<'_>) {
    put_tag(out, F_RESP_EVENT, WT_LEN);
    put_varint(out, ev.encoded_len() as u64);
    ev.put(out);
}

/// Writes the length prefix of the frame that starts at `start`.
fn patch_prefix(out: &mut [u8], start: usize) {
    let body_len = out.len() - start - PREFIX_LEN;
    debug_assert!(u32::try_from(body_len).is_ok(), "response body over 4 GiB");
    let prefix = u32::try_from(body_len).unwrap_or(u32::MAX);
    out[start..start + PREFIX_LEN].copy_from_slice(&prefix.to_be_bytes());
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
    /// The native protocol's `info` (Get, Watch) and pushed `event`.
    pub info: Vec<KeyInfo>,
    pub event: Option<Event>,
}

/// `holdfast.proto`'s `KeyInfo`, as a client reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyInfo {
    pub key: Vec<u8>,
    pub shared: bool,
    pub limit: Option<u32>,
    pub holders: Vec<Holder>,
    pub waiters: u32,
    pub delayed_micro: u64,
}

/// `holdfast.proto`'s `Holder`, as a client reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holder {
    pub fence: u64,
    pub value: Option<Vec<u8>>,
    pub lease_left_micro: u64,
    pub node: Option<u32>,
}

/// `holdfast.proto`'s `Event`, as a client reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Event {
    pub key: Vec<u8>,
    /// An [`event_kind`] value.
    pub kind: u32,
    pub fence: u64,
    pub value: Option<Vec<u8>>,
}

fn decode_holder(body: &[u8]) -> Result<Holder, &'static str> {
    let mut c = Cursor::new(body);
    let mut h = Holder::default();
    while !c.is_empty() {
        match c.tag()? {
            (F_HOLDER_FENCE, WT_VARINT) => h.fence = c.varint()?,
            (F_HOLDER_VALUE, WT_LEN) => h.value = Some(c.bytes()?.to_vec()),
            (F_HOLDER_LEASE_LEFT, WT_VARINT) => h.lease_left_micro = c.varint()?,
            (F_HOLDER_NODE, WT_VARINT) => h.node = Some(c.varint()? as u32),
            (_, wire) => c.skip(wire)?,
        }
    }
    Ok(h)
}

fn decode_info(body: &[u8]) -> Result<KeyInfo, &'static str> {
    let mut c = Cursor::new(body);
    let mut i = KeyInfo::default();
    while !c.is_empty() {
        match c.tag()? {
            (F_INFO_KEY, WT_LEN) => i.key = c.bytes()?.to_vec(),
            (F_INFO_SHARED, WT_VARINT) => i.shared = c.varint()? != 0,
            (F_INFO_LIMIT, WT_VARINT) => i.limit = Some(c.varint()? as u32),
            (F_INFO_HOLDERS, WT_LEN) => i.holders.push(decode_holder(c.bytes()?)?),
            (F_INFO_WAITERS, WT_VARINT) => i.waiters = c.varint()? as u32,
            (F_INFO_DELAYED, WT_VARINT) => i.delayed_micro = c.varint()?,
            (_, wire) => c.skip(wire)?,
        }
    }
    Ok(i)
}

fn decode_event(body: &[u8]) -> Result<Event, &'static str> {
    let mut c = Cursor::new(body);
    let mut e = Event::default();
    while !c.is_empty() {
        match c.tag()? {
            (F_EVENT_KEY, WT_LEN) => e.key = c.bytes()?.to_vec(),
            (F_EVENT_KIND, WT_VARINT) => e.kind = c.varint()? as u32,
            (F_EVENT_FENCE, WT_VARINT) => e.fence = c.varint()?,
            (F_EVENT_VALUE, WT_LEN) => e.value = Some(c.bytes()?.to_vec()),
            (_, wire) => c.skip(wire)?,
        }
    }
    Ok(e)
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
            (F_RESP_INFO, WT_LEN) => r.info.push(decode_info(c.bytes()?)?),
            (F_RESP_EVENT, WT_LEN) => r.event = Some(decode_event(c.bytes()?)?),
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
                native: Default::default(),
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
#[path = "dlock_tests.rs"]
mod tests;
