//! The owner's input as bytes: one *entry* is one owner turn, the time it ran at and the
//! operations it applied, in order. The entries of a run, applied in order to a fresh state,
//! give the same state and the same replies (tests/determinism.rs); a replicated log will carry
//! them.
//!
//! Owns: the encoding of [`OpMsg`]s with their bytes inline (spans become length-prefixed
//! strings), and its decoding back into a [`Batch`]. Must not: trust what it decodes. An entry
//! read from a disk or a peer is hostile: every count and length is bounded by the input left and
//! by the caps in [`Limits`], and anything else is a [`DecodeError`], never a panic.
//!
//! Layout (all integers LEB128 varints, `bytes` = length + bytes):
//!
//! ```text
//! entry   = "HFc2" now_ms op_count op*
//! op      = worker slot gen tag fields
//! ```
//!
//! where each tag's fields are listed in [`encode_op`].

use crate::core::codec::{self, DecodeError, Reader};
use crate::server::msg::ConnId;

use std::net::{IpAddr, SocketAddr};

pub use crate::protocol::dlock::REFUSALS as DLOCK_REFUSALS;
use crate::protocol::Entry;
use crate::server::msg::{Arena, Batch, Op, OpMsg, Span};
use crate::server::Proto;

const MAGIC: &[u8] = b"HFc2";

/// Caps on what one entry may hold: a decoded entry can never ask for more memory than the
/// daemon would have accepted from clients in one turn.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest byte string (a value, a key list, a payload).
    pub max_field: usize,
    /// Most operations in one entry.
    pub max_ops: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // A 1 GiB item (the largest --max-item-size) plus room for its key.
            max_field: (1 << 30) + 1024,
            max_ops: 1 << 20,
        }
    }
}

/// Append one entry: the turn's time and its operations, their bytes read from `arena`.
pub fn encode_entry(now_ms: u64, ops: &[OpMsg], arena: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(MAGIC);
    codec::put_u64(out, now_ms);
    codec::put_u64(out, ops.len() as u64);
    for m in ops {
        encode_op(m, arena, out);
    }
}

/// Append one entry made of several workers' batches, in order: the same bytes as one batch
/// holding all their operations (each operation's bytes are read from its own batch's arena).
pub fn encode_entry_of_batches<'a>(
    now_ms: u64,
    batches: impl Iterator<Item = &'a Batch> + Clone,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(MAGIC);
    codec::put_u64(out, now_ms);
    let n: usize = batches.clone().map(|b| b.ops.len()).sum();
    codec::put_u64(out, n as u64);
    for b in batches {
        for m in &b.ops {
            encode_op(m, &b.arena.bytes, out);
        }
    }
}

/// Decode one entry into `batch` (cleared first; its buffers are reused); returns the time.
pub fn decode_entry(bytes: &[u8], limits: Limits, batch: &mut Batch) -> Result<u64, DecodeError> {
    batch.ops.clear();
    batch.arena.bytes.clear();
    batch.wants_live = false;
    let mut r = Reader::new(bytes);
    r.expect(MAGIC, "command entry magic")?;
    let now_ms = r.u64()?;
    // Every op takes at least four bytes (three ids and a tag).
    let n = r.count(4)?;
    if n > limits.max_ops {
        return Err(DecodeError::Invalid("too many operations in one entry"));
    }
    for _ in 0..n {
        let op = decode_op(&mut r, limits, &mut batch.arena)?;
        batch.wants_live |= op.op.reports_live();
        batch.ops.push(op);
    }
    r.finish()?;
    Ok(now_ms)
}

pub(crate) fn put_span(out: &mut Vec<u8>, arena: &[u8], s: Span) {
    codec::put_bytes(out, s.get(arena));
}

pub(crate) fn get_span(
    r: &mut Reader<'_>,
    limits: Limits,
    arena: &mut Arena,
) -> Result<Span, DecodeError> {
    let b = r.bytes(limits.max_field)?;
    if arena.bytes.len().saturating_add(b.len()) > u32::MAX as usize {
        return Err(DecodeError::Invalid("entry bytes over 4 GiB"));
    }
    Ok(arena.push(b))
}

mod tag {
    // 1 to 19: memcached's (`protocol::memcache`).
    // 20: the old lock-daemon protocol's (`protocol::lockd`).
    // 30 to 35: dlock's (`protocol::dlock`).
    pub const LITERAL: u8 = 40;
    pub const DLOCK_OPEN: u8 = 41;
    pub const CLOSE: u8 = 42;
    pub const EOF: u8 = 43;
    pub const OPEN: u8 = 44;
    // 50 to 54: the counter protocol's (`protocol::counter`).
}

/// A listener's code: its place in the protocol list.
fn proto_code(p: Proto) -> u8 {
    p.index() as u8
}

fn proto_of(code: u8) -> Result<Proto, DecodeError> {
    Proto::ALL
        .get(usize::from(code))
        .copied()
        .ok_or(DecodeError::Invalid("listener"))
}

/// One operation: the connection, a tag, then the fields of that variant in declaration order
/// (spans as byte strings, options as `opt_u64`, bools as one byte).
pub fn encode_op(m: &OpMsg, arena: &[u8], out: &mut Vec<u8>) {
    m.conn.encode(out);
    let o = out;
    macro_rules! encode {
        ($($proto:ident, $v:ident, $name:literal, $ty:ty, $op:ty, $reply:ty;)*) => {
            match m.op {
                $(Op::$v(op) => <$ty>::encode_op(&op, arena, o),)*
                Op::Literal { bytes, close } => {
                    o.push(tag::LITERAL);
                    put_span(o, arena, bytes);
                    codec::put_bool(o, close);
                }
                Op::DlockOpen => o.push(tag::DLOCK_OPEN),
                Op::Open { proto, peer } => {
                    o.push(tag::OPEN);
                    o.push(proto_code(proto));
                    match peer.ip() {
                        IpAddr::V4(ip) => {
                            o.push(4);
                            o.extend_from_slice(&ip.octets());
                        }
                        IpAddr::V6(ip) => {
                            o.push(6);
                            o.extend_from_slice(&ip.octets());
                        }
                    }
                    codec::put_u64(o, u64::from(peer.port()));
                }
                Op::Close => o.push(tag::CLOSE),
                Op::Eof => o.push(tag::EOF),
            }
        };
    }
    crate::protocol::protocols!(encode);
}

/// Decode one operation, its bytes appended to `a` (the inverse of [`encode_op`]).
pub fn decode_op(r: &mut Reader<'_>, limits: Limits, a: &mut Arena) -> Result<OpMsg, DecodeError> {
    let conn = ConnId::decode(r)?;
    let t = r.u8()?;
    let op = match t {
        tag::LITERAL => Op::Literal {
            bytes: get_span(r, limits, a)?,
            close: r.bool()?,
        },
        tag::DLOCK_OPEN => Op::DlockOpen,
        tag::OPEN => {
            let proto = proto_of(r.u8()?)?;
            let ip = match r.u8()? {
                4 => {
                    let mut b = [0u8; 4];
                    for x in b.iter_mut() {
                        *x = r.u8()?;
                    }
                    IpAddr::from(b)
                }
                6 => {
                    let mut b = [0u8; 16];
                    for x in b.iter_mut() {
                        *x = r.u8()?;
                    }
                    IpAddr::from(b)
                }
                _ => return Err(DecodeError::Invalid("address family")),
            };
            let port = u16::try_from(r.u64()?).map_err(|_| DecodeError::Invalid("port"))?;
            Op::Open {
                proto,
                peer: SocketAddr::new(ip, port),
            }
        }
        tag::CLOSE => Op::Close,
        tag::EOF => Op::Eof,
        _ => {
            // A request: the protocol whose tag this is decodes it.
            macro_rules! decode_request {
                ($($proto:ident, $v:ident, $name:literal, $ty:ty, $op:ty, $reply:ty;)*) => {
                    'found: {
                        $(if let Some(op) = <$ty>::decode_op(t, r, limits, a) {
                            break 'found Op::$v(op?);
                        })*
                        return Err(DecodeError::Invalid("operation tag"));
                    }
                };
            }
            crate::protocol::protocols!(decode_request)
        }
    };
    Ok(OpMsg { conn, op })
}

#[cfg(test)]
#[path = "command_tests.rs"]
mod tests;
