//! Old lock-daemon operations applied to the lockd table: the opcode and the name decide, the
//! payload is only echoed.

use super::wire::op;
use super::{Lockd, LockdOp, LockdReply};
use crate::core::lockd::{AcquireOutcome, LockState};
use crate::core::{Now, Session};
use crate::protocol::Execute;
use crate::server::effect::{Body, Effects};
use crate::server::owner::Tables;
use crate::server::Shared;

/// ACQs one connection may have queued at once; one more that would queue gets ERR. Each queued
/// ACQ keeps its payload (up to 1 MiB) until granted, so without a cap one client could make the
/// daemon hold unbounded memory. The original daemon had no limit; no sane client waits for more
/// than a handful of locks at once.
pub const MAX_QUEUED_PER_CONN: usize = 1024;

impl Execute for Lockd {
    #[inline]
    fn apply(
        t: &mut Tables,
        fx: &mut Effects,
        _shared: &Shared,
        session: Session,
        o: LockdOp,
        arena: &[u8],
        now: Now,
    ) {
        let payload = o.payload.get(arena);
        // Every reply but REQ_TOKEN's echoes the request's payload.
        let reply = |fx: &mut Effects, opcode: u8| {
            let payload = fx.bytes(payload);
            fx.reply(session, Body::Lockd(LockdReply::Frame { opcode, payload }));
        };
        if o.opcode == op::SYNC {
            return sync(t, fx, session);
        }
        // A lock operation needs a name: an empty payload gets ERR with an empty payload, one without
        // a NUL gets ERR echoing it.
        let Some(name) = o.name else {
            return reply(fx, op::ERR);
        };
        let name = name.get(arena);
        let lockd = &mut t.lockd;
        match o.opcode {
            op::ACQ
                if lockd.queued_by(session) >= MAX_QUEUED_PER_CONN
                    && lockd.state(name) != LockState::Free =>
            {
                reply(fx, op::ERR)
            }
            op::ACQ => match lockd.acquire(session, name, payload, now.ms) {
                AcquireOutcome::Acquired => reply(fx, op::ACQUIRED),
                AcquireOutcome::Queued => reply(fx, op::ACK),
            },
            op::TRY => {
                let got = lockd.try_lock(session, name, now.ms);
                reply(fx, if got { op::ACQUIRED } else { op::WBLOCK })
            }
            op::REL => {
                let released = lockd.release(session, name, now.ms, &mut t.grants);
                reply(fx, if released { op::RELEASED } else { op::ERR });
                deliver_grants(t, fx);
            }
            op::REQ_TOKEN => match lockd.token_of(session, name) {
                Some(token) => {
                    let name = fx.bytes(name);
                    fx.reply(session, Body::Lockd(LockdReply::Token { name, token }))
                }
                None => reply(fx, op::ERR),
            },
            op::ADOPT => {
                let adopted = lockd.adopt(session, name, now.ms);
                reply(fx, if adopted { op::ACK } else { op::ERR })
            }
            _ => reply(fx, op::ERR),
        }
    }
}

/// Send ACQUIRED to every session granted a lock it queued for.
pub fn deliver_grants(t: &mut Tables, fx: &mut Effects) {
    for g in t.grants.drain(..) {
        let payload = fx.bytes(&g.payload);
        let body = Body::Lockd(LockdReply::Frame {
            opcode: op::ACQUIRED,
            payload,
        });
        fx.push(g.session, 0, false, body);
    }
}

/// SYNC: every locked name (the worker frames them, `reply.rs`).
fn sync(t: &mut Tables, fx: &mut Effects, session: Session) {
    let mark = fx.mark();
    let arena = &mut fx.arena.bytes;
    t.lockd.for_each_locked(|name| {
        arena.extend_from_slice(name);
        arena.push(0);
    });
    let names = fx.since(mark);
    fx.reply(session, Body::Lockd(LockdReply::Sync { names }));
}
