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
/// try_read_command_ascii); the contract keeps that number.
pub const MAX_LINE: usize = 2048;

/// Longest get/gets/gat/gats line, `\n` included: multi-gets carry many keys on one line
/// (memcached lets them grow without bound; the contract caps them at 64 KiB).
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
    /// holdfast's `lock_token KEY` (contract: "Fencing tokens").
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
mod tests {
    use super::*;

    const MAX: usize = 1024 * 1024;

    fn keys(raw: &[u8]) -> Keys<'_> {
        Keys { raw }
    }

    fn store<'a>(cmd: StoreCmd, key: &'a [u8], value: &'a [u8]) -> Request<'a> {
        Request::Store {
            cmd,
            key,
            flags: 0,
            exptime: 0,
            value,
            cas_unique: 0,
            noreply: false,
        }
    }

    fn parse_fresh(buf: &[u8]) -> Result<(Request<'_>, usize), ParseError> {
        let mut scanned = 0;
        parse(buf, &mut scanned, MAX)
    }

    fn long_key(n: usize) -> Vec<u8> {
        vec![b'k'; n]
    }

    /// Every command in its valid forms, with the request it must parse to.
    fn valid_cases() -> Vec<(Vec<u8>, Request<'static>)> {
        use Request::*;
        use StoreCmd::*;
        let k250: &'static [u8] = Box::leak(long_key(250).into_boxed_slice());
        let mut get250 = b"get ".to_vec();
        get250.extend_from_slice(k250);
        get250.extend_from_slice(b"\r\n");
        let mut set250 = b"set ".to_vec();
        set250.extend_from_slice(k250);
        set250.extend_from_slice(b" 0 0 1\r\nx\r\n");
        let keys250 = [&b"keys "[..], k250, b"\r\n"].concat();
        vec![
            (
                b"get foo\r\n".to_vec(),
                Get {
                    keys: keys(b"foo"),
                    cas: false,
                },
            ),
            (
                b"get foo\n".to_vec(),
                Get {
                    keys: keys(b"foo"),
                    cas: false,
                },
            ),
            (
                b"gets a b  c\r\n".to_vec(),
                Get {
                    keys: keys(b"a b  c"),
                    cas: true,
                },
            ),
            (
                b"  get   foo  bar  \r\n".to_vec(),
                Get {
                    keys: keys(b"foo  bar"),
                    cas: false,
                },
            ),
            (
                get250,
                Get {
                    keys: keys(k250),
                    cas: false,
                },
            ),
            (
                b"gat 100 foo bar\r\n".to_vec(),
                Gat {
                    exptime: 100,
                    keys: keys(b"foo bar"),
                    cas: false,
                },
            ),
            (
                b"gats -1 foo\r\n".to_vec(),
                Gat {
                    exptime: -1,
                    keys: keys(b"foo"),
                    cas: true,
                },
            ),
            (
                b"set k 0 0 5\r\nhello\r\n".to_vec(),
                store(Set, b"k", b"hello"),
            ),
            (
                b"set k 0 0 5\nhello\r\n".to_vec(),
                store(Set, b"k", b"hello"),
            ),
            (b"set k 0 0 0\r\n\r\n".to_vec(), store(Set, b"k", b"")),
            (
                b"set k 0 0 4\r\na\r\nb\r\n".to_vec(),
                store(Set, b"k", b"a\r\nb"),
            ),
            (set250, store(Set, k250, b"x")),
            (
                b"set k 4294967295 -5 3 noreply\r\nabc\r\n".to_vec(),
                Store {
                    cmd: Set,
                    key: b"k",
                    flags: u32::MAX,
                    exptime: -5,
                    value: b"abc",
                    cas_unique: 0,
                    noreply: true,
                },
            ),
            (b"add k 0 0 1\r\na\r\n".to_vec(), store(Add, b"k", b"a")),
            (
                b"replace k 0 0 1\r\na\r\n".to_vec(),
                store(Replace, b"k", b"a"),
            ),
            (
                b"append k 0 0 1\r\na\r\n".to_vec(),
                store(Append, b"k", b"a"),
            ),
            (
                b"prepend k 0 0 1\r\na\r\n".to_vec(),
                store(Prepend, b"k", b"a"),
            ),
            (
                b"cas k 7 9223372036854775807 2 18446744073709551615\r\nab\r\n".to_vec(),
                Store {
                    cmd: Cas,
                    key: b"k",
                    flags: 7,
                    exptime: i64::MAX,
                    value: b"ab",
                    cas_unique: u64::MAX,
                    noreply: false,
                },
            ),
            (
                b"cas k 0 -9223372036854775808 1 5 noreply\r\na\r\n".to_vec(),
                Store {
                    cmd: Cas,
                    key: b"k",
                    flags: 0,
                    exptime: i64::MIN,
                    value: b"a",
                    cas_unique: 5,
                    noreply: true,
                },
            ),
            (
                b"delete k\r\n".to_vec(),
                Delete {
                    key: b"k",
                    noreply: false,
                },
            ),
            (
                b"delete k 0\r\n".to_vec(),
                Delete {
                    key: b"k",
                    noreply: false,
                },
            ),
            (
                b"delete k noreply\r\n".to_vec(),
                Delete {
                    key: b"k",
                    noreply: true,
                },
            ),
            (
                b"delete k 0 noreply\r\n".to_vec(),
                Delete {
                    key: b"k",
                    noreply: true,
                },
            ),
            (
                b"incr k 5\r\n".to_vec(),
                Incr {
                    key: b"k",
                    delta: 5,
                    noreply: false,
                },
            ),
            (
                b"decr k 18446744073709551615 noreply\r\n".to_vec(),
                Decr {
                    key: b"k",
                    delta: u64::MAX,
                    noreply: true,
                },
            ),
            (
                b"touch k 10\r\n".to_vec(),
                Touch {
                    key: b"k",
                    exptime: 10,
                    noreply: false,
                },
            ),
            (
                b"touch k -1 noreply\r\n".to_vec(),
                Touch {
                    key: b"k",
                    exptime: -1,
                    noreply: true,
                },
            ),
            (
                b"flush_all\r\n".to_vec(),
                FlushAll {
                    delay: 0,
                    noreply: false,
                },
            ),
            (
                b"flush_all 10\r\n".to_vec(),
                FlushAll {
                    delay: 10,
                    noreply: false,
                },
            ),
            (
                b"flush_all noreply\r\n".to_vec(),
                FlushAll {
                    delay: 0,
                    noreply: true,
                },
            ),
            (
                b"flush_all 10 noreply\r\n".to_vec(),
                FlushAll {
                    delay: 10,
                    noreply: true,
                },
            ),
            (b"stats\r\n".to_vec(), Stats { arg: None }),
            (
                b"stats settings\r\n".to_vec(),
                Stats {
                    arg: Some(b"settings"),
                },
            ),
            (
                b"stats detail dump \r\n".to_vec(),
                Stats {
                    arg: Some(b"detail dump"),
                },
            ),
            (b"version\r\n".to_vec(), Version),
            (b"verbosity 1\r\n".to_vec(), Verbosity { noreply: false }),
            (
                b"verbosity 1 noreply\r\n".to_vec(),
                Verbosity { noreply: true },
            ),
            (b"quit\r\n".to_vec(), Quit),
            (b"version foo bar\r\n".to_vec(), Version),
            (b"version noreply\r\n".to_vec(), Version),
            (b"quit now\r\n".to_vec(), Quit),
            (b"lock k\r\n".to_vec(), Lock { key: b"k" }),
            (b"unlock k\r\n".to_vec(), Unlock { key: b"k" }),
            (b"unlock_all\r\n".to_vec(), UnlockAll),
            (b"lock_token k\r\n".to_vec(), LockToken { key: b"k" }),
            (b"keys\r\n".to_vec(), Request::Keys { prefix: b"" }),
            (b"keys   \r\n".to_vec(), Request::Keys { prefix: b"" }),
            (
                b"keys user:\r\n".to_vec(),
                Request::Keys { prefix: b"user:" },
            ),
            (
                b"keys  user: \n".to_vec(),
                Request::Keys { prefix: b"user:" },
            ),
            (keys250, Request::Keys { prefix: k250 }),
        ]
    }

    /// Malformed requests: (input, max_value, reply, skip).
    fn invalid_cases() -> Vec<(Vec<u8>, usize, &'static [u8], usize)> {
        use reply::*;
        let k251 = long_key(251);
        let line = |parts: &[&[u8]]| parts.concat();
        let set251 = line(&[b"set ", &k251, b" 0 0 5\r\nhello\r\n"]);
        let set251_len = set251.len();
        let get251 = line(&[b"get a ", &k251, b"\r\n"]);
        let get251_len = get251.len();
        let del251 = line(&[b"delete ", &k251, b"\r\n"]);
        let del251_len = del251.len();
        let unlock251 = line(&[b"unlock ", &k251, b"\r\n"]);
        let unlock251_len = unlock251.len();
        let keys251 = line(&[b"keys ", &k251, b"\r\n"]);
        let keys251_len = keys251.len();
        vec![
            (keys251, MAX, BAD_FORMAT, keys251_len),
            (b"keys a b\r\n".to_vec(), MAX, BAD_FORMAT, 10),
            (b"KEYS\r\n".to_vec(), MAX, ERROR, 6),
            (b"bogus\r\n".to_vec(), MAX, ERROR, 7),
            (b"GET foo\r\n".to_vec(), MAX, ERROR, 9),
            (b"\r\n".to_vec(), MAX, ERROR, 2),
            (b"\n".to_vec(), MAX, ERROR, 1),
            (b"   \r\n".to_vec(), MAX, ERROR, 5),
            (b"mg foo v\r\n".to_vec(), MAX, ERROR, 10),
            (b"get\r\n".to_vec(), MAX, BAD_FORMAT, 5),
            (b"get   \r\n".to_vec(), MAX, BAD_FORMAT, 8),
            (get251, MAX, BAD_FORMAT, get251_len),
            (b"gat 10\r\n".to_vec(), MAX, BAD_FORMAT, 8),
            (b"gat\r\n".to_vec(), MAX, BAD_FORMAT, 5),
            (b"gat x foo\r\n".to_vec(), MAX, BAD_EXPTIME, 11),
            (
                b"gats 9223372036854775808 foo\r\n".to_vec(),
                MAX,
                BAD_EXPTIME,
                30,
            ),
            // Storage: the data block is swallowed once <bytes> is a valid length.
            (set251, MAX, BAD_FORMAT, set251_len),
            (
                b"set k 4294967296 0 5\r\nhello\r\n".to_vec(),
                MAX,
                BAD_FORMAT,
                29,
            ),
            (b"set k -1 0 5\r\nhello\r\n".to_vec(), MAX, BAD_FORMAT, 21),
            (b"set k 0 x 5\r\nhello\r\n".to_vec(), MAX, BAD_FORMAT, 20),
            (
                b"set k 0 0 5 bogus\r\nhello\r\n".to_vec(),
                MAX,
                BAD_FORMAT,
                26,
            ),
            (
                b"cas k 0 0 5 18446744073709551616\r\nhello\r\n".to_vec(),
                MAX,
                BAD_FORMAT,
                41,
            ),
            (b"cas k 0 0 5 -1\r\nhello\r\n".to_vec(), MAX, BAD_FORMAT, 23),
            // Storage: no trustworthy length, only the line goes.
            (b"set k 0 0 -1\r\n".to_vec(), MAX, BAD_FORMAT, 14),
            (b"set k 0 0 abc\r\n".to_vec(), MAX, BAD_FORMAT, 15),
            (b"set k 0 0\r\n".to_vec(), MAX, BAD_FORMAT, 11),
            (
                b"set k 0 0 5 noreply extra\r\nhello\r\n".to_vec(),
                MAX,
                BAD_FORMAT,
                27,
            ),
            (b"cas k 0 0 5\r\nhello\r\n".to_vec(), MAX, BAD_FORMAT, 13),
            (
                b"set k 0 0 2147483645\r\n".to_vec(),
                MAX,
                TOO_LARGE,
                22 + 2147483645 + 2,
            ),
            (b"set k 0 0 2147483646\r\n".to_vec(), MAX, BAD_FORMAT, 22),
            (b"set k 0 0 5\r\n".to_vec(), 4, TOO_LARGE, 13 + 7),
            (b"set k 0 0 5 noreply\r\n".to_vec(), 4, b"", 21 + 7),
            (b"set k 0 0 5\r\nhelloXY".to_vec(), MAX, BAD_DATA_CHUNK, 20),
            (
                b"set k 0 0 5\r\nhello\n\n".to_vec(),
                MAX,
                BAD_DATA_CHUNK,
                20,
            ),
            (b"set k 0 0 5 noreply\r\nhelloXY".to_vec(), MAX, b"", 28),
            (b"delete\r\n".to_vec(), MAX, BAD_FORMAT, 8),
            (b"delete k 1\r\n".to_vec(), MAX, DELETE_USAGE, 12),
            (b"delete k 0 0\r\n".to_vec(), MAX, DELETE_USAGE, 14),
            (b"delete k noreply 0\r\n".to_vec(), MAX, DELETE_USAGE, 20),
            (b"delete k 0 noreply x\r\n".to_vec(), MAX, DELETE_USAGE, 22),
            (del251, MAX, BAD_FORMAT, del251_len),
            (b"incr k\r\n".to_vec(), MAX, BAD_FORMAT, 8),
            (b"incr k abc\r\n".to_vec(), MAX, BAD_DELTA, 12),
            (b"decr k -1\r\n".to_vec(), MAX, BAD_DELTA, 11),
            (
                b"incr k 18446744073709551616\r\n".to_vec(),
                MAX,
                BAD_DELTA,
                29,
            ),
            (b"incr k 1 bogus\r\n".to_vec(), MAX, BAD_FORMAT, 16),
            (b"touch k\r\n".to_vec(), MAX, BAD_FORMAT, 9),
            (b"touch k abc\r\n".to_vec(), MAX, BAD_EXPTIME, 13),
            (
                b"touch k 9223372036854775808\r\n".to_vec(),
                MAX,
                BAD_EXPTIME,
                29,
            ),
            (b"flush_all abc\r\n".to_vec(), MAX, BAD_FORMAT, 15),
            (b"flush_all 1 2\r\n".to_vec(), MAX, BAD_FORMAT, 15),
            (b"flush_all noreply 1\r\n".to_vec(), MAX, BAD_FORMAT, 21),
            (b"flush_all 1 noreply x\r\n".to_vec(), MAX, BAD_FORMAT, 23),
            (b"verbosity\r\n".to_vec(), MAX, BAD_FORMAT, 11),
            (b"verbosity x\r\n".to_vec(), MAX, BAD_FORMAT, 13),
            (b"verbosity noreply\r\n".to_vec(), MAX, b"", 19),
            (b"verbosity 4294967296\r\n".to_vec(), MAX, BAD_FORMAT, 22),
            (b"unlock_all k\r\n".to_vec(), MAX, BAD_FORMAT, 14),
            (b"lock\r\n".to_vec(), MAX, BAD_FORMAT, 6),
            (b"lock a b\r\n".to_vec(), MAX, BAD_FORMAT, 10),
            (unlock251, MAX, BAD_FORMAT, unlock251_len),
        ]
    }

    #[test]
    fn every_command_parses_and_consumes_exactly_its_bytes() {
        for (input, want) in valid_cases() {
            let mut scanned = 0;
            let got = parse(&input, &mut scanned, MAX);
            assert_eq!(
                got,
                Ok((want, input.len())),
                "{:?}",
                String::from_utf8_lossy(&input)
            );
            assert_eq!(scanned, 0, "reset after a request");
        }
    }

    #[test]
    fn keys_iterator_yields_each_key_skipping_runs_of_spaces() {
        let got: Vec<&[u8]> = keys(b"a  bb   ccc").collect();
        assert_eq!(got, [&b"a"[..], b"bb", b"ccc"]);
        let got: Vec<&[u8]> = keys(b"  x  ").collect();
        assert_eq!(got, [&b"x"[..]]);
        assert_eq!(keys(b"").next(), None);
        assert_eq!(keys(b"    ").next(), None);
        let Ok((Request::Get { keys: k, .. }, _)) = parse_fresh(b"get  one two  three \r\n") else {
            panic!("get did not parse");
        };
        assert_eq!(k.collect::<Vec<_>>(), [&b"one"[..], b"two", b"three"]);
    }

    #[test]
    fn every_split_point_of_every_request_is_incomplete() {
        for (input, want) in valid_cases() {
            // Fresh `scanned` for every prefix.
            for i in 0..input.len() {
                assert_eq!(
                    parse_fresh(&input[..i]),
                    Err(ParseError::Incomplete),
                    "{:?} cut at {i}",
                    String::from_utf8_lossy(&input)
                );
            }
            // One growing buffer with `scanned` carried over, as the glue does.
            let mut scanned = 0;
            for i in 0..input.len() {
                assert_eq!(
                    parse(&input[..i], &mut scanned, MAX),
                    Err(ParseError::Incomplete)
                );
                assert!(scanned <= i);
            }
            assert_eq!(parse(&input, &mut scanned, MAX), Ok((want, input.len())));
            assert_eq!(scanned, 0);
        }
    }

    #[test]
    fn pipelined_requests_parse_back_to_back() {
        let cases = valid_cases();
        let all: Vec<u8> = cases.iter().flat_map(|(b, _)| b.iter().copied()).collect();
        let mut pos = 0;
        let mut scanned = 0;
        for (input, want) in &cases {
            let (got, n) = parse(&all[pos..], &mut scanned, MAX).expect("pipelined request");
            assert_eq!((got, n), (*want, input.len()));
            pos += n;
        }
        assert_eq!(pos, all.len());
        assert_eq!(
            parse(&all[pos..], &mut scanned, MAX),
            Err(ParseError::Incomplete)
        );
    }

    #[test]
    fn malformed_requests_answer_memcached_errors_and_skip() {
        for (input, max_value, reply, skip) in invalid_cases() {
            let mut scanned = 0;
            assert_eq!(
                parse(&input, &mut scanned, max_value),
                Err(ParseError::Invalid { reply, skip }),
                "{:?}",
                String::from_utf8_lossy(&input)
            );
            assert_eq!(scanned, 0);
        }
    }

    #[test]
    fn garbage_then_valid_request_parses_after_skipping() {
        let next = b"get foo\r\n";
        for (input, max_value, reply, skip) in invalid_cases() {
            let mut buf = input.clone();
            // Pad a swallowed block that has not arrived yet, as the caller would drop it.
            if skip > buf.len() && skip - buf.len() < 64 {
                buf.resize(skip, b'z');
            }
            if skip > buf.len() {
                continue; // the 2 GiB swallow: checked in the table above
            }
            buf.extend_from_slice(next);
            let mut scanned = 0;
            assert_eq!(
                parse(&buf, &mut scanned, max_value),
                Err(ParseError::Invalid { reply, skip })
            );
            // Leftover bytes of a request whose length could not be trusted (e.g. the data
            // block after a bad `<bytes>`) come out as more errors, never as requests.
            let mut pos = skip;
            loop {
                match parse(&buf[pos..], &mut scanned, max_value) {
                    Err(ParseError::Invalid { skip, .. }) => pos += skip,
                    got => {
                        assert_eq!(
                            got,
                            Ok((
                                Request::Get {
                                    keys: keys(b"foo"),
                                    cas: false
                                },
                                next.len()
                            )),
                            "after {:?}",
                            String::from_utf8_lossy(&input)
                        );
                        break;
                    }
                }
            }
        }
    }

    #[test]
    fn too_large_value_is_refused_before_the_data_arrives() {
        let buf = b"set k 0 0 100\r\n";
        let mut scanned = 0;
        assert_eq!(
            parse(buf, &mut scanned, 99),
            Err(ParseError::Invalid {
                reply: reply::TOO_LARGE,
                skip: buf.len() + 102
            })
        );
        // Exactly max_value is fine (and waits for its data).
        assert_eq!(parse(buf, &mut scanned, 100), Err(ParseError::Incomplete));
    }

    #[test]
    fn errors_are_silent_with_noreply_as_memcached() {
        // memcached's set_noreply_maybe: silent when the command takes noreply, its token count
        // is accepted and the last token is noreply.
        for input in [
            &b"set k 0 0 5 noreply\r\nhelloXY"[..],
            b"incr k x noreply\r\n",
            b"touch k x noreply\r\n",
            b"verbosity noreply\r\n",
            b"delete k 1 noreply\r\n",
            b"cas k 0 0 1 x noreply\r\nv\r\n",
        ] {
            match parse_fresh(input) {
                Err(ParseError::Invalid { reply, .. }) => assert_eq!(reply, b"", "{input:?}"),
                other => panic!("{other:?}"),
            }
        }
        // Answered: unknown command, a token count memcached refuses, noreply not last.
        for input in [
            &b"bogus noreply\r\n"[..],
            b"set k 0 0 5 1 noreply\r\nhello\r\n",
            b"incr k noreply x\r\n",
            b"lock a noreply\r\n",
        ] {
            match parse_fresh(input) {
                Err(ParseError::Invalid { reply, .. }) => assert!(!reply.is_empty(), "{input:?}"),
                other => panic!("{input:?}: {other:?}"),
            }
        }
    }

    fn line_of(prefix: &[u8], total: usize) -> Vec<u8> {
        // `prefix` then keys of 'k' separated by spaces, "\r\n"-terminated, `total` bytes long.
        let mut v = prefix.to_vec();
        while v.len() < total - 2 {
            v.push(if v.len().is_multiple_of(200) {
                b' '
            } else {
                b'k'
            });
        }
        if v.last() == Some(&b' ') {
            v.pop();
            v.push(b'k');
        }
        v.extend_from_slice(b"\r\n");
        assert_eq!(v.len(), total);
        v
    }

    #[test]
    fn ordinary_line_may_be_2048_bytes_not_more() {
        let ok = line_of(b"stats ", MAX_LINE);
        assert!(matches!(
            parse_fresh(&ok),
            Ok((Request::Stats { .. }, MAX_LINE))
        ));
        let long = line_of(b"stats ", MAX_LINE + 1);
        assert_eq!(
            parse_fresh(&long),
            Err(ParseError::Fatal {
                reply: reply::LINE_TOO_LONG
            })
        );
        let mut scanned = 0;
        assert_eq!(
            parse(&long[..MAX_LINE - 1], &mut scanned, MAX),
            Err(ParseError::Incomplete)
        );
        assert_eq!(
            parse(&long[..MAX_LINE], &mut scanned, MAX),
            Err(ParseError::Fatal {
                reply: reply::LINE_TOO_LONG
            })
        );
        assert_eq!(scanned, 0);
        // A set line is an ordinary line too.
        let junk = vec![b'x'; 5000];
        assert_eq!(
            parse_fresh(&junk),
            Err(ParseError::Fatal {
                reply: reply::LINE_TOO_LONG
            })
        );
    }

    #[test]
    fn retrieval_line_may_be_64_kib_not_more() {
        for prefix in [&b"get "[..], b"gets ", b"gat 0 ", b"gats 0 ", b"   get "] {
            let ok = line_of(prefix, MAX_RETRIEVAL_LINE);
            let got = parse_fresh(&ok);
            assert!(matches!(got, Ok((_, MAX_RETRIEVAL_LINE))), "{got:?}");
            let long = line_of(prefix, MAX_RETRIEVAL_LINE + 1);
            assert_eq!(
                parse_fresh(&long),
                Err(ParseError::Fatal {
                    reply: reply::LINE_TOO_LONG
                })
            );
            assert_eq!(parse_fresh(&long[..5000]), Err(ParseError::Incomplete));
        }
        // "getx" is not a retrieval command: the 2048 cap applies.
        let getx = line_of(b"getx ", 5000);
        assert_eq!(
            parse_fresh(&getx),
            Err(ParseError::Fatal {
                reply: reply::LINE_TOO_LONG
            })
        );
        // More than 100 leading spaces do not count as a retrieval command (memcached's rule).
        let mut spaced = vec![b' '; 101];
        spaced.extend_from_slice(&line_of(b"get ", 3000));
        assert_eq!(
            parse_fresh(&spaced),
            Err(ParseError::Fatal {
                reply: reply::LINE_TOO_LONG
            })
        );
    }

    #[test]
    fn one_byte_at_a_time_scans_each_byte_once() {
        let line = line_of(b"get ", 60_000);
        NEWLINE_SEARCH_WORK.with(|w| w.set(0));
        let mut scanned = 0;
        for i in 0..line.len() {
            assert_eq!(
                parse(&line[..i], &mut scanned, MAX),
                Err(ParseError::Incomplete)
            );
            assert_eq!(scanned, i, "scanned is how far the search got");
        }
        assert!(matches!(parse(&line, &mut scanned, MAX), Ok((_, 60_000))));
        assert_eq!(scanned, 0);
        let work = NEWLINE_SEARCH_WORK.with(|w| w.get());
        assert_eq!(work, line.len(), "every byte examined exactly once");
    }

    #[test]
    fn scanned_stops_at_the_newline_while_the_data_block_arrives() {
        let req = b"set k 0 0 10\r\n0123456789\r\n";
        let nl = 13;
        let mut scanned = 0;
        NEWLINE_SEARCH_WORK.with(|w| w.set(0));
        for i in 0..req.len() {
            assert_eq!(
                parse(&req[..i], &mut scanned, MAX),
                Err(ParseError::Incomplete)
            );
            assert_eq!(scanned, i.min(nl));
        }
        assert!(matches!(parse(req, &mut scanned, MAX), Ok((_, 26))));
        // The newline itself is re-examined once per call while the data arrives.
        let work = NEWLINE_SEARCH_WORK.with(|w| w.get());
        assert!(work <= req.len() + req.len(), "work {work}");
    }

    #[test]
    fn scanned_beyond_the_buffer_is_treated_as_zero() {
        let mut scanned = 1000;
        assert!(matches!(
            parse(b"version\r\n", &mut scanned, MAX),
            Ok((Request::Version, 9))
        ));
        assert_eq!(scanned, 0);
    }

    #[test]
    fn numbers_at_overflow_boundaries() {
        assert_eq!(parse_u32(b"4294967295"), Some(u32::MAX));
        assert_eq!(parse_u32(b"4294967296"), None);
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b"99999999999999999999999999999999"), None);
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"9223372036854775808"), None);
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_i64(b"-9223372036854775809"), None);
        assert_eq!(parse_i64(b"-0"), Some(0));
        for bad in [&b""[..], b"-", b"+1", b"1a", b" 1", b"--1", b"0x10"] {
            assert_eq!(parse_i64(bad), None, "{bad:?}");
            assert_eq!(parse_u64(bad), None, "{bad:?}");
        }
        assert_eq!(parse_u64(b"-1"), None);
    }

    use crate::rng::Rng;

    fn check_no_panic(buf: &[u8], scanned: &mut usize, max_value: usize) {
        match parse(buf, scanned, max_value) {
            Ok((_, n)) => assert!(n >= 1 && n <= buf.len() && *scanned == 0),
            Err(ParseError::Invalid { skip, reply }) => {
                // An empty reply only where a trailing noreply silences it.
                let line_end = buf.iter().position(|&b| b == b'\n').unwrap_or(buf.len());
                let line = buf[..line_end]
                    .strip_suffix(b"\r")
                    .unwrap_or(&buf[..line_end]);
                assert!(skip >= 1 && *scanned == 0);
                assert_eq!(reply.is_empty(), noreply_silences(line), "{buf:?}");
            }
            Err(ParseError::Incomplete) => assert!(*scanned <= buf.len()),
            Err(ParseError::Fatal { .. }) => assert_eq!(*scanned, 0),
        }
    }

    #[test]
    fn random_bytes_and_mutations_never_panic() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let alphabet = b"getsadcrplinuxomfh_0123456789 -\r\n\x00\xffk";
        let seeds: Vec<Vec<u8>> = valid_cases().into_iter().map(|(b, _)| b).collect();
        for round in 0..20_000 {
            let mut buf: Vec<u8> = if round % 2 == 0 {
                let len = rng.index(64);
                (0..len)
                    .map(|_| alphabet[rng.index(alphabet.len())])
                    .collect()
            } else {
                seeds[rng.index(seeds.len())].clone()
            };
            for _ in 0..rng.index(4) {
                match rng.index(4) {
                    0 if !buf.is_empty() => {
                        let i = rng.index(buf.len());
                        buf[i] = alphabet[rng.index(alphabet.len())];
                    }
                    1 => {
                        let i = rng.index(buf.len() + 1);
                        buf.insert(i, alphabet[rng.index(alphabet.len())]);
                    }
                    2 if !buf.is_empty() => {
                        buf.remove(rng.index(buf.len()));
                    }
                    _ => buf.truncate(rng.index(buf.len() + 1)),
                }
            }
            let max_value = rng.index(16);
            let mut scanned = 0;
            check_no_panic(&buf, &mut scanned, max_value);
            // Also grow it byte by byte with `scanned` carried over.
            let mut scanned = 0;
            for i in 0..=buf.len() {
                check_no_panic(&buf[..i], &mut scanned, max_value);
            }
        }
    }
}
