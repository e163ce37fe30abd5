//! The soak's own picture of who holds what, and the mutual-exclusion checks made against it.
//! The rules are documented at the top of `main.rs`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::net::{unstamp, Alive};
use crate::report::Report;

/// `Bound::why` of a dlock connection-bound lock's idle clock: in cluster mode such a lock also
/// ends with its node's sessions (rule 10), unlike a lease.
pub const IDLE: &str = "idle timeout";

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Proto {
    Mc,
    Lockd,
    Dlock,
}

impl Proto {
    pub fn name(self) -> &'static str {
        match self {
            Proto::Mc => "memcache",
            Proto::Lockd => "lockd",
            Proto::Dlock => "dlock",
        }
    }
}

/// A holder as the soak knows it: the client thread and the connection (a process-wide serial
/// number, never reused), because the server's holder is a connection.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Owner {
    pub client: u32,
    pub conn: u64,
}

/// How long the server may keep a lock on its own: a lower bound of the instant at which the
/// server may release it without its holder asking, and what that timer is.
#[derive(Clone, Copy, Debug)]
pub struct Bound {
    pub at: Instant,
    pub why: &'static str,
}

#[derive(Clone, Debug)]
struct Mark {
    owner: Owner,
    /// When the grant was seen.
    since: Instant,
    /// Unique per grant: the same epoch seen at two instants means the same grant all along.
    epoch: u64,
    /// `None`: the server keeps the lock until its owner releases it (or its connection closes,
    /// which the owner does only after clearing the mark). `Some`: the server may release it
    /// by itself from `at` on (a lease, an idle connection, an orphan).
    bound: Option<Bound>,
    /// False once the owner let go of it in a way the server completes later (an orphan left
    /// by a disconnect, a lease left to lapse).
    active: bool,
    /// Cluster mode: the holder's connection's [`Alive`] (rule 10).
    alive: Option<Alive>,
}

/// How many of a name's latest mark transitions and client notes are kept to explain a double
/// grant.
const TRAIL_LEN: usize = 10;

/// One step of a name's trail: when, who, what.
struct Step {
    at: Instant,
    owner: Owner,
    what: String,
}

pub struct Model {
    marks: Mutex<HashMap<(Proto, String), Mark>>,
    /// The latest steps of every name (grants, releases, notes of the clients), printed with a
    /// double grant of that name.
    trails: Mutex<HashMap<(Proto, String), VecDeque<Step>>>,
    epoch: AtomicU64,
    /// How much earlier than its bound a lock may be granted again without being a double
    /// grant (the server's millisecond clock truncates; see main.rs).
    tolerance: Duration,
    report: Arc<Report>,
    /// Cluster mode: how long after a connection's `alive` its node may end its sessions
    /// (the session timeout less one election timeout, rule 10).
    session_bound: Option<Duration>,
    /// Per name, the grants whose fencing token is known (rule 11).
    tokens: Mutex<HashMap<(Proto, String), TokenLog>>,
}

/// How many grants with a token are kept per name; older ones are folded into `pruned_*`.
const TOKEN_LOG_LEN: usize = 64;

#[derive(Default)]
struct TokenLog {
    /// (when the grant was read, its token, who), in the order recorded.
    recent: VecDeque<(Instant, u64, Owner)>,
    /// The largest token and the latest read time of the grants dropped from `recent`.
    pruned_max: u64,
    pruned_read: Option<Instant>,
}

impl Model {
    pub fn new(tolerance: Duration, report: Arc<Report>) -> Model {
        Model {
            marks: Mutex::new(HashMap::new()),
            trails: Mutex::new(HashMap::new()),
            epoch: AtomicU64::new(1),
            tolerance,
            report,
            session_bound: None,
            tokens: Mutex::new(HashMap::new()),
        }
    }

    /// Cluster mode: marks of connection-bound locks end with their node's sessions (rule 10).
    pub fn with_session_bound(mut self, session_bound: Option<Duration>) -> Model {
        self.session_bound = session_bound;
        self
    }

    /// Cluster mode: the earliest instant at which the cluster may end the session of the
    /// connection that `alive` belongs to without the client having read the close (rule 10).
    pub fn session_end(&self, alive: Option<&Alive>) -> Option<Instant> {
        let st = self.session_bound?;
        alive.map(|a| unstamp(a.load(Ordering::Relaxed)) + st)
    }

    /// The earliest instant from which the server may count a timer that starts when this
    /// connection's session ends (an orphan window after a close at `now`): `now`, or in
    /// cluster mode the session end if that is earlier (the node may have been stopped).
    pub fn session_floor(&self, alive: Option<&Alive>, now: Instant) -> Instant {
        match self.session_end(alive) {
            Some(end) if end < now => end,
            _ => now,
        }
    }

    /// Whether mark `m` still excludes everyone else at `now`: active, without a bound, and
    /// (cluster mode) before its node's sessions may have been expired.
    fn exclusive(&self, m: &Mark, now: Instant) -> bool {
        m.active
            && m.bound.is_none()
            && self
                .session_end(m.alive.as_ref())
                .is_none_or(|end| now + self.tolerance < end)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(Proto, String), Mark>> {
        // A poisoned map only means another client thread panicked; the data is still usable.
        self.marks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Add a step to the trail of `name`.
    pub fn note(&self, p: Proto, name: &str, who: Owner, what: String) {
        let mut t = self.trails.lock().unwrap_or_else(|e| e.into_inner());
        let trail = t.entry((p, name.to_string())).or_default();
        if trail.len() == TRAIL_LEN {
            trail.pop_front();
        }
        trail.push_back(Step {
            at: Instant::now(),
            owner: who,
            what,
        });
    }

    /// The trail of `name`, one step per line, times in seconds since the soak started.
    pub fn trail(&self, p: Proto, name: &str) -> String {
        let t = self.trails.lock().unwrap_or_else(|e| e.into_inner());
        let Some(trail) = t.get(&(p, name.to_string())) else {
            return String::new();
        };
        let start = self.report.started;
        trail
            .iter()
            .map(|s| {
                format!(
                    "\n    [{:.3}s] client {} conn {}: {}",
                    s.at.duration_since(start).as_secs_f64(),
                    s.owner.client,
                    s.owner.conn,
                    s.what
                )
            })
            .collect()
    }

    /// Why a new grant of a name that carries mark `m` breaks mutual exclusion, if it does.
    fn conflict(&self, p: Proto, m: &Mark, who: Owner, now: Instant) -> Option<String> {
        if m.owner == who && p == Proto::Dlock {
            return None; // dlock is re-entrant: the same connection re-locks what it holds
        }
        // Rule 10: a connection-bound lock (no bound, or a dlock idle clock) ends with its
        // node's sessions at the latest; a lease and an orphan window do not.
        let session_end = self.session_end(m.alive.as_ref());
        let session_bound = match m.bound {
            None => session_end,
            Some(b) if b.why == IDLE => session_end.filter(|&e| e < b.at),
            Some(_) => None,
        };
        if let Some(end) = session_bound {
            if now + self.tolerance >= end {
                self.report.count(&self.report.c.past_session_bound);
                return None;
            }
        }
        match m.bound {
            Some(b) if now + self.tolerance >= b.at => None,
            Some(b) => Some(format!(
                "{} ms before the {} of client {} conn {} could end (held since {} ms ago{})",
                b.at.duration_since(now).as_millis(),
                b.why,
                m.owner.client,
                m.owner.conn,
                now.duration_since(m.since).as_millis(),
                if m.active { "" } else { ", let go" }
            )),
            None => Some(format!(
                "while held by client {} conn {} (for {} ms)",
                m.owner.client,
                m.owner.conn,
                now.duration_since(m.since).as_millis()
            )),
        }
    }

    fn put(
        &self,
        m: &mut HashMap<(Proto, String), Mark>,
        key: (Proto, String),
        who: Owner,
        bound: Option<Bound>,
        alive: Option<Alive>,
    ) {
        let epoch = self.epoch.fetch_add(1, Ordering::Relaxed);
        m.insert(
            key,
            Mark {
                owner: who,
                since: Instant::now(),
                epoch,
                bound,
                active: true,
                alive,
            },
        );
    }

    /// The server's reply (read just now) says `who` holds `name` (`how`: which request). `bound`:
    /// when the server may release it by itself. Records a double grant when the mark of
    /// another holder forbids the grant. Returns false on a double grant.
    pub fn granted(
        &self,
        p: Proto,
        name: &str,
        who: Owner,
        how: &str,
        bound: Option<Bound>,
        alive: Option<Alive>,
    ) -> bool {
        let now = Instant::now();
        let mut m = self.lock();
        let key = (p, name.to_string());
        // A grant read after its own lease ended (a reply that waited in a stopped or cut-off
        // node) holds nothing: no conflict.
        let over = bound.is_some_and(|b| b.why != IDLE && now >= b.at);
        let problem = m.get(&key).and_then(|old| self.conflict(p, old, who, now));
        // Such a grant must not replace another owner's mark that still excludes.
        let (problem, keep_old) = if over {
            (None, problem.is_some())
        } else {
            (problem, false)
        };
        if !keep_old {
            self.put(&mut m, key, who, bound, alive);
        }
        drop(m);
        self.note(
            p,
            name,
            who,
            match bound {
                Some(b) => format!(
                    "granted ({how}), {} until +{} ms",
                    b.why,
                    b.at.saturating_duration_since(now).as_millis()
                ),
                None => format!("granted ({how})"),
            },
        );
        match problem {
            Some(why) => {
                self.report.double_grant(format!(
                    "{} {name:?} granted to client {} conn {} ({how}) {why}; trail:{}",
                    p.name(),
                    who.client,
                    who.conn,
                    self.trail(p, name)
                ));
                false
            }
            None => true,
        }
    }

    /// lockd ADOPT answered ACK: `who` holds the orphan now. Only a lock whose holder is still
    /// connected cannot be an orphan (the soak does not know every orphan: a waiter that gave
    /// up may have been granted just before it left).
    pub fn adopted(&self, name: &str, who: Owner, alive: Option<Alive>) -> bool {
        let now = Instant::now();
        let mut m = self.lock();
        let key = (Proto::Lockd, name.to_string());
        let problem = match m.get(&key) {
            // Rule 10: a holder whose node's sessions may have ended may have left an orphan.
            Some(old)
                if old.active
                    && old.owner != who
                    && self
                        .session_end(old.alive.as_ref())
                        .is_none_or(|end| now + self.tolerance < end) =>
            {
                Some(format!(
                "lockd {name:?} adopted by client {} conn {} while its holder client {} conn {} \
                 is connected (held for {} ms)",
                who.client,
                who.conn,
                old.owner.client,
                old.owner.conn,
                old.since.elapsed().as_millis()
                ))
            }
            _ => None,
        };
        self.put(&mut m, key, who, None, alive);
        drop(m);
        self.note(Proto::Lockd, name, who, "adopted".into());
        match problem {
            Some(text) => {
                self.report
                    .double_grant(format!("{text}; trail:{}", self.trail(Proto::Lockd, name)));
                false
            }
            None => true,
        }
    }

    /// `who` is about to send the release (or to close a connection whose close releases at
    /// once): the mark goes first. A mark that is no longer `who`'s (its bound passed and the
    /// lock went to someone else) stays.
    pub fn releasing(&self, p: Proto, name: &str, who: Owner) {
        let mut m = self.lock();
        let key = (p, name.to_string());
        if m.get(&key).is_some_and(|old| old.owner == who) {
            m.remove(&key);
        }
        drop(m);
        self.note(p, name, who, "releasing".into());
    }

    /// `who` gives up a waiting dlock Lock naming `name` by closing its connection (rule 5):
    /// the server may have granted that Lock just before the close. If `who` already held
    /// `name` (a lease left to run out), that grant replaced its record (the rule: "a re-lock
    /// replaces the old record"): without a lease (`lease_end` None) the key became
    /// connection-bound and the close releases it at once; with one, the new lease runs from
    /// that grant, so from `lease_end` (send time + lease) at the earliest, and may end before
    /// the old one. So the mark goes, or its bound becomes the earlier of the two, before the
    /// close. Returns whether `who` had a mark on `name`.
    pub fn dlock_relock_given_up(
        &self,
        name: &str,
        who: Owner,
        lease_end: Option<Instant>,
    ) -> bool {
        let owned = self
            .lock()
            .get(&(Proto::Dlock, name.to_string()))
            .is_some_and(|m| m.owner == who);
        if owned {
            match lease_end {
                None => self.releasing(Proto::Dlock, name, who),
                Some(at) => self.leaving(
                    Proto::Dlock,
                    name,
                    who,
                    Bound {
                        at,
                        why: "lease of a given-up re-lock",
                    },
                ),
            }
        }
        owned
    }

    /// `who` lets go in a way the server completes only later: it may keep the lock until
    /// `bound` (at the earliest).
    pub fn leaving(&self, p: Proto, name: &str, who: Owner, bound: Bound) {
        let mut m = self.lock();
        if let Some(old) = m.get_mut(&(p, name.to_string())) {
            if old.owner == who {
                old.active = false;
                old.bound = Some(match old.bound {
                    Some(b) if b.at < bound.at => b,
                    _ => bound,
                });
            }
        }
        drop(m);
        let left = bound.at.saturating_duration_since(Instant::now());
        self.note(
            p,
            name,
            who,
            format!("leaving, {} until +{} ms", bound.why, left.as_millis()),
        );
    }

    /// `who` still holds `name` and moved its bound (a dlock request restarted the idle clock).
    pub fn rebound(&self, p: Proto, name: &str, who: Owner, bound: Bound) {
        let mut m = self.lock();
        if let Some(old) = m.get_mut(&(p, name.to_string())) {
            if old.owner == who && old.active {
                old.bound = Some(bound);
            }
        }
    }

    /// The epoch and owner of `name` if another owner holds it without a bound right now.
    pub fn held_by_other(&self, p: Proto, name: &str, me: Owner) -> Option<(u64, Owner)> {
        let now = Instant::now();
        match self.lock().get(&(p, name.to_string())) {
            Some(m) if m.owner != me && self.exclusive(m, now) => Some((m.epoch, m.owner)),
            _ => None,
        }
    }

    /// Every name of `p` held without a bound right now, with its epoch.
    pub fn held_snapshot(&self, p: Proto) -> Vec<(String, u64)> {
        let now = Instant::now();
        self.lock()
            .iter()
            .filter(|((q, _), m)| *q == p && self.exclusive(m, now))
            .map(|((_, name), m)| (name.clone(), m.epoch))
            .collect()
    }

    /// The epoch of `name`'s mark if it is held without a bound.
    pub fn held_epoch(&self, p: Proto, name: &str) -> Option<u64> {
        let now = Instant::now();
        match self.lock().get(&(p, name.to_string())) {
            Some(m) if self.exclusive(m, now) => Some(m.epoch),
            _ => None,
        }
    }

    /// Rule 11: a grant of `name` to `who` carrying fencing token `token`, whose request was
    /// sent at `sent` and whose grant was read at `read`. Its token must be larger than that
    /// of every grant of the name read before `sent`. Returns false on a violation.
    #[allow(clippy::too_many_arguments)]
    pub fn token(
        &self,
        p: Proto,
        name: &str,
        who: Owner,
        how: &str,
        token: u64,
        sent: Instant,
        read: Instant,
    ) -> bool {
        self.report.count(&self.report.c.tokens_checked);
        let mut t = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        let log = t.entry((p, name.to_string())).or_default();
        let mut problem = None;
        if log.pruned_read.is_some_and(|r| r < sent) && token <= log.pruned_max {
            problem = Some(format!(
                "not above {} of an earlier grant read before the request",
                log.pruned_max
            ));
        }
        if let Some(&(r, old, by)) = log
            .recent
            .iter()
            .filter(|(r, old, _)| *r < sent && token <= *old)
            .max_by_key(|(_, old, _)| *old)
        {
            problem = Some(format!(
                "not above {old} of the grant to client {} conn {} read {} ms before this                  request was sent",
                by.client,
                by.conn,
                sent.duration_since(r).as_millis()
            ));
        }
        if log.recent.len() == TOKEN_LOG_LEN {
            if let Some((r, old, _)) = log.recent.pop_front() {
                log.pruned_max = log.pruned_max.max(old);
                log.pruned_read = Some(log.pruned_read.map_or(r, |p| p.max(r)));
            }
        }
        log.recent.push_back((read, token, who));
        drop(t);
        self.note(p, name, who, format!("token {token} ({how})"));
        match problem {
            Some(why) => {
                self.report.token_violation(format!(
                    "{} {name:?}: token {token} of the grant to client {} conn {} ({how}) {why}; \
                     trail:{}",
                    p.name(),
                    who.client,
                    who.conn,
                    self.trail(p, name)
                ));
                false
            }
            None => true,
        }
    }

    /// lockd names that are probably orphans now (left by a disconnect, timeout not over yet).
    pub fn orphan_candidates(&self) -> Vec<String> {
        let now = Instant::now();
        self.lock()
            .iter()
            .filter(|((q, _), m)| {
                *q == Proto::Lockd && !m.active && m.bound.is_some_and(|b| b.at > now)
            })
            .map(|((_, name), _)| name.clone())
            .collect()
    }

    /// Marks now: (held by a client, let go but possibly still held by the server).
    pub fn counts(&self) -> (usize, usize) {
        let now = Instant::now();
        let m = self.lock();
        let active = m.values().filter(|k| k.active).count();
        let left = m
            .values()
            .filter(|k| !k.active && k.bound.is_some_and(|b| b.at > now))
            .count();
        (active, left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Owner = Owner { client: 1, conn: 1 };
    const B: Owner = Owner { client: 2, conn: 2 };

    fn model() -> (Model, Arc<Report>) {
        let report = Arc::new(Report::new());
        (Model::new(Duration::from_millis(5), report.clone()), report)
    }

    fn lease(from_now_ms: i64) -> Option<Bound> {
        let now = Instant::now();
        let d = Duration::from_millis(from_now_ms.unsigned_abs());
        Some(Bound {
            at: if from_now_ms < 0 { now - d } else { now + d },
            why: "lease",
        })
    }

    #[test]
    fn grant_over_a_running_lease_of_another_connection_is_a_double_grant() {
        let (m, report) = model();
        assert!(m.granted(Proto::Dlock, "k", A, "Lock with lease", lease(10_000), None));
        assert!(!m.granted(Proto::Dlock, "k", B, "Lock", None, None));
        assert_eq!(report.double_grants.load(Ordering::Relaxed), 1);
    }

    /// The soak's one false DOUBLE GRANT: A holds a lease on k, re-locks k (with a busy key)
    /// without a lease and gives up waiting by closing; the server had granted that Lock, so
    /// k was connection-bound and the close released it, long before the old lease's end.
    #[test]
    fn given_up_relock_without_lease_lets_the_close_release_a_lease() {
        let (m, report) = model();
        assert!(m.granted(Proto::Dlock, "k", A, "Lock with lease", lease(10_000), None));
        assert!(m.dlock_relock_given_up("k", A, None));
        assert!(m.granted(Proto::Dlock, "k", B, "Lock", None, None));
        assert_eq!(report.failures(), 0);
    }

    #[test]
    fn given_up_relock_with_a_shorter_lease_moves_the_bound_earlier() {
        let (m, report) = model();
        assert!(m.granted(Proto::Dlock, "k", A, "Lock with lease", lease(10_000), None));
        // Sent 60 ms ago with a 50 ms lease: the new lease may have ended already.
        let end = Instant::now() - Duration::from_millis(10);
        assert!(m.dlock_relock_given_up("k", A, Some(end)));
        assert!(m.granted(Proto::Dlock, "k", B, "Lock", None, None));
        assert_eq!(report.failures(), 0);
    }

    #[test]
    fn given_up_relock_with_a_longer_lease_keeps_the_earlier_bound() {
        let (m, report) = model();
        assert!(m.granted(Proto::Dlock, "k", A, "Lock with lease", lease(10_000), None));
        let end = Instant::now() + Duration::from_secs(20);
        assert!(m.dlock_relock_given_up("k", A, Some(end)));
        assert!(
            !m.granted(Proto::Dlock, "k", B, "Lock", None, None),
            "10 s still to go"
        );
        assert_eq!(report.double_grants.load(Ordering::Relaxed), 1);

        let (m, report) = model();
        assert!(m.granted(Proto::Dlock, "k", A, "Lock with lease", lease(-1), None));
        assert!(m.dlock_relock_given_up("k", A, Some(end)));
        assert!(
            m.granted(Proto::Dlock, "k", B, "Lock", None, None),
            "the old lease may have run out: an unseen grant of a new one need not have happened"
        );
        assert_eq!(report.failures(), 0);
    }

    #[test]
    fn given_up_lock_leaves_the_marks_of_other_owners_alone() {
        let (m, report) = model();
        assert!(m.granted(Proto::Dlock, "k", B, "Lock with lease", lease(10_000), None));
        assert!(!m.dlock_relock_given_up("k", A, None));
        assert!(!m.granted(Proto::Dlock, "k", A, "Lock", None, None));
        assert_eq!(report.double_grants.load(Ordering::Relaxed), 1);
    }

    fn alive_at(ago_ms: u64) -> Option<Alive> {
        let t = Instant::now() - Duration::from_millis(ago_ms);
        Some(Arc::new(AtomicU64::new(crate::net::stamp(t))))
    }

    #[test]
    fn a_token_not_above_one_read_before_the_request_was_sent_is_a_violation() {
        let (m, report) = model();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        let t1 = Instant::now();
        assert!(m.token(Proto::Dlock, "k", A, "Lock", 10, t0, t1));
        std::thread::sleep(Duration::from_millis(2));
        let t2 = Instant::now();
        // Sent before A's grant was read: any token is fine (the grants raced).
        assert!(m.token(Proto::Dlock, "k", B, "Lock", 7, t0, t2));
        // Sent after both were read: must be above both.
        assert!(!m.token(Proto::Dlock, "k", B, "Lock", 9, t2, Instant::now()));
        assert!(m.token(Proto::Dlock, "k", A, "Lock", 11, t2, Instant::now()));
        // Another name has its own order.
        assert!(m.token(Proto::Dlock, "other", A, "Lock", 1, t2, Instant::now()));
        assert_eq!(report.token_violations.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn tokens_folded_out_of_the_log_still_bound_later_grants() {
        let (m, report) = model();
        let start = Instant::now();
        for t in 1..=(TOKEN_LOG_LEN as u64 + 5) {
            assert!(m.token(
                Proto::Mc,
                "k",
                A,
                "Lock",
                t * 10,
                Instant::now(),
                Instant::now()
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
        assert!(!m.token(
            Proto::Mc,
            "k",
            B,
            "Lock",
            15,
            Instant::now(),
            Instant::now()
        ));
        // One sent before all of them were read is not bound by them.
        assert!(m.token(Proto::Mc, "k", B, "Lock", 15, start, Instant::now()));
        assert_eq!(report.token_violations.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn cluster_a_mark_excludes_others_only_until_its_session_bound() {
        let report = Arc::new(Report::new());
        let m = Model::new(Duration::from_millis(5), report.clone())
            .with_session_bound(Some(Duration::from_millis(600)));
        // The holder's last answered request was sent 1 s ago: its node may have ended the
        // session since (a stopped or fenced node).
        assert!(m.granted(Proto::Mc, "k", A, "lock", None, alive_at(1000)));
        assert!(m.held_by_other(Proto::Mc, "k", B).is_none());
        assert!(m.granted(Proto::Mc, "k", B, "lock", None, alive_at(0)));
        assert_eq!(report.c.past_session_bound.load(Ordering::Relaxed), 1);
        // B's request was answered just now: a grant to A is a double grant.
        assert!(m.held_by_other(Proto::Mc, "k", A).is_some());
        assert!(!m.granted(Proto::Mc, "k", A, "lock", None, alive_at(0)));
        assert_eq!(report.double_grants.load(Ordering::Relaxed), 1);
        // A lease is not tied to the session.
        let (m, report) = model();
        let m = m.with_session_bound(Some(Duration::from_millis(600)));
        assert!(m.granted(Proto::Dlock, "k", A, "Lock", lease(5000), alive_at(1000)));
        assert!(!m.granted(Proto::Dlock, "k", B, "Lock", None, alive_at(0)));
        assert_eq!(report.double_grants.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_grant_read_after_its_own_lease_ended_conflicts_with_nothing() {
        let (m, report) = model();
        assert!(m.granted(Proto::Dlock, "k", A, "Lock", None, None));
        assert!(m.granted(Proto::Dlock, "k", B, "Lock with lease", lease(-10), None));
        assert_eq!(report.failures(), 0);
        assert!(!m.granted(Proto::Dlock, "k", B, "Lock with lease", lease(100), None));
    }

    #[test]
    fn cluster_an_orphan_window_counts_from_the_session_bound_if_earlier() {
        let (m, _) = model();
        let m = m.with_session_bound(Some(Duration::from_millis(600)));
        let now = Instant::now();
        let old = alive_at(2000);
        assert!(m.session_floor(old.as_ref(), now) < now - Duration::from_millis(1000));
        assert_eq!(m.session_floor(alive_at(0).as_ref(), now), now);
        assert_eq!(m.session_floor(None, now), now);
    }
}
