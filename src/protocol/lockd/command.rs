//! A [`LockdOp`] in a command entry: its tag, the opcode, then the payload (the name is read
//! out of it again on decoding, as the worker reads it).

use super::{Lockd, LockdOp};
use crate::core::codec::{DecodeError, Reader};
use crate::protocol::Entry;
use crate::server::command::{get_span, put_span, Limits};
use crate::server::msg::Arena;

/// The command-entry tag (`server::command` lists every protocol's).
const TAG: u8 = 20;

impl Entry for Lockd {
    fn encode_op(op: &LockdOp, arena: &[u8], o: &mut Vec<u8>) {
        o.push(TAG);
        o.push(op.opcode);
        put_span(o, arena, op.payload);
    }

    fn decode_op(
        t: u8,
        r: &mut Reader<'_>,
        limits: Limits,
        a: &mut Arena,
    ) -> Option<Result<LockdOp, DecodeError>> {
        if t != TAG {
            return None;
        }
        Some((|| {
            let opcode = r.u8()?;
            let payload = get_span(r, limits, a)?;
            Ok(LockdOp::new(opcode, payload, payload.get(&a.bytes)))
        })())
    }
}
