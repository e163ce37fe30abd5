//! Worker side of each wire format: parse what arrived, answer what needs no lock state, and copy
//! everything else once into the owner's batch.

use super::conn::{Conn, REPLY_BUDGET};
use super::msg::{Batch, CounterKind, CounterOp, DlockKind, DlockOp, LockdOp, McOp, Op, OpMsg};
use super::Proto;
use crate::config::{Compat, Config};
use crate::core::ConnId;
use crate::proto::counter as ct;
use crate::proto::dlock as dl;
use crate::proto::lockd as ld;
use crate::proto::memcache::{binary, text};

/// The version string `version` answers: memcached's form (clients parse the numbers), with our
/// name after it.
pub const VERSION_REPLY: &[u8] =
    concat!("VERSION 1.6.0-holdfast-", env!("CARGO_PKG_VERSION"), "\r\n").as_bytes();

/// Parse as many requests from `data` as backpressure allows. Returns the bytes consumed and
/// whether the connection must be closed (after what was queued for it is written).
pub fn parse(
    conn: &mut Conn,
    data: &[u8],
    id: ConnId,
    config: &Config,
    batch: &mut Batch,
) -> (usize, bool) {
    let mut pos = 0;
    while pos < data.len() {
        if conn.skip > 0 {
            let n = conn.skip.min(data.len() - pos);
            conn.skip -= n;
            pos += n;
            continue;
        }
        if !conn.can_parse() {
            break;
        }
        let rest = &data[pos..];
        let step = match conn.proto {
            Proto::Memcache => memcache(conn, rest, id, config, batch),
            Proto::Lockd => lockd(conn, rest, id, batch),
            Proto::Dlock => dlock(conn, rest, id, config, batch),
            Proto::Counter => counter(conn, rest, id, batch),
        };
        match step {
            Step::Consumed(n) => pos += n,
            Step::Incomplete => break,
            Step::Fatal => return (pos, true),
        }
    }
    (pos, false)
}

/// What one parse attempt did.
pub enum Step {
    Consumed(usize),
    Incomplete,
    Fatal,
}

/// The largest reply to one retrieval of one key: the item and its header line.
fn item_reply_bound(config: &Config) -> usize {
    config.max_item_size + 512
}

/// A `stats` reply, generously.
const STATS_REPLY_BOUND: usize = 16 * 1024;

/// The largest reply a binary request can get (for the connection's reply budget).
fn binary_reply_bound(opcode: u8, config: &Config) -> usize {
    use binary::opcode as o;
    match opcode {
        o::GET | o::GETQ | o::GETK | o::GETKQ | o::GAT | o::GATQ | o::GATK | o::GATKQ => {
            item_reply_bound(config)
        }
        o::LAG | o::LAGQ | o::LAGK | o::LAGKQ => item_reply_bound(config),
        o::STAT => STATS_REPLY_BOUND,
        _ => 0,
    }
}

fn push(conn: &mut Conn, id: ConnId, op: Op, batch: &mut Batch) {
    batch.ops.push(OpMsg { conn: id, op });
    conn.inflight += 1;
}

fn memcache(conn: &mut Conn, buf: &[u8], id: ConnId, config: &Config, batch: &mut Batch) -> Step {
    // Text and binary are told apart per request, by its first byte. A text command starts with
    // an ASCII letter or space, so a first byte with the high bit set is a binary header; any
    // such byte but the request magic 0x80 is a bad magic, and the binary parser closes the
    // connection for it (the contract: "Binary with a bad magic byte: close"), instead of
    // waiting up to 2048 bytes for a newline that a binary client never sends.
    if buf[0] & 0x80 != 0 {
        return match binary::parse(buf, config.max_item_size) {
            Ok((req, n)) => {
                let a = &mut batch.arena;
                let op = McOp::Binary {
                    opcode: req.opcode,
                    opaque: req.opaque,
                    cas: req.cas,
                    extras: a.push(req.extras),
                    key: a.push(req.key),
                    value: a.push(req.value),
                };
                push(conn, id, Op::Mc(op), batch);
                conn.charge(binary_reply_bound(req.opcode, config));
                if req.opcode == binary::opcode::KEYS {
                    conn.dump = super::conn::Dump::Running;
                }
                Step::Consumed(n)
            }
            Err(binary::ParseError::Incomplete) => Step::Incomplete,
            Err(binary::ParseError::Refuse {
                opcode,
                opaque,
                status,
                skip,
            }) => {
                let mut out = Vec::with_capacity(64);
                let yrmcds = config.compat == Compat::Yrmcds;
                let msg: &[u8] = match (status == binary::status::VALUE_TOO_LARGE, yrmcds) {
                    (true, false) => b"Too large.",
                    (false, false) => b"Invalid arguments",
                    // cybozu/yrmcds src/memcache/memcache.cpp, STATUS_TOO_LARGE / STATUS_INVALID
                    (true, true) => b"Too large value",
                    (false, true) => b"Invalid request",
                };
                binary::encode_response(&mut out, opcode, status, opaque, 0, &[], &[], msg);
                conn.emit(&out, false, id, batch);
                let here = skip.min(buf.len());
                conn.skip = skip - here;
                Step::Consumed(here)
            }
            Err(binary::ParseError::Fatal) => Step::Fatal,
        };
    }
    match text::parse(buf, &mut conn.scanned, config.max_item_size) {
        Ok((req, n)) => {
            conn.scanned = 0;
            text_request(conn, req, id, config, batch);
            Step::Consumed(n)
        }
        Err(text::ParseError::Incomplete) => Step::Incomplete,
        Err(text::ParseError::Invalid { reply, skip }) => {
            conn.scanned = 0;
            let reply = if config.compat == Compat::Yrmcds {
                yrmcds_text_error(buf, reply)
            } else {
                reply
            };
            if !reply.is_empty() {
                conn.emit(reply, false, id, batch);
            }
            let here = skip.min(buf.len());
            conn.skip = skip - here;
            Step::Consumed(here)
        }
        Err(text::ParseError::Fatal { reply }) => {
            conn.scanned = 0;
            conn.emit(reply, true, id, batch);
            Step::Fatal
        }
    }
}

/// yrmcds answers every request it cannot parse with a bare `ERROR` (its `cmd_text`), and any
/// `slabs ...` line with `OK` (it ignores them).
fn yrmcds_text_error(buf: &[u8], reply: &'static [u8]) -> &'static [u8] {
    let first = text::Keys { raw: buf }.next().unwrap_or_default();
    let first = first
        .split(|&b| b == b'\r' || b == b'\n')
        .next()
        .unwrap_or_default();
    if reply == text::reply::ERROR && first == b"slabs" {
        b"OK\r\n"
    } else if reply.is_empty() {
        reply
    } else {
        text::reply::ERROR
    }
}

fn text_request(
    conn: &mut Conn,
    req: text::Request<'_>,
    id: ConnId,
    config: &Config,
    batch: &mut Batch,
) {
    use text::Request as R;
    let bound = match &req {
        R::Get { keys, .. } | R::Gat { keys, .. } => {
            keys.count().saturating_mul(item_reply_bound(config))
        }
        R::Stats { .. } => STATS_REPLY_BOUND,
        _ => 0,
    };
    let a = &mut batch.arena;
    let op = match req {
        R::Get { keys, cas } => McOp::TextGet {
            keys: a.push(keys.raw),
            cas,
            exptime: None,
        },
        R::Gat { exptime, keys, cas } => McOp::TextGet {
            keys: a.push(keys.raw),
            cas,
            exptime: Some(exptime),
        },
        R::Store {
            cmd,
            key,
            flags,
            exptime,
            value,
            cas_unique,
            noreply,
        } => McOp::TextStore {
            cmd,
            key: a.push(key),
            flags,
            exptime,
            value: a.push(value),
            cas: cas_unique,
            noreply,
        },
        R::Delete { key, noreply } => McOp::TextDelete {
            key: a.push(key),
            noreply,
        },
        R::Incr {
            key,
            delta,
            noreply,
        } => McOp::TextArith {
            key: a.push(key),
            incr: true,
            delta,
            noreply,
        },
        R::Decr {
            key,
            delta,
            noreply,
        } => McOp::TextArith {
            key: a.push(key),
            incr: false,
            delta,
            noreply,
        },
        R::Touch {
            key,
            exptime,
            noreply,
        } => McOp::TextTouch {
            key: a.push(key),
            exptime,
            noreply,
        },
        R::FlushAll { delay, noreply } => McOp::TextFlush { delay, noreply },
        R::Stats { arg } => McOp::TextStats {
            arg: arg.map(|x| a.push(x)),
        },
        R::Lock { key } => McOp::TextLock { key: a.push(key) },
        R::Unlock { key } => McOp::TextUnlock { key: a.push(key) },
        R::UnlockAll => McOp::TextUnlockAll,
        R::LockToken { key } => McOp::TextLockToken { key: a.push(key) },
        R::Keys { prefix } => {
            conn.dump = super::conn::Dump::Running;
            McOp::TextKeys {
                prefix: a.push(prefix),
            }
        }
        R::Version => return conn.emit(VERSION_REPLY, false, id, batch),
        R::Verbosity { noreply } => {
            return conn.emit(if noreply { b"" } else { b"OK\r\n" }, false, id, batch)
        }
        R::Quit => return conn.emit(b"", true, id, batch),
    };
    push(conn, id, Op::Mc(op), batch);
    conn.charge(bound);
}

fn lockd(conn: &mut Conn, buf: &[u8], id: ConnId, batch: &mut Batch) -> Step {
    let mut out = Vec::new();
    // Contract: a version other than 1 gets ERR (empty), then the connection is closed. The
    // version is the top nibble of the first byte, so decide there: the length field of a frame
    // in an unknown version means nothing, and waiting for the up to 1 MiB it announces would
    // leave the client hanging with no answer.
    if ld::peek_version(buf).is_some_and(|v| v != ld::VERSION) {
        ld::encode(&mut out, ld::op::ERR, &[]);
        conn.emit(&out, true, id, batch);
        return Step::Fatal;
    }
    let Some((frame, n)) = ld::parse(buf) else {
        return Step::Incomplete;
    };
    debug_assert_eq!(frame.version, ld::VERSION);
    match frame.opcode {
        ld::op::PING => {
            ld::encode(&mut out, ld::op::PONG, frame.payload);
            conn.emit(&out, false, id, batch);
        }
        ld::op::ACQ
        | ld::op::REL
        | ld::op::TRY
        | ld::op::ADOPT
        | ld::op::SYNC
        | ld::op::REQ_TOKEN => {
            let payload = batch.arena.push(frame.payload);
            push(
                conn,
                id,
                Op::Lockd(LockdOp {
                    opcode: frame.opcode,
                    payload,
                }),
                batch,
            );
            // Every reply echoes the payload; SYNC copies the whole table.
            conn.charge(if frame.opcode == ld::op::SYNC {
                REPLY_BUDGET
            } else {
                n
            });
        }
        _ => {
            ld::encode(&mut out, ld::op::ERR, frame.payload);
            conn.emit(&out, false, id, batch);
        }
    }
    Step::Consumed(n)
}

fn dlock(conn: &mut Conn, buf: &[u8], id: ConnId, config: &Config, batch: &mut Batch) -> Step {
    let (body, n) = match dl::parse_frame(buf, config.dlock_max_message) {
        Ok(x) => x,
        Err(dl::FrameError::Incomplete) => return Step::Incomplete,
        Err(dl::FrameError::TooLarge) => return Step::Fatal,
    };
    let req = match dl::decode_request(body) {
        Ok(r) => r,
        Err(reason) => {
            // Contract: bytes that are not a valid protobuf message close the connection, after a
            // General response where the frame was complete. The answer goes through the owner
            // (in order behind earlier requests) with the close.
            let op = DlockOp {
                id: None,
                kind: DlockKind::Refuse {
                    status: dl::status::GENERAL,
                    text: reason,
                },
            };
            push(conn, id, Op::Dlock(op), batch);
            conn.closing = true;
            return Step::Fatal;
        }
    };
    let kind = dlock_kind(&req, config, batch);
    push(conn, id, Op::Dlock(DlockOp { id: req.id, kind }), batch);
    Step::Consumed(n)
}

/// Checks in this order: version, access token, type, keys.
fn dlock_kind(req: &dl::Request<'_>, config: &Config, batch: &mut Batch) -> DlockKind {
    let refuse = |status, text| DlockKind::Refuse { status, text };
    if !matches!(req.version, None | Some(0) | Some(2)) {
        return refuse(dl::status::VERSION, "unsupported version");
    }
    if let Some(token) = &config.dlock_token {
        if req.access_token != Some(token.as_bytes()) {
            return refuse(dl::status::GENERAL, "access denied");
        }
    }
    match req.req_type {
        Some(dl::req_type::PING) => DlockKind::Ping,
        Some(t @ (dl::req_type::LOCK | dl::req_type::UNLOCK)) => {
            let lock = req.lock.unwrap_or_default();
            if lock.key_count == 0 {
                return refuse(dl::status::GENERAL, "no keys");
            }
            if lock.key_count > config.dlock_max_keys {
                return refuse(dl::status::TOO_MANY_KEYS, "too many keys");
            }
            let keys = batch.arena.push(lock.keys.raw);
            let key_count = lock.key_count as u32;
            if t == dl::req_type::LOCK {
                DlockKind::Lock {
                    keys,
                    key_count,
                    wait_us: lock.wait_micro,
                    lease_us: lock.release_micro,
                }
            } else {
                DlockKind::Unlock { keys, key_count }
            }
        }
        _ => refuse(dl::status::INVALID_TYPE, "unknown request type"),
    }
}

/// yrmcds counter protocol: a bad magic or a body over the cap closes the connection at once
/// (nothing sensible can be answered: the opcode and opaque of a stream that is not this protocol
/// mean nothing); Noop, malformed bodies and unknown opcodes are answered here, in order.
fn counter(conn: &mut Conn, buf: &[u8], id: ConnId, batch: &mut Batch) -> Step {
    let (req, n) = match ct::parse(buf) {
        Ok(x) => x,
        Err(ct::ParseError::Incomplete) => return Step::Incomplete,
        Err(ct::ParseError::BadMagic | ct::ParseError::TooLarge) => return Step::Fatal,
    };
    let a = &mut batch.arena;
    let kind = match req.command {
        ct::Command::Get { name } => CounterKind::Get { name: a.push(name) },
        ct::Command::Acquire {
            resources,
            maximum,
            name,
        } => CounterKind::Acquire {
            resources,
            maximum,
            name: a.push(name),
        },
        ct::Command::Release { resources, name } => CounterKind::Release {
            resources,
            name: a.push(name),
        },
        ct::Command::Stats => CounterKind::Stats,
        ct::Command::Dump => CounterKind::Dump,
        ct::Command::Noop | ct::Command::Invalid | ct::Command::Unknown => {
            let status = match req.command {
                ct::Command::Noop => ct::status::OK,
                ct::Command::Invalid => ct::status::INVALID,
                _ => ct::status::UNKNOWN_COMMAND,
            };
            if status == ct::status::OK {
                let mut header = [0u8; ct::HEADER_LEN];
                ct::encode_header_into(&mut header, req.opcode, status, req.opaque, 0);
                conn.emit(&header, false, id, batch);
            } else {
                let mut w = Vec::with_capacity(ct::HEADER_LEN + 32);
                ct::encode_error(&mut w, req.opcode, status, req.opaque);
                conn.emit(&w, false, id, batch);
            }
            return Step::Consumed(n);
        }
    };
    push(
        conn,
        id,
        Op::Counter(CounterOp {
            opaque: req.opaque,
            kind,
        }),
        batch,
    );
    // Dump writes the whole table; the others a few bytes.
    conn.charge(if matches!(kind, CounterKind::Dump) {
        REPLY_BUDGET
    } else {
        64
    });
    Step::Consumed(n)
}
