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
    pub const NATIVE: u8 = 34;
    pub const NATIVE_REFUSE: u8 = 35;
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

/// The raw RequestLock message of a version-3 request of type `ty`, validated as the worker
/// validates it, with `key_count` keys (at least one but for a Ping, which has none).
fn get_native_lock(
    ty: u8,
    key_count: u32,
    r: &mut Reader<'_>,
    limits: Limits,
    a: &mut Arena,
) -> Result<Span, DecodeError> {
    let start = a.bytes.len();
    let span = get_span(r, limits, a)?;
    let ping = u64::from(ty) == super::wire::req_type::PING;
    match super::wire::decode_lock(&a.bytes[start..]) {
        Ok(lock)
            if lock.key_count == key_count as usize
                && (ping == (key_count == 0))
                && super::wire::decode_native(&a.bytes[start..]).malformed == 0
                && (super::wire::req_type::PING..=super::wire::req_type::CHECK_FENCE)
                    .contains(&u64::from(ty)) =>
        {
            Ok(span)
        }
        _ => Err(DecodeError::Invalid("dlock native request")),
    }
}

/// A refusal's text as its index in [`REFUSALS`] (the last one for a text not listed).
fn put_refusal(o: &mut Vec<u8>, status: u32, text: &str) {
    codec::put_u64(o, u64::from(status));
    let last = REFUSALS.len() - 1;
    let i = REFUSALS.iter().position(|t| *t == text);
    debug_assert!(i.is_some(), "refusal text {text:?} missing from the list");
    codec::put_u64(o, i.unwrap_or(last) as u64);
}

fn get_refusal(r: &mut Reader<'_>) -> Result<(u32, &'static str), DecodeError> {
    let status = r.u32()?;
    let i = r.u64()?;
    let text = usize::try_from(i)
        .ok()
        .and_then(|i| REFUSALS.get(i))
        .ok_or(DecodeError::Invalid("dlock refusal text"))?;
    Ok((status, text))
}

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
                put_refusal(o, status, text);
            }
            DlockKind::Native {
                ty,
                lock,
                key_count,
            } => {
                o.push(tag::NATIVE);
                id_field(o);
                o.push(ty);
                codec::put_u64(o, u64::from(key_count));
                put_span(o, arena, lock);
            }
            DlockKind::NativeRefuse { status, text } => {
                o.push(tag::NATIVE_REFUSE);
                id_field(o);
                put_refusal(o, status, text);
            }
        }
    }

    fn decode_op(
        t: u8,
        r: &mut Reader<'_>,
        limits: Limits,
        a: &mut Arena,
    ) -> Option<Result<DlockOp, DecodeError>> {
        if !(tag::PING..=tag::NATIVE_REFUSE).contains(&t) {
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
                tag::REFUSE => {
                    let (status, text) = get_refusal(r)?;
                    DlockKind::Refuse { status, text }
                }
                tag::NATIVE => {
                    let ty = r.u8()?;
                    let key_count = r.u32()?;
                    DlockKind::Native {
                        ty,
                        lock: get_native_lock(ty, key_count, r, limits, a)?,
                        key_count,
                    }
                }
                _ => {
                    let (status, text) = get_refusal(r)?;
                    DlockKind::NativeRefuse { status, text }
                }
            };
            Ok(DlockOp { id, kind })
        })())
    }
}
