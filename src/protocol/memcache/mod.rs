//! memcached's text and binary protocols, with yrmcds's locking extensions, on one listener
//! (`--memcache`); text or binary is told apart per request.
//!
//! `wire` parses requests and encodes binary responses; `decode` checks and decodes a request
//! on the worker into one [`McCmd`], the same for text and binary, and `auth` serves SASL and
//! the text `auth` line until a connection authenticates (`--memcache-auth-file`); `exec`
//! applies a [`McOp`] to the item store ([`crate::core::store`]), with yrmcds's key dumps and
//! `stats ops` counters kept in `state`; `reply` writes a [`McReply`]; `command` stores a
//! [`McOp`] in a command entry.

pub(crate) mod auth;
mod command;
mod decode;
pub(crate) mod exec;
mod reply;
pub(crate) mod state;
pub mod wire;

pub use exec::KEYS_SLOTS_PER_STEP;
pub use reply::tag as reply_tag;
pub use reply::{put_item, text_value_len, ItemEntry, ItemIter};

/// The version string `version` answers: memcached's form (clients parse the numbers), with our
/// name after it.
pub const VERSION_REPLY: &[u8] =
    concat!("VERSION 1.6.0-holdfast-", env!("CARGO_PKG_VERSION"), "\r\n").as_bytes();

use super::Protocol;
use crate::core::store::StoreMode;
use crate::server::msg::Span;

/// How a memcached request is answered: the wire form it came in, and what it asked of the
/// reply. Everything else about a request is in its [`McCmd`], the same for text and binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum McForm {
    /// A text request; `noreply` asks for no answer.
    Text { noreply: bool },
    /// A binary request: its opcode (which also says quiet, and whether a hit carries its key)
    /// and the opaque every reply echoes.
    Binary { opcode: u8, opaque: u32 },
}

/// One memcached request as a semantic command, decoded on the worker from text or binary.
#[derive(Clone, Copy, Debug)]
pub enum McCmd {
    /// Retrieve items, and with `touch` set their expiry too (gat). `keys` is text's
    /// space-separated list, or a binary request's one key (which may hold spaces).
    Get {
        keys: Span,
        cas: bool,
        touch: Option<i64>,
    },
    /// set/add/replace/append/prepend, and text's `cas` (a `Set` with `cas`).
    Store {
        mode: StoreMode,
        key: Span,
        flags: u32,
        exptime: i64,
        value: Span,
        cas: Option<u64>,
    },
    Delete {
        key: Span,
        cas: Option<u64>,
    },
    /// incr/decr; binary's may create the item (`create`: initial value and expiry).
    Arith {
        key: Span,
        incr: bool,
        delta: u64,
        create: Option<(u64, i64)>,
        cas: Option<u64>,
    },
    Touch {
        key: Span,
        exptime: i64,
    },
    Flush {
        delay: i64,
    },
    Stats {
        arg: Option<Span>,
        /// The process's connection counters (`server::Live`, 24 bytes in the arena), written by
        /// the owner loop before apply; empty until then. Not part of a command entry.
        live: Span,
    },
    Lock {
        key: Span,
    },
    Unlock {
        key: Span,
    },
    UnlockAll,
    /// `lock_token KEY`: the caller's fencing token for KEY's lock.
    LockToken {
        key: Span,
    },
    /// yrmcds's LaG (lock and get), with an optional new expiry.
    LockAndGet {
        key: Span,
        touch: Option<i64>,
    },
    /// yrmcds's RaU (replace and unlock).
    ReplaceAndUnlock {
        key: Span,
        flags: u32,
        exptime: i64,
        value: Span,
        cas: Option<u64>,
    },
    /// yrmcds's key dump (`keys [<prefix>]`, binary Keys; an empty prefix lists every key).
    Keys {
        prefix: Span,
    },
    /// Continue this connection's key dump: sent by the worker, not counted in flight, once the
    /// previous chunk went out (`docs/compat.md`).
    KeysNext,
    /// Binary Noop, Version, Verbosity and Quit (text answers its own on the worker): they go
    /// through the owner to keep their place among the connection's replies and in `stats ops`.
    Noop,
    Version,
    Verbosity,
    Quit,
}

/// One memcached request: what it asks, and how to answer.
#[derive(Clone, Copy, Debug)]
pub struct McOp {
    pub cmd: McCmd,
    pub form: McForm,
}

impl McOp {
    pub const fn text(cmd: McCmd, noreply: bool) -> McOp {
        McOp {
            cmd,
            form: McForm::Text { noreply },
        }
    }
}

/// A binary memcached response's header fields that every binary reply has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BinHead {
    pub opcode: u8,
    pub status: u16,
    pub opaque: u32,
}

/// A memcached reply (text or binary).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum McReply {
    /// Text words (`STORED\r\n`).
    Words(&'static [u8]),
    /// incr/decr's new value in text: `<n>\r\n`.
    Number(u64),
    /// `TOKEN <n>\r\n`.
    Token(u64),
    /// A text get's hits (entries written by [`put_item`]), then `END`.
    Items { items: Span, cas: bool },
    /// A binary response without key or extras: success (empty `value`), an error with its
    /// status text, or Version.
    Bin {
        head: BinHead,
        cas: u64,
        value: &'static [u8],
    },
    /// A binary hit: the item's flags as extras, its key (K variants only, else empty) and value.
    BinItem {
        head: BinHead,
        cas: u64,
        flags: u32,
        key: Span,
        value: Span,
    },
    /// A binary response with a key and a static value, no extras (a K variant's miss).
    BinKeyed {
        head: BinHead,
        key: Span,
        value: &'static [u8],
    },
    /// A binary incr/decr: the new value, 8 bytes big-endian.
    BinNumber { head: BinHead, cas: u64, value: u64 },
    /// `stats`: name/value pairs (entries, two per statistic), then the end, or the error for an
    /// unknown group (`known` false).
    Stats {
        form: McForm,
        pairs: Span,
        known: bool,
    },
    /// One step of a key dump: keys (entries), in text (`binary` None) or binary with its
    /// opaque, and whether the dump ends here.
    Keys {
        binary: Option<u32>,
        keys: Span,
        end: bool,
    },
}

/// The memcached protocol.
pub(crate) struct Memcache;

impl Protocol for Memcache {
    type Op = McOp;
    type Reply = McReply;
}
