//! Lock ownership under random schedules, all protocols at once.
//!
//! Seeded random sequences drive the whole request path ([`Sim`]: the daemon's parsers, owner
//! code and tables with a fake clock) with sixteen clients, four per protocol and four of dlock's
//! version 3 (the native protocol; "Version-3 (native) dlock clients" below): random requests,
//! disconnects and reconnects, clock advances past orphan timeouts, leases, wait deadlines and
//! idle timeouts, and a 1 MiB item store under memory pressure. Each protocol has a naive model
//! of who holds what, built only from the replies the clients received, taken in the order the
//! daemon produced them ([`Sim::log_replies`]): a lockd client that reads ACQUIRED holds the name,
//! RELEASED frees it, a disconnect orphans it; a dlock Ok for a Lock holds its keys; a memcached
//! `OK` to `lock` holds the item. A reply that gives a lock somebody else already holds in the
//! model fails the test ("two holders"), and so does a dlock grant whose fencing token is not
//! above every token the clients saw before it. After every step the model must equal the tables
//! (holders, orphans, queues, stats), and no dlock waiter may outlive its wait deadline. At the
//! end every client leaves, the clock passes every timer, and nothing is left locked.
//!
//! Timers that fire within one clock advance happen at instants the clients cannot see, so the
//! model lets a lease or an orphan go as soon as its deadline is at or before the current time
//! (lazily, when a later reply needs the name), and the clock moves in chunks of at most
//! `CHUNK_MS` with the checks after each.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use holdfast::config::{self, Command, Config};
use holdfast::core::lockd::LockState;
use holdfast::proto::dlock as dl;
use holdfast::proto::lockd as ld;
use holdfast::proto::memcache::binary;
use holdfast::rng::Rng;
use holdfast::server::msg::ConnId;
use holdfast::server::sim::{Sim, SIM_UNIX_START};
// A grant's mode (exclusive stands for version 2's holds too) and which fit together.
use holdfast::server::LEASE_CLOCK_SLACK_MS;
use holdfast::sim::native::Mode;

/// The tables' clock is Unix milliseconds; the sim's (and this model's) counts from its start.
const EPOCH_MS: u64 = SIM_UNIX_START * 1000;
use holdfast::server::Proto;

/// Lock names shared by everybody (few, so that clients collide).
const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];
/// Clients of the classic mix (memcached, lockd, dlock version 2); the native mix adds four
/// version-3 dlock clients.
const CLIENTS: usize = 12;
const ORPHAN_MS: u64 = 40;
const IDLE_MS: u64 = 300;
/// Largest clock move between two checks.
const CHUNK_MS: u64 = 4;

fn config() -> Config {
    let args = [
        "--memory",
        "1",
        "--max-item-size",
        "65536",
        "--orphan-timeout",
        &ORPHAN_MS.to_string(),
        "--dlock-idle-timeout",
        &IDLE_MS.to_string(),
    ];
    match config::parse(args) {
        Ok(Command::Run(c)) => c,
        other => panic!("{other:?}"),
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum LdHold {
    Held(ConnId),
    Orphan { deadline: u64 },
}

#[derive(Clone, Copy, Debug)]
struct DlHold {
    conn: ConnId,
    fence: u64,
    /// The lease deadline; while `lease_hi` is set, only a lower bound (see `settle`).
    lease: Option<u64>,
    lease_hi: Option<u64>,
}

#[derive(Debug)]
enum DlReq {
    Lock {
        keys: Vec<&'static str>,
        wait_ms: Option<u64>,
        lease_ms: Option<u64>,
    },
    Unlock {
        keys: Vec<&'static str>,
    },
    Ping,
}

#[derive(Debug)]
enum McReq {
    Set { key: String },
    Lock(&'static str),
    Unlock(&'static str),
    UnlockAll,
    Delete(&'static str),
    Get,
    Quit,
    Flush,
    BinLock(&'static str),
    BinUnlock(&'static str),
}

struct Client {
    proto: Proto,
    conn: Option<ConnId>,
    /// lockd: requests sent and not answered, in order.
    ld_expect: VecDeque<(u8, &'static str)>,
    /// dlock: requests sent and not answered: id, request, and a lower bound of the time its
    /// wait started (when it became the first unanswered one).
    dl_out: VecDeque<(u64, DlReq)>,
    dl_front_since: (u64, u64),
    /// dlock: bounds of the last activity the idle timer counts from.
    dl_active: (u64, u64),
    /// A version-3 dlock client (on a dlock connection).
    native: bool,
    /// Version 3: requests sent and not answered, by request id (answered in any order).
    nl_out: HashMap<u64, NReq>,
    /// Version 3: watched keys.
    watch: HashMap<&'static str, WatchView>,
    /// Version 3: event frames of the current step (request id, event), checked in `settle`.
    ev_buf: Vec<(u64, dl::Event)>,
    /// Version 3: the fence of the last Acquired event this client saw.
    last_acquired: u64,
}

struct World {
    sim: Sim,
    rng: Rng,
    clients: Vec<Client>,
    /// The time before the current step, and now.
    step_start: u64,
    next_id: u64,
    mc: HashMap<&'static str, ConnId>,
    ld: HashMap<&'static str, LdHold>,
    ld_queue: HashMap<&'static str, VecDeque<ConnId>>,
    dl: HashMap<&'static str, DlHold>,
    /// The fencing token of the last dlock grant the clients saw, in the daemon's reply order:
    /// grants must reach the clients in token order.
    dl_fence: u64,
    /// The same for memcached binary Lock grants (the token is in the reply's CAS field).
    mc_fence: u64,
    /// memcached reply bytes of the current step, per client.
    mc_reply: Vec<u8>,
    filler: u64,
    /// Whether native clients may Watch.
    watches_on: bool,
    nat: NatModel,
}

fn key_of(name: &[u8]) -> &'static str {
    KEYS.iter()
        .copied()
        .find(|k| k.as_bytes() == name)
        .unwrap_or_else(|| panic!("unknown name {name:?}"))
}

impl World {
    fn with(seed: u64, mix: Mix) -> World {
        let mut sim = Sim::new(config());
        sim.log_replies();
        // (proto, native): the classic mix keeps its schedules (and its seeds' meaning).
        let kinds: &[(Proto, bool)] = match mix {
            Mix::Classic => &[
                (Proto::Memcache, false),
                (Proto::Lockd, false),
                (Proto::Dlock, false),
            ],
            Mix::Native { .. } => &[
                (Proto::Memcache, false),
                (Proto::Lockd, false),
                (Proto::Dlock, false),
                (Proto::Dlock, true),
            ],
        };
        let n = CLIENTS / 3 * kinds.len();
        World {
            sim,
            rng: Rng::mixed(seed),
            clients: (0..n)
                .map(|i| Client {
                    proto: kinds[i % kinds.len()].0,
                    conn: None,
                    ld_expect: VecDeque::new(),
                    dl_out: VecDeque::new(),
                    dl_front_since: (0, 0),
                    dl_active: (0, 0),
                    native: kinds[i % kinds.len()].1,
                    nl_out: HashMap::new(),
                    watch: HashMap::new(),
                    ev_buf: Vec::new(),
                    last_acquired: 0,
                })
                .collect(),
            step_start: 0,
            next_id: 0,
            mc: HashMap::new(),
            ld: HashMap::new(),
            ld_queue: HashMap::new(),
            dl: HashMap::new(),
            dl_fence: 0,
            mc_fence: 0,
            mc_reply: Vec::new(),
            filler: 0,
            watches_on: matches!(mix, Mix::Native { watches: true }),
            nat: NatModel::default(),
        }
    }

    fn now(&self) -> u64 {
        self.sim.now_ms()
    }

    fn conn(&mut self, c: usize) -> ConnId {
        if let Some(id) = self.clients[c].conn {
            return id;
        }
        let now = self.now();
        let id = self.sim.connect(self.clients[c].proto);
        let cl = &mut self.clients[c];
        cl.conn = Some(id);
        cl.dl_active = (now, now);
        id
    }

    fn client_of(&self, conn: ConnId) -> Option<usize> {
        self.clients.iter().position(|c| c.conn == Some(conn))
    }

    // ---- actions ----

    fn step(&mut self) {
        self.step_start = self.now();
        let c = self.rng.below(self.clients.len() as u64) as usize;
        match self.rng.below(100) {
            0..=5 => self.disconnect(c),
            6..=15 => {
                let to = match self.rng.below(4) {
                    0 => self.now() + 1 + self.rng.below(10),
                    1 => self.now() + ORPHAN_MS + self.rng.below(20),
                    2 => self.now() + 50 + self.rng.below(150),
                    _ => self.now() + IDLE_MS + self.rng.below(50),
                };
                return self.advance_to(to);
            }
            _ => match self.clients[c].proto {
                Proto::Memcache => self.memcache(c),
                Proto::Lockd => self.lockd(c),
                Proto::Dlock if self.clients[c].native => self.native(c),
                Proto::Dlock => self.dlock(c),
                // This schedule has no counter clients (tests/counter.rs covers counters).
                Proto::Counter => unreachable!("no counter clients"),
            },
        }
        self.settle();
    }

    fn advance_to(&mut self, to: u64) {
        while self.now() < to {
            self.step_start = self.now();
            let next = (self.now() + CHUNK_MS).min(to);
            self.sim.advance_to(next);
            self.settle();
        }
    }

    fn disconnect(&mut self, c: usize) {
        if let Some(id) = self.clients[c].conn {
            self.sim.disconnect(id);
            self.closed(c, id);
        }
    }

    /// Client `c`'s connection `id` is gone (its own disconnect, or the daemon closed it).
    fn closed(&mut self, c: usize, id: ConnId) {
        let now = self.now();
        let cl = &mut self.clients[c];
        cl.conn = None;
        cl.ld_expect.clear();
        cl.dl_out.clear();
        cl.nl_out.clear();
        cl.watch.clear();
        cl.ev_buf.clear();
        self.native_closed(id);
        self.mc.retain(|_, h| *h != id);
        for hold in self.ld.values_mut() {
            if *hold == LdHold::Held(id) {
                *hold = LdHold::Orphan {
                    deadline: now + ORPHAN_MS,
                };
            }
        }
        for q in self.ld_queue.values_mut() {
            q.retain(|w| *w != id);
        }
        let lost: Vec<(&'static str, u64)> = self
            .dl
            .iter()
            .filter(|(_, h)| h.conn == id && h.lease.is_none())
            .map(|(k, h)| (*k, h.fence))
            .collect();
        for (k, f) in lost {
            self.dl.remove(k);
            self.end(k, f, dl::event_kind::LOST);
        }
    }

    fn memcache(&mut self, c: usize) {
        let key = KEYS[self.rng.index(KEYS.len())];
        let req = match self.rng.below(20) {
            0..=2 => McReq::Set {
                key: key.to_string(),
            },
            3..=5 => {
                // Memory pressure: big values under other names push items out of the 1 MiB
                // store; locked items must stay.
                self.filler += 1;
                McReq::Set {
                    key: format!("f{}", self.filler % 300),
                }
            }
            6..=8 => McReq::Lock(key),
            9..=10 => McReq::Unlock(key),
            11 => McReq::UnlockAll,
            12 => McReq::Delete(key),
            13 => McReq::Get,
            14 => McReq::Quit,
            // Rare: a flush empties the store, and memory pressure needs it full.
            15 if self.rng.chance(20) => McReq::Flush,
            15 => McReq::Get,
            16..=17 => McReq::BinLock(key),
            _ => McReq::BinUnlock(key),
        };
        let bytes = match &req {
            McReq::Set { key } => {
                let len = if key.starts_with('f') {
                    20_000 + self.rng.below(44_000) as usize
                } else {
                    self.rng.below(20) as usize
                };
                let exp = if key.starts_with('f') {
                    0
                } else {
                    self.rng.below(3)
                };
                let mut b = format!("set {key} 0 {exp} {len}\r\n").into_bytes();
                b.resize(b.len() + len, b'v');
                b.extend_from_slice(b"\r\n");
                b
            }
            McReq::Lock(k) => format!("lock {k}\r\n").into_bytes(),
            McReq::Unlock(k) => format!("unlock {k}\r\n").into_bytes(),
            McReq::UnlockAll => b"unlock_all\r\n".to_vec(),
            McReq::Delete(k) => format!("delete {k}\r\n").into_bytes(),
            McReq::Get => format!("get {key} f1\r\n").into_bytes(),
            McReq::Quit => b"quit\r\n".to_vec(),
            McReq::Flush => b"flush_all\r\n".to_vec(),
            McReq::BinLock(k) | McReq::BinUnlock(k) => {
                let op = if matches!(req, McReq::BinLock(_)) {
                    binary::opcode::LOCK
                } else {
                    binary::opcode::UNLOCK
                };
                let mut v = vec![0x80, op, 0, k.len() as u8, 0, 0, 0, 0];
                v.extend_from_slice(&(k.len() as u32).to_be_bytes());
                v.extend_from_slice(&[0; 12]);
                v.extend_from_slice(k.as_bytes());
                v
            }
        };
        let id = self.conn(c);
        self.mc_reply.clear();
        self.sim.send(id, &bytes);
        // memcached replies carry no lock grants to others: read this one whole.
        self.drain_log();
        let reply = std::mem::take(&mut self.mc_reply);
        self.mc_reply_check(id, &req, &reply);
    }

    fn mc_reply_check(&mut self, me: ConnId, req: &McReq, reply: &[u8]) {
        let holder = |w: &World, k: &str| w.mc.get(k).copied();
        let ctx = format!("{req:?} by {me:?} -> {:?}", String::from_utf8_lossy(reply));
        match req {
            McReq::Set { key } => {
                let k = KEYS.iter().copied().find(|k| k == key);
                let h = k.and_then(|k| holder(self, k));
                match reply {
                    b"STORED\r\n" => assert!(h.is_none() || h == Some(me), "{ctx}"),
                    b"LOCKED\r\n" => assert!(h.is_some() && h != Some(me), "{ctx}"),
                    r if r.starts_with(b"SERVER_ERROR out of memory") => {}
                    _ => panic!("{ctx}"),
                }
            }
            McReq::Lock(k) | McReq::BinLock(k) => {
                let h = holder(self, k);
                let status = mc_status(req, reply);
                match status {
                    Mc::Ok => {
                        assert!(h.is_none(), "two holders: {ctx}, model {h:?}");
                        self.mc.insert(k, me);
                        if let McReq::BinLock(_) = req {
                            let fence = u64::from_be_bytes(reply[16..24].try_into().expect("8"));
                            assert!(fence > self.mc_fence, "fence {fence}: {ctx}");
                            self.mc_fence = fence;
                        }
                    }
                    Mc::Locked => assert!(h.is_some(), "{ctx}"),
                    Mc::NotFound => assert!(h.is_none(), "a locked item vanished: {ctx}"),
                    Mc::NotLocked => panic!("{ctx}"),
                }
            }
            McReq::Unlock(k) | McReq::BinUnlock(k) => {
                let h = holder(self, k);
                match mc_status(req, reply) {
                    Mc::Ok => {
                        assert_eq!(h, Some(me), "{ctx}");
                        self.mc.remove(k);
                    }
                    Mc::NotLocked | Mc::NotFound => assert_ne!(h, Some(me), "{ctx}"),
                    Mc::Locked => panic!("{ctx}"),
                }
            }
            McReq::UnlockAll => {
                assert_eq!(reply, b"OK\r\n", "{ctx}");
                self.mc.retain(|_, h| *h != me);
            }
            McReq::Delete(k) => {
                let h = holder(self, k);
                match reply {
                    b"DELETED\r\n" => {
                        assert!(h.is_none() || h == Some(me), "{ctx}");
                        self.mc.remove(k);
                    }
                    b"LOCKED\r\n" => assert!(h.is_some() && h != Some(me), "{ctx}"),
                    b"NOT_FOUND\r\n" => assert!(h.is_none(), "{ctx}"),
                    _ => panic!("{ctx}"),
                }
            }
            McReq::Get => assert!(reply.ends_with(b"END\r\n"), "{ctx}"),
            McReq::Quit => assert!(reply.is_empty(), "{ctx}"),
            McReq::Flush => assert_eq!(reply, b"OK\r\n", "{ctx}"),
        }
    }

    fn lockd(&mut self, c: usize) {
        let name = KEYS[self.rng.index(KEYS.len())];
        const OPS: [u8; 9] = [
            ld::op::ACQ,
            ld::op::ACQ,
            ld::op::TRY,
            ld::op::REL,
            ld::op::REL,
            ld::op::ADOPT,
            ld::op::ADOPT,
            ld::op::SYNC,
            ld::op::PING,
        ];
        let op = OPS[self.rng.below(OPS.len() as u64) as usize];
        let mut payload = name.as_bytes().to_vec();
        payload.push(0);
        let mut frame = Vec::new();
        ld::encode(
            &mut frame,
            op,
            if op == ld::op::SYNC { &[] } else { &payload },
        );
        let id = self.conn(c);
        self.clients[c].ld_expect.push_back((op, name));
        self.sim.send(id, &frame);
    }

    fn dlock(&mut self, c: usize) {
        if self.clients[c].dl_out.len() >= 3 {
            return;
        }
        let n = 1 + self.rng.below(3) as usize;
        let mut keys: Vec<&'static str> = Vec::new();
        for _ in 0..n {
            let k = KEYS[self.rng.index(KEYS.len())];
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        let req = match self.rng.below(10) {
            0..=5 => DlReq::Lock {
                keys,
                wait_ms: match self.rng.below(4) {
                    0 => None,
                    1 => Some(0),
                    _ => Some(1 + self.rng.below(150)),
                },
                lease_ms: self.rng.chance(30).then(|| 1 + self.rng.below(100)),
            },
            6..=8 => DlReq::Unlock { keys },
            _ => DlReq::Ping,
        };
        self.next_id += 1;
        let rid = self.next_id;
        let mut frame = Vec::new();
        match &req {
            DlReq::Lock {
                keys,
                wait_ms,
                lease_ms,
            } => {
                let ks: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
                let fields = dl::LockFields {
                    wait_micro: wait_ms.map(|w| w * 1000),
                    release_micro: lease_ms.map(|l| l * 1000),
                    keys: &ks,
                    native: Default::default(),
                };
                dl::encode_request(
                    &mut frame,
                    Some(rid),
                    None,
                    dl::req_type::LOCK,
                    Some(fields),
                );
            }
            DlReq::Unlock { keys } => {
                let ks: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
                let fields = dl::LockFields {
                    keys: &ks,
                    ..Default::default()
                };
                dl::encode_request(
                    &mut frame,
                    Some(rid),
                    None,
                    dl::req_type::UNLOCK,
                    Some(fields),
                );
            }
            DlReq::Ping => {
                dl::encode_request(&mut frame, Some(rid), None, dl::req_type::PING, None)
            }
        }
        let id = self.conn(c);
        let now = self.now();
        let cl = &mut self.clients[c];
        if cl.dl_out.is_empty() {
            cl.dl_front_since = (now, now);
        }
        cl.dl_out.push_back((rid, req));
        cl.dl_active = (now, now);
        self.sim.send(id, &frame);
    }

    // ---- replies, in the daemon's order ----

    fn drain_log(&mut self) {
        for (conn, bytes) in self.sim.take_log() {
            let Some(c) = self.client_of(conn) else {
                panic!("reply to {conn:?}, which no client has open");
            };
            match self.clients[c].proto {
                Proto::Memcache => self.mc_reply.extend_from_slice(&bytes),
                Proto::Counter => unreachable!("no counter clients"),
                Proto::Lockd => {
                    let mut at = 0;
                    while let Some((f, n)) = ld::parse(&bytes[at..]) {
                        self.lockd_frame(c, conn, f.opcode, f.payload);
                        at += n;
                    }
                    assert_eq!(at, bytes.len(), "partial lockd reply");
                }
                Proto::Dlock => {
                    let mut at = 0;
                    while let Ok((body, n)) = dl::parse_frame(&bytes[at..], usize::MAX) {
                        let r = dl::decode_response(body).expect("dlock reply decodes");
                        if self.clients[c].native {
                            self.native_response(c, conn, r);
                        } else {
                            self.dlock_response(c, conn, r);
                        }
                        at += n;
                    }
                    assert_eq!(at, bytes.len(), "partial dlock reply");
                }
            }
        }
        // Drain every connection's own buffer too (the log already has the bytes).
        for c in 0..self.clients.len() {
            if let Some(id) = self.clients[c].conn {
                self.sim.output(id);
            }
        }
    }

    /// Whether the model may consider `name` free now: not locked, or an orphan whose time ran
    /// out (the daemon released it at an instant the clients could not see).
    fn ld_free(&self, name: &str) -> bool {
        match self.ld.get(name) {
            None => true,
            Some(LdHold::Orphan { deadline }) => *deadline <= self.now(),
            Some(LdHold::Held(_)) => false,
        }
    }

    fn lockd_frame(&mut self, c: usize, me: ConnId, opcode: u8, payload: &[u8]) {
        let Some((op, name)) = self.clients[c].ld_expect.pop_front() else {
            // Unsolicited: a queued ACQ granted.
            assert_eq!(opcode, ld::op::ACQUIRED, "unsolicited lockd frame {opcode}");
            let name = key_of(payload.strip_suffix(b"\0").expect("name"));
            assert!(
                self.ld_free(name),
                "two holders: {name} granted to {me:?}, model {:?}",
                self.ld.get(name)
            );
            let q = self.ld_queue.entry(name).or_default();
            assert_eq!(q.pop_front(), Some(me), "grant out of FIFO order on {name}");
            self.ld.insert(name, LdHold::Held(me));
            return;
        };
        let ctx = format!("op {op} {name} by {me:?} -> {opcode}");
        let now = self.now();
        match (op, opcode) {
            (ld::op::ACQ | ld::op::TRY, ld::op::ACQUIRED) => {
                assert!(
                    self.ld_free(name),
                    "two holders: {ctx} {:?}",
                    self.ld.get(name)
                );
                assert!(
                    self.ld_queue.get(name).is_none_or(|q| q.is_empty()),
                    "{ctx}"
                );
                self.ld.insert(name, LdHold::Held(me));
            }
            (ld::op::ACQ, ld::op::ACK) => {
                assert!(!self.ld_free(name), "{ctx}");
                self.ld_queue.entry(name).or_default().push_back(me);
            }
            (ld::op::TRY, ld::op::WBLOCK) => assert!(!self.ld_free(name), "{ctx}"),
            (ld::op::REL, ld::op::RELEASED) => {
                assert!(!self.ld_free(name), "{ctx}");
                self.ld.remove(name);
            }
            (ld::op::REL, ld::op::ERR) => assert!(self.ld_free(name), "{ctx}"),
            (ld::op::ADOPT, ld::op::ACK) => {
                assert!(
                    matches!(self.ld.get(name), Some(LdHold::Orphan { deadline }) if *deadline > now),
                    "{ctx}"
                );
                self.ld.insert(name, LdHold::Held(me));
            }
            (ld::op::ADOPT, ld::op::ERR) => assert!(
                !matches!(self.ld.get(name), Some(LdHold::Orphan { deadline }) if *deadline > now),
                "{ctx}"
            ),
            (ld::op::SYNC, ld::op::SYNC_REPLY) => {
                let mut got: Vec<&str> = payload
                    .split(|&b| b == 0)
                    .filter(|n| !n.is_empty())
                    .map(key_of)
                    .collect();
                got.sort();
                let mut want: Vec<&str> = self
                    .ld
                    .keys()
                    .copied()
                    .filter(|n| !self.ld_free(n))
                    .collect();
                want.sort();
                assert_eq!(got, want, "SYNC");
            }
            (ld::op::PING, ld::op::PONG) => {}
            _ => panic!("unexpected reply: {ctx}"),
        }
    }

    fn dl_free_for(&self, key: &str, me: ConnId) -> bool {
        if !self.nat_live(key).is_empty() || self.delayed_for(key, Mode::Excl) {
            return false;
        }
        match self.dl.get(key) {
            None => true,
            Some(h) if h.conn == me => true,
            Some(DlHold { lease: Some(d), .. }) => *d <= self.now(),
            // A connection-bound holder the daemon closed (idle) in this very step.
            Some(h) => !self.sim.is_open(h.conn),
        }
    }

    fn dlock_response(&mut self, c: usize, me: ConnId, r: dl::Response) {
        let (rid, req) = self.clients[c]
            .dl_out
            .pop_front()
            .unwrap_or_else(|| panic!("dlock response {r:?} with nothing asked"));
        assert_eq!(r.request_id, Some(rid), "responses in request order");
        let now = self.now();
        let (since_lo, _) = self.clients[c].dl_front_since;
        self.clients[c].dl_front_since = (self.step_start, now);
        self.clients[c].dl_active = (self.step_start, now);
        let ctx = format!("{req:?} by {me:?} -> {r:?}");
        match (req, r.status) {
            (DlReq::Ping, Some(dl::status::OK)) => {}
            (DlReq::Lock { keys, lease_ms, .. }, Some(dl::status::OK)) => {
                let fence = r
                    .fence
                    .unwrap_or_else(|| panic!("a grant without a fence: {ctx}"));
                assert!(
                    fence > self.dl_fence,
                    "fence {fence} after {}: grants out of token order: {ctx}",
                    self.dl_fence
                );
                self.dl_fence = fence;
                for k in keys {
                    assert!(
                        self.dl_free_for(k, me),
                        "two holders: {ctx}, model {:?} {:?}",
                        self.dl.get(k),
                        self.nat_live(k)
                    );
                    self.nat_dead_delays(k, Mode::Excl, &ctx);
                    // The hold it replaces: a lease that ran out, a re-lock of its own, or a
                    // holder whose connection the daemon closed in this step.
                    if let Some(old) = self.dl.remove(k) {
                        let now = self.now();
                        let start = self.step_start;
                        let kind = if old.conn == me && old.lease.is_some_and(|d| d > start) {
                            if old.lease.is_some_and(|d| d <= now) {
                                // Re-locked at an instant of this step, maybe after its lease
                                // ran out.
                                EXPIRED_OR_RELEASED
                            } else {
                                dl::event_kind::RELEASED
                            }
                        } else if old.lease.is_some_and(|d| d <= now)
                            && old.lease_hi.is_none_or(|hi| hi <= now)
                        {
                            dl::event_kind::EXPIRED
                        } else if old.conn == me && old.lease.is_some_and(|d| d <= now) {
                            EXPIRED_OR_RELEASED
                        } else if old.conn == me {
                            dl::event_kind::RELEASED
                        } else if old.lease.is_some() {
                            dl::event_kind::EXPIRED
                        } else {
                            dl::event_kind::LOST
                        };
                        self.end(k, old.fence, kind);
                    }
                    self.grant(k, fence, Mode::Excl, None);
                    // The grant happened at some instant of this step: the deadline is known
                    // within bounds, made exact in `settle` from the table.
                    self.dl.insert(
                        k,
                        DlHold {
                            conn: me,
                            fence,
                            // The daemon adds one tick of its clock to every lease, so
                            // that none ends early (`LEASE_CLOCK_SLACK_MS`).
                            lease: lease_ms.map(|l| self.step_start + l + LEASE_CLOCK_SLACK_MS),
                            lease_hi: lease_ms.map(|l| now + l + LEASE_CLOCK_SLACK_MS),
                        },
                    );
                }
            }
            (DlReq::Lock { wait_ms, keys, .. }, Some(dl::status::ACQUIRE_TIMEOUT)) => {
                match wait_ms {
                    Some(0) => {}
                    Some(w) => assert!(now >= since_lo + w, "timed out early: {ctx}"),
                    None => panic!("an unbounded wait timed out: {ctx}"),
                }
                for k in &r.keys {
                    let k = key_of(k);
                    assert!(keys.contains(&k), "{ctx}");
                }
            }
            (DlReq::Lock { keys, .. }, Some(dl::status::GENERAL)) => {
                // Its implied limit of 1 disagrees with a semaphore's (holders or waiters now,
                // or holders that ended in this step, before it was taken up).
                assert!(
                    keys.iter().any(|k| self.slots_on(k)),
                    "General without a semaphore: {ctx}"
                );
            }
            (DlReq::Unlock { keys }, Some(status)) => {
                let not_held: Vec<&str> = r.keys.iter().map(|k| key_of(k)).collect();
                assert_eq!(status == dl::status::OK, not_held.is_empty(), "{ctx}");
                for k in keys {
                    let h = self.dl.get(k).copied();
                    let mine = h.is_some_and(|h| h.conn == me);
                    let expired = h.is_some_and(|h| h.lease.is_some_and(|d| d <= now));
                    if not_held.contains(&k) {
                        assert!(!mine || expired, "{k} was held: {ctx}");
                        if mine {
                            let h = self.dl.remove(k).expect("held");
                            self.end(k, h.fence, dl::event_kind::EXPIRED);
                        }
                    } else {
                        assert!(mine, "{k} was not held: {ctx}");
                        let h = self.dl.remove(k).expect("held");
                        self.end(k, h.fence, dl::event_kind::RELEASED);
                    }
                }
            }
            _ => panic!("unexpected response: {ctx}"),
        }
    }

    /// After every step: replies, closes, timers, then the model against the tables.
    fn settle(&mut self) {
        self.drain_log();
        let now = self.now();
        // Connections the daemon closed (memcached quit, dlock idle timeout).
        for c in 0..self.clients.len() {
            let Some(id) = self.clients[c].conn else {
                continue;
            };
            if !self.sim.is_open(id) {
                let cl = &self.clients[c];
                match cl.proto {
                    Proto::Dlock => {
                        assert!(cl.dl_out.is_empty(), "closed with a request pending");
                        assert!(cl.nl_out.is_empty(), "closed with a request pending");
                        assert!(now >= cl.dl_active.0 + IDLE_MS, "idle close too early");
                    }
                    Proto::Memcache => {}
                    Proto::Lockd => panic!("lockd connection closed by the daemon"),
                    Proto::Counter => unreachable!("no counter clients"),
                }
                self.sim.output(id);
                self.closed(c, id);
            } else if self.clients[c].proto == Proto::Dlock {
                let cl = &self.clients[c];
                assert!(
                    !cl.dl_out.is_empty()
                        || cl.nl_out.values().any(|r| matches!(r, NReq::Lock { .. }))
                        || now <= cl.dl_active.1 + IDLE_MS,
                    "idle for {} ms and still open",
                    now - cl.dl_active.1
                );
                // No waiter outlives its deadline.
                if let Some((
                    _,
                    DlReq::Lock {
                        wait_ms: Some(w), ..
                    },
                )) = cl.dl_out.front()
                {
                    assert!(
                        now < cl.dl_front_since.1 + w.max(&1),
                        "a Lock waited past its deadline of {w} ms"
                    );
                }
                for (rid, r) in &cl.nl_out {
                    if let NReq::Lock {
                        wait_ms,
                        sent,
                        mismatch,
                        ..
                    } = r
                    {
                        assert!(!mismatch, "a Lock of another limit waits: {rid} {r:?}");
                        if let Some(w) = wait_ms {
                            assert!(
                                now < sent + w.max(&1),
                                "a version-3 Lock waited past its deadline: {rid} {r:?}"
                            );
                        }
                    }
                }
            }
        }
        // Timers that ran out with nobody to hand the lock to.
        let expired: Vec<&str> = self
            .ld
            .iter()
            .filter(|(_, h)| matches!(h, LdHold::Orphan { deadline } if *deadline <= now))
            .map(|(n, _)| *n)
            .collect();
        for n in expired {
            assert!(
                self.ld_queue.get(n).is_none_or(|q| q.is_empty()),
                "orphan {n} expired and its waiter was not granted"
            );
            self.ld.remove(n);
        }
        // Leases granted in this step: the table has the exact deadline, which must lie within
        // the bounds the replies allow; one no longer in the table must have run out.
        let t = self.sim.tables();
        for (k, h) in self.dl.iter_mut() {
            let (Some(lo), Some(hi)) = (h.lease, h.lease_hi) else {
                continue;
            };
            match t.dlock.holder(k.as_bytes()) {
                Some((c, Some(d))) if self.sim.session_of(h.conn) == Some(c) => {
                    let d = d - EPOCH_MS;
                    assert!(lo <= d && d <= hi, "lease deadline {d} not in {lo}..={hi}");
                    h.lease = Some(d);
                }
                _ => assert!(lo <= now, "lease on {k} gone before {lo}"),
            }
            h.lease_hi = None;
        }
        let expired: Vec<(&'static str, u64)> = self
            .dl
            .iter()
            .filter(|(_, h)| h.lease.is_some_and(|d| d <= now))
            .map(|(k, h)| (*k, h.fence))
            .collect();
        for (k, f) in expired {
            self.dl.remove(k);
            self.end(k, f, dl::event_kind::EXPIRED);
        }
        self.native_settle();
        self.compare();
    }

    fn compare(&self) {
        let t = self.sim.tables();
        t.lockd.check_invariants();
        t.dlock.check_invariants();
        t.store.check_invariants();
        // memcached.
        // The tables hold sessions; the model knows connections.
        let conn_of = |s| t.sessions.conn(s).expect("a holder's session is live");
        let session_of = |c| {
            self.sim
                .session_of(c)
                .expect("every connection has a session")
        };
        let mut table: Vec<(Vec<u8>, ConnId)> = Vec::new();
        t.store
            .for_each_lock(|k, c| table.push((k.to_vec(), conn_of(c))));
        table.sort();
        let mut model: Vec<(Vec<u8>, ConnId)> = self
            .mc
            .iter()
            .map(|(k, c)| (k.as_bytes().to_vec(), *c))
            .collect();
        model.sort();
        assert_eq!(table, model, "memcached locks");
        assert_eq!(t.store.stats().locks_held, self.mc.len() as u64);
        // lockd.
        let (mut held, mut orphaned, mut waiting) = (0, 0, 0);
        for name in KEYS {
            let want = match self.ld.get(name) {
                None => LockState::Free,
                Some(LdHold::Held(c)) => {
                    held += 1;
                    LockState::Held(session_of(*c))
                }
                Some(LdHold::Orphan { deadline }) => {
                    orphaned += 1;
                    LockState::Orphaned {
                        deadline_ms: *deadline + EPOCH_MS,
                    }
                }
            };
            assert_eq!(t.lockd.state(name.as_bytes()), want, "lockd {name}");
            let q: Vec<ConnId> = t
                .lockd
                .waiters(name.as_bytes())
                .map(|(c, _)| conn_of(c))
                .collect();
            let mq: Vec<ConnId> = self
                .ld_queue
                .get(name)
                .map(|q| q.iter().copied().collect())
                .unwrap_or_default();
            assert_eq!(q, mq, "lockd queue of {name}");
            waiting += mq.len() as u64;
        }
        let s = t.lockd.stats();
        assert_eq!((s.held, s.orphaned, s.waiting), (held, orphaned, waiting));
        // dlock.
        for name in KEYS {
            let want = self
                .dl
                .get(name)
                .map(|h| (session_of(h.conn), h.lease.map(|d| d + EPOCH_MS)));
            assert_eq!(t.dlock.holder(name.as_bytes()), want, "dlock {name}");
        }
        let waiting = self
            .clients
            .iter()
            .filter(|c| matches!(c.dl_out.front(), Some((_, DlReq::Lock { .. }))))
            .count() as u64
            + self
                .clients
                .iter()
                .flat_map(|c| c.nl_out.values())
                .filter(|r| matches!(r, NReq::Lock { .. }))
                .count() as u64;
        let s = t.dlock.stats();
        let leases = self.dl.values().filter(|h| h.lease.is_some()).count() as u64;
        assert_eq!(
            (s.held_keys, s.leases, s.waiting),
            (self.dl.len() as u64, leases, waiting),
            "dlock stats"
        );
        self.native_compare();
    }

    /// Everybody leaves; every timer runs out; nothing is left.
    fn finish(&mut self) {
        for c in 0..self.clients.len() {
            self.step_start = self.now();
            self.disconnect(c);
            self.settle();
        }
        let end = self.now() + ORPHAN_MS + IDLE_MS + 200;
        self.advance_to(end);
        assert!(self.mc.is_empty() && self.ld.is_empty() && self.dl.is_empty());
        assert!(self.nat.grants.is_empty(), "{:?}", self.nat.grants);
        let t = self.sim.tables();
        t.lockd
            .for_each_locked(|n| panic!("lockd {n:?} still locked"));
        t.dlock
            .for_each_held(|k, c, _| panic!("dlock {k:?} still held by {c:?}"));
        t.dlock
            .for_each_grant(|k, f, c, _, _| panic!("dlock {k:?} still granted ({f}) to {c:?}"));
        t.store
            .for_each_lock(|k, c| panic!("{k:?} still locked by {c:?}"));
        let l = t.lockd.stats();
        assert_eq!((l.held, l.orphaned, l.waiting), (0, 0, 0));
        let d = t.dlock.stats();
        assert_eq!((d.held_keys, d.leases, d.waiting), (0, 0, 0));
        assert_eq!(t.store.stats().locks_held, 0);
    }
}

#[derive(Debug)]
enum Mc {
    Ok,
    Locked,
    NotFound,
    NotLocked,
}

/// The outcome of a memcached lock/unlock reply, text or binary.
fn mc_status(req: &McReq, reply: &[u8]) -> Mc {
    if matches!(req, McReq::BinLock(_) | McReq::BinUnlock(_)) {
        assert!(
            reply.len() >= 24 && reply[0] == 0x81,
            "binary reply {reply:?}"
        );
        return match u16::from_be_bytes([reply[6], reply[7]]) {
            binary::status::NO_ERROR => Mc::Ok,
            binary::status::LOCKED => Mc::Locked,
            binary::status::KEY_NOT_FOUND => Mc::NotFound,
            binary::status::NOT_LOCKED => Mc::NotLocked,
            s => panic!("binary status {s:#x}"),
        };
    }
    match reply {
        b"OK\r\n" => Mc::Ok,
        b"LOCKED\r\n" => Mc::Locked,
        b"NOT_FOUND\r\n" => Mc::NotFound,
        b"CLIENT_ERROR object is not locked or not found\r\n" => Mc::NotLocked,
        r => panic!("reply {:?}", String::from_utf8_lossy(r)),
    }
}

// ---------------------------------------------------------------------------------------------
// Version-3 (native) dlock clients: requests answered by request id in any order, grants per
// Lock (exclusive, shared, semaphore slots), values, leases, lock-delay, Unlock and Extend by
// fence, Get, CheckFence, Watch/Unwatch with event frames, and loss notices. The model keeps
// every grant the clients were told about (version 2's holds count as exclusive grants) and
// every end it can infer (Unlock replies, leases past their deadline, closed connections).
//
// Checked on every answer: a grant fits beside the key's live holders (no two exclusive ones,
// no shared one beside an exclusive one, at most `limit` slots, all of one limit), starts no
// earlier than every lock-delay of the key (one starts when a grant with a lock-delay ends by
// loss or expiry), and has a token above every one the clients saw; InvalidArgument for a
// Lock exactly when a key had holders or waiters of another limit (version 2: General); Unlock,
// Extend and their NotHeld keys, CheckFence and Get's holders (tokens in grant order, values,
// lease left, waiters, lock-delay) as the model says. After every step: the loss notices due
// (Expired to an open holder, Lost to one whose grant another connection unlocked) arrived and
// no other; each watcher's events, in order, take its view of the key's holders from the
// Watch's answer through grants that fit and ends the model knows with the right kind, and
// that view equals the table's holders, with every grant and end of the step seen; and the
// model's grants equal the table's (owner, lease, mode) and counts.

#[derive(Clone, Copy, Debug)]
enum Mix {
    /// memcached, lockd and version-2 dlock clients (the schedules of the seeds named below).
    Classic,
    /// The classic mix and version-3 dlock clients; `watches`: whether they Watch (not in the
    /// schedules replayed with snapshot restores: watches are node-local, not in snapshots).
    Native { watches: bool },
}

#[derive(Debug)]
enum NReq {
    Lock {
        keys: Vec<&'static str>,
        mode: Mode,
        wait_ms: Option<u64>,
        lease_ms: Option<u64>,
        value: Option<Vec<u8>>,
        delay_ms: u64,
        sent: u64,
        /// A key had holders or waiters of another limit when it was sent.
        mismatch: bool,
    },
    Unlock {
        keys: Vec<&'static str>,
        fence: Option<u64>,
    },
    Extend {
        keys: Vec<&'static str>,
        lease_ms: u64,
        fence: Option<u64>,
    },
    Get(Vec<&'static str>),
    Check(&'static str, u64),
    Watch(Vec<&'static str>),
    Unwatch(Vec<&'static str>),
    Ping,
}

#[derive(Clone, Debug)]
struct NGrant {
    /// Where its notices go and whose Unlock without fence releases it.
    conn: ConnId,
    /// The request id its notices carry (the Lock's, or the Extend by fence's).
    rid: u64,
    mode: Mode,
    /// Lease deadline; while `lease_hi` is set, only a lower bound (see `native_settle`).
    lease: Option<u64>,
    lease_hi: Option<u64>,
    delay_ms: u64,
}

/// One watched key of a client.
#[derive(Debug)]
struct WatchView {
    rid: u64,
    /// The table's last fence when the Watch was answered: later grants must all be seen.
    since: u64,
    /// The key's holders as the events tell them.
    held: BTreeSet<u64>,
    /// Every grant it was told of (the Watch's answer, Acquired events).
    seen: HashSet<u64>,
    ended: HashMap<u64, u32>,
    /// Unwatched in this step: its remaining events are checked, then it goes.
    closing: bool,
}

#[derive(Default)]
struct NatModel {
    /// Version-3 grants the model holds: (key, fence).
    grants: BTreeMap<(&'static str, u64), NGrant>,
    /// Every grant ever told to a client (both versions): its mode and value.
    granted: HashMap<u64, (Mode, Option<Vec<u8>>)>,
    /// Every end the model inferred: (key, fence) -> event kind.
    ends: HashMap<(&'static str, u64), u32>,
    /// A lower bound of the end of each key's lock-delay.
    delay: HashMap<&'static str, u64>,
    /// Lock-delays that began in this step (merged into `delay` at its end), with the mode of
    /// the grant that ended: a grant that fits beside that one may have come before its end.
    delay_cur: Vec<(&'static str, u64, Mode)>,
    /// Grants and ends of the current step (for the watchers' "none missing").
    step_grants: Vec<(&'static str, u64)>,
    step_ends: Vec<(&'static str, u64, u32)>,
    /// Loss notices expected and received in this step: (conn, request id, key, fence, kind).
    notices_due: Vec<(ConnId, u64, &'static str, u64, u32)>,
    notices_got: Vec<(ConnId, u64, &'static str, u64, u32)>,
    /// Counts of what the schedule reached.
    reached: NatReached,
}

#[derive(Default, Debug, Clone, Copy)]
struct NatReached {
    grants: u64,
    shared_beside: u64,
    slots_beside: u64,
    limit_refusals: u64,
    events: u64,
    notices: u64,
    delays: u64,
    by_fence: u64,
}

impl World {
    /// Version-3 holders of `key` that are still live now (not past their lease, not bound to
    /// a connection the daemon closed).
    fn nat_live(&self, key: &str) -> Vec<(u64, Mode)> {
        self.nat
            .grants
            .range((key_static(key), 0)..=(key_static(key), u64::MAX))
            .filter(|(_, g)| self.nat_state(g) == Some(true))
            .map(|((_, f), g)| (*f, g.mode))
            .collect()
    }

    /// Whether a version-3 grant is live now: `None` while unknown (a lease granted in this
    /// step whose deadline, known only within bounds, may have passed).
    fn nat_state(&self, g: &NGrant) -> Option<bool> {
        let now = self.now();
        match (g.lease, g.lease_hi) {
            (Some(lo), Some(hi)) if lo <= now && now < hi => None,
            (Some(_), Some(hi)) => Some(hi > now),
            (Some(d), None) => Some(d > now),
            (None, _) => Some(self.sim.is_open(g.conn)),
        }
    }

    /// Every live holder of `key` (a version-2 hold as exclusive), by fence.
    fn live_holders(&self, key: &'static str) -> Vec<(u64, Mode)> {
        let now = self.now();
        let mut out = self.nat_live(key);
        if let Some(h) = self.dl.get(key) {
            let live = match h.lease {
                Some(d) => d > now,
                None => self.sim.is_open(h.conn),
            };
            if live {
                out.push((h.fence, Mode::Excl));
            }
        }
        out.sort_by_key(|(f, _)| *f);
        out
    }

    /// A grant of `key` is being made: version-3 holders the daemon dropped at instants the
    /// model could not see (a lease past its deadline, a connection closed in this step) must
    /// have let their lock-delay run out first.
    fn nat_dead_delays(&mut self, key: &'static str, mode: Mode, ctx: &str) {
        let now = self.now();
        assert!(
            !self.delayed_for(key, mode),
            "a grant of {key} inside its lock-delay ({:?} at least, {:?} in this step): {ctx}",
            self.nat.delay.get(key),
            self.nat.delay_cur
        );
        let dead: Vec<(u64, NGrant)> = self
            .nat
            .grants
            .range((key, 0)..=(key, u64::MAX))
            .filter(|(_, g)| self.nat_state(g) == Some(false))
            .map(|((_, f), g)| (*f, g.clone()))
            .collect();
        for (f, g) in dead {
            let from = g.lease.unwrap_or(self.step_start);
            // One it fits beside may have ended after it.
            assert!(
                mode.fits(&[g.mode]) || now >= from + g.delay_ms,
                "a grant inside the lock-delay of {key} ({f} ended at {from} or later, delay {} ms): {ctx}",
                g.delay_ms
            );
            if g.lease.is_some() {
                self.nat_end(key, f, dl::event_kind::EXPIRED, from);
            }
            // A connection-bound one ends with its connection (`native_closed`).
        }
    }

    /// Whether a grant of `mode` on `key` now would be inside a lock-delay the model knows.
    fn delayed_for(&self, key: &str, mode: Mode) -> bool {
        let now = self.now();
        self.nat.delay.get(key).is_some_and(|&d| d > now)
            || self
                .nat
                .delay_cur
                .iter()
                .any(|(k, d, m)| *k == key && *d > now && !mode.fits(&[*m]))
    }

    /// The model tells of a grant.
    fn grant(&mut self, key: &'static str, fence: u64, mode: Mode, value: Option<Vec<u8>>) {
        self.nat.granted.insert(fence, (mode, value));
        self.nat.step_grants.push((key, fence));
    }

    /// The model infers the end of a grant (either version's).
    fn end(&mut self, key: &'static str, fence: u64, kind: u32) {
        let old = self.nat.ends.insert((key, fence), kind);
        assert!(old.is_none(), "{key} {fence} ended twice");
        self.nat.step_ends.push((key, fence, kind));
    }

    /// A version-3 grant ends at `at` (a lower bound): its lock-delay, its notice.
    fn nat_end(&mut self, key: &'static str, fence: u64, kind: u32, at: u64) {
        let g = self.nat.grants.remove(&(key, fence)).expect("a grant");
        self.end(key, fence, kind);
        if kind != dl::event_kind::RELEASED && g.delay_ms > 0 {
            self.nat.reached.delays += 1;
            self.nat.delay_cur.push((key, at + g.delay_ms, g.mode));
        }
        if kind == dl::event_kind::EXPIRED && self.client_of(g.conn).is_some() {
            self.nat.notices_due.push((g.conn, g.rid, key, fence, kind));
        }
    }

    fn native_closed(&mut self, id: ConnId) {
        let lost: Vec<(&'static str, u64)> = self
            .nat
            .grants
            .iter()
            .filter(|(_, g)| g.conn == id && g.lease.is_none())
            .map(|(k, _)| *k)
            .collect();
        let at = self.step_start;
        for (k, f) in lost {
            self.nat_end(k, f, dl::event_kind::LOST, at);
        }
    }

    fn native(&mut self, c: usize) {
        let locks = self.clients[c]
            .nl_out
            .values()
            .filter(|r| matches!(r, NReq::Lock { .. }))
            .count();
        let n = 1 + self.rng.below(2) as usize;
        let mut keys: Vec<&'static str> = Vec::new();
        for _ in 0..n {
            let k = KEYS[self.rng.index(KEYS.len())];
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        self.next_id += 1;
        let rid = self.next_id;
        let now = self.now();
        // A fence to name: a live holder's mostly, else any earlier one.
        let pick_fence = |w: &mut World, k: &'static str| {
            let live = w.live_holders(k);
            if !live.is_empty() && w.rng.chance(70) {
                live[w.rng.index(live.len())].0
            } else {
                w.rng.below(w.dl_fence + 2)
            }
        };
        let req = match self.rng.below(100) {
            0..=39 if locks < 3 => {
                let mode = match self.rng.below(8) {
                    0..=2 => Mode::Excl,
                    3 | 4 => Mode::Shared,
                    // Semaphores mostly on k3 and mostly of 3 slots: limits collide sometimes.
                    _ => {
                        if self.rng.chance(80) {
                            keys = vec!["k3"];
                        }
                        Mode::Slots(if self.rng.chance(85) { 3 } else { 2 })
                    }
                };
                let limit = mode.limit();
                // Holders and waiters of another limit: the answer is InvalidArgument.
                let mismatch = keys.iter().any(|k| {
                    self.live_holders(k).iter().any(|(_, m)| m.limit() != limit)
                        || self.waiting_limits(k).iter().any(|l| *l != limit)
                });
                NReq::Lock {
                    keys,
                    mode,
                    wait_ms: match self.rng.below(4) {
                        0 => None,
                        1 => Some(0),
                        _ => Some(1 + self.rng.below(150)),
                    },
                    lease_ms: self.rng.chance(40).then(|| 1 + self.rng.below(100)),
                    value: self.rng.chance(50).then(|| format!("v{rid}").into_bytes()),
                    delay_ms: if self.rng.chance(25) {
                        1 + self.rng.below(30)
                    } else {
                        0
                    },
                    sent: now,
                    mismatch,
                }
            }
            0..=51 => NReq::Unlock { keys, fence: None },
            52..=59 => {
                let k = keys[0];
                NReq::Unlock {
                    keys: vec![k],
                    fence: Some(pick_fence(self, k)),
                }
            }
            60..=65 => NReq::Extend {
                keys,
                lease_ms: 1 + self.rng.below(100),
                fence: None,
            },
            66..=69 => {
                let k = keys[0];
                NReq::Extend {
                    keys: vec![k],
                    lease_ms: 1 + self.rng.below(100),
                    fence: Some(pick_fence(self, k)),
                }
            }
            70..=77 => NReq::Get(keys),
            78..=83 => {
                let k = keys[0];
                NReq::Check(k, pick_fence(self, k))
            }
            84..=91 if self.watches_on => {
                keys.retain(|k| !self.clients[c].watch.contains_key(k));
                if keys.is_empty() {
                    NReq::Ping
                } else {
                    NReq::Watch(keys)
                }
            }
            92..=95 if self.watches_on => {
                let mut w: Vec<&'static str> = self.clients[c].watch.keys().copied().collect();
                w.sort();
                w.truncate(1 + self.rng.below(2) as usize);
                if w.is_empty() {
                    NReq::Ping
                } else {
                    NReq::Unwatch(w)
                }
            }
            _ => NReq::Ping,
        };
        let mut frame = Vec::new();
        {
            let (t, ks, mut lf): (u64, &[&'static str], dl::LockFields<'_>) = match &req {
                NReq::Lock {
                    keys,
                    mode,
                    wait_ms,
                    lease_ms,
                    value,
                    delay_ms,
                    ..
                } => (
                    dl::req_type::LOCK,
                    keys,
                    dl::LockFields {
                        wait_micro: wait_ms.map(|w| w * 1000),
                        release_micro: lease_ms.map(|l| l * 1000),
                        native: dl::NativeFields {
                            shared: *mode == Mode::Shared,
                            limit: matches!(mode, Mode::Slots(_)).then(|| mode.limit()),
                            value: value.as_deref(),
                            lock_delay_micro: (*delay_ms > 0).then(|| delay_ms * 1000),
                            fence: None,
                        },
                        ..Default::default()
                    },
                ),
                NReq::Unlock { keys, fence } => (
                    dl::req_type::UNLOCK,
                    keys,
                    dl::LockFields {
                        native: dl::NativeFields {
                            fence: *fence,
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                ),
                NReq::Extend {
                    keys,
                    lease_ms,
                    fence,
                } => (
                    dl::req_type::EXTEND,
                    keys,
                    dl::LockFields {
                        release_micro: Some(lease_ms * 1000),
                        native: dl::NativeFields {
                            fence: *fence,
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                ),
                NReq::Get(keys) => (dl::req_type::GET, keys, Default::default()),
                NReq::Check(k, f) => (
                    dl::req_type::CHECK_FENCE,
                    std::slice::from_ref(k),
                    dl::LockFields {
                        native: dl::NativeFields {
                            fence: Some(*f),
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                ),
                NReq::Watch(keys) => (dl::req_type::WATCH, keys, Default::default()),
                NReq::Unwatch(keys) => (dl::req_type::UNWATCH, keys, Default::default()),
                NReq::Ping => (dl::req_type::PING, &[], Default::default()),
            };
            let kb: Vec<&[u8]> = ks.iter().map(|k| k.as_bytes()).collect();
            lf.keys = &kb;
            let lock = (!kb.is_empty()).then_some(lf);
            dl::encode_request_version(&mut frame, dl::NATIVE_VERSION, Some(rid), None, t, lock);
        }
        let id = self.conn(c);
        let cl = &mut self.clients[c];
        cl.nl_out.insert(rid, req);
        cl.dl_active = (now, now);
        self.sim.send(id, &frame);
    }

    /// Whether `key` has semaphore holders or waiters, or had holders in this step.
    fn slots_on(&self, key: &'static str) -> bool {
        self.live_holders(key)
            .iter()
            .any(|(_, m)| matches!(m, Mode::Slots(_)))
            || self.waiting_limits(key).iter().any(|l| *l > 1)
            || self
                .nat
                .step_ends
                .iter()
                .any(|(k, f, _)| *k == key && matches!(self.nat.granted[f].0, Mode::Slots(_)))
    }

    /// The limits of the Locks waiting for `key` (version 2's: 1).
    fn waiting_limits(&self, key: &str) -> Vec<u32> {
        let mut out = Vec::new();
        for cl in &self.clients {
            if let Some((_, DlReq::Lock { keys, .. })) = cl.dl_out.front() {
                if keys.contains(&key) {
                    out.push(1);
                }
            }
            for r in cl.nl_out.values() {
                if let NReq::Lock { keys, mode, .. } = r {
                    if keys.contains(&key) {
                        out.push(mode.limit());
                    }
                }
            }
        }
        out
    }

    /// The holders a Get or Watch answer shows must be the model's, in grant order.
    fn check_info(&self, keys: &[&'static str], info: &[dl::KeyInfo], ctx: &str) {
        assert_eq!(info.len(), keys.len(), "{ctx}");
        let now = self.now();
        for (k, i) in keys.iter().zip(info) {
            assert_eq!(i.key, k.as_bytes(), "{ctx}");
            let live = self.live_holders(k);
            let got: Vec<u64> = i.holders.iter().map(|h| h.fence).collect();
            let want: Vec<u64> = live.iter().map(|(f, _)| *f).collect();
            assert_eq!(got, want, "holders of {k}: {ctx}");
            for h in &i.holders {
                let (mode, value) = &self.nat.granted[&h.fence];
                assert_eq!(&h.value, value, "value of {}: {ctx}", h.fence);
                let lease = match self.nat.grants.get(&(k, h.fence)) {
                    Some(g) => g.lease,
                    None => self.dl[k].lease,
                };
                let left = lease.map_or(0, |d| (d - now).max(1) * 1000);
                assert_eq!(h.lease_left_micro, left, "lease left of {}: {ctx}", h.fence);
                if h.fence == want[0] {
                    assert_eq!(i.shared, *mode == Mode::Shared, "{ctx}");
                    assert_eq!(i.limit, Some(mode.limit()), "{ctx}");
                }
            }
            let waiting = self.waiting_limits(k);
            assert_eq!(i.waiters as usize, waiting.len(), "waiters of {k}: {ctx}");
            if let Some(&until) = self.nat.delay.get(k) {
                if until > now {
                    assert!(
                        i.delayed_micro >= (until - now) * 1000,
                        "{k} delayed until {until} at least: {ctx}"
                    );
                }
            }
        }
    }

    fn native_response(&mut self, c: usize, me: ConnId, r: dl::Response) {
        assert_eq!(r.version, Some(3), "{r:?}");
        let rid = r.request_id.expect("a request id");
        if let Some(ev) = r.event.clone() {
            assert_eq!(r.status, Some(dl::status::OK), "event frame {r:?}");
            let key = key_of(&ev.key);
            let watched = self.clients[c].watch.get(key).is_some_and(|v| v.rid == rid);
            if watched {
                self.clients[c].ev_buf.push((rid, ev));
            } else {
                assert!(
                    ev.kind == dl::event_kind::EXPIRED || ev.kind == dl::event_kind::LOST,
                    "an event for no watch: {ev:?} ({rid})"
                );
                self.nat.reached.notices += 1;
                self.nat.notices_got.push((me, rid, key, ev.fence, ev.kind));
            }
            return;
        }
        let req = self.clients[c]
            .nl_out
            .remove(&rid)
            .unwrap_or_else(|| panic!("version-3 answer {r:?} to nothing asked"));
        let now = self.now();
        let ctx = format!("{req:?} by {me:?} -> {r:?}");
        let status = r.status.expect("a status");
        let not_held: Vec<&'static str> = r.keys.iter().map(|k| key_of(k)).collect();
        let mine = |w: &World, k: &'static str| -> Vec<u64> {
            w.nat_live(k)
                .into_iter()
                .filter(|(f, _)| w.nat.grants[&(k, *f)].conn == me)
                .map(|(f, _)| f)
                .collect()
        };
        match (req, status) {
            (NReq::Ping, dl::status::OK) => {}
            (
                NReq::Lock {
                    keys,
                    mode,
                    lease_ms,
                    value,
                    delay_ms,
                    mismatch,
                    ..
                },
                dl::status::OK,
            ) => {
                assert!(!mismatch, "a Lock of another limit granted: {ctx}");
                self.clients[c].dl_active = (self.step_start, now);
                let fence = r
                    .fence
                    .unwrap_or_else(|| panic!("a grant without a fence: {ctx}"));
                assert!(
                    fence > self.dl_fence,
                    "fence {fence} after {}: grants out of token order: {ctx}",
                    self.dl_fence
                );
                self.dl_fence = fence;
                self.nat.reached.grants += 1;
                for k in keys {
                    let others: Vec<Mode> = self.live_holders(k).iter().map(|(_, m)| *m).collect();
                    assert!(
                        mode.fits(&others),
                        "a {mode:?} grant beside {others:?}: {ctx}, model {:?} {:?}",
                        self.dl.get(k),
                        self.live_holders(k)
                    );
                    match mode {
                        Mode::Shared if !others.is_empty() => self.nat.reached.shared_beside += 1,
                        Mode::Slots(_) if !others.is_empty() => self.nat.reached.slots_beside += 1,
                        _ => {}
                    }
                    self.nat_dead_delays(k, mode, &ctx);
                    self.grant(k, fence, mode, value.clone());
                    self.nat.grants.insert(
                        (k, fence),
                        NGrant {
                            conn: me,
                            rid,
                            mode,
                            lease: lease_ms.map(|l| self.step_start + l + LEASE_CLOCK_SLACK_MS),
                            lease_hi: lease_ms.map(|l| now + l + LEASE_CLOCK_SLACK_MS),
                            delay_ms,
                        },
                    );
                }
            }
            (NReq::Lock { mismatch, .. }, dl::status::INVALID_ARGUMENT) => {
                assert!(
                    mismatch,
                    "InvalidArgument without a limit of another kind: {ctx}"
                );
                self.nat.reached.limit_refusals += 1;
            }
            (NReq::Lock { mismatch: true, .. }, _) => {
                panic!("a Lock of another limit not refused: {ctx}")
            }
            (
                NReq::Lock {
                    keys,
                    wait_ms,
                    sent,
                    ..
                },
                dl::status::ACQUIRE_TIMEOUT,
            ) => {
                self.clients[c].dl_active = (self.step_start, now);
                match wait_ms {
                    Some(0) => assert_eq!(sent, now, "{ctx}"),
                    Some(w) => assert!(now >= sent + w, "timed out early: {ctx}"),
                    None => panic!("an unbounded wait timed out: {ctx}"),
                }
                assert!(!not_held.is_empty(), "{ctx}");
                for k in &not_held {
                    assert!(keys.contains(k), "{ctx}");
                }
            }
            (NReq::Unlock { keys, fence: None }, s) => {
                let held: Vec<(&'static str, Vec<u64>)> =
                    keys.iter().map(|k| (*k, mine(self, k))).collect();
                let want: Vec<&'static str> = held
                    .iter()
                    .filter(|(_, f)| f.is_empty())
                    .map(|(k, _)| *k)
                    .collect();
                assert_eq!(not_held, want, "{ctx}");
                assert_eq!(s == dl::status::OK, want.is_empty(), "{ctx}");
                if s == dl::status::OK {
                    for (k, fs) in held {
                        for f in fs {
                            self.nat_end(k, f, dl::event_kind::RELEASED, now);
                        }
                    }
                } else {
                    assert_eq!(s, dl::status::NOT_HELD, "{ctx}");
                }
            }
            (
                NReq::Unlock {
                    keys,
                    fence: Some(f),
                },
                s,
            ) => {
                let k = keys[0];
                let live = self.live_holders(k).iter().any(|(g, _)| *g == f);
                assert_eq!(s == dl::status::OK, live, "{ctx}");
                if s != dl::status::OK {
                    assert_eq!(
                        (s, &not_held[..]),
                        (dl::status::NOT_HELD, &[k][..]),
                        "{ctx}"
                    );
                } else if let Some(g) = self.nat.grants.get(&(k, f)).cloned() {
                    self.nat.reached.by_fence += 1;
                    self.nat_end(k, f, dl::event_kind::RELEASED, now);
                    if g.conn != me && self.sim.is_open(g.conn) && self.client_of(g.conn).is_some()
                    {
                        self.nat
                            .notices_due
                            .push((g.conn, g.rid, k, f, dl::event_kind::LOST));
                    }
                } else {
                    // A version-2 hold (not told: version 2 has no pushed frames).
                    self.nat.reached.by_fence += 1;
                    self.dl.remove(k);
                    self.end(k, f, dl::event_kind::RELEASED);
                }
            }
            (
                NReq::Extend {
                    keys,
                    lease_ms,
                    fence,
                },
                s,
            ) => {
                let targets: Vec<(&'static str, Vec<u64>)> = match fence {
                    None => keys.iter().map(|k| (*k, mine(self, k))).collect(),
                    Some(f) => {
                        let k = keys[0];
                        let ok = self.nat_live(k).iter().any(|(g, _)| *g == f);
                        vec![(k, if ok { vec![f] } else { vec![] })]
                    }
                };
                let want: Vec<&'static str> = targets
                    .iter()
                    .filter(|(_, f)| f.is_empty())
                    .map(|(k, _)| *k)
                    .collect();
                assert_eq!(not_held, want, "{ctx}");
                assert_eq!(s == dl::status::OK, want.is_empty(), "{ctx}");
                if s != dl::status::OK {
                    assert_eq!(s, dl::status::NOT_HELD, "{ctx}");
                    return;
                }
                for (k, fs) in targets {
                    for f in fs {
                        let g = self.nat.grants.get_mut(&(k, f)).expect("held");
                        g.lease = Some(self.step_start + lease_ms);
                        g.lease_hi = Some(now + lease_ms + LEASE_CLOCK_SLACK_MS);
                        if fence.is_some() {
                            g.conn = me;
                            g.rid = rid;
                        }
                    }
                }
            }
            (NReq::Get(keys), dl::status::OK) => self.check_info(&keys, &r.info, &ctx),
            (NReq::Check(k, f), s) => {
                let live = self.live_holders(k).iter().any(|(g, _)| *g == f);
                let want = if live {
                    dl::status::OK
                } else {
                    dl::status::STALE_FENCE
                };
                assert_eq!(s, want, "{ctx}");
            }
            (NReq::Watch(keys), dl::status::OK) => {
                self.check_info(&keys, &r.info, &ctx);
                let since = self.sim.tables().dlock.last_fence();
                for (k, i) in keys.iter().zip(&r.info) {
                    let held: BTreeSet<u64> = i.holders.iter().map(|h| h.fence).collect();
                    let seen = held.iter().copied().collect();
                    let old = self.clients[c].watch.insert(
                        k,
                        WatchView {
                            rid,
                            since,
                            held,
                            seen,
                            ended: HashMap::new(),
                            closing: false,
                        },
                    );
                    assert!(old.is_none(), "{ctx}");
                }
            }
            (NReq::Unwatch(keys), dl::status::OK) => {
                for k in keys {
                    if let Some(v) = self.clients[c].watch.get_mut(k) {
                        v.closing = true;
                    }
                }
            }
            _ => panic!("unexpected response: {ctx}"),
        }
    }

    /// After the other protocols' part of `settle`: version-3 leases made exact from the
    /// table, leases past their deadline ended, loss notices and watchers' streams checked.
    fn native_settle(&mut self) {
        let now = self.now();
        let mut table: HashMap<(&'static str, u64), Option<u64>> = HashMap::new();
        if self.nat.grants.values().any(|g| g.lease_hi.is_some()) {
            self.sim.tables().dlock.for_each_grant(|k, f, _, lease, _| {
                table.insert((key_of(k), f), lease.map(|d| d - EPOCH_MS));
            });
        }
        for ((k, f), g) in self.nat.grants.iter_mut() {
            let (Some(lo), Some(hi)) = (g.lease, g.lease_hi) else {
                continue;
            };
            match table.get(&(*k, *f)) {
                Some(Some(d)) => {
                    assert!(
                        lo <= *d && *d <= hi,
                        "lease deadline {d} of {k} {f} not in {lo}..={hi}: {g:?} now {now}"
                    );
                    g.lease = Some(*d);
                }
                _ => assert!(lo <= now, "lease on {k} {f} gone before {lo}"),
            }
            g.lease_hi = None;
        }
        let expired: Vec<((&'static str, u64), u64)> = self
            .nat
            .grants
            .iter()
            .filter_map(|(kf, g)| g.lease.filter(|d| *d <= now).map(|d| (*kf, d)))
            .collect();
        for ((k, f), d) in expired {
            self.nat_end(k, f, dl::event_kind::EXPIRED, d);
        }
        for (k, until, _) in std::mem::take(&mut self.nat.delay_cur) {
            let d = self.nat.delay.entry(k).or_insert(0);
            *d = (*d).max(until);
        }
        self.nat.delay.retain(|_, until| *until > now);
        // Loss notices: each due one arrived, and none other (an Expired notice to a
        // connection the daemon closed in this step may be missing).
        let mut due = std::mem::take(&mut self.nat.notices_due);
        let mut got = std::mem::take(&mut self.nat.notices_got);
        due.retain(|n| self.sim.is_open(n.0) || got.contains(n));
        due.sort_by_key(|n| (n.2, n.3));
        got.sort_by_key(|n| (n.2, n.3));
        assert_eq!(
            got, due,
            "loss notices (conn, request id, key, fence, kind)"
        );
        // Watchers.
        let t = self.sim.tables();
        // Keys whose holders changed in this step: the other views and holders are as they
        // were after the last step (where they were checked; the model equals the table).
        let mut touched: Vec<&'static str> = self
            .nat
            .step_grants
            .iter()
            .map(|(k, _)| *k)
            .chain(self.nat.step_ends.iter().map(|(k, _, _)| *k))
            .collect();
        for c in 0..self.clients.len() {
            let cl = &mut self.clients[c];
            for (rid, ev) in std::mem::take(&mut cl.ev_buf) {
                self.nat.reached.events += 1;
                let k = key_of(&ev.key);
                if !touched.contains(&k) {
                    touched.push(k);
                }
                let v = cl.watch.get_mut(k).expect("a watched key");
                assert_eq!(v.rid, rid);
                let ctx = format!("watcher {c} of {k} ({rid}): {ev:?}, view {v:?}");
                if ev.kind == dl::event_kind::ACQUIRED {
                    assert!(ev.fence > v.since && !v.seen.contains(&ev.fence), "{ctx}");
                    assert!(ev.fence >= cl.last_acquired, "Acquired out of order: {ctx}");
                    cl.last_acquired = ev.fence;
                    let (mode, value) =
                        self.nat.granted.get(&ev.fence).unwrap_or_else(|| {
                            panic!("an event of a grant nobody was told: {ctx}")
                        });
                    assert_eq!(&ev.value, value, "{ctx}");
                    let others: Vec<Mode> = v.held.iter().map(|f| self.nat.granted[f].0).collect();
                    assert!(mode.fits(&others), "events out of apply order: {ctx}");
                    v.held.insert(ev.fence);
                    v.seen.insert(ev.fence);
                } else {
                    assert!(
                        v.held.remove(&ev.fence),
                        "the end of a grant not held: {ctx}"
                    );
                    let mut kind = self.nat.ends.get(&(k, ev.fence));
                    if kind == Some(&EXPIRED_OR_RELEASED)
                        && [dl::event_kind::EXPIRED, dl::event_kind::RELEASED].contains(&ev.kind)
                    {
                        kind = Some(&ev.kind);
                    }
                    assert_eq!(
                        kind,
                        Some(&ev.kind),
                        "an end the model does not know: {ctx}"
                    );
                    v.ended.insert(ev.fence, ev.kind);
                }
            }
            if cl.conn.is_none() {
                continue;
            }
            cl.watch.retain(|_, v| !v.closing);
            for (k, v) in cl.watch.iter().filter(|(k, _)| touched.contains(k)) {
                let ctx = || format!("watcher {c} of {k}: {v:?}");
                let holders: BTreeSet<u64> = t
                    .dlock
                    .get(k.as_bytes(), now + EPOCH_MS)
                    .holders
                    .iter()
                    .map(|h| h.fence)
                    .collect();
                assert_eq!(v.held, holders, "a watcher's holders: {}", ctx());
                for (gk, f) in &self.nat.step_grants {
                    if gk == k && *f > v.since {
                        assert!(v.seen.contains(f), "grant {f} missing: {}", ctx());
                    }
                }
                for (ek, f, kind) in &self.nat.step_ends {
                    if ek == k && v.seen.contains(f) {
                        let got = v.ended.get(f);
                        let ok = match *kind {
                            EXPIRED_OR_RELEASED => got.is_some(),
                            kind => got == Some(&kind),
                        };
                        assert!(ok, "end {kind} of {f} missing: {}", ctx());
                    }
                }
            }
        }
        self.nat.step_grants.clear();
        self.nat.step_ends.clear();
    }

    /// Version-3 grants and counts: the model against the table.
    fn native_compare(&self) {
        let t = self.sim.tables();
        let mut table: Vec<(
            &'static str,
            u64,
            holdfast::core::Session,
            Option<u64>,
            bool,
        )> = Vec::new();
        t.dlock.for_each_grant(|k, f, s, lease, shared| {
            table.push((key_of(k), f, s, lease.map(|d| d - EPOCH_MS), shared));
        });
        table.sort_by_key(|g| (g.0, g.1));
        let model: Vec<_> = self
            .nat
            .grants
            .iter()
            .map(|((k, f), g)| {
                (
                    *k,
                    *f,
                    self.sim.session_of(g.conn).expect("a session"),
                    g.lease,
                    g.mode == Mode::Shared,
                )
            })
            .collect();
        assert_eq!(table, model, "version-3 grants");
        let s = t.dlock.native_stats();
        let leases = self
            .nat
            .grants
            .values()
            .filter(|g| g.lease.is_some())
            .count() as u64;
        assert_eq!(
            (s.holds, s.leases),
            (self.nat.grants.len() as u64, leases),
            "version-3 counts"
        );
    }
}

/// The end of a version-2 lease its holder re-locked at an instant of the clock advance that
/// may have ended it: the watchers see Expired or Released.
const EXPIRED_OR_RELEASED: u32 = 0;

fn key_static(name: &str) -> &'static str {
    key_of(name.as_bytes())
}

/// Run one seed. A long run must also have reached every path the models check: grants to
/// waiters, orphan expiries and adoptions, lease expiries, wait timeouts, idle closes, evictions.
fn run(seed: u64, steps: usize) {
    run_mix(seed, steps, Mix::Native { watches: true });
}

fn run_mix(seed: u64, steps: usize, mix: Mix) {
    let mut w = World::with(seed, mix);
    for _ in 0..steps {
        w.step();
    }
    w.finish();
    let t = w.sim.tables();
    let (l, d, s) = (t.lockd.stats(), t.dlock.stats(), t.store.stats());
    if steps >= 2000 {
        let reached = [
            ("lockd grants", l.grants),
            ("lockd orphan expiries", l.orphan_expiries),
            ("lockd adoptions", l.adoptions),
            ("dlock grants", d.grants),
            ("dlock timeouts", d.timeouts),
            ("dlock lease expiries", d.lease_expiries),
            ("dlock idle disconnects", d.idle_disconnects),
            ("store evictions", s.evictions),
        ];
        all_reached(seed, &reached, &(l, d, s));
        if let Mix::Native { .. } = mix {
            let r = w.nat.reached;
            let reached = [
                ("version-3 grants", r.grants),
                ("shared grants beside others", r.shared_beside),
                ("slots beside others", r.slots_beside),
                ("limit refusals", r.limit_refusals),
                ("watch events", r.events),
                ("loss notices", r.notices),
                ("lock-delays", r.delays),
                ("unlocks by fence", r.by_fence),
            ];
            all_reached(seed, &reached, &r);
        }
    }
}

/// Every counted case happened at least once in seed `seed`'s schedule.
fn all_reached(seed: u64, reached: &[(&str, u64)], counts: &dyn std::fmt::Debug) {
    for (what, n) in reached {
        assert!(*n > 0, "seed {seed}: no {what} ({counts:?})");
    }
}

#[test]
fn random_schedules_never_show_two_holders_seed_1() {
    run(1, 3000);
}

#[test]
fn random_schedules_never_show_two_holders_seed_2() {
    run(2, 3000);
}

#[test]
fn random_schedules_never_show_two_holders_seed_3() {
    run(3, 3000);
}

#[test]
fn random_schedules_never_show_two_holders_many_short_seeds() {
    for seed in 100..120 {
        run(seed, 300);
    }
}

// ---------------------------------------------------------------------------------------------
// Determinism: the owner side is a state machine. The command entries a run fed it (one per
// owner turn, `server::command`), applied in order to a fresh state (another hash seed, another
// process, or a state restored from a snapshot halfway), give the same replies byte for byte and
// the same snapshot. If any table let a randomly seeded hash map decide an order that reaches a
// reply (or a snapshot), the replays under other seeds would differ here.

use holdfast::core::hash::with_seed;
use holdfast::server::sim::{Recording, Replayer};

/// Run one seeded schedule with the command log on; the recording and the final snapshot.
fn recorded(seed: u64, steps: usize, mix: Mix) -> (Recording, Vec<u8>) {
    let mut w = World::with(seed, mix);
    w.sim.record();
    for _ in 0..steps {
        w.step();
    }
    w.finish();
    let rec = w.sim.take_recording();
    assert_eq!(rec.entries.len(), rec.effects.len());
    (rec, w.sim.snapshot())
}

/// Replay `rec` into a state made under `hash_seed`; at each entry index in `restore_at`, the
/// state is replaced by one restored from its own snapshot under another seed. Checks every
/// turn's effects against the recording; returns the final snapshot.
fn replay(rec: &Recording, hash_seed: u64, restore_at: &[usize], what: &str) -> Vec<u8> {
    let mut r = with_seed(hash_seed, || Replayer::new(config()));
    for (i, (entry, want)) in rec.entries.iter().zip(&rec.effects).enumerate() {
        if restore_at.contains(&i) {
            let snap = r.snapshot();
            r = with_seed(hash_seed ^ (i as u64 + 1), || {
                let mut fresh = Replayer::new(config());
                fresh.restore(&snap).expect("restore");
                fresh
            });
            assert_eq!(r.snapshot(), snap, "{what}: restored snapshot at entry {i}");
        }
        let got = r.apply(entry).expect("entry decodes");
        assert!(got == *want, "{what}: effects of entry {i} differ");
    }
    r.snapshot()
}

#[test]
fn replays_under_other_hash_seeds_give_the_same_replies_and_state() {
    for seed in [1, 2, 7] {
        let (rec, snap) = recorded(seed, 1500, Mix::Native { watches: true });
        assert!(rec.entries.len() > 1000, "seed {seed}: a short run");
        for hash_seed in [1, 0xDEAD_BEEF, u64::MAX] {
            let what = format!("seed {seed} hash seed {hash_seed:#x}");
            assert!(
                replay(&rec, hash_seed, &[], &what) == snap,
                "{what}: final state"
            );
        }
    }
}

/// The schedules replayed with snapshot restores midway have no watches: watches are
/// subscriptions of a node's own connections, not state-machine state, so a restored state has
/// none (a cluster node that installs a snapshot closes its watchers' connections instead), and
/// the events the recording sent them would be missing from the replay.
const NO_WATCHES: Mix = Mix::Native { watches: false };

#[test]
fn replays_restored_from_snapshots_midway_give_the_same_replies_and_state() {
    let mut pick = Rng::mixed(99);
    for seed in [3, 4] {
        let (rec, snap) = recorded(seed, 1500, NO_WATCHES);
        let n = rec.entries.len() as u64;
        let restore_at: Vec<usize> = (0..12).map(|_| pick.below(n) as usize).collect();
        let what = format!("seed {seed} restores at {restore_at:?}");
        assert!(
            replay(&rec, 5, &restore_at, &what) == snap,
            "{what}: final state"
        );
    }
}

/// The same checks over many seeds (`make determinism`; CI runs the five above): each seed's
/// schedule is replayed under another hash seed with snapshot restores at 4 random entries.
/// `HOLDFAST_REPLAY_SEEDS` seeds from `HOLDFAST_REPLAY_FIRST`, 600 steps each. A failing seed
/// is named in the panic; replay it with HOLDFAST_REPLAY_FIRST=N HOLDFAST_REPLAY_SEEDS=1.
#[test]
#[ignore]
fn replays_agree_over_many_seeds() {
    let var = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let first = var("HOLDFAST_REPLAY_FIRST", 10_000);
    let seeds = var("HOLDFAST_REPLAY_SEEDS", 200);
    for seed in first..first + seeds {
        // Named before it runs: a model check inside the schedule panics without the seed.
        eprintln!("replay seed {seed}");
        // Odd seeds Watch and are replayed without restores (watches are not in snapshots).
        let watches = seed % 2 == 1;
        let (rec, snap) = recorded(seed, 600, Mix::Native { watches });
        let mut pick = Rng::mixed(seed);
        let n = rec.entries.len().max(1) as u64;
        let restore_at: Vec<usize> = if watches {
            Vec::new()
        } else {
            (0..4).map(|_| pick.below(n) as usize).collect()
        };
        let what = format!("seed {seed} restores at {restore_at:?}");
        assert!(
            replay(
                &rec,
                seed.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                &restore_at,
                &what
            ) == snap,
            "{what}: final state"
        );
    }
}

/// The replay in another process: this test binary runs itself with the log in a file, and the
/// child (another process, so another process-wide hash seed and another pid) prints a digest
/// of every turn's effects and of the final snapshot.
#[test]
fn a_replay_in_another_process_gives_the_same_digest() {
    const CHILD: &str = "HOLDFAST_REPLAY_LOG";
    if let Ok(path) = std::env::var(CHILD) {
        let bytes = std::fs::read(&path).expect("log file");
        let rec = decode_log(&bytes);
        let mut r = Replayer::new(config());
        let mut h = Fnv::default();
        for entry in &rec.entries {
            h.add(&r.apply(entry).expect("entry decodes"));
        }
        h.add(&r.snapshot());
        println!("digest {:016x}", h.0);
        return;
    }
    let (rec, snap) = recorded(5, 1500, Mix::Native { watches: true });
    let mut h = Fnv::default();
    rec.effects.iter().for_each(|e| h.add(e));
    h.add(&snap);
    let path = std::env::temp_dir().join(format!("holdfast-replay-{}.log", std::process::id()));
    std::fs::write(&path, encode_log(&rec)).expect("write log");
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "a_replay_in_another_process_gives_the_same_digest",
            "--nocapture",
        ])
        .env(CHILD, &path)
        .output()
        .expect("run the child");
    let _ = std::fs::remove_file(&path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed: {stdout}");
    let want = format!("digest {:016x}", h.0);
    assert!(
        stdout.contains(&want),
        "child printed {stdout:?}, want {want}"
    );
}

/// 64-bit FNV-1a over every byte given.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn add(&mut self, bytes: &[u8]) {
        for &b in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
}

/// The entries of a recording as one file: each as a u64 length and its bytes.
fn encode_log(rec: &Recording) -> Vec<u8> {
    let mut out = Vec::new();
    for e in &rec.entries {
        out.extend_from_slice(&(e.len() as u64).to_le_bytes());
        out.extend_from_slice(e);
    }
    out
}

fn decode_log(mut bytes: &[u8]) -> Recording {
    let mut rec = Recording::default();
    while !bytes.is_empty() {
        let (len, rest) = bytes.split_at(8);
        let len = u64::from_le_bytes(len.try_into().expect("8 bytes")) as usize;
        rec.entries.push(rest[..len].to_vec());
        bytes = &rest[len..];
    }
    rec
}

/// A seed of `make determinism` (10018, 600 steps). One clock advance fires several timers
/// in turn: slot 12's waiting Lock is granted a 3 ms lease (fence 21), the lease runs out at a
/// later instant of the same advance, and slot 14, answered for an earlier wait in that batch,
/// runs its backlog, whose Lock takes the same keys (fences 22, 23). Run between the answers of
/// the batch, that backlog would send slot 12's answer after slot 14's: replies out of token
/// order, and a client history with two holders. Every resolved wait is answered before any
/// backlog runs (`exec_dlock::deliver_events`).
#[test]
fn seed_10018_dlock_grants_reach_the_checker_out_of_token_order() {
    run_mix(10018, 600, Mix::Classic);
}

/// Another seed of `make determinism` that needs the same order (11210, 600 steps): slot 52's
/// wait times out, and its backlog's Lock (fence 55) must not be answered before the grant
/// (fence 54) of the 1 ms lease that slot 51 was given earlier in the same clock advance.
#[test]
fn seed_11210_dlock_grant_while_the_model_has_another_holder() {
    run_mix(11210, 600, Mix::Classic);
}
