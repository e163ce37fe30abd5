use super::*;

const MAX: usize = 1024 * 1024;

fn keys(raw: &[u8]) -> Keys<'_> {
    Keys { raw }
}

fn store<'a>(cmd: StoreCmd, key: &'a [u8], value: &'a [u8]) -> Request<'a> {
    Request::Store {
        cmd,
        key,
        flags: 0,
        exptime: 0,
        value,
        cas_unique: 0,
        noreply: false,
    }
}

fn parse_fresh(buf: &[u8]) -> Result<(Request<'_>, usize), ParseError> {
    let mut scanned = 0;
    parse(buf, &mut scanned, MAX)
}

fn long_key(n: usize) -> Vec<u8> {
    vec![b'k'; n]
}

/// Every command in its valid forms, with the request it must parse to.
fn valid_cases() -> Vec<(Vec<u8>, Request<'static>)> {
    use Request::*;
    use StoreCmd::*;
    let k250: &'static [u8] = Box::leak(long_key(250).into_boxed_slice());
    let mut get250 = b"get ".to_vec();
    get250.extend_from_slice(k250);
    get250.extend_from_slice(b"\r\n");
    let mut set250 = b"set ".to_vec();
    set250.extend_from_slice(k250);
    set250.extend_from_slice(b" 0 0 1\r\nx\r\n");
    let keys250 = [&b"keys "[..], k250, b"\r\n"].concat();
    vec![
        (
            b"get foo\r\n".to_vec(),
            Get {
                keys: keys(b"foo"),
                cas: false,
            },
        ),
        (
            b"get foo\n".to_vec(),
            Get {
                keys: keys(b"foo"),
                cas: false,
            },
        ),
        (
            b"gets a b  c\r\n".to_vec(),
            Get {
                keys: keys(b"a b  c"),
                cas: true,
            },
        ),
        (
            b"  get   foo  bar  \r\n".to_vec(),
            Get {
                keys: keys(b"foo  bar"),
                cas: false,
            },
        ),
        (
            get250,
            Get {
                keys: keys(k250),
                cas: false,
            },
        ),
        (
            b"gat 100 foo bar\r\n".to_vec(),
            Gat {
                exptime: 100,
                keys: keys(b"foo bar"),
                cas: false,
            },
        ),
        (
            b"gats -1 foo\r\n".to_vec(),
            Gat {
                exptime: -1,
                keys: keys(b"foo"),
                cas: true,
            },
        ),
        (
            b"set k 0 0 5\r\nhello\r\n".to_vec(),
            store(Set, b"k", b"hello"),
        ),
        (
            b"set k 0 0 5\nhello\r\n".to_vec(),
            store(Set, b"k", b"hello"),
        ),
        (b"set k 0 0 0\r\n\r\n".to_vec(), store(Set, b"k", b"")),
        (
            b"set k 0 0 4\r\na\r\nb\r\n".to_vec(),
            store(Set, b"k", b"a\r\nb"),
        ),
        (set250, store(Set, k250, b"x")),
        (
            b"set k 4294967295 -5 3 noreply\r\nabc\r\n".to_vec(),
            Store {
                cmd: Set,
                key: b"k",
                flags: u32::MAX,
                exptime: -5,
                value: b"abc",
                cas_unique: 0,
                noreply: true,
            },
        ),
        (b"add k 0 0 1\r\na\r\n".to_vec(), store(Add, b"k", b"a")),
        (
            b"replace k 0 0 1\r\na\r\n".to_vec(),
            store(Replace, b"k", b"a"),
        ),
        (
            b"append k 0 0 1\r\na\r\n".to_vec(),
            store(Append, b"k", b"a"),
        ),
        (
            b"prepend k 0 0 1\r\na\r\n".to_vec(),
            store(Prepend, b"k", b"a"),
        ),
        (
            b"cas k 7 9223372036854775807 2 18446744073709551615\r\nab\r\n".to_vec(),
            Store {
                cmd: Cas,
                key: b"k",
                flags: 7,
                exptime: i64::MAX,
                value: b"ab",
                cas_unique: u64::MAX,
                noreply: false,
            },
        ),
        (
            b"cas k 0 -9223372036854775808 1 5 noreply\r\na\r\n".to_vec(),
            Store {
                cmd: Cas,
                key: b"k",
                flags: 0,
                exptime: i64::MIN,
                value: b"a",
                cas_unique: 5,
                noreply: true,
            },
        ),
        (
            b"delete k\r\n".to_vec(),
            Delete {
                key: b"k",
                noreply: false,
            },
        ),
        (
            b"delete k 0\r\n".to_vec(),
            Delete {
                key: b"k",
                noreply: false,
            },
        ),
        (
            b"delete k noreply\r\n".to_vec(),
            Delete {
                key: b"k",
                noreply: true,
            },
        ),
        (
            b"delete k 0 noreply\r\n".to_vec(),
            Delete {
                key: b"k",
                noreply: true,
            },
        ),
        (
            b"incr k 5\r\n".to_vec(),
            Incr {
                key: b"k",
                delta: 5,
                noreply: false,
            },
        ),
        (
            b"decr k 18446744073709551615 noreply\r\n".to_vec(),
            Decr {
                key: b"k",
                delta: u64::MAX,
                noreply: true,
            },
        ),
        (
            b"touch k 10\r\n".to_vec(),
            Touch {
                key: b"k",
                exptime: 10,
                noreply: false,
            },
        ),
        (
            b"touch k -1 noreply\r\n".to_vec(),
            Touch {
                key: b"k",
                exptime: -1,
                noreply: true,
            },
        ),
        (
            b"flush_all\r\n".to_vec(),
            FlushAll {
                delay: 0,
                noreply: false,
            },
        ),
        (
            b"flush_all 10\r\n".to_vec(),
            FlushAll {
                delay: 10,
                noreply: false,
            },
        ),
        (
            b"flush_all noreply\r\n".to_vec(),
            FlushAll {
                delay: 0,
                noreply: true,
            },
        ),
        (
            b"flush_all 10 noreply\r\n".to_vec(),
            FlushAll {
                delay: 10,
                noreply: true,
            },
        ),
        (b"stats\r\n".to_vec(), Stats { arg: None }),
        (
            b"stats settings\r\n".to_vec(),
            Stats {
                arg: Some(b"settings"),
            },
        ),
        (
            b"stats detail dump \r\n".to_vec(),
            Stats {
                arg: Some(b"detail dump"),
            },
        ),
        (b"version\r\n".to_vec(), Version),
        (b"verbosity 1\r\n".to_vec(), Verbosity { noreply: false }),
        (
            b"verbosity 1 noreply\r\n".to_vec(),
            Verbosity { noreply: true },
        ),
        (b"quit\r\n".to_vec(), Quit),
        (b"version foo bar\r\n".to_vec(), Version),
        (b"version noreply\r\n".to_vec(), Version),
        (b"quit now\r\n".to_vec(), Quit),
        (b"lock k\r\n".to_vec(), Lock { key: b"k" }),
        (b"unlock k\r\n".to_vec(), Unlock { key: b"k" }),
        (b"unlock_all\r\n".to_vec(), UnlockAll),
        (b"lock_token k\r\n".to_vec(), LockToken { key: b"k" }),
        (b"keys\r\n".to_vec(), Request::Keys { prefix: b"" }),
        (b"keys   \r\n".to_vec(), Request::Keys { prefix: b"" }),
        (
            b"keys user:\r\n".to_vec(),
            Request::Keys { prefix: b"user:" },
        ),
        (
            b"keys  user: \n".to_vec(),
            Request::Keys { prefix: b"user:" },
        ),
        (keys250, Request::Keys { prefix: k250 }),
    ]
}

/// Malformed requests: (input, max_value, reply, skip).
fn invalid_cases() -> Vec<(Vec<u8>, usize, &'static [u8], usize)> {
    use reply::*;
    let k251 = long_key(251);
    let line = |parts: &[&[u8]]| parts.concat();
    let set251 = line(&[b"set ", &k251, b" 0 0 5\r\nhello\r\n"]);
    let set251_len = set251.len();
    let get251 = line(&[b"get a ", &k251, b"\r\n"]);
    let get251_len = get251.len();
    let del251 = line(&[b"delete ", &k251, b"\r\n"]);
    let del251_len = del251.len();
    let unlock251 = line(&[b"unlock ", &k251, b"\r\n"]);
    let unlock251_len = unlock251.len();
    let keys251 = line(&[b"keys ", &k251, b"\r\n"]);
    let keys251_len = keys251.len();
    vec![
        (keys251, MAX, BAD_FORMAT, keys251_len),
        (b"keys a b\r\n".to_vec(), MAX, BAD_FORMAT, 10),
        (b"KEYS\r\n".to_vec(), MAX, ERROR, 6),
        (b"bogus\r\n".to_vec(), MAX, ERROR, 7),
        (b"GET foo\r\n".to_vec(), MAX, ERROR, 9),
        (b"\r\n".to_vec(), MAX, ERROR, 2),
        (b"\n".to_vec(), MAX, ERROR, 1),
        (b"   \r\n".to_vec(), MAX, ERROR, 5),
        (b"mg foo v\r\n".to_vec(), MAX, ERROR, 10),
        (b"get\r\n".to_vec(), MAX, BAD_FORMAT, 5),
        (b"get   \r\n".to_vec(), MAX, BAD_FORMAT, 8),
        (get251, MAX, BAD_FORMAT, get251_len),
        (b"gat 10\r\n".to_vec(), MAX, BAD_FORMAT, 8),
        (b"gat\r\n".to_vec(), MAX, BAD_FORMAT, 5),
        (b"gat x foo\r\n".to_vec(), MAX, BAD_EXPTIME, 11),
        (
            b"gats 9223372036854775808 foo\r\n".to_vec(),
            MAX,
            BAD_EXPTIME,
            30,
        ),
        // Storage: the data block is swallowed once <bytes> is a valid length.
        (set251, MAX, BAD_FORMAT, set251_len),
        (
            b"set k 4294967296 0 5\r\nhello\r\n".to_vec(),
            MAX,
            BAD_FORMAT,
            29,
        ),
        (b"set k -1 0 5\r\nhello\r\n".to_vec(), MAX, BAD_FORMAT, 21),
        (b"set k 0 x 5\r\nhello\r\n".to_vec(), MAX, BAD_FORMAT, 20),
        (
            b"set k 0 0 5 bogus\r\nhello\r\n".to_vec(),
            MAX,
            BAD_FORMAT,
            26,
        ),
        (
            b"cas k 0 0 5 18446744073709551616\r\nhello\r\n".to_vec(),
            MAX,
            BAD_FORMAT,
            41,
        ),
        (b"cas k 0 0 5 -1\r\nhello\r\n".to_vec(), MAX, BAD_FORMAT, 23),
        // Storage: no trustworthy length, only the line goes.
        (b"set k 0 0 -1\r\n".to_vec(), MAX, BAD_FORMAT, 14),
        (b"set k 0 0 abc\r\n".to_vec(), MAX, BAD_FORMAT, 15),
        (b"set k 0 0\r\n".to_vec(), MAX, BAD_FORMAT, 11),
        (
            b"set k 0 0 5 noreply extra\r\nhello\r\n".to_vec(),
            MAX,
            BAD_FORMAT,
            27,
        ),
        (b"cas k 0 0 5\r\nhello\r\n".to_vec(), MAX, BAD_FORMAT, 13),
        (
            b"set k 0 0 2147483645\r\n".to_vec(),
            MAX,
            TOO_LARGE,
            22 + 2147483645 + 2,
        ),
        (b"set k 0 0 2147483646\r\n".to_vec(), MAX, BAD_FORMAT, 22),
        (b"set k 0 0 5\r\n".to_vec(), 4, TOO_LARGE, 13 + 7),
        (b"set k 0 0 5 noreply\r\n".to_vec(), 4, b"", 21 + 7),
        (b"set k 0 0 5\r\nhelloXY".to_vec(), MAX, BAD_DATA_CHUNK, 20),
        (
            b"set k 0 0 5\r\nhello\n\n".to_vec(),
            MAX,
            BAD_DATA_CHUNK,
            20,
        ),
        (b"set k 0 0 5 noreply\r\nhelloXY".to_vec(), MAX, b"", 28),
        (b"delete\r\n".to_vec(), MAX, BAD_FORMAT, 8),
        (b"delete k 1\r\n".to_vec(), MAX, DELETE_USAGE, 12),
        (b"delete k 0 0\r\n".to_vec(), MAX, DELETE_USAGE, 14),
        (b"delete k noreply 0\r\n".to_vec(), MAX, DELETE_USAGE, 20),
        (b"delete k 0 noreply x\r\n".to_vec(), MAX, DELETE_USAGE, 22),
        (del251, MAX, BAD_FORMAT, del251_len),
        (b"incr k\r\n".to_vec(), MAX, BAD_FORMAT, 8),
        (b"incr k abc\r\n".to_vec(), MAX, BAD_DELTA, 12),
        (b"decr k -1\r\n".to_vec(), MAX, BAD_DELTA, 11),
        (
            b"incr k 18446744073709551616\r\n".to_vec(),
            MAX,
            BAD_DELTA,
            29,
        ),
        (b"incr k 1 bogus\r\n".to_vec(), MAX, BAD_FORMAT, 16),
        (b"touch k\r\n".to_vec(), MAX, BAD_FORMAT, 9),
        (b"touch k abc\r\n".to_vec(), MAX, BAD_EXPTIME, 13),
        (
            b"touch k 9223372036854775808\r\n".to_vec(),
            MAX,
            BAD_EXPTIME,
            29,
        ),
        (b"flush_all abc\r\n".to_vec(), MAX, BAD_FORMAT, 15),
        (b"flush_all 1 2\r\n".to_vec(), MAX, BAD_FORMAT, 15),
        (b"flush_all noreply 1\r\n".to_vec(), MAX, BAD_FORMAT, 21),
        (b"flush_all 1 noreply x\r\n".to_vec(), MAX, BAD_FORMAT, 23),
        (b"verbosity\r\n".to_vec(), MAX, BAD_FORMAT, 11),
        (b"verbosity x\r\n".to_vec(), MAX, BAD_FORMAT, 13),
        (b"verbosity noreply\r\n".to_vec(), MAX, b"", 19),
        (b"verbosity 4294967296\r\n".to_vec(), MAX, BAD_FORMAT, 22),
        (b"unlock_all k\r\n".to_vec(), MAX, BAD_FORMAT, 14),
        (b"lock\r\n".to_vec(), MAX, BAD_FORMAT, 6),
        (b"lock a b\r\n".to_vec(), MAX, BAD_FORMAT, 10),
        (unlock251, MAX, BAD_FORMAT, unlock251_len),
    ]
}

#[test]
fn every_command_parses_and_consumes_exactly_its_bytes() {
    for (input, want) in valid_cases() {
        let mut scanned = 0;
        let got = parse(&input, &mut scanned, MAX);
        assert_eq!(
            got,
            Ok((want, input.len())),
            "{:?}",
            String::from_utf8_lossy(&input)
        );
        assert_eq!(scanned, 0, "reset after a request");
    }
}

#[test]
fn keys_iterator_yields_each_key_skipping_runs_of_spaces() {
    let got: Vec<&[u8]> = keys(b"a  bb   ccc").collect();
    assert_eq!(got, [&b"a"[..], b"bb", b"ccc"]);
    let got: Vec<&[u8]> = keys(b"  x  ").collect();
    assert_eq!(got, [&b"x"[..]]);
    assert_eq!(keys(b"").next(), None);
    assert_eq!(keys(b"    ").next(), None);
    let Ok((Request::Get { keys: k, .. }, _)) = parse_fresh(b"get  one two  three \r\n") else {
        panic!("get did not parse");
    };
    assert_eq!(k.collect::<Vec<_>>(), [&b"one"[..], b"two", b"three"]);
}

#[test]
fn every_split_point_of_every_request_is_incomplete() {
    for (input, want) in valid_cases() {
        // Fresh `scanned` for every prefix.
        for i in 0..input.len() {
            assert_eq!(
                parse_fresh(&input[..i]),
                Err(ParseError::Incomplete),
                "{:?} cut at {i}",
                String::from_utf8_lossy(&input)
            );
        }
        // One growing buffer with `scanned` carried over, as the glue does.
        let mut scanned = 0;
        for i in 0..input.len() {
            assert_eq!(
                parse(&input[..i], &mut scanned, MAX),
                Err(ParseError::Incomplete)
            );
            assert!(scanned <= i);
        }
        assert_eq!(parse(&input, &mut scanned, MAX), Ok((want, input.len())));
        assert_eq!(scanned, 0);
    }
}

#[test]
fn pipelined_requests_parse_back_to_back() {
    let cases = valid_cases();
    let all: Vec<u8> = cases.iter().flat_map(|(b, _)| b.iter().copied()).collect();
    let mut pos = 0;
    let mut scanned = 0;
    for (input, want) in &cases {
        let (got, n) = parse(&all[pos..], &mut scanned, MAX).expect("pipelined request");
        assert_eq!((got, n), (*want, input.len()));
        pos += n;
    }
    assert_eq!(pos, all.len());
    assert_eq!(
        parse(&all[pos..], &mut scanned, MAX),
        Err(ParseError::Incomplete)
    );
}

#[test]
fn malformed_requests_answer_memcached_errors_and_skip() {
    for (input, max_value, reply, skip) in invalid_cases() {
        let mut scanned = 0;
        assert_eq!(
            parse(&input, &mut scanned, max_value),
            Err(ParseError::Invalid { reply, skip }),
            "{:?}",
            String::from_utf8_lossy(&input)
        );
        assert_eq!(scanned, 0);
    }
}

#[test]
fn garbage_then_valid_request_parses_after_skipping() {
    let next = b"get foo\r\n";
    for (input, max_value, reply, skip) in invalid_cases() {
        let mut buf = input.clone();
        // Pad a swallowed block that has not arrived yet, as the caller would drop it.
        if skip > buf.len() && skip - buf.len() < 64 {
            buf.resize(skip, b'z');
        }
        if skip > buf.len() {
            continue; // the 2 GiB swallow: checked in the table above
        }
        buf.extend_from_slice(next);
        let mut scanned = 0;
        assert_eq!(
            parse(&buf, &mut scanned, max_value),
            Err(ParseError::Invalid { reply, skip })
        );
        // Leftover bytes of a request whose length could not be trusted (e.g. the data
        // block after a bad `<bytes>`) come out as more errors, never as requests.
        let mut pos = skip;
        loop {
            match parse(&buf[pos..], &mut scanned, max_value) {
                Err(ParseError::Invalid { skip, .. }) => pos += skip,
                got => {
                    assert_eq!(
                        got,
                        Ok((
                            Request::Get {
                                keys: keys(b"foo"),
                                cas: false
                            },
                            next.len()
                        )),
                        "after {:?}",
                        String::from_utf8_lossy(&input)
                    );
                    break;
                }
            }
        }
    }
}

#[test]
fn too_large_value_is_refused_before_the_data_arrives() {
    let buf = b"set k 0 0 100\r\n";
    let mut scanned = 0;
    assert_eq!(
        parse(buf, &mut scanned, 99),
        Err(ParseError::Invalid {
            reply: reply::TOO_LARGE,
            skip: buf.len() + 102
        })
    );
    // Exactly max_value is fine (and waits for its data).
    assert_eq!(parse(buf, &mut scanned, 100), Err(ParseError::Incomplete));
}

#[test]
fn errors_are_silent_with_noreply_as_memcached() {
    // memcached's set_noreply_maybe: silent when the command takes noreply, its token count
    // is accepted and the last token is noreply.
    for input in [
        &b"set k 0 0 5 noreply\r\nhelloXY"[..],
        b"incr k x noreply\r\n",
        b"touch k x noreply\r\n",
        b"verbosity noreply\r\n",
        b"delete k 1 noreply\r\n",
        b"cas k 0 0 1 x noreply\r\nv\r\n",
    ] {
        match parse_fresh(input) {
            Err(ParseError::Invalid { reply, .. }) => assert_eq!(reply, b"", "{input:?}"),
            other => panic!("{other:?}"),
        }
    }
    // Answered: unknown command, a token count memcached refuses, noreply not last.
    for input in [
        &b"bogus noreply\r\n"[..],
        b"set k 0 0 5 1 noreply\r\nhello\r\n",
        b"incr k noreply x\r\n",
        b"lock a noreply\r\n",
    ] {
        match parse_fresh(input) {
            Err(ParseError::Invalid { reply, .. }) => assert!(!reply.is_empty(), "{input:?}"),
            other => panic!("{input:?}: {other:?}"),
        }
    }
}

fn line_of(prefix: &[u8], total: usize) -> Vec<u8> {
    // `prefix` then keys of 'k' separated by spaces, "\r\n"-terminated, `total` bytes long.
    let mut v = prefix.to_vec();
    while v.len() < total - 2 {
        v.push(if v.len().is_multiple_of(200) {
            b' '
        } else {
            b'k'
        });
    }
    if v.last() == Some(&b' ') {
        v.pop();
        v.push(b'k');
    }
    v.extend_from_slice(b"\r\n");
    assert_eq!(v.len(), total);
    v
}

#[test]
fn ordinary_line_may_be_2048_bytes_not_more() {
    let ok = line_of(b"stats ", MAX_LINE);
    assert!(matches!(
        parse_fresh(&ok),
        Ok((Request::Stats { .. }, MAX_LINE))
    ));
    let long = line_of(b"stats ", MAX_LINE + 1);
    assert_eq!(
        parse_fresh(&long),
        Err(ParseError::Fatal {
            reply: reply::LINE_TOO_LONG
        })
    );
    let mut scanned = 0;
    assert_eq!(
        parse(&long[..MAX_LINE - 1], &mut scanned, MAX),
        Err(ParseError::Incomplete)
    );
    assert_eq!(
        parse(&long[..MAX_LINE], &mut scanned, MAX),
        Err(ParseError::Fatal {
            reply: reply::LINE_TOO_LONG
        })
    );
    assert_eq!(scanned, 0);
    // A set line is an ordinary line too.
    let junk = vec![b'x'; 5000];
    assert_eq!(
        parse_fresh(&junk),
        Err(ParseError::Fatal {
            reply: reply::LINE_TOO_LONG
        })
    );
}

#[test]
fn retrieval_line_may_be_64_kib_not_more() {
    for prefix in [&b"get "[..], b"gets ", b"gat 0 ", b"gats 0 ", b"   get "] {
        let ok = line_of(prefix, MAX_RETRIEVAL_LINE);
        let got = parse_fresh(&ok);
        assert!(matches!(got, Ok((_, MAX_RETRIEVAL_LINE))), "{got:?}");
        let long = line_of(prefix, MAX_RETRIEVAL_LINE + 1);
        assert_eq!(
            parse_fresh(&long),
            Err(ParseError::Fatal {
                reply: reply::LINE_TOO_LONG
            })
        );
        assert_eq!(parse_fresh(&long[..5000]), Err(ParseError::Incomplete));
    }
    // "getx" is not a retrieval command: the 2048 cap applies.
    let getx = line_of(b"getx ", 5000);
    assert_eq!(
        parse_fresh(&getx),
        Err(ParseError::Fatal {
            reply: reply::LINE_TOO_LONG
        })
    );
    // More than 100 leading spaces do not count as a retrieval command (memcached's rule).
    let mut spaced = vec![b' '; 101];
    spaced.extend_from_slice(&line_of(b"get ", 3000));
    assert_eq!(
        parse_fresh(&spaced),
        Err(ParseError::Fatal {
            reply: reply::LINE_TOO_LONG
        })
    );
}

#[test]
fn one_byte_at_a_time_scans_each_byte_once() {
    let line = line_of(b"get ", 60_000);
    NEWLINE_SEARCH_WORK.with(|w| w.set(0));
    let mut scanned = 0;
    for i in 0..line.len() {
        assert_eq!(
            parse(&line[..i], &mut scanned, MAX),
            Err(ParseError::Incomplete)
        );
        assert_eq!(scanned, i, "scanned is how far the search got");
    }
    assert!(matches!(parse(&line, &mut scanned, MAX), Ok((_, 60_000))));
    assert_eq!(scanned, 0);
    let work = NEWLINE_SEARCH_WORK.with(|w| w.get());
    assert_eq!(work, line.len(), "every byte examined exactly once");
}

#[test]
fn scanned_stops_at_the_newline_while_the_data_block_arrives() {
    let req = b"set k 0 0 10\r\n0123456789\r\n";
    let nl = 13;
    let mut scanned = 0;
    NEWLINE_SEARCH_WORK.with(|w| w.set(0));
    for i in 0..req.len() {
        assert_eq!(
            parse(&req[..i], &mut scanned, MAX),
            Err(ParseError::Incomplete)
        );
        assert_eq!(scanned, i.min(nl));
    }
    assert!(matches!(parse(req, &mut scanned, MAX), Ok((_, 26))));
    // The newline itself is re-examined once per call while the data arrives.
    let work = NEWLINE_SEARCH_WORK.with(|w| w.get());
    assert!(work <= req.len() + req.len(), "work {work}");
}

#[test]
fn scanned_beyond_the_buffer_is_treated_as_zero() {
    let mut scanned = 1000;
    assert!(matches!(
        parse(b"version\r\n", &mut scanned, MAX),
        Ok((Request::Version, 9))
    ));
    assert_eq!(scanned, 0);
}

#[test]
fn numbers_at_overflow_boundaries() {
    assert_eq!(parse_u32(b"4294967295"), Some(u32::MAX));
    assert_eq!(parse_u32(b"4294967296"), None);
    assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
    assert_eq!(parse_u64(b"18446744073709551616"), None);
    assert_eq!(parse_u64(b"99999999999999999999999999999999"), None);
    assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
    assert_eq!(parse_i64(b"9223372036854775808"), None);
    assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
    assert_eq!(parse_i64(b"-9223372036854775809"), None);
    assert_eq!(parse_i64(b"-0"), Some(0));
    for bad in [&b""[..], b"-", b"+1", b"1a", b" 1", b"--1", b"0x10"] {
        assert_eq!(parse_i64(bad), None, "{bad:?}");
        assert_eq!(parse_u64(bad), None, "{bad:?}");
    }
    assert_eq!(parse_u64(b"-1"), None);
}

use crate::rng::Rng;

fn check_no_panic(buf: &[u8], scanned: &mut usize, max_value: usize) {
    match parse(buf, scanned, max_value) {
        Ok((_, n)) => assert!(n >= 1 && n <= buf.len() && *scanned == 0),
        Err(ParseError::Invalid { skip, reply }) => {
            // An empty reply only where a trailing noreply silences it.
            let line_end = buf.iter().position(|&b| b == b'\n').unwrap_or(buf.len());
            let line = buf[..line_end]
                .strip_suffix(b"\r")
                .unwrap_or(&buf[..line_end]);
            assert!(skip >= 1 && *scanned == 0);
            assert_eq!(reply.is_empty(), noreply_silences(line), "{buf:?}");
        }
        Err(ParseError::Incomplete) => assert!(*scanned <= buf.len()),
        Err(ParseError::Fatal { .. }) => assert_eq!(*scanned, 0),
    }
}

#[test]
fn random_bytes_and_mutations_never_panic() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let alphabet = b"getsadcrplinuxomfh_0123456789 -\r\n\x00\xffk";
    let seeds: Vec<Vec<u8>> = valid_cases().into_iter().map(|(b, _)| b).collect();
    for round in 0..20_000 {
        let mut buf: Vec<u8> = if round % 2 == 0 {
            let len = rng.index(64);
            (0..len)
                .map(|_| alphabet[rng.index(alphabet.len())])
                .collect()
        } else {
            seeds[rng.index(seeds.len())].clone()
        };
        for _ in 0..rng.index(4) {
            match rng.index(4) {
                0 if !buf.is_empty() => {
                    let i = rng.index(buf.len());
                    buf[i] = alphabet[rng.index(alphabet.len())];
                }
                1 => {
                    let i = rng.index(buf.len() + 1);
                    buf.insert(i, alphabet[rng.index(alphabet.len())]);
                }
                2 if !buf.is_empty() => {
                    buf.remove(rng.index(buf.len()));
                }
                _ => buf.truncate(rng.index(buf.len() + 1)),
            }
        }
        let max_value = rng.index(16);
        let mut scanned = 0;
        check_no_panic(&buf, &mut scanned, max_value);
        // Also grow it byte by byte with `scanned` carried over.
        let mut scanned = 0;
        for i in 0..=buf.len() {
            check_no_panic(&buf[..i], &mut scanned, max_value);
        }
    }
}
