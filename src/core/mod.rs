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
pub mod store;
pub mod wheel;

/// Identity of one client connection: which worker owns it, its slab slot, and the generation of
/// that slot. A slot is reused after a close; the generation is not, so a late reply or lock grant
/// addressed to a closed connection can never reach the stranger that reuses its slot.
///
/// This is also the lock *holder* identity (a session id): today one session per connection.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ConnId {
    pub worker: u16,
    pub slot: u32,
    pub gen: u32,
}

impl ConnId {
    pub const fn new(worker: u16, slot: u32, gen: u32) -> Self {
        ConnId { worker, slot, gen }
    }

    /// The holder in a snapshot.
    pub fn encode(&self, out: &mut Vec<u8>) {
        codec::put_u64(out, u64::from(self.worker));
        codec::put_u64(out, u64::from(self.slot));
        codec::put_u64(out, u64::from(self.gen));
    }

    pub fn decode(r: &mut codec::Reader<'_>) -> Result<ConnId, codec::DecodeError> {
        let worker = u16::try_from(r.u64()?)
            .map_err(|_| codec::DecodeError::Invalid("worker over 16 bits"))?;
        Ok(ConnId::new(worker, r.u32()?, r.u32()?))
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
