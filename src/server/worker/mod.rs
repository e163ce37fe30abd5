//! One I/O worker thread: a mio event loop that owns its connections.
//!
//! It accepts on the daemon's listeners (one socket per address, shared by the workers),
//! reads until WouldBlock, parses every complete request zero-copy and copies it once into the
//! batch it sends the owner at the end of the loop turn. It applies the owner's replies, writes
//! each touched connection once per turn, and closes connections. It never touches lock state:
//! a closed connection is reported to the owner, which releases or orphans what it held.
//!
//! Backpressure, not loss: a connection with too many operations at the owner, or too many reply
//! bytes not yet taken by its client, is simply not parsed (and then not read) further until that
//! drains; its bytes wait in the buffer and the kernel.
//!
//! A client that never reads would hold that buffer forever, so a connection whose unread output
//! is at or above `WBUF_HIGH` (or that is closing with output left) is put on a short list of
//! stalled connections, and stays there until its output falls under [`STALL_LOW`]. About every
//! [`STALL_CHECK`] the worker looks at that list only (never at every connection): one that took
//! some bytes since the last look has its clock reset (a slow reader is served, however slowly),
//! one that took nothing for `--client-stall-timeout` is closed. Independently, a connection whose unread output passes `WBUF_MAX` (large replies to
//! requests that were already at the owner) is closed at once.

use std::io::{self, ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use slab::Slab;

mod boundary;
pub(crate) mod conn;
pub(crate) mod decode;
pub(crate) mod encode;

pub use boundary::TlsBoundary;

pub use crate::protocol::memcache::VERSION_REPLY;
pub use conn::{MAX_INFLIGHT, REPLY_BUDGET, WBUF_HIGH, WBUF_MAX};
pub use decode::Cx;

use super::effect::Effect;
use super::msg::{Arena, Batch, Op, OpMsg, Pool, Replies, ToOwner};
use super::owner::Owner;
use super::{Proto, Shared};
use crate::server::msg::ConnId;
pub(super) use conn::{Conn, Dump};

const WAKER: Token = Token(0);
/// Listener tokens are 1..=3 (one per protocol); connection tokens start here.
const FIRST_CONN: usize = 16;
/// Bytes read per `read` call into the worker's scratch buffer: a deep pipeline of small
/// requests in one syscall, and a connection's whole share of a turn ([`READS_PER_TURN`]).
/// Beside a bulk writer of 1,000-byte sets, a lock probe on another connection waited 0.38 ms at
/// the median with 64 KiB, 0.28-0.31 ms with 32 KiB and 0.29-0.30 ms with 16 KiB
/// (tools/bench_load.py), the writer as fast with each.
const READ_CHUNK: usize = 32 * 1024;
/// Requests of one connection parsed per turn (`Conn::inflight_cap`, requests in flight at
/// its first service in the turn plus this): the turn's share of a pipeline of small requests,
/// which a read of [`READ_CHUNK`] can hold a thousand of. Requests the worker answers itself
/// with nothing in flight (a `version` after the last reply) cost no owner work and are not
/// counted; the read bounds them.
const REQUESTS_PER_TURN: u32 = 256;
/// Reads of one connection per loop turn, its later passes included (`Socket::spent_turn`): the
/// rest is read next turn, which comes at once, after the connections that became ready
/// meanwhile. A turn's requests are applied together and answered at its end, so every request
/// waits for the turn it arrives in and the next: without a bound, a client that always has
/// more to send (a bulk writer, a deep pipeline) made every turn as long as its buffer. One
/// read of 64 KiB is about 64 1,000-byte sets or a thousand small requests: a quarter of a
/// millisecond of work. Measured beside a bulk writer (tools/bench_load.py), four reads and more
/// in a turn's later passes kept a lock probe on another connection waiting 2.4-2.6 ms at the
/// median; one read, 0.23-0.26 ms, with the writer as fast.
const READS_PER_TURN: usize = 1;
/// A turn's work over all its connections: requests parsed into one batch, and bytes read.
/// Connections past it keep their place in line (`Worker::deferred`) and are served first in
/// the next turn, so that under a flood of busy connections each turn stays short and every
/// connection gets its share in turn. It also bounds a batch, and with the owner's bounded
/// channel ([`OWNER_QUEUE_BATCHES`]) the work queued for the owner: a worker whose batches the
/// owner has not taken waits, reading nothing, and its clients' sockets fill (backpressure).
const TURN_REQUESTS: usize = 4096;
const TURN_BYTES: usize = 1 << 20;
/// Batches the workers' channel to a separate owner thread holds before a worker's send waits.
/// A request queues at the owner behind every batch ahead of it: beside a bulk writer with
/// `--threads 2`, a lock probe waited 0.56-0.58 ms at the median with four, 1.4-1.6 ms with
/// sixteen (tools/bench_load.py), the writer as fast; with two it lost a seventh of its rate.
pub const OWNER_QUEUE_BATCHES: usize = 4;
/// Run to completion: rounds of (apply the owner's replies, write, resume connections that
/// were held back, run the owner on what that parsed) per poll. Two: the replies to this poll's
/// requests are written in the same pass, and what they unblock is parsed once. Without a
/// bound, a few connections that always have more requests buffered (a pipelined flood) kept
/// the worker here for the whole flood, never polling: every other connection's requests sat
/// unread (1.6 s behind 1M pipelined dlock leases). The poll that follows does not sleep while
/// work is left (`recheck` or replies not yet applied).
const INLINE_ROUNDS: usize = 2;
/// Events per `poll` call.
const EVENTS: usize = 1024;
/// How long accept waits after running out of file descriptors before it tries again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);
/// How often stalled connections are looked at. Coarse on purpose: the stall timeout is counted
/// in seconds, and the worker has no other timer, so this is the one wake-up it adds (only while
/// some connection is stalled).
const STALL_CHECK: Duration = Duration::from_millis(100);
/// A stalled connection leaves the list when its unread output falls under this. Half the mark,
/// not the mark itself: a slow reader hovers around the mark (each read lets the daemon parse and
/// answer more), and its clock should be kept by its progress, not restarted by each dip.
const STALL_LOW: usize = WBUF_HIGH / 2;

/// A connection's socket with its protocol state.
struct Socket {
    stream: TcpStream,
    gen: u32,
    conn: Conn,
    /// A TLS listener's connection: rustls decrypts what is read into the parser's input and
    /// encrypts the write buffer on its way out.
    tls: Option<Box<rustls::ServerConnection>>,
    /// Whether the owner knows this connection (`Op::Open` sent): a TLS connection is opened
    /// only once its handshake has finished, so nothing is parsed or held before it.
    opened: bool,
    /// The TLS client's close_notify arrived: its requests end with what is buffered, which is
    /// parsed first (it may wait behind backpressure); then the connection is at its EOF.
    tls_eof: bool,
    peer: SocketAddr,
    /// Stopped reading before WouldBlock (backpressure): read again when it clears.
    read_pending: bool,
    write_interest: bool,
    /// Reply bytes written to the socket so far: a stalled connection whose count moved made
    /// progress.
    sent: u64,
    /// Set while the connection is on the worker's stalled list.
    stall: Option<Stall>,
    /// The worker's turn in which this connection used its reads: it is read again in the
    /// next turn, not in this one's later passes.
    spent_turn: u64,
    /// The turn whose [`REQUESTS_PER_TURN`] its `Conn::inflight_cap` allows.
    budget_turn: u64,
    /// On `Worker::deferred`: the turn's work ran out before its turn came.
    deferred: bool,
}

impl Socket {
    /// A connection served for the first time in turn `turn` may parse [`REQUESTS_PER_TURN`].
    fn fresh_budget(&mut self, turn: u64) {
        if self.budget_turn != turn {
            self.budget_turn = turn;
            self.conn.inflight_cap = (self.conn.inflight + REQUESTS_PER_TURN).min(MAX_INFLIGHT);
        }
    }
}

/// A connection whose client is not taking its replies.
struct Stall {
    /// When it was last seen making progress (or was found stalled).
    since: Instant,
    /// `Socket::sent` at that time.
    mark: u64,
}

pub struct Worker {
    id: u16,
    /// The cluster node this worker belongs to (0 on a single node), part of every [`ConnId`].
    node: u16,
    shared: Arc<Shared>,
    poll: Poll,
    listeners: Vec<Listener>,
    sockets: Slab<Socket>,
    /// Generation of each slab slot, bumped on close; indexed by slot.
    gens: Vec<u32>,
    to_owner: Sender<ToOwner>,
    from_owner: Receiver<Replies>,
    /// Run to completion (`--threads 1`): this worker runs the owner itself at the end of each
    /// turn, so a request costs no thread hand-off and no wake-up in either direction.
    inline: Option<Box<Owner>>,
    batch: Batch,
    /// Buffers coming back from the owner, reused for the next batches and returned with them.
    pool_ops: Pool<OpMsg>,
    pool_batch_arena: Pool<u8>,
    pool_effects: Pool<Effect>,
    pool_reply_arena: Pool<u8>,
    scratch: Vec<u8>,
    /// The secrets in force, taken from `Shared::secrets` when its generation moves (at most once
    /// a turn) so that no request takes a lock to read them.
    secrets: Arc<crate::tls::Secrets>,
    secrets_gen: u64,
    /// TLS connections still in their handshake, in the order of their deadlines (one timeout
    /// for all, so a queue is sorted by construction): (slot, generation, deadline).
    handshakes: std::collections::VecDeque<(usize, u32, Instant)>,
    handshake_timeout: Duration,
    /// Connections written to this turn (flushed once at its end).
    dirty: Vec<usize>,
    /// Connections to look at again at the end of the turn (closing, read pending).
    recheck: Vec<usize>,
    /// Connections not served in a turn whose work ran out ([`TURN_REQUESTS`], [`TURN_BYTES`]),
    /// in the order they asked: the next turn serves them first.
    deferred: std::collections::VecDeque<usize>,
    /// Bytes read in this turn.
    turn_bytes: usize,
    accept_paused: bool,
    /// Loop turns so far.
    turn: u64,
    /// Connections with a `Stall` (slot, generation): the only ones the stall check looks at.
    stalled: Vec<(usize, u32)>,
    /// When the stall check runs next (meaningful while `stalled` is not empty).
    next_stall_check: Instant,
    /// `--client-stall-timeout`; `None`: stalled connections are never closed for it.
    stall_timeout: Option<Duration>,
    /// The connection limit or fd exhaustion was logged and has not cleared since: one log line
    /// per episode, not one per refused connection.
    limit_logged: bool,
    fds_logged: bool,
    /// Closes for stalling or bad input are logged at most once a second per worker.
    stall_log: crate::log::Limiter,
    bad_input_log: crate::log::Limiter,
    tls_log: crate::log::Limiter,
}

/// A listening socket shared by every worker (one per address: no other process can bind it
/// beside us), and whether its connections speak TLS.
pub struct Listener {
    pub socket: TcpListener,
    pub proto: Proto,
    pub tls: bool,
}

/// Plaintext a TLS connection's rustls may hold on its way out before the worker stops moving
/// the write buffer into it: writing resumes as the socket takes the ciphertext. Bounds the
/// copy per connection without limiting throughput (several records per write).
const TLS_SEND_BUFFER: usize = 256 * 1024;

impl Worker {
    pub fn new(
        id: u16,
        shared: Arc<Shared>,
        poll: Poll,
        listeners: Vec<Listener>,
        to_owner: Sender<ToOwner>,
        from_owner: Receiver<Replies>,
    ) -> io::Result<Worker> {
        let secrets = shared.secrets.current();
        let secrets_gen = shared.secrets.generation();
        let handshake_timeout = Duration::from_millis(shared.config.tls_handshake_timeout_ms);
        let mut worker = Worker {
            id,
            node: shared.config.cluster.as_ref().map_or(0, |c| c.node_id),
            shared,
            poll,
            listeners,
            sockets: Slab::new(),
            gens: Vec::new(),
            to_owner,
            from_owner,
            inline: None,
            batch: Batch {
                worker: id,
                ..Batch::default()
            },
            pool_ops: Pool::default(),
            pool_batch_arena: Pool::default(),
            pool_effects: Pool::default(),
            pool_reply_arena: Pool::default(),
            scratch: vec![0; READ_CHUNK],
            secrets,
            secrets_gen,
            handshakes: Default::default(),
            handshake_timeout,
            dirty: Vec::new(),
            recheck: Vec::new(),
            deferred: Default::default(),
            turn_bytes: 0,
            accept_paused: false,
            turn: 0,
            stalled: Vec::new(),
            next_stall_check: Instant::now(),
            stall_timeout: None,
            limit_logged: false,
            fds_logged: false,
            stall_log: Default::default(),
            bad_input_log: Default::default(),
            tls_log: Default::default(),
        };
        let ms = worker.shared.config.client_stall_timeout_ms;
        worker.stall_timeout = (ms > 0).then(|| Duration::from_millis(ms));
        for (i, l) in worker.listeners.iter_mut().enumerate() {
            worker
                .poll
                .registry()
                .register(&mut l.socket, Token(1 + i), Interest::READABLE)?;
        }
        Ok(worker)
    }

    /// Run `owner` in this worker's own loop (the only worker; see [`Owner::step_inline`]).
    pub fn run_owner_inline(&mut self, owner: Owner) {
        self.inline = Some(Box::new(owner));
    }

    pub fn run(mut self) {
        crate::slice::request_for_this_thread(crate::slice::SERVING_THREAD_NANOS);
        let mut events = Events::with_capacity(EVENTS);
        while self.turn(&mut events) {}
        // Shutdown: drop every connection; the process is exiting.
        self.sockets.clear();
    }

    /// One loop turn: poll (without sleeping while work is left), read what became ready, run
    /// the owner inline or hand it the batch, apply replies and write. False: shut down.
    fn turn(&mut self, events: &mut Events) -> bool {
        // Connections left to look at again (found while finishing the last turn) must not
        // wait for an unrelated event.
        let replies_left = self.inline.is_some() && !self.from_owner.is_empty();
        let mut timeout = if self.work_left() || replies_left {
            Some(Duration::ZERO)
        } else {
            self.accept_paused.then_some(ACCEPT_BACKOFF)
        };
        if !self.stalled.is_empty() {
            let left = self
                .next_stall_check
                .saturating_duration_since(Instant::now());
            timeout = Some(timeout.map_or(left, |t| t.min(left)));
        }
        if let Some(due) = self.inline.as_ref().and_then(|o| o.until_due()) {
            timeout = Some(timeout.map_or(due, |t| t.min(due)));
        }
        if let Some(&(_, _, deadline)) = self.handshakes.front() {
            let left = deadline.saturating_duration_since(Instant::now());
            timeout = Some(timeout.map_or(left, |t| t.min(left)));
        }
        if let Err(e) = self.poll.poll(events, timeout) {
            if e.kind() != ErrorKind::Interrupted {
                eprintln!("holdfast: worker {}: poll failed: {e}", self.id);
                return false;
            }
        }
        if self.shared.shutdown.load(Ordering::Acquire) {
            return false;
        }
        self.turn += 1;
        self.turn_bytes = 0;
        // One clock read per turn (vDSO, no syscall), none per request: the owner's latency
        // histograms count each lock request of this turn's batch from here.
        self.batch.stamp = Some(Instant::now());
        let generation = self.shared.secrets.generation();
        if generation != self.secrets_gen {
            self.secrets = self.shared.secrets.current();
            self.secrets_gen = generation;
        }
        if !self.handshakes.is_empty() {
            self.expire_handshakes(Instant::now());
        }
        if self.accept_paused {
            self.accept_paused = false;
            for i in 0..self.listeners.len() {
                self.accept(i);
            }
        }
        // Those the last turn had no room for go first.
        for _ in 0..self.deferred.len() {
            let Some(slot) = self.deferred.pop_front() else {
                break;
            };
            if let Some(s) = self.sockets.get_mut(slot) {
                s.deferred = false;
                self.resume(slot);
            }
        }
        for event in events.iter() {
            match event.token() {
                WAKER => {}
                Token(t) if t < FIRST_CONN => self.accept(t - 1),
                Token(t) => {
                    let slot = t - FIRST_CONN;
                    if event.is_error() {
                        self.close(slot);
                        continue;
                    }
                    if event.is_writable() {
                        self.dirty.push(slot);
                    }
                    if event.is_readable() || event.is_read_closed() {
                        self.read(slot);
                    }
                }
            }
        }
        // Run to completion: the owner's due timers and queued questions first, then every
        // batch this turn produces is applied at once and its replies delivered and written
        // in the same turn; a delivery may clear backpressure and let buffered requests be
        // parsed, once more here, then after a poll that does not sleep (INLINE_ROUNDS).
        if let Some(owner) = self.inline.as_mut() {
            if !owner.step_inline(None) {
                return false;
            }
        }
        for _ in 0..INLINE_ROUNDS {
            self.apply_replies();
            self.end_turn();
            if self.inline.is_none() || self.from_owner.is_empty() {
                break;
            }
        }
        if !self.stalled.is_empty() {
            let now = Instant::now();
            if now >= self.next_stall_check {
                self.check_stalled(now);
                self.next_stall_check = now + STALL_CHECK;
            }
        }
        true
    }

    /// Connections to look at again in the next turn without waiting for an event.
    fn work_left(&self) -> bool {
        !self.recheck.is_empty() || !self.deferred.is_empty() || !self.dirty.is_empty()
    }

    fn accept(&mut self, index: usize) {
        let Some(&Listener { proto, tls, .. }) = self.listeners.get(index) else {
            return;
        };
        loop {
            match self.listeners[index].socket.accept() {
                Ok((stream, peer)) => {
                    let shared = &self.shared;
                    let open = shared.curr_connections.fetch_add(1, Ordering::Relaxed);
                    if open >= shared.config.max_connections as u64 {
                        shared.curr_connections.fetch_sub(1, Ordering::Relaxed);
                        shared.rejected_connections.fetch_add(1, Ordering::Relaxed);
                        if !self.limit_logged {
                            self.limit_logged = true;
                            crate::log_warn!(
                                "connection limit ({}) reached: refusing {} clients",
                                shared.config.max_connections,
                                proto.name()
                            );
                        }
                        drop(stream);
                        continue;
                    }
                    shared.total_connections.fetch_add(1, Ordering::Relaxed);
                    self.limit_logged = false;
                    self.fds_logged = false;
                    let _ = stream.set_nodelay(true);
                    self.add_socket(stream, proto, peer, tls);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of file descriptors (EMFILE/ENFILE) or memory: the connection stays in
                    // the backlog; try again after a pause instead of spinning on it.
                    if !matches!(
                        e.raw_os_error(),
                        Some(libc::ECONNABORTED) | Some(libc::EPROTO)
                    ) {
                        if !self.fds_logged {
                            self.fds_logged = true;
                            crate::log_warn!(
                                "accept failed, pausing {} accepts: {e}",
                                proto.name()
                            );
                        }
                        self.accept_paused = true;
                        return;
                    }
                }
            }
        }
    }

    fn add_socket(&mut self, mut stream: TcpStream, proto: Proto, peer: SocketAddr, tls: bool) {
        let tls = if tls {
            // The configuration in force now (a SIGHUP's new certificate serves the connections
            // accepted after it).
            let Some(config) = self.secrets.server.clone() else {
                self.shared.curr_connections.fetch_sub(1, Ordering::Relaxed);
                return;
            };
            match rustls::ServerConnection::new(config) {
                Ok(mut c) => {
                    c.set_buffer_limit(Some(TLS_SEND_BUFFER));
                    Some(Box::new(c))
                }
                Err(_) => {
                    self.shared.curr_connections.fetch_sub(1, Ordering::Relaxed);
                    return;
                }
            }
        } else {
            None
        };
        let entry = self.sockets.vacant_entry();
        let slot = entry.key();
        let token = Token(slot + FIRST_CONN);
        if self
            .poll
            .registry()
            .register(&mut stream, token, Interest::READABLE)
            .is_err()
        {
            self.shared.curr_connections.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        if slot >= self.gens.len() {
            self.gens.resize(slot + 1, 0);
        }
        let gen = self.gens[slot];
        let handshaking = tls.is_some();
        self.shared.open_per_listener[proto.index()].fetch_add(1, Ordering::Relaxed);
        entry.insert(Socket {
            stream,
            gen,
            conn: Conn::accepted(proto, &self.secrets),
            tls,
            opened: false,
            tls_eof: false,
            peer,
            read_pending: false,
            spent_turn: u64::MAX,
            budget_turn: u64::MAX,
            deferred: false,
            write_interest: false,
            sent: 0,
            stall: None,
        });
        if handshaking {
            let deadline = Instant::now() + self.handshake_timeout;
            self.handshakes.push_back((slot, gen, deadline));
        } else {
            self.open(slot);
        }
    }

    /// Tell the owner of a connection: from now on its requests are parsed.
    fn open(&mut self, slot: usize) {
        let Some(s) = self.sockets.get_mut(slot) else {
            return;
        };
        let conn = ConnId::on_node(self.node, self.id, slot as u32, s.gen);
        push_open(&mut self.batch, conn, s);
    }

    /// Close the TLS connections whose handshake did not finish in time (the queue is in
    /// deadline order; an entry whose connection finished or closed is simply dropped).
    fn expire_handshakes(&mut self, now: Instant) {
        while let Some(&(slot, gen, deadline)) = self.handshakes.front() {
            let Some(s) = self.sockets.get(slot).filter(|s| s.gen == gen) else {
                self.handshakes.pop_front();
                continue;
            };
            if s.opened {
                self.handshakes.pop_front();
                continue;
            }
            if deadline > now {
                break;
            }
            self.handshakes.pop_front();
            if let Some(more) = self.tls_log.ready(crate::log::Level::Info) {
                crate::log_info!(
                    "closed a {} client whose TLS handshake took over {} ms ({more} more since the last line)",
                    s.conn.proto.name(),
                    self.handshake_timeout.as_millis()
                );
            }
            self.close(slot);
        }
    }

    /// Read until WouldBlock (or backpressure, or this turn's share), parsing as bytes arrive.
    fn read(&mut self, slot: usize) {
        let scratch = &mut self.scratch;
        let mut reads = 0;
        if let Some(s) = self.sockets.get_mut(slot) {
            s.fresh_budget(self.turn);
        }
        while let Some(s) = self.sockets.get_mut(slot) {
            if !s.conn.can_parse() {
                s.read_pending = !s.conn.closing;
                if s.read_pending && s.conn.had_its_turn() {
                    // Its requests of this turn are parsed: the rest waits for the next.
                    s.spent_turn = self.turn;
                    self.recheck.push(slot);
                }
                break;
            }
            if self.batch.ops.len() >= TURN_REQUESTS || self.turn_bytes >= TURN_BYTES {
                // The turn is full: this connection is first in line for the next.
                s.read_pending = true;
                if !s.deferred {
                    s.deferred = true;
                    self.deferred.push_back(slot);
                }
                break;
            }
            if reads == READS_PER_TURN || s.spent_turn == self.turn {
                // Fairness: finish this turn for the others; the next turn resumes it.
                s.spent_turn = self.turn;
                s.read_pending = true;
                self.recheck.push(slot);
                break;
            }
            reads += 1;
            s.read_pending = false;
            let got = s.stream.read(scratch);
            if let Ok(n) = got {
                self.turn_bytes += n;
            }
            match got {
                Ok(0) => {
                    // EOF (perhaps only a half-close): answer what was asked, then close.
                    let id = ConnId::on_node(self.node, self.id, slot as u32, s.gen);
                    at_eof(&mut s.conn, id, &mut self.batch);
                    self.recheck.push(slot);
                    break;
                }
                Ok(n) if s.tls.is_some() => {
                    let id = ConnId::on_node(self.node, self.id, slot as u32, s.gen);
                    if s.tls_eof {
                        // Bytes after the client's close_notify count for nothing; what it sent
                        // before is parsed (the connection could parse): it is at its EOF.
                        at_eof(&mut s.conn, id, &mut self.batch);
                        self.recheck.push(slot);
                        break;
                    }
                    let cx = Cx {
                        config: &self.shared.config,
                        secrets: &self.secrets,
                    };
                    let Socket {
                        tls,
                        conn,
                        opened,
                        peer,
                        ..
                    } = s;
                    let Some(tls) = tls.as_mut() else {
                        break;
                    };
                    let input = &scratch[..n];
                    let got = tls_receive(tls, conn, opened, *peer, input, id, cx, &mut self.batch);
                    let got = match got {
                        Ok(got) => got,
                        Err(why) => {
                            if let Some(more) = self.tls_log.ready(crate::log::Level::Info) {
                                crate::log_info!(
                                    "closing a {} client: TLS: {why} ({more} more since the last line)",
                                    s.conn.proto.name()
                                );
                            }
                            // The alert rustls queued goes out if the socket takes it at once.
                            let _ = tls.write_tls(&mut s.stream);
                            self.close(slot);
                            break;
                        }
                    };
                    if got.fatal {
                        if let Some(more) = self.bad_input_log.ready(crate::log::Level::Info) {
                            crate::log_info!(
                                "closing a {} client for bad input ({more} more since the last line)",
                                s.conn.proto.name()
                            );
                        }
                    }
                    if s.conn.pending_output() > 0 || tls.wants_write() {
                        self.dirty.push(slot);
                    }
                    if got.eof {
                        // The client's close_notify: its EOF, once what it sent before is parsed
                        // (a backpressured connection gets there when it resumes).
                        s.tls_eof = true;
                        if s.conn.can_parse() {
                            at_eof(&mut s.conn, id, &mut self.batch);
                        } else {
                            s.read_pending = !s.conn.closing;
                        }
                        self.recheck.push(slot);
                        break;
                    }
                    if s.conn.closing {
                        self.recheck.push(slot);
                        break;
                    }
                }
                Ok(n) => {
                    let id = ConnId::on_node(self.node, self.id, slot as u32, s.gen);
                    let cx = Cx {
                        config: &self.shared.config,
                        secrets: &self.secrets,
                    };
                    let fatal = s.conn.receive(&scratch[..n], id, cx, &mut self.batch);
                    if fatal {
                        if let Some(more) = self.bad_input_log.ready(crate::log::Level::Info) {
                            crate::log_info!(
                                "closing a {} client for bad input ({more} more since the last line)",
                                s.conn.proto.name()
                            );
                        }
                    }
                    if s.conn.pending_output() > 0 {
                        self.dirty.push(slot);
                    }
                    if s.conn.closing {
                        self.recheck.push(slot);
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.close(slot);
                    break;
                }
            }
        }
    }

    /// Parse bytes already buffered, then read more if reading had stopped (backpressure cleared).
    fn resume(&mut self, slot: usize) {
        let Some(s) = self.sockets.get_mut(slot) else {
            return;
        };
        s.fresh_budget(self.turn);
        if self.batch.ops.len() >= TURN_REQUESTS {
            if !s.deferred {
                s.deferred = true;
                self.deferred.push_back(slot);
            }
            return;
        }
        if s.conn.parsable_buffered() {
            let id = ConnId::on_node(self.node, self.id, slot as u32, s.gen);
            let cx = Cx {
                config: &self.shared.config,
                secrets: &self.secrets,
            };
            s.conn.parse_buffered(id, cx, &mut self.batch);
            self.dirty.push(slot);
        }
        if s.conn.had_its_turn() && !s.conn.closing {
            // This turn's requests are parsed; the rest (buffered, or still in the socket)
            // waits for the next.
            s.read_pending = true;
            s.spent_turn = self.turn;
            self.recheck.push(slot);
            return;
        }
        if s.read_pending && s.conn.can_parse() {
            if s.tls_eof {
                // Everything the TLS client sent before its close_notify is parsed: its EOF.
                s.read_pending = false;
                let id = ConnId::on_node(self.node, self.id, slot as u32, s.gen);
                at_eof(&mut s.conn, id, &mut self.batch);
                self.recheck.push(slot);
                return;
            }
            self.read(slot);
        }
    }

    /// Cluster mode: whether this node is past the instant until which it may write the
    /// replies the log decided (`Shared::write_deadline_ms`): then it is cut off, or was
    /// stopped, and a connection with such a reply closes unanswered instead. (Replies already
    /// in a connection's buffer are written: a stop between the delivery and the write of one
    /// turn is the one window left.)
    fn cut_off(&self) -> bool {
        let deadline = self.shared.write_deadline_ms.load(Ordering::Relaxed);
        deadline != 0 && self.shared.started.elapsed().as_millis() as u64 >= deadline
    }

    fn apply_replies(&mut self) {
        while let Ok(replies) = self.from_owner.try_recv() {
            let arena = &replies.arena.bytes;
            let cut_off = self.cut_off();
            // A run of one session's effects (a pipeline's replies) goes to one connection (a
            // session's connection never changes), or nowhere, and finds its socket once. The
            // owner's direct effects (no-quorum answers, a fenced node's closes) carry no
            // session, so a run also ends where the connection changes.
            let routed = replies
                .effects
                .chunk_by(|a, b| a.to == b.to && a.conn == b.conn);
            for run in routed {
                let Some(conn) = run.first().and_then(|e| e.conn) else {
                    continue; // dropped by routing
                };
                let slot = conn.slot as usize;
                let Some(s) = self.sockets.get_mut(slot) else {
                    continue;
                };
                if s.gen != conn.gen {
                    continue; // the connection this was for is gone; its slot was reused
                }
                // Cut off, a node writes only its owner's own answers (no quorum: session 0),
                // nothing that the log decided.
                let stale = cut_off && run[0].to != crate::core::Session(0);
                let mut abort = stale;
                for effect in run.iter().take_while(|_| !stale) {
                    if matches!(effect.body, crate::server::effect::Body::Abort) {
                        abort = true;
                        break;
                    }
                    s.conn.deliver_effect(effect, arena);
                }
                if abort {
                    // Replies delivered or not, none is written: the connection goes now.
                    self.close(slot);
                    continue;
                }
                if s.conn.pending_output() > WBUF_MAX {
                    // Its client reads far slower than its requests produce replies (or not at
                    // all): holding more would let one connection take the daemon's memory.
                    self.close(slot);
                    continue;
                }
                self.dirty.push(slot);
                self.recheck.push(slot);
            }
            let Replies {
                effects,
                arena,
                spare_ops,
                spare_batch_arena,
            } = replies;
            self.pool_effects.give(effects);
            self.pool_reply_arena.give(arena.bytes);
            self.pool_ops.give(spare_ops);
            self.pool_batch_arena.give(spare_batch_arena);
        }
    }

    fn end_turn(&mut self) {
        // Write every touched connection once.
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        for &slot in &dirty {
            self.flush(slot);
        }
        dirty.clear();
        self.dirty = dirty;

        // Connections whose backpressure may have cleared, or that may close now.
        let mut recheck = std::mem::take(&mut self.recheck);
        recheck.sort_unstable();
        recheck.dedup();
        for &slot in &recheck {
            let Some(s) = self.sockets.get_mut(slot) else {
                continue;
            };
            let id = ConnId::on_node(self.node, self.id, slot as u32, s.gen);
            s.conn.continue_dump(id, &mut self.batch);
            if s.conn.closing {
                // A TLS connection's last records may still wait in rustls (the write buffer
                // empties into it before the socket has taken them).
                if s.conn.finished() && !s.tls.as_ref().is_some_and(|t| t.wants_write()) {
                    self.close(slot);
                }
            } else if s.read_pending || !s.conn.rbuf.is_empty() {
                self.resume(slot);
                self.flush(slot);
            }
        }
        // The pass itself may have queued connections for the next turn (a resumed read that
        // met EOF, a flush that drained a closing connection): keep them, or they wait forever.
        recheck.clear();
        recheck.append(&mut self.recheck);
        self.recheck = recheck;

        if !self.batch.ops.is_empty() {
            let next = Batch {
                worker: self.id,
                ops: self.pool_ops.take(),
                arena: Arena {
                    bytes: self.pool_batch_arena.take(),
                },
                ..Batch::default()
            };
            let mut full = std::mem::replace(&mut self.batch, next);
            full.spare_effects = self.pool_effects.take();
            full.spare_reply_arena = self.pool_reply_arena.take();
            let delivered = match self.inline.as_mut() {
                Some(owner) => owner.step_inline(Some(full)),
                None => {
                    // Counted until the owner takes it: the queue `/metrics` shows.
                    let n = full.ops.len() as u64;
                    let queued = self.shared.owner_queue.fetch_add(n, Ordering::Relaxed) + n;
                    self.shared
                        .owner_queue_peak
                        .fetch_max(queued, Ordering::Relaxed);
                    self.to_owner.send(ToOwner::Batch(full)).is_ok()
                }
            };
            if !delivered {
                // The owner is gone or stopping: so is the daemon.
                self.shared.shutdown.store(true, Ordering::Release);
            }
        }
    }

    /// Write as much as the socket takes; ask for WRITABLE only while bytes remain.
    fn flush(&mut self, slot: usize) {
        let Some(s) = self.sockets.get_mut(slot) else {
            return;
        };
        let ok = match s.tls.as_mut() {
            Some(tls) => tls_flush(tls, &mut s.stream, &mut s.conn, &mut s.sent),
            None => plain_flush(&mut s.stream, &mut s.conn, &mut s.sent),
        };
        if !ok {
            return self.close(slot);
        }
        let drained =
            s.conn.pending_output() == 0 && !s.tls.as_ref().is_some_and(|t| t.wants_write());
        if !drained
            && s.stall.is_none()
            && self.stall_timeout.is_some()
            && (s.conn.pending_output() >= WBUF_HIGH || s.conn.closing)
        {
            // The socket is full and the client's replies pile up (or a closing connection waits
            // for its client to take the last ones): watch it. Cheap: only reached on WouldBlock.
            let now = Instant::now();
            if self.stalled.is_empty() {
                self.next_stall_check = now + STALL_CHECK;
            }
            s.stall = Some(Stall {
                since: now,
                mark: s.sent,
            });
            self.stalled.push((slot, s.gen));
        }
        if drained == s.write_interest {
            let interest = if drained {
                Interest::READABLE
            } else {
                Interest::READABLE | Interest::WRITABLE
            };
            let token = Token(slot + FIRST_CONN);
            if self
                .poll
                .registry()
                .reregister(&mut s.stream, token, interest)
                .is_err()
            {
                return self.close(slot);
            }
            s.write_interest = !drained;
        }
        if drained
            && (s.conn.closing
                || s.read_pending && s.conn.can_parse()
                || s.conn.parsable_buffered())
        {
            // Only a connection that can go on: one held back by its requests in flight is
            // looked at again when their replies arrive (`apply_replies`), one with half a
            // request when the rest arrives, and until then the worker sleeps instead of
            // polling for it without end.
            self.recheck.push(slot);
        } else if s.conn.dump == conn::Dump::Waiting && s.conn.pending_output() < WBUF_HIGH {
            // A key dump paused for its reader may go on (only then: no spinning while the
            // client reads nothing).
            self.recheck.push(slot);
        }
    }

    /// Look at the stalled connections: drop those that drained or are gone, reset the clock of
    /// those that made progress, close those that made none for the stall timeout.
    fn check_stalled(&mut self, now: Instant) {
        let Some(timeout) = self.stall_timeout else {
            return;
        };
        let mut expired = Vec::new();
        let sockets = &mut self.sockets;
        self.stalled.retain(|&(slot, gen)| {
            let Some(s) = sockets.get_mut(slot).filter(|s| s.gen == gen) else {
                return false; // closed meanwhile (its slot may hold another connection now)
            };
            let pending = s.conn.pending_output();
            // A closing TLS connection may have all its output inside rustls.
            let unsent = pending > 0 || s.tls.as_ref().is_some_and(|t| t.wants_write());
            let still = unsent && (pending >= STALL_LOW || s.conn.closing);
            let Some(stall) = s.stall.as_mut().filter(|_| still) else {
                s.stall = None;
                return false;
            };
            if s.sent != stall.mark {
                stall.mark = s.sent;
                stall.since = now;
                true
            } else if now.duration_since(stall.since) >= timeout {
                expired.push(slot);
                false
            } else {
                true
            }
        });
        for slot in expired {
            if let Some(more) = self.stall_log.ready(crate::log::Level::Info) {
                crate::log_info!(
                    "closed a client that took none of its replies for {} ms ({more} more since the last line)",
                    timeout.as_millis()
                );
            }
            self.close(slot);
        }
    }

    fn close(&mut self, slot: usize) {
        let Some(mut s) = self.sockets.try_remove(slot) else {
            return;
        };
        let _ = self.poll.registry().deregister(&mut s.stream);
        self.gens[slot] = s.gen.wrapping_add(1);
        self.shared.curr_connections.fetch_sub(1, Ordering::Relaxed);
        self.shared.open_per_listener[s.conn.proto.index()].fetch_sub(1, Ordering::Relaxed);
        if let Some(tls) = s.tls.as_mut().filter(|_| s.opened) {
            // A courtesy: tell a TLS client the close is deliberate, if the socket takes it now.
            tls.send_close_notify();
            let _ = tls.write_tls(&mut s.stream);
        }
        if !s.opened {
            return; // the owner never heard of it (a TLS handshake that did not finish)
        }
        let conn = ConnId::on_node(self.node, self.id, slot as u32, s.gen);
        self.batch.ops.push(OpMsg {
            conn,
            op: Op::Close,
        });
    }
}

/// Bind an address's one listening socket, which every worker then accepts on (a duplicate of
/// its descriptor each). SO_REUSEADDR only (a restart may bind while old connections linger in
/// TIME_WAIT), never SO_REUSEPORT: with it a second daemon started on the same address would
/// bind beside this one, and the kernel would spread new clients over two lock tables.
pub fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    // memcached's default backlog is 1024; deep enough for a burst of reconnecting clients.
    socket.listen(1024)?;
    Ok(socket.into())
}

/// Queue a connection's opening for the owner: from now on its requests are parsed.
fn push_open(batch: &mut Batch, conn: ConnId, s: &mut Socket) {
    s.opened = true;
    open_op(batch, conn, s.conn.proto, s.peer);
}

fn open_op(batch: &mut Batch, conn: ConnId, proto: Proto, peer: SocketAddr) {
    batch.ops.push(OpMsg {
        conn,
        op: Op::Open { proto, peer },
    });
    if proto == Proto::Dlock {
        batch.ops.push(OpMsg {
            conn,
            op: Op::DlockOpen,
        });
    }
}

/// The client's requests ended (EOF, or a TLS close_notify): answer what was asked, then close.
/// A dlock Lock that waits forever would never let that happen: tell the owner.
#[inline]
fn at_eof(conn: &mut Conn, id: ConnId, batch: &mut Batch) {
    conn.closing = true;
    if conn.proto == Proto::Dlock && conn.inflight > 0 {
        batch.ops.push(OpMsg {
            conn: id,
            op: Op::Eof,
        });
    }
}

/// What feeding a TLS connection's ciphertext did (a failed handshake, a bad record or bytes
/// that are not TLS at all are an `Err`: close, after the alert rustls queued).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TlsRead {
    /// The client's close_notify arrived: it sends no more requests.
    pub eof: bool,
    /// The plaintext held bad input: the connection closes once its output is written.
    pub fatal: bool,
}

/// Feed ciphertext just read to rustls, and parse the plaintext it yields straight out of
/// rustls's own buffer (each decrypted record in place, borrowed), as plain connections parse out
/// of `scratch`.
/// The connection is opened to the owner (`opened`) the moment its handshake ends, before any of
/// its plaintext is parsed: a client's first request often shares a read with its Finished.
/// The worker's receive path of every TLS connection; [`TlsBoundary`] runs it without a socket.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tls_receive(
    tls: &mut rustls::ServerConnection,
    conn: &mut Conn,
    opened: &mut bool,
    peer: SocketAddr,
    mut input: &[u8],
    id: ConnId,
    cx: Cx<'_>,
    batch: &mut Batch,
) -> Result<TlsRead, String> {
    use std::io::BufRead;
    let mut got = TlsRead::default();
    while !input.is_empty() {
        match tls.read_tls(&mut input) {
            // After the client's close_notify nothing more counts (rustls takes no bytes).
            Ok(0) if got.eof => break,
            Ok(0) => return Err("rustls took no bytes".into()),
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
        if let Err(e) = tls.process_new_packets() {
            return Err(e.to_string());
        }
        if !*opened && !tls.is_handshaking() {
            *opened = true;
            open_op(batch, id, conn.proto, peer);
        }
        loop {
            let mut reader = tls.reader();
            match reader.fill_buf() {
                Ok([]) => {
                    // close_notify, and everything before it taken.
                    got.eof = true;
                    break;
                }
                Ok(chunk) => {
                    let n = chunk.len();
                    // Bytes after a fatal request are discarded, as on plain TCP.
                    if !conn.closing {
                        got.fatal |= conn.receive(chunk, id, cx, batch);
                    }
                    reader.consume(n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e.to_string()),
            }
        }
    }
    Ok(got)
}

/// Write a plain connection's output until the socket takes no more. False: close it.
fn plain_flush(stream: &mut TcpStream, conn: &mut Conn, sent: &mut u64) -> bool {
    while conn.pending_output() > 0 {
        match stream.write(conn.output()) {
            Ok(0) => return false,
            Ok(n) => {
                conn.written(n);
                *sent += n as u64;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
    true
}

/// Encrypt a TLS connection's output into rustls (up to its buffer limit) and write the records
/// until the socket takes no more. False: close it.
pub(crate) fn tls_flush(
    tls: &mut rustls::ServerConnection,
    stream: &mut impl Write,
    conn: &mut Conn,
    sent: &mut u64,
) -> bool {
    loop {
        if conn.pending_output() > 0 && !tls.is_handshaking() {
            match tls.writer().write(conn.output()) {
                Ok(n) => conn.written(n),
                Err(_) => return false,
            }
        }
        if !tls.wants_write() {
            return true;
        }
        while tls.wants_write() {
            match tls.write_tls(stream) {
                Ok(0) => return false,
                Ok(n) => *sent += n as u64,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
        if conn.pending_output() == 0 {
            return true;
        }
    }
}

/// The waker token, for the server module.
pub fn waker(poll: &Poll) -> io::Result<Waker> {
    Waker::new(poll.registry(), WAKER)
}

#[cfg(test)]
mod tests;
