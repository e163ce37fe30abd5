//! yrmcds's counter protocol over TCP: every opcode and status, release on disconnect, hostile
//! input.

mod common;

use std::time::{Duration, Instant};

use common::{Client, Daemon};
use holdfast::proto::counter::{self as ct, op, status};

struct Reply {
    opcode: u8,
    status: u8,
    opaque: u32,
    body: Vec<u8>,
}

fn read_reply(c: &mut Client) -> Reply {
    let h = c.take(ct::HEADER_LEN);
    assert_eq!(h[0], ct::RES_MAGIC);
    assert_eq!(h[3], 0, "reserved");
    let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
    Reply {
        opcode: h[1],
        status: h[2],
        opaque: u32::from_be_bytes([h[8], h[9], h[10], h[11]]),
        body: c.take(len),
    }
}

fn call(c: &mut Client, opcode: u8, opaque: u32, body: &[u8]) -> Reply {
    let mut v = Vec::new();
    ct::encode_request(&mut v, opcode, opaque, body);
    c.send(&v);
    let r = read_reply(c);
    assert_eq!((r.opcode, r.opaque), (opcode, opaque));
    r
}

fn acquire(c: &mut Client, name: &[u8], resources: u32, maximum: u32) -> Reply {
    let mut b = Vec::new();
    ct::acquire_body(&mut b, resources, maximum, name);
    call(c, op::ACQUIRE, 1, &b)
}

fn release(c: &mut Client, name: &[u8], resources: u32) -> Reply {
    let mut b = Vec::new();
    ct::release_body(&mut b, resources, name);
    call(c, op::RELEASE, 2, &b)
}

fn get(c: &mut Client, name: &[u8]) -> Reply {
    let mut b = Vec::new();
    ct::get_body(&mut b, name);
    call(c, op::GET, 3, &b)
}

fn value(r: &Reply) -> u32 {
    assert_eq!(
        r.status,
        status::OK,
        "{:?}",
        String::from_utf8_lossy(&r.body)
    );
    u32::from_be_bytes(r.body[..4].try_into().expect("4 bytes"))
}

/// Poll Get until it shows `want` (a disconnect is seen by the owner a moment after the close).
fn wait_for(c: &mut Client, name: &[u8], want: u32) {
    let deadline = Instant::now() + common::DEADLINE;
    loop {
        let r = get(c, name);
        if r.status == status::OK && value(&r) == want {
            return;
        }
        assert!(Instant::now() < deadline, "counter never reached {want}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn noop_get_acquire_release_and_their_statuses() {
    let d = Daemon::start(&[]);
    let mut a = d.counter();
    let mut b = d.counter();
    let r = call(&mut a, op::NOOP, 77, b"");
    assert_eq!((r.status, r.body.len()), (status::OK, 0));

    let r = get(&mut a, b"sem");
    assert_eq!(
        (r.status, &r.body[..]),
        (status::NOT_FOUND, &b"Not found"[..])
    );
    assert_eq!(release(&mut a, b"sem", 0).status, status::NOT_FOUND);

    assert_eq!(value(&acquire(&mut a, b"sem", 2, 3)), 2);
    assert_eq!(value(&get(&mut b, b"sem")), 2);
    assert_eq!(acquire(&mut b, b"sem", 2, 3).status, status::NOT_AVAILABLE);
    // The maximum is per request: a larger one lets b in.
    assert_eq!(value(&acquire(&mut b, b"sem", 2, 4)), 2);
    assert_eq!(value(&get(&mut a, b"sem")), 4);

    // b releases more than it holds: Not acquired; a cannot release b's share.
    assert_eq!(release(&mut b, b"sem", 3).status, status::NOT_ACQUIRED);
    assert_eq!(release(&mut a, b"sem", 3).status, status::NOT_ACQUIRED);
    let r = release(&mut b, b"sem", 2);
    assert_eq!((r.status, r.body.len()), (status::OK, 0));
    assert_eq!(value(&get(&mut a, b"sem")), 2);

    // Invalid arguments: zero resources, resources over the maximum, empty name, a name length
    // that disagrees with the body.
    assert_eq!(acquire(&mut a, b"x", 0, 3).status, status::INVALID);
    assert_eq!(acquire(&mut a, b"x", 4, 3).status, status::INVALID);
    assert_eq!(acquire(&mut a, b"", 1, 3).status, status::INVALID);
    assert_eq!(
        call(&mut a, op::GET, 5, &[0, 9, b'a']).status,
        status::INVALID
    );
    assert_eq!(
        call(&mut a, op::RELEASE, 5, &[0, 0, 0, 1]).status,
        status::INVALID
    );
    let r = call(&mut a, 0x55, 6, b"");
    assert_eq!(
        (r.status, &r.body[..]),
        (status::UNKNOWN_COMMAND, &b"Unknown command"[..])
    );
    // The connection is still fine after all that.
    assert_eq!(value(&get(&mut a, b"sem")), 2);
}

#[test]
fn stats_and_dump() {
    let d = Daemon::start(&[]);
    let mut a = d.counter();
    acquire(&mut a, b"one", 3, 5);
    acquire(&mut a, b"two", 1, 1);
    release(&mut a, b"one", 2);
    let r = call(&mut a, op::STATS, 9, b"");
    assert_eq!(r.status, status::OK);
    let mut pairs = Vec::new();
    let mut rest = &r.body[..];
    while !rest.is_empty() {
        let nl = u16::from_be_bytes([rest[0], rest[1]]) as usize;
        let vl = u16::from_be_bytes([rest[2], rest[3]]) as usize;
        let name = String::from_utf8_lossy(&rest[4..4 + nl]).into_owned();
        let val = String::from_utf8_lossy(&rest[4 + nl..4 + nl + vl]).into_owned();
        pairs.push((name, val));
        rest = &rest[4 + nl + vl..];
    }
    let find = |n: &str| pairs.iter().find(|p| p.0 == n).map(|p| p.1.clone());
    assert_eq!(find("objects").as_deref(), Some("2"));
    assert_eq!(find("cmd_acquire").as_deref(), Some("2"));
    assert_eq!(find("cmd_release").as_deref(), Some("1"));

    let mut v = Vec::new();
    ct::encode_request(&mut v, op::DUMP, 4, b"");
    a.send(&v);
    let mut seen = Vec::new();
    loop {
        let r = read_reply(&mut a);
        assert_eq!((r.opcode, r.status, r.opaque), (op::DUMP, status::OK, 4));
        if r.body.is_empty() {
            break;
        }
        let cur = u32::from_be_bytes(r.body[0..4].try_into().unwrap());
        let max = u32::from_be_bytes(r.body[4..8].try_into().unwrap());
        let nl = u16::from_be_bytes([r.body[8], r.body[9]]) as usize;
        assert_eq!(r.body.len(), 10 + nl);
        seen.push((r.body[10..].to_vec(), cur, max));
    }
    seen.sort();
    assert_eq!(seen, vec![(b"one".to_vec(), 1, 3), (b"two".to_vec(), 1, 1)]);

    // memcached stats shows the counter namespace.
    let mut m = d.memcache();
    m.send(b"stats\r\n");
    let mut found = false;
    loop {
        let line = m.line();
        if line.starts_with("STAT counter_objects 2") {
            found = true;
        }
        if line == "END\r\n" {
            break;
        }
    }
    assert!(found, "counter_objects in stats");
}

#[test]
fn disconnect_releases_thousands_at_once() {
    let d = Daemon::start(&[]);
    let mut a = d.counter();
    let mut watcher = d.counter();
    const N: u32 = 3000;
    // Pipeline every Acquire, then read every reply.
    let mut buf = Vec::new();
    for i in 0..N {
        let mut b = Vec::new();
        ct::acquire_body(&mut b, 1, 1, format!("res-{i}").as_bytes());
        ct::encode_request(&mut buf, op::ACQUIRE, i, &b);
    }
    a.send(&buf);
    for i in 0..N {
        let r = read_reply(&mut a);
        assert_eq!((r.status, r.opaque), (status::OK, i));
    }
    assert_eq!(
        acquire(&mut watcher, b"res-0", 1, 1).status,
        status::NOT_AVAILABLE
    );
    drop(a);
    wait_for(&mut watcher, format!("res-{}", N - 1).as_bytes(), 0);
    for i in 0..N {
        assert_eq!(value(&get(&mut watcher, format!("res-{i}").as_bytes())), 0);
    }
    assert_eq!(value(&acquire(&mut watcher, b"res-0", 1, 1)), 1);
}

#[test]
fn bad_magic_closes_even_after_good_requests() {
    let d = Daemon::start(&[]);
    let mut a = d.counter();
    let mut v = Vec::new();
    ct::encode_request(&mut v, op::NOOP, 1, b"");
    v.extend_from_slice(b"get foo\r\n");
    a.send(&v);
    let r = read_reply(&mut a);
    assert_eq!((r.opcode, r.status), (op::NOOP, status::OK));
    a.expect_closed();
}

#[test]
fn a_lying_length_closes_instead_of_buffering() {
    let d = Daemon::start(&[]);
    let mut a = d.counter();
    let mut v = Vec::new();
    ct::encode_request(&mut v, op::GET, 1, b"");
    v[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
    a.send(&v);
    a.expect_closed();
    // A length within the cap that never arrives just waits; others are unaffected.
    let mut b = d.counter();
    let mut v = Vec::new();
    ct::encode_request(&mut v, op::GET, 1, b"");
    v[4..8].copy_from_slice(&(ct::MAX_BODY as u32).to_be_bytes());
    b.send(&v);
    b.expect_silence(Duration::from_millis(100));
    let mut c = d.counter();
    assert_eq!(call(&mut c, op::NOOP, 2, b"").status, status::OK);
}

#[test]
fn byte_at_a_time_requests_are_answered() {
    let d = Daemon::start(&[]);
    let mut a = d.counter();
    let mut body = Vec::new();
    ct::acquire_body(&mut body, 1, 2, b"slow");
    let mut v = Vec::new();
    ct::encode_request(&mut v, op::ACQUIRE, 42, &body);
    for byte in &v {
        a.send(std::slice::from_ref(byte));
        std::thread::sleep(Duration::from_millis(1));
    }
    let r = read_reply(&mut a);
    assert_eq!(
        (r.opcode, r.status, r.opaque),
        (op::ACQUIRE, status::OK, 42)
    );
    assert_eq!(r.body, 1u32.to_be_bytes());
}

#[test]
fn counter_off_prints_no_listener() {
    let d = Daemon::start(&["--counter", "off"]);
    assert!(d.counter.is_none());
    assert!(d.memcache.is_some());
}

// ---- determinism: counter schedules replayed under other hash seeds and from snapshots ----

mod replay {
    use holdfast::config::{self, Command, Config};
    use holdfast::core::hash::with_seed;
    use holdfast::proto::counter::{self as ct, op, status};
    use holdfast::rng::Rng;
    use holdfast::server::sim::{Recording, Replayer, Sim};
    use holdfast::server::Proto;
    use std::collections::HashMap;

    const NAMES: [&[u8]; 6] = [b"m", b"a", b"zz", b"b", b"ab", b"\xff"];
    const CONNS: usize = 5;

    fn config() -> Config {
        match config::parse(["--memory", "1"]) {
            Ok(Command::Run(c)) => c,
            other => panic!("{other:?}"),
        }
    }

    /// One response's (opcode, status, body) from the front of `out`.
    fn responses(mut out: &[u8]) -> Vec<(u8, u8, Vec<u8>)> {
        let mut v = Vec::new();
        while !out.is_empty() {
            assert!(out.len() >= ct::HEADER_LEN && out[0] == ct::RES_MAGIC);
            let len = u32::from_be_bytes([out[4], out[5], out[6], out[7]]) as usize;
            v.push((
                out[1],
                out[2],
                out[ct::HEADER_LEN..ct::HEADER_LEN + len].to_vec(),
            ));
            out = &out[ct::HEADER_LEN + len..];
        }
        v
    }

    /// A seeded schedule of counter requests checked against a model of what each connection
    /// holds; Dump replies must list names in byte order. The recording and final snapshot.
    fn recorded(seed: u64, steps: usize) -> (Recording, Vec<u8>) {
        let mut sim = Sim::new(config());
        sim.record();
        let mut rng = Rng::mixed(seed);
        let mut conns: Vec<Option<_>> = vec![None; CONNS];
        let mut held: HashMap<(usize, &[u8]), u32> = HashMap::new();
        let total = |h: &HashMap<(usize, &[u8]), u32>, n: &[u8]| -> u32 {
            h.iter().filter(|(k, _)| k.1 == n).map(|(_, v)| *v).sum()
        };
        let mut dumps = 0;
        for _ in 0..steps {
            let c = rng.below(CONNS as u64) as usize;
            let name = NAMES[rng.below(NAMES.len() as u64) as usize];
            let id = *conns[c].get_or_insert_with(|| sim.connect(Proto::Counter));
            let mut req = Vec::new();
            let mut body = Vec::new();
            match rng.below(12) {
                0 => {
                    sim.disconnect(id);
                    conns[c] = None;
                    held.retain(|k, _| k.0 != c);
                    continue;
                }
                1 => {
                    let to = sim.now_ms() + 1 + rng.below(50);
                    sim.advance_to(to);
                    continue;
                }
                2..=5 => {
                    let r = 1 + rng.below(3) as u32;
                    let max = r + rng.below(4) as u32;
                    ct::acquire_body(&mut body, r, max, name);
                    ct::encode_request(&mut req, op::ACQUIRE, 7, &body);
                    sim.send(id, &req);
                    let got = responses(&sim.output(id));
                    let ok = total(&held, name) + r <= max;
                    assert_eq!(got.len(), 1);
                    assert_eq!(got[0].1 == status::OK, ok, "acquire {r} of {max}");
                    if ok {
                        *held.entry((c, name)).or_default() += r;
                    }
                }
                6..=8 => {
                    let r = rng.below(3) as u32;
                    ct::release_body(&mut body, r, name);
                    ct::encode_request(&mut req, op::RELEASE, 8, &body);
                    sim.send(id, &req);
                    let got = responses(&sim.output(id));
                    let have = held.get(&(c, name)).copied().unwrap_or(0);
                    // A counter nobody holds may still exist (NotAcquired) or not (NotFound).
                    if have >= r && have > 0 {
                        assert_eq!(got[0].1, status::OK);
                        let h = held.entry((c, name)).or_default();
                        *h -= r;
                        if *h == 0 {
                            held.remove(&(c, name));
                        }
                    } else {
                        assert_ne!(got[0].1, status::OK);
                    }
                }
                9 => {
                    ct::get_body(&mut body, name);
                    ct::encode_request(&mut req, op::GET, 9, &body);
                    sim.send(id, &req);
                    let got = responses(&sim.output(id));
                    if got[0].1 == status::OK {
                        assert_eq!(got[0].2, total(&held, name).to_be_bytes());
                    } else {
                        assert_eq!(total(&held, name), 0);
                    }
                }
                10 => {
                    ct::encode_request(&mut req, op::DUMP, 10, &[]);
                    sim.send(id, &req);
                    let got = responses(&sim.output(id));
                    let names: Vec<&[u8]> = got[..got.len() - 1]
                        .iter()
                        .map(|(_, _, b)| &b[10..])
                        .collect();
                    assert!(names.windows(2).all(|w| w[0] < w[1]), "{names:?}");
                    assert!(got.last().is_some_and(|r| r.2.is_empty()));
                    dumps += usize::from(names.len() > 1);
                }
                _ => {
                    ct::encode_request(&mut req, op::STATS, 11, &[]);
                    sim.send(id, &req);
                    assert_eq!(responses(&sim.output(id))[0].1, status::OK);
                }
            }
        }
        assert!(dumps > 5, "too few dumps of several counters: {dumps}");
        let rec = sim.take_recording();
        (rec, sim.snapshot())
    }

    fn replay(rec: &Recording, hash_seed: u64, restore_every: Option<usize>) -> Vec<u8> {
        let mut r = with_seed(hash_seed, || Replayer::new(config()));
        for (i, (entry, want)) in rec.entries.iter().zip(&rec.effects).enumerate() {
            if restore_every.is_some_and(|n| i % n == n - 1) {
                let snap = r.snapshot();
                r = with_seed(hash_seed ^ (i as u64 + 1), || {
                    let mut fresh = Replayer::new(config());
                    fresh.restore(&snap).expect("restore");
                    fresh
                });
            }
            let got = r.apply(entry).expect("entry decodes");
            assert!(
                got == *want,
                "seed {hash_seed:#x}: effects of entry {i} differ"
            );
        }
        r.snapshot()
    }

    #[test]
    fn counter_schedules_replay_identically_under_other_seeds_and_from_snapshots() {
        for seed in [1, 2, 3] {
            let (rec, snap) = recorded(seed, 1200);
            assert!(rec.entries.len() > 500, "a short run");
            for hash_seed in [1, 0xDEAD_BEEF] {
                assert!(replay(&rec, hash_seed, None) == snap, "final state");
            }
            assert!(
                replay(&rec, 5, Some(37)) == snap,
                "final state across restores"
            );
        }
    }
}
