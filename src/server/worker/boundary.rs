//! One TLS connection's path through the worker without a socket or an owner: the worker's own
//! [`tls_receive`] and [`tls_flush`] on a [`Conn`] and a `rustls::ServerConnection`, fed bytes as
//! the socket would deliver them. For the `tls_boundary` fuzz target and the worker's tests: any
//! split of any bytes must never panic, parse nothing before the handshake ends, and tell the
//! owner of the connection (`Op::Open`) before any of its requests.
//!
//! The owner is stood in for by answering every request at once with nothing, so backpressure
//! clears at each step and buffered requests are parsed as the worker's `resume` parses them.

use std::net::SocketAddr;
use std::sync::Arc;

use super::{at_eof, tls_flush, tls_receive, Conn, Cx, Dump};
use crate::config::Config;
use crate::server::msg::{Batch, ConnId, Op};
use crate::server::Proto;
use crate::tls::rustls;

/// Ciphertext kept for [`TlsBoundary::take_output`]; older output is dropped beyond it (a fuzz
/// run never takes it).
const KEEP_OUTPUT: usize = 1 << 20;
/// Operation kinds remembered for [`TlsBoundary::log`].
const KEEP_LOG: usize = 64;

pub struct TlsBoundary {
    config: Config,
    secrets: crate::tls::Secrets,
    tls: Box<rustls::ServerConnection>,
    conn: Conn,
    id: ConnId,
    peer: SocketAddr,
    opened: bool,
    eof: bool,
    closed: bool,
    batch: Batch,
    output: Vec<u8>,
    log: Vec<&'static str>,
    requests: u64,
}

impl TlsBoundary {
    /// A connection accepted on a `proto` TLS listener with `server`'s configuration, under the
    /// daemon's default flags.
    pub fn new(server: Arc<rustls::ServerConfig>, proto: Proto) -> TlsBoundary {
        let config = match crate::config::parse(Vec::<String>::new()) {
            Ok(crate::config::Command::Run(c)) => c,
            _ => unreachable!("the default flags are valid"),
        };
        let mut tls = rustls::ServerConnection::new(server).expect("a server connection");
        tls.set_buffer_limit(Some(super::TLS_SEND_BUFFER));
        TlsBoundary {
            config,
            secrets: crate::tls::Secrets::default(),
            tls: Box::new(tls),
            conn: Conn::new(proto),
            id: ConnId::on_node(0, 0, 0, 0),
            peer: SocketAddr::from(([127, 0, 0, 1], 1)),
            opened: false,
            eof: false,
            closed: false,
            batch: Batch::default(),
            output: Vec::new(),
            log: Vec::new(),
            requests: 0,
        }
    }

    /// Bytes as one read of the socket returns them. Returns whether the connection is still
    /// open afterwards (a failed handshake, a bad record, bad input or the end of the client's
    /// requests close it).
    pub fn feed(&mut self, bytes: &[u8]) -> bool {
        if self.closed || bytes.is_empty() {
            return !self.closed;
        }
        if self.eof {
            // After its close_notify the client is at its EOF (the worker does the same).
            at_eof(&mut self.conn, self.id, &mut self.batch);
            self.settle();
            return !self.closed;
        }
        let cx = Cx {
            config: &self.config,
            secrets: &self.secrets,
        };
        let got = tls_receive(
            &mut self.tls,
            &mut self.conn,
            &mut self.opened,
            self.peer,
            bytes,
            self.id,
            cx,
            &mut self.batch,
        );
        match got {
            Err(_) => {
                self.take_ops();
                let _ = self.tls.write_tls(&mut self.output);
                self.closed = true;
            }
            Ok(got) => {
                self.take_ops();
                if got.eof {
                    self.eof = true;
                }
                self.settle();
            }
        }
        !self.closed
    }

    /// Answer, parse what waited, write, and close once a closing connection is done.
    fn settle(&mut self) {
        // The owner answers; parsing resumes where backpressure stopped it.
        loop {
            self.answer();
            if self.conn.rbuf.is_empty() || !self.conn.can_parse() {
                break;
            }
            let before = self.conn.rbuf.len();
            let cx = Cx {
                config: &self.config,
                secrets: &self.secrets,
            };
            self.conn.parse_buffered(self.id, cx, &mut self.batch);
            self.take_ops();
            if self.conn.rbuf.len() == before {
                break;
            }
        }
        if self.eof && self.conn.can_parse() {
            at_eof(&mut self.conn, self.id, &mut self.batch);
            self.take_ops();
        }
        let mut sent = 0;
        if !tls_flush(&mut self.tls, &mut self.output, &mut self.conn, &mut sent) {
            self.closed = true;
        }
        if self.conn.closing && self.conn.finished() && !self.tls.wants_write() {
            self.tls.send_close_notify();
            let _ = self.tls.write_tls(&mut self.output);
            self.closed = true;
        }
        if self.output.len() > KEEP_OUTPUT {
            self.output.clear();
        }
    }

    /// Everything queued for the owner: checked for order, logged, and answered (with nothing).
    fn take_ops(&mut self) {
        for m in self.batch.ops.drain(..) {
            assert!(
                self.opened,
                "an operation of a connection whose handshake has not ended"
            );
            let kind = kind(&m.op);
            assert!(
                !self.log.is_empty() || kind == "open",
                "the connection's first operation is {kind}, not its opening"
            );
            assert!(
                kind != "open" || self.log.is_empty(),
                "the connection was opened twice"
            );
            if is_request(&m.op) {
                self.requests += 1;
            }
            if self.log.len() < KEEP_LOG {
                self.log.push(kind);
            }
        }
        self.batch.arena.bytes.clear();
        if !self.opened {
            assert!(
                self.conn.rbuf.is_empty() && self.conn.pending_output() == 0,
                "bytes parsed or answered before the handshake ended"
            );
        }
    }

    /// The stand-in owner: every operation in flight is answered at once.
    fn answer(&mut self) {
        self.conn.inflight = 0;
        self.conn.reply_bound = 0;
        self.conn.dump = Dump::Idle;
    }

    /// Ciphertext the server wrote since the last call (handshake flights, replies, alerts).
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }

    /// Whether the handshake has ended and the owner was told of the connection.
    pub fn is_open(&self) -> bool {
        self.opened
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Requests the owner was given.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// The kinds of the connection's first operations, in the order the owner got them:
    /// "open", "dlock_open", "request", "literal", "eof".
    pub fn log(&self) -> &[&'static str] {
        &self.log
    }
}

fn is_request(op: &Op) -> bool {
    op.proto().is_some() || matches!(op, Op::Literal { .. })
}

fn kind(op: &Op) -> &'static str {
    match op {
        Op::Open { .. } => "open",
        Op::DlockOpen => "dlock_open",
        Op::Literal { .. } => "literal",
        Op::Eof => "eof",
        Op::Close => "close",
        _ => "request",
    }
}

#[cfg(test)]
#[path = "boundary_tests.rs"]
mod tests;
