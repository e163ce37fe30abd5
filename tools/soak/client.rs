//! What every client thread has: the shared context, its id, its PRNG, its connection.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::model::{Model, Owner};
use crate::net::{Conn, Res, Rng};
use crate::report::Report;

/// Shared by every thread of the soak.
pub struct Ctx {
    pub memcache: SocketAddr,
    pub lockd: SocketAddr,
    pub dlock: SocketAddr,
    pub model: Model,
    pub report: Arc<Report>,
    /// Clients start no new work from here on; they release what they hold and leave.
    pub stop_at: Instant,
    pub orphan_timeout: Duration,
    /// Zero: idle disconnects are off.
    pub idle_timeout: Duration,
    pub tolerance: Duration,
    /// Names per protocol: few, so that clients contend.
    pub names: usize,
    /// Set when the run must end now (the daemon died).
    pub abort: AtomicBool,
    pub closes: Closes,
}

/// How the last connection from each local port ended.
#[derive(Default)]
pub struct Closes(Mutex<HashMap<u16, String>>);

impl Closes {
    pub fn note(&self, port: u16, text: String) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(port, text);
    }

    pub fn get(&self, port: u16) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&port)
            .cloned()
    }
}

impl Ctx {
    pub fn running(&self) -> bool {
        Instant::now() < self.stop_at && !self.abort.load(Ordering::Relaxed)
    }
}

pub struct Base {
    pub ctx: Arc<Ctx>,
    pub id: u32,
    pub rng: Rng,
    pub conn: Option<Conn>,
    /// What the client is doing (for error messages).
    pub what: &'static str,
    /// The last steps on the current connection (explains a connection the daemon never closes).
    history: Vec<&'static str>,
    addr: SocketAddr,
}

impl Base {
    pub fn new(ctx: Arc<Ctx>, id: u32, seed: u64, addr: SocketAddr) -> Base {
        Base {
            ctx,
            id,
            rng: Rng::mixed(seed ^ (u64::from(id) << 32)),
            conn: None,
            what: "start",
            history: Vec::new(),
            addr,
        }
    }

    /// The connection, opened if there is none.
    pub fn conn(&mut self) -> Res<&mut Conn> {
        if self.conn.is_none() {
            self.conn = Some(Conn::connect(self.addr)?);
            self.history.clear();
            self.ctx.report.count(&self.ctx.report.c.reconnects);
        }
        Ok(self.conn.as_mut().expect("just connected"))
    }

    pub fn owner(&self) -> Owner {
        Owner {
            client: self.id,
            conn: self.conn.as_ref().map_or(0, |c| c.id),
        }
    }

    /// Send a request, now and then slowly (a few bytes at a time).
    pub fn send(&mut self, bytes: &[u8]) -> Res<()> {
        let slow = self.rng.chance(3);
        if slow {
            self.ctx.report.count(&self.ctx.report.c.slow_sends);
        }
        let mut rng = Rng::mixed(self.rng.next());
        let conn = self.conn()?;
        if slow {
            conn.send_slow(bytes, &mut rng)
        } else {
            conn.send(bytes)
        }
    }

    /// Close the connection (half the time with a reset).
    pub fn disconnect(&mut self) {
        let reset = self.rng.chance(50);
        if let Some(c) = self.conn.take() {
            if reset {
                self.ctx.report.count(&self.ctx.report.c.resets);
            }
            self.note(&c, if reset { "reset" } else { "close" });
            c.close(reset);
        }
    }

    /// Start a step called `what`.
    pub fn step(&mut self, what: &'static str) {
        self.what = what;
        if self.history.len() >= 12 {
            self.history.remove(0);
        }
        self.history.push(what);
    }

    /// The server closed the connection (as it had to): drop it.
    pub fn closed_by_server(&mut self) {
        if let Some(c) = self.conn.take() {
            self.note(&c, "closed by the server");
        }
    }

    /// The run is over: close without a reset.
    pub fn finish(&mut self) {
        self.what = "end of run";
        if let Some(c) = self.conn.take() {
            self.note(&c, "close");
            c.close(false);
        }
    }

    /// Remember how the connection from this local port ended, to explain a socket the daemon
    /// never closes.
    fn note(&self, c: &Conn, how: &str) {
        self.ctx.closes.note(
            c.local_port(),
            format!(
                "client {} conn {}: steps [{}], {} then {how}",
                self.id,
                c.id,
                self.history.join(", "),
                self.what
            ),
        );
    }

    pub fn pick(&mut self, prefix: &str) -> String {
        format!("{prefix}{}", self.rng.below(self.ctx.names as u64))
    }

    /// A short pause (think time, hold time).
    pub fn pause(&mut self, max_ms: u64) {
        std::thread::sleep(Duration::from_millis(self.rng.range(0, max_ms)));
    }
}
