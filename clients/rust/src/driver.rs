//! The state a [`crate::Client`] shares between its callers and its driver thread, and that
//! thread: it keeps one connection up (moving to the next server when it breaks), reads every
//! frame and routes it by `request_id` (answers to their waiting caller, events to their hold
//! or watch), renews leases, re-attaches them after a reconnect, pings when idle and signals a
//! loss before a lease's end.
//!
//! Owns: the connection, the routes of requests in flight, the holds. Lock order: [`State`]
//! first, then a hold's own mutex; nothing blocks (no socket read, no wait for an answer) while
//! [`State`] is locked, except one frame's write.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use holdfast_wire::dlock::{
    self as dl, event_kind, req_type, status, LockFields, NativeFields, Response,
};

use crate::link::{Got, Link};
use crate::{Config, Error, Event, Loss};

/// The shortest wait for a renewal's answer before the client moves to the next server.
const OVERDUE_FLOOR: Duration = Duration::from_millis(500);

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What to do with a frame that names a request id.
pub(crate) enum Route {
    /// A caller waits for this answer; `then` says what the id becomes once it is Ok.
    Answer { slot: Arc<Slot>, then: Then },
    /// Loss notices of a hold (the id of its Lock, or of the Extend that moved it here).
    Hold(Arc<Hold>),
    /// A renewal or re-attachment of a hold (Extend by fence), one per key.
    Extend { hold: Arc<Hold>, round: u64 },
    /// Events of a watch.
    Watch(Sender<Result<Event, Error>>),
}

/// Where a caller's answer lands, and how a waiting caller is told it may read.
pub(crate) struct Slot {
    st: Mutex<SlotState>,
    cond: Condvar,
}

#[derive(Default)]
struct SlotState {
    answer: Option<Result<Response, Error>>,
    /// The reading role is free: try to take it.
    nudged: bool,
    /// The caller sleeps on the condvar (std's notify is a system call even with no waiter:
    /// at depth 1 the caller reads its own answer and never sleeps).
    waiting: bool,
}

impl Slot {
    pub fn new() -> Arc<Slot> {
        Arc::new(Slot {
            st: Mutex::new(SlotState::default()),
            cond: Condvar::new(),
        })
    }

    fn fill(&self, answer: Result<Response, Error>) {
        let mut st = locked(&self.st);
        if st.answer.is_none() {
            st.answer = Some(answer);
        }
        if st.waiting {
            self.cond.notify_one();
        }
    }

    fn nudge(&self) {
        let mut st = locked(&self.st);
        st.nudged = true;
        if st.waiting {
            self.cond.notify_one();
        }
    }

    fn take(&self) -> Option<Result<Response, Error>> {
        locked(&self.st).answer.take()
    }

    /// Wait until answered or nudged, at most `limit`.
    fn wait(&self, limit: Duration) {
        let mut st = locked(&self.st);
        if st.answer.is_none() && !st.nudged {
            st.waiting = true;
            st = self
                .cond
                .wait_timeout(st, limit)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            st.waiting = false;
        }
        st.nudged = false;
    }
}

pub(crate) enum Then {
    Nothing,
    /// A Lock: the hold it grants.
    Hold(Arc<Hold>),
    /// A Watch: where its events go.
    Watch(Sender<Result<Event, Error>>),
}

/// One grant this client holds (a [`crate::LockGuard`]'s state).
pub(crate) struct Hold {
    pub keys: Vec<Vec<u8>>,
    pub lease: Option<Duration>,
    /// Renew the lease in the background (else it runs out as asked).
    pub renew: bool,
    pub fence: AtomicU64,
    pub lost: AtomicBool,
    pub st: Mutex<HoldState>,
    pub cond: Condvar,
}

#[derive(Default)]
pub(crate) struct HoldState {
    pub loss: Option<Loss>,
    /// Unlocked by its owner: no longer renewed, its notices ignored.
    pub released: bool,
    /// Until when the lease is surely held (measured from when this client asked).
    pub valid_until: Option<Instant>,
    /// When the next renewal is due.
    pub renew_due: Option<Instant>,
    /// The renewal round in flight: its number, when it was sent, answers still expected.
    pub round: u64,
    pub round_sent: Option<Instant>,
    pub round_left: usize,
    pub round_failed: bool,
    /// The ids whose routes are this hold's: its Lock's, or the last whole renewal round's
    /// (the server sends notices under the id of the Extend that last moved the hold).
    pub ids: Vec<u64>,
    /// The ids of the renewal round in flight that were answered Ok.
    pub round_ids: Vec<u64>,
    /// The connection its notices go to (0: none since the last one broke).
    pub epoch: u64,
    pub callbacks: Vec<Box<dyn FnOnce(Loss) + Send>>,
}

impl Hold {
    pub fn new(keys: Vec<Vec<u8>>, lease: Option<Duration>, renew: bool) -> Arc<Hold> {
        Arc::new(Hold {
            keys,
            lease,
            renew,
            fence: AtomicU64::new(0),
            lost: AtomicBool::new(false),
            st: Mutex::new(HoldState::default()),
            cond: Condvar::new(),
        })
    }

    pub fn state(&self) -> MutexGuard<'_, HoldState> {
        locked(&self.st)
    }

    /// Marks the hold lost (the first reason stays) and wakes whoever waits for that.
    pub fn lose(&self, why: Loss) {
        let callbacks = {
            let mut st = self.state();
            if st.loss.is_some() || st.released {
                return;
            }
            st.loss = Some(why.clone());
            self.lost.store(true, Ordering::Release);
            self.cond.notify_all();
            std::mem::take(&mut st.callbacks)
        };
        for cb in callbacks {
            cb(why.clone());
        }
    }

    /// A margin before the lease's end at which a lease not renewed is reported lost.
    fn margin(lease: Duration) -> Duration {
        (lease / 10).max(Duration::from_millis(1))
    }
}

pub(crate) struct State {
    pub link: Option<Arc<Link>>,
    /// Incremented for each new connection.
    pub epoch: u64,
    pub routes: HashMap<u64, Route>,
    /// Holds that need the driver: leases (renewal, re-attachment, deadline) and
    /// connection-bound holds (lost with their connection).
    pub holds: Vec<Arc<Hold>>,
    /// Watched keys and how many watches of this client name each.
    pub watched: HashMap<Vec<u8>, usize>,
    pub last_send: Instant,
    /// The server to try next.
    pub next_server: usize,
    /// Connections in a row that broke before anything was answered on them.
    pub failures: u32,
    pub closed: bool,
    /// Some thread reads the connection now. Callers waiting for an answer read it themselves
    /// (no hand-off between threads on the way back); the driver reads only when no caller
    /// has been active for a tick, for the events and notices that come unasked.
    pub reading: bool,
    /// When a caller last sent or waited.
    pub last_call: Instant,
}

struct ReadBuf {
    epoch: u64,
    pending: Vec<u8>,
    scratch: Box<[u8]>,
}

pub(crate) struct Shared {
    pub cfg: Config,
    pub next_id: AtomicU64,
    pub state: Mutex<State>,
    /// Signalled when a connection comes up or the client closes.
    pub cond: Condvar,
    /// The reading role's buffers: bytes read and not yet a whole frame, with the connection
    /// they came from (by epoch), and the scratch buffer reads go through.
    read_buf: Mutex<ReadBuf>,
}

impl Shared {
    pub fn new(cfg: Config) -> Shared {
        Shared {
            cfg,
            next_id: AtomicU64::new(1),
            state: Mutex::new(State {
                link: None,
                epoch: 0,
                routes: HashMap::new(),
                holds: Vec::new(),
                watched: HashMap::new(),
                last_send: Instant::now(),
                next_server: 0,
                failures: 0,
                closed: false,
                reading: false,
                last_call: Instant::now(),
            }),
            cond: Condvar::new(),
            read_buf: Mutex::new(ReadBuf {
                epoch: 0,
                pending: Vec::new(),
                scratch: vec![0; 64 * 1024].into_boxed_slice(),
            }),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        locked(&self.state)
    }

    pub fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A request frame with this client's token.
    pub fn frame(&self, id: u64, req: u64, lock: Option<LockFields<'_>>) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        dl::encode_request_version(
            &mut out,
            dl::NATIVE_VERSION,
            Some(id),
            self.cfg.token.as_deref(),
            req,
            lock,
        );
        out
    }

    /// The current connection, waiting for one at most the connect timeout.
    pub fn link<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
    ) -> Result<(MutexGuard<'a, State>, Arc<Link>), Error> {
        let deadline = Instant::now() + self.cfg.connect_timeout;
        loop {
            if st.closed {
                return Err(Error::Closed);
            }
            if let Some(link) = &st.link {
                let link = link.clone();
                return Ok((st, link));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::NotConnected);
            }
            st = self
                .cond
                .wait_timeout(st, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Send a request whose answer `route` takes; the frame is written outside the state lock.
    /// The connection it went out on, and its epoch.
    pub fn send(&self, id: u64, frame: &[u8], route: Route) -> Result<(Arc<Link>, u64), Error> {
        let st = self.lock();
        let (mut st, link) = self.link(st)?;
        let epoch = st.epoch;
        st.routes.insert(id, route);
        st.last_send = Instant::now();
        st.last_call = st.last_send;
        drop(st);
        if link.send(frame).is_err() {
            link.shutdown();
            // The connection is gone: fail the request now (its reader may never come).
            if let Some(Route::Answer { slot, .. }) = self.lock().routes.remove(&id) {
                slot.fill(Err(Error::ConnectionLost));
            }
        }
        Ok((link, epoch))
    }

    /// Wait for the answer in `slot` to request `id`, reading the connection meanwhile when
    /// no other thread does; at most `timeout`, if given.
    pub fn wait(
        &self,
        id: u64,
        slot: &Slot,
        link: &Arc<Link>,
        epoch: u64,
        timeout: Option<Duration>,
    ) -> Result<Response, Error> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(answer) = slot.take() {
                return answer;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                self.lock().routes.remove(&id);
                return Err(Error::Timeout);
            }
            let mine = {
                let mut st = self.lock();
                st.last_call = Instant::now();
                let current = st.epoch == epoch && st.link.is_some();
                if current && !st.reading {
                    st.reading = true;
                    true
                } else {
                    false
                }
            };
            if mine {
                self.read_once(link, epoch);
                self.release_reading(Some(id));
            } else {
                slot.wait(crate::link::TICK);
            }
        }
    }

    /// One read of `link` (at most a tick) and the dispatch of what came; a broken connection
    /// is handled here. The caller holds the reading role.
    pub fn read_once(&self, link: &Arc<Link>, epoch: u64) {
        let mut rb = locked(&self.read_buf);
        let rb = &mut *rb;
        if rb.epoch != epoch {
            rb.epoch = epoch;
            rb.pending.clear();
        }
        let broken = match link.recv(&mut rb.scratch, &mut rb.pending) {
            Ok(Got::Data) => dispatch(self, &mut rb.pending).is_err(),
            Ok(Got::Idle) => false,
            Err(_) => true,
        };
        if broken {
            rb.pending.clear();
            lost_connection(self, link);
        }
    }

    /// Give the reading role back and hand it to a caller still waiting (not `me`), if any.
    pub fn release_reading(&self, me: Option<u64>) {
        let next = {
            let mut st = self.lock();
            st.reading = false;
            st.routes.iter().find_map(|(id, r)| match r {
                Route::Answer { slot, .. } if Some(*id) != me => Some(slot.clone()),
                _ => None,
            })
        };
        if let Some(slot) = next {
            slot.nudge();
        }
    }

    /// Send a request and wait for its answer (at most `timeout`, if given).
    pub fn call(
        &self,
        req: u64,
        lock: Option<LockFields<'_>>,
        then: Then,
        timeout: Option<Duration>,
    ) -> Result<Response, Error> {
        let id = self.id();
        let frame = self.frame(id, req, lock);
        let slot = Slot::new();
        let (link, epoch) = self.send(
            id,
            &frame,
            Route::Answer {
                slot: slot.clone(),
                then,
            },
        )?;
        self.wait(id, &slot, &link, epoch, timeout)
    }

    /// Forget a hold: its routes go, the driver stops renewing it.
    pub fn drop_hold(&self, hold: &Arc<Hold>) {
        let mut st = self.lock();
        st.holds.retain(|h| !Arc::ptr_eq(h, hold));
        let ids = {
            let mut hs = hold.state();
            let mut ids = std::mem::take(&mut hs.ids);
            ids.append(&mut hs.round_ids);
            ids
        };
        for id in ids {
            st.routes.remove(&id);
        }
    }

    /// Close: the connection goes, every waiting caller and watch gets [`Error::Closed`].
    pub fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        if let Some(link) = st.link.take() {
            link.shutdown();
        }
        fail_routes(&mut st, Error::Closed);
        self.cond.notify_all();
    }
}

/// Every answer still awaited fails with `why`; watches end with it; hold routes go.
fn fail_routes(st: &mut State, why: Error) {
    for (_, route) in st.routes.drain() {
        match route {
            Route::Answer { slot, .. } => slot.fill(Err(why.clone())),
            Route::Watch(tx) => {
                let _ = tx.send(Err(why.clone()));
            }
            Route::Hold(_) | Route::Extend { .. } => {}
        }
    }
    st.watched.clear();
}

/// The driver thread's body: until the client closes.
pub(crate) fn run(shared: Arc<Shared>) {
    loop {
        let (link, epoch, read) = {
            let mut st = shared.lock();
            if st.closed {
                return;
            }
            let callers = st
                .routes
                .values()
                .any(|r| matches!(r, Route::Answer { .. }));
            let quiet = st.last_call.elapsed() >= crate::link::TICK;
            let read = st.link.is_some() && !st.reading && !callers && quiet;
            if read {
                st.reading = true;
            }
            (st.link.clone(), st.epoch, read)
        };
        let Some(link) = link else {
            connect_next(&shared);
            continue;
        };
        if read {
            shared.read_once(&link, epoch);
            shared.release_reading(None);
        } else {
            std::thread::sleep(crate::link::TICK / 4);
        }
        timers(&shared);
    }
}

/// Try the next server (one attempt); on success the leases are re-attached there.
fn connect_next(shared: &Shared) {
    let (server, pause) = {
        let mut st = shared.lock();
        let n = shared.cfg.servers.len();
        let i = st.next_server % n;
        st.next_server = (i + 1) % n;
        // A pause before each round of the servers after a failure, growing to half a second.
        let pause = if st.failures > 0 && (i == 0 || n == 1) {
            Duration::from_millis((20 * u64::from(st.failures.min(25))).min(500))
        } else {
            Duration::ZERO
        };
        (shared.cfg.servers[i].clone(), pause)
    };
    if !pause.is_zero() {
        pause_with_timers(shared, pause);
    }
    match Link::connect(&server, shared.cfg.tls.as_ref(), shared.cfg.connect_timeout) {
        Ok(link) => {
            let link = Arc::new(link);
            let mut st = shared.lock();
            if st.closed {
                link.shutdown();
                return;
            }
            st.epoch += 1;
            st.link = Some(link);
            st.last_send = Instant::now();
            // Leases to renew and re-attach here at once.
            for h in &st.holds {
                let mut hs = h.state();
                if h.lease.is_some() && h.renew {
                    hs.renew_due = Some(Instant::now());
                    hs.round_sent = None;
                }
            }
            shared.cond.notify_all();
        }
        Err(_) => {
            let mut st = shared.lock();
            st.failures = st.failures.saturating_add(1);
        }
    }
    timers(shared);
}

/// Sleep `pause` in ticks, keeping lease deadlines meanwhile.
fn pause_with_timers(shared: &Shared, pause: Duration) {
    let end = Instant::now() + pause;
    while Instant::now() < end {
        if shared.lock().closed {
            return;
        }
        std::thread::sleep(crate::link::TICK.min(end.saturating_duration_since(Instant::now())));
        timers(shared);
    }
}

/// The connection broke: fail what waited on it, lose the connection-bound holds, and move on
/// to the next server (leases are kept, to be re-attached there).
fn lost_connection(shared: &Shared, link: &Arc<Link>) {
    link.shutdown();
    let lost = {
        let mut st = shared.lock();
        if !st.link.as_ref().is_some_and(|l| Arc::ptr_eq(l, link)) {
            return;
        }
        st.link = None;
        st.failures = st.failures.saturating_add(1);
        fail_routes(&mut st, Error::ConnectionLost);
        let mut lost = Vec::new();
        st.holds.retain(|h| {
            let mut hs = h.state();
            hs.ids.clear();
            hs.round_ids.clear();
            hs.epoch = 0;
            hs.round_sent = None;
            if h.lease.is_none() {
                lost.push(h.clone());
                false
            } else {
                true
            }
        });
        lost
    };
    for h in lost {
        h.lose(Loss::ConnectionLost);
    }
}

/// Route every whole frame in `buf`; an undecodable or oversized frame breaks the connection.
fn dispatch(shared: &Shared, buf: &mut Vec<u8>) -> Result<(), ()> {
    let mut used = 0;
    let result = loop {
        match dl::parse_frame(&buf[used..], shared.cfg.max_frame) {
            Ok((body, n)) => {
                used += n;
                match dl::decode_response(body) {
                    Ok(r) => route(shared, r),
                    Err(_) => break Err(()),
                }
            }
            Err(dl::FrameError::Incomplete) => break Ok(()),
            Err(dl::FrameError::TooLarge) => break Err(()),
        }
    };
    buf.drain(..used);
    result
}

fn route(shared: &Shared, r: Response) {
    let Some(id) = r.request_id else { return };
    let mut st = shared.lock();
    if let Some(ev) = r.event {
        match st.routes.get(&id) {
            Some(Route::Hold(h))
                if ev.kind == event_kind::EXPIRED || ev.kind == event_kind::LOST =>
            {
                let h = h.clone();
                drop(st);
                shared.drop_hold(&h);
                h.lose(if ev.kind == event_kind::EXPIRED {
                    Loss::Expired
                } else {
                    Loss::Taken
                });
            }
            Some(Route::Watch(tx)) => {
                let _ = tx.send(Ok(Event::from_wire(ev)));
            }
            _ => {}
        }
        return;
    }
    let ok = r.status.unwrap_or(status::OK) == status::OK;
    if ok {
        st.failures = 0;
    }
    match st.routes.remove(&id) {
        Some(Route::Answer { slot, then }) => {
            match then {
                Then::Hold(h) if ok => {
                    h.fence.store(r.fence.unwrap_or(0), Ordering::Release);
                    let epoch = st.epoch;
                    {
                        let now = Instant::now();
                        let mut hs = h.state();
                        hs.ids.push(id);
                        hs.epoch = epoch;
                        if let Some(lease) = h.lease {
                            hs.valid_until = now.checked_add(lease);
                            if h.renew {
                                hs.renew_due = now.checked_add(lease / 3);
                            }
                        }
                    }
                    st.routes.insert(id, Route::Hold(h.clone()));
                    st.holds.push(h);
                }
                Then::Watch(events) if ok => {
                    st.routes.insert(id, Route::Watch(events));
                }
                _ => {}
            }
            drop(st);
            slot.fill(Ok(r));
        }
        Some(Route::Extend { hold, round }) => {
            let status = r.status.unwrap_or(status::OK);
            let mut hs = hold.state();
            if hs.round != round || hs.released {
                return;
            }
            if status == status::OK {
                hs.round_ids.push(id);
                st.routes.insert(id, Route::Hold(hold.clone()));
                hs.round_left = hs.round_left.saturating_sub(1);
                if hs.round_left == 0 && !hs.round_failed {
                    if let (Some(sent), Some(lease)) = (hs.round_sent, hold.lease) {
                        hs.valid_until = sent.checked_add(lease);
                        hs.renew_due = sent.checked_add(lease / 3);
                    }
                    hs.round_sent = None;
                    hs.epoch = st.epoch;
                    // Notices come under this round's ids from now on: the older routes go.
                    let round = std::mem::take(&mut hs.round_ids);
                    for old in std::mem::replace(&mut hs.ids, round) {
                        st.routes.remove(&old);
                    }
                }
            } else if status == status::NOT_HELD || status == status::STALE_FENCE {
                drop(hs);
                drop(st);
                shared.drop_hold(&hold);
                hold.lose(Loss::NotHeld);
            } else {
                // No quorum on this node, or another refusal: try the next server.
                hs.round_failed = true;
                drop(hs);
                if let Some(link) = st.link.clone() {
                    drop(st);
                    link.shutdown();
                }
            }
        }
        Some(other) => {
            st.routes.insert(id, other);
        }
        None => {}
    }
}

/// Renewals due, renewals that got no answer in time, lease deadlines, the idle ping.
fn timers(shared: &Shared) {
    let now = Instant::now();
    let mut lost = Vec::new();
    let mut frames = Vec::new();
    let mut routes = Vec::new();
    let mut give_up_link = false;
    let mut st = shared.lock();
    let connected = st.link.is_some();
    for h in &st.holds {
        let Some(lease) = h.lease else { continue };
        let mut hs = h.state();
        if hs
            .valid_until
            .is_some_and(|v| now.checked_add(Hold::margin(lease)).is_some_and(|t| t >= v))
        {
            lost.push(h.clone());
            continue;
        }
        if !h.renew || !connected {
            continue;
        }
        if let Some(sent) = hs.round_sent {
            // An answer overdue by a third of the lease (half a second at least: a busy
            // machine is not a dead server): this server does not serve us.
            if now.saturating_duration_since(sent) >= (lease / 3).max(OVERDUE_FLOOR) {
                give_up_link = true;
            }
            continue;
        }
        if hs.renew_due.is_some_and(|d| now >= d) {
            hs.round += 1;
            hs.round_sent = Some(now);
            hs.round_ids.clear();
            hs.round_left = h.keys.len();
            hs.round_failed = false;
            let fence = h.fence.load(Ordering::Acquire);
            let micros = lease.as_micros().min(u128::from(u64::MAX)) as u64;
            for key in &h.keys {
                let id = shared.id();
                let keys = [key.as_slice()];
                let lock = LockFields {
                    release_micro: Some(micros.max(1)),
                    keys: &keys,
                    native: NativeFields {
                        fence: Some(fence),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                frames.push(shared.frame(id, req_type::EXTEND, Some(lock)));
                let round = hs.round;
                routes.push((
                    id,
                    Route::Extend {
                        hold: h.clone(),
                        round,
                    },
                ));
            }
        }
    }
    st.routes.extend(routes);
    let ping = connected
        && frames.is_empty()
        && now.saturating_duration_since(st.last_send) >= shared.cfg.ping_interval;
    if ping {
        frames.push(shared.frame(shared.id(), req_type::PING, None));
    }
    if !frames.is_empty() {
        st.last_send = now;
    }
    let link = st.link.clone();
    drop(st);
    for h in lost {
        shared.drop_hold(&h);
        h.lose(Loss::LeaseNotKept);
    }
    let Some(link) = link else { return };
    if give_up_link {
        // The driver's next read fails and moves on to the next server.
        link.shutdown();
        return;
    }
    for frame in &frames {
        if link.send(frame).is_err() {
            link.shutdown();
            return;
        }
    }
}
