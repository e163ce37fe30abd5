//! One connection's protocol state, apart from its socket: what was received and not parsed yet,
//! what is to be written, how many of its requests are at the owner. The worker pairs it with a
//! socket; [`crate::server::sim::Sim`] drives it with bytes and a fake clock, so the whole request path
//! (parse, owner, reply) runs in tests and fuzzing without threads or sockets.

use crate::server::effect::Effect;
use crate::server::msg::ConnId;
use crate::server::msg::{Batch, Op, OpMsg};
use crate::server::Proto;

/// Operations of one connection that may be at the owner at once before it is parsed no further
/// (backpressure; bounds owner-side memory per connection).
pub const MAX_INFLIGHT: u32 = 1024;
/// Reply bytes a connection may have waiting for its client before it is parsed no further. The
/// client then has to read before it may send more.
pub const WBUF_HIGH: usize = 4 * 1024 * 1024;
/// Reply bytes a connection may have waiting at all: beyond this it is closed at once. Parsing
/// stops at [`WBUF_HIGH`], but the replies to the up to [`MAX_INFLIGHT`] requests already at the
/// owner still arrive, and those may be large (gets of big items); this bounds that overshoot.
/// Sixteen times the high-water mark: no client that reads its replies comes near it.
pub const WBUF_MAX: usize = 64 * 1024 * 1024;
/// Worst-case reply bytes of the requests a connection may have in flight before it is parsed no
/// further (one request is always allowed, whatever its bound). Half of [`WBUF_MAX`], so a client
/// that reads keeps well clear of the hard cap.
pub const REPLY_BUDGET: usize = WBUF_MAX / 2;
/// Buffers larger than this are released once empty, so idle connections stay small.
pub(super) const KEEP_BUF: usize = 16 * 1024;

pub struct Conn {
    pub proto: Proto,
    /// Received bytes not yet parsed (empty most of the time: whole requests are parsed straight
    /// out of the bytes just read).
    pub rbuf: Vec<u8>,
    /// memcached text: how far the first line was already searched for its end.
    pub scanned: usize,
    /// `rbuf` ends in the start of a request that parsing stopped at: nothing more is parsed
    /// from it until more bytes arrive (so the worker does not look at it again meanwhile).
    pub partial: bool,
    /// Bytes still to be discarded (the rest of a refused, oversized request).
    pub skip: usize,
    /// Reply bytes not yet written; `wpos` of them are already written.
    pub wbuf: Vec<u8>,
    pub wpos: usize,
    /// Operations sent to the owner and not answered yet.
    pub inflight: u32,
    /// Close once everything in flight is answered and written (quit, EOF, fatal input).
    pub closing: bool,
    /// The largest total size the replies to the requests in flight could have (a get may answer
    /// a whole item per key; old's SYNC copies the whole lock table). Parsing stops while it is at
    /// [`REPLY_BUDGET`] or more, so a client that never reads cannot make the owner build more
    /// than about that much for it. Reset when nothing is in flight.
    pub reply_bound: usize,
    /// A key dump (`keys`) under way: nothing more is parsed until it ends, so that no other
    /// reply lands in the middle of it.
    pub dump: Dump,
    /// Whether requests are served: false for a memcached connection that has yet to
    /// authenticate (`--memcache-auth-file`; see [`super::auth`]), true otherwise.
    pub authenticated: bool,
    /// A dlock connection's version (`docs/protocol.md`, "The native protocol"): 0 until its
    /// first request sets it (2, or 3 for the native protocol); a request of the other version
    /// gets status Version.
    pub dlock_version: u8,
    /// Parsing stops while `inflight` is at this: [`MAX_INFLIGHT`], or lower for the rest of a
    /// worker's turn once the connection has had its share of it (the worker sets it each turn;
    /// [`crate::server::sim::Sim`] leaves it). One compare per request, as before the share.
    pub inflight_cap: u32,
}

/// Where a connection's key dump is (`docs/compat.md`, "Key dump").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dump {
    Idle,
    /// The owner has the dump; its next chunk is coming.
    Running,
    /// A chunk arrived and more are to come: ask for the next once the output is below
    /// [`WBUF_HIGH`] (the dump goes at the pace the client reads).
    Waiting,
}

impl Conn {
    pub fn new(proto: Proto) -> Conn {
        Conn {
            proto,
            rbuf: Vec::new(),
            scanned: 0,
            partial: false,
            skip: 0,
            wbuf: Vec::new(),
            wpos: 0,
            inflight: 0,
            closing: false,
            reply_bound: 0,
            dump: Dump::Idle,
            authenticated: true,
            dlock_version: 0,
            inflight_cap: MAX_INFLIGHT,
        }
    }

    /// A connection accepted while `secrets` are in force: a memcached connection must
    /// authenticate first when users are configured.
    pub fn accepted(proto: Proto, secrets: &crate::tls::Secrets) -> Conn {
        let mut c = Conn::new(proto);
        c.authenticated = proto != Proto::Memcache || secrets.memcache_users.is_none();
        c
    }

    /// Queue bytes the worker answers itself: straight to the write buffer when nothing is in
    /// flight, else through the owner so the reply keeps its place in the connection's order.
    pub fn emit(&mut self, bytes: &[u8], close: bool, id: ConnId, batch: &mut Batch) {
        if self.inflight == 0 {
            self.wbuf.extend_from_slice(bytes);
            if close {
                self.closing = true;
            }
        } else {
            let span = batch.arena.push(bytes);
            batch.ops.push(OpMsg {
                conn: id,
                op: Op::Literal { bytes: span, close },
            });
            self.inflight += 1;
        }
    }

    /// Hand a request to the owner: it is answered there, in order.
    #[inline]
    pub fn push(&mut self, id: ConnId, op: Op, batch: &mut Batch) {
        batch.ops.push(OpMsg { conn: id, op });
        self.inflight += 1;
    }

    pub fn pending_output(&self) -> usize {
        self.wbuf.len() - self.wpos
    }

    /// Whether this turn's share of requests is parsed (the cap is below [`MAX_INFLIGHT`]):
    /// the connection waits for the next turn, not for replies.
    pub fn had_its_turn(&self) -> bool {
        self.inflight >= self.inflight_cap && self.inflight_cap < MAX_INFLIGHT
    }

    /// May more requests be parsed now?
    pub fn can_parse(&self) -> bool {
        !self.closing
            && self.dump == Dump::Idle
            && self.reply_bound < REPLY_BUDGET
            && self.inflight < self.inflight_cap
            && self.pending_output() < WBUF_HIGH
    }

    /// Whether buffered bytes hold a request that may be parsed now (not only the start of one).
    pub fn parsable_buffered(&self) -> bool {
        !self.rbuf.is_empty() && !self.partial && self.can_parse()
    }

    /// Whether everything is answered and written, so a closing connection may go.
    pub fn finished(&self) -> bool {
        self.inflight == 0 && self.pending_output() == 0
    }

    /// Count a request in flight whose reply may be up to `bytes` long.
    pub fn charge(&mut self, bytes: usize) {
        self.reply_bound = self.reply_bound.saturating_add(bytes);
    }

    /// Take reply bytes (tests: the write buffer's bookkeeping).
    #[cfg(test)]
    pub fn deliver(&mut self, bytes: &[u8], done: u32, close: bool) {
        self.wbuf.extend_from_slice(bytes);
        self.delivered(done, close);
    }

    /// Take one effect from the owner: its body encoded straight into the write buffer.
    #[inline]
    pub fn deliver_effect(&mut self, e: &Effect, arena: &[u8]) {
        super::encode::write(&mut self.wbuf, &e.body, arena);
        self.delivered(e.done, e.close);
    }

    /// `done` requests were answered (their replies are in the write buffer).
    #[inline]
    fn delivered(&mut self, done: u32, close: bool) {
        debug_assert!(self.inflight >= done, "reply without a request");
        self.inflight = self.inflight.saturating_sub(done);
        if self.inflight == 0 {
            self.reply_bound = 0;
        }
        if self.dump != Dump::Idle {
            // While dumping, the dump is the last request in flight: a record that completes
            // nothing is one of its chunks, and the end of the dump leaves nothing in flight.
            self.dump = if self.inflight == 0 {
                Dump::Idle
            } else if done == 0 {
                Dump::Waiting
            } else {
                Dump::Running
            };
        }
        if close {
            self.closing = true;
        }
    }

    /// Ask the owner for the next chunk of this connection's key dump if one is awaited and the
    /// client has taken enough of the output. Returns whether it asked.
    pub fn continue_dump(&mut self, id: ConnId, batch: &mut Batch) -> bool {
        if self.dump != Dump::Waiting || self.pending_output() >= WBUF_HIGH {
            return false;
        }
        self.dump = Dump::Running;
        batch.ops.push(OpMsg {
            conn: id,
            op: Op::Mc(crate::server::msg::McOp::text(
                crate::server::msg::McCmd::KeysNext,
                false,
            )),
        });
        true
    }

    /// `n` more bytes of the write buffer reached the socket.
    pub fn written(&mut self, n: usize) {
        self.wpos += n;
        if self.wpos == self.wbuf.len() {
            self.wbuf.clear();
            self.wpos = 0;
            if self.wbuf.capacity() > KEEP_BUF {
                self.wbuf = Vec::new();
            }
        } else if self.wpos >= KEEP_BUF && self.wpos >= self.wbuf.len() / 2 {
            // A client that reads steadily but never quite catches up never empties the buffer;
            // without this the written prefix would stay, and the buffer would grow by every
            // byte ever sent. Moving the unwritten rest (no longer than what was written since
            // the last move) keeps the cost linear.
            self.wbuf.drain(..self.wpos);
            self.wpos = 0;
        }
    }

    /// Bytes waiting to be written.
    pub fn output(&self) -> &[u8] {
        &self.wbuf[self.wpos..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_prefix_is_dropped_while_output_stays_pending() {
        // A client that takes a little less than it is sent, turn after turn, never empties the
        // buffer: the buffer must hold what is pending, not everything ever sent.
        let mut c = Conn::new(Proto::Memcache);
        let reply = vec![b'x'; 64 * 1024];
        for _ in 0..1000 {
            c.deliver(&reply, 0, false);
            let n = c.pending_output() - 1024;
            c.written(n);
            assert!(c.pending_output() >= 1024);
            assert!(c.wbuf.len() <= 2 * (c.pending_output() + reply.len()) + KEEP_BUF);
        }
        assert_eq!(c.output(), &vec![b'x'; c.pending_output()][..]);
    }
}
