//! Effects to wire bytes: the worker writes each effect routed to one of its connections
//! straight into that connection's write buffer, with the protocols' encoders (`proto::*`).
//!
//! Owns: the exact reply bytes of every protocol (memcached doc/protocol.txt and yrmcds's
//! texts, old-protocol.txt frames, dlock Responses, yrmcds counter replies). Must not: decide
//! what a reply says (the owner's `exec_*` files chose the effect).

use crate::proto::dlock as dl;
use crate::proto::lockd::{self as ld, op as ld_op};
use crate::proto::memcache::binary::{self, opcode as opc, status as st};
use crate::protocol::counter::Counter;
use crate::protocol::Protocol;
use crate::server::effect::push_u64;
use crate::server::effect::{BinHead, Body, DlockReply, Entries, ItemIter, LockdReply, McReply};
use crate::server::msg::McForm;

/// Append `body`'s wire bytes to `out`; `a` is the arena its spans name.
#[inline]
pub fn write(out: &mut Vec<u8>, body: &Body, a: &[u8]) {
    match body {
        Body::Nothing | Body::Abort => {}
        Body::Literal(s) => out.extend_from_slice(s.get(a)),
        Body::Mc(r) => mc(out, r, a),
        Body::Lockd(r) => lockd(out, r, a),
        Body::Dlock(r) => dlock(out, r, a),
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

#[inline]
fn lockd(out: &mut Vec<u8>, r: &LockdReply, a: &[u8]) {
    match *r {
        LockdReply::Frame { opcode, payload } => ld::encode(out, opcode, payload.get(a)),
        LockdReply::Token { name, token } => {
            let name = name.get(a);
            out.extend_from_slice(&ld::header(ld_op::ACK, name.len() + 9));
            out.extend_from_slice(name);
            out.push(0);
            out.extend_from_slice(&token.to_be_bytes());
        }
        LockdReply::Sync { names } => sync(out, names.get(a)),
    }
}

/// SYNC: every locked name, NUL-terminated. One frame when it fits (as the original daemon
/// answers); otherwise several frames each holding whole names, then an empty one.
fn sync(w: &mut Vec<u8>, names: &[u8]) {
    let mut frame_start = w.len();
    let mut split = false;
    ld::encode(w, ld_op::SYNC_REPLY, &[]);
    for name in names.split_inclusive(|&b| b == 0) {
        let used = w.len() - frame_start - ld::HEADER_LEN;
        if used + name.len() > ld::MAX_PAYLOAD {
            patch_length(w, frame_start);
            frame_start = w.len();
            split = true;
            ld::encode(w, ld_op::SYNC_REPLY, &[]);
        }
        w.extend_from_slice(name);
    }
    patch_length(w, frame_start);
    if split {
        ld::encode(w, ld_op::SYNC_REPLY, &[]);
    }
}

/// Rewrite the header at `start` with the length of the payload that follows it.
fn patch_length(w: &mut [u8], start: usize) {
    let len = w.len() - start - ld::HEADER_LEN;
    w[start..start + ld::HEADER_LEN].copy_from_slice(&ld::header(ld_op::SYNC_REPLY, len));
}

#[inline]
fn dlock(out: &mut Vec<u8>, r: &DlockReply, a: &[u8]) {
    dl::encode_response_fenced(
        out,
        r.id,
        r.status,
        r.text,
        Entries(r.keys.get(a)),
        r.time,
        r.fence,
    )
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

    #[test]
    fn a_sync_that_outgrows_a_frame_splits_at_whole_names_and_ends_with_an_empty_frame() {
        let name = vec![b'n'; 1000];
        let mut names = Vec::new();
        for _ in 0..2000 {
            names.extend_from_slice(&name);
            names.push(0);
        }
        let mut out = Vec::new();
        sync(&mut out, &names);
        let mut rest = &out[..];
        let mut payloads = Vec::new();
        while let Some((h, tail)) = rest.split_first_chunk::<4>() {
            let h = u32::from_be_bytes(*h);
            let len = (h & 0xf_ffff) as usize;
            assert_eq!((h >> 20) & 0xff, u32::from(ld_op::SYNC_REPLY));
            payloads.push(&tail[..len]);
            rest = &tail[len..];
        }
        assert_eq!(payloads.len(), 3, "two full frames and the empty one");
        assert!(payloads[0].len() <= ld::MAX_PAYLOAD && payloads[0].len() % 1001 == 0);
        assert!(payloads[2].is_empty());
        assert_eq!(payloads.concat(), names);
    }
}
