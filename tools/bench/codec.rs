//! Requests and reply checks for every protocol the bench speaks.
//!
//! Owns: writing one request of a primitive kind ([`Req`]) for a key, and recognising its reply
//! as the expected one or not ([`check_reply`]). memcached binary, old and dlock go through the
//! crate's own codecs (`holdfast::proto`); memcached text replies and Redis RESP replies are
//! parsed here (the crate only parses text *requests*).
//!
//! Must not: allocate per request or reply (encoders append to the connection's buffer), or
//! accept a reply it cannot delimit: a stream it cannot follow is `Err`, and the connection is
//! closed by the caller.

use holdfast::proto::{counter, dlock, lockd, memcache::binary};

/// Longest reply line accepted from a text protocol (memcached, RESP) before the stream is
/// declared broken: every expected reply line is far shorter.
const MAX_REPLY_LINE: usize = 4096;
/// Redis PX for SET NX: 30 s, far beyond a pair's life, so the key never expires mid-pair.
const SETNX_PX: &[u8] = b"30000";
/// The slots of the native semaphore rows' keys.
pub const SEMAPHORE_LIMIT: u32 = 8;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Protocol {
    McText,
    McBinary,
    Lockd,
    Dlock,
    /// The native protocol (dlock version 3): an exclusive Lock, a shared one, and a slot of a
    /// semaphore of [`SEMAPHORE_LIMIT`].
    Native,
    NativeShared,
    NativeSemaphore,
    Redis,
    /// yrmcds's counter protocol: Lock is Acquire 1, Unlock is Release 1.
    Counter,
    /// etcd v3's JSON gateway over HTTP/1.1: Lock is a create-if-absent Txn, Unlock a
    /// DeleteRange (see etcd.rs).
    Etcd,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Protocol::McText => "memcache-text",
            Protocol::McBinary => "memcache-binary",
            Protocol::Lockd => "lockd",
            Protocol::Dlock => "dlock",
            Protocol::Native => "native",
            Protocol::NativeShared => "native-shared",
            Protocol::NativeSemaphore => "native-semaphore",
            Protocol::Redis => "redis",
            Protocol::Counter => "counter",
            Protocol::Etcd => "etcd",
        }
    }

    pub fn parse(s: &str) -> Option<Protocol> {
        [
            Protocol::McText,
            Protocol::McBinary,
            Protocol::Lockd,
            Protocol::Dlock,
            Protocol::Native,
            Protocol::NativeShared,
            Protocol::NativeSemaphore,
            Protocol::Redis,
            Protocol::Counter,
            Protocol::Etcd,
        ]
        .into_iter()
        .find(|p| p.name() == s)
    }

    pub fn default_port(self) -> u16 {
        match self {
            Protocol::McText | Protocol::McBinary => 11211,
            Protocol::Lockd => 2626,
            Protocol::Dlock
            | Protocol::Native
            | Protocol::NativeShared
            | Protocol::NativeSemaphore => 2627,
            Protocol::Redis => 6379,
            Protocol::Counter => 11215,
            Protocol::Etcd => 2379,
        }
    }
}

/// One request kind. A workload's operation is one or two of these (a lock+unlock pair is two).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Req {
    /// memcached `lock` / binary 0x40, old ACQ, dlock Lock.
    Lock,
    /// memcached `unlock` / binary 0x42, old REL, dlock Unlock (type 3).
    Unlock,
    /// memcached `add`; Redis `SET key val NX PX 30000`.
    Add,
    /// memcached `delete`, Redis `DEL`: the key must have been there.
    Delete,
    /// Like `Delete`, but a missing key is fine too (clearing the key space before a run).
    Clear,
    Get,
    Set,
}

/// What a request expects back, kept in order per connection.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Expect {
    pub req: Req,
    /// The binary opaque or dlock request id the reply must echo.
    pub id: u64,
}

/// The outcome of looking at the front of a receive buffer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Checked {
    /// Not a whole reply yet.
    Incomplete,
    /// A whole reply of `len` bytes; `ok` when it is the expected one.
    Reply { ok: bool, len: usize },
}

/// Whether `proto` can issue `req` at all.
pub fn supports(proto: Protocol, req: Req) -> bool {
    use Protocol::*;
    use Req::*;
    match proto {
        McText | McBinary => true,
        Lockd | Dlock | Native | NativeShared | NativeSemaphore | Counter | Etcd => {
            matches!(req, Lock | Unlock)
        }
        Redis => matches!(req, Add | Delete | Clear | Get | Set),
    }
}

/// Append `req` for `key` to `out`. `id` is echoed by binary (opaque, truncated to 32 bits) and
/// dlock (request id) replies.
pub fn encode(proto: Protocol, req: Req, key: &[u8], value: &[u8], id: u64, out: &mut Vec<u8>) {
    debug_assert!(supports(proto, req), "{proto:?} cannot {req:?}");
    match proto {
        Protocol::McText => encode_text(req, key, value, out),
        Protocol::McBinary => {
            use binary::opcode;
            // flags 0, exptime 0 (never), as protocol-binary.xml lays out Set/Add extras.
            const STORE_EXTRAS: &[u8] = &[0; 8];
            const NONE: &[u8] = &[];
            let (op, extras, value) = match req {
                Req::Lock => (opcode::LOCK, NONE, NONE),
                Req::Unlock => (opcode::UNLOCK, NONE, NONE),
                Req::Add => (opcode::ADD, STORE_EXTRAS, value),
                Req::Set => (opcode::SET, STORE_EXTRAS, value),
                Req::Delete | Req::Clear => (opcode::DELETE, NONE, NONE),
                Req::Get => (opcode::GET, NONE, NONE),
            };
            binary::encode_request(out, op, id as u32, 0, extras, key, value);
        }
        Protocol::Lockd => {
            let op = if req == Req::Lock {
                lockd::op::ACQ
            } else {
                lockd::op::REL
            };
            // The payload is the name, NUL-terminated (old-protocol.txt).
            out.extend_from_slice(&lockd::header(op, key.len() + 1));
            out.extend_from_slice(key);
            out.push(0);
        }
        Protocol::Dlock => {
            let ty = if req == Req::Lock {
                dlock::req_type::LOCK
            } else {
                dlock::req_type::UNLOCK
            };
            let keys = [key];
            let lock = dlock::LockFields {
                keys: &keys,
                ..dlock::LockFields::default()
            };
            dlock::encode_request(out, Some(id), None, ty, Some(lock));
        }
        Protocol::Native | Protocol::NativeShared | Protocol::NativeSemaphore => {
            let ty = if req == Req::Lock {
                dlock::req_type::LOCK
            } else {
                dlock::req_type::UNLOCK
            };
            let keys = [key];
            let mut lock = dlock::LockFields {
                keys: &keys,
                ..dlock::LockFields::default()
            };
            if req == Req::Lock {
                lock.native.shared = proto == Protocol::NativeShared;
                lock.native.limit = (proto == Protocol::NativeSemaphore).then_some(SEMAPHORE_LIMIT);
            }
            let v = dlock::NATIVE_VERSION;
            dlock::encode_request_version(out, v, Some(id), None, ty, Some(lock));
        }
        Protocol::Counter => {
            // Acquire one of u32::MAX: a pair never finds its counter full, so the bench measures
            // the protocol and the table, like an uncontended lock pair.
            let start = out.len();
            out.extend_from_slice(&[0; counter::HEADER_LEN]);
            let (op, body_start) = (
                if req == Req::Lock {
                    counter::op::ACQUIRE
                } else {
                    counter::op::RELEASE
                },
                out.len(),
            );
            if req == Req::Lock {
                counter::acquire_body(out, 1, u32::MAX, key);
            } else {
                counter::release_body(out, 1, key);
            }
            let body_len = (out.len() - body_start) as u32;
            let header = &mut out[start..body_start];
            header[0] = counter::REQ_MAGIC;
            header[1] = op;
            header[4..8].copy_from_slice(&body_len.to_be_bytes());
            header[8..12].copy_from_slice(&(id as u32).to_be_bytes());
        }
        Protocol::Etcd => crate::etcd::encode(req, key, value, out),
        Protocol::Redis => match req {
            Req::Add => resp_command(out, &[b"SET", key, value, b"NX", b"PX", SETNX_PX]),
            Req::Set => resp_command(out, &[b"SET", key, value]),
            Req::Get => resp_command(out, &[b"GET", key]),
            _ => resp_command(out, &[b"DEL", key]),
        },
    }
}

fn encode_text(req: Req, key: &[u8], value: &[u8], out: &mut Vec<u8>) {
    let verb: &[u8] = match req {
        Req::Lock => b"lock ",
        Req::Unlock => b"unlock ",
        Req::Add => b"add ",
        Req::Set => b"set ",
        Req::Delete | Req::Clear => b"delete ",
        Req::Get => b"get ",
    };
    out.extend_from_slice(verb);
    out.extend_from_slice(key);
    if matches!(req, Req::Add | Req::Set) {
        // <key> <flags> <exptime> <bytes>\r\n<data>\r\n (protocol.txt, Storage commands).
        out.extend_from_slice(b" 0 0 ");
        push_decimal(out, value.len() as u64);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(value);
    }
    out.extend_from_slice(b"\r\n");
}

/// A RESP array of bulk strings (the Redis protocol's request form).
fn resp_command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.push(b'*');
    push_decimal(out, args.len() as u64);
    out.extend_from_slice(b"\r\n");
    for arg in args {
        out.push(b'$');
        push_decimal(out, arg.len() as u64);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// Append `n` in decimal without allocating.
pub fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        // Lossless: a single decimal digit.
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// Look at the front of `buf` for the reply to `expect`. `Err` when the stream cannot be
/// followed (bad framing): the connection must be closed.
pub fn check_reply(proto: Protocol, expect: Expect, buf: &[u8]) -> Result<Checked, &'static str> {
    match proto {
        Protocol::McText => check_text(expect.req, buf),
        Protocol::McBinary => match binary::parse_response(buf) {
            Ok((r, len)) => {
                let ok = r.opaque == expect.id as u32
                    && match expect.req {
                        Req::Clear => matches!(
                            r.status,
                            binary::status::NO_ERROR | binary::status::KEY_NOT_FOUND
                        ),
                        Req::Get => r.status == binary::status::NO_ERROR && r.extras.len() == 4,
                        _ => r.status == binary::status::NO_ERROR,
                    };
                Ok(Checked::Reply { ok, len })
            }
            Err(binary::ParseError::Incomplete) => Ok(Checked::Incomplete),
            Err(_) => Err("not a memcached binary response"),
        },
        Protocol::Lockd => match lockd::parse(buf) {
            Some((f, len)) => {
                let want = if expect.req == Req::Lock {
                    lockd::op::ACQUIRED
                } else {
                    lockd::op::RELEASED
                };
                let ok = f.version == lockd::VERSION && f.opcode == want;
                Ok(Checked::Reply { ok, len })
            }
            None => Ok(Checked::Incomplete),
        },
        Protocol::Dlock | Protocol::Native | Protocol::NativeShared | Protocol::NativeSemaphore => {
            match dlock::parse_frame(buf, usize::MAX) {
                Ok((body, len)) => {
                    let resp =
                        dlock::decode_response_view(body).map_err(|_| "not a dlock response")?;
                    let ok =
                        resp.request_id == Some(expect.id) && resp.status_is(dlock::status::OK);
                    Ok(Checked::Reply { ok, len })
                }
                Err(dlock::FrameError::Incomplete) => Ok(Checked::Incomplete),
                Err(dlock::FrameError::TooLarge) => Err("dlock frame too large"),
            }
        }
        Protocol::Counter => {
            if buf.first().is_some_and(|&m| m != counter::RES_MAGIC) {
                return Err("not a counter response");
            }
            let Some(h) = buf.first_chunk::<{ counter::HEADER_LEN }>() else {
                return Ok(Checked::Incomplete);
            };
            let body = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
            if body > counter::MAX_BODY {
                return Err("counter response too large");
            }
            let len = counter::HEADER_LEN + body;
            if buf.len() < len {
                return Ok(Checked::Incomplete);
            }
            let want = if expect.req == Req::Lock {
                counter::op::ACQUIRE
            } else {
                counter::op::RELEASE
            };
            let opaque = u32::from_be_bytes([h[8], h[9], h[10], h[11]]);
            let ok = h[1] == want && h[2] == counter::status::OK && opaque == expect.id as u32;
            Ok(Checked::Reply { ok, len })
        }
        Protocol::Etcd => crate::etcd::check_reply(expect.req, buf),
        Protocol::Redis => {
            let Some((reply, len)) = parse_resp(buf)? else {
                return Ok(Checked::Incomplete);
            };
            let ok = match expect.req {
                Req::Add | Req::Set => reply == Resp::Simple(b"OK"),
                Req::Delete => reply == Resp::Int(1),
                Req::Clear => matches!(reply, Resp::Int(0 | 1)),
                Req::Get => matches!(reply, Resp::Bulk(Some(_))),
                Req::Lock | Req::Unlock => false,
            };
            Ok(Checked::Reply { ok, len })
        }
    }
}

fn check_text(req: Req, buf: &[u8]) -> Result<Checked, &'static str> {
    let Some((reply, len)) = parse_text(buf)? else {
        return Ok(Checked::Incomplete);
    };
    let ok = match (req, reply) {
        (Req::Get, TextReply::Value { .. }) => true,
        (_, TextReply::Value { .. }) | (Req::Get, _) => false,
        (Req::Lock | Req::Unlock, TextReply::Line(l)) => l == b"OK",
        (Req::Add | Req::Set, TextReply::Line(l)) => l == b"STORED",
        (Req::Delete, TextReply::Line(l)) => l == b"DELETED",
        (Req::Clear, TextReply::Line(l)) => l == b"DELETED" || l == b"NOT_FOUND",
    };
    Ok(Checked::Reply { ok, len })
}

/// One memcached text reply.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TextReply<'a> {
    /// A one-line reply without its CRLF (`STORED`, `OK`, `END`, `CLIENT_ERROR ...`).
    Line(&'a [u8]),
    /// `VALUE <key> <flags> <bytes> [<cas>]\r\n<data>\r\nEND\r\n`: a single-key hit.
    Value { key: &'a [u8], data: &'a [u8] },
}

fn line_end(buf: &[u8]) -> Result<Option<usize>, &'static str> {
    let window = &buf[..buf.len().min(MAX_REPLY_LINE)];
    match window.windows(2).position(|w| w == b"\r\n") {
        Some(at) => Ok(Some(at)),
        None if buf.len() >= MAX_REPLY_LINE => Err("reply line too long"),
        None => Ok(None),
    }
}

/// Parse one memcached text reply (protocol.txt) from the front of `buf`: the reply and its
/// length, `None` if incomplete. A VALUE block must hold exactly one value followed by `END`.
pub fn parse_text(buf: &[u8]) -> Result<Option<(TextReply<'_>, usize)>, &'static str> {
    let Some(eol) = line_end(buf)? else {
        return Ok(None);
    };
    let line = &buf[..eol];
    let Some(rest) = line.strip_prefix(b"VALUE ") else {
        return Ok(Some((TextReply::Line(line), eol + 2)));
    };
    let mut toks = rest.split(|&b| b == b' ').filter(|t| !t.is_empty());
    let (Some(key), Some(_flags), Some(bytes)) = (toks.next(), toks.next(), toks.next()) else {
        return Err("bad VALUE line");
    };
    let bytes = parse_decimal(bytes).ok_or("bad VALUE length")?;
    let data_at = eol + 2;
    let Some(end) = data_at.checked_add(bytes) else {
        return Err("bad VALUE length");
    };
    const TRAILER: &[u8] = b"\r\nEND\r\n";
    let Some(total) = end.checked_add(TRAILER.len()) else {
        return Err("bad VALUE length");
    };
    if buf.len() < total {
        // Still arriving; but a wrong byte already there means the stream is lost.
        let have = buf.len().saturating_sub(end).min(TRAILER.len());
        if buf.len() > end && buf[end..end + have] != TRAILER[..have] {
            return Err("VALUE block not followed by END");
        }
        return Ok(None);
    }
    if &buf[end..total] != TRAILER {
        return Err("VALUE block not followed by END");
    }
    Ok(Some((
        TextReply::Value {
            key,
            data: &buf[data_at..end],
        },
        total,
    )))
}

fn parse_decimal(tok: &[u8]) -> Option<usize> {
    if tok.is_empty() || tok.len() > 19 {
        return None;
    }
    tok.iter().try_fold(0usize, |n, &b| {
        b.is_ascii_digit().then(|| n * 10 + usize::from(b - b'0'))
    })
}

/// One RESP reply of the kinds our commands get back.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Resp<'a> {
    /// `+OK`
    Simple(&'a [u8]),
    /// `-ERR ...`
    Error(&'a [u8]),
    /// `:1`
    Int(i64),
    /// `$3\r\nabc` or `$-1` (nil).
    Bulk(Option<&'a [u8]>),
}

/// Parse one RESP reply from the front of `buf`. Arrays (never an answer to SET, GET or DEL)
/// are refused.
pub fn parse_resp(buf: &[u8]) -> Result<Option<(Resp<'_>, usize)>, &'static str> {
    let Some(eol) = line_end(buf)? else {
        return Ok(None);
    };
    let (&kind, rest) = buf[..eol].split_first().ok_or("empty RESP line")?;
    let after = eol + 2;
    let reply = match kind {
        b'+' => Resp::Simple(rest),
        b'-' => Resp::Error(rest),
        b':' => Resp::Int(parse_signed(rest).ok_or("bad RESP integer")?),
        b'$' => {
            let len = parse_signed(rest).ok_or("bad RESP bulk length")?;
            if len == -1 {
                return Ok(Some((Resp::Bulk(None), after)));
            }
            let len = usize::try_from(len).map_err(|_| "bad RESP bulk length")?;
            let end = after.checked_add(len).ok_or("bad RESP bulk length")?;
            let Some(total) = end.checked_add(2) else {
                return Err("bad RESP bulk length");
            };
            if buf.len() < total {
                return Ok(None);
            }
            if &buf[end..total] != b"\r\n" {
                return Err("RESP bulk string not followed by CRLF");
            }
            return Ok(Some((Resp::Bulk(Some(&buf[after..end])), total)));
        }
        _ => return Err("unexpected RESP type"),
    };
    Ok(Some((reply, after)))
}

fn parse_signed(tok: &[u8]) -> Option<i64> {
    let (neg, digits) = match tok.strip_prefix(b"-") {
        Some(d) => (true, d),
        None => (false, tok),
    };
    let n = i64::try_from(parse_decimal(digits)?).ok()?;
    Some(if neg { -n } else { n })
}

/// A short printable form of a reply, for the first few errors.
pub fn describe(bytes: &[u8]) -> String {
    const SHOWN: usize = 80;
    let shown = &bytes[..bytes.len().min(SHOWN)];
    let mut s = shown.escape_ascii().to_string();
    if bytes.len() > SHOWN {
        s.push_str("...");
    }
    s
}

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;
