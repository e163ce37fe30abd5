//! Shared by the integration tests: start the real daemon on port 0 and wait until it listens
//! (through `holdfast_testkit`, the launcher the tools use too), talk to it with deadlines (never
//! sleep-and-hope), stop it by its PID.
#![allow(dead_code)]

pub mod mcbin;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long any single expected answer may take before the test fails (generous: the machine is
/// shared and noisy; a correct daemon answers in microseconds).
pub const DEADLINE: Duration = Duration::from_secs(10);

/// `--threads` of the test daemons: 1 runs the owner inside the one worker (run to completion),
/// 2 gives the owner a thread of its own. `make test` runs the suites both ways
/// (HOLDFAST_TEST_THREADS, read at run time), 2 when unset.
pub fn test_threads() -> String {
    std::env::var("HOLDFAST_TEST_THREADS").unwrap_or_else(|_| "2".into())
}

pub struct Daemon {
    inner: holdfast_testkit::Daemon,
    pub memcache: Option<SocketAddr>,
    pub lockd: Option<SocketAddr>,
    pub dlock: Option<SocketAddr>,
    /// The admin HTTP port (on port 0 unless a test says otherwise).
    pub admin: Option<SocketAddr>,
    pub counter: Option<SocketAddr>,
}

impl Daemon {
    /// Start with every listener on 127.0.0.1:0 plus `extra` flags (which may override them:
    /// the daemon refuses a flag given twice, so a default that `extra` names is left out).
    pub fn start(extra: &[&str]) -> Daemon {
        let threads = test_threads();
        let defaults = [
            ("--memcache", "127.0.0.1:0"),
            ("--lockd", "127.0.0.1:0"),
            ("--dlock", "127.0.0.1:0"),
            ("--threads", threads.as_str()),
            ("--admin", "127.0.0.1:0"),
            ("--counter", "127.0.0.1:0"),
        ];
        let mut args: Vec<&str> = Vec::new();
        for (flag, value) in defaults {
            if !extra.contains(&flag) {
                args.extend_from_slice(&[flag, value]);
            }
        }
        args.extend_from_slice(extra);
        // A listener turned `off` prints no line.
        let is_off = |p: &str| {
            let flag = format!("--{p}");
            args.windows(2)
                .rev()
                .find(|w| w[0] == flag)
                .is_some_and(|w| w[1] == "off")
        };
        let expected: Vec<&str> = ["memcache", "lockd", "dlock", "counter", "admin"]
            .into_iter()
            .filter(|p| !is_off(p))
            .collect();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_holdfast"));
        cmd.args(&args).stderr(Stdio::inherit());
        let inner = holdfast_testkit::Daemon::spawn(&mut cmd, &expected, DEADLINE)
            .unwrap_or_else(|e| panic!("start holdfast {args:?}: {e}"));
        let mut d = Daemon {
            inner,
            memcache: None,
            lockd: None,
            dlock: None,
            admin: None,
            counter: None,
        };
        for (proto, addr) in d.inner.listeners().to_vec() {
            match proto.as_str() {
                "memcache" => d.memcache = Some(addr),
                "lockd" => d.lockd = Some(addr),
                "dlock" => d.dlock = Some(addr),
                "admin" => d.admin = Some(addr),
                "counter" => d.counter = Some(addr),
                other => panic!("unexpected listener {other} at {addr}"),
            }
        }
        d
    }

    pub fn pid(&self) -> u32 {
        self.inner.pid()
    }

    pub fn memcache(&self) -> Client {
        Client::connect(self.memcache.expect("memcache listener"))
    }

    pub fn lockd(&self) -> Client {
        Client::connect(self.lockd.expect("lockd listener"))
    }

    pub fn dlock(&self) -> Client {
        Client::connect(self.dlock.expect("dlock listener"))
    }

    pub fn counter(&self) -> Client {
        Client::connect(self.counter.expect("counter listener"))
    }

    /// Whether the daemon has not exited.
    pub fn is_running(&mut self) -> bool {
        self.inner.is_running()
    }

    /// Send SIGTERM and wait (at most DEADLINE) for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        self.inner
            .terminate(DEADLINE)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Resident memory in KiB (from /proc), for leak checks.
    pub fn rss_kib(&self) -> u64 {
        self.inner.rss_kib().unwrap_or(0)
    }

    /// Number of open file descriptors.
    pub fn open_fds(&self) -> usize {
        self.inner.open_fds()
    }
}

/// A blocking client connection with read deadlines.
pub struct Client {
    pub stream: TcpStream,
    /// Bytes received but not consumed yet.
    pub pending: Vec<u8>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Client {
            stream,
            pending: Vec::new(),
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    /// Read until at least `n` bytes are pending; panics after DEADLINE.
    pub fn fill(&mut self, n: usize) {
        let deadline = Instant::now() + DEADLINE;
        while self.pending.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "timed out waiting for {n} bytes, have {:?}",
                String::from_utf8_lossy(&self.pending)
            );
            self.stream.set_read_timeout(Some(left)).expect("timeout");
            let mut buf = [0u8; 65536];
            match self.stream.read(&mut buf) {
                Ok(0) => panic!(
                    "connection closed with {:?} pending",
                    String::from_utf8_lossy(&self.pending)
                ),
                Ok(k) => self.pending.extend_from_slice(&buf[..k]),
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(e) => panic!("read failed: {e}"),
            }
        }
    }

    /// Take exactly `n` bytes.
    pub fn take(&mut self, n: usize) -> Vec<u8> {
        self.fill(n);
        self.pending.drain(..n).collect()
    }

    /// Take one line including its "\r\n".
    pub fn line(&mut self) -> String {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(i) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=i).collect();
                return String::from_utf8_lossy(&line).into_owned();
            }
            assert!(Instant::now() < deadline, "timed out waiting for a line");
            let have = self.pending.len();
            self.fill(have + 1);
        }
    }

    /// Send a request and expect exactly this reply.
    pub fn expect(&mut self, request: &[u8], reply: &[u8]) {
        self.send(request);
        let got = self.take(reply.len());
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(reply),
            "reply to {:?}",
            String::from_utf8_lossy(request)
        );
    }

    /// Assert that nothing arrives within `wait` (for quiet commands and "not yet" checks).
    pub fn expect_silence(&mut self, wait: Duration) {
        self.stream.set_read_timeout(Some(wait)).expect("timeout");
        let mut buf = [0u8; 4096];
        match self.stream.read(&mut buf) {
            Ok(0) => panic!("connection closed, expected silence"),
            Ok(k) => panic!(
                "expected silence, got {:?}",
                String::from_utf8_lossy(&buf[..k])
            ),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => panic!("read failed: {e}"),
        }
        assert!(
            self.pending.is_empty(),
            "unexpected pending bytes {:?}",
            self.pending
        );
    }

    /// Wait until the server closes the connection (EOF or reset); panics after DEADLINE.
    pub fn expect_closed(&mut self) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "connection still open");
            self.stream.set_read_timeout(Some(left)).expect("timeout");
            let mut buf = [0u8; 4096];
            match self.stream.read(&mut buf) {
                Ok(0) => return,
                Ok(k) => self.pending.extend_from_slice(&buf[..k]),
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(_) => return,
            }
        }
    }
}
