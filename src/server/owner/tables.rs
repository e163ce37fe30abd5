//! The state machine's state: every table, the sessions, the counters, and its snapshot.
//!
//! Owns: what the owner holds between turns (`Tables`) and its canonical snapshot. Must not:
//! apply commands (`apply.rs`, each protocol's `exec`), or know about threads.

use super::admin_state::AdminState;
use super::sessions::Sessions;
use crate::core::codec::{self, DecodeError, Reader, Snapshot};
use crate::core::counter::CounterTable;
use crate::core::dlock::{DlockConfig, DlockEvent, DlockTable};
use crate::core::fence::Fence;
use crate::core::lockd::{Grant, LockdConfig, LockdTable};
use crate::core::store::{Store, StoreConfig};
use crate::core::Now;
use crate::protocol::dlock::sessions::DlockSessions;
use crate::protocol::memcache::state::McState;

/// yrmcds's default `counter.stats_interval` (one day) in ms: Dump's "maximum consumption" is the
/// peak since the start of the current interval, and idle counters at zero are forgotten after
/// one.
pub const COUNTER_STATS_INTERVAL_MS: u64 = 86_400_000;

/// Everything the owner holds.
pub struct Tables {
    pub store: Store,
    pub lockd: LockdTable,
    pub dlock: DlockTable,
    pub dlock_sessions: DlockSessions,
    /// The native protocol's watches of this node's connections (not in a snapshot).
    pub watches: crate::protocol::dlock::watches::Watches,
    /// The node whose connections' watches these tables keep: a cluster node's id, 0 on a
    /// single node (whose connections are all on node 0). Every node applies a Watch; only
    /// the watcher's own node subscribes it.
    pub node: u16,
    pub counters: Counters,
    /// The one fencing counter every table's grants draw from.
    pub fence: Fence,
    /// Key dumps under way and `stats ops` counters of the memcached port.
    pub mc: McState,
    /// yrmcds counters (the fourth namespace) and their per-opcode counts.
    pub counter: CounterTable,
    /// Scratch for lockd grants and dlock events.
    pub grants: Vec<Grant>,
    pub dlock_events: Vec<DlockEvent>,
    /// Peers of open connections and latency histograms, for the admin port.
    pub admin: AdminState,
    /// Which session each connection is (the tables know sessions only).
    pub sessions: Sessions,
}

impl Tables {
    pub fn new(c: &crate::config::Config, now: Now) -> Tables {
        let store = StoreConfig {
            memory_limit: c.memory_limit,
            max_item_size: c.max_item_size,
        };
        let lockd = LockdConfig {
            orphan_timeout_ms: c.orphan_timeout_ms,
        };
        let dlock = DlockConfig {
            idle_timeout_ms: c.dlock_idle_timeout_ms,
        };
        let fence = Fence::default();
        let counter = CounterTable::new(COUNTER_STATS_INTERVAL_MS).with_fence(&fence);
        Tables {
            store: Store::new(store, now).with_fence(&fence),
            lockd: LockdTable::new(lockd, now.ms).with_fence(&fence),
            dlock: DlockTable::new(dlock, now.ms).with_fence(&fence),
            dlock_sessions: DlockSessions::default(),
            watches: Default::default(),
            node: 0,
            counters: Counters::default(),
            fence,
            mc: McState::default(),
            counter,
            grants: Vec::new(),
            dlock_events: Vec::new(),
            admin: Default::default(),
            sessions: Default::default(),
        }
    }
}

impl Tables {
    const SNAPSHOT_MAGIC: &'static [u8] = b"HFstate2";

    /// The whole state as bytes, in a canonical form: equal states give equal bytes, whatever
    /// their history or hash seeds (tests/determinism.rs compares replicas this way).
    pub fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(Self::SNAPSHOT_MAGIC);
        self.store.snapshot(out);
        self.lockd.snapshot(out);
        self.dlock.snapshot(out);
        self.dlock_sessions.snapshot(out);
        self.counter.snapshot(out);
        let c = &self.counters;
        for v in [c.cmd_get, c.cmd_set, c.cmd_flush, c.cmd_touch] {
            codec::put_u64(out, v);
        }
        self.mc.snapshot(out);
        self.sessions.snapshot(out);
    }

    /// When the next timer of any table is due (Unix ms), if one is set.
    pub fn next_deadline(&self) -> Option<u64> {
        [
            self.store.next_deadline(),
            self.lockd.next_deadline(),
            self.dlock.next_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// When a single node's owner should next advance the tables: the next deadline, or
    /// sooner while a timing wheel has a cascade to prepare (`Wheel::next_staging`). A cluster
    /// advances them only by proposals, at deadlines.
    pub fn next_wake(&self) -> Option<u64> {
        [
            self.next_deadline(),
            self.store.next_staging(),
            self.lockd.next_staging(),
            self.dlock.next_staging(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The state from bytes written by [`Tables::snapshot`], with this daemon's configuration.
    /// Untrusted input: truncated or corrupt bytes are an error, never a panic.
    pub fn restore(c: &crate::config::Config, bytes: &[u8]) -> Result<Tables, DecodeError> {
        let mut t = Tables::new(c, Now::default());
        let r = &mut Reader::new(bytes);
        r.expect(Self::SNAPSHOT_MAGIC, "state snapshot magic")?;
        // Each table restores its holders' tokens and the counter's value; they share one
        // counter again, at the largest value any of them saw.
        let fence = t.fence.clone();
        t.store = Store::restore(t.store.config(), r)?.with_fence(&fence);
        let lockd = LockdConfig {
            orphan_timeout_ms: c.orphan_timeout_ms,
        };
        t.lockd = LockdTable::restore(lockd, r)?.with_fence(&fence);
        let dlock = DlockConfig {
            idle_timeout_ms: c.dlock_idle_timeout_ms,
        };
        t.dlock = DlockTable::restore(dlock, r)?.with_fence(&fence);
        let limits = super::command::Limits {
            max_field: c.dlock_max_message,
            ..Default::default()
        };
        t.dlock_sessions = DlockSessions::restore(r, limits)?;
        t.counter = CounterTable::restore(COUNTER_STATS_INTERVAL_MS, r)?.with_fence(&fence);
        t.counters = Counters {
            cmd_get: r.u64()?,
            cmd_set: r.u64()?,
            cmd_flush: r.u64()?,
            cmd_touch: r.u64()?,
        };
        t.mc = McState::restore(r)?;
        t.sessions = Sessions::restore(r)?;
        r.finish()?;
        Ok(t)
    }
}

/// memcached command counters kept by the owner (the store keeps hit/miss counters).
#[derive(Default, Debug)]
pub struct Counters {
    pub cmd_get: u64,
    pub cmd_set: u64,
    pub cmd_flush: u64,
    pub cmd_touch: u64,
}
