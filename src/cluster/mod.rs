//! Cluster mode (issue 10): the pieces that replicate holdfast's state machine with raft-rs.
//!
//! - [`storage`]: the durable Raft log of one node (`raft::Storage` over a data directory).
//! - [`sim`]: a deterministic simulator of 3 or 5 raft nodes, their network, disks and clocks,
//!   driving any [`sim::StateMachine`], holdfast's own `Replayer` included.
//! - [`transport`]: framed raft messages between peers over TCP.
//!
//! Nothing here is wired into the daemon yet; the owner-side state machine it replicates is
//! described in `docs/state-machine.md`.

pub mod crc32c;
pub mod liveness;
pub mod node;
pub mod sim;
pub mod storage;
pub mod transport;
