//! A [`McOp`] in a command entry: its tag (one per [`McCmd`] variant), its form (0: text, 1:
//! text with noreply, 2: binary, then the opcode and the opaque), then the command's fields in
//! declaration order.

use super::{McCmd, McForm, McOp, Memcache};
use crate::core::codec::{self, DecodeError, Reader};
use crate::core::store::StoreMode;
use crate::protocol::Entry;
use crate::server::command::{get_span, put_span, Limits};
use crate::server::msg::{Arena, Span};

/// Command-entry tags (`server::command` lists every protocol's ranges).
mod tag {
    pub const FIRST: u8 = 1;
    pub const GET: u8 = 1;
    pub const STORE: u8 = 2;
    pub const DELETE: u8 = 3;
    pub const ARITH: u8 = 4;
    pub const TOUCH: u8 = 5;
    pub const FLUSH: u8 = 6;
    pub const STATS: u8 = 7;
    pub const LOCK: u8 = 8;
    pub const UNLOCK: u8 = 9;
    pub const UNLOCK_ALL: u8 = 10;
    pub const LOCK_TOKEN: u8 = 11;
    pub const LOCK_AND_GET: u8 = 12;
    pub const REPLACE_AND_UNLOCK: u8 = 13;
    pub const KEYS: u8 = 14;
    pub const KEYS_NEXT: u8 = 15;
    pub const NOOP: u8 = 16;
    pub const VERSION: u8 = 17;
    pub const VERBOSITY: u8 = 18;
    pub const QUIT: u8 = 19;
    pub const LAST: u8 = 19;
}

fn put_i64(out: &mut Vec<u8>, v: i64) {
    // Zig-zag, so that small negative exptimes stay small.
    codec::put_u64(out, ((v << 1) ^ (v >> 63)) as u64);
}

fn get_i64(r: &mut Reader<'_>) -> Result<i64, DecodeError> {
    let z = r.u64()?;
    Ok(((z >> 1) as i64) ^ -((z & 1) as i64))
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

impl Entry for Memcache {
    fn encode_op(op: &McOp, arena: &[u8], o: &mut Vec<u8>) {
        let McOp { cmd, form } = *op;
        o.push(match cmd {
            McCmd::Get { .. } => tag::GET,
            McCmd::Store { .. } => tag::STORE,
            McCmd::Delete { .. } => tag::DELETE,
            McCmd::Arith { .. } => tag::ARITH,
            McCmd::Touch { .. } => tag::TOUCH,
            McCmd::Flush { .. } => tag::FLUSH,
            McCmd::Stats { .. } => tag::STATS,
            McCmd::Lock { .. } => tag::LOCK,
            McCmd::Unlock { .. } => tag::UNLOCK,
            McCmd::UnlockAll => tag::UNLOCK_ALL,
            McCmd::LockToken { .. } => tag::LOCK_TOKEN,
            McCmd::LockAndGet { .. } => tag::LOCK_AND_GET,
            McCmd::ReplaceAndUnlock { .. } => tag::REPLACE_AND_UNLOCK,
            McCmd::Keys { .. } => tag::KEYS,
            McCmd::KeysNext => tag::KEYS_NEXT,
            McCmd::Noop => tag::NOOP,
            McCmd::Version => tag::VERSION,
            McCmd::Verbosity => tag::VERBOSITY,
            McCmd::Quit => tag::QUIT,
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
            McCmd::Stats { arg, live: _ } => {
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

    fn decode_op(
        t: u8,
        r: &mut Reader<'_>,
        limits: Limits,
        a: &mut Arena,
    ) -> Option<Result<McOp, DecodeError>> {
        if !(tag::FIRST..=tag::LAST).contains(&t) {
            return None;
        }
        Some((|| {
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
                tag::GET => McCmd::Get {
                    keys: get_span(r, limits, a)?,
                    cas: r.bool()?,
                    touch: get_opt_i64(r)?,
                },
                tag::STORE => McCmd::Store {
                    mode: store_mode(r.u8()?)?,
                    key: get_span(r, limits, a)?,
                    flags: r.u32()?,
                    exptime: get_i64(r)?,
                    value: get_span(r, limits, a)?,
                    cas: r.opt_u64()?,
                },
                tag::DELETE => McCmd::Delete {
                    key: get_span(r, limits, a)?,
                    cas: r.opt_u64()?,
                },
                tag::ARITH => McCmd::Arith {
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
                tag::TOUCH => McCmd::Touch {
                    key: get_span(r, limits, a)?,
                    exptime: get_i64(r)?,
                },
                tag::FLUSH => McCmd::Flush { delay: get_i64(r)? },
                tag::STATS => {
                    let has = r.bool()?;
                    let arg = get_span(r, limits, a)?;
                    if !has && arg.len != 0 {
                        return Err(DecodeError::Invalid("stats argument without its flag"));
                    }
                    McCmd::Stats {
                        arg: has.then_some(arg),
                        live: Span::EMPTY,
                    }
                }
                tag::LOCK => McCmd::Lock {
                    key: get_span(r, limits, a)?,
                },
                tag::UNLOCK => McCmd::Unlock {
                    key: get_span(r, limits, a)?,
                },
                tag::UNLOCK_ALL => McCmd::UnlockAll,
                tag::LOCK_TOKEN => McCmd::LockToken {
                    key: get_span(r, limits, a)?,
                },
                tag::LOCK_AND_GET => McCmd::LockAndGet {
                    key: get_span(r, limits, a)?,
                    touch: get_opt_i64(r)?,
                },
                tag::REPLACE_AND_UNLOCK => McCmd::ReplaceAndUnlock {
                    key: get_span(r, limits, a)?,
                    flags: r.u32()?,
                    exptime: get_i64(r)?,
                    value: get_span(r, limits, a)?,
                    cas: r.opt_u64()?,
                },
                tag::KEYS => McCmd::Keys {
                    prefix: get_span(r, limits, a)?,
                },
                tag::KEYS_NEXT => McCmd::KeysNext,
                tag::NOOP => McCmd::Noop,
                tag::VERSION => McCmd::Version,
                tag::VERBOSITY => McCmd::Verbosity,
                tag::QUIT => McCmd::Quit,
                _ => return Err(DecodeError::Invalid("memcached command")),
            };
            Ok(McOp { cmd, form })
        })())
    }
}
