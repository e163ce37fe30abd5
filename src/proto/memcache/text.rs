//! STUB (API fixed, body to be written): memcached text protocol parser.

/// Storage commands that carry a data block.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum StoreCmd {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
}

/// Keys of a retrieval command, borrowed from the request line: iterate to get each key.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Keys<'a> {
    /// The part of the line holding the space-separated keys (already validated: at least one key,
    /// every key 1..=250 bytes).
    pub raw: &'a [u8],
}

impl<'a> Iterator for Keys<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        unimplemented!()
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Request<'a> {
    /// get / gets
    Get {
        keys: Keys<'a>,
        cas: bool,
    },
    /// gat / gats
    Gat {
        exptime: i64,
        keys: Keys<'a>,
        cas: bool,
    },
    /// set / add / replace / append / prepend / cas; `cas_unique` only for Cas.
    Store {
        cmd: StoreCmd,
        key: &'a [u8],
        flags: u32,
        exptime: i64,
        value: &'a [u8],
        cas_unique: u64,
        noreply: bool,
    },
    Delete {
        key: &'a [u8],
        noreply: bool,
    },
    Incr {
        key: &'a [u8],
        delta: u64,
        noreply: bool,
    },
    Decr {
        key: &'a [u8],
        delta: u64,
        noreply: bool,
    },
    Touch {
        key: &'a [u8],
        exptime: i64,
        noreply: bool,
    },
    FlushAll {
        delay: i64,
        noreply: bool,
    },
    /// `stats` with its optional argument (`settings`, `items`, ...).
    Stats {
        arg: Option<&'a [u8]>,
    },
    Version,
    Verbosity {
        noreply: bool,
    },
    Quit,
    Lock {
        key: &'a [u8],
    },
    Unlock {
        key: &'a [u8],
    },
    UnlockAll,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ParseError {
    /// Need more bytes.
    Incomplete,
    /// Answer `reply` (a whole reply line with CRLF, or empty for silence) and discard `skip`
    /// bytes from the start of the buffer. `skip` may exceed the bytes received so far (a value
    /// too large to store is swallowed as it arrives).
    Invalid { reply: &'static [u8], skip: usize },
    /// Answer `reply` and close the connection.
    Fatal { reply: &'static [u8] },
}

/// Parse one request from `buf`. `scanned` is how far an earlier call already looked for the end
/// of the first line without finding it (0 for a fresh buffer); it is updated so that a line
/// arriving one byte at a time is scanned once in all, not once per byte. `max_value` is the
/// largest data block accepted (`--max-item-size`).
#[allow(unused_variables)]
pub fn parse<'a>(
    buf: &'a [u8],
    scanned: &mut usize,
    max_value: usize,
) -> Result<(Request<'a>, usize), ParseError> {
    unimplemented!()
}
