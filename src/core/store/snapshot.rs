//! Snapshot and restore of the whole store.
//!
//! Owns: the store's canonical byte form and its decoder. Must not: trust the bytes (anything
//! truncated, corrupt or inconsistent is a [`DecodeError`], never a panic or an unbounded
//! allocation), or write anything that depends on slot numbers or hash order.

use super::expiry::Timer;
use super::locks::ConnLocks;
use super::slab::{make_data, DEAD, FETCHED, LRU, NIL};
use super::{Store, StoreConfig, StoreStats, MAX_KEY_LEN};
use crate::core::codec::{self, DecodeError, Reader, Snapshot};
use crate::core::{Now, Session};

/// Snapshot and restore: the whole store as bytes in a canonical form (items in LRU order, locks
/// by holder in acquisition order; no slot numbers, no hash order), so that two stores that
/// behave alike give the same bytes, and a restored store behaves exactly like the original.
impl Store {
    const SNAPSHOT_MAGIC: &'static [u8] = b"HFstore1";
}

impl Snapshot for Store {
    type Config = StoreConfig;

    /// Append the store's state to `out`.
    fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(Self::SNAPSHOT_MAGIC);
        codec::put_u64(out, self.wheel.now());
        codec::put_u64(out, self.last_cas);
        codec::put_u64(out, self.fence.last());
        for v in self.stats_fields() {
            codec::put_u64(out, v);
        }
        codec::put_opt_u64(out, self.pending_flush.map(|(at, _)| at));
        codec::put_opt_u64(out, self.reclaim_at);
        for list in [LRU, DEAD] {
            let mut n = 0u64;
            let mut i = self.lists[list].tail;
            while i != NIL {
                n += 1;
                i = self.slots[i as usize].prev;
            }
            codec::put_u64(out, n);
            // Least recently used first: restoring pushes each at the MRU end.
            let mut i = self.lists[list].tail;
            while i != NIL {
                self.put_item(out, i);
                codec::spill(out);
                i = self.slots[i as usize].prev;
            }
        }
        let mut holders: Vec<(&Session, &ConnLocks)> = self.sessions.iter().collect();
        holders.sort_unstable_by_key(|(c, _)| **c);
        codec::put_u64(out, holders.len() as u64);
        for (session, list) in holders {
            session.encode(out);
            codec::put_u64(out, u64::from(list.count));
            let mut i = list.head;
            while let Some(e) = self.locks.get(&i) {
                codec::put_u64(out, e.token());
                codec::put_u64(out, u64::from(e.since_s));
                self.put_item(out, i);
                codec::spill(out);
                i = e.next;
            }
        }
    }

    /// A store from bytes written by [`Store::snapshot`]. The bytes are untrusted: anything
    /// truncated, corrupt or inconsistent (a key twice, a key over 250 bytes, a value over
    /// `max_item_size`) is an error. Memory limits are not enforced on restore: a snapshot holds
    /// what a replica with the same limits held.
    fn restore(config: StoreConfig, r: &mut Reader<'_>) -> Result<Store, DecodeError> {
        Store::restore_from(config, r)
    }
}

impl Store {
    fn put_item(&self, out: &mut Vec<u8>, i: u32) {
        let item = &self.slots[i as usize];
        codec::put_bytes(out, item.key());
        codec::put_bytes(out, item.value());
        codec::put_u64(out, u64::from(item.flags));
        codec::put_u64(out, item.cas);
        codec::put_u64(out, item.deadline);
        codec::put_bool(out, item.state & FETCHED != 0);
    }

    fn stats_fields(&self) -> [u64; 20] {
        let s = &self.stats;
        [
            s.total_items,
            s.evictions,
            s.expired_unfetched,
            s.reclaimed,
            s.get_hits,
            s.get_misses,
            s.get_expired,
            s.touch_hits,
            s.touch_misses,
            s.delete_hits,
            s.delete_misses,
            s.incr_hits,
            s.incr_misses,
            s.decr_hits,
            s.decr_misses,
            s.cas_hits,
            s.cas_misses,
            s.cas_badval,
            s.lock_grants,
            s.lock_conflicts,
        ]
    }

    fn restore_from(config: StoreConfig, r: &mut Reader<'_>) -> Result<Store, DecodeError> {
        r.expect(Self::SNAPSHOT_MAGIC, "store snapshot magic")?;
        let now_ms = r.u64()?;
        let mut s = Store::new(config, Now::from_unix_ms(now_ms));
        let now = Now::from_unix_ms(now_ms);
        s.last_cas = r.u64()?;
        s.fence.raise_to(r.u64()?);
        let mut f = [0u64; 20];
        for v in f.iter_mut() {
            *v = r.u64()?;
        }
        let [total_items, evictions, expired_unfetched, reclaimed, get_hits, get_misses, get_expired, touch_hits, touch_misses, delete_hits, delete_misses, incr_hits, incr_misses, decr_hits, decr_misses, cas_hits, cas_misses, cas_badval, lock_grants, lock_conflicts] =
            f;
        s.stats = StoreStats {
            total_items,
            evictions,
            expired_unfetched,
            reclaimed,
            get_hits,
            get_misses,
            get_expired,
            touch_hits,
            touch_misses,
            delete_hits,
            delete_misses,
            incr_hits,
            incr_misses,
            decr_hits,
            decr_misses,
            cas_hits,
            cas_misses,
            cas_badval,
            lock_grants,
            lock_conflicts,
            ..StoreStats::default()
        };
        if let Some(at) = r.opt_u64()? {
            let timer = s.arm(at, Timer::Flush, now);
            s.pending_flush = Some((at, timer));
        }
        let reclaim_at = r.opt_u64()?;
        // Live items, then flushed ones: the flushed ones belong to the epoch before.
        s.epoch = 1;
        for list in [LRU, DEAD] {
            let n = r.count(6)?;
            for _ in 0..n {
                codec::consumed(r);
                let i = s.restore_item(r, now)?;
                if list == DEAD {
                    s.unlink(LRU, i);
                    let charge = s.slots[i as usize].charge();
                    s.slots[i as usize].epoch = 0;
                    s.live_count -= 1;
                    s.live_bytes -= charge;
                    s.dead_bytes += charge;
                    s.link_head(DEAD, i);
                }
            }
        }
        let holders = r.count(2)?;
        let mut last: Option<Session> = None;
        for _ in 0..holders {
            let session = Session::decode_next(r, &mut last, "store lock holders out of order")?;
            let n = r.count(6)?;
            if n == 0 {
                return Err(DecodeError::Invalid("store lock holder with no locks"));
            }
            for _ in 0..n {
                codec::consumed(r);
                let token = r.u64()?;
                if token > s.fence.last() {
                    return Err(DecodeError::Invalid("store lock token not yet issued"));
                }
                let since_s = r.u32()?;
                let i = s.restore_item(r, now)?;
                s.acquire_with(i, session, token, since_s);
            }
        }
        // Restoring replays no grants.
        s.stats.lock_grants = lock_grants;
        if let Some(at) = reclaim_at {
            if s.lists[DEAD].tail == NIL {
                return Err(DecodeError::Invalid("reclaim pending with nothing flushed"));
            }
            s.wheel.insert(at, Timer::Reclaim);
            s.reclaim_at = Some(at);
        }
        Ok(s)
    }

    /// Read one item and put it at the MRU end of the LRU, its expiry timer armed.
    fn restore_item(&mut self, r: &mut Reader<'_>, now: Now) -> Result<u32, DecodeError> {
        let key = r.bytes(MAX_KEY_LEN)?;
        let value = r.bytes(self.config.max_item_size)?;
        let flags = r.u32()?;
        let cas = r.u64()?;
        let deadline = r.u64()?;
        let fetched = r.bool()?;
        if self.find(key).is_some() {
            return Err(DecodeError::Invalid("store snapshot names a key twice"));
        }
        if self.free_head == NIL && self.slots.len() >= NIL as usize {
            return Err(DecodeError::Invalid("store snapshot over 2^32 items"));
        }
        let data = make_data(key, &[value]);
        let i = self.insert_new(key.len(), data, flags, deadline, cas, now);
        if fetched {
            self.slots[i as usize].state |= FETCHED;
        }
        Ok(i)
    }
}
