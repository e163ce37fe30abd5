//! A deterministic, single-threaded run of the whole request path: the same per-connection
//! parsing ([`Conn`]), the same owner code and tables, with bytes handed in and replies taken out
//! directly and a fake clock. No threads, no sockets, no real time. For tests that check
//! invariants across all three protocols under random schedules, and for fuzzing the connection
//! state machine.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Instant;

use hashbrown::HashMap;

use super::command;
use super::effect::Effects;
use super::msg::{Batch, Op, OpMsg};
use super::owner::{apply_turn, Outbox, Tables};
use super::worker::{Conn, Cx};
use super::{Live, Proto, Shared};
use crate::config::Config;
use crate::core::{Now, Session};
use crate::server::msg::ConnId;

/// The Unix time the fake clock starts at (2023-11-14), so absolute memcached expiry times work.
pub const SIM_UNIX_START: u64 = 1_700_000_000;

pub struct Sim {
    shared: Shared,
    tables: Tables,
    fx: Effects,
    outbox: Outbox,
    batch: Batch,
    conns: HashMap<ConnId, Conn>,
    /// Output of connections the daemon closed, until taken.
    closed_output: HashMap<ConnId, Vec<u8>>,
    next_slot: u32,
    now_ms: u64,
    /// When on: every reply byte given to any connection, in the order the daemon produced them.
    log: Option<Vec<(ConnId, Vec<u8>)>>,
    /// When on: every owner turn as a command entry, with the effects it produced.
    recording: Option<Recording>,
    /// The session the state machine gave each connection (kept after the connection closes:
    /// a dlock lease outlives its connection, and a test still wants to know whose it is).
    sessions: HashMap<ConnId, Session>,
}

/// What the owner side was given and what it answered, turn by turn (see [`Sim::record`]).
#[derive(Default, Debug, Clone)]
pub struct Recording {
    /// One command entry per owner turn (`server::command`).
    pub entries: Vec<Vec<u8>>,
    /// The typed effects of each turn, encoded by [`encode_effects`].
    pub effects: Vec<Vec<u8>>,
}

/// A turn's typed effects in their canonical bytes ([`Effects::encode_canonical`]), each with
/// the connection the state's session map gives its session at the end of the turn.
pub fn encode_effects(tables: &Tables, fx: &Effects, out: &mut Vec<u8>) {
    fx.encode_canonical(|s| tables.sessions.conn(s), out);
}

/// The owner side alone, fed command entries: what a replica of the state machine does with a
/// log. Its effects and snapshots must match the run that produced the entries byte for byte.
pub struct Replayer {
    shared: Shared,
    tables: Tables,
    fx: Effects,
    batch: Batch,
}

impl Replayer {
    pub fn new(config: Config) -> Replayer {
        let shared = sim_shared(config);
        let tables = Tables::new(&shared.config, Sim::at(0));
        Replayer {
            shared,
            tables,
            fx: Effects::default(),
            batch: Batch::default(),
        }
    }

    /// Apply one entry; returns its effects (as [`encode_effects`] writes them).
    pub fn apply(&mut self, entry: &[u8]) -> Result<Vec<u8>, crate::core::codec::DecodeError> {
        let limits = command::Limits::default();
        let now_ms = command::decode_entry(entry, limits, &mut self.batch)?;
        Live::stamp_if_wanted(&self.shared, &mut self.batch);
        let now = Now::from_unix_ms(now_ms);
        self.fx.clear();
        apply_turn(
            &mut self.tables,
            &mut self.fx,
            &self.shared,
            now,
            &self.batch.ops,
            &self.batch.arena.bytes,
        );
        let mut effects = Vec::new();
        encode_effects(&self.tables, &self.fx, &mut effects);
        Ok(effects)
    }

    /// Apply one turn's operations straight from a batch, the effects dropped as the owner
    /// hands them off (their buffers kept): the owner thread's own work and nothing else, for
    /// measuring it (examples/owner_ceiling.rs).
    pub fn apply_batch(&mut self, now_ms: u64, batch: &Batch) {
        apply_turn(
            &mut self.tables,
            &mut self.fx,
            &self.shared,
            Now::from_unix_ms(now_ms),
            &batch.ops,
            &batch.arena.bytes,
        );
        self.fx.clear();
    }

    pub fn snapshot(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.tables.snapshot(&mut out);
        out
    }

    /// Locks held in all tables (memcached items, lockd names, dlock keys).
    pub fn locks_held(&self) -> u64 {
        let t = &self.tables;
        t.store.stats().locks_held + t.lockd.stats().held + t.dlock.stats().held_keys
    }

    /// Replace the state by one restored from `bytes`.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), crate::core::codec::DecodeError> {
        self.tables = Tables::restore(&self.shared.config, bytes)?;
        Ok(())
    }
}

/// The process-wide values a sim or a replayer reports (`stats`): fixed, so that runs compare.
pub(crate) fn sim_shared(config: Config) -> Shared {
    let config_secrets = (config.secrets.clone(), config.dlock_token.clone());
    Shared {
        write_deadline_ms: AtomicU64::new(0),
        config,
        shutdown: AtomicBool::new(false),
        curr_connections: AtomicU64::new(0),
        open_per_listener: Default::default(),
        total_connections: AtomicU64::new(0),
        rejected_connections: AtomicU64::new(0),
        owner_queue: AtomicU64::new(0),
        owner_queue_peak: AtomicU64::new(0),
        started: Instant::now(),
        started_unix_ms: SIM_UNIX_START * 1000,
        pid: 1,
        secrets: crate::tls::SecretStore::load(config_secrets.0, config_secrets.1)
            .expect("a sim's secrets are given inline, not read from files"),
    }
}

impl Sim {
    pub fn new(config: Config) -> Sim {
        Sim::with_shared(sim_shared(config))
    }

    /// A sim whose secrets (memcached users, dlock token) are given inline instead of read
    /// from the files the configuration names.
    pub fn with_secrets(config: Config, secrets: crate::tls::Secrets) -> Sim {
        let mut shared = sim_shared(config);
        shared.secrets = crate::tls::SecretStore::new(Default::default(), None, secrets);
        Sim::with_shared(shared)
    }

    fn with_shared(shared: Shared) -> Sim {
        let tables = Tables::new(&shared.config, Self::at(0));
        Sim {
            shared,
            tables,
            fx: Effects::default(),
            outbox: Outbox::new(1),
            batch: Batch::default(),
            conns: HashMap::new(),
            closed_output: HashMap::new(),
            next_slot: 0,
            now_ms: 0,
            log: None,
            sessions: HashMap::new(),
            recording: None,
        }
    }

    /// From now on, record every owner turn as a command entry with its effects.
    pub fn record(&mut self) {
        self.recording.get_or_insert_with(Recording::default);
    }

    /// Take what was recorded (see [`Sim::record`]).
    pub fn take_recording(&mut self) -> Recording {
        self.recording
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The whole state machine's snapshot (`Tables::snapshot`).
    pub fn snapshot(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.tables.snapshot(&mut out);
        out
    }

    /// From now on, keep a log of every reply as the daemon gives it to a connection, across all
    /// connections in the one order the owner produced them (per-connection outputs lose that
    /// order). A test that checks lock ownership from the clients' view needs it: a release on
    /// one connection and the grant it causes on another are only in order here.
    pub fn log_replies(&mut self) {
        self.log.get_or_insert_with(Vec::new);
    }

    /// Take the reply log (see [`Sim::log_replies`]): (connection, bytes) in production order.
    pub fn take_log(&mut self) -> Vec<(ConnId, Vec<u8>)> {
        self.log.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn note(log: &mut Option<Vec<(ConnId, Vec<u8>)>>, id: ConnId, conn: &Conn, from: usize) {
        if let Some(log) = log {
            if conn.wbuf.len() > from {
                log.push((id, conn.wbuf[from..].to_vec()));
            }
        }
    }

    fn at(ms: u64) -> Now {
        Now::from_unix_ms(SIM_UNIX_START * 1000 + ms)
    }

    /// The fake clock, in milliseconds since the start.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// The fake clock as the tables see it: Unix milliseconds.
    pub fn clock_ms(&self) -> u64 {
        Self::at(self.now_ms).ms
    }

    /// The tables, to check invariants against a model.
    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    /// Open a connection to one of the listeners.
    pub fn connect(&mut self, proto: Proto) -> ConnId {
        let id = ConnId::new(0, self.next_slot, 0);
        self.next_slot += 1;
        let secrets = self.shared.secrets.current();
        self.conns.insert(id, Conn::accepted(proto, &secrets));
        // As a worker does on accept: the connection's Open (its session starts here), then a
        // dlock connection's idle clock.
        let peer = std::net::SocketAddr::from(([127, 0, 0, 1], (self.next_slot % 60000) as u16));
        self.batch.ops.push(OpMsg {
            conn: id,
            op: Op::Open { proto, peer },
        });
        if proto == Proto::Dlock {
            self.batch.ops.push(OpMsg {
                conn: id,
                op: Op::DlockOpen,
            });
        }
        self.run();
        if let Some(s) = self.tables.sessions.find(id) {
            self.sessions.insert(id, s);
        }
        id
    }

    /// The session the state machine gave connection `id` (also after it closed).
    pub fn session_of(&self, id: ConnId) -> Option<Session> {
        self.sessions.get(&id).copied()
    }

    /// Whether the daemon still has this connection open.
    pub fn is_open(&self, id: ConnId) -> bool {
        self.conns.contains_key(&id)
    }

    /// Bytes from the client; everything they cause is applied before this returns. Ignored for
    /// a connection that is closed or closing (its bytes would be discarded by the daemon too).
    pub fn send(&mut self, id: ConnId, bytes: &[u8]) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.closing {
            return;
        }
        let from = conn.wbuf.len();
        let secrets = self.shared.secrets.current();
        let cx = Cx {
            config: &self.shared.config,
            secrets: &secrets,
        };
        conn.receive(bytes, id, cx, &mut self.batch);
        Self::note(&mut self.log, id, conn, from);
        self.run();
    }

    /// Take every reply byte written to this connection so far (also after it closed).
    pub fn output(&mut self, id: ConnId) -> Vec<u8> {
        match self.conns.get_mut(&id) {
            Some(conn) => {
                let out = conn.output().to_vec();
                conn.written(out.len());
                if conn.dump == super::worker::Dump::Waiting {
                    // The client took its output: a key dump paused for it goes on.
                    self.run();
                }
                out
            }
            None => self.closed_output.remove(&id).unwrap_or_default(),
        }
    }

    /// The client closes the connection (or it resets).
    pub fn disconnect(&mut self, id: ConnId) {
        if self.conns.remove(&id).is_some() {
            self.batch.ops.push(OpMsg {
                conn: id,
                op: Op::Close,
            });
            self.run();
        }
    }

    /// Move the fake clock forward (never back) and fire what is due.
    pub fn advance_to(&mut self, ms: u64) {
        self.now_ms = self.now_ms.max(ms);
        self.run();
    }

    /// One owner turn after another until nothing is left to do: apply the batch, fire timers,
    /// deliver replies, resume connections whose backpressure cleared, close finished ones.
    fn run(&mut self) {
        let now = Self::at(self.now_ms);
        loop {
            let mut batch = std::mem::take(&mut self.batch);
            Live::stamp_if_wanted(&self.shared, &mut batch);
            if let Some(r) = &mut self.recording {
                let mut entry = Vec::new();
                command::encode_entry(now.ms, &batch.ops, &batch.arena.bytes, &mut entry);
                r.entries.push(entry);
            }
            apply_turn(
                &mut self.tables,
                &mut self.fx,
                &self.shared,
                now,
                &batch.ops,
                &batch.arena.bytes,
            );
            if let Some(r) = &mut self.recording {
                let mut effects = Vec::new();
                encode_effects(&self.tables, &self.fx, &mut effects);
                r.effects.push(effects);
            }
            // As the owner hands a turn's effects to the workers: routed to connections, then
            // each encoded into its connection's write buffer.
            self.outbox.route(&mut self.fx, &self.tables.sessions);
            let replies = &mut self.outbox.per_worker[0];
            for effect in &replies.effects {
                let Some(id) = effect.conn else { continue };
                if let Some(conn) = self.conns.get_mut(&id) {
                    let from = conn.wbuf.len();
                    conn.deliver_effect(effect, &replies.arena.bytes);
                    Self::note(&mut self.log, id, conn, from);
                }
            }
            replies.effects.clear();
            replies.arena.bytes.clear();
            // Resume parsing where backpressure cleared; close what is finished (its output stays
            // readable through `output`).
            // In id order, so that a run is the same every time (hash order is not).
            let mut ids: Vec<ConnId> = self.conns.keys().copied().collect();
            ids.sort_unstable();
            for id in ids {
                let Some(conn) = self.conns.get_mut(&id) else {
                    continue;
                };
                conn.continue_dump(id, &mut self.batch);
                if !conn.closing && !conn.rbuf.is_empty() && conn.can_parse() {
                    let from = conn.wbuf.len();
                    let secrets = self.shared.secrets.current();
                    let cx = Cx {
                        config: &self.shared.config,
                        secrets: &secrets,
                    };
                    conn.parse_buffered(id, cx, &mut self.batch);
                    Self::note(&mut self.log, id, conn, from);
                }
                if conn.closing && conn.inflight == 0 {
                    let out = conn.output().to_vec();
                    self.conns.remove(&id);
                    self.closed_output.insert(id, out);
                    self.batch.ops.push(OpMsg {
                        conn: id,
                        op: Op::Close,
                    });
                }
            }
            if self.batch.ops.is_empty() {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::dlock::{self as dl, req_type, status, LockFields};
    use crate::proto::lockd::{self as ld, op};

    fn config() -> Config {
        match crate::config::parse(["--orphan-timeout", "100", "--dlock-idle-timeout", "0"]) {
            Ok(crate::config::Command::Run(c)) => c,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_key_dump_goes_on_in_steps_the_connection_asks_for_and_replays_the_same() {
        let mut sim = Sim::new(config());
        sim.record();
        let (a, b) = (sim.connect(Proto::Memcache), sim.connect(Proto::Memcache));
        let n = 3 * super::super::owner::KEYS_SLOTS_PER_STEP + 5;
        let mut load = Vec::new();
        for i in 0..n {
            load.extend_from_slice(format!("set k{i} 0 0 1 noreply\r\nv\r\n").as_bytes());
        }
        sim.send(b, &load);
        sim.send(a, b"keys k1\r\nget k1\r\n");
        let out = String::from_utf8(sim.output(a)).unwrap();
        // Dump lines are `VALUE <key>`; the get's is `VALUE k1 0 1`.
        let listed = out
            .lines()
            .filter(|l| l.starts_with("VALUE k1") && l.split(' ').count() == 2)
            .count();
        let want = (0..n).filter(|i| i.to_string().starts_with('1')).count();
        assert_eq!(listed, want);
        assert!(
            out.ends_with("END\r\nVALUE k1 0 1\r\nv\r\nEND\r\n"),
            "{out}"
        );
        let rec = sim.take_recording();
        let mut batch = Batch::default();
        let mut continues = 0;
        for entry in &rec.entries {
            command::decode_entry(entry, command::Limits::default(), &mut batch).unwrap();
            continues += batch
                .ops
                .iter()
                .filter(|m| {
                    matches!(
                        m.op,
                        Op::Mc(super::super::msg::McOp {
                            cmd: super::super::msg::McCmd::KeysNext,
                            ..
                        })
                    )
                })
                .count();
        }
        assert_eq!(
            continues, 3,
            "one step per turn, each asked for by the worker"
        );
        let mut replica = Replayer::new(config());
        for (entry, effects) in rec.entries.iter().zip(&rec.effects) {
            assert_eq!(&replica.apply(entry).unwrap(), effects);
        }
        assert_eq!(replica.snapshot(), sim.snapshot());
    }

    #[test]
    fn memcached_locks_work_through_the_sim() {
        let mut sim = Sim::new(config());
        let (a, b) = (sim.connect(Proto::Memcache), sim.connect(Proto::Memcache));
        sim.send(a, b"set k 0 0 1\r\nv\r\nlock k\r\n");
        assert_eq!(sim.output(a), b"STORED\r\nOK\r\n");
        sim.send(b, b"set k 0 0 1\r\nw\r\nget k\r\n");
        assert_eq!(sim.output(b), b"LOCKED\r\nVALUE k 0 1\r\nv\r\nEND\r\n");
        sim.send(a, b"quit\r\n");
        assert!(!sim.is_open(a));
        sim.send(b, b"lock k\r\n");
        assert_eq!(sim.output(b), b"OK\r\n", "quit released a's lock");
    }

    #[test]
    fn an_orphan_is_granted_to_the_waiter_when_the_fake_clock_passes_its_timeout() {
        let mut sim = Sim::new(config());
        let (a, b) = (sim.connect(Proto::Lockd), sim.connect(Proto::Lockd));
        let mut acq = Vec::new();
        ld::encode(&mut acq, op::ACQ, b"n\0");
        sim.send(a, &acq);
        sim.send(b, &acq);
        assert_eq!(sim.output(b)[..4], ld::header(op::ACK, 2));
        sim.advance_to(10);
        sim.disconnect(a);
        sim.advance_to(109);
        assert!(sim.output(b).is_empty(), "not before the orphan timeout");
        sim.advance_to(110);
        assert_eq!(sim.output(b)[..4], ld::header(op::ACQUIRED, 2));
    }

    #[test]
    fn a_dlock_lease_expires_on_the_fake_clock() {
        let mut sim = Sim::new(config());
        let (a, b) = (sim.connect(Proto::Dlock), sim.connect(Proto::Dlock));
        let keys: [&[u8]; 1] = [b"k"];
        let mut lease = Vec::new();
        let fields = LockFields {
            release_micro: Some(50_000),
            keys: &keys,
            ..Default::default()
        };
        dl::encode_request(&mut lease, Some(1), None, req_type::LOCK, Some(fields));
        sim.send(a, &lease);
        sim.disconnect(a);
        let mut wait = Vec::new();
        dl::encode_request(
            &mut wait,
            Some(2),
            None,
            req_type::LOCK,
            Some(LockFields {
                keys: &keys,
                ..Default::default()
            }),
        );
        sim.send(b, &wait);
        assert!(
            sim.output(b).is_empty(),
            "the lease outlives its connection"
        );
        // 50 ms on the fake clock, plus the tick every lease gets (LEASE_CLOCK_SLACK_MS).
        sim.advance_to(50);
        assert!(sim.output(b).is_empty(), "the lease ended early");
        sim.advance_to(50 + crate::server::LEASE_CLOCK_SLACK_MS);
        let out = sim.output(b);
        let (body, _) = dl::parse_frame(&out, 1 << 20).expect("one response");
        let r = dl::decode_response(body).expect("valid");
        assert_eq!((r.request_id, r.status), (Some(2), Some(status::OK)));
    }

    #[test]
    fn memcached_requests_before_authentication_change_nothing() {
        let users = crate::tls::Users::parse(b"bob:hunter2\n").unwrap();
        let secrets = crate::tls::Secrets {
            memcache_users: Some(std::sync::Arc::new(users)),
            ..Default::default()
        };
        let mut sim = Sim::with_secrets(config(), secrets);
        sim.record();
        let (a, b) = (sim.connect(Proto::Memcache), sim.connect(Proto::Memcache));
        sim.send(
            a,
            b"set a 0 0 11\r\nbob hunter2\r\nset k 0 0 1\r\nv\r\nlock k\r\n",
        );
        assert_eq!(sim.output(a), b"STORED\r\nSTORED\r\nOK\r\n");
        // b has not authenticated: none of its requests reaches the tables.
        sim.send(
            b,
            b"set k 0 0 1\r\nw\r\nunlock k\r\ndelete k\r\nflush_all\r\nget k\r\n",
        );
        // Its `set` is taken for an authentication attempt (`w` is no `user password`).
        let unauth = "CLIENT_ERROR unauthenticated\r\n";
        let want = format!(
            "CLIENT_ERROR bad authentication token format\r\n{}",
            unauth.repeat(4)
        );
        assert_eq!(String::from_utf8(sim.output(b)).unwrap(), want);
        let mut lock = Vec::new();
        crate::proto::memcache::binary::encode_request(&mut lock, 0x40, 1, 0, &[], b"k", b"");
        sim.send(b, &lock);
        assert!(
            !sim.is_open(b),
            "a binary request before authentication closes"
        );
        sim.send(a, b"get k\r\n");
        assert_eq!(sim.output(a), b"VALUE k 0 1\r\nv\r\nEND\r\n");
        // A wrong password, then the right one: b is served from then on.
        let c = sim.connect(Proto::Memcache);
        sim.send(c, b"set x 0 0 7\r\nbob bad\r\nlock k\r\n");
        assert_eq!(
            sim.output(c),
            b"CLIENT_ERROR authentication failure\r\nCLIENT_ERROR unauthenticated\r\n"
        );
        sim.send(c, b"set x 0 0 11\r\nbob hunter2\r\nlock k\r\n");
        assert_eq!(sim.output(c), b"STORED\r\nLOCKED\r\n");
        // The owner saw only the authenticated connections' requests (and the connections'
        // opening and closing): its log replays to the same state.
        let rec = sim.take_recording();
        let mut batch = Batch::default();
        let mut requests = 0;
        for entry in &rec.entries {
            command::decode_entry(entry, command::Limits::default(), &mut batch).unwrap();
            for m in &batch.ops {
                if matches!(m.op, Op::Mc(_)) {
                    assert_ne!(m.conn, b, "an unauthenticated request reached the owner");
                    requests += 1;
                }
            }
        }
        assert_eq!(requests, 4, "a's set, lock and get, c's lock");
    }
}
