//! Fencing tokens (`docs/protocol.md`, "Fencing tokens"): every grant, in every table, gets a 64-bit number
//! strictly greater than every token granted before it anywhere in the service, so that a storage
//! system downstream can refuse a write from a holder whose lock has since gone to someone else.
//!
//! Owns: the one counter that all tables of a state share. Must not: be shared between two
//! states (each replica of the state machine has its own, restored from its snapshot).
//!
//! Why a shared handle rather than a `&mut u64` passed to every operation: grants happen deep in
//! the tables (a release that hands a lock to a waiter, a timer that expires an orphan), and the
//! tables' many operations and their tests stay as they are. The atomic is never contended: one
//! thread applies the state's operations.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A handle on a state's fencing counter; clones share it.
#[derive(Clone, Debug, Default)]
pub struct Fence(Arc<AtomicU64>);

impl Fence {
    /// The token for a new grant.
    #[inline]
    pub fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The most recent token handed out (0 before the first).
    #[inline]
    pub fn last(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Never hand out `v` or less again (restoring a snapshot).
    pub fn raise_to(&self, v: u64) {
        self.0.fetch_max(v, Ordering::Relaxed);
    }

    /// Share `other`'s counter from now on, keeping the larger of the two values.
    pub fn join(&mut self, other: &Fence) {
        other.raise_to(self.last());
        *self = other.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_one_strictly_increasing_counter() {
        let a = Fence::default();
        let b = a.clone();
        assert_eq!((a.next(), b.next(), a.next()), (1, 2, 3));
        assert_eq!(b.last(), 3);
        let mut c = Fence::default();
        c.raise_to(10);
        c.join(&a);
        assert_eq!(a.next(), 11, "joining keeps the larger value");
        a.raise_to(5);
        assert_eq!(c.next(), 12, "raise_to never lowers");
    }

    #[test]
    fn tokens_strictly_increase_across_all_tables_sharing_one_counter() {
        use crate::core::dlock::{DlockConfig, DlockEvent, DlockTable, LockRequest, LockResult};
        use crate::core::lockd::{LockdConfig, LockdTable};
        use crate::core::store::{LockOutcome, Store, StoreConfig, StoreMode, Write};
        use crate::core::{Now, Session};
        let fence = Fence::default();
        let now = Now::from_unix_ms(1_700_000_000_000);
        let c = |n: u32| Session(u64::from(n));
        let config = StoreConfig {
            memory_limit: 1 << 20,
            max_item_size: 1024,
        };
        let mut store = Store::new(config, now).with_fence(&fence);
        let lockd_config = LockdConfig {
            orphan_timeout_ms: 10,
        };
        let mut lockd = LockdTable::new(lockd_config, now.ms).with_fence(&fence);
        let dlock_config = DlockConfig { idle_timeout_ms: 0 };
        let mut dlock = DlockTable::new(dlock_config, now.ms).with_fence(&fence);
        let mut seen = Vec::new();
        store.store(
            c(1),
            StoreMode::Set,
            Write {
                key: b"k",
                flags: 0,
                exptime: 0,
                value: b"v",
            },
            None,
            now,
        );
        assert_eq!(store.lock(c(1), b"k", now), LockOutcome::Ok);
        seen.push(store.lock_token(c(1), b"k", now).expect("holder's token"));
        assert_eq!(store.lock_token(c(2), b"k", now), None, "not the holder");
        lockd.acquire(c(2), b"n", b"n\0", now.ms);
        seen.push(lockd.token_of(c(2), b"n").expect("lockd holder's token"));
        lockd.acquire(c(3), b"n", b"n\0", now.ms);
        let mut ev = Vec::new();
        let r = dlock.lock(
            c(4),
            LockRequest {
                token: 0,
                keys: &[b"a", b"b"],
                wait_us: None,
                lease_us: None,
            },
            now.ms,
            &mut ev,
        );
        assert_eq!(r, LockResult::Granted);
        seen.push(dlock.last_fence());
        assert_eq!(dlock.token_of(c(4), b"a"), dlock.token_of(c(4), b"b"));
        assert_eq!(
            dlock.lock(
                c(5),
                LockRequest {
                    token: 7,
                    keys: &[b"a"],
                    wait_us: None,
                    lease_us: None
                },
                now.ms,
                &mut ev
            ),
            LockResult::Waiting
        );
        // A queued lockd ACQ granted on release, an orphan adopted, a dlock waiter granted.
        let mut grants = Vec::new();
        lockd.release(c(2), b"n", now.ms, &mut grants);
        seen.push(grants[0].fence);
        assert_eq!(lockd.token_of(c(3), b"n"), Some(grants[0].fence));
        lockd.disconnect(c(3), now.ms);
        assert!(lockd.adopt(c(6), b"n", now.ms));
        seen.push(lockd.token_of(c(6), b"n").expect("adopter's token"));
        dlock.disconnect(c(4), now.ms, &mut ev);
        match ev.as_slice() {
            [DlockEvent::Granted {
                session,
                token: 7,
                fence: f,
            }] if *session == c(5) => seen.push(*f),
            other => panic!("{other:?}"),
        }
        // A re-lock by the same session is a new grant.
        dlock.lock(
            c(5),
            LockRequest {
                token: 8,
                keys: &[b"a"],
                wait_us: None,
                lease_us: None,
            },
            now.ms,
            &mut ev,
        );
        seen.push(dlock.token_of(c(5), b"a").expect("re-locked"));
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
        assert_eq!(fence.last(), *seen.last().expect("tokens"));
    }
}
