//! dlock requests applied to the dlock table.
//!
//! One connection's requests are answered in order, and a waiting Lock delays that connection's
//! later answers: while a connection has a Lock waiting, its later requests are kept here, in
//! arrival order, and run when the Lock is granted or times out. (The worker bounds how many it
//! sends, so this backlog is bounded too.)

use std::collections::VecDeque;

use super::sessions::{Deferred, Waiting};
use super::wire::{status, Keys};
use super::{lease_on_the_table_clock, Dlock, DlockKind, DlockOp, DlockReply, To};
use crate::core::dlock::{DlockEvent, LockRequest, LockResult};
use crate::core::{Now, Session};
use crate::protocol::Execute;
use crate::server::effect::{self, Body, Effects};
use crate::server::msg::Span;
use crate::server::owner::Tables;
use crate::server::Shared;

pub fn open(t: &mut Tables, session: Session, now: Now) {
    t.dlock.connect(session, now.ms);
}

/// A request arrives: it resets the idle timer, then runs now or waits behind a pending Lock.
impl Execute for Dlock {
    fn apply(
        t: &mut Tables,
        fx: &mut Effects,
        _shared: &Shared,
        session: Session,
        op: DlockOp,
        arena: &[u8],
        now: Now,
    ) {
        if op.kind.is_native() {
            // Version 3: answered as soon as done; the session never has a backlog.
            super::native::run(t, fx, session, op, arena, now);
            deliver_events(t, fx, now);
            return;
        }
        // Any request resets the idle timer; Lock and Unlock do it inside the table.
        if !matches!(op.kind, DlockKind::Lock { .. } | DlockKind::Unlock { .. }) {
            t.dlock.touch(session, now.ms);
        }
        if let Some(w) = t.dlock_sessions.waiting.get_mut(&session) {
            let (op, bytes) = match op.kind {
                DlockKind::Lock { keys, .. } | DlockKind::Unlock { keys, .. } => {
                    let bytes: Box<[u8]> = keys.get(arena).into();
                    (
                        rebase(
                            op,
                            Span {
                                start: 0,
                                len: keys.len,
                            },
                        ),
                        bytes,
                    )
                }
                _ => (op, Box::default()),
            };
            w.backlog.push_back(Deferred::Request(op, bytes));
            return;
        }
        run(t, fx, session, op, arena, now);
        deliver_events(t, fx, now);
    }
}

fn rebase(mut op: DlockOp, to: Span) -> DlockOp {
    match &mut op.kind {
        DlockKind::Lock { keys, .. } | DlockKind::Unlock { keys, .. } => *keys = to,
        _ => {}
    }
    op
}

/// Collect the keys of a RequestLock into the reusable scratch vector.
fn with_keys<R>(t: &mut Tables, raw: &[u8], f: impl FnOnce(&mut Tables, &[&[u8]]) -> R) -> R {
    let mut scratch: Vec<&[u8]> = recycle(std::mem::take(&mut t.dlock_sessions.keys_scratch));
    scratch.extend(Keys { raw });
    let r = f(t, &scratch);
    t.dlock_sessions.keys_scratch = recycle(scratch);
    r
}

/// Reuse a vector's allocation for a vector of a different lifetime (the in-place collect keeps
/// the allocation because the element layout is the same).
fn recycle<'a, 'b>(mut v: Vec<&'a [u8]>) -> Vec<&'b [u8]> {
    v.clear();
    v.into_iter().map(|_| -> &'b [u8] { &[] }).collect()
}

/// The Ok answer to a granted Lock, with its fencing token (Response field 7).
fn granted(fx: &mut Effects, to: To, fence: u64, now: Now) {
    let reply = DlockReply {
        id: to.id,
        status: status::OK,
        text: None,
        keys: Span::EMPTY,
        time: now.unix as i64,
        fence: Some(fence),
        native: false,
        extra: Span::EMPTY,
    };
    fx.push(to.session, to.done, false, Body::Dlock(reply));
}

fn respond<'k>(
    fx: &mut Effects,
    to: To,
    status: u32,
    text: Option<&'static str>,
    keys: impl IntoIterator<Item = &'k [u8]>,
    now: Now,
) {
    let mark = fx.mark();
    for key in keys {
        effect::put_entry(&mut fx.arena, key);
    }
    let reply = DlockReply {
        id: to.id,
        status,
        text,
        keys: fx.since(mark),
        time: now.unix as i64,
        fence: None,
        native: false,
        extra: Span::EMPTY,
    };
    fx.push(to.session, to.done, false, Body::Dlock(reply));
}

/// Run one request of a connection that has no Lock waiting.
fn run(t: &mut Tables, fx: &mut Effects, session: Session, op: DlockOp, arena: &[u8], now: Now) {
    let to = To {
        session,
        done: 1,
        id: op.id,
    };
    let no_keys: [&[u8]; 0] = [];
    match op.kind {
        DlockKind::Ping => respond(fx, to, status::OK, None, no_keys, now),
        DlockKind::Refuse { status, text } => respond(fx, to, status, Some(text), no_keys, now),
        DlockKind::Lock {
            keys,
            wait_us,
            lease_us,
            ..
        } => {
            let token = t.dlock_sessions.next_token;
            t.dlock_sessions.next_token += 1;
            let result = with_keys(t, keys.get(arena), |t, keys| {
                let events = &mut t.dlock_events;
                t.dlock.lock(
                    session,
                    LockRequest {
                        token,
                        keys,
                        wait_us,
                        lease_us: lease_on_the_table_clock(lease_us),
                    },
                    now.ms,
                    events,
                )
            });
            match result {
                LockResult::Granted => granted(fx, to, t.dlock.last_fence(), now),
                LockResult::Timeout { busy } => {
                    let busy = busy.iter().map(|k| &k[..]);
                    respond(fx, to, status::ACQUIRE_TIMEOUT, None, busy, now)
                }
                LockResult::Invalid { why } => {
                    respond(fx, to, status::GENERAL, Some(why), no_keys, now)
                }
                LockResult::Waiting => {
                    let w = Waiting {
                        token,
                        id: op.id,
                        backlog: VecDeque::new(),
                    };
                    t.dlock_sessions.waiting.insert(session, w);
                }
            }
        }
        // (A version-3 request never waits behind a Lock: `apply` runs it.)
        DlockKind::Native { .. } | DlockKind::NativeRefuse { .. } => {
            super::native::run(t, fx, session, op, arena, now)
        }
        DlockKind::Unlock { keys, .. } => {
            let result = with_keys(t, keys.get(arena), |t, keys| {
                t.dlock.unlock(session, keys, now.ms, &mut t.dlock_events)
            });
            match result {
                Ok(()) => respond(fx, to, status::OK, None, no_keys, now),
                Err(not_held) => {
                    let keys = not_held.iter().map(|k| &k[..]);
                    respond(fx, to, status::GENERAL, Some("not held"), keys, now)
                }
            }
        }
    }
}

/// The client ended its side while requests were in flight. If a Lock of its waits, give the
/// connection up as a disconnect: the Lock leaves its queues, what waited behind it is dropped
/// unanswered, its connection-bound locks are released, and one effect completes all of them
/// and closes the connection (after the replies already sent).
pub fn eof(t: &mut Tables, fx: &mut Effects, session: Session, now: Now) {
    let dropped = match t.dlock_sessions.waiting.remove(&session) {
        Some(w) => 1 + w.backlog.len() as u32,
        // Version 3: each of its waiting Locks is a request in flight.
        None => match t.dlock.native_waits(session, 0).0 {
            0 => return,
            n => n as u32,
        },
    };
    t.dlock.disconnect(session, now.ms, &mut t.dlock_events);
    fx.push(session, dropped, true, Body::Nothing);
    deliver_events(t, fx, now);
}

/// Answer the waiting Locks that the table resolved, then run what waited behind them; repeat
/// until nothing more happens (a backlog may release keys that grant other waiters).
///
/// Replies leave in the order the table decided things, hence in fencing-token order: every
/// resolved wait is answered before the next request of any backlog runs, and a backlog runs
/// one request at a time with the waits that request resolved answered right after it. (Run
/// whole, a backlog's Unlock could grant a waiter whose answer would follow the backlog's later
/// grants; run in between the answers of one batch, a backlog's Lock of a key whose lease ended
/// later in that batch would be answered before the grant of that lease.)
pub fn deliver_events(t: &mut Tables, fx: &mut Effects, now: Now) {
    let mut unblocked: VecDeque<(Session, VecDeque<Deferred>)> = VecDeque::new();
    loop {
        let mut events = std::mem::take(&mut t.dlock_events);
        for ev in events.drain(..) {
            let (session, backlog) = match ev {
                DlockEvent::Granted {
                    session,
                    token,
                    fence,
                } => {
                    if !t.dlock_sessions.waiting.contains_key(&session) {
                        super::native::answer_wait(fx, session, token, Ok(fence), now);
                        continue;
                    }
                    let Some(w) = take_waiting(t, session, token) else {
                        continue;
                    };
                    let to = To {
                        session,
                        done: 1,
                        id: w.id,
                    };
                    granted(fx, to, fence, now);
                    (session, w.backlog)
                }
                DlockEvent::TimedOut {
                    session,
                    token,
                    busy,
                } => {
                    if !t.dlock_sessions.waiting.contains_key(&session) {
                        super::native::answer_wait(fx, session, token, Err(&busy), now);
                        continue;
                    }
                    let Some(w) = take_waiting(t, session, token) else {
                        continue;
                    };
                    let keys = busy.iter().map(|k| &k[..]);
                    let to = To {
                        session,
                        done: 1,
                        id: w.id,
                    };
                    respond(fx, to, status::ACQUIRE_TIMEOUT, None, keys, now);
                    (session, w.backlog)
                }
                DlockEvent::Idle { session } => {
                    t.dlock_sessions.remove(session);
                    fx.push(session, 0, true, Body::Nothing);
                    continue;
                }
                // Version 3's: watch events and loss notices (no version-2 connection gets them).
                DlockEvent::Key {
                    key,
                    kind,
                    fence,
                    value,
                } => {
                    let ev = super::native::event(&key, kind, fence, value.as_deref());
                    super::native::key_event(t, fx, kind, ev, now);
                    continue;
                }
                DlockEvent::Notice {
                    session,
                    request_id,
                    key,
                    kind,
                    fence,
                    value,
                } => {
                    let ev = super::native::event(&key, kind, fence, value.as_deref());
                    super::native::notice(t, fx, session, request_id, ev, now);
                    continue;
                }
            };
            if !backlog.is_empty() {
                unblocked.push_back((session, backlog));
            }
        }
        // Keep the events vector's allocation for the next turn (nothing was added meanwhile:
        // answering a wait does not touch the table).
        debug_assert!(t.dlock_events.is_empty());
        t.dlock_events = events;
        let Some((session, mut backlog)) = unblocked.pop_front() else {
            return;
        };
        if let Some(d) = backlog.pop_front() {
            match d {
                Deferred::Literal(bytes, close) => {
                    let span = fx.bytes(&bytes);
                    fx.push(session, 1, close, Body::Literal(span))
                }
                Deferred::Request(op, bytes) => run(t, fx, session, op, &bytes, now),
            }
        }
        if let Some(w) = t.dlock_sessions.waiting.get_mut(&session) {
            // Blocked again: the rest waits behind this new Lock.
            w.backlog.extend(backlog);
        } else if !backlog.is_empty() {
            // The same backlog goes on next, once what its request resolved is answered.
            unblocked.push_front((session, backlog));
        }
    }
}

/// The waiting Lock `token` of `session`.
fn take_waiting(t: &mut Tables, session: Session, token: u64) -> Option<Waiting> {
    match t.dlock_sessions.waiting.get(&session) {
        Some(w) if w.token == token => t.dlock_sessions.waiting.remove(&session),
        _ => None,
    }
}
