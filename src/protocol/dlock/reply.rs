//! dlock Responses: their wire bytes and their canonical bytes.

use super::wire as dl;
use super::{Dlock, DlockOp, DlockReply};
use crate::core::codec::{put_bool, put_bytes, put_opt_u64, put_u64, put_u8};
use crate::protocol::Answer;
use crate::server::effect::Entries;
use crate::server::msg::Span;

/// Tags of the canonical encoding (`server::effect::tag` lists every protocol's).
pub mod tag {
    pub const RESPONSE: u8 = 30;
    /// A version-3 Response's marker and fields, after the keys.
    pub const NATIVE: u8 = 31;
}

/// The error text of a no-quorum answer.
const NO_QUORUM: &str = "no quorum";

impl Answer for Dlock {
    #[inline]
    fn write(out: &mut Vec<u8>, r: &DlockReply, a: &[u8]) {
        if r.native {
            return dl::encode_native_response_with(
                out,
                r.id,
                r.status,
                r.text,
                Entries(r.keys.get(a)),
                r.time,
                r.fence,
                r.extra.get(a),
            );
        }
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

    fn encode_canonical(r: &DlockReply, a: &[u8], out: &mut Vec<u8>) {
        put_u8(out, tag::RESPONSE);
        put_opt_u64(out, r.id);
        put_u64(out, u64::from(r.status));
        match r.text {
            Some(t) => {
                put_bool(out, true);
                put_bytes(out, t.as_bytes());
            }
            None => put_bool(out, false),
        }
        put_u64(out, r.time as u64);
        put_opt_u64(out, r.fence);
        Entries(r.keys.get(a)).for_each(|e| put_bytes(out, e));
        if r.native {
            // (After the keys, which a reader of the old encoding counts to the end.)
            put_u8(out, tag::NATIVE);
            put_bytes(out, r.extra.get(a));
        }
    }

    fn spans_mut(r: &mut DlockReply, mut f: impl FnMut(&mut Span)) {
        f(&mut r.keys);
        f(&mut r.extra);
    }

    /// A General error, "no quorum".
    fn no_quorum(op: &DlockOp, _arena: &[u8], now_unix_ms: u64, out: &mut Vec<u8>) {
        let no_keys: [&[u8]; 0] = [];
        if op.kind.is_native() {
            let reply = dl::NativeReply {
                request_id: op.id,
                status: dl::status::GENERAL,
                error_text: Some(NO_QUORUM),
                server_unix_time: (now_unix_ms / 1000) as i64,
                ..dl::NativeReply::default()
            };
            return dl::encode_native_response(out, &reply);
        }
        dl::encode_response(
            out,
            op.id,
            dl::status::GENERAL,
            Some(NO_QUORUM),
            no_keys,
            (now_unix_ms / 1000) as i64,
        );
    }
}
