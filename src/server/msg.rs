//! The messages that cross the thread boundary between workers and the owner.
//!
//! A worker parses requests zero-copy from its read buffer and copies each one exactly once, into
//! the arena of the batch it is filling; the batch is sent to the owner once per loop turn. The
//! owner answers with effects (`server::effect`: the reply to each operation, and unsolicited
//! ones: lock grants, timeouts, idle closes), each routed to its connection, their variable
//! bytes in the arena of a per-worker [`Replies`] batch that is sent, and the worker woken, once
//! per owner turn. The worker encodes the wire bytes. [`ToOwner`] also carries the admin port's
//! questions (`server::query`) and the shutdown.

pub use super::arena::{Arena, Span};
pub use super::conn_id::ConnId;
use super::effect::Effect;

pub use crate::protocol::counter::{CounterKind, CounterOp};
pub use crate::protocol::dlock::{DlockKind, DlockOp};
pub use crate::protocol::lockd::LockdOp;
pub use crate::protocol::memcache::{McCmd, McForm, McOp};

macro_rules! define_op {
    ($($proto:ident, $v:ident, $name:literal, $ty:ty, $op:ty, $reply:ty;)*) => {
        /// What a worker sends the owner about one connection: a request of its protocol (one
        /// variant per protocol of `crate::protocol`'s list), or a connection event.
        #[derive(Clone, Copy, Debug)]
        pub enum Op {
            $($v($op),)*
        /// Bytes the worker could answer itself but must keep in order behind operations still at
        /// the owner; `close` closes the connection after them.
        Literal {
            bytes: Span,
            close: bool,
        },
        /// A dlock connection was accepted (starts its idle timer).
        DlockOpen,
        /// A connection was accepted from `peer` on a `proto` listener (for the admin port's lock
        /// listing and per-listener counts). Never answered, not counted in flight.
        Open {
            proto: super::Proto,
            peer: std::net::SocketAddr,
        },
        /// The connection is gone: release or orphan what it held, drop its waits. Never answered.
        Close,
        /// The client ended its side of a dlock connection (EOF) with requests still in flight. If
        /// one is a Lock waiting, the client is gone as far as that Lock is concerned ("wait until
        /// acquired, or the client disconnects"): the owner gives it up and answers with one record
        /// that completes every request it dropped and closes. Not itself counted in flight.
        Eof,
        }

        impl Op {
            /// Whether this request reports the process's connection counters (`stats`), which
            /// the owner loop gives it before apply ([`super::Live::stamp`]).
            #[inline]
            pub fn reports_live(&self) -> bool {
                matches!(self, Op::Mc(McOp { cmd: McCmd::Stats { .. }, .. }))
            }

            /// The protocol whose request this is; `None` for the other ops.
            #[inline]
            pub fn proto(&self) -> Option<super::Proto> {
                match self {
                    $(Op::$v(_) => Some(super::Proto::$proto),)*
                    _ => None,
                }
            }
        }
    };
}
crate::protocol::protocols!(define_op);

#[derive(Clone, Copy, Debug)]
pub struct OpMsg {
    pub conn: ConnId,
    pub op: Op,
}

/// What a worker sends the owner once per loop turn.
#[derive(Debug, Default)]
pub struct Batch {
    pub worker: u16,
    pub ops: Vec<OpMsg>,
    pub arena: Arena,
    /// Emptied reply buffers the worker is done with, going back to be filled again (empty when
    /// it has none): with [`Replies::spare_ops`], no buffer is allocated per turn in steady state.
    pub spare_effects: Vec<Effect>,
    pub spare_reply_arena: Vec<u8>,
    /// When the worker's loop turn that read these requests began (one clock read per turn, not
    /// per request): the owner's lock-request latency histograms count from here.
    pub stamp: Option<std::time::Instant>,
    /// Some request in `ops` reports the process's connection counters and has not been given
    /// them yet ([`super::Live::stamp`]).
    pub wants_live: bool,
}

/// What the owner sends one worker once per turn.
#[derive(Debug, Default)]
pub struct Replies {
    /// Effects for this worker's connections, in order, each with the connection routing gave
    /// it (`Effect::conn`; one without was dropped), their spans in `arena`. The worker encodes
    /// each into its connection's write buffer (`worker::encode`).
    pub effects: Vec<Effect>,
    pub arena: Arena,
    /// Emptied batch buffers the owner is done with, going back to the worker.
    pub spare_ops: Vec<OpMsg>,
    pub spare_batch_arena: Vec<u8>,
}

/// Buffers that circulate between a worker and the owner: a few are kept, large ones are not.
pub struct Pool<T> {
    items: Vec<Vec<T>>,
}

/// Buffers kept per pool, and the largest capacity (in bytes) worth keeping.
const POOL_DEPTH: usize = 4;
const POOL_KEEP_BYTES: usize = 1024 * 1024;

impl<T> Default for Pool<T> {
    fn default() -> Self {
        Pool { items: Vec::new() }
    }
}

impl<T> Pool<T> {
    /// An empty buffer, reused when one is at hand.
    pub fn take(&mut self) -> Vec<T> {
        self.items.pop().unwrap_or_default()
    }

    /// Give a buffer back (it is cleared); dropped if the pool is full or the buffer too big.
    pub fn give(&mut self, mut v: Vec<T>) {
        let bytes = v.capacity() * std::mem::size_of::<T>().max(1);
        if v.capacity() > 0 && bytes <= POOL_KEEP_BYTES && self.items.len() < POOL_DEPTH {
            v.clear();
            self.items.push(v);
        }
    }
}

/// How a thread outside the I/O path (the admin port) reaches the owner: its channel, and the
/// waker of the thread that runs it when that is the one I/O worker (run to completion), which
/// sleeps in its poll otherwise.
#[derive(Clone)]
pub struct OwnerLink {
    pub tx: crossbeam_channel::Sender<ToOwner>,
    pub wake: Option<std::sync::Arc<mio::Waker>>,
}

impl OwnerLink {
    /// Send and wake; false if the owner is gone, or its channel stayed full for `wait`.
    pub fn send(&self, msg: ToOwner, wait: std::time::Duration) -> bool {
        let wake = || {
            if let Some(w) = &self.wake {
                let _ = w.wake();
            }
        };
        let sent = match self.tx.try_send(msg) {
            Ok(()) => true,
            Err(crossbeam_channel::TrySendError::Full(msg)) => {
                // The thread that drains it must be awake to make room.
                wake();
                self.tx.send_timeout(msg, wait).is_ok()
            }
            Err(crossbeam_channel::TrySendError::Disconnected(_)) => false,
        };
        wake();
        sent
    }
}

/// Messages into the owner.
#[derive(Debug)]
pub enum ToOwner {
    Batch(Batch),
    /// An admin-port question; the answer goes back on the channel (the admin thread waits for
    /// it with a deadline, so a busy owner delays the admin port, never the reverse).
    Admin(
        super::query::Query,
        crossbeam_channel::Sender<super::query::Answer>,
    ),
    Shutdown,
}
