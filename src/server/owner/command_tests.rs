use super::*;
use crate::core::store::StoreMode;
use crate::rng::Rng;
use crate::server::msg::{
    CounterKind, CounterOp, DlockKind, DlockOp, LockdOp, McCmd, McForm, McOp,
};
use crate::server::Proto;

/// A valid RequestLock message of one to three random keys (field 1, length-delimited).
fn lock_keys(rng: &mut Rng, arena: &mut Arena) -> Span {
    let mut raw = Vec::new();
    for _ in 0..1 + rng.below(3) {
        let key = rng.bytes(20);
        raw.push(0x1a); // field 3 (keys), length-delimited
        raw.push(key.len() as u8);
        raw.extend_from_slice(&key);
    }
    arena.push(&raw)
}

/// A random memcached command in a random form.
fn random_mc(rng: &mut Rng, span: &mut impl FnMut(&mut Rng) -> Span) -> McOp {
    let opt = |rng: &mut Rng| rng.chance(50).then(|| rng.wide());
    let opt_i64 = |rng: &mut Rng| rng.chance(50).then(|| rng.wide() as i64);
    let cmd = match rng.below(19) {
        0 => McCmd::Get {
            keys: span(rng),
            cas: rng.chance(50),
            touch: opt_i64(rng),
        },
        1 => McCmd::Store {
            mode: [
                StoreMode::Set,
                StoreMode::Add,
                StoreMode::Replace,
                StoreMode::Append,
                StoreMode::Prepend,
            ][rng.index(5)],
            key: span(rng),
            flags: rng.next() as u32,
            exptime: rng.wide() as i64,
            value: span(rng),
            cas: opt(rng),
        },
        2 => McCmd::Delete {
            key: span(rng),
            cas: opt(rng),
        },
        3 => McCmd::Arith {
            key: span(rng),
            incr: rng.chance(50),
            delta: rng.wide(),
            create: rng.chance(50).then(|| (rng.wide(), -(rng.wide() as i64))),
            cas: opt(rng),
        },
        4 => McCmd::Touch {
            key: span(rng),
            exptime: -(rng.wide() as i64),
        },
        5 => McCmd::Flush {
            delay: rng.wide() as i64,
        },
        6 => McCmd::Stats {
            arg: rng.chance(50).then(|| span(rng)),
            live: Span::EMPTY,
        },
        7 => McCmd::Lock { key: span(rng) },
        8 => McCmd::Unlock { key: span(rng) },
        9 => McCmd::UnlockAll,
        10 => McCmd::LockToken { key: span(rng) },
        11 => McCmd::LockAndGet {
            key: span(rng),
            touch: opt_i64(rng),
        },
        12 => McCmd::ReplaceAndUnlock {
            key: span(rng),
            flags: rng.next() as u32,
            exptime: rng.wide() as i64,
            value: span(rng),
            cas: opt(rng),
        },
        13 => McCmd::Keys { prefix: span(rng) },
        14 => McCmd::KeysNext,
        15 => McCmd::Noop,
        16 => McCmd::Version,
        17 => McCmd::Verbosity,
        _ => McCmd::Quit,
    };
    let form = if rng.chance(50) {
        McForm::Text {
            noreply: rng.chance(50),
        }
    } else {
        McForm::Binary {
            opcode: rng.next() as u8,
            opaque: rng.next() as u32,
        }
    };
    McOp { cmd, form }
}

/// A random operation with random bytes behind its spans.
fn random_op(rng: &mut Rng, arena: &mut Arena) -> OpMsg {
    let mut bytes = Vec::new();
    let mut span = |rng: &mut Rng| {
        bytes = rng.bytes(40);
        arena.push(&bytes)
    };
    let conn = ConnId::new(
        rng.below(3) as u16,
        rng.below(1 << 20) as u32,
        rng.next() as u32,
    );
    let opt = |rng: &mut Rng| rng.chance(50).then(|| rng.wide());
    let op = match rng.below(23) {
        0..=10 | 16 | 17 | 19 => Op::Mc(random_mc(rng, &mut span)),
        11 => {
            let payload = span(rng);
            Op::Lockd(LockdOp::new(rng.next() as u8, payload, &bytes))
        }
        12 => {
            let id = opt(rng);
            let kind = match rng.below(4) {
                0 => DlockKind::Ping,
                1 => DlockKind::Lock {
                    keys: lock_keys(rng, arena),
                    key_count: rng.next() as u32,
                    wait_us: opt(rng),
                    lease_us: opt(rng),
                },
                2 => DlockKind::Unlock {
                    keys: lock_keys(rng, arena),
                    key_count: rng.next() as u32,
                },
                _ => DlockKind::Refuse {
                    status: rng.next() as u32,
                    text: DLOCK_REFUSALS[rng.index(DLOCK_REFUSALS.len())],
                },
            };
            Op::Dlock(DlockOp { id, kind })
        }
        13 => Op::Literal {
            bytes: span(rng),
            close: rng.chance(50),
        },
        14 => Op::DlockOpen,
        18 => Op::Open {
            proto: [Proto::Memcache, Proto::Lockd, Proto::Dlock][rng.index(3)],
            peer: if rng.chance(50) {
                std::net::SocketAddr::from(([127, 0, 0, rng.next() as u8], rng.next() as u16))
            } else {
                std::net::SocketAddr::from(([0xfe80, 0, 0, 0, 0, 0, 0, rng.next() as u16], 80))
            },
        },
        15 => Op::Close,
        20 => {
            // Names are 1 to 65535 bytes and an Acquire has 0 < resources <= maximum (the
            // worker refuses anything else and so does the decoder).
            let mut name = |rng: &mut Rng| {
                let mut b = rng.bytes(40);
                b.push(rng.next() as u8);
                arena.push(&b)
            };
            let kind = match rng.below(5) {
                0 => CounterKind::Get { name: name(rng) },
                1 => {
                    let resources = 1 + (rng.next() as u32) / 2;
                    CounterKind::Acquire {
                        resources,
                        maximum: resources + (rng.next() as u32) / 2,
                        name: name(rng),
                    }
                }
                2 => CounterKind::Release {
                    resources: rng.next() as u32,
                    name: name(rng),
                },
                3 => CounterKind::Stats,
                _ => CounterKind::Dump,
            };
            Op::Counter(CounterOp {
                opaque: rng.next() as u32,
                kind,
            })
        }
        _ => Op::Eof,
    };
    OpMsg { conn, op }
}

/// Two entries are the same when their ops are, with every span compared by its bytes.
fn same(a: &[OpMsg], aa: &[u8], b: &[OpMsg], ba: &[u8]) -> bool {
    let mut ea = Vec::new();
    let mut eb = Vec::new();
    encode_entry(0, a, aa, &mut ea);
    encode_entry(0, b, ba, &mut eb);
    a.len() == b.len() && ea == eb
}

fn random_entry(rng: &mut Rng) -> (u64, Vec<OpMsg>, Arena) {
    let mut arena = Arena::default();
    let ops = (0..rng.below(30))
        .map(|_| random_op(rng, &mut arena))
        .collect();
    (rng.wide(), ops, arena)
}

#[test]
fn entries_round_trip_and_re_encode_to_the_same_bytes() {
    let mut rng = Rng::new(1);
    let mut batch = Batch::default();
    for _ in 0..3000 {
        let (now, ops, arena) = random_entry(&mut rng);
        let mut bytes = Vec::new();
        encode_entry(now, &ops, &arena.bytes, &mut bytes);
        let got = decode_entry(&bytes, Limits::default(), &mut batch).expect("decodes");
        assert_eq!(got, now);
        assert_eq!(format!("{:?}", batch.ops.len()), format!("{:?}", ops.len()));
        let mut again = Vec::new();
        encode_entry(now, &batch.ops, &batch.arena.bytes, &mut again);
        assert_eq!(again, bytes);
        assert!(same(&ops, &arena.bytes, &batch.ops, &batch.arena.bytes));
    }
}

#[test]
fn every_truncation_is_an_error_and_flips_never_panic() {
    let mut rng = Rng::new(2);
    let mut batch = Batch::default();
    for _ in 0..200 {
        let (now, ops, arena) = random_entry(&mut rng);
        let mut bytes = Vec::new();
        encode_entry(now, &ops, &arena.bytes, &mut bytes);
        for cut in 0..bytes.len() {
            assert!(decode_entry(&bytes[..cut], Limits::default(), &mut batch).is_err());
        }
        for _ in 0..50 {
            let mut bad = bytes.clone();
            let at = rng.index(bad.len());
            bad[at] ^= 1 << rng.below(8);
            if decode_entry(&bad, Limits::default(), &mut batch).is_ok() {
                // Whatever decoded must be well formed: every span inside the arena.
                let mut again = Vec::new();
                encode_entry(0, &batch.ops, &batch.arena.bytes, &mut again);
            }
        }
    }
}

#[test]
fn caps_refuse_big_fields_and_many_ops_before_allocating() {
    let mut arena = Arena::default();
    let value = arena.push(&[7u8; 100]);
    let op = OpMsg {
        conn: ConnId::new(0, 1, 1),
        op: Op::Lockd(LockdOp::new(1, value, &[7u8; 100])),
    };
    let mut bytes = Vec::new();
    encode_entry(5, &[op, op, op], &arena.bytes, &mut bytes);
    let mut batch = Batch::default();
    let small = Limits {
        max_field: 99,
        max_ops: 10,
    };
    assert!(matches!(
        decode_entry(&bytes, small, &mut batch),
        Err(DecodeError::Invalid(_))
    ));
    let few = Limits {
        max_field: 100,
        max_ops: 2,
    };
    assert!(matches!(
        decode_entry(&bytes, few, &mut batch),
        Err(DecodeError::Invalid(_))
    ));
    // A count far beyond the input is refused without reserving room for it.
    let mut huge = MAGIC.to_vec();
    codec::put_u64(&mut huge, 0);
    codec::put_u64(&mut huge, u64::MAX / 8);
    assert_eq!(
        decode_entry(&huge, Limits::default(), &mut batch),
        Err(DecodeError::Truncated)
    );
}

#[test]
fn every_refusal_the_dlock_decoder_gives_has_a_code() {
    // Feed the decoder a spread of malformed bodies and collect the reasons it gives.
    let mut rng = Rng::new(3);
    for _ in 0..20_000 {
        let body = rng.bytes(12);
        if let Err(reason) = crate::proto::dlock::decode_request(&body) {
            assert!(
                DLOCK_REFUSALS.contains(&reason),
                "{reason:?} is missing from DLOCK_REFUSALS"
            );
        }
    }
}

/// Counter ops the worker would never send are refused: the table relies on names of 1 to
/// 65535 bytes and on Acquire's 0 < resources <= maximum.
#[test]
fn counter_ops_the_worker_would_refuse_do_not_decode() {
    fn entry(fields: &[u64], name: &[u8], tag: u8) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        for v in [7, 1, 0, 1, 1] {
            codec::put_u64(&mut b, v);
        }
        b.push(tag);
        for v in fields {
            codec::put_u64(&mut b, *v);
        }
        codec::put_bytes(&mut b, name);
        b
    }
    let mut batch = Batch::default();
    let ok = entry(&[9, 1, 2], b"sem", 51);
    assert_eq!(decode_entry(&ok, Limits::default(), &mut batch), Ok(7));
    assert!(matches!(
        batch.ops[0].op,
        Op::Counter(CounterOp {
            opaque: 9,
            kind: CounterKind::Acquire {
                resources: 1,
                maximum: 2,
                ..
            }
        })
    ));
    for bad in [
        entry(&[9, 0, 2], b"sem", 51),
        entry(&[9, 3, 2], b"sem", 51),
        entry(&[9, 1, 2], b"", 51),
        entry(&[9], b"", 50),
        entry(&[9, 1], &vec![b'n'; 65536], 52),
        entry(&[9, 1 << 32, 1 << 33], b"sem", 51),
    ] {
        assert!(decode_entry(&bad, Limits::default(), &mut batch).is_err());
    }
}

/// The fuzz corpus's command seeds (`fuzz/seeds.py`) are valid entries: a seed the decoder
/// refuses at once would only exercise the first bytes of the decoder.
#[test]
fn every_fuzz_seed_entry_decodes() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus/command");
    let mut batch = Batch::default();
    let mut seen = 0;
    for f in std::fs::read_dir(dir).expect("fuzz/corpus/command") {
        let path = f.expect("corpus entry").path();
        let bytes = std::fs::read(&path).expect("seed");
        let got = decode_entry(&bytes, Limits::default(), &mut batch);
        assert!(got.is_ok(), "{}: {got:?}", path.display());
        seen += 1;
    }
    assert!(seen >= 6, "only {seen} seeds");
}
