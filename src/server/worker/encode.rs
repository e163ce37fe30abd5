//! Effects to wire bytes: the worker writes each effect routed to one of its connections
//! straight into that connection's write buffer, with the protocols' encoders (`proto::*`).
//!
//! Owns: the exact reply bytes of every protocol (memcached doc/protocol.txt and yrmcds's
//! texts, old-protocol.txt frames, dlock Responses, yrmcds counter replies). Must not: decide
//! what a reply says (the owner's `exec_*` files chose the effect).

use crate::proto::memcache::binary::{self, opcode as opc, status as st};
use crate::protocol::counter::Counter;
use crate::protocol::dlock::Dlock;
use crate::protocol::lockd::Lockd;
use crate::protocol::Answer;
use crate::server::effect::push_u64;
use crate::server::effect::{BinHead, Body, Entries, ItemIter, McReply};
use crate::server::msg::McForm;

/// Append `body`'s wire bytes to `out`; `a` is the arena its spans name.
#[inline]
pub fn write(out: &mut Vec<u8>, body: &Body, a: &[u8]) {
    match body {
        Body::Nothing | Body::Abort => {}
        Body::Literal(s) => out.extend_from_slice(s.get(a)),
        Body::Mc(r) => mc(out, r, a),
        Body::Lockd(r) => Lockd::write(out, r, a),
        Body::Dlock(r) => Dlock::write(out, r, a),
        Body::Counter(r) => Counter::write(out, r, a),
    }
}

#[inline]
fn bin(out: &mut Vec<u8>, h: &BinHead, cas: u64, extras: &[u8], key: &[u8], value: &[u8]) {
    binary::encode_response(out, h.opcode, h.status, h.opaque, cas, extras, key, value)
}

#[inline]
fn mc(out: &mut Vec<u8>, r: &McReply, a: &[u8]) {
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
