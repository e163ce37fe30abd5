//! dlock sessions that have a Lock waiting, and the requests each keeps behind it: state the
//! state machine holds beyond the dlock table, with its snapshot.
//!
//! Owns: which session waits for which Lock (its internal token and request id) and the
//! backlog of requests and literal replies queued behind it. Must not: run requests
//! (`exec.rs` does).

use std::collections::VecDeque;

use hashbrown::HashMap;

use super::DlockOp;
use crate::core::codec::{self, DecodeError, Reader};
use crate::core::Session;
use crate::server::command::{self, Limits};
use crate::server::msg::{Arena, ConnId, Op, OpMsg};

/// The connection a deferred request is written under in a snapshot (it belongs to its
/// session, not to a connection).
const DEFERRED: ConnId = ConnId::new(0, 0, 0);

/// A request kept while its connection waits for a Lock: the op with its spans re-based on its
/// own copy of the bytes.
pub(super) enum Deferred {
    Request(DlockOp, Box<[u8]>),
    Literal(Box<[u8]>, bool),
}

pub(super) struct Waiting {
    pub(super) token: u64,
    pub(super) id: Option<u64>,
    pub(super) backlog: VecDeque<Deferred>,
}

/// Connections with a Lock waiting.
#[derive(Default)]
pub struct DlockSessions {
    pub(super) waiting: HashMap<Session, Waiting>,
    pub(super) next_token: u64,
    /// Reused for the key slices of each Lock/Unlock.
    pub(super) keys_scratch: Vec<&'static [u8]>,
}

impl DlockSessions {
    pub fn is_waiting(&self, session: Session) -> bool {
        !self.waiting.is_empty() && self.waiting.contains_key(&session)
    }

    pub fn defer_literal(&mut self, session: Session, bytes: &[u8], close: bool) {
        if let Some(w) = self.waiting.get_mut(&session) {
            w.backlog.push_back(Deferred::Literal(bytes.into(), close));
        }
    }

    pub fn remove(&mut self, session: Session) {
        if !self.waiting.is_empty() {
            self.waiting.remove(&session);
        }
    }

    /// Every waiting session (by id) with its Lock's token and request id and the requests
    /// kept behind it, in order (the requests in the command encoding, under a placeholder
    /// connection: a deferred request belongs to its session, whatever connection that has).
    pub fn snapshot(&self, out: &mut Vec<u8>) {
        codec::put_u64(out, self.next_token);
        let mut waiting: Vec<(&Session, &Waiting)> = self.waiting.iter().collect();
        waiting.sort_unstable_by_key(|(s, _)| **s);
        codec::put_u64(out, waiting.len() as u64);
        for (session, w) in waiting {
            session.encode(out);
            codec::put_u64(out, w.token);
            codec::put_opt_u64(out, w.id);
            codec::put_u64(out, w.backlog.len() as u64);
            for d in &w.backlog {
                match d {
                    Deferred::Literal(bytes, close) => {
                        codec::put_u8(out, 0);
                        codec::put_bytes(out, bytes);
                        codec::put_bool(out, *close);
                    }
                    Deferred::Request(op, bytes) => {
                        codec::put_u8(out, 1);
                        let msg = OpMsg {
                            conn: DEFERRED,
                            op: Op::Dlock(*op),
                        };
                        command::encode_op(&msg, bytes, out);
                    }
                }
            }
            codec::spill(out);
        }
    }

    pub fn restore(r: &mut Reader<'_>, limits: Limits) -> Result<DlockSessions, DecodeError> {
        let mut s = DlockSessions {
            next_token: r.u64()?,
            ..DlockSessions::default()
        };
        let n = r.count(3)?;
        let mut last: Option<Session> = None;
        for _ in 0..n {
            codec::consumed(r);
            let session = Session::decode(r)?;
            if last.is_some_and(|l| l >= session) {
                return Err(DecodeError::Invalid("dlock sessions out of order"));
            }
            last = Some(session);
            let token = r.u64()?;
            let id = r.opt_u64()?;
            let len = r.count(2)?;
            let mut backlog = VecDeque::with_capacity(len);
            for _ in 0..len {
                backlog.push_back(match r.u8()? {
                    0 => Deferred::Literal(r.bytes(limits.max_field)?.into(), r.bool()?),
                    1 => {
                        let mut arena = Arena::default();
                        let msg = command::decode_op(r, limits, &mut arena)?;
                        match msg.op {
                            Op::Dlock(op) if msg.conn == DEFERRED => {
                                Deferred::Request(op, arena.bytes.into_boxed_slice())
                            }
                            _ => return Err(DecodeError::Invalid("deferred dlock request")),
                        }
                    }
                    _ => return Err(DecodeError::Invalid("deferred tag")),
                });
            }
            s.waiting.insert(session, Waiting { token, id, backlog });
        }
        Ok(s)
    }
}
