//! What the owner keeps for the admin port: each session's listener and client address, open
//! connections per listener, and the lock-request latency histograms.
//!
//! Owns: that bookkeeping (not part of the replicated state: it is this node's view of its own
//! clients, and no snapshot carries it). Must not: change a table.

use std::net::SocketAddr;
use std::time::Instant;

use hashbrown::HashMap;

use crate::admin::data::{Histogram, Who, PROTOCOLS};
use crate::core::Session;
use crate::server::Proto;

#[derive(Default)]
pub struct AdminState {
    peers: HashMap<Session, (Proto, SocketAddr)>,
    pub(super) open: [u64; PROTOCOLS],
    pub(super) latency: [Histogram; PROTOCOLS],
}

fn index(p: Proto) -> usize {
    match p {
        Proto::Memcache => 0,
        Proto::Lockd => 1,
        Proto::Dlock => 2,
        Proto::Counter => 3,
    }
}

impl AdminState {
    pub fn opened(&mut self, session: Session, proto: Proto, peer: SocketAddr) {
        if self.peers.insert(session, (proto, peer)).is_none() {
            self.open[index(proto)] += 1;
        }
    }

    pub fn closed(&mut self, session: Session) {
        if let Some((proto, _)) = self.peers.remove(&session) {
            self.open[index(proto)] -= 1;
        }
    }

    pub(super) fn who(&self, session: Session) -> Who {
        Who {
            session,
            peer: self.peers.get(&session).map(|p| p.1),
        }
    }

    /// Count a batch's lock requests as answered now: `stamp` is when its worker's turn began.
    pub fn observe(&mut self, stamp: Instant, counts: [u32; PROTOCOLS], now: Instant) {
        let ns = now.saturating_duration_since(stamp).as_nanos();
        let ns = u64::try_from(ns).unwrap_or(u64::MAX);
        for (h, n) in self.latency.iter_mut().zip(counts) {
            if n > 0 {
                h.observe(ns, u64::from(n));
            }
        }
    }
}
