//! A [`CounterOp`] in a command entry: its tag (one per kind), the opaque, then the kind's
//! fields in declaration order.

use super::{Counter, CounterKind, CounterOp};
use crate::core::codec::{self, DecodeError, Reader};
use crate::protocol::Entry;
use crate::server::command::{get_span, put_span, Limits};
use crate::server::msg::{Arena, Span};

/// Command-entry tags (`server::command` lists every protocol's ranges).
mod tag {
    pub const GET: u8 = 50;
    pub const ACQUIRE: u8 = 51;
    pub const RELEASE: u8 = 52;
    pub const STATS: u8 = 53;
    pub const DUMP: u8 = 54;
}

impl Entry for Counter {
    fn encode_op(op: &CounterOp, arena: &[u8], o: &mut Vec<u8>) {
        let CounterOp { opaque, kind } = *op;
        let t = match kind {
            CounterKind::Get { .. } => tag::GET,
            CounterKind::Acquire { .. } => tag::ACQUIRE,
            CounterKind::Release { .. } => tag::RELEASE,
            CounterKind::Stats => tag::STATS,
            CounterKind::Dump => tag::DUMP,
        };
        o.push(t);
        codec::put_u64(o, u64::from(opaque));
        match kind {
            CounterKind::Get { name } => put_span(o, arena, name),
            CounterKind::Acquire {
                resources,
                maximum,
                name,
            } => {
                codec::put_u64(o, u64::from(resources));
                codec::put_u64(o, u64::from(maximum));
                put_span(o, arena, name);
            }
            CounterKind::Release { resources, name } => {
                codec::put_u64(o, u64::from(resources));
                put_span(o, arena, name);
            }
            CounterKind::Stats | CounterKind::Dump => {}
        }
    }

    fn decode_op(
        t: u8,
        r: &mut Reader<'_>,
        limits: Limits,
        a: &mut Arena,
    ) -> Option<Result<CounterOp, DecodeError>> {
        if !(tag::GET..=tag::DUMP).contains(&t) {
            return None;
        }
        Some(decode_kind(t, r, limits, a))
    }
}

fn decode_kind(
    t: u8,
    r: &mut Reader<'_>,
    limits: Limits,
    a: &mut Arena,
) -> Result<CounterOp, DecodeError> {
    let opaque = r.u32()?;
    let kind = match t {
        tag::GET => CounterKind::Get {
            name: get_counter_name(r, limits, a)?,
        },
        tag::ACQUIRE => {
            let resources = r.u32()?;
            let maximum = r.u32()?;
            // The worker answers anything else Invalid arguments itself.
            if resources == 0 || resources > maximum {
                return Err(DecodeError::Invalid("counter acquire arguments"));
            }
            CounterKind::Acquire {
                resources,
                maximum,
                name: get_counter_name(r, limits, a)?,
            }
        }
        tag::RELEASE => CounterKind::Release {
            resources: r.u32()?,
            name: get_counter_name(r, limits, a)?,
        },
        tag::STATS => CounterKind::Stats,
        _ => CounterKind::Dump,
    };
    Ok(CounterOp { opaque, kind })
}

/// A counter name as the worker accepts it: 1 to 65535 bytes (the table relies on it).
fn get_counter_name(
    r: &mut Reader<'_>,
    limits: Limits,
    a: &mut Arena,
) -> Result<Span, DecodeError> {
    let span = get_span(r, limits, a)?;
    if span.len == 0 || span.len as usize > crate::core::counter::MAX_NAME {
        return Err(DecodeError::Invalid("counter name length"));
    }
    Ok(span)
}
