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

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Protocol {
    McText,
    McBinary,
    Lockd,
    Dlock,
    Redis,
    /// yrmcds's counter protocol: Lock is Acquire 1, Unlock is Release 1.
    Counter,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Protocol::McText => "memcache-text",
            Protocol::McBinary => "memcache-binary",
            Protocol::Lockd => "lockd",
            Protocol::Dlock => "dlock",
            Protocol::Redis => "redis",
            Protocol::Counter => "counter",
        }
    }

    pub fn parse(s: &str) -> Option<Protocol> {
        [
            Protocol::McText,
            Protocol::McBinary,
            Protocol::Lockd,
            Protocol::Dlock,
            Protocol::Redis,
            Protocol::Counter,
        ]
        .into_iter()
        .find(|p| p.name() == s)
    }

    pub fn default_port(self) -> u16 {
        match self {
            Protocol::McText | Protocol::McBinary => 11211,
            Protocol::Lockd => 2626,
            Protocol::Dlock => 2627,
            Protocol::Redis => 6379,
            Protocol::Counter => 11215,
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
        Lockd | Dlock | Counter => matches!(req, Lock | Unlock),
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
        Protocol::Dlock => match dlock::parse_frame(buf, usize::MAX) {
            Ok((body, len)) => {
                let resp = dlock::decode_response_view(body).map_err(|_| "not a dlock response")?;
                let ok = resp.request_id == Some(expect.id) && resp.status_is(dlock::status::OK);
                Ok(Checked::Reply { ok, len })
            }
            Err(dlock::FrameError::Incomplete) => Ok(Checked::Incomplete),
            Err(dlock::FrameError::TooLarge) => Err("dlock frame too large"),
        },
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
mod tests {
    use super::*;

    fn expect(req: Req, id: u64) -> Expect {
        Expect { req, id }
    }

    /// Every split point of `whole` is incomplete; the whole is one reply of its full length.
    fn assert_one_reply(proto: Protocol, e: Expect, whole: &[u8], ok: bool) {
        for cut in 0..whole.len() {
            assert_eq!(
                check_reply(proto, e, &whole[..cut]),
                Ok(Checked::Incomplete),
                "{proto:?} {e:?} cut {cut} of {}",
                describe(whole)
            );
        }
        let mut pipelined = whole.to_vec();
        pipelined.extend_from_slice(whole);
        assert_eq!(
            check_reply(proto, e, &pipelined),
            Ok(Checked::Reply {
                ok,
                len: whole.len()
            }),
            "{proto:?} {e:?} {}",
            describe(whole)
        );
    }

    #[test]
    fn memcache_text_replies_are_matched_to_their_request() {
        use Protocol::McText as P;
        let cases: &[(Req, &[u8], bool)] = &[
            (Req::Lock, b"OK\r\n", true),
            (Req::Lock, b"LOCKED\r\n", false),
            (Req::Unlock, b"OK\r\n", true),
            (
                Req::Unlock,
                b"CLIENT_ERROR object is not locked or not found\r\n",
                false,
            ),
            (Req::Add, b"STORED\r\n", true),
            (Req::Add, b"NOT_STORED\r\n", false),
            (Req::Set, b"STORED\r\n", true),
            (Req::Delete, b"DELETED\r\n", true),
            (Req::Delete, b"NOT_FOUND\r\n", false),
            (Req::Clear, b"NOT_FOUND\r\n", true),
            (Req::Clear, b"DELETED\r\n", true),
            (Req::Get, b"VALUE key:1 0 3\r\nabc\r\nEND\r\n", true),
            // A value may hold CRLF: its length says where it ends.
            (Req::Get, b"VALUE key:1 0 3 99\r\na\r\n\r\nEND\r\n", true),
            (Req::Get, b"VALUE k 5 0\r\n\r\nEND\r\n", true),
            (Req::Get, b"END\r\n", false),
            (Req::Set, b"ERROR\r\n", false),
            (Req::Lock, b"VALUE k 0 1\r\nx\r\nEND\r\n", false),
        ];
        for &(req, whole, ok) in cases {
            assert_one_reply(P, expect(req, 0), whole, ok);
        }
        assert_eq!(
            parse_text(b"VALUE key:1 0 3\r\nabc\r\nEND\r\n"),
            Ok(Some((
                TextReply::Value {
                    key: b"key:1",
                    data: b"abc"
                },
                27
            )))
        );
    }

    #[test]
    fn memcache_text_broken_streams_are_errors() {
        for bad in [
            &b"VALUE k 0\r\n"[..],
            b"VALUE k 0 x\r\n",
            b"VALUE k 0 1\r\nxyEND\r\n",
            b"VALUE k 0 1\r\nx\r\nENX",
        ] {
            assert!(parse_text(bad).is_err(), "{}", describe(bad));
        }
        assert!(parse_text(&[b'x'; MAX_REPLY_LINE]).is_err(), "no CRLF");
        assert_eq!(parse_text(&[b'x'; MAX_REPLY_LINE - 1]), Ok(None));
    }

    #[test]
    fn memcache_binary_replies_check_status_and_opaque() {
        use binary::{opcode, status};
        use Protocol::McBinary as P;
        let reply = |op, st, opaque, extras: &[u8], value: &[u8]| {
            let mut out = Vec::new();
            binary::encode_response(&mut out, op, st, opaque, 0, extras, b"", value);
            out
        };
        let e = expect(Req::Lock, 9);
        assert_one_reply(P, e, &reply(opcode::LOCK, 0, 9, b"", b""), true);
        assert_one_reply(
            P,
            e,
            &reply(opcode::LOCK, status::LOCKED, 9, b"", b"Locked"),
            false,
        );
        assert_one_reply(P, e, &reply(opcode::LOCK, 0, 8, b"", b""), false);
        let e = expect(Req::Get, 1);
        assert_one_reply(P, e, &reply(opcode::GET, 0, 1, &[0; 4], b"v"), true);
        assert_one_reply(
            P,
            e,
            &reply(opcode::GET, status::KEY_NOT_FOUND, 1, b"", b"Not found"),
            false,
        );
        let e = expect(Req::Clear, 2);
        assert_one_reply(
            P,
            e,
            &reply(opcode::DELETE, status::KEY_NOT_FOUND, 2, b"", b""),
            true,
        );
        let e = expect(Req::Delete, 2);
        assert_one_reply(
            P,
            e,
            &reply(opcode::DELETE, status::KEY_NOT_FOUND, 2, b"", b""),
            false,
        );
        assert!(
            check_reply(P, e, b"STORED\r\n").is_err(),
            "text where binary was expected"
        );
        // The opaque echoes the low 32 bits of a wider id.
        let e = expect(Req::Set, (1 << 32) + 5);
        assert_one_reply(P, e, &reply(opcode::SET, 0, 5, b"", b""), true);
    }

    #[test]
    fn counter_requests_parse_and_replies_check_status_and_opaque() {
        use counter::{op, status};
        use Protocol::Counter as P;
        let mut out = Vec::new();
        encode(P, Req::Lock, b"key:1", b"", 9, &mut out);
        let (r, n) = counter::parse(&out).expect("a valid Acquire");
        assert_eq!((n, r.opaque), (out.len(), 9));
        assert_eq!(
            r.command,
            counter::Command::Acquire {
                resources: 1,
                maximum: u32::MAX,
                name: b"key:1"
            }
        );
        let reply = |opcode, st, opaque, body: &[u8]| {
            let mut v = Vec::new();
            counter::encode(&mut v, opcode, st, opaque, body);
            v
        };
        let e = expect(Req::Lock, 9);
        assert_one_reply(
            P,
            e,
            &reply(op::ACQUIRE, status::OK, 9, &[0, 0, 0, 1]),
            true,
        );
        assert_one_reply(
            P,
            e,
            &reply(op::ACQUIRE, status::OK, 8, &[0, 0, 0, 1]),
            false,
        );
        assert_one_reply(
            P,
            e,
            &reply(op::ACQUIRE, status::NOT_AVAILABLE, 9, b"x"),
            false,
        );
        let e = expect(Req::Unlock, 3);
        assert_one_reply(P, e, &reply(op::RELEASE, status::OK, 3, b""), true);
        assert!(check_reply(P, e, b"STORED\r\n").is_err());
    }

    #[test]
    fn lockd_replies_check_the_opcode() {
        use lockd::op;
        use Protocol::Lockd as P;
        let frame = |opcode| {
            let mut out = Vec::new();
            lockd::encode(&mut out, opcode, b"key:1\0");
            out
        };
        assert_one_reply(P, expect(Req::Lock, 0), &frame(op::ACQUIRED), true);
        assert_one_reply(P, expect(Req::Lock, 0), &frame(op::ACK), false);
        assert_one_reply(P, expect(Req::Unlock, 0), &frame(op::RELEASED), true);
        assert_one_reply(P, expect(Req::Unlock, 0), &frame(op::ERR), false);
        // And the requests are what the daemon's parser reads.
        let mut out = Vec::new();
        encode(P, Req::Lock, b"key:1", b"", 0, &mut out);
        encode(P, Req::Unlock, b"key:1", b"", 0, &mut out);
        let (acq, used) = lockd::parse(&out).expect("ACQ");
        assert_eq!((acq.opcode, acq.name()), (op::ACQ, Some(&b"key:1"[..])));
        let (rel, _) = lockd::parse(&out[used..]).expect("REL");
        assert_eq!((rel.opcode, rel.name()), (op::REL, Some(&b"key:1"[..])));
    }

    #[test]
    fn dlock_replies_check_status_and_request_id() {
        use Protocol::Dlock as P;
        let resp = |id, st| {
            let mut out = Vec::new();
            dlock::encode_response(&mut out, Some(id), st, None, [], 1_700_000_000);
            out
        };
        assert_one_reply(P, expect(Req::Lock, 3), &resp(3, dlock::status::OK), true);
        assert_one_reply(P, expect(Req::Lock, 3), &resp(4, dlock::status::OK), false);
        assert_one_reply(
            P,
            expect(Req::Unlock, 3),
            &resp(3, dlock::status::GENERAL),
            false,
        );
        assert!(check_reply(P, expect(Req::Lock, 1), &[0, 0, 0, 2, 0x18, 0x80]).is_err());
        // The requests decode with the daemon's decoder: Lock type 2, Unlock type 3, key in 51.
        let mut out = Vec::new();
        encode(P, Req::Unlock, b"key:7", b"", 12, &mut out);
        let (body, used) = dlock::parse_frame(&out, 1 << 20).expect("frame");
        assert_eq!(used, out.len());
        let req = dlock::decode_request(body).expect("decodes");
        assert_eq!(
            (req.id, req.req_type),
            (Some(12), Some(dlock::req_type::UNLOCK))
        );
        let keys: Vec<&[u8]> = req.lock.expect("field 51").keys.collect();
        assert_eq!(keys, [b"key:7"]);
    }

    #[test]
    fn memcache_requests_parse_with_the_daemon_parser() {
        use holdfast::proto::memcache::text;
        let mut out = Vec::new();
        encode(Protocol::McText, Req::Add, b"key:1", b"vvv", 0, &mut out);
        let mut scanned = 0;
        let (req, used) = text::parse(&out, &mut scanned, 1 << 20).expect("add parses");
        assert_eq!(used, out.len());
        assert!(matches!(
            req,
            text::Request::Store {
                cmd: text::StoreCmd::Add,
                key: b"key:1",
                value: b"vvv",
                ..
            }
        ));
        let mut out = Vec::new();
        encode(Protocol::McBinary, Req::Unlock, b"key:1", b"", 77, &mut out);
        let (req, _) = binary::parse(&out, 1 << 20).expect("unlock parses");
        assert_eq!(
            (req.opcode, req.key, req.opaque),
            (binary::opcode::UNLOCK, &b"key:1"[..], 77)
        );
    }

    #[test]
    fn redis_replies_and_requests() {
        use Protocol::Redis as P;
        assert_one_reply(P, expect(Req::Add, 0), b"+OK\r\n", true);
        assert_one_reply(P, expect(Req::Add, 0), b"$-1\r\n", false);
        assert_one_reply(P, expect(Req::Delete, 0), b":1\r\n", true);
        assert_one_reply(P, expect(Req::Delete, 0), b":0\r\n", false);
        assert_one_reply(P, expect(Req::Clear, 0), b":0\r\n", true);
        assert_one_reply(P, expect(Req::Get, 0), b"$3\r\nabc\r\n", true);
        assert_one_reply(P, expect(Req::Get, 0), b"$0\r\n\r\n", true);
        assert_one_reply(P, expect(Req::Set, 0), b"-ERR wrong\r\n", false);
        assert_eq!(parse_resp(b":-12\r\n"), Ok(Some((Resp::Int(-12), 6))));
        assert!(parse_resp(b"*1\r\n").is_err());
        assert!(parse_resp(b"$3\r\nabcX\r\n").is_err());
        let mut out = Vec::new();
        encode(P, Req::Add, b"k", b"vv", 0, &mut out);
        assert_eq!(
            out,
            b"*6\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nvv\r\n$2\r\nNX\r\n$2\r\nPX\r\n$5\r\n30000\r\n"
        );
    }

    #[test]
    fn decimal_helpers() {
        for n in [0, 7, 10, 12345, u64::MAX] {
            let mut out = Vec::new();
            push_decimal(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes());
        }
        assert_eq!(parse_decimal(b""), None);
        assert_eq!(parse_decimal(b"12a"), None);
        assert_eq!(parse_signed(b"-1"), Some(-1));
    }
}
