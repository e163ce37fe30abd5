//! Snapshots made by a forked child while the node goes on applying.

use super::*;
use crate::cluster::storage::tests::TempDir;

/// Every applied entry's bytes, in order: a state as large as the log, so that its snapshots
/// are large too.
#[derive(Default)]
struct Log {
    bytes: Vec<u8>,
    /// The state's length at each applied index (to check a snapshot against its index).
    len_at: BTreeMap<u64, usize>,
}

impl Machine for Log {
    type Restored = Vec<u8>;

    fn apply(&mut self, index: u64, data: &[u8]) {
        self.bytes.extend_from_slice(data);
        self.len_at.insert(index, self.bytes.len());
    }

    fn write_snapshot(&self, out: &mut Vec<u8>) {
        for chunk in self.bytes.chunks(64 << 10) {
            out.extend_from_slice(chunk);
            crate::core::codec::spill(out);
        }
    }

    fn restorer(&self) -> Box<dyn FnOnce(&[u8]) -> Result<Vec<u8>, String> + Send> {
        Box::new(|data| Ok(data.to_vec()))
    }

    fn install(&mut self, restored: Vec<u8>) -> Box<dyn Send> {
        Box::new(std::mem::replace(&mut self.bytes, restored))
    }
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

/// The configuration of a one-node cluster in `data_dir`.
fn sole_node(data_dir: PathBuf) -> NodeConfig {
    NodeConfig {
        id: 1,
        peers: [(1, free_addr())].into_iter().collect(),
        data_dir,
        election_timeout: Duration::from_millis(100),
        join: false,
        peer_tls: None,
        peer_names: BTreeMap::new(),
        max_entry: 1 << 20,
    }
}

/// Ticks a one-node cluster until it leads (it elects itself within an election timeout).
fn elect(node: &mut RaftNode, m: &mut impl Machine, deadline: Instant) {
    while !node.is_leader() {
        assert!(Instant::now() < deadline, "no leader");
        node.tick(Instant::now()).unwrap();
        node.ready(m).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A snapshot is written by a child process while the node goes on applying; when the child
/// is done its file holds exactly the state as of the snapshot's index, the log is compacted
/// behind it, and a restart restores from it.
#[test]
fn a_snapshot_is_written_by_a_child_while_the_node_applies() {
    let dir = TempDir::new("forked-snapshot");
    let cfg = sole_node(dir.0.clone());
    let mut m = Log::default();
    let mut node = RaftNode::start(&cfg, &mut m, Instant::now()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    elect(&mut node, &mut m, deadline);
    let chunk = vec![b'x'; 256 << 10];
    let mut applied_while_writing = 0;
    let mut i = 0u32;
    while node.snapshot_stats().made == 0 {
        assert!(Instant::now() < deadline, "no snapshot made");
        let mut data = chunk.clone();
        data[..4].copy_from_slice(&i.to_le_bytes());
        i += 1;
        assert!(node.propose(data));
        let before = node.applied();
        node.tick(Instant::now()).unwrap();
        node.ready(&mut m).unwrap();
        if node.snapshot_stats().writing && node.applied() > before {
            applied_while_writing += 1;
        }
    }
    assert!(
        applied_while_writing > 0,
        "nothing was applied while the child wrote"
    );
    let stats = node.snapshot_stats().clone();
    assert_eq!(stats.failed, 0);
    assert!(stats.last_write_seconds > 0.0);
    let store = node.raw.store();
    let meta = store.snapshot_metadata().unwrap().clone();
    let state = store.snapshot_state().unwrap();
    assert_eq!(
        state.len(),
        m.len_at[&meta.index],
        "the state as of index {}",
        meta.index
    );
    assert_eq!(&state[..], &m.bytes[..state.len()]);
    assert!(
        store.first_index().unwrap() > meta.index.saturating_sub(KEEP_ENTRIES),
        "the log was compacted behind the snapshot"
    );
    assert!(!store.snapshot_tmp_path(&meta).exists());
    drop(node);
    let mut again = Log::default();
    let node = RaftNode::start(&cfg, &mut again, Instant::now()).unwrap();
    assert_eq!(node.applied(), meta.index);
    assert_eq!(again.bytes, state);
}

/// The child's bytes are the machine's snapshot however many times the spill buffer filled.
#[test]
fn a_streamed_snapshot_file_equals_the_snapshot_in_memory() {
    let dir = TempDir::new("streamed");
    let mut m = Log::default();
    for i in 1..=40u64 {
        m.apply(i, &vec![i as u8; 100_000]);
    }
    let meta = raft::prelude::SnapshotMetadata {
        index: 40,
        ..Default::default()
    };
    let path = dir.0.join("snap");
    let d = crate::cluster::snapchild::write_file(&meta, &path, 0, |out| m.write_snapshot(out))
        .unwrap();
    let c = snapfile::check(&path).unwrap();
    assert_eq!(c.descriptor, d);
    assert_eq!(snapfile::read_state(&path, &c).unwrap(), m.snapshot());
}

/// A [`Log`] whose first snapshot child fails (it exits at once); the later ones write.
struct FailsOnce {
    log: Log,
    marker: std::path::PathBuf,
    /// The test's process (a founding node writes its first snapshot itself).
    parent: u32,
    /// The first child hangs instead of failing (a child stuck in the file system, as far as
    /// the node can tell).
    hang: bool,
}

impl Machine for FailsOnce {
    type Restored = Vec<u8>;

    fn apply(&mut self, index: u64, data: &[u8]) {
        self.log.apply(index, data);
    }

    fn write_snapshot(&self, out: &mut Vec<u8>) {
        let in_child = std::process::id() != self.parent;
        let first = in_child
            && std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&self.marker)
                .is_ok();
        if first && self.hang {
            std::thread::sleep(Duration::from_secs(3600));
        }
        if first {
            // SAFETY: in the snapshot child: leaves at once, as a failed child would.
            unsafe { libc::_exit(9) };
        }
        self.log.write_snapshot(out);
    }

    fn restorer(&self) -> Box<dyn FnOnce(&[u8]) -> Result<Vec<u8>, String> + Send> {
        self.log.restorer()
    }

    fn install(&mut self, restored: Vec<u8>) -> Box<dyn Send> {
        self.log.install(restored)
    }
}

/// A snapshot child that failed is tried again after [`SNAPSHOT_RETRY`], without waiting for
/// the log to grow by another snapshot's worth.
#[test]
fn a_failed_snapshot_child_is_retried() {
    let dir = TempDir::new("snapshot-retry");
    let cfg = sole_node(dir.0.join("data"));
    std::fs::create_dir_all(&cfg.data_dir).unwrap();
    let mut m = FailsOnce {
        log: Log::default(),
        marker: dir.0.join("failed-once"),
        parent: std::process::id(),
        hang: false,
    };
    let mut node = RaftNode::start(&cfg, &mut m, Instant::now()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    elect(&mut node, &mut m, deadline);
    let chunk = vec![b'x'; 256 << 10];
    while node.snapshot_stats().failed == 0 {
        assert!(Instant::now() < deadline, "no snapshot tried");
        assert!(node.propose(chunk.clone()));
        node.tick(Instant::now()).unwrap();
        node.ready(&mut m).unwrap();
    }
    // Only a trickle now: far from another snapshot's worth of log.
    let retry_by = Instant::now() + SNAPSHOT_RETRY + Duration::from_secs(10);
    while node.snapshot_stats().made == 0 {
        assert!(
            Instant::now() < retry_by,
            "the failed snapshot was not tried again"
        );
        assert!(node.propose(b"tick".to_vec()));
        node.tick(Instant::now()).unwrap();
        node.ready(&mut m).unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(node.snapshot_stats().failed, 1);
}

/// A follower installing a snapshot (its clock ticked by [`tick_lease_only`]) grants a pre-vote
/// once the leader has been silent for an election timeout, and never campaigns itself.
#[test]
fn an_installing_follower_lets_the_leaders_lease_expire() {
    use raft::prelude::{Message, MessageType};
    let follower = || {
        let store = raft::storage::MemStorage::new_with_conf_state((vec![1, 2, 3], vec![]));
        let mut raw = RawNode::new(&raft_config(1, 0), store, &logger()).unwrap();
        raw.raft.become_follower(1, 2);
        raw
    };
    let pre_vote = || {
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgRequestPreVote);
        (m.from, m.to, m.term) = (3, 1, 2);
        m
    };
    let answered = |raw: &RawNode<raft::storage::MemStorage>| {
        raw.raft
            .msgs
            .iter()
            .any(|m| m.get_msg_type() == MessageType::MsgRequestPreVoteResponse && !m.reject)
    };
    // Standing still: the lease never ends.
    let mut still = follower();
    still.step(pre_vote()).unwrap();
    assert!(!answered(&still));
    let mut ticked = follower();
    for _ in 0..100 {
        tick_lease_only(&mut ticked.raft);
    }
    assert_eq!(ticked.raft.state, StateRole::Follower, "it campaigned");
    ticked.step(pre_vote()).unwrap();
    assert!(answered(&ticked), "the pre-vote was turned down");
}

/// A snapshot child that runs past its time is killed, counted failed, and the snapshot is
/// made by a later child: one stuck child does not hold off every later snapshot. (A later
/// child runs at the lowest priority and may run past its time too on a loaded machine: it is
/// then counted and tried again as well, so the count is at least one.)
#[test]
fn a_hung_snapshot_child_is_killed_and_tried_again() {
    let dir = TempDir::new("snapshot-hung");
    let cfg = sole_node(dir.0.join("data"));
    std::fs::create_dir_all(&cfg.data_dir).unwrap();
    let mut m = FailsOnce {
        log: Log::default(),
        marker: dir.0.join("hung-once"),
        parent: std::process::id(),
        hang: true,
    };
    let mut node = RaftNode::start(&cfg, &mut m, Instant::now()).unwrap();
    node.set_snapshot_policy(SnapshotPolicy {
        child_timeout: Duration::from_secs(2),
        ..SnapshotPolicy::default()
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    elect(&mut node, &mut m, deadline);
    let chunk = vec![b'x'; 256 << 10];
    while !dir.0.join("hung-once").exists() {
        assert!(Instant::now() < deadline, "no snapshot tried");
        assert!(node.propose(chunk.clone()));
        node.tick(Instant::now()).unwrap();
        node.ready(&mut m).unwrap();
    }
    let by = Instant::now() + 4 * (Duration::from_secs(2) + SNAPSHOT_RETRY);
    while node.snapshot_stats().made == 0 {
        assert!(Instant::now() < by, "the hung child was not replaced");
        assert!(node.propose(b"tick".to_vec()));
        node.tick(Instant::now()).unwrap();
        node.ready(&mut m).unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    let failed = node.snapshot_stats().failed;
    assert!(failed >= 1, "the hung child was not counted failed");
}
