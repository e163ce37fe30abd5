//! Blocking client connections with deadlines, slow writes, resets; the PRNG (`holdfast::rng`).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The project's one seeded generator (`holdfast::rng`).
pub use holdfast::rng::Rng;

/// How long any reply may take before the soak calls it a hang. Generous: the machine is shared
/// and the soak itself runs ~60 threads on it; a healthy daemon answers in microseconds.
pub const REPLY_DEADLINE: Duration = Duration::from_secs(15);

/// Why a conversation with the server stopped.
#[derive(Debug)]
pub enum Fail {
    /// EOF or a socket error: the server closed the connection (or reset it).
    Closed(String),
    /// No (complete) reply by the deadline.
    Timeout,
    /// A reply that the protocol (or `docs/`) does not allow here.
    Proto(String),
    /// Cluster mode: the no-quorum answer (the node closes the connection after it).
    NoQuorum(String),
}

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fail::Closed(why) => write!(f, "connection closed ({why})"),
            Fail::Timeout => write!(f, "no reply within the deadline"),
            Fail::Proto(what) => write!(f, "{what}"),
            Fail::NoQuorum(what) => write!(f, "no quorum ({what})"),
        }
    }
}

pub type Res<T> = Result<T, Fail>;

/// Serial numbers of connections: the soak's identity of a lock holder, never reused.
static CONN_SERIAL: AtomicU64 = AtomicU64::new(1);

/// The origin of [`stamp`]: instants as nanoseconds in an atomic.
static EPOCH: OnceLock<Instant> = OnceLock::new();

fn epoch() -> Instant {
    // Far enough back that every instant the soak stamps comes after it.
    *EPOCH.get_or_init(|| {
        let now = Instant::now();
        [3600, 60, 1]
            .iter()
            .find_map(|&s| now.checked_sub(Duration::from_secs(s)))
            .unwrap_or(now)
    })
}

/// `t` as nanoseconds since the soak's epoch (0 for instants before it).
pub fn stamp(t: Instant) -> u64 {
    t.saturating_duration_since(epoch()).as_nanos() as u64
}

/// The instant of a [`stamp`].
pub fn unstamp(ns: u64) -> Instant {
    epoch() + Duration::from_nanos(ns)
}

/// Cluster mode: the send time (a [`stamp`]) of the latest request on a connection whose reply
/// was read. The node had the request's proposal committed through the leader after that
/// instant, so the leader heard from the node after it: the node's sessions cannot be expired
/// before this + the session timeout (a lower bound, whatever the client thread's scheduling).
pub type Alive = Arc<AtomicU64>;

pub struct Conn {
    s: TcpStream,
    /// Received, not yet consumed.
    buf: Vec<u8>,
    pub id: u64,
    pub alive: Alive,
}

impl Conn {
    pub fn connect(addr: SocketAddr) -> Res<Conn> {
        let mut last = String::new();
        // A few tries: a connect can fail transiently on a busy loopback (backlog full).
        for attempt in 0..5 {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    return Ok(Conn {
                        s,
                        buf: Vec::new(),
                        id: CONN_SERIAL.fetch_add(1, Ordering::Relaxed),
                        alive: Arc::new(AtomicU64::new(stamp(Instant::now()))),
                    });
                }
                Err(e) => {
                    last = e.to_string();
                    std::thread::sleep(Duration::from_millis(20 << attempt));
                }
            }
        }
        Err(Fail::Closed(format!("connect to {addr}: {last}")))
    }

    /// The reply to a request sent at `sent` was read just now.
    pub fn replied(&self, sent: Instant) {
        self.alive.fetch_max(stamp(sent), Ordering::Relaxed);
    }

    pub fn local_port(&self) -> u16 {
        self.s.local_addr().map_or(0, |a| a.port())
    }

    pub fn send(&mut self, bytes: &[u8]) -> Res<()> {
        self.s
            .write_all(bytes)
            .map_err(|e| Fail::Closed(format!("write: {e}")))
    }

    /// Send `bytes` in small pieces with a short sleep between them (a slow client): at most
    /// ~40 pieces, 1-4 ms apart, so a frame takes well under a dlock idle timeout.
    pub fn send_slow(&mut self, bytes: &[u8], rng: &mut Rng) -> Res<()> {
        let piece = bytes.len().div_ceil(40).max(1);
        for chunk in bytes.chunks(piece) {
            self.send(chunk)?;
            std::thread::sleep(Duration::from_micros(1000 + rng.below(3000)));
        }
        Ok(())
    }

    /// Parse a reply out of the received bytes, reading more until `parse` finds one complete
    /// (`Ok(Some((value, consumed)))`) or the deadline passes.
    pub fn recv<T>(
        &mut self,
        deadline: Instant,
        mut parse: impl FnMut(&[u8]) -> Result<Option<(T, usize)>, String>,
    ) -> Res<T> {
        loop {
            match parse(&self.buf) {
                Ok(Some((v, used))) => {
                    self.buf.drain(..used);
                    return Ok(v);
                }
                Ok(None) => {}
                Err(e) => return Err(Fail::Proto(e)),
            }
            self.read_some(deadline)?;
        }
    }

    fn read_some(&mut self, deadline: Instant) -> Res<()> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Fail::Timeout);
            }
            let _ = self.s.set_read_timeout(Some(left));
            let mut tmp = [0u8; 16384];
            match self.s.read(&mut tmp) {
                Ok(0) => return Err(Fail::Closed("EOF".into())),
                Ok(n) => {
                    self.buf.extend_from_slice(&tmp[..n]);
                    return Ok(());
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(Fail::Closed(e.to_string())),
            }
        }
    }

    /// Wait until the server closes the connection; bytes received meanwhile are discarded.
    /// `Err(Timeout)` if it is still open at the deadline.
    pub fn wait_closed(&mut self, deadline: Instant) -> Res<()> {
        loop {
            self.buf.clear();
            match self.read_some(deadline) {
                Ok(()) => {}
                Err(Fail::Closed(_)) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// Close: an orderly FIN, or with `reset` an RST (SO_LINGER 0), so the server sees
    /// ECONNRESET with possibly unread requests in its buffer.
    pub fn close(self, reset: bool) {
        if reset {
            let _ = socket2::SockRef::from(&self.s).set_linger(Some(Duration::ZERO));
        }
        drop(self.s);
    }
}
