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
use crate::server::msg::Span;

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
}
