//! Snapshot files: the state machine as of one log index, in one self-checking file that is
//! written as a stream (by a forked child, without the whole state in memory), sent to a
//! follower as it is, chunk by chunk, and installed by the follower under the same name.
//!
//! Owns the file's layout, its checks and the descriptor that raft messages carry in place of
//! the state. Must not decide when to snapshot (the driver does) or how a file travels (the
//! transport does).
//!
//! ```text
//! file    = "HFSN" | version u32 LE (2) | meta_len u32 LE | SnapshotMetadata protobuf
//!           | state bytes ... | state_len u64 LE | crc32c(every byte before it) u32 LE | "HFSE"
//! descriptor (a raft Snapshot's data field) = "HFSD" | file_len u64 LE | crc32c(whole file) u32 LE
//! ```
//!
//! The file's own trailer makes a torn or damaged file detectable when it is read back; the
//! descriptor lets a receiver check a transferred copy, byte for byte, before it is installed.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use protobuf::Message as PbMessage;
use raft::prelude::SnapshotMetadata;

use super::crc32c;

pub const FILE_MAGIC: &[u8; 4] = b"HFSN";
pub const FILE_VERSION: u32 = 2;
pub const TRAILER_MAGIC: &[u8; 4] = b"HFSE";
pub const DESCRIPTOR_MAGIC: &[u8; 4] = b"HFSD";
pub const DESCRIPTOR_LEN: usize = 16;
/// state_len + crc + magic.
pub const TRAILER_LEN: u64 = 16;
/// The largest metadata accepted (a configuration of a few voters is tens of bytes).
pub const MAX_META_LEN: u32 = 64 << 10;
/// The largest snapshot file accepted, made, sent or received: a lock service's whole state
/// (the item store defaults to 1 GiB) with room to spare.
pub const MAX_FILE_LEN: u64 = 16 << 30;

/// What a raft snapshot message carries instead of the state: the length and checksum of the
/// sender's snapshot file, which travels beside the message in chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    pub len: u64,
    pub crc: u32,
}

impl Descriptor {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(DESCRIPTOR_LEN);
        out.extend_from_slice(DESCRIPTOR_MAGIC);
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.crc.to_le_bytes());
        out
    }

    /// Hostile bytes: anything but a well-formed descriptor of a file within the cap is `None`.
    pub fn decode(data: &[u8]) -> Option<Descriptor> {
        if data.len() != DESCRIPTOR_LEN || &data[..4] != DESCRIPTOR_MAGIC {
            return None;
        }
        let len = u64::from_le_bytes(data[4..12].try_into().ok()?);
        let crc = u32::from_le_bytes(data[12..16].try_into().ok()?);
        (len <= MAX_FILE_LEN).then_some(Descriptor { len, crc })
    }
}

/// The file of the snapshot with metadata `meta` in data directory `dir`.
pub fn path(dir: &Path, meta: &SnapshotMetadata) -> PathBuf {
    path_of(dir, meta.index, meta.term)
}

/// The file of the snapshot at (`index`, `term`) in data directory `dir`.
pub fn path_of(dir: &Path, index: u64, term: u64) -> PathBuf {
    dir.join(format!("snap-{}-{}", index, term))
}

/// Where a transferred snapshot waits, checked against its descriptor and synced, until the
/// driver installs it (by renaming it to [`path`]).
pub fn received_path(dir: &Path, index: u64, term: u64) -> PathBuf {
    dir.join(format!("received-{}-{}", index, term))
}

/// Writes a snapshot file as a stream: the header at once, then the state through
/// [`Write`], then [`SnapshotWriter::finish`] writes the trailer and tells the descriptor.
pub struct SnapshotWriter<W: Write> {
    out: W,
    /// crc32c of every byte written so far (the file's own check).
    crc: u32,
    file_len: u64,
    state_len: u64,
}

impl<W: Write> SnapshotWriter<W> {
    pub fn new(mut out: W, meta: &SnapshotMetadata) -> io::Result<SnapshotWriter<W>> {
        let meta = meta.write_to_bytes().map_err(io::Error::other)?;
        let mut head = Vec::with_capacity(12 + meta.len());
        head.extend_from_slice(FILE_MAGIC);
        head.extend_from_slice(&FILE_VERSION.to_le_bytes());
        head.extend_from_slice(&(meta.len() as u32).to_le_bytes());
        head.extend_from_slice(&meta);
        out.write_all(&head)?;
        Ok(SnapshotWriter {
            out,
            crc: crc32c::extend(0, &head),
            file_len: head.len() as u64,
            state_len: 0,
        })
    }

    /// Writes the trailer and flushes; the caller syncs the file.
    pub fn finish(mut self) -> io::Result<(W, Descriptor)> {
        let mut tail = [0u8; TRAILER_LEN as usize];
        tail[..8].copy_from_slice(&self.state_len.to_le_bytes());
        let crc = crc32c::extend(self.crc, &tail[..8]);
        tail[8..12].copy_from_slice(&crc.to_le_bytes());
        tail[12..].copy_from_slice(TRAILER_MAGIC);
        self.out.write_all(&tail)?;
        self.out.flush()?;
        let whole = crc32c::extend(crc, &tail[8..]);
        Ok((
            self.out,
            Descriptor {
                len: self.file_len + TRAILER_LEN,
                crc: whole,
            },
        ))
    }
}

impl<W: Write> Write for SnapshotWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.crc = crc32c::extend(self.crc, &buf[..n]);
        self.file_len += n as u64;
        self.state_len += n as u64;
        if self.file_len + TRAILER_LEN > MAX_FILE_LEN {
            return Err(io::Error::other("snapshot over the size cap"));
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Writes a whole snapshot file from bytes in memory (a founder's first snapshot, tests).
pub fn write_file(path: &Path, meta: &SnapshotMetadata, state: &[u8]) -> io::Result<Descriptor> {
    let f = File::create(path)?;
    let mut w = SnapshotWriter::new(BufWriter::with_capacity(1 << 20, f), meta)?;
    w.write_all(state)?;
    let (out, d) = w.finish()?;
    out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok(d)
}

/// Why a snapshot file could not be read.
#[derive(Debug)]
pub enum ReadError {
    Io(io::Error),
    Corrupt(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Corrupt(why) => write!(f, "{why}"),
        }
    }
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> ReadError {
        ReadError::Io(e)
    }
}

/// A snapshot file checked from end to end: its metadata, descriptor and where its state is.
#[derive(Debug, Clone)]
pub struct Checked {
    pub meta: SnapshotMetadata,
    pub descriptor: Descriptor,
    /// Byte offset of the state in the file.
    pub state_at: u64,
    pub state_len: u64,
}

/// Reads the file at `path` once, as a stream, and checks its layout and checksum (hostile
/// bytes: an error, never a panic or an allocation beyond the metadata's cap).
pub fn check(path: &Path) -> Result<Checked, ReadError> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    let corrupt = |why: &str| ReadError::Corrupt(format!("{}: {why}", path.display()));
    if len > MAX_FILE_LEN {
        return Err(corrupt("over the size cap"));
    }
    let mut head = [0u8; 12];
    f.read_exact(&mut head)
        .map_err(|_| corrupt("truncated header"))?;
    if &head[..4] != FILE_MAGIC {
        return Err(corrupt("not a snapshot file"));
    }
    let version = u32::from_le_bytes(head[4..8].try_into().unwrap_or_default());
    if version != FILE_VERSION {
        return Err(corrupt(&format!("version {version} unknown")));
    }
    let meta_len = u32::from_le_bytes(head[8..12].try_into().unwrap_or_default());
    if meta_len > MAX_META_LEN || 12 + meta_len as u64 + TRAILER_LEN > len {
        return Err(corrupt("metadata length out of range"));
    }
    let mut meta = vec![0u8; meta_len as usize];
    f.read_exact(&mut meta)
        .map_err(|_| corrupt("truncated metadata"))?;
    let mut crc = crc32c::extend(crc32c::extend(0, &head), &meta);
    let meta = SnapshotMetadata::parse_from_bytes(&meta).map_err(|_| corrupt("bad metadata"))?;
    let state_at = 12 + meta_len as u64;
    let state_len = len - state_at - TRAILER_LEN;
    let mut left = state_len;
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        f.read_exact(&mut buf[..n])
            .map_err(|_| corrupt("truncated state"))?;
        crc = crc32c::extend(crc, &buf[..n]);
        left -= n as u64;
    }
    let mut tail = [0u8; TRAILER_LEN as usize];
    f.read_exact(&mut tail)
        .map_err(|_| corrupt("truncated trailer"))?;
    let said_len = u64::from_le_bytes(tail[..8].try_into().unwrap_or_default());
    crc = crc32c::extend(crc, &tail[..8]);
    let said_crc = u32::from_le_bytes(tail[8..12].try_into().unwrap_or_default());
    if &tail[12..] != TRAILER_MAGIC || said_len != state_len || said_crc != crc {
        return Err(corrupt("checksum or trailer mismatch"));
    }
    Ok(Checked {
        meta,
        descriptor: Descriptor {
            len,
            crc: crc32c::extend(crc, &tail[8..]),
        },
        state_at,
        state_len,
    })
}

/// The state bytes of a file that [`check`] accepted, read into memory.
pub fn read_state(path: &Path, checked: &Checked) -> Result<Vec<u8>, ReadError> {
    use std::io::{Seek, SeekFrom};
    let mut f = File::open(path)?;
    f.seek(SeekFrom::Start(checked.state_at))?;
    let mut state = Vec::new();
    state
        .try_reserve_exact(checked.state_len as usize)
        .map_err(|_| ReadError::Corrupt("no memory for the snapshot's state".into()))?;
    (&mut f).take(checked.state_len).read_to_end(&mut state)?;
    if state.len() as u64 != checked.state_len {
        return Err(ReadError::Corrupt(format!(
            "{}: shorter than when checked",
            path.display()
        )));
    }
    Ok(state)
}

/// The state bytes of a checked snapshot file, mapped rather than read: the pages are the page
/// cache's, which the kernel may drop and read again, so installing a large snapshot does not
/// hold a second anonymous copy of it beside the state being built.
pub struct MappedState {
    base: *mut libc::c_void,
    map_len: usize,
    at: usize,
    len: usize,
}

// SAFETY: the mapping is read-only and private to this value; nothing else aliases it mutably.
unsafe impl Send for MappedState {}

impl MappedState {
    /// Maps the state of the file at `path`, which [`check`] accepted as `checked`.
    pub fn open(path: &Path, checked: &Checked) -> Result<MappedState, ReadError> {
        let f = File::open(path)?;
        let len = f.metadata()?.len();
        if len != checked.descriptor.len {
            return Err(ReadError::Corrupt(format!(
                "{}: changed since it was checked",
                path.display()
            )));
        }
        let map_len = usize::try_from(len).map_err(|_| ReadError::Corrupt("too large".into()))?;
        let (at, state_len) = (checked.state_at as usize, checked.state_len as usize);
        if map_len == 0 {
            return Err(ReadError::Corrupt("empty".into()));
        }
        use std::os::fd::AsRawFd;
        // SAFETY: maps `map_len` bytes of an open regular file read-only and private; the
        // mapping outlives the descriptor, and is unmapped on drop.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(ReadError::Io(io::Error::last_os_error()));
        }
        // SAFETY: advice on the mapping just made.
        unsafe { libc::madvise(base, map_len, libc::MADV_SEQUENTIAL) };
        Ok(MappedState {
            base,
            map_len,
            at,
            len: state_len,
        })
    }
}

impl MappedState {
    /// A handle that gives back to the kernel the pages of this mapping below an address
    /// (see [`crate::core::codec::release_as_read`]): they leave the process's RSS, and a later
    /// read of them maps them again from the page cache (the mapping is private and never
    /// written, so their bytes are the file's either way).
    pub fn releaser(&self) -> impl FnMut(usize) + 'static {
        let (base, end) = (self.base as usize, self.base as usize + self.map_len);
        let page = page_size();
        let mut done = base;
        move |at: usize| {
            let upto = at.min(end) / page * page;
            if upto > done {
                // SAFETY: advice on whole pages inside the mapping made in `open`; the mapping
                // is read-only and private, so dropping its pages loses nothing.
                unsafe {
                    libc::madvise(done as *mut libc::c_void, upto - done, libc::MADV_DONTNEED)
                };
                done = upto;
            }
        }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as usize
    } else {
        4096
    }
}

impl std::ops::Deref for MappedState {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `at + len <= map_len` (from `check`), within the live read-only mapping.
        unsafe { std::slice::from_raw_parts((self.base as *const u8).add(self.at), self.len) }
    }
}

impl Drop for MappedState {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `open`.
        unsafe { libc::munmap(self.base, self.map_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::storage::tests::TempDir;

    /// The RSS of this process's mapping that starts at `base`, in KiB (from /proc/self/smaps).
    fn mapping_rss_kib(base: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let start = format!("{base:x}-");
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&start));
        assert!(lines.next().is_some(), "no mapping at {start}");
        let rss = lines.find(|l| l.starts_with("Rss:")).unwrap();
        rss.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Released pages leave the RSS, and what is read again is still the file's bytes.
    #[test]
    fn released_pages_leave_the_rss_and_read_back_the_same() {
        let dir = TempDir::new("release");
        let p = dir.0.join("snap");
        let state: Vec<u8> = (0..16u32 << 20).map(|i| (i % 253) as u8).collect();
        write_file(&p, &meta(5, 1), &state).unwrap();
        let c = check(&p).unwrap();
        let m = MappedState::open(&p, &c).unwrap();
        let sum: u64 = m.iter().map(|&b| u64::from(b)).sum();
        let base = m.base as usize;
        assert!(
            mapping_rss_kib(base) >= 15 << 10,
            "all read: {} KiB",
            mapping_rss_kib(base)
        );
        let mut release = m.releaser();
        release(base + (8 << 20));
        let half = mapping_rss_kib(base);
        assert!(
            (7 << 10..=9 << 10).contains(&half),
            "half released: {half} KiB"
        );
        release(usize::MAX);
        assert!(
            mapping_rss_kib(base) <= 8,
            "all released: {} KiB",
            mapping_rss_kib(base)
        );
        assert_eq!(m.iter().map(|&b| u64::from(b)).sum::<u64>(), sum);
        assert_eq!(&*m, &state[..]);
    }

    fn meta(index: u64, term: u64) -> SnapshotMetadata {
        let mut m = SnapshotMetadata {
            index,
            term,
            ..Default::default()
        };
        m.mut_conf_state().voters = vec![1, 2, 3];
        m
    }

    #[test]
    fn a_written_file_checks_and_reads_back() {
        let dir = TempDir::new("snapfile");
        let p = path(&dir.0, &meta(7, 2));
        let state: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7) as u8).collect();
        let d = write_file(&p, &meta(7, 2), &state).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(d.len, bytes.len() as u64);
        assert_eq!(d.crc, crc32c::checksum(&bytes));
        let c = check(&p).unwrap();
        assert_eq!(c.descriptor, d);
        assert_eq!((c.meta.index, c.meta.term), (7, 2));
        assert_eq!(c.meta.get_conf_state().voters, vec![1, 2, 3]);
        assert_eq!(read_state(&p, &c).unwrap(), state);
        assert_eq!(&*MappedState::open(&p, &c).unwrap(), &state[..]);
        assert_eq!(Descriptor::decode(&d.encode()), Some(d));
    }

    #[test]
    fn every_truncation_and_flipped_byte_is_refused() {
        let dir = TempDir::new("snapfile-bad");
        let p = path(&dir.0, &meta(3, 1));
        write_file(&p, &meta(3, 1), b"some state bytes").unwrap();
        let good = std::fs::read(&p).unwrap();
        let bad = dir.0.join("bad");
        for cut in 0..good.len() {
            std::fs::write(&bad, &good[..cut]).unwrap();
            assert!(check(&bad).is_err(), "a file cut at {cut} was accepted");
        }
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 0x10;
            std::fs::write(&bad, &b).unwrap();
            assert!(check(&bad).is_err(), "a flip at {i} was accepted");
        }
    }

    #[test]
    fn descriptors_out_of_shape_are_refused() {
        let d = Descriptor { len: 10, crc: 5 }.encode();
        assert!(Descriptor::decode(&d[..15]).is_none());
        let mut wrong = d.clone();
        wrong[0] = b'X';
        assert!(Descriptor::decode(&wrong).is_none());
        let huge = Descriptor {
            len: MAX_FILE_LEN + 1,
            crc: 0,
        }
        .encode();
        assert!(Descriptor::decode(&huge).is_none());
    }
}
