//! Effects: what applying a turn of commands asks the world to do, as values.
//!
//! The state machine never writes wire bytes. Each reply to a session's request, each grant to
//! a waiting session and each close is one [`Effect`] addressed to a [`Session`], with a typed
//! body (one small enum per protocol). Variable bytes (item values, echoed payloads, key lists)
//! go into the turn's reused [`Arena`] and are named by [`Span`]s. After apply, the server layer
//! routes each effect to the connection its session has in this process (`owner::Outbox`),
//! dropping those of sessions with no connection here, and the worker that owns the connection
//! encodes it into the connection's write buffer (`worker::encode`).
//!
//! Owns: the effect types, the arena layouts of their lists, and their canonical encoding (what
//! the replay tests compare). Apply never sets an effect's connection (routing does) and never
//! builds a frame (the worker's writer does, from the body); a body holds wire bytes only where
//! they are fixed (memcached's text words such as `STORED\r\n`, a binary response's static
//! value) or where the worker already wrote them (`Literal`). Must not: know about sockets.

use crate::core::codec;
use crate::core::Session;
use crate::protocol::Answer;
use crate::server::arena::{Arena, Span};
use crate::server::conn_id::ConnId;

pub use crate::protocol::counter::{put_counter, CounterEntry, CounterIter, CounterReply};
pub use crate::protocol::dlock::DlockReply;
pub use crate::protocol::lockd::LockdReply;
pub use crate::protocol::memcache::{put_item, BinHead, ItemEntry, ItemIter, McReply};

/// One effect of a turn, for one session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Effect {
    pub to: Session,
    /// How many of the session's requests this completes: 1 for an answer, 0 for an unsolicited
    /// message (a grant, a key-dump chunk, an idle close), more when several are dropped at once.
    pub done: u32,
    /// Close the session's connection once this is written.
    pub close: bool,
    pub body: Body,
    /// Where routing sent it: the connection its session has in this process (None until
    /// routed, and for an effect routing dropped). Never set by apply.
    pub conn: Option<ConnId>,
}

macro_rules! define_body {
    ($($proto:ident, $v:ident, $name:literal, $ty:ty, $op:ty, $reply:ty;)*) => {
        /// What to write, if anything: a reply of one protocol (one variant per protocol of
        /// `crate::protocol`'s list), or one of the bodies every connection may get.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Body {
            /// Nothing (a quiet success, a close, a completion).
            Nothing,
            /// Close the connection now: requests still unanswered stay so, and replies not yet
            /// written are dropped. A cluster node that fenced itself, or whose sessions the
            /// cluster expired, must not answer anything more on its clients' connections.
            Abort,
            /// Bytes the worker answered itself, kept in order behind requests that were at the
            /// owner.
            Literal(Span),
            $($v($reply),)*
        }

        impl Body {
            /// The body alone in canonical bytes (see [`Effects::encode_canonical`]).
            pub fn encode_canonical(&self, a: &[u8], out: &mut Vec<u8>) {
                use codec::{put_bytes, put_u8};
                match *self {
                    Body::Nothing => put_u8(out, tag::NOTHING),
                    Body::Abort => put_u8(out, tag::ABORT),
                    Body::Literal(s) => {
                        put_u8(out, tag::LITERAL);
                        put_bytes(out, s.get(a));
                    }
                    $(Body::$v(r) => <$ty>::encode_canonical(&r, a, out),)*
                }
            }

            /// Every span this body names, to re-base when its bytes move to another arena.
            pub fn spans_mut(&mut self, mut f: impl FnMut(&mut Span)) {
                match self {
                    Body::Nothing | Body::Abort => {}
                    Body::Literal(s) => f(s),
                    $(Body::$v(r) => <$ty>::spans_mut(r, f),)*
                }
            }
        }
    };
}
crate::protocol::protocols!(define_body);

/// A turn's effects, in the order apply produced them, with their bytes. Reused across turns
/// (cleared, not dropped) so that the hot path allocates nothing.
#[derive(Debug, Default)]
pub struct Effects {
    pub list: Vec<Effect>,
    pub arena: Arena,
}

impl Effects {
    #[inline]
    pub fn push(&mut self, to: Session, done: u32, close: bool, body: Body) {
        self.list.push(Effect {
            to,
            done,
            close,
            body,
            conn: None,
        });
    }

    /// An answer (completes one request) with `body`.
    #[inline]
    pub fn reply(&mut self, to: Session, body: Body) {
        self.push(to, 1, false, body);
    }

    pub fn clear(&mut self) {
        self.list.clear();
        self.arena.bytes.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Bytes to copy into the arena, as a span.
    #[inline]
    pub fn bytes(&mut self, data: &[u8]) -> Span {
        self.arena.push(data)
    }

    /// The arena's end: the start of a list about to be written with [`put_entry`] & co.
    #[inline]
    pub fn mark(&self) -> usize {
        self.arena.bytes.len()
    }

    /// The span from `mark` to the arena's end.
    #[inline]
    pub fn since(&self, mark: usize) -> Span {
        debug_assert!(
            self.arena.bytes.len() <= u32::MAX as usize,
            "arena over 4 GiB"
        );
        Span {
            start: mark as u32,
            len: (self.arena.bytes.len() - mark) as u32,
        }
    }

    /// Every effect in canonical bytes: its session, the connection `route` gives it (None:
    /// nowhere), how many requests it completes, whether it closes, and its body with every
    /// span resolved to its bytes. Equal effects give equal bytes whatever their arena layout.
    pub fn encode_canonical(&self, route: impl Fn(Session) -> Option<ConnId>, out: &mut Vec<u8>) {
        let a = &self.arena.bytes[..];
        for e in &self.list {
            e.to.encode(out);
            match route(e.to) {
                Some(conn) => {
                    codec::put_bool(out, true);
                    conn.encode(out);
                }
                None => codec::put_bool(out, false),
            }
            codec::put_u64(out, u64::from(e.done));
            codec::put_bool(out, e.close);
            let mut body = Vec::new();
            e.body.encode_canonical(a, &mut body);
            codec::put_bytes(out, &body);
        }
    }
}

/// Tags of the canonical body encoding (first byte).
pub mod tag {
    pub const NOTHING: u8 = 0;
    pub const LITERAL: u8 = 1;
    pub const ABORT: u8 = 2;
    pub use crate::protocol::counter::reply_tag::{
        DUMP as COUNTER_DUMP, STATS as COUNTER_STATS, STATUS as COUNTER_STATUS,
    };
    pub use crate::protocol::dlock::reply_tag::RESPONSE as DLOCK;
    pub use crate::protocol::lockd::reply_tag::{
        FRAME as LOCKD_FRAME, SYNC as LOCKD_SYNC, TOKEN as LOCKD_TOKEN,
    };
    pub use crate::protocol::memcache::reply_tag::{
        BIN as MC_BIN, BIN_ITEM as MC_BIN_ITEM, BIN_KEYED as MC_BIN_KEYED,
        BIN_NUMBER as MC_BIN_NUMBER, ITEMS as MC_ITEMS, KEYS as MC_KEYS, NUMBER as MC_NUMBER,
        STATS as MC_STATS, TOKEN as MC_TOKEN, WORDS as MC_WORDS,
    };
}

// ---------------------------------------------------------------------------------------------
// Arena layouts of the lists. The arena is written by apply and read by the worker in the same
// process, never from the network; the readers still stop at the first short entry rather than
// index past the end.

/// One entry of a list: a 4-byte little-endian length, then the bytes.
#[inline]
pub fn put_entry(a: &mut Arena, bytes: &[u8]) {
    a.bytes
        .extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    a.bytes.extend_from_slice(bytes);
}

pub(crate) fn take_u32(b: &mut &[u8]) -> Option<u32> {
    let (head, rest) = b.split_first_chunk::<4>()?;
    *b = rest;
    Some(u32::from_le_bytes(*head))
}

pub(crate) fn take_u64(b: &mut &[u8]) -> Option<u64> {
    let (head, rest) = b.split_first_chunk::<8>()?;
    *b = rest;
    Some(u64::from_le_bytes(*head))
}

pub(crate) fn take_entry<'a>(b: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = take_u32(b)? as usize;
    if b.len() < len {
        return None;
    }
    let (e, rest) = b.split_at(len);
    *b = rest;
    Some(e)
}

/// The entries of a list written with [`put_entry`].
pub struct Entries<'a>(pub &'a [u8]);

impl<'a> Iterator for Entries<'a> {
    type Item = &'a [u8];

    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        let mut b = self.0;
        let e = take_entry(&mut b);
        self.0 = if e.is_some() { b } else { &[] };
        e
    }
}

/// Append a decimal number without going through `fmt`.
#[inline]
pub fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_read_back_what_was_written_and_stop_at_a_short_entry() {
        let mut a = Arena::default();
        put_entry(&mut a, b"one");
        put_entry(&mut a, b"");
        put_entry(&mut a, b"three");
        let got: Vec<&[u8]> = Entries(&a.bytes).collect();
        assert_eq!(got, [&b"one"[..], b"", b"three"]);
        let cut = &a.bytes[..a.bytes.len() - 1];
        assert_eq!(Entries(cut).count(), 2, "a short last entry is not read");
        let mut items = Arena::default();
        put_item(&mut items, b"k", 7, 9, b"value");
        let it: Vec<_> = ItemIter(&items.bytes).collect();
        assert_eq!(it.len(), 1);
        assert_eq!(
            (it[0].key, it[0].flags, it[0].cas, it[0].value),
            (&b"k"[..], 7, 9, &b"value"[..])
        );
        assert_eq!(ItemIter(&items.bytes[..10]).count(), 0);
        let mut counters = Arena::default();
        put_counter(&mut counters, b"c", 1, 2);
        let c: Vec<_> = CounterIter(&counters.bytes).collect();
        assert_eq!((c[0].name, c[0].current, c[0].max), (&b"c"[..], 1, 2));
    }

    #[test]
    fn canonical_bytes_do_not_depend_on_the_arena_layout() {
        let mut a = Effects::default();
        a.bytes(b"padding");
        let p = a.bytes(b"name\0");
        let frame = |payload| Body::Lockd(LockdReply::Frame { opcode: 3, payload });
        a.reply(Session(4), frame(p));
        let mut b = Effects::default();
        let p = b.bytes(b"name\0");
        b.reply(Session(4), frame(p));
        let (mut x, mut y) = (Vec::new(), Vec::new());
        a.encode_canonical(|_| None, &mut x);
        b.encode_canonical(|_| None, &mut y);
        assert_eq!(x, y);
        let mut c = Effects::default();
        let p = c.bytes(b"other\0");
        c.reply(Session(4), frame(p));
        let mut z = Vec::new();
        c.encode_canonical(|_| None, &mut z);
        assert_ne!(x, z, "the payload's bytes are compared, not its span");
    }
}
