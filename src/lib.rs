//! holdfast: a lock server that speaks memcached text and binary (with yrmcds locks and
//! counters), the old lock-daemon protocol and dlock, on one node or as a raft cluster.
//!
//! # Threads
//!
//! ```text
//!     clients: memcached :11211 · old :2626 · dlock :2627 · counter :11215     admin HTTP
//!                 │              │               │               │                │
//!   ┌─────────────▼──────────────▼───────────────▼───────────────▼──┐   ┌─────────▼────────┐
//!   │ worker 0 … worker N-1   (mio Poll, SO_REUSEPORT listeners,    │   │ admin thread,    │
//!   │   Slab<Conn>, ConnId = {node, worker, slot, generation})      │   │ one thread per   │
//!   │   parse in place → one copy into this turn's Batch            │   │ admin connection │
//!   └─────────────┬──────────────────────────────▲──────────────────┘   └─────────┬────────┘
//!    one Batch per│loop turn                     │ one Replies per worker per     │ Query /
//!    (crossbeam)  │                              │ owner turn, one wake           │ Answer
//!   ┌─────────────▼──────────────────────────────┴──────────────────┐             │
//!   │ owner: one thread, the only writer of lock state              │◄────────────┘
//!   │   (run inside the one worker when --threads 1 on a single node)│
//!   │   store · lockd · dlock · counter tables, sessions, timers     │
//!   │   cluster mode: proposes each turn as a command entry and      │
//!   │   applies it once raft has committed it; raft messages go to   │
//!   │   peers over the cluster transport                             │
//!   └────────────────────────────────────────────────────────────────┘
//! ```
//!
//! # The life of one request
//!
//! 1. A worker's `Poll` says a socket is readable (`server/worker/mod.rs`); the worker reads
//!    into its scratch buffer, and its parse loop (`server/worker/decode.rs`) hands the bytes to
//!    the connection's protocol (`protocol/<name>/decode.rs`), which parses them in place with
//!    the protocol's wire codec (`protocol/<name>/wire`) and either answers on the spot
//!    (`version`, a bad frame) or copies the request once into the turn's
//!    [`server::msg::Batch`] as the protocol's op. The batch goes to the owner when the turn
//!    ends.
//! 2. On a single node the owner (`server/owner/mod.rs`) applies the batch at once; in cluster
//!    mode (`server/owner/cluster.rs`) it encodes the turn as a command entry
//!    (`server/owner/command.rs`, each op by `protocol/<name>/command.rs`), proposes it through
//!    the node's raft driver (`cluster/node.rs`) and applies it when it is committed, as every
//!    replica does.
//! 3. Applying a turn (`server/owner/apply.rs`) fires due timers and calls each op's protocol
//!    (`protocol/<name>/exec.rs`) on its table in `core/`, with the turn's time; the result is
//!    typed effects addressed to sessions ([`server::effect`]: the reply, and any grants to
//!    other sessions the op caused), never a socket write.
//! 4. The outbox (`server/owner/outbox.rs`) routes each effect to the connection its session
//!    has in this process (dropping those with none here), moves each worker's effects into its
//!    [`server::msg::Replies`] and wakes it once.
//! 5. The worker encodes each effect into its connection's write buffer
//!    (`server/worker/encode.rs`, with `protocol/<name>/reply.rs`); one for a connection that
//!    has closed since, recognised by its generation, is dropped. Each touched connection is
//!    written once.
//!
//! # Modules
//!
//! [`config`] (flags), [`core`] (the tables: pure state machines, time passed in),
//! [`protocol`] (one folder per protocol: wire codec, the worker's decoding, the owner's
//! executor, replies, command entries, no-quorum answers), [`proto`] (the wire codecs by
//! protocol name, for clients and tools), [`server`] (listeners, workers, the owner, effects,
//! the messages between threads), [`cluster`] (the raft log on disk, the raft driver, the peer
//! transport, liveness), [`sim`] (the deterministic cluster simulator, above both `cluster` and
//! `server`: it drives the raft driver and the owner's cluster loop), [`admin`] (the admin HTTP
//! port), [`tls`] (certificates and keys), [`log`], [`rng`] and [`fdlimit`].

pub mod admin;
pub mod cluster;
pub mod config;
pub mod core;
pub mod fdlimit;
pub mod histogram;
#[macro_use]
pub mod log;
pub mod proto;
pub mod protocol;
pub mod rng;
pub mod server;
pub mod sim;
pub mod slice;
pub mod tls;
