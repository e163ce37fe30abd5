//! The wire codecs of every protocol, by protocol name, for clients, tools and tests: each is
//! the `wire` module of its protocol's folder (`crate::protocol`).
//!
//! Every parser has httparse's shape: it takes the bytes received so far, returns a request that
//! borrows from them and the number of bytes it consumed, and treats incomplete input as
//! `Incomplete`, never as an error. Parsers never allocate, never read a clock and never panic on
//! any input.

pub use crate::protocol::counter::wire as counter;
pub use crate::protocol::dlock::wire as dlock;
pub use crate::protocol::lockd::wire as lockd;
pub use crate::protocol::memcache::wire as memcache;
