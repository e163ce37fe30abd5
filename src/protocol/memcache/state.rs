//! What the owner keeps for the memcached port beyond the item store: yrmcds's key dumps under
//! way and its `stats ops` counters, with their snapshot.
//!
//! Owns: that state and its canonical bytes. Must not: answer requests (`exec.rs` does).

use std::collections::BTreeMap;

use super::wire::binary::opcode as opc;
use crate::core::codec::{self, DecodeError, Reader};
use crate::core::Session;

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
    pub(super) dumps: BTreeMap<Session, KeyDump>,
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
pub(super) struct KeyDump {
    pub(super) prefix: Vec<u8>,
    pub(super) next: u32,
    /// `None`: text; else the binary request's opaque.
    pub(super) binary: Option<u32>,
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
        for (session, d) in &self.dumps {
            session.encode(out);
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
        let n = r.count(4)?;
        for _ in 0..n {
            let session = Session::decode(r)?;
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
            if s.dumps.insert(session, d).is_some() {
                return Err(DecodeError::Invalid("two dumps of one session"));
            }
        }
        Ok(s)
    }

    /// The session is gone: its dump ends.
    pub fn disconnect(&mut self, session: Session) {
        self.dumps.remove(&session);
    }
}
