//! One daemon per address: a second process can never share a listener of a running holdfast,
//! so no client can be granted a lock by a second lock table.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Client, Daemon, DEADLINE};

/// Start holdfast with `args` and expect it to fail at start: its exit status and stderr.
fn start_fails(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn holdfast");
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status.code(), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("holdfast {args:?} kept running beside the first daemon");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn only(proto: &str, addr: SocketAddr) -> Vec<String> {
    let mut args = Vec::new();
    for p in ["memcache", "lockd", "dlock", "counter"] {
        args.push(format!("--{p}"));
        args.push(if p == proto {
            addr.to_string()
        } else {
            "off".to_string()
        });
    }
    args.extend(["--admin".into(), "off".into()]);
    args
}

#[test]
fn a_second_daemon_on_a_listener_of_a_running_one_fails_with_address_in_use() {
    let d = Daemon::start(&[]);
    let listeners = [
        ("memcache", d.memcache.unwrap()),
        ("lockd", d.lockd.unwrap()),
        ("dlock", d.dlock.unwrap()),
        ("counter", d.counter.unwrap()),
    ];
    for (proto, addr) in listeners {
        for threads in ["1", "2"] {
            let mut args = only(proto, addr);
            args.extend(["--threads".into(), threads.into()]);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (code, err) = start_fails(&args);
            assert_eq!(code, Some(1), "{proto} --threads {threads}: {err}");
            let want = format!("cannot listen for {proto} on {addr}: address in use");
            assert!(err.contains(&want), "{proto}: stderr {err:?}");
            // One line says why (the other is the start line every start logs).
            let said = err.lines().filter(|l| !l.contains(" info ")).count();
            assert_eq!(said, 1, "one line: {err:?}");
        }
    }
    // The admin port given explicitly is exclusive too.
    let admin = d.admin.unwrap();
    let admin_s = admin.to_string();
    let (code, err) = start_fails(&[
        "--memcache",
        "127.0.0.1:0",
        "--lockd",
        "off",
        "--dlock",
        "off",
        "--counter",
        "off",
        "--admin",
        &admin_s,
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "cannot listen for admin on {admin}: address in use"
        )),
        "{err:?}"
    );
    d.terminate();
}

#[test]
fn a_port_another_program_holds_is_refused_too() {
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = other.local_addr().unwrap();
    let args = only("lockd", addr);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, err) = start_fails(&args);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("address in use"), "{err:?}");
}

/// As a new user would: one daemon running, a second started on the same port (an overlapping
/// restart), then a dozen clients each take the same yrmcds lock: exactly one gets it. Should
/// the second daemon start after all, it stays up while the clients connect (the kernel would
/// spread them over both), so the count is what a user would see.
#[test]
fn every_lock_is_granted_once_when_a_second_daemon_tries_the_same_port() {
    let d = Daemon::start(&[]);
    let addr = d.memcache.unwrap();
    let args = only("memcache", addr);
    let mut second = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn holdfast");
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut status = None;
    while status.is_none() && Instant::now() < deadline {
        status = second.try_wait().unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut clients: Vec<Client> = (0..12).map(|_| Client::connect(addr)).collect();
    let mut granted = 0;
    for c in clients.iter_mut() {
        c.send(b"set dup 0 0 1\r\nx\r\n");
        let _ = c.line();
        c.send(b"lock dup\r\n");
        match c.line().trim_end() {
            "OK" => granted += 1,
            "LOCKED" => {}
            other => panic!("lock dup: {other:?}"),
        }
    }
    if status.is_none() {
        let _ = second.kill();
    }
    let _ = second.wait();
    assert_eq!(granted, 1, "the lock must be granted exactly once");
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(1),
        "the second daemon must fail at start"
    );
    drop(clients);
    d.terminate();
}
