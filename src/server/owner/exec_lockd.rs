//! old lock-daemon requests applied to the lockd table (contract: "old lock-daemon protocol").

use super::outbox::Outbox;
use super::tables::{Tables, Who};
use crate::core::lockd::{AcquireOutcome, LockState};
use crate::core::Now;
use crate::proto::lockd::{self as ld, op, Frame};
use crate::server::msg::ConnId;
use crate::server::msg::LockdOp;

/// ACQs one connection may have queued at once; one more that would queue gets ERR. Each queued
/// ACQ keeps its payload (up to 1 MiB) until granted, so without a cap one client could make the
/// daemon hold unbounded memory. The original daemon had no limit; no sane client waits for more
/// than a handful of locks at once.
pub const MAX_QUEUED_PER_CONN: usize = 1024;

pub fn apply(t: &mut Tables, out: &mut Outbox, who: Who, o: LockdOp, arena: &[u8], now: Now) {
    let Who { conn, session } = who;
    let payload = o.payload.get(arena);
    let reply = |out: &mut Outbox, opcode: u8, payload: &[u8]| {
        out.record(conn, 1, false, |w| ld::encode(w, opcode, payload));
    };
    if o.opcode == op::SYNC {
        return sync(t, out, conn);
    }
    // A lock operation needs a name: an empty payload gets ERR with an empty payload, one without
    // a NUL gets ERR echoing it.
    let frame = Frame {
        version: ld::VERSION,
        opcode: o.opcode,
        payload,
    };
    let Some(name) = frame.name() else {
        return reply(out, op::ERR, payload);
    };
    let lockd = &mut t.lockd;
    match o.opcode {
        op::ACQ
            if lockd.queued_by(session) >= MAX_QUEUED_PER_CONN
                && lockd.state(name) != LockState::Free =>
        {
            reply(out, op::ERR, payload)
        }
        op::ACQ => match lockd.acquire(session, name, payload, now.ms) {
            AcquireOutcome::Acquired => reply(out, op::ACQUIRED, payload),
            AcquireOutcome::Queued => reply(out, op::ACK, payload),
        },
        op::TRY => {
            let got = lockd.try_lock(session, name, now.ms);
            reply(out, if got { op::ACQUIRED } else { op::WBLOCK }, payload)
        }
        op::REL => {
            let released = lockd.release(session, name, now.ms, &mut t.grants);
            reply(out, if released { op::RELEASED } else { op::ERR }, payload);
            deliver_grants(t, out);
        }
        op::REQ_TOKEN => match lockd.token_of(session, name) {
            Some(token) => out.record(conn, 1, false, |w| {
                let mut body = Vec::with_capacity(name.len() + 9);
                body.extend_from_slice(name);
                body.push(0);
                body.extend_from_slice(&token.to_be_bytes());
                ld::encode(w, op::ACK, &body)
            }),
            None => reply(out, op::ERR, payload),
        },
        op::ADOPT => {
            let adopted = lockd.adopt(session, name, now.ms);
            reply(out, if adopted { op::ACK } else { op::ERR }, payload)
        }
        _ => reply(out, op::ERR, payload),
    }
}

/// Send ACQUIRED to every session granted a lock it queued for (a grant goes to a live
/// session: a session's queued ACQs leave the queues when it closes).
pub fn deliver_grants(t: &mut Tables, out: &mut Outbox) {
    for g in t.grants.drain(..) {
        if let Some(conn) = t.sessions.conn(g.session) {
            out.record(conn, 0, false, |w| ld::encode(w, op::ACQUIRED, &g.payload));
        }
    }
}

/// SYNC: every locked name, NUL-terminated. One reply when it fits in one frame (as the original
/// daemon answers); otherwise several replies each holding whole names, then an empty one.
fn sync(t: &mut Tables, out: &mut Outbox, conn: ConnId) {
    out.record(conn, 1, false, |w| {
        let mut frame_start = w.len();
        let mut split = false;
        ld::encode(w, op::SYNC_REPLY, &[]);
        t.lockd.for_each_locked(|name| {
            let used = w.len() - frame_start - 4;
            if used + name.len() + 1 > ld::MAX_PAYLOAD {
                patch_length(w, frame_start);
                frame_start = w.len();
                split = true;
                ld::encode(w, op::SYNC_REPLY, &[]);
            }
            w.extend_from_slice(name);
            w.push(0);
        });
        patch_length(w, frame_start);
        if split {
            ld::encode(w, op::SYNC_REPLY, &[]);
        }
    });
}

/// Rewrite the header at `start` with the length of the payload that follows it.
fn patch_length(w: &mut [u8], start: usize) {
    let len = (w.len() - start - 4) as u32;
    let header = u32::from(ld::VERSION) << 28 | u32::from(op::SYNC_REPLY) << 20 | len;
    w[start..start + 4].copy_from_slice(&header.to_be_bytes());
}
