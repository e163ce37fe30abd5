//! The `connection` target: the fuzz input is a script of steps (send raw bytes, send a
//! well-formed request, disconnect, advance the fake clock) over six connection slots, two per
//! protocol, driven through [`Sim`] (the daemon's own parsers, owner code and tables). After
//! every step: the tables' own index checks, every lock holder is an open connection of the
//! right protocol (or a lease / an orphan whose deadline is still ahead), and every reply to a
//! lockd or dlock client is a whole, well-formed frame. At the end every client disconnects and
//! the clock passes every timer: nothing may stay locked, held or waiting.

use holdfast::config::{self, Command, Config};
use holdfast::server::msg::ConnId;
use holdfast::proto::dlock as dl;
use holdfast::proto::lockd as ld;
use holdfast::server::sim::Sim;
use holdfast::server::Proto;

/// Connection slots: slot `i` speaks `PROTOS[i % 3]`.
const SLOTS: usize = 6;
const PROTOS: [Proto; 3] = [Proto::Memcache, Proto::Lockd, Proto::Dlock];
/// A tiny key space, so that clients collide on the same locks.
const KEYS: [&[u8]; 3] = [b"a", b"b", b"c"];

/// Reads the script; past its end every byte is 0.
struct Input<'a> {
    rest: &'a [u8],
}

impl<'a> Input<'a> {
    fn byte(&mut self) -> u8 {
        match self.rest.split_first() {
            Some((&b, rest)) => {
                self.rest = rest;
                b
            }
            None => 0,
        }
    }

    fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.rest.len());
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        head
    }

    fn key(&mut self) -> &'static [u8] {
        KEYS[usize::from(self.byte()) % KEYS.len()]
    }
}

struct Client {
    id: ConnId,
    proto: Proto,
    /// Reply bytes received and not yet checked as whole frames.
    received: Vec<u8>,
}

pub struct Driver {
    sim: Sim,
    slots: [Option<Client>; SLOTS],
    /// The protocol of every connection ever opened.
    protos: Vec<(ConnId, Proto)>,
    next_id: u64,
    config: Config,
}

/// A configuration with small limits so that timeouts, memory pressure and key limits are all
/// reachable from short inputs.
fn config_from(input: &mut Input<'_>) -> Config {
    let Ok(Command::Run(mut c)) = config::parse(["--memory", "1", "--max-item-size", "1024"])
    else {
        unreachable!("fixed flags parse");
    };
    c.orphan_timeout_ms = u64::from(input.byte());
    let idle = input.byte();
    c.dlock_idle_timeout_ms = if idle & 1 == 0 {
        0
    } else {
        u64::from(idle) * 4
    };
    let limits = input.byte();
    c.dlock_max_keys = 1 + usize::from(limits % 4);
    c.dlock_max_message = 64 << ((limits >> 4) & 7);
    c.dlock_token = (limits & 8 != 0).then(|| "t".to_string());
    c
}

impl Driver {
    fn proto_of(&self, id: ConnId) -> Option<Proto> {
        self.protos.iter().find(|(c, _)| *c == id).map(|(_, p)| *p)
    }

    fn client(&mut self, slot: usize) -> ConnId {
        if let Some(c) = &self.slots[slot] {
            return c.id;
        }
        let proto = PROTOS[slot % 3];
        let id = self.sim.connect(proto);
        self.protos.push((id, proto));
        self.slots[slot] = Some(Client {
            id,
            proto,
            received: Vec::new(),
        });
        id
    }

    fn send(&mut self, slot: usize, bytes: &[u8]) {
        let id = self.client(slot);
        self.sim.send(id, bytes);
    }

    /// One well-formed request of the slot's protocol, chosen by the input.
    fn request(&mut self, slot: usize, input: &mut Input<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        match PROTOS[slot % 3] {
            // Counter connections are fuzzed by the `counter` target, not this script (yet).
            Proto::Counter => unreachable!("no counter slots"),
            Proto::Memcache => memcache_request(&mut out, input),
            Proto::Lockd => {
                const OPS: [u8; 8] = [
                    ld::op::ACQ,
                    ld::op::ACQ,
                    ld::op::TRY,
                    ld::op::REL,
                    ld::op::ADOPT,
                    ld::op::SYNC,
                    ld::op::PING,
                    0,
                ];
                let op = OPS[usize::from(input.byte()) % OPS.len()];
                let mut payload = input.key().to_vec();
                payload.push(0);
                ld::encode(&mut out, op, &payload);
            }
            Proto::Dlock => {
                let shape = input.byte();
                let n = 1 + usize::from(shape % 3);
                let keys: Vec<&[u8]> = (0..n).map(|_| input.key()).collect();
                let t = input.byte();
                let wait = match t & 3 {
                    0 => None,
                    1 => Some(0),
                    _ => Some(u64::from(t >> 2) * 1000),
                };
                let l = input.byte();
                let lease = (l & 1 == 1).then(|| u64::from(l >> 1) * 1000);
                let lock = dl::LockFields {
                    wait_micro: wait,
                    release_micro: lease,
                    keys: &keys,
                    native: Default::default(),
                };
                self.next_id += 1;
                let token: Option<&[u8]> = self.config.dlock_token.as_ref().map(|t| t.as_bytes());
                if shape & 0x40 != 0 {
                    // The native protocol (version 3): every request type, every field, small
                    // leases and lock-delays (under 256 ms, so that `finish` outlasts them).
                    let f = input.byte();
                    let value = (f & 2 != 0).then(|| input.key());
                    let mut lock = lock;
                    lock.native = dl::NativeFields {
                        shared: f & 1 != 0,
                        limit: (f & 12 != 0).then_some(u32::from((f >> 2) & 3)),
                        value,
                        lock_delay_micro: (f & 16 != 0).then(|| u64::from(input.byte()) * 1000),
                        fence: (f & 32 != 0).then(|| u64::from(input.byte())),
                    };
                    let ty = 1 + u64::from(shape >> 2) % 8;
                    let id = Some(self.next_id);
                    let v = dl::NATIVE_VERSION;
                    dl::encode_request_version(&mut out, v, id, token, ty, Some(lock));
                    return out;
                }
                match (shape >> 2) % 4 {
                    0 | 1 => dl::encode_request(
                        &mut out,
                        Some(self.next_id),
                        token,
                        dl::req_type::LOCK,
                        Some(lock),
                    ),
                    2 => dl::encode_request(
                        &mut out,
                        Some(self.next_id),
                        token,
                        dl::req_type::UNLOCK,
                        Some(lock),
                    ),
                    _ => dl::encode_request(
                        &mut out,
                        Some(self.next_id),
                        token,
                        dl::req_type::PING,
                        None,
                    ),
                }
            }
        }
        out
    }

    fn disconnect(&mut self, slot: usize) {
        if let Some(c) = self.slots[slot].take() {
            self.sim.disconnect(c.id);
        }
    }

    /// Everything that must hold between any two steps.
    fn check(&mut self) {
        // Deadlines in the tables are Unix milliseconds.
        let now = self.sim.clock_ms();
        for slot in 0..SLOTS {
            let Some(c) = &mut self.slots[slot] else {
                continue;
            };
            let out = self.sim.output(c.id);
            c.received.extend_from_slice(&out);
            check_frames(c.proto, &mut c.received);
            if !self.sim.is_open(c.id) {
                self.slots[slot] = None;
            }
        }
        let t = self.sim.tables();
        t.lockd.check_invariants();
        t.dlock.check_invariants();
        t.store.check_invariants();
        // The tables hold sessions: a holder is live if its session still has an open
        // connection of the right listener.
        let live = |s: holdfast::core::Session, proto: Proto| {
            t.sessions
                .conn(s)
                .is_some_and(|id| self.sim.is_open(id) && self.proto_of(id) == Some(proto))
        };
        let mut locked = 0;
        t.lockd.for_each_locked(|name| {
            locked += 1;
            match t.lockd.state(name) {
                holdfast::core::lockd::LockState::Held(c) => {
                    assert!(live(c, Proto::Lockd), "lockd {name:?} held by {c:?}, gone")
                }
                holdfast::core::lockd::LockState::Orphaned { deadline_ms } => {
                    assert!(deadline_ms > now, "orphan {name:?} past its deadline")
                }
                holdfast::core::lockd::LockState::Free => panic!("{name:?} listed, not locked"),
            }
            for (w, _) in t.lockd.waiters(name) {
                assert!(live(w, Proto::Lockd), "lockd {name:?} waiter {w:?} gone");
            }
        });
        let s = t.lockd.stats();
        assert_eq!(s.held + s.orphaned, locked);
        t.dlock.for_each_held(|key, c, lease| match lease {
            None => assert!(live(c, Proto::Dlock), "dlock {key:?} held by {c:?}, gone"),
            Some(d) => assert!(d > now, "dlock lease on {key:?} past its deadline"),
        });
        t.store.for_each_lock(|key, c| {
            assert!(
                live(c, Proto::Memcache),
                "item {key:?} locked by {c:?}, gone"
            )
        });
    }

    /// Every client leaves and the clock passes every timer: nothing may be left.
    fn finish(&mut self) {
        for slot in 0..SLOTS {
            self.disconnect(slot);
        }
        let t = self.sim.tables();
        let mut last = 0;
        t.dlock
            .for_each_held(|_, _, lease| last = last.max(lease.unwrap_or(0)));
        // Native leases, and the lock-delay (under 256 ms) that may follow one.
        t.dlock.for_each_grant(|_, _, _, lease, _| {
            last = last.max(lease.map_or(0, |l| l + 256));
        });
        let now = self.sim.now_ms();
        // Lease deadlines are Unix milliseconds; the sim's clock counts from its start.
        let last = last.saturating_sub(self.sim.clock_ms() - now);
        let far = now
            .saturating_add(self.config.orphan_timeout_ms)
            .saturating_add(self.config.dlock_idle_timeout_ms)
            .saturating_add(256)
            .max(last)
            .saturating_add(1);
        self.sim.advance_to(far);
        let t = self.sim.tables();
        t.lockd.check_invariants();
        t.dlock.check_invariants();
        t.store.check_invariants();
        t.lockd
            .for_each_locked(|name| panic!("lockd {name:?} still locked"));
        t.dlock
            .for_each_held(|key, c, _| panic!("dlock {key:?} still held by {c:?}"));
        t.store
            .for_each_lock(|key, c| panic!("item {key:?} still locked by {c:?}"));
        let l = t.lockd.stats();
        assert_eq!((l.held, l.orphaned, l.waiting), (0, 0, 0), "{l:?}");
        let d = t.dlock.stats();
        assert_eq!((d.held_keys, d.leases, d.waiting), (0, 0, 0), "{d:?}");
        let n = t.dlock.native_stats();
        assert_eq!((n.holds, n.leases, n.delayed_keys), (0, 0, 0), "{n:?}");
        assert_eq!(t.store.stats().locks_held, 0);
    }
}

/// Whole reply frames only, each well formed (memcached replies are not checked here).
fn check_frames(proto: Proto, received: &mut Vec<u8>) {
    match proto {
        Proto::Counter => unreachable!("no counter slots"),
        Proto::Memcache => received.clear(),
        Proto::Lockd => {
            let mut at = 0;
            while let Some((f, n)) = ld::parse(&received[at..]) {
                assert_eq!(f.version, ld::VERSION, "reply version");
                assert!(
                    (ld::op::ACQUIRED..=ld::op::SYNC_REPLY).contains(&f.opcode),
                    "reply opcode {}",
                    f.opcode
                );
                at += n;
            }
            assert_eq!(at, received.len(), "a partial lockd reply: {received:?}");
            received.clear();
        }
        Proto::Dlock => {
            let mut at = 0;
            while let Ok((body, n)) = dl::parse_frame(&received[at..], usize::MAX) {
                let r = dl::decode_response(body).expect("a dlock reply decodes");
                let native = Some(dl::NATIVE_VERSION);
                assert!(r.version == Some(dl::API_VERSION) || r.version == native);
                assert!(r.status.is_some() && r.server_unix_time.is_some());
                at += n;
            }
            assert_eq!(at, received.len(), "a partial dlock reply: {received:?}");
            received.clear();
        }
    }
}

fn memcache_request(out: &mut Vec<u8>, input: &mut Input<'_>) {
    use holdfast::proto::memcache::binary::opcode as bop;
    let kind = input.byte();
    let key = input.key();
    let k = String::from_utf8_lossy(key);
    let text = |out: &mut Vec<u8>, s: String| out.extend_from_slice(s.as_bytes());
    match kind % 14 {
        0 | 1 => {
            // Values up to ~1 KiB against a 1 MiB store: evictions happen.
            let len = usize::from(input.byte()) * 4;
            text(out, format!("set {k} 0 0 {len}\r\n"));
            out.resize(out.len() + len, b'v');
            out.extend_from_slice(b"\r\n");
        }
        2 => text(out, format!("set {k} 0 {} 1\r\nv\r\n", input.byte() % 3)),
        3 | 4 => text(out, format!("lock {k}\r\n")),
        5 => text(out, format!("unlock {k}\r\n")),
        6 => text(out, "unlock_all\r\n".into()),
        7 => text(out, format!("delete {k}\r\n")),
        8 => text(out, format!("get {k}\r\n")),
        9 => text(out, "quit\r\n".into()),
        10 => text(out, format!("flush_all {}\r\n", input.byte() % 3)),
        _ => {
            let ops = [bop::LOCK, bop::UNLOCK, bop::LAG, bop::RAU, bop::UNLOCK_ALL];
            let op = ops[usize::from(input.byte()) % ops.len()];
            let extras: &[u8] = if op == bop::RAU { &[0; 8] } else { &[] };
            let (key, value): (&[u8], &[u8]) = match op {
                bop::UNLOCK_ALL => (b"", b""),
                bop::RAU => (key, b"w"),
                _ => (key, b""),
            };
            let req = holdfast::proto::memcache::binary::Request {
                opcode: op,
                data_type: 0,
                vbucket: 0,
                opaque: 7,
                cas: 0,
                extras,
                key,
                value,
            };
            out.extend_from_slice(&crate::encode_binary(&req));
        }
    }
}

/// Run one script.
pub fn run(data: &[u8]) {
    let mut input = Input { rest: data };
    let config = config_from(&mut input);
    let mut d = Driver {
        sim: Sim::new(config.clone()),
        slots: Default::default(),
        protos: Vec::new(),
        next_id: 0,
        config,
    };
    let mut steps = 0;
    while !input.rest.is_empty() && steps < 256 {
        steps += 1;
        let op = input.byte();
        let slot = usize::from(op >> 3) % SLOTS;
        match op & 7 {
            0 => {
                let n = usize::from(input.byte());
                let bytes = input.take(n);
                d.send(slot, bytes);
            }
            1..=3 => {
                let req = d.request(slot, &mut input);
                d.send(slot, &req);
            }
            4 => {
                // A request split in two, checked in between.
                let req = d.request(slot, &mut input);
                let cut = usize::from(input.byte()) % (req.len() + 1);
                d.send(slot, &req[..cut]);
                d.check();
                d.send(slot, &req[cut..]);
            }
            5 => d.disconnect(slot),
            6 => {
                let b = input.byte();
                let ms = if b & 0x80 != 0 {
                    u64::from(b & 0x7f) * 50
                } else {
                    u64::from(b)
                };
                let to = d.sim.now_ms() + ms;
                d.sim.advance_to(to);
            }
            _ => {
                // Several requests in one read (pipelining).
                let n = 2 + usize::from(input.byte() % 3);
                let mut all = Vec::new();
                for _ in 0..n {
                    all.extend(d.request(slot, &mut input));
                }
                d.send(slot, &all);
            }
        }
        d.check();
    }
    d.finish();
}
