//! yrmcds counter requests applied to the counter table (contract: "yrmcds parity").
//!
//! Owns: the mapping from table outcomes to the protocol's statuses and the Stats and Dump
//! replies. Must not: keep state of its own (the table and its statistics live in [`Tables`]).

use super::outbox::{push_u64, Outbox};
use super::tables::{Tables, Who};
use crate::core::counter::CounterError;
use crate::core::Now;
use crate::proto::counter::{self as ct, op, status};
use crate::server::msg::{CounterKind, CounterOp};

fn status_of(e: CounterError) -> u8 {
    match e {
        CounterError::NotFound => status::NOT_FOUND,
        CounterError::NotAvailable => status::NOT_AVAILABLE,
        CounterError::NotAcquired => status::NOT_ACQUIRED,
    }
}

pub fn apply(
    t: &mut Tables,
    out: &mut Outbox,
    shared: &super::Shared,
    who: Who,
    o: CounterOp,
    arena: &[u8],
    now: Now,
) {
    let Who { conn, session } = who;
    let table = &mut t.counter;
    table.collect_due(now.ms);
    let opaque = o.opaque;
    let result = |w: &mut Vec<u8>, opcode: u8, r: Result<Option<u32>, CounterError>| match r {
        Ok(None) => ct::encode_header(w, opcode, status::OK, opaque, 0),
        Ok(Some(v)) => ct::encode(w, opcode, status::OK, opaque, &v.to_be_bytes()),
        Err(e) => ct::encode_error(w, opcode, status_of(e), opaque),
    };
    match o.kind {
        CounterKind::Get { name } => {
            table.stats.cmd_get += 1;
            let r = table.get(name.get(arena)).map(Some);
            out.record(conn, 1, false, |w| result(w, op::GET, r));
        }
        CounterKind::Acquire {
            resources,
            maximum,
            name,
        } => {
            table.stats.cmd_acquire += 1;
            let r = table
                .acquire(session, name.get(arena), resources, maximum, now.ms)
                .map(|()| Some(resources));
            out.record(conn, 1, false, |w| result(w, op::ACQUIRE, r));
        }
        CounterKind::Release { resources, name } => {
            table.stats.cmd_release += 1;
            let r = table
                .release(session, name.get(arena), resources, now.ms)
                .map(|()| None);
            out.record(conn, 1, false, |w| result(w, op::RELEASE, r));
        }
        CounterKind::Stats => {
            table.stats.cmd_stats += 1;
            let s = table.stats;
            let objects = table.len() as u64;
            let uptime = now.ms.saturating_sub(shared.started_unix_ms) / 1000;
            out.record(conn, 1, false, |w| {
                let start = w.len();
                ct::encode_header(w, op::STATS, status::OK, opaque, 0);
                let num = |w: &mut Vec<u8>, name: &[u8], v: u64| {
                    let mut b = Vec::with_capacity(20);
                    push_u64(&mut b, v);
                    ct::encode_stat(w, name, &b);
                };
                num(w, b"time", now.unix);
                num(w, b"uptime", uptime);
                num(w, b"objects", objects);
                num(w, b"total_objects", s.total_objects);
                num(w, b"cmd_get", s.cmd_get);
                num(w, b"cmd_acquire", s.cmd_acquire);
                num(w, b"cmd_release", s.cmd_release);
                num(w, b"cmd_stats", s.cmd_stats);
                num(w, b"cmd_dump", s.cmd_dump);
                num(w, b"acquired", s.acquired);
                num(w, b"not_available", s.not_available);
                num(w, b"released", s.released);
                num(w, b"released_on_close", s.released_on_close);
                let v = crate::server::VERSION_REPLY;
                ct::encode_stat(w, b"version", &v[b"VERSION ".len()..v.len() - 2]);
                let body = (w.len() - start - ct::HEADER_LEN) as u32;
                w[start + 4..start + 8].copy_from_slice(&body.to_be_bytes());
            });
        }
        CounterKind::Dump => {
            table.stats.cmd_dump += 1;
            out.record(conn, 1, false, |w| {
                table.dump(now.ms, |name, cur, max| {
                    ct::encode_dump_entry(w, opaque, cur, max, name)
                });
                ct::encode_header(w, op::DUMP, status::OK, opaque, 0);
            });
        }
    }
}
