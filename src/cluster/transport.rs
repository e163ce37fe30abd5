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
//! frame = magic "HFRT" | version u8 (1) | kind u8 | sender id u64 LE | length u32 LE | body
//! kind 0, raft:  body = one raft `Message` (protobuf), at most `max_frame` bytes
//! kind 1, chunk: body = index u64 LE | term u64 LE | file_len u64 LE | file_crc u32 LE
//!                       | offset u64 LE | bytes (at most MAX_CHUNK)
//! kind 2, ack:   body = index u64 LE | term u64 LE | offset u64 LE | flags u8 (bit 0: rewind)
//! ```
//!
//! A raft frame is the same bytes as before snapshots were chunked (the kind byte was the
//! reserved 0). Any other kind byte, or a length outside its kind's bounds, refuses the
//! connection.
//!
//! **Snapshots.** A raft `MsgSnapshot` carries a [`snapfile::Descriptor`] (the length and
//! crc32c of the snapshot file) in place of the state. The writer that takes one from its queue
//! opens `snapfile::path(data_dir, meta)` (and keeps it open: the driver may delete it
//! meanwhile), checks its length against the descriptor, and sends it as chunk frames of
//! [`CHUNK`] bytes read one at a time, with at most [`WINDOW`] bytes sent and not acknowledged;
//! ordinary messages queued meanwhile go between the chunks. When the receiver has
//! acknowledged the whole file, the `MsgSnapshot` frame goes last and the driver hears
//! [`PeerEvent::SnapshotSent`]; a missing or mismatched file, the peer leaving, or
//! [`SNAPSHOT_STALL_TIMEOUT`] without the acknowledged offset moving gives
//! [`PeerEvent::SnapshotFailed`]. A snapshot message queued during a transfer waits for it.
//!
//! Connections are one-way: the receiver acknowledges on its own connection to the sender. Its
//! reader of the sender's connection keeps one partial file per sender, `incoming-<sender>` in
//! its data directory, with the snapshot (index, term, descriptor) it belongs to, the bytes
//! held (always a prefix of the file) and their running crc32c, in memory. A chunk:
//! - of another snapshot than the one held: the partial file is dropped and a new one begun;
//! - at the offset held: written, and acknowledged with the new offset (every chunk);
//! - below it (sent again): not written, acknowledged with the offset held (a sender behind it
//!   skips ahead);
//! - beyond it (a gap): not written, answered with a rewind to the offset held (once per
//!   offset per 500 ms: the chunks in flight behind it would ask for the same).
//!
//! The sender applies acknowledgements in order: the acknowledged offset becomes what the
//! receiver holds; a rewind, or an offset beyond what it sent, makes it send from there. After
//! a reconnection it sends from the last acknowledged offset, one chunk first and the window
//! only once the receiver has answered it (so a window is not sent again when the receiver held
//! more). When the `MsgSnapshot` frame arrives, the partial file must be of that snapshot,
//! complete and match its descriptor's crc; it is synced, renamed to
//! `snapfile::received_path(dir, index, term)` and the directory synced, and only then is the
//! message handed to the driver (which installs the file by renaming it). Otherwise the message
//! is dropped and counted ([`TransportStats::snapshots_rejected`]); raft asks again. A
//! `MsgSnapshot` whose data is not a descriptor is refused. Chunks and acknowledgements are
//! accepted only from known members (acknowledgements go back on our writer to the sender); a
//! chunk that does not fit its descriptor or [`snapfile::MAX_FILE_LEN`] refuses the
//! connection. Memory: one chunk buffer per transfer and per reader, never the file.
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

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::ops::{Deref, DerefMut};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender, TrySendError};
use protobuf::Message as PbMessage;
use raft::prelude::{Message, MessageType};

use super::crc32c;
use super::snapfile::{self, Descriptor};
use crate::tls::rustls;

pub const MAGIC: &[u8; 4] = b"HFRT";
pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 18;
/// The largest raft frame accepted by default: a few MiB. A snapshot does not travel in a
/// message (its file goes in chunk frames), so the largest legitimate message is an append:
/// raft-rs packs entries up to `max_size_per_msg` (1 MiB) but always sends at least one, and
/// the owner's entries hold about 1 MiB of requests and one more
/// (`node::MAX_ENTRY_BYTES`). A node sets its cap from its largest entry
/// (`node::max_frame`, which grows with `--max-item-size`); this is the floor. The buffer grows
/// only as bytes arrive, and only after the header named an admitted sender.
pub const DEFAULT_MAX_FRAME: usize = 4 << 20;
/// Snapshot bytes per chunk frame sent.
pub const CHUNK: usize = 1 << 20;
/// The largest chunk of snapshot bytes accepted in one chunk frame (twice [`CHUNK`]).
pub const MAX_CHUNK: usize = 2 << 20;
/// Snapshot bytes sent and not yet acknowledged, per transfer, at most.
pub const WINDOW: u64 = 8 << 20;
/// A transfer whose acknowledged offset has not moved for this long fails.
pub const SNAPSHOT_STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes of a chunk frame's body before the snapshot bytes.
pub const CHUNK_HEAD_LEN: usize = 36;
/// Bytes of an acknowledgement frame's body.
pub const ACK_LEN: usize = 25;
/// An acknowledgement's flag: the receiver dropped a chunk that was not at the offset it holds;
/// the sender goes back to that offset.
const ACK_REWIND: u8 = 1;
/// A receiver sends at most one rewind for the same offset this often (the chunks in flight
/// behind a mismatched one would each ask for it again).
const REWIND_EVERY: Duration = Duration::from_millis(500);
/// How often a writer waiting for acknowledgements looks at them (and at its queue).
const ACK_POLL: Duration = Duration::from_millis(2);
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
    /// The reserved byte names no frame kind.
    BadKind(u8),
    TooLarge(usize),
    /// A frame shorter than its kind's fixed part (or an acknowledgement of another length).
    BadLength(usize),
    NotMember(u64),
    SenderChanged {
        was: u64,
        now: u64,
    },
    BadMessage(String),
    /// A chunk that does not fit its descriptor or the snapshot caps, or a node without a
    /// data directory.
    BadChunk(String),
    /// With peer TLS: bytes that are not this connection's TLS records.
    BadTls(String),
}

/// What a frame carries (the header's byte 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// One raft `Message` (byte 5 is 0: these frames are the same bytes as before chunking).
    Raft = 0,
    /// A piece of a snapshot file.
    Chunk = 1,
    /// How much of a snapshot file the receiver holds.
    Ack = 2,
}

/// A frame header, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: FrameKind,
    pub sender: u64,
    pub len: usize,
}

/// Checks a frame header (exactly [`HEADER_LEN`] bytes): a raft frame is at most `max_frame`
/// long, a chunk frame at most a chunk header and [`MAX_CHUNK`] bytes (and `max_frame`), an
/// acknowledgement exactly [`ACK_LEN`].
pub fn decode_header(h: &[u8; HEADER_LEN], max_frame: usize) -> Result<Header, FrameError> {
    if &h[..4] != MAGIC {
        return Err(FrameError::BadMagic);
    }
    if h[4] != VERSION {
        return Err(FrameError::BadVersion(h[4]));
    }
    let kind = match h[5] {
        0 => FrameKind::Raft,
        1 => FrameKind::Chunk,
        2 => FrameKind::Ack,
        k => return Err(FrameError::BadKind(k)),
    };
    let mut id = [0u8; 8];
    id.copy_from_slice(&h[6..14]);
    let len = u32::from_le_bytes([h[14], h[15], h[16], h[17]]) as usize;
    let max = match kind {
        FrameKind::Raft => max_frame,
        FrameKind::Chunk => max_frame.min(CHUNK_HEAD_LEN + MAX_CHUNK),
        FrameKind::Ack => ACK_LEN,
    };
    if len > max {
        return Err(FrameError::TooLarge(len));
    }
    let min = match kind {
        FrameKind::Raft => 0,
        FrameKind::Chunk => CHUNK_HEAD_LEN,
        FrameKind::Ack => ACK_LEN,
    };
    if len < min {
        return Err(FrameError::BadLength(len));
    }
    Ok(Header {
        kind,
        sender: u64::from_le_bytes(id),
        len,
    })
}

fn put_header(out: &mut Vec<u8>, kind: FrameKind, sender: u64, len: u32) {
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.push(kind as u8);
    out.extend_from_slice(&sender.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
}

/// Appends one frame carrying `m` to `out` (a reused buffer).
pub fn encode_frame(sender: u64, m: &Message, out: &mut Vec<u8>) -> Result<(), String> {
    let start = out.len();
    put_header(out, FrameKind::Raft, sender, 0);
    m.write_to_vec(out).map_err(|e| e.to_string())?;
    let len = out.len() - start - HEADER_LEN;
    let len32 = u32::try_from(len).map_err(|_| format!("message of {} bytes", len))?;
    out[start + 14..start + 18].copy_from_slice(&len32.to_le_bytes());
    Ok(())
}

/// The snapshot a chunk or an acknowledgement belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapId {
    pub index: u64,
    pub term: u64,
}

/// The fixed part of a chunk frame: which snapshot file (and its descriptor), and where the
/// bytes that follow go in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHead {
    pub snap: SnapId,
    pub descriptor: Descriptor,
    pub offset: u64,
}

/// Appends one chunk frame to `out`: `head` and then `bytes` (at most [`MAX_CHUNK`]).
pub fn encode_chunk(sender: u64, head: &ChunkHead, bytes: &[u8], out: &mut Vec<u8>) {
    debug_assert!(bytes.len() <= MAX_CHUNK);
    put_header(
        out,
        FrameKind::Chunk,
        sender,
        (CHUNK_HEAD_LEN + bytes.len()) as u32,
    );
    out.extend_from_slice(&head.snap.index.to_le_bytes());
    out.extend_from_slice(&head.snap.term.to_le_bytes());
    out.extend_from_slice(&head.descriptor.len.to_le_bytes());
    out.extend_from_slice(&head.descriptor.crc.to_le_bytes());
    out.extend_from_slice(&head.offset.to_le_bytes());
    out.extend_from_slice(bytes);
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// The fixed part of a chunk frame's body (at least [`CHUNK_HEAD_LEN`] bytes, as
/// [`decode_header`] checked); the snapshot bytes follow it.
pub fn decode_chunk_head(body: &[u8]) -> Result<ChunkHead, FrameError> {
    if body.len() < CHUNK_HEAD_LEN {
        return Err(FrameError::BadLength(body.len()));
    }
    let mut crc = [0u8; 4];
    crc.copy_from_slice(&body[24..28]);
    Ok(ChunkHead {
        snap: SnapId {
            index: le64(body, 0),
            term: le64(body, 8),
        },
        descriptor: Descriptor {
            len: le64(body, 16),
            crc: u32::from_le_bytes(crc),
        },
        offset: le64(body, 28),
    })
}

/// An acknowledgement: the receiver holds the first `offset` bytes of the snapshot file
/// `snap` (with `rewind`: and it dropped a chunk that did not start there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    pub snap: SnapId,
    pub offset: u64,
    pub rewind: bool,
}

/// Appends one acknowledgement frame to `out`.
pub fn encode_ack(sender: u64, a: &Ack, out: &mut Vec<u8>) {
    put_header(out, FrameKind::Ack, sender, ACK_LEN as u32);
    out.extend_from_slice(&a.snap.index.to_le_bytes());
    out.extend_from_slice(&a.snap.term.to_le_bytes());
    out.extend_from_slice(&a.offset.to_le_bytes());
    out.push(if a.rewind { ACK_REWIND } else { 0 });
}

pub fn decode_ack(body: &[u8]) -> Result<Ack, FrameError> {
    if body.len() != ACK_LEN || body[24] & !ACK_REWIND != 0 {
        return Err(FrameError::BadLength(body.len()));
    }
    Ok(Ack {
        snap: SnapId {
            index: le64(body, 0),
            term: le64(body, 8),
        },
        offset: le64(body, 16),
        rewind: body[24] & ACK_REWIND != 0,
    })
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
    /// Snapshot bytes written to peers in chunk frames (resent ones too).
    pub snapshot_bytes_sent: AtomicU64,
    /// Snapshot bytes received in chunks and written to an incoming file.
    pub snapshot_bytes_received: AtomicU64,
    /// Outbound transfers begun, ended with the snapshot message written, failed (reported as
    /// [`PeerEvent::SnapshotFailed`]), and reconnections within a transfer that went on from an
    /// acknowledged offset (not from the start).
    pub snapshot_transfers_started: AtomicU64,
    pub snapshot_transfers_completed: AtomicU64,
    pub snapshot_transfers_failed: AtomicU64,
    pub snapshot_transfers_resumed: AtomicU64,
    /// Inbound snapshot messages handed to the driver with their file in place, and those
    /// dropped (file incomplete, checksum or descriptor mismatch, no data directory).
    pub snapshots_received: AtomicU64,
    pub snapshots_rejected: AtomicU64,
    /// Inbound chunks not at the offset held (answered with a rewind), not written.
    pub snapshot_chunks_dropped: AtomicU64,
    /// Per peer: snapshot bytes sent and not yet acknowledged (0 when no transfer runs).
    pub snapshot_in_flight: Mutex<BTreeMap<u64, u64>>,
    /// The most snapshot bytes in flight to one peer ever seen (never above [`WINDOW`]).
    pub snapshot_in_flight_max: AtomicU64,
}

impl TransportStats {
    /// Per peer: snapshot bytes sent and not yet acknowledged.
    pub fn snapshot_bytes_in_flight(&self) -> BTreeMap<u64, u64> {
        self.snapshot_in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_in_flight(&self, peer: u64, bytes: u64) {
        self.snapshot_in_flight_max
            .fetch_max(bytes, Ordering::Relaxed);
        self.snapshot_in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(peer, bytes);
    }
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
    /// The data directory: where snapshot files to send are (`snapfile::path`) and where
    /// received ones are written (`incoming-<sender>`, then `snapfile::received_path`). None:
    /// snapshots are neither sent nor received.
    pub data_dir: Option<PathBuf>,
    /// Tests: each writer cuts its connection once, when a transfer's acknowledged offset has
    /// reached this many bytes.
    #[cfg(test)]
    pub cut_at: Option<u64>,
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
            data_dir: None,
            #[cfg(test)]
            cut_at: None,
        }
    }
}

/// The running transport of one node. Dropping it stops every thread it started.
pub struct Transport {
    id: u64,
    local: SocketAddr,
    /// Per peer: where its writer connects, and its queue.
    outbound: BTreeMap<u64, (SocketAddr, Sender<Out>)>,
    /// Per peer: the snapshot acknowledgements between its writer and the readers.
    links: Links,
    data_dir: Option<PathBuf>,
    #[cfg(test)]
    cut_at: Option<u64>,
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
        let links: Links = Arc::new(Mutex::new(BTreeMap::new()));
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
                links: links.clone(),
                data_dir: cfg.data_dir.clone(),
                incoming: Arc::new(Mutex::new(BTreeMap::new())),
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
            links,
            data_dir: cfg.data_dir,
            #[cfg(test)]
            cut_at: cfg.cut_at,
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
        for (id, link) in self.links.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            if !self.outbound.contains_key(id) {
                // A departed peer's writer must see its queue disconnected and stop.
                *link.wake.lock().unwrap_or_else(|e| e.into_inner()) = None;
            }
        }
        for (&peer, &addr) in peers {
            if peer == self.id || self.outbound.contains_key(&peer) {
                continue;
            }
            let (tx, rx) = bounded(self.queue_len);
            let link = link(&self.links, peer);
            *link.wake.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx.clone());
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
                data_dir: self.data_dir.clone(),
                link,
                #[cfg(test)]
                cut_at: self.cut_at,
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
            Some((_, q)) => match q.try_send(Out::Msg(m)) {
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
        for link in self
            .links
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            *link.wake.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// What a writer's queue carries.
enum Out {
    Msg(Message),
    /// A reader left an acknowledgement for this peer in the link: write it now.
    Wake,
}

fn is_snapshot(m: &Message) -> bool {
    m.get_msg_type() == MessageType::MsgSnapshot
}

/// Acknowledgements from one peer queued for our writer at most (one per chunk: a window's
/// worth is a few; more means the writer is gone).
const MAX_ACKS_QUEUED: usize = 1024;

/// Per peer: what our writer to it and our readers of its connections share about snapshot
/// transfers (connections are one-way: acknowledgements go back on our own connection to it).
#[derive(Default)]
struct Link {
    /// Acknowledgements from that peer, in the order they came (our reader of its connection
    /// pushes, our writer to it takes).
    acks_in: Mutex<VecDeque<Ack>>,
    /// The latest acknowledgement we owe that peer (our reader of its chunks sets it, our
    /// writer to it writes it with its next write).
    ack_out: Mutex<Option<Ack>>,
    ack_pending: AtomicBool,
    /// Our writer's queue to that peer, to wake it for an acknowledgement.
    wake: Mutex<Option<Sender<Out>>>,
}

type Links = Arc<Mutex<BTreeMap<u64, Arc<Link>>>>;

fn link(links: &Links, id: u64) -> Arc<Link> {
    links
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(id)
        .or_default()
        .clone()
}

impl Link {
    /// Owe the peer `a`, replacing an older one not yet written (each says all the receiver
    /// holds; a rewind followed by progress means the sender went back already).
    fn owe(&self, a: Ack) {
        *self.ack_out.lock().unwrap_or_else(|e| e.into_inner()) = Some(a);
        if !self.ack_pending.swap(true, Ordering::AcqRel) {
            if let Some(tx) = self.wake.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                let _ = tx.try_send(Out::Wake);
            }
        }
    }

    /// The acknowledgement owed, if any (one atomic load when none is).
    fn take_owed(&self) -> Option<Ack> {
        if !self.ack_pending.swap(false, Ordering::AcqRel) {
            return None;
        }
        self.ack_out
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// An acknowledgement that could not be written: owed again unless a newer one is.
    fn owe_again(&self, a: Ack) {
        let mut out = self.ack_out.lock().unwrap_or_else(|e| e.into_inner());
        if out.is_none() {
            *out = Some(a);
            self.ack_pending.store(true, Ordering::Release);
        }
    }

    fn heard_ack(&self, a: Ack) {
        let mut q = self.acks_in.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= MAX_ACKS_QUEUED {
            q.pop_front();
        }
        q.push_back(a);
    }

    fn next_ack(&self) -> Option<Ack> {
        self.acks_in
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
    }
}

struct Writer {
    id: u64,
    peer: u64,
    addr: SocketAddr,
    /// The name the peer's certificate must carry (with TLS).
    name: String,
    tls: Option<PeerTls>,
    rx: Receiver<Out>,
    events: Sender<PeerEvent>,
    stats: Arc<TransportStats>,
    shutdown: Arc<AtomicBool>,
    data_dir: Option<PathBuf>,
    link: Arc<Link>,
    #[cfg(test)]
    cut_at: Option<u64>,
}

/// A writer's connection, and what it reuses from one write to the next.
struct Conn {
    stream: Option<Stream>,
    backoff: Duration,
    retry_at: Instant,
    buf: Vec<u8>,
    batch: Vec<Message>,
    /// Snapshot messages taken from the queue during a write or a transfer, in order.
    snapshots: VecDeque<Message>,
    /// Connections made (a transfer notices a reconnection by it).
    connects: u64,
}

impl Writer {
    fn run(self) {
        let mut c = Conn {
            stream: None,
            backoff: BACKOFF_MIN,
            retry_at: Instant::now(),
            buf: Vec::new(),
            batch: Vec::new(),
            snapshots: VecDeque::new(),
            connects: 0,
        };
        loop {
            if self.shutdown.load(Ordering::Relaxed) {
                return;
            }
            if let Some(m) = c.snapshots.pop_front() {
                self.transfer(m, &mut c);
                continue;
            }
            match self.rx.recv_timeout(POLL) {
                Ok(Out::Msg(m)) if is_snapshot(&m) => self.transfer(m, &mut c),
                Ok(Out::Msg(m)) => {
                    self.round(&mut c, Some(m), None);
                }
                Ok(Out::Wake) | Err(RecvTimeoutError::Timeout) => {
                    if self.link.ack_pending.load(Ordering::Acquire) {
                        self.round(&mut c, None, None);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// Connects unless connected or the backoff says not yet.
    fn connect_now(&self, c: &mut Conn) {
        if c.stream.is_some() || Instant::now() < c.retry_at {
            return;
        }
        match self.connect() {
            Ok(s) => {
                self.stats.connects.fetch_add(1, Ordering::Relaxed);
                c.backoff = BACKOFF_MIN;
                c.stream = Some(s);
                c.connects += 1;
            }
            Err(_) => {
                let _ = self.events.try_send(PeerEvent::Unreachable(self.peer));
                c.retry_at = Instant::now() + c.backoff;
                c.backoff = (c.backoff * 2).min(BACKOFF_MAX);
            }
        }
    }

    /// One write: the acknowledgement owed to the peer, `first` and the ordinary messages
    /// queued behind it (a snapshot message among them waits in `c.snapshots`, and those behind
    /// it in the queue), then `tail` (one encoded frame: a chunk, or a transfer's snapshot
    /// message). Without a connection, or when the write fails, the messages are dropped and
    /// false is returned.
    fn round(&self, c: &mut Conn, first: Option<Message>, tail: Option<&[u8]>) -> bool {
        self.connect_now(c);
        let owed = self.link.take_owed();
        c.batch.clear();
        c.batch.extend(first);
        while c.batch.len() < 256 {
            match self.rx.try_recv() {
                Ok(Out::Msg(m)) if is_snapshot(&m) => {
                    c.snapshots.push_back(m);
                    break;
                }
                Ok(Out::Msg(m)) => c.batch.push(m),
                Ok(Out::Wake) => {}
                Err(_) => break,
            }
        }
        let Some(s) = c.stream.as_mut() else {
            for m in &c.batch {
                self.lost(m);
            }
            if let Some(a) = owed {
                self.link.owe_again(a);
            }
            return false;
        };
        // Whole frames, and through TLS all of them handed to the socket (`flush`).
        c.buf.clear();
        if let Some(a) = &owed {
            encode_ack(self.id, a, &mut c.buf);
        }
        for m in &c.batch {
            if encode_frame(self.id, m, &mut c.buf).is_err() {
                self.lost(m);
            }
        }
        let written = s
            .write_all(&c.buf)
            .and_then(|()| tail.map_or(Ok(()), |t| s.write_all(t)))
            .and_then(|()| s.flush());
        if written.is_err() {
            c.stream = None;
            c.retry_at = Instant::now() + c.backoff;
            for m in &c.batch {
                self.lost(m);
            }
            if let Some(a) = owed {
                self.link.owe_again(a);
            }
            let _ = self.events.try_send(PeerEvent::Unreachable(self.peer));
            return false;
        }
        self.stats
            .sent
            .fetch_add(c.batch.len() as u64, Ordering::Relaxed);
        true
    }

    /// Waits up to `d` for the queue, writing what comes (see [`Writer::round`]). False when the
    /// queue is gone (the peer departed).
    fn idle(&self, c: &mut Conn, d: Duration) -> bool {
        match self.rx.recv_timeout(d) {
            Ok(Out::Msg(m)) if is_snapshot(&m) => c.snapshots.push_back(m),
            Ok(Out::Msg(m)) => {
                self.round(c, Some(m), None);
            }
            Ok(Out::Wake) | Err(RecvTimeoutError::Timeout) => {
                if self.link.ack_pending.load(Ordering::Acquire) {
                    self.round(c, None, None);
                }
            }
            Err(RecvTimeoutError::Disconnected) => return false,
        }
        true
    }

    /// Sends snapshot message `m`: its file in chunks, then the message, and tells the driver.
    fn transfer(&self, m: Message, c: &mut Conn) {
        let result = self.try_transfer(&m, c);
        self.stats.set_in_flight(self.peer, 0);
        match result {
            Ok(()) => {
                self.stats.sent.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .snapshot_transfers_completed
                    .fetch_add(1, Ordering::Relaxed);
                let _ = self.events.try_send(PeerEvent::SnapshotSent(self.peer));
            }
            Err(why) => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .snapshot_transfers_failed
                    .fetch_add(1, Ordering::Relaxed);
                if !self.shutdown.load(Ordering::Relaxed) {
                    crate::log_warn!(
                        "peer transport: the snapshot at index {} for {} was not sent: {why}",
                        m.get_snapshot().get_metadata().index,
                        self.peer
                    );
                }
                let _ = self.events.try_send(PeerEvent::SnapshotFailed(self.peer));
            }
        }
    }

    fn try_transfer(&self, m: &Message, c: &mut Conn) -> Result<(), String> {
        let dir = self.data_dir.as_ref().ok_or("no data directory")?;
        let d = Descriptor::decode(m.get_snapshot().get_data())
            .ok_or("the message's data is not a snapshot descriptor")?;
        let meta = m.get_snapshot().get_metadata();
        let snap = SnapId {
            index: meta.index,
            term: meta.term,
        };
        let path = snapfile::path(dir, meta);
        // Kept open: the driver may delete the file meanwhile (a newer snapshot replaced it).
        let file = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let len = file
            .metadata()
            .map_err(|e| format!("{}: {e}", path.display()))?
            .len();
        if len != d.len {
            return Err(format!(
                "{} has {len} bytes, its descriptor {}",
                path.display(),
                d.len
            ));
        }
        let mut message = Vec::new();
        encode_frame(self.id, m, &mut message)?;
        self.stats
            .snapshot_transfers_started
            .fetch_add(1, Ordering::Relaxed);
        while self.link.next_ack().is_some() {}
        let mut chunk = vec![0u8; CHUNK];
        let mut frame = Vec::with_capacity(HEADER_LEN + CHUNK_HEAD_LEN + CHUNK);
        // Bytes written (from 0, or from where the receiver said it holds), and held by the
        // receiver as far as its acknowledgements said.
        let (mut sent, mut acked) = (0u64, 0u64);
        let mut progress_at = Instant::now();
        let mut connects = c.connects;
        // After a reconnection: one chunk goes first, and the rest waits for the receiver's
        // answer to it (it may hold more than we knew, or less), so that a window is not sent
        // again for nothing. `probe_end`: where that chunk ends once sent (0: not yet).
        let (mut probing, mut probe_end) = (false, 0u64);
        #[cfg(test)]
        let mut cut_at = self.cut_at;
        loop {
            if self.shutdown.load(Ordering::Relaxed) {
                return Err("shutting down".into());
            }
            while let Some(a) = self.link.next_ack() {
                if a.snap != snap {
                    continue;
                }
                let at = a.offset.min(d.len);
                if at != acked {
                    progress_at = Instant::now();
                }
                acked = at;
                if at > sent && sent == 0 {
                    // The receiver kept part of this file from an earlier attempt (or its
                    // acknowledgements were lost with a connection): go on from there.
                    self.stats
                        .snapshot_transfers_resumed
                        .fetch_add(1, Ordering::Relaxed);
                }
                if a.rewind || at > sent {
                    sent = at;
                }
                if probing && (a.rewind || (probe_end > 0 && at >= probe_end)) {
                    probing = false;
                }
            }
            self.stats.set_in_flight(self.peer, sent - acked);
            #[cfg(test)]
            if cut_at.is_some_and(|n| acked >= n) {
                cut_at = None;
                if let Some(s) = &c.stream {
                    let _ = s.tcp().shutdown(std::net::Shutdown::Both);
                }
            }
            if progress_at.elapsed() > SNAPSHOT_STALL_TIMEOUT {
                return Err(format!(
                    "no progress for {:?} ({acked} of {} bytes acknowledged)",
                    SNAPSHOT_STALL_TIMEOUT, d.len
                ));
            }
            if c.stream.is_none() {
                self.connect_now(c);
                if c.stream.is_none() {
                    let wait = c.retry_at.saturating_duration_since(Instant::now());
                    if !self.idle(c, wait.clamp(ACK_POLL, POLL)) {
                        return Err("the peer departed".into());
                    }
                    continue;
                }
            }
            if c.connects != connects {
                // A new connection: what was written after the last acknowledgement may be
                // lost; go on from there (the receiver corrects us if it holds more or less).
                connects = c.connects;
                if acked > 0 && sent > 0 {
                    self.stats
                        .snapshot_transfers_resumed
                        .fetch_add(1, Ordering::Relaxed);
                }
                sent = acked;
                (probing, probe_end) = (true, 0);
            }
            if acked >= d.len {
                // The receiver holds the whole file: the message goes last.
                if self.round(c, None, Some(&message)) {
                    return Ok(());
                }
                continue;
            }
            let n = (d.len - sent).min(CHUNK as u64);
            let may = !probing || probe_end == 0;
            if may && sent < d.len && sent - acked + n <= WINDOW {
                let bytes = &mut chunk[..n as usize];
                file.read_exact_at(bytes, sent)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                frame.clear();
                let head = ChunkHead {
                    snap,
                    descriptor: d,
                    offset: sent,
                };
                encode_chunk(self.id, &head, bytes, &mut frame);
                if self.round(c, None, Some(&frame)) {
                    sent += n;
                    if probing {
                        probe_end = sent;
                    }
                    self.stats
                        .snapshot_bytes_sent
                        .fetch_add(n, Ordering::Relaxed);
                    self.stats.set_in_flight(self.peer, sent - acked);
                }
                continue;
            }
            if !self.idle(c, ACK_POLL) {
                return Err("the peer departed".into());
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
    links: Links,
    data_dir: Option<PathBuf>,
    /// Per sender: the snapshot file it is sending us, as far as received.
    incoming: Incoming,
}

/// A snapshot file being received from one sender (`incoming-<sender>` in the data directory).
struct Partial {
    snap: SnapId,
    descriptor: Descriptor,
    file: File,
    /// Bytes written, from the file's start, and their crc32c.
    held: u64,
    crc: u32,
    /// The latest rewind sent: its offset and when.
    rewound: Option<(u64, Instant)>,
}

type Incoming = Arc<Mutex<BTreeMap<u64, Partial>>>;

/// Where the snapshot file `sender` is sending us is written as it arrives.
pub fn incoming_path(dir: &Path, sender: u64) -> PathBuf {
    dir.join(format!("incoming-{sender}"))
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
        // Grow as the bytes arrive: a lying length costs at most one step.
        body.clear();
        const STEP: usize = 64 << 10;
        while body.len() < head.len {
            let start = body.len();
            let n = (head.len - start).min(STEP);
            body.resize(start + n, 0);
            if !self.fill(s, &mut body[start..], deadline)? {
                return Ok(Got::Closed);
            }
        }
        match head.kind {
            FrameKind::Raft => {}
            // Only from members: an acknowledgement goes back on our writer to the sender.
            _ if !known => return Err(FrameError::NotMember(head.sender)),
            FrameKind::Chunk => {
                self.chunk(head.sender, body)?;
                self.note_heard(head.sender);
                if body.capacity() > 2 * MAX_CHUNK {
                    *body = Vec::new();
                }
                return Ok(Got::Frame);
            }
            FrameKind::Ack => {
                let a = decode_ack(body)?;
                link(&self.links, head.sender).heard_ack(a);
                self.note_heard(head.sender);
                return Ok(Got::Frame);
            }
        }
        let m =
            Message::parse_from_bytes(body).map_err(|e| FrameError::BadMessage(e.to_string()))?;
        // raft-rs forwards proposals and read requests as they came to it, with the `from` of
        // the node that sent them first (a node that no longer leads, to the leader it knows):
        // those may name another member.
        let forwarded = matches!(
            m.get_msg_type(),
            MessageType::MsgPropose | MessageType::MsgReadIndex
        ) && m.from != self.id
            && self
                .members
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .knows(m.from);
        if (m.from != head.sender && !forwarded) || m.to != self.id {
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
        if is_snapshot(&m) {
            let Some(d) = Descriptor::decode(m.get_snapshot().get_data()) else {
                return Err(FrameError::BadMessage(
                    "a snapshot message whose data is not a snapshot descriptor".into(),
                ));
            };
            self.note_heard(head.sender);
            if let Err(why) = self.install(head.sender, &m, d) {
                self.stats
                    .snapshots_rejected
                    .fetch_add(1, Ordering::Relaxed);
                crate::log_warn!(
                    "peer transport: the snapshot at index {} from {} was dropped: {why}",
                    m.get_snapshot().get_metadata().index,
                    head.sender
                );
                return Ok(Got::Frame);
            }
            self.stats
                .snapshots_received
                .fetch_add(1, Ordering::Relaxed);
        }
        self.stats.received.fetch_add(1, Ordering::Relaxed);
        self.note_heard(head.sender);
        if is_keepalive(&m) {
            return Ok(Got::Frame);
        }
        let received = is_snapshot(&m).then(|| {
            let meta = m.get_snapshot().get_metadata();
            (meta.index, meta.term)
        });
        if self.inbound.try_send(m).is_err() {
            self.stats.dropped_inbound.fetch_add(1, Ordering::Relaxed);
            // A snapshot file nobody will install (the leader sends another).
            if let (Some((index, term)), Some(dir)) = (received, &self.data_dir) {
                let _ = std::fs::remove_file(snapfile::received_path(dir, index, term));
            }
        }
        if body.capacity() > 4 * STEP {
            // A snapshot-sized buffer is not kept for heartbeats.
            *body = Vec::new();
        }
        Ok(Got::Frame)
    }

    fn note_heard(&self, sender: u64) {
        self.heard
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(sender, Instant::now());
    }

    /// A chunk frame's body from `sender` (a member): written if it starts where the file held
    /// ends, answered with a rewind to there if not. Bytes that do not fit their descriptor or
    /// the caps refuse the connection; a local failure (the disk) drops the partial file.
    fn chunk(&self, sender: u64, body: &[u8]) -> Result<(), FrameError> {
        let dir = self
            .data_dir
            .as_ref()
            .ok_or_else(|| FrameError::BadChunk("no data directory".into()))?;
        let h = decode_chunk_head(body)?;
        let bytes = &body[CHUNK_HEAD_LEN..];
        let d = h.descriptor;
        let end = h.offset.checked_add(bytes.len() as u64);
        if d.len > snapfile::MAX_FILE_LEN || end.is_none_or(|end| end > d.len) {
            return Err(FrameError::BadChunk(format!(
                "{} bytes at {} of a file of {}",
                bytes.len(),
                h.offset,
                d.len
            )));
        }
        let path = incoming_path(dir, sender);
        let mut map = self.incoming.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = !map
            .get(&sender)
            .is_some_and(|p| p.snap == h.snap && p.descriptor == d);
        if fresh {
            // Another snapshot than the one held (if any): only one per sender is kept.
            if map.remove(&sender).is_some() {
                let _ = std::fs::remove_file(&path);
            }
            let file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path);
            let file = match file {
                Ok(f) => f,
                Err(e) => {
                    crate::log_error!("peer transport: {}: {e}", path.display());
                    return Ok(());
                }
            };
            map.insert(
                sender,
                Partial {
                    snap: h.snap,
                    descriptor: d,
                    file,
                    held: 0,
                    crc: 0,
                    rewound: None,
                },
            );
        }
        let Some(p) = map.get_mut(&sender) else {
            return Ok(());
        };
        let ack = if h.offset < p.held {
            // Bytes held already (sent again after a reconnection or a rewind): the sender
            // learns how far we are, and skips ahead if it is behind.
            self.stats
                .snapshot_chunks_dropped
                .fetch_add(1, Ordering::Relaxed);
            Ack {
                snap: h.snap,
                offset: p.held,
                rewind: false,
            }
        } else if h.offset > p.held {
            // A gap (bytes lost with a connection, or we lost the file): the sender goes back.
            // The chunks it had in flight behind this one ask for the same: once is enough.
            self.stats
                .snapshot_chunks_dropped
                .fetch_add(1, Ordering::Relaxed);
            let now = Instant::now();
            if p.rewound
                .is_some_and(|(at, t)| at == p.held && now < t + REWIND_EVERY)
            {
                return Ok(());
            }
            p.rewound = Some((p.held, now));
            Ack {
                snap: h.snap,
                offset: p.held,
                rewind: true,
            }
        } else if let Err(e) = p.file.write_all(bytes) {
            crate::log_error!("peer transport: {}: {e}", path.display());
            map.remove(&sender);
            let _ = std::fs::remove_file(&path);
            Ack {
                snap: h.snap,
                offset: 0,
                rewind: true,
            }
        } else {
            p.crc = crc32c::extend(p.crc, bytes);
            p.held += bytes.len() as u64;
            self.stats
                .snapshot_bytes_received
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            Ack {
                snap: h.snap,
                offset: p.held,
                rewind: false,
            }
        };
        drop(map);
        link(&self.links, sender).owe(ack);
        Ok(())
    }

    /// A snapshot message from `sender` whose data is descriptor `d`: its file must have
    /// arrived whole and match `d`; it is synced, renamed to `snapfile::received_path` and the
    /// directory synced, before the message may go to the driver.
    fn install(&self, sender: u64, m: &Message, d: Descriptor) -> Result<(), String> {
        let dir = self.data_dir.as_ref().ok_or("no data directory")?;
        let meta = m.get_snapshot().get_metadata();
        let snap = SnapId {
            index: meta.index,
            term: meta.term,
        };
        let p = {
            let mut map = self.incoming.lock().unwrap_or_else(|e| e.into_inner());
            match map.get(&sender) {
                None => return Err("none of its file was received".into()),
                Some(p) if p.snap != snap || p.descriptor != d => {
                    return Err("the file received is of another snapshot".into())
                }
                Some(p) if p.held != d.len => {
                    return Err(format!("{} of its {} bytes received", p.held, d.len))
                }
                Some(_) => {}
            }
            map.remove(&sender).ok_or("gone")?
        };
        let from = incoming_path(dir, sender);
        let io = |e: io::Error| format!("{}: {e}", from.display());
        if p.crc != d.crc {
            drop(p.file);
            let _ = std::fs::remove_file(&from);
            return Err(format!(
                "the file received has crc32c {:08x}, its descriptor {:08x}",
                p.crc, d.crc
            ));
        }
        p.file.sync_all().map_err(io)?;
        drop(p.file);
        let to = snapfile::received_path(dir, snap.index, snap.term);
        std::fs::rename(&from, &to).map_err(io)?;
        File::open(dir).and_then(|f| f.sync_all()).map_err(io)?;
        Ok(())
    }
}

#[cfg(test)]
#[path = "transport_tests.rs"]
mod tests;
