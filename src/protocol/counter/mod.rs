//! yrmcds's counter protocol (cybozu/yrmcds `docs/counter.md`): named counting semaphores,
//! binary framed, on its own listener (`--counter`).
//!
//! `wire` parses requests and encodes replies; `decode` answers Noop and malformed requests
//! on the worker and hands the rest to the owner as a [`CounterOp`]; `exec` applies it to the
//! counter table ([`crate::core::counter`]); `reply` writes a [`CounterReply`]; `command`
//! stores a [`CounterOp`] in a command entry.

mod command;
mod decode;
mod exec;
mod reply;
pub mod wire;

pub use reply::tag as reply_tag;
pub use reply::{put_counter, CounterEntry, CounterIter};

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

/// One counter request that needs the counter table (Noop and malformed requests are
/// answered by the worker).
#[derive(Clone, Copy, Debug)]
pub enum CounterKind {
    Get {
        name: Span,
    },
    Acquire {
        resources: u32,
        maximum: u32,
        name: Span,
    },
    Release {
        resources: u32,
        name: Span,
    },
    Stats,
    Dump,
}

#[derive(Clone, Copy, Debug)]
pub struct CounterOp {
    pub opaque: u32,
    pub kind: CounterKind,
}

/// A counter reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CounterReply {
    /// A status reply: OK with an optional 4-byte value, or an error with its status text.
    Status {
        opcode: u8,
        status: u8,
        opaque: u32,
        value: Option<u32>,
    },
    /// Stats: name/value pairs (entries, two per statistic).
    Stats { opaque: u32, pairs: Span },
    /// Dump: one entry per counter (written by [`put_counter`]), then the empty terminator.
    Dump { opaque: u32, entries: Span },
}

/// The counter protocol.
pub(crate) struct Counter;

impl Protocol for Counter {
    type Op = CounterOp;
    type Reply = CounterReply;

    #[inline]
    fn parse(conn: &mut Conn, buf: &[u8], id: ConnId, _cx: Cx<'_>, batch: &mut Batch) -> Step {
        decode::parse(conn, buf, id, batch)
    }

    #[inline]
    fn apply(
        t: &mut Tables,
        fx: &mut Effects,
        shared: &Shared,
        session: Session,
        op: CounterOp,
        arena: &[u8],
        now: Now,
    ) {
        exec::apply(t, fx, shared, session, op, arena, now)
    }

    #[inline]
    fn write(out: &mut Vec<u8>, reply: &CounterReply, a: &[u8]) {
        reply::write(out, reply, a)
    }

    fn encode_canonical(reply: &CounterReply, a: &[u8], out: &mut Vec<u8>) {
        reply::encode_canonical(reply, a, out)
    }

    fn spans_mut(reply: &mut CounterReply, f: impl FnMut(&mut Span)) {
        reply::spans_mut(reply, f)
    }

    fn encode_op(op: &CounterOp, arena: &[u8], out: &mut Vec<u8>) {
        command::encode(op, arena, out)
    }

    fn decode_op(
        tag: u8,
        r: &mut Reader<'_>,
        limits: Limits,
        a: &mut Arena,
    ) -> Option<Result<CounterOp, DecodeError>> {
        command::decode(tag, r, limits, a)
    }

    /// The counter protocol has no status for it: the connection closes unanswered.
    fn no_quorum(_op: &CounterOp, _arena: &[u8], _now_unix_ms: u64, _out: &mut Vec<u8>) {}
}
