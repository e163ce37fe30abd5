//! etcd v3 through its JSON gateway (grpc-gateway, on the client port) over plain HTTP/1.1
//! keep-alive connections: the lock workload as etcd users write it without the v3lock service.
//!
//! Lock is a create-if-absent transaction: `POST /v3/kv/txn` with
//! `compare: [{key, target: CREATE, create_revision: 0}]` (the key does not exist) and
//! `success: [{request_put: {key, value}}]`; it is granted when the reply says
//! `"succeeded":true`. Unlock is `POST /v3/kv/deleterange {key}`; it is done when the reply says
//! `"deleted":"1"`. Keys and values are base64 in the gateway's JSON (protobuf `bytes`). etcd
//! 3.4's gateway omits fields at their default value, so a failed compare is a reply *without*
//! `"succeeded":true` and deleting nothing is a reply without `"deleted"`.
//!
//! Why the gateway and not gRPC: the bench tool is a mio event loop that writes requests into a
//! reused buffer and checks replies in place; HTTP/1.1 fits that as every other protocol here
//! does, with no async runtime, no generated code and no system `protoc` (which the etcd client
//! crates' build scripts need). The gateway is part of every etcd server since 3.4.
//!
//! Owns: encoding those two requests and delimiting and checking one HTTP/1.1 response.
//! Must not: allocate (requests are appended to the connection's buffer; replies are checked in
//! place), or follow a response it cannot delimit: chunked bodies, heads over [`MAX_HEAD`] and
//! bodies over [`MAX_BODY`] are `Err`, and the caller closes the connection.

use crate::codec::{push_decimal, Checked, Req};

/// Longest response head (status line and headers) accepted: etcd's are about 300 bytes.
const MAX_HEAD: usize = 8 * 1024;
/// Largest response body accepted: a txn or deleterange reply is about 200 bytes.
const MAX_BODY: usize = 64 * 1024;
/// Lock's body, around the base64 key (twice) and value.
const TXN_PARTS: [&[u8]; 4] = [
    br#"{"compare":[{"key":""#,
    br#"","target":"CREATE","create_revision":0}],"success":[{"request_put":{"key":""#,
    br#"","value":""#,
    br#""}}]}"#,
];
const DELETE_PARTS: [&[u8]; 2] = [br#"{"key":""#, br#""}"#];
/// What a granted lock's reply says (the gateway omits `"succeeded"` when it is false).
const GRANTED: &[u8] = br#""succeeded":true"#;
/// What a done unlock's reply says (the gateway omits `"deleted"` when nothing was deleted).
const DELETED_ONE: &[u8] = br#""deleted":"1""#;

/// Append the HTTP/1.1 request for `req` (Lock or Unlock) on `key` to `out`.
pub fn encode(req: Req, key: &[u8], value: &[u8], out: &mut Vec<u8>) {
    let (path, body_len): (&[u8], usize) = match req {
        Req::Lock => (
            b"/v3/kv/txn",
            TXN_PARTS.iter().map(|p| p.len()).sum::<usize>()
                + 2 * base64_len(key.len())
                + base64_len(value.len()),
        ),
        _ => (
            b"/v3/kv/deleterange",
            DELETE_PARTS.iter().map(|p| p.len()).sum::<usize>() + base64_len(key.len()),
        ),
    };
    out.extend_from_slice(b"POST ");
    out.extend_from_slice(path);
    out.extend_from_slice(
        b" HTTP/1.1\r\nHost: etcd\r\nContent-Type: application/json\r\nContent-Length: ",
    );
    push_decimal(out, body_len as u64);
    out.extend_from_slice(b"\r\n\r\n");
    let body_start = out.len();
    if req == Req::Lock {
        out.extend_from_slice(TXN_PARTS[0]);
        base64(key, out);
        out.extend_from_slice(TXN_PARTS[1]);
        base64(key, out);
        out.extend_from_slice(TXN_PARTS[2]);
        base64(value, out);
        out.extend_from_slice(TXN_PARTS[3]);
    } else {
        out.extend_from_slice(DELETE_PARTS[0]);
        base64(key, out);
        out.extend_from_slice(DELETE_PARTS[1]);
    }
    debug_assert_eq!(out.len() - body_start, body_len);
}

fn base64_len(n: usize) -> usize {
    n.div_ceil(3) * 4
}

/// Standard base64 with padding (RFC 4648 section 4), what protobuf JSON uses for `bytes`.
fn base64(data: &[u8], out: &mut Vec<u8>) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(ALPHABET[(n >> 18) as usize & 63]);
        out.push(ALPHABET[(n >> 12) as usize & 63]);
        out.push(if chunk.len() > 1 {
            ALPHABET[(n >> 6) as usize & 63]
        } else {
            b'='
        });
        out.push(if chunk.len() > 2 {
            ALPHABET[n as usize & 63]
        } else {
            b'='
        });
    }
}

/// Look at the front of `buf` for one whole HTTP/1.1 response to `req`: ok when its status is
/// 200 and its body says the lock was granted (Lock) or the key deleted (Unlock).
pub fn check_reply(req: Req, buf: &[u8]) -> Result<Checked, &'static str> {
    let window = &buf[..buf.len().min(MAX_HEAD)];
    let Some(head_len) = find(window, b"\r\n\r\n").map(|at| at + 4) else {
        if buf.len() >= MAX_HEAD {
            return Err("HTTP response head too long");
        }
        if !buf.is_empty() && !b"HTTP/1.".starts_with(&buf[..buf.len().min(7)]) {
            return Err("not an HTTP/1 response");
        }
        return Ok(Checked::Incomplete);
    };
    let head = &buf[..head_len];
    let status = head
        .strip_prefix(b"HTTP/1.1 ")
        .ok_or("not an HTTP/1.1 response")?;
    let mut body_len = None;
    for line in head.split(|&b| b == b'\n').skip(1) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if name.eq_ignore_ascii_case(b"content-length") {
            body_len = Some(parse_len(value).ok_or("bad Content-Length")?);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            return Err("chunked HTTP responses are not followed");
        }
    }
    let body_len = body_len.ok_or("HTTP response without Content-Length")?;
    if body_len > MAX_BODY {
        return Err("HTTP response body too large");
    }
    let len = head_len + body_len;
    if buf.len() < len {
        return Ok(Checked::Incomplete);
    }
    let body = &buf[head_len..len];
    let want = if req == Req::Lock {
        GRANTED
    } else {
        DELETED_ONE
    };
    let ok = status.starts_with(b"200 ") && find(body, want).is_some();
    Ok(Checked::Reply { ok, len })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn parse_len(tok: &[u8]) -> Option<usize> {
    if tok.is_empty() || tok.len() > 9 {
        return None;
    }
    tok.iter().try_fold(0usize, |n, &b| {
        b.is_ascii_digit().then(|| n * 10 + usize::from(b - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: &str, body: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nGrpc-Metadata-Content-Type: \
             application/grpc\r\nDate: Mon, 23 Nov 2026 12:39:59 GMT\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    const HEADER: &str = r#"{"header":{"cluster_id":"324952591200643719","member_id":"3319814642761637952","revision":"2","raft_term":"2"}"#;

    #[test]
    fn base64_matches_rfc4648_test_vectors() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            let mut out = Vec::new();
            base64(plain.as_bytes(), &mut out);
            assert_eq!(out, coded.as_bytes(), "{plain}");
            assert_eq!(base64_len(plain.len()), coded.len());
        }
    }

    #[test]
    fn lock_is_a_create_if_absent_txn_and_unlock_a_delete() {
        let mut out = Vec::new();
        encode(Req::Lock, b"foo", b"x", &mut out);
        let want_body = r#"{"compare":[{"key":"Zm9v","target":"CREATE","create_revision":0}],"success":[{"request_put":{"key":"Zm9v","value":"eA=="}}]}"#;
        let want = format!(
            "POST /v3/kv/txn HTTP/1.1\r\nHost: etcd\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{want_body}",
            want_body.len()
        );
        assert_eq!(String::from_utf8(out).unwrap(), want);
        let mut out = Vec::new();
        encode(Req::Unlock, b"hfb-1:42", b"x", &mut out);
        let want_body = r#"{"key":"aGZiLTE6NDI="}"#;
        let want = format!(
            "POST /v3/kv/deleterange HTTP/1.1\r\nHost: etcd\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{want_body}",
            want_body.len()
        );
        assert_eq!(String::from_utf8(out).unwrap(), want);
    }

    /// Every split point is incomplete; the whole is one reply; a second one behind it
    /// (HTTP/1.1 pipelining) is left alone.
    fn assert_one_reply(req: Req, whole: &[u8], ok: bool) {
        for cut in 0..whole.len() {
            assert_eq!(
                check_reply(req, &whole[..cut]),
                Ok(Checked::Incomplete),
                "{req:?} cut {cut}"
            );
        }
        let mut two = whole.to_vec();
        two.extend_from_slice(whole);
        assert_eq!(
            check_reply(req, &two),
            Ok(Checked::Reply {
                ok,
                len: whole.len()
            }),
            "{req:?} {}",
            String::from_utf8_lossy(whole)
        );
    }

    #[test]
    fn replies_are_checked_for_the_grant_or_the_delete() {
        let granted = format!(
            r#"{HEADER},"succeeded":true,"responses":[{{"response_put":{{"header":{{"revision":"2"}}}}}}]}}"#
        );
        let refused = format!("{HEADER}}}");
        let deleted = format!(r#"{HEADER},"deleted":"1"}}"#);
        assert_one_reply(Req::Lock, &response("200 OK", &granted), true);
        // A failed compare (the key exists): an error, never a retry (keys are disjoint).
        assert_one_reply(Req::Lock, &response("200 OK", &refused), false);
        assert_one_reply(Req::Unlock, &response("200 OK", &deleted), true);
        // Nothing deleted: the lock was not held.
        assert_one_reply(Req::Unlock, &response("200 OK", &refused), false);
        // The right words under another status are still a failure.
        let unavailable = r#"{"error":"etcdserver: leader changed","code":14,"succeeded":true}"#;
        assert_one_reply(
            Req::Lock,
            &response("503 Service Unavailable", unavailable),
            false,
        );
        // The reply to a Lock does not satisfy an Unlock and the reverse.
        assert_one_reply(Req::Unlock, &response("200 OK", &granted), false);
        assert_one_reply(Req::Lock, &response("200 OK", &deleted), false);
    }

    #[test]
    fn streams_that_cannot_be_followed_are_errors() {
        let chunked =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
        let cases: &[&[u8]] = &[
            b"SSH-2.0-OpenSSH\r\n",
            b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n",
            chunked,
        ];
        for &case in cases {
            assert!(
                check_reply(Req::Lock, case).is_err(),
                "{}",
                String::from_utf8_lossy(case)
            );
        }
        let endless = vec![b'a'; MAX_HEAD + 1];
        let mut head = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
        head.extend_from_slice(&endless);
        assert!(check_reply(Req::Lock, &head).is_err());
    }
}
