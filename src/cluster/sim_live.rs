//! The simulator's liveness mode ([`Options::liveness`]): each simulated node runs the daemon's
//! own liveness decisions (`cluster::liveness`) on its own rate-skewed clock, proposes what a
//! `--peers` node proposes (its commands under its incarnation and sequence numbers, the
//! leader's expiries of unreachable nodes' sessions, a new leader's lease extension), and its
//! clients see what a real client would: replies written only before the node's write
//! deadline, connections closed on a crash, a fence, a write past the deadline or an expiry.
//!
//! Owns: the nodes' liveness state, their proposals in flight, pauses (a node not driven, its
//! timers and messages held, resuming with stale state), the lockd clients and the client-view
//! checks. Must not: decide anything the daemon decides itself (that is `liveness.rs` and
//! `Replicated`), or read a clock.
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
//! state the node applied when it wrote the grant (`LockdTable::token_of`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::*;
use crate::cluster::liveness::{Fence, Liveness, Micros};
use crate::core::codec::Reader;
use crate::proto::lockd::op;
use crate::server::command;
use crate::server::effect::tag;
use crate::server::msg::{Arena, ConnId, LockdOp, Op, OpMsg};
use crate::server::Replicated;

/// The simulated election timeout (raft's base; it draws 1 to 2 of them) and the session
/// timeout, by default three election timeouts (`--session-timeout`).
pub const ELECTION_US: Micros = TICK_US * ELECTION_TICKS as u64;
pub const SESSION_TIMEOUT_US: Micros = 3 * ELECTION_US;
/// A node's proposals in flight at most (the daemon's `MAX_INFLIGHT_PROPOSALS`).
const MAX_INFLIGHT: usize = 8;
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

/// What a client asked of its node (a request waiting for its proposal, or a close).
#[derive(Clone)]
struct Pending {
    conn: ConnId,
    /// A lockd opcode, or `None` for the connection's close.
    opcode: Option<u8>,
    name: Vec<u8>,
    /// When a request reached the node (on its clock).
    since: Micros,
}

struct InFlight {
    seq: u64,
    data: Vec<u8>,
    tried: Micros,
    sent: bool,
    /// What it proposes, and since when its oldest request waits for an answer (`None` once
    /// answered "no quorum": then it proposes only its connection events).
    ops: Vec<Pending>,
    waiting_since: Option<Micros>,
}

/// One running node's liveness state: what `ClusterOwner` keeps.
pub struct LiveNode {
    pub liveness: Liveness,
    incarnation: u64,
    seq: u64,
    inflight: VecDeque<InFlight>,
    queued: Vec<Pending>,
    leader_seen: u64,
    was_leader: bool,
    /// Its proposals through this number came in a leader's snapshot it installed: their
    /// replies were never made.
    installed_through: u64,
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
            expired_conns: BTreeSet::new(),
            trace: std::env::var("HOLDFAST_SIM_TRACE").is_ok_and(|v| v == "1"),
            leader_crashed_at: None,
        }
    }
}

/// Node `id`'s proposal number `seq` of run `inc`: its clients' `ops` at `time`.
fn commands_proposal(id: u64, inc: u64, seq: u64, time: u64, ops: &[Pending]) -> Vec<u8> {
    let mut arena = Arena::default();
    let mut msgs = Vec::new();
    for p in ops {
        let op = match p.opcode {
            None => Op::Close,
            Some(opcode) => {
                let mut payload = p.name.clone();
                payload.push(0);
                Op::Lockd(LockdOp::new(opcode, arena.push(&payload), &payload))
            }
        };
        msgs.push(OpMsg { conn: p.conn, op });
    }
    let mut entry = Vec::new();
    command::encode_entry(time, &msgs, &arena.bytes, &mut entry);
    let mut data = Vec::new();
    Replicated::encode_commands(id, inc, seq, &entry, &mut data);
    data
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

    /// Node `i` (re)started: a new run, whose first proposal (empty) announces it.
    pub(super) fn live_start(&mut self, i: usize) {
        let now = self.local_us(i);
        let cs = self.nodes[i]
            .raft
            .as_ref()
            .map(|r| r.conf_state())
            .unwrap_or_default();
        let mut liveness = Liveness::new(
            self.nodes[i].id,
            cs.voters.clone(),
            SESSION_TIMEOUT_US,
            ELECTION_US,
            now,
        );
        liveness.outgoing = cs.voters_outgoing;
        if self.opts.bug_late_fence {
            liveness.fence_after = SESSION_TIMEOUT_US + ELECTION_US;
        }
        let node = LiveNode {
            liveness,
            // Later runs have larger incarnations (the daemon's: its start in Unix µs).
            incarnation: self.now + 1,
            seq: 0,
            inflight: VecDeque::new(),
            queued: Vec::new(),
            leader_seen: 0,
            was_leader: false,
            installed_through: 0,
        };
        let live = self.live();
        live.nodes[i] = Some(node);
        live.paused_until[i] = 0;
        self.live_propose_new(i, true);
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

    /// A raft message from `from` reaches node `to`: it looks at its contact first (messages
    /// that waited while it was stopped must not hide that it was cut off), then counts it.
    pub(super) fn live_heard(&mut self, to: usize, from: usize) -> Result<(), String> {
        self.live_fence_check(to)?;
        let (now, id) = (self.local_us(to), self.nodes[from].id);
        if let Some(n) = self.live().nodes[to].as_mut() {
            n.liveness.heard(id, now);
        }
        Ok(())
    }

    /// One round of node `i`'s owner after an event: propose, drive raft, then watch (probe,
    /// contact, expiries, fence), announce a new leadership, and drive again.
    pub(super) fn live_round(&mut self, i: usize) -> Result<(), String> {
        if self.nodes[i].raft.is_none() {
            return Ok(());
        }
        self.live_propose(i);
        self.drive(i)?;
        self.live_conf(i);
        self.live_watch(i)?;
        self.drive(i)?;
        self.live_conf(i);
        self.live_settle(i);
        Ok(())
    }

    /// A membership change applied (or a snapshot installed) on node `i`: the members it
    /// watches follow raft's configuration, and the removed nodes that still have sessions are
    /// departed ones for the leader to expire (the owner's `conf_changed`).
    fn live_conf(&mut self, i: usize) {
        let Some(raft) = self.nodes[i].raft.as_mut() else {
            return;
        };
        if !raft.take_conf_changed() {
            return;
        }
        let cs = raft.conf_state();
        let id = self.nodes[i].id;
        let state = &self.nodes[i].machine.state.inner;
        let departed: Vec<u64> = state
            .removed()
            .into_iter()
            .filter(|&gone| gone != id && state.has_sessions_of(gone))
            .collect();
        if let Some(n) = self.live.as_mut().and_then(|l| l.nodes[i].as_mut()) {
            n.liveness.voters = cs.voters;
            n.liveness.outgoing = cs.voters_outgoing;
            n.liveness.departed.extend(departed);
        }
    }

    /// Proposals of node `i` seen applied leave its in-flight list.
    /// Those applied in a leader's snapshot it installed get the no-quorum answer (the owner's
    /// rule: their replies were never made).
    fn live_settle(&mut self, i: usize) {
        let id = self.nodes[i].id;
        let run = self.nodes[i].machine.state.inner.run_of(id);
        let mut unanswered = Vec::new();
        if let Some(n) = self.live.as_mut().and_then(|l| l.nodes[i].as_mut()) {
            while let Some(f) = n.inflight.front() {
                match run {
                    Some((inc, seq)) if inc == n.incarnation && seq >= f.seq => {
                        let f = n.inflight.pop_front().expect("checked");
                        let forget = self.opts.bug_forget_installed_requests;
                        if f.seq <= n.installed_through && f.waiting_since.is_some() && !forget {
                            let ops = f.ops.into_iter().filter(|p| p.opcode.is_some());
                            unanswered.extend(ops.map(|p| p.conn));
                        }
                    }
                    _ => break,
                }
            }
        }
        for conn in unanswered {
            if self.live().conn_client.contains_key(&conn) {
                self.report.no_quorum_answers += 1;
                self.live_close(conn, true);
            }
        }
    }

    /// Node `i` installed a leader's snapshot: its proposals applied in it are noted.
    pub(super) fn live_installed(&mut self, i: usize) {
        let id = self.nodes[i].id;
        let run = self.nodes[i].machine.state.inner.run_of(id);
        if let Some(n) = self.live.as_mut().and_then(|l| l.nodes[i].as_mut()) {
            n.installed_through = match run {
                Some((inc, seq)) if inc == n.incarnation => seq,
                _ => 0,
            };
        }
    }

    fn live_watch(&mut self, i: usize) -> Result<(), String> {
        let now = self.local_us(i);
        let time = self.local_ms(i);
        let id = self.nodes[i].id;
        let Some(raft) = self.nodes[i].raft.as_mut() else {
            return Ok(());
        };
        // The daemon's quorum probes (raft ReadIndex requests), answered in `ready`.
        raft.probe_quorum(now);
        let (is_leader, term, confirmed) = (raft.is_leader(), raft.term(), raft.quorum_confirmed());
        let Some(n) = self.live.as_mut().and_then(|l| l.nodes[i].as_mut()) else {
            return Ok(());
        };
        n.liveness.confirmed(confirmed);
        if self.opts.bug_leader_does_not_wait && is_leader {
            n.liveness.leader_since.get_or_insert(0);
        }
        let machine = &self.nodes[i].machine.state.inner;
        let due = n
            .liveness
            .expiries(is_leader, now, |p| machine.has_sessions_of(p));
        let announce = is_leader && !n.was_leader;
        n.was_leader = is_leader;
        for e in due {
            let mut data = Vec::new();
            Replicated::encode_expire(e.node, time, &mut data);
            if self.live_send(i, data) {
                self.report.expiries += 1;
            }
        }
        if announce {
            let mut data = Vec::new();
            Replicated::encode_leader(term, id, ELECTION_US / 1_000, time, &mut data);
            self.live_send(i, data);
        }
        self.live_fence_check(i)
    }

    fn live_fence_check(&mut self, i: usize) -> Result<(), String> {
        let now = self.local_us(i);
        let id = self.nodes[i].id;
        let Some(n) = self.live.as_mut().and_then(|l| l.nodes[i].as_mut()) else {
            return Ok(());
        };
        if let Some(Fence::Lost { .. }) = n.liveness.fence_check(now) {
            self.report.fences += 1;
            // The connections of this node's sessions in the state it applied, as the daemon.
            let conns = self.nodes[i].machine.state.inner.conns_of_node(id);
            for conn in conns {
                self.live_close(conn, true);
            }
        }
        Ok(())
    }

    /// Propose `data` from node `i`: appended if it leads, forwarded to the leader it knows,
    /// refused otherwise (`RaftNode::propose`).
    fn live_send(&mut self, i: usize, data: Vec<u8>) -> bool {
        self.nodes[i]
            .raft
            .as_mut()
            .is_some_and(|raft| raft.propose(data))
    }

    /// The daemon's `propose`: everything in flight again when the oldest is overdue or the
    /// leader changed; otherwise the queued requests as a new proposal, while fewer than the
    /// cap are in flight.
    fn live_propose(&mut self, i: usize) {
        let now = self.local_us(i);
        self.live_give_up(i, now);
        let leader = self.nodes[i].raft.as_ref().map_or(0, |r| r.leader());
        let Some(n) = self.live.as_mut().and_then(|l| l.nodes[i].as_mut()) else {
            return;
        };
        let new_leader = leader != 0 && leader != n.leader_seen;
        n.leader_seen = leader;
        let overdue = n.inflight.front().map(|oldest| {
            let retry = if oldest.sent {
                ELECTION_US / 2
            } else {
                TICK_US
            };
            new_leader || now.saturating_sub(oldest.tried) >= retry
        });
        if let Some(overdue) = overdue {
            if overdue {
                let all: Vec<Vec<u8>> = n.inflight.iter().map(|f| f.data.clone()).collect();
                let mut sent = Vec::new();
                for data in all {
                    sent.push(self.live_send(i, data));
                }
                if let Some(n) = self.live.as_mut().and_then(|l| l.nodes[i].as_mut()) {
                    for (f, s) in n.inflight.iter_mut().zip(sent) {
                        f.sent = s;
                        f.tried = now;
                    }
                }
                return;
            }
        }
        self.live_propose_new(i, false);
    }

    /// The owner's no-quorum rule: once the oldest request of node `i` not yet answered has
    /// waited two election timeouts, every request of it not yet answered is answered "no
    /// quorum" and its connection closes; the proposals in flight keep only their connection
    /// events (under the same numbers), the queued requests go.
    fn live_give_up(&mut self, i: usize, now: Micros) {
        let (id, time) = (self.nodes[i].id, self.local_ms(i));
        let Some(n) = self.live.as_mut().and_then(|l| l.nodes[i].as_mut()) else {
            return;
        };
        let oldest = n.inflight.iter().find_map(|f| f.waiting_since).or_else(|| {
            n.queued
                .iter()
                .filter(|p| p.opcode.is_some())
                .map(|p| p.since)
                .min()
        });
        if oldest.is_none_or(|at| now < at + 2 * ELECTION_US) {
            return;
        }
        let mut answered = Vec::new();
        let inc = n.incarnation;
        for f in n.inflight.iter_mut() {
            if f.waiting_since.take().is_none() {
                continue;
            }
            answered.extend(f.ops.iter().filter(|p| p.opcode.is_some()).map(|p| p.conn));
            f.ops.retain(|p| p.opcode.is_none());
            f.data = commands_proposal(id, inc, f.seq, time, &f.ops);
        }
        answered.extend(
            n.queued
                .iter()
                .filter(|p| p.opcode.is_some())
                .map(|p| p.conn),
        );
        n.queued.retain(|p| p.opcode.is_none());
        answered.sort_unstable();
        answered.dedup();
        for conn in answered {
            if self.live().conn_client.contains_key(&conn) {
                self.report.no_quorum_answers += 1;
                if self.live().trace {
                    eprintln!("{} node {id}: no quorum for {conn:?}", self.now);
                }
                self.live_close(conn, true);
            }
        }
    }

    /// A new proposal of node `i` with what its clients sent (`announce`: even if empty).
    fn live_propose_new(&mut self, i: usize, announce: bool) {
        let now = self.local_us(i);
        let (id, time) = (self.nodes[i].id, self.local_ms(i));
        let Some(n) = self.live.as_mut().and_then(|l| l.nodes[i].as_mut()) else {
            return;
        };
        if n.inflight.len() >= MAX_INFLIGHT || (n.queued.is_empty() && !announce) {
            return;
        }
        let ops: Vec<Pending> = n.queued.drain(..).collect();
        let waiting_since = ops
            .iter()
            .filter(|p| p.opcode.is_some())
            .map(|p| p.since)
            .min();
        n.seq += 1;
        let (seq, inc) = (n.seq, n.incarnation);
        if self.live.as_ref().is_some_and(|l| l.trace) {
            eprintln!(
                "{} node {id}: proposes #{seq} with {} ops",
                self.now,
                ops.len()
            );
        }
        let data = commands_proposal(id, inc, seq, time, &ops);
        let sent = self.live_send(i, data.clone());
        if let Some(n) = self.live.as_mut().and_then(|l| l.nodes[i].as_mut()) {
            n.inflight.push_back(InFlight {
                seq,
                data,
                tried: now,
                sent,
                ops,
                waiting_since,
            });
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

    /// Node `i` applied an entry with `effects` (every session's, canonical form): the replies
    /// to its own connections go out, before its write deadline; after it, their connections
    /// close instead. `closed`: the connections the entry closes (an expiry of this node's own
    /// sessions closes their connections: `Replicated::end_sessions_of`); `tokens`: each lockd
    /// reply's lock token in the state that wrote it.
    pub(super) fn live_applied(
        &mut self,
        i: usize,
        effects: &[u8],
        closed: Vec<ConnId>,
        tokens: &[Option<u64>],
    ) -> Result<(), String> {
        if self.live.is_none() {
            return Ok(());
        }
        let id = self.nodes[i].id as u16;
        let now = self.local_us(i);
        let may_write = self
            .live
            .as_ref()
            .and_then(|l| l.nodes[i].as_ref())
            .is_some_and(|n| self.opts.bug_ignore_write_deadline || n.liveness.may_write(now));
        let mut r = Reader::new(effects);
        let mut tokens = tokens.iter().copied();
        while r.remaining() > 0 {
            let (to, close, body) = holdfast::next_effect(&mut r)?;
            let token = match (to, body) {
                (Some(_), [tag::LOCKD_FRAME, ..]) => tokens.next().flatten(),
                _ => None,
            };
            let Some(to) = to.filter(|c| c.node == id) else {
                continue;
            };
            let live = self.live();
            let Some(&k) = live.conn_client.get(&to) else {
                continue; // a connection closed already (or of an earlier run)
            };
            if !may_write {
                self.report.deadline_closes += 1;
                self.live_close(to, true);
                continue;
            }
            if let [tag::LOCKD_FRAME, opcode, payload @ ..] = body {
                self.live_reply(k, *opcode, name_of(payload).to_vec(), token)?;
            }
            if close {
                self.live_close(to, true);
            }
        }
        for conn in closed {
            self.live_close(conn, true);
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
        if node_runs {
            if let Some(n) = live.nodes[i].as_mut() {
                n.queued.push(Pending {
                    conn,
                    opcode: None,
                    name: Vec::new(),
                    since: 0,
                });
            }
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
        let since = now * self.nodes[i].rate / 1_000;
        let live = self.live.as_mut().expect("liveness mode");
        if let Some(n) = live.nodes[i].as_mut() {
            n.queued.push(Pending {
                conn,
                opcode: Some(opcode),
                name,
                since,
            });
        }
        if live.paused_until[i] <= now {
            self.live_round(i)?;
        }
        Ok(())
    }
}
