//! The protocols holdfast speaks, one folder each.
//!
//! A protocol's folder holds everything that is particular to it: its wire codec (`wire`: the
//! zero-copy parser and the reply encoders, public as [`crate::proto`] for clients and tests),
//! what the worker makes of a parsed request (`decode`: answer it on the spot, or copy it once
//! into the owner's batch as the protocol's op), what the owner does with that op (`exec`: the
//! protocol's rules over its table, yielding effects), its reply type with its writer,
//! canonical bytes and spans, and its answer to a request the cluster gives up on (`reply`),
//! and its ops' encoding in command entries (`command`).
//!
//! The rest of the daemon reaches a protocol only through the traits below (`Protocol` and one
//! trait per layer), with static dispatch: each op and each reply is one variant of a plain
//! enum (`server::msg::Op`, `server::effect::Body`) generated from the list of protocols
//! (`protocols!`), matched to the protocol's functions, which inline. Nothing on the request
//! path goes through a vtable. `docs/adding-a-protocol.md` lists what a new protocol touches.

pub mod counter;
pub mod dlock;
pub mod lockd;
pub mod memcache;

/// The list of protocols, one line each, in listener order (their place in per-listener
/// arrays, and their code in a command entry's `Open`): the listener ([`crate::server::Proto`]
/// variant), the variant of its ops and replies (`server::msg::Op`, `server::effect::Body`),
/// its name on the admin port and in logs, the type implementing [`Protocol`], its op and its
/// reply. `protocols!(m)` calls the macro `m` with the list; each place that dispatches on the
/// protocol (the enums, the worker's parse, apply, the writer, the canonical encoding, the
/// command codec, the no-quorum answers) is one such macro, so a new protocol is one more line
/// here.
macro_rules! protocols {
    ($then:ident) => {
        $then! {
            Memcache, Mc, "memcache", $crate::protocol::memcache::Memcache,
                $crate::protocol::memcache::McOp, $crate::protocol::memcache::McReply;
            Lockd, Lockd, "lockd", $crate::protocol::lockd::Lockd,
                $crate::protocol::lockd::LockdOp, $crate::protocol::lockd::LockdReply;
            Dlock, Dlock, "dlock", $crate::protocol::dlock::Dlock,
                $crate::protocol::dlock::DlockOp, $crate::protocol::dlock::DlockReply;
            Counter, Counter, "counter", $crate::protocol::counter::Counter,
                $crate::protocol::counter::CounterOp, $crate::protocol::counter::CounterReply;
        }
    };
}
pub(crate) use protocols;

use crate::core::codec::{DecodeError, Reader};
use crate::core::{Now, Session};
use crate::server::command::Limits;
use crate::server::effect::Effects;
use crate::server::msg::Op;
use crate::server::msg::{Arena, Batch, ConnId, Span};
use crate::server::owner::Tables;
use crate::server::worker::conn::Conn;
use crate::server::worker::decode::{Cx, Step};
use crate::server::Shared;

/// One protocol: the two types that cross the daemon's layers. Each layer reaches the
/// protocol through one trait of its own, implemented in the file of that layer in the
/// protocol's folder: [`Decode`] (the worker), [`Execute`] (the owner), [`Answer`] (the
/// worker's writer, the replay tests, the cluster's no-quorum answers) and [`Entry`] (the
/// command codec).
pub(crate) trait Protocol {
    /// A request as the worker hands it to the owner: decoded, its variable bytes in the
    /// batch's arena.
    type Op: Copy + std::fmt::Debug;
    /// A reply as the owner decides it: typed, its variable bytes in the effects' arena.
    type Reply: Copy + std::fmt::Debug + PartialEq + Eq;
}

/// The worker's side (`decode.rs`).
pub(crate) trait Decode: Protocol {
    /// Parse one request at the start of `buf` (more may follow); answer it on the spot
    /// (`Conn::emit`) or hand its op to the owner (`Conn::push`).
    fn parse(conn: &mut Conn, buf: &[u8], id: ConnId, cx: Cx<'_>, batch: &mut Batch) -> Step;
}

/// The owner's side (`exec.rs`).
pub(crate) trait Execute: Protocol {
    /// Apply one op of `session` at `now`; its answers go to `fx`.
    fn apply(
        t: &mut Tables,
        fx: &mut Effects,
        shared: &Shared,
        session: Session,
        op: Self::Op,
        arena: &[u8],
        now: Now,
    );
}

/// The replies (`reply.rs`).
pub(crate) trait Answer: Protocol {
    /// Append the reply's wire bytes; `a` is the arena its spans name.
    fn write(out: &mut Vec<u8>, reply: &Self::Reply, a: &[u8]);

    /// The reply in canonical bytes (its tag first, every span resolved to its bytes): what
    /// the replay tests compare. Equal replies give equal bytes whatever their arena layout.
    fn encode_canonical(reply: &Self::Reply, a: &[u8], out: &mut Vec<u8>);

    /// Every span the reply names, to re-base when its bytes move to another arena.
    fn spans_mut(reply: &mut Self::Reply, f: impl FnMut(&mut Span));

    /// Append the wire answer to a request the cluster gave up on for want of a quorum (the
    /// connection closes after it); `now_unix_ms` is the wall clock.
    fn no_quorum(op: &Self::Op, arena: &[u8], now_unix_ms: u64, out: &mut Vec<u8>);
}

/// The command codec (`command.rs`).
pub(crate) trait Entry: Protocol {
    /// Append the op as a command entry stores it, its tag first.
    fn encode_op(op: &Self::Op, arena: &[u8], out: &mut Vec<u8>);

    /// The op whose tag `tag` was just read, its bytes appended to `a`; `None` when the tag is
    /// not one of this protocol's. What it decodes is checked as the worker checks a request:
    /// an entry is hostile input.
    fn decode_op(
        tag: u8,
        r: &mut Reader<'_>,
        limits: Limits,
        a: &mut Arena,
    ) -> Option<Result<Self::Op, DecodeError>>;
}

/// Append the wire answer to a request the cluster gave up on for want of a quorum (its
/// protocol's [`Answer::no_quorum`]); nothing for an op that is not a request.
pub(crate) fn no_quorum(op: &Op, arena: &[u8], now_unix_ms: u64, out: &mut Vec<u8>) {
    macro_rules! answer {
        ($($proto:ident, $v:ident, $name:literal, $ty:ty, $op:ty, $reply:ty;)*) => {
            match op {
                $(Op::$v(op) => <$ty>::no_quorum(op, arena, now_unix_ms, out),)*
                _ => {}
            }
        };
    }
    protocols!(answer)
}
