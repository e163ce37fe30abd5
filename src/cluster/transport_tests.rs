use std::net::Shutdown;

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

#[test]
fn headers_are_checked() {
    let cases: &[([u8; HEADER_LEN], Result<Header, FrameError>)] = &[
        (header(MAGIC, 1, 2, 10), Ok(Header { sender: 2, len: 10 })),
        (
            header(MAGIC, 1, 2, 1000),
            Ok(Header {
                sender: 2,
                len: 1000,
            }),
        ),
        (header(MAGIC, 1, 2, 1001), Err(FrameError::TooLarge(1001))),
        (
            header(MAGIC, 1, 2, u32::MAX),
            Err(FrameError::TooLarge(u32::MAX as usize)),
        ),
        (header(b"HFRU", 1, 2, 10), Err(FrameError::BadMagic)),
        (header(b"GET ", 1, 2, 10), Err(FrameError::BadMagic)),
        (header(MAGIC, 2, 2, 10), Err(FrameError::BadVersion(2))),
        (header(MAGIC, 0, 2, 10), Err(FrameError::BadVersion(0))),
    ];
    for (h, want) in cases {
        assert_eq!(&decode_header(h, 1000), want, "{:?}", h);
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
