//! The wire codecs holdfast shares with its clients, without a dependency: one codec per
//! protocol, used by the daemon (which re-exports each under `holdfast::proto`), the client
//! library (`holdfast-client`), the bench tools and the fuzz targets.
//!
//! [`dlock`]: dlock's frames and a hand-written protobuf codec of its `Request` and `Response`,
//! both sides (the server decodes requests and encodes responses; clients the other way round).

pub mod dlock;
