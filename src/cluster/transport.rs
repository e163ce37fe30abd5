//! Peer transport: raft messages between cluster nodes over TCP.
//!
//! Owns the peer listener, one outbound connection per peer (each with its own writer thread
//! and bounded queue) and the reader threads of inbound connections. It must not interpret
//! messages beyond checking who sent them, and must never block the caller (the raft driver):
//! [`Transport::send`] only enqueues, dropping the message when that peer's queue is full
//! (raft retransmits what matters), and inbound messages arrive on a bounded channel that the
//! driver polls.
//!
//! ```text
//! frame = magic "HFRT" | version u8 (1) | reserved u8 (0) | sender id u64 LE
//!         | length u32 LE | length bytes: one raft `Message` (protobuf)
//! ```
//!
//! **Keepalives.** Raft followers do not talk to each other, so the driver sends every peer a
//! keepalive now and then ([`Transport::keepalive`]): a `Message` of type `MsgBeat` with only
//! `from` and `to` set, a type raft-rs takes only from its own node, never from the network
//! (`RawNode::step` refuses it). A reader takes it for itself: it notes the time, as for every
//! frame ([`Transport::heard`]), and hands nothing to the driver. So every node hears from every
//! other member, followers from each other too, and knows whom it can reach. A keepalive from an
//! id this node does not know yet (a member added while it was down) is ignored, not refused.
//!
//! Every inbound byte is hostile: a wrong magic or version, a length over the cap, a sender
//! that is not a member, a sender that changes within a connection, a message whose `from`
//! is not its frame's sender or whose `to` is not us, or bytes that are not a `Message` close
//! the connection (counted in [`TransportStats::refused`]). A frame's buffer grows only as its
//! bytes arrive, so a lying length allocates nothing.
//!
//! Membership changes while it runs ([`Transport::set_peers`]): a new member gets a writer, a
//! departed one's writer stops, and frames from an id that is no longer a member are refused
//! from the next frame on, on connections already open too.
//!
//! With peer TLS ([`TransportConfig::tls`]) every connection is mutual TLS (rustls): an inbound
//! connection is read only after a handshake in which the peer proved a certificate signed by
//! the peer CA, before a single frame byte; the handshake has [`HANDSHAKE_TIMEOUT`], so that
//! stalled strangers cannot hold the inbound slots, and a failed one is counted in
//! [`TransportStats::refused`]. A dialing writer checks the accepting node's certificate against
//! the same CA, with the host of that peer's `--peers` entry as the name. The configurations are
//! taken once per new connection: a certificate reload (SIGHUP) applies to the connections made
//! after it; open ones keep theirs.
//!
//! Outbound connections reconnect with exponential backoff ([`BACKOFF_MIN`] doubling to
//! [`BACKOFF_MAX`]); the driver hears [`PeerEvent::Unreachable`] once per failed attempt (for
//! `report_unreachable`) and [`PeerEvent::SnapshotFailed`] for a snapshot message that was
//! not written (for `report_snapshot(.., Failure)`), or raft waits for it forever.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender, TrySendError};
use protobuf::Message as PbMessage;
use raft::prelude::{Message, MessageType};

use crate::tls::rustls;

pub const MAGIC: &[u8; 4] = b"HFRT";
pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 18;
/// The largest frame accepted by default: a raft message carrying a snapshot of the whole
/// state (the item store is 1 GiB by default). Larger snapshots need chunking (not done yet).
pub const DEFAULT_MAX_FRAME: usize = (1 << 30) + (1 << 20);
/// Messages queued per peer: raft sends a few per tick per peer; more than this means the
/// peer is not keeping up, and dropping is what raft expects of a lossy network.
pub const DEFAULT_QUEUE_LEN: usize = 4096;
/// Inbound messages waiting for the driver, from all peers together.
pub const DEFAULT_INBOUND_LEN: usize = 16384;
/// Reconnect backoff: quick enough to rejoin within one election timeout after a restart,
/// slow enough not to spin against a dead peer.
pub const BACKOFF_MIN: Duration = Duration::from_millis(20);
pub const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// A write that makes no progress this long fails the connection (a peer that stopped reading).
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Inbound connections served at once: a peer needs one (two across a reconnect); more are
/// strangers, refused so that they cannot make us start a thread each.
pub const MAX_INBOUND_CONNECTIONS: usize = 32;
/// A connection that has not sent one whole valid frame this long after it was accepted is
/// closed, so that idle strangers cannot hold the inbound slots.
pub const FIRST_FRAME_TIMEOUT: Duration = Duration::from_secs(5);
/// A TLS handshake, inbound or outbound, that has not ended this long after the connection was
/// made fails: an inbound one frees its slot, an outbound one is retried with the backoff.
pub const HANDSHAKE_TIMEOUT: Duration = FIRST_FRAME_TIMEOUT;
/// At most one log line about refused inbound connections this often (a stranger that
/// reconnects in a loop must not flood the log); the lines in between are counted.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);
/// How often blocked threads look at the shutdown flag.
const POLL: Duration = Duration::from_millis(50);

/// Why an inbound frame was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    BadMagic,
    BadVersion(u8),
    TooLarge(usize),
    NotMember(u64),
    SenderChanged {
        was: u64,
        now: u64,
    },
    BadMessage(String),
    /// With peer TLS: bytes that are not this connection's TLS records.
    BadTls(String),
}

/// A frame header, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub sender: u64,
    pub len: usize,
}

/// Checks a frame header (exactly [`HEADER_LEN`] bytes).
pub fn decode_header(h: &[u8; HEADER_LEN], max_frame: usize) -> Result<Header, FrameError> {
    if &h[..4] != MAGIC {
        return Err(FrameError::BadMagic);
    }
    if h[4] != VERSION {
        return Err(FrameError::BadVersion(h[4]));
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&h[6..14]);
    let len = u32::from_le_bytes([h[14], h[15], h[16], h[17]]) as usize;
    if len > max_frame {
        return Err(FrameError::TooLarge(len));
    }
    Ok(Header {
        sender: u64::from_le_bytes(id),
        len,
    })
}

/// Appends one frame carrying `m` to `out` (a reused buffer).
pub fn encode_frame(sender: u64, m: &Message, out: &mut Vec<u8>) -> Result<(), String> {
    let start = out.len();
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.push(0);
    out.extend_from_slice(&sender.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    m.write_to_vec(out).map_err(|e| e.to_string())?;
    let len = out.len() - start - HEADER_LEN;
    let len32 = u32::try_from(len).map_err(|_| format!("message of {} bytes", len))?;
    out[start + 14..start + 18].copy_from_slice(&len32.to_le_bytes());
    Ok(())
}

/// Something the driver must tell raft.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerEvent {
    /// A connection attempt to this peer failed (`RawNode::report_unreachable`).
    Unreachable(u64),
    /// A snapshot message to this peer was dropped (`report_snapshot(id, Failure)`).
    SnapshotFailed(u64),
    /// A snapshot message to this peer was written whole (`report_snapshot(id, Finish)`): as
    /// etcd does, so that a leader whose follower's answer to the snapshot was lost does not
    /// wait for it forever.
    SnapshotSent(u64),
    /// This peer's connection to us ended (EOF or reset) after it had sent a valid frame: its
    /// process most likely exited (the kernel closes a dead process's sockets; a partition
    /// closes nothing).
    Closed(u64),
}

/// Counters, for metrics and tests.
#[derive(Debug, Default)]
pub struct TransportStats {
    pub sent: AtomicU64,
    pub received: AtomicU64,
    /// Outbound messages dropped: queue full, unknown peer, or lost with a failed connection.
    pub dropped: AtomicU64,
    /// Inbound messages dropped because the driver's queue was full.
    pub dropped_inbound: AtomicU64,
    /// Inbound connections closed for a bad frame, a failed TLS handshake (a certificate not
    /// of the peer CA, bytes that are not TLS, a handshake past its deadline) or over the cap.
    pub refused: AtomicU64,
    pub connects: AtomicU64,
    /// Inbound TLS handshakes that ended with a peer certificate of the peer CA.
    pub handshakes: AtomicU64,
}

/// The TLS configurations of the peer links at one moment.
pub struct PeerTlsConfigs {
    /// Accepting: our certificate, and the CA whose certificate a peer must present.
    pub server: Arc<rustls::ServerConfig>,
    /// Dialing: our certificate, and the CA that must have signed the accepting peer's.
    pub client: Arc<rustls::ClientConfig>,
}

/// Peer TLS: where the transport takes the configurations in force, once per new connection
/// (the daemon's reads its `SecretStore`, which SIGHUP reloads). None at a given moment refuses
/// that connection: with peer TLS on, nothing is ever sent or read in the clear.
#[derive(Clone)]
pub struct PeerTls(Arc<dyn Fn() -> Option<PeerTlsConfigs> + Send + Sync>);

impl PeerTls {
    pub fn new(current: impl Fn() -> Option<PeerTlsConfigs> + Send + Sync + 'static) -> PeerTls {
        PeerTls(Arc::new(current))
    }

    /// The same configurations for every connection.
    pub fn fixed(server: Arc<rustls::ServerConfig>, client: Arc<rustls::ClientConfig>) -> PeerTls {
        PeerTls::new(move || {
            Some(PeerTlsConfigs {
                server: server.clone(),
                client: client.clone(),
            })
        })
    }

    fn current(&self) -> Option<PeerTlsConfigs> {
        (self.0)()
    }
}

pub struct TransportConfig {
    pub id: u64,
    /// Every other member and where it listens.
    pub peers: BTreeMap<u64, SocketAddr>,
    pub max_frame: usize,
    pub queue_len: usize,
    pub inbound_len: usize,
    /// Mutual TLS on every connection; None: plain TCP.
    pub tls: Option<PeerTls>,
    /// The name a peer's certificate must carry (the host of its `--peers` entry: an IP address
    /// or a DNS name); a peer not named here: the IP address it is reached at.
    pub names: BTreeMap<u64, String>,
}

impl TransportConfig {
    pub fn new(id: u64, peers: BTreeMap<u64, SocketAddr>) -> TransportConfig {
        TransportConfig {
            id,
            peers,
            max_frame: DEFAULT_MAX_FRAME,
            queue_len: DEFAULT_QUEUE_LEN,
            inbound_len: DEFAULT_INBOUND_LEN,
            tls: None,
            names: BTreeMap::new(),
        }
    }
}

/// The running transport of one node. Dropping it stops every thread it started.
pub struct Transport {
    id: u64,
    local: SocketAddr,
    /// Per peer: where its writer connects, and its queue.
    outbound: BTreeMap<u64, (SocketAddr, Sender<Message>)>,
    /// The ids whose frames are accepted (this node's own included), shared with the readers.
    members: Members,
    queue_len: usize,
    tls: Option<PeerTls>,
    names: BTreeMap<u64, String>,
    inbound: Receiver<Message>,
    events: Receiver<PeerEvent>,
    event_tx: Sender<PeerEvent>,
    stats: Arc<TransportStats>,
    /// When each peer's latest frame arrived (any frame, keepalives included).
    heard: Heard,
    shutdown: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

/// When each peer's latest frame arrived, written by the readers.
type Heard = Arc<Mutex<BTreeMap<u64, Instant>>>;

/// Whether `m` is a keepalive (see the module header).
pub fn is_keepalive(m: &Message) -> bool {
    m.get_msg_type() == MessageType::MsgBeat
}

impl Transport {
    /// Starts serving `listener` (already bound: the caller chose the address, port 0 included)
    /// and a writer per peer.
    pub fn start(cfg: TransportConfig, listener: TcpListener) -> io::Result<Transport> {
        let local = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let shutdown = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(TransportStats::default());
        let (in_tx, in_rx) = bounded(cfg.inbound_len);
        // Events are few (one per failed attempt per backoff step); bounded all the same.
        let (ev_tx, ev_rx) = bounded(1024);
        let mut threads = Vec::new();
        let members: Members = Arc::new(RwLock::new(MemberSet::default()));
        let heard: Heard = Arc::new(Mutex::new(BTreeMap::new()));
        {
            let template = Reader {
                id: cfg.id,
                members: members.clone(),
                max_frame: cfg.max_frame,
                inbound: in_tx,
                events: ev_tx.clone(),
                stats: stats.clone(),
                shutdown: shutdown.clone(),
                tls: cfg.tls.clone(),
                refusals: Arc::new(Mutex::new(RefusalLog::default())),
                heard: heard.clone(),
            };
            threads.push(
                thread::Builder::new()
                    .name(format!("raft-accept-{}", cfg.id))
                    .spawn(move || accept_loop(listener, template))?,
            );
        }
        let mut t = Transport {
            id: cfg.id,
            local,
            outbound: BTreeMap::new(),
            members,
            queue_len: cfg.queue_len,
            tls: cfg.tls,
            names: cfg.names,
            inbound: in_rx,
            events: ev_rx,
            event_tx: ev_tx,
            stats,
            heard,
            shutdown,
            threads,
        };
        t.set_peers(&cfg.peers)?;
        Ok(t)
    }

    /// Makes `peers` (every member and where it listens; this node may be among them) the
    /// members: a writer starts for each new peer (or one whose address changed), the writers
    /// of departed peers stop (what they had queued is dropped), and frames from departed ids
    /// are refused from now on.
    pub fn set_peers(&mut self, peers: &BTreeMap<u64, SocketAddr>) -> io::Result<()> {
        self.threads.retain(|h| !h.is_finished());
        self.outbound
            .retain(|id, (addr, _)| peers.get(id) == Some(addr));
        for (&peer, &addr) in peers {
            if peer == self.id || self.outbound.contains_key(&peer) {
                continue;
            }
            let (tx, rx) = bounded(self.queue_len);
            let w = Writer {
                id: self.id,
                peer,
                addr,
                name: self
                    .names
                    .get(&peer)
                    .cloned()
                    .unwrap_or_else(|| addr.ip().to_string()),
                tls: self.tls.clone(),
                rx,
                events: self.event_tx.clone(),
                stats: self.stats.clone(),
                shutdown: self.shutdown.clone(),
            };
            self.threads.push(
                thread::Builder::new()
                    .name(format!("raft-send-{}-{}", self.id, peer))
                    .spawn(move || w.run())?,
            );
            self.outbound.insert(peer, (addr, tx));
        }
        let mut set = self.members.write().unwrap_or_else(|e| e.into_inner());
        set.known = peers.keys().copied().collect();
        Ok(())
    }

    /// Ids removed from the cluster: refused from now on, whatever they send.
    pub fn set_removed(&mut self, removed: &BTreeSet<u64>) {
        let mut set = self.members.write().unwrap_or_else(|e| e.into_inner());
        set.removed = removed.iter().copied().collect();
    }

    /// The peers this transport sends to.
    pub fn peers(&self) -> BTreeMap<u64, SocketAddr> {
        self.outbound
            .iter()
            .map(|(&id, (addr, _))| (id, *addr))
            .collect()
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Queues `m` for `m.to`; never blocks. Returns false when it was dropped (unknown peer or
    /// its queue full). A dropped snapshot is reported as [`PeerEvent::SnapshotFailed`] too.
    pub fn send(&self, m: Message) -> bool {
        let to = m.to;
        let is_snap = m.get_msg_type() == MessageType::MsgSnapshot;
        let ok = match self.outbound.get(&to) {
            Some((_, q)) => match q.try_send(m) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => false,
            },
            None => false,
        };
        if !ok {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            if is_snap {
                let _ = self.event_tx.try_send(PeerEvent::SnapshotFailed(to));
            }
        }
        ok
    }

    /// The driver's side of inbound messages (to poll or to `select!` on).
    pub fn inbound(&self) -> &Receiver<Message> {
        &self.inbound
    }

    pub fn try_recv(&self) -> Option<Message> {
        self.inbound.try_recv().ok()
    }

    pub fn recv_timeout(&self, d: Duration) -> Option<Message> {
        match self.inbound.recv_timeout(d) {
            Ok(m) => Some(m),
            Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => None,
        }
    }

    /// Events for raft (to `select!` on).
    pub fn events(&self) -> &Receiver<PeerEvent> {
        &self.events
    }

    /// The next event for raft, if any.
    pub fn try_event(&self) -> Option<PeerEvent> {
        self.events.try_recv().ok()
    }

    pub fn stats(&self) -> &TransportStats {
        &self.stats
    }

    /// Queue a keepalive for every peer (see the module header); never blocks.
    pub fn keepalive(&self) {
        for &to in self.outbound.keys() {
            let mut m = Message::default();
            m.set_msg_type(MessageType::MsgBeat);
            m.from = self.id;
            m.to = to;
            self.send(m);
        }
    }

    /// When each peer's latest frame arrived (raft traffic or a keepalive).
    pub fn heard(&self) -> BTreeMap<u64, Instant> {
        self.heard.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether every connection is mutual TLS.
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::Relaxed);
        self.outbound.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

struct Writer {
    id: u64,
    peer: u64,
    addr: SocketAddr,
    /// The name the peer's certificate must carry (with TLS).
    name: String,
    tls: Option<PeerTls>,
    rx: Receiver<Message>,
    events: Sender<PeerEvent>,
    stats: Arc<TransportStats>,
    shutdown: Arc<AtomicBool>,
}

impl Writer {
    fn run(self) {
        let mut buf = Vec::new();
        let mut backoff = BACKOFF_MIN;
        let mut conn: Option<Stream> = None;
        let mut retry_at = Instant::now();
        loop {
            if self.shutdown.load(Ordering::Relaxed) {
                return;
            }
            let m = match self.rx.recv_timeout(POLL) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            if conn.is_none() && Instant::now() >= retry_at {
                match self.connect() {
                    Ok(s) => {
                        self.stats.connects.fetch_add(1, Ordering::Relaxed);
                        backoff = BACKOFF_MIN;
                        conn = Some(s);
                    }
                    Err(_) => {
                        let _ = self.events.try_send(PeerEvent::Unreachable(self.peer));
                        retry_at = Instant::now() + backoff;
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                    }
                }
            }
            let Some(s) = conn.as_mut() else {
                self.lost(&m);
                continue;
            };
            // Batch whatever else is queued into one write.
            buf.clear();
            let mut batch = vec![m];
            while batch.len() < 256 {
                match self.rx.try_recv() {
                    Ok(m) => batch.push(m),
                    Err(_) => break,
                }
            }
            for m in &batch {
                if encode_frame(self.id, m, &mut buf).is_err() {
                    self.lost(m);
                }
            }
            // Whole frames, and through TLS all of them handed to the socket (`flush`).
            if s.write_all(&buf).and_then(|()| s.flush()).is_err() {
                conn = None;
                retry_at = Instant::now() + backoff;
                for m in &batch {
                    self.lost(m);
                }
                let _ = self.events.try_send(PeerEvent::Unreachable(self.peer));
            } else {
                self.stats
                    .sent
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                if batch
                    .iter()
                    .any(|m| m.get_msg_type() == MessageType::MsgSnapshot)
                {
                    let _ = self.events.try_send(PeerEvent::SnapshotSent(self.peer));
                }
            }
        }
    }

    /// A new connection to the peer: TCP, and with peer TLS a handshake in which the peer
    /// proved a certificate of the peer CA for this peer's name.
    fn connect(&self) -> io::Result<Stream> {
        let tcp = TcpStream::connect_timeout(&self.addr, BACKOFF_MAX)?;
        let _ = tcp.set_nodelay(true);
        tcp.set_write_timeout(Some(WRITE_TIMEOUT))?;
        let Some(tls) = &self.tls else {
            return Ok(Stream::Plain(tcp));
        };
        // Nothing is read on this side but the handshake and what TLS sends after it (tickets,
        // alerts): rustls reads those while it waits to write, so a read must not block either.
        tcp.set_read_timeout(Some(POLL))?;
        let configs = tls
            .current()
            .ok_or_else(|| io::Error::other("no peer TLS configuration"))?;
        let name = crate::tls::server_name(&self.name).map_err(io::Error::other)?;
        let conn = rustls::ClientConnection::new(configs.client, name).map_err(io::Error::other)?;
        let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
        let s = handshake(conn, tcp, deadline, &self.shutdown)?;
        Ok(Stream::Client(Box::new(s)))
    }

    fn lost(&self, m: &Message) {
        self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        if m.get_msg_type() == MessageType::MsgSnapshot {
            let _ = self.events.try_send(PeerEvent::SnapshotFailed(self.peer));
        }
    }
}

/// Accepts peers' connections, each read by a thread of its own (a clone of `template`).
fn accept_loop(listener: TcpListener, template: Reader) {
    let shutdown = template.shutdown.clone();
    let mut readers: Vec<JoinHandle<()>> = Vec::new();
    while !shutdown.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((s, from)) => {
                readers.retain(|h| !h.is_finished());
                if readers.len() >= MAX_INBOUND_CONNECTIONS {
                    template.refuse(from, "too many inbound connections");
                    drop(s);
                    continue;
                }
                let r = template.clone();
                if let Ok(h) = thread::Builder::new()
                    .name(format!("raft-recv-{}", template.id))
                    .spawn(move || r.run(s, from))
                {
                    readers.push(h);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(POLL / 5),
            Err(_) => thread::sleep(POLL),
        }
    }
    for h in readers {
        let _ = h.join();
    }
}

/// One peer connection: plain TCP, or TLS over it (inbound: this node is the TLS server;
/// outbound: the client). Reads and writes go through rustls's `StreamOwned`: a read that the
/// socket's timeout interrupts (`WouldBlock`) leaves a partly received record in rustls's
/// buffer, and the next read goes on from there.
enum Stream {
    Plain(TcpStream),
    Server(Box<crate::tls::ServerStream>),
    Client(Box<crate::tls::ClientStream>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Server(s) => &s.sock,
            Stream::Client(s) => &s.sock,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Server(s) => s.read(buf),
            Stream::Client(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Server(s) => s.write(buf),
            Stream::Client(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Server(s) => s.flush(),
            Stream::Client(s) => s.flush(),
        }
    }
}

/// Runs a TLS handshake over `tcp` until it ends, fails, `deadline` passes or the transport
/// stops.
fn handshake<C, S>(
    mut conn: C,
    tcp: TcpStream,
    deadline: Instant,
    shutdown: &AtomicBool,
) -> io::Result<rustls::StreamOwned<C, TcpStream>>
where
    C: DerefMut + Deref<Target = rustls::ConnectionCommon<S>>,
    S: rustls::SideData,
{
    while conn.is_handshaking() {
        if shutdown.load(Ordering::Relaxed) {
            return Err(io::Error::new(io::ErrorKind::Interrupted, "shutting down"));
        }
        if Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the TLS handshake did not end in time",
            ));
        }
        // Each call ends by the next look at the shutdown flag or the deadline, however the
        // peer trickles its bytes (complete_io reads until a whole message has arrived).
        let mut io = crate::tls::Deadline {
            tcp: &tcp,
            deadline: deadline.min(Instant::now() + POLL),
        };
        match conn.complete_io(&mut io) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(rustls::StreamOwned::new(conn, tcp))
}

/// Refusals since the last log line about them.
#[derive(Default)]
struct RefusalLog {
    last: Option<Instant>,
    unlogged: u64,
}

/// Who may send to us; written on a membership change, read once per frame.
type Members = Arc<RwLock<MemberSet>>;

/// The members this node knows (its configuration's), and the ids removed from the cluster.
/// A frame from a removed id is refused. A frame from an id this node does not know is
/// accepted only if it carries a leader's traffic (appends, heartbeats, a snapshot): a node
/// that was down while a member joined knows of it only from the log, which it must be able
/// to get from that member if it leads. Anything else from a stranger is refused.
#[derive(Default)]
struct MemberSet {
    known: Vec<u64>,
    removed: Vec<u64>,
}

impl MemberSet {
    /// Whether a frame from `id` may be read at all.
    fn admits(&self, me: u64, id: u64) -> bool {
        id != me && id != 0 && !self.removed.contains(&id)
    }

    fn knows(&self, id: u64) -> bool {
        self.known.contains(&id)
    }
}

/// Traffic that only a leader sends.
fn is_leader_traffic(m: &Message) -> bool {
    matches!(
        m.get_msg_type(),
        MessageType::MsgAppend | MessageType::MsgHeartbeat | MessageType::MsgSnapshot
    )
}

#[derive(Clone)]
struct Reader {
    id: u64,
    members: Members,
    max_frame: usize,
    inbound: Sender<Message>,
    events: Sender<PeerEvent>,
    stats: Arc<TransportStats>,
    shutdown: Arc<AtomicBool>,
    tls: Option<PeerTls>,
    refusals: Arc<Mutex<RefusalLog>>,
    heard: Heard,
}

/// What reading one frame gave.
enum Got {
    Frame,
    Closed,
}

impl Reader {
    fn run(self, tcp: TcpStream, from: SocketAddr) {
        let accepted = Instant::now();
        if tcp.set_nonblocking(false).is_err()
            || tcp.set_read_timeout(Some(POLL)).is_err()
            || tcp.set_write_timeout(Some(WRITE_TIMEOUT)).is_err()
        {
            return;
        }
        let mut s = match &self.tls {
            None => Stream::Plain(tcp),
            // Not one byte of a frame is read before the peer has proved its certificate.
            Some(tls) => match self.accept_tls(tls, tcp, accepted + HANDSHAKE_TIMEOUT) {
                Ok(s) => {
                    self.stats.handshakes.fetch_add(1, Ordering::Relaxed);
                    Stream::Server(Box::new(s))
                }
                // Bytes that are not a good handshake, a certificate not of the peer CA, or no
                // end in time: refused. A peer that went away meanwhile only closed.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::InvalidData | io::ErrorKind::TimedOut
                    ) =>
                {
                    self.refuse(from, &format!("TLS handshake: {e}"));
                    return;
                }
                Err(_) => return,
            },
        };
        let mut sender: Option<u64> = None;
        let mut body = Vec::new();
        loop {
            match self.frame(&mut s, &mut sender, &mut body) {
                Ok(Got::Frame) => {}
                Ok(Got::Closed) => {
                    if let Some(peer) = sender.filter(|_| !self.shutdown.load(Ordering::Relaxed)) {
                        let _ = self.events.try_send(PeerEvent::Closed(peer));
                    }
                    return;
                }
                Err(refused) => {
                    self.refuse(from, &format!("{refused:?}"));
                    let _ = s.tcp().shutdown(std::net::Shutdown::Both);
                    return;
                }
            }
        }
    }

    fn accept_tls(
        &self,
        tls: &PeerTls,
        tcp: TcpStream,
        deadline: Instant,
    ) -> io::Result<crate::tls::ServerStream> {
        let configs = tls
            .current()
            .ok_or_else(|| io::Error::other("no peer TLS configuration"))?;
        let conn = rustls::ServerConnection::new(configs.server).map_err(io::Error::other)?;
        handshake(conn, tcp, deadline, &self.shutdown)
    }

    /// Counts a refused connection, and logs it unless a line was logged lately.
    fn refuse(&self, from: SocketAddr, why: &str) {
        self.stats.refused.fetch_add(1, Ordering::Relaxed);
        let mut log = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if log.last.is_some_and(|t| now < t + REFUSAL_LOG_EVERY) {
            log.unlogged += 1;
            return;
        }
        let more = std::mem::take(&mut log.unlogged);
        log.last = Some(now);
        drop(log);
        if more > 0 {
            crate::log_warn!(
                "peer transport: refused a connection from {from}: {why} ({more} more refused \
                 since the last line)"
            );
        } else {
            crate::log_warn!("peer transport: refused a connection from {from}: {why}");
        }
    }

    /// Reads exactly `buf.len()` bytes; false at EOF, error, shutdown or the deadline. Bytes
    /// that are not TLS records of this connection (with peer TLS) are an error.
    fn fill(
        &self,
        s: &mut Stream,
        buf: &mut [u8],
        deadline: Option<Instant>,
    ) -> Result<bool, FrameError> {
        let mut at = 0;
        while at < buf.len() {
            if self.shutdown.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() > d)
            {
                return Ok(false);
            }
            match s.read(&mut buf[at..]) {
                Ok(0) => return Ok(false),
                Ok(n) => at += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // rustls: a record that does not decrypt, or not a record at all.
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    return Err(FrameError::BadTls(e.to_string()))
                }
                Err(_) => return Ok(false),
            }
        }
        Ok(true)
    }

    fn frame(
        &self,
        s: &mut Stream,
        sender: &mut Option<u64>,
        body: &mut Vec<u8>,
    ) -> Result<Got, FrameError> {
        // Until the peer has proved itself with one valid frame, it has a deadline.
        let deadline = sender
            .is_none()
            .then(|| Instant::now() + FIRST_FRAME_TIMEOUT);
        let mut h = [0u8; HEADER_LEN];
        if !self.fill(s, &mut h, deadline)? {
            return Ok(Got::Closed);
        }
        let head = decode_header(&h, self.max_frame)?;
        let known = {
            let set = self.members.read().unwrap_or_else(|e| e.into_inner());
            if !set.admits(self.id, head.sender) {
                return Err(FrameError::NotMember(head.sender));
            }
            set.knows(head.sender)
        };
        match *sender {
            Some(was) if was != head.sender => {
                return Err(FrameError::SenderChanged {
                    was,
                    now: head.sender,
                })
            }
            _ => *sender = Some(head.sender),
        }
        // Grow as the bytes arrive: a lying length costs at most one chunk.
        body.clear();
        const CHUNK: usize = 64 << 10;
        while body.len() < head.len {
            let start = body.len();
            let n = (head.len - start).min(CHUNK);
            body.resize(start + n, 0);
            if !self.fill(s, &mut body[start..], deadline)? {
                return Ok(Got::Closed);
            }
        }
        let m =
            Message::parse_from_bytes(body).map_err(|e| FrameError::BadMessage(e.to_string()))?;
        if m.from != head.sender || m.to != self.id {
            return Err(FrameError::BadMessage(format!(
                "message from {} to {} in a frame from {}",
                m.from, m.to, head.sender
            )));
        }
        if !known && is_keepalive(&m) {
            return Ok(Got::Frame);
        }
        if !known && !is_leader_traffic(&m) {
            return Err(FrameError::NotMember(head.sender));
        }
        self.stats.received.fetch_add(1, Ordering::Relaxed);
        self.heard
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(head.sender, Instant::now());
        if is_keepalive(&m) {
            return Ok(Got::Frame);
        }
        if self.inbound.try_send(m).is_err() {
            self.stats.dropped_inbound.fetch_add(1, Ordering::Relaxed);
        }
        if body.capacity() > 4 * CHUNK {
            // A snapshot-sized buffer is not kept for heartbeats.
            *body = Vec::new();
        }
        Ok(Got::Frame)
    }
}

#[cfg(test)]
#[path = "transport_tests.rs"]
mod tests;
