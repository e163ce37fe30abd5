//! One I/O worker thread: a mio event loop that owns its connections.
//!
//! It accepts on its own listeners (SO_REUSEPORT: the kernel spreads connections over workers),
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

mod conn;
mod decode;
pub(crate) mod encode;

pub use conn::{MAX_INFLIGHT, REPLY_BUDGET, WBUF_HIGH, WBUF_MAX};
pub use decode::VERSION_REPLY;

use super::effect::Effect;
use super::msg::{Arena, Batch, Op, OpMsg, Pool, Replies, ToOwner};
use super::owner::Owner;
use super::{Proto, Shared};
use crate::server::msg::ConnId;
pub(super) use conn::{Conn, Dump};

const WAKER: Token = Token(0);
/// Listener tokens are 1..=3 (one per protocol); connection tokens start here.
const FIRST_CONN: usize = 16;
/// Bytes read per `read` call into the worker's scratch buffer. Large enough for a deep pipeline
/// of small requests in one syscall.
const READ_CHUNK: usize = 64 * 1024;
/// Reads of one connection per loop turn before the worker moves on to the others (the rest is
/// read next turn, which then comes at once). Without a bound, a client that sends faster than
/// the worker parses requests that need no reply room and nothing at the owner (`verbosity
/// noreply`, a value being swallowed) kept the worker in its read loop, every other connection
/// of that worker waiting. 4 x 64 KiB: about a millisecond of parsing, and a deep pipeline
/// still takes few turns.
const READS_PER_TURN: usize = 4;
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
    /// Stopped reading before WouldBlock (backpressure): read again when it clears.
    read_pending: bool,
    write_interest: bool,
    /// Reply bytes written to the socket so far: a stalled connection whose count moved made
    /// progress.
    sent: u64,
    /// Set while the connection is on the worker's stalled list.
    stall: Option<Stall>,
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
    listeners: Vec<(TcpListener, Proto)>,
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
    /// Connections written to this turn (flushed once at its end).
    dirty: Vec<usize>,
    /// Connections to look at again at the end of the turn (closing, read pending).
    recheck: Vec<usize>,
    accept_paused: bool,
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
}

impl Worker {
    pub fn new(
        id: u16,
        shared: Arc<Shared>,
        poll: Poll,
        listeners: Vec<(TcpListener, Proto)>,
        to_owner: Sender<ToOwner>,
        from_owner: Receiver<Replies>,
    ) -> io::Result<Worker> {
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
            dirty: Vec::new(),
            recheck: Vec::new(),
            accept_paused: false,
            stalled: Vec::new(),
            next_stall_check: Instant::now(),
            stall_timeout: None,
            limit_logged: false,
            fds_logged: false,
            stall_log: Default::default(),
            bad_input_log: Default::default(),
        };
        let ms = worker.shared.config.client_stall_timeout_ms;
        worker.stall_timeout = (ms > 0).then(|| Duration::from_millis(ms));
        for (i, (l, _)) in worker.listeners.iter_mut().enumerate() {
            worker
                .poll
                .registry()
                .register(l, Token(1 + i), Interest::READABLE)?;
        }
        Ok(worker)
    }

    /// Run `owner` in this worker's own loop (the only worker; see [`Owner::step_inline`]).
    pub fn run_owner_inline(&mut self, owner: Owner) {
        self.inline = Some(Box::new(owner));
    }

    pub fn run(mut self) {
        let mut events = Events::with_capacity(EVENTS);
        loop {
            // Connections left to look at again (found while finishing the last turn) must not
            // wait for an unrelated event.
            let replies_left = self.inline.is_some() && !self.from_owner.is_empty();
            let mut timeout = if !self.recheck.is_empty() || !self.dirty.is_empty() || replies_left
            {
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
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != ErrorKind::Interrupted {
                    eprintln!("holdfast: worker {}: poll failed: {e}", self.id);
                    break;
                }
            }
            if self.shared.shutdown.load(Ordering::Acquire) {
                break;
            }
            // One clock read per turn (vDSO, no syscall), none per request: the owner's latency
            // histograms count each lock request of this turn's batch from here.
            self.batch.stamp = Some(Instant::now());
            if self.accept_paused {
                self.accept_paused = false;
                for i in 0..self.listeners.len() {
                    self.accept(i);
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
                    break;
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
        }
        // Shutdown: drop every connection; the process is exiting.
        self.sockets.clear();
    }

    fn accept(&mut self, index: usize) {
        let Some(&(_, proto)) = self.listeners.get(index) else {
            return;
        };
        loop {
            match self.listeners[index].0.accept() {
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
                    self.add_socket(stream, proto, peer);
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

    fn add_socket(&mut self, mut stream: TcpStream, proto: Proto, peer: SocketAddr) {
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
        entry.insert(Socket {
            stream,
            gen,
            conn: Conn::new(proto),
            read_pending: false,
            write_interest: false,
            sent: 0,
            stall: None,
        });
        let conn = ConnId::on_node(self.node, self.id, slot as u32, gen);
        self.batch.ops.push(OpMsg {
            conn,
            op: Op::Open { proto, peer },
        });
        if proto == Proto::Dlock {
            self.batch.ops.push(OpMsg {
                conn,
                op: Op::DlockOpen,
            });
        }
    }

    /// Read until WouldBlock (or backpressure, or this turn's share), parsing as bytes arrive.
    fn read(&mut self, slot: usize) {
        let scratch = &mut self.scratch;
        let mut reads = 0;
        while let Some(s) = self.sockets.get_mut(slot) {
            if !s.conn.can_parse() {
                s.read_pending = !s.conn.closing;
                break;
            }
            if reads == READS_PER_TURN {
                // Fairness: finish this turn for the others; the end of the turn resumes it.
                s.read_pending = true;
                self.recheck.push(slot);
                break;
            }
            reads += 1;
            s.read_pending = false;
            match s.stream.read(scratch) {
                Ok(0) => {
                    // EOF (perhaps only a half-close): answer what was asked, then close. A dlock
                    // Lock that waits forever would never let that happen: tell the owner.
                    s.conn.closing = true;
                    if s.conn.proto == Proto::Dlock && s.conn.inflight > 0 {
                        let conn = ConnId::on_node(self.node, self.id, slot as u32, s.gen);
                        self.batch.ops.push(OpMsg { conn, op: Op::Eof });
                    }
                    self.recheck.push(slot);
                    break;
                }
                Ok(n) => {
                    let id = ConnId::on_node(self.node, self.id, slot as u32, s.gen);
                    let fatal =
                        s.conn
                            .receive(&scratch[..n], id, &self.shared.config, &mut self.batch);
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
        if !s.conn.rbuf.is_empty() && s.conn.can_parse() {
            let id = ConnId::on_node(self.node, self.id, slot as u32, s.gen);
            s.conn
                .parse_buffered(id, &self.shared.config, &mut self.batch);
            self.dirty.push(slot);
        }
        if s.read_pending && s.conn.can_parse() {
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
                if s.conn.finished() {
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
                None => self.to_owner.send(ToOwner::Batch(full)).is_ok(),
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
        while s.conn.pending_output() > 0 {
            match s.stream.write(s.conn.output()) {
                Ok(0) => return self.close(slot),
                Ok(n) => {
                    s.conn.written(n);
                    s.sent += n as u64;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return self.close(slot),
            }
        }
        let drained = s.conn.pending_output() == 0;
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
        if drained && (s.conn.closing || s.read_pending || !s.conn.rbuf.is_empty()) {
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
            let still = pending > 0 && (pending >= STALL_LOW || s.conn.closing);
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
        let conn = ConnId::on_node(self.node, self.id, slot as u32, s.gen);
        self.batch.ops.push(OpMsg {
            conn,
            op: Op::Close,
        });
    }
}

/// Bind one listener socket for a worker: SO_REUSEADDR and SO_REUSEPORT so that every worker can
/// bind the same address and the kernel spreads connections over them.
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    // memcached's default backlog is 1024; deep enough for a burst of reconnecting clients.
    socket.listen(1024)?;
    Ok(TcpListener::from_std(socket.into()))
}

/// The waker token, for the server module.
pub fn waker(poll: &Poll) -> io::Result<Waker> {
    Waker::new(poll.registry(), WAKER)
}
