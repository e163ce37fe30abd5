//! The worker's side of dlock: a Request is checked here (version, access token, type, key
//! count) and goes to the owner as a [`DlockOp`], a refused one as its refusal (in order behind
//! the connection's earlier requests); a frame over the cap closes the connection.

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
                let op = DlockOp {
                    id: None,
                    kind: DlockKind::Refuse {
                        status: dl::status::GENERAL,
                        text: reason,
                    },
                };
                conn.push(id, Op::Dlock(op), batch);
                conn.closing = true;
                return Step::Fatal;
            }
        };
        let kind = dlock_kind(&req, cx, batch);
        conn.push(id, Op::Dlock(DlockOp { id: req.id, kind }), batch);
        Step::Consumed(n)
    }
}

/// Checks in this order: version, access token, type, keys.
fn dlock_kind(req: &dl::Request<'_>, cx: Cx<'_>, batch: &mut Batch) -> DlockKind {
    let config = cx.config;
    let refuse = |status, text| DlockKind::Refuse { status, text };
    if !matches!(req.version, None | Some(0) | Some(2)) {
        return refuse(dl::status::VERSION, "unsupported version");
    }
    if let Some(token) = &cx.secrets.dlock_token {
        let given = req.access_token.unwrap_or_default();
        if req.access_token.is_none() || !crate::tls::constant_time_eq(given, token) {
            return refuse(dl::status::GENERAL, "access denied");
        }
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
