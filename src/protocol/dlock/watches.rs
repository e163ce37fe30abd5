//! Watches of the native protocol: which sessions watch which keys, under which Watch's
//! request id.
//!
//! Owns: the subscriptions and the per-connection cap. Must not: make events (the dlock table
//! does) or write them (`native.rs` does). A node's subscriptions are fed from what that node
//! applies and are not part of a snapshot: a node that installs a leader's snapshot skipped
//! the events in between, so it closes its watchers' connections instead of leaving a gap.
//! Its counts of frames sent ([`Sent`]) are this node's, for `/metrics`, and not in a snapshot
//! either.

use crate::core::hash::HashMap;
use crate::core::Session;

/// Watched keys per connection, at most (more: InvalidArgument).
pub const MAX_WATCHED_KEYS: usize = 1024;

#[derive(Default)]
pub struct Watches {
    /// Key -> its watchers (session, the Watch's request id), in subscription order.
    by_key: HashMap<Box<[u8]>, Vec<(Session, u64)>>,
    /// Session -> the keys it watches.
    by_session: HashMap<Session, Vec<Box<[u8]>>>,
    /// Frames pushed to this node's connections since it started.
    pub sent: Sent,
}

/// Pushed frames of the native protocol, counted where `native.rs` pushes them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sent {
    /// Watch events, by kind: acquired, released, expired, lost (one per watcher).
    pub events: [u64; 4],
    /// Expired and Lost notices to holders.
    pub notices: u64,
}

impl Watches {
    pub fn is_empty(&self) -> bool {
        self.by_session.is_empty()
    }

    /// Keys `session` watches.
    pub fn count(&self, session: Session) -> usize {
        self.by_session.get(&session).map_or(0, Vec::len)
    }

    /// How many of `keys` `session` does not watch yet.
    pub fn new_keys<'k>(&self, session: Session, keys: impl Iterator<Item = &'k [u8]>) -> usize {
        let mine = self.by_session.get(&session);
        keys.filter(|k| mine.is_none_or(|m| !m.iter().any(|w| &w[..] == *k)))
            .count()
    }

    /// `session` watches `key` under request `id` (a key it watched already moves to `id`).
    pub fn watch(&mut self, session: Session, id: u64, key: &[u8]) {
        let watchers = self.by_key.entry(key.into()).or_default();
        if let Some(w) = watchers.iter_mut().find(|(s, _)| *s == session) {
            w.1 = id;
            return;
        }
        watchers.push((session, id));
        self.by_session.entry(session).or_default().push(key.into());
    }

    /// `session` no longer watches `key` (nothing if it did not).
    pub fn unwatch(&mut self, session: Session, key: &[u8]) {
        let Some(mine) = self.by_session.get_mut(&session) else {
            return;
        };
        let Some(i) = mine.iter().position(|k| &k[..] == key) else {
            return;
        };
        mine.swap_remove(i);
        if mine.is_empty() {
            self.by_session.remove(&session);
        }
        self.forget(session, key);
    }

    /// Every watch of `session` ends (its connection closed).
    pub fn drop_session(&mut self, session: Session) {
        if self.by_session.is_empty() {
            return;
        }
        for key in self.by_session.remove(&session).unwrap_or_default() {
            self.forget(session, &key);
        }
    }

    fn forget(&mut self, session: Session, key: &[u8]) {
        if let Some(watchers) = self.by_key.get_mut(key) {
            watchers.retain(|(s, _)| *s != session);
            if watchers.is_empty() {
                self.by_key.remove(key);
            }
        }
    }

    /// The watchers of `key`, in subscription order.
    pub fn watchers(&self, key: &[u8]) -> &[(Session, u64)] {
        self.by_key.get(key).map_or(&[], Vec::as_slice)
    }

    /// Every watching session, in id order; the registry is left empty.
    pub fn take_sessions(&mut self) -> Vec<Session> {
        let mut s: Vec<Session> = self.by_session.drain().map(|(s, _)| s).collect();
        self.by_key.clear();
        s.sort_unstable();
        s
    }

    /// Watched (key, session) pairs.
    pub fn len(&self) -> usize {
        self.by_session.values().map(Vec::len).sum()
    }

    /// Keys with at least one watcher.
    pub fn keys(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_unwatch_and_close_keep_both_maps_in_step() {
        let mut w = Watches::default();
        let (a, b) = (Session(1), Session(2));
        w.watch(a, 10, b"k");
        w.watch(b, 20, b"k");
        w.watch(a, 11, b"j");
        w.watch(a, 12, b"k");
        assert_eq!(w.watchers(b"k"), &[(a, 12), (b, 20)]);
        assert_eq!((w.count(a), w.count(b), w.len(), w.keys()), (2, 1, 3, 2));
        assert_eq!(w.new_keys(a, [&b"k"[..], b"x", b"y"].into_iter()), 2);
        w.unwatch(a, b"k");
        assert_eq!(w.watchers(b"k"), &[(b, 20)]);
        w.unwatch(a, b"never");
        w.drop_session(b);
        assert!(w.watchers(b"k").is_empty());
        assert_eq!(w.watchers(b"j"), &[(a, 11)]);
        assert_eq!(w.take_sessions(), vec![a]);
        assert!(w.is_empty() && w.watchers(b"j").is_empty());
    }
}
