//! Helpers shared by the fuzz targets: request encoders the main crate has no use for (a client
//! writes memcached text and binary requests, the daemon only parses them), the parse loops that
//! mirror the daemon's (consume, skip, stop on incomplete), the connection script driver, and
//! the TLS boundary driver.

pub mod script;
pub mod tls;

use holdfast::proto::dlock as dl;
use holdfast::proto::memcache::{binary, text, BINARY_REQUEST_MAGIC, MAX_KEY_LEN};

/// A memcached text request written back as a client would send it: single spaces, numbers in
/// canonical decimal, `\r\n` line ends. Parsing the result gives the same request.
pub fn encode_text(req: &text::Request<'_>) -> Vec<u8> {
    use text::Request as R;
    let mut out = Vec::new();
    let num = |out: &mut Vec<u8>, n: &dyn std::fmt::Display| {
        out.push(b' ');
        out.extend_from_slice(n.to_string().as_bytes());
    };
    let word = |out: &mut Vec<u8>, w: &[u8]| {
        out.push(b' ');
        out.extend_from_slice(w);
    };
    let noreply = |out: &mut Vec<u8>, nr: bool| {
        if nr {
            out.extend_from_slice(b" noreply");
        }
    };
    match *req {
        R::Get { keys, cas } => {
            out.extend_from_slice(if cas { b"gets" } else { b"get" });
            for k in keys {
                word(&mut out, k);
            }
        }
        R::Gat { exptime, keys, cas } => {
            out.extend_from_slice(if cas { b"gats" } else { b"gat" });
            num(&mut out, &exptime);
            for k in keys {
                word(&mut out, k);
            }
        }
        R::Store {
            cmd,
            key,
            flags,
            exptime,
            value,
            cas_unique,
            noreply: nr,
        } => {
            use text::StoreCmd as S;
            let name: &[u8] = match cmd {
                S::Set => b"set",
                S::Add => b"add",
                S::Replace => b"replace",
                S::Append => b"append",
                S::Prepend => b"prepend",
                S::Cas => b"cas",
            };
            out.extend_from_slice(name);
            word(&mut out, key);
            num(&mut out, &flags);
            num(&mut out, &exptime);
            num(&mut out, &value.len());
            if cmd == S::Cas {
                num(&mut out, &cas_unique);
            }
            noreply(&mut out, nr);
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(value);
        }
        R::Delete { key, noreply: nr } => {
            out.extend_from_slice(b"delete");
            word(&mut out, key);
            noreply(&mut out, nr);
        }
        R::Incr {
            key,
            delta,
            noreply: nr,
        }
        | R::Decr {
            key,
            delta,
            noreply: nr,
        } => {
            let name: &[u8] = if matches!(req, R::Incr { .. }) {
                b"incr"
            } else {
                b"decr"
            };
            out.extend_from_slice(name);
            word(&mut out, key);
            num(&mut out, &delta);
            noreply(&mut out, nr);
        }
        R::Touch {
            key,
            exptime,
            noreply: nr,
        } => {
            out.extend_from_slice(b"touch");
            word(&mut out, key);
            num(&mut out, &exptime);
            noreply(&mut out, nr);
        }
        R::FlushAll { delay, noreply: nr } => {
            out.extend_from_slice(b"flush_all");
            num(&mut out, &delay);
            noreply(&mut out, nr);
        }
        R::Stats { arg } => {
            out.extend_from_slice(b"stats");
            if let Some(a) = arg {
                word(&mut out, a);
            }
        }
        R::Version => out.extend_from_slice(b"version"),
        R::Verbosity { noreply: nr } => {
            out.extend_from_slice(b"verbosity 1");
            noreply(&mut out, nr);
        }
        R::Quit => out.extend_from_slice(b"quit"),
        R::Lock { key } => {
            out.extend_from_slice(b"lock");
            word(&mut out, key);
        }
        R::Unlock { key } => {
            out.extend_from_slice(b"unlock");
            word(&mut out, key);
        }
        R::UnlockAll => out.extend_from_slice(b"unlock_all"),
        R::LockToken { key } => {
            out.extend_from_slice(b"lock_token");
            word(&mut out, key);
        }
        R::Keys { prefix } => {
            out.extend_from_slice(b"keys");
            if !prefix.is_empty() {
                word(&mut out, prefix);
            }
        }
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// The keys a text request names (for the key-length invariant).
pub fn text_keys<'a>(req: &text::Request<'a>) -> Vec<&'a [u8]> {
    use text::Request as R;
    match *req {
        R::Get { keys, .. } | R::Gat { keys, .. } => keys.collect(),
        R::Store { key, .. }
        | R::Delete { key, .. }
        | R::Incr { key, .. }
        | R::Decr { key, .. }
        | R::Touch { key, .. }
        | R::Lock { key }
        | R::Unlock { key }
        | R::LockToken { key } => vec![key],
        // `keys` without a prefix lists every key (yrmcds's `keys [PREFIX]`): an empty prefix
        // is no key; a prefix given obeys the key rules.
        R::Keys { prefix } if !prefix.is_empty() => vec![prefix],
        _ => Vec::new(),
    }
}

/// Parse memcached text requests out of `data` as the daemon does: `chunk` bytes arrive at a
/// time (the `scanned` state carried across), every request is checked, a refused one is skipped,
/// the loop stops at an incomplete request or a fatal error.
pub fn fuzz_text(data: &[u8], chunk: usize, max_value: usize) {
    let chunk = chunk.max(1);
    let mut pos = 0;
    while pos < data.len() {
        let mut scanned = 0;
        let mut end = (pos + chunk).min(data.len());
        let result = loop {
            let buf = &data[pos..end];
            let r = text::parse(buf, &mut scanned, max_value);
            if r == Err(text::ParseError::Incomplete) && end < data.len() {
                end = (end + chunk).min(data.len());
                continue;
            }
            break r;
        };
        let buf = &data[pos..end];
        // Parsing in pieces must agree with parsing the same bytes at once.
        let mut fresh = 0;
        assert_eq!(
            result,
            text::parse(buf, &mut fresh, max_value),
            "incremental parse differs"
        );
        match result {
            Ok((req, n)) => {
                assert!(n > 0 && n <= buf.len(), "consumed {n} of {}", buf.len());
                for k in text_keys(&req) {
                    assert!(!k.is_empty() && k.len() <= MAX_KEY_LEN, "key {k:?}");
                    assert!(!k.contains(&b' ') && !k.contains(&b'\n'), "key {k:?}");
                }
                if let text::Request::Store { value, .. } = req {
                    assert!(value.len() <= max_value);
                }
                let again = encode_text(&req);
                // A maximal line sent with a bare `\n` is one byte longer with `\r\n`.
                let line = again.iter().position(|&b| b == b'\n').unwrap_or(0) + 1;
                if line < text::MAX_LINE {
                    let mut s = 0;
                    let (req2, n2) = text::parse(&again, &mut s, max_value)
                        .unwrap_or_else(|e| panic!("re-encoded {again:?} fails: {e:?}"));
                    assert_eq!(n2, again.len(), "re-encoded {again:?}");
                    assert_eq!(encode_text(&req2), again, "round trip of {req:?}");
                }
                pos += n;
            }
            Err(text::ParseError::Invalid { reply, skip }) => {
                assert!(skip >= 1);
                assert!(reply.is_empty() || reply.ends_with(b"\r\n"));
                pos = pos.saturating_add(skip);
            }
            Err(text::ParseError::Incomplete) | Err(text::ParseError::Fatal { .. }) => break,
        }
    }
}

/// A binary request frame with exactly these fields (the header's lengths computed).
pub fn encode_binary(req: &binary::Request<'_>) -> Vec<u8> {
    let body = req.extras.len() + req.key.len() + req.value.len();
    let mut v = vec![BINARY_REQUEST_MAGIC, req.opcode];
    v.extend_from_slice(&(req.key.len() as u16).to_be_bytes());
    v.push(req.extras.len() as u8);
    v.push(req.data_type);
    v.extend_from_slice(&req.vbucket.to_be_bytes());
    v.extend_from_slice(&(body as u32).to_be_bytes());
    v.extend_from_slice(&req.opaque.to_be_bytes());
    v.extend_from_slice(&req.cas.to_be_bytes());
    v.extend_from_slice(req.extras);
    v.extend_from_slice(req.key);
    v.extend_from_slice(req.value);
    v
}

pub fn fuzz_binary(data: &[u8], max_value: usize) {
    let mut pos = 0;
    while pos < data.len() {
        let buf = &data[pos..];
        match binary::parse(buf, max_value) {
            Ok((req, n)) => {
                assert!(n <= buf.len());
                assert_eq!(
                    n,
                    binary::HEADER_LEN + req.extras.len() + req.key.len() + req.value.len()
                );
                assert!(req.key.len() <= MAX_KEY_LEN);
                assert!(req.value.len() <= max_value);
                let again = encode_binary(&req);
                assert_eq!(again, buf[..n], "re-encoding differs from the frame");
                assert_eq!(binary::parse(&again, max_value), Ok((req, n)));
                pos += n;
            }
            Err(binary::ParseError::Refuse { skip, status, .. }) => {
                assert!(skip >= binary::HEADER_LEN);
                assert_eq!(status, binary::status::VALUE_TOO_LARGE);
                pos = pos.saturating_add(skip);
            }
            Err(binary::ParseError::Fatal) | Err(binary::ParseError::Incomplete) => break,
        }
    }
}

pub fn fuzz_lockd(data: &[u8]) {
    use holdfast::proto::lockd as ld;
    let mut pos = 0;
    while pos < data.len() {
        let buf = &data[pos..];
        let Some((frame, n)) = ld::parse(buf) else {
            assert!(
                buf.len() < ld::HEADER_LEN
                    || buf.len() - ld::HEADER_LEN
                        < (u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) & 0xf_ffff)
                            as usize,
                "a complete frame reported incomplete"
            );
            break;
        };
        assert!(n <= buf.len() && n == ld::HEADER_LEN + frame.payload.len());
        assert!(frame.payload.len() <= ld::MAX_PAYLOAD);
        assert!(frame.version < 16);
        assert_eq!(ld::peek_version(buf), Some(frame.version));
        if let Some(name) = frame.name() {
            assert!(!name.contains(&0));
            assert_eq!(frame.payload.get(name.len()), Some(&0));
            assert!(frame.payload.starts_with(name));
        } else {
            assert!(!frame.payload.contains(&0));
        }
        if frame.version == ld::VERSION {
            let mut again = Vec::new();
            ld::encode(&mut again, frame.opcode, frame.payload);
            assert_eq!(again, buf[..n], "re-encoding differs from the frame");
            assert_eq!(ld::parse(&again), Some((frame, n)));
        }
        pos += n;
    }
}

/// Any dlock Request with exactly these fields present (unlike `encode_request`, which always
/// writes version 2 and a type).
pub fn encode_dlock(req: &dl::Request<'_>) -> Vec<u8> {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v & 0x7f) as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    fn bytes(out: &mut Vec<u8>, field: u64, b: &[u8]) {
        varint(out, field << 3 | 2);
        varint(out, b.len() as u64);
        out.extend_from_slice(b);
    }
    let mut body = Vec::new();
    if let Some(v) = req.version {
        varint(&mut body, 1 << 3);
        varint(&mut body, v);
    }
    if let Some(v) = req.id {
        varint(&mut body, 2 << 3);
        varint(&mut body, v);
    }
    if let Some(t) = req.access_token {
        bytes(&mut body, 3, t);
    }
    if let Some(v) = req.req_type {
        varint(&mut body, 4 << 3);
        varint(&mut body, v);
    }
    if let Some(l) = req.lock {
        let mut lock = Vec::new();
        if let Some(v) = l.wait_micro {
            varint(&mut lock, 1 << 3);
            varint(&mut lock, v);
        }
        if let Some(v) = l.release_micro {
            varint(&mut lock, 2 << 3);
            varint(&mut lock, v);
        }
        for k in l.keys {
            bytes(&mut lock, 3, k);
        }
        bytes(&mut body, 51, &lock);
    }
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

/// The fields of a Request, owned, keys collected: equal exactly when two requests mean the same.
pub type DlockFields = (
    Option<u64>,
    Option<u64>,
    Option<Vec<u8>>,
    Option<u64>,
    Option<(Option<u64>, Option<u64>, usize, Vec<Vec<u8>>)>,
);

pub fn dlock_fields(req: &dl::Request<'_>) -> DlockFields {
    (
        req.version,
        req.id,
        req.access_token.map(<[u8]>::to_vec),
        req.req_type,
        req.lock.map(|l| {
            (
                l.wait_micro,
                l.release_micro,
                l.key_count,
                l.keys.map(<[u8]>::to_vec).collect(),
            )
        }),
    )
}

pub fn fuzz_dlock(data: &[u8], max_message: usize) {
    let mut pos = 0;
    while pos < data.len() {
        let buf = &data[pos..];
        let (body, n) = match dl::parse_frame(buf, max_message) {
            Ok(x) => x,
            Err(_) => break,
        };
        assert!(n <= buf.len() && n == dl::PREFIX_LEN + body.len());
        assert!(body.len() <= max_message);
        // The client-side decoder must not panic on anything either.
        let _ = dl::decode_response(body);
        if let Ok(req) = dl::decode_request(body) {
            let fields = dlock_fields(&req);
            if let Some(l) = req.lock {
                assert_eq!(l.key_count, l.keys.count(), "key count");
            }
            let again = encode_dlock(&req);
            let (b2, n2) = dl::parse_frame(&again, usize::MAX).expect("one frame");
            assert_eq!(n2, again.len());
            let req2 = dl::decode_request(b2).expect("re-encoded request decodes");
            assert_eq!(dlock_fields(&req2), fields);
            // The crate's own client encoder, where it can express the request.
            if let (None | Some(dl::API_VERSION), Some(t)) = (req.version, req.req_type) {
                let keys: Vec<&[u8]> = req.lock.map(|l| l.keys.collect()).unwrap_or_default();
                let lock = req.lock.map(|l| dl::LockFields {
                    wait_micro: l.wait_micro,
                    release_micro: l.release_micro,
                    keys: &keys,
                    native: Default::default(),
                });
                let mut out = Vec::new();
                dl::encode_request(&mut out, req.id, req.access_token, t, lock);
                let (b3, _) = dl::parse_frame(&out, usize::MAX).expect("one frame");
                let req3 = dl::decode_request(b3).expect("encode_request output decodes");
                let mut want = fields.clone();
                want.0 = Some(dl::API_VERSION);
                assert_eq!(dlock_fields(&req3), want);
            }
        }
        pos += n;
    }
}

/// The dlock lock table driven by arbitrary bytes: version-2 and version-3 requests of eight
/// sessions on five keys (Lock, shared Lock, semaphores, values, lock-delay, Unlock with and
/// without fence, Extend, disconnects, Get, CheckFence) with time moving on. After every
/// operation the table's invariants hold, Get agrees with CheckFence, and a snapshot restores to
/// a table that snapshots to the same bytes.
pub fn fuzz_dlock_table(data: &[u8]) {
    use holdfast::core::codec::{Reader, Snapshot};
    use holdfast::core::dlock::{
        DlockConfig, DlockEvent, DlockTable, LockRequest, LockResult, NativeLock,
    };
    use holdfast::core::Session;
    const KEYS: [&[u8]; 5] = [b"a", b"b", b"c", b"d", b"e"];
    let mut bytes = data.iter().copied();
    let Some(first) = bytes.next() else {
        return;
    };
    let config = DlockConfig {
        idle_timeout_ms: if first & 1 == 0 { 0 } else { 40 },
    };
    let mut t = DlockTable::new(config, 0);
    t.set_key_events(first & 2 != 0);
    let mut now = 0u64;
    let mut events: Vec<DlockEvent> = Vec::new();
    // Sessions 0 to 3 speak version 2 (one Lock at a time), 4 to 7 version 3.
    let mut v2_waiting = [false; 4];
    // A closed session's id is never used again (as in the daemon): slot `s` is session
    // `8 * generation + s`.
    let mut generation = [0u64; 8];
    let mut id = 0u64;
    let mut next = move || bytes.next();
    while let Some(op) = next() {
        let arg = next().unwrap_or(0);
        let s = usize::from(arg & 7);
        let session = Session(8 * generation[s] + s as u64);
        let nkeys = 1 + usize::from((arg >> 3) & 1) + usize::from((arg >> 4) & 1);
        let keys: Vec<&[u8]> = (0..nkeys)
            .map(|_| KEYS[usize::from(next().unwrap_or(0)) % KEYS.len()])
            .collect();
        let x = u64::from(next().unwrap_or(0));
        let wait_us = match x % 4 {
            0 => Some(0),
            1 => Some(x * 500),
            _ => None,
        };
        let lease_us = (x & 16 != 0).then_some(x * 300 + 1);
        id += 1;
        events.clear();
        match op % 10 {
            0 | 1 if s < 4 && !v2_waiting[s] => {
                let r = LockRequest {
                    token: id,
                    keys: &keys,
                    wait_us,
                    lease_us,
                };
                if t.lock(session, r, now, &mut events) == LockResult::Waiting {
                    v2_waiting[s] = true;
                }
            }
            0 | 1 if s >= 4 => {
                let y = next().unwrap_or(0);
                let value = vec![y; usize::from(y % 8)];
                let r = NativeLock {
                    request_id: id,
                    keys: &keys,
                    wait_us,
                    lease_us,
                    shared: y & 1 != 0,
                    limit: (y & 2 != 0).then_some(u32::from(y >> 6) + 1),
                    value: (y & 4 != 0).then_some(&value[..]),
                    lock_delay_us: (y & 8 != 0).then_some(u64::from(y) * 400),
                };
                let _ = t.lock_native(session, r, now, &mut events);
            }
            2 if s < 4 && !v2_waiting[s] => {
                let _ = t.unlock(session, &keys, now, &mut events);
            }
            3 | 4 => {
                // By fence: one of the first key's holders (any session's), or a made-up one.
                let holders = t.get(keys[0], now).holders;
                let fence = match x % 3 {
                    0 => None,
                    1 if !holders.is_empty() => Some(holders[x as usize % holders.len()].fence),
                    _ => Some(x),
                };
                let keys = if fence.is_some() && x & 32 == 0 {
                    &keys[..1]
                } else {
                    &keys[..]
                };
                if op % 10 == 3 {
                    if s >= 4 || !v2_waiting[s] {
                        let _ = t.unlock_native(session, keys, fence, now, &mut events);
                    }
                } else if s >= 4 {
                    let release = x * 700 + u64::from(x & 64 == 0);
                    let _ = t.extend(session, keys, release, fence, id, now, &mut events);
                }
            }
            5 => {
                t.disconnect(session, now, &mut events);
                generation[s] += 1;
                if s < 4 {
                    v2_waiting[s] = false;
                }
            }
            6 | 7 => {
                now += x;
                t.advance(now, &mut events);
            }
            8 => {
                for k in KEYS {
                    let info = t.get(k, now);
                    if !info.shared {
                        assert!(
                            info.holders.len() <= info.limit as usize,
                            "{k:?} over its limit"
                        );
                    }
                    if info.holders.is_empty() {
                        assert!(!info.shared);
                    }
                    for h in &info.holders {
                        assert!(t.check_fence(k, h.fence));
                    }
                    if info.holders.len() > 1 && info.limit == 1 {
                        assert!(info.shared, "two exclusive holders of {k:?}");
                    }
                }
            }
            _ => {
                let mut snap = Vec::new();
                t.snapshot(&mut snap);
                let mut copy =
                    DlockTable::restore(config, &mut Reader::new(&snap)).expect("own snapshot");
                copy.check_invariants();
                let mut again = Vec::new();
                copy.snapshot(&mut again);
                assert_eq!(snap, again, "snapshot of the restored table differs");
                copy.set_key_events(first & 2 != 0);
                t = copy;
            }
        }
        for e in &events {
            if let DlockEvent::Granted { session, .. }
            | DlockEvent::TimedOut { session, .. }
            | DlockEvent::Idle { session } = e
            {
                let slot = (session.0 % 8) as usize;
                if slot < 4 {
                    v2_waiting[slot] = false;
                }
            }
            if let DlockEvent::Idle { session } = e {
                let slot = (session.0 % 8) as usize;
                if generation[slot] == session.0 / 8 {
                    generation[slot] += 1;
                }
            }
        }
        t.check_invariants();
    }
}

/// The state machine's hostile inputs from disk or peers: a command entry and a snapshot.
/// Decoding never panics; what decodes re-encodes to the same bytes; an entry that decodes
/// applies to a fresh state without panicking, and a snapshot that restores snapshots back to
/// the same bytes.
pub fn fuzz_command(data: &[u8]) {
    use holdfast::server::command::{decode_entry, encode_entry, Limits};
    use holdfast::server::msg::Batch;
    use holdfast::server::sim::Replayer;
    let limits = Limits {
        max_field: 1 << 16,
        max_ops: 1 << 12,
    };
    let config = match holdfast::config::parse(["--max-item-size", "65536"]) {
        Ok(holdfast::config::Command::Run(c)) => c,
        other => panic!("{other:?}"),
    };
    let mut batch = Batch::default();
    if let Ok(now) = decode_entry(data, limits, &mut batch) {
        let mut again = Vec::new();
        encode_entry(now, &batch.ops, &batch.arena.bytes, &mut again);
        let mut second = Batch::default();
        assert_eq!(decode_entry(&again, limits, &mut second), Ok(now));
        let mut third = Vec::new();
        encode_entry(now, &second.ops, &second.arena.bytes, &mut third);
        assert_eq!(again, third, "re-encoding is not stable");
        let mut r = Replayer::new(config.clone());
        let _ = r.apply(&again);
    }
    let mut r = Replayer::new(config.clone());
    if r.restore(data).is_ok() {
        let snap = r.snapshot();
        let mut copy = Replayer::new(config);
        copy.restore(&snap).expect("a snapshot restores");
        assert_eq!(copy.snapshot(), snap, "snapshot round trip");
    }
}

/// yrmcds counter requests: parse arbitrary bytes in a loop; every outcome must agree with the
/// header, names must be non-empty and inside the body, and decoded bodies must re-encode to the
/// same bytes.
pub fn fuzz_counter(data: &[u8]) {
    use holdfast::proto::counter::{self as ct, Command, ParseError};
    let mut pos = 0;
    while pos < data.len() {
        let buf = &data[pos..];
        let announced = buf
            .get(4..8)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
        match ct::parse(buf) {
            Err(ParseError::BadMagic) => {
                assert_ne!(buf[0], ct::REQ_MAGIC);
                break;
            }
            Err(ParseError::TooLarge) => {
                assert!(buf.len() >= ct::HEADER_LEN && announced.unwrap_or(0) > ct::MAX_BODY);
                break;
            }
            Err(ParseError::Incomplete) => {
                assert_eq!(buf[0], ct::REQ_MAGIC);
                assert!(
                    buf.len() < ct::HEADER_LEN
                        || buf.len() - ct::HEADER_LEN < announced.unwrap_or(0),
                    "a complete request reported incomplete"
                );
                break;
            }
            Ok((req, n)) => {
                assert_eq!(Some(n - ct::HEADER_LEN), announced);
                assert!(n <= buf.len() && n - ct::HEADER_LEN <= ct::MAX_BODY);
                assert_eq!(req.opcode, buf[1]);
                let body = &buf[ct::HEADER_LEN..n];
                let mut again = Vec::new();
                match req.command {
                    Command::Get { name } => ct::get_body(&mut again, name),
                    Command::Acquire {
                        resources,
                        maximum,
                        name,
                    } => {
                        assert!(resources > 0 && resources <= maximum);
                        ct::acquire_body(&mut again, resources, maximum, name)
                    }
                    Command::Release { resources, name } => {
                        ct::release_body(&mut again, resources, name)
                    }
                    _ => again.extend_from_slice(body),
                }
                if let Command::Get { name }
                | Command::Acquire { name, .. }
                | Command::Release { name, .. } = req.command
                {
                    assert!(!name.is_empty() && name.len() <= ct::MAX_NAME);
                }
                assert_eq!(again, body, "re-encoding differs from the body");
                pos += n;
            }
        }
    }
}
