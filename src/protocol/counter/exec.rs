//! Counter requests applied to the counter table, as yrmcds answers them.
//!
//! Owns: the mapping from table outcomes to the protocol's statuses and the Stats and Dump
//! replies. Must not: keep state of its own (the table and its statistics live in [`Tables`]).

use super::wire::{op, status};
use super::{Counter, CounterKind, CounterOp, CounterReply};
use crate::core::counter::CounterError;
use crate::core::{Now, Session};
use crate::protocol::Execute;
use crate::server::effect::{self, push_u64, Body, Effects};
use crate::server::owner::Tables;
use crate::server::Shared;

fn status_of(e: CounterError) -> u8 {
    match e {
        CounterError::NotFound => status::NOT_FOUND,
        CounterError::NotAvailable => status::NOT_AVAILABLE,
        CounterError::NotAcquired => status::NOT_ACQUIRED,
    }
}

impl Execute for Counter {
    fn apply(
        t: &mut Tables,
        fx: &mut Effects,
        shared: &Shared,
        session: Session,
        o: CounterOp,
        arena: &[u8],
        now: Now,
    ) {
        let table = &mut t.counter;
        table.collect_due(now.ms);
        let opaque = o.opaque;
        let result = |opcode: u8, r: Result<Option<u32>, CounterError>| {
            let (status, value) = match r {
                Ok(v) => (status::OK, v),
                Err(e) => (status_of(e), None),
            };
            Body::Counter(CounterReply::Status {
                opcode,
                status,
                opaque,
                value,
            })
        };
        match o.kind {
            CounterKind::Get { name } => {
                table.stats.cmd_get += 1;
                let r = table.get(name.get(arena)).map(Some);
                fx.reply(session, result(op::GET, r));
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
                fx.reply(session, result(op::ACQUIRE, r));
            }
            CounterKind::Release { resources, name } => {
                table.stats.cmd_release += 1;
                let r = table
                    .release(session, name.get(arena), resources, now.ms)
                    .map(|()| None);
                fx.reply(session, result(op::RELEASE, r));
            }
            CounterKind::Stats => {
                table.stats.cmd_stats += 1;
                let s = table.stats;
                let objects = table.len() as u64;
                let uptime = now.ms.saturating_sub(shared.started_unix_ms) / 1000;
                let mark = fx.mark();
                let a = &mut fx.arena;
                let mut b = Vec::with_capacity(20);
                let mut num = |name: &[u8], v: u64| {
                    b.clear();
                    push_u64(&mut b, v);
                    effect::put_entry(a, name);
                    effect::put_entry(a, &b);
                };
                num(b"time", now.unix);
                num(b"uptime", uptime);
                num(b"objects", objects);
                num(b"total_objects", s.total_objects);
                num(b"cmd_get", s.cmd_get);
                num(b"cmd_acquire", s.cmd_acquire);
                num(b"cmd_release", s.cmd_release);
                num(b"cmd_stats", s.cmd_stats);
                num(b"cmd_dump", s.cmd_dump);
                num(b"acquired", s.acquired);
                num(b"not_available", s.not_available);
                num(b"released", s.released);
                num(b"released_on_close", s.released_on_close);
                let v = crate::server::VERSION_REPLY;
                effect::put_entry(a, b"version");
                effect::put_entry(a, &v[b"VERSION ".len()..v.len() - 2]);
                let pairs = fx.since(mark);
                fx.reply(
                    session,
                    Body::Counter(CounterReply::Stats { opaque, pairs }),
                );
            }
            CounterKind::Dump => {
                table.stats.cmd_dump += 1;
                let mark = fx.mark();
                let a = &mut fx.arena;
                table.dump(now.ms, |name, cur, max| {
                    super::put_counter(a, name, cur, max)
                });
                let entries = fx.since(mark);
                fx.reply(
                    session,
                    Body::Counter(CounterReply::Dump { opaque, entries }),
                );
            }
        }
    }
}
