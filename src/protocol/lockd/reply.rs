//! Old lock-daemon replies: their wire bytes (a SYNC split into frames of whole names when it
//! outgrows one) and their canonical bytes.

use super::wire::{self as ld, op as ld_op};
use super::{Lockd, LockdOp, LockdReply};
use crate::core::codec::{put_bytes, put_u64, put_u8};
use crate::protocol::Answer;
use crate::server::msg::Span;

/// Tags of the canonical encoding (`server::effect::tag` lists every protocol's).
pub mod tag {
    /// Followed by the opcode (one byte) and the payload (the rest): what the cluster
    /// simulator's lockd check reads.
    pub const FRAME: u8 = 20;
    pub const TOKEN: u8 = 21;
    pub const SYNC: u8 = 22;
}

impl Answer for Lockd {
    #[inline]
    fn write(out: &mut Vec<u8>, r: &LockdReply, a: &[u8]) {
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

    fn encode_canonical(r: &LockdReply, a: &[u8], out: &mut Vec<u8>) {
        match *r {
            LockdReply::Frame { opcode, payload } => {
                put_u8(out, tag::FRAME);
                put_u8(out, opcode);
                out.extend_from_slice(payload.get(a));
            }
            LockdReply::Token { name, token } => {
                put_u8(out, tag::TOKEN);
                put_bytes(out, name.get(a));
                put_u64(out, token);
            }
            LockdReply::Sync { names } => {
                put_u8(out, tag::SYNC);
                put_bytes(out, names.get(a));
            }
        }
    }

    fn spans_mut(r: &mut LockdReply, mut f: impl FnMut(&mut Span)) {
        match r {
            LockdReply::Frame { payload, .. } => f(payload),
            LockdReply::Token { name, .. } => f(name),
            LockdReply::Sync { names } => f(names),
        }
    }

    /// ERR, echoing the payload.
    fn no_quorum(op: &LockdOp, arena: &[u8], _now_unix_ms: u64, out: &mut Vec<u8>) {
        ld::encode(out, ld_op::ERR, op.payload.get(arena));
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

#[cfg(test)]
mod tests {
    use super::*;

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
