use std::sync::atomic::{AtomicU64, Ordering};

use raft::prelude::{ConfState, Entry, HardState, Snapshot};
use raft::storage::MemStorage;
use raft::{GetEntriesContext, Storage};

use super::*;
use crate::rng::Rng;

/// A fresh directory under the system's temporary directory, removed on drop.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new(what: &str) -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!(
            "holdfast-raftlog-{}-{}-{}",
            std::process::id(),
            what,
            n
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn entry(index: u64, term: u64, data: &[u8]) -> Entry {
    Entry {
        index,
        term,
        data: data.to_vec().into(),
        ..Default::default()
    }
}

fn hs(term: u64, vote: u64, commit: u64) -> HardState {
    HardState {
        term,
        vote,
        commit,
        ..Default::default()
    }
}

fn all_entries(s: &DiskStorage) -> Vec<Entry> {
    let (lo, hi) = (s.first_index().unwrap(), s.last_index().unwrap() + 1);
    if lo == hi {
        return Vec::new();
    }
    s.entries(lo, hi, None, GetEntriesContext::empty(false))
        .unwrap()
}

fn only_log(dir: &Path) -> PathBuf {
    let logs: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with("log."))
        .collect();
    assert_eq!(logs.len(), 1, "{:?}", logs);
    logs[0].clone()
}

/// Five entries, a hard state, then a sixth entry: returns the log bytes and the offset where
/// the last write (entry 6 + its hard state) begins.
fn five_then_one(dir: &Path) -> (Vec<u8>, usize) {
    let mut s = DiskStorage::open(dir).unwrap();
    s.initialize_with_conf_state(ConfState::from((vec![1, 2, 3], vec![])))
        .unwrap();
    let ents: Vec<Entry> = (1..=5)
        .map(|i| entry(i, 1, format!("op{}", i).as_bytes()))
        .collect();
    s.append(&ents).unwrap();
    s.set_hard_state(&hs(1, 2, 3)).unwrap();
    s.sync().unwrap();
    let before = s.log_file_len() as usize;
    s.append(&[entry(6, 1, b"the last one")]).unwrap();
    s.set_hard_state(&hs(1, 2, 6)).unwrap();
    s.sync().unwrap();
    drop(s);
    (fs::read(only_log(dir)).unwrap(), before)
}

#[test]
fn a_crash_at_every_byte_of_the_last_write_recovers_a_prefix() {
    let d = TempDir::new("torn");
    let (bytes, before) = five_then_one(&d.0);
    let log = only_log(&d.0);
    for cut in before..=bytes.len() {
        for zero_fill in [false, true] {
            let mut damaged = bytes[..cut].to_vec();
            if zero_fill {
                damaged.resize(bytes.len(), 0);
            }
            fs::write(&log, &damaged).unwrap();
            let s = DiskStorage::open(&d.0)
                .unwrap_or_else(|e| panic!("cut {} zero {}: {}", cut, zero_fill, e));
            let ents = all_entries(&s);
            assert!(
                ents.len() == 5 || ents.len() == 6,
                "cut {}: {} entries",
                cut,
                ents.len()
            );
            for (i, e) in ents.iter().enumerate() {
                assert_eq!(e.index, i as u64 + 1);
            }
            let commit = s.initial_state().unwrap().hard_state.commit;
            assert!(
                commit == 3 || (commit == 6 && ents.len() == 6),
                "cut {}: commit {}",
                cut,
                commit
            );
            if cut == bytes.len() {
                assert_eq!((ents.len(), commit), (6, 6));
            }
            // The torn tail is gone from the file: appending after recovery is clean.
            drop(s);
            let mut s = DiskStorage::open(&d.0).unwrap();
            let next = s.last_index().unwrap() + 1;
            s.append(&[entry(next, 1, b"after")]).unwrap();
            s.sync().unwrap();
            drop(s);
            let s = DiskStorage::open(&d.0).unwrap();
            assert_eq!(s.last_index().unwrap(), next, "cut {}", cut);
        }
    }
}

#[test]
fn damage_before_the_last_write_is_an_error_not_a_loss() {
    let d = TempDir::new("corrupt");
    let (bytes, before) = five_then_one(&d.0);
    let log = only_log(&d.0);
    // Every byte of every record but the last write, the file header included.
    for at in 0..before {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x5a;
        fs::write(&log, &damaged).unwrap();
        match DiskStorage::open(&d.0) {
            Err(LogError::Corrupt { offset, .. }) => assert!(offset as usize <= at, "at {}", at),
            Err(e) => panic!("at {}: {}", at, e),
            Ok(_) => panic!("damage at byte {} went unnoticed", at),
        }
    }
}

#[test]
fn a_damaged_hard_state_is_an_error_with_a_clear_message() {
    let d = TempDir::new("hs");
    let mut s = DiskStorage::open(&d.0).unwrap();
    s.set_hard_state(&hs(7, 3, 0)).unwrap();
    s.sync().unwrap();
    let hs_at = s.log_file_len() as usize;
    s.set_hard_state(&hs(8, 1, 0)).unwrap();
    s.append(&[entry(1, 8, b"x")]).unwrap();
    s.sync().unwrap();
    drop(s);
    let log = only_log(&d.0);
    let mut bytes = fs::read(&log).unwrap();
    bytes[hs_at + RECORD_HEADER_LEN + 2] ^= 1;
    fs::write(&log, &bytes).unwrap();
    let err = DiskStorage::open(&d.0)
        .err()
        .expect("a damaged vote must not be skipped");
    let msg = err.to_string();
    assert!(
        msg.contains("corrupt at byte") && msg.contains("checksum"),
        "{}",
        msg
    );
}

#[test]
fn a_huge_record_length_is_refused_without_allocating_it() {
    for len in [MAX_RECORD_LEN as u32 + 1, u32::MAX] {
        let d = TempDir::new("huge");
        drop(DiskStorage::open(&d.0).unwrap());
        let log = only_log(&d.0);
        let mut bytes = fs::read(&log).unwrap();
        let mut head = [0u8; RECORD_HEADER_LEN];
        head[..4].copy_from_slice(&len.to_le_bytes());
        let crc = crc32c::checksum(&head[..8]);
        head[8..].copy_from_slice(&crc.to_le_bytes());
        bytes.extend_from_slice(&head);
        bytes.extend_from_slice(&[1u8; 100]);
        fs::write(&log, &bytes).unwrap();
        let err = DiskStorage::open(&d.0).err().expect("refused");
        assert!(err.to_string().contains("record length"), "{}", err);
    }
}

#[test]
fn a_foreign_file_is_not_a_log() {
    let d = TempDir::new("magic");
    fs::write(d.0.join("log.1"), b"GIF89a and so on").unwrap();
    let err = DiskStorage::open(&d.0).err().expect("refused");
    assert!(
        err.to_string().contains("not a holdfast raft log"),
        "{}",
        err
    );
}

#[test]
fn a_new_leaders_conflicting_suffix_replaces_ours_durably() {
    let d = TempDir::new("conflict");
    let mut s = DiskStorage::open(&d.0).unwrap();
    s.append(&(1..=6).map(|i| entry(i, 1, b"old")).collect::<Vec<_>>())
        .unwrap();
    s.sync().unwrap();
    s.append(&[entry(4, 2, b"new4"), entry(5, 2, b"new5")])
        .unwrap();
    s.sync().unwrap();
    drop(s);
    let s = DiskStorage::open(&d.0).unwrap();
    let terms: Vec<u64> = all_entries(&s).iter().map(|e| e.term).collect();
    assert_eq!(terms, vec![1, 1, 1, 2, 2]);
    assert_eq!(s.term(5).unwrap(), 2);
}

#[test]
fn unsynced_writes_are_lost_and_synced_ones_kept() {
    let d = TempDir::new("unsynced");
    let mut s = DiskStorage::open(&d.0).unwrap();
    s.append(&[entry(1, 1, b"a")]).unwrap();
    s.sync().unwrap();
    s.append(&[entry(2, 1, b"b")]).unwrap();
    assert!(s.unsynced_bytes() > 0);
    drop(s); // a crash: the pending buffer never reached the file
    let s = DiskStorage::open(&d.0).unwrap();
    assert_eq!(s.last_index().unwrap(), 1);
}

#[test]
fn snapshots_survive_reopen_and_a_damaged_snapshot_file_is_an_error() {
    let d = TempDir::new("snap");
    let mut s = DiskStorage::open(&d.0).unwrap();
    let cs = ConfState::from((vec![1, 2, 3], vec![]));
    s.initialize_with_conf_state(cs.clone()).unwrap();
    s.append(&(1..=10).map(|i| entry(i, 2, b"e")).collect::<Vec<_>>())
        .unwrap();
    s.set_hard_state(&hs(2, 1, 8)).unwrap();
    s.create_snapshot(8, cs.clone(), b"state at 8".to_vec())
        .unwrap();
    s.compact(7).unwrap();
    s.sync().unwrap();
    drop(s);
    let s = DiskStorage::open(&d.0).unwrap();
    assert_eq!(s.first_index().unwrap(), 7);
    assert_eq!(s.term(6).unwrap(), 2);
    assert!(matches!(
        s.term(5),
        Err(raft::Error::Store(StorageError::Compacted))
    ));
    let snap = s.snapshot(8, 2).unwrap();
    assert_eq!(
        (snap.get_metadata().index, snap.get_metadata().term),
        (8, 2)
    );
    // Messages carry the file's descriptor; the state is in the file.
    assert_eq!(
        crate::cluster::snapfile::Descriptor::decode(snap.get_data()),
        s.snapshot_descriptor()
    );
    assert_eq!(s.snapshot_state().unwrap(), b"state at 8");
    assert!(matches!(
        s.snapshot(9, 2),
        Err(raft::Error::Store(
            StorageError::SnapshotTemporarilyUnavailable
        ))
    ));
    drop(s);
    let snap_file = d.0.join("snap-8-2");
    let mut bytes = fs::read(&snap_file).unwrap();
    let n = bytes.len();
    bytes[n - 3] ^= 0xff;
    fs::write(&snap_file, &bytes).unwrap();
    let err = DiskStorage::open(&d.0)
        .err()
        .expect("damaged snapshot refused");
    assert!(err.to_string().contains("snap-8-2"), "{}", err);
    fs::remove_file(&snap_file).unwrap();
    assert!(
        DiskStorage::open(&d.0).is_err(),
        "a missing snapshot file is refused"
    );
}

#[test]
fn installing_a_leaders_snapshot_replaces_the_log() {
    let d = TempDir::new("install");
    let mut s = DiskStorage::open(&d.0).unwrap();
    s.append(&(1..=3).map(|i| entry(i, 1, b"e")).collect::<Vec<_>>())
        .unwrap();
    let mut snap = Snapshot::default();
    snap.mut_metadata().index = 20;
    snap.mut_metadata().term = 4;
    snap.mut_metadata()
        .set_conf_state(ConfState::from((vec![1, 2, 3, 4], vec![])));
    snap.set_data(b"leader state".to_vec().into());
    s.apply_snapshot(&snap).unwrap();
    s.sync().unwrap();
    drop(s);
    let s = DiskStorage::open(&d.0).unwrap();
    assert_eq!(
        (s.first_index().unwrap(), s.last_index().unwrap()),
        (21, 20)
    );
    assert_eq!(s.term(20).unwrap(), 4);
    let st = s.initial_state().unwrap();
    assert_eq!(st.hard_state.commit, 20);
    assert_eq!(st.conf_state.voters, vec![1, 2, 3, 4]);
    assert_eq!(s.snapshot_state().unwrap(), b"leader state");
}

/// A leader's snapshot whose data is a descriptor is the file the transport received: it is
/// renamed into place (not copied), and a missing one is an error that leaves the log as it was.
#[test]
fn a_received_snapshot_file_is_installed_in_place() {
    use crate::cluster::snapfile;
    let d = TempDir::new("received");
    let mut s = DiskStorage::open(&d.0).unwrap();
    s.append(&(1..=3).map(|i| entry(i, 1, b"e")).collect::<Vec<_>>())
        .unwrap();
    let mut snap = Snapshot::default();
    snap.mut_metadata().index = 30;
    snap.mut_metadata().term = 5;
    snap.mut_metadata()
        .set_conf_state(ConfState::from((vec![1, 2, 3], vec![])));
    let received = snapfile::received_path(&d.0, 30, 5);
    let desc = snapfile::write_file(&received, snap.get_metadata(), b"sent state").unwrap();
    snap.set_data(desc.encode().into());
    let mut other = snap.clone();
    other.mut_metadata().index = 31;
    assert!(s.apply_snapshot(&other).is_err(), "no file was received");
    assert_eq!(s.last_index().unwrap(), 3);
    s.apply_snapshot(&snap).unwrap();
    s.sync().unwrap();
    assert!(!received.exists());
    assert_eq!(s.snapshot_descriptor(), Some(desc));
    drop(s);
    let s = DiskStorage::open(&d.0).unwrap();
    assert_eq!(s.snapshot_state().unwrap(), b"sent state");
    assert_eq!(
        snapfile::Descriptor::decode(s.snapshot(30, 1).unwrap().get_data()),
        Some(desc)
    );
}

/// A log that grows is cut into segments and no entry is written twice: a segment once sealed
/// is never rewritten, only deleted once every entry in it is compacted; the new segment starts
/// with the state's records, so the log reopens the same from what is left.
#[test]
fn a_growing_log_rolls_into_segments_and_compaction_deletes_them_without_copying() {
    let d = TempDir::new("growing");
    let mut s = DiskStorage::open(&d.0).unwrap();
    let big = vec![7u8; 64 << 10];
    let mut written = 0u64;
    for i in 1..=800u64 {
        s.append(&[entry(i, 1, &big)]).unwrap();
        s.set_hard_state(&hs(1, 1, i)).unwrap();
        let before = s.log_file_len();
        s.sync().unwrap();
        written += s.log_file_len().saturating_sub(before);
    }
    let segments = s.segments();
    assert!(segments >= 3, "{segments} segments after 50 MiB");
    let on_disk: u64 = fs::read_dir(&d.0)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("log."))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    // Each entry once (and a few hundred bytes per segment of restated state).
    assert!(on_disk < 800 * ((64 << 10) + 100) + segments as u64 * 1024);
    assert!(written <= on_disk);
    s.create_snapshot(790, ConfState::from((vec![1], vec![])), b"s".to_vec())
        .unwrap();
    let upto = s.compaction_keeping(790, 1_000, 256 << 10);
    assert_eq!(
        upto, 788,
        "keeps the 3 entries of 64 KiB that fit in 256 KiB"
    );
    s.compact(upto).unwrap();
    s.sync().unwrap();
    assert_eq!(s.segments(), 1, "every sealed segment was compacted away");
    let logs: Vec<String> = fs::read_dir(&d.0)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("log."))
        .collect();
    assert_eq!(logs.len(), 1, "{logs:?}");
    drop(s);
    let s = DiskStorage::open(&d.0).unwrap();
    assert_eq!(s.first_index().unwrap(), 788);
    assert_eq!(s.last_index().unwrap(), 800);
    assert_eq!(s.hard_state().commit, 800);
    assert_eq!(s.snapshot_state().unwrap(), b"s");
}

/// The segments left after a compaction may begin past the compaction point that the later
/// ones restate in their heads (the point of their start): the log reopens, with what is left.
/// (Found by the cluster soak: a node that restarted then refused its own log.)
#[test]
fn segments_left_after_a_compaction_reopen_whatever_point_their_heads_restate() {
    let d = TempDir::new("restated");
    let mut s = DiskStorage::open(&d.0).unwrap();
    let big = vec![9u8; 64 << 10];
    let cs = || ConfState::from((vec![1], vec![]));
    for i in 1..=1200u64 {
        s.append(&[entry(i, 1, &big)]).unwrap();
        s.set_hard_state(&hs(1, 1, i)).unwrap();
        if i == 100 {
            s.create_snapshot(100, cs(), b"early".to_vec()).unwrap();
            s.compact(60).unwrap();
        }
        s.sync().unwrap();
    }
    // Segments of 16 MiB hold about 250 entries: compacting to 700 leaves some that start
    // after 60, whose heads (rolled before this compaction) restate 60.
    s.create_snapshot(1100, cs(), b"late".to_vec()).unwrap();
    s.compact(700).unwrap();
    s.sync().unwrap();
    assert!(s.segments() >= 3, "{} segments", s.segments());
    drop(s);
    let s = DiskStorage::open(&d.0).unwrap();
    assert_eq!(s.first_index().unwrap(), 700);
    assert_eq!(s.last_index().unwrap(), 1200);
    assert_eq!(s.snapshot_state().unwrap(), b"late");
    drop(s);
    let s = DiskStorage::open(&d.0).unwrap();
    assert_eq!(s.first_index().unwrap(), 700);
}

/// A compaction exactly at a segment's boundary deletes the segments before it: the replay
/// then begins at that point without knowing its term, which the compaction's record gives.
#[test]
fn a_compaction_at_a_segment_boundary_reopens() {
    let d = TempDir::new("boundary");
    let mut s = DiskStorage::open(&d.0).unwrap();
    let big = vec![4u8; 64 << 10];
    let mut boundary = None;
    for i in 1..=700u64 {
        let segments = s.segments();
        s.append(&[entry(i, 3, &big)]).unwrap();
        s.set_hard_state(&hs(3, 1, i)).unwrap();
        s.sync().unwrap();
        if s.segments() > segments && boundary.is_none() && i > 300 {
            boundary = Some(i);
        }
    }
    let boundary = boundary.expect("a segment sealed after entry 300");
    s.create_snapshot(600, ConfState::from((vec![1], vec![])), b"at 600".to_vec())
        .unwrap();
    s.compact(boundary + 1).unwrap();
    s.sync().unwrap();
    drop(s);
    for _ in 0..2 {
        let s = DiskStorage::open(&d.0).unwrap();
        assert_eq!(s.first_index().unwrap(), boundary + 1);
        assert_eq!(s.term(boundary).unwrap(), 3);
        assert_eq!(s.last_index().unwrap(), 700);
    }
}

/// Segments survive reopening at any point: all of them are replayed in order, the newest
/// may end torn, a new segment whose header never landed is ignored, and a sealed segment
/// that ends torn is an error (a segment is synced before the next starts).
#[test]
fn segments_reopen_in_order_and_only_the_newest_may_be_torn() {
    let d = TempDir::new("segments");
    let mut s = DiskStorage::open(&d.0).unwrap();
    let big = vec![5u8; 64 << 10];
    for i in 1..=600u64 {
        s.append(&[entry(i, 1, &big)]).unwrap();
        s.set_hard_state(&hs(1, 1, i)).unwrap();
        s.sync().unwrap();
    }
    assert!(s.segments() >= 2);
    drop(s);
    let s = DiskStorage::open(&d.0).unwrap();
    assert_eq!(
        (s.first_index().unwrap(), s.last_index().unwrap()),
        (1, 600)
    );
    let gens = |dir: &std::path::Path| {
        let mut g: Vec<u64> = fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                e.file_name()
                    .to_string_lossy()
                    .strip_prefix("log.")
                    .and_then(|g| g.parse().ok())
            })
            .collect();
        g.sort_unstable();
        g
    };
    drop(s);
    // A segment being started when the node stopped: no header yet, or zeros.
    let all = gens(&d.0);
    let next = d.0.join(format!("log.{}", all.last().unwrap() + 1));
    fs::write(&next, [0u8; 5]).unwrap();
    let s = DiskStorage::open(&d.0).unwrap();
    assert_eq!(s.last_index().unwrap(), 600);
    assert!(!next.exists());
    drop(s);
    fs::write(&next, [0u8; 64]).unwrap();
    let s = DiskStorage::open(&d.0).unwrap();
    assert_eq!(s.last_index().unwrap(), 600);
    drop(s);
    // A sealed segment whose entries are still live, lost: an error, not a shorter log.
    let oldest = d.0.join(format!("log.{}", gens(&d.0)[0]));
    let kept = fs::read(&oldest).unwrap();
    fs::remove_file(&oldest).unwrap();
    let err = DiskStorage::open(&d.0).err().expect("a lost segment");
    assert!(err.to_string().contains("missing"), "{err}");
    fs::write(&oldest, kept).unwrap();
    // A sealed segment cut short is damage, not a torn tail.
    let first = d.0.join(format!("log.{}", gens(&d.0)[0]));
    let len = fs::metadata(&first).unwrap().len();
    let f = OpenOptions::new().write(true).open(&first).unwrap();
    f.set_len(len - 10).unwrap();
    drop(f);
    let err = DiskStorage::open(&d.0)
        .err()
        .expect("a torn sealed segment");
    assert!(err.to_string().contains("sealed segment"), "{err}");
}

/// The owner writes, the node's sync thread syncs: a write leaves nothing pending, its
/// handle syncs from another thread (also a handle of a segment sealed since), and the log
/// reopens with every synced entry.
#[test]
fn a_write_is_synced_from_another_thread_across_segments() {
    let d = TempDir::new("written");
    let mut s = DiskStorage::open(&d.0).unwrap();
    s.append(&[entry(1, 1, b"a")]).unwrap();
    let first = s.write().unwrap();
    assert_eq!(s.unsynced_bytes(), 0);
    let payload = vec![3u8; 64 << 10];
    for i in 2..=400u64 {
        s.append(&[entry(i, 1, &payload)]).unwrap();
        s.set_hard_state(&hs(1, 1, i)).unwrap();
        if i % 20 == 0 {
            s.create_snapshot(i, ConfState::from((vec![1], vec![])), vec![1; 100])
                .unwrap();
            s.compact(i).unwrap();
        }
        let log = s.write().unwrap();
        std::thread::spawn(move || log.sync())
            .join()
            .unwrap()
            .unwrap();
    }
    assert!(s.segments() >= 1);
    // The first handle names a segment sealed since: syncing it is harmless.
    first.sync().unwrap();
    drop(s);
    let s = DiskStorage::open(&d.0).unwrap();
    assert_eq!(s.last_index().unwrap(), 400);
    assert_eq!(s.hard_state().commit, 400);
}

#[test]
fn compaction_keeps_the_directory_bounded() {
    let d = TempDir::new("bounded");
    let mut s = DiskStorage::open(&d.0).unwrap();
    let payload = vec![7u8; 4096];
    let mut max_dir = 0u64;
    for i in 1..=6000u64 {
        s.append(&[entry(i, 1, &payload)]).unwrap();
        s.set_hard_state(&hs(1, 1, i)).unwrap();
        if i % 500 == 0 {
            s.create_snapshot(i, ConfState::from((vec![1], vec![])), vec![i as u8; 10_000])
                .unwrap();
            s.compact(i - 100).unwrap();
        }
        s.sync().unwrap();
        let size: u64 = fs::read_dir(&d.0)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        max_dir = max_dir.max(size);
    }
    // ~24 MiB went through the log; live data is at most ~600 entries of 4 KiB.
    assert!(
        max_dir < SEGMENT_BYTES + (4 << 20),
        "directory grew to {} bytes",
        max_dir
    );
    let names: Vec<String> = fs::read_dir(&d.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        names.iter().filter(|n| n.starts_with("snap-")).count(),
        1,
        "{:?}",
        names
    );
    drop(s);
    let s = DiskStorage::open(&d.0).unwrap();
    assert_eq!(s.last_index().unwrap(), 6000);
    assert_eq!(s.first_index().unwrap(), 5900);
}

/// Random appends (with conflicts), hard states, compactions and snapshots, applied to the disk
/// log and to raft-rs's MemStorage; after every few steps the disk log is synced, reopened and
/// must answer every Storage question as MemStorage does.
#[test]
fn random_operations_match_memstorage_across_reopens() {
    for seed in 0..12u64 {
        let d = TempDir::new("model");
        let mut rng = Rng::new(seed);
        let mem = MemStorage::new();
        let mut disk = DiskStorage::open(&d.0).unwrap();
        let mut term = 1u64;
        for step in 0..300 {
            let last = mem.last_index().unwrap();
            let first = mem.first_index().unwrap();
            // As raft does: the commit index never goes back and committed entries never change.
            let commit = mem.initial_state().unwrap().hard_state.commit;
            match rng.below(10) {
                0..=4 => {
                    // Append at a random point in [first, last+1], sometimes under a new term.
                    if rng.chance(20) {
                        term += 1;
                    }
                    let lowest = first.max(commit + 1);
                    let at = lowest + rng.below(last + 2 - lowest);
                    let n = 1 + rng.below(4);
                    let ents: Vec<Entry> = (at..at + n)
                        .map(|i| entry(i, term, &rng.bytes(40)))
                        .collect();
                    mem.wl().append(&ents).unwrap();
                    disk.append(&ents).unwrap();
                }
                5 | 6 => {
                    let h = hs(term, rng.below(4), commit + rng.below(last + 1 - commit));
                    mem.wl().set_hardstate(h.clone());
                    disk.set_hard_state(&h).unwrap();
                }
                7 => {
                    // MemStorage cannot compact its last entry away; raft never asks it to.
                    let top = commit.min(last);
                    if top >= first {
                        let to = first + rng.below(top + 1 - first);
                        mem.wl().compact(to).unwrap();
                        disk.compact(to).unwrap();
                    }
                }
                8 => {
                    // A leader's snapshot ahead of our log.
                    let mut snap = Snapshot::default();
                    let idx = last + 1 + rng.below(5);
                    term += 1;
                    snap.mut_metadata().index = idx;
                    snap.mut_metadata().term = term;
                    snap.mut_metadata()
                        .set_conf_state(ConfState::from((vec![1, 2, 3], vec![])));
                    snap.set_data(rng.bytes(100).into());
                    mem.wl().apply_snapshot(snap.clone()).unwrap();
                    disk.apply_snapshot(&snap).unwrap();
                }
                _ => {
                    let cs = ConfState::from((vec![1, 2, 3 + rng.below(3)], vec![]));
                    mem.wl().set_conf_state(cs.clone());
                    disk.set_conf_state(cs).unwrap();
                }
            }
            if rng.chance(30) {
                disk.sync().unwrap();
                drop(disk);
                disk = DiskStorage::open(&d.0)
                    .unwrap_or_else(|e| panic!("seed {} step {}: {}", seed, step, e));
            }
            let ctx = format!("seed {} step {}", seed, step);
            assert_eq!(
                disk.first_index().unwrap(),
                mem.first_index().unwrap(),
                "{}",
                ctx
            );
            assert_eq!(
                disk.last_index().unwrap(),
                mem.last_index().unwrap(),
                "{}",
                ctx
            );
            let (ds, ms) = (disk.initial_state().unwrap(), mem.initial_state().unwrap());
            assert_eq!(ds.hard_state, ms.hard_state, "{}", ctx);
            assert_eq!(ds.conf_state, ms.conf_state, "{}", ctx);
            let (lo, hi) = (mem.first_index().unwrap(), mem.last_index().unwrap());
            // MemStorage forgets the term before its first entry after a compaction; ours keeps it.
            if let Ok(t) = mem.term(lo - 1) {
                assert_eq!(disk.term(lo - 1).unwrap(), t, "{} term({})", ctx, lo - 1);
            }
            for i in lo..=hi {
                assert_eq!(disk.term(i).ok(), mem.term(i).ok(), "{} term({})", ctx, i);
            }
            if lo <= hi {
                let max = rng.below(200);
                let a = disk
                    .entries(lo, hi + 1, max, GetEntriesContext::empty(false))
                    .unwrap();
                let b = mem
                    .entries(lo, hi + 1, max, GetEntriesContext::empty(false))
                    .unwrap();
                assert_eq!(a, b, "{}", ctx);
            }
        }
    }
}

/// Three raft-rs nodes on disk logs, messages passed by hand: they elect a leader, commit
/// proposals, snapshot and compact, then every node restarts from its directory alone and the
/// cluster carries on from where it was.
#[test]
fn raft_nodes_on_disk_logs_commit_and_survive_a_full_restart() {
    use raft::prelude::Message;
    use raft::{Config, RawNode, StateRole};

    let dirs: Vec<TempDir> = (0..3).map(|_| TempDir::new("raft")).collect();
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let start = |i: usize, fresh: bool| {
        let mut s = DiskStorage::open(&dirs[i].0).unwrap();
        if fresh {
            s.initialize_with_conf_state(ConfState::from((vec![1, 2, 3], vec![])))
                .unwrap();
            s.sync().unwrap();
        }
        let applied = s.snapshot_metadata().map_or(0, |m| m.index);
        let cfg = Config {
            id: i as u64 + 1,
            election_tick: 10,
            heartbeat_tick: 1,
            pre_vote: true,
            check_quorum: true,
            applied,
            ..Default::default()
        };
        RawNode::new(&cfg, s, &logger).unwrap()
    };
    // Drives every node until quiet; returns the data of entries applied, per node.
    fn pump(nodes: &mut [RawNode<DiskStorage>], applied: &mut [Vec<Vec<u8>>]) {
        for _ in 0..200 {
            let mut mail: Vec<Message> = Vec::new();
            for (i, n) in nodes.iter_mut().enumerate() {
                if !n.has_ready() {
                    continue;
                }
                let mut rd = n.ready();
                mail.extend(rd.take_messages());
                if !rd.snapshot().is_empty() {
                    n.mut_store().apply_snapshot(rd.snapshot()).unwrap();
                }
                for e in rd.take_committed_entries() {
                    if !e.get_data().is_empty() {
                        applied[i].push(e.get_data().to_vec());
                    }
                }
                n.mut_store().append(rd.entries()).unwrap();
                if let Some(hs) = rd.hs() {
                    n.mut_store().set_hard_state(hs).unwrap();
                }
                n.mut_store().sync().unwrap();
                mail.extend(rd.take_persisted_messages());
                let mut light = n.advance(rd);
                if let Some(c) = light.commit_index() {
                    let mut hs = n.store().hard_state().clone();
                    hs.commit = c;
                    n.mut_store().set_hard_state(&hs).unwrap();
                    n.mut_store().sync().unwrap();
                }
                mail.extend(light.take_messages());
                for e in light.take_committed_entries() {
                    if !e.get_data().is_empty() {
                        applied[i].push(e.get_data().to_vec());
                    }
                }
                n.advance_apply();
            }
            if mail.is_empty() && nodes.iter().all(|n| !n.has_ready()) {
                return;
            }
            for m in mail {
                let to = m.to as usize - 1;
                let _ = nodes[to].step(m);
            }
        }
    }
    let mut nodes: Vec<RawNode<DiskStorage>> = (0..3).map(|i| start(i, true)).collect();
    let mut applied = vec![Vec::new(); 3];
    nodes[0].campaign().unwrap();
    pump(&mut nodes, &mut applied);
    assert_eq!(nodes[0].raft.state, StateRole::Leader);
    for k in 0..20u8 {
        nodes[0].propose(vec![], vec![b'a', k]).unwrap();
        pump(&mut nodes, &mut applied);
    }
    let want: Vec<Vec<u8>> = (0..20u8).map(|k| vec![b'a', k]).collect();
    assert_eq!(applied[0], want);
    // Heartbeats carry the commit index to followers.
    for _ in 0..3 {
        for n in nodes.iter_mut() {
            n.tick();
        }
        pump(&mut nodes, &mut applied);
    }
    assert!(
        applied.iter().all(|a| *a == want),
        "{:?}",
        applied.iter().map(|a| a.len()).collect::<Vec<_>>()
    );
    let last = nodes[0].raft.raft_log.last_index();
    let term = nodes[0].raft.term;
    // Node 1 snapshots and compacts what it applied.
    let commit = nodes[0].store().hard_state().commit;
    let s = nodes[0].mut_store();
    s.create_snapshot(
        commit,
        ConfState::from((vec![1, 2, 3], vec![])),
        b"app state".to_vec(),
    )
    .unwrap();
    s.compact(commit).unwrap();
    s.sync().unwrap();
    drop(nodes);

    // Everyone restarts from disk.
    let mut nodes: Vec<RawNode<DiskStorage>> = (0..3).map(|i| start(i, false)).collect();
    for n in &nodes {
        assert_eq!(n.raft.raft_log.last_index(), last);
        assert!(n.raft.term >= term);
    }
    assert_eq!(nodes[0].store().first_index().unwrap(), commit);
    let mut applied = vec![Vec::new(); 3];
    nodes[1].campaign().unwrap();
    pump(&mut nodes, &mut applied);
    assert_eq!(nodes[1].raft.state, StateRole::Leader);
    nodes[1].propose(vec![], b"after restart".to_vec()).unwrap();
    pump(&mut nodes, &mut applied);
    for _ in 0..3 {
        for n in nodes.iter_mut() {
            n.tick();
        }
        pump(&mut nodes, &mut applied);
    }
    for a in &applied {
        assert_eq!(a.last().map(|v| &v[..]), Some(&b"after restart"[..]));
    }
}

#[test]
fn a_snapshot_file_that_is_not_the_one_named_or_has_no_log_is_an_error() {
    let d = TempDir::new("snapname");
    let mut s = DiskStorage::open(&d.0).unwrap();
    s.append(&(1..=4).map(|i| entry(i, 3, b"e")).collect::<Vec<_>>())
        .unwrap();
    s.set_hard_state(&hs(3, 1, 4)).unwrap();
    s.create_snapshot(4, ConfState::from((vec![1], vec![])), b"at 4".to_vec())
        .unwrap();
    s.sync().unwrap();
    drop(s);
    let d2 = TempDir::new("snapname2");
    let mut s = DiskStorage::open(&d2.0).unwrap();
    s.append(&[entry(1, 1, b"e"), entry(2, 1, b"e")]).unwrap();
    s.set_hard_state(&hs(1, 1, 2)).unwrap();
    s.create_snapshot(2, ConfState::from((vec![1], vec![])), b"at 2".to_vec())
        .unwrap();
    s.sync().unwrap();
    drop(s);
    fs::copy(d.0.join("snap-4-3"), d2.0.join("snap-2-1")).unwrap();
    let err = DiskStorage::open(&d2.0)
        .err()
        .expect("mismatched snapshot refused");
    assert!(err.to_string().contains("differs from the log"), "{}", err);
    fs::remove_file(only_log(&d2.0)).unwrap();
    let err = DiskStorage::open(&d2.0)
        .err()
        .expect("snapshot without a log refused");
    assert!(err.to_string().contains("without a log"), "{}", err);
}

/// A node restarted often keeps its log bounded by what is live: a segment is never larger
/// than the segment size, and compacted segments go, restart or not.
#[test]
fn a_log_reopened_often_stays_bounded_by_what_is_live() {
    let d = TempDir::new("reopened");
    let payload = vec![7u8; 4096];
    let mut max_file = 0u64;
    let mut i = 0u64;
    for _restart in 0..12 {
        let mut s = DiskStorage::open(&d.0).unwrap();
        for _ in 0..500 {
            i += 1;
            s.append(&[entry(i, 1, &payload)]).unwrap();
            s.set_hard_state(&hs(1, 1, i)).unwrap();
            if i.is_multiple_of(100) {
                s.create_snapshot(i, ConfState::from((vec![1], vec![])), vec![1; 100])
                    .unwrap();
                s.compact(i - 16).unwrap();
            }
            s.sync().unwrap();
            max_file = max_file.max(s.log_file_len());
        }
    }
    // ~24 MiB went through; live data is at most ~116 entries of 4 KiB.
    assert!(
        max_file < SEGMENT_BYTES + (1 << 20),
        "the log file grew to {max_file} bytes across restarts"
    );
}

#[test]
fn a_data_directory_is_claimed_by_one_node_at_a_time() {
    let t = TempDir::new("claim");
    let dir = t.0.join("node");
    let first = claim_dir(&dir).expect("a new directory is made and claimed");
    let pid = fs::read_to_string(dir.join("lock")).expect("the lock file");
    assert_eq!(pid.trim(), std::process::id().to_string());
    // flock belongs to the open file: a second claim fails even from this process.
    let e = claim_dir(&dir).expect_err("claimed twice");
    assert!(
        e.starts_with(&format!("--data-dir {}: in use", dir.display())),
        "{e}"
    );
    assert!(
        e.contains(&format!("process {}", std::process::id())),
        "{e}"
    );
    drop(first);
    let again = claim_dir(&dir).expect("free once the first claim is gone");
    // The lock file is not a log file: the log opens beside it.
    DiskStorage::open(&dir).expect("the log opens in a claimed directory");
    drop(again);
    let file = t.0.join("a-file");
    fs::write(&file, b"x").unwrap();
    let e = claim_dir(&file).expect_err("a file");
    assert_eq!(e, format!("--data-dir {}: not a directory", file.display()));
}

/// The payloads of all but the newest entries leave memory once written, and every read gives
/// back what was appended: across segments, a new leader's suffix over evicted entries, a
/// compaction, a size limit and a reopen.
#[test]
fn old_payloads_leave_memory_and_read_back_from_the_segments() {
    let d = TempDir::new("cache");
    let mut s = DiskStorage::open(&d.0).unwrap();
    let payload = |i: u64, term: u64| -> Vec<u8> {
        (0..1000u64)
            .map(|k| (i * 31 + k * 7 + term) as u8)
            .collect()
    };
    let mut model: Vec<Entry> = Vec::new();
    let n = SEGMENT_BYTES / 1000 + 500;
    for chunk in (1..=n).collect::<Vec<_>>().chunks(100) {
        let ents: Vec<Entry> = chunk.iter().map(|&i| entry(i, 1, &payload(i, 1))).collect();
        s.append(&ents).unwrap();
        s.set_hard_state(&hs(1, 1, chunk[chunk.len() - 1])).unwrap();
        s.sync().unwrap();
        model.extend(ents);
    }
    assert!(s.segments() >= 2, "{} segments", s.segments());
    assert!(
        s.cached_bytes() <= LOG_CACHE_BYTES,
        "{} bytes of payloads in memory",
        s.cached_bytes()
    );
    assert_eq!(all_entries(&s), model);
    assert!(s.entries_read() >= n - 10, "{} read back", s.entries_read());

    // A size limit cuts a read from the files as raft-rs's `limit_size` cuts one from memory.
    for (lo, max) in [
        (1, 0),
        (1, 2500),
        (500, 10_000),
        (n - 2, 2500),
        (n - 20, u64::MAX),
    ] {
        let got = s
            .entries(lo, n + 1, Some(max), GetEntriesContext::empty(false))
            .unwrap();
        let mut want = model[(lo - 1) as usize..].to_vec();
        raft::util::limit_size(&mut want, Some(max));
        assert_eq!(got, want, "from {} max {}", lo, max);
    }

    // A new leader's entries replace a suffix whose payloads had left memory.
    let ents: Vec<Entry> = (10..=30).map(|i| entry(i, 2, &payload(i, 2))).collect();
    s.append(&ents).unwrap();
    model.truncate(9);
    model.extend(ents);
    s.sync().unwrap();
    assert_eq!(all_entries(&s), model);
    assert_eq!(s.term(9).unwrap(), 1);
    assert_eq!(s.term(10).unwrap(), 2);

    s.set_hard_state(&hs(2, 1, 30)).unwrap();
    s.compact(6).unwrap();
    s.sync().unwrap();
    model.drain(..5);
    assert_eq!(all_entries(&s), model);
    drop(s);

    let s = DiskStorage::open(&d.0).unwrap();
    assert_eq!(all_entries(&s), model);
    assert!(s.cached_bytes() <= LOG_CACHE_BYTES);
}
