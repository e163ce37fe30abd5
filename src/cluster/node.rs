//! One cluster node's Raft driver: raft-rs's `RawNode` over the durable log in `--data-dir`
//! ([`DiskStorage`]) and the peer [`Transport`], ticked by the caller's clock.
//!
//! Owns: the order of a `Ready` (send what may go before persisting, persist, apply, sync,
//! then send what promised that state), ticking, forwarding proposals to the leader, making
//! snapshots and compacting the log. Must not: interpret an entry (the [`Machine`] does), read
//! a clock (the caller passes instants), or block (the transport only enqueues).
//!
//! Proposals: the leader appends them; a follower that knows the leader forwards them as a
//! `MsgPropose` message (what raft-rs itself does); with no leader, [`RaftNode::propose`]
//! says no. raft-rs drops proposals silently on a leader change, so the caller must remember
//! what it proposed and propose it again, and the machine must apply each proposal once.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use raft::prelude::{ConfState, Entry, EntryType, Message, MessageType};
use raft::{Config, RawNode, SnapshotStatus, StateRole, Storage};

use super::storage::DiskStorage;
use super::transport::{PeerEvent, Transport, TransportConfig};

/// Ticks in one election timeout: the contract's "heartbeats every tenth of it".
pub const TICKS_PER_ELECTION: usize = 10;
/// Applied entries between two snapshots (each snapshot lets the log be compacted).
pub const SNAPSHOT_EVERY: u64 = 10_000;
/// Entries kept behind a snapshot, so that a follower a little behind catches up from the
/// log instead of a whole snapshot.
pub const KEEP_ENTRIES: u64 = 1_000;
/// The largest append message (raft-rs's `max_size_per_msg`): one owner turn's entry fits.
const MAX_MSG_BYTES: u64 = 1 << 20;
const MAX_INFLIGHT_MSGS: usize = 256;

/// The replicated state machine a node drives: fed committed entries in log order.
pub trait Machine {
    /// Apply the data of the committed normal entry at `index` (never empty).
    fn apply(&mut self, index: u64, data: &[u8]);
    /// The whole state, as applied so far.
    fn snapshot(&self) -> Vec<u8>;
    /// Replace the state by a leader's snapshot (hostile bytes: an error, no panic).
    fn restore(&mut self, data: &[u8]) -> Result<(), String>;
}

pub struct NodeConfig {
    pub id: u64,
    /// Every member, this node included, and where it listens for peers.
    pub peers: BTreeMap<u64, SocketAddr>,
    pub data_dir: PathBuf,
    pub election_timeout: Duration,
}

pub struct RaftNode {
    raw: RawNode<DiskStorage>,
    transport: Transport,
    tick: Duration,
    next_tick: Instant,
    applied: u64,
    last_snapshot: u64,
}

fn raft_config(id: u64, applied: u64) -> Config {
    Config {
        id,
        election_tick: TICKS_PER_ELECTION,
        heartbeat_tick: 1,
        applied,
        pre_vote: true,
        check_quorum: true,
        max_size_per_msg: MAX_MSG_BYTES,
        max_inflight_msgs: MAX_INFLIGHT_MSGS,
        ..Default::default()
    }
}

fn logger() -> slog::Logger {
    slog::Logger::root(slog::Discard, slog::o!())
}

impl RaftNode {
    /// Open the data directory (a new cluster's members if it is empty), restore `machine`
    /// from its snapshot, and start serving peers on this node's address in `peers`.
    pub fn start(
        cfg: &NodeConfig,
        machine: &mut impl Machine,
        now: Instant,
    ) -> Result<RaftNode, String> {
        let addr = *cfg
            .peers
            .get(&cfg.id)
            .ok_or_else(|| format!("node {} is not one of the peers", cfg.id))?;
        let mut storage = DiskStorage::open(&cfg.data_dir).map_err(|e| e.to_string())?;
        let fresh = storage.initial_state().map_err(|e| e.to_string())?;
        if fresh.conf_state.voters.is_empty() && storage.snapshot_metadata().is_none() {
            let voters: Vec<u64> = cfg.peers.keys().copied().collect();
            storage
                .initialize_with_conf_state(ConfState::from((voters, vec![])))
                .and_then(|()| storage.sync())
                .map_err(|e| e.to_string())?;
        }
        let mut applied = 0;
        if let Some(meta) = storage.snapshot_metadata().cloned() {
            let snap = storage.snapshot(meta.index, 0).map_err(|e| e.to_string())?;
            machine
                .restore(snap.get_data())
                .map_err(|e| format!("the snapshot in {}: {e}", cfg.data_dir.display()))?;
            applied = meta.index;
        }
        let raw = RawNode::new(&raft_config(cfg.id, applied), storage, &logger())
            .map_err(|e| format!("raft: {e}"))?;
        let listener = TcpListener::bind(addr)
            .map_err(|e| format!("cannot listen for peers on {addr}: {e}"))?;
        let transport = Transport::start(TransportConfig::new(cfg.id, cfg.peers.clone()), listener)
            .map_err(|e| format!("peer transport: {e}"))?;
        let tick = (cfg.election_timeout / TICKS_PER_ELECTION as u32).max(Duration::from_millis(1));
        Ok(RaftNode {
            raw,
            transport,
            tick,
            next_tick: now + tick,
            applied,
            last_snapshot: applied,
        })
    }

    pub fn id(&self) -> u64 {
        self.raw.raft.id
    }

    pub fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    /// The leader this node knows of (0: none).
    pub fn leader(&self) -> u64 {
        self.raw.raft.leader_id
    }

    pub fn term(&self) -> u64 {
        self.raw.raft.term
    }

    pub fn role(&self) -> StateRole {
        self.raw.raft.state
    }

    /// Peer messages for [`RaftNode::step`] (to `select!` on).
    pub fn inbound(&self) -> &Receiver<Message> {
        self.transport.inbound()
    }

    pub fn peer_addr(&self) -> SocketAddr {
        self.transport.local_addr()
    }

    /// Propose `data`: appended if this node leads, forwarded to the leader it knows, refused
    /// (false) otherwise. True means only "sent": raft-rs may still drop it.
    pub fn propose(&mut self, data: Vec<u8>) -> bool {
        if self.is_leader() {
            return self.raw.propose(Vec::new(), data).is_ok();
        }
        let leader = self.leader();
        if leader == 0 {
            return false;
        }
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgPropose);
        m.from = self.id();
        m.to = leader;
        let e = Entry {
            data: data.into(),
            ..Default::default()
        };
        m.entries = vec![e].into();
        self.transport.send(m)
    }

    /// A message from a peer (a stale or odd one is ignored, as raft-rs decides).
    pub fn step(&mut self, m: Message) {
        let _ = self.raw.step(m);
    }

    /// Tick raft for every tick interval that has passed by `now`.
    pub fn tick(&mut self, now: Instant) {
        while now >= self.next_tick {
            self.raw.tick();
            self.next_tick += self.tick;
        }
        while let Some(ev) = self.transport_event() {
            match ev {
                PeerEvent::Unreachable(id) => self.raw.report_unreachable(id),
                PeerEvent::SnapshotFailed(id) => {
                    self.raw.report_snapshot(id, SnapshotStatus::Failure)
                }
            }
        }
    }

    fn transport_event(&self) -> Option<PeerEvent> {
        self.transport.try_event()
    }

    /// When the next tick is due.
    pub fn next_tick(&self) -> Instant {
        self.next_tick
    }

    /// Handle every `Ready`: persist and sync what raft asks (one sync per `Ready`: every
    /// proposal since the last one shares it), apply what is committed, send messages. An
    /// error is a storage failure: the node must stop acknowledging (the caller stops it).
    pub fn ready(&mut self, machine: &mut impl Machine) -> Result<(), String> {
        while self.raw.has_ready() {
            let mut rd = self.raw.ready();
            // Messages that promise nothing about our disk (a leader's appends) go at once.
            for m in rd.take_messages() {
                self.transport.send(m);
            }
            if !rd.snapshot().is_empty() {
                let snap = rd.snapshot().clone();
                self.raw
                    .mut_store()
                    .apply_snapshot(&snap)
                    .map_err(|e| e.to_string())?;
                machine
                    .restore(snap.get_data())
                    .map_err(|e| format!("a leader's snapshot: {e}"))?;
                self.applied = snap.get_metadata().index;
                self.last_snapshot = self.applied;
            }
            self.apply(machine, rd.take_committed_entries());
            let store = self.raw.mut_store();
            store.append(rd.entries()).map_err(|e| e.to_string())?;
            if let Some(hs) = rd.hs() {
                store.set_hard_state(hs).map_err(|e| e.to_string())?;
            }
            store.sync().map_err(|e| e.to_string())?;
            for m in rd.take_persisted_messages() {
                self.transport.send(m);
            }
            let mut light = self.raw.advance(rd);
            if let Some(commit) = light.commit_index() {
                let mut hs = self.raw.store().hard_state().clone();
                hs.commit = commit;
                self.raw
                    .mut_store()
                    .set_hard_state(&hs)
                    .map_err(|e| e.to_string())?;
            }
            for m in light.take_messages() {
                self.transport.send(m);
            }
            self.apply(machine, light.take_committed_entries());
            self.raw.advance_apply();
            self.maybe_snapshot(machine)?;
        }
        Ok(())
    }

    fn apply(&mut self, machine: &mut impl Machine, entries: Vec<Entry>) {
        for e in entries {
            if e.index <= self.applied {
                continue;
            }
            self.applied = e.index;
            match e.get_entry_type() {
                EntryType::EntryNormal if !e.data.is_empty() => machine.apply(e.index, &e.data),
                // A new leader's empty entry, or a membership change (not supported yet: the
                // members are the founding ones).
                _ => {}
            }
        }
    }

    fn maybe_snapshot(&mut self, machine: &mut impl Machine) -> Result<(), String> {
        if self.applied < self.last_snapshot + SNAPSHOT_EVERY {
            return Ok(());
        }
        let cs = self.raw.raft.prs().conf().to_conf_state();
        let store = self.raw.mut_store();
        store
            .create_snapshot(self.applied, cs, machine.snapshot())
            .and_then(|()| store.compact(self.applied.saturating_sub(KEEP_ENTRIES)))
            .and_then(|()| store.sync())
            .map_err(|e| e.to_string())?;
        self.last_snapshot = self.applied;
        Ok(())
    }

    /// The index of the last applied entry.
    pub fn applied(&self) -> u64 {
        self.applied
    }
}
