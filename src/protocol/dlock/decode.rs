//! The worker's side of dlock: a Request is checked here (version, access token, type, key
//! count) and goes to the owner as a [`DlockOp`], a refused one as its refusal (in order behind
//! the connection's earlier requests); a frame over the cap closes the connection.
//!
//! A connection speaks the version of its first request: 2 (dlock; absent or 0 mean 2) or 3
//! (the native protocol). A request of the other version is refused with status Version, in
//! the connection's own version.

use super::wire as dl;
use super::{Dlock, DlockKind, DlockOp};
use crate::protocol::Decode;
use crate::server::msg::{Batch, ConnId, Op};
use crate::server::worker::conn::Conn;
use crate::server::worker::decode::{Cx, Step};

impl Decode for Dlock {
    #[inline]
    fn parse(conn: &mut Conn, buf: &[u8], id: ConnId, cx: Cx<'_>, batch: &mut Batch) -> Step {
        let config = cx.config;
        let (body, n) = match dl::parse_frame(buf, config.dlock_max_message) {
            Ok(x) => x,
            Err(dl::FrameError::Incomplete) => return Step::Incomplete,
            Err(dl::FrameError::TooLarge) => return Step::Fatal,
        };
        let req = match dl::decode_request(body) {
            Ok(r) => r,
            Err(reason) => {
                // Bytes that are not a valid protobuf message close the connection, after a
                // General response where the frame was complete. The answer goes through the owner
                // (in order behind earlier requests) with the close.
                let (status, text) = (dl::status::GENERAL, reason);
                let kind = if conn.dlock_version == 3 {
                    DlockKind::NativeRefuse { status, text }
                } else {
                    DlockKind::Refuse { status, text }
                };
                let op = DlockOp { id: None, kind };
                conn.push(id, Op::Dlock(op), batch);
                conn.closing = true;
                return Step::Fatal;
            }
        };
        let version = match req.version {
            None | Some(0) | Some(2) => 2,
            Some(3) => 3,
            _ => 0,
        };
        if conn.dlock_version == 0 && version != 0 {
            conn.dlock_version = version;
        }
        let kind = if version != conn.dlock_version {
            let (status, text) = (dl::status::VERSION, "unsupported version");
            if conn.dlock_version == 3 {
                DlockKind::NativeRefuse { status, text }
            } else {
                DlockKind::Refuse { status, text }
            }
        } else if version == 3 {
            native_kind(&req, cx, batch)
        } else {
            dlock_kind(&req, cx, batch)
        };
        conn.push(id, Op::Dlock(DlockOp { id: req.id, kind }), batch);
        Step::Consumed(n)
    }
}

/// Whether the request carries the access token the listener wants (or it wants none).
fn token_ok(req: &dl::Request<'_>, cx: Cx<'_>) -> bool {
    let Some(token) = &cx.secrets.dlock_token else {
        return true;
    };
    let given = req.access_token.unwrap_or_default();
    req.access_token.is_some() && crate::tls::constant_time_eq(given, token)
}

/// A version-3 request's checks, in this order: access token, type, keys, the native fields'
/// wire types.
fn native_kind(req: &dl::Request<'_>, cx: Cx<'_>, batch: &mut Batch) -> DlockKind {
    use dl::req_type as t;
    let refuse = |status, text| DlockKind::NativeRefuse { status, text };
    if !token_ok(req, cx) {
        return refuse(dl::status::GENERAL, "access denied");
    }
    let ty = match req.req_type {
        Some(ty @ t::PING..=t::CHECK_FENCE) => ty as u8,
        _ => return refuse(dl::status::INVALID_TYPE, "unknown request type"),
    };
    if u64::from(ty) == t::PING {
        return DlockKind::Native {
            ty,
            lock: crate::server::msg::Span::EMPTY,
            key_count: 0,
        };
    }
    let lock = req.lock.unwrap_or_default();
    if lock.key_count == 0 {
        return refuse(dl::status::INVALID_ARGUMENT, "no keys");
    }
    if lock.key_count > cx.config.dlock_max_keys {
        return refuse(dl::status::TOO_MANY_KEYS, "too many keys");
    }
    if dl::decode_native(lock.keys.raw).malformed > 0 {
        return refuse(
            dl::status::INVALID_ARGUMENT,
            "wrong wire type for a known field of lock",
        );
    }
    DlockKind::Native {
        ty,
        lock: batch.arena.push(lock.keys.raw),
        key_count: lock.key_count as u32,
    }
}

/// Checks in this order: version, access token, type, keys.
fn dlock_kind(req: &dl::Request<'_>, cx: Cx<'_>, batch: &mut Batch) -> DlockKind {
    let config = cx.config;
    let refuse = |status, text| DlockKind::Refuse { status, text };
    if !matches!(req.version, None | Some(0) | Some(2)) {
        return refuse(dl::status::VERSION, "unsupported version");
    }
    if !token_ok(req, cx) {
        return refuse(dl::status::GENERAL, "access denied");
    }
    match req.req_type {
        Some(dl::req_type::PING) => DlockKind::Ping,
        Some(t @ (dl::req_type::LOCK | dl::req_type::UNLOCK)) => {
            let lock = req.lock.unwrap_or_default();
            if lock.key_count == 0 {
                return refuse(dl::status::GENERAL, "no keys");
            }
            if lock.key_count > config.dlock_max_keys {
                return refuse(dl::status::TOO_MANY_KEYS, "too many keys");
            }
            let keys = batch.arena.push(lock.keys.raw);
            let key_count = lock.key_count as u32;
            if t == dl::req_type::LOCK {
                DlockKind::Lock {
                    keys,
                    key_count,
                    wait_us: lock.wait_micro,
                    lease_us: lock.release_micro,
                }
            } else {
                DlockKind::Unlock { keys, key_count }
            }
        }
        _ => refuse(dl::status::INVALID_TYPE, "unknown request type"),
    }
}
