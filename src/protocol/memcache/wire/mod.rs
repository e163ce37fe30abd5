//! memcached text and binary (memcached's doc/protocol.txt and doc/protocol-binary.xml), with
//! yrmcds's lock commands. A connection tells them apart by the first byte of each request:
//! 0x80 is a binary request, anything else a text line.

pub mod binary;
pub mod text;

/// Longest key memcached accepts (protocol.txt: "the key must not include control characters or
/// whitespace" and is at most 250 bytes).
pub const MAX_KEY_LEN: usize = 250;

/// The binary request magic byte.
pub const BINARY_REQUEST_MAGIC: u8 = 0x80;
