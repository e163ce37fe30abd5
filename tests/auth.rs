//! Authentication against the real daemon (contract: "Security: TLS and authentication"):
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
