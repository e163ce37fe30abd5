//! What every client thread has: the shared context, its id, its PRNG, its connection.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::model::{Model, Owner};
use crate::net::{Alive, Conn, Fail, Res, Rng, REPLY_DEADLINE};
use crate::report::Report;

/// Shared by every thread of the soak.
pub struct Ctx {
    /// One address per node (one node unless `--cluster`); each connection picks one.
    pub memcache: Vec<SocketAddr>,
    pub lockd: Vec<SocketAddr>,
    pub dlock: Vec<SocketAddr>,
    /// Cluster mode: the nodes' `--session-timeout` (the cluster rules 9-11 apply).
    pub session_timeout: Option<Duration>,
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
    addrs: Vec<SocketAddr>,
    /// The node (index into `addrs`) of the current or last connection.
    pub node: usize,
}

impl Base {
    pub fn new(ctx: Arc<Ctx>, id: u32, seed: u64, addrs: Vec<SocketAddr>) -> Base {
        Base {
            ctx,
            id,
            rng: Rng::mixed(seed ^ (u64::from(id) << 32)),
            conn: None,
            what: "start",
            history: Vec::new(),
            node: (id as usize) % addrs.len().max(1),
            addrs,
        }
    }

    /// The connection, opened if there is none (to a node picked at random in cluster mode).
    pub fn conn(&mut self) -> Res<&mut Conn> {
        if self.conn.is_none() {
            if self.addrs.len() > 1 {
                self.node = self.rng.below(self.addrs.len() as u64) as usize;
            }
            let addr = self.addrs[self.node];
            self.conn = Some(Conn::connect(addr)?);
            self.history.clear();
            self.ctx.report.count(&self.ctx.report.c.reconnects);
        }
        Ok(self.conn.as_mut().expect("just connected"))
    }

    pub fn cluster(&self) -> bool {
        self.ctx.session_timeout.is_some()
    }

    /// Cluster mode: the current connection's [`Alive`], for its marks (rule 10).
    pub fn alive(&self) -> Option<Alive> {
        if !self.cluster() {
            return None;
        }
        self.conn.as_ref().map(|c| c.alive.clone())
    }

    /// The reply to the request sent at `sent` was read just now.
    pub fn replied(&self, sent: std::time::Instant) {
        if let Some(c) = &self.conn {
            c.replied(sent);
        }
    }

    /// Cluster mode (rule 9): whether `f` is an accepted outcome: the node closed or refused
    /// the connection (killed, stopped then fenced, its sessions expired), or answered no
    /// quorum, after which it must close the connection (checked here). The caller clears
    /// its marks (rule 9) and the connection is dropped.
    pub fn cluster_outcome(&mut self, f: &Fail) -> bool {
        if !self.cluster() {
            return false;
        }
        match f {
            Fail::Closed(_) => {
                self.ctx.report.count(&self.ctx.report.c.closed_by_node);
                self.closed_by_server();
                true
            }
            Fail::NoQuorum(what) => {
                self.ctx.report.count(&self.ctx.report.c.no_quorum);
                let closed = match &mut self.conn {
                    Some(c) => c.wait_closed(Instant::now() + REPLY_DEADLINE).is_ok(),
                    None => true,
                };
                if !closed {
                    let conn = self.conn.as_ref().map_or(0, |c| c.id);
                    self.ctx.report.error(format!(
                        "client {} conn {conn} (node {}): {what}: answered no quorum, but the \
                         connection stayed open",
                        self.id,
                        self.node + 1
                    ));
                }
                self.closed_by_server();
                true
            }
            _ => false,
        }
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
