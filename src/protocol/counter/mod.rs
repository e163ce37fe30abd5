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
use crate::server::msg::Span;

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
}
