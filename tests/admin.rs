//! The admin HTTP port against the real daemon: every endpoint, the caps, hostile clients.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{Client, Daemon, DEADLINE};
use holdfast::proto::dlock::{self as dl, req_type, LockFields};
use serde_json::Value;

/// A raw HTTP exchange: send `request`, read to EOF. Status, head, body.
fn http_raw(addr: SocketAddr, request: &[u8]) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).expect("connect admin");
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    s.write_all(request).expect("send");
    read_response(&mut s)
}

fn read_response(s: &mut TcpStream) -> (u16, String, Vec<u8>) {
    let deadline = Instant::now() + DEADLINE;
    let mut all = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        assert!(Instant::now() < deadline, "response not finished in time");
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => all.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset && !all.is_empty() => break,
            Err(e) => panic!("read: {e} after {:?}", String::from_utf8_lossy(&all)),
        }
    }
    let split = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(&all)));
    let head = String::from_utf8_lossy(&all[..split]).into_owned();
    let body = all[split + 4..].to_vec();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    (status, head, body)
}

fn get(addr: SocketAddr, path: &str) -> (u16, String, Vec<u8>) {
    http_raw(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
    )
}

fn get_json(addr: SocketAddr, path: &str) -> Value {
    let (status, head, body) = get(addr, path);
    assert_eq!(status, 200, "{path}: {head}");
    assert!(head.contains("Content-Type: application/json"), "{head}");
    serde_json::from_slice(&body).expect("valid JSON")
}

/// Poll `path` until `done` holds, failing after DEADLINE (grants travel through the owner).
fn wait_json(addr: SocketAddr, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let v = get_json(addr, path);
        if done(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "{path} never satisfied: {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn lockd_frame(opcode: u8, name: &[u8]) -> Vec<u8> {
    let mut payload = name.to_vec();
    payload.push(0);
    let word = (1u32 << 28) | (u32::from(opcode) << 20) | payload.len() as u32;
    let mut out = word.to_be_bytes().to_vec();
    out.extend_from_slice(&payload);
    out
}

fn dlock_lock(id: u64, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let keys: &[&[u8]] = &[key];
    let fields = LockFields {
        keys,
        release_micro: Some(60_000_000),
        ..Default::default()
    };
    dl::encode_request(&mut out, Some(id), None, req_type::LOCK, Some(fields));
    out
}

fn admin(d: &Daemon) -> SocketAddr {
    d.admin.expect("admin listener")
}

fn local(c: &Client) -> String {
    c.stream.local_addr().unwrap().to_string()
}

#[test]
fn admin_port_prints_its_listening_line_and_off_disables_it() {
    let d = Daemon::start(&[]);
    assert!(d.admin.is_some());
    let off = Daemon::start(&["--admin", "off"]);
    assert!(off.admin.is_none());
    let mut c = off.memcache();
    c.expect(b"version\r\n", holdfast::server::VERSION_REPLY);
}

#[test]
fn healthz_is_ok_while_the_owner_turns() {
    let d = Daemon::start(&[]);
    let (status, head, body) = get(admin(&d), "/healthz");
    assert_eq!(status, 200, "{head}");
    assert_eq!(body, b"ok\n");
    let (status, _, body) = http_raw(admin(&d), b"HEAD /healthz HTTP/1.1\r\n\r\n");
    assert_eq!(status, 200);
    assert!(body.is_empty(), "HEAD has no body");
}

#[test]
fn metrics_show_every_table_open_connections_and_latency() {
    let d = Daemon::start(&[]);
    let mut mc = d.memcache();
    mc.expect(b"set m1 0 0 1\r\nv\r\nlock m1\r\n", b"STORED\r\nOK\r\n");
    let mut ld = d.lockd();
    ld.send(&lockd_frame(1, b"l1"));
    ld.take(4 + 3);
    let mut dc = d.dlock();
    dc.send(&dlock_lock(1, b"d1"));
    dc.fill(4);
    let mut ct = d.counter();
    let mut noop = Vec::new();
    holdfast::proto::counter::encode_request(&mut noop, holdfast::proto::counter::op::NOOP, 0, &[]);
    ct.send(&noop);
    ct.fill(holdfast::proto::counter::HEADER_LEN);
    let (status, head, body) = get(admin(&d), "/metrics");
    assert_eq!(status, 200);
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    let text = String::from_utf8(body).unwrap();
    // A strict parse: every family typed, counters in _total, gauges not, histograms whole.
    let samples = common::check_exposition(&text);
    for (name, want) in [
        ("holdfast_counter_objects", 0.0),
        ("holdfast_counter_acquired_total", 0.0),
        ("holdfast_counter_released_on_close_total", 0.0),
        ("holdfast_total_connections_total", 4.0),
    ] {
        assert_eq!(common::sample(&samples, name, ""), Some(want), "{name}");
    }
    assert!(
        !text.contains("holdfast_cluster_"),
        "a single node has no cluster metrics"
    );
    for want in [
        "holdfast_locks_held{table=\"memcache\"} 1\n",
        "holdfast_locks_held{table=\"lockd\"} 1\n",
        "holdfast_locks_held{table=\"dlock\"} 1\n",
        "holdfast_lock_grants_total{table=\"lockd\"} 1\n",
        "# TYPE holdfast_lock_grants_total counter\n",
        "# TYPE holdfast_curr_connections gauge\n",
        "holdfast_curr_connections 4\n",
        "holdfast_cmd_set_total 1\n",
        "# TYPE holdfast_lock_request_duration_seconds histogram\n",
        "holdfast_build_info{version=",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    for proto in ["memcache", "lockd", "dlock", "counter"] {
        let open = format!("holdfast_open_connections{{listener=\"{proto}\",");
        let line = text.lines().find(|l| l.starts_with(&open)).expect(&open);
        assert!(line.ends_with(" 1"), "{line}");
    }
    for proto in ["memcache", "lockd", "dlock"] {
        let open = format!("holdfast_open_connections{{listener=\"{proto}\",");
        let line = text.lines().find(|l| l.starts_with(&open)).expect(&open);
        assert!(line.ends_with(" 1"), "{line}");
        let count =
            format!("holdfast_lock_request_duration_seconds_count{{protocol=\"{proto}\"}} 1");
        assert!(text.contains(&count), "missing {count}");
        let inf = format!(
            "holdfast_lock_request_duration_seconds_bucket{{protocol=\"{proto}\",le=\"+Inf\"}} 1"
        );
        assert!(text.contains(&inf), "missing {inf}");
    }
}

#[test]
fn locks_lists_holders_with_addresses_and_waiters_in_order() {
    let d = Daemon::start(&[]);
    let a = admin(&d);
    let (mut h, mut w1, mut w2) = (d.lockd(), d.lockd(), d.lockd());
    h.send(&lockd_frame(1, b"job"));
    h.take(4 + 4);
    w1.send(&lockd_frame(1, b"job"));
    w1.take(4 + 4); // ACK: queued
    w2.send(&lockd_frame(1, b"job"));
    w2.take(4 + 4);
    let v = get_json(a, "/locks?table=lockd");
    assert_eq!(v["table"], "lockd");
    assert_eq!(v["matched"], 1);
    let lock = &v["locks"][0];
    assert_eq!(lock["name"], "job");
    assert_eq!(lock["holder"]["address"], local(&h));
    assert_eq!(lock["orphaned"], false);
    assert!(lock["held_for_ms"].as_u64().unwrap() < 60_000);
    assert_eq!(lock["waiters_total"], 2);
    assert_eq!(lock["waiters"][0]["address"], local(&w1));
    assert_eq!(lock["waiters"][1]["address"], local(&w2));
    assert!(lock["fence"].is_null() || lock["fence"].is_u64());
    // The holder leaves: the lock is an orphan (lockd) until its timeout.
    drop(h);
    wait_json(a, "/locks?table=lockd", |v| {
        v["locks"][0]["orphaned"] == true
    });

    let (mut dh, mut dw) = (d.dlock(), d.dlock());
    dh.send(&dlock_lock(1, b"res"));
    dh.fill(4);
    dw.send(&dlock_lock(2, b"res"));
    let v = wait_json(a, "/locks?table=dlock", |v| {
        v["locks"][0]["waiters_total"] == 1
    });
    let lock = &v["locks"][0];
    assert_eq!(lock["name"], "res");
    assert_eq!(lock["holder"]["address"], local(&dh));
    assert_eq!(lock["waiters"][0]["address"], local(&dw));
    let held_for = lock["held_for_ms"].as_u64().expect("dlock records when");
    assert!(held_for < 60_000, "{held_for}");
    let since = lock["held_since_unix_ms"].as_u64().unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(
        since <= now_ms && now_ms - since < 60_000,
        "{since} vs {now_ms}"
    );
    let lease = lock["expires_in_ms"].as_u64().expect("a lease deadline");
    // A 60 s lease plus the tick every lease gets so that none ends early.
    let most = 60_000 + holdfast::server::LEASE_CLOCK_SLACK_MS;
    assert!(lease > 50_000 && lease <= most, "{lease}");

    let mut mc = d.memcache();
    mc.expect(b"set mk 0 0 1\r\nv\r\nlock mk\r\n", b"STORED\r\nOK\r\n");
    let v = get_json(a, "/locks?table=memcache");
    assert_eq!(v["locks"][0]["name"], "mk");
    assert_eq!(v["locks"][0]["holder"]["address"], local(&mc));
    assert_eq!(v["locks"][0]["expires_in_ms"], Value::Null);
    assert!(
        v["locks"][0]["held_for_ms"].is_u64(),
        "memcache records when"
    );
}

#[test]
fn locks_filters_by_prefix_and_caps_the_listing_at_limit() {
    let d = Daemon::start(&[]);
    let a = admin(&d);
    let mut mc = d.memcache();
    for k in ["app/1", "app/2", "app/3", "other"] {
        let req = format!("set {k} 0 0 1\r\nv\r\nlock {k}\r\n");
        mc.expect(req.as_bytes(), b"STORED\r\nOK\r\n");
    }
    let v = get_json(a, "/locks?table=memcache&prefix=app%2F&limit=2");
    assert_eq!(v["matched"], 3);
    assert_eq!(v["truncated"], true);
    let names: Vec<&str> = v["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2);
    assert!(names.iter().all(|n| n.starts_with("app/")), "{names:?}");
    let v = get_json(a, "/locks?table=memcache&limit=99999999");
    assert_eq!(v["limit"], 10_000, "the limit is capped");
    assert_eq!(v["matched"], 4);
}

#[test]
fn status_page_and_its_json_are_served() {
    let d = Daemon::start(&[]);
    let (status, head, body) = get(admin(&d), "/");
    assert_eq!(status, 200);
    assert!(head.contains("text/html"), "{head}");
    let page = String::from_utf8(body).unwrap();
    assert!(page.contains("<script>") && page.contains("/status.json"));
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "no external assets"
    );
    let v = get_json(admin(&d), "/status.json");
    // memcache, lockd, dlock and counter (the admin port is not a lock listener).
    assert_eq!(v["listeners"].as_array().unwrap().len(), 4);
    assert!(v["stats"]["uptime"].is_string());
    for t in ["memcache", "lockd", "dlock", "counter"] {
        assert!(v["tables"][t]["locks"].is_array(), "{t}");
    }
}

#[test]
fn bad_requests_get_4xx_and_the_port_keeps_serving() {
    let d = Daemon::start(&[]);
    let a = admin(&d);
    let cases: &[(&[u8], u16)] = &[
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
        (b"DELETE /locks HTTP/1.1\r\n\r\n", 405),
        (b"GET /nope HTTP/1.1\r\n\r\n", 404),
        (b"GET /locks HTTP/1.1\r\n\r\n", 400),
        (b"GET /locks?table=redis HTTP/1.1\r\n\r\n", 400),
        (b"GET /locks?table=lockd&limit=zero HTTP/1.1\r\n\r\n", 400),
        (b"GET /locks?table=lockd&limit=0 HTTP/1.1\r\n\r\n", 400),
        (b"GET /locks?table=lockd&evil=1 HTTP/1.1\r\n\r\n", 400),
        (b"GET /locks?table=lockd&prefix=%zz HTTP/1.1\r\n\r\n", 400),
        (b"GET /locks?table=lockd&table=dlock HTTP/1.1\r\n\r\n", 400),
        (
            b"GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
            413,
        ),
        (
            b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            413,
        ),
        (b"\x00\x01\x02 garbage\r\n\r\n", 400),
        (b"GET /metrics HTTP/9.9\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nBad Header\r\n\r\n", 400),
    ];
    for (req, want) in cases {
        let (status, head, _) = http_raw(a, req);
        assert_eq!(status, *want, "{:?}: {head}", String::from_utf8_lossy(req));
    }
    // A head over the cap: 431, not a buffer that grows.
    let mut big = b"GET /metrics HTTP/1.1\r\nX-Big: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 20_000));
    big.extend_from_slice(b"\r\n\r\n");
    assert_eq!(http_raw(a, &big).0, 431);
    // More header fields than the parser holds.
    let mut many = b"GET /metrics HTTP/1.1\r\n".to_vec();
    for i in 0..100 {
        many.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    assert_eq!(http_raw(a, &many).0, 431);
    assert_eq!(get(a, "/healthz").0, 200);
}

#[test]
fn a_slowloris_client_is_closed_after_the_request_deadline_without_blocking_others() {
    let d = Daemon::start(&[]);
    let a = admin(&d);
    let mut slow = TcpStream::connect(a).unwrap();
    slow.write_all(b"GET /metrics HTTP/1.1\r\nX-Drip: ")
        .unwrap();
    let start = Instant::now();
    // Others are served meanwhile.
    assert_eq!(get(a, "/healthz").0, 200);
    slow.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut drip = Instant::now();
    let mut buf = [0u8; 1024];
    let mut got = Vec::new();
    slow.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    loop {
        assert!(start.elapsed() < DEADLINE, "slow client never closed");
        if drip.elapsed() > Duration::from_millis(400) {
            // Still dripping bytes: activity must not extend the deadline.
            let _ = slow.write_all(b"a");
            drip = Instant::now();
        }
        match slow.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let took = start.elapsed();
    assert!(took >= Duration::from_secs(4), "closed too early: {took:?}");
    assert!(
        String::from_utf8_lossy(&got).starts_with("HTTP/1.1 408"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
}

#[test]
fn connections_over_the_cap_get_503_and_the_port_recovers() {
    let d = Daemon::start(&[]);
    let a = admin(&d);
    // Idle connections (no request yet) hold their slots until the request deadline.
    let idle: Vec<TcpStream> = (0..holdfast::admin::MAX_ADMIN_CONNS)
        .map(|_| TcpStream::connect(a).unwrap())
        .collect();
    // Give the admin thread time to accept them all (it accepts in order).
    let deadline = Instant::now() + DEADLINE;
    let mut refused = false;
    while Instant::now() < deadline {
        let (status, _, body) = get(a, "/healthz");
        if status == 503 {
            assert_eq!(body, b"too many admin connections\n");
            refused = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(refused, "a connection over the cap was served");
    // The lock path is not affected meanwhile.
    let mut mc = d.memcache();
    mc.expect(b"set k 0 0 1\r\nv\r\nlock k\r\n", b"STORED\r\nOK\r\n");
    drop(idle);
    wait_until(|| get(a, "/healthz").0 == 200);
}

fn wait_until(f: impl Fn() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !f() {
        assert!(Instant::now() < deadline, "condition never held");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_explicit_admin_address_that_is_taken_is_an_error() {
    let d = Daemon::start(&[]);
    let taken = admin(&d).to_string();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args([
            "--memcache",
            "127.0.0.1:0",
            "--lockd",
            "off",
            "--dlock",
            "off",
            "--counter",
            "off",
        ])
        .args(["--admin", &taken])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot listen for admin"), "{err}");
}

/// Run the daemon with stderr captured, do `work` against its lockd address, stop it with
/// SIGTERM, return its log (stderr).
fn log_of(extra: &[&str], work: impl FnOnce(SocketAddr)) -> String {
    use std::process::{Command, Stdio};
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_holdfast"));
    cmd.args([
        "--memcache",
        "off",
        "--lockd",
        "127.0.0.1:0",
        "--dlock",
        "off",
        "--counter",
        "off",
    ])
    .args(["--admin", "127.0.0.1:0", "--threads", "1"])
    .args(extra)
    .stderr(Stdio::piped());
    let mut d = holdfast_testkit::Daemon::spawn(&mut cmd, &["lockd", "admin"], DEADLINE)
        .unwrap_or_else(|e| panic!("start holdfast: {e}"));
    let printed: Vec<&str> = d.listeners().iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(printed, ["lockd", "admin"], "listening lines in this order");
    // Read the log while the daemon runs, so that it never blocks on a full pipe.
    let mut stderr = d.take_stderr().expect("stderr piped");
    let log = std::thread::spawn(move || {
        let mut log = String::new();
        stderr.read_to_string(&mut log).map(|_| log)
    });
    work(d.addr("lockd").expect("lockd listener"));
    let status = d.terminate(DEADLINE).unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success());
    log.join().expect("log reader").expect("log is UTF-8")
}

#[test]
fn log_lines_have_a_timestamp_and_level_and_nothing_per_request_at_info() {
    let log = log_of(&[], |addr| {
        let mut c = Client::connect(addr);
        for _ in 0..100 {
            c.send(&lockd_frame(1, b"x"));
            c.take(4 + 2);
            c.send(&lockd_frame(2, b"x"));
            c.take(4 + 2);
        }
        // A frame of protocol version 2: an error, then the connection closes.
        let mut bad = Client::connect(addr);
        bad.send(&[0x20, 0, 0, 0]);
        bad.expect_closed();
    });
    let lines: Vec<&str> = log.lines().collect();
    for l in &lines {
        // 2026-11-23T07:05:35.123Z info holdfast: ...
        let mut w = l.split(' ');
        let ts = w.next().unwrap();
        assert_eq!(ts.len(), 24, "{l}");
        assert!(ts.ends_with('Z') && ts.as_bytes()[10] == b'T', "{l}");
        assert!(matches!(w.next(), Some("info" | "warn" | "error")), "{l}");
        assert_eq!(w.next(), Some("holdfast:"), "{l}");
    }
    assert!(lines[0].contains("starting holdfast") && lines[0].contains("orphan-timeout=5000ms"));
    assert!(
        log.contains("closing a lockd client for bad input"),
        "{log}"
    );
    assert!(
        log.contains("shutting down") && log.contains("stopped"),
        "{log}"
    );
    assert!(lines.len() <= 6, "200 requests logged nothing each:\n{log}");
}

#[test]
fn log_level_warn_keeps_info_lines_out() {
    let log = log_of(&["--log-level", "warn"], |addr| {
        let mut bad = Client::connect(addr);
        bad.send(&[0x20, 0, 0, 0]);
        bad.expect_closed();
    });
    assert_eq!(log, "", "nothing at warn in a quiet run");
}

#[test]
fn reaching_the_connection_limit_is_logged_once_per_episode() {
    let log = log_of(&["--max-connections", "1"], |addr| {
        let mut first = Client::connect(addr);
        first.send(&lockd_frame(1, b"x"));
        first.take(4 + 2);
        for _ in 0..5 {
            let mut refused = Client::connect(addr);
            refused.expect_closed();
        }
    });
    assert_eq!(
        log.matches("connection limit (1) reached").count(),
        1,
        "{log}"
    );
    assert!(log.contains(" warn holdfast: connection limit"), "{log}");
}

#[test]
fn a_listing_over_the_cap_is_cut_at_ten_thousand_and_grants_go_on() {
    const LOCKS: usize = 12_000;
    let d = Daemon::start(&[]);
    let mut c = d.lockd();
    let mut batch = Vec::new();
    for i in 0..LOCKS {
        batch.extend_from_slice(&lockd_frame(1, format!("n{i:05}").as_bytes()));
    }
    c.send(&batch);
    // ACQUIRED, echoing "nXXXXX\0": 4 + 7 bytes each.
    c.take(LOCKS * 11);
    let v = get_json(admin(&d), "/locks?table=lockd&limit=50000");
    assert_eq!(v["matched"], LOCKS);
    assert_eq!(v["limit"], 10_000);
    assert_eq!(v["truncated"], true);
    let locks = v["locks"].as_array().unwrap();
    assert_eq!(locks.len(), 10_000);
    assert!(locks
        .windows(2)
        .all(|w| w[0]["name"].as_str() < w[1]["name"].as_str()));
    // The lock path answers while a big listing is being served.
    let a = admin(&d);
    let lister = std::thread::spawn(move || {
        for _ in 0..5 {
            assert_eq!(get(a, "/locks?table=lockd&limit=10000").0, 200);
        }
    });
    let mut other = d.lockd();
    for i in 0..50 {
        let name = format!("free{i}");
        other.send(&lockd_frame(1, name.as_bytes()));
        other.take(4 + name.len() + 1);
    }
    lister.join().unwrap();
}

#[test]
fn locks_lists_counter_holders_with_the_resources_each_holds_and_their_tokens() {
    use holdfast::proto::counter;
    let d = Daemon::start(&[]);
    let addr = admin(&d);
    let mut c = d.counter();
    for (resources, name) in [(3u32, &b"jobs"[..]), (1, b"other")] {
        let mut body = Vec::new();
        counter::acquire_body(&mut body, resources, 10, name);
        let mut req = Vec::new();
        counter::encode_request(&mut req, 0x02, 7, &body);
        c.send(&req);
        let h = c.take(12);
        assert_eq!(h[2], 0, "acquire succeeded");
        let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
        c.take(len);
    }
    let v = get_json(addr, "/locks?table=counter&prefix=jo");
    assert_eq!(v["table"], "counter");
    let locks = v["locks"].as_array().expect("locks");
    assert_eq!(locks.len(), 1, "{v}");
    assert_eq!(locks[0]["name"], "jobs");
    assert_eq!(locks[0]["resources"], 3);
    assert_eq!(locks[0]["holder"]["address"], local(&c));
    // Each acquire is a grant with a fencing token; the listing shows the holder's latest (the
    // counter protocol has no field to carry it).
    let jobs = locks[0]["fence"]
        .as_u64()
        .expect("a counter holding has a fencing token");
    let v = get_json(addr, "/locks?table=counter&prefix=ot");
    let other = v["locks"][0]["fence"].as_u64().expect("fence");
    assert!(
        other > jobs,
        "the later acquire has the larger token: {jobs} {other}"
    );
    drop(c);
    let v = wait_json(addr, "/locks?table=counter", |v| {
        v["locks"].as_array().is_some_and(|l| l.is_empty())
    });
    assert_eq!(v["matched"], 0, "released when the connection closed");
}

/// A version-3 (native protocol) request frame.
fn native_frame(id: u64, t: u64, keys: &[&[u8]], f: impl FnOnce(&mut LockFields<'_>)) -> Vec<u8> {
    let mut lock = LockFields {
        keys,
        ..Default::default()
    };
    f(&mut lock);
    let mut out = Vec::new();
    dl::encode_request_version(&mut out, dl::NATIVE_VERSION, Some(id), None, t, Some(lock));
    out
}

/// Sends a version-3 request and reads its answer, which must be Ok (no event comes first on
/// these connections).
fn native_ok(c: &mut Client, frame: &[u8]) -> dl::Response {
    c.send(frame);
    c.fill(4);
    let len = u32::from_be_bytes([c.pending[0], c.pending[1], c.pending[2], c.pending[3]]);
    let bytes = c.take(4 + len as usize);
    let r = dl::decode_response(&bytes[4..]).expect("a valid Response");
    assert_eq!(
        (r.status, r.event.is_none()),
        (Some(dl::status::OK), true),
        "{r:?}"
    );
    r
}

#[test]
fn locks_and_metrics_show_shared_holders_semaphore_slots_values_lock_delay_and_watchers() {
    let d = Daemon::start(&[]);
    let a = admin(&d);
    // A version-2 hold, then watchers: `w` of three keys, `w2` of one.
    let mut legacy = d.dlock();
    legacy.send(&dlock_lock(1, b"legacy"));
    let v2 = dl::decode_response(
        &{
            legacy.fill(4);
            let len = u32::from_be_bytes(legacy.pending[..4].try_into().unwrap()) as usize;
            legacy.take(4 + len)
        }[4..],
    )
    .unwrap();
    let legacy_fence = v2.fence.expect("a fence");
    let (mut w, mut w2) = (d.dlock(), d.dlock());
    native_ok(
        &mut w,
        &native_frame(1, req_type::WATCH, &[b"cache", b"pool", b"legacy"], |_| {}),
    );
    native_ok(
        &mut w2,
        &native_frame(1, req_type::WATCH, &[b"cache"], |_| {}),
    );

    // Three shared holders of "cache": a text value, a binary one, and one with a lock-delay
    // whose connection closes (lost: the key is delayed while the others hold on).
    let shared = |value: Option<&'static [u8]>, delay: Option<u64>| {
        move |l: &mut LockFields<'_>| {
            l.native.shared = true;
            l.native.value = value;
            l.native.lock_delay_micro = delay;
        }
    };
    let (mut r1, mut r2, mut r3) = (d.dlock(), d.dlock(), d.dlock());
    let f1 = native_ok(
        &mut r1,
        &native_frame(
            1,
            req_type::LOCK,
            &[b"cache"],
            shared(Some(b"reader-1"), None),
        ),
    )
    .fence
    .unwrap();
    let f2 = native_ok(
        &mut r2,
        &native_frame(
            1,
            req_type::LOCK,
            &[b"cache"],
            shared(Some(&[0, 1, 0xff]), None),
        ),
    )
    .fence
    .unwrap();
    native_ok(
        &mut r3,
        &native_frame(
            1,
            req_type::LOCK,
            &[b"cache"],
            shared(None, Some(30_000_000)),
        ),
    );
    // An exclusive request waits behind them.
    let mut x = d.dlock();
    x.send(&native_frame(1, req_type::LOCK, &[b"cache"], |_| {}));

    // A semaphore of 3 slots: a value, a lease with a long value, and a third slot unlocked by
    // fence from another connection (its holder is told it lost it).
    let slot = |value: &'static [u8], lease: Option<u64>| {
        move |l: &mut LockFields<'_>| {
            l.native.limit = Some(3);
            l.native.value = Some(value);
            l.release_micro = lease;
        }
    };
    let long: &'static [u8] = Box::leak(vec![b'x'; 300].into_boxed_slice());
    let (mut p1, mut p2, mut p3) = (d.dlock(), d.dlock(), d.dlock());
    native_ok(
        &mut p1,
        &native_frame(1, req_type::LOCK, &[b"pool"], slot(b"worker-1", None)),
    );
    native_ok(
        &mut p2,
        &native_frame(1, req_type::LOCK, &[b"pool"], slot(long, Some(60_000_000))),
    );
    let f3 = native_ok(
        &mut p3,
        &native_frame(1, req_type::LOCK, &[b"pool"], slot(b"w3", None)),
    )
    .fence
    .unwrap();
    native_ok(
        &mut p1,
        &native_frame(2, req_type::UNLOCK, &[b"pool"], |l| {
            l.native.fence = Some(f3)
        }),
    );
    drop(r3);

    let v = wait_json(a, "/locks?table=dlock", |v| {
        v["locks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k["name"] == "cache" && k["holders_total"] == 2)
    });
    assert_eq!(v["matched"], 3, "{v:#}");
    let locks = v["locks"].as_array().unwrap();
    let key = |name: &str| locks.iter().find(|k| k["name"] == name).unwrap();

    let cache = key("cache");
    assert_eq!(
        (
            &cache["mode"],
            &cache["limit"],
            &cache["watchers"],
            &cache["waiters_total"]
        ),
        (&"shared".into(), &1.into(), &2.into(), &1.into()),
        "{cache:#}"
    );
    let delay = cache["lock_delay_ms"].as_u64().unwrap();
    assert!((20_000..=30_000).contains(&delay), "{cache:#}");
    let holders = cache["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 2, "{cache:#}");
    assert_eq!(
        (&holders[0]["fence"], &holders[1]["fence"]),
        (&f1.into(), &f2.into())
    );
    assert_eq!(holders[0]["value"], "reader-1");
    assert_eq!(holders[0]["address"], local(&r1));
    assert_eq!(
        (
            &holders[1]["value"],
            &holders[1]["value_hex"],
            &holders[1]["value_bytes"]
        ),
        (&Value::Null, &"0001ff".into(), &3.into())
    );
    assert_eq!(holders[0]["expires_in_ms"], Value::Null, "connection-bound");
    // The fields every table has describe the first holder.
    assert_eq!(cache["fence"], f1);
    assert_eq!(cache["holder"]["session"], holders[0]["session"]);
    assert_eq!(cache["orphaned"], false);

    let pool = key("pool");
    assert_eq!(
        (
            &pool["mode"],
            &pool["limit"],
            &pool["holders_total"],
            &pool["watchers"]
        ),
        (&"semaphore".into(), &3.into(), &2.into(), &1.into()),
        "{pool:#}"
    );
    let slots = pool["holders"].as_array().unwrap();
    assert_eq!(slots[0]["value"], "worker-1");
    assert_eq!(slots[1]["value"].as_str().unwrap(), "x".repeat(256));
    assert_eq!(
        (&slots[1]["value_bytes"], &slots[1]["value_truncated"]),
        (&300.into(), &true.into())
    );
    let lease = slots[1]["expires_in_ms"].as_u64().unwrap();
    // 60 s and the lease clock's slack (a lease never ends early).
    assert!((50_000..=61_000).contains(&lease), "{pool:#}");
    assert_eq!(pool["lock_delay_ms"], 0);

    let legacy_key = key("legacy");
    assert_eq!(
        (
            &legacy_key["mode"],
            &legacy_key["limit"],
            &legacy_key["holders_total"],
            &legacy_key["watchers"]
        ),
        (&"exclusive".into(), &1.into(), &1.into(), &1.into()),
        "{legacy_key:#}"
    );
    assert_eq!(legacy_key["holders"][0]["fence"], legacy_fence);
    assert_eq!(legacy_key["holders"][0]["address"], local(&legacy));

    // The status page's JSON has the same fields.
    let status = get_json(a, "/status.json");
    let listed = status["tables"]["dlock"]["locks"].as_array().unwrap();
    assert!(listed
        .iter()
        .any(|k| k["name"] == "pool" && k["holders_total"] == 2));

    let (_, _, body) = get(a, "/metrics");
    let text = String::from_utf8(body).unwrap();
    let samples = common::check_exposition(&text);
    for (name, labels, want) in [
        ("holdfast_dlock_native_holds", "", 4.0),
        ("holdfast_dlock_native_leases", "", 1.0),
        ("holdfast_dlock_delayed_keys", "", 1.0),
        ("holdfast_dlock_watches", "", 4.0),
        ("holdfast_dlock_watched_keys", "", 3.0),
        (
            "holdfast_dlock_watch_events_total",
            "kind=\"acquired\"",
            9.0,
        ),
        (
            "holdfast_dlock_watch_events_total",
            "kind=\"released\"",
            1.0,
        ),
        ("holdfast_dlock_watch_events_total", "kind=\"lost\"", 2.0),
        ("holdfast_dlock_watch_events_total", "kind=\"expired\"", 0.0),
        ("holdfast_dlock_loss_notices_total", "", 1.0),
    ] {
        assert_eq!(
            common::sample(&samples, name, labels),
            Some(want),
            "{name}{{{labels}}} in\n{text}"
        );
    }
    drop((w, w2, x, p2));
}
