//! Which entries of the live log keep their payload in memory, and where each entry's record
//! lies in the segments, so that older payloads are read back from the files.
//!
//! The compaction rule lets the live log grow to the size of the state before a snapshot
//! covers it, and a snapshot of a large state takes seconds to write, during which the log
//! grows on. Held in memory, that log doubled a node's memory. Only the newest
//! [`EntryCache::limit`] bytes of payload stay in memory: they are what a follower in step and
//! the next apply read. Older payloads are dropped once their records are written to the
//! segment (not necessarily synced: a `pread` sees them) and read back, from the page cache
//! usually, by a far-behind follower's catch-up or a restart's replay.
//!
//! Owns: the record location of every entry of the log state it follows (same indexes) and
//! the count of payload bytes in memory. Must not: decide what is compacted, write, or know
//! the record format (the storage hands it the parser).

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;

use protobuf::Message as PbMessage;
use raft::prelude::Entry;

/// Where an entry's record is: its segment's generation, its offset there and its length
/// (header included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Loc {
    pub(crate) gen: u64,
    pub(crate) offset: u64,
    pub(crate) len: u32,
}

pub(crate) struct EntryCache {
    /// The location of entry `base + 1 + i` at `i`.
    locs: VecDeque<Loc>,
    base: u64,
    /// The first index whose payload is in memory (`last + 1` when none is).
    first: u64,
    /// Record bytes of the entries from `first` on: the measure of what memory holds.
    bytes: u64,
    limit: u64,
}

impl EntryCache {
    pub(crate) fn new(limit: u64) -> EntryCache {
        EntryCache {
            locs: VecDeque::new(),
            base: 0,
            first: 1,
            bytes: 0,
            limit,
        }
    }

    fn last(&self) -> u64 {
        self.base + self.locs.len() as u64
    }

    /// The first index whose payload is in memory.
    pub(crate) fn first_cached(&self) -> u64 {
        self.first
    }

    /// Record bytes of the entries whose payload is in memory.
    pub(crate) fn cached_bytes(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn loc(&self, index: u64) -> Option<Loc> {
        if index <= self.base {
            return None;
        }
        self.locs.get((index - self.base - 1) as usize).copied()
    }

    /// Follows the log down to `base..=last` (a compaction, an installed snapshot, a suffix
    /// dropped by a new leader's entries): locations outside go.
    pub(crate) fn follow(&mut self, base: u64, last: u64) {
        while self.base < base {
            let Some(loc) = self.locs.pop_front() else {
                break;
            };
            self.base += 1;
            if self.base >= self.first {
                self.bytes -= u64::from(loc.len);
            }
        }
        self.base = self.base.max(base);
        while self.last() > last {
            let index = self.last();
            let loc = self.locs.pop_back().expect("last > base");
            if index >= self.first {
                self.bytes -= u64::from(loc.len);
            }
        }
        self.first = self.first.clamp(self.base + 1, self.last() + 1);
    }

    /// The record of entry `index`, the one after the last (its payload in memory).
    pub(crate) fn push(&mut self, index: u64, loc: Loc) {
        debug_assert_eq!(index, self.last() + 1);
        self.locs.push_back(loc);
        self.bytes += u64::from(loc.len);
    }

    /// Drops the oldest payloads (`drop_payload(index)` of the log state) until what memory
    /// holds is within the limit. Every entry's record must be written.
    pub(crate) fn evict(&mut self, mut drop_payload: impl FnMut(u64)) {
        while self.bytes > self.limit && self.first <= self.last() {
            drop_payload(self.first);
            let loc = self.loc(self.first).expect("first <= last");
            self.bytes -= u64::from(loc.len);
            self.first += 1;
        }
    }

    /// Reads entries `low..high` (all before [`EntryCache::first_cached`]) from their records,
    /// into `out`, stopping after the first entry that takes the total past `max_size` (as
    /// `raft::util::limit_size` would cut it). `open` gives a segment's file by generation,
    /// `parse` the entry a record holds.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn read(
        &self,
        low: u64,
        high: u64,
        max_size: Option<u64>,
        mut open: impl FnMut(u64) -> std::io::Result<File>,
        parse: impl Fn(&[u8]) -> Option<Entry>,
        out: &mut Vec<Entry>,
    ) -> Result<(), ReadFailure> {
        let mut file: Option<(u64, File)> = None;
        let mut buf = Vec::new();
        let mut size = 0u64;
        for index in low..high {
            let loc = self.loc(index).ok_or(ReadFailure::Missing(index))?;
            if file.as_ref().map(|(g, _)| *g) != Some(loc.gen) {
                let f = open(loc.gen).map_err(|e| ReadFailure::Io(loc.gen, e))?;
                file = Some((loc.gen, f));
            }
            let f = &file.as_ref().expect("just set").1;
            buf.resize(loc.len as usize, 0);
            f.read_exact_at(&mut buf, loc.offset)
                .map_err(|e| ReadFailure::Io(loc.gen, e))?;
            let e = parse(&buf)
                .filter(|e| e.index == index)
                .ok_or(ReadFailure::Corrupt(loc.gen, loc.offset))?;
            size += u64::from(e.compute_size());
            out.push(e);
            if max_size.is_some_and(|m| size > m) {
                break;
            }
        }
        Ok(())
    }
}

/// Why an entry could not be read back.
#[derive(Debug)]
pub(crate) enum ReadFailure {
    Missing(u64),
    Io(u64, std::io::Error),
    Corrupt(u64, u64),
}
