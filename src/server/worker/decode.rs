//! Worker side of each wire format: parse what arrived, answer what needs no lock state, and copy
//! everything else once into the owner's batch.

use super::conn::Conn;
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
            Step::Incomplete => break,
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
