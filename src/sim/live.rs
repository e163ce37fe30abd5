//! The simulator's liveness mode ([`Options::liveness`]): each simulated node runs the daemon's
//! own cluster loop, `server::owner::cluster::OwnerCore` (what `ClusterOwner` runs on its
//! thread), over the node's in-memory environment and its own rate-skewed clock: its proposals
//! in flight under its incarnation and sequence numbers, re-proposing, the no-quorum answers,
//! reachability, fencing, the leader's expiries of unreachable nodes' sessions, a new leader's
//! lease extension, membership changes, and the answers to requests applied in a snapshot it
//! installed. Its clients see what a real client would: replies written only before the node's
//! write deadline, connections closed on a crash, a fence, a write past the deadline, an
//! expiry or a no-quorum answer.
//!
//! Owns: the simulated worker of each node (it hands the owner its clients' requests as a
//! worker's batch, and writes the replies the owner sends it, checking the write deadline the
//! owner publishes, as the daemon's worker does), pauses (a node not driven, its timers and
//! messages held, resuming with stale state), the lockd clients and the client-view checks.
//! Must not: decide anything the daemon decides itself (that is the owner's loop,
//! `liveness.rs` and `Replicated`), or read a clock.
//!
//! **Client view.** A client's claim on a lock runs from the simulated instant it *receives*
//! the grant to the instant it sends the release or receives the close of its connection.
//! Two views are checked at every grant a client receives:
//! - *lease* (locker's client-side rule, the soak's rule 10): a claim also ends at the send time
//!   of the client's last answered request plus the session timeout less one election timeout,
//!   and once lapsed it is over. No two clients' lease claims on one lock overlap, ever.
//! - *connection* (the fencing promise of `docs/cluster.md`: "a client learns that it lost its locks
//!   before anyone else can be granted them"): the claim ends only by release or close. No
//!   other client may receive a grant while it is open, unless the holder's node was paused
//!   during it (a stopped process cannot close anything: that is what the lease rule is for).
//!
//! Fencing tokens: a grant whose request was sent after another grant of the lock was received
//! carries a larger token. lockd's ACQUIRED does not carry the token, so it is read from the
//! state the node applied when it made the grant (`LockdTable::token_of`).
//!
//! Faults: besides `mod.rs`'s crashes, partitions and membership changes, pauses (here) and
//! send cuts (`mod.rs`: a node stops being heard just after a failover, when it may apply its
//! clients' first requests past its write deadline). The mutations these checks catch, and
//! by which seeds: `docs/cluster.md`, "Liveness mode".

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam_channel::Receiver;

use super::*;
use crate::cluster::liveness::Micros;
use crate::core::codec::Reader;
use crate::proto::lockd::op;
use crate::server::command;
use crate::server::effect::{tag, Body};
use crate::server::msg::{Batch, ConnId, LockdOp, Op, OpMsg, Replies};
use crate::server::owner::cluster::{Mutations, Outcome, OwnerCore};
use crate::server::{Proto, Shared};

/// The simulated election timeout (raft's base; it draws 1 to 2 of them) and the session
/// timeout, by default three election timeouts (`--session-timeout`).
pub const ELECTION_US: Micros = TICK_US * ELECTION_TICKS as u64;
pub const SESSION_TIMEOUT_US: Micros = 3 * ELECTION_US;
/// Lock names the clients fight over.
const NAMES: u64 = 3;
/// A client that waited this long for an answer closes its connection: its node answers
/// "no quorum" and closes after two election timeouts (on its own clock, looked at once a
/// tick), unless it was paused.
const GIVE_UP_US: u64 = 3 * ELECTION_US;
/// Share of grants after which the client works under the lock, sending nothing, for up to
/// two session timeouts.
const IDLE_PERCENT: u64 = 30;
const IDLE_MAX_US: u64 = 2 * SESSION_TIMEOUT_US;
/// Share of a client's turns without a lock or a wait on which it closes its connection.
const RECONNECT_PERCENT: u64 = 15;
/// A client acts this often (plus up to the same again).
const CLIENT_EVERY_US: u64 = 20_000;
/// A pause lasts from half to three session timeouts.
const PAUSE_MIN_US: u64 = SESSION_TIMEOUT_US / 2;
const PAUSE_SPREAD_US: u64 = 5 * SESSION_TIMEOUT_US / 2;

/// One running node's owner loop and its one worker.
pub struct LiveNode {
    owner: OwnerCore<()>,
    /// The process state its owner and worker share (the write deadline).
    shared: Arc<Shared>,
    /// The worker's channel from the owner.
    replies: Receiver<Replies>,
    /// What the worker read from its clients and has not handed to the owner yet (held while
    /// the node is paused).
    batch: Batch,
    /// The owner's fences counted so far.
    fences: u64,
}

/// A request a client sent and has not had answered.
struct Request {
    opcode: u8,
    name: Vec<u8>,
    sent: u64,
}

#[derive(Default)]
struct Client {
    /// Its connection: the node's index and the connection's id.
    conn: Option<(usize, ConnId)>,
    pending: Option<Request>,
    /// An ACQ answered with ACK (queued): its name and send time.
    waiting: Option<(Vec<u8>, u64)>,
    /// The send time of the last request answered on this connection.
    last_answered: u64,
    /// Names it was granted and has not released (whatever it believes of them now).
    owned: Vec<Vec<u8>>,
    /// It works under a lock it was granted, sending nothing, until then: only a fence (or a
    /// crash) closes its connection meanwhile.
    idle_until: u64,
}

/// A claim on a lock ([module docs](self)).
struct Claim {
    client: usize,
    name: Vec<u8>,
    node: usize,
    start: u64,
    /// The lease view's end, once known (lapsed, released or closed).
    lease_end: Option<u64>,
    /// The connection view's end (released or closed).
    conn_end: Option<u64>,
}

/// The liveness mode's world.
pub struct LiveWorld {
    pub nodes: Vec<Option<LiveNode>>,
    pub paused_until: Vec<u64>,
    /// Per node, its pauses (start, end) in simulated time.
    pauses: Vec<Vec<(u64, u64)>>,
    clients: Vec<Client>,
    next_slot: u32,
    conn_client: BTreeMap<ConnId, usize>,
    claims: Vec<Claim>,
    /// Per lock: (received at, token) of every grant a client received.
    grants: BTreeMap<Vec<u8>, Vec<(u64, u64)>>,
    /// Per open connection, the lock tokens of the lockd replies its node applied for it and
    /// its worker has not written yet, in order (each read from the state that made it).
    tokens: BTreeMap<ConnId, VecDeque<Option<u64>>>,
    /// The known bug: connections whose sessions an expiry ended, and per lock the log
    /// indexes where a release of such a connection was applied.
    expired_conns: BTreeSet<ConnId>,
    /// HOLDFAST_SIM_TRACE=1: every client event on stderr (to read a failing seed's story).
    trace: bool,
    /// When the leader last crashed (until a leader is elected).
    leader_crashed_at: Option<u64>,
}

impl LiveWorld {
    /// A node joined (its index is the next).
    pub fn add_node(&mut self) {
        self.nodes.push(None);
        self.paused_until.push(0);
        self.pauses.push(Vec::new());
    }

    pub fn new(nodes: usize, clients: u64) -> LiveWorld {
        LiveWorld {
            nodes: (0..nodes).map(|_| None).collect(),
            paused_until: vec![0; nodes],
            pauses: vec![Vec::new(); nodes],
            clients: (0..clients).map(|_| Client::default()).collect(),
            next_slot: 1,
            conn_client: BTreeMap::new(),
            claims: Vec::new(),
            grants: BTreeMap::new(),
            tokens: BTreeMap::new(),
            expired_conns: BTreeSet::new(),
            trace: std::env::var("HOLDFAST_SIM_TRACE").is_ok_and(|v| v == "1"),
            leader_crashed_at: None,
        }
    }
}

fn lease_deadline(c: &Client) -> u64 {
    c.last_answered + SESSION_TIMEOUT_US - ELECTION_US
}

pub(super) fn name_of(payload: &[u8]) -> &[u8] {
    let end = payload
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(payload.len());
    &payload[..end]
}

fn lock_name(i: u64) -> Vec<u8> {
    format!("lock-{i}").into_bytes()
}

/// The address a simulated client connects from (what its worker's `Op::Open` carries).
fn client_addr(conn: ConnId) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], 10_000 + (conn.slot % 50_000) as u16))
}

impl<W: Workload> Cluster<W> {
    fn live(&mut self) -> &mut LiveWorld {
        self.live.as_mut().expect("liveness mode")
    }

    /// Node `i`'s monotonic clock, in microseconds: its liveness decisions' time.
    pub(super) fn local_us(&self, i: usize) -> Micros {
        self.now * self.nodes[i].rate / 1_000
    }

    /// Whether `ev` waits for a paused node: then it is held until the node resumes.
    pub(super) fn live_held(&mut self, ev: Ev) -> Option<Ev> {
        let Some(live) = &self.live else {
            return Some(ev);
        };
        let target = match &ev {
            Ev::Tick(i)
            | Ev::Restart(i)
            | Ev::SnapshotMade { i, .. }
            | Ev::Installed { i, .. }
            | Ev::TransferCheck { i, .. } => *i,
            Ev::Deliver { to, .. } | Ev::PeerClosed { to, .. } => *to,
            _ => return Some(ev),
        };
        let until = live.paused_until[target];
        if until > self.now {
            self.push(until - self.now, ev);
            return None;
        }
        Some(ev)
    }

    /// Node `i`'s process state for a new run: its clocks start at the simulator's base
    /// instant, so that the state machine's clock and the write deadline read the node's own
    /// skewed clock ([`Cluster::instant`], [`Cluster::local_ms`]).
    pub(super) fn live_shared(&self, i: usize) -> Arc<Shared> {
        let mut shared = crate::server::sim::sim_shared(holdfast::ReplicatedMachine::live_config());
        shared.started = self.epoch;
        shared.started_unix_ms = EPOCH_MS + self.nodes[i].offset_ms;
        Arc::new(shared)
    }

    /// Node `i` (re)started (its driver assembled, its state of this run restored): a new run
    /// of the owner's loop, whose first proposal (empty) announces it.
    pub(super) fn live_start(&mut self, i: usize) {
        let now = self.instant(i);
        let node = &self.nodes[i];
        let Some(raft) = node.raft.as_ref() else {
            return;
        };
        let state = crate::server::owner::cluster::OwnerState::replicated(&node.machine);
        let (shared, incarnation) = (state.shared().clone(), state.incarnation());
        let (tx, replies) = crossbeam_channel::unbounded();
        let mut owner = OwnerCore::new(
            shared.clone(),
            vec![(tx, ())],
            raft,
            incarnation,
            SESSION_TIMEOUT_US,
            Duration::from_micros(ELECTION_US),
            None,
            now,
        );
        if self.opts.bug_late_fence {
            owner.liveness.fence_after = SESSION_TIMEOUT_US + ELECTION_US;
        }
        owner.mutations = Mutations {
            forget_installed_requests: self.opts.bug_forget_installed_requests,
            leader_does_not_wait: self.opts.bug_leader_does_not_wait,
        };
        let live = self.live();
        live.nodes[i] = Some(LiveNode {
            owner,
            shared,
            replies,
            batch: Batch::default(),
            fences: 0,
        });
        live.paused_until[i] = 0;
    }

    /// Node `i` crashed: its clients' connections close at once, and so do its peers'
    /// connections to it, which each peer that it does not block sees a network delay later
    /// (a leader's close starts the daemon's fast failover).
    pub(super) fn live_crash(&mut self, i: usize) {
        if self.leader_terms.values().next_back() == Some(&self.nodes[i].id) {
            self.live().leader_crashed_at = Some(self.now);
        }
        for to in 0..self.nodes.len() {
            if to != i && self.nodes[to].raft.is_some() && !self.blocked[i][to] {
                let delay = 50 + self.rng.below(self.opts.max_delay_us);
                self.push(delay, Ev::PeerClosed { to, from: i });
            }
        }
        let live = self.live();
        live.nodes[i] = None;
        live.paused_until[i] = 0;
        let conns: Vec<ConnId> = live
            .clients
            .iter()
            .filter_map(|c| c.conn.filter(|(n, _)| *n == i).map(|(_, c)| c))
            .collect();
        for conn in conns {
            self.live_close(conn, false);
        }
    }

    /// Node `to` sees node `from`'s connection close: the daemon's peer event
    /// (`RaftNode::peer_event`, which campaigns at once if `from` led).
    pub(super) fn live_peer_closed(&mut self, to: usize, from: usize) -> Result<(), String> {
        let (now, id) = (self.instant(to), self.nodes[from].id);
        let Some(raft) = self.nodes[to].raft.as_mut() else {
            return Ok(());
        };
        raft.peer_event(PeerEvent::Closed(id), now);
        self.report.peer_closes += 1;
        self.round(to)
    }

    /// A leader was elected (liveness mode): within an election timeout of the last leader's
    /// crash, only the fast failover gets there.
    pub(super) fn live_new_leader(&mut self) {
        let now = self.now;
        if let Some(at) = self.live.as_mut().and_then(|l| l.leader_crashed_at.take()) {
            if now - at < ELECTION_US {
                self.report.fast_failovers += 1;
            }
        }
    }

    /// The pause fault: node `i` is not driven for a while.
    pub(super) fn live_pause(&mut self) {
        let i = self.rng.index(self.nodes.len());
        let len = PAUSE_MIN_US + self.rng.below(PAUSE_SPREAD_US);
        let now = self.now;
        if self.nodes[i].raft.is_none() || self.live().paused_until[i] > now {
            return;
        }
        let live = self.live();
        live.paused_until[i] = now + len;
        live.pauses[i].push((now, now + len));
        self.report.pauses += 1;
    }

    /// A raft message from a peer reaches node `to`: the owner's loop steps it (looking at its
    /// contact first: messages that waited while it was stopped must not hide that it was cut
    /// off).
    pub(super) fn live_step(&mut self, to: usize, m: Message) {
        let now = self.instant(to);
        let node = &mut self.nodes[to];
        let (Some(raft), Some(n)) = (
            node.raft.as_mut(),
            self.live.as_mut().and_then(|l| l.nodes[to].as_mut()),
        ) else {
            return;
        };
        node.io.borrow_mut().now = now;
        n.owner.step(raft, &mut node.machine, m, now);
    }

    /// One round of node `i`'s owner loop after an event, as the daemon's `ClusterOwner::run`
    /// does after waking: it takes what its worker read, then runs [`OwnerCore::round`] (again
    /// while its syncer has answers waiting: the daemon wakes for them); the simulator checks
    /// what the driver did, and the worker writes the replies.
    pub(super) fn live_round(&mut self, i: usize) -> Result<(), String> {
        loop {
            // Raft's election timeout is the seed's before the loop ticks (a message stepped
            // may have reset it).
            self.draw_election_timeout(i);
            let now = self.instant(i);
            let node = &mut self.nodes[i];
            let (Some(raft), Some(n)) = (
                node.raft.as_mut(),
                self.live.as_mut().and_then(|l| l.nodes[i].as_mut()),
            ) else {
                return Ok(());
            };
            node.io.borrow_mut().now = now;
            if !n.batch.ops.is_empty() && n.owner.take_more() {
                let b = std::mem::take(&mut n.batch);
                n.owner.admit(&mut node.machine, b, now);
            }
            let result = n.owner.round(raft, &mut node.machine, now);
            let fences = n.owner.fences();
            let new_fences = fences - std::mem::replace(&mut n.fences, fences);
            self.report.fences += new_fences;
            // A crash in the disk's fault hook loses this round's replies with the process.
            let Some((outcome, again)) = self.after_call(i, result)? else {
                return Ok(());
            };
            self.live_write(i)?;
            if outcome == Outcome::Removed && self.nodes[i].raft.is_some() {
                // It applied its own removal: its owner stops it (the process exits).
                self.nodes[i].retired = true;
                self.nodes[i].raft = None;
                self.live_crash(i);
                return Ok(());
            }
            if !again {
                return Ok(());
            }
        }
    }

    /// Node `i`'s worker writes the replies its owner sent: as the daemon's worker, nothing
    /// that the log decided once the node is past its write deadline (the connection closes
    /// instead), and a connection with an abort (a fence, an expiry of this node's sessions)
    /// closes with nothing written.
    fn live_write(&mut self, i: usize) -> Result<(), String> {
        let now = self.instant(i);
        let ignore_deadline = self.opts.bug_ignore_write_deadline;
        let Some(n) = self.live.as_mut().and_then(|l| l.nodes[i].as_mut()) else {
            return Ok(());
        };
        let replies: Vec<Replies> = n.replies.try_iter().collect();
        // The worker's `cut_off`.
        let deadline = n.shared.write_deadline_ms.load(Ordering::Relaxed);
        let since_start = now.saturating_duration_since(n.shared.started).as_millis() as u64;
        let cut_off = !ignore_deadline && deadline != 0 && since_start >= deadline;
        let mut body = Vec::new();
        for r in replies {
            let arena = &r.arena.bytes;
            for run in r.effects.chunk_by(|a, b| a.to == b.to && a.conn == b.conn) {
                let Some(conn) = run.first().and_then(|e| e.conn) else {
                    continue;
                };
                let Some(&k) = self.live().conn_client.get(&conn) else {
                    continue; // a connection closed already
                };
                if cut_off && run[0].to != crate::core::Session(0) {
                    self.report.deadline_closes += 1;
                    self.live_close(conn, true);
                    continue;
                }
                if run.iter().any(|e| matches!(e.body, Body::Abort)) {
                    self.live_close(conn, true);
                    continue;
                }
                for e in run {
                    if !self.live().conn_client.contains_key(&conn) {
                        break;
                    }
                    body.clear();
                    e.body.encode_canonical(arena, &mut body);
                    match body.as_slice() {
                        [tag::LITERAL, ..] => {
                            // The owner's own answer: no quorum, and the connection closes.
                            self.report.no_quorum_answers += 1;
                            if self.live().trace {
                                eprintln!("{} node {i}: no quorum for {conn:?}", self.now);
                            }
                        }
                        [tag::LOCKD_FRAME, opcode, payload @ ..] => {
                            let token = (self.live().tokens.get_mut(&conn))
                                .and_then(|q| q.pop_front())
                                .flatten();
                            let name = name_of(payload).to_vec();
                            self.live_reply(k, *opcode, name, token)?;
                        }
                        _ => {}
                    }
                    if e.close {
                        self.live_close(conn, true);
                    }
                }
            }
        }
        Ok(())
    }

    /// Client `k`'s worker hands its node `i` an op of connection `conn` (read now).
    fn live_read(&mut self, i: usize, conn: ConnId, op: impl FnOnce(&mut Batch) -> Op) {
        if let Some(n) = self.live.as_mut().and_then(|l| l.nodes[i].as_mut()) {
            let op = op(&mut n.batch);
            n.batch.ops.push(OpMsg { conn, op });
        }
    }

    /// The entry at `index` was applied for the first time: note the connections an expiry
    /// ends (`expired`: its node's sessions' connections before it), and the releases applied
    /// for such connections after it.
    pub(super) fn live_first(&mut self, index: u64, data: &[u8], expired: &[ConnId]) {
        if self.live().trace {
            let head: Vec<u64> = (0..3)
                .filter_map(|w| data.get(1 + 8 * w..9 + 8 * w))
                .map(|b| b.iter().rev().fold(0, |a, &x| a << 8 | u64::from(x)))
                .collect();
            eprintln!("{} log {index}: kind {:?} {head:?}", self.now, data.first());
        }
        match data.first() {
            Some(2) if data.len() == 17 => {
                // An expiry a leader's owner proposed, committed.
                self.report.expiries += 1;
                self.live().expired_conns.extend(expired.iter().copied());
            }
            Some(1) if data.len() > 25 => {
                let mut batch = crate::server::msg::Batch::default();
                if command::decode_entry(&data[25..], command::Limits::default(), &mut batch)
                    .is_err()
                {
                    return;
                }
                let live = self.live.as_mut().expect("liveness mode");
                for m in &batch.ops {
                    if live.trace {
                        eprintln!("    op {:?} {:?}", m.conn, m.op);
                    }
                    let Op::Lockd(o) = m.op else { continue };
                    // A release by a connection whose session the log ended: the state must
                    // drop it (it would free whoever holds the lock now: "anybody may release
                    // any lock"). Counted, to show the seeds reach that case.
                    if o.opcode == op::REL && live.expired_conns.contains(&m.conn) {
                        self.report.stale_releases += 1;
                    }
                }
            }
            _ => {}
        }
    }
    /// Node `i` applied an entry with `effects` (every session's, canonical form) and `tokens`
    /// (each lockd reply's lock token in the state that made it): the tokens of the replies
    /// to its own open connections wait for its worker to write them.
    pub(super) fn live_applied(
        &mut self,
        i: usize,
        effects: &[u8],
        tokens: &[Option<u64>],
    ) -> Result<(), String> {
        if self.live.is_none() {
            return Ok(());
        }
        let id = self.nodes[i].id as u16;
        let mut r = Reader::new(effects);
        let mut tokens = tokens.iter().copied();
        while r.remaining() > 0 {
            let (to, _close, body) = holdfast::next_effect(&mut r)?;
            let token = match (to, body) {
                (Some(_), [tag::LOCKD_FRAME, ..]) => tokens.next().flatten(),
                _ => continue,
            };
            let Some(to) = to.filter(|c| c.node == id) else {
                continue;
            };
            let live = self.live();
            if live.conn_client.contains_key(&to) {
                live.tokens.entry(to).or_default().push_back(token);
            }
        }
        Ok(())
    }

    /// Connection `conn` closes (the client receives the close now): its claims end; a node
    /// that still runs (`node_runs`) proposes the close.
    fn live_close(&mut self, conn: ConnId, node_runs: bool) {
        let now = self.now;
        let live = self.live();
        let Some(k) = live.conn_client.remove(&conn) else {
            return;
        };
        let c = &mut live.clients[k];
        let Some((i, _)) = c.conn.take() else {
            return;
        };
        if live.trace {
            eprintln!("{now} client {k}: {conn:?} closed (node runs: {node_runs})");
        }
        c.pending = None;
        c.waiting = None;
        c.owned.clear();
        let lease = lease_deadline(c);
        for cl in live.claims.iter_mut().filter(|cl| cl.client == k) {
            if cl.conn_end.is_none() {
                cl.conn_end = Some(now);
                cl.lease_end.get_or_insert(lease.min(now));
            }
        }
        live.tokens.remove(&conn);
        if node_runs {
            // Its worker tells the owner.
            self.live_read(i, conn, |_| Op::Close);
        }
    }

    /// Client `k` lapses: past its lease deadline its open lease claims end there.
    fn live_lapse(&mut self, k: usize) {
        let now = self.now;
        let live = self.live();
        let deadline = lease_deadline(&live.clients[k]);
        if deadline > now {
            return;
        }
        let mut lapsed = 0;
        for cl in live.claims.iter_mut().filter(|cl| cl.client == k) {
            if cl.lease_end.is_none() {
                cl.lease_end = Some(deadline);
                lapsed += 1;
            }
        }
        self.report.claims_lapsed += lapsed;
    }

    /// Client `k` receives `opcode` about `name` now (`token`: the lock's token in the state
    /// that wrote it).
    fn live_reply(
        &mut self,
        k: usize,
        opcode: u8,
        name: Vec<u8>,
        token: Option<u64>,
    ) -> Result<(), String> {
        self.live_lapse(k);
        if self.live().trace {
            let n = String::from_utf8_lossy(&name);
            eprintln!(
                "{} client {k}: receives {opcode} {n} (token {token:?})",
                self.now
            );
        }
        let c = &mut self.live().clients[k];
        let pending_is = |c: &Client, ops: &[u8]| {
            c.pending
                .as_ref()
                .is_some_and(|p| ops.contains(&p.opcode) && p.name == name)
        };
        match opcode {
            op::ACQUIRED
                if c.waiting.as_ref().is_some_and(|(n, _)| *n == name)
                    && !pending_is(c, &[op::ACQ, op::TRY]) =>
            {
                // A queued ACQ granted: it answered (ACK) already.
                let (_, sent) = c.waiting.take().unwrap_or_default();
                self.live_grant(k, name, sent, token)
            }
            op::ACQUIRED if pending_is(c, &[op::ACQ, op::TRY]) => {
                let sent = c.pending.take().map_or(0, |p| p.sent);
                c.last_answered = c.last_answered.max(sent);
                self.live_grant(k, name, sent, token)
            }
            op::ACK if pending_is(c, &[op::ACQ]) => {
                let sent = c.pending.take().map_or(0, |p| p.sent);
                c.last_answered = c.last_answered.max(sent);
                c.waiting = Some((name, sent));
                Ok(())
            }
            op::WBLOCK | op::RELEASED | op::ERR if c.pending.is_some() => {
                let sent = c.pending.take().map_or(0, |p| p.sent);
                c.last_answered = c.last_answered.max(sent);
                Ok(())
            }
            _ => Err(format!(
                "client {} got opcode {} for {} unasked",
                k,
                opcode,
                String::from_utf8_lossy(&name)
            )),
        }
    }

    /// Client `k` receives a grant of `name` now, for its request sent at `sent`: the checks.
    fn live_grant(
        &mut self,
        k: usize,
        name: Vec<u8>,
        sent: u64,
        token: Option<u64>,
    ) -> Result<(), String> {
        let now = self.now;
        let live = self.live.as_mut().expect("liveness mode");
        let (own_node, _) = live.clients[k]
            .conn
            .expect("a client with a reply has a connection");
        let own_lease_open = lease_deadline(&live.clients[k]) > now;
        for cl in live.claims.iter() {
            if cl.name != name {
                continue;
            }
            let open = cl.conn_end.is_none_or(|e| e > now);
            let holder = &live.clients[cl.client];
            let lease_end = cl
                .lease_end
                .unwrap_or_else(|| lease_deadline(holder).min(cl.conn_end.unwrap_or(u64::MAX)));
            if own_lease_open && lease_end > now && cl.start < lease_end {
                return Err(format!(
                    "lease view: {} granted to client {} (node {}) at {} µs while client {} \
                     (node {}) holds it since {} until {}",
                    String::from_utf8_lossy(&name),
                    k,
                    self.nodes[own_node].id,
                    now,
                    cl.client,
                    self.nodes[cl.node].id,
                    cl.start,
                    lease_end
                ));
            }
            let paused = live.pauses[cl.node]
                .iter()
                .any(|&(a, b)| a <= now && b >= cl.start);
            if open && !paused {
                return Err(format!(
                    "connection view: {} granted to client {} (node {}) at {} µs while client {} \
                     (node {}, not paused) holds it since {} and its connection is open",
                    String::from_utf8_lossy(&name),
                    k,
                    self.nodes[own_node].id,
                    now,
                    cl.client,
                    self.nodes[cl.node].id,
                    cl.start
                ));
            }
            if open {
                self.report.conn_view_excused += 1;
            }
        }
        if let Some(token) = token {
            let list = live.grants.entry(name.clone()).or_default();
            if let Some(&(at, t)) = list.iter().find(|&&(at, t)| at < sent && t >= token) {
                return Err(format!(
                    "token: {} granted to client {} with token {} for a request sent at {} µs, \
                     after a grant with token {} was received at {} µs",
                    String::from_utf8_lossy(&name),
                    k,
                    token,
                    sent,
                    t,
                    at
                ));
            }
            list.push((now, token));
            self.report.tokens_checked += 1;
        }
        // Claims that ended long ago prove nothing more.
        live.claims
            .retain(|cl| cl.conn_end.is_none_or(|e| e + SESSION_TIMEOUT_US > now));
        live.claims.push(Claim {
            client: k,
            name: name.clone(),
            node: own_node,
            start: now,
            lease_end: (!own_lease_open).then_some(now),
            conn_end: None,
        });
        live.clients[k].owned.push(name);
        self.report.live_grants += 1;
        if self.rng.chance(IDLE_PERCENT) {
            let work = self.rng.below(IDLE_MAX_US);
            self.live().clients[k].idle_until = now + work;
        }
        Ok(())
    }

    /// Client `k` acts: connects if it has no connection, gives up on a request unanswered for
    /// too long, or sends its next request (a release, an ACQ or a TRY) through its node.
    pub(super) fn live_client_event(&mut self, k: u64) -> Result<(), String> {
        let k = k as usize;
        // Quiet at the end, so that the nodes converge (the final check).
        let end = (self.opts.chaos_ms + self.opts.quiet_ms) * 1000;
        if self.now + 2 * RETRY_US > end {
            return Ok(());
        }
        let next = CLIENT_EVERY_US + self.rng.below(CLIENT_EVERY_US);
        self.push(next, Ev::Client(k as u64));
        self.live_lapse(k);
        let now = self.now;
        if self.live().clients[k].conn.is_none() {
            let up: Vec<usize> = (0..self.nodes.len())
                .filter(|&i| self.nodes[i].raft.is_some())
                .collect();
            if up.is_empty() {
                return Ok(());
            }
            let i = up[self.rng.index(up.len())];
            let id = self.nodes[i].id as u16;
            let live = self.live();
            let conn = ConnId::on_node(id, 0, live.next_slot, 1);
            if live.trace {
                eprintln!("{now} client {k}: connects {conn:?}");
            }
            live.next_slot += 1;
            live.conn_client.insert(conn, k);
            // Its worker accepted the connection: the owner hears of it first.
            let peer = client_addr(conn);
            self.live_read(i, conn, |_| Op::Open {
                proto: Proto::Lockd,
                peer,
            });
            let live = self.live();
            live.clients[k] = Client {
                conn: Some((i, conn)),
                ..Client::default()
            };
            return Ok(());
        }
        let c = &self.live().clients[k];
        let Some((i, conn)) = c.conn else {
            return Ok(());
        };
        if c.pending.is_none() && now < c.idle_until {
            return Ok(()); // working under its lock
        }
        let pending_since = c.pending.as_ref().map(|p| p.sent);
        let owned = c.owned.clone();
        let waiting = c.waiting.as_ref().map(|(n, _)| n.clone());
        if let Some(sent) = pending_since {
            if now.saturating_sub(sent) >= GIVE_UP_US {
                // The owner answers every request within two election timeouts (by its
                // reply, a close at the write deadline, or "no quorum"), unless its process
                // was stopped meanwhile.
                let paused = self.live().pauses[i]
                    .iter()
                    .any(|&(a, b)| a <= now && b >= sent);
                if !paused {
                    return Err(format!(
                        "no quorum rule: client {k}'s request sent at {sent} µs to node {} is \
                         unanswered at {now} µs",
                        self.nodes[i].id
                    ));
                }
                self.report.client_give_ups += 1;
                self.live_close(conn, true);
            }
            return Ok(());
        }
        if owned.is_empty() && waiting.is_none() && self.rng.chance(RECONNECT_PERCENT) {
            // Done with this connection: the next request goes on a new one (a new session,
            // whose first request is one a cut-off node may still see decided).
            self.live_close(conn, true);
            return Ok(());
        }
        let (opcode, name) = if !owned.is_empty() && self.rng.chance(40) {
            (op::REL, owned[self.rng.index(owned.len())].clone())
        } else {
            let name = lock_name(self.rng.below(NAMES));
            if owned.contains(&name) || waiting.as_ref() == Some(&name) {
                return Ok(());
            }
            let acq = waiting.is_none() && self.rng.chance(60);
            (if acq { op::ACQ } else { op::TRY }, name)
        };
        let live = self.live();
        let c = &mut live.clients[k];
        if opcode == op::REL {
            // The client stops believing in the lock as it sends the release.
            c.owned.retain(|n| *n != name);
            let lease = lease_deadline(c);
            for cl in live
                .claims
                .iter_mut()
                .filter(|cl| cl.client == k && cl.name == name && cl.conn_end.is_none())
            {
                cl.conn_end = Some(now);
                cl.lease_end.get_or_insert(lease.min(now));
            }
        }
        if live.trace {
            let n = String::from_utf8_lossy(&name);
            eprintln!("{now} client {k}: sends {opcode} {n} on {conn:?}");
        }
        let c = &mut live.clients[k];
        c.pending = Some(Request {
            opcode,
            name: name.clone(),
            sent: now,
        });
        // Its worker decodes the request as the daemon's does.
        let mut payload = name;
        payload.push(0);
        self.live_read(i, conn, |b| {
            Op::Lockd(LockdOp::new(opcode, b.arena.push(&payload), &payload))
        });
        if self.live().paused_until[i] <= now {
            self.live_round(i)?;
        }
        Ok(())
    }
}
