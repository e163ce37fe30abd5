//! The worker's side of the counter protocol: a bad magic or a body over the cap closes the
//! connection at once (nothing sensible can be answered: the opcode and opaque of a stream that
//! is not this protocol mean nothing); Noop, malformed bodies and unknown opcodes are answered
//! here, in order; the rest goes to the owner.

use super::wire as ct;
use super::{Counter, CounterKind, CounterOp};
use crate::protocol::Decode;
use crate::server::msg::{Batch, ConnId, Op};
use crate::server::worker::conn::{Conn, REPLY_BUDGET};
use crate::server::worker::decode::{Cx, Step};

impl Decode for Counter {
    #[inline]
    fn parse(conn: &mut Conn, buf: &[u8], id: ConnId, _cx: Cx<'_>, batch: &mut Batch) -> Step {
        let (req, n) = match ct::parse(buf) {
            Ok(x) => x,
            Err(ct::ParseError::Incomplete) => return Step::Incomplete,
            Err(ct::ParseError::BadMagic | ct::ParseError::TooLarge) => return Step::Fatal,
        };
        let a = &mut batch.arena;
        let kind = match req.command {
            ct::Command::Get { name } => CounterKind::Get { name: a.push(name) },
            ct::Command::Acquire {
                resources,
                maximum,
                name,
            } => CounterKind::Acquire {
                resources,
                maximum,
                name: a.push(name),
            },
            ct::Command::Release { resources, name } => CounterKind::Release {
                resources,
                name: a.push(name),
            },
            ct::Command::Stats => CounterKind::Stats,
            ct::Command::Dump => CounterKind::Dump,
            ct::Command::Noop | ct::Command::Invalid | ct::Command::Unknown => {
                let status = match req.command {
                    ct::Command::Noop => ct::status::OK,
                    ct::Command::Invalid => ct::status::INVALID,
                    _ => ct::status::UNKNOWN_COMMAND,
                };
                if status == ct::status::OK {
                    let mut header = [0u8; ct::HEADER_LEN];
                    ct::encode_header_into(&mut header, req.opcode, status, req.opaque, 0);
                    conn.emit(&header, false, id, batch);
                } else {
                    let mut w = Vec::with_capacity(ct::HEADER_LEN + 32);
                    ct::encode_error(&mut w, req.opcode, status, req.opaque);
                    conn.emit(&w, false, id, batch);
                }
                return Step::Consumed(n);
            }
        };
        conn.push(
            id,
            Op::Counter(CounterOp {
                opaque: req.opaque,
                kind,
            }),
            batch,
        );
        // Dump writes the whole table; the others a few bytes.
        conn.charge(if matches!(kind, CounterKind::Dump) {
            REPLY_BUDGET
        } else {
            64
        });
        Step::Consumed(n)
    }
}
