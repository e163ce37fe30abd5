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
//! - *connection* (the contract's fencing promise: "a client learns that it lost its locks
//!   before anyone else can be granted them"): the claim ends only by release or close. No
//!   other client may receive a grant while it is open, unless the holder's node was paused
//!   during it (a stopped process cannot close anything: that is what the lease rule is for).
//!
//! Fencing tokens: a grant whose request was sent after another grant of the lock was received
//! carries a larger token. lockd's ACQUIRED does not carry the token, so it is read from the
//! state the node applied when it wrote the grant (`LockdTable::token_of`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::*;
use crate::cluster::liveness::{Fence, Liveness, Micros, Probes};
use crate::core::codec::Reader;
use crate::proto::lockd::op;
use crate::server::command;
use crate::server::effect::tag;
use crate::server::msg::{Arena, ConnId, LockdOp, Op, OpMsg};
use crate::server::Replicated;

/// The simulated election timeout (raft's base; it draws 1 to 2 of them) and the session
/// timeout, the contract's default of three election timeouts.
pub const ELECTION_US: Micros = TICK_US * ELECTION_TICKS as u64;
pub const SESSION_TIMEOUT_US: Micros = 3 * ELECTION_US;
/// A node's proposals in flight at most (the daemon's `MAX_INFLIGHT_PROPOSALS`).
const MAX_INFLIGHT: usize = 8;
/// Lock names the clients fight over.
const NAMES: u64 = 3;
/// A client that waited this long for an answer closes its connection (the daemon answers
/// "no quorum" and closes after two election timeouts).
const GIVE_UP_US: u64 = 3 * ELECTION_US;
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
}

struct InFlight {
    seq: u64,
    data: Vec<u8>,
    tried: Micros,
    sent: bool,
}

/// One running node's liveness state: what `ClusterOwner` keeps.
pub struct LiveNode {
    pub liveness: Liveness,
    probes: Probes,
    incarnation: u64,
    seq: u64,
    inflight: VecDeque<InFlight>,
    queued: Vec<Pending>,
    leader_seen: u64,
    was_leader: bool,
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
}

impl LiveWorld {
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
        }
    }
}

fn lease_deadline(c: &Client) -> u64 {
    c.last_answered + SESSION_TIMEOUT_US - ELECTION_US
}

fn name_of(payload: &[u8]) -> &[u8] {
    let end = payload
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(payload.len());
    &payload[..end]
}

fn lock_name(i: u64) -> Vec<u8> {
    format!("lock-{i}").into_bytes()
}

impl<M: StateMachine, W: Workload> Cluster<M, W> {
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
            Ev::Deliver { to, .. } => *to,
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
        let voters: Vec<u64> = (1..=self.opts.nodes as u64).collect();
        let mut liveness = Liveness::new(
            self.nodes[i].id,
            voters,
            SESSION_TIMEOUT_US,
            ELECTION_US,
            now,
        );
        if self.opts.bug_late_fence {
            liveness.fence_after = SESSION_TIMEOUT_US + ELECTION_US;
        }
        let node = LiveNode {
            liveness,
            probes: Probes::new(TICK_US),
            // Later runs have larger incarnations (the daemon's: its start in Unix µs).
            incarnation: self.now + 1,
            seq: 0,
            inflight: VecDeque::new(),
            queued: Vec::new(),
            leader_seen: 0,
            was_leader: false,
        };
        let live = self.live();
        live.nodes[i] = Some(node);
        live.paused_until[i] = 0;
        self.live_propose_new(i, true);
    }

    /// Node `i` crashed: its clients' connections close at once.
    pub(super) fn live_crash(&mut self, i: usize) {
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

    /// The pause fault: node `i` is not driven for a while.
    pub(super) fn live_pause(&mut self) {
        let i = self.rng.index(self.nodes.len());
        let len = PAUSE_MIN_US + self.rng.below(PAUSE_SPREAD_US);
        let now = self.now;
        if self.nodes[i].raw.is_none() || self.live().paused_until[i] > now {
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

    /// A read state: a probe's answer.
    pub(super) fn live_read_state(&mut self, i: usize, ctx: &[u8], index: u64) {
        let id = self.nodes[i].id;
        if let Some(n) = self.live.as_mut().and_then(|l| l.nodes[i].as_mut()) {
            n.probes.answered(id, ctx, index);
        }
    }

    /// Node `i` has nothing more to handle: count its confirmed probes.
    pub(super) fn live_count(&mut self, i: usize) {
        let applied = self.nodes[i].applied;
        if let Some(n) = self.live.as_mut().and_then(|l| l.nodes[i].as_mut()) {
            n.probes.count(applied);
        }
    }

    /// One round of node `i`'s owner after an event: propose, drive raft, then watch (probe,
    /// contact, expiries, fence), announce a new leadership, and drive again.
    pub(super) fn live_round(&mut self, i: usize) -> Result<(), String> {
        if self.nodes[i].raw.is_none() {
            return Ok(());
        }
        self.live_propose(i);
        self.drive(i)?;
        self.live_watch(i)?;
        self.drive(i)?;
        self.live_settle(i);
        Ok(())
    }

    /// Proposals of node `i` seen applied leave its in-flight list.
    fn live_settle(&mut self, i: usize) {
        let id = self.nodes[i].id;
        let run = self.nodes[i].machine.inner.run_of(id);
        if let Some(n) = self.live.as_mut().and_then(|l| l.nodes[i].as_mut()) {
            while let Some(f) = n.inflight.front() {
                match run {
                    Some((inc, seq)) if inc == n.incarnation && seq >= f.seq => {
                        n.inflight.pop_front();
                    }
                    _ => break,
                }
            }
        }
    }

    fn live_watch(&mut self, i: usize) -> Result<(), String> {
        let now = self.local_us(i);
        let time = self.local_ms(i);
        let id = self.nodes[i].id;
        let Some(raw) = self.nodes[i].raw.as_mut() else {
            return Ok(());
        };
        let (leader, is_leader, term) = (
            raw.raft.leader_id,
            raw.raft.state == StateRole::Leader,
            raw.raft.term,
        );
        let Some(n) = self.live.as_mut().and_then(|l| l.nodes[i].as_mut()) else {
            return Ok(());
        };
        if let Some(ctx) = n.probes.due(id, leader != 0, now) {
            raw.read_index(ctx.to_vec());
        }
        n.liveness.confirmed(n.probes.confirmed());
        if self.opts.bug_leader_does_not_wait && is_leader {
            n.liveness.leader_since.get_or_insert(0);
        }
        let machine = &self.nodes[i].machine.inner;
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
            let conns = self.nodes[i].machine.inner.conns_of_node(id);
            for conn in conns {
                self.live_close(conn, true);
            }
        }
        Ok(())
    }

    /// Propose `data` from node `i`: appended if it leads, forwarded to the leader it knows
    /// (`RaftNode::propose`), refused otherwise.
    fn live_send(&mut self, i: usize, data: Vec<u8>) -> bool {
        let id = self.nodes[i].id;
        let Some(raw) = self.nodes[i].raw.as_mut() else {
            return false;
        };
        if raw.raft.state == StateRole::Leader {
            return raw.propose(Vec::new(), data).is_ok();
        }
        let leader = raw.raft.leader_id;
        let Some(to) = (leader != 0).then(|| self.index_of(leader)).flatten() else {
            return false;
        };
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgPropose);
        m.from = id;
        m.to = leader;
        m.entries = vec![Entry {
            data: data.into(),
            ..Default::default()
        }]
        .into();
        self.send(i, to, Packet::Raft(m));
        true
    }

    /// The daemon's `propose`: everything in flight again when the oldest is overdue or the
    /// leader changed; otherwise the queued requests as a new proposal, while fewer than the
    /// cap are in flight.
    fn live_propose(&mut self, i: usize) {
        let now = self.local_us(i);
        let leader = self.nodes[i].raw.as_ref().map_or(0, |r| r.raft.leader_id);
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
        let mut arena = Arena::default();
        let mut ops = Vec::new();
        for p in n.queued.drain(..) {
            let op = match p.opcode {
                None => Op::Close,
                Some(opcode) => {
                    let mut payload = p.name.clone();
                    payload.push(0);
                    Op::Lockd(LockdOp::new(opcode, arena.push(&payload), &payload))
                }
            };
            ops.push(OpMsg { conn: p.conn, op });
        }
        let mut entry = Vec::new();
        command::encode_entry(time, &ops, &arena.bytes, &mut entry);
        n.seq += 1;
        let (seq, inc) = (n.seq, n.incarnation);
        if self.live.as_ref().is_some_and(|l| l.trace) {
            eprintln!(
                "{} node {id}: proposes #{seq} with {} ops",
                self.now,
                ops.len()
            );
        }
        let mut data = Vec::new();
        Replicated::encode_commands(id, inc, seq, &entry, &mut data);
        let sent = self.live_send(i, data.clone());
        if let Some(n) = self.live.as_mut().and_then(|l| l.nodes[i].as_mut()) {
            n.inflight.push_back(InFlight {
                seq,
                data,
                tried: now,
                sent,
            });
        }
    }

    /// The entry at `index` is applied for the first time (by node `i`, about to): note the
    /// connections an expiry ends, and the releases applied for such connections after it.
    pub(super) fn live_first(&mut self, i: usize, index: u64, data: &[u8]) {
        if self.live().trace {
            let head: Vec<u64> = (0..3)
                .filter_map(|w| data.get(1 + 8 * w..9 + 8 * w))
                .map(|b| b.iter().rev().fold(0, |a, &x| a << 8 | u64::from(x)))
                .collect();
            eprintln!("{} log {index}: kind {:?} {head:?}", self.now, data.first());
        }
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&data[at..at + 8]);
            u64::from_le_bytes(w)
        };
        match data.first() {
            Some(2) if data.len() == 17 => {
                let conns = self.nodes[i].machine.inner.conns_of_node(word(1));
                self.live().expired_conns.extend(conns);
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

    /// The connections of node `i` that an entry about to be applied closes: an expiry of this
    /// node's own sessions closes their connections (`Replicated::end_sessions_of`).
    pub(super) fn live_closed_by(&self, i: usize, data: &[u8]) -> Vec<ConnId> {
        let id = self.nodes[i].id;
        let expire_of_me = data.len() == 17
            && data[0] == 2
            && data[1..9] == id.to_le_bytes()
            && self.live.is_some();
        if !expire_of_me {
            return Vec::new();
        }
        self.nodes[i].machine.inner.conns_of_node(id)
    }

    /// Node `i` applied an entry with `effects` (every session's, canonical form): the replies
    /// to its own connections go out, before its write deadline; after it, their connections
    /// close instead. `closed`: the connections the entry closes ([`Cluster::live_closed_by`]).
    pub(super) fn live_applied(
        &mut self,
        i: usize,
        effects: &[u8],
        closed: Vec<ConnId>,
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
        while r.remaining() > 0 {
            let (to, close, body) = holdfast::next_effect(&mut r)?;
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
                let token = self.nodes[i].machine.inner.token_of(to, name_of(payload));
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
                .filter(|&i| self.nodes[i].raw.is_some())
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
        let pending_since = c.pending.as_ref().map(|p| p.sent);
        let owned = c.owned.clone();
        let waiting = c.waiting.as_ref().map(|(n, _)| n.clone());
        if let Some(sent) = pending_since {
            if now.saturating_sub(sent) >= GIVE_UP_US {
                self.report.client_give_ups += 1;
                self.live_close(conn, true);
            }
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
        if let Some(n) = live.nodes[i].as_mut() {
            n.queued.push(Pending {
                conn,
                opcode: Some(opcode),
                name,
            });
        }
        if live.paused_until[i] <= now {
            self.live_round(i)?;
        }
        Ok(())
    }
}
