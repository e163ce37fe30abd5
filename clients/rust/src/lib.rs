//! `holdfast-client`: a blocking Rust client of holdfast's native lock protocol (dlock version 3).
//!
//! ```no_run
//! use std::time::Duration;
//! let client = holdfast_client::Client::connect(["127.0.0.1:2627"])?;
//! let guard = client
//!     .lock("nightly")
//!     .lease(Duration::from_secs(30))
//!     .wait(Duration::from_secs(10))
//!     .acquire()?;
//! println!("fencing token {}", guard.fence());
//! // ... work, passing guard.fence() to the storage written to ...
//! guard.unlock()?;
//! # Ok::<(), holdfast_client::Error>(())
//! ```
//!
//! One [`Client`] is one connection, shared by every thread that uses it: requests are
//! multiplexed by `request_id`. A caller waiting for an answer reads the connection itself when
//! no other thread does (so that an answer reaches its caller without a hand-off between
//! threads), routing whatever it reads: other callers' answers, events, loss notices. A driver
//! thread reads when no caller has been active for a tick, renews leases at a third of their
//! length, re-attaches them by fence on the next server when a connection breaks, pings when
//! idle, and reports a lease it cannot keep as lost before the lease's end. README.md describes
//! the behaviour in full.
//!
//! Owns: its connection and driver thread (ended by [`Client::close`] or when the last clone
//! and guard are dropped). Must not: panic on anything a server sends, or block a caller without
//! a bound unless the caller asked to wait for a lock forever.

mod driver;
mod link;
pub mod tls;

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use holdfast_wire::dlock::{self as dl, event_kind, req_type, status, LockFields, NativeFields};
pub use holdfast_wire::dlock::{Holder, KeyInfo};

use driver::{Hold, Route, Shared, Then};

/// The default port of the dlock listener.
pub const DEFAULT_PORT: u16 = 2627;

/// What went wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// No server could be reached (each server's error, joined).
    Unreachable(String),
    /// No connection came up within the connect timeout (the client is between servers).
    NotConnected,
    /// The connection broke before the answer came (a Lock that waited may or may not have been
    /// granted: a lease granted then runs out by itself, a connection-bound hold is gone).
    ConnectionLost,
    /// The server did not answer within the request timeout.
    Timeout,
    /// The client was closed.
    Closed,
    /// A Lock's wait ran out; `busy` are the keys that were not free.
    AcquireTimeout { busy: Vec<Vec<u8>> },
    /// The keys are not held that way (an Unlock or Extend of a grant that is gone).
    NotHeld { keys: Vec<Vec<u8>> },
    /// Any other refusal: the status (`holdfast.proto`'s `ResponseStatus`) and the server's text.
    Refused { status: u32, text: String },
    /// A bad argument caught before sending (an empty key list, a zero lease).
    Invalid(&'static str),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys = |k: &[Vec<u8>]| {
            k.iter()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        };
        match self {
            Error::Unreachable(why) => write!(f, "no server reachable: {why}"),
            Error::NotConnected => f.write_str("not connected to any server"),
            Error::ConnectionLost => f.write_str("the connection was lost before the answer"),
            Error::Timeout => f.write_str("no answer from the server in time"),
            Error::Closed => f.write_str("the client is closed"),
            Error::AcquireTimeout { busy } => {
                write!(f, "timed out waiting for the lock (busy: {})", keys(busy))
            }
            Error::NotHeld { keys: k } => write!(f, "not held: {}", keys(k)),
            Error::Refused { status, text } => {
                write!(f, "the server refused (status {status}: {text})")
            }
            Error::Invalid(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for Error {}

/// Why a hold ended without its owner's unlock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Loss {
    /// The server says its lease ran out.
    Expired,
    /// The server says it was taken away (an Unlock by fence from elsewhere, a session ended).
    Taken,
    /// The connection it was bound to broke (a hold without a lease).
    ConnectionLost,
    /// The lease could not be renewed in time on any server: reported before the lease's end.
    LeaseNotKept,
    /// A renewal or re-attachment found the grant gone.
    NotHeld,
}

impl std::fmt::Display for Loss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Loss::Expired => "the lease expired",
            Loss::Taken => "the lock was taken away",
            Loss::ConnectionLost => "the connection was lost",
            Loss::LeaseNotKept => "the lease could not be renewed in time",
            Loss::NotHeld => "the server no longer knows the grant",
        })
    }
}

/// What happened to a watched key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Acquired,
    Released,
    Expired,
    Lost,
    /// A kind this client does not know (a newer server).
    Other(u32),
}

/// One event of a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub key: Vec<u8>,
    pub kind: EventKind,
    pub fence: u64,
    pub value: Option<Vec<u8>>,
}

impl Event {
    fn from_wire(e: dl::Event) -> Event {
        let kind = match e.kind {
            event_kind::ACQUIRED => EventKind::Acquired,
            event_kind::RELEASED => EventKind::Released,
            event_kind::EXPIRED => EventKind::Expired,
            event_kind::LOST => EventKind::Lost,
            k => EventKind::Other(k),
        };
        Event {
            key: e.key,
            kind,
            fence: e.fence,
            value: e.value,
        }
    }
}

#[derive(Clone)]
pub(crate) struct Config {
    servers: Vec<String>,
    token: Option<Vec<u8>>,
    tls: Option<Arc<rustls::ClientConfig>>,
    connect_timeout: Duration,
    request_timeout: Duration,
    ping_interval: Duration,
    max_frame: usize,
}

/// A [`Client`]'s settings.
pub struct ClientBuilder {
    cfg: Config,
}

impl ClientBuilder {
    /// The servers ("host:port"; a bare host gets port 2627), tried in order; on a lost
    /// connection the client moves to the next one.
    pub fn new<I, S>(servers: I) -> ClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let servers = servers
            .into_iter()
            .map(Into::into)
            .map(|s: String| {
                if s.rsplit_once(':')
                    .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
                    && !s.ends_with(']')
                {
                    s
                } else {
                    format!("{s}:{DEFAULT_PORT}")
                }
            })
            .collect();
        ClientBuilder {
            cfg: Config {
                servers,
                token: None,
                tls: None,
                connect_timeout: Duration::from_secs(5),
                request_timeout: Duration::from_secs(10),
                ping_interval: Duration::from_secs(5),
                max_frame: 16 << 20,
            },
        }
    }

    /// The access token (`--dlock-token` of the server), sent with every request.
    pub fn token(mut self, token: impl Into<Vec<u8>>) -> Self {
        self.cfg.token = Some(token.into());
        self
    }

    /// Speak TLS with this configuration (see [`tls::client_config`]: a CA file or the system's
    /// CAs, and a client certificate for mutual TLS).
    pub fn tls(mut self, config: Arc<rustls::ClientConfig>) -> Self {
        self.cfg.tls = Some(config);
        self
    }

    /// How long one connection attempt (TCP and TLS handshake) may take, and how long a request
    /// waits for a connection while the client moves between servers (default 5 s).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.cfg.connect_timeout = d;
        self
    }

    /// How long a request other than a waiting Lock waits for its answer (default 10 s).
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.cfg.request_timeout = d;
        self
    }

    /// Ping after this long without sending anything (default 5 s; the server closes a
    /// connection idle for `--dlock-idle-timeout`, 60 s by default).
    pub fn ping_interval(mut self, d: Duration) -> Self {
        self.cfg.ping_interval = d.max(Duration::from_millis(1));
        self
    }

    /// The largest frame accepted from a server (default 16 MiB); a larger one breaks the
    /// connection.
    pub fn max_frame(mut self, bytes: usize) -> Self {
        self.cfg.max_frame = bytes;
        self
    }

    /// Connect to the first server that answers (each tried once, in order).
    pub fn connect(self) -> Result<Client, Error> {
        if self.cfg.servers.is_empty() {
            return Err(Error::Invalid("no server given"));
        }
        let mut why = Vec::new();
        let mut first = None;
        for (i, server) in self.cfg.servers.iter().enumerate() {
            match link::Link::connect(server, self.cfg.tls.as_ref(), self.cfg.connect_timeout) {
                Ok(l) => {
                    first = Some((i, l));
                    break;
                }
                Err(e) => why.push(format!("{server}: {e}")),
            }
        }
        let Some((i, link)) = first else {
            return Err(Error::Unreachable(why.join("; ")));
        };
        let shared = Arc::new(Shared::new(self.cfg));
        {
            let mut st = shared.lock();
            st.link = Some(Arc::new(link));
            st.epoch = 1;
            st.next_server = (i + 1) % shared.cfg.servers.len();
        }
        let for_driver = shared.clone();
        let driver = std::thread::Builder::new()
            .name("holdfast-client".into())
            .spawn(move || driver::run(for_driver))
            .map_err(|e| Error::Unreachable(format!("cannot start the driver thread: {e}")))?;
        Ok(Client {
            shared: shared.clone(),
            handle: Arc::new(Handle {
                shared,
                driver: std::sync::Mutex::new(Some(driver)),
            }),
        })
    }
}

/// Closes the client when the last [`Client`] clone and guard are gone.
struct Handle {
    shared: Arc<Shared>,
    driver: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Handle {
    fn close(&self) {
        self.shared.close();
        let driver = self
            .driver
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(d) = driver {
            if d.thread().id() != std::thread::current().id() {
                let _ = d.join();
            }
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.close();
    }
}

/// A connection to a holdfast cluster (or one server). Cheap to clone; clones share the
/// connection. Safe to use from many threads at once.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
    handle: Arc<Handle>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("servers", &self.shared.cfg.servers)
            .finish()
    }
}

fn check(r: dl::Response) -> Result<dl::Response, Error> {
    match r.status.unwrap_or(status::OK) {
        status::OK => Ok(r),
        status::ACQUIRE_TIMEOUT => Err(Error::AcquireTimeout { busy: r.keys }),
        status::NOT_HELD => Err(Error::NotHeld { keys: r.keys }),
        s => Err(Error::Refused {
            status: s,
            text: r
                .error_text
                .map(|t| String::from_utf8_lossy(&t).into_owned())
                .unwrap_or_default(),
        }),
    }
}

fn micros(d: Duration) -> u64 {
    d.as_micros().min(u128::from(u64::MAX)) as u64
}

impl Client {
    /// Connect with the default settings (see [`ClientBuilder`]).
    pub fn connect<I, S>(servers: I) -> Result<Client, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientBuilder::new(servers).connect()
    }

    /// Settings first, then [`ClientBuilder::connect`].
    pub fn builder<I, S>(servers: I) -> ClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientBuilder::new(servers)
    }

    /// A lock on one key, to set up and [`LockBuilder::acquire`].
    pub fn lock(&self, key: impl AsRef<[u8]>) -> LockBuilder<'_> {
        self.lock_many([key])
    }

    /// A lock on several keys at once (all granted together, one fencing token).
    pub fn lock_many<I, K>(&self, keys: I) -> LockBuilder<'_>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<[u8]>,
    {
        LockBuilder {
            client: self,
            keys: keys.into_iter().map(|k| k.as_ref().to_vec()).collect(),
            shared: false,
            limit: None,
            value: None,
            lease: None,
            wait: None,
            lock_delay: None,
            renew: true,
        }
    }

    fn call(
        &self,
        req: u64,
        keys: &[&[u8]],
        native: NativeFields<'_>,
    ) -> Result<dl::Response, Error> {
        let lock = LockFields {
            keys,
            native,
            ..Default::default()
        };
        let r = self.shared.call(
            req,
            Some(lock),
            Then::Nothing,
            Some(self.shared.cfg.request_timeout),
        )?;
        check(r)
    }

    /// The state of `key`: its holders (fence, value, lease left, node), waiters, lock-delay.
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<KeyInfo, Error> {
        let r = self.call(req_type::GET, &[key.as_ref()], NativeFields::default())?;
        Ok(r.info.into_iter().next().unwrap_or_default())
    }

    /// Whether `fence` is a current grant of `key`.
    pub fn check_fence(&self, key: impl AsRef<[u8]>, fence: u64) -> Result<bool, Error> {
        let native = NativeFields {
            fence: Some(fence),
            ..Default::default()
        };
        match self.call(req_type::CHECK_FENCE, &[key.as_ref()], native) {
            Ok(_) => Ok(true),
            Err(Error::Refused { status, .. }) if status == status::STALE_FENCE => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Release the grant of `key` whose token is `fence`, whoever holds it (its holder, if
    /// connected, is told it lost it).
    pub fn unlock_fence(&self, key: impl AsRef<[u8]>, fence: u64) -> Result<(), Error> {
        let native = NativeFields {
            fence: Some(fence),
            ..Default::default()
        };
        self.call(req_type::UNLOCK, &[key.as_ref()], native)
            .map(drop)
    }

    /// A round trip to the server.
    pub fn ping(&self) -> Result<(), Error> {
        let r = self.shared.call(
            req_type::PING,
            None,
            Then::Nothing,
            Some(self.shared.cfg.request_timeout),
        )?;
        check(r).map(drop)
    }

    /// Watch `keys`: their state now, then every grant and release of them, in order. The
    /// watch ends (an `Err` item) if the connection breaks; watch again then.
    pub fn watch<I, K>(&self, keys: I) -> Result<Watch, Error>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<[u8]>,
    {
        let keys: Vec<Vec<u8>> = keys.into_iter().map(|k| k.as_ref().to_vec()).collect();
        if keys.is_empty() {
            return Err(Error::Invalid("watch names no key"));
        }
        let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let (etx, erx) = std::sync::mpsc::channel();
        let id = self.shared.id();
        let frame = self.shared.frame(
            id,
            req_type::WATCH,
            Some(LockFields {
                keys: &refs,
                ..Default::default()
            }),
        );
        let slot = driver::Slot::new();
        let (link, epoch) = self.shared.send(
            id,
            &frame,
            Route::Answer {
                slot: slot.clone(),
                then: Then::Watch(etx),
            },
        )?;
        let r = self
            .shared
            .wait(
                id,
                &slot,
                &link,
                epoch,
                Some(self.shared.cfg.request_timeout),
            )
            .and_then(check);
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                self.shared.lock().routes.remove(&id);
                return Err(e);
            }
        };
        let mut st = self.shared.lock();
        for k in &keys {
            *st.watched.entry(k.clone()).or_default() += 1;
        }
        Ok(Watch {
            client: self.clone(),
            id,
            keys,
            initial: r.info,
            events: erx,
            ended: false,
        })
    }

    /// Campaign for leadership of `name`: wait (forever) until this client leads, with `value`
    /// (its address, say) shown to observers; the lease is renewed while the returned
    /// [`Leadership`] lives. docs/recipes.md, "Leader election".
    pub fn campaign(
        &self,
        name: impl AsRef<[u8]>,
        value: impl Into<Vec<u8>>,
        lease: Duration,
    ) -> Result<Leadership, Error> {
        let guard = self.lock(name).value(value).lease(lease).acquire()?;
        Ok(Leadership { guard })
    }

    /// Who leads `name` now, if anyone.
    pub fn leader(&self, name: impl AsRef<[u8]>) -> Result<Option<Leader>, Error> {
        Ok(Leader::of(&self.get(name)?))
    }

    /// Follow who leads `name`: the leader now, then each change.
    pub fn observe(&self, name: impl AsRef<[u8]>) -> Result<Observer, Error> {
        let name = name.as_ref().to_vec();
        let watch = self.watch([&name])?;
        let current = watch.initial.first().and_then(Leader::of);
        Ok(Observer {
            client: self.clone(),
            name,
            watch: Some(watch),
            first: Some(current.clone()),
            current,
        })
    }

    /// Close the connection now: waiting calls fail with [`Error::Closed`], leases are no
    /// longer renewed (they run out on the server), connection-bound holds are released by the
    /// server. Dropping the last clone and guard does the same.
    pub fn close(&self) {
        self.handle.close();
    }
}

/// A lock request being set up: [`Client::lock`], then options, then [`LockBuilder::acquire`].
#[must_use = "a lock is requested by acquire()"]
pub struct LockBuilder<'a> {
    client: &'a Client,
    keys: Vec<Vec<u8>>,
    shared: bool,
    limit: Option<u32>,
    value: Option<Vec<u8>>,
    lease: Option<Duration>,
    wait: Option<Duration>,
    lock_delay: Option<Duration>,
    renew: bool,
}

impl LockBuilder<'_> {
    /// Shared (read) mode: any number of shared holders, no exclusive one.
    pub fn shared(mut self) -> Self {
        self.shared = true;
        self
    }

    /// A semaphore: up to `n` holders at once (1 to 65535; every user of the key must agree).
    pub fn limit(mut self, n: u32) -> Self {
        self.limit = Some(n);
        self
    }

    /// A value attached to the grant (at most 4096 bytes), shown by `get` and in events.
    pub fn value(mut self, v: impl Into<Vec<u8>>) -> Self {
        self.value = Some(v.into());
        self
    }

    /// Hold as a lease of this length, renewed in the background at a third of it while the
    /// guard lives, and kept across a reconnect. Without a lease the hold is bound to the
    /// connection: it ends if the connection breaks.
    pub fn lease(mut self, d: Duration) -> Self {
        self.lease = Some(d);
        self
    }

    /// Whether a lease is renewed (default true). Not renewed, it runs out after its length
    /// (and is reported lost just before).
    pub fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// Wait at most this long (zero: try once). Not set: wait forever.
    pub fn wait(mut self, d: Duration) -> Self {
        self.wait = Some(d);
        self
    }

    /// `wait` as an option: `None` waits forever.
    pub fn wait_for(mut self, d: Option<Duration>) -> Self {
        self.wait = d;
        self
    }

    /// If this grant ends by loss or expiry, nobody gets the key for this long (at most 60 s).
    pub fn lock_delay(mut self, d: Duration) -> Self {
        self.lock_delay = Some(d);
        self
    }

    /// Ask, and wait for the grant. [`Error::AcquireTimeout`] when the wait runs out.
    pub fn acquire(self) -> Result<LockGuard, Error> {
        if self.keys.is_empty() {
            return Err(Error::Invalid("a lock names at least one key"));
        }
        if self.lease.is_some_and(|l| micros(l) == 0) {
            return Err(Error::Invalid("a lease must be at least 1 microsecond"));
        }
        let keys: Vec<&[u8]> = self.keys.iter().map(Vec::as_slice).collect();
        let lock = LockFields {
            wait_micro: self.wait.map(micros),
            release_micro: self.lease.map(micros),
            keys: &keys,
            native: NativeFields {
                shared: self.shared,
                limit: self.limit,
                value: self.value.as_deref(),
                lock_delay_micro: self.lock_delay.map(micros),
                fence: None,
            },
        };
        let hold = Hold::new(self.keys.clone(), self.lease, self.renew);
        let shared = &self.client.shared;
        let timeout = self.wait.map(|w| w + shared.cfg.request_timeout);
        let r = shared.call(
            req_type::LOCK,
            Some(lock),
            Then::Hold(hold.clone()),
            timeout,
        )?;
        check(r)?;
        Ok(LockGuard {
            client: self.client.clone(),
            hold,
            done: false,
        })
    }
}

/// A held lock. Dropping it unlocks (and returns once the server confirmed, or the connection
/// is gone, or the request timeout passed); [`LockGuard::unlock`] does the same and says how it
/// went.
#[must_use = "dropping the guard unlocks at once"]
pub struct LockGuard {
    client: Client,
    hold: Arc<Hold>,
    done: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("fence", &self.fence())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LockGuard {
    /// The grant's fencing token: pass it with every write the lock protects.
    pub fn fence(&self) -> u64 {
        self.hold.fence.load(Ordering::Acquire)
    }

    /// Whether the lock was lost (see [`Loss`]).
    pub fn is_lost(&self) -> bool {
        self.hold.lost.load(Ordering::Acquire)
    }

    /// Why the lock was lost, if it was.
    pub fn loss(&self) -> Option<Loss> {
        self.hold.state().loss.clone()
    }

    /// Block until the lock is lost (`Some(why)`) or `timeout` passes (`None`); `None` as the
    /// timeout waits without end.
    pub fn wait_lost(&self, timeout: Option<Duration>) -> Option<Loss> {
        self.loss_signal().wait(timeout)
    }

    /// A handle on the loss signal for another thread (a watchdog) while this one works.
    pub fn loss_signal(&self) -> LossSignal {
        LossSignal {
            hold: self.hold.clone(),
        }
    }

    /// Call `f` once when the lock is lost (at once if it already was), on the thread that
    /// notices: the client's driver thread or a caller reading the connection for its answer.
    /// `f` must not block.
    pub fn on_lost(&self, f: impl FnOnce(Loss) + Send + 'static) {
        let mut st = self.hold.state();
        match st.loss.clone() {
            Some(why) => {
                drop(st);
                f(why);
            }
            None => st.callbacks.push(Box::new(f)),
        }
    }

    /// Unlock and wait for the server's answer. After a loss there is nothing to unlock: Ok.
    pub fn unlock(mut self) -> Result<(), Error> {
        self.release()
    }

    fn release(&mut self) -> Result<(), Error> {
        if std::mem::replace(&mut self.done, true) {
            return Ok(());
        }
        {
            let mut st = self.hold.state();
            if st.loss.is_some() {
                return Ok(());
            }
            st.released = true;
        }
        let shared = &self.client.shared;
        shared.drop_hold(&self.hold);
        let fence = self.fence();
        let mut result = Ok(());
        for key in &self.hold.keys {
            let native = NativeFields {
                fence: Some(fence),
                ..Default::default()
            };
            match self
                .client
                .call(req_type::UNLOCK, &[key.as_slice()], native)
            {
                Ok(_) | Err(Error::NotHeld { .. }) => {}
                // The connection is gone: a connection-bound hold went with it, a lease runs out.
                Err(Error::ConnectionLost | Error::NotConnected | Error::Closed) => {}
                Err(e) => result = Err(e),
            }
        }
        result
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

/// The loss signal of one [`LockGuard`], usable from any thread.
#[derive(Clone)]
pub struct LossSignal {
    hold: Arc<Hold>,
}

impl LossSignal {
    pub fn is_lost(&self) -> bool {
        self.hold.lost.load(Ordering::Acquire)
    }

    /// Block until the lock is lost (`Some(why)`) or `timeout` passes (`None`; a `None`
    /// timeout waits without end).
    pub fn wait(&self, timeout: Option<Duration>) -> Option<Loss> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut st = self.hold.state();
        loop {
            if let Some(why) = &st.loss {
                return Some(why.clone());
            }
            if st.released {
                return None;
            }
            st = match deadline {
                None => self
                    .hold
                    .cond
                    .wait(st)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    self.hold
                        .cond
                        .wait_timeout(st, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
    }
}

/// The events of watched keys: an iterator that blocks for the next one. It ends after an
/// `Err` (the connection broke or the client closed). Dropping it unwatches.
pub struct Watch {
    client: Client,
    id: u64,
    keys: Vec<Vec<u8>>,
    initial: Vec<KeyInfo>,
    events: std::sync::mpsc::Receiver<Result<Event, Error>>,
    ended: bool,
}

impl Watch {
    /// The state of each key when the watch began.
    pub fn initial(&self) -> &[KeyInfo] {
        &self.initial
    }

    /// The next event, waiting at most `timeout`; `Ok(None)` when none came in time.
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Option<Event>, Error> {
        if self.ended {
            return Err(Error::Closed);
        }
        match self.events.recv_timeout(timeout) {
            Ok(Ok(e)) => Ok(Some(e)),
            Ok(Err(e)) => {
                self.ended = true;
                Err(e)
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                self.ended = true;
                Err(Error::Closed)
            }
        }
    }
}

impl Iterator for Watch {
    type Item = Result<Event, Error>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.ended {
            return None;
        }
        let item = self.events.recv().unwrap_or(Err(Error::Closed));
        self.ended = item.is_err();
        Some(item)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let shared = &self.client.shared;
        let mut st = shared.lock();
        st.routes.remove(&self.id);
        let mut last = Vec::new();
        for k in &self.keys {
            if let Some(n) = st.watched.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    st.watched.remove(k);
                    last.push(k.as_slice());
                }
            }
        }
        let link = st.link.clone();
        drop(st);
        // Unwatch the keys no other watch of this client names; the answer is not awaited.
        if let (Some(link), false) = (link, last.is_empty()) {
            let frame = shared.frame(
                shared.id(),
                req_type::UNWATCH,
                Some(LockFields {
                    keys: &last,
                    ..Default::default()
                }),
            );
            if link.send(&frame).is_err() {
                link.shutdown();
            }
        }
    }
}

/// This client's leadership of a name ([`Client::campaign`]). Dropping it resigns.
#[must_use = "dropping the leadership resigns at once"]
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
}

impl Leadership {
    /// The term: the grant's fencing token, greater than every earlier leader's.
    pub fn fence(&self) -> u64 {
        self.guard.fence()
    }

    /// Whether leadership was lost (stop acting as leader at once).
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Block until leadership is lost or `timeout` passes.
    pub fn wait_lost(&self, timeout: Option<Duration>) -> Option<Loss> {
        self.guard.wait_lost(timeout)
    }

    pub fn loss_signal(&self) -> LossSignal {
        self.guard.loss_signal()
    }

    /// Step down: the next candidate is granted at once (no lock-delay).
    pub fn resign(self) -> Result<(), Error> {
        self.guard.unlock()
    }
}

/// Who leads: the leader's grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    pub fence: u64,
    pub value: Option<Vec<u8>>,
}

impl Leader {
    fn of(info: &KeyInfo) -> Option<Leader> {
        info.holders.first().map(|h| Leader {
            fence: h.fence,
            value: h.value.clone(),
        })
    }
}

/// The leaders of a name, as they change ([`Client::observe`]): each item is the leader from
/// then on (`None`: nobody leads). Watches again after a reconnect, so it lasts as long as
/// the client; it blocks for the next change.
pub struct Observer {
    client: Client,
    name: Vec<u8>,
    watch: Option<Watch>,
    first: Option<Option<Leader>>,
    current: Option<Leader>,
}

impl Observer {
    /// The leader as last seen.
    pub fn current(&self) -> Option<&Leader> {
        self.current.as_ref()
    }
}

impl Iterator for Observer {
    type Item = Option<Leader>;
    fn next(&mut self) -> Option<Option<Leader>> {
        if let Some(first) = self.first.take() {
            return Some(first);
        }
        loop {
            let Some(watch) = self.watch.as_mut() else {
                // Watch again (after a reconnect), telling the leader then if it changed.
                match self.client.watch([&self.name]) {
                    Ok(w) => {
                        let now = w.initial.first().and_then(Leader::of);
                        self.watch = Some(w);
                        if now != self.current {
                            self.current = now.clone();
                            return Some(now);
                        }
                        continue;
                    }
                    Err(Error::Closed) => return None,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                }
            };
            match watch.next() {
                Some(Ok(ev)) => {
                    let now = match ev.kind {
                        EventKind::Acquired => Some(Leader {
                            fence: ev.fence,
                            value: ev.value,
                        }),
                        EventKind::Other(_) => continue,
                        _ if self.current.as_ref().is_some_and(|l| l.fence != ev.fence) => continue,
                        _ => None,
                    };
                    self.current = now.clone();
                    return Some(now);
                }
                Some(Err(Error::Closed)) | None => return None,
                Some(Err(_)) => self.watch = None,
            }
        }
    }
}
