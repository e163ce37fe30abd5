//! The old lock-daemon protocol (`old-protocol.txt`): named exclusive locks over 4-byte-header
//! frames, on its own listener (`--lockd`).
//!
//! `wire` frames; `decode` answers PING, unknown opcodes and a wrong version on the worker, and
//! hands the lock operations to the owner as a [`LockdOp`]: the opcode and the name, read out
//! of the payload there, with the payload that the replies echo; `exec` applies it to the lockd
//! table ([`crate::core::lockd`]); `reply` writes a [`LockdReply`]; `command` stores a
//! [`LockdOp`] in a command entry.

mod command;
mod decode;
pub(crate) mod exec;
mod reply;
pub mod wire;

pub use exec::MAX_QUEUED_PER_CONN;
pub use reply::tag as reply_tag;

use super::Protocol;
use crate::core::codec::{DecodeError, Reader};
use crate::core::{Now, Session};
use crate::server::command::Limits;
use crate::server::effect::Effects;
use crate::server::msg::{Arena, Batch, ConnId, Span};
use crate::server::owner::Tables;
use crate::server::worker::conn::Conn;
use crate::server::worker::decode::{Cx, Step};
use crate::server::Shared;

/// One lock operation (ACQ, REL, TRY, ADOPT, SYNC or REQ_TOKEN), decoded on the worker.
#[derive(Clone, Copy, Debug)]
pub struct LockdOp {
    pub opcode: u8,
    /// The object name (the payload's bytes before its first NUL); `None` when the payload is
    /// empty or holds no NUL, which a lock operation answers with ERR.
    pub name: Option<Span>,
    /// The whole payload: every reply but REQ_TOKEN's echoes it, and a queued ACQ's grant too.
    pub payload: Span,
}

impl LockdOp {
    /// The op of a request with this opcode and payload: `payload` is where the payload's
    /// `bytes` are in the batch's arena.
    #[inline]
    pub fn new(opcode: u8, payload: Span, bytes: &[u8]) -> LockdOp {
        debug_assert_eq!(payload.len as usize, bytes.len());
        let name = wire::name_len(bytes).map(|len| Span {
            start: payload.start,
            len: len as u32,
        });
        LockdOp {
            opcode,
            name,
            payload,
        }
    }
}

/// An old lock-daemon reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockdReply {
    /// One frame: opcode and payload (an echo of the request's, or a grant's).
    Frame { opcode: u8, payload: Span },
    /// REQ_TOKEN's ACK: `name NUL token` (8 bytes, big-endian).
    Token { name: Span, token: u64 },
    /// SYNC's answer: every locked name, each NUL-terminated, in byte order. One frame when it
    /// fits, else frames of whole names and an empty one.
    Sync { names: Span },
}

/// The old lock-daemon protocol.
pub(crate) struct Lockd;

impl Protocol for Lockd {
    type Op = LockdOp;
    type Reply = LockdReply;

    #[inline]
    fn parse(conn: &mut Conn, buf: &[u8], id: ConnId, _cx: Cx<'_>, batch: &mut Batch) -> Step {
        decode::parse(conn, buf, id, batch)
    }

    #[inline]
    fn apply(
        t: &mut Tables,
        fx: &mut Effects,
        _shared: &Shared,
        session: Session,
        op: LockdOp,
        arena: &[u8],
        now: Now,
    ) {
        exec::apply(t, fx, session, op, arena, now)
    }

    #[inline]
    fn write(out: &mut Vec<u8>, reply: &LockdReply, a: &[u8]) {
        reply::write(out, reply, a)
    }

    fn encode_canonical(reply: &LockdReply, a: &[u8], out: &mut Vec<u8>) {
        reply::encode_canonical(reply, a, out)
    }

    fn spans_mut(reply: &mut LockdReply, f: impl FnMut(&mut Span)) {
        reply::spans_mut(reply, f)
    }

    fn encode_op(op: &LockdOp, arena: &[u8], out: &mut Vec<u8>) {
        command::encode(op, arena, out)
    }

    fn decode_op(
        tag: u8,
        r: &mut Reader<'_>,
        limits: Limits,
        a: &mut Arena,
    ) -> Option<Result<LockdOp, DecodeError>> {
        command::decode(tag, r, limits, a)
    }

    /// ERR, echoing the payload.
    fn no_quorum(op: &LockdOp, arena: &[u8], _now_unix_ms: u64, out: &mut Vec<u8>) {
        wire::encode(out, wire::op::ERR, op.payload.get(arena));
    }
}
