use std::net::Shutdown;
use std::sync::Mutex;

use super::*;

fn msg(from: u64, to: u64, term: u64) -> Message {
    Message {
        from,
        to,
        term,
        msg_type: MessageType::MsgHeartbeat,
        ..Default::default()
    }
}

fn listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").expect("bind")
}

fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {}", what);
        thread::sleep(Duration::from_millis(5));
    }
}

fn header(magic: &[u8; 4], version: u8, sender: u64, len: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(magic);
    h[4] = version;
    h[6..14].copy_from_slice(&sender.to_le_bytes());
    h[14..].copy_from_slice(&len.to_le_bytes());
    h
}

fn kind_header(kind: u8, sender: u64, len: u32) -> [u8; HEADER_LEN] {
    let mut h = header(MAGIC, 1, sender, len);
    h[5] = kind;
    h
}

#[test]
fn headers_are_checked() {
    let raft = |sender, len| {
        Ok(Header {
            kind: FrameKind::Raft,
            sender,
            len,
        })
    };
    let chunk_max = CHUNK_HEAD_LEN + MAX_CHUNK;
    let cases: &[([u8; HEADER_LEN], Result<Header, FrameError>)] = &[
        (header(MAGIC, 1, 2, 10), raft(2, 10)),
        (header(MAGIC, 1, 2, 1000), raft(2, 1000)),
        (header(MAGIC, 1, 2, 1001), Err(FrameError::TooLarge(1001))),
        (
            header(MAGIC, 1, 2, u32::MAX),
            Err(FrameError::TooLarge(u32::MAX as usize)),
        ),
        (header(b"HFRU", 1, 2, 10), Err(FrameError::BadMagic)),
        (header(b"GET ", 1, 2, 10), Err(FrameError::BadMagic)),
        (header(MAGIC, 2, 2, 10), Err(FrameError::BadVersion(2))),
        (header(MAGIC, 0, 2, 10), Err(FrameError::BadVersion(0))),
        (kind_header(3, 2, 10), Err(FrameError::BadKind(3))),
        (kind_header(0xff, 2, 10), Err(FrameError::BadKind(0xff))),
        (
            kind_header(1, 2, chunk_max as u32),
            Ok(Header {
                kind: FrameKind::Chunk,
                sender: 2,
                len: chunk_max,
            }),
        ),
        (
            kind_header(1, 2, chunk_max as u32 + 1),
            Err(FrameError::TooLarge(chunk_max + 1)),
        ),
        (
            kind_header(1, 2, CHUNK_HEAD_LEN as u32 - 1),
            Err(FrameError::BadLength(CHUNK_HEAD_LEN - 1)),
        ),
        (
            kind_header(2, 2, ACK_LEN as u32),
            Ok(Header {
                kind: FrameKind::Ack,
                sender: 2,
                len: ACK_LEN,
            }),
        ),
        (
            kind_header(2, 2, ACK_LEN as u32 + 1),
            Err(FrameError::TooLarge(ACK_LEN + 1)),
        ),
        (
            kind_header(2, 2, ACK_LEN as u32 - 1),
            Err(FrameError::BadLength(ACK_LEN - 1)),
        ),
    ];
    for (h, want) in cases {
        let max = if h[5] == 0 { 1000 } else { DEFAULT_MAX_FRAME };
        assert_eq!(&decode_header(h, max), want, "{:?}", h);
    }
}

#[test]
fn a_frame_round_trips() {
    let mut m = msg(3, 1, 7);
    m.set_msg_type(MessageType::MsgAppend);
    m.index = 41;
    let mut buf = vec![0xaa]; // frames append to what the buffer holds
    encode_frame(3, &m, &mut buf).unwrap();
    let h: [u8; HEADER_LEN] = buf[1..1 + HEADER_LEN].try_into().unwrap();
    let head = decode_header(&h, DEFAULT_MAX_FRAME).unwrap();
    assert_eq!(head.sender, 3);
    assert_eq!(head.len, buf.len() - 1 - HEADER_LEN);
    assert_eq!(
        Message::parse_from_bytes(&buf[1 + HEADER_LEN..]).unwrap(),
        m
    );
}

/// The largest legitimate raft message fits the frame cap: an append of one entry as large as
/// a log record (raft-rs sends at least one entry whatever `max_size_per_msg` says), with every
/// other field at its largest; and an append of `max_size_per_msg` (1 MiB, node.rs) worth of
/// the smallest entries (their framing is the overhead).
#[test]
fn the_largest_append_fits_the_frame_cap() {
    // The owner's largest entry with the largest --max-item-size a cluster takes.
    let max_entry = crate::cluster::node::max_entry_bytes(crate::config::MAX_CLUSTER_ITEM_SIZE);
    let cap = crate::cluster::node::max_frame(max_entry);
    assert!(cap < super::super::storage::MAX_RECORD_LEN);
    let mut e = raft::prelude::Entry {
        term: u64::MAX,
        index: u64::MAX,
        ..Default::default()
    };
    e.set_entry_type(raft::prelude::EntryType::EntryConfChangeV2);
    e.context = vec![0xff; 64].into();
    e.data = vec![0xab; max_entry].into();
    let mut m = msg(u64::MAX, u64::MAX, u64::MAX);
    m.set_msg_type(MessageType::MsgAppend);
    (m.log_term, m.index, m.commit, m.reject_hint) = (u64::MAX, u64::MAX, u64::MAX, u64::MAX);
    m.context = vec![0xff; 64].into();
    m.entries = vec![e].into();
    let mut buf = Vec::new();
    encode_frame(u64::MAX, &m, &mut buf).unwrap();
    assert!(buf.len() - HEADER_LEN <= cap);
    // With the default --max-item-size, a few MiB.
    assert!(
        crate::cluster::node::max_frame(crate::cluster::node::max_entry_bytes(1 << 20)) <= 4 << 20
    );

    let small = raft::prelude::Entry {
        term: 1,
        index: 1,
        ..Default::default()
    };
    let n = (1 << 20) / small.compute_size() as usize;
    m.entries = vec![small; n].into();
    buf.clear();
    encode_frame(u64::MAX, &m, &mut buf).unwrap();
    assert!(buf.len() - HEADER_LEN <= DEFAULT_MAX_FRAME);
}

/// Two nodes, then the second killed and restarted on the same address: the first never blocks
/// meanwhile, hears that the peer is unreachable, and reconnects by itself.
#[test]
fn peers_exchange_messages_and_reconnect_after_a_restart() {
    let (la, lb) = (listener(), listener());
    let (aa, ab) = (la.local_addr().unwrap(), lb.local_addr().unwrap());
    let peers: BTreeMap<u64, SocketAddr> = [(1, aa), (2, ab)].into_iter().collect();
    let a = Transport::start(TransportConfig::new(1, peers.clone()), la).unwrap();
    let b = Transport::start(TransportConfig::new(2, peers.clone()), lb).unwrap();
    assert!(a.send(msg(1, 2, 5)));
    let got = wait_for("b receives", || b.try_recv());
    assert_eq!((got.from, got.to, got.term), (1, 2, 5));
    assert!(b.send(msg(2, 1, 6)));
    assert_eq!(wait_for("a receives", || a.try_recv()).term, 6);

    drop(b);
    // While b is gone: sends return at once and are dropped, and a hears of it.
    let t = Instant::now();
    wait_for("a notices b is unreachable", || {
        a.send(msg(1, 2, 7));
        thread::sleep(Duration::from_millis(2));
        a.try_event().filter(|e| *e == PeerEvent::Unreachable(2))
    });
    let sent_before = a.stats().sent.load(Ordering::Relaxed);
    for _ in 0..10_000 {
        a.send(msg(1, 2, 8));
    }
    assert!(t.elapsed() < Duration::from_secs(5), "send blocked");
    assert!(a.stats().dropped.load(Ordering::Relaxed) > 0);

    // b comes back on the same address; a's writer reconnects with its backoff.
    let lb2 = TcpListener::bind(ab).expect("rebind the peer's port");
    let b2 = Transport::start(TransportConfig::new(2, peers), lb2).unwrap();
    // Messages queued before the reconnect may arrive first: drain them all each round.
    let got = wait_for("b2 receives after reconnect", || {
        a.send(msg(1, 2, 9));
        let first = b2.recv_timeout(Duration::from_millis(20));
        first
            .into_iter()
            .chain(std::iter::from_fn(|| b2.try_recv()))
            .find(|m| m.term == 9)
    });
    assert_eq!(got.from, 1);
    assert!(a.stats().sent.load(Ordering::Relaxed) > sent_before);
    assert!(a.stats().connects.load(Ordering::Relaxed) >= 2);
}

/// Each hostile input closes that connection, is counted, and leaves the node serving its
/// real peers.
#[test]
fn garbage_and_impostors_are_refused() {
    let (la, lb) = (listener(), listener());
    let (aa, ab) = (la.local_addr().unwrap(), lb.local_addr().unwrap());
    let peers: BTreeMap<u64, SocketAddr> = [(1, aa), (2, ab)].into_iter().collect();
    let mut a = Transport::start(TransportConfig::new(1, peers.clone()), la).unwrap();
    a.set_removed(&[5].into_iter().collect());

    let good = |from: u64, to: u64| {
        let mut v = Vec::new();
        encode_frame(from, &msg(from, to, 1), &mut v).unwrap();
        v
    };
    let mut wrong_version = good(2, 1);
    wrong_version[4] = 9;
    let mut lying_from = Vec::new();
    encode_frame(2, &msg(3, 1, 1), &mut lying_from).unwrap();
    let mut not_protobuf = header(MAGIC, 1, 2, 4).to_vec();
    not_protobuf.extend_from_slice(&[0xff, 0xff, 0xff, 0xff]);
    let mut changed_sender = good(2, 1);
    changed_sender.extend_from_slice(&good(3, 1));
    // A stranger may send only a leader's traffic (see `MemberSet`): its vote request is refused.
    let mut stranger_vote = Vec::new();
    let mut vote = msg(7, 1, 1);
    vote.set_msg_type(MessageType::MsgRequestPreVote);
    encode_frame(7, &vote, &mut stranger_vote).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        ("wrong version", wrong_version),
        ("not a member", stranger_vote),
        ("a removed member", good(5, 1)),
        ("ourselves", good(1, 1)),
        ("for someone else", good(2, 3)),
        ("from field lies", lying_from),
        ("huge length", header(MAGIC, 1, 2, u32::MAX).to_vec()),
        ("not protobuf", not_protobuf),
        ("sender changes", changed_sender),
    ];
    for (i, (what, bytes)) in cases.iter().enumerate() {
        let mut s = TcpStream::connect(aa).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(bytes).unwrap();
        let mut buf = [0u8; 16];
        // The node closes the connection: EOF or a reset, never a hang.
        match s.read(&mut buf) {
            Ok(0) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
            other => panic!("{}: connection not closed: {:?}", what, other),
        }
        wait_for(what, || {
            (a.stats().refused.load(Ordering::Relaxed) == i as u64 + 1).then_some(())
        });
        let _ = s.shutdown(Shutdown::Both);
    }
    // "sender changes" delivered its first, valid frame before the impostor's.
    assert_eq!(wait_for("the one valid frame", || a.try_recv()).from, 2);
    assert!(a.try_recv().is_none(), "nothing hostile got through");

    // The real peer still gets through.
    let b = Transport::start(TransportConfig::new(2, peers), lb).unwrap();
    b.send(msg(2, 1, 42));
    assert_eq!(wait_for("a receives from b", || a.try_recv()).term, 42);
}

/// raft-rs forwards proposals and read requests as they came, with the `from` of the member
/// that sent them first: such a message in another member's frame is delivered; any other
/// message whose `from` is not its frame's sender, or a forward naming a stranger, is refused.
#[test]
fn forwarded_proposals_and_read_requests_keep_their_first_sender() {
    let (la, l3) = (listener(), listener());
    let peers: BTreeMap<u64, SocketAddr> = [
        (1, la.local_addr().unwrap()),
        (2, listener().local_addr().unwrap()),
        (3, l3.local_addr().unwrap()),
    ]
    .into_iter()
    .collect();
    let a = Transport::start(TransportConfig::new(1, peers), la).unwrap();
    let frame = |from_field: u64, t: MessageType| {
        let mut m = msg(from_field, 1, 9);
        m.set_msg_type(t);
        let mut v = Vec::new();
        encode_frame(3, &m, &mut v).unwrap();
        v
    };
    let mut s = TcpStream::connect(a.local_addr()).unwrap();
    s.write_all(&frame(2, MessageType::MsgReadIndex)).unwrap();
    s.write_all(&frame(2, MessageType::MsgPropose)).unwrap();
    let got = wait_for("a forwarded read request", || a.try_recv());
    assert_eq!(
        (got.from, got.get_msg_type()),
        (2, MessageType::MsgReadIndex)
    );
    let got = wait_for("a forwarded proposal", || a.try_recv());
    assert_eq!((got.from, got.get_msg_type()), (2, MessageType::MsgPropose));
    assert_eq!(refused(&a), 0);
    for (what, bytes) in [
        (
            "a heartbeat in another's name",
            frame(2, MessageType::MsgHeartbeat),
        ),
        (
            "a forward in a stranger's name",
            frame(7, MessageType::MsgPropose),
        ),
        (
            "a forward in our own name",
            frame(1, MessageType::MsgReadIndex),
        ),
    ] {
        let before = refused(&a);
        let mut s = TcpStream::connect(a.local_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&bytes).unwrap();
        assert!(closed(&mut s), "{what}: not closed");
        wait_for(what, || (refused(&a) > before).then_some(()));
    }
    assert!(a.try_recv().is_none(), "nothing refused got through");
}

#[test]
fn a_full_queue_drops_instead_of_blocking() {
    // A peer address where nothing listens (bound, then closed).
    let dead = listener().local_addr().unwrap();
    let la = listener();
    let peers: BTreeMap<u64, SocketAddr> = [(1, la.local_addr().unwrap()), (2, dead)]
        .into_iter()
        .collect();
    let mut cfg = TransportConfig::new(1, peers);
    cfg.queue_len = 4;
    let a = Transport::start(cfg, la).unwrap();
    let t = Instant::now();
    let mut refused = 0;
    for _ in 0..100_000 {
        if !a.send(msg(1, 2, 1)) {
            refused += 1;
        }
    }
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(refused > 0, "a 4-message queue took 100k messages");
    assert!(!a.send(msg(1, 9, 1)), "an unknown peer is refused");
    let mut snap = msg(1, 2, 1);
    snap.set_msg_type(MessageType::MsgSnapshot);
    wait_for("a snapshot dropped is reported", || {
        a.send(snap.clone());
        std::iter::from_fn(|| a.try_event()).find(|e| *e == PeerEvent::SnapshotFailed(2))
    });
}

/// Strangers that connect and say nothing take no more than the inbound cap, are closed after
/// the first-frame timeout, and the real peer gets in after them.
#[test]
fn idle_strangers_cannot_hold_the_inbound_slots() {
    let (la, lb) = (listener(), listener());
    let (aa, ab) = (la.local_addr().unwrap(), lb.local_addr().unwrap());
    let peers: BTreeMap<u64, SocketAddr> = [(1, aa), (2, ab)].into_iter().collect();
    let a = Transport::start(TransportConfig::new(1, peers.clone()), la).unwrap();
    let idle: Vec<TcpStream> = (0..MAX_INBOUND_CONNECTIONS + 3)
        .map(|_| TcpStream::connect(aa).unwrap())
        .collect();
    wait_for("connections over the cap refused", || {
        (a.stats().refused.load(Ordering::Relaxed) >= 3).then_some(())
    });
    let b = Transport::start(TransportConfig::new(2, peers), lb).unwrap();
    let got = wait_for("the real peer gets through", || {
        b.send(msg(2, 1, 3));
        a.recv_timeout(Duration::from_millis(50))
    });
    assert_eq!(got.from, 2);
    drop(idle);
}

/// Membership changes while running: a new peer gets a writer and its frames in, a departed one
/// stops getting messages, a removed one is refused, and a stranger gets in only with a
/// leader's traffic (a lagging node must hear from a leader that joined after its log).
#[test]
fn membership_changes_add_and_refuse_peers() {
    let (la, lb, lc) = (listener(), listener(), listener());
    let (aa, ab, ac) = (
        la.local_addr().unwrap(),
        lb.local_addr().unwrap(),
        lc.local_addr().unwrap(),
    );
    let two: BTreeMap<u64, SocketAddr> = [(1, aa), (2, ab)].into_iter().collect();
    let mut a = Transport::start(TransportConfig::new(1, two.clone()), la).unwrap();
    let three: BTreeMap<u64, SocketAddr> = [(1, aa), (2, ab), (3, ac)].into_iter().collect();
    let c = Transport::start(TransportConfig::new(3, three.clone()), lc).unwrap();
    assert!(!a.send(msg(1, 3, 1)), "3 is not a peer of a yet");

    // c is a stranger to a: its vote request is refused, its heartbeat (leader traffic) is not.
    let mut vote = msg(3, 1, 2);
    vote.set_msg_type(MessageType::MsgRequestVote);
    c.send(vote);
    wait_for("a stranger's vote refused", || {
        (a.stats().refused.load(Ordering::Relaxed) >= 1).then_some(())
    });
    let got = wait_for("a stranger's heartbeat", || {
        c.send(msg(3, 1, 3));
        a.recv_timeout(Duration::from_millis(50))
    });
    assert_eq!((got.from, got.term), (3, 3));

    // 3 joins: a sends to it and knows it.
    a.set_peers(&three).unwrap();
    assert_eq!(a.peers().keys().copied().collect::<Vec<_>>(), vec![2, 3]);
    let got = wait_for("c hears from a", || {
        a.send(msg(1, 3, 4));
        c.recv_timeout(Duration::from_millis(50))
    });
    assert_eq!((got.from, got.term), (1, 4));

    // 3 is removed: a stops sending to it and refuses what it sends, even a heartbeat on the
    // connection already open.
    a.set_peers(&two).unwrap();
    a.set_removed(&[3].into_iter().collect());
    assert!(!a.send(msg(1, 3, 5)), "a departed peer gets nothing");
    while a.try_recv().is_some() {}
    let refused = a.stats().refused.load(Ordering::Relaxed);
    wait_for("a removed member refused", || {
        c.send(msg(3, 1, 6));
        thread::sleep(Duration::from_millis(20));
        (a.stats().refused.load(Ordering::Relaxed) > refused).then_some(())
    });
    assert!(
        std::iter::from_fn(|| a.try_recv()).all(|m| m.from != 3 || m.term < 6),
        "nothing of the removed member got through"
    );
}

/// A peer whose transport goes away (its process exits) is reported closed, once it had sent a
/// valid frame; a stranger that never did is not.
#[test]
fn a_peer_that_goes_away_is_reported_closed() {
    let (la, lb) = (listener(), listener());
    let (aa, ab) = (la.local_addr().unwrap(), lb.local_addr().unwrap());
    let peers: BTreeMap<u64, SocketAddr> = [(1, aa), (2, ab)].into_iter().collect();
    let a = Transport::start(TransportConfig::new(1, peers.clone()), la).unwrap();
    let idle = TcpStream::connect(aa).unwrap();
    drop(idle);
    let b = Transport::start(TransportConfig::new(2, peers), lb).unwrap();
    wait_for("a hears from b", || {
        b.send(msg(2, 1, 1));
        a.recv_timeout(Duration::from_millis(50))
    });
    drop(b);
    let ev = wait_for("b's close reported", || {
        a.events().recv_timeout(Duration::from_millis(50)).ok()
    });
    assert_eq!(ev, PeerEvent::Closed(2));
    assert!(
        a.try_event().is_none(),
        "the stranger's close is not reported"
    );
}

/// Test certificates: one CA for the nodes, and a foreign one.
struct Pki {
    dir: std::path::PathBuf,
    ca: holdfast_testkit::pki::Ca,
    ca_path: std::path::PathBuf,
    foreign: holdfast_testkit::pki::Ca,
}

impl Pki {
    fn new() -> Pki {
        let dir = holdfast_testkit::pki::temp_dir("transport-tls");
        let ca = holdfast_testkit::pki::Ca::new("peer CA");
        let ca_path = ca.write(&dir.join("ca.pem"));
        Pki {
            dir,
            ca,
            ca_path,
            foreign: holdfast_testkit::pki::Ca::new("foreign CA"),
        }
    }

    /// A node's peer TLS: its certificate signed by `signer`, trusting the peer CA.
    fn tls(&self, stem: &str, signer: &holdfast_testkit::pki::Ca) -> PeerTls {
        let (server, client) = self.configs(stem, signer);
        PeerTls::fixed(server, client)
    }

    fn configs(
        &self,
        stem: &str,
        signer: &holdfast_testkit::pki::Ca,
    ) -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
        let i = signer.issue(&self.dir, stem, &["127.0.0.1"]);
        let server = crate::tls::server_config(&i.cert, &i.key, Some(&self.ca_path)).unwrap();
        let client =
            crate::tls::client_config(Some(&self.ca_path), Some((&i.cert, &i.key))).unwrap();
        (server, client)
    }

    /// A TLS client of `addr` with a certificate signed by `signer`, trusting the peer CA (the
    /// handshake done, as far as the client can tell).
    fn client(
        &self,
        addr: SocketAddr,
        signer: &holdfast_testkit::pki::Ca,
    ) -> crate::tls::ClientStream {
        self.try_client(addr, signer).expect("handshake")
    }

    fn try_client(
        &self,
        addr: SocketAddr,
        signer: &holdfast_testkit::pki::Ca,
    ) -> io::Result<crate::tls::ClientStream> {
        let (_, config) = self.configs("client", signer);
        let tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        crate::tls::connect_blocking(config, crate::tls::server_name("127.0.0.1").unwrap(), tcp)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tls_config(id: u64, peers: &BTreeMap<u64, SocketAddr>, tls: PeerTls) -> TransportConfig {
    let mut cfg = TransportConfig::new(id, peers.clone());
    cfg.tls = Some(tls);
    cfg
}

/// Reads until the other side closes: true when it did (EOF or reset) within 10 s.
fn closed(s: &mut impl Read) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // A reset, or (through TLS) the server's alert or an unclean close.
            Err(_) => return true,
        }
    }
    false
}

fn refused(t: &Transport) -> u64 {
    t.stats().refused.load(Ordering::Relaxed)
}

/// Two nodes with peer TLS: messages flow both ways, each inbound connection after a handshake.
#[test]
fn tls_peers_exchange_messages() {
    let pki = Pki::new();
    let (la, lb) = (listener(), listener());
    let peers: BTreeMap<u64, SocketAddr> =
        [(1, la.local_addr().unwrap()), (2, lb.local_addr().unwrap())]
            .into_iter()
            .collect();
    let a = Transport::start(tls_config(1, &peers, pki.tls("a", &pki.ca)), la).unwrap();
    let b = Transport::start(tls_config(2, &peers, pki.tls("b", &pki.ca)), lb).unwrap();
    assert!(a.tls() && b.tls());
    for term in 1..=3 {
        a.send(msg(1, 2, term));
        assert_eq!(wait_for("b receives", || b.try_recv()).term, term);
        b.send(msg(2, 1, 10 + term));
        assert_eq!(wait_for("a receives", || a.try_recv()).term, 10 + term);
    }
    // A frame larger than a TLS record (16 KiB) arrives whole.
    let mut big = msg(1, 2, 99);
    big.set_msg_type(MessageType::MsgAppend);
    big.context = vec![7u8; 200 << 10].into();
    a.send(big.clone());
    assert_eq!(wait_for("b receives the big one", || b.try_recv()), big);
    assert_eq!(a.stats().handshakes.load(Ordering::Relaxed), 1);
    assert_eq!(b.stats().handshakes.load(Ordering::Relaxed), 1);
    assert_eq!(refused(&a) + refused(&b), 0);
}

/// A plain TCP client of a TLS transport, even one that sends a perfectly good frame, is closed
/// without any of its bytes read as a frame.
#[test]
fn a_plain_client_of_a_tls_transport_is_closed_before_any_frame() {
    let pki = Pki::new();
    let (la, lb) = (listener(), listener());
    let peers: BTreeMap<u64, SocketAddr> =
        [(1, la.local_addr().unwrap()), (2, lb.local_addr().unwrap())]
            .into_iter()
            .collect();
    let a = Transport::start(tls_config(1, &peers, pki.tls("a", &pki.ca)), la).unwrap();
    let mut good = Vec::new();
    encode_frame(2, &msg(2, 1, 1), &mut good).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("a valid frame in the clear", good),
        ("http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        (
            "a TLS record header, then junk",
            vec![0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5],
        ),
    ];
    for (i, (what, bytes)) in cases.iter().enumerate() {
        let mut s = TcpStream::connect(a.local_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(bytes).unwrap();
        assert!(closed(&mut s), "{what}: not closed");
        wait_for(what, || (refused(&a) == i as u64 + 1).then_some(()));
    }
    thread::sleep(Duration::from_millis(100));
    assert!(a.try_recv().is_none(), "a frame got through");
    assert_eq!(a.stats().handshakes.load(Ordering::Relaxed), 0);
}

/// A certificate of another CA is refused both ways: the accepting node refuses the connection
/// of a node that presents one (nothing it sends is read), and a dialing node refuses to talk to
/// an accepting node that presents one.
#[test]
fn a_foreign_certificate_is_refused_both_ways() {
    let pki = Pki::new();
    let (la, lb) = (listener(), listener());
    let peers: BTreeMap<u64, SocketAddr> =
        [(1, la.local_addr().unwrap()), (2, lb.local_addr().unwrap())]
            .into_iter()
            .collect();
    let a = Transport::start(tls_config(1, &peers, pki.tls("a", &pki.ca)), la).unwrap();
    // b trusts the peer CA, but its own certificate is the foreign CA's.
    let b = Transport::start(tls_config(2, &peers, pki.tls("b", &pki.foreign)), lb).unwrap();
    // b -> a: a refuses the handshake.
    wait_for("a refuses b", || {
        b.send(msg(2, 1, 1));
        thread::sleep(Duration::from_millis(20));
        (refused(&a) >= 2).then_some(())
    });
    // a -> b: a does not accept b's certificate and says so to raft.
    wait_for("a finds b unreachable", || {
        a.send(msg(1, 2, 2));
        thread::sleep(Duration::from_millis(20));
        std::iter::from_fn(|| a.try_event()).find(|e| *e == PeerEvent::Unreachable(2))
    });
    assert!(a.try_recv().is_none(), "a read a frame of b");
    assert!(b.try_recv().is_none(), "b read a frame of a");
    assert_eq!(a.stats().handshakes.load(Ordering::Relaxed), 0);
    assert_eq!(a.stats().sent.load(Ordering::Relaxed), 0);

    // A client of the foreign CA that sends a valid frame right after its side of the handshake
    // (TLS 1.3: before the server has judged its certificate) gets nothing through either.
    let before = refused(&a);
    let mut c = pki.client(a.local_addr(), &pki.foreign);
    let mut good = Vec::new();
    encode_frame(2, &msg(2, 1, 3), &mut good).unwrap();
    let _ = c.write_all(&good).and_then(|()| c.flush());
    assert!(closed(&mut c), "the foreign client was not closed");
    wait_for("the foreign client refused", || {
        (refused(&a) > before).then_some(())
    });
    assert!(
        a.try_recv().is_none(),
        "a frame of a foreign client got through"
    );
}

/// After a valid handshake, bytes that are not frames (inside TLS) or not TLS records (beside
/// it) close the connection and are counted; a good client then still gets through.
#[test]
fn garbage_after_a_valid_handshake_is_refused() {
    let pki = Pki::new();
    let (la, lb) = (listener(), listener());
    let peers: BTreeMap<u64, SocketAddr> =
        [(1, la.local_addr().unwrap()), (2, lb.local_addr().unwrap())]
            .into_iter()
            .collect();
    let a = Transport::start(tls_config(1, &peers, pki.tls("a", &pki.ca)), la).unwrap();

    let mut c = pki.client(a.local_addr(), &pki.ca);
    c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    c.flush().unwrap();
    assert!(closed(&mut c), "garbage inside TLS: not closed");
    wait_for("garbage inside TLS refused", || {
        (refused(&a) == 1).then_some(())
    });

    let mut c = pki.client(a.local_addr(), &pki.ca);
    // The handshake's last flight is written with the first data: send one good frame first.
    let mut good = Vec::new();
    encode_frame(2, &msg(2, 1, 5), &mut good).unwrap();
    c.write_all(&good).unwrap();
    c.flush().unwrap();
    assert_eq!(wait_for("the good frame", || a.try_recv()).term, 5);
    // Then bytes that are no TLS record, straight on the socket.
    c.sock.write_all(&[0x17, 0x03, 0x03, 0x00, 0x20]).unwrap();
    c.sock.write_all(&[0xee; 32]).unwrap();
    assert!(closed(&mut c.sock), "garbage beside TLS: not closed");
    wait_for("garbage beside TLS refused", || {
        (refused(&a) == 2).then_some(())
    });
    assert_eq!(a.stats().handshakes.load(Ordering::Relaxed), 2);
    assert!(a.try_recv().is_none());

    let b = Transport::start(tls_config(2, &peers, pki.tls("b", &pki.ca)), lb).unwrap();
    b.send(msg(2, 1, 42));
    assert_eq!(wait_for("a receives from b", || a.try_recv()).term, 42);
}

/// The configurations are taken per new connection: after a rotation to another CA, the open
/// connection keeps working, a new client of the old CA is refused and one of the new CA is
/// accepted.
#[test]
fn a_certificate_rotation_applies_to_new_connections() {
    let pki = Pki::new();
    let (la, lb) = (listener(), listener());
    let peers: BTreeMap<u64, SocketAddr> =
        [(1, la.local_addr().unwrap()), (2, lb.local_addr().unwrap())]
            .into_iter()
            .collect();
    let (s1, c1) = pki.configs("a1", &pki.ca);
    let current = Arc::new(Mutex::new((s1, c1)));
    let cur = current.clone();
    let rotating = PeerTls::new(move || {
        let (server, client) = cur.lock().unwrap().clone();
        Some(PeerTlsConfigs { server, client })
    });
    let a = Transport::start(tls_config(1, &peers, rotating), la).unwrap();
    let b = Transport::start(tls_config(2, &peers, pki.tls("b", &pki.ca)), lb).unwrap();
    b.send(msg(2, 1, 1));
    assert_eq!(wait_for("before the rotation", || a.try_recv()).term, 1);

    // a now trusts (and is certified by) another CA only.
    let next = holdfast_testkit::pki::Ca::new("next peer CA");
    let next_ca = next.write(&pki.dir.join("next-ca.pem"));
    let i = next.issue(&pki.dir, "a2", &["127.0.0.1"]);
    *current.lock().unwrap() = (
        crate::tls::server_config(&i.cert, &i.key, Some(&next_ca)).unwrap(),
        crate::tls::client_config(Some(&next_ca), Some((&i.cert, &i.key))).unwrap(),
    );
    b.send(msg(2, 1, 2));
    assert_eq!(wait_for("on the open connection", || a.try_recv()).term, 2);
    let before = refused(&a);
    // A client of the old CA no longer trusts a's certificate, and a no longer trusts its.
    if let Ok(mut old) = pki.try_client(a.local_addr(), &pki.ca) {
        let _ = old.write_all(b"x").and_then(|()| old.flush());
        assert!(closed(&mut old));
    }
    wait_for("the old CA refused", || {
        (refused(&a) > before).then_some(())
    });
    // A client of the new CA (trusting it for a's certificate too).
    let j = next.issue(&pki.dir, "c2", &["127.0.0.1"]);
    let config = crate::tls::client_config(Some(&next_ca), Some((&j.cert, &j.key))).unwrap();
    let tcp = TcpStream::connect(a.local_addr()).unwrap();
    let mut new =
        crate::tls::connect_blocking(config, crate::tls::server_name("127.0.0.1").unwrap(), tcp)
            .expect("a handshake with the new CA");
    let mut good = Vec::new();
    encode_frame(2, &msg(2, 1, 3), &mut good).unwrap();
    new.write_all(&good).unwrap();
    new.flush().unwrap();
    assert_eq!(wait_for("through the new CA", || a.try_recv()).term, 3);
}

/// Strangers that connect and never finish a handshake take no more than the inbound cap and
/// are closed after the handshake timeout; the real peer gets in after them.
#[test]
fn stalled_handshakes_cannot_hold_the_inbound_slots() {
    let pki = Pki::new();
    let (la, lb) = (listener(), listener());
    let peers: BTreeMap<u64, SocketAddr> =
        [(1, la.local_addr().unwrap()), (2, lb.local_addr().unwrap())]
            .into_iter()
            .collect();
    let a = Transport::start(tls_config(1, &peers, pki.tls("a", &pki.ca)), la).unwrap();
    let started = Instant::now();
    let mut idle: Vec<TcpStream> = (0..MAX_INBOUND_CONNECTIONS)
        .map(|_| {
            let mut s = TcpStream::connect(a.local_addr()).unwrap();
            // Half a ClientHello's record header: the handshake has begun and stalls.
            s.write_all(&[0x16, 0x03]).unwrap();
            s
        })
        .collect();
    let b = Transport::start(tls_config(2, &peers, pki.tls("b", &pki.ca)), lb).unwrap();
    let got = wait_for("the real peer gets through", || {
        b.send(msg(2, 1, 3));
        a.recv_timeout(Duration::from_millis(50))
    });
    assert_eq!(got.from, 2);
    assert!(
        started.elapsed() >= HANDSHAKE_TIMEOUT - Duration::from_millis(100),
        "a slot was free before the strangers' handshakes timed out"
    );
    for s in idle.iter_mut() {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        assert!(closed(s), "a stalled stranger is still connected");
    }
    // The reader closes the socket before it counts the refusal.
    wait_for("every stranger counted as refused", || {
        (refused(&a) >= MAX_INBOUND_CONNECTIONS as u64).then_some(())
    });
}

/// A stranger that trickles a real ClientHello a byte at a time (far more often than any
/// per-read timeout) is closed at the handshake deadline all the same, unanswered.
#[test]
fn a_trickled_handshake_ends_at_the_deadline() {
    let pki = Pki::new();
    let la = listener();
    let peers: BTreeMap<u64, SocketAddr> = [(1, la.local_addr().unwrap())].into_iter().collect();
    let a = Transport::start(tls_config(1, &peers, pki.tls("a", &pki.ca)), la).unwrap();
    let (_, config) = pki.configs("client", &pki.ca);
    let name = crate::tls::server_name("127.0.0.1").unwrap();
    let mut client = rustls::ClientConnection::new(config, name).unwrap();
    let mut hello = Vec::new();
    client.write_tls(&mut hello).unwrap();
    let mut s = TcpStream::connect(a.local_addr()).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let start = Instant::now();
    let mut sent = 0;
    let mut buf = [0u8; 4096];
    // About 40 ms a byte: the whole hello takes longer than the handshake timeout.
    assert!(
        Duration::from_millis(40) * hello.len() as u32 > HANDSHAKE_TIMEOUT + Duration::from_secs(2),
        "a ClientHello of {} bytes is too short for this test",
        hello.len()
    );
    let closed_after = loop {
        assert!(
            start.elapsed() < HANDSHAKE_TIMEOUT * 4,
            "still open after {:?}",
            start.elapsed()
        );
        if sent < hello.len() && s.write_all(&hello[sent..sent + 1]).is_err() {
            break start.elapsed();
        }
        sent += 1;
        match s.read(&mut buf) {
            Ok(0) => break start.elapsed(),
            Ok(n) => panic!("answered {n} bytes after {:?}", start.elapsed()),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break start.elapsed(),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        closed_after < HANDSHAKE_TIMEOUT + Duration::from_secs(1),
        "closed after {closed_after:?}"
    );
    // The reader closes the socket before it counts the refusal.
    wait_for("the stranger counted as refused", || {
        (refused(&a) >= 1).then_some(())
    });
}

/// The dialing node checks the accepting node's certificate against the name of that peer's
/// `--peers` entry: a DNS name given there is checked as such, and a certificate without the
/// name is not accepted.
#[test]
fn the_dialer_checks_the_name_of_the_peers_entry() {
    let pki = Pki::new();
    let (la, lb, lc) = (listener(), listener(), listener());
    let peers: BTreeMap<u64, SocketAddr> = [
        (1, la.local_addr().unwrap()),
        (2, lb.local_addr().unwrap()),
        (3, lc.local_addr().unwrap()),
    ]
    .into_iter()
    .collect();
    let named = |stem: &str, names: &[&str]| {
        let i = pki.ca.issue(&pki.dir, stem, names);
        PeerTls::fixed(
            crate::tls::server_config(&i.cert, &i.key, Some(&pki.ca_path)).unwrap(),
            crate::tls::client_config(Some(&pki.ca_path), Some((&i.cert, &i.key))).unwrap(),
        )
    };
    // 1 reaches 2 as "localhost" and 3 as "peer3.test"; both listen on 127.0.0.1.
    let mut cfg = tls_config(1, &peers, pki.tls("a", &pki.ca));
    cfg.names = [(2, "localhost".to_string()), (3, "peer3.test".to_string())]
        .into_iter()
        .collect();
    let a = Transport::start(cfg, la).unwrap();
    let b = Transport::start(tls_config(2, &peers, named("b", &["localhost"])), lb).unwrap();
    let c = Transport::start(tls_config(3, &peers, named("c", &["127.0.0.1"])), lc).unwrap();
    let got = wait_for("b, certified as localhost, hears from a", || {
        a.send(msg(1, 2, 1));
        b.recv_timeout(Duration::from_millis(50))
    });
    assert_eq!(got.term, 1);
    wait_for("c, not certified as peer3.test, is unreachable", || {
        a.send(msg(1, 3, 2));
        thread::sleep(Duration::from_millis(20));
        std::iter::from_fn(|| a.try_event()).find(|e| *e == PeerEvent::Unreachable(3))
    });
    assert!(c.try_recv().is_none(), "c heard from a");
}

/// A keepalive reaches the reader, which notes when the peer was heard and hands raft
/// nothing; one from an id this node does not know is dropped without closing the connection,
/// so that a leader's traffic after it still gets through.
#[test]
fn keepalives_are_heard_and_kept_from_raft() {
    let (la, lb) = (listener(), listener());
    let (aa, ab) = (la.local_addr().unwrap(), lb.local_addr().unwrap());
    let peers: BTreeMap<u64, SocketAddr> = [(1, aa), (2, ab)].into_iter().collect();
    let a = Transport::start(TransportConfig::new(1, peers.clone()), la).unwrap();
    let b = Transport::start(TransportConfig::new(2, peers), lb).unwrap();
    assert!(a.heard().is_empty());
    let before = Instant::now();
    b.keepalive();
    let heard = wait_for("a hears b", || a.heard().get(&2).copied());
    assert!(heard >= before);
    assert!(a.try_recv().is_none(), "a keepalive is not raft's");
    // Raft traffic counts as heard too.
    b.send(msg(2, 1, 3));
    assert_eq!(wait_for("a receives", || a.try_recv()).term, 3);
    assert!(a.heard()[&2] >= heard);

    // A stranger's keepalive, then its leader traffic, on one connection.
    let mut s = TcpStream::connect(aa).unwrap();
    let mut beat = msg(9, 1, 0);
    beat.set_msg_type(MessageType::MsgBeat);
    assert!(is_keepalive(&beat));
    let mut bytes = Vec::new();
    encode_frame(9, &beat, &mut bytes).unwrap();
    encode_frame(9, &msg(9, 1, 4), &mut bytes).unwrap();
    s.write_all(&bytes).unwrap();
    let got = wait_for("the stranger's heartbeat", || a.try_recv());
    assert_eq!((got.from, got.term), (9, 4));
    assert_eq!(a.stats().refused.load(Ordering::Relaxed), 0);
}

// Snapshot transfers.

use crate::cluster::storage::tests::TempDir;
use raft::prelude::SnapshotMetadata;

fn snap_meta(index: u64, term: u64) -> SnapshotMetadata {
    let mut m = SnapshotMetadata {
        index,
        term,
        ..Default::default()
    };
    m.mut_conf_state().voters = vec![1, 2];
    m
}

/// Bytes that are not all alike (a misplaced chunk shows).
fn state_of(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Writes a snapshot file at (`index`, `term`) of `len` state bytes in `dir`; its descriptor.
fn write_snapshot(dir: &Path, index: u64, term: u64, len: usize) -> Descriptor {
    let meta = snap_meta(index, term);
    snapfile::write_file(
        &snapfile::path(dir, &meta),
        &meta,
        &state_of(len, index as u32),
    )
    .unwrap()
}

fn snapshot_msg(from: u64, to: u64, index: u64, term: u64, data: Vec<u8>) -> Message {
    let mut m = msg(from, to, term);
    m.set_msg_type(MessageType::MsgSnapshot);
    let s = m.mut_snapshot();
    *s.mut_metadata() = snap_meta(index, term);
    s.data = data.into();
    m
}

/// Nodes 1 and 2, each with a data directory; `tweak` adjusts each configuration.
fn snapshot_pair(tweak: impl Fn(&mut TransportConfig)) -> (Transport, Transport, TempDir, TempDir) {
    let (la, lb) = (listener(), listener());
    let peers: BTreeMap<u64, SocketAddr> =
        [(1, la.local_addr().unwrap()), (2, lb.local_addr().unwrap())]
            .into_iter()
            .collect();
    let (da, db) = (TempDir::new("transport-a"), TempDir::new("transport-b"));
    let mut ca = TransportConfig::new(1, peers.clone());
    ca.data_dir = Some(da.0.clone());
    tweak(&mut ca);
    let mut cb = TransportConfig::new(2, peers);
    cb.data_dir = Some(db.0.clone());
    tweak(&mut cb);
    let a = Transport::start(ca, la).unwrap();
    let b = Transport::start(cb, lb).unwrap();
    (a, b, da, db)
}

/// Waits for the snapshot message at `index` on `t`; the messages before it, in order.
fn wait_for_snapshot(t: &Transport, index: u64) -> (Message, Vec<Message>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut before = Vec::new();
    loop {
        assert!(Instant::now() < deadline, "no snapshot message");
        if let Some(m) = t.recv_timeout(Duration::from_millis(20)) {
            if m.get_msg_type() == MessageType::MsgSnapshot
                && m.get_snapshot().get_metadata().index == index
            {
                return (m, before);
            }
            before.push(m);
        }
    }
}

fn stat(t: &Transport, f: impl Fn(&TransportStats) -> &AtomicU64) -> u64 {
    f(t.stats()).load(Ordering::Relaxed)
}

/// The received file is the sender's, byte for byte, in place when the message arrives.
fn assert_received(from: &TempDir, to: &TempDir, index: u64, term: u64, d: Descriptor) {
    let sent = std::fs::read(snapfile::path_of(&from.0, index, term)).unwrap();
    let got = std::fs::read(snapfile::received_path(&to.0, index, term)).unwrap();
    assert_eq!(got.len() as u64, d.len);
    assert!(got == sent, "the received file differs");
    let c = snapfile::check(&snapfile::received_path(&to.0, index, term)).unwrap();
    assert_eq!(c.descriptor, d);
    assert!(
        !incoming_path(&to.0, 1).exists(),
        "the partial file stays behind"
    );
}

/// A multi-MiB snapshot arrives byte for byte; the message is delivered only once the file is
/// in place and checked; the sender reports it sent; the window was kept.
#[test]
fn a_snapshot_file_arrives_in_chunks_before_its_message() {
    let (a, b, da, db) = snapshot_pair(|_| {});
    let len = 5 * CHUNK + 12_345;
    let d = write_snapshot(&da.0, 10, 3, len);
    assert!(a.send(snapshot_msg(1, 2, 10, 3, d.encode())));
    let (m, _) = wait_for_snapshot(&b, 10);
    assert_eq!(m.get_snapshot().get_data(), &d.encode()[..]);
    assert_received(&da, &db, 10, 3, d);
    wait_for("the sender reports it sent", || {
        std::iter::from_fn(|| a.try_event()).find(|e| *e == PeerEvent::SnapshotSent(2))
    });
    assert_eq!(stat(&a, |s| &s.snapshot_bytes_sent), d.len);
    assert_eq!(stat(&b, |s| &s.snapshot_bytes_received), d.len);
    assert_eq!(stat(&a, |s| &s.snapshot_transfers_started), 1);
    assert_eq!(stat(&a, |s| &s.snapshot_transfers_completed), 1);
    assert_eq!(stat(&a, |s| &s.snapshot_transfers_failed), 0);
    assert_eq!(stat(&b, |s| &s.snapshots_received), 1);
    let max = stat(&a, |s| &s.snapshot_in_flight_max);
    assert!(max > 0 && max <= WINDOW, "in flight at most {max}");
    assert_eq!(a.stats().snapshot_bytes_in_flight().get(&2), Some(&0));
}

/// Ordinary messages queued during a transfer go between its chunks, not behind it; bytes in
/// flight never exceed the window.
#[test]
fn messages_go_between_the_chunks_of_a_transfer() {
    let (a, b, da, db) = snapshot_pair(|_| {});
    let len = 24 << 20;
    let d = write_snapshot(&da.0, 20, 4, len);
    assert!(a.send(snapshot_msg(1, 2, 20, 4, d.encode())));
    for term in 100..110 {
        a.send(msg(1, 2, term));
        thread::sleep(Duration::from_millis(5));
    }
    let (_, before) = wait_for_snapshot(&b, 20);
    let beats: Vec<u64> = before.iter().map(|m| m.term).collect();
    assert!(
        beats.contains(&100),
        "the first heartbeat waited behind the transfer: {beats:?}"
    );
    assert_received(&da, &db, 20, 4, d);
    let max = stat(&a, |s| &s.snapshot_in_flight_max);
    assert!(max > 0 && max <= WINDOW, "in flight at most {max}");
}

/// A connection cut in the middle of a transfer: the writer reconnects and goes on from the
/// acknowledged offset, not from the start.
#[test]
fn a_cut_transfer_resumes_from_the_acknowledged_offset() {
    let cut = 6 << 20;
    let (a, b, da, db) = snapshot_pair(|c| c.cut_at = Some(cut));
    let len = 24 << 20;
    let d = write_snapshot(&da.0, 30, 5, len);
    assert!(a.send(snapshot_msg(1, 2, 30, 5, d.encode())));
    let (_, _) = wait_for_snapshot(&b, 30);
    assert_received(&da, &db, 30, 5, d);
    assert!(stat(&a, |s| &s.connects) >= 2, "no reconnection");
    assert!(stat(&a, |s| &s.snapshot_transfers_resumed) >= 1);
    let sent = stat(&a, |s| &s.snapshot_bytes_sent);
    assert!(
        sent >= d.len && sent <= d.len + WINDOW + CHUNK as u64,
        "{sent} bytes sent for a file of {}",
        d.len
    );
    assert_eq!(stat(&a, |s| &s.snapshot_transfers_completed), 1);
}

/// A descriptor whose checksum is not the file's: the whole file travels, and the message is
/// dropped, its file not installed.
#[test]
fn a_wrong_descriptor_is_not_delivered() {
    let (a, b, da, db) = snapshot_pair(|_| {});
    let d = write_snapshot(&da.0, 40, 6, 3 * CHUNK);
    let wrong = Descriptor {
        crc: d.crc ^ 1,
        ..d
    };
    assert!(a.send(snapshot_msg(1, 2, 40, 6, wrong.encode())));
    wait_for("the receiver drops it", || {
        (stat(&b, |s| &s.snapshots_rejected) == 1).then_some(())
    });
    assert!(b.try_recv().is_none(), "delivered");
    assert!(!snapfile::received_path(&db.0, 40, 6).exists());
    // A descriptor whose length is not the file's: not even sent.
    let short = Descriptor {
        len: d.len - 1,
        ..d
    };
    assert!(a.send(snapshot_msg(1, 2, 40, 6, short.encode())));
    wait_for("the sender fails it", || {
        std::iter::from_fn(|| a.try_event()).find(|e| *e == PeerEvent::SnapshotFailed(2))
    });
    // A snapshot file that is not there.
    assert!(a.send(snapshot_msg(1, 2, 41, 6, d.encode())));
    wait_for("the sender fails the missing file", || {
        std::iter::from_fn(|| a.try_event()).find(|e| *e == PeerEvent::SnapshotFailed(2))
    });
    assert_eq!(stat(&a, |s| &s.snapshot_transfers_failed), 2);
}

/// A raw client, as member 2, sends chunks by hand: a corrupted byte means no delivery; the
/// same file uncorrupted then goes through on the same connection.
#[test]
fn a_corrupted_chunk_is_not_delivered() {
    let (la, lb) = (listener(), listener());
    let peers: BTreeMap<u64, SocketAddr> =
        [(1, la.local_addr().unwrap()), (2, lb.local_addr().unwrap())]
            .into_iter()
            .collect();
    let (da, db) = (
        TempDir::new("transport-raw-a"),
        TempDir::new("transport-raw-b"),
    );
    let mut cfg = TransportConfig::new(1, peers);
    cfg.data_dir = Some(da.0.clone());
    let a = Transport::start(cfg, la).unwrap();
    let d = write_snapshot(&db.0, 50, 7, 2 * CHUNK + 77);
    let file = std::fs::read(snapfile::path_of(&db.0, 50, 7)).unwrap();
    let send_file = |s: &mut TcpStream, bytes: &[u8]| {
        let mut out = Vec::new();
        for (i, piece) in bytes.chunks(CHUNK).enumerate() {
            let head = ChunkHead {
                snap: SnapId { index: 50, term: 7 },
                descriptor: d,
                offset: (i * CHUNK) as u64,
            };
            encode_chunk(2, &head, piece, &mut out);
        }
        encode_frame(2, &snapshot_msg(2, 1, 50, 7, d.encode()), &mut out).unwrap();
        s.write_all(&out).unwrap();
    };
    let mut s = TcpStream::connect(a.local_addr()).unwrap();
    let mut bad = file.clone();
    bad[CHUNK + 5] ^= 0x40;
    send_file(&mut s, &bad);
    wait_for("the corrupted file dropped", || {
        (stat(&a, |s| &s.snapshots_rejected) == 1).then_some(())
    });
    assert!(a.try_recv().is_none(), "delivered");
    assert!(!snapfile::received_path(&da.0, 50, 7).exists());
    send_file(&mut s, &file);
    let (m, _) = wait_for_snapshot(&a, 50);
    assert_eq!(m.from, 2);
    assert_eq!(
        std::fs::read(snapfile::received_path(&da.0, 50, 7)).unwrap(),
        file
    );
    assert_eq!(refused(&a), 0);
}

/// Hostile chunk traffic: a stranger's chunk, one past its descriptor's end, a frame over the
/// caps, a snapshot message without a descriptor: each refused (the connection closed and
/// counted). A chunk out of order is not written, and the connection stays.
#[test]
fn hostile_chunks_are_refused() {
    let (la, lb) = (listener(), listener());
    let peers: BTreeMap<u64, SocketAddr> =
        [(1, la.local_addr().unwrap()), (2, lb.local_addr().unwrap())]
            .into_iter()
            .collect();
    let da = TempDir::new("transport-hostile");
    let mut cfg = TransportConfig::new(1, peers);
    cfg.data_dir = Some(da.0.clone());
    let a = Transport::start(cfg, la).unwrap();
    let d = Descriptor { len: 1000, crc: 0 };
    let chunk = |from: u64, offset: u64, n: usize| {
        let head = ChunkHead {
            snap: SnapId { index: 5, term: 1 },
            descriptor: d,
            offset,
        };
        let mut out = Vec::new();
        encode_chunk(from, &head, &vec![7u8; n], &mut out);
        out
    };
    let mut not_descriptor = Vec::new();
    encode_frame(
        2,
        &snapshot_msg(2, 1, 5, 1, vec![0; 100]),
        &mut not_descriptor,
    )
    .unwrap();
    let mut huge_chunk = kind_header(1, 2, (CHUNK_HEAD_LEN + MAX_CHUNK + 1) as u32).to_vec();
    huge_chunk.extend_from_slice(&[0; 64]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("a stranger's chunk", chunk(7, 0, 10)),
        ("a removed or unknown kind", kind_header(9, 2, 10).to_vec()),
        ("past the descriptor's end", chunk(2, 995, 10)),
        ("a chunk over the cap", huge_chunk),
        (
            "a raft frame over the cap",
            header(MAGIC, 1, 2, DEFAULT_MAX_FRAME as u32 + 1).to_vec(),
        ),
        ("a snapshot message without a descriptor", not_descriptor),
    ];
    for (i, (what, bytes)) in cases.iter().enumerate() {
        let mut s = TcpStream::connect(a.local_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(bytes).unwrap();
        assert!(closed(&mut s), "{what}: not closed");
        wait_for(what, || (refused(&a) == i as u64 + 1).then_some(()));
    }
    assert_eq!(stat(&a, |s| &s.snapshot_bytes_received), 0);

    // Out of order from a member: dropped, not written, the connection kept.
    let mut s = TcpStream::connect(a.local_addr()).unwrap();
    s.write_all(&chunk(2, 100, 10)).unwrap();
    wait_for("the chunk out of order dropped", || {
        (stat(&a, |s| &s.snapshot_chunks_dropped) == 1).then_some(())
    });
    s.write_all(&chunk(2, 0, 10)).unwrap();
    s.write_all(&chunk(2, 20, 10)).unwrap();
    encode_frame(2, &msg(2, 1, 9), &mut Vec::new()).unwrap();
    let mut beat = Vec::new();
    encode_frame(2, &msg(2, 1, 9), &mut beat).unwrap();
    s.write_all(&beat).unwrap();
    assert_eq!(
        wait_for("the connection still serves", || a.try_recv()).term,
        9
    );
    assert_eq!(stat(&a, |s| &s.snapshot_bytes_received), 10);
    assert_eq!(stat(&a, |s| &s.snapshot_chunks_dropped), 2);
    assert_eq!(refused(&a), cases.len() as u64);
}

/// The same transfer through peer TLS.
#[test]
fn a_snapshot_travels_through_peer_tls() {
    let pki = Pki::new();
    let (tls_a, tls_b) = (pki.tls("a", &pki.ca), pki.tls("b", &pki.ca));
    let (la, lb) = (listener(), listener());
    let peers: BTreeMap<u64, SocketAddr> =
        [(1, la.local_addr().unwrap()), (2, lb.local_addr().unwrap())]
            .into_iter()
            .collect();
    let (da, db) = (
        TempDir::new("transport-tls-a"),
        TempDir::new("transport-tls-b"),
    );
    let mut ca = tls_config(1, &peers, tls_a);
    ca.data_dir = Some(da.0.clone());
    ca.cut_at = Some(2 << 20);
    let mut cb = tls_config(2, &peers, tls_b);
    cb.data_dir = Some(db.0.clone());
    let a = Transport::start(ca, la).unwrap();
    let b = Transport::start(cb, lb).unwrap();
    let d = write_snapshot(&da.0, 60, 8, 6 * CHUNK + 1);
    assert!(a.send(snapshot_msg(1, 2, 60, 8, d.encode())));
    wait_for_snapshot(&b, 60);
    assert_received(&da, &db, 60, 8, d);
    assert!(stat(&a, |s| &s.snapshot_transfers_resumed) >= 1);
}
