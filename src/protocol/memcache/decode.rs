//! The worker's side of memcached: text and binary told apart per request, each parsed,
//! checked (a binary request's shape, per opcode) and decoded into one [`McCmd`]; what needs no
//! state (version, verbosity, quit, errors) is answered here, the rest goes to the owner.

use super::wire::text::StoreCmd;
use super::wire::{binary, text};
use super::{McCmd, McForm, McOp, Memcache};
use crate::config::{Compat, Config};
use crate::core::store::StoreMode;
use crate::protocol::Decode;
use crate::server::msg::{Arena, Batch, ConnId, Op};
use crate::server::worker::conn::{Conn, Dump};
use crate::server::worker::decode::{Cx, Step};

impl Decode for Memcache {
    #[inline]
    fn parse(conn: &mut Conn, buf: &[u8], id: ConnId, cx: Cx<'_>, batch: &mut Batch) -> Step {
        if !conn.authenticated {
            return super::auth::unauthenticated(conn, buf, id, cx, batch);
        }
        // The authenticated path takes the flags alone: the users matter only to the rare
        // requests that `sasl_again` handles, and a wider argument costs every request of the
        // hot loop.
        match memcache(conn, buf, id, cx.config, batch) {
            Parsed::Step(step) => step,
            Parsed::Sasl(n) => {
                sasl_again(conn, &buf[..n], id, cx, batch);
                Step::Consumed(n)
            }
        }
    }
}

/// What one attempt at an authenticated connection's request did.
enum Parsed {
    Step(Step),
    /// A binary SASL request of this many bytes: served as SASL when users are configured,
    /// else an unknown command.
    Sasl(usize),
}

/// The largest reply to one retrieval of one key: the item and its header line.
fn item_reply_bound(config: &Config) -> usize {
    config.max_item_size + 512
}

/// A `stats` reply, generously.
const STATS_REPLY_BOUND: usize = 16 * 1024;

/// The largest reply a binary request can get (for the connection's reply budget).
fn binary_reply_bound(opcode: u8, config: &Config) -> usize {
    use binary::opcode as o;
    match opcode {
        o::GET | o::GETQ | o::GETK | o::GETKQ | o::GAT | o::GATQ | o::GATK | o::GATKQ => {
            item_reply_bound(config)
        }
        o::LAG | o::LAGQ | o::LAGK | o::LAGKQ => item_reply_bound(config),
        o::STAT => STATS_REPLY_BOUND,
        _ => 0,
    }
}

#[inline]
fn memcache(conn: &mut Conn, buf: &[u8], id: ConnId, config: &Config, batch: &mut Batch) -> Parsed {
    // Text and binary are told apart per request, by its first byte. A text command starts with
    // an ASCII letter or space, so a first byte with the high bit set is a binary header; any
    // such byte but the request magic 0x80 is a bad magic, and the binary parser closes the
    // connection for it (`docs/protocol.md`: a bad magic byte closes), instead of
    // waiting up to 2048 bytes for a newline that a binary client never sends.
    if buf[0] & 0x80 != 0 {
        return match binary::parse(buf, config.max_item_size) {
            Ok((req, n)) => {
                if binary_request(conn, &req, id, config, batch) {
                    Parsed::Step(Step::Consumed(n))
                } else {
                    Parsed::Sasl(n)
                }
            }
            Err(binary::ParseError::Incomplete) => Parsed::Step(Step::Incomplete),
            Err(binary::ParseError::Refuse {
                opcode,
                opaque,
                status,
                skip,
            }) => {
                let mut out = Vec::with_capacity(64);
                let msg = binary::status_text(status, config.compat == Compat::Yrmcds);
                binary::encode_response(&mut out, opcode, status, opaque, 0, &[], &[], msg);
                conn.emit(&out, false, id, batch);
                let here = skip.min(buf.len());
                conn.skip = skip - here;
                Parsed::Step(Step::Consumed(here))
            }
            Err(binary::ParseError::Fatal) => Parsed::Step(Step::Fatal),
        };
    }
    match text::parse(buf, &mut conn.scanned, config.max_item_size) {
        Ok((req, n)) => {
            conn.scanned = 0;
            text_request(conn, req, id, config, batch);
            Parsed::Step(Step::Consumed(n))
        }
        Err(text::ParseError::Incomplete) => Parsed::Step(Step::Incomplete),
        Err(text::ParseError::Invalid { reply, skip }) => {
            conn.scanned = 0;
            let reply = if config.compat == Compat::Yrmcds {
                yrmcds_text_error(buf, reply)
            } else {
                reply
            };
            if !reply.is_empty() {
                conn.emit(reply, false, id, batch);
            }
            let here = skip.min(buf.len());
            conn.skip = skip - here;
            Parsed::Step(Step::Consumed(here))
        }
        Err(text::ParseError::Fatal { reply }) => {
            conn.scanned = 0;
            conn.emit(reply, true, id, batch);
            Parsed::Step(Step::Fatal)
        }
    }
}

/// The shape a request of one opcode must have (protocol-binary.xml's MUST / MUST NOT): which
/// extras lengths are allowed (bit 0: none, bit 1: 4 bytes, bit 2: 8 bytes, bit 3: 20 bytes),
/// and whether a key and a value must be there, must not, or may. One byte per opcode, so the
/// check of a request is a table load and a few compares.
#[derive(Clone, Copy)]
struct Shape(u8);

impl Shape {
    const EXTRAS_0: u8 = 1;
    const EXTRAS_4: u8 = 2;
    const EXTRAS_8: u8 = 4;
    const EXTRAS_20: u8 = 8;
    const KEY_YES: u8 = 0x10;
    const KEY_NO: u8 = 0x20;
    const VALUE_YES: u8 = 0x40;
    const VALUE_NO: u8 = 0x80;
    /// Opcodes that take anything (NOOP, VERSION, QUIT, STAT) or are unknown.
    const ANY: Shape = Shape(Self::EXTRAS_0 | Self::EXTRAS_4 | Self::EXTRAS_8 | Self::EXTRAS_20);

    const fn new(extras: u8, key: Need, value: Need) -> Shape {
        let key = match key {
            Need::Yes => Self::KEY_YES,
            Need::No => Self::KEY_NO,
            Need::Any => 0,
        };
        let value = match value {
            Need::Yes => Self::VALUE_YES,
            Need::No => Self::VALUE_NO,
            Need::Any => 0,
        };
        Shape(extras | key | value)
    }

    #[inline]
    fn admits(self, r: &binary::Request<'_>) -> bool {
        let extras = match r.extras.len() {
            0 => Self::EXTRAS_0,
            4 => Self::EXTRAS_4,
            8 => Self::EXTRAS_8,
            20 => Self::EXTRAS_20,
            // Only an opcode that takes anything takes an odd extras length.
            _ => return self.0 == Self::ANY.0,
        };
        let key = if r.key.is_empty() {
            Self::KEY_YES
        } else {
            Self::KEY_NO
        };
        let value = if r.value.is_empty() {
            Self::VALUE_YES
        } else {
            Self::VALUE_NO
        };
        self.0 & extras != 0 && self.0 & (key | value) == 0
    }
}

#[derive(Clone, Copy)]
enum Need {
    No,
    Yes,
    Any,
}

/// memcached's shapes, per opcode.
const SHAPES: [Shape; 256] = shapes(false);
/// yrmcds's shapes (cybozu/yrmcds src/memcache/memcache.cpp, `binary_request::parse`): every
/// get may carry a 4-byte expiration (and then touches), a store, append or prepend must carry
/// a value, a Stat nothing but its key.
const SHAPES_YRMCDS: [Shape; 256] = shapes(true);

const fn shapes(yrmcds: bool) -> [Shape; 256] {
    use binary::opcode as o;
    use Need::*;
    let (e0, e4, e8, e20) = (
        Shape::EXTRAS_0,
        Shape::EXTRAS_4,
        Shape::EXTRAS_8,
        Shape::EXTRAS_20,
    );
    let mut t = [Shape::ANY; 256];
    let mut op = 0;
    while op < 256 {
        let opcode = op as u8;
        let get = matches!(opcode, o::GET | o::GETQ | o::GETK | o::GETKQ);
        let gat = matches!(opcode, o::GAT | o::GATQ | o::GATK | o::GATKQ);
        let store = matches!(
            opcode,
            o::SET | o::SETQ | o::ADD | o::ADDQ | o::REPLACE | o::REPLACEQ | o::RAU | o::RAUQ
        );
        let concat = matches!(opcode, o::APPEND | o::APPENDQ | o::PREPEND | o::PREPENDQ);
        // A value a store must carry in yrmcds, may in memcached.
        let stored = if yrmcds { Yes } else { Any };
        t[op] = match opcode {
            _ if get && yrmcds => Shape::new(e0 | e4, Yes, No),
            _ if get => Shape::new(e0, Yes, No),
            _ if gat && yrmcds => Shape::new(e0 | e4, Yes, No),
            _ if gat => Shape::new(e4, Yes, No),
            o::TOUCH => Shape::new(e4, Yes, No),
            _ if store => Shape::new(e8, Yes, stored),
            _ if concat => Shape::new(e0, Yes, stored),
            o::KEYS => Shape::new(e0, Any, No),
            o::DELETE | o::DELETEQ => Shape::new(e0, Yes, No),
            o::LOCK | o::LOCKQ | o::UNLOCK | o::UNLOCKQ => Shape::new(e0, Yes, No),
            o::UNLOCK_ALL | o::UNLOCK_ALLQ => Shape::new(e0, No, No),
            o::LAG | o::LAGQ | o::LAGK | o::LAGKQ => Shape::new(e0 | e4, Yes, No),
            o::INCREMENT | o::INCREMENTQ | o::DECREMENT | o::DECREMENTQ => Shape::new(e20, Yes, No),
            o::FLUSH | o::FLUSHQ => Shape::new(e0 | e4, No, No),
            o::VERBOSITY => Shape::new(e4, No, No),
            o::STAT if yrmcds => Shape::new(e0, Any, No),
            _ => Shape::ANY,
        };
        op += 1;
    }
    t
}

fn be32(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(x)
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

/// memcached treats the 32-bit binary expiration like the text one: interpret it as signed so
/// that "negative" means already expired.
fn exptime(b: &[u8], at: usize) -> i64 {
    be32(b, at) as i32 as i64
}

/// A binary request as a [`McCmd`], or the status it is refused with (its shape is wrong, or
/// the opcode is unknown here). Call only once the request has the shape [`SHAPES`] demands.
#[inline]
fn binary_command(r: &binary::Request<'_>, yrmcds: bool, a: &mut Arena) -> Result<McCmd, u16> {
    use binary::opcode as o;
    use binary::status as st;
    let cas = (r.cas != 0).then_some(r.cas);
    Ok(match r.opcode {
        o::GET | o::GETQ | o::GETK | o::GETKQ | o::GAT | o::GATQ | o::GATK | o::GATKQ => {
            McCmd::Get {
                keys: a.push(r.key),
                cas: true,
                // A GaT always has an expiration; in yrmcds mode a Get may have one and a GaT
                // not.
                touch: (r.extras.len() == 4).then(|| exptime(r.extras, 0)),
            }
        }
        o::SET | o::SETQ | o::ADD | o::ADDQ | o::REPLACE | o::REPLACEQ => McCmd::Store {
            mode: match r.opcode {
                o::SET | o::SETQ => StoreMode::Set,
                o::ADD | o::ADDQ => StoreMode::Add,
                _ => StoreMode::Replace,
            },
            key: a.push(r.key),
            flags: be32(r.extras, 0),
            exptime: exptime(r.extras, 4),
            value: a.push(r.value),
            cas,
        },
        o::APPEND | o::APPENDQ | o::PREPEND | o::PREPENDQ => McCmd::Store {
            mode: if matches!(r.opcode, o::APPEND | o::APPENDQ) {
                StoreMode::Append
            } else {
                StoreMode::Prepend
            },
            key: a.push(r.key),
            flags: 0,
            exptime: 0,
            value: a.push(r.value),
            cas,
        },
        o::DELETE | o::DELETEQ => McCmd::Delete {
            key: a.push(r.key),
            cas,
        },
        o::INCREMENT | o::INCREMENTQ | o::DECREMENT | o::DECREMENTQ => {
            let exp = be32(r.extras, 16);
            McCmd::Arith {
                key: a.push(r.key),
                incr: matches!(r.opcode, o::INCREMENT | o::INCREMENTQ),
                delta: be64(r.extras, 0),
                // An expiration of all ones means "do not create".
                create: (exp != u32::MAX).then(|| (be64(r.extras, 8), exp as i32 as i64)),
                cas,
            }
        }
        o::TOUCH => McCmd::Touch {
            key: a.push(r.key),
            exptime: exptime(r.extras, 0),
        },
        o::FLUSH | o::FLUSHQ => McCmd::Flush {
            delay: if r.extras.len() == 4 {
                exptime(r.extras, 0)
            } else {
                0
            },
        },
        o::STAT => {
            let mut arg = (!r.key.is_empty()).then_some(r.key);
            if yrmcds && !matches!(arg, Some(b"settings" | b"items" | b"sizes" | b"ops")) {
                // yrmcds answers any other group with the general statistics.
                arg = None;
            }
            McCmd::Stats {
                arg: arg.map(|k| a.push(k)),
                live: crate::server::arena::Span::EMPTY,
            }
        }
        o::LOCK | o::LOCKQ => McCmd::Lock { key: a.push(r.key) },
        o::UNLOCK | o::UNLOCKQ => McCmd::Unlock { key: a.push(r.key) },
        o::UNLOCK_ALL | o::UNLOCK_ALLQ => McCmd::UnlockAll,
        o::LAG | o::LAGQ | o::LAGK | o::LAGKQ => McCmd::LockAndGet {
            key: a.push(r.key),
            touch: (r.extras.len() == 4).then(|| exptime(r.extras, 0)),
        },
        o::RAU | o::RAUQ => McCmd::ReplaceAndUnlock {
            key: a.push(r.key),
            flags: be32(r.extras, 0),
            exptime: exptime(r.extras, 4),
            value: a.push(r.value),
            cas,
        },
        o::KEYS => McCmd::Keys {
            prefix: a.push(r.key),
        },
        o::NOOP => McCmd::Noop,
        o::VERSION => McCmd::Version,
        // yrmcds has no binary Verbosity.
        o::VERBOSITY if yrmcds => return Err(st::UNKNOWN_COMMAND),
        o::VERBOSITY => McCmd::Verbosity,
        o::QUIT | o::QUITQ => McCmd::Quit,
        _ => return Err(st::UNKNOWN_COMMAND),
    })
}

/// One parsed binary request: checked and decoded here, answered here when it is refused, else
/// sent to the owner. False for a SASL request, which the caller answers (it knows the users).
#[inline]
fn binary_request(
    conn: &mut Conn,
    req: &binary::Request<'_>,
    id: ConnId,
    config: &Config,
    batch: &mut Batch,
) -> bool {
    let yrmcds = config.compat == Compat::Yrmcds;
    let shapes = if yrmcds { &SHAPES_YRMCDS } else { &SHAPES };
    // yrmcds has no binary Verbosity: unknown there whatever its shape.
    let unknown_here = yrmcds && req.opcode == binary::opcode::VERBOSITY;
    if !unknown_here && !shapes[usize::from(req.opcode)].admits(req) {
        refuse(
            conn,
            req,
            id,
            yrmcds,
            batch,
            binary::status::INVALID_ARGUMENTS,
        );
        return true;
    }
    let mark = batch.arena.bytes.len();
    match binary_command(req, yrmcds, &mut batch.arena) {
        Ok(cmd) => {
            let form = McForm::Binary {
                opcode: req.opcode,
                opaque: req.opaque,
            };
            match cmd {
                McCmd::Keys { .. } => conn.dump = Dump::Running,
                McCmd::Stats { .. } => batch.wants_live = true,
                _ => {}
            }
            conn.push(id, Op::Mc(McOp { cmd, form }), batch);
            conn.charge(binary_reply_bound(req.opcode, config));
        }
        Err(status) => {
            batch.arena.bytes.truncate(mark);
            if let super::auth::SASL_LIST_MECHS..=super::auth::SASL_STEP = req.opcode {
                return false; // SASL (an unknown command here): the caller knows the users
            }
            refuse(conn, req, id, yrmcds, batch, status);
        }
    }
    true
}

/// A SASL request on an authenticated memcached connection: SASL again when users are
/// configured; without users SASL is an unknown command, as in a memcached built without SASL.
#[cold]
fn sasl_again(conn: &mut Conn, bytes: &[u8], id: ConnId, cx: Cx<'_>, batch: &mut Batch) {
    let Ok((req, _)) = binary::parse(bytes, cx.config.max_item_size) else {
        return; // parsed once already: cannot happen
    };
    match cx.secrets.memcache_users.as_deref() {
        Some(users) => {
            super::auth::sasl(conn, &req, id, users, batch);
        }
        None => {
            let yrmcds = cx.config.compat == Compat::Yrmcds;
            refuse(
                conn,
                &req,
                id,
                yrmcds,
                batch,
                binary::status::UNKNOWN_COMMAND,
            );
        }
    }
}

/// Answer a binary request with an error status here, in order behind whatever the connection
/// has at the owner (an error path: its small allocation is not on the way of any served
/// request).
#[cold]
fn refuse(
    conn: &mut Conn,
    req: &binary::Request<'_>,
    id: ConnId,
    yrmcds: bool,
    batch: &mut Batch,
    status: u16,
) {
    let text = binary::status_text(status, yrmcds);
    let mut v = Vec::with_capacity(binary::HEADER_LEN + text.len());
    binary::encode_response(&mut v, req.opcode, status, req.opaque, 0, &[], &[], text);
    conn.emit(&v, false, id, batch);
}

/// yrmcds answers every request it cannot parse with a bare `ERROR` (its `cmd_text`), and any
/// `slabs ...` line with `OK` (it ignores them).
fn yrmcds_text_error(buf: &[u8], reply: &'static [u8]) -> &'static [u8] {
    let first = text::Keys { raw: buf }.next().unwrap_or_default();
    let first = first
        .split(|&b| b == b'\r' || b == b'\n')
        .next()
        .unwrap_or_default();
    if reply == text::reply::ERROR && first == b"slabs" {
        b"OK\r\n"
    } else if reply.is_empty() {
        reply
    } else {
        text::reply::ERROR
    }
}

fn arith(a: &mut Arena, key: &[u8], incr: bool, delta: u64) -> McCmd {
    McCmd::Arith {
        key: a.push(key),
        incr,
        delta,
        create: None,
        cas: None,
    }
}

fn text_request(
    conn: &mut Conn,
    req: text::Request<'_>,
    id: ConnId,
    config: &Config,
    batch: &mut Batch,
) {
    use text::Request as R;
    let bound = match &req {
        R::Get { keys, .. } | R::Gat { keys, .. } => {
            keys.count().saturating_mul(item_reply_bound(config))
        }
        R::Stats { .. } => {
            batch.wants_live = true;
            STATS_REPLY_BOUND
        }
        _ => 0,
    };
    let a = &mut batch.arena;
    let (cmd, noreply) = match req {
        R::Get { keys, cas } => (
            McCmd::Get {
                keys: a.push(keys.raw),
                cas,
                touch: None,
            },
            false,
        ),
        R::Gat { exptime, keys, cas } => (
            McCmd::Get {
                keys: a.push(keys.raw),
                cas,
                touch: Some(exptime),
            },
            false,
        ),
        R::Store {
            cmd,
            key,
            flags,
            exptime,
            value,
            cas_unique,
            noreply,
        } => {
            let (mode, cas) = match cmd {
                StoreCmd::Set => (StoreMode::Set, None),
                StoreCmd::Add => (StoreMode::Add, None),
                StoreCmd::Replace => (StoreMode::Replace, None),
                StoreCmd::Append => (StoreMode::Append, None),
                StoreCmd::Prepend => (StoreMode::Prepend, None),
                StoreCmd::Cas => (StoreMode::Set, Some(cas_unique)),
            };
            let cmd = McCmd::Store {
                mode,
                key: a.push(key),
                flags,
                exptime,
                value: a.push(value),
                cas,
            };
            (cmd, noreply)
        }
        R::Delete { key, noreply } => (
            McCmd::Delete {
                key: a.push(key),
                cas: None,
            },
            noreply,
        ),
        R::Incr {
            key,
            delta,
            noreply,
        } => (arith(a, key, true, delta), noreply),
        R::Decr {
            key,
            delta,
            noreply,
        } => (arith(a, key, false, delta), noreply),
        R::Touch {
            key,
            exptime,
            noreply,
        } => (
            McCmd::Touch {
                key: a.push(key),
                exptime,
            },
            noreply,
        ),
        R::FlushAll { delay, noreply } => (McCmd::Flush { delay }, noreply),
        R::Stats { arg } => (
            McCmd::Stats {
                arg: arg.map(|x| a.push(x)),
                live: crate::server::arena::Span::EMPTY,
            },
            false,
        ),
        R::Lock { key } => (McCmd::Lock { key: a.push(key) }, false),
        R::Unlock { key } => (McCmd::Unlock { key: a.push(key) }, false),
        R::UnlockAll => (McCmd::UnlockAll, false),
        R::LockToken { key } => (McCmd::LockToken { key: a.push(key) }, false),
        R::Keys { prefix } => {
            conn.dump = Dump::Running;
            (
                McCmd::Keys {
                    prefix: a.push(prefix),
                },
                false,
            )
        }
        R::Version => return conn.emit(super::VERSION_REPLY, false, id, batch),
        R::Verbosity { noreply } => {
            return conn.emit(if noreply { b"" } else { b"OK\r\n" }, false, id, batch)
        }
        R::Quit => return conn.emit(b"", true, id, batch),
    };
    let op = McOp::text(cmd, noreply);
    conn.push(id, Op::Mc(op), batch);
    conn.charge(bound);
}

#[cfg(test)]
mod tests {
    use super::*;
    use binary::opcode as o;

    fn req<'a>(
        opcode: u8,
        extras: &'a [u8],
        key: &'a [u8],
        value: &'a [u8],
    ) -> binary::Request<'a> {
        binary::Request {
            opcode,
            data_type: 0,
            vbucket: 0,
            opaque: 0,
            cas: 0,
            extras,
            key,
            value,
        }
    }

    /// (opcode, extras length, key, value, memcached admits, yrmcds admits)
    const CASES: &[(u8, usize, bool, bool, bool, bool)] = &[
        (o::GET, 0, true, false, true, true),
        (o::GET, 4, true, false, false, true),
        (o::GET, 0, false, false, false, false),
        (o::GET, 0, true, true, false, false),
        (o::GATK, 4, true, false, true, true),
        (o::GATK, 0, true, false, false, true),
        (o::TOUCH, 4, true, false, true, true),
        (o::TOUCH, 0, true, false, false, false),
        (o::SET, 8, true, true, true, true),
        (o::SET, 8, true, false, true, false),
        (o::SET, 0, true, true, false, false),
        (o::RAUQ, 8, true, false, true, false),
        (o::APPEND, 0, true, false, true, false),
        (o::APPEND, 4, true, true, false, false),
        (o::DELETE, 0, true, false, true, true),
        (o::DELETE, 0, true, true, false, false),
        (o::LOCK, 0, true, false, true, true),
        (o::LOCK, 0, false, false, false, false),
        (o::UNLOCK, 4, true, false, false, false),
        (o::UNLOCK_ALL, 0, false, false, true, true),
        (o::UNLOCK_ALL, 0, true, false, false, false),
        (o::LAG, 4, true, false, true, true),
        (o::LAG, 8, true, false, false, false),
        (o::INCREMENT, 20, true, false, true, true),
        (o::INCREMENT, 8, true, false, false, false),
        (o::FLUSH, 4, false, false, true, true),
        (o::FLUSH, 0, true, false, false, false),
        (o::VERBOSITY, 4, false, false, true, true),
        (o::KEYS, 0, true, false, true, true),
        (o::KEYS, 0, false, false, true, true),
        (o::KEYS, 0, true, true, false, false),
        (o::STAT, 0, true, false, true, true),
        (o::STAT, 4, true, true, true, false),
        (o::NOOP, 3, true, true, true, true),
        (0xe7, 7, true, true, true, true),
    ];

    #[test]
    fn binary_shapes_are_memcached_and_yrmcds_rules() {
        for &(opcode, extras, key, value, memcached, yrmcds) in CASES {
            let e = vec![0u8; extras];
            let k: &[u8] = if key { b"k" } else { b"" };
            let v: &[u8] = if value { b"v" } else { b"" };
            let r = req(opcode, &e, k, v);
            let case = (opcode, extras, key, value);
            assert_eq!(
                SHAPES[usize::from(opcode)].admits(&r),
                memcached,
                "{case:?}"
            );
            assert_eq!(
                SHAPES_YRMCDS[usize::from(opcode)].admits(&r),
                yrmcds,
                "{case:?} yrmcds"
            );
        }
    }
}
