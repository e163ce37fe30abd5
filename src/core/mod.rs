//! The lock tables and the item store: pure state machines owned by the owner thread.
//!
//! Nothing in here reads a clock, touches a socket or takes a mutex. Every operation takes the
//! current time as an argument and returns its effects as values (replies, grants to other
//! connections, timer requests kept in each table's own [`wheel::Wheel`]). That keeps every table
//! testable with a fake clock, and lets a replicated log drive the same operations later.

pub mod codec;
pub mod counter;
pub mod dlock;
pub mod fence;
pub mod hash;
pub mod lockd;
pub mod small;
pub mod store;
pub mod wheel;

/// A client session: the identity of a lock holder and of a waiter. The state machine hands
/// sessions out in order (1, 2, 3, ...) as connections first appear (`server::owner::Sessions`);
/// the server layer maps its connections to them. A session id is never reused, so a late grant
/// to a session that ended can never reach a stranger, and it means the same on every replica,
/// which a connection's worker and slab slot do not.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct Session(pub u64);

impl Session {
    /// The session in a snapshot or a command entry.
    pub fn encode(&self, out: &mut Vec<u8>) {
        codec::put_u64(out, self.0);
    }

    pub fn decode(r: &mut codec::Reader<'_>) -> Result<Session, codec::DecodeError> {
        Ok(Session(r.u64()?))
    }

    /// The next of a snapshot's sessions, which it keeps in increasing order: an error named
    /// `what` if it is not above `last` (which it becomes). What was read before it is done
    /// with ([`codec::consumed`]).
    pub fn decode_next(
        r: &mut codec::Reader<'_>,
        last: &mut Option<Session>,
        what: &'static str,
    ) -> Result<Session, codec::DecodeError> {
        codec::consumed(r);
        let session = Session::decode(r)?;
        if last.is_some_and(|l| l >= session) {
            return Err(codec::DecodeError::Invalid(what));
        }
        *last = Some(session);
        Ok(session)
    }
}

/// The current time as the owner thread passes it into the tables.
///
/// The state machine's clock: Unix-epoch milliseconds, carried into the tables by every
/// operation and never read by them. The daemon derives it from the wall clock once at start
/// plus a monotonic clock since, so it never runs backwards; a replicated log will carry the
/// leader's.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Default)]
pub struct Now {
    /// Unix-epoch milliseconds (the timing wheels' clock).
    pub ms: u64,
    /// `ms` in whole seconds (memcached absolute expiry times, dlock `server_unix_time`).
    pub unix: u64,
}

impl Now {
    pub const fn from_unix_ms(ms: u64) -> Now {
        Now {
            ms,
            unix: ms / 1000,
        }
    }
}
