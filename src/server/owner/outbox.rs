//! Replies gathered during a turn, one batch per worker, and the small encoders they share.
//!
//! Owns: where each reply's bytes go and when a turn's replies must go out early. Must not:
//! decide what a reply says (the `exec_*` files do).

use crate::server::msg::{ConnId, Record, Replies, Span};

/// Replies being gathered this turn, one batch per worker.
pub struct Outbox {
    pub per_worker: Vec<Replies>,
    /// The cluster node whose connections these workers own (0 on a single node): replies to
    /// another node's connections are that node's to send, and are dropped here unwritten.
    pub node: u16,
    /// The largest reply arena of this turn so far.
    pub bytes_this_turn: usize,
}

/// Reply bytes for one worker after which the owner sends them at once instead of at the end of
/// its turn.
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
            bytes_this_turn: 0,
        }
    }

    /// Write one reply record for `conn`: `done` is 1 when it answers an operation the worker
    /// sent, 0 for an unsolicited message.
    #[inline]
    pub fn record(
        &mut self,
        conn: ConnId,
        done: u32,
        close: bool,
        write: impl FnOnce(&mut Vec<u8>),
    ) {
        self.record_then(conn, done, |o| {
            write(o);
            close
        });
    }

    /// Like [`Outbox::record`], with the writer deciding whether the connection closes after it.
    pub fn record_then(
        &mut self,
        conn: ConnId,
        done: u32,
        write: impl FnOnce(&mut Vec<u8>) -> bool,
    ) {
        if conn.node != self.node {
            return;
        }
        let Some(replies) = self.per_worker.get_mut(conn.worker as usize) else {
            return;
        };
        let start = replies.arena.bytes.len();
        let close = write(&mut replies.arena.bytes);
        let len = replies.arena.bytes.len() - start;
        debug_assert!(
            replies.arena.bytes.len() <= u32::MAX as usize,
            "reply arena over 4 GiB"
        );
        let bytes = Span {
            start: start as u32,
            len: len as u32,
        };
        replies.records.push(Record {
            conn,
            bytes,
            done,
            close,
        });
        self.bytes_this_turn = self.bytes_this_turn.max(replies.arena.bytes.len());
    }

    /// Whether some worker's replies are large enough to be sent before the turn ends (keeps
    /// every reply arena far below the 4 GiB its 32-bit spans can address).
    pub fn should_send_early(&self) -> bool {
        self.bytes_this_turn >= SEND_EARLY_BYTES
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
