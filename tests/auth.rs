//! Authentication against the real daemon (`docs/operations.md`, "Security"):
//! memcached users, the dlock token file, the admin token, the admin port over TLS, secret
//! files that others can read, and SIGHUP reloads.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::mcbin::{self, Resp};
use common::{Client, Daemon, DEADLINE};
use holdfast::proto::dlock::{self as dl, req_type, status, LockFields};
use holdfast_testkit::pki::temp_dir;

/// Write a secret file with `mode`, replacing any old one whole (a reload never reads half).
fn secret(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.new"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path
}

fn sighup(d: &Daemon) {
    // SAFETY: kill(2) on the PID of the daemon this test started and has not reaped.
    assert_eq!(
        unsafe { libc::kill(d.pid() as libc::pid_t, libc::SIGHUP) },
        0
    );
}

/// Try `f` until it is true; panics after DEADLINE (a SIGHUP is handled asynchronously).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !f() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

// ---------------------------------------------------------------------------------------------
// memcached users

const SASL_LIST_MECHS: u8 = 0x20;
const SASL_AUTH: u8 = 0x21;
const SASL_STEP: u8 = 0x22;
const AUTH_ERROR: u16 = 0x0020;

fn sasl_plain(c: &mut Client, opcode: u8, user: &str, password: &str) -> Resp {
    let value = format!("\0{user}\0{password}");
    mcbin::call(
        c,
        &mcbin::request(opcode, &[], b"PLAIN", value.as_bytes(), 9, 0),
    )
}

fn text_auth(c: &mut Client, user: &str, password: &str) -> String {
    let token = format!("{user} {password}");
    c.send(format!("set auth 0 0 {}\r\n{token}\r\n", token.len()).as_bytes());
    c.line()
}

fn mc_daemon(dir: &Path) -> (Daemon, PathBuf) {
    let users = secret(dir, "users", "alice:wonder land\nbob:hunter2\n", 0o600);
    let d = Daemon::start(&["--memcache-auth-file", path_str(&users)]);
    (d, users)
}

#[test]
fn memcached_text_clients_authenticate_first_and_nothing_passes_before() {
    let dir = temp_dir("auth-mc-text");
    let (d, _) = mc_daemon(&dir);
    let mut a = d.memcache();
    for cmd in [
        &b"get k\r\n"[..],
        b"lock k\r\n",
        b"delete k\r\n",
        b"flush_all\r\n",
        b"stats\r\n",
        b"version\r\n",
    ] {
        a.expect(cmd, b"CLIENT_ERROR unauthenticated\r\n");
    }
    assert_eq!(
        text_auth(&mut a, "bob", "hunter3"),
        "CLIENT_ERROR authentication failure\r\n"
    );
    a.expect(b"get k\r\n", b"CLIENT_ERROR unauthenticated\r\n");
    assert_eq!(text_auth(&mut a, "alice", "wonder land"), "STORED\r\n");
    a.expect(b"set k 0 0 1\r\nv\r\n", b"STORED\r\n");
    a.expect(b"lock k\r\n", b"OK\r\n");
    a.expect(b"get auth\r\n", b"END\r\n");

    // Another connection, not authenticated: it can neither read, nor unlock, nor change.
    let mut b = d.memcache();
    b.expect(b"unlock k\r\n", b"CLIENT_ERROR unauthenticated\r\n");
    b.expect(b"unlock_all\r\n", b"CLIENT_ERROR unauthenticated\r\n");
    b.expect(b"get k\r\n", b"CLIENT_ERROR unauthenticated\r\n");
    b.expect(
        b"set x 0 0 1\r\nv\r\n",
        b"CLIENT_ERROR bad authentication token format\r\n",
    );
    // A binary request before authentication: auth error, then the connection is closed.
    let r = mcbin::call(&mut b, &mcbin::request(0x42, &[], b"k", b"", 3, 0));
    assert_eq!(
        (r.opcode, r.status, r.opaque, &r.value[..]),
        (0x42, AUTH_ERROR, 3, &b"Auth failure."[..])
    );
    b.expect_closed();
    a.expect(b"get k\r\nget x\r\n", b"VALUE k 0 1\r\nv\r\nEND\r\nEND\r\n");
    let mut c = d.memcache();
    c.expect(b"quit\r\n", b"");
    c.expect_closed();
    let mut e = d.memcache();
    assert_eq!(text_auth(&mut e, "bob", "hunter2"), "STORED\r\n");
    e.expect(b"lock k\r\n", b"LOCKED\r\n");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn memcached_binary_clients_authenticate_with_sasl_plain() {
    let dir = temp_dir("auth-mc-sasl");
    let (d, _) = mc_daemon(&dir);
    let mut c = d.memcache();
    let r = mcbin::call(
        &mut c,
        &mcbin::request(SASL_LIST_MECHS, &[], b"", b"", 1, 0),
    );
    assert_eq!((r.status, &r.value[..]), (0, &b"PLAIN"[..]));
    let r = sasl_plain(&mut c, SASL_AUTH, "bob", "hunter3");
    assert_eq!(
        (r.opcode, r.status, r.opaque, &r.value[..]),
        (SASL_AUTH, AUTH_ERROR, 9, &b"Auth failure."[..])
    );
    // Still open after a failed attempt; the right password then works (step as auth).
    let r = sasl_plain(&mut c, SASL_STEP, "bob", "hunter2");
    assert_eq!((r.status, &r.value[..]), (0, &b"Authenticated"[..]));
    let set = mcbin::request(0x01, &[0; 8], b"k", b"v", 5, 0);
    assert_eq!(mcbin::call(&mut c, &set).status, 0);
    let r = mcbin::call(&mut c, &mcbin::request(0x00, &[], b"k", b"", 6, 0));
    assert_eq!((r.status, &r.value[..]), (0, &b"v"[..]));
    // Every opcode before authentication: auth error and close, and nothing changed.
    for opcode in [0x00u8, 0x01, 0x04, 0x08, 0x0a, 0x10, 0x40, 0x44, 0x46, 0x50] {
        let mut u = d.memcache();
        let extras: &[u8] = match opcode {
            0x01 => &[0; 8],
            _ => &[],
        };
        let key: &[u8] = if matches!(opcode, 0x08 | 0x0a | 0x10 | 0x44) {
            b""
        } else {
            b"k"
        };
        let value: &[u8] = if opcode == 0x01 { b"w" } else { b"" };
        let r = mcbin::call(&mut u, &mcbin::request(opcode, extras, key, value, 2, 0));
        assert_eq!((r.opcode, r.status), (opcode, AUTH_ERROR), "{opcode:#04x}");
        u.expect_closed();
    }
    let r = mcbin::call(&mut c, &mcbin::request(0x00, &[], b"k", b"", 6, 0));
    assert_eq!(
        (r.status, &r.value[..]),
        (0, &b"v"[..]),
        "flush or set got through"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_sighup_changes_the_users_for_new_attempts_and_open_sessions_keep_theirs() {
    let dir = temp_dir("auth-mc-reload");
    let (d, _) = mc_daemon(&dir);
    let mut old = d.memcache();
    assert_eq!(text_auth(&mut old, "bob", "hunter2"), "STORED\r\n");
    secret(&dir, "users", "bob:correct horse\n", 0o600);
    sighup(&d);
    eventually("the new password accepted", || {
        text_auth(&mut d.memcache(), "bob", "correct horse") == "STORED\r\n"
    });
    let mut c = d.memcache();
    assert_eq!(
        text_auth(&mut c, "bob", "hunter2"),
        "CLIENT_ERROR authentication failure\r\n"
    );
    assert_eq!(
        sasl_plain(&mut c, SASL_AUTH, "alice", "wonder land").status,
        AUTH_ERROR
    );
    assert_eq!(
        sasl_plain(&mut c, SASL_AUTH, "bob", "correct horse").status,
        0
    );
    old.expect(b"set k 0 0 1\r\nv\r\n", b"STORED\r\n");
    // A file that fails to load keeps the users in force.
    secret(&dir, "users", "bob:other\n", 0o644);
    sighup(&d);
    std::thread::sleep(Duration::from_millis(200));
    let mut e = d.memcache();
    assert_eq!(text_auth(&mut e, "bob", "correct horse"), "STORED\r\n");
    std::fs::remove_dir_all(dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// The dlock token file

fn dlock_ping(c: &mut Client, token: Option<&[u8]>) -> dl::Response {
    let mut out = Vec::new();
    dl::encode_request(&mut out, Some(1), token, req_type::PING, None);
    c.send(&out);
    read_dlock(c)
}

fn dlock_lock(c: &mut Client, token: Option<&[u8]>, key: &[u8]) -> dl::Response {
    let keys = [key];
    let mut out = Vec::new();
    let lock = LockFields {
        wait_micro: Some(0),
        keys: &keys,
        ..Default::default()
    };
    dl::encode_request(&mut out, Some(2), token, req_type::LOCK, Some(lock));
    c.send(&out);
    read_dlock(c)
}

fn read_dlock(c: &mut Client) -> dl::Response {
    c.fill(4);
    let len = u32::from_be_bytes([c.pending[0], c.pending[1], c.pending[2], c.pending[3]]) as usize;
    let bytes = c.take(4 + len);
    dl::decode_response(&bytes[4..]).expect("a valid Response")
}

fn denied(r: &dl::Response) -> bool {
    r.status == Some(status::GENERAL) && r.error_text.as_deref() == Some(&b"access denied"[..])
}

#[test]
fn the_dlock_token_file_guards_every_request_and_a_sighup_replaces_it() {
    let dir = temp_dir("auth-dlock");
    let token = secret(&dir, "dlock.token", "first-token\nignored line\n", 0o600);
    let d = Daemon::start(&["--dlock-token-file", path_str(&token)]);
    let mut c = d.dlock();
    assert!(denied(&dlock_ping(&mut c, None)));
    assert!(denied(&dlock_lock(&mut c, None, b"k")));
    assert!(denied(&dlock_lock(&mut c, Some(b"first-tokeN"), b"k")));
    assert!(denied(&dlock_lock(&mut c, Some(b"first-token\n"), b"k")));
    assert!(denied(&dlock_lock(&mut c, Some(b""), b"k")));
    let r = dlock_lock(&mut c, Some(b"first-token"), b"k");
    assert_eq!(r.status, Some(status::OK), "{r:?}");
    // The lock is held: a denied request of another connection did not take it.
    let mut other = d.dlock();
    assert!(denied(&dlock_lock(&mut other, Some(b"guess"), b"k")));
    assert_eq!(
        dlock_lock(&mut other, Some(b"first-token"), b"k").status,
        Some(status::ACQUIRE_TIMEOUT)
    );

    secret(&dir, "dlock.token", "second-token\n", 0o600);
    sighup(&d);
    eventually("the new token accepted", || {
        dlock_ping(&mut d.dlock(), Some(b"second-token")).status == Some(status::OK)
    });
    let mut n = d.dlock();
    assert!(denied(&dlock_ping(&mut n, Some(b"first-token"))));
    assert!(denied(&dlock_lock(&mut n, Some(b"first-token"), b"j")));
    assert_eq!(
        dlock_lock(&mut n, Some(b"second-token"), b"j").status,
        Some(status::OK)
    );
    std::fs::remove_dir_all(dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Secret files others can read

fn refused_at_start(flag: &str, mode: u32) {
    let dir = temp_dir("auth-mode");
    let file = secret(&dir, "secret", "user:password\n", mode);
    let out = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args([
            flag,
            path_str(&file),
            "--memcache",
            "127.0.0.1:0",
            "--lockd",
            "127.0.0.1:0",
            "--dlock",
            "127.0.0.1:0",
            "--counter",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("run holdfast");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{flag} mode {mode:o}: {err}");
    assert_eq!(err.lines().count(), 1, "{flag}: {err}");
    assert!(err.contains(path_str(&file)), "{flag}: {err}");
    assert!(err.contains("chmod 600"), "{flag}: {err}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_secret_file_others_can_read_stops_the_daemon_with_exit_2() {
    refused_at_start("--dlock-token-file", 0o644);
    refused_at_start("--memcache-auth-file", 0o640);
    refused_at_start("--admin-token-file", 0o640);
}

// ---------------------------------------------------------------------------------------------
// The admin port: token, loopback-only changes, TLS

/// Send `request` on `stream` and read to EOF: (status, head, body); status 0 when the answer
/// was no HTTP at all.
fn exchange(
    stream: &mut (impl std::io::Read + std::io::Write),
    request: &str,
) -> (u16, String, String) {
    stream.write_all(request.as_bytes()).expect("send");
    let mut all = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => all.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&all).into_owned();
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return (0, text, String::new());
    };
    let status = head
        .strip_prefix("HTTP/1.1 ")
        .and_then(|h| h.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

fn request(method: &str, path: &str, auth: Option<&str>) -> String {
    let auth = auth.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    format!("{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 0\r\n\r\n")
}

fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    auth: Option<&str>,
) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect admin");
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    exchange(&mut s, &request(method, path, auth))
}

const TOKEN: &str = "adm1n-t0ken";
/// base64("ops:adm1n-t0ken") and base64("ops:wrong").
const BASIC: &str = "Basic b3BzOmFkbTFuLXQwa2Vu";
const BASIC_WRONG: &str = "Basic b3BzOndyb25n";

/// Every guarded request: (method, path).
const GUARDED: &[(&str, &str)] = &[
    ("GET", "/"),
    ("GET", "/index.html"),
    ("HEAD", "/"),
    ("GET", "/locks?table=lockd"),
    ("GET", "/cluster"),
    ("GET", "/status.json"),
    ("POST", "/cluster/add?id=4&addr=127.0.0.1:1"),
    ("POST", "/cluster/remove?id=4"),
    ("GET", "/no/such/path"),
    ("DELETE", "/locks"),
    ("POST", "/healthz"),
    ("POST", "/metrics"),
];

#[test]
fn the_admin_token_guards_every_request_but_healthz_and_metrics() {
    let dir = temp_dir("auth-admin");
    let token = secret(&dir, "admin.token", &format!("{TOKEN}\n"), 0o600);
    let d = Daemon::start(&["--admin-token-file", path_str(&token)]);
    let admin = d.admin.expect("admin port");
    let wrong = [
        None,
        Some("Bearer wrong"),
        Some("Bearer adm1n-t0ke"),
        Some(BASIC_WRONG),
        Some("adm1n-t0ken"),
    ];
    for &(method, path) in GUARDED {
        for auth in wrong {
            let (status, head, body) = http(admin, method, path, auth);
            assert_eq!(status, 401, "{method} {path} with {auth:?}: {head}");
            assert!(
                head.contains("WWW-Authenticate: Basic realm=\"holdfast\""),
                "{head}"
            );
            assert!(
                head.contains("WWW-Authenticate: Bearer realm=\"holdfast\""),
                "{head}"
            );
            assert!(
                !body.contains("not found") && !body.contains("/locks"),
                "{body}"
            );
        }
    }
    for path in ["/healthz", "/metrics"] {
        assert_eq!(http(admin, "GET", path, None).0, 200, "{path}");
        assert_eq!(http(admin, "HEAD", path, None).0, 200, "{path}");
    }
    let bearer = format!("Bearer {TOKEN}");
    for auth in [bearer.as_str(), BASIC] {
        for path in ["/", "/status.json", "/locks?table=lockd"] {
            let (status, _, body) = http(admin, "GET", path, Some(auth));
            assert_eq!(status, 200, "{path} with {auth}: {body}");
        }
        assert_eq!(http(admin, "GET", "/no/such/path", Some(auth)).0, 404);
        assert_eq!(http(admin, "DELETE", "/locks", Some(auth)).0, 405);
        // Past the token, a single node says it is no cluster.
        let (status, _, body) = http(
            admin,
            "POST",
            "/cluster/add?id=4&addr=127.0.0.1:1",
            Some(auth),
        );
        assert_eq!(status, 404, "{body}");
        assert!(body.contains("not a cluster"), "{body}");
    }

    // A SIGHUP replaces the token.
    secret(&dir, "admin.token", "next-token\n", 0o600);
    sighup(&d);
    eventually("the new admin token accepted", || {
        http(admin, "GET", "/status.json", Some("Bearer next-token")).0 == 200
    });
    assert_eq!(http(admin, "GET", "/status.json", Some(&bearer)).0, 401);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn without_a_token_membership_changes_from_loopback_reach_the_owner() {
    let d = Daemon::start(&[]);
    let admin = d.admin.expect("admin port");
    let (status, _, body) = http(admin, "POST", "/cluster/remove?id=4", None);
    assert_eq!(
        (status, body.trim()),
        (404, "not a cluster node (no --peers)")
    );
    assert_eq!(http(admin, "GET", "/status.json", None).0, 200);
}

fn tls_files(dir: &Path) -> (PathBuf, holdfast_testkit::pki::Issued) {
    let ca = holdfast_testkit::pki::Ca::new("holdfast test CA");
    let ca_path = ca.write(&dir.join("ca.pem"));
    let leaf = ca.issue(dir, "server", &["127.0.0.1", "localhost"]);
    (ca_path, leaf)
}

fn https(
    addr: std::net::SocketAddr,
    ca: &Path,
    method: &str,
    path: &str,
    auth: Option<&str>,
) -> (u16, String, String) {
    let config = holdfast::tls::client_config(Some(ca), None).expect("client config");
    let tcp = std::net::TcpStream::connect(addr).expect("connect admin");
    tcp.set_read_timeout(Some(DEADLINE)).unwrap();
    let name = holdfast::tls::server_name(&addr.ip().to_string()).unwrap();
    let mut s = holdfast::tls::connect_blocking(config, name, tcp).expect("TLS handshake");
    exchange(&mut s, &request(method, path, auth))
}

#[test]
fn the_admin_port_speaks_https_with_tls_cert_and_plain_with_notls() {
    let dir = temp_dir("auth-admin-tls");
    let (ca, leaf) = tls_files(&dir);
    let token = secret(&dir, "admin.token", &format!("{TOKEN}\n"), 0o600);
    let d = Daemon::start(&[
        "--tls-cert",
        path_str(&leaf.cert),
        "--tls-key",
        path_str(&leaf.key),
        "--tls-handshake-timeout",
        "500",
        "--admin-token-file",
        path_str(&token),
    ]);
    let admin = d.admin.expect("admin port");
    let (status, _, body) = https(admin, &ca, "GET", "/metrics", None);
    assert_eq!(status, 200);
    assert!(body.contains("holdfast_"), "{body}");
    assert_eq!(https(admin, &ca, "GET", "/status.json", None).0, 401);
    let bearer = format!("Bearer {TOKEN}");
    assert_eq!(
        https(admin, &ca, "GET", "/status.json", Some(&bearer)).0,
        200
    );
    // Plain HTTP on the TLS port: no HTTP answer, the connection is closed.
    let (status, text, _) = http(admin, "GET", "/metrics", None);
    assert_eq!(status, 0, "{text}");
    assert!(!text.contains("HTTP/"), "{text}");
    // A client that never finishes its handshake is closed after --tls-handshake-timeout.
    let mut idle = std::net::TcpStream::connect(admin).unwrap();
    idle.set_read_timeout(Some(DEADLINE)).unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 16];
    let n = std::io::Read::read(&mut idle, &mut buf).unwrap_or(0);
    assert_eq!(n, 0, "closed without an answer");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    // The port still serves.
    assert_eq!(https(admin, &ca, "GET", "/healthz", None).0, 200);
    drop(d);

    let d = Daemon::start(&[
        "--tls-cert",
        path_str(&leaf.cert),
        "--tls-key",
        path_str(&leaf.key),
        "--admin",
        "notls:127.0.0.1:0",
    ]);
    let admin = d.admin.expect("admin port");
    let (status, _, body) = http(admin, "GET", "/metrics", None);
    assert_eq!(status, 200);
    assert!(body.contains("holdfast_"), "{body}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// A membership change sent by a browser from another site's page (a plain form POST to a
/// loopback address needs no preflight, and a browser adds its Basic credentials by itself) is
/// refused: 403 whenever `Sec-Fetch-Site` names another site or `Origin` is not this port,
/// with or without a token; the command-line client and curl send neither header.
#[test]
fn a_membership_change_from_another_sites_page_is_refused() {
    let d = Daemon::start(&[]);
    let admin = d.admin.expect("admin port");
    let post = |extra: &str| {
        let mut s = std::net::TcpStream::connect(admin).expect("connect admin");
        s.set_read_timeout(Some(DEADLINE)).unwrap();
        let req = format!(
            "POST /cluster/remove?id=2 HTTP/1.1\r\nHost: {admin}\r\n{extra}Content-Length: 0\r\n\r\n"
        );
        exchange(&mut s, &req).0
    };
    assert_eq!(post("Sec-Fetch-Site: cross-site\r\n"), 403);
    assert_eq!(post("Sec-Fetch-Site: same-site\r\n"), 403);
    assert_eq!(post("Origin: http://evil.example\r\n"), 403);
    assert_eq!(post("Origin: null\r\n"), 403);
    // The same request from the port's own page, or from a client that is not a browser, goes
    // on to the membership logic (a single node has no cluster to change).
    for extra in [
        String::new(),
        "Sec-Fetch-Site: same-origin\r\n".to_string(),
        format!("Origin: http://{admin}\r\n"),
    ] {
        let status = post(&extra);
        assert_ne!(status, 403, "{extra:?}");
        assert!(status >= 400, "{extra:?}: {status}");
    }
}

/// A client that trickles its ClientHello a byte at a time (each byte well within any per-read
/// timeout) is closed at `--tls-handshake-timeout` all the same, never answered: a handshake's
/// deadline counts from the connection, not from its last byte.
#[test]
fn a_trickled_admin_handshake_ends_at_the_handshake_timeout() {
    use std::io::{Read, Write};
    let dir = temp_dir("auth-admin-trickle");
    let (ca, leaf) = tls_files(&dir);
    let d = Daemon::start(&[
        "--tls-cert",
        path_str(&leaf.cert),
        "--tls-key",
        path_str(&leaf.key),
        "--tls-handshake-timeout",
        "1000",
    ]);
    let admin = d.admin.expect("admin port");
    let config = holdfast::tls::client_config(Some(&ca), None).expect("client config");
    let name = holdfast::tls::server_name("127.0.0.1").unwrap();
    let mut client = holdfast::tls::rustls::ClientConnection::new(config, name).unwrap();
    let mut hello = Vec::new();
    client.write_tls(&mut hello).unwrap();
    assert!(hello.len() > 100, "a ClientHello of {} bytes", hello.len());
    let mut s = std::net::TcpStream::connect(admin).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let start = Instant::now();
    let mut sent = 0;
    let mut buf = [0u8; 4096];
    // One byte about every 40 ms: the whole hello would take several seconds.
    let closed_after = loop {
        assert!(
            start.elapsed() < DEADLINE,
            "still open after {:?}",
            start.elapsed()
        );
        if sent < hello.len() && s.write_all(&hello[sent..sent + 1]).is_err() {
            break start.elapsed();
        }
        sent += 1;
        match s.read(&mut buf) {
            Ok(0) => break start.elapsed(),
            Ok(n) => panic!("answered {n} bytes after {:?}", start.elapsed()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break start.elapsed(),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        sent < hello.len(),
        "the whole hello went out ({sent} bytes) before the close"
    );
    assert!(
        closed_after < Duration::from_millis(2500),
        "closed after {closed_after:?}, the handshake timeout is 1 s"
    );
    drop(d);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A network namespace joined to this one by a veth pair, made for one test and removed when
/// dropped: `host` is this side's address, `inner` the namespace's (a /30 of their own).
struct Netns {
    name: String,
    veth: String,
    host: std::net::Ipv4Addr,
}

impl Netns {
    /// `None` (after saying why) when this machine cannot make one: not root, or no `ip`.
    fn new() -> Option<Netns> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            println!("skipped: making a network namespace needs root");
            return None;
        }
        if Command::new("ip").arg("-V").output().is_err() {
            println!("skipped: no `ip` command (iproute2)");
            return None;
        }
        let pid = std::process::id();
        // A /30 of 10.201.0.0/16 from the PID, so that parallel runs do not collide.
        let block = (pid % 16_384) * 4;
        let n = Netns {
            name: format!("hfauth{pid}"),
            veth: format!("hfa{}h", pid % 100_000),
            host: std::net::Ipv4Addr::new(10, 201, (block >> 8) as u8, (block & 0xff) as u8 + 1),
        };
        let peer = format!("hfa{}n", pid % 100_000);
        let inner = n.inner();
        let steps: Vec<Vec<String>> = vec![
            vec!["netns".into(), "add".into(), n.name.clone()],
            vec![
                "link".into(),
                "add".into(),
                n.veth.clone(),
                "type".into(),
                "veth".into(),
                "peer".into(),
                "name".into(),
                peer.clone(),
            ],
            vec![
                "link".into(),
                "set".into(),
                peer.clone(),
                "netns".into(),
                n.name.clone(),
            ],
            vec![
                "addr".into(),
                "add".into(),
                format!("{}/30", n.host),
                "dev".into(),
                n.veth.clone(),
            ],
            vec!["link".into(), "set".into(), n.veth.clone(), "up".into()],
            n.exec_args(&["ip", "addr", "add", &format!("{inner}/30"), "dev", &peer]),
            n.exec_args(&["ip", "link", "set", &peer, "up"]),
            n.exec_args(&["ip", "link", "set", "lo", "up"]),
        ];
        for step in steps {
            let out = Command::new("ip").args(&step).output().expect("run ip");
            assert!(
                out.status.success(),
                "ip {step:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Some(n)
    }

    fn inner(&self) -> std::net::Ipv4Addr {
        let o = self.host.octets();
        std::net::Ipv4Addr::new(o[0], o[1], o[2], o[3] + 1)
    }

    fn exec_args(&self, cmd: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = vec!["netns".into(), "exec".into(), self.name.clone()];
        v.extend(cmd.iter().map(|s| s.to_string()));
        v
    }

    /// One HTTP request from inside the namespace (python3 there): the status, or 0.
    fn http(
        &self,
        addr: std::net::SocketAddr,
        method: &str,
        path: &str,
        auth: Option<&str>,
    ) -> u16 {
        let script = format!(
            "import socket\n\
             s = socket.create_connection(('{ip}', {port}), timeout=10)\n\
             s.sendall({req:?}.encode())\n\
             data = b''\n\
             while True:\n\
             \x20   b = s.recv(65536)\n\
             \x20   if not b: break\n\
             \x20   data += b\n\
             print(data.split(b' ')[1].decode() if data.startswith(b'HTTP/1.1 ') else 0)\n",
            ip = addr.ip(),
            port = addr.port(),
            req = request(method, path, auth),
        );
        let out = Command::new("ip")
            .args(self.exec_args(&["python3", "-c", &script]))
            .output()
            .expect("run python3 in the namespace");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(0)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting one end of the pair deletes the other.
        let _ = Command::new("ip")
            .args(["link", "del", &self.veth])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

#[test]
fn without_a_token_a_membership_change_from_another_host_is_forbidden() {
    let Some(ns) = Netns::new() else {
        return;
    };
    let listen = format!("{}:0", ns.host);
    let d = Daemon::start(&["--admin", &listen]);
    let admin = d.admin.expect("admin port");
    assert_eq!(
        ns.http(admin, "POST", "/cluster/add?id=4&addr=127.0.0.1:1", None),
        403
    );
    assert_eq!(ns.http(admin, "POST", "/cluster/remove?id=4", None), 403);
    // Reading is open to it, as before.
    assert_eq!(ns.http(admin, "GET", "/healthz", None), 200);
    assert_eq!(ns.http(admin, "GET", "/status.json", None), 200);
    drop(d);

    // With a token, the token decides wherever the client is.
    let dir = temp_dir("auth-netns");
    let token = secret(&dir, "admin.token", &format!("{TOKEN}\n"), 0o600);
    let d = Daemon::start(&["--admin", &listen, "--admin-token-file", path_str(&token)]);
    let admin = d.admin.expect("admin port");
    let change = "/cluster/add?id=4&addr=127.0.0.1:1";
    assert_eq!(ns.http(admin, "POST", change, None), 401);
    let bearer = format!("Bearer {TOKEN}");
    assert_eq!(
        ns.http(admin, "POST", change, Some(&bearer)),
        404,
        "past the token: no cluster"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// `holdfast cluster` with a token, over HTTPS

/// A port for a peer listener, drawn below the ephemeral range (a port bind(0) picked could be
/// taken by another test's daemon before the node binds it).
fn peer_port() -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let seed = (u64::from(std::process::id()) << 20 ^ DRAWS.fetch_add(1, Ordering::Relaxed))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for k in 0..10_000u64 {
        let x = (seed ^ k.wrapping_mul(0xBF58_476D_1CE4_E5B9)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let port = 32_000 - 1 - (x >> 40) as u16 % 10_000;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port")
}

fn cli(args: &[&str], env_token: Option<&str>) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_holdfast"));
    cmd.arg("cluster")
        .args(args)
        .env_remove("HOLDFAST_ADMIN_TOKEN");
    if let Some(t) = env_token {
        cmd.env("HOLDFAST_ADMIN_TOKEN", t);
    }
    cmd.stdin(Stdio::null())
        .output()
        .expect("run holdfast cluster")
}

fn voters(out: &std::process::Output) -> Vec<u64> {
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    v["voters"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x.as_u64()).collect())
        .unwrap_or_default()
}

#[test]
fn the_cluster_command_sends_the_token_over_https() {
    let dir = temp_dir("auth-cluster");
    let (ca, leaf) = tls_files(&dir);
    let token = secret(&dir, "admin.token", &format!("{TOKEN}\n"), 0o600);
    let (p1, p2) = (peer_port(), peer_port());
    let peers1 = format!("1=127.0.0.1:{p1}");
    let peers2 = format!("1=127.0.0.1:{p1},2=127.0.0.1:{p2}");
    let (d1, d2) = (dir.join("node1"), dir.join("node2"));
    std::fs::create_dir_all(&d1).unwrap();
    std::fs::create_dir_all(&d2).unwrap();
    let common = [
        "--tls-cert",
        path_str(&leaf.cert),
        "--tls-key",
        path_str(&leaf.key),
        "--admin-token-file",
        path_str(&token),
        "--election-timeout",
        "300",
    ];
    let node = |id: &str, peers: &str, data: &Path, join: bool| {
        let mut args = vec![
            "--node-id",
            id,
            "--peers",
            peers,
            "--data-dir",
            path_str(data),
        ];
        args.extend_from_slice(&common);
        if join {
            args.push("--join");
        }
        Daemon::start(&args)
    };
    let n1 = node("1", &peers1, &d1, false);
    let admin = n1.admin.expect("admin").to_string();
    let tls = ["--admin", &admin, "--tls", "--tls-ca", path_str(&ca)];
    let with_file = [&tls[..], &["--admin-token-file", path_str(&token)]].concat();

    eventually("node 1 leads its one-node cluster", || {
        let out = cli(&[&["status"], &with_file[..]].concat(), None);
        out.status.success()
            && serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .is_ok_and(|v| v["leader"] == 1)
    });
    let out = cli(&[&["status"], &tls[..]].concat(), Some(TOKEN));
    assert!(
        out.status.success(),
        "the token from HOLDFAST_ADMIN_TOKEN: {out:?}"
    );
    // Refusals: no token, a wrong one, no TLS, a CA that did not sign the certificate.
    let out = cli(&[&["status"], &tls[..]].concat(), None);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("401"),
        "{out:?}"
    );
    let out = cli(&[&["status"], &tls[..]].concat(), Some("wrong"));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("401"),
        "{out:?}"
    );
    let out = cli(&["status", "--admin", &admin], Some(TOKEN));
    assert!(
        !out.status.success(),
        "plain HTTP to the HTTPS port: {out:?}"
    );
    let other = holdfast_testkit::pki::Ca::new("another CA").write(&dir.join("other.pem"));
    let out = cli(
        &["status", "--admin", &admin, "--tls-ca", path_str(&other)],
        Some(TOKEN),
    );
    assert!(!out.status.success(), "an unknown CA: {out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("TLS"),
        "{out:?}"
    );
    let out = cli(&[&["remove", "2"], &tls[..]].concat(), None);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("401"),
        "{out:?}"
    );

    // A membership change through HTTPS with the token: node 2 joins, then leaves.
    let _n2 = node("2", &peers2, &d2, true);
    let member = format!("2=127.0.0.1:{p2}");
    let out = cli(&[&["add", &member], &with_file[..]].concat(), None);
    assert!(out.status.success(), "add: {out:?}");
    assert_eq!(voters(&out), [1, 2]);
    let out = cli(&[&["remove", "2"], &tls[..]].concat(), Some(TOKEN));
    assert!(out.status.success(), "remove: {out:?}");
    assert_eq!(voters(&out), [1]);
    std::fs::remove_dir_all(dir).unwrap();
}
