//! Old lock-daemon clients: ACQ (waiting FIFO, pinging while they wait, giving up by closing),
//! TRY, REL, ADOPT of orphans, PING, SYNC, disconnects while holding (orphans).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use holdfast::proto::lockd::{self as wire, op};

use crate::client::{Base, Ctx};
use crate::model::{Bound, Proto};
use crate::net::{Fail, Res, REPLY_DEADLINE};

struct Frame {
    opcode: u8,
    payload: Vec<u8>,
}

fn parse(buf: &[u8]) -> Result<Option<(Frame, usize)>, String> {
    match wire::parse(buf) {
        None => Ok(None),
        Some((f, _)) if f.version != wire::VERSION => {
            Err(format!("lockd reply with version {}", f.version))
        }
        Some((f, used)) => Ok(Some((
            Frame {
                opcode: f.opcode,
                payload: f.payload.to_vec(),
            },
            used,
        ))),
    }
}

fn op_name(o: u8) -> &'static str {
    match o {
        op::ACQUIRED => "ACQUIRED",
        op::WBLOCK => "WBLOCK",
        op::RELEASED => "RELEASED",
        op::PONG => "PONG",
        op::ACK => "ACK",
        op::ERR => "ERR",
        op::SYNC_REPLY => "SYNC",
        _ => "?",
    }
}

fn payload_of(name: &str) -> Vec<u8> {
    let mut p = name.as_bytes().to_vec();
    p.push(0);
    p
}

pub struct LockdClient {
    b: Base,
    /// The name this connection holds.
    held: Option<String>,
    /// PINGs sent whose PONG has not been read yet, oldest first, with their send times.
    pongs: VecDeque<(Vec<u8>, Instant)>,
    serial: u64,
    /// When the latest request was sent (its reply, when read, moves the connection's Alive).
    last_send: Instant,
}

pub fn run(ctx: Arc<Ctx>, id: u32, seed: u64) {
    let addr = ctx.lockd.clone();
    let mut c = LockdClient {
        b: Base::new(ctx.clone(), id, seed, addr),
        held: None,
        pongs: VecDeque::new(),
        serial: 0,
        last_send: Instant::now(),
    };
    while ctx.running() {
        if let Err(f) = c.step() {
            let what = c.b.what;
            c.failed(what, f);
        }
        c.b.pause(3);
    }
    if c.held.is_some() {
        if let Err(f) = c.release() {
            c.failed("final REL", f);
        }
    }
    c.b.finish();
}

impl LockdClient {
    fn failed(&mut self, what: &str, f: Fail) {
        let owner = self.b.owner();
        if self.b.cluster() && matches!(f, Fail::Closed(_) | Fail::NoQuorum(_)) {
            // Rule 9: the node closed the connection; the lock becomes an orphan later (when
            // the session ends), and the mark goes now.
            if let Some(name) = self.held.take() {
                self.b.ctx.model.releasing(Proto::Lockd, &name, owner);
            }
            self.pongs.clear();
            self.b.cluster_outcome(&f);
            return;
        }
        self.b.ctx.report.error(format!(
            "lockd client {} conn {} (node {}): {what}: {f}",
            self.b.id,
            owner.conn,
            self.b.node + 1
        ));
        self.leave();
    }

    /// Close the connection; a held lock becomes an orphan, which the server may keep for the
    /// orphan timeout counted from (at the earliest) now, or in cluster mode from the end of
    /// the node's sessions if that may be earlier (rule 10).
    fn leave(&mut self) {
        if let Some(name) = self.held.take() {
            let alive = self.b.alive();
            let from = self
                .b
                .ctx
                .model
                .session_floor(alive.as_ref(), Instant::now());
            let bound = Bound {
                at: from + self.b.ctx.orphan_timeout,
                why: "orphan timeout",
            };
            self.b
                .ctx
                .model
                .leaving(Proto::Lockd, &name, self.b.owner(), bound);
            self.b.ctx.report.count(&self.b.ctx.report.c.lockd_orphans);
        }
        self.pongs.clear();
        self.b.disconnect();
    }

    fn step(&mut self) -> Res<()> {
        let (what, r): (_, fn(&mut Self) -> Res<()>) = match self.b.rng.below(1000) {
            0..=399 => ("ACQ", Self::acquire),
            400..=619 => ("TRY", Self::try_lock),
            620..=719 => ("ADOPT", Self::adopt),
            720..=939 => ("PING", Self::ping),
            940..=969 => ("SYNC", Self::sync),
            970..=994 => ("reconnect", |c| {
                c.b.disconnect();
                Ok(())
            }),
            _ => ("hostile", Self::hostile),
        };
        self.b.step(what);
        r(self)
    }

    fn send(&mut self, opcode: u8, payload: &[u8]) -> Res<()> {
        let mut req = Vec::with_capacity(4 + payload.len());
        wire::encode(&mut req, opcode, payload);
        self.last_send = Instant::now();
        self.b.send(&req)
    }

    /// The next reply that is not the PONG of a PING sent while waiting.
    fn recv(&mut self, deadline: Instant) -> Res<Frame> {
        loop {
            let f = self.b.conn()?.recv(deadline, parse)?;
            self.b.ctx.report.op();
            if f.opcode == op::ERR
                && self.b.cluster()
                && self.pongs.front().is_some_and(|(p, _)| *p == f.payload)
            {
                return Err(Fail::NoQuorum("PING while waiting".into()));
            }
            if f.opcode == op::PONG {
                if let Some((expected, sent)) = self.pongs.pop_front() {
                    if f.payload != expected {
                        return Err(Fail::Proto(format!(
                            "PONG payload {:?}, expected {:?}",
                            f.payload, expected
                        )));
                    }
                    self.b.replied(sent);
                    continue;
                }
            }
            return Ok(f);
        }
    }

    /// A reply to a request on `payload` must echo it byte for byte.
    fn expect(&mut self, what: &str, payload: &[u8], allowed: &[u8]) -> Res<u8> {
        let sent = self.last_send;
        let f = self.recv(Instant::now() + REPLY_DEADLINE)?;
        if f.opcode == op::ERR && f.payload == payload && self.b.cluster() {
            if !allowed.contains(&op::ERR) {
                return Err(Fail::NoQuorum(format!(
                    "{what} {:?}",
                    String::from_utf8_lossy(payload)
                )));
            }
            // ADOPT's ERR: not an orphan, or no quorum; the next request tells (a closed
            // connection). Nothing is marked either way.
            return Ok(op::ERR);
        }
        if !allowed.contains(&f.opcode) || f.payload != payload {
            return Err(Fail::Proto(format!(
                "{what} {:?}: got {} ({}) {:?}",
                String::from_utf8_lossy(payload),
                op_name(f.opcode),
                f.opcode,
                String::from_utf8_lossy(&f.payload)
            )));
        }
        self.b.replied(sent);
        Ok(f.opcode)
    }

    fn acquire(&mut self) -> Res<()> {
        let name = self.b.pick("lk:");
        let payload = payload_of(&name);
        let sent = Instant::now();
        self.send(op::ACQ, &payload)?;
        if self.expect("ACQ", &payload, &[op::ACQUIRED, op::ACK])? == op::ACQUIRED {
            return self.hold(name, "ACQ", sent);
        }
        self.b.ctx.report.count(&self.b.ctx.report.c.lockd_waited);
        // Queued. Wait a while, pinging (the connection keeps working); some give up soon, so
        // that closing while queued (or just granted) happens often.
        let patience = if self.b.rng.chance(30) {
            Duration::from_millis(self.b.rng.range(5, 200))
        } else {
            Duration::from_millis(self.b.rng.range(200, 2000))
        };
        let give_up = Instant::now() + patience;
        loop {
            let next_ping =
                (Instant::now() + Duration::from_millis(self.b.rng.range(30, 150))).min(give_up);
            match self.recv(next_ping) {
                Ok(f) if f.opcode == op::ACQUIRED && f.payload == payload => break,
                Ok(f) => {
                    return Err(Fail::Proto(format!(
                        "waiting for {name:?}: got {} {:?}",
                        op_name(f.opcode),
                        String::from_utf8_lossy(&f.payload)
                    )))
                }
                Err(Fail::Timeout) if Instant::now() >= give_up || !self.b.ctx.running() => {
                    // Gives up by closing: the server drops the queued ACQ, or, if it granted
                    // it just now, makes an orphan the soak never saw (harmless to the rules).
                    self.b.ctx.report.count(&self.b.ctx.report.c.gave_up);
                    self.b.what = "ACQ queued, gave up";
                    self.leave();
                    return Ok(());
                }
                Err(Fail::Timeout) => {
                    self.serial += 1;
                    let p = format!("wait {} {}", self.b.id, self.serial).into_bytes();
                    self.send(op::PING, &p)?;
                    self.pongs.push_back((p, self.last_send));
                }
                Err(e) => return Err(e),
            }
        }
        self.hold(name, "ACQ after ACK", sent)
    }

    /// The server granted `name` (requested at `sent`): mark it, now and then check its
    /// fencing token (REQ_TOKEN), hold it a little, then REL it or leave an orphan.
    fn hold(&mut self, name: String, how: &str, sent: Instant) -> Res<()> {
        let read = Instant::now();
        self.b.ctx.report.count(&self.b.ctx.report.c.lockd_grants);
        let owner = self.b.owner();
        let via = format!("{how} via node {}", self.b.node + 1);
        self.b
            .ctx
            .model
            .granted(Proto::Lockd, &name, owner, &via, None, self.b.alive());
        self.held = Some(name.clone());
        self.drain_pongs()?;
        if self.b.rng.chance(30) {
            self.check_token(&name, how, sent, read)?;
        }
        self.b.pause(15);
        if self.b.rng.chance(20) {
            self.ping()?;
        }
        if self.b.rng.chance(80) {
            self.release()
        } else {
            self.b.what = "holding (orphan)";
            self.leave();
            Ok(())
        }
    }

    /// REQ_TOKEN of the held `name`: ACK with `name NUL token`; the token goes to rule 11.
    fn check_token(&mut self, name: &str, how: &str, sent: Instant, read: Instant) -> Res<()> {
        let payload = payload_of(name);
        self.send(op::REQ_TOKEN, &payload)?;
        let req_sent = self.last_send;
        let f = self.recv(Instant::now() + REPLY_DEADLINE)?;
        if f.opcode == op::ERR && f.payload == payload && self.b.cluster() {
            return Err(Fail::NoQuorum(format!("REQ_TOKEN {name:?}")));
        }
        let token = match f.payload.strip_prefix(payload.as_slice()) {
            Some(t) if f.opcode == op::ACK && t.len() == 8 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(t);
                u64::from_be_bytes(b)
            }
            _ => {
                return Err(Fail::Proto(format!(
                    "REQ_TOKEN {name:?} of a held lock: got {} {:?}",
                    op_name(f.opcode),
                    String::from_utf8_lossy(&f.payload)
                )))
            }
        };
        self.b.replied(req_sent);
        let owner = self.b.owner();
        self.b
            .ctx
            .model
            .token(Proto::Lockd, name, owner, how, token, sent, read);
        Ok(())
    }

    fn drain_pongs(&mut self) -> Res<()> {
        while let Some((expected, sent)) = self.pongs.pop_front() {
            let f = self
                .b
                .conn()?
                .recv(Instant::now() + REPLY_DEADLINE, parse)?;
            self.b.ctx.report.op();
            if f.opcode == op::ERR && f.payload == expected && self.b.cluster() {
                return Err(Fail::NoQuorum("PING".into()));
            }
            self.b.replied(sent);
            if f.opcode != op::PONG || f.payload != expected {
                return Err(Fail::Proto(format!(
                    "expected PONG {:?}, got {} {:?}",
                    String::from_utf8_lossy(&expected),
                    op_name(f.opcode),
                    String::from_utf8_lossy(&f.payload)
                )));
            }
        }
        Ok(())
    }

    fn release(&mut self) -> Res<()> {
        let Some(name) = self.held.take() else {
            return Ok(());
        };
        self.b
            .ctx
            .model
            .releasing(Proto::Lockd, &name, self.b.owner());
        let payload = payload_of(&name);
        self.send(op::REL, &payload)?;
        self.expect("REL", &payload, &[op::RELEASED])?;
        Ok(())
    }

    fn try_lock(&mut self) -> Res<()> {
        let name = self.b.pick("lk:");
        let payload = payload_of(&name);
        let sent = Instant::now();
        self.send(op::TRY, &payload)?;
        if self.expect("TRY", &payload, &[op::ACQUIRED, op::WBLOCK])? == op::ACQUIRED {
            return self.hold(name, "TRY", sent);
        }
        Ok(())
    }

    /// ADOPT a name that is probably an orphan (or, now and then, any name).
    fn adopt(&mut self) -> Res<()> {
        let candidates = self.b.ctx.model.orphan_candidates();
        let name = if !candidates.is_empty() && self.b.rng.chance(80) {
            candidates[self.b.rng.below(candidates.len() as u64) as usize].clone()
        } else {
            self.b.pick("lk:")
        };
        let payload = payload_of(&name);
        let sent = Instant::now();
        self.send(op::ADOPT, &payload)?;
        if self.expect("ADOPT", &payload, &[op::ACK, op::ERR])? == op::ERR {
            return Ok(());
        }
        let read = Instant::now();
        self.b
            .ctx
            .report
            .count(&self.b.ctx.report.c.lockd_adoptions);
        let alive = self.b.alive();
        self.b.ctx.model.adopted(&name, self.b.owner(), alive);
        self.held = Some(name.clone());
        if self.b.rng.chance(30) {
            self.check_token(&name, "ADOPT", sent, read)?;
        }
        self.b.pause(15);
        if self.b.rng.chance(80) {
            self.release()
        } else {
            self.b.what = "holding adopted (orphan)";
            self.leave();
            Ok(())
        }
    }

    fn ping(&mut self) -> Res<()> {
        let len = self.b.rng.below(48) as usize;
        let p: Vec<u8> = (0..len).map(|_| self.b.rng.next() as u8).collect();
        self.send(op::PING, &p)?;
        self.expect("PING", &p, &[op::PONG])?;
        Ok(())
    }

    /// SYNC lists every locked name: each name held (by a connected client) from before the
    /// request until after the reply must be in it.
    fn sync(&mut self) -> Res<()> {
        let before = self.b.ctx.model.held_snapshot(Proto::Lockd);
        self.send(op::SYNC, &[])?;
        let sent = self.last_send;
        let f = self.recv(Instant::now() + REPLY_DEADLINE)?;
        if f.opcode == op::ERR && f.payload.is_empty() && self.b.cluster() {
            return Err(Fail::NoQuorum("SYNC".into()));
        }
        self.b.replied(sent);
        if f.opcode != op::SYNC_REPLY {
            return Err(Fail::Proto(format!("SYNC: got {}", op_name(f.opcode))));
        }
        self.b.ctx.report.count(&self.b.ctx.report.c.lockd_syncs);
        let names: Vec<&[u8]> = f.payload.split(|&b| b == 0).collect();
        for (name, epoch) in before {
            let still = self.b.ctx.model.held_epoch(Proto::Lockd, &name) == Some(epoch);
            if still && !names.contains(&name.as_bytes()) {
                self.b.ctx.report.error(format!(
                    "lockd SYNC does not list {name:?}, held throughout the request"
                ));
            }
        }
        Ok(())
    }

    /// A frame of version 2: ERR with an empty payload, then the server closes. Only while
    /// holding nothing.
    fn hostile(&mut self) -> Res<()> {
        self.b.ctx.report.count(&self.b.ctx.report.c.hostile);
        let payload = payload_of(&self.b.pick("lk:"));
        let mut req = Vec::new();
        wire::encode(&mut req, op::ACQ, &payload);
        req[0] = (req[0] & 0x0f) | 0x20;
        // The server refuses the version at the first byte and closes: the rest of the frame
        // may meet a closed socket (EPIPE), which is fine.
        let _ = self.b.conn()?.send(&req);
        let f = self.recv(Instant::now() + REPLY_DEADLINE)?;
        if f.opcode != op::ERR || !f.payload.is_empty() {
            return Err(Fail::Proto(format!(
                "version 2 frame: got {} {:?}",
                op_name(f.opcode),
                f.payload
            )));
        }
        self.b
            .conn()?
            .wait_closed(Instant::now() + REPLY_DEADLINE)?;
        self.b.closed_by_server();
        Ok(())
    }
}
