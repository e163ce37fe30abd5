//! dlock clients: multi-key Lock (waiting forever, with a deadline, or trying once; some as
//! leases), Unlock, Ping, disconnects while holding or waiting, letting the idle timeout close
//! the connection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use holdfast::proto::dlock::{self as wire, req_type, status, LockFields};

use crate::client::{Base, Ctx};
use crate::model::{Bound, Proto, IDLE};
use crate::net::{Fail, Res, REPLY_DEADLINE};

/// Largest response frame accepted.
const MAX_RESPONSE: usize = 1 << 20;

pub struct DlockClient {
    b: Base,
    next_id: u64,
    /// When the last request of this connection was sent (the server's idle clock restarts
    /// when it receives a request, so at this instant or later).
    last_send: Instant,
    /// Connection-bound keys this connection holds (the idle timeout may release them).
    held: Vec<String>,
}

pub fn run(ctx: Arc<Ctx>, id: u32, seed: u64) {
    let addr = ctx.dlock.clone();
    let mut c = DlockClient {
        b: Base::new(ctx.clone(), id, seed, addr),
        next_id: 1,
        last_send: Instant::now(),
        held: Vec::new(),
    };
    while ctx.running() {
        if let Err(f) = c.step() {
            let what = c.b.what;
            c.failed(what, f);
        }
        c.b.pause(3);
    }
    if !c.held.is_empty() {
        if let Err(f) = c.unlock_held() {
            c.failed("final Unlock", f);
        }
    }
    c.b.finish();
}

impl DlockClient {
    fn failed(&mut self, what: &str, f: Fail) {
        let owner = self.b.owner();
        let idle = self.b.ctx.idle_timeout;
        let silent = self.last_send.elapsed();
        if self.b.cluster() && matches!(f, Fail::Closed(_) | Fail::NoQuorum(_)) {
            // Rule 9: the close releases the connection-bound keys later; the marks go now.
            for k in std::mem::take(&mut self.held) {
                self.b.ctx.model.releasing(Proto::Dlock, &k, owner);
            }
            self.b.cluster_outcome(&f);
            return;
        }
        if matches!(f, Fail::Closed(_)) && !idle.is_zero() && silent + self.b.ctx.tolerance >= idle
        {
            // This thread was not scheduled for an idle timeout (the machine is overloaded):
            // the server was right to close. The marks were bounded by the idle clock.
            eprintln!(
                "soak: note: dlock client {} conn {owner:?} silent {} ms, closed by the idle timeout",
                self.b.id,
                silent.as_millis()
            );
            self.b.ctx.report.count(&self.b.ctx.report.c.dlock_idle);
        } else {
            self.b.ctx.report.error(format!(
                "dlock client {} conn {} (node {}): {what}: {f}",
                self.b.id,
                owner.conn,
                self.b.node + 1
            ));
        }
        for k in std::mem::take(&mut self.held) {
            self.b.ctx.model.releasing(Proto::Dlock, &k, owner);
        }
        self.b.disconnect();
    }

    fn step(&mut self) -> Res<()> {
        let (what, r): (_, fn(&mut Self) -> Res<()>) = match self.b.rng.below(1000) {
            0..=549 => ("Lock", Self::lock),
            550..=899 => ("Ping", Self::ping),
            900..=949 => ("Unlock not held", Self::unlock_not_held),
            950..=994 => ("reconnect", |c| {
                c.b.disconnect();
                Ok(())
            }),
            _ => ("hostile", Self::hostile),
        };
        self.b.step(what);
        r(self)
    }

    fn request(&mut self, ty: u64, lock: Option<LockFields<'_>>) -> Res<u64> {
        let id = self.next_id;
        self.next_id += 1;
        let mut req = Vec::new();
        wire::encode_request(&mut req, Some(id), None, ty, lock);
        self.b.send(&req)?;
        self.last_send = Instant::now();
        // Every request restarts the idle clock of the locks this connection holds.
        if !self.b.ctx.idle_timeout.is_zero() {
            let bound = self.idle_bound();
            let owner = self.b.owner();
            for k in &self.held {
                self.b.ctx.model.rebound(Proto::Dlock, k, owner, bound);
            }
        }
        Ok(id)
    }

    fn idle_bound(&self) -> Bound {
        Bound {
            at: self.last_send + self.b.ctx.idle_timeout,
            why: IDLE,
        }
    }

    fn response(&mut self, id: u64, deadline: Instant) -> Res<wire::Response> {
        let r =
            self.b
                .conn()?
                .recv(deadline, |buf| match wire::parse_frame(buf, MAX_RESPONSE) {
                    Ok((body, used)) => wire::decode_response(body)
                        .map(|r| Some((r, used)))
                        .map_err(|e| format!("bad dlock response: {e}")),
                    Err(wire::FrameError::Incomplete) => Ok(None),
                    Err(wire::FrameError::TooLarge) => Err("dlock response over 1 MiB".into()),
                })?;
        self.b.ctx.report.op();
        if r.version != Some(2) || r.request_id != Some(id) {
            return Err(Fail::Proto(format!(
                "response version {:?} request_id {:?} to request {id}",
                r.version, r.request_id
            )));
        }
        if self.b.cluster()
            && r.status == Some(status::GENERAL)
            && r.error_text.as_deref() == Some(b"no quorum".as_slice())
        {
            return Err(Fail::NoQuorum(format!("request {id}")));
        }
        // One request at a time: this is the reply to the latest one.
        self.b.replied(self.last_send);
        Ok(r)
    }

    fn lock(&mut self) -> Res<()> {
        let n = match self.b.rng.below(10) {
            0..=5 => 1,
            6..=8 => 2,
            _ => 3,
        }
        .min(self.b.ctx.names); // `--names 2` must not look for a third distinct key forever
        let mut keys: Vec<String> = Vec::new();
        while keys.len() < n {
            let k = self.b.pick("dk:");
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        let wait = match self.b.rng.below(100) {
            0..=24 => None,
            25..=44 => Some(Duration::ZERO),
            _ => Some(Duration::from_millis(self.b.rng.range(1, 400))),
        };
        let lease = if self.b.rng.chance(25) {
            Some(Duration::from_millis(self.b.rng.range(50, 500)))
        } else {
            None
        };
        let key_refs: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        let fields = LockFields {
            wait_micro: wait.map(|w| w.as_micros() as u64),
            release_micro: lease.map(|l| l.as_micros() as u64),
            keys: &key_refs,
            native: Default::default(),
        };
        let sent = Instant::now();
        let id = self.request(req_type::LOCK, Some(fields))?;
        let owner = self.b.owner();
        for k in &keys {
            self.b.ctx.model.note(
                Proto::Dlock,
                k,
                owner,
                format!(
                    "Lock {keys:?} sent, wait {:?} ms, lease {:?} ms",
                    wait.map(|w| w.as_millis()),
                    lease.map(|l| l.as_millis())
                ),
            );
        }
        let deadline = match wait {
            // Waiting forever: the client gives up by closing (while queued, or as it is
            // granted: a grant the soak does not see is released by the close, or is a lease
            // that runs out; `give_up` corrects the marks of keys it held already, whose
            // records such a grant replaced).
            None if self.b.rng.chance(20) => sent + Duration::from_millis(self.b.rng.range(5, 100)),
            None => sent + Duration::from_millis(self.b.rng.range(200, 2500)),
            Some(w) => sent + w + REPLY_DEADLINE,
        };
        let r = match self.response(id, deadline) {
            Err(Fail::Timeout) if wait.is_none() => {
                self.b.ctx.report.count(&self.b.ctx.report.c.gave_up);
                self.b.what = "Lock waiting, gave up";
                self.held.clear();
                self.give_up(&keys, lease.map(|l| sent + l));
                self.b.disconnect();
                return Ok(());
            }
            other => other?,
        };
        match r.status {
            Some(status::OK) => {}
            Some(status::ACQUIRE_TIMEOUT) => {
                let Some(w) = wait else {
                    return Err(Fail::Proto("AcquireTimeout for a Lock without wait".into()));
                };
                let took = sent.elapsed();
                if took + self.b.ctx.tolerance < w {
                    return Err(Fail::Proto(format!(
                        "AcquireTimeout after {} ms for a wait of {} ms",
                        took.as_millis(),
                        w.as_millis()
                    )));
                }
                let busy_ok =
                    !r.keys.is_empty() && r.keys.iter().all(|k| key_refs.contains(&k.as_slice()));
                if !busy_ok {
                    return Err(Fail::Proto(format!(
                        "AcquireTimeout busy keys {:?} for {keys:?}",
                        r.keys
                    )));
                }
                self.b.ctx.report.count(&self.b.ctx.report.c.dlock_timeouts);
                return Ok(());
            }
            s => {
                return Err(Fail::Proto(format!(
                    "Lock {keys:?}: status {s:?} {:?}",
                    r.error_text
                        .map(|t| String::from_utf8_lossy(&t).into_owned())
                )))
            }
        }
        self.b.ctx.report.count(&self.b.ctx.report.c.dlock_grants);
        let owner = self.b.owner();
        let read = Instant::now();
        let alive = self.b.alive();
        // Rule 11: one token covers every key of the Lock.
        match r.fence {
            Some(t) => {
                for k in &keys {
                    self.b
                        .ctx
                        .model
                        .token(Proto::Dlock, k, owner, "Lock", t, sent, read);
                }
            }
            None => return Err(Fail::Proto(format!("Ok Lock {keys:?} without a fence"))),
        }
        match lease {
            Some(l) => {
                // Counted from the grant, which is after `sent`.
                let bound = Bound {
                    at: sent + l,
                    why: "lease",
                };
                for k in &keys {
                    self.b.ctx.model.granted(
                        Proto::Dlock,
                        k,
                        owner,
                        &format!("Lock with lease via node {}", self.b.node + 1),
                        Some(bound),
                        alive.clone(),
                    );
                }
                self.b.ctx.report.count(&self.b.ctx.report.c.dlock_leases);
                self.lease_end(keys, sent + l)
            }
            None => {
                let bound = (!self.b.ctx.idle_timeout.is_zero()).then(|| self.idle_bound());
                for k in &keys {
                    self.b.ctx.model.granted(
                        Proto::Dlock,
                        k,
                        owner,
                        &format!("Lock via node {}", self.b.node + 1),
                        bound,
                        alive.clone(),
                    );
                }
                self.held = keys;
                self.bound_end()
            }
        }
    }

    /// The waiting Lock of `keys` is given up by closing the connection: it may have been
    /// granted just before the close, replacing the records of keys this connection already
    /// held as leases (`Model::dlock_relock_given_up`). `lease_end`: send time + the Lock's lease.
    fn give_up(&mut self, keys: &[String], lease_end: Option<Instant>) {
        let owner = self.b.owner();
        let model = &self.b.ctx.model;
        let mut over_lease = false;
        for k in keys {
            model.note(Proto::Dlock, k, owner, "gave up waiting, closing".into());
            over_lease |= model.dlock_relock_given_up(k, owner, lease_end);
        }
        if over_lease {
            self.b
                .ctx
                .report
                .count(&self.b.ctx.report.c.dlock_gave_up_over_lease);
        }
    }

    /// Connection-bound keys: hold a little, then Unlock, close, or go silent until the idle
    /// timeout closes the connection.
    fn bound_end(&mut self) -> Res<()> {
        self.b.pause(15);
        if self.b.rng.chance(20) {
            self.ping()?;
        }
        let r = self.b.rng.below(1000);
        if r < 850 {
            self.unlock_held()
        } else if r < 995 || self.b.ctx.idle_timeout.is_zero() {
            let owner = self.b.owner();
            for k in std::mem::take(&mut self.held) {
                self.b.ctx.model.releasing(Proto::Dlock, &k, owner);
            }
            self.b.what = "holding";
            self.b.disconnect();
            Ok(())
        } else {
            self.go_idle()
        }
    }

    fn unlock_held(&mut self) -> Res<()> {
        let owner = self.b.owner();
        let keys = std::mem::take(&mut self.held);
        for k in &keys {
            self.b.ctx.model.releasing(Proto::Dlock, k, owner);
        }
        let key_refs: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        let id = self.request(
            req_type::UNLOCK,
            Some(LockFields {
                keys: &key_refs,
                ..LockFields::default()
            }),
        )?;
        let r = self.response(id, Instant::now() + REPLY_DEADLINE)?;
        if r.status != Some(status::OK) {
            return Err(Fail::Proto(format!(
                "Unlock {keys:?}: status {:?} keys {:?}",
                r.status, r.keys
            )));
        }
        Ok(())
    }

    /// Send nothing: the server must close the connection once the idle timeout has passed
    /// since the last request, not before, releasing the keys.
    fn go_idle(&mut self) -> Res<()> {
        let owner = self.b.owner();
        let bound = self.idle_bound();
        for k in std::mem::take(&mut self.held) {
            self.b.ctx.model.leaving(Proto::Dlock, &k, owner, bound);
        }
        let idle = self.b.ctx.idle_timeout;
        let conn = self.b.conn()?;
        conn.wait_closed(self.last_send + idle + REPLY_DEADLINE)
            .map_err(|_| {
                Fail::Proto(format!(
                    "still open {} ms after the last request (idle timeout {} ms)",
                    (idle + REPLY_DEADLINE).as_millis(),
                    idle.as_millis()
                ))
            })?;
        let silent = self.last_send.elapsed();
        self.b.closed_by_server();
        if silent + self.b.ctx.tolerance < idle && self.b.cluster() {
            // Rule 9: closed by the node (killed, fenced, its sessions expired), not idle.
            self.b.ctx.report.count(&self.b.ctx.report.c.closed_by_node);
            return Ok(());
        }
        if silent + self.b.ctx.tolerance < idle {
            return Err(Fail::Proto(format!(
                "idle-disconnected after {} ms of silence (timeout {} ms)",
                silent.as_millis(),
                idle.as_millis()
            )));
        }
        self.b.ctx.report.count(&self.b.ctx.report.c.dlock_idle);
        Ok(())
    }

    /// A lease: Unlock it early, let it run out (on this connection or after closing it).
    fn lease_end(&mut self, keys: Vec<String>, ends: Instant) -> Res<()> {
        self.b.pause(15);
        let r = self.b.rng.below(100);
        if r < 40 && Instant::now() + Duration::from_millis(20) < ends {
            let owner = self.b.owner();
            for k in &keys {
                self.b.ctx.model.releasing(Proto::Dlock, k, owner);
            }
            let key_refs: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
            let id = self.request(
                req_type::UNLOCK,
                Some(LockFields {
                    keys: &key_refs,
                    ..LockFields::default()
                }),
            )?;
            let r = self.response(id, Instant::now() + REPLY_DEADLINE)?;
            let late = Instant::now() + self.b.ctx.tolerance >= ends;
            let ok = r.status == Some(status::OK) || (late && r.status == Some(status::GENERAL));
            if !ok {
                return Err(Fail::Proto(format!(
                    "Unlock of lease {keys:?}: status {:?} keys {:?}",
                    r.status, r.keys
                )));
            }
            return Ok(());
        }
        // Let it run out: the mark's bound already says when the server may release it.
        self.b.ctx.report.count(&self.b.ctx.report.c.dlock_lapses);
        if r >= 90 {
            self.b.what = "holding a lease";
            self.b.disconnect();
        }
        Ok(())
    }

    fn ping(&mut self) -> Res<()> {
        let id = self.request(req_type::PING, None)?;
        let r = self.response(id, Instant::now() + REPLY_DEADLINE)?;
        if r.status != Some(status::OK) {
            return Err(Fail::Proto(format!("Ping: status {:?}", r.status)));
        }
        Ok(())
    }

    /// Unlock of a key nobody locks: General, naming the key.
    fn unlock_not_held(&mut self) -> Res<()> {
        let keys: [&[u8]; 1] = [b"dk:none"];
        let id = self.request(
            req_type::UNLOCK,
            Some(LockFields {
                keys: &keys,
                ..LockFields::default()
            }),
        )?;
        let r = self.response(id, Instant::now() + REPLY_DEADLINE)?;
        if r.status != Some(status::GENERAL) || r.keys != [b"dk:none".to_vec()] {
            return Err(Fail::Proto(format!(
                "Unlock of a key not held: status {:?} keys {:?}",
                r.status, r.keys
            )));
        }
        Ok(())
    }

    /// A complete frame that is not protobuf: General, then the server closes.
    fn hostile(&mut self) -> Res<()> {
        self.b.ctx.report.count(&self.b.ctx.report.c.hostile);
        // Field 1 with wire type 7 (undefined): invalid.
        let req = [0, 0, 0, 2, 0x0f, 0x00];
        self.b.conn()?.send(&req)?;
        self.last_send = Instant::now();
        let conn = self.b.conn()?;
        conn.wait_closed(Instant::now() + REPLY_DEADLINE)?;
        self.b.ctx.report.op();
        self.b.closed_by_server();
        Ok(())
    }
}
