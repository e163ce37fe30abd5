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

use std::io::{self, ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use slab::Slab;

use super::decode;
use super::msg::{Batch, Op, OpMsg, Replies, ToOwner};
use super::{Proto, Shared};
use crate::core::ConnId;

const WAKER: Token = Token(0);
/// Listener tokens are 1..=3 (one per protocol); connection tokens start here.
const FIRST_CONN: usize = 16;
/// Bytes read per `read` call into the worker's scratch buffer. Large enough for a deep pipeline
/// of small requests in one syscall.
const READ_CHUNK: usize = 64 * 1024;
/// Operations of one connection that may be at the owner at once before the worker stops parsing
/// that connection (backpressure; bounds owner-side memory per connection).
pub const MAX_INFLIGHT: u32 = 1024;
/// Reply bytes a connection may have waiting for its client before the worker stops parsing it.
/// The client then has to read before it may send more.
pub const WBUF_HIGH: usize = 4 * 1024 * 1024;
/// Buffers larger than this are released once empty, so idle connections stay small.
const KEEP_BUF: usize = 16 * 1024;
/// Events per `poll` call.
const EVENTS: usize = 1024;
/// How long accept waits after running out of file descriptors before it tries again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

pub struct Conn {
    stream: TcpStream,
    pub proto: Proto,
    gen: u32,
    /// Received bytes not yet parsed (empty most of the time: whole requests are parsed straight
    /// out of the worker's scratch buffer).
    pub rbuf: Vec<u8>,
    /// memcached text: how far the first line was already searched for its end.
    pub scanned: usize,
    /// Bytes still to be discarded (the rest of a refused, oversized request).
    pub skip: usize,
    wbuf: Vec<u8>,
    wpos: usize,
    /// Operations sent to the owner and not answered yet.
    pub inflight: u32,
    /// Close once everything in flight is answered and written (quit, EOF, fatal input).
    pub closing: bool,
    /// Stopped reading before WouldBlock (backpressure): read again when it clears.
    read_pending: bool,
    write_interest: bool,
}

impl Conn {
    /// Queue bytes the worker answers itself: straight to the write buffer when nothing is in
    /// flight, else through the owner so the reply keeps its place in the connection's order.
    pub fn emit(&mut self, bytes: &[u8], close: bool, id: ConnId, batch: &mut Batch) {
        if self.inflight == 0 {
            self.wbuf.extend_from_slice(bytes);
            if close {
                self.closing = true;
            }
        } else {
            let span = batch.arena.push(bytes);
            batch.ops.push(OpMsg {
                conn: id,
                op: Op::Literal { bytes: span, close },
            });
            self.inflight += 1;
        }
    }

    fn pending_output(&self) -> usize {
        self.wbuf.len() - self.wpos
    }

    /// May more requests be parsed now?
    pub fn can_parse(&self) -> bool {
        !self.closing && self.inflight < MAX_INFLIGHT && self.pending_output() < WBUF_HIGH
    }
}

pub struct Worker {
    id: u16,
    shared: Arc<Shared>,
    poll: Poll,
    listeners: Vec<(TcpListener, Proto)>,
    conns: Slab<Conn>,
    /// Generation of each slab slot, bumped on close; indexed by slot.
    gens: Vec<u32>,
    to_owner: Sender<ToOwner>,
    from_owner: Receiver<Replies>,
    batch: Batch,
    scratch: Vec<u8>,
    /// Connections written to this turn (flushed once at its end).
    dirty: Vec<usize>,
    /// Connections to look at again at the end of the turn (closing, read pending).
    recheck: Vec<usize>,
    accept_paused: bool,
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
            shared,
            poll,
            listeners,
            conns: Slab::new(),
            gens: Vec::new(),
            to_owner,
            from_owner,
            batch: Batch {
                worker: id,
                ..Batch::default()
            },
            scratch: vec![0; READ_CHUNK],
            dirty: Vec::new(),
            recheck: Vec::new(),
            accept_paused: false,
        };
        for (i, (l, _)) in worker.listeners.iter_mut().enumerate() {
            worker
                .poll
                .registry()
                .register(l, Token(1 + i), Interest::READABLE)?;
        }
        Ok(worker)
    }

    pub fn run(mut self) {
        let mut events = Events::with_capacity(EVENTS);
        loop {
            // Connections left to look at again (found while finishing the last turn) must not
            // wait for an unrelated event.
            let timeout = if !self.recheck.is_empty() || !self.dirty.is_empty() {
                Some(Duration::ZERO)
            } else {
                self.accept_paused.then_some(ACCEPT_BACKOFF)
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != ErrorKind::Interrupted {
                    eprintln!("holdfast: worker {}: poll failed: {e}", self.id);
                    break;
                }
            }
            if self.shared.shutdown.load(Ordering::Acquire) {
                break;
            }
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
                            self.mark_dirty(slot);
                        }
                        if event.is_readable() || event.is_read_closed() {
                            self.read(slot);
                        }
                    }
                }
            }
            self.apply_replies();
            self.end_turn();
        }
        // Shutdown: drop every connection; the process is exiting.
        self.conns.clear();
    }

    fn accept(&mut self, index: usize) {
        let Some(&(_, proto)) = self.listeners.get(index) else {
            return;
        };
        loop {
            match self.listeners[index].0.accept() {
                Ok((stream, _)) => {
                    let shared = &self.shared;
                    let open = shared.curr_connections.fetch_add(1, Ordering::Relaxed);
                    if open >= shared.config.max_connections as u64 {
                        shared.curr_connections.fetch_sub(1, Ordering::Relaxed);
                        shared.rejected_connections.fetch_add(1, Ordering::Relaxed);
                        drop(stream);
                        continue;
                    }
                    shared.total_connections.fetch_add(1, Ordering::Relaxed);
                    let _ = stream.set_nodelay(true);
                    self.add_conn(stream, proto);
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
                        self.accept_paused = true;
                        return;
                    }
                }
            }
        }
    }

    fn add_conn(&mut self, mut stream: TcpStream, proto: Proto) {
        let entry = self.conns.vacant_entry();
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
        entry.insert(Conn {
            stream,
            proto,
            gen,
            rbuf: Vec::new(),
            scanned: 0,
            skip: 0,
            wbuf: Vec::new(),
            wpos: 0,
            inflight: 0,
            closing: false,
            read_pending: false,
            write_interest: false,
        });
        if proto == Proto::Dlock {
            let conn = self.conn_id(slot, gen);
            self.batch.ops.push(OpMsg {
                conn,
                op: Op::DlockOpen,
            });
        }
    }

    fn conn_id(&self, slot: usize, gen: u32) -> ConnId {
        ConnId::new(self.id, slot as u32, gen)
    }

    /// Read until WouldBlock (or backpressure), parsing as bytes arrive.
    fn read(&mut self, slot: usize) {
        let mut scratch = std::mem::take(&mut self.scratch);
        while let Some(conn) = self.conns.get_mut(slot) {
            if !conn.can_parse() {
                conn.read_pending = !conn.closing;
                break;
            }
            conn.read_pending = false;
            let result = if conn.rbuf.is_empty() {
                conn.stream.read(&mut scratch)
            } else {
                read_append(&mut conn.stream, &mut conn.rbuf)
            };
            match result {
                Ok(0) => {
                    // EOF (perhaps only a half-close): answer what was asked, then close.
                    conn.closing = true;
                    self.recheck.push(slot);
                    break;
                }
                Ok(n) => {
                    let id = ConnId::new(self.id, slot as u32, conn.gen);
                    let from_scratch = conn.rbuf.is_empty();
                    let fatal = if from_scratch {
                        let (consumed, fatal) = decode::parse(
                            conn,
                            &scratch[..n],
                            id,
                            &self.shared.config,
                            &mut self.batch,
                        );
                        if !fatal && consumed < n {
                            conn.rbuf.extend_from_slice(&scratch[consumed..n]);
                        }
                        fatal
                    } else {
                        let data = std::mem::take(&mut conn.rbuf);
                        let (consumed, fatal) =
                            decode::parse(conn, &data, id, &self.shared.config, &mut self.batch);
                        conn.rbuf = data;
                        conn.rbuf.drain(..consumed);
                        if conn.rbuf.is_empty() && conn.rbuf.capacity() > KEEP_BUF {
                            conn.rbuf = Vec::new();
                        }
                        fatal
                    };
                    if conn.pending_output() > 0 {
                        self.dirty.push(slot);
                    }
                    if fatal || conn.closing {
                        conn.closing = true;
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
        self.scratch = scratch;
    }

    /// Parse bytes already buffered (after backpressure cleared).
    fn reparse(&mut self, slot: usize) {
        let Some(conn) = self.conns.get_mut(slot) else {
            return;
        };
        if !conn.rbuf.is_empty() && conn.can_parse() {
            let id = ConnId::new(self.id, slot as u32, conn.gen);
            let data = std::mem::take(&mut conn.rbuf);
            let (consumed, fatal) =
                decode::parse(conn, &data, id, &self.shared.config, &mut self.batch);
            conn.rbuf = data;
            conn.rbuf.drain(..consumed);
            if fatal {
                conn.closing = true;
            }
            self.dirty.push(slot);
        }
        let Some(conn) = self.conns.get_mut(slot) else {
            return;
        };
        if conn.read_pending && conn.can_parse() {
            self.read(slot);
        }
    }

    fn mark_dirty(&mut self, slot: usize) {
        self.dirty.push(slot);
    }

    fn apply_replies(&mut self) {
        while let Ok(replies) = self.from_owner.try_recv() {
            let arena = &replies.arena.bytes;
            for rec in &replies.records {
                let slot = rec.conn.slot as usize;
                let Some(conn) = self.conns.get_mut(slot) else {
                    continue;
                };
                if conn.gen != rec.conn.gen {
                    continue; // the connection this was for is gone; its slot was reused
                }
                conn.wbuf.extend_from_slice(rec.bytes.get(arena));
                debug_assert!(conn.inflight >= rec.done as u32, "reply without a request");
                conn.inflight = conn.inflight.saturating_sub(rec.done as u32);
                if rec.close {
                    conn.closing = true;
                }
                self.dirty.push(slot);
                self.recheck.push(slot);
            }
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
            let Some(conn) = self.conns.get(slot) else {
                continue;
            };
            if conn.closing {
                if conn.inflight == 0 && conn.pending_output() == 0 {
                    self.close(slot);
                }
            } else if conn.read_pending || !conn.rbuf.is_empty() {
                self.reparse(slot);
                self.flush(slot);
            }
        }
        recheck.clear();
        self.recheck = recheck;

        if !self.batch.ops.is_empty() {
            let batch = Batch {
                worker: self.id,
                ops: Vec::with_capacity(self.batch.ops.len()),
                arena: super::msg::Arena {
                    bytes: Vec::with_capacity(self.batch.arena.bytes.len()),
                },
            };
            let full = std::mem::replace(&mut self.batch, batch);
            if self.to_owner.send(ToOwner::Batch(full)).is_err() {
                // The owner is gone: the daemon is stopping.
                self.shared.shutdown.store(true, Ordering::Release);
            }
        }
    }

    /// Write as much as the socket takes; ask for WRITABLE only while bytes remain.
    fn flush(&mut self, slot: usize) {
        let Some(conn) = self.conns.get_mut(slot) else {
            return;
        };
        while conn.wpos < conn.wbuf.len() {
            match conn.stream.write(&conn.wbuf[conn.wpos..]) {
                Ok(0) => {
                    self.close(slot);
                    return;
                }
                Ok(n) => conn.wpos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.close(slot);
                    return;
                }
            }
        }
        let drained = conn.wpos == conn.wbuf.len();
        if drained {
            conn.wbuf.clear();
            conn.wpos = 0;
            if conn.wbuf.capacity() > KEEP_BUF {
                conn.wbuf = Vec::new();
            }
        }
        let want_write = !drained;
        if want_write != conn.write_interest {
            let interest = if want_write {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            let token = Token(slot + FIRST_CONN);
            if self
                .poll
                .registry()
                .reregister(&mut conn.stream, token, interest)
                .is_err()
            {
                self.close(slot);
                return;
            }
            conn.write_interest = want_write;
        }
        if drained && (conn.closing || conn.read_pending || !conn.rbuf.is_empty()) {
            self.recheck.push(slot);
        }
    }

    fn close(&mut self, slot: usize) {
        let Some(mut conn) = self.conns.try_remove(slot) else {
            return;
        };
        let _ = self.poll.registry().deregister(&mut conn.stream);
        self.gens[slot] = conn.gen.wrapping_add(1);
        self.shared.curr_connections.fetch_sub(1, Ordering::Relaxed);
        let id = self.conn_id(slot, conn.gen);
        self.batch.ops.push(OpMsg {
            conn: id,
            op: Op::Close,
        });
    }
}

/// Read into the spare capacity of `buf`, growing it by one chunk.
fn read_append(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    let len = buf.len();
    buf.resize(len + READ_CHUNK, 0);
    let result = stream.read(&mut buf[len..]);
    let n = *result.as_ref().unwrap_or(&0);
    buf.truncate(len + n);
    result
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
