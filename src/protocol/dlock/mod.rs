//! dlock (`dlock.proto`): multi-key locks with waits and leases over length-prefixed protobuf
//! messages, on its own listener (`--dlock`).
//!
//! `wire` decodes Requests and encodes Responses; `decode` checks a Request on the worker
//! (version, access token, type, key count) and hands it to the owner as a [`DlockOp`]; `exec`
//! applies it to the dlock table ([`crate::core::dlock`]), keeping a connection's later
//! requests behind its waiting Lock (`sessions`); `reply` writes a [`DlockReply`]; `command`
//! stores a [`DlockOp`] in a command entry.

mod command;
mod decode;
pub(crate) mod exec;
mod native;
mod reply;
pub(crate) mod sessions;
pub mod watches;
pub use holdfast_wire::dlock as wire;

pub use command::REFUSALS;
pub use reply::tag as reply_tag;

use super::Protocol;
use crate::core::Session;
use crate::server::msg::Span;

/// One dlock request, already checked by the worker for version, type, token and key count.
#[derive(Clone, Copy, Debug)]
pub enum DlockKind {
    Ping,
    /// `keys` spans the raw RequestLock message (iterate with [`wire::Keys`]).
    Lock {
        keys: Span,
        key_count: u32,
        wait_us: Option<u64>,
        lease_us: Option<u64>,
    },
    Unlock {
        keys: Span,
        key_count: u32,
    },
    /// Answer with this status and error text, touching nothing.
    Refuse {
        status: u32,
        text: &'static str,
    },
    /// A version-3 request (the native protocol, `holdfast.proto`) of type `ty`: Ping, or one
    /// whose `lock` spans the raw RequestLock message (its keys and the native fields are read
    /// from it: [`wire::decode_lock`]), with `key_count` keys.
    Native {
        ty: u8,
        lock: Span,
        key_count: u32,
    },
    /// [`DlockKind::Refuse`], answered in version 3.
    NativeRefuse {
        status: u32,
        text: &'static str,
    },
}

impl DlockKind {
    /// Whether the request is a version-3 one (its answer is a version-3 Response).
    pub fn is_native(&self) -> bool {
        matches!(
            self,
            DlockKind::Native { .. } | DlockKind::NativeRefuse { .. }
        )
    }
}

#[derive(Clone, Copy, Debug)]
pub struct DlockOp {
    pub id: Option<u64>,
    pub kind: DlockKind,
}

/// A dlock Response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DlockReply {
    pub id: Option<u64>,
    pub status: u32,
    pub text: Option<&'static str>,
    /// Keys (entries): busy or not-held keys.
    pub keys: Span,
    pub time: i64,
    /// The fencing token of a granted Lock (Response field 7).
    pub fence: Option<u64>,
    /// A version-3 Response (`version` 3, and `extra` after the fields above).
    pub native: bool,
    /// Version 3: the `info` and `event` fields, already encoded.
    pub extra: Span,
}

/// The dlock protocol.
pub(crate) struct Dlock;

impl Protocol for Dlock {
    type Op = DlockOp;
    type Reply = DlockReply;
}

/// Where an answer goes: the session, whether it answers an operation the worker sent, and
/// the request id it echoes.
#[derive(Clone, Copy)]
pub(crate) struct To {
    pub(crate) session: Session,
    pub(crate) done: u32,
    pub(crate) id: Option<u64>,
}

/// A lease's duration as the table runs it: rounded up to whole milliseconds, plus one. The
/// state machine's clock counts whole milliseconds and a grant can happen up to a millisecond
/// after the current one began, so a lease of exactly its duration on that clock could end up
/// to a millisecond before its duration has passed; a lease never ends early (`docs/protocol.md`).
pub(crate) fn lease_on_the_table_clock(lease_us: Option<u64>) -> Option<u64> {
    lease_us.filter(|&us| us > 0).map(|us| {
        us.div_ceil(1000)
            .saturating_add(LEASE_CLOCK_SLACK_MS)
            .saturating_mul(1000)
    })
}

/// What [`lease_on_the_table_clock`] adds: one tick of the state machine's clock.
pub const LEASE_CLOCK_SLACK_MS: u64 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_on_the_table_clock_is_rounded_up_and_never_wraps() {
        assert_eq!(lease_on_the_table_clock(None), None);
        assert_eq!(lease_on_the_table_clock(Some(0)), None);
        assert_eq!(lease_on_the_table_clock(Some(1)), Some(2000));
        assert_eq!(lease_on_the_table_clock(Some(1000)), Some(2000));
        assert_eq!(lease_on_the_table_clock(Some(1001)), Some(3000));
        // The longest leases a client can ask for saturate instead of wrapping to a short one
        // (or overflowing: a panic of the owner thread in a debug build).
        for us in [u64::MAX, u64::MAX - 999, u64::MAX / 1000 * 1000] {
            assert!(lease_on_the_table_clock(Some(us)).unwrap() >= us, "{us}");
        }
    }
}
