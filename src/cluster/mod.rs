//! Cluster mode: the pieces that replicate holdfast's state machine with raft-rs.
//!
//! - [`storage`]: the durable Raft log of one node (`raft::Storage` over a data directory).
//! - [`node`]: one node's Raft driver over that log and the transport.
//! - [`snapchild`]: a snapshot written by a forked child while the node goes on.
//! - [`snapfile`]: a snapshot file (written as a stream, sent in chunks) and its descriptor.
//! - [`transport`]: framed raft messages between peers over TCP (mutual TLS with peer TLS).
//! - [`liveness`]: quorum probes, fencing, the write deadline and session expiries, as pure
//!   functions of time.
//! - [`env`]: what a node's driver works through (its log, peers and clock), and the daemon's.
//!
//! The owner drives them (`server::owner::cluster`), and the simulator (`crate::sim`, above
//! both) drives the node's driver and the owner's loop over in-memory ones; nothing here
//! imports either. The state machine they replicate is described in `docs/state-machine.md`,
//! the whole of cluster mode in `docs/cluster.md`.

pub mod crc32c;
pub mod env;
pub mod liveness;
mod logcache;
pub mod node;
pub mod snapchild;
pub mod snapfile;
pub mod storage;
pub mod transport;
