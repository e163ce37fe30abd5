//! The counter table of yrmcds's counter extension: counted semaphores by name.
//!
//! Owns: each counter's current consumption and its maximum consumption in the current stats
//! interval, what each connection holds of each counter (released all at once when it closes),
//! and the table's statistics (object and per-command counts).
//!
//! Must not: read a clock (the caller passes Unix-epoch milliseconds in), do I/O, know the wire
//! format, or let a hash-map order reach a reply or a snapshot (Dump and snapshots go in name
//! order, holders in `ConnId` order). Capacity is not stored: each Acquire says the maximum it
//! accepts (docs/counter.md).

use super::codec::{self, DecodeError, Reader, Snapshot};
use super::hash::HashMap;
use super::ConnId;

/// The longest counter name: the protocol's 16-bit name length.
pub const MAX_NAME: usize = u16::MAX as usize;

/// Why an operation failed; the wire status is chosen by the caller.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CounterError {
    /// No counter of that name.
    NotFound,
    /// Consumption plus the request would exceed the given maximum.
    NotAvailable,
    /// Release of more than this connection holds of that counter.
    NotAcquired,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Counter {
    consumption: u32,
    max_consumption: u32,
    /// Unix ms of the last change; before the current interval's start, `max_consumption` is
    /// stale and the current consumption stands for it.
    last_updated: u64,
}

/// Operation counts and object counts (part of the state: Stats reports them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterStats {
    pub total_objects: u64,
    pub acquired: u64,
    pub not_available: u64,
    pub released: u64,
    pub released_on_close: u64,
    pub cmd_get: u64,
    pub cmd_acquire: u64,
    pub cmd_release: u64,
    pub cmd_stats: u64,
    pub cmd_dump: u64,
}

impl CounterStats {
    fn fields(&mut self) -> [&mut u64; 10] {
        [
            &mut self.total_objects,
            &mut self.acquired,
            &mut self.not_available,
            &mut self.released,
            &mut self.released_on_close,
            &mut self.cmd_get,
            &mut self.cmd_acquire,
            &mut self.cmd_release,
            &mut self.cmd_stats,
            &mut self.cmd_dump,
        ]
    }
}

pub struct CounterTable {
    counters: HashMap<Box<[u8]>, Counter>,
    held: HashMap<ConnId, HashMap<Box<[u8]>, u32>>,
    /// Length of a stats interval in ms (yrmcds `counter.stats_interval`), at least 1.
    interval_ms: u64,
    /// The interval start at which [`CounterTable::collect_due`] last collected.
    collected_at: u64,
    pub stats: CounterStats,
}

impl CounterTable {
    const SNAPSHOT_MAGIC: &'static [u8] = b"HFcount1";

    pub fn new(interval_ms: u64) -> CounterTable {
        CounterTable {
            counters: HashMap::default(),
            held: HashMap::default(),
            interval_ms: interval_ms.max(1),
            collected_at: 0,
            stats: CounterStats::default(),
        }
    }

    pub fn interval_ms(&self) -> u64 {
        self.interval_ms
    }

    fn boundary(&self, now_ms: u64) -> u64 {
        now_ms / self.interval_ms * self.interval_ms
    }

    /// Current consumption of `name`.
    pub fn get(&self, name: &[u8]) -> Result<u32, CounterError> {
        self.counters
            .get(name)
            .map(|c| c.consumption)
            .ok_or(CounterError::NotFound)
    }

    /// Take `resources` of `name` for `conn` if consumption stays within `maximum`. A counter
    /// that does not exist is created holding `resources` (the caller has checked
    /// `0 < resources <= maximum`).
    pub fn acquire(
        &mut self,
        conn: ConnId,
        name: &[u8],
        resources: u32,
        maximum: u32,
        now_ms: u64,
    ) -> Result<(), CounterError> {
        let boundary = self.boundary(now_ms);
        match self.counters.get_mut(name) {
            Some(c) => {
                let after = u64::from(c.consumption) + u64::from(resources);
                if after > u64::from(maximum) {
                    self.stats.not_available += 1;
                    return Err(CounterError::NotAvailable);
                }
                let after = after as u32; // <= maximum, a u32
                c.max_consumption = if c.last_updated < boundary {
                    after
                } else {
                    c.max_consumption.max(after)
                };
                c.consumption = after;
                c.last_updated = now_ms;
            }
            None => {
                self.counters.insert(
                    name.into(),
                    Counter {
                        consumption: resources,
                        max_consumption: resources,
                        last_updated: now_ms,
                    },
                );
                self.stats.total_objects += 1;
            }
        }
        let mine = self.held.entry(conn).or_default();
        match mine.get_mut(name) {
            // Held amounts sum to the consumption, which stays within a u32.
            Some(n) => *n = n.saturating_add(resources),
            None => {
                mine.insert(name.into(), resources);
            }
        }
        self.stats.acquired += 1;
        Ok(())
    }

    /// Give back `resources` of `name` that `conn` holds.
    pub fn release(
        &mut self,
        conn: ConnId,
        name: &[u8],
        resources: u32,
        now_ms: u64,
    ) -> Result<(), CounterError> {
        if !self.counters.contains_key(name) {
            return Err(CounterError::NotFound);
        }
        let mine = self.held.get_mut(&conn).ok_or(CounterError::NotAcquired)?;
        let have = mine.get_mut(name).ok_or(CounterError::NotAcquired)?;
        if *have < resources {
            return Err(CounterError::NotAcquired);
        }
        *have -= resources;
        if *have == 0 {
            mine.remove(name);
            if mine.is_empty() {
                self.held.remove(&conn);
            }
        }
        self.take_back(name, resources, now_ms);
        self.stats.released += 1;
        Ok(())
    }

    fn take_back(&mut self, name: &[u8], resources: u32, now_ms: u64) {
        let boundary = self.boundary(now_ms);
        if let Some(c) = self.counters.get_mut(name) {
            if c.last_updated < boundary {
                c.max_consumption = c.consumption;
            }
            // Held amounts never exceed the consumption they were added to.
            c.consumption = c.consumption.saturating_sub(resources);
            c.last_updated = now_ms;
        }
    }

    /// Release everything `conn` holds. Returns how many counters it held. Each name is
    /// independent of the others, so the hash order of the walk changes nothing.
    pub fn disconnect(&mut self, conn: ConnId, now_ms: u64) -> usize {
        let Some(mine) = self.held.remove(&conn) else {
            return 0;
        };
        let n = mine.len();
        for (name, resources) in &mine {
            self.take_back(name, *resources, now_ms);
        }
        self.stats.released_on_close += n as u64;
        n
    }

    /// Forget counters at zero that have not changed in this interval (yrmcds's GC), so names
    /// acquired once do not stay forever. Returns how many went.
    pub fn collect(&mut self, now_ms: u64) -> usize {
        let boundary = self.boundary(now_ms);
        let before = self.counters.len();
        self.counters
            .retain(|_, c| c.consumption != 0 || c.last_updated >= boundary);
        before - self.counters.len()
    }

    /// Collect once per interval: the first call in a new interval walks the table, the others
    /// cost one division.
    pub fn collect_due(&mut self, now_ms: u64) {
        let boundary = self.boundary(now_ms);
        if boundary > self.collected_at {
            self.collected_at = boundary;
            self.collect(now_ms);
        }
    }

    /// Every counter in name order: name, current consumption, maximum consumption in this
    /// interval.
    pub fn dump(&self, now_ms: u64, mut f: impl FnMut(&[u8], u32, u32)) {
        let boundary = self.boundary(now_ms);
        let mut names: Vec<(&[u8], &Counter)> =
            self.counters.iter().map(|(n, c)| (&n[..], c)).collect();
        names.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (name, c) in names {
            let max = if c.last_updated < boundary {
                c.consumption
            } else {
                c.max_consumption
            };
            f(name, c.consumption, max);
        }
    }

    /// Counters in the table.
    pub fn len(&self) -> usize {
        self.counters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
    }

    /// What `conn` holds of `name`.
    /// Every (counter, holder, resources held) — for the admin port's listing; no order.
    pub fn for_each_holding(&self, mut f: impl FnMut(&[u8], ConnId, u32)) {
        for (conn, mine) in &self.held {
            for (name, &n) in mine {
                f(name, *conn, n);
            }
        }
    }

    pub fn held_by(&self, conn: ConnId, name: &[u8]) -> u32 {
        self.held
            .get(&conn)
            .and_then(|m| m.get(name))
            .copied()
            .unwrap_or(0)
    }

    /// The table's invariants: every consumption is the sum of what connections hold of it, no
    /// holder holds zero or a name that does not exist, no peak is below the consumption.
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        let mut sums: HashMap<&[u8], u64> = HashMap::default();
        for mine in self.held.values() {
            if mine.is_empty() {
                return Err("a holder with nothing held");
            }
            for (name, n) in mine {
                if *n == 0 {
                    return Err("zero held");
                }
                if !self.counters.contains_key(name) {
                    return Err("held counter does not exist");
                }
                *sums.entry(name).or_default() += u64::from(*n);
            }
        }
        for (name, c) in &self.counters {
            if name.is_empty() || name.len() > MAX_NAME {
                return Err("counter name length");
            }
            if c.max_consumption < c.consumption {
                return Err("peak below consumption");
            }
            if sums.get(&name[..]).copied().unwrap_or(0) != u64::from(c.consumption) {
                return Err("consumption is not the sum held");
            }
        }
        Ok(())
    }
}

impl Snapshot for CounterTable {
    /// The stats interval in ms.
    type Config = u64;

    fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(Self::SNAPSHOT_MAGIC);
        codec::put_u64(out, self.collected_at);
        let mut stats = self.stats;
        for v in stats.fields() {
            codec::put_u64(out, *v);
        }
        let mut names: Vec<(&[u8], &Counter)> =
            self.counters.iter().map(|(n, c)| (&n[..], c)).collect();
        names.sort_unstable_by(|a, b| a.0.cmp(b.0));
        codec::put_u64(out, names.len() as u64);
        for (name, c) in names {
            codec::put_bytes(out, name);
            codec::put_u64(out, u64::from(c.consumption));
            codec::put_u64(out, u64::from(c.max_consumption));
            codec::put_u64(out, c.last_updated);
        }
        let mut holders: Vec<_> = self.held.iter().collect();
        holders.sort_unstable_by_key(|(conn, _)| **conn);
        codec::put_u64(out, holders.len() as u64);
        for (conn, mine) in holders {
            conn.encode(out);
            let mut names: Vec<_> = mine.iter().map(|(n, v)| (&n[..], *v)).collect();
            names.sort_unstable();
            codec::put_u64(out, names.len() as u64);
            for (name, n) in names {
                codec::put_bytes(out, name);
                codec::put_u64(out, u64::from(n));
            }
        }
    }

    /// A table from bytes written by [`CounterTable::snapshot`]; untrusted (names out of order
    /// or twice, holders out of order, held amounts that do not add up to the consumption are
    /// errors).
    fn restore(interval_ms: u64, r: &mut Reader<'_>) -> Result<CounterTable, DecodeError> {
        r.expect(Self::SNAPSHOT_MAGIC, "counter snapshot magic")?;
        let mut t = CounterTable::new(interval_ms);
        t.collected_at = r.u64()?;
        for v in t.stats.fields() {
            *v = r.u64()?;
        }
        let n = r.count(5)?;
        let mut last: Option<&[u8]> = None;
        for _ in 0..n {
            let name = r.bytes(MAX_NAME)?;
            if last.is_some_and(|l| l >= name) {
                return Err(DecodeError::Invalid("counter names out of order"));
            }
            last = Some(name);
            let c = Counter {
                consumption: r.u32()?,
                max_consumption: r.u32()?,
                last_updated: r.u64()?,
            };
            t.counters.insert(name.into(), c);
        }
        let holders = r.count(4)?;
        let mut last: Option<ConnId> = None;
        for _ in 0..holders {
            let conn = ConnId::decode(r)?;
            if last.is_some_and(|l| l >= conn) {
                return Err(DecodeError::Invalid("counter holders out of order"));
            }
            last = Some(conn);
            let k = r.count(2)?;
            let mut mine: HashMap<Box<[u8]>, u32> = HashMap::default();
            let mut last_name: Option<&[u8]> = None;
            for _ in 0..k {
                let name = r.bytes(MAX_NAME)?;
                if last_name.is_some_and(|l| l >= name) {
                    return Err(DecodeError::Invalid("held names out of order"));
                }
                last_name = Some(name);
                mine.insert(name.into(), r.u32()?);
            }
            t.held.insert(conn, mine);
        }
        t.check_invariants().map_err(DecodeError::Invalid)?;
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::codec::testing::{damage_is_refused, round_trip};
    use crate::rng::Rng;
    use std::collections::{HashMap as StdHashMap, HashSet as StdHashSet};

    fn valid(t: &CounterTable) {
        t.check_invariants().expect("invariants");
    }

    fn c(n: u32) -> ConnId {
        ConnId::new(0, n, 1)
    }

    #[test]
    fn acquire_respects_the_maximum_each_request_gives() {
        let mut t = CounterTable::new(60);
        assert_eq!(t.acquire(c(1), b"x", 2, 3, 0), Ok(()));
        assert_eq!(
            t.acquire(c(2), b"x", 2, 3, 0),
            Err(CounterError::NotAvailable)
        );
        // A larger maximum in a later request is honoured: capacity is per request.
        assert_eq!(t.acquire(c(2), b"x", 2, 4, 0), Ok(()));
        assert_eq!(t.get(b"x"), Ok(4));
        // A smaller maximum than the current consumption refuses anything.
        assert_eq!(
            t.acquire(c(3), b"x", 1, 1, 0),
            Err(CounterError::NotAvailable)
        );
    }

    #[test]
    fn release_of_more_than_held_is_not_acquired() {
        let mut t = CounterTable::new(60);
        assert_eq!(t.release(c(1), b"x", 0, 0), Err(CounterError::NotFound));
        t.acquire(c(1), b"x", 2, 5, 0).unwrap();
        assert_eq!(t.release(c(2), b"x", 1, 0), Err(CounterError::NotAcquired));
        assert_eq!(t.release(c(1), b"x", 3, 0), Err(CounterError::NotAcquired));
        assert_eq!(t.release(c(1), b"x", 0, 0), Ok(()));
        assert_eq!(t.release(c(1), b"x", 2, 0), Ok(()));
        assert_eq!(t.get(b"x"), Ok(0));
        // Holding nothing any more: even zero is not acquired.
        assert_eq!(t.release(c(1), b"x", 0, 0), Err(CounterError::NotAcquired));
    }

    #[test]
    fn disconnect_releases_thousands_at_once() {
        let mut t = CounterTable::new(60);
        for i in 0..5000u32 {
            t.acquire(c(1), &i.to_be_bytes(), 1, 1, 0).unwrap();
        }
        t.acquire(c(2), b"keep", 1, 9, 0).unwrap();
        assert_eq!(t.disconnect(c(1), 0), 5000);
        for i in 0..5000u32 {
            assert_eq!(t.get(&i.to_be_bytes()), Ok(0));
        }
        assert_eq!(t.get(b"keep"), Ok(1));
        assert_eq!(t.disconnect(c(1), 0), 0);
    }

    #[test]
    fn dump_max_is_the_peak_of_the_interval() {
        let mut t = CounterTable::new(100);
        t.acquire(c(1), b"x", 3, 9, 10).unwrap();
        t.release(c(1), b"x", 2, 20).unwrap();
        let mut seen = Vec::new();
        t.dump(30, |n, cur, max| seen.push((n.to_vec(), cur, max)));
        assert_eq!(seen, vec![(b"x".to_vec(), 1, 3)]);
        // Next interval: the peak restarts from the current consumption.
        seen.clear();
        t.dump(150, |n, cur, max| seen.push((n.to_vec(), cur, max)));
        assert_eq!(seen, vec![(b"x".to_vec(), 1, 1)]);
        // Idle zero counters are collected after their interval, busy ones are not.
        t.release(c(1), b"x", 1, 150).unwrap();
        assert_eq!(t.collect(199), 0);
        assert_eq!(t.collect(200), 1);
        assert_eq!(t.get(b"x"), Err(CounterError::NotFound));
    }

    #[test]
    fn dump_lists_counters_in_name_order_whatever_the_seed() {
        for seed in 0..4 {
            let names = crate::core::hash::with_seed(seed, || {
                let mut t = CounterTable::new(1000);
                for n in [&b"m"[..], b"a", b"zz", b"b", b"\xff", b"ab"] {
                    t.acquire(c(1), n, 1, 1, 5).unwrap();
                }
                let mut names = Vec::new();
                t.dump(5, |n, _, _| names.push(n.to_vec()));
                names
            });
            let want: Vec<Vec<u8>> = [&b"a"[..], b"ab", b"b", b"m", b"zz", b"\xff"]
                .iter()
                .map(|n| n.to_vec())
                .collect();
            assert_eq!(names, want);
        }
    }

    fn busy_table() -> CounterTable {
        let mut t = CounterTable::new(1000);
        for i in 0..40u32 {
            let name = format!("n{}", i % 7);
            let _ = t.acquire(c(i % 5), name.as_bytes(), 1 + i % 3, 9, u64::from(i) * 97);
            if i % 4 == 0 {
                let _ = t.release(c(i % 5), name.as_bytes(), 1, u64::from(i) * 97 + 1);
            }
        }
        t.stats.cmd_dump = 3;
        t.collect_due(2500);
        t
    }

    #[test]
    fn snapshot_round_trips_under_another_seed() {
        let t = busy_table();
        valid(&t);
        let copy = round_trip(&t, t.interval_ms(), 99, valid);
        assert_eq!(copy.stats, t.stats);
        assert_eq!(copy.collected_at, t.collected_at);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        t.dump(2600, |n, cur, max| a.push((n.to_vec(), cur, max)));
        copy.dump(2600, |n, cur, max| b.push((n.to_vec(), cur, max)));
        assert_eq!(a, b);
        assert!(!a.is_empty());
        round_trip(&CounterTable::new(5), 5, 1, valid);
    }

    #[test]
    fn damaged_snapshots_are_refused() {
        let t = busy_table();
        damage_is_refused(&t, t.interval_ms(), 3000, valid);
    }

    #[test]
    fn inconsistent_snapshots_are_refused() {
        // A consumption that holders do not account for.
        let mut t = CounterTable::new(10);
        t.acquire(c(1), b"x", 2, 5, 0).unwrap();
        t.held.get_mut(&c(1)).unwrap().insert(b"x"[..].into(), 1);
        let mut bytes = Vec::new();
        t.snapshot(&mut bytes);
        assert!(CounterTable::restore(10, &mut Reader::new(&bytes)).is_err());
    }

    /// Seeded random operations checked against a naive model after every step.
    #[test]
    fn random_operations_match_a_naive_model() {
        for seed in 0..40 {
            run(seed, None);
        }
    }

    /// The same, with the table replaced every ~30 steps by a copy restored from its snapshot
    /// under another hash seed.
    #[test]
    fn random_operations_match_the_model_across_restores() {
        for seed in 0..40 {
            run(seed, Some(30));
        }
    }

    fn run(seed: u64, restore_every: Option<u64>) {
        let mut rng = Rng::new(seed);
        let mut t = CounterTable::new(1000);
        // model: per (conn, name) held; consumption is the sum.
        let mut model: StdHashMap<(u32, u8), u32> = StdHashMap::new();
        let mut exists: StdHashSet<u8> = StdHashSet::new();
        let mut now = 0u64;
        for step in 0..600u64 {
            now += rng.below(40);
            let conn = rng.below(4) as u32;
            let name = rng.below(5) as u8;
            let total = |m: &StdHashMap<(u32, u8), u32>, n: u8| -> u32 {
                m.iter().filter(|(k, _)| k.1 == n).map(|(_, v)| *v).sum()
            };
            match rng.below(4) {
                0 | 1 => {
                    let r = 1 + rng.below(3) as u32;
                    let max = r + rng.below(5) as u32;
                    let got = t.acquire(c(conn), &[name], r, max, now);
                    let cur = total(&model, name);
                    let want = if exists.contains(&name) && cur + r > max {
                        Err(CounterError::NotAvailable)
                    } else {
                        Ok(())
                    };
                    assert_eq!(got, want, "seed {seed} step {step}");
                    if got.is_ok() {
                        exists.insert(name);
                        *model.entry((conn, name)).or_default() += r;
                    }
                }
                2 => {
                    let r = rng.below(4) as u32;
                    let have = model.get(&(conn, name)).copied();
                    let want = if !exists.contains(&name) {
                        Err(CounterError::NotFound)
                    } else {
                        match have {
                            Some(h) if h >= r => Ok(()),
                            _ => Err(CounterError::NotAcquired),
                        }
                    };
                    assert_eq!(t.release(c(conn), &[name], r, now), want);
                    if want.is_ok() {
                        let h = model.entry((conn, name)).or_default();
                        *h -= r;
                        if *h == 0 {
                            model.remove(&(conn, name));
                        }
                    }
                }
                _ => {
                    t.disconnect(c(conn), now);
                    model.retain(|k, _| k.0 != conn);
                }
            }
            // yrmcds's GC: zero counters untouched for a whole interval go.
            if rng.below(50) == 0 {
                now += 1000;
                t.collect_due(now);
                exists.retain(|n| total(&model, *n) > 0);
            }
            for n in 0..5u8 {
                let want = if exists.contains(&n) {
                    Ok(total(&model, n))
                } else {
                    Err(CounterError::NotFound)
                };
                assert_eq!(t.get(&[n]), want, "seed {seed} step {step}");
                for k in 0..4 {
                    assert_eq!(
                        t.held_by(c(k), &[n]),
                        model.get(&(k, n)).copied().unwrap_or(0)
                    );
                }
            }
            valid(&t);
            if restore_every.is_some_and(|every| step % every == every - 1) {
                t = round_trip(&t, t.interval_ms(), seed ^ step, valid);
            }
        }
    }
}
