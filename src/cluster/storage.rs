//! Durable Raft storage: the log, hard state, conf state and snapshots of one node in a data
//! directory, behind raft-rs's `Storage` trait.
//!
//! Owns the files of `--data-dir` and the live log (the entries after the last compaction
//! point) in memory: every entry's index and term, and the payloads of the newest
//! [`LOG_CACHE_BYTES`] of them; older payloads are read back from their records
//! ([`super::logcache`]). It must not apply anything to the state machine and must not decide
//! when to snapshot or compact: the driver does.
//!
//! ```text
//! data-dir/
//!   lock                 the running node's process id, under an exclusive flock ([`claim_dir`])
//!   log.<gen>            segments: "HFRL" version(u32 LE), then records, append-only; each
//!                        new one begins by restating the snapshot, compaction point, conf
//!                        state and hard state, so that older ones hold only entries
//!   snap-<index>-<term>  the state machine as of that entry, in the format of [`snapfile`]
//!   received-<i>-<t>     a leader's snapshot, transferred and checked, until it is installed
//!
//! record = len(u32 LE) crc32c(payload)(u32 LE) crc32c(first 8 bytes)(u32 LE) payload
//! payload = kind(u8) body
//!   ENTRY       Entry protobuf: appends; an index at or below the last one first drops the
//!               conflicting suffix (a new leader's log wins)
//!   HARD_STATE  HardState protobuf (term, vote, commit)
//!   CONF_STATE  ConfState protobuf
//!   COMPACT     index(u64) term(u64): entries up to index are gone; index/term stay for matching
//!   SNAPSHOT    SnapshotMetadata protobuf: the latest snapshot file (made here)
//!   INSTALL     SnapshotMetadata protobuf: a leader's snapshot replaced the log up to its index
//! ```
//!
//! **Durability.** Every mutation updates memory and appends its record to a pending buffer;
//! [`DiskStorage::sync`] writes the buffer with one `write` and makes it durable with one
//! `fdatasync` (group commit). The driver calls `sync` after persisting a `Ready` and before it
//! sends the messages (votes, append acks) that promise that state. A snapshot file is written
//! to a temporary name (by a forked child, see `node.rs`), synced, renamed and the directory
//! synced before the record naming it. raft's snapshot messages carry the file's
//! [`Descriptor`], not the state: the file travels beside them (`transport.rs`).
//!
//! **Recovery.** At open the records are replayed. A crash can only tear the end of the last
//! write, so a partial last record (a short header, a header whose length runs past the end of
//! the file, a last payload whose checksum fails, or a zero-filled tail) is cut off and the log
//! recovers to a prefix of what was written. Any damage before the tail, a bad file header, a
//! record that breaks the log's order, or a missing or damaged snapshot file is a [`LogError`]:
//! the node refuses to start rather than silently forget a vote or an acknowledged entry.
//!
//! **Bounded, without copying.** The log is a series of segments: once the current one reaches
//! [`SEGMENT_BYTES`], the next write starts `log.<gen+1>` (the sealed one synced first), which
//! restates the state the records so far built but none of the entries. `compact` drops the
//! entries covered by a snapshot from memory; [`DiskStorage::sync`] then deletes every sealed
//! segment whose entries are all compacted, and superseded snapshot files. No entry is ever
//! written twice, so compaction costs nothing in proportion to the log or the state. At open
//! the segments are replayed in order; only the newest may end torn.

use std::collections::VecDeque;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use protobuf::Message as PbMessage;
use raft::prelude::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{Storage, StorageError};

use super::crc32c;
use super::logcache::{EntryCache, Loc, ReadFailure};
use super::snapfile::{self, Descriptor};

/// First bytes of a log file: the format's name and version.
const LOG_MAGIC: &[u8; 4] = b"HFRL";
const LOG_VERSION: u32 = 1;
const FILE_HEADER_LEN: u64 = 8;
/// len + payload crc + header crc.
const RECORD_HEADER_LEN: usize = 12;
/// The largest record the log accepts: a corrupt length must not make recovery allocate
/// gigabytes. 64 MiB is far above one owner turn's entry (its ops carry values of at most
/// `--max-item-size`, 1 MiB by default) yet cheap to allocate once.
pub const MAX_RECORD_LEN: usize = 64 << 20;
/// The largest snapshot file read back: a lock service's whole state (the item store defaults
/// to 1 GiB) with room to spare; a snapshot is also never larger than its file.
pub const MAX_SNAPSHOT_LEN: u64 = snapfile::MAX_FILE_LEN;
/// A log segment is sealed and a new one started once it is this large: the directory holds
/// the live log and at most one segment of compacted entries more.
pub const SEGMENT_BYTES: u64 = 16 << 20;
/// Record bytes of the newest entries whose payloads memory keeps ([`EntryCache`]); older ones
/// are read back from the segments. Far above what a follower in step or the next apply reads
/// (raft sends at most 1 MiB per append). Unit tests keep a few records only, so that every
/// test of the log and of the cluster's nodes reads entries back from the files.
#[cfg(not(test))]
pub const LOG_CACHE_BYTES: u64 = 32 << 20;
#[cfg(test)]
pub const LOG_CACHE_BYTES: u64 = 4 << 10;

const ENTRY: u8 = 1;
const HARD_STATE: u8 = 2;
const CONF_STATE: u8 = 3;
const COMPACT: u8 = 4;
const SNAPSHOT: u8 = 5;
const INSTALL: u8 = 6;

/// Why the data directory could not be opened or written.
#[derive(Debug)]
pub enum LogError {
    Io {
        path: PathBuf,
        source: io::Error,
    },
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    /// A caller asked for something the log cannot do (an append with a gap, a compaction past
    /// the last entry); the log is unchanged.
    Misuse(String),
}

impl fmt::Display for LogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogError::Io { path, source } => write!(f, "{}: {}", path.display(), source),
            LogError::Corrupt {
                path,
                offset,
                reason,
            } => {
                write!(
                    f,
                    "{}: corrupt at byte {}: {}",
                    path.display(),
                    offset,
                    reason
                )
            }
            LogError::Misuse(what) => write!(f, "raft log: {}", what),
        }
    }
}

impl std::error::Error for LogError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LogError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<LogError> for raft::Error {
    fn from(e: LogError) -> raft::Error {
        raft::Error::Store(StorageError::Other(Box::new(e)))
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> LogError + '_ {
    move |source| LogError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The replayable state: what memory holds and what the records describe. Also the whole of
/// the simulator's in-memory storage (`crate::sim`), so both answer raft alike.
#[derive(Default, Clone)]
pub(crate) struct LogState {
    pub(crate) hard_state: HardState,
    pub(crate) conf_state: ConfState,
    /// Index and term of the entry just before `entries` (0/0, a snapshot's or a compaction's).
    base_index: u64,
    base_term: u64,
    entries: VecDeque<Entry>,
    /// The newest snapshot file, if any.
    pub(crate) snapshot: Option<SnapshotMetadata>,
}

impl LogState {
    pub(crate) fn base_index(&self) -> u64 {
        self.base_index
    }

    pub(crate) fn last_index(&self) -> u64 {
        self.base_index + self.entries.len() as u64
    }

    pub(crate) fn entry(&self, idx: u64) -> Option<&Entry> {
        if idx <= self.base_index {
            return None;
        }
        self.entries.get((idx - self.base_index - 1) as usize)
    }

    pub(crate) fn term(&self, idx: u64) -> Option<u64> {
        if idx == self.base_index {
            return Some(self.base_term);
        }
        if idx < self.base_index || idx > self.last_index() {
            return None;
        }
        Some(self.entries[(idx - self.base_index - 1) as usize].term)
    }

    /// Entries `low..high`, all inside the log.
    fn range(&self, low: u64, high: u64) -> impl Iterator<Item = &Entry> {
        let lo = (low - self.base_index - 1) as usize;
        let hi = (high - self.base_index - 1) as usize;
        self.entries.range(lo..hi)
    }

    /// Drops the payload of entry `index` from memory (its record is in the log file, where
    /// [`DiskStorage`] reads it back from).
    pub(crate) fn drop_payload(&mut self, index: u64) {
        if let Some(e) = index
            .checked_sub(self.base_index + 1)
            .and_then(|i| self.entries.get_mut(i as usize))
        {
            e.data = Default::default();
            e.context = Default::default();
        }
    }

    /// Appends one entry, dropping a conflicting suffix first.
    pub(crate) fn push(&mut self, e: Entry) -> Result<(), String> {
        if e.index <= self.base_index {
            return Err(format!(
                "entry {} at or before the compaction point {}",
                e.index, self.base_index
            ));
        }
        if e.index > self.last_index() + 1 {
            return Err(format!(
                "entry {} leaves a gap after {}",
                e.index,
                self.last_index()
            ));
        }
        self.entries
            .truncate((e.index - self.base_index - 1) as usize);
        self.entries.push_back(e);
        Ok(())
    }

    pub(crate) fn compact(&mut self, index: u64, term: u64) -> Result<(), String> {
        self.compact_taking(index, term).map(drop)
    }

    /// [`LogState::compact`], giving back the entries it drops (for the caller to free
    /// elsewhere: behind a large state's snapshot they are as large as the state).
    pub(crate) fn compact_taking(&mut self, index: u64, term: u64) -> Result<Vec<Entry>, String> {
        if index < self.base_index {
            return Err(format!(
                "compaction to {} before {}",
                index, self.base_index
            ));
        }
        let drop = (index - self.base_index).min(self.entries.len() as u64) as usize;
        if self.term(index).is_some_and(|t| t != term) {
            return Err(format!(
                "compaction to {} term {} disagrees with the log",
                index, term
            ));
        }
        let gone = self.entries.drain(..drop).collect();
        self.base_index = index;
        self.base_term = term;
        Ok(gone)
    }

    /// The checks of an append from a `Ready`: it starts inside the log or right after it and
    /// its entries are consecutive.
    pub(crate) fn check_append(&self, ents: &[Entry]) -> Result<(), String> {
        let Some(first) = ents.first() else {
            return Ok(());
        };
        if first.index <= self.base_index || first.index > self.last_index() + 1 {
            return Err(format!(
                "append at {} outside {}..={}",
                first.index,
                self.base_index + 1,
                self.last_index() + 1
            ));
        }
        for (i, e) in ents.iter().enumerate() {
            if e.index != first.index + i as u64 {
                return Err(format!("append of non-consecutive entry {}", e.index));
            }
        }
        Ok(())
    }

    /// The index and term a compaction that keeps `compact_index` drops through; `None` when
    /// that is compacted already; an error past the last entry or the commit index.
    pub(crate) fn compaction_point(
        &self,
        compact_index: u64,
    ) -> Result<Option<(u64, u64)>, String> {
        if compact_index <= self.base_index + 1 {
            return Ok(None);
        }
        let index = compact_index - 1;
        if index > self.last_index() || index > self.hard_state.commit {
            return Err(format!(
                "compaction to {} past the last entry {} or the commit index {}",
                compact_index,
                self.last_index(),
                self.hard_state.commit
            ));
        }
        Ok(Some((index, self.term(index).unwrap_or_default())))
    }

    /// See [`DiskStorage::compaction_keeping`].
    pub(crate) fn compaction_keeping(&self, index: u64, max_entries: u64, max_bytes: u64) -> u64 {
        self.compaction_keeping_by(index, max_entries, max_bytes, |_, e| entry_bytes(e))
    }

    /// [`LogState::compaction_keeping`] with `size(index, entry)` the bytes of an entry.
    fn compaction_keeping_by(
        &self,
        index: u64,
        max_entries: u64,
        max_bytes: u64,
        size: impl Fn(u64, &Entry) -> u64,
    ) -> u64 {
        let Some(e) = self.entry(index) else {
            return index;
        };
        let (mut first, mut bytes) = (index, size(index, e));
        while first > self.base_index + 1 && index - first + 1 < max_entries {
            let Some(e) = self.entry(first - 1) else {
                break;
            };
            let b = size(first - 1, e);
            if bytes + b > max_bytes {
                break;
            }
            bytes += b;
            first -= 1;
        }
        first
    }

    /// See [`DiskStorage::snapshot_metadata_at`].
    pub(crate) fn snapshot_metadata_at(
        &self,
        index: u64,
        cs: ConfState,
    ) -> Result<Option<SnapshotMetadata>, String> {
        if index > self.hard_state.commit || index < self.base_index {
            return Err(format!(
                "snapshot at {} outside {}..={}",
                index, self.base_index, self.hard_state.commit
            ));
        }
        if self.snapshot.as_ref().is_some_and(|m| m.index >= index) {
            return Ok(None);
        }
        let mut meta = SnapshotMetadata {
            index,
            term: self.term(index).unwrap_or_default(),
            ..Default::default()
        };
        meta.set_conf_state(cs);
        Ok(Some(meta))
    }

    /// A leader's snapshot: entries after it survive only if the log agrees at its index
    /// (Raft's InstallSnapshot rule); the commit index reaches it.
    pub(crate) fn install(&mut self, meta: &SnapshotMetadata) {
        if self.term(meta.index) == Some(meta.term) && meta.index >= self.base_index {
            let drop = (meta.index - self.base_index) as usize;
            self.entries.drain(..drop);
        } else {
            self.entries.clear();
        }
        self.base_index = meta.index;
        self.base_term = meta.term;
        self.hard_state.term = self.hard_state.term.max(meta.term);
        self.hard_state.commit = self.hard_state.commit.max(meta.index);
        self.conf_state = meta.get_conf_state().clone();
        self.snapshot = Some(meta.clone());
    }

    fn apply_record(&mut self, kind: u8, body: &[u8]) -> Result<(), String> {
        match kind {
            ENTRY => self.push(parse::<Entry>(body)?),
            HARD_STATE => {
                self.hard_state = parse(body)?;
                Ok(())
            }
            CONF_STATE => {
                self.conf_state = parse(body)?;
                Ok(())
            }
            COMPACT => {
                if body.len() != 16 {
                    return Err(format!("compaction record of {} bytes", body.len()));
                }
                let index = u64::from_le_bytes(body[..8].try_into().unwrap_or_default());
                let term = u64::from_le_bytes(body[8..].try_into().unwrap_or_default());
                self.compact(index, term)
            }
            SNAPSHOT => {
                self.snapshot = Some(parse(body)?);
                Ok(())
            }
            INSTALL => {
                self.install(&parse(body)?);
                Ok(())
            }
            other => Err(format!("unknown record kind {}", other)),
        }
    }
}

fn parse<M: PbMessage>(body: &[u8]) -> Result<M, String> {
    M::parse_from_bytes(body).map_err(|e| format!("bad protobuf: {}", e))
}

/// Appends one framed record to `buf`.
fn put_record(buf: &mut Vec<u8>, kind: u8, body: &[u8]) {
    let len = (body.len() + 1) as u32;
    let payload_crc = crc32c::extend(crc32c::checksum(&[kind]), body);
    let mut head = [0u8; RECORD_HEADER_LEN];
    head[..4].copy_from_slice(&len.to_le_bytes());
    head[4..8].copy_from_slice(&payload_crc.to_le_bytes());
    let head_crc = crc32c::checksum(&head[..8]);
    head[8..].copy_from_slice(&head_crc.to_le_bytes());
    buf.extend_from_slice(&head);
    buf.push(kind);
    buf.extend_from_slice(body);
}

fn put_message<M: PbMessage>(buf: &mut Vec<u8>, kind: u8, m: &M) -> Result<(), LogError> {
    let body = m
        .write_to_bytes()
        .map_err(|e| LogError::Misuse(format!("encode: {}", e)))?;
    if body.len() + 1 > MAX_RECORD_LEN {
        return Err(LogError::Misuse(format!(
            "record of {} bytes over the cap",
            body.len()
        )));
    }
    put_record(buf, kind, &body);
    Ok(())
}

/// The entry an ENTRY record holds (`buf` is exactly the record), if it is one and intact.
pub(crate) fn entry_record(buf: &[u8]) -> Option<Entry> {
    match scan_one(buf, 0) {
        Scan::Record {
            kind: ENTRY,
            body,
            next,
        } if next == buf.len() => parse(body).ok(),
        _ => None,
    }
}

/// What the scan of one record found.
enum Scan<'a> {
    Record {
        kind: u8,
        body: &'a [u8],
        next: usize,
    },
    /// The rest of the file is the torn end of an interrupted write.
    TornTail,
    /// `after`: where the damaged record ends, as far as its header tells.
    Corrupt { reason: String, after: usize },
}

/// Scans the record at `at`. Damage is a torn tail when nothing but zeros follows the damaged
/// part: file systems may extend a file (with zeros) before the data of an interrupted write
/// lands, while damage before the tail is followed by the records written after it.
fn scan(buf: &[u8], at: usize) -> Scan<'_> {
    match scan_one(&buf[at..], at) {
        Scan::Corrupt { reason, after } => {
            if buf[(at + after).min(buf.len())..].iter().all(|&b| b == 0) {
                Scan::TornTail
            } else {
                Scan::Corrupt { reason, after }
            }
        }
        other => other,
    }
}

fn scan_one(rest: &[u8], at: usize) -> Scan<'_> {
    if rest.len() < RECORD_HEADER_LEN {
        return Scan::TornTail;
    }
    let word = |i: usize| u32::from_le_bytes([rest[i], rest[i + 1], rest[i + 2], rest[i + 3]]);
    let (len, payload_crc, head_crc) = (word(0) as usize, word(4), word(8));
    if crc32c::checksum(&rest[..8]) != head_crc {
        return Scan::Corrupt {
            reason: "record header checksum mismatch".into(),
            after: RECORD_HEADER_LEN,
        };
    }
    if len == 0 || len > MAX_RECORD_LEN {
        return Scan::Corrupt {
            reason: format!("record length {} outside 1..={}", len, MAX_RECORD_LEN),
            // A torn write never leaves a well-formed header with a length we never write.
            after: 0,
        };
    }
    let end = RECORD_HEADER_LEN + len;
    if end > rest.len() {
        // The header made it to disk, not all of the payload.
        return Scan::TornTail;
    }
    let payload = &rest[RECORD_HEADER_LEN..end];
    if crc32c::checksum(payload) != payload_crc {
        if end == rest.len() {
            return Scan::TornTail;
        }
        return Scan::Corrupt {
            reason: "record checksum mismatch".into(),
            after: end,
        };
    }
    Scan::Record {
        kind: payload[0],
        body: &payload[1..],
        next: at + end,
    }
}

/// A data directory claimed by this process ([`claim_dir`]): the exclusive lock on its `lock`
/// file is held while this value lives (and the kernel drops it when the process ends).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

/// Make `dir` this process's data directory, or say which flag is wrong and why, in a line an
/// operator can act on: `dir` must be (or become) a directory, be writable, and not be in use by
/// another running node (an exclusive `flock` on `dir/lock`, which names the holder's process).
/// Two nodes on one directory would each write the log and remove the other's files.
pub fn claim_dir(dir: &Path) -> Result<DirLock, String> {
    use std::os::fd::AsRawFd;
    let flag = |what: String| format!("--data-dir {}: {what}", dir.display());
    if let Ok(m) = fs::metadata(dir) {
        if !m.is_dir() {
            return Err(flag("not a directory".into()));
        }
    }
    fs::create_dir_all(dir).map_err(|e| flag(format!("cannot create it: {e}")))?;
    let read_only = |e: &io::Error| {
        matches!(
            e.raw_os_error(),
            Some(libc::EACCES) | Some(libc::EROFS) | Some(libc::EPERM)
        )
    };
    let path = dir.join("lock");
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| {
            if read_only(&e) {
                flag(format!("not writable: {e}"))
            } else {
                flag(format!("cannot open {}: {e}", path.display()))
            }
        })?;
    // SAFETY: flock on a descriptor this function owns; no memory is involved.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = match holder.trim() {
                "" => String::new(),
                pid => format!(" (process {pid})"),
            };
            return Err(flag(format!(
                "in use by another running holdfast node{holder}: one directory per node"
            )));
        }
        return Err(flag(format!("cannot lock {}: {e}", path.display())));
    }
    // The lock file may be writable where nothing else is (a directory made read-only since):
    // try a new file too.
    let probe = dir.join("lock.probe.tmp");
    File::create(&probe)
        .and_then(|_| fs::remove_file(&probe))
        .map_err(|e| {
            if read_only(&e) {
                flag(format!("not writable: {e}"))
            } else {
                flag(format!("cannot write in it: {e}"))
            }
        })?;
    let pid = format!("{}\n", std::process::id());
    let _ = file
        .set_len(0)
        .and_then(|()| file.write_all(pid.as_bytes()));
    Ok(DirLock { _file: file })
}

/// raft-rs `Storage` over a data directory. See the module header for the format.
pub struct DiskStorage {
    dir: PathBuf,
    state: LogState,
    /// The current log file, its generation and its length on disk (written, maybe unsynced).
    /// Shared with whoever makes a [`PendingLog`] durable (the node's sync thread).
    file: Arc<LogFile>,
    gen: u64,
    file_len: u64,
    /// Records not yet written.
    pending: Vec<u8>,
    /// Sealed segments still on disk: generation, and the last log index when it was sealed
    /// (every entry in it is at or below; it goes once the compaction point reaches that).
    sealed: Vec<(u64, u64)>,
    /// Snapshot files to remove once the record superseding them is durable.
    obsolete: Vec<PathBuf>,
    /// The length and checksum of the newest snapshot file (what raft's messages carry).
    descriptor: Option<Descriptor>,
    /// Entries compacted away, freed by the next sync (on its thread, in the background).
    dropped: Vec<Entry>,
    /// Where every live entry's record is, and which payloads memory keeps.
    cache: EntryCache,
    /// Entries read back from the segments so far.
    entries_read: std::sync::atomic::AtomicU64,
}

/// The open log file and its path (for error messages), shared with the sync thread.
struct LogFile {
    file: File,
    path: PathBuf,
    /// Whether the directory entry of a new segment is durable (the first sync of the segment
    /// syncs the directory too).
    dir_synced: std::sync::atomic::AtomicBool,
}

impl LogFile {
    fn new(file: File, path: PathBuf, dir_synced: bool) -> Arc<LogFile> {
        Arc::new(LogFile {
            file,
            path,
            dir_synced: std::sync::atomic::AtomicBool::new(dir_synced),
        })
    }
}

/// A log file with records written but maybe not yet durable.
pub struct PendingLog(Arc<LogFile>);

impl PendingLog {
    /// One fdatasync: every record written to this file before the call is durable after it.
    pub fn sync(&self) -> Result<(), LogError> {
        use std::sync::atomic::Ordering::{Acquire, Release};
        self.0.file.sync_data().map_err(io_err(&self.0.path))?;
        if !self.0.dir_synced.load(Acquire) {
            if let Some(dir) = self.0.path.parent() {
                sync_dir(dir)?;
            }
            self.0.dir_synced.store(true, Release);
        }
        Ok(())
    }

    /// Whether two handles name the same file (one sync serves both).
    pub fn same_file(&self, other: &PendingLog) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The index and term of a COMPACT record's body (0s if it is malformed: `apply_record`
/// refuses it).
fn compact_fields(body: &[u8]) -> (u64, u64) {
    let word = |r: std::ops::Range<usize>| {
        body.get(r)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    };
    (word(0..8), word(8..16))
}

/// About what an entry takes in the log file.
fn entry_bytes(e: &Entry) -> u64 {
    (e.data.len() + e.context.len() + 32) as u64
}

fn log_path(dir: &Path, gen: u64) -> PathBuf {
    dir.join(format!("log.{}", gen))
}

fn snap_path(dir: &Path, meta: &SnapshotMetadata) -> PathBuf {
    snapfile::path(dir, meta)
}

fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

impl DiskStorage {
    /// Opens (or creates) the log in `dir`, recovering from a torn tail. See the module header
    /// for what is an error.
    pub fn open(dir: impl AsRef<Path>) -> Result<DiskStorage, LogError> {
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let mut gens = Vec::new();
        let mut snaps = Vec::new();
        for ent in fs::read_dir(&dir).map_err(io_err(&dir))? {
            let ent = ent.map_err(io_err(&dir))?;
            let name = ent.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.ends_with(".tmp") {
                // An interrupted snapshot write (or a log rewrite of an older version): never referenced.
                fs::remove_file(ent.path()).map_err(io_err(&ent.path()))?;
            } else if let Some(g) = name
                .strip_prefix("log.")
                .and_then(|g| g.parse::<u64>().ok())
            {
                gens.push(g);
            } else if name.starts_with("snap-") {
                snaps.push(ent.path());
            } else if name.starts_with("received-") || name.starts_with("incoming-") {
                // A transfer that had not been installed: the leader sends a newer one.
                fs::remove_file(ent.path()).map_err(io_err(&ent.path()))?;
            }
        }
        gens.sort_unstable();
        let Some(&gen) = gens.last() else {
            if let Some(p) = snaps.first() {
                return Err(LogError::Corrupt {
                    path: p.clone(),
                    offset: 0,
                    reason: "snapshot file without a log: the log was lost".into(),
                });
            }
            return DiskStorage::create(dir);
        };
        let mut gen = gen;
        // A segment whose header never reached the disk was being started: it holds nothing.
        while gens.len() > 1 {
            let p = log_path(&dir, gen);
            let mut head = [0u8; FILE_HEADER_LEN as usize];
            let whole = File::open(&p)
                .and_then(|mut f| f.read_exact(&mut head))
                .is_ok();
            // (A file system may show a file extended with zeros before its data lands.)
            if whole && head != [0u8; FILE_HEADER_LEN as usize] {
                break;
            }
            fs::remove_file(&p).map_err(io_err(&p))?;
            gens.pop();
            gen = *gens.last().expect("more than one");
        }
        let mut state = LogState::default();
        let mut cache = EntryCache::new(LOG_CACHE_BYTES);
        let mut sealed = Vec::new();
        let mut at = 0;
        let mut lost_before = None;
        let mut covered = false;
        let mut last_file = None;
        for (k, &g) in gens.iter().enumerate() {
            let path = log_path(&dir, g);
            let newest = k + 1 == gens.len();
            let mut file = OpenOptions::new()
                .read(true)
                .write(newest)
                .open(&path)
                .map_err(io_err(&path))?;
            let mut buf = Vec::new();
            file.read_to_end(&mut buf).map_err(io_err(&path))?;
            let corrupt = |offset: usize, reason: String| LogError::Corrupt {
                path: path.clone(),
                offset: offset as u64,
                reason,
            };
            if buf.len() < FILE_HEADER_LEN as usize
                || &buf[..4] != LOG_MAGIC
                || buf[4..8] != LOG_VERSION.to_le_bytes()
            {
                return Err(corrupt(0, "not a holdfast raft log of version 1".into()));
            }
            at = FILE_HEADER_LEN as usize;
            while at < buf.len() {
                match scan(&buf, at) {
                    Scan::Record { kind, body, next } => {
                        if k == 0 && kind == ENTRY && state.entries.is_empty() {
                            // The oldest segment left may begin after the compaction point it
                            // restates: the segments before were deleted once a later
                            // compaction covered them, and that compaction's record follows.
                            let e: Entry = parse(body).map_err(|r| corrupt(at, r))?;
                            if e.index > state.last_index() + 1 {
                                state.base_index = e.index - 1;
                                state.base_term = 0;
                                lost_before = Some(e.index - 1);
                            }
                        }
                        let base = state.base_index;
                        if kind == COMPACT && lost_before.is_some() {
                            let (index, term) = compact_fields(body);
                            if index < base {
                                // A later segment's head restates the compaction point of its
                                // start, older than where the segments left begin: nothing to
                                // drop.
                                at = next;
                                continue;
                            }
                            if index == base && lost_before == Some(base) && !covered {
                                // The point the replay began at, whose term it could not know.
                                state.base_term = term;
                                covered = true;
                                at = next;
                                continue;
                            }
                        }
                        state.apply_record(kind, body).map_err(|r| corrupt(at, r))?;
                        if kind == ENTRY {
                            let index = state.last_index();
                            cache.follow(state.base_index, index - 1);
                            let len = (next - at) as u32;
                            let loc = Loc {
                                gen: g,
                                offset: at as u64,
                                len,
                            };
                            cache.push(index, loc);
                        } else {
                            cache.follow(state.base_index, state.last_index());
                        }
                        if matches!(kind, COMPACT | INSTALL) && state.base_index > base {
                            covered = lost_before.is_some_and(|i| state.base_index >= i);
                        }
                        at = next;
                    }
                    // Only the newest segment can end torn: a segment is synced before the
                    // next one starts.
                    Scan::TornTail if newest => break,
                    Scan::TornTail => return Err(corrupt(at, "a sealed segment ends torn".into())),
                    Scan::Corrupt { reason, .. } => return Err(corrupt(at, reason)),
                }
            }
            // (Not holding more than the cache and one segment's payloads while replaying.)
            cache.evict(|i| state.drop_payload(i));
            if newest {
                if at < buf.len() {
                    file.set_len(at as u64).map_err(io_err(&path))?;
                }
                // What the replay saw is durable before anything is deleted because of it.
                file.sync_all().map_err(io_err(&path))?;
                file.seek(SeekFrom::Start(at as u64))
                    .map_err(io_err(&path))?;
                last_file = Some((file, path));
            } else {
                sealed.push((g, state.last_index()));
            }
        }
        let (file, path) = last_file.expect("at least one segment");
        if lost_before.is_some() && !covered {
            return Err(LogError::Corrupt {
                path: log_path(&dir, gens[0]),
                offset: 0,
                reason: "the log's first entries are missing (a segment was lost)".into(),
            });
        }
        sync_dir(&dir)?;
        // Sealed segments whose entries are all compacted (the records that made them so are
        // durable: synced just above).
        sealed.retain(|&(g, last)| {
            if last > state.base_index {
                return true;
            }
            let _ = fs::remove_file(log_path(&dir, g));
            false
        });
        let keep = state.snapshot.as_ref().map(|m| snap_path(&dir, m));
        let mut descriptor = None;
        if let (Some(keep), Some(meta)) = (&keep, &state.snapshot) {
            // Fails on a missing or damaged file, or one that is not the snapshot named.
            let checked = check_or_convert(keep)?;
            if &checked.meta != meta {
                return Err(LogError::Corrupt {
                    path: keep.clone(),
                    offset: 0,
                    reason: "snapshot metadata differs from the log's record".into(),
                });
            }
            descriptor = Some(checked.descriptor);
        }
        for p in snaps {
            if Some(&p) != keep.as_ref() {
                fs::remove_file(&p).map_err(io_err(&p))?;
            }
        }
        Ok(DiskStorage {
            dir,
            file: LogFile::new(file, path, true),
            gen,
            file_len: at as u64,
            pending: Vec::new(),
            sealed,
            state,
            obsolete: Vec::new(),
            descriptor,
            dropped: Vec::new(),
            cache,
            entries_read: Default::default(),
        })
    }

    /// A segment's first records: the snapshot, the compaction point, the conf state and the
    /// hard state, as `state` has them (not its entries).
    fn segment_head(state: &LogState, buf: &mut Vec<u8>) -> Result<(), LogError> {
        buf.extend_from_slice(LOG_MAGIC);
        buf.extend_from_slice(&LOG_VERSION.to_le_bytes());
        if let Some(meta) = &state.snapshot {
            put_message(buf, SNAPSHOT, meta)?;
        }
        if state.base_index > 0 {
            let mut body = [0u8; 16];
            body[..8].copy_from_slice(&state.base_index.to_le_bytes());
            body[8..].copy_from_slice(&state.base_term.to_le_bytes());
            put_record(buf, COMPACT, &body);
        }
        put_message(buf, CONF_STATE, &state.conf_state)?;
        put_message(buf, HARD_STATE, &state.hard_state)
    }

    /// Writes an empty log as log file 1 (temporary name, sync, rename, directory sync).
    fn create(dir: PathBuf) -> Result<DiskStorage, LogError> {
        let (gen, state) = (1, LogState::default());
        let mut buf = Vec::new();
        Self::segment_head(&state, &mut buf)?;
        let path = log_path(&dir, gen);
        let tmp = path.with_extension(format!("{}.tmp", gen));
        let mut f = File::create(&tmp).map_err(io_err(&tmp))?;
        f.write_all(&buf).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
        drop(f);
        fs::rename(&tmp, &path).map_err(io_err(&path))?;
        sync_dir(&dir)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_err(&path))?;
        file.seek(SeekFrom::End(0)).map_err(io_err(&path))?;
        let len = buf.len() as u64;
        Ok(DiskStorage {
            dir,
            state,
            file: LogFile::new(file, path, true),
            gen,
            file_len: len,
            pending: Vec::new(),
            sealed: Vec::new(),
            obsolete: Vec::new(),
            descriptor: None,
            dropped: Vec::new(),
            cache: EntryCache::new(LOG_CACHE_BYTES),
            entries_read: Default::default(),
        })
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Sets the membership of a brand-new cluster (every founding node the same), like
    /// raft-rs's `MemStorage::new_with_conf_state`. Refused once the log holds anything.
    pub fn initialize_with_conf_state(&mut self, cs: ConfState) -> Result<(), LogError> {
        if self.state.last_index() != 0 || self.state.conf_state != ConfState::default() {
            return Err(LogError::Misuse(
                "initialising a log that is not empty".into(),
            ));
        }
        self.set_conf_state(cs)
    }

    /// Appends entries from a `Ready` (the leader's or our own), replacing any conflicting
    /// suffix. Durable after the next [`DiskStorage::sync`].
    pub fn append(&mut self, ents: &[Entry]) -> Result<(), LogError> {
        self.state.check_append(ents).map_err(LogError::Misuse)?;
        let mark = self.pending.len();
        let mut ends = Vec::with_capacity(ents.len());
        for e in ents {
            if let Err(err) = put_message(&mut self.pending, ENTRY, e) {
                self.pending.truncate(mark);
                return Err(err);
            }
            ends.push(self.pending.len());
        }
        let mut start = mark;
        for (e, end) in ents.iter().zip(ends) {
            self.state.push(e.clone()).map_err(LogError::Misuse)?;
            self.cache.follow(self.state.base_index, e.index - 1);
            let loc = Loc {
                gen: self.gen,
                offset: self.file_len + start as u64,
                len: (end - start) as u32,
            };
            self.cache.push(e.index, loc);
            start = end;
        }
        Ok(())
    }

    pub fn set_hard_state(&mut self, hs: &HardState) -> Result<(), LogError> {
        put_message(&mut self.pending, HARD_STATE, hs)?;
        self.state.hard_state = hs.clone();
        Ok(())
    }

    /// Makes the configuration the one of the snapshot (in memory only), for a node that
    /// starts from its snapshot and applies the log after it again: the membership changes in
    /// that log are applied again too, each to the configuration it was made against.
    pub fn rewind_conf_state_to_snapshot(&mut self) {
        if let Some(meta) = &self.state.snapshot {
            self.state.conf_state = meta.get_conf_state().clone();
        }
    }

    pub fn set_conf_state(&mut self, cs: ConfState) -> Result<(), LogError> {
        put_message(&mut self.pending, CONF_STATE, &cs)?;
        self.state.conf_state = cs;
        Ok(())
    }

    /// Drops every entry before `compact_index` (they must be covered by a snapshot the
    /// driver made; at most up to the commit index). Indexes already compacted are ignored.
    pub fn compact(&mut self, compact_index: u64) -> Result<(), LogError> {
        let Some((index, term)) = self
            .state
            .compaction_point(compact_index)
            .map_err(LogError::Misuse)?
        else {
            return Ok(());
        };
        let mut body = [0u8; 16];
        body[..8].copy_from_slice(&index.to_le_bytes());
        body[8..].copy_from_slice(&term.to_le_bytes());
        put_record(&mut self.pending, COMPACT, &body);
        let gone = self.state.compact_taking(index, term);
        let mut gone = gone.map_err(LogError::Misuse)?;
        self.cache
            .follow(self.state.base_index, self.state.last_index());
        if self.dropped.is_empty() {
            self.dropped = gone;
        } else {
            self.dropped.append(&mut gone);
        }
        Ok(())
    }

    /// The compaction index (the first entry kept) that keeps `index` and, behind it, at most
    /// `max_entries` entries in all and at most `max_bytes` of them (the entry at `index`
    /// always): a follower a little behind catches up from the log, and the log left after a
    /// snapshot stays small whatever the entries' size.
    pub fn compaction_keeping(&self, index: u64, max_entries: u64, max_bytes: u64) -> u64 {
        let cache = &self.cache;
        self.state
            .compaction_keeping_by(index, max_entries, max_bytes, |i, e| {
                cache.loc(i).map_or(entry_bytes(e), |l| u64::from(l.len))
            })
    }

    /// The metadata of a snapshot of the state machine as applied through `index` (at most
    /// the commit index, at least the compaction point), to be written to
    /// [`DiskStorage::snapshot_tmp_path`] and then adopted; `None` when the newest snapshot is
    /// already at or after `index`.
    pub fn snapshot_metadata_at(
        &self,
        index: u64,
        cs: ConfState,
    ) -> Result<Option<SnapshotMetadata>, LogError> {
        self.state
            .snapshot_metadata_at(index, cs)
            .map_err(LogError::Misuse)
    }

    /// Where the snapshot with `meta` is written before [`DiskStorage::adopt_snapshot`] (a
    /// leftover from a crash is removed at open).
    pub fn snapshot_tmp_path(&self, meta: &SnapshotMetadata) -> PathBuf {
        snap_path(&self.dir, meta).with_extension("tmp")
    }

    /// Takes the finished, synced snapshot file at [`DiskStorage::snapshot_tmp_path`] as the
    /// newest snapshot: renamed into place, the directory synced; the record naming it after the
    /// next sync. Ignored (and the file removed) when a newer snapshot arrived meanwhile.
    pub fn adopt_snapshot(
        &mut self,
        meta: SnapshotMetadata,
        descriptor: Descriptor,
    ) -> Result<(), LogError> {
        let tmp = self.snapshot_tmp_path(&meta);
        if meta.index < self.state.base_index
            || self
                .state
                .snapshot
                .as_ref()
                .is_some_and(|m| m.index >= meta.index)
        {
            return fs::remove_file(&tmp).map_err(io_err(&tmp));
        }
        let path = snap_path(&self.dir, &meta);
        fs::rename(&tmp, &path).map_err(io_err(&path))?;
        sync_dir(&self.dir)?;
        put_message(&mut self.pending, SNAPSHOT, &meta)?;
        self.replace_snapshot(meta, descriptor);
        Ok(())
    }

    /// Writes a snapshot of the state machine as applied through `index` from bytes in memory
    /// (tests; the driver writes its snapshots from a forked child). The file is durable when
    /// this returns; the record naming it after the next sync.
    pub fn create_snapshot(
        &mut self,
        index: u64,
        cs: ConfState,
        data: Vec<u8>,
    ) -> Result<(), LogError> {
        let Some(meta) = self.snapshot_metadata_at(index, cs)? else {
            return Ok(());
        };
        let tmp = self.snapshot_tmp_path(&meta);
        let d = snapfile::write_file(&tmp, &meta, &data).map_err(io_err(&tmp))?;
        self.adopt_snapshot(meta, d)
    }

    /// Installs a leader's snapshot from a `Ready` (the driver then restores the state machine
    /// from [`DiskStorage::snapshot_path`]). Its data is the [`Descriptor`] of the leader's file,
    /// which the transport received, checked and synced as `received-<index>-<term>`; any
    /// other data is the state itself (a founding node's first snapshot, tests). Refused when
    /// older than our compaction point.
    pub fn apply_snapshot(&mut self, snap: &Snapshot) -> Result<(), LogError> {
        let meta = snap.get_metadata();
        if meta.index < self.state.base_index {
            return Err(LogError::Misuse(format!(
                "snapshot at {} older than the compaction point {}",
                meta.index, self.state.base_index
            )));
        }
        let path = snap_path(&self.dir, meta);
        let descriptor = match Descriptor::decode(snap.get_data()) {
            Some(d) => {
                let received = snapfile::received_path(&self.dir, meta.index, meta.term);
                fs::rename(&received, &path).map_err(io_err(&received))?;
                d
            }
            None => {
                let tmp = path.with_extension("tmp");
                let d = snapfile::write_file(&tmp, meta, snap.get_data()).map_err(io_err(&tmp))?;
                fs::rename(&tmp, &path).map_err(io_err(&path))?;
                d
            }
        };
        sync_dir(&self.dir)?;
        // Transfers that raft did not install (stale, or dropped on the way to it).
        if let Ok(entries) = fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with("received-") {
                    self.obsolete.push(e.path());
                }
            }
        }
        put_message(&mut self.pending, INSTALL, meta)?;
        let old = self.state.snapshot.clone();
        self.state.install(meta);
        self.state.snapshot = old;
        self.cache
            .follow(self.state.base_index, self.state.last_index());
        self.replace_snapshot(meta.clone(), descriptor);
        Ok(())
    }

    /// The file of the newest snapshot, if any.
    pub fn snapshot_path(&self) -> Option<PathBuf> {
        self.state
            .snapshot
            .as_ref()
            .map(|m| snap_path(&self.dir, m))
    }

    /// The newest snapshot's state bytes, read and checked (start-up, tests).
    pub fn snapshot_state(&self) -> Result<Vec<u8>, LogError> {
        let path = self
            .snapshot_path()
            .ok_or_else(|| LogError::Misuse("no snapshot".into()))?;
        let checked = check_file(&path)?;
        snapfile::read_state(&path, &checked).map_err(|e| read_error(&path, e))
    }

    /// The newest snapshot file's length and checksum.
    pub fn snapshot_descriptor(&self) -> Option<Descriptor> {
        self.descriptor
    }

    fn replace_snapshot(&mut self, meta: SnapshotMetadata, descriptor: Descriptor) {
        self.descriptor = Some(descriptor);
        if let Some(old) = self.state.snapshot.replace(meta) {
            let old = snap_path(&self.dir, &old);
            if Some(&old)
                != self
                    .state
                    .snapshot
                    .as_ref()
                    .map(|m| snap_path(&self.dir, m))
                    .as_ref()
            {
                self.obsolete.push(old);
            }
        }
    }

    /// Makes every mutation so far durable: one write, one fdatasync. Call it after persisting
    /// a `Ready`'s entries, hard state and snapshot and before sending its messages. Then the
    /// files the records made useless go (see [`DiskStorage::sync_in_background`]).
    pub fn sync(&mut self) -> Result<(), LogError> {
        self.write()?.sync()?;
        self.dropped = Vec::new();
        for p in self.useless_files() {
            match fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(LogError::Io { path: p, source: e }),
            }
        }
        Ok(())
    }

    /// [`DiskStorage::sync`] on a thread of its own, for records that nothing waits for (a
    /// snapshot adopted and the compaction behind it): the write here, then the fdatasync and
    /// the removal of what those records made useless (sealed segments they compacted,
    /// superseded snapshot files), in that order, there. Freeing the blocks of large files takes
    /// time in proportion to them: never on the owner's thread. A failure is logged; the next
    /// sync of the log fails the same way and stops the node.
    pub fn sync_in_background(&mut self) -> Result<(), LogError> {
        let log = self.write()?;
        let useless = self.useless_files();
        // Behind a snapshot of a large state, as many bytes of entries as the state: freeing
        // them takes tens of milliseconds.
        let dropped = std::mem::take(&mut self.dropped);
        let work = move || match log.sync().map(|()| drop(dropped)) {
            Ok(()) => {
                for p in useless {
                    if let Err(e) = fs::remove_file(&p) {
                        if e.kind() != io::ErrorKind::NotFound {
                            crate::log_warn!("cannot remove {}: {e}", p.display());
                        }
                    }
                }
            }
            Err(e) => crate::log_error!("raft log: {e}"),
        };
        std::thread::Builder::new()
            .name("holdfast-compact".into())
            .spawn(work)
            .map(|_| ())
            .map_err(|e| LogError::Io {
                path: self.dir.clone(),
                source: e,
            })
    }

    /// The files that the records so far make useless once durable: sealed segments whose
    /// entries are all compacted, and superseded snapshot files (taken off the lists).
    fn useless_files(&mut self) -> Vec<PathBuf> {
        let base = self.state.base_index;
        let dir = self.dir.clone();
        let mut gone = Vec::new();
        self.sealed.retain(|&(g, last)| {
            let keep = last > base;
            if !keep {
                gone.push(log_path(&dir, g));
            }
            keep
        });
        gone.append(&mut self.obsolete);
        gone
    }

    /// Writes every mutation so far to the log file with one `write`, without waiting for the
    /// disk: the caller makes it durable with [`PendingLog::sync`], on any thread, before it
    /// sends what promised that state (the group commit of a node whose owner goes on working
    /// while the disk syncs). A segment that has reached [`SEGMENT_BYTES`] is sealed here
    /// (synced) and the next one started; the handle returned is the new segment's.
    pub fn write(&mut self) -> Result<PendingLog, LogError> {
        if !self.pending.is_empty() {
            let log = &*self.file;
            (&log.file)
                .write_all(&self.pending)
                .map_err(io_err(&log.path))?;
            self.file_len += self.pending.len() as u64;
            self.pending.clear();
            // Every entry's record is written now: older payloads can be read back.
            let state = &mut self.state;
            self.cache.evict(|i| state.drop_payload(i));
        }
        if self.file_len >= SEGMENT_BYTES {
            self.roll()?;
        }
        Ok(PendingLog(self.file.clone()))
    }

    /// Bytes recorded but not yet synced.
    pub fn unsynced_bytes(&self) -> usize {
        self.pending.len()
    }

    /// Length of the current log file (for tests and metrics).
    pub fn log_file_len(&self) -> u64 {
        self.file_len
    }

    /// Seals the current segment (synced, so that the next one may restate what it built) and
    /// starts the next with the state's records but none of its entries: a few hundred bytes,
    /// however long the log. Its directory entry is synced with its first sync.
    fn roll(&mut self) -> Result<(), LogError> {
        self.file
            .file
            .sync_data()
            .map_err(io_err(&self.file.path))?;
        let gen = self.gen + 1;
        let path = log_path(&self.dir, gen);
        let mut buf = Vec::new();
        Self::segment_head(&self.state, &mut buf)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io_err(&path))?;
        (&file).write_all(&buf).map_err(io_err(&path))?;
        self.sealed.push((self.gen, self.state.last_index()));
        self.file = LogFile::new(file, path, false);
        self.gen = gen;
        self.file_len = buf.len() as u64;
        Ok(())
    }

    /// Record bytes of the entries whose payloads memory keeps.
    pub fn cached_bytes(&self) -> u64 {
        self.cache.cached_bytes()
    }

    /// Entries read back from the segments so far (their payloads had left memory).
    pub fn entries_read(&self) -> u64 {
        self.entries_read.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Entries `low..high` of the live log: those whose payload memory no longer keeps from
    /// their records, the rest from memory; cut to `max_size` as raft's `limit_size` does.
    fn read_entries(&self, low: u64, high: u64, max_size: Option<u64>) -> raft::Result<Vec<Entry>> {
        let state = &self.state;
        if low <= state.base_index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > state.last_index() + 1 || low > high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let split = self.cache.first_cached().clamp(low, high);
        let mut out = Vec::with_capacity((high - low).min(1024) as usize);
        if low < split {
            let open = |gen: u64| {
                if gen == self.gen {
                    self.file.file.try_clone()
                } else {
                    File::open(log_path(&self.dir, gen))
                }
            };
            let read = self
                .cache
                .read(low, split, max_size, open, entry_record, &mut out);
            self.entries_read
                .fetch_add(out.len() as u64, std::sync::atomic::Ordering::Relaxed);
            read.map_err(|f| self.read_failure(f))?;
        }
        if out.len() as u64 == split - low {
            out.extend(state.range(split, high).cloned());
        }
        raft::util::limit_size(&mut out, max_size);
        Ok(out)
    }

    fn read_failure(&self, f: ReadFailure) -> raft::Error {
        let e = match f {
            ReadFailure::Missing(index) => {
                LogError::Misuse(format!("no record of entry {index} in the log"))
            }
            ReadFailure::Io(gen, source) => LogError::Io {
                path: log_path(&self.dir, gen),
                source,
            },
            ReadFailure::Corrupt(gen, offset) => LogError::Corrupt {
                path: log_path(&self.dir, gen),
                offset,
                reason: "an entry's record does not read back".into(),
            },
        };
        e.into()
    }

    /// Log segments on disk (sealed ones and the current one).
    pub fn segments(&self) -> usize {
        self.sealed.len() + 1
    }

    /// The hard state as last set.
    pub fn hard_state(&self) -> &HardState {
        &self.state.hard_state
    }

    /// The metadata of the newest snapshot file, if any.
    pub fn snapshot_metadata(&self) -> Option<&SnapshotMetadata> {
        self.state.snapshot.as_ref()
    }
}

fn read_error(path: &Path, e: snapfile::ReadError) -> LogError {
    match e {
        snapfile::ReadError::Io(source) => LogError::Io {
            path: path.to_path_buf(),
            source,
        },
        snapfile::ReadError::Corrupt(reason) => LogError::Corrupt {
            path: path.to_path_buf(),
            offset: 0,
            reason,
        },
    }
}

fn check_file(path: &Path) -> Result<snapfile::Checked, LogError> {
    snapfile::check(path).map_err(|e| read_error(path, e))
}

/// Checks the snapshot file at `path`; one in the first format (a single record holding a
/// `Snapshot` protobuf) is rewritten in the current one first.
fn check_or_convert(path: &Path) -> Result<snapfile::Checked, LogError> {
    let mut magic = [0u8; 4];
    let legacy = File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .map(|()| &magic != snapfile::FILE_MAGIC)
        .unwrap_or(false);
    if legacy {
        let snap = read_legacy_snapshot_file(path)?;
        let tmp = path.with_extension("tmp");
        snapfile::write_file(&tmp, snap.get_metadata(), snap.get_data()).map_err(io_err(&tmp))?;
        fs::rename(&tmp, path).map_err(io_err(path))?;
        if let Some(dir) = path.parent() {
            sync_dir(dir)?;
        }
    }
    check_file(path)
}

/// A snapshot file in the first format: one record holding a `Snapshot` protobuf.
fn read_legacy_snapshot_file(path: &Path) -> Result<Snapshot, LogError> {
    let mut f = File::open(path).map_err(io_err(path))?;
    let len = f.metadata().map_err(io_err(path))?.len();
    let corrupt = |reason: String| LogError::Corrupt {
        path: path.to_path_buf(),
        offset: 0,
        reason,
    };
    if len > MAX_SNAPSHOT_LEN + RECORD_HEADER_LEN as u64 {
        return Err(corrupt(format!(
            "snapshot file of {} bytes over the cap",
            len
        )));
    }
    let mut buf = Vec::with_capacity(len as usize);
    f.read_to_end(&mut buf).map_err(io_err(path))?;
    if buf.len() < RECORD_HEADER_LEN {
        return Err(corrupt("snapshot file truncated".into()));
    }
    let word = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
    if crc32c::checksum(&buf[..8]) != word(8) || word(0) as usize != buf.len() - RECORD_HEADER_LEN {
        return Err(corrupt("snapshot file header damaged or truncated".into()));
    }
    let payload = &buf[RECORD_HEADER_LEN..];
    if crc32c::checksum(payload) != word(4) || payload.first() != Some(&SNAPSHOT) {
        return Err(corrupt("snapshot file checksum mismatch".into()));
    }
    parse(&payload[1..]).map_err(corrupt)
}

impl LogState {
    /// `Storage::entries` over this state.
    pub(crate) fn read_entries(
        &self,
        low: u64,
        high: u64,
        max_size: Option<u64>,
    ) -> raft::Result<Vec<Entry>> {
        if low <= self.base_index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last_index() + 1 || low > high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let lo = (low - self.base_index - 1) as usize;
        let hi = (high - self.base_index - 1) as usize;
        let mut out: Vec<Entry> = self.entries.range(lo..hi).cloned().collect();
        raft::util::limit_size(&mut out, max_size);
        Ok(out)
    }

    /// `Storage::term` over this state.
    pub(crate) fn read_term(&self, idx: u64) -> raft::Result<u64> {
        if idx < self.base_index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        self.term(idx)
            .ok_or(raft::Error::Store(StorageError::Unavailable))
    }
}

/// The methods of raft's `Storage` that read the log state (`self.state`, a [`LogState`]) and
/// its entries (`self.read_entries`): the same for the disk storage and the simulator's
/// in-memory one, which differ in where a snapshot's data and old entries' payloads live.
macro_rules! log_state_reads {
    () => {
        fn initial_state(&self) -> raft::Result<raft::RaftState> {
            Ok(raft::RaftState::new(
                self.state.hard_state.clone(),
                self.state.conf_state.clone(),
            ))
        }

        fn entries(
            &self,
            low: u64,
            high: u64,
            max_size: impl Into<Option<u64>>,
            _context: raft::GetEntriesContext,
        ) -> raft::Result<Vec<raft::prelude::Entry>> {
            self.read_entries(low, high, max_size.into())
        }

        fn term(&self, idx: u64) -> raft::Result<u64> {
            self.state.read_term(idx)
        }

        fn first_index(&self) -> raft::Result<u64> {
            Ok(self.state.base_index() + 1)
        }

        fn last_index(&self) -> raft::Result<u64> {
            Ok(self.state.last_index())
        }
    };
}
pub(crate) use log_state_reads;

/// Whether configuration `cs` names node `id` (as a voter or learner, joint ones included).
fn names(cs: &raft::prelude::ConfState, id: u64) -> bool {
    cs.voters
        .iter()
        .chain(&cs.voters_outgoing)
        .chain(&cs.learners)
        .chain(&cs.learners_next)
        .any(|&v| v == id)
}

impl Storage for DiskStorage {
    log_state_reads!();

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        match &self.state.snapshot {
            // A snapshot older than `to`'s joining would not name it: raft-rs's follower drops
            // it. The driver snapshots when a node is added; raft asks again later. (`to` 0:
            // the node reads its own, at start.)
            Some(meta)
                if meta.index >= request_index && (to == 0 || names(meta.get_conf_state(), to)) =>
            {
                let d = self.descriptor.ok_or_else(|| {
                    LogError::Misuse("a snapshot without its file's descriptor".into())
                })?;
                let mut snap = Snapshot::default();
                snap.set_metadata(meta.clone());
                snap.set_data(d.encode().into());
                Ok(snap)
            }
            // The driver makes a newer one from the state machine; raft asks again later.
            _ => Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            )),
        }
    }
}

#[cfg(test)]
#[path = "storage_tests.rs"]
pub(crate) mod tests;
