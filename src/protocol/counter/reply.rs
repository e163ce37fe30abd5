//! Counter replies: their wire bytes, their canonical bytes, and the arena layout of a Dump.

use super::wire::{self as ct, op, status};
use super::{Counter, CounterOp, CounterReply};
use crate::core::codec::{put_bytes, put_opt_u64, put_u64, put_u8};
use crate::protocol::Answer;
use crate::server::effect::{put_entry, take_entry, take_u32, Entries};
use crate::server::msg::{Arena, Span};

/// Tags of the canonical encoding (`server::effect::tag` lists every protocol's).
pub mod tag {
    pub const STATUS: u8 = 40;
    pub const STATS: u8 = 41;
    pub const DUMP: u8 = 42;
}

impl Answer for Counter {
    #[inline]
    fn write(w: &mut Vec<u8>, r: &CounterReply, a: &[u8]) {
        match *r {
            CounterReply::Status {
                opcode,
                status,
                opaque,
                value,
            } => match (status, value) {
                (status::OK, None) => ct::encode_header(w, opcode, status, opaque, 0),
                (status::OK, Some(v)) => ct::encode(w, opcode, status, opaque, &v.to_be_bytes()),
                _ => ct::encode_error(w, opcode, status, opaque),
            },
            CounterReply::Stats { opaque, pairs } => {
                let start = w.len();
                ct::encode_header(w, op::STATS, status::OK, opaque, 0);
                let mut e = Entries(pairs.get(a));
                while let (Some(name), Some(value)) = (e.next(), e.next()) {
                    ct::encode_stat(w, name, value);
                }
                let body = (w.len() - start - ct::HEADER_LEN) as u32;
                w[start + 4..start + 8].copy_from_slice(&body.to_be_bytes());
            }
            CounterReply::Dump { opaque, entries } => {
                for c in CounterIter(entries.get(a)) {
                    ct::encode_dump_entry(w, opaque, c.current, c.max, c.name);
                }
                ct::encode_header(w, op::DUMP, status::OK, opaque, 0);
            }
        }
    }

    fn encode_canonical(r: &CounterReply, a: &[u8], out: &mut Vec<u8>) {
        match *r {
            CounterReply::Status {
                opcode,
                status,
                opaque,
                value,
            } => {
                put_u8(out, tag::STATUS);
                put_u8(out, opcode);
                put_u8(out, status);
                put_u64(out, u64::from(opaque));
                put_opt_u64(out, value.map(u64::from));
            }
            CounterReply::Stats { opaque, pairs } => {
                put_u8(out, tag::STATS);
                put_u64(out, u64::from(opaque));
                Entries(pairs.get(a)).for_each(|e| put_bytes(out, e));
            }
            CounterReply::Dump { opaque, entries } => {
                put_u8(out, tag::DUMP);
                put_u64(out, u64::from(opaque));
                for c in CounterIter(entries.get(a)) {
                    put_bytes(out, c.name);
                    put_u64(out, u64::from(c.current));
                    put_u64(out, u64::from(c.max));
                }
            }
        }
    }

    fn spans_mut(r: &mut CounterReply, mut f: impl FnMut(&mut Span)) {
        match r {
            CounterReply::Status { .. } => {}
            CounterReply::Stats { pairs, .. } => f(pairs),
            CounterReply::Dump { entries, .. } => f(entries),
        }
    }

    /// The counter protocol has no status for it: the connection closes unanswered.
    fn no_quorum(_op: &CounterOp, _arena: &[u8], _now_unix_ms: u64, _out: &mut Vec<u8>) {}
}

/// One counter of a Dump, as [`put_counter`] writes it.
pub struct CounterEntry<'a> {
    pub name: &'a [u8],
    pub current: u32,
    pub max: u32,
}

pub fn put_counter(a: &mut Arena, name: &[u8], current: u32, max: u32) {
    a.bytes.extend_from_slice(&current.to_le_bytes());
    a.bytes.extend_from_slice(&max.to_le_bytes());
    put_entry(a, name);
}

pub struct CounterIter<'a>(pub &'a [u8]);

impl<'a> Iterator for CounterIter<'a> {
    type Item = CounterEntry<'a>;

    fn next(&mut self) -> Option<CounterEntry<'a>> {
        let mut b = self.0;
        let c = (|| {
            let current = take_u32(&mut b)?;
            let max = take_u32(&mut b)?;
            let name = take_entry(&mut b)?;
            Some(CounterEntry { name, current, max })
        })();
        self.0 = if c.is_some() { b } else { &[] };
        c
    }
}
