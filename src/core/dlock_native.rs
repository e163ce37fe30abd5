//! Version 3 of dlock (the native protocol) in the dlock table: holds per grant, shared mode,
//! semaphores, values, lock-delay, Unlock and Extend by fence, Get and CheckFence
//! (`docs/protocol.md`).
//!
//! # The rule, with version 3
//!
//! A key has a *limit* (1 to 65535) while it has holders or waiters: that of its version-3
//! grants and waiters, 1 for version 2's. A request of another limit is refused and changes
//! nothing. Its holders are version 2's one holder (exclusive, re-entrant per connection), or
//! version-3 grants: with limit 1, one exclusive grant or any number of shared ones; with a
//! larger limit, up to that many grants (slots). A version-3 Lock is granted when, for every one
//! of its keys, no earlier Lock waits for the key (it would head the key's queue), the key is
//! not in a lock-delay and the Lock fits beside the key's holders. So a waiting exclusive Lock is
//! never overtaken by later shared ones, and shared Locks at the head of a queue are granted
//! together (each grant lets the next head through), each with its own fencing token. Version
//! 2's rule is unchanged; a version-3 grant or a lock-delay is a holder it waits for.
//!
//! # Choices the contract leaves open
//!
//! - A version-3 Lock that names a key twice takes it once (as version 2 does).
//! - The key's limit is free again once the key has no holder and no waiter, even during a
//!   lock-delay.
//! - Unlock by fence also ends a version-2 hold with that token (of that one key; the version-2
//!   holder is not told: version 2 has no pushed frames). Extend by fence reaches version-3
//!   grants only: a version-2 hold belongs to its connection (NotHeld).
//! - Unlock by fence or Extend by fence naming other than exactly one key: InvalidArgument.
//! - Extend without fence extends every grant of the connection on each named key (it may hold
//!   a key more than once: shared, or several slots).
//! - A grant ended by loss or expiry with a lock-delay delays the key until the latest of the
//!   delays running (a second loss never shortens one). A new cluster leader moves delays by the
//!   same margin as leases.
//! - A version-2 re-lock that replaces its own hold ends one grant and begins another: `Key`
//!   events Released, then Acquired with the new token.
//! - A lease left by a closed connection keeps its session: nobody is told when it runs out
//!   (Extend by fence from another connection gives it a new one).
//! - Lock-delays and values are counted in milliseconds on the table's clock, like leases
//!   (rounded up).

use super::*;

/// Largest value of a grant, in bytes.
pub const MAX_VALUE: usize = 4096;
/// Largest semaphore limit.
pub const MAX_LIMIT: u32 = 65535;
/// Longest lock-delay, in microseconds (60 s).
pub const MAX_LOCK_DELAY_US: u64 = 60_000_000;

/// A version-3 Lock: version 2's fields (`request_id` is the caller's tag for the answer, as
/// `LockRequest::token`) and the native ones.
#[derive(Clone, Copy, Debug, Default)]
pub struct NativeLock<'k> {
    pub request_id: u64,
    pub keys: &'k [&'k [u8]],
    pub wait_us: Option<u64>,
    pub lease_us: Option<u64>,
    pub shared: bool,
    /// Slots of the key (`None`: 1).
    pub limit: Option<u32>,
    pub value: Option<&'k [u8]>,
    pub lock_delay_us: Option<u64>,
}

/// Why a version-3 request was refused; nothing changed.
#[derive(Debug, PartialEq, Eq)]
pub enum NativeError {
    InvalidArgument(&'static str),
    /// These keys are not held by the caller (or the fence).
    NotHeld(Vec<Box<[u8]>>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum KeyEventKind {
    Acquired,
    Released,
    Expired,
    Lost,
}

/// One holder of a key, as Get shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderInfo {
    pub fence: u64,
    /// The session that holds it (the one a lease was left by, after its connection closed).
    pub session: Session,
    pub value: Option<Box<[u8]>>,
    /// Microseconds left of its lease; 0: connection-bound.
    pub lease_left_us: u64,
}

/// A key as Get shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyInfo {
    pub shared: bool,
    pub limit: u32,
    /// In grant order.
    pub holders: Vec<HolderInfo>,
    pub waiters: u32,
    pub delayed_us: u64,
}

/// One version-3 grant as the admin listing shows it.
#[derive(Clone, Copy, Debug)]
pub struct GrantView<'a> {
    pub fence: u64,
    pub session: Session,
    /// When it was granted (Unix ms, whole seconds).
    pub since_ms: u64,
    /// Its lease's deadline (Unix ms); `None`: connection-bound.
    pub lease_deadline_ms: Option<u64>,
    pub value: Option<&'a [u8]>,
}

/// A key with version-3 grants as the admin listing shows it.
#[derive(Clone, Copy)]
pub struct NativeKeyView<'a> {
    /// The mode of its grants (of its first, for a semaphore's slots).
    pub shared: bool,
    pub limit: u32,
    /// The end of its lock-delay (Unix ms), if one runs.
    pub delay_until_ms: Option<u64>,
    grants: &'a [Grant],
}

impl<'a> NativeKeyView<'a> {
    pub fn holders(&self) -> usize {
        self.grants.len()
    }

    /// Its grants, in grant order.
    pub fn grants(&self) -> impl Iterator<Item = GrantView<'a>> + 'a {
        self.grants.iter().map(|g| GrantView {
            fence: g.fence,
            session: g.session,
            since_ms: u64::from(g.since_s) * 1000,
            lease_deadline_ms: g.lease.as_ref().map(|l| l.deadline),
            value: g.value.as_deref(),
        })
    }
}

/// Counts of version-3 state (the invariant check recounts them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NativeStats {
    /// Grants held, one per key of each.
    pub holds: u64,
    /// Of those, leases.
    pub leases: u64,
    /// Keys in a lock-delay.
    pub delayed_keys: u64,
}

/// A waiting version-3 Lock's own fields.
pub(super) struct NativeWait {
    pub(super) shared: bool,
    pub(super) limit: u16,
    pub(super) value: Option<Box<[u8]>>,
    pub(super) lock_delay_ms: u32,
}

/// One version-3 grant of one key.
pub(super) struct Grant {
    pub(super) fence: u64,
    /// Where its notices go (the Lock's connection, or the last Extend by fence's).
    pub(super) session: Session,
    /// The Lock's (or that Extend's) request id.
    pub(super) request_id: u64,
    pub(super) lease: Option<Lease>,
    pub(super) value: Option<Box<[u8]>>,
    pub(super) lock_delay_ms: u32,
    pub(super) since_s: u32,
    pub(super) shared: bool,
}

/// The version-3 state of a key.
pub(super) struct NativeKey {
    /// The limit of its grants and version-3 waiters (meaningful while it has any).
    pub(super) limit: u16,
    /// In grant order (increasing fence).
    pub(super) grants: Vec<Grant>,
    /// Version-3 waiters queued on the key.
    pub(super) waiting: u32,
    /// The end of its lock-delay (ms) and that end's timer.
    pub(super) delay: Option<(u64, TimerKey)>,
}

impl NativeKey {
    fn new(limit: u16) -> NativeKey {
        NativeKey {
            limit,
            grants: Vec::new(),
            waiting: 0,
            delay: None,
        }
    }

    fn is_empty(&self) -> bool {
        self.grants.is_empty() && self.waiting == 0 && self.delay.is_none()
    }
}

/// How a version-3 grant ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    /// An Unlock of `by` (the holder's own, or any connection's by fence).
    Unlock {
        by: Session,
    },
    Expired,
    Lost,
}

fn boxed(keys: &[&[u8]]) -> Vec<Box<[u8]>> {
    keys.iter().map(|k| Box::from(*k)).collect()
}

/// The public version-3 operations.
impl DlockTable {
    /// Make [`DlockEvent::Key`] events (for watchers) or not; off by default.
    pub fn set_key_events(&mut self, on: bool) {
        self.key_events = on;
    }

    pub fn native_stats(&self) -> NativeStats {
        self.nstats
    }

    /// A version-3 Lock (see the module docs for the rule). `Ok(Waiting)`: the answer comes
    /// later as a `Granted` or `TimedOut` event tagged `request_id`; an immediate grant's token
    /// is [`DlockTable::last_fence`]. `Err`: refused, nothing changed.
    pub fn lock_native(
        &mut self,
        session: Session,
        req: NativeLock<'_>,
        now_ms: u64,
        events: &mut Vec<DlockEvent>,
    ) -> Result<LockResult, NativeError> {
        use NativeError::InvalidArgument as Invalid;
        let limit = req.limit.unwrap_or(1);
        if limit == 0 || limit > MAX_LIMIT {
            return Err(Invalid("limit out of range (1 to 65535)"));
        }
        if req.shared && limit > 1 {
            return Err(Invalid("shared with a limit above 1"));
        }
        if req.value.is_some_and(|v| v.len() > MAX_VALUE) {
            return Err(Invalid("value over 4096 bytes"));
        }
        if req.lock_delay_us.is_some_and(|d| d > MAX_LOCK_DELAY_US) {
            return Err(Invalid("lock_delay over 60 s"));
        }
        let limit = limit as u16;
        self.touch(session, now_ms);
        self.advance(now_ms, events);
        let keys = distinct(req.keys);
        if keys
            .iter()
            .any(|k| self.limit_of(k).is_some_and(|l| l != limit))
        {
            return Err(Invalid("the key has holders or waiters of another limit"));
        }
        let n = NativeWait {
            shared: req.shared,
            limit,
            value: req.value.map(Box::from),
            lock_delay_ms: ms_from_us(req.lock_delay_us).unwrap_or(0) as u32,
        };
        let busy: Vec<&[u8]> = keys
            .iter()
            .copied()
            .filter(|k| self.busy_for_native_new(req.shared, k))
            .collect();
        if busy.is_empty() {
            let lease_ms = ms_from_us(req.lease_us);
            let fence = self.fence.next();
            for k in keys.iter() {
                self.add_grant(
                    k,
                    session,
                    req.request_id,
                    fence,
                    lease_ms,
                    &n,
                    now_ms,
                    events,
                );
            }
            self.stats.grants += 1;
            return Ok(LockResult::Granted);
        }
        if req.wait_us == Some(0) {
            self.stats.timeouts += 1;
            return Ok(LockResult::Timeout { busy: boxed(&busy) });
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        for k in keys.iter() {
            let r = self.find_or_insert(k);
            self.recs[r].queue.insert(seq);
            self.native_queued(r, limit);
        }
        let deadline = ms_from_us(req.wait_us).map(|ms| now_ms.saturating_add(ms));
        let timer = deadline.map(|d| self.wheel.insert(d, (d, Timer::Wait { seq })));
        self.waiters.insert(
            seq,
            Waiter {
                session,
                token: req.request_id,
                keys: boxed(&keys).into_boxed_slice(),
                lease_us: req.lease_us,
                deadline,
                timer,
                native: Some(Box::new(n)),
            },
        );
        if let Some(c) = self.sessions.get_mut(&session) {
            c.native_mut().waits.push(seq);
            if let Some(t) = c.idle_timer.take() {
                self.wheel.cancel(t);
            }
        }
        Ok(LockResult::Waiting)
    }

    /// A version-3 Unlock. Without `fence`: every grant of `session` on each of `keys`; with
    /// it (exactly one key): the grant with that token, whoever holds it. A key not held that
    /// way: `NotHeld` with those keys, nothing released. No lock-delay follows; a holder whose
    /// grant another session unlocked is told (`Notice`, Lost).
    pub fn unlock_native(
        &mut self,
        session: Session,
        keys: &[&[u8]],
        fence: Option<u64>,
        now_ms: u64,
        events: &mut Vec<DlockEvent>,
    ) -> Result<(), NativeError> {
        let keys = distinct(keys);
        if fence.is_some() && keys.len() != 1 {
            return Err(NativeError::InvalidArgument("fence names exactly one key"));
        }
        self.touch(session, now_ms);
        self.advance(now_ms, events);
        let end = End::Unlock { by: session };
        if let Some(f) = fence {
            let key = keys[0];
            let Some(r) = self.find(key) else {
                return Err(NativeError::NotHeld(boxed(&keys)));
            };
            if self.recs[r].holder.as_ref().is_some_and(|h| h.token == f) {
                self.v2_ended(r, KeyEventKind::Released, events);
                self.release_rec(r);
            } else {
                let Some(i) = self.grant_index(r, |g| g.fence == f) else {
                    return Err(NativeError::NotHeld(boxed(&keys)));
                };
                self.end_grant(r, i, end, now_ms, events);
                self.tidy(r);
            }
            self.check_heads(&keys, now_ms, events);
            return Ok(());
        }
        let not_held: Vec<&[u8]> = keys
            .iter()
            .copied()
            .filter(|k| {
                self.find(k)
                    .and_then(|r| self.grant_index(r, |g| g.session == session))
                    .is_none()
            })
            .collect();
        if !not_held.is_empty() {
            return Err(NativeError::NotHeld(boxed(&not_held)));
        }
        for k in keys.iter() {
            let Some(r) = self.find(k) else { continue };
            while let Some(i) = self.grant_index(r, |g| g.session == session) {
                self.end_grant(r, i, end, now_ms, events);
            }
            self.tidy(r);
        }
        self.check_heads(&keys, now_ms, events);
        Ok(())
    }

    /// A version-3 Extend: each grant of `session` on `keys` (or, with `fence`, the grant of
    /// the one key with that token, which moves to `session` with `request_id` for its
    /// notices) becomes a lease ending `release_us` from now. The token stays. A key not held
    /// that way: `NotHeld`, nothing changed.
    #[allow(clippy::too_many_arguments)]
    pub fn extend(
        &mut self,
        session: Session,
        keys: &[&[u8]],
        release_us: u64,
        fence: Option<u64>,
        request_id: u64,
        now_ms: u64,
        events: &mut Vec<DlockEvent>,
    ) -> Result<(), NativeError> {
        let keys = distinct(keys);
        if release_us == 0 {
            return Err(NativeError::InvalidArgument(
                "Extend needs release_micro > 0",
            ));
        }
        if fence.is_some() && keys.len() != 1 {
            return Err(NativeError::InvalidArgument("fence names exactly one key"));
        }
        self.touch(session, now_ms);
        self.advance(now_ms, events);
        let mine = |g: &Grant| match fence {
            Some(f) => g.fence == f,
            None => g.session == session,
        };
        let not_held: Vec<&[u8]> = keys
            .iter()
            .copied()
            .filter(|k| {
                self.find(k)
                    .and_then(|r| self.grant_index(r, mine))
                    .is_none()
            })
            .collect();
        if !not_held.is_empty() {
            return Err(NativeError::NotHeld(boxed(&not_held)));
        }
        let deadline = now_ms.saturating_add(ms_from_us(Some(release_us)).unwrap_or(0));
        for k in keys.iter() {
            let Some(r) = self.find(k) else { continue };
            let Some(nk) = self.natives.get_mut(&(r as u32)) else {
                continue;
            };
            for g in nk.grants.iter_mut().filter(|g| mine(g)) {
                match g.lease.take() {
                    Some(l) => {
                        self.wheel.cancel(l.timer);
                    }
                    None => self.nstats.leases += 1,
                }
                let gen = self.next_lease_gen;
                self.next_lease_gen += 1;
                let timer = Timer::Lease { rec: r as u32, gen };
                g.lease = Some(Lease {
                    deadline,
                    timer: self.wheel.insert(deadline, (deadline, timer)),
                    gen,
                });
                if fence.is_some() && g.session != session {
                    if let Some(c) = self.sessions.get_mut(&g.session) {
                        c.native_mut().grants.remove(&(g.fence, r as u32));
                    }
                    if let Some(c) = self.sessions.get_mut(&session) {
                        c.native_mut().grants.insert((g.fence, r as u32));
                    }
                    g.session = session;
                }
                if fence.is_some() {
                    g.request_id = request_id;
                }
            }
        }
        Ok(())
    }

    /// `key` as Get shows it at `now_ms` (a key nobody uses: free, limit 1).
    pub fn get(&self, key: &[u8], now_ms: u64) -> KeyInfo {
        let Some(r) = self.find(key) else {
            return KeyInfo {
                limit: 1,
                ..KeyInfo::default()
            };
        };
        let rec = &self.recs[r];
        let left = |l: &Option<Lease>| {
            l.as_ref()
                .map_or(0, |l| l.deadline.saturating_sub(now_ms).max(1) * 1000)
        };
        let mut info = KeyInfo {
            shared: false,
            limit: u32::from(self.limit_at(r).unwrap_or(1)),
            holders: Vec::new(),
            waiters: rec.queue.len() as u32,
            delayed_us: 0,
        };
        if let Some(h) = &rec.holder {
            info.holders.push(HolderInfo {
                fence: h.token,
                session: h.session,
                value: None,
                lease_left_us: left(&h.lease),
            });
        }
        if let Some(nk) = self.native(r) {
            info.shared = nk.grants.first().is_some_and(|g| g.shared);
            info.holders.extend(nk.grants.iter().map(|g| HolderInfo {
                fence: g.fence,
                session: g.session,
                value: g.value.clone(),
                lease_left_us: left(&g.lease),
            }));
            if let Some((until, _)) = nk.delay {
                info.delayed_us = until.saturating_sub(now_ms) * 1000;
            }
        }
        info
    }

    /// Whether `fence` is a current grant of `key` (either version's).
    pub fn check_fence(&self, key: &[u8], fence: u64) -> bool {
        let Some(r) = self.find(key) else {
            return false;
        };
        self.recs[r]
            .holder
            .as_ref()
            .is_some_and(|h| h.token == fence)
            || self.grant_index(r, |g| g.fence == fence).is_some()
    }

    /// Every key with version-3 grants. No order.
    pub fn for_each_native_key(&self, mut f: impl FnMut(&[u8], NativeKeyView<'_>)) {
        for (r, nk) in &self.natives {
            if nk.grants.is_empty() {
                continue;
            }
            let view = NativeKeyView {
                shared: nk.grants[0].shared,
                limit: u32::from(nk.limit),
                delay_until_ms: nk.delay.as_ref().map(|d| d.0),
                grants: &nk.grants,
            };
            f(&self.recs[*r as usize].key, view);
        }
    }

    /// The end of `key`'s lock-delay (Unix ms), if one runs.
    pub fn delay_until(&self, key: &[u8]) -> Option<u64> {
        let r = self.find(key)?;
        self.native(r)?.delay.as_ref().map(|d| d.0)
    }

    /// Every version-3 grant: key, fence, session, lease deadline (ms), shared. No order.
    pub fn for_each_grant(&self, mut f: impl FnMut(&[u8], u64, Session, Option<u64>, bool)) {
        for (r, nk) in &self.natives {
            let key = &self.recs[*r as usize].key;
            for g in &nk.grants {
                f(
                    key,
                    g.fence,
                    g.session,
                    g.lease.as_ref().map(|l| l.deadline),
                    g.shared,
                );
            }
        }
    }
}

/// The internals the version-2 code calls.
impl DlockTable {
    #[inline]
    pub(super) fn native(&self, r: usize) -> Option<&NativeKey> {
        if self.natives.is_empty() {
            None
        } else {
            self.natives.get(&(r as u32))
        }
    }

    #[inline]
    pub(super) fn has_native(&self, r: usize) -> bool {
        self.native(r).is_some()
    }

    /// Whether version-3 state keeps a version-2 Lock off record `r`: a grant or a
    /// lock-delay.
    #[inline]
    pub(super) fn native_blocks(&self, r: usize) -> bool {
        self.native(r)
            .is_some_and(|nk| !nk.grants.is_empty() || nk.delay.is_some())
    }

    /// [`DlockTable::native_blocks`] by name: nothing to look up while no key has version-3
    /// state.
    #[inline]
    pub(super) fn native_blocks_key(&self, key: &[u8]) -> bool {
        !self.natives.is_empty() && self.native_blocks_found(key)
    }

    #[cold]
    #[inline(never)]
    fn native_blocks_found(&self, key: &[u8]) -> bool {
        self.find(key).is_some_and(|r| self.native_blocks(r))
    }

    /// The limit of `key` if it has holders or waiters.
    pub(super) fn limit_of(&self, key: &[u8]) -> Option<u16> {
        self.find(key).and_then(|r| self.limit_at(r))
    }

    fn limit_at(&self, r: usize) -> Option<u16> {
        if let Some(nk) = self.native(r) {
            if !nk.grants.is_empty() || nk.waiting > 0 {
                return Some(nk.limit);
            }
        }
        let s = &self.recs[r];
        (s.holder.is_some() || !s.queue.is_empty()).then_some(1)
    }

    /// Whether a Lock of mode `shared` fits beside record `r`'s holders now (queue aside).
    fn fits(&self, r: usize, shared: bool) -> bool {
        if self.recs[r].holder.is_some() {
            return false;
        }
        let Some(nk) = self.native(r) else {
            return true;
        };
        if nk.delay.is_some() {
            return false;
        }
        match nk.grants.first() {
            None => true,
            Some(_) if nk.limit > 1 => nk.grants.len() < usize::from(nk.limit),
            Some(g) => shared && g.shared,
        }
    }

    fn busy_for_native_new(&self, shared: bool, key: &[u8]) -> bool {
        self.find(key)
            .is_some_and(|r| !self.recs[r].queue.is_empty() || !self.fits(r, shared))
    }

    pub(super) fn busy_for_native_waiter(&self, seq: u64, shared: bool, key: &[u8]) -> bool {
        match self.find(key) {
            None => {
                debug_assert!(false, "a waiter's key has no state");
                false
            }
            Some(r) => self.recs[r].queue.first() != Some(&seq) || !self.fits(r, shared),
        }
    }

    /// A version-3 waiter of `limit` joined record `r`'s queue.
    fn native_queued(&mut self, r: usize, limit: u16) {
        let nk = self
            .natives
            .entry(r as u32)
            .or_insert_with(|| NativeKey::new(limit));
        if nk.grants.is_empty() && nk.waiting == 0 {
            nk.limit = limit;
        }
        nk.waiting += 1;
    }

    /// A version-3 waiter left record `r`'s queue.
    pub(super) fn native_unqueued(&mut self, r: usize) {
        if let Some(nk) = self.natives.get_mut(&(r as u32)) {
            nk.waiting -= 1;
        }
    }

    /// Drop record `r`'s version-3 state if it has none left, and the record if nothing at
    /// all is left of it.
    pub(super) fn tidy(&mut self, r: usize) {
        if !self.natives.is_empty() {
            if let Some(nk) = self.natives.get(&(r as u32)) {
                if !nk.is_empty() {
                    return;
                }
                self.natives.remove(&(r as u32));
            }
        }
        let s = &self.recs[r];
        if s.holder.is_none() && s.queue.is_empty() {
            self.remove_rec(r);
        }
    }

    #[inline]
    pub(super) fn key_event(
        &self,
        events: &mut Vec<DlockEvent>,
        r: usize,
        kind: KeyEventKind,
        fence: u64,
        value: Option<&[u8]>,
    ) {
        if self.key_events {
            self.push_key_event(events, r, kind, fence, value);
        }
    }

    #[cold]
    #[inline(never)]
    fn push_key_event(
        &self,
        events: &mut Vec<DlockEvent>,
        r: usize,
        kind: KeyEventKind,
        fence: u64,
        value: Option<&[u8]>,
    ) {
        events.push(DlockEvent::Key {
            key: Box::from(&*self.recs[r].key),
            kind,
            fence,
            value: value.map(Box::from),
        });
    }

    fn grant_index(&self, r: usize, f: impl Fn(&Grant) -> bool) -> Option<usize> {
        self.native(r)?.grants.iter().position(f)
    }

    /// Add a grant of `key` (fence `fence`, the Lock `request_id` of `session`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add_grant(
        &mut self,
        key: &[u8],
        session: Session,
        request_id: u64,
        fence: u64,
        lease_ms: Option<u64>,
        n: &NativeWait,
        now_ms: u64,
        events: &mut Vec<DlockEvent>,
    ) {
        let r = self.find_or_insert(key);
        let lease = lease_ms.map(|ms| {
            self.nstats.leases += 1;
            self.arm_lease(r, now_ms.saturating_add(ms))
        });
        let nk = self
            .natives
            .entry(r as u32)
            .or_insert_with(|| NativeKey::new(n.limit));
        if nk.grants.is_empty() && nk.waiting == 0 {
            nk.limit = n.limit;
        }
        debug_assert_eq!(nk.limit, n.limit);
        // Most keys have one grant: room for one (a first push would make room for four).
        if nk.grants.capacity() == 0 {
            nk.grants.reserve_exact(1);
        }
        nk.grants.push(Grant {
            fence,
            session,
            request_id,
            lease,
            value: n.value.clone(),
            lock_delay_ms: n.lock_delay_ms,
            since_s: (now_ms / 1000) as u32,
            shared: n.shared,
        });
        self.nstats.holds += 1;
        if let Some(c) = self.sessions.get_mut(&session) {
            c.native_mut().grants.insert((fence, r as u32));
        }
        self.key_event(events, r, KeyEventKind::Acquired, fence, n.value.as_deref());
    }

    /// End grant `i` of record `r` (the caller tidies the record and checks its queue).
    fn end_grant(&mut self, r: usize, i: usize, end: End, at: u64, events: &mut Vec<DlockEvent>) {
        let Some(nk) = self.natives.get_mut(&(r as u32)) else {
            return;
        };
        let g = nk.grants.remove(i);
        self.nstats.holds -= 1;
        if let Some(l) = g.lease {
            self.wheel.cancel(l.timer);
            self.nstats.leases -= 1;
        }
        let open = match self.sessions.get_mut(&g.session) {
            Some(c) => {
                c.native_mut().grants.remove(&(g.fence, r as u32));
                true
            }
            None => false,
        };
        let kind = match end {
            End::Unlock { .. } => KeyEventKind::Released,
            End::Expired => KeyEventKind::Expired,
            End::Lost => KeyEventKind::Lost,
        };
        self.key_event(events, r, kind, g.fence, g.value.as_deref());
        let own_unlock = end == End::Unlock { by: g.session };
        if open && !own_unlock {
            events.push(DlockEvent::Notice {
                session: g.session,
                request_id: g.request_id,
                key: Box::from(&*self.recs[r].key),
                kind: if end == End::Expired {
                    KeyEventKind::Expired
                } else {
                    KeyEventKind::Lost
                },
                fence: g.fence,
                value: g.value,
            });
        }
        if !matches!(end, End::Unlock { .. }) && g.lock_delay_ms > 0 {
            let until = at.saturating_add(u64::from(g.lock_delay_ms));
            let Some(nk) = self.natives.get_mut(&(r as u32)) else {
                return;
            };
            match nk.delay {
                Some((old, _)) if old >= until => {}
                old => {
                    match old {
                        Some((_, t)) => {
                            self.wheel.cancel(t);
                        }
                        None => self.nstats.delayed_keys += 1,
                    }
                    let t = Timer::Delay { rec: r as u32 };
                    nk.delay = Some((until, self.wheel.insert(until, (until, t))));
                }
            }
        }
    }

    /// The lease `gen` of a version-3 grant of record `r` ran out (if it is still current).
    pub(super) fn native_lease_ends(
        &mut self,
        r: usize,
        gen: u64,
        at: u64,
        events: &mut Vec<DlockEvent>,
    ) {
        if self.recs.get(r).is_none() {
            return;
        }
        let current = |g: &Grant| g.lease.as_ref().is_some_and(|l| l.gen == gen);
        let Some(i) = self.grant_index(r, current) else {
            return;
        };
        self.stats.lease_expiries += 1;
        let key = self.recs[r].key.clone();
        self.end_grant(r, i, End::Expired, at, events);
        self.tidy(r);
        self.check_heads(&[key], at, events);
    }

    /// The lock-delay of record `r` may end at `at`.
    pub(super) fn delay_ends(&mut self, r: usize, at: u64, events: &mut Vec<DlockEvent>) {
        let Some(nk) = self.natives.get_mut(&(r as u32)) else {
            return;
        };
        match nk.delay {
            Some((until, _)) if until <= at => nk.delay = None,
            _ => return,
        }
        self.nstats.delayed_keys -= 1;
        let key = self.recs[r].key.clone();
        self.tidy(r);
        self.check_heads(&[key], at, events);
    }

    /// The version-3 part of dropping connection `c` (already out of `sessions`): its waiting
    /// Locks leave their queues, its connection-bound grants are lost (in token order), its
    /// leases stay. The keys to settle go to `affected`.
    pub(super) fn drop_native(
        &mut self,
        c: Conn,
        at: u64,
        affected: &mut Vec<Key>,
        events: &mut Vec<DlockEvent>,
    ) {
        let n = c.native.map(|n| *n).unwrap_or_default();
        for seq in n.waits {
            if let Some(w) = self.take_waiter(seq, false) {
                affected.extend(w.keys.iter().map(|k| Key::from(&**k)));
            }
        }
        let mut bound: Vec<(u64, Key, usize)> = Vec::new();
        for &(fence, r) in &n.grants {
            let r = r as usize;
            let is_bound = self
                .native(r)
                .and_then(|nk| nk.grants.iter().find(|g| g.fence == fence))
                .is_some_and(|g| g.lease.is_none());
            if is_bound {
                bound.push((fence, self.recs[r].key.clone(), r));
            }
        }
        bound.sort_unstable_by(|a, b| (a.0, &*a.1).cmp(&(b.0, &*b.1)));
        for (fence, key, r) in bound {
            if let Some(i) = self.grant_index(r, |g| g.fence == fence) {
                self.end_grant(r, i, End::Lost, at, events);
                self.tidy(r);
            }
            affected.push(key);
        }
    }

    pub(super) fn extend_native_leases(&mut self, extra_ms: u64) {
        for (r, nk) in self.natives.iter_mut() {
            for g in nk.grants.iter_mut() {
                let Some(lease) = g.lease.as_mut() else {
                    continue;
                };
                self.wheel.cancel(lease.timer);
                lease.deadline = lease.deadline.saturating_add(extra_ms);
                let timer = Timer::Lease {
                    rec: *r,
                    gen: lease.gen,
                };
                lease.timer = self.wheel.insert(lease.deadline, (lease.deadline, timer));
            }
            if let Some((until, t)) = nk.delay.as_mut() {
                self.wheel.cancel(*t);
                *until = until.saturating_add(extra_ms);
                *t = self
                    .wheel
                    .insert(*until, (*until, Timer::Delay { rec: *r }));
            }
        }
    }

    pub(super) fn has_native_state(&self) -> bool {
        !self.natives.is_empty() || self.waiters.values().any(|w| w.native.is_some())
    }

    pub(super) fn check_native_invariants(&self) {
        let (mut holds, mut leases, mut delayed) = (0, 0, 0);
        let mut waiting: HashMap<u32, u32> = HashMap::default();
        for w in self.waiters.values().filter(|w| w.native.is_some()) {
            for k in w.keys.iter() {
                let r = self.find(k).expect("a waiter's key") as u32;
                *waiting.entry(r).or_default() += 1;
            }
        }
        for (r, nk) in &self.natives {
            let rec = self
                .recs
                .get(*r as usize)
                .expect("native state of no record");
            let k = &*rec.key;
            assert!(!nk.is_empty(), "empty native state of {k:?}");
            assert_eq!(
                nk.waiting,
                waiting.get(r).copied().unwrap_or(0),
                "{k:?} waiting"
            );
            if !nk.grants.is_empty() {
                assert!(rec.holder.is_none(), "{k:?} held by both versions");
                if nk.limit > 1 {
                    assert!(
                        nk.grants.len() <= usize::from(nk.limit),
                        "{k:?} over its limit"
                    );
                    assert!(
                        nk.grants.iter().all(|g| !g.shared),
                        "{k:?} shared semaphore"
                    );
                } else if nk.grants.len() > 1 {
                    assert!(nk.grants.iter().all(|g| g.shared), "{k:?} two exclusive");
                }
            }
            assert!(
                nk.grants.windows(2).all(|w| w[0].fence < w[1].fence),
                "{k:?} grants out of order"
            );
            if nk.waiting > 0 && !rec.queue.is_empty() {
                for seq in &rec.queue {
                    let w = &self.waiters[seq];
                    if let Some(n) = &w.native {
                        assert_eq!(n.limit, nk.limit, "{k:?} waiter of another limit");
                    }
                }
            }
            for g in &nk.grants {
                holds += 1;
                leases += u64::from(g.lease.is_some());
                assert!(g.fence <= self.fence.last());
                if let Some(c) = self.sessions.get(&g.session) {
                    assert!(c.has_grant(&(g.fence, *r)), "{k:?} grant not listed");
                } else {
                    assert!(
                        g.lease.is_some(),
                        "{k:?} connection-bound grant of no session"
                    );
                }
            }
            delayed += u64::from(nk.delay.is_some());
        }
        for (w, n) in &waiting {
            assert!(
                self.natives.contains_key(w),
                "native waiter of no native key {n}"
            );
        }
        for (id, c) in &self.sessions {
            for (fence, r) in c.grants() {
                let g = self.natives[r].grants.iter().find(|g| g.fence == *fence);
                assert_eq!(g.map(|g| g.session), Some(*id), "stale grant listing");
            }
        }
        assert_eq!(
            self.nstats,
            NativeStats {
                holds,
                leases,
                delayed_keys: delayed
            }
        );
    }
}

/// The version-3 part of a snapshot (after version 2's, `HFdlock2`): keys in byte order with
/// their limit, delay and grants; then the version-3 waiters by arrival number.
impl DlockTable {
    pub(super) fn snapshot_native(&self, out: &mut Vec<u8>) {
        let mut keys: Vec<(&KeyRec, &NativeKey)> = self
            .natives
            .iter()
            .map(|(r, nk)| (&self.recs[*r as usize], nk))
            .collect();
        keys.sort_unstable_by(|a, b| a.0.key.cmp(&b.0.key));
        codec::put_u64(out, keys.len() as u64);
        for (rec, nk) in keys {
            codec::put_bytes(out, &rec.key);
            codec::put_u64(out, u64::from(nk.limit));
            codec::put_opt_u64(out, nk.delay.map(|d| d.0));
            codec::put_u64(out, nk.grants.len() as u64);
            for g in &nk.grants {
                codec::put_u64(out, g.fence);
                g.session.encode(out);
                codec::put_u64(out, g.request_id);
                codec::put_u64(out, u64::from(g.since_s));
                codec::put_bool(out, g.shared);
                codec::put_u64(out, u64::from(g.lock_delay_ms));
                put_value(out, g.value.as_deref());
                Lease::put(g.lease.as_ref(), out);
            }
            codec::spill(out);
        }
        let mut waiters: Vec<(&u64, &Waiter, &NativeWait)> = self
            .waiters
            .iter()
            .filter_map(|(s, w)| w.native.as_deref().map(|n| (s, w, n)))
            .collect();
        waiters.sort_unstable_by_key(|(seq, _, _)| **seq);
        codec::put_u64(out, waiters.len() as u64);
        for (seq, w, n) in waiters {
            codec::put_u64(out, *seq);
            w.session.encode(out);
            codec::put_u64(out, w.token);
            codec::put_opt_u64(out, w.lease_us);
            codec::put_opt_u64(out, w.deadline);
            codec::put_bool(out, n.shared);
            codec::put_u64(out, u64::from(n.limit));
            codec::put_u64(out, u64::from(n.lock_delay_ms));
            put_value(out, n.value.as_deref());
            codec::put_u64(out, w.keys.len() as u64);
            for k in w.keys.iter() {
                codec::put_bytes(out, k);
            }
            codec::spill(out);
        }
    }

    /// Read what [`DlockTable::snapshot_native`] wrote, into a table that has restored
    /// version 2's part (its keys include every key here).
    pub(super) fn restore_native(&mut self, r: &mut Reader<'_>) -> Result<(), DecodeError> {
        use DecodeError::Invalid;
        let n = r.count(4)?;
        let mut last_key: Option<&[u8]> = None;
        for _ in 0..n {
            codec::consumed(r);
            let key = r.bytes(Self::MAX_KEY)?;
            if last_key.is_some_and(|l| l >= key) {
                return Err(Invalid("dlock native keys out of order"));
            }
            last_key = Some(key);
            let rec = self
                .find(key)
                .ok_or(Invalid("dlock native key of no record"))?;
            let limit = read_limit(r)?;
            let delay = r.opt_u64()?;
            let ngrants = r.count(7)?;
            if limit > 1 && ngrants > usize::from(limit) {
                return Err(Invalid("dlock native grants over the limit"));
            }
            if ngrants > 0 && self.recs[rec].holder.is_some() {
                return Err(Invalid("dlock native grants beside a version-2 holder"));
            }
            let mut nk = NativeKey::new(limit);
            for _ in 0..ngrants {
                let fence = r.u64()?;
                if fence > self.fence.last() || nk.grants.last().is_some_and(|g| g.fence >= fence) {
                    return Err(Invalid("dlock native grant token"));
                }
                let session = Session::decode(r)?;
                let request_id = r.u64()?;
                let since_s = r.u32()?;
                let shared = r.bool()?;
                let lock_delay_ms = read_delay(r)?;
                let value = read_value(r)?;
                let lease = self.read_lease(r, rec)?;
                self.nstats.leases += u64::from(lease.is_some());
                match self.sessions.get_mut(&session) {
                    Some(c) => {
                        c.native_mut().grants.insert((fence, rec as u32));
                    }
                    None if lease.is_none() => {
                        return Err(Invalid("dlock connection-bound grant of no session"))
                    }
                    None => {}
                }
                self.nstats.holds += 1;
                nk.grants.push(Grant {
                    fence,
                    session,
                    request_id,
                    lease,
                    value,
                    lock_delay_ms,
                    since_s,
                    shared,
                });
            }
            let exclusive = nk.grants.iter().filter(|g| !g.shared).count();
            let bad_mode = if limit > 1 {
                exclusive < nk.grants.len()
            } else {
                nk.grants.len() > 1 && exclusive > 0
            };
            if bad_mode {
                return Err(Invalid("dlock native grants of mixed modes"));
            }
            if let Some(until) = delay {
                let t = Timer::Delay { rec: rec as u32 };
                nk.delay = Some((until, self.wheel.insert(until, (until, t))));
                self.nstats.delayed_keys += 1;
            }
            self.natives.insert(rec as u32, nk);
        }
        let n = r.count(8)?;
        let mut last_seq: Option<u64> = None;
        for _ in 0..n {
            codec::consumed(r);
            let order = "dlock native waiters out of order";
            let WaiterHead {
                seq,
                session,
                token,
                lease_us,
                deadline,
            } = read_waiter_head(r, &mut last_seq, self.next_seq, order)?;
            let shared = r.bool()?;
            let limit = read_limit(r)?;
            if shared && limit > 1 {
                return Err(Invalid("dlock shared waiter with a limit"));
            }
            let lock_delay_ms = read_delay(r)?;
            let value = read_value(r)?;
            let keys = read_waiter_keys(r)?;
            if self.waiters.contains_key(&seq) {
                return Err(Invalid("dlock waiter twice"));
            }
            match self.sessions.get_mut(&session) {
                Some(c) => c.native_mut().waits.push(seq),
                None => return Err(Invalid("dlock waiter of no session")),
            }
            for k in &keys {
                let rec = self
                    .find(k)
                    .ok_or(Invalid("dlock waiter key of no record"))?;
                self.recs[rec].queue.insert(seq);
                let nk = self
                    .natives
                    .get_mut(&(rec as u32))
                    .ok_or(Invalid("dlock native waiter of a key with no native state"))?;
                if nk.limit != limit {
                    return Err(Invalid("dlock waiter of another limit than its key"));
                }
                nk.waiting += 1;
            }
            let timer = deadline.map(|d| self.wheel.insert(d, (d, Timer::Wait { seq })));
            let native = NativeWait {
                shared,
                limit,
                value,
                lock_delay_ms,
            };
            self.waiters.insert(
                seq,
                Waiter {
                    session,
                    token,
                    keys: keys.into_boxed_slice(),
                    lease_us,
                    deadline,
                    timer,
                    native: Some(Box::new(native)),
                },
            );
        }
        for (r, nk) in &self.natives {
            let rec = &self.recs[*r as usize];
            if nk.is_empty() {
                return Err(Invalid("dlock empty native key state"));
            }
            if nk.grants.is_empty() && nk.waiting == 0 {
                continue;
            }
            // A version-2 holder or waiter implies limit 1.
            let v2 = rec.holder.is_some()
                || rec
                    .queue
                    .iter()
                    .any(|s| self.waiters.get(s).is_some_and(|w| w.native.is_none()));
            if v2 && nk.limit != 1 {
                return Err(Invalid("dlock version-2 use of a semaphore"));
            }
        }
        Ok(())
    }
}

fn put_value(out: &mut Vec<u8>, v: Option<&[u8]>) {
    match v {
        None => codec::put_u8(out, 0),
        Some(v) => {
            codec::put_u8(out, 1);
            codec::put_bytes(out, v);
        }
    }
}

fn read_value(r: &mut Reader<'_>) -> Result<Option<Box<[u8]>>, DecodeError> {
    Ok(match r.u8()? {
        0 => None,
        1 => Some(r.bytes(MAX_VALUE)?.into()),
        _ => return Err(DecodeError::Invalid("dlock value tag")),
    })
}

fn read_limit(r: &mut Reader<'_>) -> Result<u16, DecodeError> {
    match r.u64()? {
        l @ 1..=65535 => Ok(l as u16),
        _ => Err(DecodeError::Invalid("dlock limit out of range")),
    }
}

fn read_delay(r: &mut Reader<'_>) -> Result<u32, DecodeError> {
    match r.u64()? {
        d if d <= MAX_LOCK_DELAY_US / 1000 => Ok(d as u32),
        _ => Err(DecodeError::Invalid("dlock lock-delay over 60 s")),
    }
}

#[cfg(test)]
#[path = "dlock_native_tests.rs"]
mod tests;
