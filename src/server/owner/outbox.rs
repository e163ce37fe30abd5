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
use crate::server::msg::{Record, Replies};

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
                // Effects that were all dropped: nothing names them.
                replies.effects.clear();
                replies.arena.bytes.clear();
            }
        }
        // The session of the run of effects being routed, and whether it has a record (its
        // connection is here).
        let mut run: Option<(Session, bool)> = None;
        if let [replies] = &mut self.per_worker[..] {
            // One worker: its batch takes the effects and their bytes whole (swapped, not
            // copied), and the records name runs of them. Only when an early send this turn
            // left some behind do they move, after those.
            let (base, shift) = (replies.effects.len(), replies.arena.bytes.len() as u32);
            for (i, e) in fx.list.iter_mut().enumerate() {
                if shift != 0 {
                    e.body.spans_mut(|s| s.start += shift);
                }
                match run {
                    Some((s, open)) if s == e.to => {
                        if let (true, Some(r)) = (open, replies.records.last_mut()) {
                            r.count += 1;
                        }
                    }
                    _ => {
                        let conn = sessions.conn(e.to).filter(|c| c.worker == 0);
                        run = Some((e.to, conn.is_some()));
                        if let Some(conn) = conn {
                            let first = (base + i) as u32;
                            replies.records.push(Record {
                                conn,
                                first,
                                count: 1,
                            });
                        }
                    }
                }
            }
            if base == 0 && shift == 0 {
                std::mem::swap(&mut replies.effects, &mut fx.list);
                std::mem::swap(&mut replies.arena.bytes, &mut fx.arena.bytes);
            } else {
                replies.effects.append(&mut fx.list);
                replies.arena.bytes.extend_from_slice(&fx.arena.bytes);
            }
        } else {
            // Several workers: each batch has its own arena, so the effects and bytes move.
            let mut conn = None;
            for e in &fx.list {
                let same = matches!(run, Some((s, _)) if s == e.to);
                if !same {
                    conn = sessions.conn(e.to);
                }
                run = Some((e.to, true));
                let Some(conn) = conn else { continue };
                let Some(replies) = self.per_worker.get_mut(usize::from(conn.worker)) else {
                    continue;
                };
                let mut e = *e;
                let (from, to) = (&fx.arena.bytes, &mut replies.arena);
                e.body.spans_mut(|s| *s = to.push(s.get(from)));
                let first = replies.effects.len() as u32;
                replies.effects.push(e);
                match replies.records.last_mut() {
                    // The run goes on: this worker's last record is its own.
                    Some(r) if same => r.count += 1,
                    _ => replies.records.push(Record {
                        conn,
                        first,
                        count: 1,
                    }),
                }
            }
        }
        fx.clear();
    }

    /// Whether a turn's effects are large enough to be routed and sent before the turn ends.
    pub fn should_send_early(fx: &Effects) -> bool {
        fx.arena.bytes.len() >= SEND_EARLY_BYTES
    }
}
