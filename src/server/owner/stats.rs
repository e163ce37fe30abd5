//! memcached `stats` (and its `settings`, `items`, `slabs`, `conns` groups, and yrmcds's `ops`
//! and `sizes`), with the lock counters of all three tables. Text and binary share this list;
//! each encodes the pairs.

use super::tables::Tables;
use crate::core::Now;
use crate::server::effect::push_u64;
use crate::server::{Live, Shared};

/// Emit every `name value` pair of the group `arg`; false for an unknown group. `live` is the
/// process's connection counters, read outside apply (`Live`); from `shared` this reads only
/// what never changes while the process runs (the configuration, the pid, the start time).
pub fn write(
    t: &Tables,
    shared: &Shared,
    live: Live,
    now: Now,
    arg: Option<&[u8]>,
    emit: &mut dyn FnMut(&str, &[u8]),
) -> bool {
    let mut num = |name: &str, v: u64| {
        let mut b = Vec::with_capacity(20);
        push_u64(&mut b, v);
        emit(name, &b);
    };
    let c = &shared.config;
    let s = t.store.stats();
    match arg {
        None => {
            num("pid", u64::from(shared.pid));
            num(
                "uptime",
                now.ms.saturating_sub(shared.started_unix_ms) / 1000,
            );
            num("time", now.unix);
            num("pointer_size", usize::BITS as u64);
            num("curr_connections", live.curr_connections);
            num("total_connections", live.total_connections);
            num("rejected_connections", live.rejected_connections);
            num("cmd_get", t.counters.cmd_get);
            num("cmd_set", t.counters.cmd_set);
            num("cmd_flush", t.counters.cmd_flush);
            num("cmd_touch", t.counters.cmd_touch);
            num("get_hits", s.get_hits);
            num("get_misses", s.get_misses);
            num("get_expired", s.get_expired);
            num("delete_misses", s.delete_misses);
            num("delete_hits", s.delete_hits);
            num("incr_misses", s.incr_misses);
            num("incr_hits", s.incr_hits);
            num("decr_misses", s.decr_misses);
            num("decr_hits", s.decr_hits);
            num("cas_misses", s.cas_misses);
            num("cas_hits", s.cas_hits);
            num("cas_badval", s.cas_badval);
            num("touch_hits", s.touch_hits);
            num("touch_misses", s.touch_misses);
            num("threads", c.threads as u64);
            num("limit_maxbytes", c.memory_limit as u64);
            num("bytes", s.bytes);
            num("curr_items", s.curr_items);
            num("total_items", s.total_items);
            num("expired_unfetched", s.expired_unfetched);
            num("evictions", s.evictions);
            num("reclaimed", s.reclaimed);
            // memcached locks (yrmcds)
            num("locks_held", s.locks_held);
            num("lock_grants", s.lock_grants);
            num("lock_conflicts", s.lock_conflicts);
            // old lock-daemon table
            let l = t.lockd.stats();
            num("lockd_held", l.held);
            num("lockd_orphaned", l.orphaned);
            num("lockd_waiting", l.waiting);
            num("lockd_grants", l.grants);
            num("lockd_orphan_expiries", l.orphan_expiries);
            num("lockd_adoptions", l.adoptions);
            // dlock table
            let d = t.dlock.stats();
            num("dlock_held_keys", d.held_keys);
            num("dlock_leases", d.leases);
            num("dlock_waiting", d.waiting);
            num("dlock_grants", d.grants);
            num("dlock_timeouts", d.timeouts);
            num("dlock_lease_expiries", d.lease_expiries);
            num("dlock_idle_disconnects", d.idle_disconnects);
            // the native protocol (dlock version 3): its grants, and this node's watches
            let n = t.dlock.native_stats();
            num("dlock_native_holds", n.holds);
            num("dlock_native_leases", n.leases);
            num("dlock_delayed_keys", n.delayed_keys);
            let w = &t.watches;
            num("dlock_watches", w.len() as u64);
            num("dlock_watched_keys", w.keys() as u64);
            let [acquired, released, expired, lost] = w.sent.events;
            num("dlock_events_acquired", acquired);
            num("dlock_events_released", released);
            num("dlock_events_expired", expired);
            num("dlock_events_lost", lost);
            num("dlock_loss_notices", w.sent.notices);
            // yrmcds counters
            let k = t.counter.stats;
            num("counter_objects", t.counter.len() as u64);
            num("counter_total_objects", k.total_objects);
            num("counter_acquired", k.acquired);
            num("counter_not_available", k.not_available);
            num("counter_released", k.released);
            num("counter_released_on_close", k.released_on_close);
            let v = crate::server::VERSION_REPLY;
            emit("version", &v[b"VERSION ".len()..v.len() - 2]);
        }
        Some(b"settings") => {
            num("maxbytes", c.memory_limit as u64);
            num("maxconns", c.max_connections as u64);
            num("num_threads", c.threads as u64);
            num("item_size_max", c.max_item_size as u64);
            num("lockd_orphan_timeout_ms", c.orphan_timeout_ms);
            num("dlock_idle_timeout_ms", c.dlock_idle_timeout_ms);
            num("dlock_max_keys", c.dlock_max_keys as u64);
            num("dlock_max_message", c.dlock_max_message as u64);
            emit("evictions", b"on");
            emit("cas_enabled", b"yes");
        }
        // One class holds every item: the store does not use slabs.
        Some(b"items") => {
            num("items:1:number", s.curr_items);
            num("items:1:evicted", s.evictions);
            num("items:1:reclaimed", s.reclaimed);
            num("items:1:expired_unfetched", s.expired_unfetched);
        }
        Some(b"slabs") => {
            num("active_slabs", u64::from(s.curr_items > 0));
            num("total_malloced", s.bytes);
        }
        // yrmcds's groups (cybozu/yrmcds src/memcache/memcache.cpp, `stats_ops`, `stats_sizes`).
        Some(b"ops") => {
            use crate::protocol::memcache::state::{BINARY_OPS, TEXT_OPS};
            let mut name = String::with_capacity(24);
            for (i, op) in TEXT_OPS.iter().enumerate() {
                name.clear();
                name.push_str("text:");
                name.push_str(op);
                num(&name, t.mc.text_ops[i]);
            }
            for (op, code) in BINARY_OPS {
                name.clear();
                name.push_str("binary:");
                name.push_str(op);
                num(&name, t.mc.binary_ops[usize::from(code)]);
            }
        }
        Some(b"sizes") => {
            let counts = t.store.size_counts();
            let mut name = String::with_capacity(8);
            for (bound, n) in crate::core::store::SIZE_CLASSES.iter().zip(counts) {
                name.clear();
                name.push_str(&bound.to_string());
                num(&name, n);
            }
            num("huge", counts[crate::core::store::SIZE_CLASSES.len()]);
        }
        Some(b"conns") => num("curr_connections", live.curr_connections),
        Some(_) => return false,
    }
    true
}
