//! The state machine's one entry point: a turn of commands applied to the [`Tables`].
//!
//! Owns: the order of a turn (timers, then commands, then timers again) and the dispatch of
//! each command to its protocol's `exec_*` file, with the session the command's connection
//! maps to. Must not: read a clock or touch a thread or a socket (time comes in `now`).

use super::outbox::Outbox;
use super::tables::{Tables, Who};
use crate::core::Now;
use crate::server::msg::{ConnId, Op, OpMsg};
use crate::server::Shared;

/// One owner turn, the state machine's one entry point: timers due by `now` fire first (an
/// orphan whose time is up is released before anyone can TRY or ADOPT it), then the operations
/// apply in order, then timers they set at or before `now` fire (a zero orphan timeout). The
/// owner thread, the sim and a replayed command log all go through here, so that the same
/// entries (`server::command`) give the same state and the same replies.
pub fn apply_turn(
    t: &mut Tables,
    out: &mut Outbox,
    shared: &Shared,
    now: Now,
    ops: &[OpMsg],
    arena: &[u8],
) {
    fire_timers(t, out, now);
    for msg in ops {
        apply_op(t, out, shared, msg.conn, msg.op, arena, now);
    }
    fire_timers(t, out, now);
}

/// Fire every timer due by `now` in every table and deliver what that caused.
pub fn fire_timers(t: &mut Tables, out: &mut Outbox, now: Now) {
    t.store.advance(now);
    t.lockd.advance(now.ms, &mut t.grants);
    super::exec_lockd::deliver_grants(t, out);
    t.dlock.advance(now.ms, &mut t.dlock_events);
    super::exec_dlock::deliver_events(t, out, now);
}

/// Apply one operation of one connection.
pub fn apply_op(
    t: &mut Tables,
    out: &mut Outbox,
    shared: &Shared,
    conn: ConnId,
    op: Op,
    arena: &[u8],
    now: Now,
) {
    // The tables see sessions; replies go to the connection. A connection's first command
    // (its Open, or its first request when no Open came) starts its session.
    let session = t.sessions.session(conn);
    let who = Who { conn, session };
    match op {
        Op::Mc(op) => super::exec_mc::apply(t, out, shared, who, op, arena, now),
        Op::Lockd(op) => super::exec_lockd::apply(t, out, who, op, arena, now),
        Op::Dlock(op) => super::exec_dlock::receive(t, out, who, op, arena, now),
        Op::Counter(op) => super::exec_counter::apply(t, out, shared, who, op, arena, now),
        Op::DlockOpen => super::exec_dlock::open(t, session, now),
        Op::Open { proto, peer } => t.admin.opened(session, proto, peer),
        Op::Literal { bytes, close } => {
            if t.dlock_sessions.is_waiting(session) {
                t.dlock_sessions
                    .defer_literal(session, bytes.get(arena), close);
            } else {
                out.record(conn, 1, close, |o| o.extend_from_slice(bytes.get(arena)));
            }
        }
        Op::Eof => super::exec_dlock::eof(t, out, who, now),
        Op::Close => {
            t.mc.disconnect(session);
            t.store.disconnect(session, now);
            t.lockd.disconnect(session, now.ms);
            t.counter.disconnect(session, now.ms);
            t.dlock_sessions.remove(session);
            t.admin.closed(session);
            t.dlock.disconnect(session, now.ms, &mut t.dlock_events);
            super::exec_dlock::deliver_events(t, out, now);
            t.sessions.close(conn);
        }
    }
}
