//! Effects to wire bytes: the worker writes each effect routed to one of its connections
//! straight into that connection's write buffer, with its protocol's writer
//! (`protocol::<name>::reply`).
//!
//! Owns: the bodies every connection may get (nothing, an abort, the worker's own bytes).
//! Must not: decide what a reply says (the protocol's `exec` chose the effect).

use crate::protocol::Answer;
use crate::server::effect::Body;

/// Append `body`'s wire bytes to `out`; `a` is the arena its spans name.
#[inline]
pub fn write(out: &mut Vec<u8>, body: &Body, a: &[u8]) {
    macro_rules! write_body {
        ($($proto:ident, $v:ident, $name:literal, $ty:ty, $op:ty, $reply:ty;)*) => {
            match body {
                Body::Nothing | Body::Abort => {}
                Body::Literal(s) => out.extend_from_slice(s.get(a)),
                $(Body::$v(r) => <$ty>::write(out, r, a),)*
            }
        };
    }
    crate::protocol::protocols!(write_body)
}
