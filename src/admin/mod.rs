//! The admin port: a small read-only HTTP/1.1 server for operators (`/metrics`, `/locks`,
//! `/healthz`, `/status.json` and the status page at `/`).
//!
//! It owns its listener thread and one short-lived thread per admin connection (at most
//! [`MAX_ADMIN_CONNS`]); it must never touch the lock tables or delay the lock path. Everything
//! it shows comes from the owner thread as one [`query::Query`] message answered with a bounded
//! amount of data; the admin side waits for that answer with a deadline, so a busy owner makes
//! the admin port slow, never the reverse.
//!
//! Hostile clients: the request line and headers together are capped at [`MAX_REQUEST_BYTES`]
//! and [`MAX_HEADERS`], a request must be complete within [`REQUEST_DEADLINE`] (slowloris
//! clients are closed then), no request body is accepted, one request per connection
//! (`Connection: close`), and every bad method, path or parameter gets a 4xx.
//!
//! Security: with `--tls-cert` the port speaks HTTPS (unless its address was given as
//! `notls:`), the handshake done on the connection's thread within `--tls-handshake-timeout`.
//! With `--admin-token-file`, every request but a GET or HEAD of `/healthz` or `/metrics` needs
//! the token (`Authorization: Bearer`, or Basic with the token as password), checked before the
//! request is routed; without it, membership changes are taken from loopback addresses only.

mod http;
pub(crate) mod render;

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token, Waker};

use crate::server::msg::{OwnerLink, ToOwner};
/// The question and answer types, under the name the cluster code imports them by.
pub use crate::server::query as data;
use crate::server::query;
use crate::server::{AdminPort as Admin, Proto, Shared};

/// Admin connections served at once; more are answered 503 and closed at once. Operators and a
/// scraper or two need a handful; the cap bounds the admin port's threads and memory.
pub const MAX_ADMIN_CONNS: usize = 16;
/// Request line plus headers, in bytes: a browser's request is well under 2 KiB.
pub const MAX_REQUEST_BYTES: usize = 8192;
/// Headers per request (httparse needs a fixed array).
pub const MAX_HEADERS: usize = 32;
/// A request must arrive complete within this, or the connection is closed (slowloris).
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// How long an admin request waits for the owner thread. `/healthz` reports the owner
/// unresponsive past this.
pub const OWNER_DEADLINE: Duration = Duration::from_secs(1);
/// How long writing a response may take before the client is dropped.
const WRITE_DEADLINE: Duration = Duration::from_secs(5);
/// While accept fails for lack of file descriptors, try again this often.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Heavy admin questions (lock listings) may take at most this share of the owner's time: after
/// one that took the owner T, the next may start T * (1/share - 1) later. 16 admin clients asking
/// for 10 000-lock listings back to back still leave the owner 90% of its time for grants.
const HEAVY_SHARE_INVERSE: u32 = 10;
/// Stack of each connection thread: parsing and formatting need little.
const CONN_STACK: usize = 256 * 1024;

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);

/// What every admin connection thread needs.
pub struct Ctx {
    pub shared: Arc<Shared>,
    pub to_owner: OwnerLink,
    /// The lock listeners (protocol, bound address) and the admin port's own address.
    pub listeners: Vec<(Proto, SocketAddr)>,
    pub admin: SocketAddr,
    /// Whether the port speaks HTTPS (`--tls-cert`, and the address not given as `notls:`).
    pub tls: bool,
    /// Admin connections being served now.
    pub active: AtomicUsize,
    /// When the next heavy question may go to the owner (held while one is asked: they go one
    /// at a time).
    heavy: std::sync::Mutex<std::time::Instant>,
}

impl Ctx {
    /// Ask the owner and wait at most [`OWNER_DEADLINE`]; `None` if it did not answer.
    pub fn ask(&self, q: query::Query) -> Option<query::Answer> {
        let heavy = matches!(q, query::Query::Locks { .. } | query::Query::Status { .. });
        if !heavy {
            return self.ask_now(q);
        }
        let mut next = self.heavy.lock().unwrap_or_else(|e| e.into_inner());
        let wait = next.saturating_duration_since(std::time::Instant::now());
        if wait > OWNER_DEADLINE {
            return None;
        }
        std::thread::sleep(wait);
        let start = std::time::Instant::now();
        let answer = self.ask_now(q);
        let took = start.elapsed();
        *next = std::time::Instant::now() + took * (HEAVY_SHARE_INVERSE - 1);
        answer
    }

    fn ask_now(&self, q: query::Query) -> Option<query::Answer> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.to_owner
            .send(ToOwner::Admin(q, tx), OWNER_DEADLINE)
            .then_some(())?;
        rx.recv_timeout(OWNER_DEADLINE).ok()
    }
}

/// Start serving on `listener` (already bound: bind errors are reported with the others).
pub fn start(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    to_owner: OwnerLink,
    listeners: Vec<(Proto, SocketAddr)>,
) -> io::Result<Admin> {
    let addr = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let mut listener = TcpListener::from_std(listener);
    let poll = Poll::new()?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
    let tls = shared.config.secrets.tls.is_some() && !shared.config.notls.admin;
    let ctx = Arc::new(Ctx {
        tls,
        shared,
        to_owner,
        listeners,
        admin: addr,
        active: AtomicUsize::new(0),
        heavy: std::sync::Mutex::new(std::time::Instant::now()),
    });
    let thread = std::thread::Builder::new()
        .name("holdfast-admin".into())
        .spawn(move || run(poll, listener, ctx))?;
    Ok(Admin {
        addr,
        waker,
        thread,
    })
}

fn run(mut poll: Poll, listener: TcpListener, ctx: Arc<Ctx>) {
    let mut events = Events::with_capacity(16);
    let mut paused = false;
    loop {
        let timeout = paused.then_some(ACCEPT_BACKOFF);
        if let Err(e) = poll.poll(&mut events, timeout) {
            if e.kind() != io::ErrorKind::Interrupted {
                crate::log_error!("admin: poll failed: {e}");
                return;
            }
        }
        if ctx.shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        paused = false;
        loop {
            match listener.accept() {
                Ok((stream, peer)) => accept(stream, peer, &ctx),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    if matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE)) {
                        crate::log_warn!("admin: out of file descriptors, accept paused: {e}");
                    }
                    paused = true;
                    break;
                }
            }
        }
        let _ = &mut poll;
    }
}

fn accept(stream: mio::net::TcpStream, peer: SocketAddr, ctx: &Arc<Ctx>) {
    use std::os::fd::{FromRawFd, IntoRawFd};
    // SAFETY: the descriptor comes from a TcpStream we own and give up here.
    let stream = unsafe { std::net::TcpStream::from_raw_fd(stream.into_raw_fd()) };
    if ctx.active.fetch_add(1, Ordering::AcqRel) >= MAX_ADMIN_CONNS {
        ctx.active.fetch_sub(1, Ordering::AcqRel);
        crate::log_debug!("admin: {peer}: too many admin connections, answered 503");
        if !ctx.tls {
            // Still non-blocking: a best-effort answer that never waits (a TLS client is only
            // closed: an answer would need a handshake).
            let _ = http::write_response(&mut &stream, &http::Response::busy(), false);
        }
        return;
    }
    let ctx2 = ctx.clone();
    let spawned = std::thread::Builder::new()
        .name("holdfast-admin-conn".into())
        .stack_size(CONN_STACK)
        .spawn(move || {
            http::serve(stream, peer, &ctx2);
            ctx2.active.fetch_sub(1, Ordering::AcqRel);
        });
    if spawned.is_err() {
        ctx.active.fetch_sub(1, Ordering::AcqRel);
        crate::log_warn!("admin: {peer}: cannot start a thread for the connection");
    }
}
