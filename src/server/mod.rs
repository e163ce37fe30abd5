//! The running daemon: listeners, worker threads, the owner thread, shutdown.
//!
//! Two sides: `worker/` (the mio threads: sockets, parsers, write buffers) and `owner/` (the
//! one thread, or the worker itself when run to completion, that applies every command to the
//! state machine in one serial order; in cluster mode, after raft has committed it). Between
//! them: `msg` (the batches and replies that cross, and the owner's inbox), `effect` (what
//! applying a turn yields), `arena` (the byte arena both carry their bytes in), `conn_id` (a
//! connection's address) and `query` (the admin port's questions and the owner's answers; the
//! admin port, `crate::admin`, sits above this module and is handed in at start). Also here:
//! `sim` (the whole request path in one thread, for tests and fuzzing) and `notify` (systemd
//! readiness).

pub mod arena;
pub mod conn_id;
pub mod effect;
pub mod msg;
pub mod notify;
pub(crate) mod owner;
pub mod query;
pub mod sim;
pub(crate) mod worker;

pub use owner::cluster::Replicated;
pub use owner::{command, sessions};

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::config::Config;

pub use owner::{LEASE_CLOCK_SLACK_MS, LOCKD_MAX_QUEUED_PER_CONN};
pub use worker::{TlsBoundary, MAX_INFLIGHT, REPLY_BUDGET, VERSION_REPLY, WBUF_HIGH, WBUF_MAX};

macro_rules! define_proto {
    ($($proto:ident, $v:ident, $name:literal, $ty:ty, $op:ty, $reply:ty;)*) => {
        /// Which wire format a listener (and so each of its connections) speaks: one per
        /// protocol of `crate::protocol`'s list, in its order.
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        pub enum Proto {
            $($proto,)*
        }

        impl Proto {
            /// Every protocol, in the list's order.
            pub const ALL: &'static [Proto] = &[$(Proto::$proto,)*];

            /// The protocol's place in per-listener arrays (its place in the list).
            pub fn index(self) -> usize {
                self as usize
            }

            pub fn name(self) -> &'static str {
                match self {
                    $(Proto::$proto => $name,)*
                }
            }
        }
    };
}
crate::protocol::protocols!(define_proto);

/// The process's connection counters at one moment, as `stats` reports them. The owner loop
/// reads them (outside apply) and writes them beside each `stats` request of the batch it is
/// about to apply ([`Live::stamp`]), so that apply reads no live counter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Live {
    pub curr_connections: u64,
    pub total_connections: u64,
    pub rejected_connections: u64,
}

impl Live {
    const BYTES: usize = 24;

    /// The counters of this process now.
    pub fn of(shared: &Shared) -> Live {
        Live {
            curr_connections: shared.curr_connections.load(Ordering::Relaxed),
            total_connections: shared.total_connections.load(Ordering::Relaxed),
            rejected_connections: shared.rejected_connections.load(Ordering::Relaxed),
        }
    }

    /// Stamp `batch` with this process's counters if it holds a request that reports them (the
    /// counters are read only then).
    #[inline]
    pub fn stamp_if_wanted(shared: &Shared, batch: &mut msg::Batch) {
        if batch.wants_live {
            Live::of(shared).stamp(batch);
        }
    }

    /// Give every request of `batch` that reports the counters (`McCmd::Stats`) these, in
    /// its arena; a batch with no such request (`Batch::wants_live` false) is left alone.
    pub fn stamp(self, batch: &mut msg::Batch) {
        if !batch.wants_live {
            return;
        }
        let mut bytes = [0; Self::BYTES];
        bytes[..8].copy_from_slice(&self.curr_connections.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.total_connections.to_le_bytes());
        bytes[16..].copy_from_slice(&self.rejected_connections.to_le_bytes());
        let span = batch.arena.push(&bytes);
        for m in &mut batch.ops {
            if let msg::Op::Mc(msg::McOp {
                cmd: msg::McCmd::Stats { live, .. },
                ..
            }) = &mut m.op
            {
                *live = span;
            }
        }
        batch.wants_live = false;
    }

    /// The counters a request was stamped with; `None` if it was not.
    pub fn read(span: arena::Span, arena: &[u8]) -> Option<Live> {
        if span.len as usize != Self::BYTES {
            return None;
        }
        let b = span.get(arena);
        let word = |i: usize| {
            let mut w = [0; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        Some(Live {
            curr_connections: word(0),
            total_connections: word(8),
            rejected_connections: word(16),
        })
    }
}

/// State every thread may read: the configuration, counters kept by the workers, the clock base.
pub struct Shared {
    pub config: Config,
    pub shutdown: AtomicBool,
    pub curr_connections: AtomicU64,
    /// This process's client sockets per listener (memcache, lockd, dlock, counter): the
    /// workers count a socket from its accept to its close, as `curr_connections`.
    pub open_per_listener: [AtomicU64; Proto::ALL.len()],
    pub total_connections: AtomicU64,
    pub rejected_connections: AtomicU64,
    /// Requests the workers handed to a separate owner thread that it has not taken yet (a
    /// single thread's owner takes each batch as it is made), and the most there ever were.
    pub owner_queue: AtomicU64,
    pub owner_queue_peak: AtomicU64,
    pub started: Instant,
    /// The wall clock at `started`, in Unix milliseconds: the state machine's clock is
    /// `started_unix_ms` plus the monotonic time since `started`, so it never runs backwards.
    pub started_unix_ms: u64,
    /// This process's id, as `stats` reports it (kept here so that the tables never ask the
    /// operating system anything: a replayed run reports the id it is given).
    pub pid: u32,
    /// Cluster mode: until when (milliseconds since `started`) this node may still write the
    /// owner's replies; 0: no limit (a single node). The owner moves it forward each time a
    /// leader confirms a quorum probe; past it the node is, or is about to be, fenced, and a
    /// worker writes nothing more: a reply decided before the node was cut off or stopped
    /// (SIGSTOP) must not reach its client after the majority may have given its locks away.
    pub write_deadline_ms: AtomicU64,
    /// Certificates, keys and tokens in force (replaced by SIGHUP's [`Server::reload`]).
    pub secrets: crate::tls::SecretStore,
}

/// A started daemon.
/// Starts the admin port on its bound listener, once the lock threads run: `crate::admin::start`.
/// The caller hands it in, so that the admin port imports the server and not the reverse.
pub type StartAdmin = fn(
    std::net::TcpListener,
    Arc<Shared>,
    msg::OwnerLink,
    Vec<(Proto, SocketAddr)>,
) -> io::Result<AdminPort>;

/// A running admin port.
pub struct AdminPort {
    pub addr: SocketAddr,
    pub waker: Arc<mio::Waker>,
    pub thread: JoinHandle<()>,
}

pub struct Server {
    shared: Arc<Shared>,
    /// The addresses actually bound (port 0 resolved), one per enabled listener.
    pub addresses: Vec<(Proto, SocketAddr)>,
    /// The admin port's address, when it is on.
    pub admin: Option<SocketAddr>,
    wakers: Vec<Arc<mio::Waker>>,
    to_owner: crossbeam_channel::Sender<msg::ToOwner>,
    threads: Vec<JoinHandle<()>>,
}

impl Server {
    /// Load the secret files, bind every listener and start the threads; `start_admin` starts
    /// the admin port when one is configured (`crate::admin::start`).
    pub fn start(config: Config, start_admin: StartAdmin) -> io::Result<Server> {
        let secrets =
            crate::tls::SecretStore::load(config.secrets.clone(), config.dlock_token.clone())
                .map_err(io::Error::other)?;
        Server::start_with(config, secrets, start_admin)
    }

    /// Bind every listener and start the threads, with secrets already loaded (the daemon loads
    /// them first: a file that cannot be used is a bad flag, exit status 2).
    pub fn start_with(
        config: Config,
        secrets: crate::tls::SecretStore,
        start_admin: StartAdmin,
    ) -> io::Result<Server> {
        let started = Instant::now();
        let started_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let shared = Arc::new(Shared {
            write_deadline_ms: AtomicU64::new(0),
            config: config.clone(),
            shutdown: AtomicBool::new(false),
            curr_connections: AtomicU64::new(0),
            open_per_listener: Default::default(),
            total_connections: AtomicU64::new(0),
            rejected_connections: AtomicU64::new(0),
            owner_queue: AtomicU64::new(0),
            owner_queue_peak: AtomicU64::new(0),
            started,
            started_unix_ms,
            pid: std::process::id(),
            secrets,
        });

        // One listening socket per address, shared by every worker (each registers a duplicate
        // of the descriptor): exclusive, so a second daemon on the same address fails to start.
        let tls_on = config.secrets.tls.is_some();
        let wanted = [
            (Proto::Memcache, config.memcache, config.notls.memcache),
            (Proto::Lockd, config.lockd, config.notls.lockd),
            (Proto::Dlock, config.dlock, config.notls.dlock),
            (Proto::Counter, config.counter, config.notls.counter),
        ];
        let mut addresses = Vec::new();
        let mut per_worker: Vec<Vec<worker::Listener>> =
            (0..config.threads).map(|_| Vec::new()).collect();
        for (proto, addr, notls) in wanted {
            let Some(addr) = addr else { continue };
            let l = worker::bind(addr).map_err(|e| {
                let why = if e.kind() == io::ErrorKind::AddrInUse {
                    "address in use".to_string()
                } else {
                    e.to_string()
                };
                io::Error::new(
                    e.kind(),
                    format!("cannot listen for {} on {addr}: {why}", proto.name()),
                )
            })?;
            for listeners in per_worker.iter_mut() {
                listeners.push(worker::Listener {
                    socket: mio::net::TcpListener::from_std(l.try_clone()?),
                    proto,
                    tls: tls_on && !notls,
                });
            }
            addresses.push((proto, l.local_addr()?));
        }

        let admin_listener = bind_admin(&config)?;

        let (to_owner, owner_rx) = crossbeam_channel::bounded(worker::OWNER_QUEUE_BATCHES);
        let mut wakers = Vec::new();
        let mut worker_links = Vec::new();
        let mut workers = Vec::new();
        for (i, listeners) in per_worker.into_iter().enumerate() {
            let poll = mio::Poll::new()?;
            let waker = Arc::new(worker::waker(&poll)?);
            let (reply_tx, reply_rx) = crossbeam_channel::unbounded();
            let w = worker::Worker::new(
                i as u16,
                shared.clone(),
                poll,
                listeners,
                to_owner.clone(),
                reply_rx,
            )?;
            wakers.push(waker.clone());
            worker_links.push((reply_tx, waker));
            workers.push(w);
        }
        // One I/O thread: it runs the owner itself (run to completion; see `Owner::step_inline`),
        // and whoever else talks to the owner (the admin port) must wake that thread.
        // A cluster node's owner drives raft on a thread of its own.
        let inline_waker =
            (workers.len() == 1 && config.cluster.is_none()).then(|| wakers[0].clone());
        let mut owner_rx = Some(owner_rx);
        if let (Some(w), Some(link), Some(rx)) = (
            workers.first_mut(),
            worker_links.first(),
            owner_rx.take_if(|_| inline_waker.is_some()),
        ) {
            w.run_owner_inline(owner::Owner::new_inline(shared.clone(), rx, link.clone()));
        }
        // Opened before any thread starts: a data directory that cannot be used stops the start.
        let cluster_owner = match (
            &config.cluster,
            owner_rx.take_if(|_| config.cluster.is_some()),
        ) {
            (Some(cluster), Some(rx)) => Some(
                owner::cluster::ClusterOwner::start(
                    shared.clone(),
                    rx,
                    std::mem::take(&mut worker_links),
                    cluster,
                )
                .map_err(|e| match e {
                    crate::cluster::node::StartError::Flag(why) => {
                        io::Error::new(io::ErrorKind::InvalidInput, crate::config::BadFlag(why))
                    }
                    crate::cluster::node::StartError::Failed(why) => io::Error::other(why),
                })?,
            ),
            _ => None,
        };
        let mut threads = Vec::new();
        for (i, w) in workers.into_iter().enumerate() {
            threads.push(
                std::thread::Builder::new()
                    .name(format!("holdfast-worker-{i}"))
                    .spawn(move || w.run())?,
            );
        }
        if let Some(owner) = cluster_owner {
            threads.push(
                std::thread::Builder::new()
                    .name("holdfast-owner".into())
                    .spawn(move || owner.run())?,
            );
        } else if let Some(rx) = owner_rx {
            let owner = owner::Owner::new(shared.clone(), rx, worker_links);
            threads.push(
                std::thread::Builder::new()
                    .name("holdfast-owner".into())
                    .spawn(move || owner.run())?,
            );
        }
        let mut admin = None;
        if let Some(l) = admin_listener {
            let owner_link = msg::OwnerLink {
                tx: to_owner.clone(),
                wake: inline_waker.clone(),
            };
            let a = start_admin(l, shared.clone(), owner_link, addresses.clone())?;
            admin = Some(a.addr);
            wakers.push(a.waker);
            threads.push(a.thread);
        }
        Ok(Server {
            shared,
            addresses,
            admin,
            wakers,
            to_owner,
            threads,
        })
    }

    /// SIGHUP: read every certificate, key, CA and token file again. New connections use the
    /// new ones; open connections keep theirs. A file that fails to load keeps the old one in
    /// force; each such failure is logged.
    pub fn reload(&self) {
        let errors = self.shared.secrets.reload();
        for e in &errors {
            crate::log_warn!("{e}");
        }
        crate::log_info!(
            "reloaded certificates, keys and tokens ({} kept from before)",
            errors.len()
        );
    }

    /// Stop accepting, close every connection, stop every thread.
    pub fn stop(self) {
        self.shared.shutdown.store(true, Ordering::Release);
        for w in &self.wakers {
            let _ = w.wake();
        }
        let _ = self.to_owner.send(msg::ToOwner::Shutdown);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Bind the admin port: a default address that is taken (another daemon on this host has it)
/// is a warning and no admin port; an address given with `--admin` must bind.
fn bind_admin(config: &Config) -> io::Result<Option<std::net::TcpListener>> {
    let Some(addr) = config.admin else {
        return Ok(None);
    };
    match std::net::TcpListener::bind(addr) {
        Ok(l) => Ok(Some(l)),
        Err(e) if !config.admin_explicit => {
            crate::log_warn!("admin port off: cannot listen on default {addr}: {e}");
            Ok(None)
        }
        Err(e) => Err(io::Error::new(
            e.kind(),
            if e.kind() == io::ErrorKind::AddrInUse {
                format!("cannot listen for admin on {addr}: address in use")
            } else {
                format!("cannot listen for admin on {addr}: {e}")
            },
        )),
    }
}
