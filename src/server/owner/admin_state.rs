//! What the owner keeps for the admin port: each session's listener and client address, and the
//! lock-request latency histograms. (Open connections per listener are the workers' count of
//! this process's sockets, `Shared::open_per_listener`: in cluster mode the sessions here are
//! every node's.)
//!
//! Owns: that bookkeeping (not part of the replicated state: no snapshot carries it). Must not:
//! change a table.

use std::net::SocketAddr;
use std::time::Instant;

use hashbrown::HashMap;

use crate::core::Session;
use crate::server::query::{Histogram, Who, PROTOCOLS};
use crate::server::Proto;

#[derive(Default)]
pub struct AdminState {
    peers: HashMap<Session, (Proto, SocketAddr)>,
    pub(super) latency: [Histogram; PROTOCOLS],
}

impl AdminState {
    pub fn opened(&mut self, session: Session, proto: Proto, peer: SocketAddr) {
        self.peers.insert(session, (proto, peer));
    }

    pub fn closed(&mut self, session: Session) {
        self.peers.remove(&session);
    }

    pub(super) fn who(&self, session: Session) -> Who {
        Who {
            session,
            peer: self.peers.get(&session).map(|p| p.1),
            node: None,
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
