//! The native protocol's workload (dlock version 3, `holdfast.proto`): clients on the cluster's
//! nodes send version-3 frames that go through the worker's own parser
//! (`server::worker::conn::Conn::receive`) into command entries, as the daemon's worker hands
//! them to its owner: exclusive and shared Locks (some of two keys), semaphore slots (limits 2
//! and 3 on one key, so that limits collide), short leases that run out, values, lock-delays,
//! waits of every kind, Unlock and Extend of their own grants and by fence (any grant's, the
//! other clients' too), Get, CheckFence, and the end of a connection (a `Close`: its
//! connection-bound grants are lost; a client goes on on a new connection).
//!
//! Its check keeps a model of every grant from the applied effects alone, in log order: answers
//! (matched by request id), waiting Locks granted or timed out later, Expired and Lost notices;
//! and the log's clock (each command's time, never running backwards, as both machines keep it).
//! A waiting Lock is granted at an instant the effects do not show (a timer that fired between
//! the previous command's time and this one's), so a lease's deadline is known within bounds, and
//! a grant whose lease may or may not have run out is *uncertain* until something tells: a notice,
//! a Get, a CheckFence, an Unlock or Extend answer, or the clock passing its latest deadline.
//! Only what is certain fails the check:
//! - a grant beside a holder certainly live then that it does not fit beside: two exclusive
//!   holders, a shared holder beside an exclusive one, more slots than the limit, slots of two
//!   limits;
//! - a grant certainly inside a lock-delay (one starts when a grant with a lock-delay ends by
//!   loss or expiry, never by Unlock);
//! - a grant while an earlier Lock waits for one of its keys (per-key FIFO: a waiting
//!   exclusive Lock is never overtaken by later shared ones);
//! - a fencing token not above every earlier token of its key;
//! - an answer the model disagrees with: Unlock, Extend (own and by fence), Get's holders (in
//!   grant order, values, lease left, mode, limit, waiters, lock-delay left) and CheckFence, all
//!   applied in log order, hence linearizable; a key found busy (or shown delayed) with no
//!   holder, no waiter and no lock-delay that may still run;
//! - a notice the model does not expect (or a Lost one missing), a lease that ran out with no
//!   Expired notice to its open holder, a waiting Lock not answered by its wait deadline, a Lock
//!   answered twice or never.
//!
//! Watches, in [`NativeWorkload::watching`]: client 0 also Watches and Unwatches keys, and
//! each change of a key it watches that the model learns (a grant, an end by Unlock, expiry or
//! loss) must reach it once under that key's Watch id, a grant's event before its end's, with
//! no event the model does not call for; an Expired event also tells the model that a lease
//! whose holder was not told ran out. A Watch or Unwatch takes effect at the end of its
//! command (the events of timers that fired before it follow the keys watched before it), and
//! an expiry that may have come before its key's Watch may have an event or not. Only the
//! watcher's own node subscribes a Watch and watches are not in a snapshot, so these runs make
//! no snapshot and every replica plays the watcher's node (node 0): then every replica's
//! effects, events included, are the same byte for byte, as the simulator checks.
//! `tests/invariants.rs` also checks watchers' events (in apply order) on one node, and
//! `tests/cluster.rs` (`native_watches_notices_and_extend_by_fence_survive_a_leader_failover`)
//! across a leader failover.

use std::collections::{BTreeMap, BTreeSet};

use super::holdfast::next_effect_of_session;
use super::Workload;
use crate::config::{self, Command, Config};
use crate::core::codec::Reader;
use crate::proto::dlock::{self as dl, event_kind, req_type, status};
use crate::protocol::dlock::lease_on_the_table_clock;
use crate::rng::Rng;
use crate::server::command::{self, Limits};
use crate::server::effect::tag;
use crate::server::msg::{Batch, ConnId, Op, OpMsg};
use crate::server::worker::conn::Conn;
use crate::server::worker::decode::Cx;
use crate::server::Proto;

/// The keys: exclusive and shared Locks mostly on the first two, semaphores mostly on the last.
const KEYS: [&[u8]; 3] = [b"k0", b"k1", b"k2"];
const SEMAPHORE_KEY: usize = 2;
/// A request's first byte: it ends the client's connection (a `Close`), or it is the first of a
/// new connection (a `DlockOpen` goes before it, as the worker sends one on accept).
const CLOSES: u8 = 1;
const OPENS: u8 = 2;
/// Waiting Locks a client keeps at most.
const MAX_WAITS: usize = 2;

/// A grant's mode, and which fit together (the reference rule the models check the tables'
/// grants against).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Excl,
    Shared,
    /// A semaphore slot of a key with this limit (above 1).
    Slots(u32),
}

impl Mode {
    /// The key's limit a grant of this mode needs.
    pub fn limit(self) -> u32 {
        match self {
            Mode::Slots(l) => l,
            _ => 1,
        }
    }

    /// Whether a grant of this mode fits beside holders of `others`.
    pub fn fits(self, others: &[Mode]) -> bool {
        match self {
            Mode::Excl => others.is_empty(),
            Mode::Shared => others.iter().all(|m| *m == Mode::Shared),
            Mode::Slots(l) => {
                others.iter().all(|m| *m == Mode::Slots(l)) && (others.len() as u32) < l
            }
        }
    }
}

/// A version-3 Lock as a client sends it; times in whole milliseconds.
#[derive(Clone, Debug)]
pub struct LockReq {
    pub keys: Vec<usize>,
    pub mode: Mode,
    pub wait_ms: Option<u64>,
    pub lease_ms: Option<u64>,
    pub value: Option<Vec<u8>>,
    pub delay_ms: u64,
}

/// What a client sends.
#[derive(Clone, Debug)]
pub enum Req {
    Lock(LockReq),
    Unlock {
        keys: Vec<usize>,
        fence: Option<u64>,
    },
    Extend {
        keys: Vec<usize>,
        lease_ms: u64,
        fence: Option<u64>,
    },
    Get(Vec<usize>),
    Check(usize, u64),
    /// The watcher's ([`NativeWorkload::watching`]).
    Watch(Vec<usize>),
    Unwatch(Vec<usize>),
    Ping,
    /// The client's connection ends.
    Close,
}

/// A request sent and not applied yet.
struct Sent {
    conn: ConnId,
    rid: u64,
    req: Req,
}

/// A grant the model holds.
#[derive(Clone, Debug)]
struct Grant {
    /// Its holder's connection (the session's, after Extend by fence moved it).
    conn: ConnId,
    /// The request id its notices carry.
    rid: u64,
    mode: Mode,
    value: Option<Vec<u8>>,
    /// Bounds of its lease's deadline on the log's clock (ms); `None`: connection-bound.
    lease: Option<(u64, u64)>,
    delay_ms: u64,
}

/// How a grant ended.
#[derive(Clone, Copy, Debug)]
enum End {
    /// By an Unlock (its own or by fence): no lock-delay.
    Released,
    /// Its lease ran out at an instant within these bounds.
    Expired(u64, u64),
    /// Its connection closed, or it was unlocked by fence, at this instant.
    Lost(u64),
}

/// The watcher: client 0, when the workload watches ([`NativeWorkload::watching`]).
#[derive(Default)]
struct Watcher {
    /// Watched key -> (the Watch's request id, the log's clock when it was answered).
    keys: BTreeMap<usize, (u64, u64)>,
    /// Watches and Unwatches answered in this command: they take effect at its end (the
    /// events of timers that fired before the request in the same command follow the keys
    /// watched before it).
    pending: Vec<(usize, Option<u64>)>,
    /// Events of this command the model's changes call for: (key, kind, fence).
    expect: Vec<(usize, u32, u64)>,
    /// Expiries that may have come before their key was watched: an event may come, or not.
    maybe: Vec<(usize, u32, u64)>,
    /// Events of this command received, in order.
    got: Vec<(usize, u32, u64)>,
    /// Every Watch's request id.
    rids: BTreeSet<u64>,
}

/// A waiting Lock.
struct Wait {
    conn: ConnId,
    lock: LockReq,
    deadline: Option<u64>,
    /// Its place in the keys' queues (the order the Locks were applied).
    seq: u64,
}

/// A lock-delay that began when a grant of `mode` ended (between `from.0` and `from.1`): the key
/// is delayed from that end for its delay, until `until` at least and `until_hi` at most.
#[derive(Clone, Copy, Debug)]
struct Delay {
    key: usize,
    from: (u64, u64),
    until: u64,
    until_hi: u64,
    mode: Mode,
}

#[derive(Default)]
struct ClientState {
    gen: u32,
    opened: bool,
    next_rid: u64,
}

/// What the runs reached (for the tests that the paths were taken).
#[derive(Clone, Copy, Debug, Default)]
pub struct NativeCounts {
    pub grants: u64,
    pub waited_grants: u64,
    pub two_key_grants: u64,
    pub shared_beside: u64,
    pub slots_beside: u64,
    pub full_semaphores: u64,
    pub values: u64,
    pub timeouts: u64,
    pub limit_refusals: u64,
    pub unlocks: u64,
    pub unlocks_by_fence: u64,
    pub lost_notices: u64,
    pub expired_notices: u64,
    pub silent_expiries: u64,
    pub closes: u64,
    pub lost_by_close: u64,
    pub extends: u64,
    pub extends_by_fence: u64,
    pub not_held: u64,
    pub gets: u64,
    pub delays_started: u64,
    pub delays_seen: u64,
    pub checks_ok: u64,
    pub checks_stale: u64,
    pub watches: u64,
    pub unwatches: u64,
    /// Watcher events received and matched, by kind (acquired, released, expired, lost).
    pub events: [u64; 4],
}

impl NativeCounts {
    pub fn add(&mut self, o: &NativeCounts) {
        let NativeCounts {
            grants,
            waited_grants,
            two_key_grants,
            shared_beside,
            slots_beside,
            full_semaphores,
            values,
            timeouts,
            limit_refusals,
            unlocks,
            unlocks_by_fence,
            lost_notices,
            expired_notices,
            silent_expiries,
            closes,
            lost_by_close,
            extends,
            extends_by_fence,
            not_held,
            gets,
            delays_started,
            delays_seen,
            checks_ok,
            checks_stale,
            watches,
            unwatches,
            events,
        } = *o;
        self.grants += grants;
        self.waited_grants += waited_grants;
        self.two_key_grants += two_key_grants;
        self.shared_beside += shared_beside;
        self.slots_beside += slots_beside;
        self.full_semaphores += full_semaphores;
        self.values += values;
        self.timeouts += timeouts;
        self.limit_refusals += limit_refusals;
        self.unlocks += unlocks;
        self.unlocks_by_fence += unlocks_by_fence;
        self.lost_notices += lost_notices;
        self.expired_notices += expired_notices;
        self.silent_expiries += silent_expiries;
        self.closes += closes;
        self.lost_by_close += lost_by_close;
        self.extends += extends;
        self.extends_by_fence += extends_by_fence;
        self.not_held += not_held;
        self.gets += gets;
        self.delays_started += delays_started;
        self.delays_seen += delays_seen;
        self.checks_ok += checks_ok;
        self.checks_stale += checks_stale;
        self.watches += watches;
        self.unwatches += unwatches;
        for (a, b) in self.events.iter_mut().zip(events) {
            *a += b;
        }
    }
}

/// One answer or notice of the native protocol, from an effect's canonical body.
struct Answer {
    id: Option<u64>,
    status: u32,
    fence: Option<u64>,
    keys: Vec<Vec<u8>>,
    /// The `info` and `event` fields.
    extra: dl::Response,
}

/// A dlock Response's canonical body (`protocol::dlock::reply`): tag, request id, status,
/// text, time, fence, keys, then the version-3 marker and its encoded `info`/`event` fields.
fn answer_of(body: &[u8]) -> Result<Answer, String> {
    let err = |e| format!("dlock answer: {e:?}");
    let mut r = Reader::new(body);
    r.u8().map_err(err)?;
    let id = r.opt_u64().map_err(err)?;
    let status = r.u32().map_err(err)?;
    if r.bool().map_err(err)? {
        r.bytes(usize::MAX).map_err(err)?;
    }
    r.u64().map_err(err)?;
    let fence = r.opt_u64().map_err(err)?;
    let mut keys = Vec::new();
    let mut extra = None;
    while r.remaining() > 0 {
        // The marker, then one field to the end (a key here is 2 bytes: its length byte is 2).
        let rest = &body[body.len() - r.remaining()..];
        if rest[0] == crate::protocol::dlock::reply_tag::NATIVE {
            let mut m = Reader::new(&rest[1..]);
            if let Ok(bytes) = m.bytes(usize::MAX) {
                if m.remaining() == 0 {
                    extra = Some(dl::decode_response(bytes).map_err(|e| format!("extra: {e}"))?);
                    break;
                }
            }
        }
        keys.push(r.bytes(usize::MAX).map_err(err)?.to_vec());
    }
    let Some(extra) = extra else {
        return Err("a dlock answer without the version-3 marker".into());
    };
    Ok(Answer {
        id,
        status,
        fence,
        keys,
        extra,
    })
}

fn key_name(k: usize) -> String {
    String::from_utf8_lossy(KEYS[k]).into_owned()
}

fn key_index(name: &[u8]) -> Result<usize, String> {
    KEYS.iter()
        .position(|k| *k == name)
        .ok_or_else(|| format!("a key the clients never named: {name:?}"))
}

/// Version-3 clients and the model of their grants ([module docs](self)).
pub struct NativeWorkload {
    config: Config,
    secrets: crate::tls::Secrets,
    clients: BTreeMap<u64, ClientState>,
    sent: BTreeMap<u64, Sent>,
    /// The log's clock (ms) after the last command applied.
    clock: u64,
    grants: BTreeMap<(usize, u64), Grant>,
    /// Per key, the largest token granted.
    last_fence: [u64; 3],
    waits: BTreeMap<(u64, u64), Wait>,
    waits_queued: u64,
    delays: Vec<Delay>,
    closed: BTreeSet<ConnId>,
    /// Each session's connection, from the effects routed to it.
    sessions: BTreeMap<u64, ConnId>,
    /// The connection the current command closes.
    closing: Option<ConnId>,
    /// Lost notices due and received in the current command: (conn, request id, key, fence).
    lost_due: Vec<(ConnId, u64, usize, u64)>,
    lost_got: Vec<(ConnId, u64, usize, u64)>,
    batch: Batch,
    /// Client 0 watches keys ([`NativeWorkload::watching`]).
    watcher: Option<Watcher>,
    /// HOLDFAST_SIM_TRACE=1: every command and what it answered, on stderr.
    trace: bool,
    pub counts: NativeCounts,
}

impl Default for NativeWorkload {
    fn default() -> Self {
        NativeWorkload::new()
    }
}

/// The window of instants at which a waiting Lock granted in a command at `now` (after one at
/// `prev`) may have been granted: a timer between the two, or the command itself.
fn window(prev: u64, now: u64) -> (u64, u64) {
    if now > prev {
        (prev + 1, now)
    } else {
        (now, now)
    }
}

/// A lease of `ms` on the table's clock (as the daemon rounds it).
fn table_ms(ms: u64) -> u64 {
    lease_on_the_table_clock(Some(ms * 1000)).unwrap_or(0) / 1000
}

impl NativeWorkload {
    pub fn new() -> NativeWorkload {
        let config = match config::parse(std::iter::empty::<&str>()) {
            Ok(Command::Run(c)) => c,
            _ => unreachable!("no flags parse"),
        };
        NativeWorkload {
            config,
            secrets: Default::default(),
            clients: BTreeMap::new(),
            sent: BTreeMap::new(),
            clock: 0,
            grants: BTreeMap::new(),
            last_fence: [0; 3],
            waits: BTreeMap::new(),
            waits_queued: 0,
            delays: Vec::new(),
            closed: BTreeSet::new(),
            sessions: BTreeMap::new(),
            closing: None,
            lost_due: Vec::new(),
            lost_got: Vec::new(),
            batch: Batch::default(),
            watcher: None,
            trace: std::env::var("HOLDFAST_SIM_TRACE").is_ok_and(|v| v == "1"),
            counts: NativeCounts::default(),
        }
    }

    /// The workload with a watcher: client 0 also Watches and Unwatches keys and never closes
    /// its connection, and the check requires every change of a key it watches (each grant and
    /// its end, of the kind the model knows) to reach it once, under that key's Watch id, the
    /// grant before its end, and no other event. Watches are the watcher's node's own and not
    /// in a snapshot, so this runs only where no node restores one (every replica plays the
    /// watcher's node, node 0): see [`super::Options::without_compaction`].
    pub fn watching() -> NativeWorkload {
        NativeWorkload {
            watcher: Some(Watcher::default()),
            ..NativeWorkload::new()
        }
    }

    /// Client `client`'s connection now.
    fn conn_of(&mut self, client: u64) -> ConnId {
        let c = self.clients.entry(client).or_default();
        c.gen = c.gen.max(1);
        ConnId::on_node(client as u16, 0, client as u32, c.gen)
    }

    /// The request bytes of `req` from `client` (what [`Workload::command`] turns into a
    /// command entry), noted as sent.
    pub fn send(&mut self, client: u64, req: Req) -> Vec<u8> {
        let conn = self.conn_of(client);
        let c = self.clients.get_mut(&client).expect("made above");
        c.next_rid += 1;
        let rid = c.next_rid;
        let mut flags = if c.opened { 0 } else { OPENS };
        c.opened = true;
        if matches!(req, Req::Close) {
            flags |= CLOSES;
            c.gen += 1;
            c.opened = false;
        }
        let mut out = vec![flags];
        out.extend_from_slice(&conn.gen.to_le_bytes());
        encode_frame(&req, rid, &mut out);
        if let (Req::Watch(_), Some(w)) = (&req, self.watcher.as_mut()) {
            w.rids.insert(rid);
        }
        self.sent.insert(client, Sent { conn, rid, req });
        out
    }

    /// A fence to name on `key`: a grant's mostly, else any.
    fn pick_fence(&self, key: usize, rng: &mut Rng) -> u64 {
        let held: Vec<u64> = self
            .grants
            .range((key, 0)..=(key, u64::MAX))
            .map(|((_, f), _)| *f)
            .collect();
        if !held.is_empty() && rng.chance(75) {
            held[rng.index(held.len())]
        } else {
            rng.below(self.last_fence.iter().max().copied().unwrap_or(0) + 2)
        }
    }

    fn pick_req(&mut self, client: u64, rng: &mut Rng) -> Req {
        let conn = self.conn_of(client);
        let waiting = self.waits.keys().filter(|(c, _)| *c == client).count();
        let mine: Vec<usize> = self
            .grants
            .iter()
            .filter(|(_, g)| g.conn == conn)
            .map(|((k, _), _)| *k)
            .collect();
        let some_key = |rng: &mut Rng| rng.index(KEYS.len());
        let my_key = |rng: &mut Rng| {
            if !mine.is_empty() && rng.chance(80) {
                mine[rng.index(mine.len())]
            } else {
                rng.index(KEYS.len())
            }
        };
        match rng.below(100) {
            0..=31 if waiting < MAX_WAITS => Req::Lock(pick_lock(client, rng)),
            0..=43 => Req::Unlock {
                keys: vec![my_key(rng)],
                fence: None,
            },
            44..=49 => {
                let k = some_key(rng);
                Req::Unlock {
                    keys: vec![k],
                    fence: Some(self.pick_fence(k, rng)),
                }
            }
            50..=57 => Req::Extend {
                keys: vec![my_key(rng)],
                lease_ms: 20 + rng.below(1_200),
                fence: None,
            },
            58..=62 => {
                let k = some_key(rng);
                Req::Extend {
                    keys: vec![k],
                    lease_ms: 20 + rng.below(1_200),
                    fence: Some(self.pick_fence(k, rng)),
                }
            }
            63..=74 => {
                let mut keys = vec![some_key(rng)];
                if rng.chance(40) {
                    let k = some_key(rng);
                    if !keys.contains(&k) {
                        keys.push(k);
                    }
                }
                Req::Get(keys)
            }
            77..=91 if self.watcher.is_some() && client == 0 => {
                let w = self.watcher.as_ref().expect("watching");
                if w.keys.is_empty() || rng.chance(55) {
                    let mut keys = vec![some_key(rng)];
                    if rng.chance(30) {
                        let k = some_key(rng);
                        if !keys.contains(&k) {
                            keys.push(k);
                        }
                    }
                    Req::Watch(keys)
                } else {
                    Req::Unwatch(vec![some_key(rng)])
                }
            }
            75..=83 => {
                let k = some_key(rng);
                Req::Check(k, self.pick_fence(k, rng))
            }
            84..=88 => Req::Close,
            _ => Req::Ping,
        }
    }
}

/// A Lock: exclusive, shared (some of two keys) or a semaphore slot (limit 3, sometimes 2),
/// with short leases, values, lock-delays and waits of every kind.
fn pick_lock(client: u64, rng: &mut Rng) -> LockReq {
    let (keys, mode) = match rng.below(10) {
        0..=6 => {
            let mode = if rng.chance(55) {
                Mode::Excl
            } else {
                Mode::Shared
            };
            let keys = match rng.below(10) {
                0 => vec![SEMAPHORE_KEY],
                1 | 2 => vec![0, 1],
                _ => vec![rng.index(2)],
            };
            (keys, mode)
        }
        _ => {
            let limit = if rng.chance(85) { 3 } else { 2 };
            (vec![SEMAPHORE_KEY], Mode::Slots(limit))
        }
    };
    LockReq {
        keys,
        mode,
        wait_ms: match rng.below(10) {
            0 | 1 => None,
            2..=4 => Some(0),
            _ => Some(50 + rng.below(1_500)),
        },
        lease_ms: rng.chance(55).then(|| 20 + rng.below(1_200)),
        value: rng
            .chance(40)
            .then(|| format!("v{client}.{}", rng.below(1000)).into_bytes()),
        delay_ms: if rng.chance(30) {
            1 + rng.below(600)
        } else {
            0
        },
    }
}

/// `req` as a version-3 frame with request id `rid` (nothing for a Close).
fn encode_frame(req: &Req, rid: u64, out: &mut Vec<u8>) {
    let us = |ms: u64| ms * 1000;
    let (ty, keys, mut lf): (u64, Vec<usize>, dl::LockFields<'_>) = match req {
        Req::Close => return,
        Req::Ping => (req_type::PING, Vec::new(), Default::default()),
        Req::Lock(l) => (
            req_type::LOCK,
            l.keys.clone(),
            dl::LockFields {
                wait_micro: l.wait_ms.map(us),
                release_micro: l.lease_ms.map(us),
                native: dl::NativeFields {
                    shared: l.mode == Mode::Shared,
                    limit: matches!(l.mode, Mode::Slots(_)).then(|| l.mode.limit()),
                    value: l.value.as_deref(),
                    lock_delay_micro: (l.delay_ms > 0).then(|| us(l.delay_ms)),
                    fence: None,
                },
                ..Default::default()
            },
        ),
        Req::Unlock { keys, fence } => (
            req_type::UNLOCK,
            keys.clone(),
            dl::LockFields {
                native: dl::NativeFields {
                    fence: *fence,
                    ..Default::default()
                },
                ..Default::default()
            },
        ),
        Req::Extend {
            keys,
            lease_ms,
            fence,
        } => (
            req_type::EXTEND,
            keys.clone(),
            dl::LockFields {
                release_micro: Some(us(*lease_ms)),
                native: dl::NativeFields {
                    fence: *fence,
                    ..Default::default()
                },
                ..Default::default()
            },
        ),
        Req::Get(keys) => (req_type::GET, keys.clone(), Default::default()),
        Req::Watch(keys) => (req_type::WATCH, keys.clone(), Default::default()),
        Req::Unwatch(keys) => (req_type::UNWATCH, keys.clone(), Default::default()),
        Req::Check(k, f) => (
            req_type::CHECK_FENCE,
            vec![*k],
            dl::LockFields {
                native: dl::NativeFields {
                    fence: Some(*f),
                    ..Default::default()
                },
                ..Default::default()
            },
        ),
    };
    let kb: Vec<&[u8]> = keys.iter().map(|&k| KEYS[k]).collect();
    lf.keys = &kb;
    let lock = (!kb.is_empty()).then_some(lf);
    dl::encode_request_version(out, dl::NATIVE_VERSION, Some(rid), None, ty, lock);
}

impl Workload for NativeWorkload {
    fn request(&mut self, client: u64, rng: &mut Rng) -> Vec<u8> {
        let req = self.pick_req(client, rng);
        self.send(client, req)
    }

    fn command(&self, client: u64, request: &[u8], now_ms: u64) -> Vec<u8> {
        let flags = request[0];
        let mut gen = [0u8; 4];
        gen.copy_from_slice(&request[1..5]);
        let conn = ConnId::on_node(client as u16, 0, client as u32, u32::from_le_bytes(gen));
        let mut batch = Batch::default();
        if flags & OPENS != 0 {
            batch.ops.push(OpMsg {
                conn,
                op: Op::DlockOpen,
            });
        }
        if flags & CLOSES != 0 {
            batch.ops.push(OpMsg {
                conn,
                op: Op::Close,
            });
        } else {
            // The worker's own parser makes the operation from the frame.
            let cx = Cx {
                config: &self.config,
                secrets: &self.secrets,
            };
            Conn::new(Proto::Dlock).receive(&request[5..], conn, cx, &mut batch);
        }
        let mut out = Vec::new();
        command::encode_entry(now_ms, &batch.ops, &batch.arena.bytes, &mut out);
        out
    }

    fn check(&mut self, client: u64, command: &[u8], effects: &[u8]) -> Result<(), String> {
        let time = command::decode_entry(command, Limits::default(), &mut self.batch)
            .map_err(|e| format!("a command that does not decode: {e:?}"))?;
        let prev = self.clock;
        self.clock = prev.max(time);
        let sent = self
            .sent
            .remove(&client)
            .ok_or_else(|| format!("client {client}: a command it did not send"))?;
        let now = self.clock;
        if self.trace {
            eprintln!(
                "native: {now} client {client} {:?} rid {} {:?}",
                sent.conn, sent.rid, sent.req
            );
        }
        let ctx = |e: String| format!("at {now} ms, client {client} {:?}: {e}", sent.req);
        self.lost_due.clear();
        self.lost_got.clear();
        self.apply_effects(&sent, prev, effects).map_err(ctx)?;
        self.after_command().map_err(ctx)
    }
}

impl NativeWorkload {
    fn apply_effects(&mut self, sent: &Sent, prev: u64, effects: &[u8]) -> Result<(), String> {
        self.closing = None;
        if matches!(sent.req, Req::Close) {
            // Before the grants its end lets through. Its own effects made before the close in
            // this turn (a waiting Lock granted, a notice) route nowhere: they are known by
            // their session.
            self.close(sent.conn);
            self.closing = Some(sent.conn);
        }
        let mut answered = matches!(sent.req, Req::Close);
        let mut r = Reader::new(effects);
        while r.remaining() > 0 {
            let e = next_effect_of_session(&mut r)?;
            let (session, to, body) = (e.session, e.to, e.body);
            if body.first() != Some(&tag::DLOCK) {
                continue;
            }
            let to = match (to, self.sessions.get(&session), self.closing) {
                (Some(to), ..) => {
                    self.sessions.insert(session, to);
                    to
                }
                (None, Some(&conn), _) => conn,
                (None, None, Some(conn)) => {
                    self.sessions.insert(session, conn);
                    conn
                }
                (None, None, None) => {
                    return Err(format!("an answer to session {session}, of no connection"))
                }
            };
            let a = answer_of(body)?;
            if self.trace {
                eprintln!(
                    "native:   to {to:?} id {:?} status {} fence {:?} keys {:?} {:?} {:?}",
                    a.id, a.status, a.fence, a.keys, a.extra.info, a.extra.event
                );
            }
            if let Some(ev) = self.watch_event(to, &a)? {
                self.watcher.as_mut().expect("watching").got.push(ev);
            } else if a.extra.event.is_some() {
                self.notice(to, &a, prev)?;
            } else if to == sent.conn && a.id == Some(sent.rid) && !answered {
                answered = true;
                self.answer(sent, &a)?;
            } else {
                self.wait_answered(to, &a, prev)?;
            }
        }
        if let Some(conn) = self.closing {
            // Its waiting Locks not answered before the close are dropped.
            self.waits.retain(|_, w| w.conn != conn);
        }
        if !answered {
            let Req::Lock(l) = &sent.req else {
                return Err("no answer".into());
            };
            if l.wait_ms == Some(0) {
                return Err("a Lock that may not wait was not answered".into());
            }
            let deadline = l.wait_ms.map(|w| self.clock + w);
            let key = (u64::from(sent.conn.slot), sent.rid);
            self.waits_queued += 1;
            let wait = Wait {
                conn: sent.conn,
                lock: l.clone(),
                deadline,
                seq: self.waits_queued,
            };
            self.waits.insert(key, wait);
        }
        Ok(())
    }

    /// The checks once a command's effects are all seen.
    fn after_command(&mut self) -> Result<(), String> {
        let now = self.clock;
        // An Expired event the model did not call for yet: a lease whose holder was not told
        // (its connection closed) ran out in this command.
        let got = self
            .watcher
            .as_ref()
            .map(|w| w.got.clone())
            .unwrap_or_default();
        for (k, kind, f) in got {
            if kind == event_kind::EXPIRED && self.grants.contains_key(&(k, f)) {
                self.agree(k, f, false, "an Expired event")?;
            }
        }
        self.lost_due.sort_unstable();
        self.lost_got.sort_unstable();
        if self.lost_due != self.lost_got {
            return Err(format!(
                "Lost notices due {:?}, received {:?}",
                self.lost_due, self.lost_got
            ));
        }
        // Every lease whose latest deadline passed has ended: an open holder was told.
        let gone: Vec<(usize, u64)> = self
            .grants
            .iter()
            .filter(|(_, g)| g.lease.is_some_and(|(_, hi)| hi <= now))
            .map(|(k, _)| *k)
            .collect();
        for (k, f) in gone {
            let lease = self.grants[&(k, f)].lease.expect("a lease");
            self.silent_expiry(k, f, lease)?;
        }
        if let Some(((c, rid), w)) = self
            .waits
            .iter()
            .find(|(_, w)| w.deadline.is_some_and(|d| d <= now))
        {
            return Err(format!(
                "client {c}'s Lock {rid} ({:?}) still waits past its deadline {:?}",
                w.lock, w.deadline
            ));
        }
        self.delays.retain(|d| d.until_hi > now);
        self.match_events()
    }

    /// The event `a` to `to`, when it is one of the watcher's Watches' (a notice carries its
    /// Lock's or Extend's request id, never a Watch's).
    fn watch_event(&self, to: ConnId, a: &Answer) -> Result<Option<(usize, u32, u64)>, String> {
        let (Some(w), Some(ev)) = (&self.watcher, &a.extra.event) else {
            return Ok(None);
        };
        let rid = a.id.unwrap_or(0);
        if to.slot != 0 || !w.rids.contains(&rid) {
            return Ok(None);
        }
        let k = key_index(&ev.key)?;
        match w.keys.get(&k) {
            Some(&(id, _)) if id == rid => Ok(Some((k, ev.kind, ev.fence))),
            other => Err(format!(
                "an event of {} {} under Watch {rid}; the watcher's Watch of it: {other:?}",
                key_name(k),
                ev.fence
            )),
        }
    }

    /// A change of `k` the model learned: an event the watcher must get, if it watches `k`.
    /// An expiry within `at` may have come before the Watch (an event may come, or not).
    fn changed(&mut self, k: usize, kind: u32, f: u64, at: Option<(u64, u64)>) {
        let Some(w) = self.watcher.as_mut() else {
            return;
        };
        let Some(&(_, since)) = w.keys.get(&k) else {
            return;
        };
        match at {
            // Timers due by the Watch's time fired before it.
            Some((lo, hi)) if kind == event_kind::EXPIRED && lo <= since => {
                if hi > since {
                    w.maybe.push((k, kind, f));
                }
            }
            _ => w.expect.push((k, kind, f)),
        }
    }

    /// The watcher's events of this command against the changes the model learned: each once,
    /// a grant's before its end, none the model does not call for; then the Watches and
    /// Unwatches of this command take effect.
    fn match_events(&mut self) -> Result<(), String> {
        let now = self.clock;
        let Some(w) = self.watcher.as_mut() else {
            return Ok(());
        };
        let got = std::mem::take(&mut w.got);
        let mut expect = std::mem::take(&mut w.expect);
        let mut maybe = std::mem::take(&mut w.maybe);
        for (i, &(k, kind, f)) in got.iter().enumerate() {
            let name = key_name(k);
            if kind == event_kind::ACQUIRED && got[..i].iter().any(|e| (e.0, e.2) == (k, f)) {
                return Err(format!(
                    "{name} {f}: Acquired after an event of its end: {got:?}"
                ));
            }
            if let Some(j) = expect.iter().position(|e| *e == (k, kind, f)) {
                expect.remove(j);
            } else if let Some(j) = maybe.iter().position(|e| *e == (k, kind, f)) {
                maybe.remove(j);
            } else {
                return Err(format!(
                    "an event of kind {kind} for {name} {f} the model does not call for (got \
                     {got:?}, the model's {expect:?})"
                ));
            }
            self.counts.events[(kind as usize).clamp(1, 4) - 1] += 1;
        }
        if !expect.is_empty() {
            return Err(format!(
                "watcher events missing: (key, kind, fence) {expect:?}; got {got:?}"
            ));
        }
        for (k, rid) in std::mem::take(&mut w.pending) {
            match rid {
                Some(rid) => {
                    w.keys.insert(k, (rid, now));
                }
                None => {
                    w.keys.remove(&k);
                }
            }
        }
        Ok(())
    }

    /// The connection ends: its connection-bound grants are lost (lock-delays from now), its
    /// waiting Locks dropped; its leases stay until they run out, and nobody is told then.
    fn close(&mut self, conn: ConnId) {
        self.counts.closes += 1;
        self.closed.insert(conn);
        let now = self.clock;
        let lost: Vec<(usize, u64)> = self
            .grants
            .iter()
            .filter(|(_, g)| g.conn == conn && g.lease.is_none())
            .map(|(k, _)| *k)
            .collect();
        for (k, f) in lost {
            self.counts.lost_by_close += 1;
            self.end(k, f, End::Lost(now));
        }
    }

    /// Grant `(k, f)` ended `how`: by loss or expiry, its lock-delay begins; a watcher of `k`
    /// is told.
    fn end(&mut self, k: usize, f: u64, how: End) {
        let Some(g) = self.grants.remove(&(k, f)) else {
            return;
        };
        let (kind, delay_from) = match how {
            End::Released => (event_kind::RELEASED, None),
            End::Expired(lo, hi) => (event_kind::EXPIRED, Some((lo, hi))),
            End::Lost(at) => (event_kind::LOST, Some((at, at))),
        };
        self.changed(k, kind, f, delay_from);
        if let Some(from) = delay_from.filter(|_| g.delay_ms > 0) {
            self.counts.delays_started += 1;
            self.delays.push(Delay {
                key: k,
                from,
                until: from.0 + g.delay_ms,
                until_hi: from.1 + g.delay_ms,
                mode: g.mode,
            });
        }
    }

    /// `(k, f)`'s lease ran out with nobody told: its holder's connection must be closed.
    fn silent_expiry(&mut self, k: usize, f: u64, at: (u64, u64)) -> Result<(), String> {
        let g = &self.grants[&(k, f)];
        if !self.closed.contains(&g.conn) {
            return Err(format!(
                "{} {f}'s lease ran out (deadline {:?}) with no Expired notice to its open holder {:?}",
                key_name(k),
                g.lease,
                g.conn
            ));
        }
        self.counts.silent_expiries += 1;
        self.end(k, f, End::Expired(at.0, at.1));
        Ok(())
    }

    /// Whether `g` is certainly live at `now` (`Some(false)`: certainly not; `None`: unknown).
    fn live(g: &Grant, now: u64) -> Option<bool> {
        match g.lease {
            None => Some(true),
            Some((lo, _)) if lo > now => Some(true),
            Some((_, hi)) if hi <= now => Some(false),
            Some(_) => None,
        }
    }

    /// The model learns that uncertain `(k, f)` is live now, or that it ran out.
    fn learn(&mut self, k: usize, f: u64, live: bool) -> Result<(), String> {
        let now = self.clock;
        let g = self.grants.get_mut(&(k, f)).expect("a grant");
        let Some((lo, hi)) = g.lease else {
            return Ok(());
        };
        if live {
            g.lease = Some((lo.max(now + 1), hi));
            Ok(())
        } else {
            self.silent_expiry(k, f, (lo, hi.min(now)))
        }
    }

    /// What the answer about `(k, f)` says of it, against the model: `want` whether the answer
    /// says it is live.
    fn agree(&mut self, k: usize, f: u64, live: bool, what: &str) -> Result<(), String> {
        let now = self.clock;
        let model = self.grants.get(&(k, f)).map(|g| Self::live(g, now));
        match (model, live) {
            (None, true) => Err(format!(
                "{what}: {} {f} is live, the model has no such grant",
                key_name(k)
            )),
            (Some(Some(true)), false) => Err(format!(
                "{what}: {} {f} is not live, the model has it live: {:?}",
                key_name(k),
                self.grants[&(k, f)]
            )),
            (Some(Some(false)), true) => Err(format!(
                "{what}: {} {f} is live past its lease: {:?}",
                key_name(k),
                self.grants[&(k, f)]
            )),
            (Some(_), _) => self.learn(k, f, live),
            (None, false) => Ok(()),
        }
    }

    /// The grants of `conn` on `k`.
    fn grants_of(&self, conn: ConnId, k: usize) -> Vec<u64> {
        self.grants
            .range((k, 0)..=(k, u64::MAX))
            .filter(|(_, g)| g.conn == conn)
            .map(|((_, f), _)| *f)
            .collect()
    }

    /// An Unlock or Extend of `sent.conn`'s own grants on `keys`: Ok when it had one on each,
    /// NotHeld with the keys it had none on. Returns the grants it reached (those of the
    /// caller on `keys`: its connection is open, so a lease of its that ran out was noticed
    /// before, and the rest are live).
    fn own_grants(
        &mut self,
        sent: &Sent,
        keys: &[usize],
        a: &Answer,
    ) -> Result<Vec<(usize, u64)>, String> {
        let not_held: Vec<usize> = match a.status {
            status::OK => Vec::new(),
            status::NOT_HELD if !a.keys.is_empty() => {
                self.counts.not_held += 1;
                a.keys
                    .iter()
                    .map(|k| key_index(k))
                    .collect::<Result<_, _>>()?
            }
            s => return Err(format!("status {s} (keys {:?})", a.keys)),
        };
        let mut out = Vec::new();
        for &k in keys {
            let held = !not_held.contains(&k);
            for f in self.grants_of(sent.conn, k) {
                let live = Self::live(&self.grants[&(k, f)], self.clock);
                if !held || live == Some(false) {
                    self.agree(k, f, false, "NotHeld")?;
                } else {
                    self.agree(k, f, true, "held")?;
                }
            }
            let mine = self.grants_of(sent.conn, k);
            if held && mine.is_empty() {
                return Err(format!(
                    "{} answered as held; the model has no grant of it",
                    key_name(k)
                ));
            }
            out.extend(mine.iter().map(|f| (k, *f)));
        }
        Ok(if a.status == status::OK {
            out
        } else {
            Vec::new()
        })
    }

    /// The answer to the command's own request.
    fn answer(&mut self, sent: &Sent, a: &Answer) -> Result<(), String> {
        let now = self.clock;
        match &sent.req {
            Req::Lock(l) => match (a.status, a.fence) {
                (status::OK, Some(f)) => {
                    self.first_in_line(l, u64::MAX)?;
                    self.grant(sent.conn, sent.rid, l, f, (now, now))
                }
                (status::ACQUIRE_TIMEOUT, None) if l.wait_ms == Some(0) => {
                    self.counts.timeouts += 1;
                    self.busy(&a.keys)
                }
                (status::INVALID_ARGUMENT, None) => self.limit_refused(l),
                (s, f) => Err(format!("answered {s} (fence {f:?})")),
            },
            Req::Unlock { keys, fence: None } => {
                let released = self.own_grants(sent, keys, a)?;
                self.counts.unlocks += u64::from(a.status == status::OK);
                for (k, f) in released {
                    self.end(k, f, End::Released);
                }
                Ok(())
            }
            Req::Unlock {
                keys,
                fence: Some(f),
            } => {
                let k = keys[0];
                match a.status {
                    status::OK => {
                        self.agree(k, *f, true, "Unlock by fence")?;
                        let g = self.grants[&(k, *f)].clone();
                        if g.conn != sent.conn && !self.closed.contains(&g.conn) {
                            self.lost_due.push((g.conn, g.rid, k, *f));
                        }
                        self.counts.unlocks_by_fence += 1;
                        self.end(k, *f, End::Released);
                        Ok(())
                    }
                    status::NOT_HELD => {
                        self.counts.not_held += 1;
                        self.agree(k, *f, false, "Unlock by fence")
                    }
                    s => Err(format!("status {s}")),
                }
            }
            Req::Extend {
                keys,
                lease_ms,
                fence: None,
            } => {
                let extended = self.own_grants(sent, keys, a)?;
                let d = now + table_ms(*lease_ms);
                for kf in extended {
                    self.counts.extends += 1;
                    self.grants.get_mut(&kf).expect("held").lease = Some((d, d));
                }
                Ok(())
            }
            Req::Extend {
                keys,
                lease_ms,
                fence: Some(f),
            } => {
                let k = keys[0];
                match a.status {
                    status::OK => {
                        self.agree(k, *f, true, "Extend by fence")?;
                        self.counts.extends_by_fence += 1;
                        let d = now + table_ms(*lease_ms);
                        let g = self.grants.get_mut(&(k, *f)).expect("agreed");
                        g.lease = Some((d, d));
                        g.conn = sent.conn;
                        g.rid = sent.rid;
                        Ok(())
                    }
                    status::NOT_HELD => {
                        self.counts.not_held += 1;
                        self.agree(k, *f, false, "Extend by fence")
                    }
                    s => Err(format!("status {s}")),
                }
            }
            Req::Get(keys) => self.check_get(keys, a),
            Req::Watch(keys) => {
                // Its answer shows the keys' state as a Get's would.
                self.check_get(keys, a)?;
                self.counts.watches += 1;
                let w = self.watcher.as_mut().ok_or("a Watch of no watcher")?;
                w.pending.extend(keys.iter().map(|&k| (k, Some(sent.rid))));
                Ok(())
            }
            Req::Unwatch(keys) if a.status == status::OK => {
                self.counts.unwatches += 1;
                let w = self.watcher.as_mut().ok_or("an Unwatch of no watcher")?;
                w.pending.extend(keys.iter().map(|&k| (k, None)));
                Ok(())
            }
            Req::Unwatch(_) => Err(format!("Unwatch answered {}", a.status)),
            Req::Check(k, f) => {
                let live = match a.status {
                    status::OK => true,
                    status::STALE_FENCE => false,
                    s => return Err(format!("status {s}")),
                };
                if live {
                    self.counts.checks_ok += 1;
                } else {
                    self.counts.checks_stale += 1;
                }
                self.agree(*k, *f, live, "CheckFence")
            }
            Req::Ping if a.status == status::OK => Ok(()),
            Req::Ping | Req::Close => Err(format!("answered {}", a.status)),
        }
    }

    /// Keys a Lock that may not wait found busy: each has a holder, a waiter or a lock-delay
    /// that may still run (the model does not say which Locks fit: only that a busy key is not
    /// free of everything, as after an Unlock, which starts no lock-delay).
    fn busy(&self, keys: &[Vec<u8>]) -> Result<(), String> {
        let now = self.clock;
        for name in keys {
            let k = key_index(name)?;
            let held = self.grants.range((k, 0)..=(k, u64::MAX)).next().is_some();
            let waited = self.waits.values().any(|w| w.lock.keys.contains(&k));
            let delayed = self.delays.iter().any(|d| d.key == k && d.until_hi > now);
            if !(held || waited || delayed) {
                return Err(format!(
                    "{} busy, with no holder, no waiter and no lock-delay",
                    key_name(k)
                ));
            }
        }
        Ok(())
    }

    /// A Lock refused for its limit: a key had holders or waiters of another limit.
    fn limit_refused(&mut self, l: &LockReq) -> Result<(), String> {
        let limit = l.mode.limit();
        let other = l.keys.iter().any(|&k| {
            self.grants
                .range((k, 0)..=(k, u64::MAX))
                .any(|(_, g)| g.mode.limit() != limit)
                || self
                    .waits
                    .values()
                    .any(|w| w.lock.keys.contains(&k) && w.lock.mode.limit() != limit)
        });
        if !other {
            return Err("refused for its limit; no holder or waiter has another".into());
        }
        self.counts.limit_refusals += 1;
        Ok(())
    }

    /// A waiting Lock's answer (in any command's effects).
    fn wait_answered(&mut self, to: ConnId, a: &Answer, prev: u64) -> Result<(), String> {
        let rid = a.id.unwrap_or(0);
        let key = (u64::from(to.slot), rid);
        let Some(w) = self.waits.remove(&key) else {
            return Err(format!(
                "an answer {} to {to:?} request {rid} nobody waits for",
                a.status
            ));
        };
        if w.conn != to {
            return Err(format!("client {} request {rid} answered on {to:?}", key.0));
        }
        let now = self.clock;
        match (a.status, a.fence) {
            (status::OK, Some(f)) => {
                self.counts.waited_grants += 1;
                self.first_in_line(&w.lock, w.seq)?;
                self.grant(to, rid, &w.lock, f, window(prev, now))
            }
            (status::ACQUIRE_TIMEOUT, None) => match w.deadline {
                Some(d) if d <= now => {
                    self.counts.timeouts += 1;
                    Ok(())
                }
                d => Err(format!("request {rid} timed out before its deadline {d:?}")),
            },
            (s, f) => Err(format!("waiting request {rid} answered {s} (fence {f:?})")),
        }
    }

    /// A Lock is granted only when no earlier Lock waits for one of its keys (per-key FIFO: a
    /// waiting exclusive Lock is never overtaken by later shared ones); `seq`: its place in the
    /// queues (`u64::MAX` for a Lock granted at once). The waits of a connection closing in this
    /// turn may have been dropped before.
    fn first_in_line(&self, lock: &LockReq, seq: u64) -> Result<(), String> {
        let earlier = self.waits.iter().find(|(_, w)| {
            w.seq < seq
                && Some(w.conn) != self.closing
                && w.lock.keys.iter().any(|k| lock.keys.contains(k))
        });
        match earlier {
            Some(((c, rid), w)) => Err(format!(
                "granted while client {c}'s earlier Lock {rid} waits for a key of it: {:?}",
                w.lock
            )),
            None => Ok(()),
        }
    }

    /// `lock` of `conn` granted with token `f`, at an instant within `at`.
    fn grant(
        &mut self,
        conn: ConnId,
        rid: u64,
        lock: &LockReq,
        f: u64,
        at: (u64, u64),
    ) -> Result<(), String> {
        let now = self.clock;
        for &k in &lock.keys {
            let name = key_name(k);
            if f <= self.last_fence[k] {
                return Err(format!(
                    "{name} granted with token {f}, not above its last {}",
                    self.last_fence[k]
                ));
            }
            let beside: Vec<(u64, Mode)> = self
                .grants
                .range((k, 0)..=(k, u64::MAX))
                .filter(|(_, g)| Self::live(g, now) == Some(true))
                .map(|((_, f), g)| (*f, g.mode))
                .collect();
            let modes: Vec<Mode> = beside.iter().map(|(_, m)| *m).collect();
            if !lock.mode.fits(&modes) {
                let why = match (lock.mode, modes.first()) {
                    (Mode::Excl, Some(Mode::Excl)) => "two exclusive holders",
                    (Mode::Slots(l), _) if modes.iter().all(|m| *m == Mode::Slots(l)) => {
                        "more slot holders than the limit"
                    }
                    (Mode::Shared, _) | (_, Some(Mode::Shared)) => {
                        "a shared holder beside an exclusive one"
                    }
                    _ => "holders of two modes",
                };
                return Err(format!(
                    "{why}: {name} granted {:?} with token {f} beside live {beside:?}",
                    lock.mode
                ));
            }
            match lock.mode {
                Mode::Shared if !modes.is_empty() => self.counts.shared_beside += 1,
                Mode::Slots(l) if !modes.is_empty() => {
                    self.counts.slots_beside += 1;
                    if modes.len() as u32 + 1 == l {
                        self.counts.full_semaphores += 1;
                    }
                }
                _ => {}
            }
            // Certainly after the end of a grant (it could not fit beside it, or that ended
            // before this window) and certainly before its lock-delay ran out.
            if let Some(d) = self.delays.iter().find(|d| {
                d.key == k && at.1 < d.until && (d.from.1 <= at.0 || !lock.mode.fits(&[d.mode]))
            }) {
                return Err(format!(
                    "{name} granted {:?} with token {f} at {at:?}, inside a lock-delay: {d:?}",
                    lock.mode
                ));
            }
        }
        let lease = lock.lease_ms.map(|ms| {
            let l = table_ms(ms);
            (at.0 + l, at.1 + l)
        });
        for &k in &lock.keys {
            self.last_fence[k] = f;
            let g = Grant {
                conn,
                rid,
                mode: lock.mode,
                value: lock.value.clone(),
                lease,
                delay_ms: lock.delay_ms,
            };
            self.grants.insert((k, f), g);
            self.changed(k, event_kind::ACQUIRED, f, None);
            if self.closing == Some(conn) && lease.is_none() {
                // Granted in the turn that closes its connection, before the close.
                self.counts.lost_by_close += 1;
                self.end(k, f, End::Lost(now));
            }
        }
        self.counts.grants += 1;
        self.counts.two_key_grants += u64::from(lock.keys.len() > 1);
        self.counts.values += u64::from(lock.value.is_some());
        Ok(())
    }

    /// An Expired or Lost notice to `to`.
    fn notice(&mut self, to: ConnId, a: &Answer, prev: u64) -> Result<(), String> {
        let ev = a.extra.event.as_ref().expect("an event");
        let k = key_index(&ev.key)?;
        let f = ev.fence;
        let rid = a.id.unwrap_or(0);
        match ev.kind {
            event_kind::EXPIRED => {
                let now = self.clock;
                let Some(g) = self.grants.get(&(k, f)) else {
                    return Err(format!(
                        "an Expired notice of {} {f} to {to:?}, a grant the model does not have",
                        key_name(k)
                    ));
                };
                let (lo, hi) = g
                    .lease
                    .ok_or("an Expired notice of a connection-bound grant")?;
                if (g.conn, g.rid) != (to, rid) || lo > now {
                    return Err(format!(
                        "an Expired notice of {} {f} to {to:?} request {rid} at {now}: the model \
                         has {g:?}",
                        key_name(k)
                    ));
                }
                self.counts.expired_notices += 1;
                let (wlo, whi) = window(prev, now);
                self.end(k, f, End::Expired(lo.max(wlo), hi.min(whi)));
                Ok(())
            }
            event_kind::LOST => {
                // Only an Unlock by fence of another connection's grant makes one; its answer
                // (before or after this notice) says which.
                self.counts.lost_notices += 1;
                self.lost_got.push((to, rid, k, f));
                Ok(())
            }
            kind => Err(format!("an event of kind {kind} with no Watch")),
        }
    }

    /// Get's answer: the model's holders of each key, in grant order, with their values, lease
    /// left and mode; the key's limit, waiters and lock-delay.
    fn check_get(&mut self, keys: &[usize], a: &Answer) -> Result<(), String> {
        if a.status != status::OK || a.extra.info.len() != keys.len() {
            return Err(format!(
                "Get answered {} with {} infos",
                a.status,
                a.extra.info.len()
            ));
        }
        self.counts.gets += 1;
        let now = self.clock;
        for (&k, info) in keys.iter().zip(&a.extra.info) {
            let name = key_name(k);
            if info.key != KEYS[k] {
                return Err(format!("Get of {name} answered for {:?}", info.key));
            }
            let got: Vec<u64> = info.holders.iter().map(|h| h.fence).collect();
            if got.windows(2).any(|w| w[0] >= w[1]) {
                return Err(format!("{name}'s holders not in grant order: {got:?}"));
            }
            let model: Vec<u64> = self
                .grants
                .range((k, 0)..=(k, u64::MAX))
                .map(|((_, f), _)| *f)
                .collect();
            for f in model.iter().filter(|f| !got.contains(f)) {
                self.agree(k, *f, false, "Get")?;
            }
            for h in &info.holders {
                self.agree(k, h.fence, true, "Get")?;
                let g = &self.grants[&(k, h.fence)];
                if h.value != g.value {
                    return Err(format!(
                        "{name} {}: value {:?}, the model's {:?}",
                        h.fence, h.value, g.value
                    ));
                }
                let left_ok = match g.lease {
                    None => h.lease_left_micro == 0,
                    Some((lo, hi)) => {
                        let left = |d: u64| d.saturating_sub(now).max(1) * 1000;
                        (left(lo)..=left(hi)).contains(&h.lease_left_micro)
                    }
                };
                if !left_ok {
                    return Err(format!(
                        "{name} {}: lease left {} µs, the model's deadline {:?} at {now}",
                        h.fence, h.lease_left_micro, g.lease
                    ));
                }
            }
            if let Some(first) = info.holders.first() {
                let mode = self.grants[&(k, first.fence)].mode;
                if info.shared != (mode == Mode::Shared) || info.limit.unwrap_or(1) != mode.limit()
                {
                    return Err(format!(
                        "{name}: shared {} limit {:?}, its first holder is {mode:?}",
                        info.shared, info.limit
                    ));
                }
            }
            let waiting: Vec<&Wait> = self
                .waits
                .values()
                .filter(|w| w.lock.keys.contains(&k))
                .collect();
            let surely = waiting
                .iter()
                .filter(|w| w.deadline.is_none_or(|d| d > now))
                .count();
            if !(surely..=waiting.len()).contains(&(info.waiters as usize)) {
                return Err(format!(
                    "{name}: {} waiters, the model has {surely} to {}",
                    info.waiters,
                    waiting.len()
                ));
            }
            for d in self.delays.iter().filter(|d| d.key == k && d.from.1 <= now) {
                if d.until > now && info.delayed_micro < (d.until - now) * 1000 {
                    return Err(format!(
                        "{name}: delayed {} µs at {now}, the model has {d:?}",
                        info.delayed_micro
                    ));
                }
            }
            if info.delayed_micro > 0 {
                // A lock-delay the model knows that may run that long.
                let longest = self
                    .delays
                    .iter()
                    .filter(|d| d.key == k)
                    .map(|d| d.until_hi.saturating_sub(now) * 1000)
                    .max()
                    .unwrap_or(0);
                if info.delayed_micro > longest {
                    return Err(format!(
                        "{name}: delayed {} µs at {now}; the model's lock-delays may run {longest} µs",
                        info.delayed_micro
                    ));
                }
                self.counts.delays_seen += 1;
            }
        }
        Ok(())
    }
}
