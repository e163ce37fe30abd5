//! `holdfast-lock` against the real daemon: mutual exclusion of whole commands, exit codes, the
//! wait timeout, losing the connection, signals.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Daemon;

fn lock_cmd(d: &Daemon) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_holdfast-lock"));
    c.arg("--server")
        .arg(d.dlock.expect("dlock listener").to_string());
    c
}

fn wait_with_deadline(
    child: &mut std::process::Child,
    limit: Duration,
) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            return st;
        }
        assert!(
            Instant::now() < deadline,
            "holdfast-lock did not finish in {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn two_invocations_on_one_key_run_their_commands_one_after_the_other() {
    let d = Daemon::start(&[]);
    let dir = std::env::temp_dir().join(format!("holdfast-lock-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("log");
    let _ = std::fs::remove_file(&log);
    // Each command writes "start <ns>" and, 300 ms later, "end <ns>".
    let script = format!(
        "echo start $(date +%s%N) >> {0}; sleep 0.3; echo end $(date +%s%N) >> {0}",
        log.display()
    );
    let mut children: Vec<_> = (0..2)
        .map(|_| {
            lock_cmd(&d)
                .args(["job", "--", "sh", "-c", &script])
                .spawn()
                .expect("spawn")
        })
        .collect();
    for c in &mut children {
        assert!(wait_with_deadline(c, Duration::from_secs(10)).success());
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let events: Vec<(&str, u128)> = text
        .lines()
        .map(|l| {
            let mut w = l.split_whitespace();
            (w.next().unwrap(), w.next().unwrap().parse().unwrap())
        })
        .collect();
    assert_eq!(events.len(), 4, "{text}");
    // Never two starts in a row: the second command starts after the first ended.
    let kinds: Vec<&str> = events.iter().map(|e| e.0).collect();
    assert_eq!(kinds, ["start", "end", "start", "end"], "{text}");
    assert!(
        events[2].1 >= events[1].1,
        "second start before first end: {text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_commands_exit_status_is_passed_through() {
    let d = Daemon::start(&[]);
    let st = lock_cmd(&d)
        .args(["k", "--", "sh", "-c", "exit 7"])
        .status()
        .expect("run");
    assert_eq!(st.code(), Some(7));
    let st = lock_cmd(&d)
        .args(["k", "--", "true"])
        .status()
        .expect("run");
    assert_eq!(st.code(), Some(0));
}

#[test]
fn a_wait_timeout_exits_75_while_another_holds_the_key() {
    let d = Daemon::start(&[]);
    let mut holder = lock_cmd(&d)
        .args(["busy", "--", "sleep", "5"])
        .spawn()
        .expect("spawn");
    // Wait until the holder has the lock: a zero-wait attempt fails with 75 from then on.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let st = lock_cmd(&d)
            .args(["--wait", "0", "busy", "--", "true"])
            .stderr(Stdio::null())
            .status()
            .unwrap();
        if st.code() == Some(75) {
            break;
        }
        assert!(Instant::now() < deadline, "holder never got the lock");
        std::thread::sleep(Duration::from_millis(20));
    }
    let start = Instant::now();
    let out = lock_cmd(&d)
        .args(["--wait", "200ms", "busy", "--", "true"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(75));
    assert!(start.elapsed() >= Duration::from_millis(200));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("timed out"),
        "one clear line on stderr"
    );
    let _ = holder.kill();
    let _ = holder.wait();
}

#[test]
fn an_unreachable_server_exits_69() {
    // A port nobody listens on: bind one, note it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = Command::new(env!("CARGO_BIN_EXE_holdfast-lock"))
        .args(["--server", &format!("127.0.0.1:{port}"), "k", "--", "true"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(69));
    assert!(!out.stderr.is_empty());
}

#[test]
fn losing_the_server_with_kill_on_loss_terminates_the_command() {
    let d = Daemon::start(&[]);
    let mut child = lock_cmd(&d)
        .args([
            "--heartbeat",
            "100ms",
            "--kill-on-loss",
            "k",
            "--",
            "sleep",
            "30",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    std::thread::sleep(Duration::from_millis(300));
    let status = d.terminate();
    assert!(status.success(), "daemon exits 0 on SIGTERM");
    let st = wait_with_deadline(&mut child, Duration::from_secs(5));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        st.code(),
        Some(128 + libc::SIGTERM),
        "sleep was terminated: {st:?} {:?}",
        st.signal()
    );
    let mut err = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(err.contains("lost"), "says so on stderr: {err}");
}

#[test]
fn sigterm_is_passed_to_the_command_and_the_lock_is_released() {
    let d = Daemon::start(&[]);
    let mut child = lock_cmd(&d)
        .args(["sig", "--", "sleep", "30"])
        .spawn()
        .expect("spawn");
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill(2) on the PID of the child we spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = wait_with_deadline(&mut child, Duration::from_secs(5));
    assert_eq!(st.code(), Some(128 + libc::SIGTERM));
    let st = lock_cmd(&d)
        .args(["--wait", "2s", "sig", "--", "true"])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(0), "the key is free again");
}

#[test]
fn the_command_gets_the_fencing_token_and_print_fence_prints_it_first() {
    let d = Daemon::start(&[]);
    let run = || {
        let out = lock_cmd(&d)
            .args([
                "--print-fence",
                "k",
                "--",
                "sh",
                "-c",
                "echo env=$HOLDFAST_FENCE",
            ])
            .stdin(Stdio::null())
            .output()
            .expect("run");
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8(out.stdout).expect("utf-8");
        let mut lines = text.lines();
        let printed: u64 = lines.next().expect("token line").parse().expect("a number");
        assert_eq!(lines.next(), Some(format!("env={printed}").as_str()));
        assert_eq!(lines.next(), None);
        printed
    };
    let (first, second) = (run(), run());
    assert!(first > 0 && second > first, "{first} then {second}");
    // Without --print-fence, only the command's environment has it.
    let out = lock_cmd(&d)
        .args(["k", "--", "sh", "-c", "echo $HOLDFAST_FENCE"])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    let only: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("one number");
    assert!(only > second);
}

#[test]
fn slots_let_at_most_n_commands_run_at_once() {
    let d = Daemon::start(&[]);
    let dir = std::env::temp_dir().join(format!("holdfast-slots-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("log");
    let _ = std::fs::remove_file(&log);
    let script = format!(
        "echo start $(date +%s%N) >> {0}; sleep 0.4; echo end $(date +%s%N) >> {0}",
        log.display()
    );
    let counter = d.counter.expect("counter listener").to_string();
    let mut children: Vec<_> = (0..3)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_holdfast-lock"))
                .args(["--slots", "2", "--counter", &counter, "jobs", "--"])
                .args(["sh", "-c", &script])
                .spawn()
                .expect("spawn")
        })
        .collect();
    for c in &mut children {
        assert!(wait_with_deadline(c, Duration::from_secs(15)).success());
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let mut events: Vec<(u128, i32)> = text
        .lines()
        .map(|l| {
            let mut w = l.split_whitespace();
            let delta = if w.next() == Some("start") { 1 } else { -1 };
            (w.next().unwrap().parse().unwrap(), delta)
        })
        .collect();
    assert_eq!(events.len(), 6, "{text}");
    // Ends sort before starts at the same instant (a slot freed, then taken).
    events.sort();
    let (mut running, mut most) = (0, 0);
    for (_, delta) in &events {
        running += delta;
        most = most.max(running);
    }
    assert!(most <= 2, "more than two ran at once: {text}");
    assert_eq!(most, 2, "two slots were never used together: {text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn slots_time_out_when_all_are_taken() {
    let d = Daemon::start(&[]);
    let counter = d.counter.expect("counter listener").to_string();
    let mut holder = Command::new(env!("CARGO_BIN_EXE_holdfast-lock"))
        .args([
            "--slots",
            "1",
            "--counter",
            &counter,
            "one",
            "--",
            "sleep",
            "2",
        ])
        .spawn()
        .expect("spawn");
    // Wait until the holder has its slot (Get shows 1).
    let mut c = d.counter();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut req = Vec::new();
        let mut body = Vec::new();
        holdfast::proto::counter::get_body(&mut body, b"one");
        holdfast::proto::counter::encode_request(&mut req, 1, 0, &body);
        c.send(&req);
        let h = c.take(12);
        let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
        let b = c.take(len);
        if h[2] == 0 && b == 1u32.to_be_bytes() {
            break;
        }
        assert!(Instant::now() < deadline, "holder never got its slot");
        std::thread::sleep(Duration::from_millis(10));
    }
    let st = Command::new(env!("CARGO_BIN_EXE_holdfast-lock"))
        .args(["--slots", "1", "--counter", &counter, "--wait", "200ms"])
        .args(["one", "--", "true"])
        .status()
        .expect("run");
    assert_eq!(st.code(), Some(75));
    assert!(wait_with_deadline(&mut holder, Duration::from_secs(10)).success());
}

/// `--tls`: the lock is taken over TLS (the dlock listener and the counter listener), the server's
/// certificate checked against `--tls-ca`; a certificate from another CA, or plain TCP to the
/// TLS listener, gets nothing run.
#[test]
fn tls_takes_the_lock_and_a_wrong_ca_or_plain_tcp_runs_nothing() {
    use holdfast_testkit::pki;
    let dir = pki::temp_dir("lock-tls");
    let ca = pki::Ca::new("lock CA");
    let ca_file = ca.write(&dir.join("ca.pem"));
    let other = pki::Ca::new("other CA").write(&dir.join("other.pem"));
    let server = ca.issue(&dir, "server", &["127.0.0.1"]);
    let d = Daemon::start(&[
        "--tls-cert",
        server.cert.to_str().unwrap(),
        "--tls-key",
        server.key.to_str().unwrap(),
    ]);
    let ca_s = ca_file.to_str().unwrap();
    let out = lock_cmd(&d)
        .args([
            "--tls",
            "--tls-ca",
            ca_s,
            "--print-fence",
            "k",
            "--",
            "true",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert!(out.status.success(), "{out:?}");
    let fence: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a fence");
    assert!(fence > 0);
    let counter = d.counter.unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_holdfast-lock"))
        .args([
            "--tls",
            "--tls-ca",
            ca_s,
            "--counter",
            &counter,
            "--slots",
            "2",
            "c",
            "--",
            "true",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert!(out.status.success(), "slots over TLS: {out:?}");
    for args in [vec!["--tls", "--tls-ca", other.to_str().unwrap()], vec![]] {
        let mut c = lock_cmd(&d);
        c.args(&args)
            .args(["--wait", "2s", "k", "--", "sh", "-c", "echo ran"]);
        let out = c.stdin(Stdio::null()).output().expect("run");
        assert!(!out.status.success(), "{args:?}: {out:?}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("ran"),
            "{args:?} ran the command: {out:?}"
        );
    }
    drop(d);
    let _ = std::fs::remove_dir_all(dir);
}

/// `--elect`: the first candidate runs its command; a second waits; when leadership is taken
/// away (an Unlock by fence from another client) the leader's command, which ignores SIGTERM,
/// is killed after the grace, and the second candidate leads with a greater fence.
#[test]
fn elect_runs_the_command_only_while_leading_and_stops_it_when_leadership_is_lost() {
    let d = Daemon::start(&[]);
    let dir = std::env::temp_dir().join(format!("holdfast-elect-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("log");
    let _ = std::fs::remove_file(&log);
    let starts = || -> Vec<u64> {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.strip_prefix("start ")?.parse().ok())
            .collect()
    };
    let wait_starts = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while starts().len() < n {
            assert!(Instant::now() < deadline, "{n} leaders never started");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let candidate = |script: &str| {
        lock_cmd(&d)
            .args(["--elect", "svc", "--lease", "1s", "--grace", "300ms", "--"])
            .args([
                "sh",
                "-c",
                &format!(
                    "{script}; echo start $HOLDFAST_FENCE >> {0}; exec sleep 30",
                    log.display()
                ),
            ])
            .spawn()
            .expect("spawn")
    };
    let mut first = candidate("trap '' TERM");
    wait_starts(1);
    let mut second = candidate("true");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(starts().len(), 1, "two leaders at once");
    let c = holdfast_client::Client::connect([d.dlock.unwrap().to_string()]).unwrap();
    let leader = c.leader("svc").unwrap().expect("a leader");
    assert_eq!(leader.fence, starts()[0]);
    let value = String::from_utf8(leader.value.unwrap()).unwrap();
    assert!(value.ends_with(&format!(":{}", first.id())), "{value}");
    let taken = Instant::now();
    c.unlock_fence("svc", leader.fence).unwrap();
    let st = wait_with_deadline(&mut first, Duration::from_secs(5));
    assert_eq!(
        st.code(),
        Some(128 + libc::SIGKILL),
        "killed after the grace"
    );
    assert!(taken.elapsed() >= Duration::from_millis(300));
    wait_starts(2);
    assert!(starts()[1] > starts()[0]);
    // SAFETY: kill(2) on the PID of the child we spawned.
    unsafe { libc::kill(second.id() as i32, libc::SIGTERM) };
    let st = wait_with_deadline(&mut second, Duration::from_secs(5));
    assert_eq!(st.code(), Some(128 + libc::SIGTERM));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn elect_takes_no_key_and_not_slots() {
    for args in [
        vec!["--elect", "e", "key", "--", "true"],
        vec!["--elect", "e", "--slots", "2", "--", "true"],
    ] {
        let st = Command::new(env!("CARGO_BIN_EXE_holdfast-lock"))
            .args(&args)
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert_eq!(st.code(), Some(64), "{args:?}");
    }
}
