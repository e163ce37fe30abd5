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
use crate::core::store::StoreMode;
use crate::server::msg::ConnId;

use std::net::{IpAddr, SocketAddr};

use crate::protocol::counter::Counter;
use crate::protocol::dlock::Dlock;
pub use crate::protocol::dlock::REFUSALS as DLOCK_REFUSALS;
use crate::protocol::lockd::Lockd;
use crate::protocol::Entry;
use crate::server::msg::{Arena, Batch, McCmd, McForm, McOp, Op, OpMsg, Span};
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

fn put_i64(out: &mut Vec<u8>, v: i64) {
    // Zig-zag, so that small negative exptimes stay small.
    codec::put_u64(out, ((v << 1) ^ (v >> 63)) as u64);
}

fn get_i64(r: &mut Reader<'_>) -> Result<i64, DecodeError> {
    let z = r.u64()?;
    Ok(((z >> 1) as i64) ^ -((z & 1) as i64))
}

mod tag {
    // memcached commands: one tag per `McCmd` variant.
    pub const MC_FIRST: u8 = 1;
    pub const MC_GET: u8 = 1;
    pub const MC_STORE: u8 = 2;
    pub const MC_DELETE: u8 = 3;
    pub const MC_ARITH: u8 = 4;
    pub const MC_TOUCH: u8 = 5;
    pub const MC_FLUSH: u8 = 6;
    pub const MC_STATS: u8 = 7;
    pub const MC_LOCK: u8 = 8;
    pub const MC_UNLOCK: u8 = 9;
    pub const MC_UNLOCK_ALL: u8 = 10;
    pub const MC_LOCK_TOKEN: u8 = 11;
    pub const MC_LOCK_AND_GET: u8 = 12;
    pub const MC_REPLACE_AND_UNLOCK: u8 = 13;
    pub const MC_KEYS: u8 = 14;
    pub const MC_KEYS_NEXT: u8 = 15;
    pub const MC_NOOP: u8 = 16;
    pub const MC_VERSION: u8 = 17;
    pub const MC_VERBOSITY: u8 = 18;
    pub const MC_QUIT: u8 = 19;
    pub const MC_LAST: u8 = 19;
    // 20: the old lock-daemon protocol's (`protocol::lockd`).
    // 30 to 33: dlock's (`protocol::dlock`).
    pub const LITERAL: u8 = 40;
    pub const DLOCK_OPEN: u8 = 41;
    pub const CLOSE: u8 = 42;
    pub const EOF: u8 = 43;
    pub const OPEN: u8 = 44;
    // 50 to 54: the counter protocol's (`protocol::counter`).
}

fn proto_code(p: Proto) -> u8 {
    match p {
        Proto::Memcache => 0,
        Proto::Lockd => 1,
        Proto::Dlock => 2,
        Proto::Counter => 3,
    }
}

fn proto_of(code: u8) -> Result<Proto, DecodeError> {
    Ok(match code {
        0 => Proto::Memcache,
        1 => Proto::Lockd,
        2 => Proto::Dlock,
        3 => Proto::Counter,
        _ => return Err(DecodeError::Invalid("listener")),
    })
}

fn store_mode_code(m: StoreMode) -> u8 {
    match m {
        StoreMode::Set => 0,
        StoreMode::Add => 1,
        StoreMode::Replace => 2,
        StoreMode::Append => 3,
        StoreMode::Prepend => 4,
    }
}

fn store_mode(code: u8) -> Result<StoreMode, DecodeError> {
    Ok(match code {
        0 => StoreMode::Set,
        1 => StoreMode::Add,
        2 => StoreMode::Replace,
        3 => StoreMode::Append,
        4 => StoreMode::Prepend,
        _ => return Err(DecodeError::Invalid("store mode")),
    })
}

fn put_opt_i64(o: &mut Vec<u8>, v: Option<i64>) {
    codec::put_bool(o, v.is_some());
    if let Some(v) = v {
        put_i64(o, v);
    }
}

fn get_opt_i64(r: &mut Reader<'_>) -> Result<Option<i64>, DecodeError> {
    Ok(if r.bool()? { Some(get_i64(r)?) } else { None })
}

/// A memcached command: its tag, its form (0: text, 1: text with noreply, 2: binary, then the
/// opcode and the opaque), then its fields in declaration order.
fn encode_mc(op: McOp, arena: &[u8], o: &mut Vec<u8>) {
    let McOp { cmd, form } = op;
    o.push(match cmd {
        McCmd::Get { .. } => tag::MC_GET,
        McCmd::Store { .. } => tag::MC_STORE,
        McCmd::Delete { .. } => tag::MC_DELETE,
        McCmd::Arith { .. } => tag::MC_ARITH,
        McCmd::Touch { .. } => tag::MC_TOUCH,
        McCmd::Flush { .. } => tag::MC_FLUSH,
        McCmd::Stats { .. } => tag::MC_STATS,
        McCmd::Lock { .. } => tag::MC_LOCK,
        McCmd::Unlock { .. } => tag::MC_UNLOCK,
        McCmd::UnlockAll => tag::MC_UNLOCK_ALL,
        McCmd::LockToken { .. } => tag::MC_LOCK_TOKEN,
        McCmd::LockAndGet { .. } => tag::MC_LOCK_AND_GET,
        McCmd::ReplaceAndUnlock { .. } => tag::MC_REPLACE_AND_UNLOCK,
        McCmd::Keys { .. } => tag::MC_KEYS,
        McCmd::KeysNext => tag::MC_KEYS_NEXT,
        McCmd::Noop => tag::MC_NOOP,
        McCmd::Version => tag::MC_VERSION,
        McCmd::Verbosity => tag::MC_VERBOSITY,
        McCmd::Quit => tag::MC_QUIT,
    });
    match form {
        McForm::Text { noreply } => o.push(u8::from(noreply)),
        McForm::Binary { opcode, opaque } => {
            o.push(2);
            o.push(opcode);
            codec::put_u64(o, u64::from(opaque));
        }
    }
    match cmd {
        McCmd::Get { keys, cas, touch } => {
            put_span(o, arena, keys);
            codec::put_bool(o, cas);
            put_opt_i64(o, touch);
        }
        McCmd::Store {
            mode,
            key,
            flags,
            exptime,
            value,
            cas,
        } => {
            o.push(store_mode_code(mode));
            put_span(o, arena, key);
            codec::put_u64(o, u64::from(flags));
            put_i64(o, exptime);
            put_span(o, arena, value);
            codec::put_opt_u64(o, cas);
        }
        McCmd::Delete { key, cas } => {
            put_span(o, arena, key);
            codec::put_opt_u64(o, cas);
        }
        McCmd::Arith {
            key,
            incr,
            delta,
            create,
            cas,
        } => {
            put_span(o, arena, key);
            codec::put_bool(o, incr);
            codec::put_u64(o, delta);
            codec::put_bool(o, create.is_some());
            if let Some((initial, exptime)) = create {
                codec::put_u64(o, initial);
                put_i64(o, exptime);
            }
            codec::put_opt_u64(o, cas);
        }
        McCmd::Touch { key, exptime } => {
            put_span(o, arena, key);
            put_i64(o, exptime);
        }
        McCmd::Flush { delay } => put_i64(o, delay),
        McCmd::Stats { arg } => {
            codec::put_bool(o, arg.is_some());
            put_span(o, arena, arg.unwrap_or(Span::EMPTY));
        }
        McCmd::Lock { key } | McCmd::Unlock { key } | McCmd::LockToken { key } => {
            put_span(o, arena, key)
        }
        McCmd::LockAndGet { key, touch } => {
            put_span(o, arena, key);
            put_opt_i64(o, touch);
        }
        McCmd::ReplaceAndUnlock {
            key,
            flags,
            exptime,
            value,
            cas,
        } => {
            put_span(o, arena, key);
            codec::put_u64(o, u64::from(flags));
            put_i64(o, exptime);
            put_span(o, arena, value);
            codec::put_opt_u64(o, cas);
        }
        McCmd::Keys { prefix } => put_span(o, arena, prefix),
        McCmd::UnlockAll
        | McCmd::KeysNext
        | McCmd::Noop
        | McCmd::Version
        | McCmd::Verbosity
        | McCmd::Quit => {}
    }
}

/// The inverse of [`encode_mc`], `t` already read.
fn decode_mc(
    t: u8,
    r: &mut Reader<'_>,
    limits: Limits,
    a: &mut Arena,
) -> Result<McOp, DecodeError> {
    let form = match r.u8()? {
        0 => McForm::Text { noreply: false },
        1 => McForm::Text { noreply: true },
        2 => McForm::Binary {
            opcode: r.u8()?,
            opaque: r.u32()?,
        },
        _ => return Err(DecodeError::Invalid("memcached reply form")),
    };
    let cmd = match t {
        tag::MC_GET => McCmd::Get {
            keys: get_span(r, limits, a)?,
            cas: r.bool()?,
            touch: get_opt_i64(r)?,
        },
        tag::MC_STORE => McCmd::Store {
            mode: store_mode(r.u8()?)?,
            key: get_span(r, limits, a)?,
            flags: r.u32()?,
            exptime: get_i64(r)?,
            value: get_span(r, limits, a)?,
            cas: r.opt_u64()?,
        },
        tag::MC_DELETE => McCmd::Delete {
            key: get_span(r, limits, a)?,
            cas: r.opt_u64()?,
        },
        tag::MC_ARITH => McCmd::Arith {
            key: get_span(r, limits, a)?,
            incr: r.bool()?,
            delta: r.u64()?,
            create: if r.bool()? {
                Some((r.u64()?, get_i64(r)?))
            } else {
                None
            },
            cas: r.opt_u64()?,
        },
        tag::MC_TOUCH => McCmd::Touch {
            key: get_span(r, limits, a)?,
            exptime: get_i64(r)?,
        },
        tag::MC_FLUSH => McCmd::Flush { delay: get_i64(r)? },
        tag::MC_STATS => {
            let has = r.bool()?;
            let arg = get_span(r, limits, a)?;
            if !has && arg.len != 0 {
                return Err(DecodeError::Invalid("stats argument without its flag"));
            }
            McCmd::Stats {
                arg: has.then_some(arg),
            }
        }
        tag::MC_LOCK => McCmd::Lock {
            key: get_span(r, limits, a)?,
        },
        tag::MC_UNLOCK => McCmd::Unlock {
            key: get_span(r, limits, a)?,
        },
        tag::MC_UNLOCK_ALL => McCmd::UnlockAll,
        tag::MC_LOCK_TOKEN => McCmd::LockToken {
            key: get_span(r, limits, a)?,
        },
        tag::MC_LOCK_AND_GET => McCmd::LockAndGet {
            key: get_span(r, limits, a)?,
            touch: get_opt_i64(r)?,
        },
        tag::MC_REPLACE_AND_UNLOCK => McCmd::ReplaceAndUnlock {
            key: get_span(r, limits, a)?,
            flags: r.u32()?,
            exptime: get_i64(r)?,
            value: get_span(r, limits, a)?,
            cas: r.opt_u64()?,
        },
        tag::MC_KEYS => McCmd::Keys {
            prefix: get_span(r, limits, a)?,
        },
        tag::MC_KEYS_NEXT => McCmd::KeysNext,
        tag::MC_NOOP => McCmd::Noop,
        tag::MC_VERSION => McCmd::Version,
        tag::MC_VERBOSITY => McCmd::Verbosity,
        tag::MC_QUIT => McCmd::Quit,
        _ => return Err(DecodeError::Invalid("memcached command")),
    };
    Ok(McOp { cmd, form })
}

/// One operation: the connection, a tag, then the fields of that variant in declaration order
/// (spans as byte strings, options as `opt_u64`, bools as one byte).
pub fn encode_op(m: &OpMsg, arena: &[u8], out: &mut Vec<u8>) {
    m.conn.encode(out);
    let o = out;
    match m.op {
        Op::Mc(op) => encode_mc(op, arena, o),
        Op::Lockd(op) => Lockd::encode_op(&op, arena, o),
        Op::Dlock(op) => Dlock::encode_op(&op, arena, o),
        Op::Counter(op) => Counter::encode_op(&op, arena, o),
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
}

/// Decode one operation, its bytes appended to `a` (the inverse of [`encode_op`]).
pub fn decode_op(r: &mut Reader<'_>, limits: Limits, a: &mut Arena) -> Result<OpMsg, DecodeError> {
    let conn = ConnId::decode(r)?;
    let t = r.u8()?;
    let op = match t {
        tag::MC_FIRST..=tag::MC_LAST => Op::Mc(decode_mc(t, r, limits, a)?),
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
            if let Some(op) = Lockd::decode_op(t, r, limits, a) {
                Op::Lockd(op?)
            } else if let Some(op) = Dlock::decode_op(t, r, limits, a) {
                Op::Dlock(op?)
            } else if let Some(op) = Counter::decode_op(t, r, limits, a) {
                Op::Counter(op?)
            } else {
                return Err(DecodeError::Invalid("operation tag"));
            }
        }
    };
    Ok(OpMsg { conn, op })
}

#[cfg(test)]
#[path = "command_tests.rs"]
mod tests;
