//! The worker's loop driven one turn at a time over a real loopback connection, its batches
//! taken from the owner's channel.

use super::*;
use crate::config::{self, Command};

/// A worker with no listener and no owner: its batches stay in the returned channel.
fn worker() -> (Worker, crossbeam_channel::Receiver<ToOwner>) {
    let config = match config::parse(["--memcache", "127.0.0.1:0"]) {
        Ok(Command::Run(c)) => c,
        _ => unreachable!("fixed flags parse"),
    };
    let shared = Arc::new(crate::server::sim::sim_shared(config));
    let (to_owner, batches) = crossbeam_channel::unbounded();
    let (_replies, from_owner) = crossbeam_channel::unbounded();
    let poll = Poll::new().expect("poll");
    let w = Worker::new(0, shared, poll, Vec::new(), to_owner, from_owner).expect("worker");
    (w, batches)
}

/// A connection accepted by `w` and the client's end of it.
fn connect(w: &mut Worker, proto: Proto) -> std::net::TcpStream {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let client = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (server, peer) = l.accept().expect("accept");
    server.set_nonblocking(true).expect("nonblocking");
    w.add_socket(TcpStream::from_std(server), proto, peer, false);
    client
}

/// Requests of connection `slot` in a batch.
fn requests(b: &Batch, slot: u32) -> usize {
    b.ops
        .iter()
        .filter(|m| m.conn.slot == slot && matches!(m.op, Op::Mc(_)))
        .count()
}

/// A connection that always has more to send gets one read of `READ_CHUNK` per turn, its
/// later passes included; a connection with one request is read in the next turn, beside one
/// read of the bulk.
#[test]
fn a_bulk_sender_gets_one_read_per_turn() {
    let (mut w, batches) = worker();
    let mut bulk = connect(&mut w, Proto::Memcache);
    let mut set = b"set k 0 0 1000 noreply\r\n".to_vec();
    set.extend_from_slice(&[b'v'; 1000]);
    set.extend_from_slice(b"\r\n");
    const SETS: usize = 1000;
    let stream: Vec<u8> = set.iter().copied().cycle().take(set.len() * SETS).collect();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        bulk.write_all(&stream).expect("bulk write");
        bulk
    });
    // Complete requests one read can hold (a partial one carried over completes in it).
    let per_read = READ_CHUNK / set.len() + 1;
    let mut events = Events::with_capacity(EVENTS);
    let (mut turns, mut seen) = (0, 0);
    let mut probe = None;
    let mut probe_client = None;
    while seen < SETS / 2 {
        assert!(w.turn(&mut events), "the worker stopped");
        turns += 1;
        let (mut bulk_sets, mut probe_gets) = (0, 0);
        while let Ok(ToOwner::Batch(b)) = batches.try_recv() {
            bulk_sets += requests(&b, 0);
            probe_gets += probe.map_or(0, |slot| requests(&b, slot));
        }
        assert!(
            bulk_sets <= per_read,
            "turn {turns}: {bulk_sets} sets of one connection, more than one read holds"
        );
        seen += bulk_sets;
        if probe.is_some() {
            assert_eq!(probe_gets, 1, "turn {turns}: the probe's get was not read");
            probe = None;
        }
        if turns == 3 {
            // A second connection asks one thing while the bulk goes on.
            let mut c = connect(&mut w, Proto::Memcache);
            std::io::Write::write_all(&mut c, b"get probe\r\n").expect("probe write");
            std::thread::sleep(Duration::from_millis(50));
            probe = Some(1);
            probe_client = Some(c);
        }
    }
    assert!(
        probe.is_none() && probe_client.is_some(),
        "the probe was sent and read"
    );
    assert!(
        turns >= SETS / 2 / per_read,
        "{seen} sets in {turns} turns: more than one read per turn"
    );
    drop(writer);
}

/// A pipeline of small requests, a thousand to a read, is parsed [`REQUESTS_PER_TURN`] a turn:
/// the rest waits in the connection's buffer for the next turns.
#[test]
fn a_pipeline_of_small_requests_is_parsed_a_turns_budget_at_a_time() {
    let (mut w, batches) = worker();
    let mut pipeline = connect(&mut w, Proto::Memcache);
    // Sets without a reply: nothing charges the connection's reply budget.
    let set = b"set k 0 0 1 noreply\r\nx\r\n";
    let gets: Vec<u8> = set.iter().copied().cycle().take(set.len() * 3000).collect();
    std::io::Write::write_all(&mut pipeline, &gets).expect("pipeline write");
    std::thread::sleep(Duration::from_millis(50));
    let mut events = Events::with_capacity(EVENTS);
    let mut per_turn = Vec::new();
    // Three turns: the owner answers nothing here, so the connection's requests in flight
    // (at most MAX_INFLIGHT) would stop it in the fourth.
    for _ in 0..3 {
        assert!(w.turn(&mut events), "the worker stopped");
        let mut n = 0;
        while let Ok(ToOwner::Batch(b)) = batches.try_recv() {
            n += requests(&b, 0);
        }
        per_turn.push(n);
    }
    assert_eq!(
        per_turn, [REQUESTS_PER_TURN as usize; 3],
        "requests parsed per turn"
    );
}

/// A connection that has [`MAX_INFLIGHT`] requests at the owner and more buffered is parsed no
/// further until replies come, and leaves the worker nothing to do meanwhile: its polls sleep
/// instead of returning at once, turn after turn, while the owner works (a cluster's owner
/// waits for commits; a busy poll there took a CPU from the nodes).
#[test]
fn a_connection_held_back_by_its_requests_in_flight_lets_the_worker_sleep() {
    let (mut w, batches) = worker();
    let mut pipeline = connect(&mut w, Proto::Memcache);
    let set = b"set k 0 0 1 noreply\r\nx\r\n";
    let sets = 3 * MAX_INFLIGHT as usize;
    let stream: Vec<u8> = set.iter().copied().cycle().take(set.len() * sets).collect();
    std::io::Write::write_all(&mut pipeline, &stream).expect("pipeline write");
    std::thread::sleep(Duration::from_millis(50));
    let mut events = Events::with_capacity(EVENTS);
    let mut parsed = 0;
    // The first turn has the connection's bytes to read; each later one runs only while the
    // worker has work left (else its poll would sleep: the owner here never answers). Enough
    // turns to parse the requests allowed in flight a turn's share at a time, and a few more.
    let enough = 2 * MAX_INFLIGHT as usize / REQUESTS_PER_TURN as usize + 4;
    let mut turns = 0;
    while turns == 0 || w.work_left() {
        assert!(
            turns < enough,
            "after {turns} turns the worker still has work left ({parsed} requests parsed): \
             it polls without sleeping for a connection that cannot go on"
        );
        assert!(w.turn(&mut events), "the worker stopped");
        turns += 1;
        while let Ok(ToOwner::Batch(b)) = batches.try_recv() {
            parsed += requests(&b, 0);
        }
    }
    assert_eq!(
        parsed, MAX_INFLIGHT as usize,
        "requests parsed before the worker rests"
    );
    let s = w.sockets.get(0).expect("the connection is open");
    assert!(
        s.read_pending || !s.conn.rbuf.is_empty(),
        "more requests wait in the connection"
    );
}

/// A connection that sent only the start of a request leaves the worker nothing to do until
/// the rest arrives (its polls sleep; a client that stops mid-request costs no CPU), and the
/// request is parsed once it has.
#[test]
fn half_a_request_lets_the_worker_sleep_until_the_rest_arrives() {
    let (mut w, batches) = worker();
    let mut client = connect(&mut w, Proto::Memcache);
    std::io::Write::write_all(&mut client, b"get half").expect("write");
    std::thread::sleep(Duration::from_millis(50));
    let mut events = Events::with_capacity(EVENTS);
    let mut turns = 0;
    while turns == 0 || w.work_left() {
        assert!(
            turns < 4,
            "after {turns} turns the worker still has work left: it polls without sleeping \
             for a connection whose request is not whole"
        );
        assert!(w.turn(&mut events), "the worker stopped");
        turns += 1;
    }
    let mut early = 0;
    while let Ok(ToOwner::Batch(b)) = batches.try_recv() {
        early += requests(&b, 0);
    }
    assert_eq!(early, 0, "half a request was parsed");
    std::io::Write::write_all(&mut client, b"-key\r\n").expect("write");
    std::thread::sleep(Duration::from_millis(50));
    assert!(w.turn(&mut events), "the worker stopped");
    let mut parsed = 0;
    while let Ok(ToOwner::Batch(b)) = batches.try_recv() {
        parsed += requests(&b, 0);
    }
    assert_eq!(
        parsed, 1,
        "the whole request is parsed once the rest arrives"
    );
}
