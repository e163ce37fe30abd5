//! `holdfast-lock`: flock(1) for many machines, over holdfast's native protocol (through the
//! `holdfast-client` library).
//!
//! ```text
//! holdfast-lock [--server HOST:PORT[,HOST:PORT...]] [--wait DURATION] [--lease DURATION] [--token T]
//!               [--heartbeat DURATION] [--kill-on-loss] [--print-fence] KEY... -- COMMAND [ARG...]
//! holdfast-lock --elect NAME [--lease DURATION] [--value V] [--grace DURATION] [--server ...] -- COMMAND
//! holdfast-lock --slots N [--counter HOST:PORT] [--wait DURATION] [--kill-on-loss] KEY -- COMMAND
//! ```
//!
//! With `--slots N`, KEY names a yrmcds counter and holdfast-lock takes one of its N slots
//! instead of a lock: at most N such commands run at once.
//!
//! Acquires every KEY at once (waiting at most --wait, default forever), runs COMMAND (not through
//! a shell) while pinging the server so the connection is never idle, releases the keys when
//! COMMAND exits, and exits with COMMAND's status (128 + N when a signal N ended it, as shells
//! report). Exit codes of its own (sysexits.h): 64 usage, 69 server unreachable or the
//! connection lost before the lock was granted, 75 the wait timed out (like `flock -w`), 1 the
//! server refused the request (its error text is printed), 71 COMMAND could not be started.
//! Several servers (a cluster's nodes) may be given, comma-separated: the first that answers is
//! used, and the next one when a connection breaks. `--lease D` holds the keys as a lease of D
//! that is not renewed: it ends after D even if COMMAND still runs (said on stderr, and COMMAND
//! gets SIGTERM with `--kill-on-loss`, as when the connection is lost).
//!
//! With `--elect NAME`, holdfast-lock is a candidate in the election NAME (docs/recipes.md,
//! "Leader election"): it waits until it leads (a lock on NAME with a lease of `--lease`,
//! default 10s, renewed in the background and kept across a reconnect to another server;
//! `--value`, default HOST:PID, shows who leads), runs COMMAND only while it leads, and when
//! leadership is lost (the lease could not be renewed, the grant was taken away) stops COMMAND:
//! SIGTERM, then SIGKILL after `--grace` (default 5s). It exits with COMMAND's status. The
//! leadership carries a lock-delay of the grace: when a leader dies or is cut off, the next
//! one is granted only after its lease ran out and the grace passed, while its COMMAND is
//! being stopped (an Unlock by fence ends it at once, as an operator's removal should).
//!
//! The lock's fencing token (the server's Response field 7; with `--elect`, the leader's term)
//! is given to COMMAND as the environment variable `HOLDFAST_FENCE`, so that a job can hand it
//! to the storage it writes to (which refuses writes carrying a smaller token than one it has
//! seen); `--print-fence` also prints it on standard output, one line, before COMMAND starts.
//!
//! SIGINT and SIGTERM sent to holdfast-lock are passed on to COMMAND. A SIGINT typed at the
//! terminal already reaches COMMAND (same process group) and is not sent twice: only signals
//! sent by a process (kill(2), si_code SI_USER/SI_QUEUE) are forwarded.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitCode};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use holdfast_client::{Client, Error, LossSignal};

const EX_USAGE: u8 = 64;
const EX_UNAVAILABLE: u8 = 69;
const EX_OSERR: u8 = 71;
const EX_TEMPFAIL: u8 = 75;
const EX_REFUSED: u8 = 1;
/// Default ping interval: well inside the server's default 60 s idle timeout, and often enough
/// that a lost connection is noticed within seconds.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(2);
/// `--elect`: the default lease of the leadership, and the default grace between SIGTERM and
/// SIGKILL when it is lost.
const DEFAULT_ELECT_LEASE: Duration = Duration::from_secs(10);
const DEFAULT_GRACE: Duration = Duration::from_secs(5);
/// How often the supervising loop looks at the child and the signals while nothing happens.
const TICK_MS: i32 = 50;

struct Args {
    /// `--server`, split at commas.
    servers: Vec<String>,
    wait: Option<Duration>,
    lease: Option<Duration>,
    token: Option<String>,
    heartbeat: Duration,
    kill_on_loss: bool,
    print_fence: bool,
    keys: Vec<String>,
    command: Vec<String>,
    /// `--slots N`: take one of N slots of a yrmcds counter instead of a dlock lock.
    slots: Option<u32>,
    counter: String,
    /// `--elect NAME`: run COMMAND only while this process leads the election NAME.
    elect: Option<String>,
    value: Option<String>,
    grace: Duration,
    /// `--tls`: the client configuration (the server's certificate checked against `--tls-ca`,
    /// else the system's CAs; `--tls-cert`/`--tls-key` for mutual TLS).
    tls: Option<std::sync::Arc<holdfast::tls::rustls::ClientConfig>>,
}

fn usage(opts: &getopts::Options) -> String {
    opts.usage(
        "Usage: holdfast-lock [options] KEY... -- COMMAND [ARG...]\n       \
         holdfast-lock --elect NAME [options] -- COMMAND [ARG...]",
    )
}

fn parse_args() -> Result<Args, String> {
    let mut opts = getopts::Options::new();
    opts.optopt(
        "s",
        "server",
        "dlock server (default 127.0.0.1:2627); several, comma-separated, are tried in turn",
        "HOST:PORT",
    )
    .optopt(
        "w",
        "wait",
        "wait at most this long for the lock (default forever)",
        "DURATION",
    )
    .optopt(
        "l",
        "lease",
        "hold the keys as a lease of this length (not renewed); with --elect, the \
         leadership's lease, renewed (default 10s)",
        "DURATION",
    )
    .optopt("t", "token", "access token", "T")
    .optopt("", "heartbeat", "ping interval (default 2s)", "DURATION")
    .optflag(
        "k",
        "kill-on-loss",
        "terminate COMMAND if the connection is lost",
    )
    .optflag(
        "",
        "print-fence",
        "print the lock's fencing token (also in COMMAND's HOLDFAST_FENCE)",
    )
    .optopt(
        "",
        "elect",
        "campaign in the election NAME; run COMMAND only while leading, stop it when \
         leadership is lost",
        "NAME",
    )
    .optopt(
        "",
        "value",
        "with --elect: who this candidate is, shown to observers (default HOST:PID)",
        "V",
    )
    .optopt(
        "",
        "grace",
        "with --elect: time between SIGTERM and SIGKILL when leadership is lost (default 5s)",
        "DURATION",
    )
    .optopt(
        "",
        "slots",
        "take one of N slots of the counter named KEY instead of a lock",
        "N",
    )
    .optopt(
        "",
        "counter",
        "yrmcds counter server for --slots (default 127.0.0.1:11215)",
        "HOST:PORT",
    )
    .optflag(
        "",
        "tls",
        "speak TLS to the server (its certificate checked against --tls-ca, else the system's CAs)",
    )
    .optopt(
        "",
        "tls-ca",
        "CA certificates that sign the server's",
        "FILE",
    )
    .optopt(
        "",
        "tls-cert",
        "client certificate, for servers that ask for one",
        "FILE",
    )
    .optopt("", "tls-key", "private key of --tls-cert", "FILE")
    .optflag("h", "help", "print this help");
    let all: Vec<String> = std::env::args().skip(1).collect();
    let split = all.iter().position(|a| a == "--");
    let (flags, command) = match split {
        Some(i) => (&all[..i], all[i + 1..].to_vec()),
        None => (&all[..], Vec::new()),
    };
    let m = opts
        .parse(flags)
        .map_err(|e| format!("{e}\n{}", usage(&opts)))?;
    if m.opt_present("help") {
        return Err(usage(&opts));
    }
    let duration = |name: &str| -> Result<Option<Duration>, String> {
        m.opt_str(name)
            .map(|s| parse_duration(&s).ok_or(format!("--{name} {s}: not a duration")))
            .transpose()
    };
    let servers: Vec<String> = m
        .opt_str("server")
        .unwrap_or_else(|| "127.0.0.1:2627".into())
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let args = Args {
        servers,
        wait: duration("wait")?,
        lease: duration("lease")?,
        token: m.opt_str("token"),
        heartbeat: duration("heartbeat")?.unwrap_or(DEFAULT_HEARTBEAT),
        kill_on_loss: m.opt_present("kill-on-loss"),
        print_fence: m.opt_present("print-fence"),
        keys: m.free.clone(),
        command,
        slots: m
            .opt_str("slots")
            .map(|s| match s.parse::<u32>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!("--slots {s}: not a positive number")),
            })
            .transpose()?,
        counter: m
            .opt_str("counter")
            .unwrap_or_else(|| "127.0.0.1:11215".into()),
        elect: m.opt_str("elect"),
        value: m.opt_str("value"),
        grace: duration("grace")?.unwrap_or(DEFAULT_GRACE),
        tls: tls_config(&m)?,
    };
    if args.servers.is_empty() {
        return Err("--server names no server".into());
    }
    if args.slots.is_some() && args.keys.len() != 1 {
        return Err("--slots takes exactly one KEY (the counter's name)".into());
    }
    match &args.elect {
        Some(_) if !args.keys.is_empty() => {
            return Err("--elect NAME takes no KEY (NAME is the key)".into())
        }
        Some(_) if args.slots.is_some() => {
            return Err("--elect and --slots exclude each other".into())
        }
        Some(_) if args.lease.is_some_and(|l| l.is_zero()) => {
            return Err("--lease must be positive".into())
        }
        Some(_) => {}
        None if args.keys.is_empty() => return Err(format!("no KEY given\n{}", usage(&opts))),
        None => {}
    }
    if args.command.is_empty() {
        return Err(format!("no COMMAND given after --\n{}", usage(&opts)));
    }
    if args.heartbeat.is_zero() {
        return Err("--heartbeat must be positive".into());
    }
    Ok(args)
}

/// `--tls` and its files.
fn tls_config(
    m: &getopts::Matches,
) -> Result<Option<std::sync::Arc<holdfast::tls::rustls::ClientConfig>>, String> {
    let path = |f: &str| m.opt_str(f).map(std::path::PathBuf::from);
    let (ca, cert, key) = (path("tls-ca"), path("tls-cert"), path("tls-key"));
    holdfast::tls::client_flags(
        m.opt_present("tls"),
        ca.as_deref(),
        cert.as_deref(),
        key.as_deref(),
    )
}

/// `1.5s`, `250ms`, `2m`, `1h`, `10us`; a bare number is seconds.
fn parse_duration(s: &str) -> Option<Duration> {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().ok()?;
    let secs = match unit {
        "" | "s" => v,
        "ms" => v / 1e3,
        "us" => v / 1e6,
        "m" => v * 60.0,
        "h" => v * 3600.0,
        _ => return None,
    };
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("holdfast-lock: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    if let Some(n) = args.slots {
        return ExitCode::from(slots::run(&args, n));
    }
    ExitCode::from(run(&args))
}

/// The servers as given, for messages.
fn servers(args: &Args) -> String {
    args.servers.join(",")
}

fn connect(args: &Args) -> Result<Client, u8> {
    let mut b = Client::builder(args.servers.clone()).ping_interval(args.heartbeat);
    if let Some(t) = &args.token {
        b = b.token(t.as_bytes());
    }
    if let Some(tls) = &args.tls {
        b = b.tls(tls.clone());
    }
    b.connect().map_err(|e| {
        eprintln!("holdfast-lock: cannot reach {}: {e}", servers(args));
        EX_UNAVAILABLE
    })
}

/// The exit code and message of a lock (or campaign) that was not granted.
fn not_granted(args: &Args, e: Error) -> u8 {
    match e {
        Error::AcquireTimeout { .. } => {
            eprintln!("holdfast-lock: {e}");
            EX_TEMPFAIL
        }
        Error::Refused { status, text } => {
            eprintln!("holdfast-lock: the server refused the lock (status {status}: {text})");
            EX_REFUSED
        }
        Error::Invalid(why) => {
            eprintln!("holdfast-lock: {why}");
            EX_USAGE
        }
        e => {
            eprintln!(
                "holdfast-lock: connection to {} lost before the lock was granted: {e}",
                servers(args)
            );
            EX_UNAVAILABLE
        }
    }
}

fn run(args: &Args) -> u8 {
    let client = match connect(args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let granted = match &args.elect {
        Some(name) => {
            let value = args.value.clone().unwrap_or_else(default_value);
            let lease = args.lease.unwrap_or(DEFAULT_ELECT_LEASE);
            // A lock-delay of the grace: a leader that dies or is cut off keeps the next one
            // out while its COMMAND is being stopped (at most 60 s, the protocol's limit).
            let delay = args.grace.min(Duration::from_secs(60));
            client
                .lock(name)
                .value(value)
                .lease(lease)
                .lock_delay(delay)
                .acquire()
        }
        None => {
            let mut req = client.lock_many(&args.keys).wait_for(args.wait);
            if let Some(lease) = args.lease {
                // A lease must be > 0 to be one; round sub-microsecond leases up.
                req = req.lease(lease.max(Duration::from_micros(1))).renew(false);
            }
            req.acquire()
        }
    };
    let guard = match granted {
        Ok(g) => g,
        Err(e) => return not_granted(args, e),
    };
    let fence = guard.fence();
    let mut command = Command::new(&args.command[0]);
    command.args(&args.command[1..]);
    // A server that sends no token (fence 0) leaves the variable unset and prints nothing.
    if fence > 0 {
        command.env("HOLDFAST_FENCE", fence.to_string());
        if args.print_fence {
            let mut out = std::io::stdout().lock();
            // Printed before COMMAND starts, so a script reading our output sees it first.
            if writeln!(out, "{fence}").and_then(|_| out.flush()).is_err() {
                eprintln!("holdfast-lock: cannot print the fencing token");
            }
        }
    }
    install_forwarding();
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("holdfast-lock: cannot run {}: {e}", args.command[0]);
            return EX_OSERR;
        }
    };
    let status = supervise(&mut child, &guard.loss_signal(), args);
    // Release explicitly (a lease would otherwise outlive us); after a loss there is nothing
    // to release, and a connection that is gone makes this return at once.
    let _ = guard.unlock();
    client.close();
    status
}

/// `--value`'s default: this host's name and our PID.
fn default_value() -> String {
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer we own.
    let ok = unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) } == 0;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let host = if ok {
        String::from_utf8_lossy(&name[..end]).into_owned()
    } else {
        "localhost".into()
    };
    format!("{host}:{}", std::process::id())
}

/// Wait for the child, forwarding signals, and watching the lock: when it is lost, say so;
/// with `--elect` stop COMMAND (SIGTERM, SIGKILL after the grace), with `--kill-on-loss` send
/// it SIGTERM.
fn supervise(child: &mut Child, lost: &LossSignal, args: &Args) -> u8 {
    let mut told = false;
    let mut kill_at = None;
    loop {
        let sig = PENDING_SIGNAL.swap(0, Ordering::AcqRel);
        if sig != 0 {
            // SAFETY: kill(2) on the PID of the child we spawned and have not reaped.
            unsafe { libc::kill(child.id() as i32, sig) };
        }
        match child.try_wait() {
            Ok(Some(st)) => return exit_code(st),
            Ok(None) => {}
            Err(e) => {
                eprintln!("holdfast-lock: waiting for the command failed: {e}");
                return EX_OSERR;
            }
        }
        if !told {
            if let Some(why) = lost.wait(Some(Duration::from_millis(TICK_MS as u64))) {
                told = true;
                let what = if args.elect.is_some() {
                    "leadership"
                } else {
                    "the lock"
                };
                match why {
                    holdfast_client::Loss::ConnectionLost => eprintln!(
                        "holdfast-lock: connection to {} lost: {what} is no longer held",
                        servers(args)
                    ),
                    why => eprintln!("holdfast-lock: {why}: {what} is lost"),
                }
                if args.elect.is_some() || args.kill_on_loss {
                    // SAFETY: as above.
                    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
                }
                if args.elect.is_some() {
                    kill_at = Some(Instant::now() + args.grace);
                }
            }
        } else {
            std::thread::sleep(Duration::from_millis(TICK_MS as u64));
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            kill_at = None;
            // SAFETY: as above.
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        }
    }
}

fn exit_code(st: std::process::ExitStatus) -> u8 {
    match (st.code(), st.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(sig)) => (128 + sig) as u8,
        _ => EX_OSERR,
    }
}

static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
    let code = unsafe { (*info).si_code };
    // Only signals sent by a process are forwarded: a terminal's SIGINT (si_code SI_KERNEL)
    // already reached the child, which shares our process group.
    if code == libc::SI_USER || code == libc::SI_QUEUE {
        PENDING_SIGNAL.store(sig, Ordering::Release);
    }
}

fn install_forwarding() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction with a valid handler and an empty mask is well formed; the
        // handler only stores to an atomic (async-signal-safe).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// A connection to the counter server (`--slots`), plain or TLS.
enum Stream {
    Plain(TcpStream),
    Tls(Box<holdfast::tls::ClientStream>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }

    fn connect(
        server: &str,
        tls: Option<&std::sync::Arc<holdfast::tls::rustls::ClientConfig>>,
    ) -> std::io::Result<Stream> {
        let mut last = None;
        for addr in server.to_socket_addrs()? {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
                Ok(tcp) => {
                    tcp.set_nodelay(true)?;
                    return Ok(match tls {
                        Some(config) => {
                            let name = holdfast::tls::server_name_of(server)
                                .map_err(|e| std::io::Error::new(ErrorKind::InvalidInput, e))?;
                            tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
                            let s = holdfast::tls::connect_blocking(config.clone(), name, tcp)?;
                            s.sock.set_read_timeout(None)?;
                            Stream::Tls(Box::new(s))
                        }
                        None => Stream::Plain(tcp),
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::new(ErrorKind::NotFound, "no address")))
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.tcp().as_raw_fd()
    }
}

/// `--slots N`: at most N holders of one name at once, over yrmcds's counter protocol. The
/// protocol cannot wait (Acquire answers "Resource not available" at once), so a full counter is
/// retried with a growing pause (up to `MAX_RETRY`) until `--wait` runs out. The slot is tied to
/// the connection: if holdfast-lock dies, the server releases it when the connection closes.
mod slots {
    use super::*;
    use holdfast::proto::counter::{self as ct, op, status};

    /// Longest pause between two Acquire attempts on a full counter.
    const MAX_RETRY: Duration = Duration::from_millis(200);
    /// Largest counter response body accepted (an error text or a 4-byte count).
    const MAX_BODY: usize = 64 * 1024;

    struct Reply {
        status: u8,
        body: Vec<u8>,
    }

    fn read_reply(stream: &mut Stream) -> std::io::Result<Reply> {
        let mut h = [0u8; ct::HEADER_LEN];
        stream.read_exact(&mut h)?;
        let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
        if h[0] != ct::RES_MAGIC || len > MAX_BODY {
            return Err(std::io::Error::new(
                ErrorKind::InvalidData,
                "not a counter response",
            ));
        }
        let mut body = vec![0u8; len];
        stream.read_exact(&mut body)?;
        Ok(Reply { status: h[2], body })
    }

    pub fn run(args: &Args, n: u32) -> u8 {
        let name = args.keys[0].as_bytes();
        let mut stream = match Stream::connect(&args.counter, args.tls.as_ref()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("holdfast-lock: cannot reach {}: {e}", args.counter);
                return EX_UNAVAILABLE;
            }
        };
        let mut acquire = Vec::new();
        let mut body = Vec::new();
        ct::acquire_body(&mut body, 1, n, name);
        ct::encode_request(&mut acquire, op::ACQUIRE, 1, &body);
        let deadline = args.wait.map(|w| Instant::now() + w);
        let mut pause = Duration::from_millis(5);
        loop {
            let reply = stream
                .write_all(&acquire)
                .and_then(|_| read_reply(&mut stream));
            match reply {
                Ok(r) if r.status == status::OK => break,
                Ok(r) if r.status == status::NOT_AVAILABLE => {}
                Ok(r) => {
                    eprintln!(
                        "holdfast-lock: the server refused the slot (status {:#04x}: {})",
                        r.status,
                        String::from_utf8_lossy(&r.body)
                    );
                    return EX_REFUSED;
                }
                Err(e) => {
                    eprintln!(
                        "holdfast-lock: connection to {} lost before a slot was granted: {e}",
                        args.counter
                    );
                    return EX_UNAVAILABLE;
                }
            }
            if deadline.is_some_and(|d| Instant::now() + pause > d) {
                eprintln!("holdfast-lock: timed out waiting for one of {n} slots");
                return EX_TEMPFAIL;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(MAX_RETRY);
        }

        install_forwarding();
        let mut child = match Command::new(&args.command[0])
            .args(&args.command[1..])
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                eprintln!("holdfast-lock: cannot run {}: {e}", args.command[0]);
                return EX_OSERR;
            }
        };
        let code = supervise(&mut stream, &mut child, args);
        // Release explicitly; closing the connection would release it too.
        let mut release = Vec::new();
        let mut body = Vec::new();
        ct::release_body(&mut body, 1, name);
        ct::encode_request(&mut release, op::RELEASE, 2, &body);
        let _ = stream
            .write_all(&release)
            .and_then(|_| read_reply(&mut stream));
        code
    }

    /// Wait for the child, forwarding signals and watching the connection (the counter
    /// protocol has no idle timeout, so nothing needs to be sent meanwhile).
    fn supervise(stream: &mut Stream, child: &mut Child, args: &Args) -> u8 {
        let mut alive = true;
        loop {
            let sig = PENDING_SIGNAL.swap(0, Ordering::AcqRel);
            if sig != 0 {
                // SAFETY: kill(2) on the PID of the child we spawned and have not reaped.
                unsafe { libc::kill(child.id() as i32, sig) };
            }
            match child.try_wait() {
                Ok(Some(st)) => return exit_code(st),
                Ok(None) => {}
                Err(e) => {
                    eprintln!("holdfast-lock: waiting for the command failed: {e}");
                    return EX_OSERR;
                }
            }
            if !alive {
                std::thread::sleep(Duration::from_millis(TICK_MS as u64));
                continue;
            }
            let mut pfd = libc::pollfd {
                fd: stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            if unsafe { libc::poll(&mut pfd, 1, TICK_MS) } > 0 {
                let mut chunk = [0u8; 256];
                // Nothing is unsolicited in this protocol: data, EOF or an error all mean the
                // connection is no longer one we hold a slot through.
                let lost = !matches!(stream.read(&mut chunk), Err(e) if e.kind() == ErrorKind::Interrupted);
                if lost {
                    alive = false;
                    eprintln!(
                        "holdfast-lock: connection to {} lost: the slot is no longer held",
                        args.counter
                    );
                    if args.kill_on_loss {
                        // SAFETY: as above.
                        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_take_units_and_bare_seconds() {
        assert_eq!(parse_duration("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("10us"), Some(Duration::from_micros(10)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_duration("x"), None);
        assert_eq!(parse_duration("5d"), None);
        assert_eq!(parse_duration(""), None);
    }
}
