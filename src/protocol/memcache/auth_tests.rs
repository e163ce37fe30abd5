//! The worker's parsing of a memcached connection that has not authenticated: the exact answers,
//! and that nothing reaches the owner before authentication.

use super::*;
use crate::config::Config;
use crate::proto::memcache::binary::{encode_request, parse_response};
use crate::server::Proto;
use crate::tls::Secrets;
use std::sync::Arc;

fn config() -> Config {
    match crate::config::parse(Vec::<String>::new()) {
        Ok(crate::config::Command::Run(c)) => c,
        other => panic!("{other:?}"),
    }
}

fn secrets() -> Secrets {
    Secrets {
        memcache_users: Some(Arc::new(
            Users::parse(b"alice:s3cret pass\nbob:hunter2\n").unwrap(),
        )),
        ..Secrets::default()
    }
}

/// A connection under test: everything sent so far, what it answered, what reached the owner.
struct T {
    conn: Conn,
    config: Config,
    secrets: Secrets,
    batch: Batch,
    id: ConnId,
}

impl T {
    fn new() -> T {
        let secrets = secrets();
        T {
            conn: Conn::accepted(Proto::Memcache, &secrets),
            config: config(),
            secrets,
            batch: Batch::default(),
            id: ConnId::new(0, 1, 0),
        }
    }

    /// Send bytes; returns whether the connection is to be closed.
    fn send(&mut self, bytes: &[u8]) -> bool {
        let cx = Cx {
            config: &self.config,
            secrets: &self.secrets,
        };
        self.conn.receive(bytes, self.id, cx, &mut self.batch) || self.conn.closing
    }

    fn output(&mut self) -> Vec<u8> {
        let out = self.conn.output().to_vec();
        self.conn.written(out.len());
        out
    }

    fn to_owner(&self) -> usize {
        self.batch.ops.len()
    }
}

fn bin(opcode: u8, key: &[u8], value: &[u8], opaque: u32) -> Vec<u8> {
    let mut v = Vec::new();
    encode_request(&mut v, opcode, opaque, 0, &[], key, value);
    v
}

fn bin_set(key: &[u8], value: &[u8]) -> Vec<u8> {
    bin_store(opcode::SET, key, value)
}

fn bin_store(op: u8, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    encode_request(&mut v, op, 7, 0, &[0; 8], key, value);
    v
}

/// (opcode, status, opaque, value) of each response in `out`.
fn responses(mut out: &[u8]) -> Vec<(u8, u16, u32, Vec<u8>)> {
    let mut v = Vec::new();
    while !out.is_empty() {
        let (r, n) = parse_response(out).expect("a whole response");
        v.push((r.opcode, r.status, r.opaque, r.value.to_vec()));
        out = &out[n..];
    }
    v
}

#[test]
fn without_users_a_connection_needs_no_authentication() {
    assert!(Conn::accepted(Proto::Memcache, &Secrets::default()).authenticated);
    for proto in [Proto::Lockd, Proto::Dlock, Proto::Counter] {
        assert!(Conn::accepted(proto, &secrets()).authenticated, "{proto:?}");
    }
    assert!(!Conn::accepted(Proto::Memcache, &secrets()).authenticated);
}

#[test]
fn every_text_command_before_authentication_is_refused_and_nothing_reaches_the_owner() {
    let commands: &[&[u8]] = &[
        b"get k\r\n",
        b"gets k\r\n",
        b"set k 0 0\r\n",
        b"add k 0 0 1\r\nv\r\n",
        b"delete k\r\n",
        b"incr k 1\r\n",
        b"lock k\r\n",
        b"unlock_all\r\n",
        b"lock_token k\r\n",
        b"stats\r\n",
        b"version\r\n",
        b"verbosity 1\r\n",
        b"flush_all\r\n",
        b"keys\r\n",
        b"\r\n",
        b"x\n",
    ];
    for &cmd in commands {
        let mut t = T::new();
        assert!(!t.send(cmd), "{:?}", String::from_utf8_lossy(cmd));
        let out = t.output();
        // `add k 0 0 1` leaves its data line, which is one more command.
        let want = if cmd.starts_with(b"add") {
            [reply::UNAUTHENTICATED, reply::UNAUTHENTICATED].concat()
        } else {
            reply::UNAUTHENTICATED.to_vec()
        };
        assert_eq!(out, want, "{:?}", String::from_utf8_lossy(cmd));
        assert_eq!(t.to_owner(), 0, "{:?}", String::from_utf8_lossy(cmd));
        assert!(!t.conn.authenticated);
    }
}

#[test]
fn text_authentication_answers_as_memcached() {
    let cases: &[(&[u8], &[u8], bool)] = &[
        (b"set any 0 0 7\r\nbob pwd\r\n", reply::FAILURE, false),
        (b"set any 0 0 11\r\nbob hunter2\r\n", reply::STORED, true),
        // The password is everything after the first space.
        (
            b"set k 1 2 17\r\nalice s3cret pass\r\n",
            reply::STORED,
            true,
        ),
        (b"set k 1 2 12\r\nalice s3cret\r\n", reply::FAILURE, false),
        (
            b"set k 0 0 11 noreply\r\nbob hunter2\r\n",
            reply::STORED,
            true,
        ),
        (b"set k 0 0 7\r\nhunter2\r\n", reply::BAD_FORMAT, false),
        (
            b"set k 0 0 11\r\nbob hunter2XY",
            reply::BAD_TERMINATION,
            false,
        ),
        (b"set k 0 0 0\r\n\r\n", reply::BAD_FORMAT, false),
        (b"set k 0 0 14\r\nnobody hunter2\r\n", reply::FAILURE, false),
        (b"set k 0 0 3\r\n:x \r\n", reply::FAILURE, false),
        (b"set k 0 0 -1\r\n", reply::UNAUTHENTICATED, false),
        (b"set k 0 0 x\r\n", reply::UNAUTHENTICATED, false),
        (b"set k 0 0\r\n", reply::UNAUTHENTICATED, false),
        (b"add k 0 0 11\r\n", reply::UNAUTHENTICATED, false),
        (b"set k 0 0 16385\r\n", reply::TOO_LONG, false),
    ];
    for &(input, want, ok) in cases {
        let mut t = T::new();
        assert!(!t.send(input), "{:?}", String::from_utf8_lossy(input));
        assert_eq!(
            String::from_utf8_lossy(&t.output()),
            String::from_utf8_lossy(want),
            "{:?}",
            String::from_utf8_lossy(input)
        );
        assert_eq!(
            t.conn.authenticated,
            ok,
            "{:?}",
            String::from_utf8_lossy(input)
        );
        assert_eq!(t.to_owner(), 0);
    }
}

#[test]
fn a_failed_text_attempt_leaves_the_connection_open_and_a_later_one_may_succeed() {
    let mut t = T::new();
    assert!(!t.send(b"set a 0 0 7\r\nbob bad\r\nget a\r\n"));
    assert_eq!(
        t.output(),
        [reply::FAILURE, reply::UNAUTHENTICATED].concat()
    );
    // Byte by byte: the attempt waits for its data block.
    for &b in b"set a 0 0 11\r\nbob hunter2\r\n" {
        assert!(!t.send(&[b]));
    }
    assert_eq!(t.output(), reply::STORED);
    assert!(t.conn.authenticated);
    assert_eq!(t.to_owner(), 0, "the authentication itself stores nothing");
    // From now on requests are served: a `set` is a set.
    t.send(b"set a 0 0 1\r\nv\r\nget a\r\n");
    assert_eq!(t.to_owner(), 2);
}

#[test]
fn a_text_line_without_end_closes_and_quit_closes() {
    let mut t = T::new();
    assert!(!t.send(&[b'a'; MAX_LINE - 1]));
    assert!(t.send(b"a"));
    assert!(t.output().is_empty());
    let mut t = T::new();
    assert!(t.send(b"quit\r\n"));
    assert!(t.output().is_empty());
    assert_eq!(t.to_owner(), 0);
}

#[test]
fn every_binary_request_before_authentication_gets_auth_error_and_closes() {
    for &op in opcode::ALL.iter().filter(|&&op| op != opcode::VERSION) {
        let mut t = T::new();
        let req = if matches!(op, opcode::SET | opcode::ADD) {
            bin_store(op, b"k", b"v")
        } else {
            bin(op, b"k", b"", 9)
        };
        assert!(t.send(&req), "opcode {op:#04x} must close");
        let r = responses(&t.output());
        let opaque = if matches!(op, opcode::SET | opcode::ADD) {
            7
        } else {
            9
        };
        assert_eq!(
            r,
            vec![(op, status::AUTH_ERROR, opaque, AUTH_FAILURE.to_vec())],
            "opcode {op:#04x}"
        );
        assert_eq!(t.to_owner(), 0, "opcode {op:#04x}");
    }
}

#[test]
fn an_unauthenticated_binary_request_is_refused_from_its_header_alone() {
    let mut t = T::new();
    // A Set announcing a 1 MiB value: refused at once, its body never awaited.
    let mut req = bin_set(b"k", &vec![b'v'; 1 << 20]);
    req.truncate(HEADER_LEN);
    assert!(t.send(&req));
    assert_eq!(responses(&t.output())[0].1, status::AUTH_ERROR);
}

#[test]
fn sasl_plain_authenticates_and_a_wrong_password_leaves_the_connection_open() {
    let mut t = T::new();
    t.send(&bin(SASL_LIST_MECHS, b"", b"", 1));
    assert_eq!(
        responses(&t.output()),
        vec![(SASL_LIST_MECHS, 0, 1, b"PLAIN".to_vec())]
    );
    t.send(&bin(opcode::VERSION, b"", b"", 2));
    let r = responses(&t.output());
    assert_eq!((r[0].1, r[0].2), (0, 2));
    assert!(r[0].3.starts_with(b"1.6.0-holdfast-"));

    let wrong: &[(&[u8], &[u8])] = &[
        (b"PLAIN", b"\0bob\0hunter3"),
        (b"PLAIN", b"\0bob\0"),
        (b"PLAIN", b"bob\0hunter2"),
        (b"PLAIN", b"alice\0bob\0hunter2"),
        (b"PLAIN", b""),
        (b"CRAM-MD5", b"\0bob\0hunter2"),
        (b"plain", b"\0bob\0hunter2"),
    ];
    for (mech, value) in wrong {
        assert!(!t.send(&bin(SASL_AUTH, mech, value, 3)));
        assert_eq!(
            responses(&t.output()),
            vec![(SASL_AUTH, status::AUTH_ERROR, 3, AUTH_FAILURE.to_vec())],
            "{mech:?} {value:?}"
        );
        assert!(!t.conn.authenticated);
    }
    // A mechanism name over 32 bytes: Invalid arguments, as memcached answers.
    assert!(!t.send(&bin(SASL_AUTH, &[b'X'; 40], b"\0bob\0hunter2", 4)));
    assert_eq!(responses(&t.output())[0].1, status::INVALID_ARGUMENTS);
    assert_eq!(t.to_owner(), 0);

    assert!(!t.send(&bin(SASL_AUTH, b"PLAIN", b"bob\0bob\0hunter2", 5)));
    assert_eq!(
        responses(&t.output()),
        vec![(SASL_AUTH, 0, 5, AUTHENTICATED.to_vec())]
    );
    assert!(t.conn.authenticated);
    t.send(&bin_set(b"k", b"v"));
    assert_eq!(t.to_owner(), 1, "served once authenticated");
}

#[test]
fn sasl_step_authenticates_like_auth_and_a_failed_reauthentication_logs_out() {
    let mut t = T::new();
    t.send(&bin(SASL_STEP, b"PLAIN", b"\0alice\0s3cret pass", 1));
    assert_eq!(responses(&t.output())[0].1, 0);
    assert!(t.conn.authenticated);
    // Authenticated: SASL is still answered, and a wrong attempt starts over.
    t.send(&bin(SASL_LIST_MECHS, b"", b"", 2));
    assert_eq!(responses(&t.output())[0].3, b"PLAIN");
    t.send(&bin(SASL_AUTH, b"PLAIN", b"\0alice\0wrong", 3));
    assert_eq!(responses(&t.output())[0].1, status::AUTH_ERROR);
    assert!(!t.conn.authenticated);
    assert!(t.send(&bin(opcode::GET, b"k", b"", 4)));
    assert_eq!(responses(&t.output())[0].1, status::AUTH_ERROR);
    assert_eq!(t.to_owner(), 0);
}

#[test]
fn malformed_sasl_requests_close() {
    let mut t = T::new();
    assert!(t.send(&bin(SASL_LIST_MECHS, b"k", b"", 1)));
    assert_eq!(responses(&t.output())[0].1, status::INVALID_ARGUMENTS);
    let mut t = T::new();
    assert!(t.send(&bin(SASL_AUTH, b"", b"\0bob\0hunter2", 1)));
    assert_eq!(responses(&t.output())[0].1, status::INVALID_ARGUMENTS);
    let mut t = T::new();
    assert!(t.send(&bin(SASL_AUTH, b"PLAIN", &vec![0; MAX_AUTH_DATA + 1], 1)));
    assert_eq!(responses(&t.output())[0].1, status::INVALID_ARGUMENTS);
    let mut t = T::new();
    assert!(t.send(b"\x81rest"), "a bad magic closes");
}

#[test]
fn authentication_then_requests_in_one_read_are_served_in_order() {
    let mut t = T::new();
    let mut bytes = bin(SASL_AUTH, b"PLAIN", b"\0bob\0hunter2", 1);
    bytes.extend_from_slice(&bin(opcode::GET, b"k", b"", 2));
    bytes.extend_from_slice(b"get k\r\n");
    assert!(!t.send(&bytes));
    assert_eq!(responses(&t.output())[0].3, AUTHENTICATED);
    assert_eq!(t.to_owner(), 2);
}

#[test]
fn without_users_sasl_is_an_unknown_command() {
    let secrets = Secrets::default();
    let config = config();
    let mut conn = Conn::accepted(Proto::Memcache, &secrets);
    let mut batch = Batch::default();
    let cx = Cx {
        config: &config,
        secrets: &secrets,
    };
    conn.receive(
        &bin(SASL_AUTH, b"PLAIN", b"\0bob\0hunter2", 1),
        ConnId::new(0, 1, 0),
        cx,
        &mut batch,
    );
    let out = conn.output().to_vec();
    assert_eq!(responses(&out)[0].1, status::UNKNOWN_COMMAND);
}

#[test]
fn plain_messages() {
    assert_eq!(plain(b"\0u\0p"), Some((&b"u"[..], &b"p"[..])));
    assert_eq!(plain(b"u\0u\0p"), Some((&b"u"[..], &b"p"[..])));
    assert_eq!(plain(b"\0u\0"), Some((&b"u"[..], &b""[..])));
    assert_eq!(plain(b"\0u\0p\0q"), Some((&b"u"[..], &b"p\0q"[..])));
    assert_eq!(plain(b"x\0u\0p"), None);
    assert_eq!(plain(b"u\0p"), None);
    assert_eq!(plain(b""), None);
}
