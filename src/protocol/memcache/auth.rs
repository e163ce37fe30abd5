//! memcached authentication (`--memcache-auth-file`), on the worker side: what a memcached
//! connection may send before it has authenticated, and the SASL requests after that.
//!
//! A connection of the memcache listener starts unauthenticated when users are configured
//! ([`super::Conn::authenticated`]); until it authenticates, every request is parsed here, not by
//! the usual parsers, and nothing reaches the owner. memcached 1.6's answers (proto_text.c
//! `try_read_command_asciiauth`, proto_bin.c's SASL handling):
//!
//! | before authentication | answer |
//! |---|---|
//! | binary SASL list mechanisms (0x20) | status 0, body `PLAIN` |
//! | binary SASL auth or step (0x21, 0x22), mechanism `PLAIN`, value `[authzid]\0user\0password` | status 0, body `Authenticated`; else 0x0020 `Auth failure.` (the connection stays open) |
//! | binary Version | the version, as after authentication |
//! | any other binary request | status 0x0020 `Auth failure.`, then the connection is closed |
//! | text `set <key> <flags> <exptime> <bytes>` + data `user password` | `STORED`; else `CLIENT_ERROR authentication failure` |
//! | that `set` with `<bytes>` over 16384 | `CLIENT_ERROR auth token too long` (the line only is consumed) |
//! | its data block not ended by `\r\n` | `CLIENT_ERROR bad command line termination` |
//! | its data without a space | `CLIENT_ERROR bad authentication token format` |
//! | text `quit` | the connection is closed |
//! | any other text line | `CLIENT_ERROR unauthenticated` |
//! | no `\n` within 2048 bytes | the connection is closed |
//!
//! After authentication the connection is served as any other; a SASL auth or step again
//! starts over (a wrong password leaves it unauthenticated, as memcached does), and a text
//! `set` is a `set`.

use super::wire::binary::{self, opcode, status, HEADER_LEN};
use super::wire::text::MAX_LINE;
use super::wire::BINARY_REQUEST_MAGIC;
use crate::server::msg::{Batch, ConnId};
use crate::server::worker::conn::Conn;
use crate::server::worker::decode::{Cx, Step};
use crate::tls::Users;

/// SASL opcodes (memcached's protocol_binary.h).
pub const SASL_LIST_MECHS: u8 = 0x20;
pub const SASL_AUTH: u8 = 0x21;
pub const SASL_STEP: u8 = 0x22;

/// The one mechanism offered.
pub const MECHANISMS: &[u8] = b"PLAIN";
/// Longest mechanism name memcached takes (`MAX_SASL_MECH_LEN`).
const MAX_MECH_LEN: usize = 32;
/// Largest text auth token and SASL value (memcached's `MAX_AUTH_REQ_LEN`).
pub const MAX_AUTH_DATA: usize = 16384;

pub const AUTHENTICATED: &[u8] = b"Authenticated";
pub const AUTH_FAILURE: &[u8] = b"Auth failure.";

/// Text answers, CRLF included.
pub mod reply {
    pub const UNAUTHENTICATED: &[u8] = b"CLIENT_ERROR unauthenticated\r\n";
    pub const FAILURE: &[u8] = b"CLIENT_ERROR authentication failure\r\n";
    pub const TOO_LONG: &[u8] = b"CLIENT_ERROR auth token too long\r\n";
    pub const BAD_TERMINATION: &[u8] = b"CLIENT_ERROR bad command line termination\r\n";
    pub const BAD_FORMAT: &[u8] = b"CLIENT_ERROR bad authentication token format\r\n";
    pub const STORED: &[u8] = b"STORED\r\n";
}

/// One request of a connection that has not authenticated yet.
#[cold]
pub fn unauthenticated(
    conn: &mut Conn,
    buf: &[u8],
    id: ConnId,
    cx: Cx<'_>,
    batch: &mut Batch,
) -> Step {
    let Some(users) = cx.secrets.memcache_users.as_deref() else {
        // No users (cannot happen: the file is fixed at start and a reload that fails keeps
        // the old users): nothing to authenticate against.
        conn.authenticated = true;
        return Step::Consumed(0);
    };
    if buf[0] & 0x80 != 0 {
        binary_request(conn, buf, id, users, batch)
    } else {
        text_request(conn, buf, id, users, batch)
    }
}

fn binary_request(
    conn: &mut Conn,
    buf: &[u8],
    id: ConnId,
    users: &Users,
    batch: &mut Batch,
) -> Step {
    if buf[0] != BINARY_REQUEST_MAGIC {
        return Step::Fatal;
    }
    if buf.len() < HEADER_LEN {
        return Step::Incomplete;
    }
    let op = buf[1];
    let opaque = u32::from_be_bytes([buf[12], buf[13], buf[14], buf[15]]);
    if !matches!(
        op,
        SASL_LIST_MECHS | SASL_AUTH | SASL_STEP | opcode::VERSION
    ) {
        // Decided from the header: the body is never waited for.
        respond(
            conn,
            id,
            batch,
            op,
            status::AUTH_ERROR,
            opaque,
            AUTH_FAILURE,
            true,
        );
        return Step::Fatal;
    }
    match binary::parse(buf, MAX_AUTH_DATA) {
        Ok((req, n)) => {
            if req.opcode == opcode::VERSION {
                let v = super::VERSION_REPLY;
                let version = &v[b"VERSION ".len()..v.len() - 2];
                respond(
                    conn,
                    id,
                    batch,
                    op,
                    status::NO_ERROR,
                    opaque,
                    version,
                    false,
                );
            } else if !sasl(conn, &req, id, users, batch) {
                return Step::Fatal;
            }
            Step::Consumed(n)
        }
        Err(binary::ParseError::Incomplete) => Step::Incomplete,
        Err(binary::ParseError::Refuse { .. }) => {
            // A key or value longer than any authentication needs.
            let text = binary::status_text(status::INVALID_ARGUMENTS, false);
            respond(
                conn,
                id,
                batch,
                op,
                status::INVALID_ARGUMENTS,
                opaque,
                text,
                true,
            );
            Step::Fatal
        }
        Err(binary::ParseError::Fatal) => Step::Fatal,
    }
}

/// A SASL request, before or after authentication. Returns false when the connection must be
/// closed (a request of the wrong shape, as memcached's protocol error).
pub fn sasl(
    conn: &mut Conn,
    req: &binary::Request<'_>,
    id: ConnId,
    users: &Users,
    batch: &mut Batch,
) -> bool {
    let (op, opaque) = (req.opcode, req.opaque);
    let invalid = binary::status_text(status::INVALID_ARGUMENTS, false);
    if req.opcode == SASL_LIST_MECHS {
        if !(req.extras.is_empty() && req.key.is_empty() && req.value.is_empty()) {
            respond(
                conn,
                id,
                batch,
                op,
                status::INVALID_ARGUMENTS,
                opaque,
                invalid,
                true,
            );
            return false;
        }
        respond(
            conn,
            id,
            batch,
            op,
            status::NO_ERROR,
            opaque,
            MECHANISMS,
            false,
        );
        return true;
    }
    debug_assert!(matches!(req.opcode, SASL_AUTH | SASL_STEP));
    if !req.extras.is_empty() || req.key.is_empty() {
        respond(
            conn,
            id,
            batch,
            op,
            status::INVALID_ARGUMENTS,
            opaque,
            invalid,
            true,
        );
        return false;
    }
    if req.key.len() > MAX_MECH_LEN {
        respond(
            conn,
            id,
            batch,
            op,
            status::INVALID_ARGUMENTS,
            opaque,
            invalid,
            false,
        );
        return true;
    }
    // Every attempt starts over: a wrong one leaves the connection unauthenticated.
    conn.authenticated = false;
    let right = req.key == MECHANISMS
        && plain(req.value).is_some_and(|(user, password)| users.check(user, password));
    if right {
        conn.authenticated = true;
        respond(
            conn,
            id,
            batch,
            op,
            status::NO_ERROR,
            opaque,
            AUTHENTICATED,
            false,
        );
    } else {
        respond(
            conn,
            id,
            batch,
            op,
            status::AUTH_ERROR,
            opaque,
            AUTH_FAILURE,
            false,
        );
    }
    true
}

/// A PLAIN message (RFC 4616): `[authzid] NUL authcid NUL passwd`. The authorization identity
/// may be empty or the user's own name (nobody may act as another user).
pub fn plain(value: &[u8]) -> Option<(&[u8], &[u8])> {
    let mut parts = value.splitn(3, |&b| b == 0);
    let authzid = parts.next()?;
    let user = parts.next()?;
    let password = parts.next()?;
    (authzid.is_empty() || authzid == user).then_some((user, password))
}

/// Write one binary response of the worker's own (nothing is in flight before authentication,
/// so it goes straight to the write buffer): built on the stack, never allocated.
#[allow(clippy::too_many_arguments)]
fn respond(
    conn: &mut Conn,
    id: ConnId,
    batch: &mut Batch,
    opcode: u8,
    status: u16,
    opaque: u32,
    body: &[u8],
    close: bool,
) {
    const MAX_BODY: usize = 64;
    debug_assert!(body.len() <= MAX_BODY);
    let body = &body[..body.len().min(MAX_BODY)];
    let mut out = [0u8; HEADER_LEN + MAX_BODY];
    out[0] = binary::BINARY_RESPONSE_MAGIC;
    out[1] = opcode;
    out[6..8].copy_from_slice(&status.to_be_bytes());
    out[8..12].copy_from_slice(&(body.len() as u32).to_be_bytes());
    out[12..16].copy_from_slice(&opaque.to_be_bytes());
    out[HEADER_LEN..HEADER_LEN + body.len()].copy_from_slice(body);
    conn.emit(&out[..HEADER_LEN + body.len()], close, id, batch);
}

fn text_request(conn: &mut Conn, buf: &[u8], id: ConnId, users: &Users, batch: &mut Batch) -> Step {
    let Some(nl) = buf.iter().take(MAX_LINE).position(|&b| b == b'\n') else {
        return if buf.len() >= MAX_LINE {
            Step::Fatal
        } else {
            Step::Incomplete
        };
    };
    let line_len = nl + 1;
    let line = &buf[..nl];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut tokens = line.split(|&b| b == b' ').filter(|t| !t.is_empty());
    let first = tokens.next().unwrap_or_default();
    if first == b"quit" {
        conn.emit(b"", true, id, batch);
        return Step::Fatal;
    }
    // `set <key> <flags> <exptime> <bytes>`: only the length counts (extra tokens are ignored,
    // as memcached ignores them).
    let size = match (first, tokens.nth(3)) {
        (b"set", Some(bytes)) => parse_u32(bytes),
        _ => None,
    };
    let Some(size) = size else {
        conn.emit(reply::UNAUTHENTICATED, false, id, batch);
        return Step::Consumed(line_len);
    };
    let size = size as usize;
    if size > MAX_AUTH_DATA {
        conn.emit(reply::TOO_LONG, false, id, batch);
        return Step::Consumed(line_len);
    }
    let total = line_len + size + 2;
    if buf.len() < total {
        return Step::Incomplete;
    }
    let data = &buf[line_len..total];
    let answer = if &data[size..] != b"\r\n" {
        reply::BAD_TERMINATION
    } else {
        let token = &data[..size];
        match token.iter().position(|&b| b == b' ') {
            None => reply::BAD_FORMAT,
            Some(sp) if users.check(&token[..sp], &token[sp + 1..]) => {
                conn.authenticated = true;
                reply::STORED
            }
            Some(_) => reply::FAILURE,
        }
    };
    conn.emit(answer, false, id, batch);
    Step::Consumed(total)
}

/// A decimal `u32` (digits only).
fn parse_u32(t: &[u8]) -> Option<u32> {
    if t.is_empty() || t.len() > 10 || !t.iter().all(u8::is_ascii_digit) {
        return None;
    }
    t.iter().try_fold(0u32, |n, &d| {
        n.checked_mul(10)?.checked_add(u32::from(d - b'0'))
    })
}

#[cfg(test)]
#[path = "auth_tests.rs"]
mod tests;
