//! memcached clients: set, get, touch, delete, and yrmcds locks over text and binary (mixed on
//! one connection), with a data check while the lock is held.

use std::sync::Arc;
use std::time::Instant;

use crate::client::{Base, Ctx};
use crate::model::Proto;
use crate::net::{Fail, Res, REPLY_DEADLINE};

mod op {
    pub const GET: u8 = 0x00;
    pub const SET: u8 = 0x01;
    pub const DELETE: u8 = 0x04;
    pub const NOOP: u8 = 0x0a;
    pub const LOCK: u8 = 0x40;
    pub const UNLOCK: u8 = 0x42;
    pub const UNLOCK_Q: u8 = 0x43;
    pub const UNLOCK_ALL: u8 = 0x44;
    pub const LAG: u8 = 0x46;
    pub const RAU: u8 = 0x4a;
}

const ST_OK: u16 = 0;
const ST_NOT_FOUND: u16 = 1;
const ST_LOCKED: u16 = 0x10;
/// Cluster mode: the no-quorum status (temporary failure).
const ST_NO_QUORUM: u16 = 0x0086;
/// Cluster mode: the no-quorum answer in the text protocol.
const NO_QUORUM_LINE: &str = "SERVER_ERROR no quorum";

struct BinReply {
    opcode: u8,
    status: u16,
    opaque: u32,
    /// A successful Lock's (0x40) fencing token.
    cas: u64,
    value: Vec<u8>,
}

fn bin_request(opcode: u8, opaque: u32, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
    let body = extras.len() + key.len() + value.len();
    let mut v = Vec::with_capacity(24 + body);
    v.extend_from_slice(&[0x80, opcode]);
    v.extend_from_slice(&(key.len() as u16).to_be_bytes());
    v.extend_from_slice(&[extras.len() as u8, 0, 0, 0]);
    v.extend_from_slice(&(body as u32).to_be_bytes());
    v.extend_from_slice(&opaque.to_be_bytes());
    v.extend_from_slice(&[0; 8]);
    v.extend_from_slice(extras);
    v.extend_from_slice(key);
    v.extend_from_slice(value);
    v
}

fn parse_bin(buf: &[u8]) -> Result<Option<(BinReply, usize)>, String> {
    if buf.len() < 24 {
        return Ok(None);
    }
    if buf[0] != 0x81 {
        return Err(format!(
            "binary reply with magic {:#04x}: {:?}",
            buf[0],
            String::from_utf8_lossy(&buf[..buf.len().min(60)])
        ));
    }
    let keylen = usize::from(u16::from_be_bytes([buf[2], buf[3]]));
    let extlen = usize::from(buf[4]);
    let status = u16::from_be_bytes([buf[6], buf[7]]);
    let body = u32::from_be_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize;
    let opaque = u32::from_be_bytes([buf[12], buf[13], buf[14], buf[15]]);
    let mut cas = [0u8; 8];
    cas.copy_from_slice(&buf[16..24]);
    if extlen + keylen > body {
        return Err(format!(
            "binary reply: extras {extlen} + key {keylen} > body {body}"
        ));
    }
    if buf.len() < 24 + body {
        return Ok(None);
    }
    Ok(Some((
        BinReply {
            opcode: buf[1],
            status,
            opaque,
            cas: u64::from_be_bytes(cas),
            value: buf[24 + extlen + keylen..24 + body].to_vec(),
        },
        24 + body,
    )))
}

fn parse_line(buf: &[u8]) -> Result<Option<(String, usize)>, String> {
    match buf.windows(2).position(|w| w == b"\r\n") {
        Some(i) => Ok(Some((
            String::from_utf8_lossy(&buf[..i]).into_owned(),
            i + 2,
        ))),
        None if buf.len() > 4096 => Err("text reply line over 4 KiB".into()),
        None => Ok(None),
    }
}

/// What a parser found: `None` until a whole reply is there, then the reply and its length.
type Parsed<T> = Result<Option<(T, usize)>, String>;

/// A text `get` reply for one key: `Some(value)` or `None` for a miss.
fn parse_get(buf: &[u8], key: &str) -> Parsed<Option<Vec<u8>>> {
    let Some((line, n)) = parse_line(buf)? else {
        return Ok(None);
    };
    if line == "END" {
        return Ok(Some((None, n)));
    }
    if line == NO_QUORUM_LINE {
        return Err(NO_QUORUM_LINE.into());
    }
    let words: Vec<&str> = line.split(' ').collect();
    let len: usize = match words.as_slice() {
        ["VALUE", k, _flags, len] if *k == key => len.parse().map_err(|_| line.clone())?,
        _ => return Err(format!("get {key}: unexpected {line:?}")),
    };
    let total = n + len + 2 + 5;
    if buf.len() < total {
        return Ok(None);
    }
    if &buf[n + len..total] != b"\r\nEND\r\n" {
        return Err(format!("get {key}: value not followed by END"));
    }
    Ok(Some((Some(buf[n..n + len].to_vec()), total)))
}

enum LockResult {
    Got,
    Locked,
    Missing,
}

pub struct McClient {
    b: Base,
    /// Keys this connection holds.
    held: Vec<String>,
    opaque: u32,
    serial: u64,
}

pub fn run(ctx: Arc<Ctx>, id: u32, seed: u64) {
    let addr = ctx.memcache.clone();
    let mut c = McClient {
        b: Base::new(ctx.clone(), id, seed, addr),
        held: Vec::new(),
        opaque: 0,
        serial: 0,
    };
    while ctx.running() {
        if let Err(f) = c.step() {
            let what = c.b.what;
            c.failed(what, f);
        }
        c.b.pause(3);
    }
    if !c.held.is_empty() {
        if let Err(f) = c.unlock_all() {
            c.failed("final unlock_all", f);
        }
    }
    c.b.finish();
}

impl McClient {
    fn failed(&mut self, what: &str, f: Fail) {
        let owner = self.b.owner();
        // Rule 9: the close releases the locks, later; the marks go now.
        for k in std::mem::take(&mut self.held) {
            self.b.ctx.model.releasing(Proto::Mc, &k, owner);
        }
        if self.b.cluster_outcome(&f) {
            return;
        }
        self.b.ctx.report.error(format!(
            "memcache client {} conn {} (node {}): {what}: {f}",
            self.b.id,
            owner.conn,
            self.b.node + 1
        ));
        self.b.disconnect();
    }

    fn step(&mut self) -> Res<()> {
        let (what, r): (_, fn(&mut Self) -> Res<()>) = match self.b.rng.below(1000) {
            0..=399 => ("lock cycle", Self::lock_cycle),
            400..=649 => ("set", Self::other_set),
            650..=779 => ("get", Self::get_any),
            780..=809 => ("touch", Self::touch_any),
            810..=839 => ("delete", Self::delete_any),
            840..=989 => ("ping", Self::ping),
            990..=997 => ("reconnect", |c| {
                c.b.disconnect();
                Ok(())
            }),
            _ => ("hostile", Self::hostile),
        };
        self.b.step(what);
        r(self)
    }

    fn text(&mut self, req: &[u8]) -> Res<String> {
        let sent = Instant::now();
        self.b.send(req)?;
        let line = self
            .b
            .conn()?
            .recv(Instant::now() + REPLY_DEADLINE, parse_line)?;
        self.b.ctx.report.op();
        if line == NO_QUORUM_LINE && self.b.cluster() {
            return Err(Fail::NoQuorum(format!(
                "{:?}",
                String::from_utf8_lossy(&req[..req.len().min(40)])
            )));
        }
        self.b.replied(sent);
        Ok(line)
    }

    fn bin(&mut self, opcode: u8, extras: &[u8], key: &[u8], value: &[u8]) -> Res<BinReply> {
        self.opaque = self.opaque.wrapping_add(1);
        let opaque = self.opaque;
        let sent = Instant::now();
        self.b
            .send(&bin_request(opcode, opaque, extras, key, value))?;
        let r = self
            .b
            .conn()?
            .recv(Instant::now() + REPLY_DEADLINE, parse_bin)?;
        self.b.ctx.report.op();
        if r.status == ST_NO_QUORUM && self.b.cluster() {
            // This request's answer, or that of a quiet one pipelined before it (UnlockQ).
            return Err(Fail::NoQuorum(format!(
                "binary opcode {:#04x} opaque {}",
                r.opcode, r.opaque
            )));
        }
        self.b.replied(sent);
        if r.opaque != opaque || r.opcode != opcode {
            return Err(Fail::Proto(format!(
                "binary reply opcode {:#04x} opaque {} status {:#06x} to request {opcode:#04x} \
                 opaque {opaque}",
                r.opcode, r.opaque, r.status
            )));
        }
        Ok(r)
    }

    fn value(&mut self) -> Vec<u8> {
        self.serial += 1;
        let mut v = format!("c{}-{}-", self.b.id, self.serial).into_bytes();
        // Mostly small, now and then a few KiB.
        let pad = if self.b.rng.chance(5) {
            self.b.rng.below(8192)
        } else {
            self.b.rng.below(32)
        };
        v.extend((0..pad).map(|i| b'a' + (i % 26) as u8));
        v
    }

    /// Store `value` under `key` (text or binary set): true if STORED, false if LOCKED.
    fn set(&mut self, key: &str, value: &[u8]) -> Res<bool> {
        if self.b.rng.chance(50) {
            let mut req = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
            req.extend_from_slice(value);
            req.extend_from_slice(b"\r\n");
            match self.text(&req)?.as_str() {
                "STORED" => Ok(true),
                "LOCKED" => Ok(false),
                other => Err(Fail::Proto(format!("set {key}: {other:?}"))),
            }
        } else {
            let r = self.bin(op::SET, &[0; 8], key.as_bytes(), value)?;
            match r.status {
                ST_OK => Ok(true),
                ST_LOCKED => Ok(false),
                s => Err(Fail::Proto(format!("binary set {key}: status {s:#06x}"))),
            }
        }
    }

    fn get(&mut self, key: &str) -> Res<Option<Vec<u8>>> {
        if self.b.rng.chance(50) {
            let req = format!("get {key}\r\n");
            let sent = Instant::now();
            self.b.send(req.as_bytes())?;
            let key = key.to_string();
            let v = self
                .b
                .conn()?
                .recv(Instant::now() + REPLY_DEADLINE, |b| parse_get(b, &key))
                .map_err(|f| match f {
                    Fail::Proto(e) if e == NO_QUORUM_LINE => Fail::NoQuorum(format!("get {key}")),
                    f => f,
                })?;
            self.b.ctx.report.op();
            self.b.replied(sent);
            Ok(v)
        } else {
            let r = self.bin(op::GET, &[], key.as_bytes(), &[])?;
            match r.status {
                ST_OK => Ok(Some(r.value)),
                ST_NOT_FOUND => Ok(None),
                s => Err(Fail::Proto(format!("binary get {key}: status {s:#06x}"))),
            }
        }
    }

    /// Try to lock `key`: the result, how, and the grant's fencing token when the reply
    /// carries it (binary Lock's CAS).
    fn try_lock(&mut self, key: &str) -> Res<(LockResult, &'static str, Option<u64>)> {
        let how = self.b.rng.below(3);
        if how == 0 {
            let r = match self.text(format!("lock {key}\r\n").as_bytes())?.as_str() {
                "OK" => LockResult::Got,
                "LOCKED" => LockResult::Locked,
                "NOT_FOUND" => LockResult::Missing,
                other => return Err(Fail::Proto(format!("lock {key}: {other:?}"))),
            };
            return Ok((r, "text lock", None));
        }
        let (opcode, name) = if how == 1 {
            (op::LOCK, "binary Lock")
        } else {
            (op::LAG, "binary LaG")
        };
        let r = self.bin(opcode, &[], key.as_bytes(), &[])?;
        let res = match r.status {
            ST_OK => LockResult::Got,
            ST_LOCKED => LockResult::Locked,
            ST_NOT_FOUND => LockResult::Missing,
            s => return Err(Fail::Proto(format!("{name} {key}: status {s:#06x}"))),
        };
        let token = (opcode == op::LOCK && matches!(res, LockResult::Got)).then_some(r.cas);
        Ok((res, name, token))
    }

    /// Lock a key, prove the lock holds (the holder's write is the value read back), hold it a
    /// little, then let go in one of the ways the protocol has.
    fn lock_cycle(&mut self) -> Res<()> {
        let key = self.b.pick("mc:");
        if !self.lock_one(&key)? {
            return Ok(());
        }
        let value = self.value();
        if !self.set(&key, &value)? {
            return Err(Fail::Proto(format!(
                "holder's set of locked {key} answered LOCKED"
            )));
        }
        let owner = self.b.owner();
        self.b.ctx.model.note(
            Proto::Mc,
            &key,
            owner,
            format!(
                "holder's set {:?} STORED",
                String::from_utf8_lossy(&value[..value.len().min(12)])
            ),
        );
        match self.get(&key)? {
            Some(v) if v == value => {}
            got if self
                .b
                .ctx
                .model
                .session_end(self.b.alive().as_ref())
                .is_some_and(|end| Instant::now() >= end) =>
            {
                // Rule 10: the session may have ended before this reply; the lock may have
                // gone to someone else. Not a double grant, but the node answered a request of
                // a session it should have fenced first.
                self.b.ctx.report.error(format!(
                    "memcache {key:?}: client {} conn {} (node {}) read {:?} after writing {:?}: \
                     answered after its session may have ended (the node did not close the \
                     connection first); trail:{}",
                    self.b.id,
                    self.b.owner().conn,
                    self.b.node + 1,
                    got.map(|v| String::from_utf8_lossy(&v[..v.len().min(40)]).into_owned()),
                    String::from_utf8_lossy(&value[..value.len().min(40)]),
                    self.b.ctx.model.trail(Proto::Mc, &key)
                ));
            }
            got => {
                self.b.ctx.report.double_grant(format!(
                    "memcache {key:?} locked by client {} conn {} (node {}) changed under it: \
                     wrote {:?}, read {:?}; trail:{}",
                    self.b.id,
                    self.b.owner().conn,
                    self.b.node + 1,
                    String::from_utf8_lossy(&value[..value.len().min(40)]),
                    got.map(|v| String::from_utf8_lossy(&v[..v.len().min(40)]).into_owned()),
                    self.b.ctx.model.trail(Proto::Mc, &key)
                ));
            }
        }
        if self.b.rng.chance(20) {
            let second = self.b.pick("mc:");
            if second != key {
                self.lock_one(&second)?;
            }
        }
        self.b.pause(10);
        if self.b.rng.chance(20) {
            self.ping()?;
        }
        let r = self.b.rng.below(100);
        match r {
            0..=54 => {
                for k in self.let_go() {
                    self.unlock(&k)?;
                }
                Ok(())
            }
            55..=64 => {
                for k in self.let_go() {
                    let v = self.value();
                    let r = self.bin(op::RAU, &[0; 8], k.as_bytes(), &v)?;
                    if r.status != ST_OK {
                        return Err(Fail::Proto(format!("RaU {k}: status {:#06x}", r.status)));
                    }
                }
                Ok(())
            }
            65..=71 => {
                for k in self.let_go() {
                    if self.b.rng.chance(50) {
                        let line = self.text(format!("delete {k}\r\n").as_bytes())?;
                        if line != "DELETED" {
                            return Err(Fail::Proto(format!("holder's delete {k}: {line:?}")));
                        }
                    } else {
                        let r = self.bin(op::DELETE, &[], k.as_bytes(), &[])?;
                        if r.status != ST_OK {
                            return Err(Fail::Proto(format!(
                                "holder's binary delete {k}: status {:#06x}",
                                r.status
                            )));
                        }
                    }
                }
                Ok(())
            }
            72..=86 => self.unlock_all(),
            _ => {
                self.let_go();
                self.b.what = "holding";
                self.b.disconnect();
                Ok(())
            }
        }
    }

    /// Clear the marks of every key this connection holds, before any release is sent (if a
    /// release fails half-way, the connection is closed, which releases the rest).
    fn let_go(&mut self) -> Vec<String> {
        let owner = self.b.owner();
        let keys = std::mem::take(&mut self.held);
        for k in &keys {
            self.b.ctx.model.releasing(Proto::Mc, k, owner);
        }
        keys
    }

    /// Try to lock `key` (creating it if missing); true if this connection holds it now.
    fn lock_one(&mut self, key: &str) -> Res<bool> {
        let sent = Instant::now();
        let (res, how, token) = self.try_lock(key)?;
        match res {
            LockResult::Got => {
                let read = Instant::now();
                self.b.ctx.report.count(&self.b.ctx.report.c.mc_grants);
                let owner = self.b.owner();
                let via = format!("{how} via node {}", self.b.node + 1);
                self.b
                    .ctx
                    .model
                    .granted(Proto::Mc, key, owner, &via, None, self.b.alive());
                self.held.push(key.to_string());
                // The token: binary Lock's CAS, or now and then `lock_token` after a text lock.
                let token = match token {
                    Some(t) => Some(t),
                    None if how == "text lock" && self.b.rng.chance(30) => {
                        let line = self.text(format!("lock_token {key}\r\n").as_bytes())?;
                        match line.strip_prefix("TOKEN ").and_then(|t| t.parse().ok()) {
                            Some(t) => Some(t),
                            None => {
                                return Err(Fail::Proto(format!(
                                    "lock_token {key} of a held lock: {line:?}"
                                )))
                            }
                        }
                    }
                    None => None,
                };
                if let Some(t) = token {
                    self.b
                        .ctx
                        .model
                        .token(Proto::Mc, key, owner, how, t, sent, read);
                }
                Ok(true)
            }
            LockResult::Locked => {
                self.b.ctx.report.count(&self.b.ctx.report.c.mc_conflicts);
                Ok(false)
            }
            LockResult::Missing => {
                let v = self.value();
                self.set(key, &v)?;
                Ok(false)
            }
        }
    }

    /// Unlock `key`, whose mark is already cleared.
    fn unlock(&mut self, key: &str) -> Res<()> {
        match self.b.rng.below(3) {
            0 => {
                let line = self.text(format!("unlock {key}\r\n").as_bytes())?;
                if line != "OK" {
                    return Err(Fail::Proto(format!("unlock {key}: {line:?}")));
                }
            }
            1 => {
                let r = self.bin(op::UNLOCK, &[], key.as_bytes(), &[])?;
                if r.status != ST_OK {
                    return Err(Fail::Proto(format!(
                        "Unlock {key}: status {:#06x}",
                        r.status
                    )));
                }
            }
            _ => {
                // UnlockQ is silent on success: the Noop's answer must come first.
                self.opaque = self.opaque.wrapping_add(1);
                let req = bin_request(op::UNLOCK_Q, self.opaque, &[], key.as_bytes(), &[]);
                self.b.ctx.report.op();
                self.b.send(&req)?;
                let r = self.bin(op::NOOP, &[], &[], &[]);
                match r {
                    Ok(r) if r.status == ST_OK => {}
                    Ok(r) => return Err(Fail::Proto(format!("Noop: status {:#06x}", r.status))),
                    Err(Fail::Proto(e)) => {
                        return Err(Fail::Proto(format!("UnlockQ {key} then Noop: {e}")))
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    fn unlock_all(&mut self) -> Res<()> {
        self.let_go();
        if self.b.rng.chance(50) {
            let line = self.text(b"unlock_all\r\n")?;
            if line != "OK" {
                return Err(Fail::Proto(format!("unlock_all: {line:?}")));
            }
        } else {
            let r = self.bin(op::UNLOCK_ALL, &[], &[], &[])?;
            if r.status != ST_OK {
                return Err(Fail::Proto(format!("UnlockAll: status {:#06x}", r.status)));
            }
        }
        Ok(())
    }

    /// A set by a client that does not hold the lock: LOCKED while someone does. STORED while
    /// another client's lock mark stood the whole time (same epoch before the request and
    /// after the reply) means a locked item was modified by a stranger.
    fn other_set(&mut self) -> Res<()> {
        let key = self.b.pick("mc:");
        let me = self.b.owner();
        let before = self.b.ctx.model.held_by_other(Proto::Mc, &key, me);
        let value = self.value();
        let stored = self.set(&key, &value)?;
        let after = self.b.ctx.model.held_by_other(Proto::Mc, &key, me);
        if stored {
            self.b.ctx.model.note(
                Proto::Mc,
                &key,
                me,
                format!(
                    "non-holder's set {:?} STORED via node {}",
                    String::from_utf8_lossy(&value[..value.len().min(12)]),
                    self.b.node + 1
                ),
            );
            if let (Some((e1, holder)), Some((e2, _))) = (before, after) {
                if e1 == e2 {
                    self.b.ctx.report.double_grant(format!(
                        "memcache {key:?}: set by client {} STORED while client {} conn {} held \
                         the lock throughout",
                        self.b.id, holder.client, holder.conn
                    ));
                }
            }
        } else {
            self.b
                .ctx
                .report
                .count(&self.b.ctx.report.c.mc_stores_refused);
        }
        Ok(())
    }

    fn get_any(&mut self) -> Res<()> {
        let key = self.b.pick("mc:");
        self.get(&key).map(|_| ())
    }

    fn touch_any(&mut self) -> Res<()> {
        let key = self.b.pick("mc:");
        let line = self.text(format!("touch {key} 0\r\n").as_bytes())?;
        match line.as_str() {
            "TOUCHED" | "NOT_FOUND" => Ok(()),
            other => Err(Fail::Proto(format!("touch {key}: {other:?}"))),
        }
    }

    /// A delete by a client without the lock: LOCKED while someone holds it.
    fn delete_any(&mut self) -> Res<()> {
        let key = self.b.pick("mc:");
        let me = self.b.owner();
        let before = self.b.ctx.model.held_by_other(Proto::Mc, &key, me);
        let line = self.text(format!("delete {key}\r\n").as_bytes())?;
        let after = self.b.ctx.model.held_by_other(Proto::Mc, &key, me);
        match line.as_str() {
            "DELETED" => {
                if let (Some((e1, holder)), Some((e2, _))) = (before, after) {
                    if e1 == e2 {
                        self.b.ctx.report.double_grant(format!(
                            "memcache {key:?}: delete by client {} succeeded while client {} \
                             conn {} held the lock throughout",
                            self.b.id, holder.client, holder.conn
                        ));
                    }
                }
                Ok(())
            }
            "NOT_FOUND" | "LOCKED" => Ok(()),
            other => Err(Fail::Proto(format!("delete {key}: {other:?}"))),
        }
    }

    fn ping(&mut self) -> Res<()> {
        if self.b.rng.chance(50) {
            let line = self.text(b"version\r\n")?;
            if !line.starts_with("VERSION ") {
                return Err(Fail::Proto(format!("version: {line:?}")));
            }
        } else {
            let r = self.bin(op::NOOP, &[], &[], &[])?;
            if r.status != ST_OK {
                return Err(Fail::Proto(format!("Noop: status {:#06x}", r.status)));
            }
        }
        Ok(())
    }

    /// A hostile request that must close the connection: a binary header whose key and extras
    /// do not fit its body, or a text line that never ends. Only while holding nothing.
    fn hostile(&mut self) -> Res<()> {
        if !self.held.is_empty() {
            return Ok(());
        }
        self.b.ctx.report.count(&self.b.ctx.report.c.hostile);
        let req: Vec<u8> = if self.b.rng.chance(50) {
            let mut r = bin_request(op::GET, 1, &[], b"key", &[]);
            r[11] = 1; // total body 1 < key length 3
            r
        } else {
            vec![b'x'; 4096]
        };
        let conn = self.b.conn()?;
        // The server may close before reading it all: a write error is fine here.
        let _ = conn.send(&req);
        conn.wait_closed(Instant::now() + REPLY_DEADLINE)?;
        self.b.ctx.report.op();
        self.b.closed_by_server();
        Ok(())
    }
}
