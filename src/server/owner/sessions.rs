//! Sessions: the state machine's holder identities, and which connection each belongs to.
//!
//! Owns: handing out session ids in order (1, 2, 3, ...) the first time a connection appears in
//! the command stream (its `Open`, or its first request), the map from connections to sessions
//! and back, and forgetting a session when its connection closes. Because ids are handed out by
//! the order of the commands, every replica of the state gives a connection the same session,
//! and a snapshot carries the map so that a restored state goes on with the same ids. Must not:
//! reuse an id, or let a table see a connection (tables hold [`Session`]s only).

use crate::core::codec::{self, DecodeError, Reader};
use crate::core::hash::HashMap;
use crate::core::Session;

use crate::server::msg::ConnId;

/// Workers and slots found by index rather than by hash: a daemon's workers are few, and a
/// worker's slab slots stay below its peak of open connections. A connection outside (only a
/// hostile or odd command entry names one) goes to the hash map, so memory follows the sessions
/// that exist, never the numbers an entry names.
const DIRECT_WORKERS: usize = 64;
/// Slots beyond this many past the live sessions go to the hash map.
const DIRECT_SLACK: usize = 4096;
/// Entries of the direct-mapped session-to-connection cache (a power of two). Routing asks for
/// the connection of every run of effects; ids are handed out in order, so the live sessions of
/// a daemon with up to this many connections never collide, and an indexed load replaces a hash
/// lookup (measured: about 20 instructions per request at pipeline depth 1).
const RECENT: usize = 1024;

#[derive(Default)]
pub struct Sessions {
    /// The last id handed out (0: none yet).
    last: u64,
    /// `[worker][slot]`: (node, generation, session id), id 0 for none. In a cluster the first
    /// node to use a worker's slot gets the entry; a connection of another node with the same
    /// worker and slot goes to `other` while it is taken.
    direct: Vec<Vec<(u16, u32, u64)>>,
    /// Connections outside `direct`.
    other: HashMap<ConnId, Session>,
    conn_of: HashMap<Session, ConnId>,
    /// `[id % RECENT]`: (session id, its connection), id 0 for none. A cache of `conn_of`,
    /// kept in step with it, never in a snapshot.
    recent: Vec<(u64, ConnId)>,
}

impl Sessions {
    /// The session of `conn`, a new one if `conn` has none yet.
    #[inline]
    pub fn session(&mut self, conn: ConnId) -> Session {
        if let Some(s) = self.find(conn) {
            return s;
        }
        self.last += 1;
        let s = Session(self.last);
        self.insert(conn, s);
        s
    }

    fn insert(&mut self, conn: ConnId, s: Session) {
        let (w, slot) = (usize::from(conn.worker), conn.slot as usize);
        let free = |row: &Vec<(u16, u32, u64)>| row.get(slot).is_none_or(|e| e.2 == 0);
        if w < DIRECT_WORKERS
            && slot < self.conn_of.len() + DIRECT_SLACK
            && self.direct.get(w).is_none_or(free)
        {
            if self.direct.len() <= w {
                self.direct.resize_with(w + 1, Vec::new);
            }
            let row = &mut self.direct[w];
            if row.len() <= slot {
                row.resize(slot + 1, (0, 0, 0));
            }
            row[slot] = (conn.node, conn.gen, s.0);
        } else {
            self.other.insert(conn, s);
        }
        self.conn_of.insert(s, conn);
        if self.recent.is_empty() {
            self.recent = vec![(0, ConnId::new(0, 0, 0)); RECENT];
        }
        self.recent[s.0 as usize % RECENT] = (s.0, conn);
    }

    /// The session of `conn` if it has one (a question that must not start a session).
    #[inline]
    pub fn find(&self, conn: ConnId) -> Option<Session> {
        let direct = self
            .direct
            .get(usize::from(conn.worker))
            .and_then(|row| row.get(conn.slot as usize))
            .filter(|&&(node, gen, id)| id != 0 && gen == conn.gen && node == conn.node);
        match direct {
            Some(&(_, _, id)) => Some(Session(id)),
            None if self.other.is_empty() => None,
            None => self.other.get(&conn).copied(),
        }
    }

    /// The connection of a live session: where its replies and grants go.
    #[inline]
    pub fn conn(&self, s: Session) -> Option<ConnId> {
        match self.recent.get(s.0 as usize % RECENT) {
            Some(&(id, conn)) if id == s.0 => Some(conn),
            _ => self.conn_of.get(&s).copied(),
        }
    }

    /// `conn` closed: its session ends (the tables have already let it go).
    pub fn close(&mut self, conn: ConnId) -> Option<Session> {
        let s = self.find(conn)?;
        let entry = self
            .direct
            .get_mut(usize::from(conn.worker))
            .and_then(|row| row.get_mut(conn.slot as usize))
            .filter(|e| e.2 == s.0);
        match entry {
            Some(e) => *e = (0, 0, 0),
            None => {
                self.other.remove(&conn);
            }
        }
        self.conn_of.remove(&s);
        if let Some(e) = self.recent.get_mut(s.0 as usize % RECENT) {
            if e.0 == s.0 {
                e.0 = 0;
            }
        }
        Some(s)
    }

    /// The live connections of cluster node `node`, in connection order (the same on every
    /// replica: a restarted node's old sessions end in this order).
    pub fn conns_of_node(&self, node: u16) -> Vec<ConnId> {
        let mut v: Vec<ConnId> = self
            .conn_of
            .values()
            .copied()
            .filter(|c| c.node == node)
            .collect();
        v.sort_unstable();
        v
    }

    pub fn len(&self) -> usize {
        self.conn_of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conn_of.is_empty()
    }

    /// The last id and every live session with its connection, in session order.
    pub fn snapshot(&self, out: &mut Vec<u8>) {
        codec::put_u64(out, self.last);
        let mut live: Vec<(Session, ConnId)> = self.conn_of.iter().map(|(&s, &c)| (s, c)).collect();
        live.sort_unstable();
        codec::put_u64(out, live.len() as u64);
        for (s, c) in live {
            s.encode(out);
            c.encode(out);
            codec::spill(out);
        }
    }

    /// Untrusted input: ids above the last one handed out, or a session or connection named
    /// twice, are errors.
    pub fn restore(r: &mut Reader<'_>) -> Result<Sessions, DecodeError> {
        let mut t = Sessions {
            last: r.u64()?,
            ..Sessions::default()
        };
        // A session id and a connection id take at least four bytes.
        let n = r.count(4)?;
        for _ in 0..n {
            codec::consumed(r);
            let s = Session::decode(r)?;
            let c = ConnId::decode(r)?;
            if s.0 == 0 || s.0 > t.last {
                return Err(DecodeError::Invalid("session id not yet handed out"));
            }
            if t.find(c).is_some() || t.conn_of.contains_key(&s) {
                return Err(DecodeError::Invalid("session or connection named twice"));
            }
            t.insert(c, s);
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_handed_out_in_order_never_reused_and_survive_a_snapshot() {
        let mut s = Sessions::default();
        let a = ConnId::new(0, 1, 0);
        let b = ConnId::new(1, 1, 0);
        assert_eq!(s.session(a), Session(1));
        assert_eq!(s.session(b), Session(2));
        assert_eq!(s.session(a), Session(1));
        assert_eq!(s.conn(Session(2)), Some(b));
        assert_eq!(s.close(a), Some(Session(1)));
        assert_eq!(s.conn(Session(1)), None);
        // The slot's next connection is a new session, never the old id.
        let a2 = ConnId::new(0, 1, 1);
        assert_eq!(s.session(a2), Session(3));
        let mut bytes = Vec::new();
        s.snapshot(&mut bytes);
        let mut r = Reader::new(&bytes);
        let mut t = Sessions::restore(&mut r).unwrap();
        r.finish().unwrap();
        assert_eq!(t.conn(Session(3)), Some(a2));
        assert_eq!(t.find(b), Some(Session(2)));
        assert_eq!(t.session(ConnId::new(0, 9, 0)), Session(4));
        // Far slots and workers (a hostile entry's) work the same, through the hash map.
        let far = ConnId::new(60_000, u32::MAX, 3);
        assert_eq!(t.session(far), Session(5));
        assert_eq!(t.find(far), Some(Session(5)));
        assert_eq!(t.find(ConnId::new(60_000, u32::MAX, 4)), None);
        assert_eq!(t.close(far), Some(Session(5)));
        assert_eq!(t.find(far), None);
        assert!(t.direct.iter().map(Vec::len).sum::<usize>() < 100);
        let mut again = Vec::new();
        s.snapshot(&mut again);
        assert_eq!(again, bytes);
    }

    #[test]
    fn connections_of_different_nodes_with_the_same_slot_are_different_sessions() {
        let mut s = Sessions::default();
        let a = ConnId::on_node(1, 0, 7, 0);
        let b = ConnId::on_node(2, 0, 7, 0);
        assert_eq!(s.session(a), Session(1));
        assert_eq!(s.session(b), Session(2));
        assert_eq!(s.find(a), Some(Session(1)));
        assert_eq!(s.find(b), Some(Session(2)));
        assert_eq!(s.conn(Session(2)), Some(b));
        assert_eq!(s.close(a), Some(Session(1)));
        assert_eq!(s.find(a), None);
        assert_eq!(s.find(b), Some(Session(2)));
        // The freed direct entry goes to the next connection; b still answers from the map.
        let c = ConnId::on_node(3, 0, 7, 0);
        assert_eq!(s.session(c), Session(3));
        assert_eq!(s.close(b), Some(Session(2)));
        assert_eq!(s.find(c), Some(Session(3)));
        assert_eq!(s.find(b), None);
        let mut bytes = Vec::new();
        s.snapshot(&mut bytes);
        let t = Sessions::restore(&mut Reader::new(&bytes)).unwrap();
        assert_eq!(t.find(c), Some(Session(3)));
        assert_eq!(t.find(ConnId::on_node(1, 0, 7, 0)), None);
    }

    #[test]
    fn damaged_session_snapshots_are_errors() {
        let mut s = Sessions::default();
        s.session(ConnId::new(0, 1, 0));
        s.session(ConnId::new(0, 2, 0));
        let mut bytes = Vec::new();
        s.snapshot(&mut bytes);
        for cut in 0..bytes.len() {
            let mut r = Reader::new(&bytes[..cut]);
            assert!(
                Sessions::restore(&mut r).and_then(|_| r.finish()).is_err(),
                "cut {cut}"
            );
        }
        // last = 1 while session 2 is live.
        let mut bad = bytes.clone();
        bad[0] = 1;
        assert!(Sessions::restore(&mut Reader::new(&bad)).is_err());
    }
}
