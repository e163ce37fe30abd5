//! The worker's side of the old lock-daemon protocol: PING, unknown opcodes and a wrong
//! version are answered here; the lock operations go to the owner with their name.

use super::wire as ld;
use super::{Lockd, LockdOp};
use crate::protocol::Decode;
use crate::server::msg::{Batch, ConnId, Op};
use crate::server::worker::conn::{Conn, REPLY_BUDGET};
use crate::server::worker::decode::{Cx, Step};

impl Decode for Lockd {
    #[inline]
    fn parse(conn: &mut Conn, buf: &[u8], id: ConnId, _cx: Cx<'_>, batch: &mut Batch) -> Step {
        let mut out = Vec::new();
        // A version other than 1 gets ERR (empty), then the connection is closed. The
        // version is the top nibble of the first byte, so decide there: the length field of a frame
        // in an unknown version means nothing, and waiting for the up to 1 MiB it announces would
        // leave the client hanging with no answer.
        if ld::peek_version(buf).is_some_and(|v| v != ld::VERSION) {
            ld::encode(&mut out, ld::op::ERR, &[]);
            conn.emit(&out, true, id, batch);
            return Step::Fatal;
        }
        let Some((frame, n)) = ld::parse(buf) else {
            return Step::Incomplete;
        };
        debug_assert_eq!(frame.version, ld::VERSION);
        match frame.opcode {
            ld::op::PING => {
                ld::encode(&mut out, ld::op::PONG, frame.payload);
                conn.emit(&out, false, id, batch);
            }
            ld::op::ACQ
            | ld::op::REL
            | ld::op::TRY
            | ld::op::ADOPT
            | ld::op::SYNC
            | ld::op::REQ_TOKEN => {
                let payload = batch.arena.push(frame.payload);
                let op = LockdOp::new(frame.opcode, payload, frame.payload);
                conn.push(id, Op::Lockd(op), batch);
                // Every reply echoes the payload; SYNC copies the whole table.
                conn.charge(if frame.opcode == ld::op::SYNC {
                    REPLY_BUDGET
                } else {
                    n
                });
            }
            _ => {
                ld::encode(&mut out, ld::op::ERR, frame.payload);
                conn.emit(&out, false, id, batch);
            }
        }
        Step::Consumed(n)
    }
}
