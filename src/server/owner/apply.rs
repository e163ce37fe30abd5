//! The state machine's one entry point: a turn of commands applied to the [`Tables`].
//!
//! Owns: the order of a turn (timers, then commands, then timers again) and the dispatch of
//! each command to its protocol's `exec` (`protocol/<name>/exec.rs`), with the session the command's connection
//! maps to. Must not: read a clock or touch a thread or a socket (time comes in `now`), or
//! address anything to a connection: its output is [`Effects`] addressed to sessions, which
//! the server layer routes (`Outbox::route`).

use super::tables::Tables;
use crate::core::Now;
use crate::protocol::Execute;
use crate::server::effect::{Body, Effects};
use crate::server::msg::{ConnId, Op, OpMsg};
use crate::server::Shared;

/// One owner turn, the state machine's one entry point: timers due by `now` fire first (an
/// orphan whose time is up is released before anyone can TRY or ADOPT it), then the operations
/// apply in order, then timers they set at or before `now` fire (a zero orphan timeout). The
/// owner thread, the sim and a replayed command log all go through here, so that the same
/// entries (`server::command`) give the same state and the same effects (appended to `fx`).
pub fn apply_turn(
    t: &mut Tables,
    fx: &mut Effects,
    shared: &Shared,
    now: Now,
    ops: &[OpMsg],
    arena: &[u8],
) {
    fire_timers(t, fx, now);
    for msg in ops {
        apply_op(t, fx, shared, msg.conn, msg.op, arena, now);
    }
    fire_timers(t, fx, now);
}

/// Fire every timer due by `now` in every table and deliver what that caused.
pub fn fire_timers(t: &mut Tables, fx: &mut Effects, now: Now) {
    t.store.advance(now);
    t.lockd.advance(now.ms, &mut t.grants);
    crate::protocol::lockd::exec::deliver_grants(t, fx);
    t.dlock.advance(now.ms, &mut t.dlock_events);
    crate::protocol::dlock::exec::deliver_events(t, fx, now);
}

/// Apply one operation of one connection.
pub fn apply_op(
    t: &mut Tables,
    fx: &mut Effects,
    shared: &Shared,
    conn: ConnId,
    op: Op,
    arena: &[u8],
    now: Now,
) {
    // The tables and the effects see sessions only. A connection's first command (its Open,
    // or its first request when no Open came) starts its session.
    let session = t.sessions.session(conn);
    macro_rules! apply {
        ($($proto:ident, $v:ident, $name:literal, $ty:ty, $op:ty, $reply:ty;)*) => {
            match op {
                $(Op::$v(op) => <$ty>::apply(t, fx, shared, session, op, arena, now),)*
                Op::DlockOpen => crate::protocol::dlock::exec::open(t, session, now),
                Op::Open { proto, peer } => t.admin.opened(session, proto, peer),
                Op::Literal { bytes, close } => {
                    if t.dlock_sessions.is_waiting(session) {
                        t.dlock_sessions
                            .defer_literal(session, bytes.get(arena), close);
                    } else {
                        let span = fx.bytes(bytes.get(arena));
                        fx.push(session, 1, close, Body::Literal(span));
                    }
                }
                Op::Eof => crate::protocol::dlock::exec::eof(t, fx, session, now),
                Op::Close => {
                    t.mc.disconnect(session);
                    t.store.disconnect(session, now);
                    t.lockd.disconnect(session, now.ms);
                    t.counter.disconnect(session, now.ms);
                    t.dlock_sessions.remove(session);
                    if !t.watches.is_empty() {
                        t.watches.drop_session(session);
                        t.dlock.set_key_events(!t.watches.is_empty());
                    }
                    t.admin.closed(session);
                    t.dlock.disconnect(session, now.ms, &mut t.dlock_events);
                    crate::protocol::dlock::exec::deliver_events(t, fx, now);
                    t.sessions.close(conn);
                }
            }
        };
    }
    crate::protocol::protocols!(apply);
}

#[cfg(test)]
#[path = "effects_tests.rs"]
mod tests;
