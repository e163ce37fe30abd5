//! Worker side of each wire format: parse what arrived, answer what needs no lock state, and copy
//! everything else once into the owner's batch.

use super::conn::{Conn, KEEP_BUF};
use crate::config::Config;
use crate::protocol::Decode;
use crate::server::msg::{Batch, ConnId};
use crate::server::Proto;

/// What parsing reads besides the bytes: the flags, and the secrets in force this turn (the
/// worker takes the current set once per turn, never per request).
#[derive(Clone, Copy)]
pub struct Cx<'a> {
    pub config: &'a Config,
    pub secrets: &'a crate::tls::Secrets,
}

/// What a connection does with the bytes it reads: the parse loop below, over them or its buffer.
impl Conn {
    /// Parse bytes just received. Whole requests are parsed straight out of `data`; only a
    /// partial request is copied, into `rbuf`. Returns true when the connection must close once
    /// its queued output is written.
    pub fn receive(&mut self, data: &[u8], id: ConnId, cx: Cx<'_>, batch: &mut Batch) -> bool {
        if !self.rbuf.is_empty() {
            self.rbuf.extend_from_slice(data);
            return self.parse_buffered(id, cx, batch);
        }
        let (consumed, fatal) = parse(self, data, id, cx, batch);
        if fatal {
            self.closing = true;
        } else if consumed < data.len() {
            self.rbuf.extend_from_slice(&data[consumed..]);
        }
        fatal
    }

    /// Parse what is buffered (after backpressure cleared, or after more bytes arrived).
    pub fn parse_buffered(&mut self, id: ConnId, cx: Cx<'_>, batch: &mut Batch) -> bool {
        let data = std::mem::take(&mut self.rbuf);
        let (consumed, fatal) = parse(self, &data, id, cx, batch);
        self.rbuf = data;
        self.rbuf.drain(..consumed);
        if self.rbuf.is_empty() && self.rbuf.capacity() > KEEP_BUF {
            self.rbuf = Vec::new();
        }
        if fatal {
            self.closing = true;
        }
        fatal
    }
}

/// Parse as many requests from `data` as backpressure allows. Returns the bytes consumed and
/// whether the connection must be closed (after what was queued for it is written).
pub fn parse(
    conn: &mut Conn,
    data: &[u8],
    id: ConnId,
    cx: Cx<'_>,
    batch: &mut Batch,
) -> (usize, bool) {
    let mut pos = 0;
    conn.partial = false;
    while pos < data.len() {
        if conn.skip > 0 {
            let n = conn.skip.min(data.len() - pos);
            conn.skip -= n;
            pos += n;
            continue;
        }
        if !conn.can_parse() {
            break;
        }
        let rest = &data[pos..];
        macro_rules! parse_one {
            ($($proto:ident, $v:ident, $name:literal, $ty:ty, $op:ty, $reply:ty;)*) => {
                match conn.proto {
                    $(Proto::$proto => <$ty>::parse(conn, rest, id, cx, batch),)*
                }
            };
        }
        let step = crate::protocol::protocols!(parse_one);
        match step {
            Step::Consumed(n) => pos += n,
            Step::Incomplete => {
                conn.partial = true;
                break;
            }
            Step::Fatal => return (pos, true),
        }
    }
    (pos, false)
}

/// What one parse attempt did.
pub enum Step {
    Consumed(usize),
    Incomplete,
    Fatal,
}
