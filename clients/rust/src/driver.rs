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

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What to do with a frame that names a request id.
pub(crate) enum Route {
    /// A caller waits for this answer; `then` says what the id becomes once it is Ok.
    Answer {
        tx: Sender<Result<Response, Error>>,
        then: Then,
    },
    /// Loss notices of a hold (the id of its Lock, or of the Extend that moved it here).
    Hold(Arc<Hold>),
    /// A renewal or re-attachment of a hold (Extend by fence), one per key.
    Extend { hold: Arc<Hold>, round: u64 },
    /// Events of a watch.
    Watch(Sender<Result<Event, Error>>),
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
    /// The ids whose routes are this hold's.
    pub ids: Vec<u64>,
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
}

pub(crate) struct Shared {
    pub cfg: Config,
    pub next_id: AtomicU64,
    pub state: Mutex<State>,
    /// Signalled when a connection comes up or the client closes.
    pub cond: Condvar,
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
            }),
            cond: Condvar::new(),
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
    pub fn send(&self, id: u64, frame: &[u8], route: Route) -> Result<(), Error> {
        let st = self.lock();
        let (mut st, link) = self.link(st)?;
        st.routes.insert(id, route);
        st.last_send = Instant::now();
        drop(st);
        if link.send(frame).is_err() {
            link.shutdown();
            // The driver fails the route when it sees the connection gone; do it now in case
            // it already has.
            if let Some(Route::Answer { tx, .. }) = self.lock().routes.remove(&id) {
                let _ = tx.send(Err(Error::ConnectionLost));
            }
        }
        Ok(())
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
        let (tx, rx) = std::sync::mpsc::channel();
        self.send(id, &frame, Route::Answer { tx, then })?;
        let answer = match timeout {
            Some(t) => rx.recv_timeout(t).map_err(|_| Error::Timeout),
            None => rx.recv().map_err(|_| Error::Closed),
        };
        if answer.is_err() {
            self.lock().routes.remove(&id);
        }
        answer?
    }

    /// Forget a hold: its routes go, the driver stops renewing it.
    pub fn drop_hold(&self, hold: &Arc<Hold>) {
        let mut st = self.lock();
        st.holds.retain(|h| !Arc::ptr_eq(h, hold));
        let ids = std::mem::take(&mut hold.state().ids);
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
            Route::Answer { tx, .. } => {
                let _ = tx.send(Err(why.clone()));
            }
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
    let mut buf = Vec::new();
    loop {
        let link = {
            let st = shared.lock();
            if st.closed {
                return;
            }
            st.link.clone()
        };
        let Some(link) = link else {
            connect_next(&shared);
            continue;
        };
        let got = link.recv(&mut buf);
        let broken = match got {
            Ok(Got::Data) => dispatch(&shared, &mut buf).is_err(),
            Ok(Got::Idle) => false,
            Err(_) => true,
        };
        if broken {
            lost_connection(&shared, &link);
            buf.clear();
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
        Some(Route::Answer { tx, then }) => {
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
                            hs.valid_until = Some(now + lease);
                            if h.renew {
                                hs.renew_due = Some(now + lease / 3);
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
            let _ = tx.send(Ok(r));
        }
        Some(Route::Extend { hold, round }) => {
            let status = r.status.unwrap_or(status::OK);
            let mut hs = hold.state();
            if hs.round != round || hs.released {
                return;
            }
            if status == status::OK {
                hs.ids.push(id);
                st.routes.insert(id, Route::Hold(hold.clone()));
                hs.round_left = hs.round_left.saturating_sub(1);
                if hs.round_left == 0 && !hs.round_failed {
                    if let (Some(sent), Some(lease)) = (hs.round_sent, hold.lease) {
                        hs.valid_until = Some(sent + lease);
                        hs.renew_due = Some(sent + lease / 3);
                    }
                    hs.round_sent = None;
                    hs.epoch = st.epoch;
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
            .is_some_and(|v| now + Hold::margin(lease) >= v)
        {
            lost.push(h.clone());
            continue;
        }
        if !h.renew || !connected {
            continue;
        }
        if let Some(sent) = hs.round_sent {
            // An answer overdue by a third of the lease: this server does not serve us.
            if now.saturating_duration_since(sent) >= (lease / 3).max(Duration::from_millis(50)) {
                give_up_link = true;
            }
            continue;
        }
        if hs.renew_due.is_some_and(|d| now >= d) {
            hs.round += 1;
            hs.round_sent = Some(now);
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
