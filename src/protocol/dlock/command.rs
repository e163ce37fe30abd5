//! A [`DlockOp`] in a command entry: its tag (one per kind), the request id, then the kind's
//! fields in declaration order; a refusal's text as its index in [`REFUSALS`].

use super::{Dlock, DlockKind, DlockOp};
use crate::core::codec::{self, DecodeError, Reader};
use crate::protocol::Entry;
use crate::server::command::{get_span, put_span, Limits};
use crate::server::msg::{Arena, Span};

/// Command-entry tags (`server::command` lists every protocol's ranges).
mod tag {
    pub const PING: u8 = 30;
    pub const LOCK: u8 = 31;
    pub const UNLOCK: u8 = 32;
    pub const REFUSE: u8 = 33;
}

/// Refusal texts a dlock request can carry ([`DlockKind::Refuse`]): sent as their index, because
/// the op holds a `&'static str`. A text not in this list (a new one someone forgot to add) is
/// sent as the last entry; the test below keeps the list in step with the decoder.
pub const REFUSALS: &[&str] = &[
    "unsupported version",
    "access denied",
    "no keys",
    "too many keys",
    "unknown request type",
    "field lock (51) repeated",
    "field number 0",
    "field number out of range",
    "groups are not supported",
    "invalid wire type",
    "length out of range",
    "truncated field",
    "truncated length-delimited field",
    "truncated varint",
    "varint longer than 10 bytes or over 64 bits",
    "varint longer than 10 bytes",
    "wrong wire type for a known field of lock",
    "wrong wire type for a known field",
    "invalid request",
];

/// The raw RequestLock message of a dlock Lock or Unlock, validated as the worker validates it
/// (the table iterates its keys and trusts it to parse), with at least one key.
fn get_lock_keys(r: &mut Reader<'_>, limits: Limits, a: &mut Arena) -> Result<Span, DecodeError> {
    let start = a.bytes.len();
    let span = get_span(r, limits, a)?;
    match super::wire::decode_lock(&a.bytes[start..]) {
        Ok(lock) if lock.key_count > 0 => Ok(span),
        _ => Err(DecodeError::Invalid("dlock lock message")),
    }
}

impl Entry for Dlock {
    fn encode_op(op: &DlockOp, arena: &[u8], o: &mut Vec<u8>) {
        let DlockOp { id, kind } = *op;
        let id_field = |o: &mut Vec<u8>| codec::put_opt_u64(o, id);
        match kind {
            DlockKind::Ping => {
                o.push(tag::PING);
                id_field(o);
            }
            DlockKind::Lock {
                keys,
                key_count,
                wait_us,
                lease_us,
            } => {
                o.push(tag::LOCK);
                id_field(o);
                put_span(o, arena, keys);
                codec::put_u64(o, u64::from(key_count));
                codec::put_opt_u64(o, wait_us);
                codec::put_opt_u64(o, lease_us);
            }
            DlockKind::Unlock { keys, key_count } => {
                o.push(tag::UNLOCK);
                id_field(o);
                put_span(o, arena, keys);
                codec::put_u64(o, u64::from(key_count));
            }
            DlockKind::Refuse { status, text } => {
                o.push(tag::REFUSE);
                id_field(o);
                codec::put_u64(o, u64::from(status));
                let last = REFUSALS.len() - 1;
                let i = REFUSALS.iter().position(|t| *t == text);
                debug_assert!(i.is_some(), "refusal text {text:?} missing from the list");
                codec::put_u64(o, i.unwrap_or(last) as u64);
            }
        }
    }

    fn decode_op(
        t: u8,
        r: &mut Reader<'_>,
        limits: Limits,
        a: &mut Arena,
    ) -> Option<Result<DlockOp, DecodeError>> {
        if !(tag::PING..=tag::REFUSE).contains(&t) {
            return None;
        }
        Some((|| {
            let id = r.opt_u64()?;
            let kind = match t {
                tag::PING => DlockKind::Ping,
                tag::LOCK => DlockKind::Lock {
                    keys: get_lock_keys(r, limits, a)?,
                    key_count: r.u32()?,
                    wait_us: r.opt_u64()?,
                    lease_us: r.opt_u64()?,
                },
                tag::UNLOCK => DlockKind::Unlock {
                    keys: get_lock_keys(r, limits, a)?,
                    key_count: r.u32()?,
                },
                _ => {
                    let status = r.u32()?;
                    let i = r.u64()?;
                    let text = usize::try_from(i)
                        .ok()
                        .and_then(|i| REFUSALS.get(i))
                        .ok_or(DecodeError::Invalid("dlock refusal text"))?;
                    DlockKind::Refuse { status, text }
                }
            };
            Ok(DlockOp { id, kind })
        })())
    }
}
