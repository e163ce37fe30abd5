use super::*;
use std::collections::{BTreeMap, HashMap as StdHashMap};

const TIMEOUT: u64 = 20;
const SLOTS: u32 = 5;
const NAMES: [&[u8]; 4] = [b"a", b"b", b"", b"long name \xff"];

use crate::rng::Rng;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum MHolder {
    Held(Session),
    Orphan(u64),
}

struct MLock {
    holder: MHolder,
    queue: Vec<(Session, Vec<u8>)>,
}

#[derive(Default)]
struct Model {
    locks: BTreeMap<Vec<u8>, MLock>,
    grants: u64,
    expiries: u64,
    adoptions: u64,
    fence: u64,
}

impl Model {
    fn acquire(&mut self, session: Session, name: &[u8], payload: &[u8]) -> AcquireOutcome {
        match self.locks.get_mut(name) {
            Some(lock) => {
                lock.queue.push((session, payload.to_vec()));
                AcquireOutcome::Queued
            }
            None => {
                self.take(session, name);
                AcquireOutcome::Acquired
            }
        }
    }
    fn take(&mut self, session: Session, name: &[u8]) {
        self.locks.insert(
            name.to_vec(),
            MLock {
                holder: MHolder::Held(session),
                queue: Vec::new(),
            },
        );
        self.grants += 1;
        self.fence += 1;
    }
    fn try_lock(&mut self, session: Session, name: &[u8]) -> bool {
        if self.locks.contains_key(name) {
            return false;
        }
        self.take(session, name);
        true
    }
    fn pass_on(&mut self, name: &[u8], out: &mut Vec<(Session, Vec<u8>)>) {
        let Some(lock) = self.locks.get_mut(name) else {
            panic!("model: pass_on of a free name");
        };
        if lock.queue.is_empty() {
            self.locks.remove(name);
            return;
        }
        let (session, payload) = lock.queue.remove(0);
        lock.holder = MHolder::Held(session);
        self.grants += 1;
        self.fence += 1;
        out.push((session, payload));
    }
    fn release(&mut self, name: &[u8], out: &mut Vec<(Session, Vec<u8>)>) -> bool {
        if !self.locks.contains_key(name) {
            return false;
        }
        self.pass_on(name, out);
        true
    }
    fn adopt(&mut self, session: Session, name: &[u8], now: u64) -> bool {
        match self.locks.get_mut(name) {
            Some(lock) if matches!(lock.holder, MHolder::Orphan(d) if now < d) => {
                lock.holder = MHolder::Held(session);
                self.adoptions += 1;
                self.fence += 1;
                true
            }
            _ => false,
        }
    }
    fn disconnect(&mut self, session: Session, now: u64) {
        for lock in self.locks.values_mut() {
            if lock.holder == MHolder::Held(session) {
                lock.holder = MHolder::Orphan(now + TIMEOUT);
            }
            lock.queue.retain(|(c, _)| *c != session);
        }
    }
    fn advance(&mut self, now: u64, out: &mut Vec<(Session, Vec<u8>)>) {
        let mut due: Vec<(u64, Vec<u8>)> = self
            .locks
            .iter()
            .filter_map(|(n, l)| match l.holder {
                MHolder::Orphan(d) if d <= now => Some((d, n.clone())),
                _ => None,
            })
            .collect();
        due.sort();
        for (_, name) in due {
            self.expiries += 1;
            self.pass_on(&name, out);
        }
    }
    fn stats(&self) -> LockdStats {
        let mut s = LockdStats {
            grants: self.grants,
            orphan_expiries: self.expiries,
            adoptions: self.adoptions,
            ..Default::default()
        };
        for lock in self.locks.values() {
            match lock.holder {
                MHolder::Held(_) => s.held += 1,
                MHolder::Orphan(_) => s.orphaned += 1,
            }
            s.waiting += lock.queue.len() as u64;
        }
        s
    }
}

/// Counts of interesting events, to show the random walk actually reaches them.
#[derive(Default, Debug)]
struct Coverage {
    async_grants: u64,
    self_grants: u64,
    adoptions: u64,
    expiries: u64,
    queued_leaving_on_disconnect: u64,
    max_queue: usize,
}

fn compare(t: &LockdTable, m: &Model, step: u64) {
    t.check_invariants();
    for name in NAMES {
        let want = match m.locks.get(name).map(|l| l.holder) {
            None => LockState::Free,
            Some(MHolder::Held(c)) => LockState::Held(c),
            Some(MHolder::Orphan(d)) => LockState::Orphaned { deadline_ms: d },
        };
        assert_eq!(t.state(name), want, "step {step}: state of {name:?}");
        let got: Vec<(Session, Vec<u8>)> = t.waiters(name).map(|(c, p)| (c, p.to_vec())).collect();
        let want = m
            .locks
            .get(name)
            .map(|l| l.queue.clone())
            .unwrap_or_default();
        assert_eq!(got, want, "step {step}: queue of {name:?}");
    }
    let mut locked = Vec::new();
    t.for_each_locked(|n| locked.push(n.to_vec()));
    locked.sort();
    let want: Vec<Vec<u8>> = m.locks.keys().cloned().collect();
    assert_eq!(locked, want, "step {step}: locked names");
    assert_eq!(t.stats(), m.stats(), "step {step}: stats");
    assert_eq!(t.last_fence(), m.fence, "step {step}: fence");
}

/// The connections alive now (one per slot), and every queued ACQ's payload (unique: it
/// carries a serial number) with its connection, until it is granted or its session leaves.
struct Clients {
    live: Vec<Session>,
    outstanding: StdHashMap<Vec<u8>, Session>,
}

/// Grants of one step: the same set as the model's (their order across different names
/// may differ when orphans expire at the same instant), fences strictly increasing and
/// ending at the model's counter; every grant goes to a live connection and was queued.
fn check_grants(
    step: u64,
    got: &mut Vec<Grant>,
    want: &mut Vec<(Session, Vec<u8>)>,
    fence_before: u64,
    m: &Model,
    clients: &mut Clients,
    cov: &mut Coverage,
) {
    let Clients { live, outstanding } = clients;
    let mut fence = fence_before;
    for g in got.iter() {
        assert!(g.fence > fence, "step {step}: fence not increasing");
        fence = g.fence;
        assert!(
            live.contains(&g.session),
            "step {step}: grant to a dead session"
        );
        assert_eq!(
            outstanding.remove(&*g.payload),
            Some(g.session),
            "step {step}: granted an ACQ that was not waiting"
        );
    }
    if !got.is_empty() {
        // Asynchronous grants never share a step with an immediate one or an adoption.
        assert_eq!(fence, m.fence, "step {step}: last grant fence");
    }
    let mut got_set: Vec<(Session, Vec<u8>)> = got
        .drain(..)
        .map(|g| (g.session, g.payload.to_vec()))
        .collect();
    got_set.sort();
    want.sort();
    assert_eq!(&got_set, want, "step {step}: grants");
    cov.async_grants += want.len() as u64;
    want.clear();
}

fn run(seed: u64, steps: u64, cov: &mut Coverage) {
    run_restoring(seed, steps, cov, None)
}

/// With `restore_every`, the table is replaced by a restored copy of its snapshot every that
/// many steps and must go on matching the model exactly.
fn run_restoring(seed: u64, steps: u64, cov: &mut Coverage, restore_every: Option<u64>) {
    let mut rng = Rng::mixed(seed);
    let mut t = LockdTable::new(
        LockdConfig {
            orphan_timeout_ms: TIMEOUT,
        },
        0,
    );
    let mut m = Model::default();
    let mut clients = Clients {
        live: (0..SLOTS).map(|s| Session(u64::from(s))).collect(),
        outstanding: StdHashMap::new(),
    };
    let mut now = 0u64;
    let mut serial = 0u64;
    let mut got = Vec::new();
    let mut want = Vec::new();
    for step in 0..steps {
        let session = clients.live[rng.below(u64::from(SLOTS)) as usize];
        let name = NAMES[rng.below(NAMES.len() as u64) as usize];
        let fence_before = m.fence;
        match rng.below(100) {
            0..=29 => {
                serial += 1;
                let mut payload = name.to_vec();
                payload.push(0);
                payload.extend_from_slice(serial.to_string().as_bytes());
                let out = t.acquire(session, name, &payload, now);
                assert_eq!(
                    out,
                    m.acquire(session, name, &payload),
                    "step {step}: acquire"
                );
                if out == AcquireOutcome::Queued {
                    clients.outstanding.insert(payload, session);
                }
            }
            30..=39 => {
                assert_eq!(
                    t.try_lock(session, name, now),
                    m.try_lock(session, name),
                    "step {step}: try"
                );
            }
            40..=57 => {
                let before = t.state(name);
                let ok = t.release(session, name, now, &mut got);
                assert_eq!(ok, m.release(name, &mut want), "step {step}: release");
                assert!(
                    got.len() <= 1,
                    "step {step}: more than one grant per release"
                );
                if let (LockState::Held(h), Some(g)) = (before, got.first()) {
                    if g.session == h {
                        cov.self_grants += 1;
                    }
                }
            }
            58..=65 => {
                let ok = t.adopt(session, name, now);
                assert_eq!(ok, m.adopt(session, name, now), "step {step}: adopt");
                cov.adoptions += u64::from(ok);
            }
            66..=71 => {
                let waits = t.sessions.get(&session).map_or(0, |s| s.waits.len());
                cov.queued_leaving_on_disconnect += waits as u64;
                t.disconnect(session, now);
                m.disconnect(session, now);
                clients.outstanding.retain(|_, c| *c != session);
                // Reconnect in the same slot as a new generation.
                let slot = clients
                    .live
                    .iter()
                    .position(|c| *c == session)
                    .expect("live");
                clients.live[slot] = Session(session.0 + u64::from(SLOTS));
            }
            72..=89 => {
                now += rng.below(TIMEOUT / 2);
                let before = m.expiries;
                t.advance(now, &mut got);
                m.advance(now, &mut want);
                cov.expiries += m.expiries - before;
            }
            _ => now += rng.below(TIMEOUT / 3 + 1),
        }
        check_grants(
            step,
            &mut got,
            &mut want,
            fence_before,
            &m,
            &mut clients,
            cov,
        );
        compare(&t, &m, step);
        if restore_every.is_some_and(|n| step % n == n - 1) {
            let before = t.stats();
            t = crate::core::codec::testing::round_trip(&t, t.config, seed ^ step, |c| {
                c.check_invariants()
            });
            assert_eq!(t.stats(), before);
        }
        for l in m.locks.values() {
            cov.max_queue = cov.max_queue.max(l.queue.len());
        }
    }

    // Drain: release everything until nothing is locked; every ACQ still waiting must be
    // granted exactly once on the way (none lost).
    now += TIMEOUT;
    let fence_before = m.fence;
    t.advance(now, &mut got);
    m.advance(now, &mut want);
    check_grants(
        steps,
        &mut got,
        &mut want,
        fence_before,
        &m,
        &mut clients,
        cov,
    );
    while let Some(name) = m.locks.keys().next().cloned() {
        let fence_before = m.fence;
        assert!(t.release(clients.live[0], &name, now, &mut got));
        assert!(m.release(&name, &mut want));
        check_grants(
            steps,
            &mut got,
            &mut want,
            fence_before,
            &m,
            &mut clients,
            cov,
        );
        compare(&t, &m, steps);
    }
    assert!(
        clients.outstanding.is_empty(),
        "seed {seed}: waiters lost: {:?}",
        clients.outstanding
    );
    assert!(t.locks.is_empty() && t.waiters.is_empty() && t.by_name.is_empty());
    assert_eq!(t.next_deadline(), None);
}

#[test]
fn a_table_restored_from_its_snapshot_goes_on_exactly_like_the_original() {
    let mut cov = Coverage::default();
    for seed in 11..=13 {
        run_restoring(seed, 20_000, &mut cov, Some(29));
    }
    assert!(cov.async_grants > 100 && cov.expiries > 10, "{cov:?}");
}

#[test]
fn truncated_or_corrupt_lockd_snapshots_are_errors_not_panics() {
    let config = LockdConfig {
        orphan_timeout_ms: 100,
    };
    let mut t = LockdTable::new(config, 0);
    let c = |slot: u32| Session(u64::from(slot));
    let mut g = Vec::new();
    t.acquire(c(1), b"a", b"a\0", 0);
    t.acquire(c(2), b"a", b"a\0x", 0);
    t.acquire(c(1), b"b", b"b\0", 0);
    t.disconnect(c(1), 5);
    t.acquire(c(3), b"c", b"c\0", 6);
    t.advance(6, &mut g);
    crate::core::codec::testing::damage_is_refused(&t, config, 2000, |c| c.check_invariants());
}

#[test]
fn random_commands_match_the_naive_model() {
    let mut cov = Coverage::default();
    for seed in 1..=8 {
        run(seed, 30_000, &mut cov);
    }
    eprintln!("coverage: {cov:?}");
    // The walk must have reached every interesting transition, many times.
    assert!(cov.async_grants > 1000, "{cov:?}");
    assert!(cov.self_grants > 100, "{cov:?}");
    assert!(cov.adoptions > 100, "{cov:?}");
    assert!(cov.expiries > 100, "{cov:?}");
    assert!(cov.queued_leaving_on_disconnect > 100, "{cov:?}");
    assert!(cov.max_queue >= 5, "{cov:?}");
}
