//! The counter table of yrmcds's counter extension: counted semaphores by name.
//!
//! Owns: each counter's current consumption and its maximum consumption in the current stats
//! interval, what each connection holds of each counter (released all at once when it closes),
//! and the table's statistics (object and per-command counts).
//!
//! Must not: read a clock (the caller passes Unix-epoch milliseconds in), do I/O, know the wire
//! format, or let a hash-map order reach a reply or a snapshot (Dump and snapshots go in name
//! order, holders in `Session` order). Capacity is not stored: each Acquire says the maximum it
//! accepts (docs/counter.md).

use super::codec::{self, DecodeError, Reader, Snapshot};
use super::fence::Fence;
use super::hash::HashMap;
use super::Session;

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

/// What one session holds of one counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Holding {
    resources: u32,
    /// The fencing token of the session's latest acquire of this counter (`docs/protocol.md`,
    /// "Fencing tokens"). The counter protocol has no field for it, so only the admin listing shows it.
    token: u64,
}

pub struct CounterTable {
    counters: HashMap<Box<[u8]>, Counter>,
    held: HashMap<Session, HashMap<Box<[u8]>, Holding>>,
    /// The state's one fencing counter: every successful acquire is a grant.
    fence: Fence,
    /// Length of a stats interval in ms (yrmcds `counter.stats_interval`), at least 1.
    interval_ms: u64,
    /// The interval start at which [`CounterTable::collect_due`] last collected.
    collected_at: u64,
    pub stats: CounterStats,
}

impl CounterTable {
    const SNAPSHOT_MAGIC: &'static [u8] = b"HFcount2";

    pub fn new(interval_ms: u64) -> CounterTable {
        CounterTable {
            counters: HashMap::default(),
            held: HashMap::default(),
            fence: Fence::default(),
            interval_ms: interval_ms.max(1),
            collected_at: 0,
            stats: CounterStats::default(),
        }
    }

    pub fn interval_ms(&self) -> u64 {
        self.interval_ms
    }

    /// Share the state's fencing counter (see [`crate::core::fence`]).
    pub fn with_fence(mut self, fence: &Fence) -> Self {
        self.fence.join(fence);
        self
    }

    /// The fencing token of the most recent grant in any table of the state.
    pub fn last_fence(&self) -> u64 {
        self.fence.last()
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

    /// Take `resources` of `name` for `session` if consumption stays within `maximum`. A counter
    /// that does not exist is created holding `resources` (the caller has checked
    /// `0 < resources <= maximum`).
    pub fn acquire(
        &mut self,
        session: Session,
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
        let token = self.fence.next();
        let mine = self.held.entry(session).or_default();
        match mine.get_mut(name) {
            // Held amounts sum to the consumption, which stays within a u32.
            Some(h) => {
                h.resources = h.resources.saturating_add(resources);
                h.token = token;
            }
            None => {
                mine.insert(name.into(), Holding { resources, token });
            }
        }
        self.stats.acquired += 1;
        Ok(())
    }

    /// Give back `resources` of `name` that `session` holds.
    pub fn release(
        &mut self,
        session: Session,
        name: &[u8],
        resources: u32,
        now_ms: u64,
    ) -> Result<(), CounterError> {
        if !self.counters.contains_key(name) {
            return Err(CounterError::NotFound);
        }
        let mine = self
            .held
            .get_mut(&session)
            .ok_or(CounterError::NotAcquired)?;
        let have = mine.get_mut(name).ok_or(CounterError::NotAcquired)?;
        if have.resources < resources {
            return Err(CounterError::NotAcquired);
        }
        have.resources -= resources;
        if have.resources == 0 {
            mine.remove(name);
            if mine.is_empty() {
                self.held.remove(&session);
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

    /// Release everything `session` holds. Returns how many counters it held. Each name is
    /// independent of the others, so the hash order of the walk changes nothing.
    pub fn disconnect(&mut self, session: Session, now_ms: u64) -> usize {
        let Some(mine) = self.held.remove(&session) else {
            return 0;
        };
        let n = mine.len();
        for (name, h) in &mine {
            self.take_back(name, h.resources, now_ms);
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

    /// Every (counter, holder, resources held, fencing token of its latest acquire), for the
    /// admin port's listing; no order.
    pub fn for_each_holding(&self, mut f: impl FnMut(&[u8], Session, u32, u64)) {
        for (session, mine) in &self.held {
            for (name, h) in mine {
                f(name, *session, h.resources, h.token);
            }
        }
    }

    /// What `session` holds of `name`.
    pub fn held_by(&self, session: Session, name: &[u8]) -> u32 {
        self.held
            .get(&session)
            .and_then(|m| m.get(name))
            .map_or(0, |h| h.resources)
    }

    /// The fencing token of `session`'s latest acquire of `name`, while it holds some.
    pub fn token_of(&self, session: Session, name: &[u8]) -> Option<u64> {
        self.held
            .get(&session)
            .and_then(|m| m.get(name))
            .map(|h| h.token)
    }

    /// The table's invariants: every consumption is the sum of what connections hold of it, no
    /// holder holds zero or a name that does not exist, no peak is below the consumption.
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        let mut sums: HashMap<&[u8], u64> = HashMap::default();
        for mine in self.held.values() {
            if mine.is_empty() {
                return Err("a holder with nothing held");
            }
            for (name, h) in mine {
                if h.resources == 0 {
                    return Err("zero held");
                }
                if !self.counters.contains_key(name) {
                    return Err("held counter does not exist");
                }
                if h.token == 0 || h.token > self.fence.last() {
                    return Err("holding token not handed out");
                }
                *sums.entry(name).or_default() += u64::from(h.resources);
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
        codec::put_u64(out, self.fence.last());
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
            codec::spill(out);
        }
        let mut holders: Vec<_> = self.held.iter().collect();
        holders.sort_unstable_by_key(|(session, _)| **session);
        codec::put_u64(out, holders.len() as u64);
        for (session, mine) in holders {
            session.encode(out);
            let mut names: Vec<_> = mine.iter().map(|(n, h)| (&n[..], *h)).collect();
            names.sort_unstable_by(|a, b| a.0.cmp(b.0));
            codec::put_u64(out, names.len() as u64);
            for (name, h) in names {
                codec::put_bytes(out, name);
                codec::put_u64(out, u64::from(h.resources));
                codec::put_u64(out, h.token);
            }
        }
    }

    /// A table from bytes written by [`CounterTable::snapshot`]; untrusted (names out of order
    /// or twice, holders out of order, held amounts that do not add up to the consumption, a
    /// holding's token above the fencing counter are errors). Rejoin the state's fence after.
    fn restore(interval_ms: u64, r: &mut Reader<'_>) -> Result<CounterTable, DecodeError> {
        r.expect(Self::SNAPSHOT_MAGIC, "counter snapshot magic")?;
        let mut t = CounterTable::new(interval_ms);
        t.collected_at = r.u64()?;
        t.fence.raise_to(r.u64()?);
        for v in t.stats.fields() {
            *v = r.u64()?;
        }
        let n = r.count(5)?;
        let mut last: Option<&[u8]> = None;
        for _ in 0..n {
            codec::consumed(r);
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
        let holders = r.count(2)?;
        let mut last: Option<Session> = None;
        for _ in 0..holders {
            let session = Session::decode_next(r, &mut last, "counter holders out of order")?;
            let k = r.count(3)?;
            let mut mine: HashMap<Box<[u8]>, Holding> = HashMap::default();
            let mut last_name: Option<&[u8]> = None;
            for _ in 0..k {
                let name = r.bytes(MAX_NAME)?;
                if last_name.is_some_and(|l| l >= name) {
                    return Err(DecodeError::Invalid("held names out of order"));
                }
                last_name = Some(name);
                let h = Holding {
                    resources: r.u32()?,
                    token: r.u64()?,
                };
                mine.insert(name.into(), h);
            }
            t.held.insert(session, mine);
        }
        t.check_invariants().map_err(DecodeError::Invalid)?;
        Ok(t)
    }
}

#[cfg(test)]
#[path = "counter_tests.rs"]
mod tests;
