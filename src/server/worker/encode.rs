//! Effects to wire bytes: the worker writes each effect routed to one of its connections
//! straight into that connection's write buffer, with the protocols' encoders (`proto::*`).
//!
//! Owns: the exact reply bytes of every protocol (memcached doc/protocol.txt and yrmcds's
//! texts, old-protocol.txt frames, dlock Responses, yrmcds counter replies). Must not: decide
//! what a reply says (the owner's `exec_*` files chose the effect).

use crate::protocol::counter::Counter;
use crate::protocol::dlock::Dlock;
use crate::protocol::lockd::Lockd;
use crate::protocol::memcache::Memcache;
use crate::protocol::Answer;
use crate::server::effect::Body;

/// Append `body`'s wire bytes to `out`; `a` is the arena its spans name.
#[inline]
pub fn write(out: &mut Vec<u8>, body: &Body, a: &[u8]) {
    match body {
        Body::Nothing | Body::Abort => {}
        Body::Literal(s) => out.extend_from_slice(s.get(a)),
        Body::Mc(r) => Memcache::write(out, r, a),
        Body::Lockd(r) => Lockd::write(out, r, a),
        Body::Dlock(r) => Dlock::write(out, r, a),
        Body::Counter(r) => Counter::write(out, r, a),
    }
}
