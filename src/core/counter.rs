//! The counter table of yrmcds's counter extension: counted semaphores by name.
//!
//! Owns: each counter's current consumption and its maximum consumption in the current stats
//! interval, what each connection holds of each counter (released all at once when it closes),
//! and the table's statistics.
//!
//! Must not: read a clock (the caller passes Unix seconds in), do I/O, or know the wire format.
//! Capacity is not stored: each Acquire says the maximum it accepts (docs/counter.md).

use std::collections::HashMap;

use super::ConnId;

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

#[derive(Clone, Copy, Debug)]
struct Counter {
    consumption: u32,
    max_consumption: u32,
    /// Unix seconds of the last change; before the current interval's start, `max_consumption`
    /// is stale and the current consumption stands for it.
    last_updated: u64,
}

/// Operation counts and object counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterStats {
    pub total_objects: u64,
    pub acquired: u64,
    pub not_available: u64,
    pub released: u64,
    pub released_on_close: u64,
}

pub struct CounterTable {
    counters: HashMap<Box<[u8]>, Counter>,
    held: HashMap<ConnId, HashMap<Box<[u8]>, u32>>,
    /// Length of a stats interval in seconds (yrmcds `counter.stats_interval`), at least 1.
    interval: u64,
    /// The interval start at which [`CounterTable::collect_due`] last collected.
    collected_at: u64,
    pub stats: CounterStats,
}

impl CounterTable {
    pub fn new(interval_secs: u64) -> CounterTable {
        CounterTable {
            counters: HashMap::new(),
            held: HashMap::new(),
            interval: interval_secs.max(1),
            collected_at: 0,
            stats: CounterStats::default(),
        }
    }

    fn boundary(&self, now: u64) -> u64 {
        now / self.interval * self.interval
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
        now: u64,
    ) -> Result<(), CounterError> {
        let boundary = self.boundary(now);
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
                c.last_updated = now;
            }
            None => {
                self.counters.insert(
                    name.into(),
                    Counter {
                        consumption: resources,
                        max_consumption: resources,
                        last_updated: now,
                    },
                );
                self.stats.total_objects += 1;
            }
        }
        let mine = self.held.entry(conn).or_default();
        match mine.get_mut(name) {
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
        now: u64,
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
        self.take_back(name, resources, now);
        self.stats.released += 1;
        Ok(())
    }

    fn take_back(&mut self, name: &[u8], resources: u32, now: u64) {
        let boundary = self.boundary(now);
        if let Some(c) = self.counters.get_mut(name) {
            if c.last_updated < boundary {
                c.max_consumption = c.consumption;
            }
            // Held amounts never exceed the consumption they were added to.
            c.consumption = c.consumption.saturating_sub(resources);
            c.last_updated = now;
        }
    }

    /// Release everything `conn` holds. Returns how many counters it held.
    pub fn disconnect(&mut self, conn: ConnId, now: u64) -> usize {
        let Some(mine) = self.held.remove(&conn) else {
            return 0;
        };
        let n = mine.len();
        for (name, resources) in &mine {
            self.take_back(name, *resources, now);
        }
        self.stats.released_on_close += n as u64;
        n
    }

    /// Forget counters at zero that have not changed in this interval (yrmcds's GC), so names
    /// acquired once do not stay forever. Returns how many went.
    pub fn collect(&mut self, now: u64) -> usize {
        let boundary = self.boundary(now);
        let before = self.counters.len();
        self.counters
            .retain(|_, c| c.consumption != 0 || c.last_updated >= boundary);
        before - self.counters.len()
    }

    /// Collect once per interval: the first call in a new interval walks the table, the others
    /// cost one division.
    pub fn collect_due(&mut self, now: u64) {
        let boundary = self.boundary(now);
        if boundary > self.collected_at {
            self.collected_at = boundary;
            self.collect(now);
        }
    }

    /// Every counter: name, current consumption, maximum consumption in this interval.
    pub fn for_each(&self, now: u64, mut f: impl FnMut(&[u8], u32, u32)) {
        let boundary = self.boundary(now);
        for (name, c) in &self.counters {
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
    pub fn held_by(&self, conn: ConnId, name: &[u8]) -> u32 {
        self.held
            .get(&conn)
            .and_then(|m| m.get(name))
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

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
        t.for_each(30, |n, cur, max| seen.push((n.to_vec(), cur, max)));
        assert_eq!(seen, vec![(b"x".to_vec(), 1, 3)]);
        // Next interval: the peak restarts from the current consumption.
        seen.clear();
        t.for_each(150, |n, cur, max| seen.push((n.to_vec(), cur, max)));
        assert_eq!(seen, vec![(b"x".to_vec(), 1, 1)]);
        // Idle zero counters are collected after their interval, busy ones are not.
        t.release(c(1), b"x", 1, 150).unwrap();
        assert_eq!(t.collect(199), 0);
        assert_eq!(t.collect(200), 1);
        assert_eq!(t.get(b"x"), Err(CounterError::NotFound));
    }

    /// Seeded random operations checked against a naive model after every step.
    #[test]
    fn random_operations_match_a_naive_model() {
        for seed in 0..40 {
            let mut rng = Rng::new(seed);
            let mut t = CounterTable::new(1_000_000);
            // model: per (conn, name) held; consumption is the sum.
            let mut model: HashMap<(u32, u8), u32> = HashMap::new();
            let mut exists: std::collections::HashSet<u8> = Default::default();
            for _ in 0..600 {
                let conn = rng.below(4) as u32;
                let name = rng.below(5) as u8;
                let total = |m: &HashMap<(u32, u8), u32>, n: u8| -> u32 {
                    m.iter().filter(|(k, _)| k.1 == n).map(|(_, v)| *v).sum()
                };
                match rng.below(4) {
                    0 | 1 => {
                        let r = 1 + rng.below(3) as u32;
                        let max = r + rng.below(5) as u32;
                        let got = t.acquire(c(conn), &[name], r, max, 0);
                        let cur = total(&model, name);
                        let want = if exists.contains(&name) && cur + r > max {
                            Err(CounterError::NotAvailable)
                        } else {
                            Ok(())
                        };
                        assert_eq!(got, want);
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
                        assert_eq!(t.release(c(conn), &[name], r, 0), want);
                        if want.is_ok() {
                            let h = model.get_mut(&(conn, name)).unwrap();
                            *h -= r;
                            if *h == 0 {
                                model.remove(&(conn, name));
                            }
                        }
                    }
                    _ => {
                        t.disconnect(c(conn), 0);
                        model.retain(|k, _| k.0 != conn);
                    }
                }
                for n in 0..5u8 {
                    let want = if exists.contains(&n) {
                        Ok(total(&model, n))
                    } else {
                        Err(CounterError::NotFound)
                    };
                    assert_eq!(t.get(&[n]), want, "seed {seed}");
                    for k in 0..4 {
                        assert_eq!(
                            t.held_by(c(k), &[n]),
                            model.get(&(k, n)).copied().unwrap_or(0)
                        );
                    }
                }
            }
        }
    }
}
