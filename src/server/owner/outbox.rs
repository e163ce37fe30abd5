//! Routing: a turn's typed effects, addressed to sessions, sorted into one batch per worker,
//! addressed to connections.
//!
//! Owns: which connection each effect goes to (the session map's answer at the end of the
//! turn), dropping effects for sessions with no connection in this process, moving their bytes
//! into the worker's arena, and when a turn's effects must go out early. Must not: decide what
//! an effect says (the `exec_*` files do) nor encode it (the worker does).

use super::sessions::Sessions;
use crate::core::Session;
use crate::server::effect::Effects;
use crate::server::msg::{ConnId, Record, Replies};

/// Replies being gathered this turn, one batch per worker.
pub struct Outbox {
    pub per_worker: Vec<Replies>,
}

/// Effect bytes after which the owner routes and sends a turn's effects at once instead of at
/// the end of its turn: keeps every arena far below the 4 GiB its 32-bit spans can address.
const SEND_EARLY_BYTES: usize = 64 * 1024 * 1024;

impl Outbox {
    pub fn new(workers: usize) -> Outbox {
        Outbox {
            per_worker: (0..workers).map(|_| Replies::default()).collect(),
        }
    }

    /// Route every effect of `fx` (which is left empty, its buffers kept): each goes to the
    /// connection its session has here, into that worker's batch; an effect for a session
    /// with no connection (ended, or another process's) or on a worker this process does not
    /// have is dropped. Consecutive effects of one session (a pipeline's replies) look the
    /// session up once.
    pub fn route(&mut self, fx: &mut Effects, sessions: &Sessions) {
        for replies in &mut self.per_worker {
            if replies.records.is_empty() {
                // Bytes of effects that were all dropped: nothing names them.
                replies.arena.bytes.clear();
            }
        }
        let single = self.per_worker.len() == 1;
        // One worker: its batch takes the whole arena (swapped, not copied) and the spans stay
        // valid, or, when an early send this turn already left bytes there, they move by `base`.
        let base = match self.per_worker.first() {
            Some(r) if single => r.arena.bytes.len() as u32,
            _ => 0,
        };
        let mut last: Option<(Session, Option<ConnId>)> = None;
        for e in fx.list.drain(..) {
            let conn = match last {
                Some((s, c)) if s == e.to => c,
                _ => {
                    let c = sessions.conn(e.to);
                    last = Some((e.to, c));
                    c
                }
            };
            let Some(conn) = conn else { continue };
            let Some(replies) = self.per_worker.get_mut(usize::from(conn.worker)) else {
                continue;
            };
            let mut body = e.body;
            if !single {
                // Several workers: each batch has an arena of its own, so the bytes move.
                let (from, to) = (&fx.arena.bytes, &mut replies.arena);
                body.spans_mut(|s| *s = to.push(s.get(from)));
            } else if base != 0 {
                body.spans_mut(|s| s.start += base);
            }
            replies.records.push(Record {
                conn,
                body,
                done: e.done,
                close: e.close,
            });
        }
        if single {
            let replies = &mut self.per_worker[0];
            if base == 0 {
                std::mem::swap(&mut replies.arena.bytes, &mut fx.arena.bytes);
            } else {
                replies.arena.bytes.extend_from_slice(&fx.arena.bytes);
            }
        }
        fx.arena.bytes.clear();
    }

    /// Whether a turn's effects are large enough to be routed and sent before the turn ends.
    pub fn should_send_early(fx: &Effects) -> bool {
        fx.arena.bytes.len() >= SEND_EARLY_BYTES
    }
}
