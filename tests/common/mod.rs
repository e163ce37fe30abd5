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
        Client::connect(self.memcache_addr())
    }

    pub fn memcache_addr(&self) -> SocketAddr {
        self.memcache.expect("memcache listener")
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

/// One sample of a Prometheus text exposition: metric name, labels as given (`a="x",b="y"`,
/// without braces), value.
pub type Sample = (String, String, f64);

/// Parse `/metrics` strictly (text format 0.0.4, as Prometheus reads it) and check holdfast's
/// rules on top: every family has one `# TYPE` before its samples, which follow it together;
/// counters end in `_total`, gauges do not; nothing is untyped; a histogram has cumulative
/// `_bucket`s ending in `le="+Inf"` equal to its `_count`, and a `_sum`; no sample twice.
/// Panics with the offending line; returns every sample.
pub fn check_exposition(text: &str) -> Vec<Sample> {
    use std::collections::{BTreeMap, BTreeSet};
    fn valid_name(n: &str) -> bool {
        let mut c = n.chars();
        c.next()
            .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
            && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
    }
    /// `a="x",b="y"` into pairs (escapes: \\, \", \n).
    fn labels(s: &str, line: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut rest = s;
        while !rest.is_empty() {
            let (k, v) = rest
                .split_once("=\"")
                .unwrap_or_else(|| panic!("bad labels in {line:?}"));
            assert!(valid_name(k), "bad label name {k:?} in {line:?}");
            let mut value = String::new();
            let mut chars = v.char_indices();
            let end = loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, '\\')) => value.push('\\'),
                        Some((_, '"')) => value.push('"'),
                        Some((_, 'n')) => value.push('\n'),
                        _ => panic!("bad escape in {line:?}"),
                    },
                    Some((i, '"')) => break i,
                    Some((_, c)) => value.push(c),
                    None => panic!("unterminated label value in {line:?}"),
                }
            };
            out.push((k.to_string(), value));
            rest = &v[end + 1..];
            if let Some(r) = rest.strip_prefix(',') {
                rest = r;
            } else {
                assert!(rest.is_empty(), "junk after a label in {line:?}");
            }
        }
        out
    }
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut finished: BTreeSet<String> = BTreeSet::new();
    let mut current: Option<String> = None;
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    let mut samples: Vec<Sample> = Vec::new();
    for line in text.lines() {
        assert!(!line.is_empty(), "an empty line in the exposition");
        if let Some(rest) = line.strip_prefix("# ") {
            let mut w = rest.splitn(3, ' ');
            let (what, name) = (w.next().unwrap_or(""), w.next().unwrap_or(""));
            assert!(valid_name(name), "bad metric name in {line:?}");
            match what {
                "HELP" => {}
                "TYPE" => {
                    let kind = w.next().unwrap_or("");
                    assert!(
                        matches!(kind, "counter" | "gauge" | "histogram"),
                        "type {kind:?} in {line:?}: counters and gauges only (and histograms)"
                    );
                    match kind {
                        "counter" => {
                            assert!(name.ends_with("_total"), "counter {name} without _total")
                        }
                        "gauge" => {
                            assert!(!name.ends_with("_total"), "gauge {name} ends in _total")
                        }
                        _ => {}
                    }
                    assert!(
                        types.insert(name.to_string(), kind.to_string()).is_none(),
                        "two TYPE lines for {name}"
                    );
                    if let Some(done) = current.replace(name.to_string()) {
                        finished.insert(done);
                    }
                }
                _ => panic!("unknown comment {line:?}"),
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value in {line:?}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        let (name, labelled) = match series.split_once('{') {
            Some((n, l)) => (
                n,
                l.strip_suffix('}')
                    .unwrap_or_else(|| panic!("unclosed labels in {line:?}")),
            ),
            None => (series, ""),
        };
        assert!(valid_name(name), "bad metric name in {line:?}");
        labels(labelled, line);
        let family = current
            .as_deref()
            .unwrap_or_else(|| panic!("a sample before any TYPE: {line:?}"));
        let ok = match types[family].as_str() {
            "histogram" => [
                format!("{family}_bucket"),
                format!("{family}_sum"),
                format!("{family}_count"),
            ]
            .contains(&name.to_string()),
            _ => name == family,
        };
        assert!(
            ok,
            "{line:?} is not a sample of the family {family} above it"
        );
        assert!(
            !finished.contains(name),
            "{name}'s samples are not together"
        );
        assert!(
            seen.insert((name.to_string(), labelled.to_string())),
            "{line:?} twice"
        );
        if types[family] == "counter" || name.ends_with("_bucket") || name.ends_with("_count") {
            assert!(value >= 0.0, "negative count in {line:?}");
        }
        samples.push((name.to_string(), labelled.to_string(), value));
    }
    // Histograms: per label set (without le), buckets cumulative, +Inf last and equal to count.
    for (family, kind) in &types {
        if kind != "histogram" {
            continue;
        }
        let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        let bucket = format!("{family}_bucket");
        for (name, labelled, value) in &samples {
            if *name != bucket {
                continue;
            }
            let pairs = labels(labelled, labelled);
            let le = pairs
                .iter()
                .find(|(k, _)| k == "le")
                .unwrap_or_else(|| panic!("{family} bucket without le"));
            let le: f64 = if le.1 == "+Inf" {
                f64::INFINITY
            } else {
                le.1.parse().expect("le is a number")
            };
            let rest: Vec<String> = pairs
                .iter()
                .filter(|(k, _)| k != "le")
                .map(|(k, v)| format!("{k}=\"{v}\""))
                .collect();
            series.entry(rest.join(",")).or_default().push((le, *value));
        }
        assert!(!series.is_empty(), "histogram {family} has no buckets");
        for (rest, buckets) in series {
            for w in buckets.windows(2) {
                assert!(w[0].0 < w[1].0, "{family}{{{rest}}}: bounds not increasing");
                assert!(
                    w[0].1 <= w[1].1,
                    "{family}{{{rest}}}: buckets not cumulative"
                );
            }
            let (le, inf) = *buckets.last().expect("a bucket");
            assert!(
                le.is_infinite(),
                "{family}{{{rest}}}: the last bucket is not +Inf"
            );
            let find = |suffix: &str| {
                samples
                    .iter()
                    .find(|(n, l, _)| *n == format!("{family}{suffix}") && *l == rest)
                    .map(|s| s.2)
                    .unwrap_or_else(|| panic!("{family}{suffix}{{{rest}}} missing"))
            };
            assert_eq!(
                find("_count"),
                inf,
                "{family}{{{rest}}}: +Inf bucket != count"
            );
            find("_sum");
        }
    }
    samples
}

/// The value of the sample `name{labels}` (labels as printed, without braces).
pub fn sample(samples: &[Sample], name: &str, labels: &str) -> Option<f64> {
    samples
        .iter()
        .find(|(n, l, _)| n == name && l == labels)
        .map(|s| s.2)
}

/// Whether this kernel gives a thread of this process the slice it asks for
/// (`holdfast::slice::request_for_this_thread`; Linux 6.12 and later).
pub fn kernel_grants_slices() -> bool {
    std::thread::spawn(|| {
        holdfast::slice::request_for_this_thread(holdfast::slice::SERVING_THREAD_NANOS)
    })
    .join()
    .expect("the asking thread")
}

/// A thread's name (its comm) and its scheduler slice in nanoseconds.
pub type ThreadSlice = (String, u64);

/// The daemon `pid`'s threads and their scheduler slices (`holdfast::slice::of_thread`), split
/// into the threads that serve requests (the I/O workers and the owner; a thread's comm holds
/// 15 bytes, so "holdfast-worker-0" reads "holdfast-worker"), sorted, and the others. A
/// thread names itself and asks for its slice once it runs, which may be after the daemon has
/// printed its addresses: this reads until the serving threads are `expected`, for at most
/// ten seconds, and then returns what it read last.
pub fn serving_threads_once_they_are(
    pid: u32,
    expected: &[ThreadSlice],
) -> (Vec<ThreadSlice>, Vec<ThreadSlice>) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let mut serving = Vec::new();
        let mut others = Vec::new();
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return (serving, others);
        };
        for task in tasks.flatten() {
            let Ok(tid) = task.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            // A thread that ended since the directory was read has no comm.
            let Ok(comm) = std::fs::read_to_string(task.path().join("comm")) else {
                continue;
            };
            let comm = comm.trim().to_string();
            let slice = holdfast::slice::of_thread(tid);
            if comm.starts_with("holdfast-worker") || comm == "holdfast-owner" {
                serving.push((comm, slice));
            } else {
                others.push((comm, slice));
            }
        }
        serving.sort();
        if serving == expected || Instant::now() > deadline {
            return (serving, others);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
