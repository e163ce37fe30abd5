//! The owner of a cluster node (`--peers`): the same state machine as a single node's, fed by
//! the Raft log instead of by the workers directly.
//!
//! Owns: turning the workers' batches into proposals, proposing them (through the leader),
//! applying committed entries to the [`Tables`] with the log's time, delivering the replies
//! addressed to this node's connections, and answering "no quorum" when a proposal cannot be
//! committed in time. Must not: apply anything that did not come out of the log.
//!
//! **The loop and its thread.** [`OwnerCore`] is the loop: every input is a call with the time
//! passed in (a worker's batch, a peer's message, then one round per turn: tick, propose,
//! `Ready`, a membership change, this node's proposals seen applied, watch, look, a new
//! leader's lease extension, the replies to the workers), and it reads no clock itself. It is
//! generic over the node's environment, its state ([`OwnerState`]) and how a worker is woken
//! ([`Wake`]). [`ClusterOwner`] is the daemon's thread around it: the `select!` over the
//! workers' channel, the peers' messages and events and the sync thread's answers, the admin
//! port's questions, and the process's exit on a storage failure or its own removal. The
//! simulator's liveness mode (`crate::sim`) runs the same loop over its in-memory node.
//!
//! **Proposals.** A proposal is one owner turn's worth of this node's batches, as one command
//! entry (`command.rs`) behind a header naming the node, this run of it (its *incarnation*, the
//! Unix time in microseconds at start) and a sequence number:
//!
//! ```text
//! proposal = 1 node(u64 LE) incarnation(u64 LE) seq(u64 LE) entry   commands
//!          | 2 node(u64 LE) time_ms(u64 LE)                            a node's sessions expire
//!          | 3 term(u64 LE) node(u64 LE) extend_ms(u64 LE) time_ms(u64 LE)  a new leader
//! ```
//!
//! A new leader's first entry restarts every running lease and orphan window with its
//! remaining time plus one election timeout (no lease ends early because of a failover: see
//! `docs/cluster.md`); applied once per term.
//!
//! A node keeps up to [`MAX_INFLIGHT_PROPOSALS`] proposals in flight, each carrying whatever
//! its workers sent since the last (so one entry, one sync and one round trip carry many
//! requests: group commit, and the next entry does not wait for this one's round trip). The
//! state machine applies a node's proposals in the order of their sequence numbers, each once:
//! one whose predecessor has not been applied is ignored, and one of an older incarnation too.
//! When the oldest is not applied within half an election timeout, every proposal in flight is
//! proposed again, in order (raft-rs drops proposals silently when the leader changes).
//!
//! **No quorum.** Every request is answered within two election timeouts of reaching the owner,
//! whether it is in flight or still queued behind the cap: when the oldest request of this node
//! not yet answered has waited that long, every request of this node not yet answered is
//! answered with the protocol's no-quorum reply, in the order they came, and their connections
//! close; what such a connection sends after that gets the same answer on arrival, until its
//! close. A proposal given up stays in flight with its requests taken out (the same sequence
//! number, so whichever version is committed first is applied, and the node's later proposals
//! can follow it): a node whose cap is full of proposals given up, none of which can commit,
//! makes no new proposal, but its later requests are still answered in time. Queued batches
//! given up keep only their connection events, merged into one batch (a run of queued batches
//! without requests is one batch too), in which a connection that opened and closed leaves
//! nothing: none of its ops was ever proposed (its open comes first), so the log need never
//! hear of it. What waits for the log while there is no quorum is therefore bounded by the
//! cap, by the connections, and by the requests of two election timeouts (the owner stops
//! taking batches from the workers at [`MAX_QUEUED_BATCHES`]).
//! Proposals of this node that came in a leader's snapshot it installed (not applied one entry
//! at a time) made no replies here: their requests get the no-quorum answer when they leave
//! the flight.
//!
//! What a no-quorum answer guarantees, and no more: the request is applied at most once, and
//! its client learns nothing more of it. A request given up before it was proposed is never
//! applied. One given up in flight is applied if the original version of its proposal reached
//! a leader's log and is committed before the version without it; its reply is then dropped,
//! and its connection's close, which the log takes after it, ends the session and whatever it
//! was granted (a lock, a queued wait); what it wrote stays written, as after a timeout. The
//! close makes sure that the client never acts on a lock it was told it did not get.
//!
//! **Time.** Each entry carries the proposer's clock; the state's clock is the largest seen, so
//! it never runs backwards. Timers fire only when an entry is applied: the leader proposes an
//! empty entry when one is due and nothing else is in flight.
//!
//! **Sessions.** Every node applies every node's commands; [`Outbox`] writes only the replies
//! to this node's connections. The first proposal of a new incarnation of a node ends every
//! session of its earlier one (that process is gone, and its connections with it). An expiry
//! ends a running node's sessions; their connections are dead from then on, and what the log
//! carries of them later (proposed before the node knew it was cut off) is dropped.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{select, Receiver, Sender};
use mio::Waker;

use super::Wake;
use super::{apply_op, apply_turn, clock, clock_at, command, exec_admin, Outbox, Pools, Tables};
use crate::admin::data::{Answer, ClusterMetrics, Histogram, Query, CLUSTER_BOUNDS};
use crate::cluster::env::{Clock, LogStore, PeerLink};
use crate::cluster::liveness::{Fence, Liveness, Micros};
use crate::cluster::node::{
    conf_members, max_entry_bytes, Machine, Membership, NodeConfig, RaftNode, StartError,
    MAX_ENTRY_BYTES, TICKS_PER_ELECTION,
};
use crate::cluster::transport::{PeerTls, PeerTlsConfigs};
use crate::config::ClusterConfig;
use crate::core::codec::{self, DecodeError, Reader};
use crate::core::Now;
use crate::server::effect::{Body, Effect, Effects};
use crate::server::msg::{Arena, Batch, ConnId, Op, OpMsg, Replies, ToOwner};
use crate::server::Shared;

/// A proposal's first byte: what it is.
const KIND_COMMANDS: u8 = 1;
const KIND_EXPIRE: u8 = 2;
const KIND_LEADER: u8 = 3;
/// Header of a commands proposal: kind, node, incarnation, sequence number.
const HEADER_LEN: usize = 25;
/// An expiry: kind, node, the leader's time.
const EXPIRE_LEN: usize = 17;
/// A new leader: kind, term, node, extension, time.
const LEADER_LEN: usize = 33;
/// Proposals of this node in flight at most: enough to keep the log busy while earlier ones
/// make their round trip, few enough that a leader change re-proposes little.
const MAX_INFLIGHT_PROPOSALS: usize = 8;
/// Worker batches gathered into one proposal at most (bounds an entry like a single node's
/// turn: the caps on each batch's requests apply before proposal).
const MAX_BATCHES_PER_PROPOSAL: usize = 64;
/// Batches waiting for the next proposal before the owner stops taking more from the workers
/// (they queue in the channel, whose requests are each bounded by the workers' caps).
const MAX_QUEUED_BATCHES: usize = 4096;
/// Bytes of this node's proposals in flight at most (with [`MAX_INFLIGHT_PROPOSALS`]): a
/// request from another node waits behind at most these of this node's bytes in the leader's
/// log, and one of this node behind these and the batches queued before it (at most
/// [`MAX_QUEUED_BYTES`]). A bulk writer's throughput is about this window over the time a sync
/// and a round trip take, and a lock request waits behind about that time (Little's law): the
/// window trades the one for the other. Measured on two cores with a 1 GiB fill through one
/// node of three and a TRY + REL probe on another (`make bench-cluster-state`, the leader on
/// the probe's node): 96 KiB gives 32-37 MB/s and a probe p50 of 3.7-4.2 ms, p99 20-26 ms;
/// 192 KiB 44 MB/s, 5.7 ms, 30-31 ms. A lock server's writes are small: the shorter wait wins.
const MAX_INFLIGHT_BYTES: usize = 96 << 10;
/// Bytes of batches queued for proposal at which the owner stops taking more from the workers
/// (they wait in the channel, and the workers stop reading at their own caps).
const MAX_QUEUED_BYTES: usize = 2 << 20;

/// What an op adds to an entry beyond its bytes in the arena, about (ids, tags, lengths; a
/// small dlock request takes about 48 bytes in all).
const OP_OVERHEAD: usize = 64;
/// The exit status of a node whose storage failed (sysexits' EX_IOERR).
const EXIT_STORAGE_FAILED: i32 = 74;

/// The replicated state: what every node has the same of, plus where this node's replies go.
pub struct Replicated {
    shared: Arc<Shared>,
    pub tables: Tables,
    /// The effects of the entry being applied (routed to this node's connections after it).
    fx: Effects,
    pub outbox: Outbox,
    /// The log's clock: the largest time any applied entry carried.
    clock_ms: u64,
    /// Per node: its latest incarnation and the last sequence number applied from it.
    nodes: BTreeMap<u64, (u64, u64)>,
    /// Scratch for decoding entries.
    batch: Batch,
    me: u64,
    incarnation: u64,
    /// The last of this node's own sequence numbers applied (this incarnation).
    pub mine_applied: u64,
    /// This node's proposals through this number came in a leader's snapshot installed here,
    /// not applied one by one: their replies were never made.
    pub installed_through: u64,
    /// Entries that did not decode (hostile or from a newer version): ignored on every replica.
    pub refused: u64,
    /// Expiries of a node's sessions applied.
    pub expired: u64,
    /// The term of the last new-leader entry applied.
    leader_term: u64,
    /// Added nodes' addresses and removed ids (the configuration itself is raft's).
    membership: Membership,
    /// Sessions of this node's run that an expiry applied here has ended and not yet reported
    /// (the owner logs it: the replicated state logs nothing).
    pub own_expiry: Option<usize>,
    /// Connections whose sessions an expiry ended. Their node proposed their requests before
    /// it knew (it was cut off), and the log may carry them after the expiry: such a request
    /// must not start a new session and act for a client that has lost everything (an
    /// old-protocol REL, which anybody may send for any lock, would free the lock of whoever
    /// was granted it since). Their ops are dropped until their close comes through, or the
    /// node's next run.
    dead: BTreeSet<ConnId>,
}

const SNAPSHOT_MAGIC: &[u8] = b"HFcl3";
/// Connections remembered as dead at most (a node has at most `--max-connections` of them
/// when it is expired; a snapshot claiming more is damaged).
const MAX_DEAD_CONNS: usize = 1 << 24;
/// The longest `ID=HOST:PORT` a membership change may carry.
const MAX_MEMBER_ADDR: usize = 300;

impl Replicated {
    pub fn new(shared: Arc<Shared>, workers: usize, me: u64, incarnation: u64) -> Replicated {
        // Every replica starts from the same state: its clocks at 0 until the first entry.
        let mut tables = Tables::new(&shared.config, Now::from_unix_ms(0));
        tables.node = me as u16;
        Replicated {
            outbox: Outbox::for_node(workers, me as u16),
            fx: Effects::default(),
            tables,
            shared,
            clock_ms: 0,
            nodes: BTreeMap::new(),
            batch: Batch::default(),
            me,
            incarnation,
            mine_applied: 0,
            installed_through: 0,
            refused: 0,
            expired: 0,
            leader_term: 0,
            membership: Membership::default(),
            own_expiry: None,
            dead: BTreeSet::new(),
        }
    }

    fn apply_proposal(&mut self, data: &[u8]) -> Result<(), DecodeError> {
        let word = |i: usize| -> Result<u64, DecodeError> {
            let b = data
                .get(i..i + 8)
                .ok_or(DecodeError::Invalid("proposal header truncated"))?;
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            Ok(u64::from_le_bytes(a))
        };
        match data.first() {
            Some(&KIND_COMMANDS) => {}
            Some(&KIND_EXPIRE) => {
                // The leader has not heard from `node` for the session timeout: its sessions
                // end (the node has fenced itself by now).
                let (node, time) = (word(1)?, word(9)?);
                if data.len() != EXPIRE_LEN {
                    return Err(DecodeError::Invalid("expiry entry length"));
                }
                let node16 = u16::try_from(node).map_err(|_| DecodeError::Invalid("node id"))?;
                self.clock_ms = self.clock_ms.max(time);
                if node == self.me && self.this_run_announced() {
                    let n = self.tables.sessions.conns_of_node(node16).len();
                    *self.own_expiry.get_or_insert(0) += n;
                }
                self.end_sessions_of(node16, true);
                self.expired += 1;
                return Ok(());
            }
            Some(&KIND_LEADER) => {
                if data.len() != LEADER_LEN {
                    return Err(DecodeError::Invalid("leader entry length"));
                }
                let (term, _node, extend_ms, time) = (word(1)?, word(9)?, word(17)?, word(25)?);
                if term > self.leader_term {
                    self.leader_term = term;
                    self.clock_ms = self.clock_ms.max(time);
                    self.tables.lockd.extend_orphans(extend_ms);
                    self.tables.dlock.extend_leases(extend_ms);
                }
                return Ok(());
            }
            _ => return Err(DecodeError::Invalid("unknown proposal kind")),
        }
        let (node, incarnation, seq) = (word(1)?, word(9)?, word(17)?);
        let node16 = u16::try_from(node).map_err(|_| DecodeError::Invalid("node id"))?;
        let limits = command::Limits::default();
        let time = command::decode_entry(&data[HEADER_LEN..], limits, &mut self.batch)?;
        // The counters `stats` reports are this node's, read here, never during apply.
        crate::server::Live::stamp_if_wanted(&self.shared, &mut self.batch);
        match self.nodes.get(&node).copied() {
            Some((inc, _)) if incarnation < inc => return Ok(()),
            // Applied already, or proposed before its predecessor was applied (that one was
            // dropped, and its node proposes both again, in order): a node's proposals apply
            // in the order it made them, each once.
            Some((inc, last)) if incarnation == inc && seq != last + 1 => return Ok(()),
            Some((inc, _)) if incarnation == inc => {}
            // A run begins with its first proposal.
            _ if seq != 1 => return Ok(()),
            earlier => {
                // A new run of that node: its earlier run's connections are gone.
                self.clock_ms = self.clock_ms.max(time);
                if earlier.is_some() {
                    self.end_sessions_of(node16, false);
                }
                self.dead.retain(|c| c.node != node16);
            }
        }
        self.nodes.insert(node, (incarnation, seq));
        // A proposal names only its own node's connections.
        if self.batch.ops.iter().any(|m| m.conn.node != node16) {
            return Err(DecodeError::Invalid(
                "a proposal names another node's connection",
            ));
        }
        if !self.dead.is_empty() {
            let dead = &mut self.dead;
            self.batch.ops.retain(|m| {
                if !dead.contains(&m.conn) {
                    return true;
                }
                if matches!(m.op, Op::Close) {
                    dead.remove(&m.conn);
                }
                false
            });
        }
        self.clock_ms = self.clock_ms.max(time);
        apply_turn(
            &mut self.tables,
            &mut self.fx,
            &self.shared,
            Now::from_unix_ms(self.clock_ms),
            &self.batch.ops,
            &self.batch.arena.bytes,
        );
        if node == self.me && incarnation == self.incarnation {
            self.mine_applied = seq;
        }
        Ok(())
    }

    /// A commands proposal: `node`'s run `incarnation`, number `seq`, carrying the command
    /// entry `entry` (`command.rs`).
    pub fn encode_commands(node: u64, incarnation: u64, seq: u64, entry: &[u8], out: &mut Vec<u8>) {
        out.push(KIND_COMMANDS);
        for v in [node, incarnation, seq] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(entry);
    }

    /// [`Machine::apply`], also writing the entry's effects for every session, this node's or
    /// not, in canonical form before they are routed: what the simulator compares across
    /// replicas while the owner's loop drives this node.
    pub fn apply_recorded(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.apply_proposal(data).is_err() {
            self.refused += 1;
        }
        let t = &self.tables;
        self.fx.encode_canonical(|s| t.sessions.conn(s), out);
        self.route_applied();
    }

    /// The effects of the entry just applied go to this node's connections.
    #[inline]
    fn route_applied(&mut self) {
        if self.this_run_announced() {
            self.outbox.route(&mut self.fx, &self.tables.sessions);
        } else {
            // Entries from before this run's first proposal (a restarted node replaying its log,
            // or catching up): any session of this node they address belongs to an earlier run,
            // whose connections died with it, and whose connection numbers this run's may repeat.
            self.fx.clear();
        }
    }

    /// The process state this node's state machine reads (configuration, the clocks' origin,
    /// the published write deadline).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// This run's incarnation.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Apply one proposal and write its effects for every session, this node's or not, in
    /// canonical form (`Effects::encode_canonical`): what a simulator compares across replicas.
    pub fn apply_canonical(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.apply_proposal(data).is_err() {
            self.refused += 1;
        }
        let t = &self.tables;
        self.fx.encode_canonical(|s| t.sessions.conn(s), out);
        self.fx.clear();
    }

    /// End every session of `node`'s connections, in connection order, at the log's time:
    /// connection-bound locks are released, old-protocol locks become orphans, waits end.
    /// `close_connections`: the node still runs (an expiry), and its connections close too.
    /// Not for a node's new run: its earlier run's connections died with that process, and
    /// the new run's connections may have the same numbers.
    fn end_sessions_of(&mut self, node: u16, close_connections: bool) {
        let now = Now::from_unix_ms(self.clock_ms);
        let conns = self.tables.sessions.conns_of_node(node);
        if close_connections {
            // On the node that has them (the others route nothing): their clients must not go
            // on believing in locks they no longer have. Routed before the sessions end, while
            // they still map to their connections.
            for &conn in &conns {
                if let Some(s) = self.tables.sessions.find(conn) {
                    self.fx.push(s, 0, true, Body::Abort);
                }
            }
            self.outbox.route(&mut self.fx, &self.tables.sessions);
        }
        for conn in conns {
            apply_op(
                &mut self.tables,
                &mut self.fx,
                &self.shared,
                conn,
                Op::Close,
                &[],
                now,
            );
            if close_connections && self.dead.len() < MAX_DEAD_CONNS {
                self.dead.insert(conn);
            }
        }
    }

    /// Whether this run's first proposal has been applied: from then on, every session of this
    /// node in the state is one of this run's connections.
    fn this_run_announced(&self) -> bool {
        self.nodes
            .get(&self.me)
            .is_some_and(|&(inc, _)| inc == self.incarnation)
    }

    /// An expiry of `node`'s sessions, proposed by the leader at its time `time_ms`.
    pub fn encode_expire(node: u64, time_ms: u64, out: &mut Vec<u8>) {
        out.push(KIND_EXPIRE);
        out.extend_from_slice(&node.to_le_bytes());
        out.extend_from_slice(&time_ms.to_le_bytes());
    }

    /// A new leader's entry: `node` leads `term`, running leases and orphan windows get
    /// `extend_ms` more, at its time `time_ms`.
    pub fn encode_leader(term: u64, node: u64, extend_ms: u64, time_ms: u64, out: &mut Vec<u8>) {
        out.push(KIND_LEADER);
        for v in [term, node, extend_ms, time_ms] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// `node`'s latest run applied and the last sequence number applied from it.
    pub fn run_of(&self, node: u64) -> Option<(u64, u64)> {
        self.nodes.get(&node).copied()
    }

    /// Whether any session of `node` is live.
    pub fn has_sessions_of(&self, node: u16) -> bool {
        !self.tables.sessions.conns_of_node(node).is_empty()
    }

    /// The log's clock.
    pub fn clock_ms(&self) -> u64 {
        self.clock_ms
    }
}

impl Machine for Replicated {
    type Restored = Restored;

    fn apply(&mut self, _index: u64, data: &[u8]) {
        if self.apply_proposal(data).is_err() {
            // Every replica refuses the same bytes the same way.
            self.refused += 1;
        }
        self.route_applied();
    }

    fn apply_conf_change(
        &mut self,
        _index: u64,
        context: &[u8],
        before: &raft::prelude::ConfState,
        after: &raft::prelude::ConfState,
    ) {
        let (before, after) = (conf_members(before), conf_members(after));
        // An added node's address (every replica parses the same bytes the same way).
        if let Some((id, addr)) = std::str::from_utf8(context)
            .ok()
            .and_then(|c| crate::config::parse_peers(c).ok())
            .and_then(|p| p.into_iter().next())
        {
            if after.contains(&id) && !self.membership.removed.contains(&id) {
                self.membership.addrs.insert(id, addr);
            }
        }
        for gone in before.difference(&after) {
            self.membership.addrs.remove(gone);
            self.membership.removed.insert(*gone);
        }
    }

    fn membership(&self) -> Membership {
        self.membership.clone()
    }

    fn write_snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(SNAPSHOT_MAGIC);
        codec::put_u64(out, self.clock_ms);
        codec::put_u64(out, self.nodes.len() as u64);
        for (&node, &(inc, seq)) in &self.nodes {
            codec::put_u64(out, node);
            codec::put_u64(out, inc);
            codec::put_u64(out, seq);
        }
        codec::put_u64(out, self.refused);
        codec::put_u64(out, self.expired);
        codec::put_u64(out, self.leader_term);
        codec::put_u64(out, self.membership.addrs.len() as u64);
        for (&id, addr) in &self.membership.addrs {
            codec::put_u64(out, id);
            codec::put_bytes(out, addr.to_string().as_bytes());
        }
        codec::put_u64(out, self.membership.removed.len() as u64);
        for &id in &self.membership.removed {
            codec::put_u64(out, id);
        }
        codec::put_u64(out, self.dead.len() as u64);
        for conn in &self.dead {
            conn.encode(out);
        }
        self.tables.snapshot(out);
    }

    fn restorer(&self) -> Box<dyn FnOnce(&[u8]) -> Result<Restored, String> + Send> {
        let shared = self.shared.clone();
        Box::new(move |data| restore_state(&shared.config, data))
    }

    /// The tables go (a follower installing a leader's snapshot applies nothing until it is in
    /// place; what reads them meanwhile, the admin pages, sees them empty); the head stays.
    fn release(&mut self) -> Box<dyn Send> {
        let mut empty = Tables::new(&self.shared.config, crate::core::Now::default());
        empty.node = self.me as u16;
        Box::new(std::mem::replace(&mut self.tables, empty))
    }

    fn install(&mut self, restored: Restored) -> Box<dyn Send> {
        let Restored { head, tables } = restored;
        (
            self.clock_ms,
            self.nodes,
            self.refused,
            self.expired,
            self.leader_term,
            self.membership,
            self.dead,
        ) = head;
        let mut old = std::mem::replace(&mut self.tables, tables);
        self.tables.node = self.me as u16;
        // This node's watchers missed the events between its state and the snapshot: their
        // connections close (their clients watch again) rather than go on with a gap. Routed
        // through the old sessions, which still map them.
        let watchers = old.watches.take_sessions();
        // The counts of frames pushed are this node's, whatever state it holds.
        self.tables.watches.sent = old.watches.sent;
        if !watchers.is_empty() {
            for s in watchers {
                self.fx.push(s, 0, true, Body::Abort);
            }
            self.outbox.route(&mut self.fx, &old.sessions);
        }
        self.mine_applied = self
            .nodes
            .get(&self.me)
            .filter(|(inc, _)| *inc == self.incarnation)
            .map_or(0, |&(_, seq)| seq);
        self.installed_through = self.mine_applied;
        Box::new(old)
    }
}

/// The replicated part of the state beside the tables, as a snapshot holds it: the log's
/// clock, each node's run and last sequence number, counts of refused entries and expiries,
/// the leader's term, membership and the connections known dead.
type Head = (
    u64,
    BTreeMap<u64, (u64, u64)>,
    u64,
    u64,
    u64,
    Membership,
    BTreeSet<ConnId>,
);

/// A state rebuilt from a snapshot, off the owner's thread ([`Machine::restorer`]).
pub struct Restored {
    head: Head,
    tables: Tables,
}

/// Parses a snapshot written by [`Machine::write_snapshot`] (hostile bytes: an error).
fn restore_state(config: &crate::config::Config, data: &[u8]) -> Result<Restored, String> {
    let mut r = Reader::new(data);
    let head = (|| -> Result<Head, DecodeError> {
        r.expect(SNAPSHOT_MAGIC, "cluster snapshot magic")?;
        let clock_ms = r.u64()?;
        let n = r.count(3)?;
        let mut nodes = BTreeMap::new();
        for _ in 0..n {
            let node = r.u64()?;
            let v = (r.u64()?, r.u64()?);
            if nodes.insert(node, v).is_some() {
                return Err(DecodeError::Invalid("a node named twice"));
            }
        }
        let (refused, expired, leader_term) = (r.u64()?, r.u64()?, r.u64()?);
        let mut membership = Membership::default();
        for _ in 0..r.count(2)? {
            let id = r.u64()?;
            let addr = std::str::from_utf8(r.bytes(MAX_MEMBER_ADDR)?)
                .ok()
                .and_then(|a| a.parse().ok())
                .ok_or(DecodeError::Invalid("a member's address"))?;
            membership.addrs.insert(id, addr);
        }
        for _ in 0..r.count(1)? {
            membership.removed.insert(r.u64()?);
        }
        let n = r.count(3)?;
        if n > MAX_DEAD_CONNS {
            return Err(DecodeError::Invalid("too many dead connections"));
        }
        let mut dead = BTreeSet::new();
        for _ in 0..n {
            dead.insert(ConnId::decode(&mut r)?);
        }
        Ok((
            clock_ms,
            nodes,
            refused,
            expired,
            leader_term,
            membership,
            dead,
        ))
    })()
    .map_err(|e| e.to_string())?;
    let used = data.len() - r.remaining();
    let tables = Tables::restore(config, &data[used..]).map_err(|e| e.to_string())?;
    Ok(Restored { head, tables })
}

/// A proposal of this node not yet seen applied.
struct InFlight {
    seq: u64,
    data: Vec<u8>,
    batches: Vec<Batch>,
    /// When its oldest request reached the owner; None once it has no request left to answer
    /// (given up: its requests answered "no quorum", `data` the version without them).
    waiting_since: Option<Instant>,
    /// When it was first proposed (the proposal-to-apply histogram counts from here).
    proposed: Instant,
    /// The last attempt, and whether it reached a leader (as far as this node can tell).
    tried: Instant,
    sent: bool,
}

/// A worker's batch waiting to be proposed.
struct Queued {
    batch: Batch,
    /// When it reached the owner, if it carries requests not yet answered.
    waiting_since: Option<Instant>,
}

/// About what a batch adds to an entry.
fn batch_bytes(b: &Batch) -> usize {
    b.arena.bytes.len() + b.ops.len() * OP_OVERHEAD
}

/// What the owner's cluster loop drives as the node's replicated state: [`Replicated`] itself
/// in the daemon; the simulator's machine wraps one and records what each entry did.
pub trait OwnerState: Machine {
    fn replicated(&self) -> &Replicated;
    fn replicated_mut(&mut self) -> &mut Replicated;
}

impl OwnerState for Replicated {
    #[inline]
    fn replicated(&self) -> &Replicated {
        self
    }

    #[inline]
    fn replicated_mut(&mut self) -> &mut Replicated {
        self
    }
}

/// Deliberate bugs the simulator switches on to show that its checks catch them; all off in
/// the daemon (nothing else sets them).
#[derive(Clone, Copy, Debug, Default)]
pub struct Mutations {
    /// Forget the requests of this node's proposals that came in a leader's snapshot it
    /// installed, instead of answering them "no quorum".
    pub forget_installed_requests: bool,
    /// A new leader expires nodes a session timeout after it last heard from them, without
    /// waiting a session timeout from its own election.
    pub leader_does_not_wait: bool,
}

/// The daemon's owner thread in cluster mode: [`OwnerCore`] over the daemon's node and state,
/// fed by the workers' channel, the peers' messages and events and the sync thread's answers.
pub struct ClusterOwner {
    rx: Receiver<ToOwner>,
    core: OwnerCore,
    node: RaftNode,
    state: Replicated,
}

/// The owner's cluster loop without its thread: every input is a call with the time passed
/// in (`now`, on the node's monotonic clock; the state machine's clock is derived from it as
/// the workers' is), and it reads no clock itself. Generic over the node's environment
/// (`RaftNode<S, T, C>`), the replicated state ([`OwnerState`]) and how a worker is woken
/// ([`Wake`]): the daemon runs it in [`ClusterOwner::run`], the simulator (`crate::sim`'s
/// liveness mode) over its in-memory environment.
pub struct OwnerCore<K: Wake = Arc<Waker>> {
    shared: Arc<Shared>,
    workers: Vec<(Sender<Replies>, K)>,
    pools: Vec<Pools>,
    incarnation: u64,
    seq: u64,
    queued: VecDeque<Queued>,
    /// [`batch_bytes`] of the queued batches.
    queued_bytes: usize,
    inflight: VecDeque<InFlight>,
    /// The leader the last [`OwnerCore::propose`] saw.
    leader_seen: u64,
    /// Whether this node led at the end of the last round.
    was_leader: bool,
    election: Duration,
    /// Who is reachable, fencing, expiries (`cluster::liveness`).
    pub liveness: Liveness,
    /// The Great Poncio (`--on-quorum-loss`).
    on_quorum_loss: Option<String>,
    /// Connections whose requests were answered "no quorum" (and which close after that):
    /// their later requests get the same answer, replies the log makes for them are dropped,
    /// until their close comes through.
    poisoned: HashSet<ConnId>,
    /// What `/metrics` shows beyond raft's state, and what the operator's log lines need.
    watch: Watch,
    /// All off in the daemon; the simulator sets them.
    pub mutations: Mutations,
}

/// What a round of the loop left the node: running, or stopped (it applied its own removal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Running,
    Removed,
}

/// A cluster node's counters and the last state its log lines and counters compared against.
/// Looked at once per round (cheap comparisons) and once per tick (reachability): never per
/// request.
struct Watch {
    proposal_apply: Histogram,
    quorum_losses: u64,
    fences: u64,
    leader_changes: u64,
    /// Requests answered no quorum (given up after two election timeouts, or behind one that
    /// was on the same connection).
    no_quorum_answers: u64,
    /// The last leader known and its term (0: none yet).
    leader: (u64, u64),
    /// Whether a quorum of the voters was reachable at the last look (`None`: none has been
    /// yet since the start: peers started together take a while to be heard from, and that is
    /// no loss), and since when it has not been.
    quorum: Option<bool>,
    quorum_lost_at: Option<Instant>,
    /// When reachability is looked at next (once per tick).
    next_look: Instant,
    /// Quorum lines (they may flap on a lossy network) and leader lines.
    quorum_log: crate::log::Limiter,
    leader_log: crate::log::Limiter,
}

/// The peer links' TLS (`--peer-tls-*`), read from the secrets in force at each new connection
/// (SIGHUP reloads them); None without it.
fn peer_tls(shared: &Arc<Shared>) -> Option<PeerTls> {
    shared.secrets.files().peer.as_ref()?;
    let shared = shared.clone();
    Some(PeerTls::new(move || {
        let s = shared.secrets.current();
        Some(PeerTlsConfigs {
            server: s.peer_server.clone()?,
            client: s.peer_client.clone()?,
        })
    }))
}

/// This node's clock for its liveness decisions (`cluster::liveness`): microseconds since the
/// process started, the clock the workers' write deadline (`Shared::write_deadline_ms`) reads.
fn micros(shared: &Shared, t: Instant) -> Micros {
    t.saturating_duration_since(shared.started).as_micros() as Micros
}

impl ClusterOwner {
    pub fn start(
        shared: Arc<Shared>,
        rx: Receiver<ToOwner>,
        workers: Vec<(Sender<Replies>, Arc<Waker>)>,
        cfg: &ClusterConfig,
    ) -> Result<ClusterOwner, StartError> {
        return_large_blocks_to_the_system();
        let incarnation = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_micros() as u64);
        let me = u64::from(cfg.node_id);
        let mut state = Replicated::new(shared.clone(), workers.len(), me, incarnation);
        let node_cfg = NodeConfig {
            id: me,
            peers: cfg.peers.clone(),
            data_dir: cfg.data_dir.clone(),
            election_timeout: Duration::from_millis(cfg.election_timeout_ms),
            join: cfg.join,
            peer_tls: peer_tls(&shared),
            peer_names: cfg.peer_hosts.clone(),
            // The largest request: a value, or a dlock message.
            max_entry: max_entry_bytes(
                shared
                    .config
                    .max_item_size
                    .max(shared.config.dlock_max_message),
            ),
        };
        if let Some(line) = crate::config::plaintext_peers_warning(cfg, node_cfg.peer_tls.is_some())
        {
            crate::log_warn!("{line}");
        }
        let node = RaftNode::start(&node_cfg, &mut state, Instant::now())?;
        if state.membership.removed.contains(&me) {
            return Err(StartError::Failed(format!(
                "node {me} was removed from the cluster: to serve again it must be added under \
                 a new id, with an empty data directory and --join"
            )));
        }
        crate::log_info!(
            "cluster node {} of {} (peers on {}), data in {}",
            me,
            cfg.peers.len(),
            node.peer_addr(),
            cfg.data_dir.display()
        );
        let core = OwnerCore::new(
            shared,
            workers,
            &node,
            incarnation,
            cfg.session_timeout_ms * 1_000,
            Duration::from_millis(cfg.election_timeout_ms),
            cfg.on_quorum_loss.clone(),
            Instant::now(),
        );
        Ok(ClusterOwner {
            rx,
            core,
            node,
            state,
        })
    }

    pub fn run(mut self) {
        crate::slice::request_for_this_thread(crate::slice::SERVING_THREAD_NANOS);
        loop {
            let wait = self.core.wait(&self.node, Instant::now());
            let inbound = self.node.inbound().clone();
            let events = self.node.events().clone();
            let synced = self.node.synced().clone();
            let take_more = self.core.take_more();
            let never = crossbeam_channel::never();
            let rx = if take_more { &self.rx } else { &never };
            select! {
                recv(rx) -> msg => match msg {
                    Ok(msg) => if !self.take(msg, Instant::now()) { return },
                    Err(_) => return,
                },
                recv(inbound) -> m => if let Ok(m) = m {
                    self.core.step(&mut self.node, &mut self.state, m, Instant::now())
                },
                recv(events) -> ev => if let Ok(ev) = ev { self.node.peer_event(ev, Instant::now()) },
                recv(synced) -> done => {
                    let done = done.unwrap_or_else(|_| Err("the sync thread has stopped".into()));
                    if let Err(e) = self.node.on_synced(done) {
                        self.storage_failed(&e);
                    }
                }
                default(wait) => {}
            }
            while self.core.take_more() {
                match self.rx.try_recv() {
                    Ok(msg) => {
                        if !self.take(msg, Instant::now()) {
                            return;
                        }
                    }
                    Err(_) => break,
                }
            }
            while let Ok(m) = inbound.try_recv() {
                self.core
                    .step(&mut self.node, &mut self.state, m, Instant::now());
            }
            match self
                .core
                .round(&mut self.node, &mut self.state, Instant::now())
            {
                Ok(Outcome::Running) => {}
                Ok(Outcome::Removed) => {
                    // Its clients' connections close with the process; the cluster has expired
                    // or will expire their sessions. Exit 0: a service manager must not start it
                    // again as is.
                    crate::log_warn!(
                        "cluster node {} was removed from the cluster: stopping (to serve again \
                         it must be added under a new id, with an empty data directory and \
                         --join)",
                        self.node.id()
                    );
                    std::process::exit(0);
                }
                Err(e) => self.storage_failed(&e),
            }
        }
    }

    /// The log could not be written or synced (a full disk, an I/O error) or a leader's
    /// snapshot did not restore: this node must not acknowledge anything more. Its clients'
    /// connections go with the process; the others go on.
    fn storage_failed(&self, e: &str) -> ! {
        crate::log_error!("cluster node {} stops: {e}", self.node.id());
        std::process::exit(EXIT_STORAGE_FAILED);
    }

    /// One message from the workers or the admin port, received at `now`; false on shutdown.
    fn take(&mut self, msg: ToOwner, now: Instant) -> bool {
        match msg {
            ToOwner::Shutdown => return false,
            ToOwner::Batch(b) => {
                let n = b.ops.len() as u64;
                let queue = &self.core.shared.owner_queue;
                queue.fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
                self.core.admit(&mut self.state, b, now)
            }
            ToOwner::Admin(crate::admin::data::Query::Cluster, reply) => {
                let _ = reply.send(crate::admin::data::Answer::Cluster(Some(self.status())));
            }
            ToOwner::Admin(crate::admin::data::Query::ClusterChange(change), reply) => {
                let answer = self.change_membership(change);
                let _ = reply.send(crate::admin::data::Answer::ClusterChange(answer));
            }
            ToOwner::Admin(Query::Ping, reply) => {
                let answer = match self.health(now) {
                    Ok(()) => Answer::Pong,
                    Err(why) => Answer::Unhealthy(why),
                };
                let _ = reply.send(answer);
            }
            ToOwner::Admin(query, reply) => {
                let shared = &self.core.shared;
                let now = Now::from_unix_ms(self.state.clock_ms().max(clock(shared).ms));
                let mut answer = exec_admin::answer(&self.state.tables, shared, now, query);
                if let Answer::Metrics(s) | Answer::Status(s, _) = &mut answer {
                    s.cluster = Some(Box::new(self.metrics()));
                }
                let _ = reply.send(answer);
            }
        }
        true
    }

    /// Every member's peer address, this node's too.
    fn peers(&self) -> BTreeMap<u64, std::net::SocketAddr> {
        let mut peers = self.node.peers();
        peers.insert(self.node.id(), self.node.peer_addr());
        peers
    }

    fn status(&self) -> crate::admin::data::ClusterStatus {
        let now = Instant::now();
        let l = &self.core.liveness;
        let heard = self.node.heard();
        let election = self.core.election;
        crate::admin::data::ClusterStatus {
            node: l.me,
            role: self.node.role_name().to_string(),
            leader: self.node.leader(),
            term: self.node.term(),
            applied: self.node.applied(),
            log_time_ms: self.state.clock_ms(),
            fenced: l.fenced,
            peers: self
                .peers()
                .iter()
                .map(|(&id, addr)| {
                    let ago = heard
                        .get(&id)
                        .map(|&t| now.saturating_duration_since(t).as_millis() as u64);
                    (id, addr.to_string(), ago)
                })
                .collect(),
            commit: self.node.commit_index(),
            reachable: self.core.reachable(&self.node, now, election),
            health: self.health(now),
            voters: sorted(&l.voters),
            voters_outgoing: sorted(&l.outgoing),
            peer_tls: self.node.peer_tls(),
            peer_refused: self
                .node
                .transport_stats()
                .refused
                .load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Whether this node can grant locks (`/healthz`, `/cluster`, `/status.json`): it is not
    /// fenced, knows a leader, and has heard from a quorum within the session timeout.
    fn health(&self, now: Instant) -> Result<(), String> {
        let l = &self.core.liveness;
        if l.fenced {
            let cut_off = micros(&self.core.shared, now).saturating_sub(l.contact);
            return Err(format!(
                "fenced: no quorum contact for {} ms",
                cut_off / 1_000
            ));
        }
        if self.node.leader() == 0 {
            return Err("no leader".into());
        }
        let within = Duration::from_micros(l.session_timeout);
        if !self.core.quorum_within(&self.node, now, within) {
            return Err("no quorum".into());
        }
        Ok(())
    }

    /// `/metrics`' cluster figures.
    fn metrics(&self) -> ClusterMetrics {
        let w = &self.core.watch;
        ClusterMetrics {
            status: self.status(),
            proposal_apply: w.proposal_apply.clone(),
            log_sync: self.node.log_sync_times(),
            snapshot_bytes: self.node.snapshot_bytes(),
            log_file_bytes: self.node.log_file_bytes(),
            log_cached_bytes: self.node.log_cache().0,
            log_entries_read: self.node.log_cache().1,
            snapshots: self.node.snapshot_stats().clone(),
            quorum_losses: w.quorum_losses,
            fences: w.fences,
            leader_changes: w.leader_changes,
            no_quorum_answers: w.no_quorum_answers,
            snapshot_transfer: {
                use std::sync::atomic::Ordering::Relaxed;
                let t = self.node.transport_stats();
                crate::admin::data::SnapshotTransfer {
                    in_flight: t.snapshot_bytes_in_flight().into_iter().collect(),
                    bytes_sent: t.snapshot_bytes_sent.load(Relaxed),
                    bytes_received: t.snapshot_bytes_received.load(Relaxed),
                    completed: t.snapshot_transfers_completed.load(Relaxed),
                    failed: t.snapshot_transfers_failed.load(Relaxed),
                    resumed: t.snapshot_transfers_resumed.load(Relaxed),
                }
            },
        }
    }

    /// `cluster add` / `cluster remove`: propose the change (raft joint consensus; raft-rs's
    /// leader leaves the joint configuration by itself once it is applied).
    fn change_membership(
        &mut self,
        change: crate::admin::data::MemberChange,
    ) -> Result<String, (u16, String)> {
        use crate::admin::data::MemberChange;
        use raft::prelude::{ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2};
        let cs = self.node.conf_state();
        if !cs.voters_outgoing.is_empty() {
            return Err((409, "a membership change is under way".into()));
        }
        let mut single = ConfChangeSingle::default();
        let mut cc = ConfChangeV2::default();
        let what = match change {
            MemberChange::Add(id, addr) => {
                if id == 0 || id > u64::from(u16::MAX) {
                    return Err((400, format!("node id {id}: 1 to 65535")));
                }
                if conf_members(&cs).contains(&id) {
                    return Err((409, format!("node {id} is already a member")));
                }
                if self.state.membership.removed.contains(&id) {
                    return Err((
                        409,
                        format!("node {id} was removed: a node comes back under a new id"),
                    ));
                }
                if self.peers().values().any(|a| *a == addr) {
                    return Err((409, format!("{addr} is already a member's address")));
                }
                single.set_change_type(ConfChangeType::AddNode);
                single.node_id = id;
                cc.context = format!("{id}={addr}").into_bytes().into();
                format!("adding node {id} at {addr}")
            }
            MemberChange::Remove(id) => {
                if !cs.voters.contains(&id) {
                    return Err((404, format!("node {id} is not a member")));
                }
                if cs.voters.len() == 1 {
                    return Err((409, "the last member cannot be removed".into()));
                }
                single.set_change_type(ConfChangeType::RemoveNode);
                single.node_id = id;
                format!("removing node {id}")
            }
        };
        cc.set_transition(ConfChangeTransition::Implicit);
        cc.mut_changes().push(single);
        self.node
            .propose_conf_change(cc)
            .map_err(|e| (503, format!("not proposed: {e}")))?;
        crate::log_info!("cluster: {what} (proposed)");
        Ok(format!("{what}: proposed"))
    }
}

impl<K: Wake> OwnerCore<K> {
    /// The loop of node `node` (started, its state restored) for run `incarnation`, with the
    /// workers' reply channels `workers`, at `now`.
    #[allow(clippy::too_many_arguments)]
    pub fn new<S: LogStore, T: PeerLink, C: Clock>(
        shared: Arc<Shared>,
        workers: Vec<(Sender<Replies>, K)>,
        node: &RaftNode<S, T, C>,
        incarnation: u64,
        session_timeout: Micros,
        election: Duration,
        on_quorum_loss: Option<String>,
        now: Instant,
    ) -> OwnerCore<K> {
        let cs = node.conf_state();
        let mut liveness = Liveness::new(
            node.id(),
            cs.voters,
            session_timeout,
            election.as_micros() as Micros,
            micros(&shared, now),
        );
        liveness.outgoing = cs.voters_outgoing;
        publish_write_deadline(&shared, liveness.write_deadline());
        OwnerCore {
            pools: workers.iter().map(|_| Pools::default()).collect(),
            shared,
            workers,
            incarnation,
            seq: 0,
            // The first proposal, empty, announces this run (ending the sessions of the last).
            queued: VecDeque::from([Queued {
                batch: Batch::default(),
                waiting_since: None,
            }]),
            queued_bytes: 0,
            inflight: VecDeque::new(),
            leader_seen: 0,
            was_leader: false,
            election,
            liveness,
            on_quorum_loss,
            poisoned: HashSet::new(),
            watch: Watch {
                proposal_apply: Histogram::default(),
                quorum_losses: 0,
                fences: 0,
                leader_changes: 0,
                no_quorum_answers: 0,
                leader: (0, 0),
                quorum: None,
                quorum_lost_at: None,
                next_look: now,
                quorum_log: crate::log::Limiter::default(),
                leader_log: crate::log::Limiter::default(),
            },
            mutations: Mutations::default(),
        }
    }

    /// One round of the loop, after the messages of this turn were taken and stepped: tick,
    /// propose, handle raft's `Ready` (apply, persist, send), follow a membership change, let
    /// go of this node's proposals seen applied, watch (expiries, fencing), look (leader and
    /// quorum changes), propose a new leader's lease extension, and send the workers their
    /// replies. An error is a storage failure (the node must stop).
    pub fn round<S: LogStore, T: PeerLink, C: Clock, M: OwnerState>(
        &mut self,
        node: &mut RaftNode<S, T, C>,
        st: &mut M,
        now: Instant,
    ) -> Result<Outcome, String> {
        node.tick(now)?;
        // The state machine's clock at `now`, read once a round (proposals carry it).
        let wall = clock_at(&self.shared, now).ms;
        self.propose(node, st, now, wall);
        self.ready(node, st)?;
        if node.take_conf_changed() && self.conf_changed(node, st) {
            self.send_replies(st);
            return Ok(Outcome::Removed);
        }
        self.settle(node, st, wall);
        self.watch(node, st, now, wall);
        self.look(node, st, now);
        let leader = node.is_leader();
        if leader && !self.was_leader {
            self.announce_leadership(node, st, wall);
        }
        if leader != self.was_leader {
            crate::log_info!(
                "cluster node {}: {} in term {}",
                node.id(),
                if leader { "leader" } else { "follower" },
                node.term()
            );
            self.was_leader = leader;
        }
        self.send_replies(st);
        Ok(Outcome::Running)
    }

    /// This node's proposals seen applied leave the flight. Those applied in a leader's
    /// snapshot installed here made no replies: their requests get the no-quorum answer
    /// (applied once, nothing more to learn), or their clients would wait for good.
    fn settle<S: LogStore, T: PeerLink, C: Clock, M: OwnerState>(
        &mut self,
        node: &RaftNode<S, T, C>,
        st: &mut M,
        wall: u64,
    ) {
        let state = st.replicated_mut();
        let mut applied_at = None;
        while let Some(f) = self.inflight.front() {
            if state.mine_applied < f.seq {
                break;
            }
            let mut f = self.inflight.pop_front().expect("checked");
            let forget = self.mutations.forget_installed_requests;
            if f.seq <= state.installed_through && f.waiting_since.is_some() && !forget {
                for b in &mut f.batches {
                    let n = refuse_requests(&mut self.poisoned, &mut state.outbox, b, wall);
                    self.watch.no_quorum_answers += n as u64;
                }
            }
            // One clock read per round that saw any of this node's proposals applied.
            let at = *applied_at.get_or_insert_with(|| node.now());
            let ns = at.saturating_duration_since(f.proposed).as_nanos();
            let ns = u64::try_from(ns).unwrap_or(u64::MAX);
            self.watch.proposal_apply.observe_in(&CLUSTER_BOUNDS, ns, 1);
            self.recycle(f.batches);
        }
    }

    /// This node has just been elected: restart every running lease and orphan window with
    /// its remaining time plus an election timeout (the old leader's clock and this one's may
    /// differ, and the time the election took must not eat into anybody's lease).
    fn announce_leadership<S: LogStore, T: PeerLink, C: Clock, M: OwnerState>(
        &mut self,
        node: &mut RaftNode<S, T, C>,
        st: &M,
        wall: u64,
    ) {
        let mut data = Vec::with_capacity(LEADER_LEN);
        let time = wall.max(st.replicated().clock_ms());
        let extend = self.election.as_millis() as u64;
        Replicated::encode_leader(node.term(), node.id(), extend, time, &mut data);
        if !node.propose(data) {
            crate::log_warn!("cluster: a new leader's lease extension was not proposed");
        }
    }

    /// A peer's raft message, received at `now`.
    pub fn step<S: LogStore, T: PeerLink, C: Clock, M: OwnerState>(
        &mut self,
        node: &mut RaftNode<S, T, C>,
        st: &mut M,
        m: raft::prelude::Message,
        now: Instant,
    ) {
        // Messages that waited while this process was stopped must not hide that it was cut
        // off meanwhile: look first, then count them.
        let t = micros(&self.shared, now);
        self.fence_check(node, st, t, now);
        self.liveness.heard(m.from, t);
        node.step(m);
    }

    /// After each round: as leader, expire the sessions of nodes unheard from for the session
    /// timeout; on every node, fence or unfence on losing or regaining contact with a quorum.
    fn watch<S: LogStore, T: PeerLink, C: Clock, M: OwnerState>(
        &mut self,
        node: &mut RaftNode<S, T, C>,
        st: &mut M,
        now: Instant,
        wall: u64,
    ) {
        let t = micros(&self.shared, now);
        node.probe_quorum(t);
        if let Some(deadline) = self.liveness.confirmed(node.quorum_confirmed()) {
            publish_write_deadline(&self.shared, deadline);
        }
        if self.mutations.leader_does_not_wait && node.is_leader() {
            self.liveness.leader_since.get_or_insert(0);
        }
        let state = st.replicated();
        let due = self
            .liveness
            .expiries(node.is_leader(), t, |p| state.has_sessions_of(p as u16));
        for e in due {
            let mut data = Vec::with_capacity(EXPIRE_LEN);
            let time = wall.max(state.clock_ms());
            Replicated::encode_expire(e.node, time, &mut data);
            let sessions = state.tables.sessions.conns_of_node(e.node as u16).len();
            if node.propose(data) {
                crate::log_warn!(
                    "cluster: node {} unheard from for {} ms: expiring its {sessions} sessions",
                    e.node,
                    e.unheard_us / 1_000
                );
            }
        }
        self.fence_check(node, st, t, now);
    }

    /// Fence this node on losing contact with a quorum, unfence it on regaining it (`t`: `now`
    /// on the liveness clock).
    fn fence_check<S: LogStore, T: PeerLink, C: Clock, M: OwnerState>(
        &mut self,
        node: &RaftNode<S, T, C>,
        st: &mut M,
        t: Micros,
        now: Instant,
    ) {
        let Some(fence) = self.liveness.fence_check(t) else {
            return;
        };
        let me = self.liveness.me;
        let event = match fence {
            Fence::Lost { for_us } => {
                self.watch.fences += 1;
                let state = st.replicated_mut();
                let conns = state.tables.sessions.conns_of_node(me as u16);
                crate::log_warn!(
                    "cluster: fenced: no quorum contact for {} ms: closing this node's {} client \
                     connections",
                    for_us / 1_000,
                    conns.len()
                );
                for conn in conns {
                    state.outbox.abort(conn);
                }
                "quorum-lost"
            }
            Fence::Regained => {
                crate::log_info!("cluster: unfenced: a leader confirmed quorum contact again");
                "quorum-regained"
            }
        };
        if let Some(program) = self.on_quorum_loss.clone() {
            let role = node.role_name().to_string();
            let mut ids = self.reachable(node, now, self.election);
            ids.push(me);
            ids.sort_unstable();
            let reachable: Vec<String> = ids.iter().map(u64::to_string).collect();
            poncio(program, me, event, role, reachable.join(","));
        }
    }

    /// How long to wait at `now` for a message: until the next tick, a retry, a no-quorum
    /// answer, or a due timer.
    pub fn wait<S: LogStore, T: PeerLink, C: Clock>(
        &self,
        node: &RaftNode<S, T, C>,
        now: Instant,
    ) -> Duration {
        let mut until = node.next_tick();
        if let Some(f) = self.inflight.front() {
            until = until.min(f.tried + retry_after(self.election, f.sent));
        }
        if let Some(at) = self.give_up_at() {
            until = until.min(at);
        }
        if !self.queued.is_empty() && self.room_in_flight() {
            until = now;
        }
        until.saturating_duration_since(now)
    }

    /// The other members heard from (any frame) within `within` of `now`, in id order.
    fn reachable<S: LogStore, T: PeerLink, C: Clock>(
        &self,
        node: &RaftNode<S, T, C>,
        now: Instant,
        within: Duration,
    ) -> Vec<u64> {
        let me = self.liveness.me;
        node.heard()
            .into_iter()
            .filter(|&(id, t)| id != me && now.saturating_duration_since(t) <= within)
            .map(|(id, _)| id)
            .collect()
    }

    /// Whether this node and the members heard from within `within` make a quorum of the
    /// voters (of both configurations during a membership change).
    fn quorum_within<S: LogStore, T: PeerLink, C: Clock>(
        &self,
        node: &RaftNode<S, T, C>,
        now: Instant,
        within: Duration,
    ) -> bool {
        let mut reached = self.reachable(node, now, within);
        reached.push(self.liveness.me);
        let majority = |voters: &[u64]| {
            let n = voters.iter().filter(|v| reached.contains(v)).count();
            2 * n > voters.len()
        };
        let l = &self.liveness;
        !l.voters.is_empty()
            && majority(&l.voters)
            && (l.outgoing.is_empty() || majority(&l.outgoing))
    }

    /// After each round: a change of leader, this node's own sessions expired by the cluster,
    /// and (once per tick) losing or regaining a quorum of reachable voters: counted, and one
    /// log line each (the repeatable ones rate-limited).
    fn look<S: LogStore, T: PeerLink, C: Clock, M: OwnerState>(
        &mut self,
        node: &RaftNode<S, T, C>,
        st: &mut M,
        now: Instant,
    ) {
        // A new leader, or the same node elected again for a new term: a new leadership.
        let leader = (node.leader(), node.term());
        if leader.0 != 0 && leader != self.watch.leader {
            self.watch.leader_changes += 1;
            if let Some(more) = self.watch.leader_log.ready(crate::log::Level::Info) {
                let was = match self.watch.leader {
                    (0, _) => String::new(),
                    (n, t) => format!(", was node {n} in term {t}"),
                };
                crate::log_info!(
                    "cluster: leader is node {} in term {}{was}{}",
                    leader.0,
                    leader.1,
                    unlogged(more, "leader changes")
                );
            }
            self.watch.leader = leader;
        }
        if let Some(n) = st.replicated_mut().own_expiry.take() {
            crate::log_warn!(
                "cluster: the cluster expired this node's {n} sessions (it was cut off from the \
                 leader for the session timeout)"
            );
        }
        if now < self.watch.next_look {
            return;
        }
        self.watch.next_look = now + self.election / TICKS_PER_ELECTION as u32;
        let ok = self.quorum_within(node, now, self.election);
        let was = self.watch.quorum;
        if was.is_none() && !ok {
            return;
        }
        self.watch.quorum = Some(ok);
        if was.is_none() || was == Some(ok) {
            return;
        }
        let line = self.watch.quorum_log.ready(crate::log::Level::Info);
        if ok {
            let after = self
                .watch
                .quorum_lost_at
                .take()
                .map_or(0, |t| now.saturating_duration_since(t).as_millis());
            if let Some(more) = line {
                crate::log_info!(
                    "cluster: quorum regained after {after} ms: reachable {:?}{}",
                    self.reachable(node, now, self.election),
                    unlogged(more, "quorum changes")
                );
            }
        } else {
            self.watch.quorum_losses += 1;
            self.watch.quorum_lost_at = Some(now);
            if let Some(more) = line {
                crate::log_warn!(
                    "cluster: quorum lost: of the voters {:?}, only {:?} heard from within {} ms{}",
                    sorted(&self.liveness.voters),
                    self.reachable(node, now, self.election),
                    self.election.as_millis(),
                    unlogged(more, "quorum changes")
                );
            }
        }
    }

    /// A membership change applied (or a snapshot installed): the members this node watches
    /// follow raft's configuration, and the removed nodes that still have sessions are departed
    /// ones for the leader to expire. True when this node finds itself removed (it stops).
    fn conf_changed<S: LogStore, T: PeerLink, C: Clock, M: OwnerState>(
        &mut self,
        node: &RaftNode<S, T, C>,
        st: &M,
    ) -> bool {
        let cs = node.conf_state();
        let me = node.id();
        let l = &mut self.liveness;
        l.voters = cs.voters;
        l.outgoing = cs.voters_outgoing;
        let state = st.replicated();
        for &gone in &state.membership.removed {
            if gone != me && state.has_sessions_of(gone as u16) {
                l.departed.insert(gone);
            }
        }
        state.membership.removed.contains(&me)
    }

    /// Answer with no quorum what has waited two election timeouts (see [`Self::give_up`]);
    /// propose everything in flight again when the oldest is overdue; propose the queued
    /// batches (or, on the leader with nothing in flight, an empty entry for a due timer) while
    /// fewer than the cap are in flight.
    fn propose<S: LogStore, T: PeerLink, C: Clock, M: OwnerState>(
        &mut self,
        node: &mut RaftNode<S, T, C>,
        st: &mut M,
        now: Instant,
        wall: u64,
    ) {
        let time = wall.max(st.replicated().clock_ms());
        if self.give_up_at().is_some_and(|at| at <= now) {
            self.give_up(node.id(), st, time);
        }
        // A new leader (raft-rs dropped whatever the old one had not appended): propose again
        // at once rather than when the retry is due.
        let leader = node.leader();
        let new_leader = leader != 0 && leader != self.leader_seen;
        self.leader_seen = leader;
        if let Some(oldest) = self.inflight.front() {
            if new_leader
                || now.saturating_duration_since(oldest.tried)
                    >= retry_after(self.election, oldest.sent)
            {
                for f in self.inflight.iter_mut() {
                    f.sent = node.propose(f.data.clone());
                    f.tried = now;
                }
                return;
            }
        }
        if !self.room_in_flight() {
            return;
        }
        let due = self.inflight.is_empty()
            && node.is_leader()
            && (st.replicated().tables.next_deadline()).is_some_and(|d| d <= time);
        if self.queued.is_empty() && !due {
            return;
        }
        self.split_front();
        let mut take = 0;
        let mut bytes = 0;
        for q in self.queued.iter().take(MAX_BATCHES_PER_PROPOSAL) {
            let b = batch_bytes(&q.batch);
            if take > 0 && bytes + b > MAX_ENTRY_BYTES {
                break;
            }
            take += 1;
            bytes += b;
        }
        let mut waiting_since = None;
        let mut batches = Vec::with_capacity(take);
        for q in self.queued.drain(..take) {
            waiting_since = waiting_since.or(q.waiting_since);
            self.queued_bytes = self.queued_bytes.saturating_sub(batch_bytes(&q.batch));
            batches.push(q.batch);
        }
        self.seq += 1;
        let data = self.commands_proposal(node.id(), self.seq, time, &batches);
        let sent = node.propose(data.clone());
        self.inflight.push_back(InFlight {
            seq: self.seq,
            data,
            batches,
            waiting_since,
            proposed: now,
            tried: now,
            sent,
        });
    }

    /// Times this node fenced itself.
    pub fn fences(&self) -> u64 {
        self.watch.fences
    }

    /// Whether the owner takes more batches from the workers.
    pub fn take_more(&self) -> bool {
        self.queued.len() < MAX_QUEUED_BATCHES && self.queued_bytes < MAX_QUEUED_BYTES
    }

    /// Whether another proposal may go out: fewer than [`MAX_INFLIGHT_PROPOSALS`] in flight,
    /// with fewer than [`MAX_INFLIGHT_BYTES`] in them.
    fn room_in_flight(&self) -> bool {
        self.inflight.len() < MAX_INFLIGHT_PROPOSALS
            && self.inflight.iter().map(|f| f.data.len()).sum::<usize>() < MAX_INFLIGHT_BYTES
    }

    /// A first queued batch larger than an entry is cut into pieces of at most
    /// [`MAX_ENTRY_BYTES`] (at least one request each), in one pass: the first keeps the
    /// batch, each other gets an arena of its own requests' bytes only (re-encoded), so a batch
    /// of any size costs one copy of itself.
    fn split_front(&mut self) {
        let Some(q) = self.queued.front_mut() else {
            return;
        };
        if batch_bytes(&q.batch) <= MAX_ENTRY_BYTES || q.waiting_since.is_none() {
            return;
        }
        let limits = command::Limits::default();
        let mut pieces: Vec<Batch> = Vec::new();
        let mut scratch = Vec::new();
        let (mut fit, mut size) = (0, 0);
        for (n, m) in q.batch.ops.iter().enumerate() {
            scratch.clear();
            command::encode_op(m, &q.batch.arena.bytes, &mut scratch);
            if n > 0 && size + scratch.len() > MAX_ENTRY_BYTES {
                pieces.push(Batch {
                    worker: q.batch.worker,
                    stamp: q.batch.stamp,
                    ..Default::default()
                });
                size = 0;
            }
            size += scratch.len();
            match pieces.last_mut() {
                None => fit = n + 1,
                Some(piece) => {
                    let mut r = Reader::new(&scratch);
                    match command::decode_op(&mut r, limits, &mut piece.arena) {
                        Ok(op) => piece.ops.push(op),
                        // What encode_op wrote decodes; were it not so, keep the batch whole.
                        Err(_) => return,
                    }
                }
            }
        }
        if pieces.is_empty() {
            return;
        }
        let before = batch_bytes(&q.batch);
        q.batch.ops.truncate(fit);
        let since = q.waiting_since;
        let requests = |b: &Batch| b.ops.iter().any(|m| is_request(&m.op));
        q.waiting_since = since.filter(|_| requests(&q.batch));
        let mut after = batch_bytes(&q.batch);
        for (k, piece) in pieces.into_iter().enumerate() {
            after += batch_bytes(&piece);
            let waiting_since = since.filter(|_| requests(&piece));
            self.queued.insert(
                1 + k,
                Queued {
                    batch: piece,
                    waiting_since,
                },
            );
        }
        self.queued_bytes = (self.queued_bytes + after).saturating_sub(before);
    }

    /// When the oldest request not yet answered will have waited two election timeouts. (The
    /// proposals in flight are older than the queued batches, and each is in the order of
    /// arrival; no two queued batches in a row are without requests.)
    fn give_up_at(&self) -> Option<Instant> {
        let oldest = (self.inflight.iter().find_map(|f| f.waiting_since))
            .or_else(|| self.queued.iter().find_map(|q| q.waiting_since))?;
        Some(oldest + 2 * self.election)
    }

    fn commands_proposal(&self, me: u64, seq: u64, time: u64, batches: &[Batch]) -> Vec<u8> {
        let mut data = Vec::with_capacity(HEADER_LEN + 64);
        data.push(KIND_COMMANDS);
        data.extend_from_slice(&me.to_le_bytes());
        data.extend_from_slice(&self.incarnation.to_le_bytes());
        data.extend_from_slice(&seq.to_le_bytes());
        command::encode_entry_of_batches(time, batches.iter(), &mut data);
        data
    }

    /// The oldest request not yet answered has waited two election timeouts for a quorum:
    /// answer every request not yet answered, in flight and queued, in the order they came,
    /// with the protocol's no-quorum reply, closing their connections (a request waiting behind
    /// one given up cannot be applied before it, and its connection's requests must be
    /// answered in order). The proposals in flight stay there with only their connection
    /// events, under their sequence numbers; the queued batches become one batch of connection
    /// events. Every batch is looked through, those without requests too: a connection's close
    /// there, after a request of it answered here, ends its poisoning.
    fn give_up<M: OwnerState>(&mut self, me: u64, st: &mut M, time: u64) {
        let out = &mut st.replicated_mut().outbox;
        let mut answered = 0;
        for i in 0..self.inflight.len() {
            let f = &mut self.inflight[i];
            let waiting = f.waiting_since.take().is_some();
            for b in &mut f.batches {
                answered += refuse_requests(&mut self.poisoned, out, b, time);
            }
            if waiting {
                let f = &self.inflight[i];
                let data = self.commands_proposal(me, f.seq, time, &f.batches);
                self.inflight[i].data = data;
            }
        }
        let mut held: Option<Batch> = None;
        for mut q in std::mem::take(&mut self.queued) {
            answered += refuse_requests(&mut self.poisoned, out, &mut q.batch, time);
            match &mut held {
                None => held = Some(q.batch),
                Some(h) => {
                    h.ops.append(&mut q.batch.ops);
                    super::recycle(&mut self.pools, q.batch);
                }
            }
        }
        self.queued_bytes = 0;
        if let Some(mut batch) = held {
            forget_unproposed_connections(&mut batch.ops, 0);
            self.queued_bytes = batch_bytes(&batch);
            self.queued.push_back(Queued {
                batch,
                waiting_since: None,
            });
        }
        self.watch.no_quorum_answers += answered as u64;
        if answered > 0 {
            crate::log_warn!(
                "cluster node {me}: no quorum for {} ms, answering {answered} requests with \
                 no-quorum errors",
                (2 * self.election).as_millis()
            );
        }
    }

    /// A worker's batch, received at `now`, queued for the next proposal; requests of
    /// connections given up on are answered at once instead. A batch without requests joins
    /// the last queued one if that has none either.
    pub fn admit<M: OwnerState>(&mut self, st: &mut M, mut b: Batch, now: Instant) {
        if !self.poisoned.is_empty() {
            let time = clock_at(&self.shared, now).ms;
            let out = &mut st.replicated_mut().outbox;
            let answered = refuse_poisoned(&mut self.poisoned, out, &mut b, time);
            self.watch.no_quorum_answers += answered as u64;
        }
        if b.ops.is_empty() {
            super::recycle(&mut self.pools, b);
            return;
        }
        let requests = b.ops.iter().any(|m| is_request(&m.op));
        if !requests {
            if let Some(last) = self.queued.back_mut().filter(|q| q.waiting_since.is_none()) {
                let from = last.batch.ops.len();
                last.batch.ops.append(&mut b.ops);
                forget_unproposed_connections(&mut last.batch.ops, from);
                super::recycle(&mut self.pools, b);
                return;
            }
        }
        self.queued_bytes += batch_bytes(&b);
        self.queued.push_back(Queued {
            batch: b,
            waiting_since: requests.then_some(now),
        });
    }

    /// Handle every `Ready`. Replies that the log produces for connections given up on are
    /// dropped: they answer a proposal that was abandoned and committed after all, and the
    /// client has had its no-quorum answer.
    fn ready<S: LogStore, T: PeerLink, C: Clock, M: OwnerState>(
        &mut self,
        node: &mut RaftNode<S, T, C>,
        st: &mut M,
    ) -> Result<(), String> {
        if self.poisoned.is_empty() {
            return node.ready(st);
        }
        let marks: Vec<usize> = st
            .replicated()
            .outbox
            .per_worker
            .iter()
            .map(|r| r.effects.len())
            .collect();
        let result = node.ready(st);
        let out = &mut st.replicated_mut().outbox;
        for (r, &mark) in out.per_worker.iter_mut().zip(&marks) {
            let fresh: Vec<Effect> = r.effects.drain(mark..).collect();
            let poisoned = &self.poisoned;
            let keep = |e: &Effect| e.conn.is_none_or(|c| !poisoned.contains(&c));
            r.effects.extend(fresh.into_iter().filter(keep));
        }
        result
    }

    fn recycle(&mut self, batches: Vec<Batch>) {
        for batch in batches {
            super::recycle(&mut self.pools, batch);
        }
    }

    fn send_replies<M: OwnerState>(&mut self, st: &mut M) {
        let out = &mut st.replicated_mut().outbox;
        super::send_replies(out, &self.workers, &mut self.pools, false);
    }
}

/// Let the workers write replies until `until` ([`micros`]; see `Shared::write_deadline_ms`).
fn publish_write_deadline(shared: &Shared, until: Micros) {
    let ms = until / 1_000;
    shared
        .write_deadline_ms
        .store(ms.max(1), std::sync::atomic::Ordering::Relaxed);
}

/// A cluster node allocates and frees large blocks all the time (proposals of many batches,
/// raft messages and entries, snapshots). glibc raises its mmap threshold on the first such
/// free and keeps later ones in the heap, where they stay resident: measured with 200k held
/// locks, each node held 126-133 bytes per lock against a single node's 57. A fixed threshold
/// (glibc's own starting value) makes blocks of 128 KiB and more go back to the system when
/// freed: 75-77 bytes.
fn return_large_blocks_to_the_system() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes an allocator setting; called before the node allocates its
    // state, on the owner's thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// The Great Poncio (`--on-quorum-loss`): the operator's program, run on a thread of its own
/// (never on the lock path) with what happened in its environment; its exit is logged.
fn poncio(program: String, node: u64, event: &'static str, role: String, reachable: String) {
    let spawned = std::thread::Builder::new()
        .name("holdfast-poncio".into())
        .spawn(move || {
            let status = std::process::Command::new("/bin/sh")
                .arg("-c")
                .arg(&program)
                .env("HOLDFAST_NODE_ID", node.to_string())
                .env("HOLDFAST_EVENT", event)
                .env("HOLDFAST_ROLE", role)
                .env("HOLDFAST_REACHABLE", reachable)
                .stdin(std::process::Stdio::null())
                .status();
            match status {
                Ok(s) => crate::log_info!("on-quorum-loss ({event}): {program} exited {s}"),
                Err(e) => crate::log_error!("on-quorum-loss ({event}): cannot run {program}: {e}"),
            }
        });
    if let Err(e) = spawned {
        crate::log_error!("on-quorum-loss: cannot start a thread: {e}");
    }
}

/// When to propose again a proposal not yet seen applied: one that reached a leader was
/// perhaps dropped by a leader change (half an election timeout gives the log time to commit
/// it first); one that found no leader, at the next tick.
fn retry_after(election: Duration, sent: bool) -> Duration {
    if sent {
        election / 2
    } else {
        election / crate::cluster::node::TICKS_PER_ELECTION as u32
    }
}

/// Whether a worker's op is a client's request (answered), not a connection event.
fn is_request(op: &Op) -> bool {
    !matches!(op, Op::Open { .. } | Op::Close | Op::DlockOpen | Op::Eof)
}

/// Answer every request in `b` with no quorum, in order, and take it out, poisoning its
/// connection; a connection's close after it ends that (as in [`refuse_poisoned`]). What is
/// left are connection events, which refer to no bytes of the arena. Returns how many requests
/// were answered.
fn refuse_requests(
    poisoned: &mut HashSet<ConnId>,
    out: &mut Outbox,
    b: &mut Batch,
    time: u64,
) -> usize {
    let arena = &b.arena;
    let mut answered = 0;
    b.ops.retain(|m| {
        if is_request(&m.op) {
            no_quorum(out, m, arena, time);
            poisoned.insert(m.conn);
            answered += 1;
            return false;
        }
        if matches!(m.op, Op::Close) {
            poisoned.remove(&m.conn);
        }
        true
    });
    b.arena.bytes.clear();
    answered
}

/// Take out of `ops`, connection events of queued batches (no request among them, nothing of
/// them proposed yet), every connection that opened there and closed at `from` or later: none
/// of its ops was ever proposed (a connection's open comes before anything else of it), none
/// of its requests is waiting, so the log need never hear of it.
fn forget_unproposed_connections(ops: &mut Vec<OpMsg>, from: usize) {
    let closed: HashSet<ConnId> = ops[from..]
        .iter()
        .filter(|m| matches!(m.op, Op::Close))
        .map(|m| m.conn)
        .collect();
    if closed.is_empty() {
        return;
    }
    let gone: HashSet<ConnId> = ops
        .iter()
        .filter(|m| matches!(m.op, Op::Open { .. }) && closed.contains(&m.conn))
        .map(|m| m.conn)
        .collect();
    if !gone.is_empty() {
        ops.retain(|m| !gone.contains(&m.conn));
    }
}

/// Answer the requests of given-up connections in `b` with no quorum and take them out; a
/// connection's close ends its poisoning (its slot's next connection is another one). Returns
/// how many requests were answered.
fn refuse_poisoned(
    poisoned: &mut HashSet<ConnId>,
    out: &mut Outbox,
    b: &mut Batch,
    time: u64,
) -> usize {
    let arena = &b.arena;
    let mut answered = 0;
    b.ops.retain(|m| {
        if !poisoned.contains(&m.conn) {
            return true;
        }
        if is_request(&m.op) {
            no_quorum(out, m, arena, time);
            answered += 1;
            return false;
        }
        if matches!(m.op, Op::Close) {
            poisoned.remove(&m.conn);
        }
        true
    });
    answered
}

/// The no-quorum answer to one request (`docs/cluster.md`) at the state machine's clock
/// `time`, closing its connection after it.
fn no_quorum(out: &mut Outbox, m: &OpMsg, arena: &Arena, time: u64) {
    let mut w = Vec::new();
    let close = match m.op {
        // The worker's own answer, kept in order behind the others.
        Op::Literal { bytes, close } => {
            w.extend_from_slice(bytes.get(&arena.bytes));
            close
        }
        Op::Open { .. } | Op::Close | Op::DlockOpen | Op::Eof => return,
        // A request: its protocol's answer.
        op => {
            crate::protocol::no_quorum(&op, &arena.bytes, time, &mut w);
            true
        }
    };
    out.direct(m.conn, 1, close, &w);
}

/// What a rate-limited line adds about the lines it stood for: `" (N more quorum changes
/// since the last line)"`, or nothing.
fn unlogged(more: u64, what: &str) -> String {
    if more == 0 {
        String::new()
    } else {
        format!(" ({more} more {what} since the last line)")
    }
}

fn sorted(ids: &[u64]) -> Vec<u64> {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
