//! A cluster node's liveness decisions, as pure functions of time: quorum probes, contact with
//! a quorum, fencing, the write deadline, and which nodes' sessions the leader expires.
//!
//! Owns: the bookkeeping of quorum probes (raft ReadIndex requests: sent, answered, waiting for
//! this node to apply up to their read index, confirmed), when this node last had contact with
//! a quorum, when it fences itself and unfences, until when it may write the replies the log
//! decided, and (on the leader) which unreachable nodes' sessions must be expired now. The
//! daemon (`server::owner::cluster`, `cluster::node`) and the simulator (`crate::sim`) both
//! run this very code, so the simulator tests the daemon's decisions.
//!
//! Must not: read a clock, touch raft or a socket, or log. Time is a plain number of
//! microseconds on the node's own monotonic clock ([`Micros`]); the daemon converts its
//! `Instant`s at the boundary (microseconds since the process started), the simulator passes
//! each node's rate-skewed clock.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Ticks in one election timeout: heartbeats go out every tenth of it.
pub const TICKS_PER_ELECTION: usize = 10;

/// Microseconds on one node's monotonic clock.
pub type Micros = u64;

/// Quorum probes remembered: one per tick, so more than an election timeout's worth; older
/// ones are forgotten (their answers, if they ever come, prove nothing newer).
pub const MAX_PROBES: usize = 2 * TICKS_PER_ELECTION;

/// How long a node may be cut off before it fences itself: the session timeout less half an
/// election timeout, or half the session timeout when that is shorter.
///
/// "Cut off" is measured from the sending of the latest quorum probe (raft ReadIndex) that a
/// leader confirmed ([`Probes::confirmed`]). That leader received the probe, so it last heard
/// from this node no earlier, and it expires this node's sessions a whole session timeout
/// after it last heard from it; a leader elected later waits a whole session timeout from its
/// election, which comes after that confirmation. The margin covers this node's own check
/// (once per tick, a tenth of an election timeout) and its scheduling. Measuring from messages
/// received instead would not do: under a one-way partition a node goes on hearing a leader
/// that no longer hears it.
pub fn fence_after(session_timeout: Micros, election: Micros) -> Micros {
    if session_timeout >= 2 * election {
        session_timeout - election / 2
    } else {
        session_timeout / 2
    }
}

/// The quorum probes of one node: raft ReadIndex requests that write nothing. A probe the
/// leader confirmed proves that the leader received it, so the leader heard from this node no
/// earlier than the probe was sent.
#[derive(Debug)]
pub struct Probes {
    /// Probes in flight: number and when each was sent.
    sent: VecDeque<(u64, Micros)>,
    seq: u64,
    /// Confirmed probes (sent when, the leader's commit index then) not yet counted: a probe
    /// counts once this node has applied up to that index, because the log up to it may end
    /// this node's sessions (a node that wakes from a stop hears the leader at once, but its
    /// sessions' expiry is in entries it has yet to apply; replies it makes before applying
    /// them must not be written).
    awaiting: VecDeque<(Micros, u64)>,
    /// When the latest counted probe was sent.
    confirmed: Option<Micros>,
    /// At most one probe this often (a tick).
    every: Micros,
}

/// A probe's context: the node's id and the probe's number, both little-endian.
pub const PROBE_CTX_LEN: usize = 16;

impl Probes {
    pub fn new(every: Micros) -> Probes {
        Probes {
            sent: VecDeque::new(),
            seq: 0,
            awaiting: VecDeque::new(),
            confirmed: None,
            every,
        }
    }

    /// The context of the probe node `me` must send now (to raft's `read_index`), if one is
    /// due: there is a leader to ask, and the last probe went out a tick ago or more.
    pub fn due(&mut self, me: u64, has_leader: bool, now: Micros) -> Option<[u8; PROBE_CTX_LEN]> {
        if !has_leader || self.sent.back().is_some_and(|&(_, t)| now < t + self.every) {
            return None;
        }
        self.seq += 1;
        let mut ctx = [0u8; PROBE_CTX_LEN];
        ctx[..8].copy_from_slice(&me.to_le_bytes());
        ctx[8..].copy_from_slice(&self.seq.to_le_bytes());
        self.sent.push_back((self.seq, now));
        while self.sent.len() > MAX_PROBES {
            self.sent.pop_front();
        }
        Some(ctx)
    }

    /// A read state raft handed back: the probe `ctx` (if it is one of `me`'s) was confirmed
    /// by a quorum at the leader's commit `index`. Earlier probes still in flight are forgotten
    /// (this one proves more than they would).
    pub fn answered(&mut self, me: u64, ctx: &[u8], index: u64) {
        if ctx.len() != PROBE_CTX_LEN || ctx[..8] != me.to_le_bytes() {
            return;
        }
        let mut word = [0u8; 8];
        word.copy_from_slice(&ctx[8..]);
        let seq = u64::from_le_bytes(word);
        while let Some(&(s, sent)) = self.sent.front() {
            if s > seq {
                break;
            }
            self.sent.pop_front();
            if s == seq {
                self.awaiting.push_back((sent, index));
                if self.awaiting.len() > MAX_PROBES {
                    self.awaiting.pop_front();
                }
            }
        }
    }

    /// Count the confirmed probes whose read index this node has `applied`.
    pub fn count(&mut self, applied: u64) {
        while let Some(&(sent, index)) = self.awaiting.front() {
            if index > applied {
                break;
            }
            self.awaiting.pop_front();
            self.confirmed = Some(self.confirmed.map_or(sent, |c| c.max(sent)));
        }
    }

    /// When the latest probe a leader confirmed with a quorum was sent, counted once this node
    /// applied up to its read index: the leader heard from this node, and a quorum from the
    /// leader, no earlier than that.
    pub fn confirmed(&self) -> Option<Micros> {
        self.confirmed
    }
}

/// A fencing transition ([`Liveness::fence_check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fence {
    /// Cut off for `for_us`: close this node's client connections.
    Lost { for_us: Micros },
    /// Contact with a quorum again.
    Regained,
}

/// A node whose sessions the leader must expire now: unheard from for `unheard_us`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expiry {
    pub node: u64,
    pub unheard_us: Micros,
}

/// What a node knows of who is reachable: for the leader's expiry of unreachable nodes'
/// sessions, for fencing itself when it is cut off, and for the Great Poncio.
#[derive(Debug)]
pub struct Liveness {
    pub me: u64,
    /// The configuration's voters (and the old configuration's, during a change).
    pub voters: Vec<u64>,
    pub outgoing: Vec<u64>,
    /// Nodes removed whose sessions may still be live: the leader expires them like an
    /// unreachable member's, a session timeout after it last heard from them.
    pub departed: BTreeSet<u64>,
    pub session_timeout: Micros,
    pub election: Micros,
    /// Cut off this long (no leader heard from, or as leader no quorum), the node fences
    /// itself: comfortably before the majority's session timeout runs out for it.
    pub fence_after: Micros,
    /// When each peer was last heard from.
    pub heard: BTreeMap<u64, Micros>,
    /// When the latest quorum probe a leader confirmed was sent (see [`fence_after`]).
    pub contact: Micros,
    /// When this node became leader (a new leader waits a whole session timeout before it
    /// expires anybody: it cannot know when the others last heard from a node).
    pub leader_since: Option<Micros>,
    /// Expiries looked at and when (looked at again after an election timeout).
    pub expiring: BTreeMap<u64, Micros>,
    pub fenced: bool,
}

impl Liveness {
    /// Node `me` of `voters`, started at `now` (which counts as contact: it has not been cut
    /// off for longer than it has run).
    pub fn new(
        me: u64,
        voters: Vec<u64>,
        session_timeout: Micros,
        election: Micros,
        now: Micros,
    ) -> Liveness {
        Liveness {
            me,
            voters,
            outgoing: Vec::new(),
            departed: BTreeSet::new(),
            session_timeout,
            election,
            fence_after: fence_after(session_timeout, election),
            heard: BTreeMap::new(),
            contact: now,
            leader_since: None,
            expiring: BTreeMap::new(),
            fenced: false,
        }
    }

    /// A message from `from`.
    pub fn heard(&mut self, from: u64, now: Micros) {
        self.heard.insert(from, now);
    }

    /// Who may have sessions for the leader to expire: every other member, and departed nodes.
    pub fn others(&self) -> Vec<u64> {
        let mut ids: BTreeSet<u64> = self.voters.iter().chain(&self.outgoing).copied().collect();
        ids.extend(&self.departed);
        ids.remove(&self.me);
        ids.into_iter().collect()
    }

    /// The nodes heard from within `within` of `now`, and this one, as `1,2,3`.
    pub fn reachable(&self, now: Micros, within: Micros) -> String {
        let mut ids: Vec<String> = self
            .heard
            .iter()
            .filter(|(_, &t)| now.saturating_sub(t) <= within)
            .map(|(id, _)| id.to_string())
            .collect();
        ids.push(self.me.to_string());
        ids.sort();
        ids.join(",")
    }

    /// The probes' latest confirmation ([`Probes::confirmed`]): the new write deadline if it
    /// moves contact forward.
    pub fn confirmed(&mut self, confirmed: Option<Micros>) -> Option<Micros> {
        match confirmed {
            Some(c) if c > self.contact => {
                self.contact = c;
                Some(self.write_deadline())
            }
            _ => None,
        }
    }

    /// The instant from which this node must write no reply that the log decided (it closes
    /// the connection instead): past it, the majority may have expired this node's sessions.
    pub fn write_deadline(&self) -> Micros {
        self.contact + self.fence_after
    }

    /// Whether a reply the log decided may be written at `now` (the workers' rule).
    pub fn may_write(&self, now: Micros) -> bool {
        now < self.write_deadline()
    }

    /// As leader (`leader`), the nodes whose sessions must be expired at `now`: unheard from
    /// for a session timeout (counted from this node's election at the earliest), each looked
    /// at once per election timeout, and only while `has_sessions` says it has any (a
    /// departed node without sessions is forgotten). Not leader: forgets its election.
    pub fn expiries(
        &mut self,
        leader: bool,
        now: Micros,
        has_sessions: impl Fn(u64) -> bool,
    ) -> Vec<Expiry> {
        let mut due = Vec::new();
        if !leader {
            self.leader_since = None;
            return due;
        }
        let since = *self.leader_since.get_or_insert(now);
        for p in self.others() {
            let heard = self.heard.get(&p).copied().unwrap_or(since).max(since);
            let again = self
                .expiring
                .get(&p)
                .is_none_or(|&t| now.saturating_sub(t) >= self.election);
            let unheard_us = now.saturating_sub(heard);
            if unheard_us < self.session_timeout || !again {
                continue;
            }
            self.expiring.insert(p, now);
            if !has_sessions(p) {
                self.departed.remove(&p);
                continue;
            }
            due.push(Expiry {
                node: p,
                unheard_us,
            });
        }
        due
    }

    /// Fence this node on losing contact with a quorum, unfence it on regaining it: the
    /// transition at `now`, if any.
    pub fn fence_check(&mut self, now: Micros) -> Option<Fence> {
        let cut_off = now.saturating_sub(self.contact) >= self.fence_after;
        if cut_off == self.fenced {
            return None;
        }
        self.fenced = cut_off;
        Some(if cut_off {
            Fence::Lost {
                for_us: now.saturating_sub(self.contact),
            }
        } else {
            Fence::Regained
        })
    }
}

#[cfg(test)]
#[path = "liveness_tests.rs"]
mod tests;
