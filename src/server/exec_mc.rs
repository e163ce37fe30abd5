//! memcached text and binary requests applied to the item store, replies encoded in place.
//!
//! Reply texts are memcached's (doc/protocol.txt) and yrmcds's (yrmcds-locking.md); the contract
//! (`shared/specs/README.md`, "memcached + yrmcds locks") settles the rest. With `--compat
//! yrmcds` the cases where yrmcds answers otherwise answer as yrmcds does (`docs/compat.md`).
//! Also yrmcds's extensions: the key dump (`keys`, opcode 0x50), a few thousand slots per step,
//! and the `stats ops` counters ([`McState`]).

use std::collections::BTreeMap;

use super::msg::McOp;
use super::owner::{push_u64, Outbox, Tables};
use super::Shared;
use crate::config::Compat;
use crate::core::codec::{self, DecodeError, Reader};
use crate::core::store::{
    ArithOutcome, DeleteOutcome, ItemView, LockOutcome, RauOutcome, StoreMode, StoreOutcome,
    UnlockOutcome,
};
use crate::core::{ConnId, Now};
use crate::proto::memcache::binary::{self, opcode as opc, status as st};
use crate::proto::memcache::text::{Keys, StoreCmd};

/// Largest reply to one text get/gets/gat/gats (a 64 KiB line names up to ~32,000 keys, each
/// perhaps a whole item): past it the request fails and the connection closes.
const GET_REPLY_CAP: usize = super::REPLY_BUDGET;

/// Store slots one step of a key dump looks at: a few thousand keys at most, a few hundred
/// microseconds of the owner, so other connections' requests wait for no more than that; the
/// next step comes when the worker asks for it ([`McOp::KeysNext`]).
pub const KEYS_SLOTS_PER_STEP: usize = 4096;

/// yrmcds's text commands as `stats ops` names them, in its order (cybozu/yrmcds
/// src/memcache/memcache.cpp, `stats_ops`).
pub const TEXT_OPS: [&str; 22] = [
    "set",
    "add",
    "replace",
    "append",
    "prepend",
    "cas",
    "get",
    "gets",
    "delete",
    "incr",
    "decr",
    "touch",
    "lock",
    "unlock",
    "unlock_all",
    "slabs",
    "stats",
    "flush_all",
    "version",
    "verbosity",
    "quit",
    "keys",
];

/// yrmcds's binary commands as `stats ops` names them, in its order, with their opcodes.
pub const BINARY_OPS: [(&str, u8); 45] = [
    ("Get", opc::GET),
    ("Set", opc::SET),
    ("Add", opc::ADD),
    ("Replace", opc::REPLACE),
    ("Delete", opc::DELETE),
    ("Increment", opc::INCREMENT),
    ("Decrement", opc::DECREMENT),
    ("Quit", opc::QUIT),
    ("Flush", opc::FLUSH),
    ("GetQ", opc::GETQ),
    ("Noop", opc::NOOP),
    ("Version", opc::VERSION),
    ("GetK", opc::GETK),
    ("GetKQ", opc::GETKQ),
    ("Append", opc::APPEND),
    ("Prepend", opc::PREPEND),
    ("Stat", opc::STAT),
    ("SetQ", opc::SETQ),
    ("AddQ", opc::ADDQ),
    ("ReplaceQ", opc::REPLACEQ),
    ("DeleteQ", opc::DELETEQ),
    ("IncrementQ", opc::INCREMENTQ),
    ("DecrementQ", opc::DECREMENTQ),
    ("QuitQ", opc::QUITQ),
    ("FlushQ", opc::FLUSHQ),
    ("AppendQ", opc::APPENDQ),
    ("PrependQ", opc::PREPENDQ),
    ("Touch", opc::TOUCH),
    ("GaT", opc::GAT),
    ("GaTQ", opc::GATQ),
    ("GaTK", opc::GATK),
    ("GaTKQ", opc::GATKQ),
    ("Lock", opc::LOCK),
    ("LockQ", opc::LOCKQ),
    ("Unlock", opc::UNLOCK),
    ("UnlockQ", opc::UNLOCKQ),
    ("UnlockAll", opc::UNLOCK_ALL),
    ("UnlockAllQ", opc::UNLOCK_ALLQ),
    ("LaG", opc::LAG),
    ("LaGQ", opc::LAGQ),
    ("LaGK", opc::LAGK),
    ("LaGKQ", opc::LAGKQ),
    ("RaU", opc::RAU),
    ("RaUQ", opc::RAUQ),
    ("Keys", opc::KEYS),
];

/// What the owner keeps for the memcached port beyond the store: key dumps under way (by
/// connection, so that their order is the same everywhere) and the `stats ops` counters.
pub struct McState {
    dumps: BTreeMap<ConnId, KeyDump>,
    /// Per [`TEXT_OPS`] entry.
    pub text_ops: [u64; TEXT_OPS.len()],
    /// Per opcode (only those of [`BINARY_OPS`] count).
    pub binary_ops: [u64; 256],
}

impl Default for McState {
    fn default() -> Self {
        McState {
            dumps: BTreeMap::new(),
            text_ops: [0; TEXT_OPS.len()],
            binary_ops: [0; 256],
        }
    }
}

/// One key dump under way: what it lists, where it goes on, how it answers.
#[derive(Debug, PartialEq, Eq)]
struct KeyDump {
    prefix: Vec<u8>,
    next: u32,
    /// `None`: text; else the binary request's opaque.
    binary: Option<u32>,
}

impl McState {
    /// The counters (binary ones for yrmcds's opcodes only: the others are never shown) and the
    /// dumps, dumps in connection order. A dump's position is a store
    /// slot: slot numbers are not canonical, so a dump under way when the state is restored
    /// goes on from the same slot number of the restored store (`docs/compat.md`).
    pub fn snapshot(&self, out: &mut Vec<u8>) {
        for &v in &self.text_ops {
            codec::put_u64(out, v);
        }
        for &(_, op) in &BINARY_OPS {
            codec::put_u64(out, self.binary_ops[usize::from(op)]);
        }
        codec::put_u64(out, self.dumps.len() as u64);
        for (conn, d) in &self.dumps {
            conn.encode(out);
            codec::put_bytes(out, &d.prefix);
            codec::put_u64(out, u64::from(d.next));
            codec::put_opt_u64(out, d.binary.map(u64::from));
        }
    }

    pub fn restore(r: &mut Reader<'_>) -> Result<McState, DecodeError> {
        let mut s = McState::default();
        for v in &mut s.text_ops {
            *v = r.u64()?;
        }
        for &(_, op) in &BINARY_OPS {
            s.binary_ops[usize::from(op)] = r.u64()?;
        }
        let n = r.count(6)?;
        for _ in 0..n {
            let conn = ConnId::decode(r)?;
            let prefix = r.bytes(crate::core::store::MAX_KEY_LEN)?.to_vec();
            let next = r.u32()?;
            let binary = match r.opt_u64()? {
                None => None,
                Some(v) => Some(u32::try_from(v).map_err(|_| DecodeError::Invalid("dump opaque"))?),
            };
            let d = KeyDump {
                prefix,
                next,
                binary,
            };
            if s.dumps.insert(conn, d).is_some() {
                return Err(DecodeError::Invalid("two dumps of one connection"));
            }
        }
        Ok(s)
    }

    /// The connection is gone: its dump ends.
    pub fn disconnect(&mut self, conn: ConnId) {
        self.dumps.remove(&conn);
    }
}

/// The [`TEXT_OPS`] entry a text request counts under (an index, so that counting is one
/// increment; `text_ops_are_counted_under_their_yrmcds_names` checks the numbers). yrmcds has no
/// gat/gats: they count as get/gets.
fn text_op_index(op: &McOp) -> Option<usize> {
    Some(match op {
        McOp::TextStore { cmd, .. } => match cmd {
            StoreCmd::Set => 0,
            StoreCmd::Add => 1,
            StoreCmd::Replace => 2,
            StoreCmd::Append => 3,
            StoreCmd::Prepend => 4,
            StoreCmd::Cas => 5,
        },
        McOp::TextGet { cas: false, .. } => 6,
        McOp::TextGet { cas: true, .. } => 7,
        McOp::TextDelete { .. } => 8,
        McOp::TextArith { incr: true, .. } => 9,
        McOp::TextArith { incr: false, .. } => 10,
        McOp::TextTouch { .. } => 11,
        McOp::TextLock { .. } => 12,
        McOp::TextUnlock { .. } => 13,
        McOp::TextUnlockAll => 14,
        McOp::TextStats { .. } => 16,
        McOp::TextFlush { .. } => 17,
        McOp::TextKeys { .. } => 21,
        McOp::KeysNext | McOp::TextLockToken { .. } | McOp::Binary { .. } => return None,
    })
}

/// One step of `conn`'s dump: up to [`KEYS_SLOTS_PER_STEP`] slots listed into one record. The
/// last step ends the listing (`END`, or binary's empty response) and completes the request;
/// the others complete nothing and the worker asks for the next once this one went out.
fn dump_step(t: &mut Tables, out: &mut Outbox, conn: ConnId, now: Now) {
    let Some(d) = t.mc.dumps.get_mut(&conn) else {
        // No dump (a `KeysNext` after the connection's dump ended): nothing to answer.
        return;
    };
    let store = &t.store;
    let mut next = None;
    let binary = d.binary;
    out.record_then(conn, 0, |o| {
        next = store.keys_step(
            d.next,
            &d.prefix,
            KEYS_SLOTS_PER_STEP,
            now,
            |key| match binary {
                None => {
                    o.extend_from_slice(b"VALUE ");
                    o.extend_from_slice(key);
                    o.extend_from_slice(b"\r\n");
                }
                Some(opaque) => {
                    binary::encode_response(o, opc::KEYS, st::NO_ERROR, opaque, 0, &[], key, &[])
                }
            },
        );
        if next.is_none() {
            match binary {
                None => o.extend_from_slice(b"END\r\n"),
                Some(opaque) => {
                    binary::encode_response(o, opc::KEYS, st::NO_ERROR, opaque, 0, &[], &[], &[])
                }
            }
        }
        false
    });
    match next {
        Some(slot) => d.next = slot,
        None => {
            // The record above ends the request: it completes it.
            if let Some(rec) = out
                .per_worker
                .get_mut(conn.worker as usize)
                .and_then(|r| r.records.last_mut())
                .filter(|rec| rec.conn == conn)
            {
                rec.done = 1;
            }
            t.mc.dumps.remove(&conn);
        }
    }
}

/// Start a key dump for `conn` (a second one replaces a stale first; the worker sends none
/// while one runs).
fn dump_start(
    t: &mut Tables,
    out: &mut Outbox,
    conn: ConnId,
    prefix: &[u8],
    binary: Option<u32>,
    now: Now,
) {
    let d = KeyDump {
        prefix: prefix.to_vec(),
        next: 0,
        binary,
    };
    t.mc.dumps.insert(conn, d);
    dump_step(t, out, conn, now);
}

pub fn apply(
    t: &mut Tables,
    out: &mut Outbox,
    shared: &Shared,
    conn: ConnId,
    op: McOp,
    arena: &[u8],
    now: Now,
) {
    match op {
        McOp::Binary {
            opcode,
            opaque,
            cas,
            extras,
            key,
            value,
        } => {
            let req = BinReq {
                opcode,
                opaque,
                cas,
                extras: extras.get(arena),
                key: key.get(arena),
                value: value.get(arena),
            };
            apply_binary(t, out, shared, conn, &req, now)
        }
        McOp::KeysNext => dump_step(t, out, conn, now),
        op => apply_text(t, out, shared, conn, op, arena, now),
    }
}

// ---------------------------------------------------------------------------------------------
// Text

fn apply_text(
    t: &mut Tables,
    out: &mut Outbox,
    shared: &Shared,
    conn: ConnId,
    op: McOp,
    arena: &[u8],
    now: Now,
) {
    if let Some(i) = text_op_index(&op) {
        t.mc.text_ops[i] += 1;
    }
    let yrmcds = shared.config.compat == Compat::Yrmcds;
    let s = &mut t.store;
    match op {
        // yrmcds has no gat/gats.
        McOp::TextGet {
            exptime: Some(_), ..
        } if yrmcds => text_reply(out, conn, false, b"ERROR\r\n"),
        McOp::TextGet { keys, cas, exptime } => {
            out.record_then(conn, 1, |o| {
                let start = o.len();
                for key in (Keys {
                    raw: keys.get(arena),
                }) {
                    t.counters.cmd_get += 1;
                    let item = match exptime {
                        Some(e) => {
                            t.counters.cmd_touch += 1;
                            s.get_and_touch(key, e, now)
                        }
                        None => s.get(key, now),
                    };
                    if let Some(item) = item {
                        text_value(o, &item, cas);
                    }
                    if o.len() - start > GET_REPLY_CAP {
                        // As memcached does when a multi-get outgrows its buffers: say so and
                        // close, rather than build a reply of unbounded size.
                        o.truncate(start);
                        o.extend_from_slice(b"SERVER_ERROR out of memory writing get response\r\n");
                        return true;
                    }
                }
                o.extend_from_slice(b"END\r\n");
                false
            });
        }
        McOp::TextStore {
            cmd,
            key,
            flags,
            exptime,
            value,
            cas,
            noreply,
        } => {
            t.counters.cmd_set += 1;
            let (mode, cas) = match cmd {
                StoreCmd::Set => (StoreMode::Set, None),
                StoreCmd::Add => (StoreMode::Add, None),
                StoreCmd::Replace => (StoreMode::Replace, None),
                StoreCmd::Append => (StoreMode::Append, None),
                StoreCmd::Prepend => (StoreMode::Prepend, None),
                StoreCmd::Cas => (StoreMode::Set, Some(cas)),
            };
            let r = s.store(
                conn,
                mode,
                key.get(arena),
                flags,
                exptime,
                value.get(arena),
                cas,
                now,
            );
            let reply: &[u8] = match r {
                StoreOutcome::Stored { .. } => b"STORED\r\n",
                StoreOutcome::NotStored => b"NOT_STORED\r\n",
                StoreOutcome::Exists => b"EXISTS\r\n",
                StoreOutcome::NotFound => b"NOT_FOUND\r\n",
                StoreOutcome::Locked => b"LOCKED\r\n",
                StoreOutcome::TooLarge => b"SERVER_ERROR object too large for cache\r\n",
                StoreOutcome::OutOfMemory => b"SERVER_ERROR out of memory storing object\r\n",
            };
            text_reply(out, conn, noreply, reply);
        }
        McOp::TextDelete { key, noreply } => {
            let reply: &[u8] = match s.delete(conn, key.get(arena), None, now) {
                DeleteOutcome::Deleted => b"DELETED\r\n",
                DeleteOutcome::NotFound => b"NOT_FOUND\r\n",
                DeleteOutcome::Exists => b"EXISTS\r\n",
                DeleteOutcome::Locked => b"LOCKED\r\n",
            };
            text_reply(out, conn, noreply, reply);
        }
        McOp::TextArith {
            key,
            incr,
            delta,
            noreply,
        } => {
            let r = s.incr_decr(conn, key.get(arena), incr, delta, None, None, now);
            out.record(conn, 1, false, |o| {
                if noreply {
                    return;
                }
                match r {
                    ArithOutcome::Value { value, .. } => {
                        push_u64(o, value);
                        o.extend_from_slice(b"\r\n");
                    }
                    ArithOutcome::NotFound => o.extend_from_slice(b"NOT_FOUND\r\n"),
                    ArithOutcome::NonNumeric => o.extend_from_slice(
                        b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
                    ),
                    ArithOutcome::Exists => o.extend_from_slice(b"EXISTS\r\n"),
                    ArithOutcome::Locked => o.extend_from_slice(b"LOCKED\r\n"),
                    ArithOutcome::OutOfMemory => {
                        o.extend_from_slice(b"SERVER_ERROR out of memory\r\n")
                    }
                }
            });
        }
        McOp::TextTouch {
            key,
            exptime,
            noreply,
        } => {
            t.counters.cmd_touch += 1;
            let hit = s.touch(key.get(arena), exptime, now);
            text_reply(
                out,
                conn,
                noreply,
                if hit {
                    b"TOUCHED\r\n"
                } else {
                    b"NOT_FOUND\r\n"
                },
            );
        }
        McOp::TextFlush { delay, noreply } => {
            t.counters.cmd_flush += 1;
            s.flush_all(delay, now);
            text_reply(out, conn, noreply, b"OK\r\n");
        }
        // yrmcds has no `stats slabs` nor `stats conns`.
        McOp::TextStats { arg }
            if yrmcds && matches!(arg.map(|a| a.get(arena)), Some(b"slabs" | b"conns")) =>
        {
            text_reply(out, conn, false, b"ERROR\r\n")
        }
        McOp::TextStats { arg } => {
            let arg = arg.map(|a| a.get(arena));
            out.record(conn, 1, false, |o| {
                let known = super::stats::write(t, shared, now, arg, &mut |name, value| {
                    o.extend_from_slice(b"STAT ");
                    o.extend_from_slice(name.as_bytes());
                    o.push(b' ');
                    o.extend_from_slice(value);
                    o.extend_from_slice(b"\r\n");
                });
                o.extend_from_slice(if known { b"END\r\n" } else { b"ERROR\r\n" });
            });
        }
        McOp::TextLock { key } => {
            let reply: &[u8] = match s.lock(conn, key.get(arena), now) {
                LockOutcome::Ok => b"OK\r\n",
                LockOutcome::Locked => b"LOCKED\r\n",
                LockOutcome::NotFound => b"NOT_FOUND\r\n",
            };
            text_reply(out, conn, false, reply);
        }
        McOp::TextUnlock { key } => {
            let reply: &[u8] = match s.unlock(conn, key.get(arena), now) {
                UnlockOutcome::Ok => b"OK\r\n",
                UnlockOutcome::NotFound | UnlockOutcome::NotLocked => {
                    b"CLIENT_ERROR object is not locked or not found\r\n"
                }
            };
            text_reply(out, conn, false, reply);
        }
        McOp::TextLockToken { key } => {
            out.record(conn, 1, false, |o| {
                match s.lock_token(conn, key.get(arena), now) {
                    Some(token) => {
                        o.extend_from_slice(b"TOKEN ");
                        push_u64(o, token);
                        o.extend_from_slice(b"\r\n");
                    }
                    None => o.extend_from_slice(b"CLIENT_ERROR object is not locked by you\r\n"),
                }
            });
        }
        McOp::TextUnlockAll => {
            s.unlock_all(conn, now);
            text_reply(out, conn, false, b"OK\r\n");
        }
        McOp::TextKeys { prefix } => dump_start(t, out, conn, prefix.get(arena), None, now),
        McOp::Binary { .. } | McOp::KeysNext => {}
    }
}

fn text_reply(out: &mut Outbox, conn: ConnId, noreply: bool, reply: &[u8]) {
    out.record(conn, 1, false, |o| {
        if !noreply {
            o.extend_from_slice(reply)
        }
    });
}

/// `VALUE <key> <flags> <bytes> [<cas>]\r\n<data>\r\n`
fn text_value(o: &mut Vec<u8>, item: &ItemView<'_>, cas: bool) {
    o.extend_from_slice(b"VALUE ");
    o.extend_from_slice(item.key);
    o.push(b' ');
    push_u64(o, item.flags as u64);
    o.push(b' ');
    push_u64(o, item.value.len() as u64);
    if cas {
        o.push(b' ');
        push_u64(o, item.cas);
    }
    o.extend_from_slice(b"\r\n");
    o.extend_from_slice(item.value);
    o.extend_from_slice(b"\r\n");
}

// ---------------------------------------------------------------------------------------------
// Binary

struct BinReq<'a> {
    opcode: u8,
    opaque: u32,
    cas: u64,
    extras: &'a [u8],
    key: &'a [u8],
    value: &'a [u8],
}

/// The shape a request of one opcode must have (protocol-binary.xml's MUST / MUST NOT).
#[derive(Clone, Copy)]
enum Need {
    No,
    Yes,
    Any,
}

/// What a request of `opcode` must carry: the extras lengths allowed, a key, a value. `None`
/// for opcodes that take anything (NOOP, VERSION, QUIT, STAT) or are unknown.
fn shape(opcode: u8) -> Option<(&'static [usize], Need, Need)> {
    use Need::*;
    Some(match opcode {
        opc::KEYS => (&[0], Any, No),
        opc::GET | opc::GETQ | opc::GETK | opc::GETKQ => (&[0], Yes, No),
        opc::GAT | opc::GATQ | opc::GATK | opc::GATKQ | opc::TOUCH => (&[4], Yes, No),
        opc::SET | opc::SETQ | opc::ADD | opc::ADDQ | opc::REPLACE | opc::REPLACEQ => {
            (&[8], Yes, Any)
        }
        opc::RAU | opc::RAUQ => (&[8], Yes, Any),
        opc::APPEND | opc::APPENDQ | opc::PREPEND | opc::PREPENDQ => (&[0], Yes, Any),
        opc::DELETE | opc::DELETEQ => (&[0], Yes, No),
        opc::LOCK | opc::LOCKQ | opc::UNLOCK | opc::UNLOCKQ => (&[0], Yes, No),
        opc::UNLOCK_ALL | opc::UNLOCK_ALLQ => (&[0], No, No),
        opc::LAG | opc::LAGQ | opc::LAGK | opc::LAGKQ => (&[0, 4], Yes, No),
        opc::INCREMENT | opc::INCREMENTQ | opc::DECREMENT | opc::DECREMENTQ => (&[20], Yes, No),
        opc::FLUSH | opc::FLUSHQ => (&[0, 4], No, No),
        opc::VERBOSITY => (&[4], No, No),
        _ => return None,
    })
}

/// yrmcds's shapes where they differ (cybozu/yrmcds src/memcache/memcache.cpp,
/// `binary_request::parse`): every get may carry a 4-byte expiration (and then touches), a
/// store, append or prepend must carry a value, a Stat nothing but its key.
fn shape_yrmcds(opcode: u8) -> Option<(&'static [usize], Need, Need)> {
    use Need::*;
    Some(match opcode {
        opc::GET | opc::GETQ | opc::GETK | opc::GETKQ => (&[0, 4], Yes, No),
        opc::GAT | opc::GATQ | opc::GATK | opc::GATKQ => (&[0, 4], Yes, No),
        opc::SET | opc::SETQ | opc::ADD | opc::ADDQ | opc::REPLACE | opc::REPLACEQ => {
            (&[8], Yes, Yes)
        }
        opc::RAU | opc::RAUQ => (&[8], Yes, Yes),
        opc::APPEND | opc::APPENDQ | opc::PREPEND | opc::PREPENDQ => (&[0], Yes, Yes),
        opc::STAT => (&[0], Any, No),
        op => return shape(op),
    })
}

fn shape_ok(r: &BinReq<'_>, extras: &[usize], key: Need, value: Need) -> bool {
    let present = |n: Need, len: usize| match n {
        Need::No => len == 0,
        Need::Yes => len > 0,
        Need::Any => true,
    };
    extras.contains(&r.extras.len()) && present(key, r.key.len()) && present(value, r.value.len())
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

/// Error bodies, as memcached words them (yrmcds's where its words differ).
fn status_text(status: u16, yrmcds: bool) -> &'static [u8] {
    if yrmcds {
        // cybozu/yrmcds src/memcache/memcache.cpp, the STATUS_* texts.
        match status {
            st::KEY_EXISTS => return b"Exists",
            st::VALUE_TOO_LARGE => return b"Too large value",
            st::INVALID_ARGUMENTS => return b"Invalid request",
            st::ITEM_NOT_STORED => return b"Not stored",
            st::NON_NUMERIC => return b"Non-numeric value",
            _ => {}
        }
    }
    match status {
        st::KEY_NOT_FOUND => b"Not found",
        st::KEY_EXISTS => b"Data exists for key.",
        st::VALUE_TOO_LARGE => b"Too large.",
        st::INVALID_ARGUMENTS => b"Invalid arguments",
        st::ITEM_NOT_STORED => b"Not stored.",
        st::NON_NUMERIC => b"Non-numeric server-side value for incr or decr",
        st::LOCKED => b"Locked",
        st::NOT_LOCKED => b"Not locked",
        st::UNKNOWN_COMMAND => b"Unknown command",
        st::OUT_OF_MEMORY => b"Out of memory",
        _ => b"",
    }
}

struct Bin<'o> {
    out: &'o mut Outbox,
    conn: ConnId,
    opcode: u8,
    opaque: u32,
    quiet: bool,
    yrmcds: bool,
}

impl Bin<'_> {
    /// A reply that a quiet variant suppresses on success.
    fn ok(self, cas: u64, extras: &[u8], key: &[u8], value: &[u8]) {
        let silent = self.quiet;
        self.success(silent, cas, extras, key, value);
    }

    /// A found item: answered even by the quiet get variants (GetQ/GetKQ/GatQ/GatKQ/LaGQ/LaGKQ
    /// are silent only on a miss).
    fn hit(self, cas: u64, extras: &[u8], key: &[u8], value: &[u8]) {
        self.success(false, cas, extras, key, value);
    }

    fn success(self, silent: bool, cas: u64, extras: &[u8], key: &[u8], value: &[u8]) {
        let Bin {
            out,
            conn,
            opcode,
            opaque,
            ..
        } = self;
        out.record(conn, 1, false, |o| {
            if !silent {
                binary::encode_response(o, opcode, st::NO_ERROR, opaque, cas, extras, key, value)
            }
        });
    }

    /// An error reply (quiet variants answer errors too).
    fn err(self, status: u16) {
        let Bin {
            out,
            conn,
            opcode,
            opaque,
            yrmcds,
            ..
        } = self;
        let text = status_text(status, yrmcds);
        out.record(conn, 1, false, |o| {
            binary::encode_response(o, opcode, status, opaque, 0, &[], &[], text)
        });
    }

    /// An error that a quiet variant suppresses (yrmcds: a DeleteQ of a missing key).
    fn err_unless_quiet(self, status: u16) {
        if self.quiet {
            self.out.record(self.conn, 1, false, |_| {});
        } else {
            self.err(status);
        }
    }

    /// A miss that a quiet get suppresses. yrmcds's miss never carries the key, and its LaGQ
    /// answers a miss (`cmd_bin`: "! cmd.quiet() || cmd.command() == LaGQ").
    fn miss(self, key: &[u8], with_key: bool) {
        let Bin {
            out,
            conn,
            opcode,
            opaque,
            quiet,
            yrmcds,
        } = self;
        let quiet = quiet && !(yrmcds && opcode == opc::LAGQ);
        let with_key = with_key && !yrmcds;
        out.record(conn, 1, false, |o| {
            if !quiet {
                let key = if with_key { key } else { &[] };
                binary::encode_response(
                    o,
                    opcode,
                    st::KEY_NOT_FOUND,
                    opaque,
                    0,
                    &[],
                    key,
                    status_text(st::KEY_NOT_FOUND, yrmcds),
                )
            }
        });
    }
}

fn store_status(r: StoreOutcome) -> Result<u64, u16> {
    match r {
        StoreOutcome::Stored { cas } => Ok(cas),
        StoreOutcome::NotStored => Err(st::ITEM_NOT_STORED),
        StoreOutcome::Exists => Err(st::KEY_EXISTS),
        StoreOutcome::NotFound => Err(st::KEY_NOT_FOUND),
        StoreOutcome::Locked => Err(st::LOCKED),
        StoreOutcome::TooLarge => Err(st::VALUE_TOO_LARGE),
        StoreOutcome::OutOfMemory => Err(st::OUT_OF_MEMORY),
    }
}

fn apply_binary(
    t: &mut Tables,
    out: &mut Outbox,
    shared: &Shared,
    conn: ConnId,
    r: &BinReq<'_>,
    now: Now,
) {
    let quiet = opc::is_quiet(r.opcode);
    let yrmcds = shared.config.compat == Compat::Yrmcds;
    let b = Bin {
        out,
        conn,
        opcode: r.opcode,
        opaque: r.opaque,
        quiet,
        yrmcds,
    };
    if yrmcds && r.opcode == opc::VERBOSITY {
        // yrmcds has no binary Verbosity.
        return b.err(st::UNKNOWN_COMMAND);
    }
    let want = if yrmcds {
        shape_yrmcds(r.opcode)
    } else {
        shape(r.opcode)
    };
    if let Some((extras, key, value)) = want {
        if !shape_ok(r, extras, key, value) {
            return b.err(st::INVALID_ARGUMENTS);
        }
    }
    // Every opcode counts; `stats ops` shows those yrmcds names.
    t.mc.binary_ops[usize::from(r.opcode)] += 1;
    let cas = (r.cas != 0).then_some(r.cas);
    let s = &mut t.store;
    match r.opcode {
        opc::GET
        | opc::GETQ
        | opc::GETK
        | opc::GETKQ
        | opc::GAT
        | opc::GATQ
        | opc::GATK
        | opc::GATKQ => {
            // A GaT always has an expiration; in yrmcds mode a Get may have one and a GaT not.
            let touch = r.extras.len() == 4;
            let with_key = matches!(r.opcode, opc::GETK | opc::GETKQ | opc::GATK | opc::GATKQ);
            t.counters.cmd_get += 1;
            let item = if touch {
                t.counters.cmd_touch += 1;
                s.get_and_touch(r.key, exptime(r.extras, 0), now)
            } else {
                s.get(r.key, now)
            };
            match item {
                Some(item) => b.hit(
                    item.cas,
                    &item.flags.to_be_bytes(),
                    if with_key { item.key } else { &[] },
                    item.value,
                ),
                None => b.miss(r.key, with_key),
            }
        }
        opc::SET | opc::SETQ | opc::ADD | opc::ADDQ | opc::REPLACE | opc::REPLACEQ => {
            t.counters.cmd_set += 1;
            let mode = match r.opcode {
                opc::SET | opc::SETQ => StoreMode::Set,
                opc::ADD | opc::ADDQ => StoreMode::Add,
                _ => StoreMode::Replace,
            };
            let flags = be32(r.extras, 0);
            let res = s.store(
                conn,
                mode,
                r.key,
                flags,
                exptime(r.extras, 4),
                r.value,
                cas,
                now,
            );
            match store_status(res) {
                Ok(cas) => b.ok(cas, &[], &[], &[]),
                // memcached: add of an existing key answers "exists"; replace of a missing one
                // "not found".
                Err(st::ITEM_NOT_STORED) if mode == StoreMode::Add => b.err(st::KEY_EXISTS),
                Err(st::ITEM_NOT_STORED) => b.err(st::KEY_NOT_FOUND),
                Err(e) => b.err(e),
            }
        }
        opc::APPEND | opc::APPENDQ | opc::PREPEND | opc::PREPENDQ => {
            t.counters.cmd_set += 1;
            let mode = if matches!(r.opcode, opc::APPEND | opc::APPENDQ) {
                StoreMode::Append
            } else {
                StoreMode::Prepend
            };
            match store_status(s.store(conn, mode, r.key, 0, 0, r.value, cas, now)) {
                Ok(cas) => b.ok(cas, &[], &[], &[]),
                // yrmcds: append or prepend to a missing item is "not found".
                Err(st::ITEM_NOT_STORED) if yrmcds => b.err(st::KEY_NOT_FOUND),
                Err(e) => b.err(e),
            }
        }
        opc::DELETE | opc::DELETEQ => match s.delete(conn, r.key, cas, now) {
            DeleteOutcome::Deleted => b.ok(0, &[], &[], &[]),
            // yrmcds: a DeleteQ of a missing key is silent.
            DeleteOutcome::NotFound if yrmcds => b.err_unless_quiet(st::KEY_NOT_FOUND),
            DeleteOutcome::NotFound => b.err(st::KEY_NOT_FOUND),
            DeleteOutcome::Exists => b.err(st::KEY_EXISTS),
            DeleteOutcome::Locked => b.err(st::LOCKED),
        },
        opc::INCREMENT | opc::INCREMENTQ | opc::DECREMENT | opc::DECREMENTQ => {
            let incr = matches!(r.opcode, opc::INCREMENT | opc::INCREMENTQ);
            let delta = be64(r.extras, 0);
            let initial = be64(r.extras, 8);
            let exp = be32(r.extras, 16);
            // An expiration of all ones means "do not create".
            let create = (exp != u32::MAX).then_some((initial, exp as i32 as i64));
            match s.incr_decr(conn, r.key, incr, delta, create, cas, now) {
                ArithOutcome::Value { value, cas } => b.ok(cas, &[], &[], &value.to_be_bytes()),
                ArithOutcome::NotFound => b.err(st::KEY_NOT_FOUND),
                ArithOutcome::NonNumeric => b.err(st::NON_NUMERIC),
                ArithOutcome::Exists => b.err(st::KEY_EXISTS),
                ArithOutcome::Locked => b.err(st::LOCKED),
                ArithOutcome::OutOfMemory => b.err(st::OUT_OF_MEMORY),
            }
        }
        opc::QUIT | opc::QUITQ => {
            let Bin {
                out,
                conn,
                opcode,
                opaque,
                quiet,
                ..
            } = b;
            out.record(conn, 1, true, |o| {
                if !quiet {
                    binary::encode_response(o, opcode, st::NO_ERROR, opaque, 0, &[], &[], &[])
                }
            });
        }
        opc::FLUSH | opc::FLUSHQ => {
            t.counters.cmd_flush += 1;
            let delay = if r.extras.len() == 4 {
                exptime(r.extras, 0)
            } else {
                0
            };
            s.flush_all(delay, now);
            b.ok(0, &[], &[], &[]);
        }
        opc::NOOP => b.ok(0, &[], &[], &[]),
        opc::VERSION => {
            let v = super::VERSION_REPLY;
            b.ok(0, &[], &[], &v[b"VERSION ".len()..v.len() - 2]);
        }
        opc::VERBOSITY => {
            b.ok(0, &[], &[], &[]);
        }
        opc::STAT => {
            let Bin {
                out,
                conn,
                opcode,
                opaque,
                ..
            } = b;
            let mut arg = (!r.key.is_empty()).then_some(r.key);
            if yrmcds && !matches!(arg, Some(b"settings" | b"items" | b"sizes" | b"ops")) {
                // yrmcds answers any other group with the general statistics.
                arg = None;
            }
            out.record(conn, 1, false, |o| {
                let known = super::stats::write(t, shared, now, arg, &mut |name, value| {
                    binary::encode_response(
                        o,
                        opcode,
                        st::NO_ERROR,
                        opaque,
                        0,
                        &[],
                        name.as_bytes(),
                        value,
                    )
                });
                if known {
                    binary::encode_response(o, opcode, st::NO_ERROR, opaque, 0, &[], &[], &[]);
                } else {
                    binary::encode_response(
                        o,
                        opcode,
                        st::KEY_NOT_FOUND,
                        opaque,
                        0,
                        &[],
                        &[],
                        b"Not found",
                    );
                }
            });
        }
        opc::TOUCH => {
            t.counters.cmd_touch += 1;
            if s.touch(r.key, exptime(r.extras, 0), now) {
                // yrmcds answers a touch with the item's CAS.
                let cas = if yrmcds {
                    s.peek(r.key, now).map_or(0, |item| item.cas)
                } else {
                    0
                };
                b.ok(cas, &[], &[], &[]);
            } else {
                b.err(st::KEY_NOT_FOUND);
            }
        }
        // The CAS field of a successful Lock carries its fencing token (contract: "Fencing
        // tokens"); memcached clients ignore a Lock reply's CAS.
        opc::LOCK | opc::LOCKQ => match s.lock_for_token(conn, r.key, now) {
            Ok(token) => b.ok(token, &[], &[], &[]),
            Err(LockOutcome::Locked) => b.err(st::LOCKED),
            Err(_) => b.err(st::KEY_NOT_FOUND),
        },
        opc::UNLOCK | opc::UNLOCKQ => match s.unlock(conn, r.key, now) {
            UnlockOutcome::Ok => b.ok(0, &[], &[], &[]),
            UnlockOutcome::NotFound => b.err(st::KEY_NOT_FOUND),
            UnlockOutcome::NotLocked => b.err(st::NOT_LOCKED),
        },
        opc::UNLOCK_ALL | opc::UNLOCK_ALLQ => {
            s.unlock_all(conn, now);
            b.ok(0, &[], &[], &[]);
        }
        opc::LAG | opc::LAGQ | opc::LAGK | opc::LAGKQ => {
            let with_key = matches!(r.opcode, opc::LAGK | opc::LAGKQ);
            let exp = (r.extras.len() == 4).then(|| exptime(r.extras, 0));
            t.counters.cmd_get += 1;
            match s.lock_and_get(conn, r.key, exp, now) {
                Ok(item) => b.hit(
                    item.cas,
                    &item.flags.to_be_bytes(),
                    if with_key { item.key } else { &[] },
                    item.value,
                ),
                Err(LockOutcome::NotFound) => b.miss(r.key, with_key),
                Err(_) => b.err(st::LOCKED),
            }
        }
        opc::RAU | opc::RAUQ => {
            t.counters.cmd_set += 1;
            let flags = be32(r.extras, 0);
            match s.replace_and_unlock(conn, r.key, flags, exptime(r.extras, 4), r.value, cas, now)
            {
                RauOutcome::Stored { cas } => b.ok(cas, &[], &[], &[]),
                RauOutcome::NotFound => b.err(st::KEY_NOT_FOUND),
                RauOutcome::NotLocked => b.err(st::NOT_LOCKED),
                RauOutcome::Exists => b.err(st::KEY_EXISTS),
                RauOutcome::TooLarge => b.err(st::VALUE_TOO_LARGE),
                RauOutcome::OutOfMemory => b.err(st::OUT_OF_MEMORY),
            }
        }
        opc::KEYS => {
            let Bin { out, opaque, .. } = b;
            dump_start(t, out, conn, r.key, Some(opaque), now);
        }
        _ => b.err(st::UNKNOWN_COMMAND),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::msg::Span;

    #[test]
    fn text_ops_are_counted_under_their_yrmcds_names() {
        let k = Span::EMPTY;
        let store = |cmd| McOp::TextStore {
            cmd,
            key: k,
            flags: 0,
            exptime: 0,
            value: k,
            cas: 0,
            noreply: false,
        };
        let arith = |incr| McOp::TextArith {
            key: k,
            incr,
            delta: 1,
            noreply: false,
        };
        let get = |cas| McOp::TextGet {
            keys: k,
            cas,
            exptime: None,
        };
        let cases = [
            (store(StoreCmd::Set), "set"),
            (store(StoreCmd::Add), "add"),
            (store(StoreCmd::Replace), "replace"),
            (store(StoreCmd::Append), "append"),
            (store(StoreCmd::Prepend), "prepend"),
            (store(StoreCmd::Cas), "cas"),
            (get(false), "get"),
            (get(true), "gets"),
            (
                McOp::TextGet {
                    keys: k,
                    cas: true,
                    exptime: Some(1),
                },
                "gets",
            ),
            (
                McOp::TextDelete {
                    key: k,
                    noreply: false,
                },
                "delete",
            ),
            (arith(true), "incr"),
            (arith(false), "decr"),
            (
                McOp::TextTouch {
                    key: k,
                    exptime: 0,
                    noreply: false,
                },
                "touch",
            ),
            (McOp::TextLock { key: k }, "lock"),
            (McOp::TextUnlock { key: k }, "unlock"),
            (McOp::TextUnlockAll, "unlock_all"),
            (McOp::TextStats { arg: None }, "stats"),
            (
                McOp::TextFlush {
                    delay: 0,
                    noreply: false,
                },
                "flush_all",
            ),
            (McOp::TextKeys { prefix: k }, "keys"),
        ];
        for (op, name) in cases {
            let i = text_op_index(&op).expect("counted");
            assert_eq!(TEXT_OPS[i], name, "{op:?}");
        }
        assert_eq!(text_op_index(&McOp::KeysNext), None);
    }

    #[test]
    fn binary_ops_list_yrmcds_opcodes_once_each() {
        let mut seen = [false; 256];
        for (name, op) in BINARY_OPS {
            assert!(!seen[usize::from(op)], "{name} twice");
            seen[usize::from(op)] = true;
        }
        assert_eq!(BINARY_OPS[0], ("Get", 0x00));
        assert_eq!(BINARY_OPS[44], ("Keys", 0x50));
    }
}
