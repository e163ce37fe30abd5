//! holdfast: a lock server that speaks memcached (with yrmcds locks), old and dlock.
//!
//! ```text
//!            clients (memcached text/binary :11211, old :2626, dlock :2627)
//!                 │              │               │
//!   ┌─────────────▼──────────────▼───────────────▼──────────────┐
//!   │ worker 0 … worker N-1   (mio Poll, SO_REUSEPORT listeners,│
//!   │   Slab<Conn>, ConnId = {worker, slot, generation})        │
//!   │   read until WouldBlock → zero-copy parse → one copy into │
//!   │   this turn's Batch (ops + byte arena)                    │
//!   └─────────────┬──────────────────────────────▲──────────────┘
//!    one Batch per│loop turn                     │ one Replies per worker per owner turn,
//!    (crossbeam)  │                              │ then one mio::Waker::wake
//!   ┌─────────────▼──────────────────────────────┴──────────────┐
//!   │ owner (one thread, the only writer of lock state)         │
//!   │   now = clock() once per turn                             │
//!   │   store (items + yrmcds locks) · lockd table · dlock table│
//!   │   each with its own timing wheel: expiry, orphans, leases,│
//!   │   wait deadlines, idle timeouts                           │
//!   └───────────────────────────────────────────────────────────┘
//! ```
//!
//! The life of one request: a worker's `Poll` says a socket is readable; the worker reads into
//! its 64 KiB scratch buffer and parses every complete request straight out of it (a partial
//! request's bytes are kept in the connection's own buffer). Requests that need no lock state
//! (`version`, old's PING) are answered on the spot, unless earlier requests of that connection
//! are still at the owner, in which case the answer travels through the owner to keep its place.
//! Everything else is copied once into the turn's [`server::msg::Batch`] and the batch is sent to
//! the owner when the turn ends. The owner applies the operations in order with the turn's time,
//! which yields typed effects addressed to sessions ([`server::effect`]: the reply, plus any
//! grants to *other* sessions the operation caused), fires due timers, then routes the effects to
//! the connections their sessions have (dropping those with none here), sends each worker its
//! batch and wakes it once. The worker encodes each effect into its connection's write buffer
//! (one for a closed connection, recognised by its generation, is dropped) and writes each
//! touched connection once.
//!
//! Modules: [`config`] (flags), [`core`] (the tables: pure state machines, time passed in),
//! [`protocol`] (one folder per protocol: its wire codec, the worker's decoding, the owner's
//! executor, its replies and command entries), [`proto`] (the wire codecs by name),
//! [`server`] (threads and glue).

pub mod admin;
pub mod cluster;
pub mod config;
pub mod core;
pub mod fdlimit;
#[macro_use]
pub mod log;
pub mod proto;
pub mod protocol;
pub mod rng;
pub mod server;
pub mod tls;
