//! memcached replies, text and binary: their wire bytes, their canonical bytes, and the arena
//! layout of a text get's hits.

use super::wire::binary::{self, opcode as opc, status as st};
use super::{BinHead, McForm, McOp, McReply, Memcache};
use crate::core::codec::{put_bool, put_bytes, put_opt_u64, put_u64, put_u8};
use crate::protocol::Answer;
use crate::server::effect::{push_u64, put_entry, take_entry, take_u32, take_u64, Entries};
use crate::server::msg::{Arena, Span};

/// Tags of the canonical encoding (`server::effect::tag` lists every protocol's).
pub mod tag {
    pub const WORDS: u8 = 10;
    pub const NUMBER: u8 = 11;
    pub const TOKEN: u8 = 12;
    pub const ITEMS: u8 = 13;
    pub const BIN: u8 = 14;
    pub const BIN_ITEM: u8 = 15;
    pub const BIN_NUMBER: u8 = 16;
    pub const STATS: u8 = 17;
    pub const KEYS: u8 = 18;
    pub const BIN_KEYED: u8 = 19;
}

/// binary protocol status "temporary failure" (memcached's PROTOCOL_BINARY_RESPONSE_ETMPFAIL).
const BINARY_TEMPORARY_FAILURE: u16 = 0x0086;
/// The error text of a no-quorum answer.
const NO_QUORUM: &str = "no quorum";

impl Answer for Memcache {
    #[inline]
    fn write(out: &mut Vec<u8>, r: &McReply, a: &[u8]) {
        match *r {
            McReply::Words(w) => out.extend_from_slice(w),
            McReply::Bin { head, cas, value } => bin(out, &head, cas, &[], &[], value),
            McReply::Number(n) => {
                push_u64(out, n);
                out.extend_from_slice(b"\r\n");
            }
            McReply::Token(n) => {
                out.extend_from_slice(b"TOKEN ");
                push_u64(out, n);
                out.extend_from_slice(b"\r\n");
            }
            McReply::Items { items, cas } => {
                for it in ItemIter(items.get(a)) {
                    text_value(out, it.key, it.flags, it.value, cas.then_some(it.cas));
                }
                out.extend_from_slice(b"END\r\n");
            }
            McReply::BinItem {
                head,
                cas,
                flags,
                key,
                value,
            } => bin(
                out,
                &head,
                cas,
                &flags.to_be_bytes(),
                key.get(a),
                value.get(a),
            ),
            McReply::BinKeyed { head, key, value } => bin(out, &head, 0, &[], key.get(a), value),
            McReply::BinNumber { head, cas, value } => {
                bin(out, &head, cas, &[], &[], &value.to_be_bytes())
            }
            McReply::Stats { form, pairs, known } => {
                let mut e = Entries(pairs.get(a));
                while let (Some(name), Some(value)) = (e.next(), e.next()) {
                    match form {
                        McForm::Text { .. } => {
                            out.extend_from_slice(b"STAT ");
                            out.extend_from_slice(name);
                            out.push(b' ');
                            out.extend_from_slice(value);
                            out.extend_from_slice(b"\r\n");
                        }
                        McForm::Binary { opcode, opaque } => binary::encode_response(
                            out,
                            opcode,
                            st::NO_ERROR,
                            opaque,
                            0,
                            &[],
                            name,
                            value,
                        ),
                    }
                }
                match (form, known) {
                    (McForm::Text { .. }, true) => out.extend_from_slice(b"END\r\n"),
                    (McForm::Text { .. }, false) => out.extend_from_slice(b"ERROR\r\n"),
                    (McForm::Binary { opcode, opaque }, true) => {
                        binary::encode_response(out, opcode, st::NO_ERROR, opaque, 0, &[], &[], &[])
                    }
                    (McForm::Binary { opcode, opaque }, false) => binary::encode_response(
                        out,
                        opcode,
                        st::KEY_NOT_FOUND,
                        opaque,
                        0,
                        &[],
                        &[],
                        b"Not found",
                    ),
                }
            }
            McReply::Keys { binary, keys, end } => {
                for key in Entries(keys.get(a)) {
                    match binary {
                        None => {
                            out.extend_from_slice(b"VALUE ");
                            out.extend_from_slice(key);
                            out.extend_from_slice(b"\r\n");
                        }
                        Some(opaque) => binary::encode_response(
                            out,
                            opc::KEYS,
                            st::NO_ERROR,
                            opaque,
                            0,
                            &[],
                            key,
                            &[],
                        ),
                    }
                }
                if end {
                    match binary {
                        None => out.extend_from_slice(b"END\r\n"),
                        Some(opaque) => binary::encode_response(
                            out,
                            opc::KEYS,
                            st::NO_ERROR,
                            opaque,
                            0,
                            &[],
                            &[],
                            &[],
                        ),
                    }
                }
            }
        }
    }

    fn encode_canonical(r: &McReply, a: &[u8], out: &mut Vec<u8>) {
        let head = |out: &mut Vec<u8>, h: &BinHead| {
            put_u8(out, h.opcode);
            put_u64(out, u64::from(h.status));
            put_u64(out, u64::from(h.opaque));
        };
        match *r {
            McReply::Words(w) => {
                put_u8(out, tag::WORDS);
                put_bytes(out, w);
            }
            McReply::Number(n) => {
                put_u8(out, tag::NUMBER);
                put_u64(out, n);
            }
            McReply::Token(n) => {
                put_u8(out, tag::TOKEN);
                put_u64(out, n);
            }
            McReply::Items { items, cas } => {
                put_u8(out, tag::ITEMS);
                put_bool(out, cas);
                for it in ItemIter(items.get(a)) {
                    put_bytes(out, it.key);
                    put_u64(out, u64::from(it.flags));
                    put_u64(out, it.cas);
                    put_bytes(out, it.value);
                }
            }
            McReply::Bin {
                head: h,
                cas,
                value,
            } => {
                put_u8(out, tag::BIN);
                head(out, &h);
                put_u64(out, cas);
                put_bytes(out, value);
            }
            McReply::BinItem {
                head: h,
                cas,
                flags,
                key,
                value,
            } => {
                put_u8(out, tag::BIN_ITEM);
                head(out, &h);
                put_u64(out, cas);
                put_u64(out, u64::from(flags));
                put_bytes(out, key.get(a));
                put_bytes(out, value.get(a));
            }
            McReply::BinKeyed {
                head: h,
                key,
                value,
            } => {
                put_u8(out, tag::BIN_KEYED);
                head(out, &h);
                put_bytes(out, key.get(a));
                put_bytes(out, value);
            }
            McReply::BinNumber {
                head: h,
                cas,
                value,
            } => {
                put_u8(out, tag::BIN_NUMBER);
                head(out, &h);
                put_u64(out, cas);
                put_u64(out, value);
            }
            McReply::Stats { form, pairs, known } => {
                put_u8(out, tag::STATS);
                match form {
                    McForm::Text { noreply } => {
                        put_u8(out, 0);
                        put_bool(out, noreply);
                    }
                    McForm::Binary { opcode, opaque } => {
                        put_u8(out, 1);
                        put_u8(out, opcode);
                        put_u64(out, u64::from(opaque));
                    }
                }
                put_bool(out, known);
                Entries(pairs.get(a)).for_each(|e| put_bytes(out, e));
            }
            McReply::Keys { binary, keys, end } => {
                put_u8(out, tag::KEYS);
                put_opt_u64(out, binary.map(u64::from));
                put_bool(out, end);
                Entries(keys.get(a)).for_each(|e| put_bytes(out, e));
            }
        }
    }

    fn spans_mut(r: &mut McReply, mut f: impl FnMut(&mut Span)) {
        match r {
            McReply::Words(_)
            | McReply::Number(_)
            | McReply::Token(_)
            | McReply::Bin { .. }
            | McReply::BinNumber { .. } => {}
            McReply::Items { items, .. } => f(items),
            McReply::BinItem { key, value, .. } => {
                f(key);
                f(value);
            }
            McReply::BinKeyed { key, .. } => f(key),
            McReply::Stats { pairs, .. } => f(pairs),
            McReply::Keys { keys, .. } => f(keys),
        }
    }

    /// Text: `SERVER_ERROR no quorum` (nothing for noreply); binary: a temporary failure.
    fn no_quorum(op: &McOp, _arena: &[u8], _now_unix_ms: u64, w: &mut Vec<u8>) {
        match op.form {
            McForm::Text { noreply: true } => {}
            McForm::Text { noreply: false } => w.extend_from_slice(b"SERVER_ERROR no quorum\r\n"),
            McForm::Binary { opcode, opaque } => binary::encode_response(
                w,
                opcode,
                BINARY_TEMPORARY_FAILURE,
                opaque,
                0,
                &[],
                &[],
                NO_QUORUM.as_bytes(),
            ),
        }
    }
}

#[inline]
fn bin(out: &mut Vec<u8>, h: &BinHead, cas: u64, extras: &[u8], key: &[u8], value: &[u8]) {
    binary::encode_response(out, h.opcode, h.status, h.opaque, cas, extras, key, value)
}

/// `VALUE <key> <flags> <bytes> [<cas>]\r\n<data>\r\n`
fn text_value(o: &mut Vec<u8>, key: &[u8], flags: u32, value: &[u8], cas: Option<u64>) {
    o.extend_from_slice(b"VALUE ");
    o.extend_from_slice(key);
    o.push(b' ');
    push_u64(o, u64::from(flags));
    o.push(b' ');
    push_u64(o, value.len() as u64);
    if let Some(cas) = cas {
        o.push(b' ');
        push_u64(o, cas);
    }
    o.extend_from_slice(b"\r\n");
    o.extend_from_slice(value);
    o.extend_from_slice(b"\r\n");
}

/// The length of [`text_value`]'s bytes, without writing them (a text get's reply cap is
/// checked on the owner, before anything is encoded).
pub fn text_value_len(key: usize, flags: u32, value: usize, cas: Option<u64>) -> usize {
    let mut n = b"VALUE ".len() + key + 1 + digits(u64::from(flags)) + 1;
    n += digits(value as u64) + 2 + value + 2;
    if let Some(cas) = cas {
        n += 1 + digits(cas);
    }
    n
}

fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// One hit of a text get, as [`put_item`] writes it.
pub struct ItemEntry<'a> {
    pub key: &'a [u8],
    pub flags: u32,
    pub cas: u64,
    pub value: &'a [u8],
}

/// Append one item: flags, cas, key entry, value entry.
pub fn put_item(a: &mut Arena, key: &[u8], flags: u32, cas: u64, value: &[u8]) {
    a.bytes.extend_from_slice(&flags.to_le_bytes());
    a.bytes.extend_from_slice(&cas.to_le_bytes());
    put_entry(a, key);
    put_entry(a, value);
}

pub struct ItemIter<'a>(pub &'a [u8]);

impl<'a> Iterator for ItemIter<'a> {
    type Item = ItemEntry<'a>;

    fn next(&mut self) -> Option<ItemEntry<'a>> {
        let mut b = self.0;
        let item = (|| {
            let flags = take_u32(&mut b)?;
            let cas = take_u64(&mut b)?;
            let key = take_entry(&mut b)?;
            let value = take_entry(&mut b)?;
            Some(ItemEntry {
                key,
                flags,
                cas,
                value,
            })
        })();
        self.0 = if item.is_some() { b } else { &[] };
        item
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_value_len_counts_what_text_value_writes() {
        for (key, flags, value, cas) in [
            (&b"k"[..], 0, &b""[..], None),
            (b"key", 4_294_967_295, b"0123456789", Some(0)),
            (b"x", 10, b"v", Some(u64::MAX)),
            (b"", 9, b"99", Some(10)),
        ] {
            let mut out = Vec::new();
            text_value(&mut out, key, flags, value, cas);
            assert_eq!(
                text_value_len(key.len(), flags, value.len(), cas),
                out.len()
            );
        }
    }
}
