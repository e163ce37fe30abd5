//! One client thread: a mio event loop over a slab of connections (rpc-perf's worker shape).
//!
//! Owns: its connections, the schedule of its operations, their latencies and error counts.
//! Sends the main thread one [`Report::Window`] per second and one [`Report::Done`] at the end.
//!
//! Timing (no coordinated omission): every operation has an *intended* start time. Closed loop:
//! the moment a pipeline slot of a connection became free. Open loop (`--rate`): op `i` of this
//! thread is due at `start + i / rate`, whatever the server did; when no connection has a free
//! slot the op waits, and its latency still counts from when it was due. Latency is recorded
//! when the op's last reply arrives. The latency of ops intended in `[warmup end, end)` is
//! measured; the rate counts ops completed in that window. After the end, an open loop's backlog
//! (ops due before the end, not sent yet) still goes out during the drain, timed from when it was
//! due; what remains unsent is reported, never silently dropped.
//!
//! Contended (old ACQ, closed loop): each connection ACQs its name (connection index modulo
//! `--keys`); when granted it sends REL at once, and after RELEASED it ACQs again. Hand-off
//! latency is from a REL being written to the next ACQUIRED at the waiter it granted; a wake-up
//! is a readable event at a connection waiting for its grant (counted as at least one per grant).
//!
//! Must not: allocate per request or reply (buffers are reused; only the first few error
//! descriptions are formatted), block (sockets are non-blocking), or run past its deadline plus
//! [`DRAIN`].

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::TcpStream as StdStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use holdfast::proto::lockd;
use holdfast::rng::Rng;
use holdfast::tls::rustls;

use crate::codec::{self, check_reply, describe, encode, Checked, Expect, Protocol, Req};
use crate::config::{Config, Workload};
use crate::histogram::Histogram;

/// After the end, in-flight operations get this long to complete before connections close.
pub const DRAIN: Duration = Duration::from_secs(1);
/// Connecting one connection may take this long (loopback connects in microseconds).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Progress window.
pub const WINDOW_NS: u64 = 1_000_000_000;
/// Error descriptions kept per thread; the rest are only counted.
pub const ERRORS_SHOWN: usize = 5;
/// Bytes read per `read` call.
const READ_CHUNK: usize = 64 * 1024;
/// Upper bound on one poll's sleep, so that deadlines are noticed even without traffic.
const MAX_POLL: Duration = Duration::from_millis(100);
/// The timerfd's token: open-loop ops are scheduled with a timerfd in the same epoll set, because
/// epoll's own timeout has millisecond resolution (ops would leave up to 1 ms late), a nanosleep
/// would delay replies arriving meanwhile, and spinning would take a core from the server.
const TIMER: Token = Token(usize::MAX);

/// Everything the threads share, fixed before they start.
pub struct Shared {
    pub config: Config,
    /// Key (or name) prefix: makes the keys of this run distinct where leftovers of an earlier
    /// run could not be cleared (lock tables).
    pub prefix: Vec<u8>,
    pub value: Vec<u8>,
    /// Contended: nanoseconds since the epoch at which the last REL of each name was written.
    pub rel_sent: Vec<AtomicU64>,
}

/// One thread's share of the connections: global indexes `first..first + count`.
pub struct Assignment {
    pub thread: usize,
    pub first: usize,
    pub count: usize,
}

pub enum Report {
    /// Connected (or not), before the start.
    Connected {
        thread: usize,
        result: Result<(), String>,
    },
    Window {
        index: u64,
        ops: u64,
        errors: u64,
        hist: Box<Histogram>,
    },
    Done(Box<ThreadResult>),
}

#[derive(Default)]
pub struct ThreadResult {
    /// Latency of measured ops (hand-off latency for contended), nanoseconds.
    pub hist: Histogram,
    /// Ops completed without error within the measured window (grants for contended).
    pub ops: u64,
    pub errors: u64,
    pub first_errors: Vec<String>,
    /// Open loop: ops due before the end that were never sent (no free connection).
    pub unsent: u64,
    /// Ops still in flight when the drain time ran out.
    pub unfinished: u64,
    /// Contended, measured: grants after waiting, and the wake-ups they took.
    pub handoffs: u64,
    pub wakeups: u64,
}

/// The start signal: the common epoch and the phase boundaries (ns since the epoch), or `None`
/// to give up (another thread could not connect).
#[derive(Clone, Copy)]
pub struct Start {
    pub epoch: Instant,
    pub warm_ns: u64,
    pub end_ns: u64,
}

struct Pending {
    expect: Expect,
    /// Intended start of the op, ns since the epoch.
    start_ns: u64,
    /// The op's last request: its reply completes the op.
    last: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Contend {
    Idle,
    /// ACQ sent, nothing back yet.
    Acquiring,
    /// ACK received: queued behind the holder.
    Waiting,
    /// REL sent.
    Releasing,
}

struct Conn {
    stream: TcpStream,
    /// `--tls`: requests go through rustls on their way out, replies on their way in.
    tls: Option<Box<rustls::ClientConnection>>,
    global: u64,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    /// Bytes of `wbuf` already written.
    wpos: usize,
    writable_interest: bool,
    pending: VecDeque<Pending>,
    /// Ops sent and not yet completed.
    in_flight: usize,
    /// A reply of the op at the front was unexpected.
    op_failed: bool,
    key_lo: u64,
    key_span: u64,
    next_key: u64,
    seq: u64,
    rng: Rng,
    dirty: bool,
    dead: bool,
    // Contended.
    state: Contend,
    wait_events: u64,
}

struct Stats {
    result: ThreadResult,
    window: Histogram,
    window_ops: u64,
    window_errors: u64,
}

impl Stats {
    fn error(&mut self, what: impl FnOnce() -> String) {
        self.result.errors += 1;
        self.window_errors += 1;
        if self.result.first_errors.len() < ERRORS_SHOWN {
            self.result.first_errors.push(what());
        }
    }
}

pub fn run(
    shared: Arc<Shared>,
    a: Assignment,
    reports: Sender<Report>,
    start: Receiver<Option<Start>>,
) {
    let connected = connect_all(&shared, &a);
    let (poll, conns) = match connected {
        Ok(c) => {
            let _ = reports.send(Report::Connected {
                thread: a.thread,
                result: Ok(()),
            });
            c
        }
        Err(e) => {
            let _ = reports.send(Report::Connected {
                thread: a.thread,
                result: Err(e),
            });
            return;
        }
    };
    let Ok(Some(start)) = start.recv() else {
        return;
    };
    let mut w = Worker {
        shared: &shared,
        poll,
        conns,
        start,
        stats: Stats {
            result: ThreadResult::default(),
            window: Histogram::new(),
            window_ops: 0,
            window_errors: 0,
        },
        free: VecDeque::new(),
        dirty: Vec::new(),
        scratch: vec![0; READ_CHUNK].into_boxed_slice(),
        reports,
        window_index: 0,
        live: 0,
    };
    w.live = w.conns.len();
    let share = a.count as f64 / shared.config.connections as f64;
    let result = w.run(shared.config.rate.map(|r| r * share));
    let _ = w.reports.send(Report::Done(Box::new(result)));
}

fn connect_all(shared: &Shared, a: &Assignment) -> Result<(Poll, Slab<Conn>), String> {
    let config = &shared.config;
    let poll = Poll::new().map_err(|e| format!("creating the event loop: {e}"))?;
    let mut conns = Slab::with_capacity(a.count);
    let span = (config.keys / config.connections as u64).max(1);
    for i in 0..a.count {
        let global = (a.first + i) as u64;
        let server = config.server_for(global);
        let std = StdStream::connect_timeout(&server, CONNECT_TIMEOUT)
            .map_err(|e| format!("connecting to {server}: {e}"))?;
        std.set_nodelay(true)
            .map_err(|e| format!("configuring a connection: {e}"))?;
        // The handshake is done before the run, blocking: the run measures requests.
        let (std, tls) = match &config.tls {
            Some(tls) => {
                let s = tls_connect(tls, server, std)?;
                (s.sock, Some(Box::new(s.conn)))
            }
            None => (std, None),
        };
        std.set_nonblocking(true)
            .map_err(|e| format!("configuring a connection: {e}"))?;
        let mut stream = TcpStream::from_std(std);
        let entry = conns.vacant_entry();
        poll.registry()
            .register(&mut stream, Token(entry.key()), Interest::READABLE)
            .map_err(|e| format!("registering a connection: {e}"))?;
        let (key_lo, key_span) = if config.workload.disjoint_keys() {
            (global * span, span)
        } else {
            (0, config.keys)
        };
        entry.insert(Conn {
            stream,
            tls,
            global,
            rbuf: Vec::new(),
            wbuf: Vec::new(),
            wpos: 0,
            writable_interest: false,
            pending: VecDeque::with_capacity(config.pipeline * 2),
            in_flight: 0,
            op_failed: false,
            key_lo,
            key_span,
            next_key: 0,
            seq: 0,
            // Any odd non-zero seed; distinct per connection.
            rng: Rng(0x9e37_79b9_7f4a_7c15 ^ (global.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1)),
            dirty: false,
            dead: false,
            state: Contend::Idle,
            wait_events: 0,
        });
    }
    Ok((poll, conns))
}

struct Worker<'a> {
    shared: &'a Shared,
    poll: Poll,
    conns: Slab<Conn>,
    start: Start,
    stats: Stats,
    /// One entry per free pipeline slot (a connection appears once per free slot).
    free: VecDeque<usize>,
    /// Connections with bytes to write this turn.
    dirty: Vec<usize>,
    scratch: Box<[u8]>,
    reports: Sender<Report>,
    window_index: u64,
    /// Connections not closed yet.
    live: usize,
}

impl Worker<'_> {
    fn now_ns(&self) -> u64 {
        // u64 nanoseconds last 584 years.
        self.start.epoch.elapsed().as_nanos() as u64
    }

    fn run(&mut self, rate: Option<f64>) -> ThreadResult {
        let contended = self.shared.config.workload == Workload::Contended;
        let pipeline = self.shared.config.pipeline;
        for _ in 0..pipeline {
            self.free.extend(self.conns.iter().map(|(slot, _)| slot));
        }
        // Open loop: op i is due at i * interval.
        let interval_ns = rate.map(|r| 1e9 / r);
        let mut issued: u64 = 0;
        let mut events = Events::with_capacity(1024);
        let mut timer = match Timer::new(&self.poll) {
            Ok(t) => t,
            Err(e) => {
                self.stats.error(|| format!("timerfd: {e}"));
                return std::mem::take(&mut self.stats.result);
            }
        };
        let drain_end = self.start.end_ns + DRAIN.as_nanos() as u64;
        let mut running = true;
        loop {
            let now = self.now_ns();
            while now >= (self.window_index + 1) * WINDOW_NS {
                self.send_window();
            }
            if running && now >= self.start.end_ns {
                running = false;
                if interval_ns.is_none() {
                    // Closed loop: no new ops after the end. Open loop: the backlog of ops due
                    // before the end still goes out during the drain, timed from when it was due.
                    self.free.clear();
                }
            }
            // Open loop: ops due by the end and not yet sent.
            let backlog = interval_ns.map_or(0, |iv| {
                ((self.start.end_ns as f64 / iv).ceil() as u64).saturating_sub(issued)
            });
            if !running {
                if let Some(iv) = interval_ns {
                    self.issue_due(self.start.end_ns, iv, &mut issued);
                    self.flush_dirty();
                }
                let busy = self
                    .conns
                    .iter()
                    .any(|(_, c)| !c.dead && (!c.pending.is_empty() || c.state != Contend::Idle));
                if (!busy && backlog == 0) || now >= drain_end {
                    break;
                }
            }
            let mut timeout = MAX_POLL;
            if running {
                if contended {
                    // Every connection starts with one ACQ; later ones follow RELEASED.
                    while let Some(slot) = self.free.pop_front() {
                        self.contend_acquire(slot);
                    }
                } else if let Some(iv) = interval_ns {
                    if let Some(due) = self.issue_due(now, iv, &mut issued) {
                        if let Err(e) = timer.arm(due - now) {
                            self.stats.error(|| format!("timerfd: {e}"));
                            break;
                        }
                    }
                } else {
                    while let Some(slot) = self.free.pop_front() {
                        self.issue(slot, now);
                    }
                }
            }
            self.flush_dirty();
            let next_window = (self.window_index + 1) * WINDOW_NS;
            let deadline = if running {
                self.start.end_ns
            } else {
                drain_end
            };
            let until = next_window.min(deadline).saturating_sub(now);
            timeout = timeout.min(Duration::from_nanos(until));
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    self.stats.error(|| format!("poll: {e}"));
                    break;
                }
            }
            for event in &events {
                if event.token() == TIMER {
                    timer.clear();
                    continue;
                }
                let slot = event.token().0;
                if !self.conns.contains(slot) || self.conns[slot].dead {
                    continue;
                }
                if event.is_writable() {
                    self.flush(slot);
                }
                if event.is_readable() || event.is_read_closed() || event.is_error() {
                    if contended && self.conns[slot].state == Contend::Waiting {
                        self.conns[slot].wait_events += 1;
                    }
                    self.read(slot, running);
                }
            }
            if self.live == 0 {
                break;
            }
        }
        if let Some(iv) = interval_ns {
            let due_by_end = (self.start.end_ns as f64 / iv).ceil() as u64;
            self.stats.result.unsent = due_by_end.saturating_sub(issued);
        }
        // Whatever is still in flight did not finish in time.
        for (_, c) in self.conns.iter() {
            if !c.dead {
                self.stats.result.unfinished += c.pending.iter().filter(|p| p.last).count() as u64;
            }
        }
        let now = self.now_ns();
        while now >= (self.window_index + 1) * WINDOW_NS {
            self.send_window();
        }
        std::mem::take(&mut self.stats.result)
    }

    /// Open loop: send every op due by `now` (and before the end) while connections have free
    /// slots. Returns when the next op is due, if that is before the end and a slot is free.
    fn issue_due(&mut self, now: u64, interval_ns: f64, issued: &mut u64) -> Option<u64> {
        while !self.free.is_empty() {
            let due = (*issued as f64 * interval_ns) as u64;
            if due >= self.start.end_ns {
                return None;
            }
            if due > now {
                return Some(due);
            }
            let slot = self.free.pop_front()?;
            if self.conns[slot].dead {
                continue;
            }
            *issued += 1;
            self.issue(slot, due);
        }
        None
    }

    fn send_window(&mut self) {
        let hist = Box::new(self.stats.window.clone());
        self.stats.window.reset();
        let _ = self.reports.send(Report::Window {
            index: self.window_index,
            ops: std::mem::take(&mut self.stats.window_ops),
            errors: std::mem::take(&mut self.stats.window_errors),
            hist,
        });
        self.window_index += 1;
    }

    fn measured(&self, start_ns: u64) -> bool {
        (self.start.warm_ns..self.start.end_ns).contains(&start_ns)
    }

    /// Write the requests of one op on `slot`, intended to start at `start_ns`.
    fn issue(&mut self, slot: usize, start_ns: u64) {
        let config = &self.shared.config;
        let c = &mut self.conns[slot];
        if c.dead {
            return;
        }
        let key_index = if config.workload.disjoint_keys() {
            let k = c.key_lo + c.next_key;
            c.next_key = (c.next_key + 1) % c.key_span;
            k
        } else {
            c.key_lo + c.rng.below(c.key_span)
        };
        let mut key = [0u8; 64];
        let key = make_key(&mut key, &self.shared.prefix, key_index);
        let reqs = config.workload.requests();
        for (i, &req) in reqs.iter().enumerate() {
            c.seq += 1;
            encode(
                config.protocol,
                req,
                key,
                &self.shared.value,
                c.seq,
                &mut c.wbuf,
            );
            c.pending.push_back(Pending {
                expect: Expect { req, id: c.seq },
                start_ns,
                last: i + 1 == reqs.len(),
            });
        }
        c.in_flight += 1;
        if !c.dirty {
            c.dirty = true;
            self.dirty.push(slot);
        }
    }

    fn flush_dirty(&mut self) {
        while let Some(slot) = self.dirty.pop() {
            if let Some(c) = self.conns.get_mut(slot) {
                c.dirty = false;
            }
            self.flush(slot);
        }
    }

    /// Write until done or WouldBlock; ask for writability only while bytes are left.
    fn flush(&mut self, slot: usize) {
        let c = &mut self.conns[slot];
        if let Some(tls) = c.tls.as_mut() {
            // rustls takes the whole plaintext (a client's buffer is unlimited) and holds the
            // records the socket does not take yet.
            if c.wpos < c.wbuf.len() {
                if let Err(e) = tls.writer().write_all(&c.wbuf[c.wpos..]) {
                    return self.kill(slot, format!("TLS write: {e}"));
                }
                c.wpos = c.wbuf.len();
            }
            while tls.wants_write() {
                match tls.write_tls(&mut c.stream) {
                    Ok(0) => return self.kill(slot, "connection closed while writing".into()),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return self.kill(slot, format!("write: {e}")),
                }
            }
        }
        while c.wpos < c.wbuf.len() {
            match c.stream.write(&c.wbuf[c.wpos..]) {
                Ok(0) => return self.kill(slot, "connection closed while writing".into()),
                Ok(n) => c.wpos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.kill(slot, format!("write: {e}")),
            }
        }
        if c.wpos == c.wbuf.len() {
            c.wbuf.clear();
            c.wpos = 0;
        }
        let want = c.wpos < c.wbuf.len() || c.tls.as_ref().is_some_and(|t| t.wants_write());
        if want != c.writable_interest {
            c.writable_interest = want;
            let interest = if want {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            if let Err(e) = self
                .poll
                .registry()
                .reregister(&mut c.stream, Token(slot), interest)
            {
                self.kill(slot, format!("reregister: {e}"));
            }
        }
    }

    /// Read until WouldBlock, handling every whole reply.
    fn read(&mut self, slot: usize, running: bool) {
        loop {
            let c = &mut self.conns[slot];
            match c.stream.read(&mut self.scratch) {
                Ok(0) => {
                    return self.kill(slot, "server closed the connection".into());
                }
                Ok(n) => {
                    match c.tls.as_mut() {
                        Some(tls) => {
                            if let Err(e) = tls_decrypt(tls, &self.scratch[..n], &mut c.rbuf) {
                                return self.kill(slot, format!("TLS: {e}"));
                            }
                        }
                        None => c.rbuf.extend_from_slice(&self.scratch[..n]),
                    }
                    let outcome = if self.shared.config.workload == Workload::Contended {
                        self.contend_replies(slot, running)
                    } else {
                        self.replies(slot, running)
                    };
                    if let Err(e) = outcome {
                        return self.kill(slot, e);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.kill(slot, format!("read: {e}")),
            }
        }
    }

    /// Check every whole reply at the front of the connection's buffer against what it waits
    /// for; complete ops, free their slots.
    fn replies(&mut self, slot: usize, running: bool) -> Result<(), String> {
        let proto = self.shared.config.protocol;
        let mut at = 0;
        let result = loop {
            let c = &mut self.conns[slot];
            let Some(p) = c.pending.front() else {
                if at < c.rbuf.len() {
                    break Err(format!(
                        "reply without a request: {}",
                        describe(&c.rbuf[at..])
                    ));
                }
                break Ok(());
            };
            let (ok, len) = match check_reply(proto, p.expect, &c.rbuf[at..]) {
                Ok(Checked::Incomplete) => break Ok(()),
                Ok(Checked::Reply { ok, len }) => (ok, len),
                Err(e) => {
                    break Err(format!(
                        "{e} (expecting {:?}): {}",
                        p.expect.req,
                        describe(&c.rbuf[at..])
                    ))
                }
            };
            let (expect, start_ns, last) = (p.expect, p.start_ns, p.last);
            c.pending.pop_front();
            if !ok {
                c.op_failed = true;
                let reply = &c.rbuf[at..at + len];
                self.stats
                    .error(|| format!("{:?} got {}", expect.req, describe(reply)));
            }
            at += len;
            if last {
                let c = &mut self.conns[slot];
                c.in_flight -= 1;
                let failed = std::mem::take(&mut c.op_failed);
                if !failed {
                    let now = self.now_ns();
                    let latency = now.saturating_sub(start_ns);
                    self.stats.window.record(latency);
                    self.stats.window_ops += 1;
                    // The rate is throughput: ops completed in the measured window. Latency is
                    // for ops intended in it (so an overload's late ops count in full).
                    if self.measured(now) {
                        self.stats.result.ops += 1;
                    }
                    if self.measured(start_ns) {
                        self.stats.result.hist.record(latency);
                    }
                }
                // After the end only an open loop's backlog still uses the free slots.
                if running || self.shared.config.rate.is_some() {
                    self.free.push_back(slot);
                }
            }
        };
        self.conns[slot].rbuf.drain(..at);
        result
    }

    fn contend_name(&self, slot: usize) -> u64 {
        self.conns[slot].global % self.shared.config.keys
    }

    fn contend_send(&mut self, slot: usize, op: u8) {
        let name = self.contend_name(slot);
        let mut buf = [0u8; 64];
        let key = make_key(&mut buf, &self.shared.prefix, name);
        let now = self.now_ns();
        let c = &mut self.conns[slot];
        c.wbuf.extend_from_slice(&lockd::header(op, key.len() + 1));
        c.wbuf.extend_from_slice(key);
        c.wbuf.push(0);
        if op == lockd::op::REL {
            // Stamped just before the write that carries it, so the hand-off is measured from
            // the moment the REL leaves.
            self.shared.rel_sent[name as usize].store(now, Ordering::Release);
            c.state = Contend::Releasing;
            self.flush(slot);
        } else {
            c.state = Contend::Acquiring;
            if !c.dirty {
                c.dirty = true;
                self.dirty.push(slot);
            }
        }
    }

    fn contend_acquire(&mut self, slot: usize) {
        if !self.conns[slot].dead {
            self.contend_send(slot, lockd::op::ACQ);
        }
    }

    /// Contended: follow each connection through ACQ, (ACK,) ACQUIRED, REL, RELEASED.
    fn contend_replies(&mut self, slot: usize, running: bool) -> Result<(), String> {
        let mut at = 0;
        let result = loop {
            let c = &mut self.conns[slot];
            let Some((frame, len)) = lockd::parse(&c.rbuf[at..]) else {
                break Ok(());
            };
            let (opcode, state) = (frame.opcode, c.state);
            at += len;
            match (state, opcode) {
                (Contend::Acquiring, lockd::op::ACK) => {
                    c.state = Contend::Waiting;
                    c.wait_events = 0;
                }
                (Contend::Acquiring | Contend::Waiting, lockd::op::ACQUIRED) => {
                    let now = self.now_ns();
                    let measured = self.measured(now);
                    self.stats.window_ops += 1;
                    if measured {
                        self.stats.result.ops += 1;
                    }
                    if state == Contend::Waiting {
                        let name = self.contend_name(slot) as usize;
                        let sent = self.shared.rel_sent[name].load(Ordering::Acquire);
                        let handoff = now.saturating_sub(sent);
                        let wakeups = self.conns[slot].wait_events.max(1);
                        self.stats.window.record(handoff);
                        if measured {
                            self.stats.result.hist.record(handoff);
                            self.stats.result.handoffs += 1;
                            self.stats.result.wakeups += wakeups;
                        }
                    }
                    // The holder releases at once, also after the end, so its waiters drain.
                    self.contend_send(slot, lockd::op::REL);
                }
                (Contend::Releasing, lockd::op::RELEASED) => {
                    c.state = Contend::Idle;
                    if running {
                        self.contend_acquire(slot);
                    }
                }
                _ => {
                    break Err(format!(
                        "old: opcode {opcode} while {state:?}: {}",
                        describe(frame.payload)
                    ))
                }
            }
            if self.conns[slot].dead {
                break Ok(());
            }
        };
        if let Some(c) = self.conns.get_mut(slot) {
            c.rbuf.drain(..at.min(c.rbuf.len()));
        }
        result
    }

    /// Close a connection after an I/O or stream error; its ops in flight are lost (counted as
    /// one error: the connection).
    fn kill(&mut self, slot: usize, why: String) {
        let c = &mut self.conns[slot];
        if c.dead {
            return;
        }
        c.dead = true;
        self.live -= 1;
        c.state = Contend::Idle;
        c.pending.clear();
        let _ = self.poll.registry().deregister(&mut c.stream);
        let _ = c.stream.shutdown(std::net::Shutdown::Both);
        let global = c.global;
        self.stats.error(|| format!("connection {global}: {why}"));
    }
}

/// A one-shot timerfd registered in the worker's epoll set (nanosecond resolution).
struct Timer {
    fd: std::os::fd::OwnedFd,
}

impl Timer {
    fn new(poll: &Poll) -> io::Result<Timer> {
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: plain syscall; a valid fd is owned by the OwnedFd below, -1 is an error.
        let raw = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        poll.registry().register(
            &mut mio::unix::SourceFd(&fd.as_raw_fd()),
            TIMER,
            Interest::READABLE,
        )?;
        Ok(Timer { fd })
    }

    /// Fire once, `ns` from now (0 is raised to 1: a zero value would disarm the timer).
    fn arm(&mut self, ns: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let ns = ns.max(1);
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (ns % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: `spec` is a valid itimerspec; the old value is not asked for.
        let r =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Consume the expiration count, so the next expiry is a fresh edge.
    fn clear(&mut self) {
        use std::os::fd::AsRawFd;
        let mut count = [0u8; 8];
        // SAFETY: reads at most 8 bytes into an 8-byte buffer; EAGAIN is fine.
        unsafe {
            libc::read(self.fd.as_raw_fd(), count.as_mut_ptr().cast(), count.len());
        }
    }
}

/// `prefix` followed by `index` in decimal, in `buf`.
pub fn make_key<'b>(buf: &'b mut [u8; 64], prefix: &[u8], index: u64) -> &'b [u8] {
    // 40 prefix bytes + 20 digits fit in 64.
    let plen = prefix.len().min(40);
    buf[..plen].copy_from_slice(&prefix[..plen]);
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = index;
    loop {
        at -= 1;
        // Lossless: one decimal digit.
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let d = &digits[at..];
    buf[plen..plen + d.len()].copy_from_slice(d);
    &buf[..plen + d.len()]
}

/// A blocking stream, plain or TLS.
pub trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// Connect TLS over `tcp` (blocking, bounded by [`CONNECT_TIMEOUT`]); the server name is the
/// server's IP address.
pub fn tls_connect(
    config: &Arc<rustls::ClientConfig>,
    server: std::net::SocketAddr,
    tcp: StdStream,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, StdStream>, String> {
    let name = holdfast::tls::server_name(&server.ip().to_string())?;
    tcp.set_read_timeout(Some(CONNECT_TIMEOUT))
        .and_then(|()| tcp.set_write_timeout(Some(CONNECT_TIMEOUT)))
        .map_err(|e| format!("configuring a connection: {e}"))?;
    let s = holdfast::tls::connect_blocking(config.clone(), name, tcp)
        .map_err(|e| format!("TLS handshake with {server}: {e}"))?;
    s.sock
        .set_read_timeout(None)
        .and_then(|()| s.sock.set_write_timeout(None))
        .map_err(|e| format!("configuring a connection: {e}"))?;
    Ok(s)
}

/// Feed ciphertext to rustls and append the plaintext it yields to `out`.
fn tls_decrypt(
    tls: &mut rustls::ClientConnection,
    mut input: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), String> {
    while !input.is_empty() {
        if tls.read_tls(&mut input).map_err(|e| e.to_string())? == 0 {
            return Err("rustls took no bytes".into());
        }
        tls.process_new_packets().map_err(|e| e.to_string())?;
        match tls.reader().read_to_end(out) {
            Ok(_) => return Err("the server closed the TLS session".into()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}

/// Make every key exist (`Req::Set`) or make sure none does (`Req::Clear`) before the run, over
/// one blocking connection, in pipelined batches, checking each reply.
pub fn prepare(shared: &Shared, req: Req, deadline: Instant) -> Result<(), String> {
    /// Requests per write: enough to amortise round trips, small enough for socket buffers.
    const BATCH: u64 = 256;
    let config = &shared.config;
    let proto: Protocol = config.protocol;
    let server = config.servers[0];
    let tcp = StdStream::connect_timeout(&server, CONNECT_TIMEOUT)
        .map_err(|e| format!("connecting to {server}: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let timeouts = tcp
        .try_clone()
        .map_err(|e| format!("preparing keys: {e}"))?;
    let mut stream: Box<dyn ReadWrite> = match &config.tls {
        Some(tls) => Box::new(tls_connect(tls, server, tcp)?),
        None => Box::new(tcp),
    };
    let mut out = Vec::new();
    let mut rbuf = Vec::new();
    let mut chunk = vec![0u8; READ_CHUNK];
    let mut next = 0;
    let mut id = 0u64;
    while next < config.keys {
        let end = (next + BATCH).min(config.keys);
        out.clear();
        let mut expects = VecDeque::new();
        for k in next..end {
            let mut buf = [0u8; 64];
            let key = make_key(&mut buf, &shared.prefix, k);
            id += 1;
            encode(proto, req, key, &shared.value, id, &mut out);
            expects.push_back(Expect { req, id });
        }
        stream
            .write_all(&out)
            .map_err(|e| format!("preparing keys: write: {e}"))?;
        while let Some(&expect) = expects.front() {
            match codec::check_reply(proto, expect, &rbuf)
                .map_err(|e| format!("preparing keys: {e}"))?
            {
                Checked::Reply { ok, len } => {
                    if !ok {
                        return Err(format!(
                            "preparing keys: {req:?} got {}",
                            describe(&rbuf[..len])
                        ));
                    }
                    rbuf.drain(..len);
                    expects.pop_front();
                }
                Checked::Incomplete => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err("preparing keys: out of time".into());
                    }
                    timeouts
                        .set_read_timeout(Some(left))
                        .map_err(|e| format!("preparing keys: {e}"))?;
                    let n = stream
                        .read(&mut chunk)
                        .map_err(|e| format!("preparing keys: read: {e}"))?;
                    if n == 0 {
                        return Err("preparing keys: server closed the connection".into());
                    }
                    rbuf.extend_from_slice(&chunk[..n]);
                }
            }
        }
        next = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_prefix_then_decimal_index() {
        let mut buf = [0u8; 64];
        assert_eq!(make_key(&mut buf, b"hfb:", 0), b"hfb:0");
        assert_eq!(make_key(&mut buf, b"hfb:", 1234), b"hfb:1234");
        assert_eq!(
            make_key(&mut buf, b"", u64::MAX),
            u64::MAX.to_string().as_bytes()
        );
    }
}
