//! Routing: a turn's typed effects, addressed to sessions, sorted into one batch per worker,
//! addressed to connections.
//!
//! Owns: which connection each effect goes to (the session map's answer at the end of the
//! turn), dropping effects for sessions with no connection in this process, moving their bytes
//! into the worker's arena, and when a turn's effects must go out early. Must not: decide what
//! an effect says (each protocol's `exec` does) nor encode it (the worker does).

use super::sessions::Sessions;
use crate::core::Session;
use crate::server::effect::{Body, Effect, Effects};
use crate::server::msg::{ConnId, Replies};

/// Replies being gathered this turn, one batch per worker.
pub struct Outbox {
    pub per_worker: Vec<Replies>,
    /// The cluster node whose connections these workers own (0 on a single node): effects for
    /// another node's connections are that node's to send, and are dropped here.
    pub node: u16,
}

/// Effect bytes after which the owner routes and sends a turn's effects at once instead of at
/// the end of its turn: keeps every arena far below the 4 GiB its 32-bit spans can address.
const SEND_EARLY_BYTES: usize = 64 * 1024 * 1024;

impl Outbox {
    pub fn new(workers: usize) -> Outbox {
        Outbox::for_node(workers, 0)
    }

    /// The outbox of cluster node `node`, whose `workers` own the node's connections.
    pub fn for_node(workers: usize, node: u16) -> Outbox {
        Outbox {
            per_worker: (0..workers).map(|_| Replies::default()).collect(),
            node,
        }
    }

    /// An answer outside the state machine, addressed to a connection (a cluster node's
    /// no-quorum answers and closes): `bytes` as they go on the wire.
    pub fn direct(&mut self, conn: ConnId, done: u32, close: bool, bytes: &[u8]) {
        let Some(replies) = self.per_worker.get_mut(usize::from(conn.worker)) else {
            return;
        };
        if replies.effects.is_empty() {
            replies.arena.bytes.clear();
        }
        let span = replies.arena.push(bytes);
        replies.effects.push(Effect {
            to: Session(0),
            done,
            close,
            body: Body::Literal(span),
            conn: Some(conn),
        });
    }

    /// Close `conn` at once, leaving its unanswered requests so (see [`Body::Abort`]).
    pub fn abort(&mut self, conn: ConnId) {
        let Some(replies) = self.per_worker.get_mut(usize::from(conn.worker)) else {
            return;
        };
        if replies.effects.is_empty() {
            replies.arena.bytes.clear();
        }
        replies.effects.push(Effect {
            to: Session(0),
            done: 0,
            close: true,
            body: Body::Abort,
            conn: Some(conn),
        });
    }

    /// Route every effect of `fx` (which is left empty, its buffers kept): each goes to the
    /// connection its session has here (`Effect::conn`), in that worker's batch; an effect for
    /// a session with no connection (ended, or another process's) or on a worker this process
    /// does not have is dropped (with several workers it is not copied anywhere; with one it
    /// stays in the batch with no connection, and the worker skips it). Consecutive effects of
    /// one session (a pipeline's replies) look the session up once.
    pub fn route(&mut self, fx: &mut Effects, sessions: &Sessions) {
        let node = self.node;
        // The session of the run of effects being routed (a pipeline's replies are one run, so
        // its session is looked up once), and where it goes: only this node's connections.
        let mut run: Option<(Session, Option<ConnId>)> = None;
        let mut conn_of = |s: Session| match run {
            Some((r, c)) if r == s => c,
            _ => {
                let c = sessions.conn(s).filter(|c| c.node == node);
                run = Some((s, c));
                c
            }
        };
        if let [replies] = &mut self.per_worker[..] {
            // One worker: its batch takes the effects and their bytes whole (swapped, not
            // copied). Only when an early send this turn left some there do they move, after
            // those.
            let shift = match replies.effects.is_empty() {
                true => 0,
                false => replies.arena.bytes.len() as u32,
            };
            for run in fx.list.chunk_by_mut(|a, b| a.to == b.to) {
                let conn = conn_of(run[0].to).filter(|c| c.worker == 0);
                for e in run {
                    e.conn = conn;
                    if shift != 0 {
                        e.body.spans_mut(|s| s.start += shift);
                    }
                }
            }
            if replies.effects.is_empty() {
                // (Bytes left without effects, if any, are dropped with `fx` below.)
                std::mem::swap(&mut replies.effects, &mut fx.list);
                std::mem::swap(&mut replies.arena.bytes, &mut fx.arena.bytes);
            } else {
                replies.effects.append(&mut fx.list);
                replies.arena.bytes.extend_from_slice(&fx.arena.bytes);
            }
        } else {
            // Several workers: each batch has its own arena, so the effects and bytes move.
            for e in &fx.list {
                let Some(conn) = conn_of(e.to) else { continue };
                let Some(replies) = self.per_worker.get_mut(usize::from(conn.worker)) else {
                    continue;
                };
                if replies.effects.is_empty() {
                    replies.arena.bytes.clear();
                }
                let mut e = *e;
                let (from, to) = (&fx.arena.bytes, &mut replies.arena);
                e.body.spans_mut(|s| *s = to.push(s.get(from)));
                e.conn = Some(conn);
                replies.effects.push(e);
            }
        }
        fx.clear();
    }

    /// Whether a turn's effects are large enough to be routed and sent before the turn ends.
    pub fn should_send_early(fx: &Effects) -> bool {
        fx.arena.bytes.len() >= SEND_EARLY_BYTES
    }
}
