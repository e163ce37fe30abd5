//! Version-3 requests (the native protocol, `holdfast.proto`) applied to the dlock table, and
//! the answers, watch events and loss notices its events make.
//!
//! Every version-3 request is answered as soon as it is done, matched by its request id: a
//! waiting Lock delays nothing else on its connection (no backlog, unlike version 2). Watches
//! ([`super::watches`]) turn the table's key events on while any exist.
//!
//! Choices the contract leaves open:
//! - A request without an `id` is answered with request id 0, and its waiting Lock is tagged 0.
//! - Request ids in flight are those of the connection's waiting Locks and of its Watches
//!   (their events carry them): a Lock with one of them, or a Watch with a waiting Lock's, is
//!   General. A Watch may reuse its own id (more keys on the same stream).
//! - Every dlock connection is subject to `--dlock-idle-timeout`, watching or not: a watcher
//!   that sends nothing (a Ping will do) for that long is closed like any idle connection.
//! - Leases, Extend's `release_micro` and waits are rounded as version 2's (a lease never ends
//!   early: [`super::LEASE_CLOCK_SLACK_MS`]).
//! - Watch of a key already watched moves it to the new Watch's request id; Unwatch of a key
//!   not watched is Ok.

use super::watches::MAX_WATCHED_KEYS;
use super::wire::{self as dl, event_kind, req_type, status, Keys};
use super::{lease_on_the_table_clock, DlockKind, DlockOp, DlockReply, To};
use crate::core::dlock::{KeyEventKind, LockResult, NativeError, NativeLock};
use crate::core::{Now, Session};
use crate::server::effect::{self, Body, Effects};
use crate::server::msg::Span;
use crate::server::owner::Tables;

/// An answer to a version-3 request: `keys` and `extra` (encoded `info`/`event` fields) are
/// spans of the effects' arena.
fn reply(to: To, status: u32, text: Option<&'static str>, now: Now) -> Reply {
    Reply {
        to,
        r: DlockReply {
            id: Some(to.id.unwrap_or(0)),
            status,
            text,
            keys: Span::EMPTY,
            time: now.unix as i64,
            fence: None,
            native: true,
            extra: Span::EMPTY,
        },
    }
}

struct Reply {
    to: To,
    r: DlockReply,
}

impl Reply {
    fn keys<'k>(mut self, fx: &mut Effects, keys: impl IntoIterator<Item = &'k [u8]>) -> Reply {
        let mark = fx.mark();
        for key in keys {
            effect::put_entry(&mut fx.arena, key);
        }
        self.r.keys = fx.since(mark);
        self
    }

    fn send(self, fx: &mut Effects) {
        fx.push(self.to.session, self.to.done, false, Body::Dlock(self.r));
    }
}

/// A refused request's answer: InvalidArgument with the reason, or NotHeld with the keys.
fn refused(fx: &mut Effects, to: To, e: NativeError, now: Now) {
    match e {
        NativeError::InvalidArgument(why) => {
            reply(to, status::INVALID_ARGUMENT, Some(why), now).send(fx)
        }
        NativeError::NotHeld(keys) => reply(to, status::NOT_HELD, Some("not held"), now)
            .keys(fx, keys.iter().map(|k| &k[..]))
            .send(fx),
    }
}

/// Runs one version-3 request of `session`.
pub(super) fn run(
    t: &mut Tables,
    fx: &mut Effects,
    session: Session,
    op: DlockOp,
    arena: &[u8],
    now: Now,
) {
    let to = To {
        session,
        done: 1,
        id: op.id,
    };
    let (ty, raw) = match op.kind {
        DlockKind::Native { ty, lock, .. } => (ty, lock.get(arena)),
        DlockKind::NativeRefuse { status, text } => {
            return reply(to, status, Some(text), now).send(fx);
        }
        _ => return,
    };
    t.dlock.touch(session, now.ms);
    if u64::from(ty) == req_type::PING {
        return reply(to, status::OK, None, now).send(fx);
    }
    // The worker and the command decoder validated it.
    let Ok(lock) = dl::decode_lock(raw) else {
        return reply(to, status::GENERAL, Some("invalid request"), now).send(fx);
    };
    let mut scratch: Vec<&[u8]> = Vec::with_capacity(lock.key_count);
    scratch.extend(Keys { raw });
    let keys = &scratch[..];
    let n = dl::decode_native(raw);
    let request_id = op.id.unwrap_or(0);
    match u64::from(ty) {
        req_type::LOCK => {
            // Not checked against the connection's Watches: only its own node keeps them, and
            // every node must decide a Lock alike.
            if t.dlock.native_waits(session, request_id).1 {
                let why = "request id of a Lock still waiting";
                return reply(to, status::GENERAL, Some(why), now).send(fx);
            }
            let req = NativeLock {
                request_id,
                keys,
                wait_us: lock.wait_micro,
                lease_us: lease_on_the_table_clock(lock.release_micro),
                shared: n.is_shared(),
                limit: n.limit.map(|l| u32::try_from(l).unwrap_or(u32::MAX)),
                value: n.value,
                lock_delay_us: n.lock_delay_micro,
            };
            match t
                .dlock
                .lock_native(session, req, now.ms, &mut t.dlock_events)
            {
                Ok(LockResult::Granted) => {
                    let mut r = reply(to, status::OK, None, now);
                    r.r.fence = Some(t.dlock.last_fence());
                    r.send(fx)
                }
                Ok(LockResult::Waiting) => {}
                Ok(LockResult::Timeout { busy }) => reply(to, status::ACQUIRE_TIMEOUT, None, now)
                    .keys(fx, busy.iter().map(|k| &k[..]))
                    .send(fx),
                Ok(LockResult::Invalid { why }) => {
                    reply(to, status::INVALID_ARGUMENT, Some(why), now).send(fx)
                }
                Err(e) => refused(fx, to, e, now),
            }
        }
        req_type::UNLOCK => {
            match t
                .dlock
                .unlock_native(session, keys, n.fence, now.ms, &mut t.dlock_events)
            {
                Ok(()) => reply(to, status::OK, None, now).send(fx),
                Err(e) => refused(fx, to, e, now),
            }
        }
        req_type::EXTEND => {
            let Some(release) = lease_on_the_table_clock(lock.release_micro) else {
                let why = "Extend needs release_micro > 0";
                return reply(to, status::INVALID_ARGUMENT, Some(why), now).send(fx);
            };
            let events = &mut t.dlock_events;
            match t
                .dlock
                .extend(session, keys, release, n.fence, request_id, now.ms, events)
            {
                Ok(()) => reply(to, status::OK, None, now).send(fx),
                Err(e) => refused(fx, to, e, now),
            }
        }
        req_type::GET => {
            let mut r = reply(to, status::OK, None, now);
            r.r.extra = info(t, fx, keys, now);
            r.send(fx)
        }
        req_type::CHECK_FENCE => {
            let (Some(fence), [key]) = (n.fence, keys) else {
                let why = "CheckFence names one key and a fence";
                return reply(to, status::INVALID_ARGUMENT, Some(why), now).send(fx);
            };
            let ok = t.dlock.check_fence(key, fence);
            let s = if ok { status::OK } else { status::STALE_FENCE };
            reply(to, s, None, now).send(fx)
        }
        req_type::WATCH => {
            if t.dlock.native_waits(session, request_id).1 {
                let why = "request id of a Lock still waiting";
                return reply(to, status::GENERAL, Some(why), now).send(fx);
            }
            let have = t.watches.count(session);
            if have + t.watches.new_keys(session, keys.iter().copied()) > MAX_WATCHED_KEYS {
                let why = "more than 1024 watched keys on one connection";
                return reply(to, status::INVALID_ARGUMENT, Some(why), now).send(fx);
            }
            // Every node applies the Watch and answers it alike (the answer reaches the
            // watcher's node only); the subscription is that node's alone.
            if t.sessions.conn(session).is_some_and(|c| c.node == t.node) {
                for key in keys {
                    t.watches.watch(session, request_id, key);
                }
            }
            t.dlock.set_key_events(true);
            let mut r = reply(to, status::OK, None, now);
            r.r.extra = info(t, fx, keys, now);
            r.send(fx)
        }
        req_type::UNWATCH => {
            for key in keys {
                t.watches.unwatch(session, key);
            }
            t.dlock.set_key_events(!t.watches.is_empty());
            reply(to, status::OK, None, now).send(fx)
        }
        _ => reply(to, status::INVALID_TYPE, Some("unknown request type"), now).send(fx),
    }
}

/// The `info` fields for `keys` (one each, in order), encoded into the effects' arena.
fn info(t: &Tables, fx: &mut Effects, keys: &[&[u8]], now: Now) -> Span {
    let mark = fx.mark();
    for key in keys {
        let i = t.dlock.get(key, now.ms);
        let mut holders = Vec::with_capacity(i.holders.len());
        holders.extend(i.holders.iter().map(|h| {
            dl::HolderOut {
                fence: h.fence,
                value: h.value.as_deref(),
                lease_left_micro: h.lease_left_us,
                node: t
                    .sessions
                    .conn(h.session)
                    .map(|c| u32::from(c.node))
                    .filter(|&n| n != 0),
            }
        }));
        let out = dl::KeyInfoOut {
            key,
            shared: i.shared,
            limit: i.limit,
            holders: &holders,
            waiters: i.waiters,
            delayed_micro: i.delayed_us,
        };
        dl::put_info_field(&mut fx.arena.bytes, &out);
    }
    fx.since(mark)
}

/// A version-3 waiting Lock was granted (`fence`) or timed out (`busy`): its answer.
pub(super) fn answer_wait(
    fx: &mut Effects,
    session: Session,
    request_id: u64,
    outcome: Result<u64, &[Box<[u8]>]>,
    now: Now,
) {
    let to = To {
        session,
        done: 1,
        id: Some(request_id),
    };
    match outcome {
        Ok(fence) => {
            let mut r = reply(to, status::OK, None, now);
            r.r.fence = Some(fence);
            r.send(fx)
        }
        Err(busy) => reply(to, status::ACQUIRE_TIMEOUT, None, now)
            .keys(fx, busy.iter().map(|k| &k[..]))
            .send(fx),
    }
}

fn kind_code(kind: KeyEventKind) -> u32 {
    match kind {
        KeyEventKind::Acquired => event_kind::ACQUIRED,
        KeyEventKind::Released => event_kind::RELEASED,
        KeyEventKind::Expired => event_kind::EXPIRED,
        KeyEventKind::Lost => event_kind::LOST,
    }
}

/// One pushed event frame to `session`, with `request_id` (its Watch's, or its Lock's).
fn push_event(fx: &mut Effects, session: Session, request_id: u64, ev: dl::EventOut<'_>, now: Now) {
    let to = To {
        session,
        done: 0,
        id: Some(request_id),
    };
    let mark = fx.mark();
    dl::put_event_field(&mut fx.arena.bytes, &ev);
    let mut r = reply(to, status::OK, None, now);
    r.r.extra = fx.since(mark);
    r.send(fx)
}

/// The event of a grant of `key` (`fence`, `value`) that began or ended (`kind`).
pub(super) fn event<'a>(
    key: &'a [u8],
    kind: KeyEventKind,
    fence: u64,
    value: Option<&'a [u8]>,
) -> dl::EventOut<'a> {
    dl::EventOut {
        key,
        kind: kind_code(kind),
        fence,
        value,
    }
}

/// A key's grant began or ended (`kind`): an event to each of its watchers, in subscription
/// order.
pub(super) fn key_event(
    t: &mut Tables,
    fx: &mut Effects,
    kind: KeyEventKind,
    ev: dl::EventOut<'_>,
    now: Now,
) {
    let watchers = t.watches.watchers(ev.key);
    for &(session, id) in watchers {
        push_event(fx, session, id, ev, now);
    }
    let n = watchers.len() as u64;
    t.watches.sent.events[kind as usize] += n;
}

/// A version-3 holder's grant ended while its connection is open, not by its own Unlock: the
/// notice goes to it with the request id of the Lock (or Extend) that holds it.
pub(super) fn notice(
    t: &mut Tables,
    fx: &mut Effects,
    session: Session,
    request_id: u64,
    ev: dl::EventOut<'_>,
    now: Now,
) {
    push_event(fx, session, request_id, ev, now);
    // Every node makes the notice; the holder's own node sends it.
    if t.sessions.conn(session).is_some_and(|c| c.node == t.node) {
        t.watches.sent.notices += 1;
    }
}
