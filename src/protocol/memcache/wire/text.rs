//! memcached text protocol parser (memcached's doc/protocol.txt, every command but the meta
//! commands) plus yrmcds's `lock`, `unlock` and `unlock_all` (yrmcds-locking.md) and its key
//! dump `keys [<prefix>]` (cybozu/yrmcds docs/keys.md; a prefix over 250 bytes or a second
//! argument is `CLIENT_ERROR bad command line format`). The `--compat yrmcds` error words are
//! chosen by the caller (`server::decode`), not here.
//!
//! Owns: splitting the receive buffer into request lines and data blocks, validating them, and
//! choosing the error line memcached answers for each malformed request together with how many
//! bytes to drop so the stream stays in sync.
//!
//! Must not: allocate, read a clock, panic on any input, scan a partial line twice (see `scanned`
//! on [`parse`]), or wait for bytes it is going to throw away (a value too large to store is
//! refused from its command line alone: `skip` may exceed the bytes received so far).
//!
//! Error replies (all static, see [`reply`]); the connection goes on after each `Invalid`:
//!
//! | input | reply | skip |
//! |---|---|---|
//! | unknown command, empty line | `ERROR` | the line |
//! | known command, wrong token count, bad number, missing key | `CLIENT_ERROR bad command line format` | the line |
//! | key over 250 bytes | `CLIENT_ERROR bad command line format` | the line (+ data block, storage) |
//! | storage: `<bytes>` negative, not a number, or over `MAX_DATA_LEN` | `CLIENT_ERROR bad command line format` | the line |
//! | storage: bad flags/exptime/cas, stray last token (`<bytes>` valid) | `CLIENT_ERROR bad command line format` | line + bytes + 2 |
//! | storage: `<bytes>` over `max_value` | `SERVER_ERROR object too large for cache` | line + bytes + 2 |
//! | storage: the 2 bytes after the data are not `\r\n` | `CLIENT_ERROR bad data chunk` | line + bytes + 2 |
//! | incr/decr: bad delta | `CLIENT_ERROR invalid numeric delta argument` | the line |
//! | touch/gat/gats: bad exptime | `CLIENT_ERROR invalid exptime argument` | the line |
//! | delete: extra tokens other than `0` / `noreply` | `CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]` | the line |
//!
//! and `Fatal` (`CLIENT_ERROR line too long`, then close) when no `\n` arrives within
//! [`MAX_LINE`] bytes, or [`MAX_RETRIEVAL_LINE`] for get/gets/gat/gats.
//!
//! `noreply` silences errors too, as memcached does (its `set_noreply_maybe` looks at the last
//! token before validating the rest, and `out_string` then skips every reply line, errors
//! included): for set/add/replace/append/prepend/cas, incr/decr, touch, delete, verbosity and
//! flush_all whose token count is one memcached accepts and whose last token is `noreply`, an
//! `Invalid` carries an empty reply (the bytes are still skipped, the data block swallowed).
//! Clients that send `noreply` never read an answer (pymemcache, libmemcached); an error line
//! would be taken as the answer to their next command and desynchronise the stream, and
//! memccapable's `verbosity noreply` check requires the silence. A line with another token count
//! (memcached's `WANT_TOKENS` check, which answers `ERROR` before looking at `noreply`) or an
//! unknown command is still answered.
//!
//! `version` and `quit` ignore extra tokens, as memcached 1.6 does (memccapable checks
//! `version foo bar` and `version noreply` answer `VERSION ...`).

/// Longest request line, `\n` included, for every command but get/gets/gat/gats. memcached
/// closes a connection that sent 2048 bytes without a newline (proto_text.c,
/// try_read_command_ascii); holdfast keeps that number.
pub const MAX_LINE: usize = 2048;

/// Longest get/gets/gat/gats line, `\n` included: multi-gets carry many keys on one line
/// (memcached lets them grow without bound; holdfast caps them at 64 KiB).
pub const MAX_RETRIEVAL_LINE: usize = 65536;

/// Leading spaces allowed before a long retrieval command is recognised (memcached's own
/// number in try_read_command_ascii).
const MAX_LEADING_SPACES: usize = 100;

/// Largest `<bytes>` of a storage command that is a number at all: memcached reads it as an
/// `int32_t` and refuses `vlen > INT_MAX - 2` (process_update_command) before adding the CRLF.
/// Anything above is `CLIENT_ERROR bad command line format` with only the line skipped; values
/// between `max_value` and this are `SERVER_ERROR object too large for cache` and swallowed.
pub const MAX_DATA_LEN: usize = i32::MAX as usize - 2;

/// The error lines this parser answers, CRLF included.
pub mod reply {
    pub const ERROR: &[u8] = b"ERROR\r\n";
    pub const BAD_FORMAT: &[u8] = b"CLIENT_ERROR bad command line format\r\n";
    pub const BAD_DATA_CHUNK: &[u8] = b"CLIENT_ERROR bad data chunk\r\n";
    pub const TOO_LARGE: &[u8] = b"SERVER_ERROR object too large for cache\r\n";
    pub const LINE_TOO_LONG: &[u8] = b"CLIENT_ERROR line too long\r\n";
    pub const BAD_DELTA: &[u8] = b"CLIENT_ERROR invalid numeric delta argument\r\n";
    pub const BAD_EXPTIME: &[u8] = b"CLIENT_ERROR invalid exptime argument\r\n";
    pub const DELETE_USAGE: &[u8] =
        b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n";
}

use super::MAX_KEY_LEN;

/// Storage commands that carry a data block.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum StoreCmd {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
}

/// Keys of a retrieval command, borrowed from the request line: iterate to get each key.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Keys<'a> {
    /// The part of the line holding the space-separated keys (already validated: at least one key,
    /// every key 1..=250 bytes).
    pub raw: &'a [u8],
}

impl<'a> Iterator for Keys<'a> {
    type Item = &'a [u8];
    /// The next run of non-space bytes; runs of spaces separate keys.
    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = trim_leading_spaces(self.raw);
        let end = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        let (key, tail) = rest.split_at(end);
        self.raw = tail;
        if key.is_empty() {
            None
        } else {
            Some(key)
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Request<'a> {
    /// get / gets
    Get {
        keys: Keys<'a>,
        cas: bool,
    },
    /// gat / gats
    Gat {
        exptime: i64,
        keys: Keys<'a>,
        cas: bool,
    },
    /// set / add / replace / append / prepend / cas; `cas_unique` only for Cas.
    Store {
        cmd: StoreCmd,
        key: &'a [u8],
        flags: u32,
        exptime: i64,
        value: &'a [u8],
        cas_unique: u64,
        noreply: bool,
    },
    Delete {
        key: &'a [u8],
        noreply: bool,
    },
    Incr {
        key: &'a [u8],
        delta: u64,
        noreply: bool,
    },
    Decr {
        key: &'a [u8],
        delta: u64,
        noreply: bool,
    },
    Touch {
        key: &'a [u8],
        exptime: i64,
        noreply: bool,
    },
    FlushAll {
        delay: i64,
        noreply: bool,
    },
    /// `stats` with its optional argument (`settings`, `items`, ...).
    Stats {
        arg: Option<&'a [u8]>,
    },
    Version,
    Verbosity {
        noreply: bool,
    },
    Quit,
    Lock {
        key: &'a [u8],
    },
    Unlock {
        key: &'a [u8],
    },
    UnlockAll,
    /// holdfast's `lock_token KEY` (`docs/protocol.md`, "Fencing tokens").
    LockToken {
        key: &'a [u8],
    },
    /// yrmcds's key dump: `keys [<prefix>]` (cybozu/yrmcds docs/keys.md).
    Keys {
        prefix: &'a [u8],
    },
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ParseError {
    /// Need more bytes.
    Incomplete,
    /// Answer `reply` (a whole reply line with CRLF, or empty for silence) and discard `skip`
    /// bytes from the start of the buffer. `skip` may exceed the bytes received so far (a value
    /// too large to store is swallowed as it arrives).
    Invalid { reply: &'static [u8], skip: usize },
    /// Answer `reply` and close the connection.
    Fatal { reply: &'static [u8] },
}

/// Parse one request from `buf`. `scanned` is how far an earlier call already looked for the end
/// of the first line without finding it (0 for a fresh buffer); it is updated so that a line
/// arriving one byte at a time is scanned once in all, not once per byte. `max_value` is the
/// largest data block accepted (`--max-item-size`).
///
/// # The `scanned` rule
///
/// Invariant: `buf[..*scanned]` holds no `\n`. `parse` maintains it itself:
/// - on `Err(Incomplete)` it sets `*scanned` to how far it looked: `buf.len()` (capped at the
///   line limit) while the line has no `\n` yet, or the index of that `\n` when the line is
///   complete and its data block is still arriving;
/// - on `Ok`, `Err(Invalid)` and `Err(Fatal)` it resets `*scanned` to 0, because the caller is
///   about to drop bytes from the front of the buffer.
///
/// So the caller never touches `scanned` except to start it at 0 for a new connection; between
/// two `Incomplete` calls it may only append to `buf` (moving the same bytes to another
/// allocation is fine: `scanned` is relative to the buffer start). A `*scanned` greater than
/// `buf.len()` is treated as 0.
///
/// `Ok((request, consumed))`: `consumed` is the line plus, for storage commands, the data block
/// and its CRLF; `consumed <= buf.len()`. `Invalid.skip` is always at least 1.
///
/// Line ends: `\r\n` or a bare `\n`, as memcached (the `\r` is dropped). Tokens are separated by
/// one or more spaces (only `' '`, as memcached's tokenizer); leading spaces are ignored.
pub fn parse<'a>(
    buf: &'a [u8],
    scanned: &mut usize,
    max_value: usize,
) -> Result<(Request<'a>, usize), ParseError> {
    let from = if *scanned <= buf.len() { *scanned } else { 0 };
    let cap = line_cap(buf);
    let limit = buf.len().min(cap);
    let Some(nl) = find_newline(buf, from.min(limit), limit) else {
        if buf.len() >= cap {
            *scanned = 0;
            return Err(ParseError::Fatal {
                reply: reply::LINE_TOO_LONG,
            });
        }
        *scanned = limit;
        return Err(ParseError::Incomplete);
    };
    let result = parse_line(buf, nl, max_value);
    *scanned = match result {
        Err(ParseError::Incomplete) => nl,
        _ => 0,
    };
    result
}

#[cfg(test)]
thread_local! {
    /// Bytes examined by the newline search, for the linear-work test.
    static NEWLINE_SEARCH_WORK: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Index of the first `\n` in `buf[from..to]`.
fn find_newline(buf: &[u8], from: usize, to: usize) -> Option<usize> {
    let window = buf.get(from..to)?;
    let found = window.iter().position(|&b| b == b'\n');
    #[cfg(test)]
    NEWLINE_SEARCH_WORK.with(|w| w.set(w.get() + found.map_or(window.len(), |i| i + 1)));
    found.map(|i| from + i)
}

/// The line limit for the request starting at `buf[0]`: [`MAX_RETRIEVAL_LINE`] when it starts
/// (after at most 100 spaces) with `get `, `gets `, `gat ` or `gats `, else [`MAX_LINE`].
fn line_cap(buf: &[u8]) -> usize {
    let lead = buf
        .iter()
        .take(MAX_LEADING_SPACES + 1)
        .take_while(|&&b| b == b' ')
        .count();
    if lead > MAX_LEADING_SPACES {
        return MAX_LINE;
    }
    let rest = buf.get(lead..).unwrap_or_default();
    let long: [&[u8]; 4] = [b"get ", b"gets ", b"gat ", b"gats "];
    if long.iter().any(|p| rest.starts_with(p)) {
        MAX_RETRIEVAL_LINE
    } else {
        MAX_LINE
    }
}

fn trim_leading_spaces(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|&b| b != b' ').unwrap_or(s.len());
    s.get(start..).unwrap_or_default()
}

fn trim_spaces(s: &[u8]) -> &[u8] {
    let s = trim_leading_spaces(s);
    let end = s.iter().rposition(|&b| b != b' ').map_or(0, |i| i + 1);
    s.get(..end).unwrap_or_default()
}

fn invalid<T>(reply: &'static [u8], skip: usize) -> Result<T, ParseError> {
    Err(ParseError::Invalid { reply, skip })
}

/// Takes the remaining tokens into an array; `None` if there are more than `N`.
fn collect<'a, const N: usize>(mut toks: Keys<'a>) -> Option<([&'a [u8]; N], usize)> {
    let mut out: [&[u8]; N] = [&[]; N];
    let mut n = 0;
    for t in &mut toks {
        *out.get_mut(n)? = t;
        n += 1;
    }
    Some((out, n))
}

/// Parse the request whose line ends with the `\n` at `buf[nl]`.
fn parse_line(buf: &[u8], nl: usize, max_value: usize) -> Result<(Request<'_>, usize), ParseError> {
    let result = parse_line_inner(buf, nl, max_value);
    match result {
        Err(ParseError::Invalid { reply, skip }) if !reply.is_empty() => {
            let line = buf.get(..nl).unwrap_or_default();
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if noreply_silences(line) {
                return Err(ParseError::Invalid { reply: b"", skip });
            }
            result
        }
        _ => result,
    }
}

/// memcached's `set_noreply_maybe` rule (see the module header): does this line's `noreply`
/// silence its error? Yes when the command takes `noreply`, the token count passes memcached's
/// `WANT_TOKENS` check for it, and the last token is `noreply`.
fn noreply_silences(line: &[u8]) -> bool {
    let mut toks = Keys { raw: line };
    let Some(cmd) = toks.next() else {
        return false;
    };
    let (min, max) = match cmd {
        b"set" | b"add" | b"replace" | b"append" | b"prepend" => (5, 6),
        b"cas" => (6, 7),
        b"incr" | b"decr" | b"touch" => (3, 4),
        b"delete" => (2, 4),
        b"verbosity" => (2, 3),
        b"flush_all" => (1, 3),
        _ => return false,
    };
    let mut count = 1;
    let mut last: &[u8] = cmd;
    for t in toks {
        count += 1;
        last = t;
    }
    last == b"noreply" && (min..=max).contains(&count)
}

fn parse_line_inner(
    buf: &[u8],
    nl: usize,
    max_value: usize,
) -> Result<(Request<'_>, usize), ParseError> {
    let line_len = nl + 1;
    let line = buf.get(..nl).unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut toks = Keys { raw: line };
    let Some(cmd) = toks.next() else {
        return invalid(reply::ERROR, line_len);
    };
    let ok = |req| Ok((req, line_len));
    let bad = || invalid(reply::BAD_FORMAT, line_len);
    match cmd {
        b"get" | b"gets" => match retrieval_keys(toks.raw) {
            Some(keys) => ok(Request::Get {
                keys,
                cas: cmd == b"gets",
            }),
            None => bad(),
        },
        b"gat" | b"gats" => {
            let Some(exp) = toks.next() else {
                return bad();
            };
            let Some(exptime) = parse_i64(exp) else {
                return invalid(reply::BAD_EXPTIME, line_len);
            };
            match retrieval_keys(toks.raw) {
                Some(keys) => ok(Request::Gat {
                    exptime,
                    keys,
                    cas: cmd == b"gats",
                }),
                None => bad(),
            }
        }
        b"set" => parse_store(StoreCmd::Set, toks, buf, line_len, max_value),
        b"add" => parse_store(StoreCmd::Add, toks, buf, line_len, max_value),
        b"replace" => parse_store(StoreCmd::Replace, toks, buf, line_len, max_value),
        b"append" => parse_store(StoreCmd::Append, toks, buf, line_len, max_value),
        b"prepend" => parse_store(StoreCmd::Prepend, toks, buf, line_len, max_value),
        b"cas" => parse_store(StoreCmd::Cas, toks, buf, line_len, max_value),
        b"delete" => {
            // memcached accepts a legacy hold time of exactly "0" (process_delete_command).
            let Some((t, n)) = collect::<3>(toks) else {
                return invalid(reply::DELETE_USAGE, line_len);
            };
            let noreply = match (n, t[1], t[2]) {
                (1, _, _) => false,
                (2, b"0", _) => false,
                (2, b"noreply", _) | (3, b"0", b"noreply") => true,
                (0, _, _) => return bad(),
                _ => return invalid(reply::DELETE_USAGE, line_len),
            };
            if t[0].len() > MAX_KEY_LEN {
                return bad();
            }
            ok(Request::Delete { key: t[0], noreply })
        }
        b"incr" | b"decr" => {
            let Some(([key, delta, nr], n)) = collect::<3>(toks) else {
                return bad();
            };
            let noreply = match (n, nr) {
                (2, _) => false,
                (3, b"noreply") => true,
                _ => return bad(),
            };
            if key.len() > MAX_KEY_LEN {
                return bad();
            }
            let Some(delta) = parse_u64(delta) else {
                return invalid(reply::BAD_DELTA, line_len);
            };
            if cmd == b"incr" {
                ok(Request::Incr {
                    key,
                    delta,
                    noreply,
                })
            } else {
                ok(Request::Decr {
                    key,
                    delta,
                    noreply,
                })
            }
        }
        b"touch" => {
            let Some(([key, exp, nr], n)) = collect::<3>(toks) else {
                return bad();
            };
            let noreply = match (n, nr) {
                (2, _) => false,
                (3, b"noreply") => true,
                _ => return bad(),
            };
            if key.len() > MAX_KEY_LEN {
                return bad();
            }
            let Some(exptime) = parse_i64(exp) else {
                return invalid(reply::BAD_EXPTIME, line_len);
            };
            ok(Request::Touch {
                key,
                exptime,
                noreply,
            })
        }
        b"flush_all" => {
            let Some(([a, b], n)) = collect::<2>(toks) else {
                return bad();
            };
            let (delay, noreply) = match (n, a, b) {
                (0, _, _) => (Some(0), false),
                (1, b"noreply", _) => (Some(0), true),
                (1, d, _) => (parse_i64(d), false),
                (2, d, b"noreply") => (parse_i64(d), true),
                _ => (None, false),
            };
            match delay {
                Some(delay) => ok(Request::FlushAll { delay, noreply }),
                None => bad(),
            }
        }
        b"stats" => {
            let arg = trim_spaces(toks.raw);
            ok(Request::Stats {
                arg: (!arg.is_empty()).then_some(arg),
            })
        }
        b"verbosity" => {
            let Some(([level, nr], n)) = collect::<2>(toks) else {
                return bad();
            };
            let noreply = match (n, nr) {
                (1, _) => false,
                (2, b"noreply") => true,
                _ => return bad(),
            };
            if parse_u32(level).is_none() {
                return bad();
            }
            ok(Request::Verbosity { noreply })
        }
        // memcached 1.6 ignores whatever follows `version` and `quit`.
        b"version" => ok(Request::Version),
        b"quit" => ok(Request::Quit),
        b"unlock_all" => {
            if toks.next().is_some() {
                return bad();
            }
            ok(Request::UnlockAll)
        }
        b"lock" | b"unlock" | b"lock_token" => {
            let Some(([key], 1)) = collect::<1>(toks) else {
                return bad();
            };
            if key.len() > MAX_KEY_LEN {
                return bad();
            }
            match cmd {
                b"lock" => ok(Request::Lock { key }),
                b"unlock" => ok(Request::Unlock { key }),
                _ => ok(Request::LockToken { key }),
            }
        }
        b"keys" => {
            // At most one prefix, no longer than a key (a longer one could match nothing).
            let Some(([prefix], n)) = collect::<1>(toks) else {
                return bad();
            };
            if n > 1 || prefix.len() > MAX_KEY_LEN {
                return bad();
            }
            ok(Request::Keys { prefix })
        }
        _ => invalid(reply::ERROR, line_len),
    }
}

/// The keys region of a get/gat line: at least one key, none over 250 bytes.
fn retrieval_keys(raw: &[u8]) -> Option<Keys<'_>> {
    let keys = Keys {
        raw: trim_spaces(raw),
    };
    let mut n = 0usize;
    for k in keys {
        if k.len() > MAX_KEY_LEN {
            return None;
        }
        n += 1;
    }
    (n > 0).then_some(keys)
}

/// `<cmd> <key> <flags> <exptime> <bytes> [<cas unique>] [noreply]\r\n<data>\r\n`.
///
/// Once `<bytes>` is a valid length, every error swallows the data block too (skip = line +
/// bytes + 2): the client is about to send it whatever we answer, and parsing it as commands
/// would only add a second, confusing error (memcached does that for bad keys and numbers; it
/// swallows only for too-large values). With a wrong token count or a bad `<bytes>` there is no
/// length to trust, so only the line is skipped, as memcached.
fn parse_store<'a>(
    cmd: StoreCmd,
    toks: Keys<'a>,
    buf: &'a [u8],
    line_len: usize,
    max_value: usize,
) -> Result<(Request<'a>, usize), ParseError> {
    let want = if cmd == StoreCmd::Cas { 5 } else { 4 };
    let Some((t, n)) = collect::<6>(toks) else {
        return invalid(reply::BAD_FORMAT, line_len);
    };
    if n != want && n != want + 1 {
        return invalid(reply::BAD_FORMAT, line_len);
    }
    let bytes = parse_i64(t[3])
        .and_then(|b| usize::try_from(b).ok())
        .filter(|&b| b <= MAX_DATA_LEN);
    let Some(bytes) = bytes else {
        return invalid(reply::BAD_FORMAT, line_len);
    };
    let data_end = line_len.checked_add(bytes);
    let Some((data_end, total)) = data_end.and_then(|e| Some((e, e.checked_add(2)?))) else {
        return invalid(reply::BAD_FORMAT, line_len);
    };
    let swallow = |reply| invalid(reply, total);
    let key = t[0];
    if key.len() > MAX_KEY_LEN {
        return swallow(reply::BAD_FORMAT);
    }
    let (Some(flags), Some(exptime)) = (parse_u32(t[1]), parse_i64(t[2])) else {
        return swallow(reply::BAD_FORMAT);
    };
    let cas_unique = if cmd == StoreCmd::Cas {
        match parse_u64(t[4]) {
            Some(c) => c,
            None => return swallow(reply::BAD_FORMAT),
        }
    } else {
        0
    };
    let noreply = n == want + 1;
    if noreply && t[want] != b"noreply" {
        return swallow(reply::BAD_FORMAT);
    }
    if bytes > max_value {
        return swallow(reply::TOO_LARGE);
    }
    let (Some(value), Some(end)) = (buf.get(line_len..data_end), buf.get(data_end..total)) else {
        return Err(ParseError::Incomplete);
    };
    // memcached reads <bytes> + 2 into the item, then complains if they do not end in CRLF
    // (complete_nread_ascii): the whole block is consumed either way.
    if end != b"\r\n" {
        return swallow(reply::BAD_DATA_CHUNK);
    }
    Ok((
        Request::Store {
            cmd,
            key,
            flags,
            exptime,
            value,
            cas_unique,
            noreply,
        },
        total,
    ))
}

/// Decimal digits only (no sign, no spaces), as memcached's `safe_strtoull` accepts them.
fn parse_u64(tok: &[u8]) -> Option<u64> {
    if tok.is_empty() {
        return None;
    }
    tok.iter().try_fold(0u64, |v, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        v.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

fn parse_u32(tok: &[u8]) -> Option<u32> {
    u32::try_from(parse_u64(tok)?).ok()
}

/// An optional `-` then decimal digits.
fn parse_i64(tok: &[u8]) -> Option<i64> {
    match tok.split_first() {
        Some((b'-', digits)) => i64::try_from(-i128::from(parse_u64(digits)?)).ok(),
        _ => i64::try_from(parse_u64(tok)?).ok(),
    }
}

#[cfg(test)]
#[path = "text_tests.rs"]
mod tests;
