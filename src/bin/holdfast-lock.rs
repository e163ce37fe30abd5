//! `holdfast-lock`: flock(1) for many machines, over the dlock protocol.
//!
//! ```text
//! holdfast-lock [--server HOST:PORT] [--wait DURATION] [--lease DURATION] [--token T]
//!               [--heartbeat DURATION] [--kill-on-loss] KEY... -- COMMAND [ARG...]
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
//!
//! The lock's fencing token (the server's Response field 7) is given to COMMAND as the
//! environment variable `HOLDFAST_FENCE`, so that a job can hand it to the storage it writes to
//! (which refuses writes carrying a smaller token than one it has seen); `--print-fence` also
//! prints it on standard output, one line, before COMMAND starts. A server that sends no token
//! (an original dlock server) leaves the variable unset and prints nothing.
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

use holdfast::proto::dlock::{self as dl, req_type, status, LockFields};

const EX_USAGE: u8 = 64;
const EX_UNAVAILABLE: u8 = 69;
const EX_OSERR: u8 = 71;
const EX_TEMPFAIL: u8 = 75;
const EX_REFUSED: u8 = 1;
/// Default ping interval: well inside the server's default 60 s idle timeout, and often enough
/// that a lost connection is noticed within seconds.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(2);
/// How often the supervising loop looks at the child and the signals while nothing happens.
const TICK_MS: i32 = 50;
/// Largest response frame accepted from the server.
const MAX_RESPONSE: usize = 16 << 20;

struct Args {
    server: String,
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
    /// `--tls`: the client configuration (the server's certificate checked against `--tls-ca`,
    /// else the system's CAs; `--tls-cert`/`--tls-key` for mutual TLS).
    tls: Option<std::sync::Arc<holdfast::tls::rustls::ClientConfig>>,
}

fn usage(opts: &getopts::Options) -> String {
    opts.usage("Usage: holdfast-lock [options] KEY... -- COMMAND [ARG...]")
}

fn parse_args() -> Result<Args, String> {
    let mut opts = getopts::Options::new();
    opts.optopt(
        "s",
        "server",
        "dlock server (default 127.0.0.1:2627)",
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
        "hold the keys as a lease of this length",
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
    let args = Args {
        server: m
            .opt_str("server")
            .unwrap_or_else(|| "127.0.0.1:2627".into()),
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
        tls: tls_config(&m)?,
    };
    if args.slots.is_some() && args.keys.len() != 1 {
        return Err("--slots takes exactly one KEY (the counter's name)".into());
    }
    if args.keys.is_empty() {
        return Err(format!("no KEY given\n{}", usage(&opts)));
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

fn run(args: &Args) -> u8 {
    let mut conn = match Conn::connect(&args.server, args.tls.as_ref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("holdfast-lock: cannot reach {}: {e}", args.server);
            return EX_UNAVAILABLE;
        }
    };
    let token = args.token.as_deref().map(str::as_bytes);
    let keys: Vec<&[u8]> = args.keys.iter().map(|k| k.as_bytes()).collect();
    let micros = |d: Duration| d.as_micros().min(u64::MAX as u128) as u64;
    let lock = LockFields {
        wait_micro: args.wait.map(micros),
        // A lease must be > 0 to be one; round sub-microsecond leases up.
        release_micro: args.lease.map(|d| micros(d).max(1)),
        keys: &keys,
        native: Default::default(),
    };
    let mut frame = Vec::new();
    dl::encode_request(&mut frame, Some(1), token, req_type::LOCK, Some(lock));
    let granted = conn.send(&frame).and_then(|_| conn.response());
    let fence = match granted {
        Ok(r) if r.status == Some(status::OK) => r.fence,
        Ok(r) if r.status == Some(status::ACQUIRE_TIMEOUT) => {
            let busy: Vec<String> = r
                .keys
                .iter()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect();
            eprintln!(
                "holdfast-lock: timed out waiting for the lock (busy: {})",
                busy.join(" ")
            );
            return EX_TEMPFAIL;
        }
        Ok(r) => {
            let text = r
                .error_text
                .as_deref()
                .map(String::from_utf8_lossy)
                .unwrap_or_default();
            eprintln!(
                "holdfast-lock: the server refused the lock (status {:?}: {text})",
                r.status
            );
            return EX_REFUSED;
        }
        Err(e) => {
            eprintln!(
                "holdfast-lock: connection to {} lost before the lock was granted: {e}",
                args.server
            );
            return EX_UNAVAILABLE;
        }
    };

    let mut command = Command::new(&args.command[0]);
    command.args(&args.command[1..]);
    if let Some(fence) = fence {
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
    let status = supervise(&mut conn, &mut child, args, token);

    // Release explicitly (a lease would otherwise outlive us), then close.
    if conn.alive {
        let mut frame = Vec::new();
        dl::encode_request(
            &mut frame,
            Some(2),
            token,
            req_type::UNLOCK,
            Some(LockFields {
                keys: &keys,
                ..Default::default()
            }),
        );
        let _ = conn.send(&frame);
    }
    status
}

/// Wait for the child, pinging the server and forwarding signals meanwhile.
fn supervise(conn: &mut Conn, child: &mut Child, args: &Args, token: Option<&[u8]>) -> u8 {
    let mut next_ping = Instant::now() + args.heartbeat;
    let mut ping = Vec::new();
    dl::encode_request(&mut ping, None, token, req_type::PING, None);
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
        if conn.alive {
            if Instant::now() >= next_ping {
                next_ping = Instant::now() + args.heartbeat;
                if conn.send(&ping).is_err() {
                    conn.alive = false;
                }
            }
            if conn.alive && conn.poll_readable(TICK_MS) && conn.drain().is_err() {
                conn.alive = false;
            }
            if !conn.alive {
                eprintln!(
                    "holdfast-lock: connection to {} lost: the lock is no longer held",
                    args.server
                );
                if args.kill_on_loss {
                    // SAFETY: as above.
                    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
                }
            }
        } else {
            std::thread::sleep(Duration::from_millis(TICK_MS as u64));
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

/// A connection to the server, plain or TLS.
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

struct Conn {
    stream: Stream,
    buf: Vec<u8>,
    alive: bool,
}

impl Conn {
    fn connect(
        server: &str,
        tls: Option<&std::sync::Arc<holdfast::tls::rustls::ClientConfig>>,
    ) -> std::io::Result<Conn> {
        let mut last = None;
        for addr in server.to_socket_addrs()? {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
                Ok(tcp) => {
                    tcp.set_nodelay(true)?;
                    let stream = match tls {
                        Some(config) => {
                            // The name checked is the host as given (an IP address or a DNS name).
                            let host = server
                                .rsplit_once(':')
                                .map_or(server, |(h, _)| h)
                                .trim_start_matches('[')
                                .trim_end_matches(']');
                            let name = holdfast::tls::server_name(host)
                                .map_err(|e| std::io::Error::new(ErrorKind::InvalidInput, e))?;
                            tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
                            let s = holdfast::tls::connect_blocking(config.clone(), name, tcp)?;
                            s.sock.set_read_timeout(None)?;
                            Stream::Tls(Box::new(s))
                        }
                        None => Stream::Plain(tcp),
                    };
                    return Ok(Conn {
                        stream,
                        buf: Vec::new(),
                        alive: true,
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::new(ErrorKind::NotFound, "no address")))
    }

    fn send(&mut self, frame: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(frame)
    }

    /// Block until one whole response arrives.
    fn response(&mut self) -> std::io::Result<dl::Response> {
        loop {
            if let Some(r) = self.take_response()? {
                return Ok(r);
            }
            let mut chunk = [0u8; 65536];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn take_response(&mut self) -> std::io::Result<Option<dl::Response>> {
        let bad = |e: &str| std::io::Error::new(ErrorKind::InvalidData, e.to_string());
        match dl::parse_frame(&self.buf, MAX_RESPONSE) {
            Ok((body, n)) => {
                let r = dl::decode_response(body).map_err(bad)?;
                self.buf.drain(..n);
                Ok(Some(r))
            }
            Err(dl::FrameError::Incomplete) => Ok(None),
            Err(dl::FrameError::TooLarge) => Err(bad("response too large")),
        }
    }

    fn poll_readable(&self, timeout_ms: i32) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        n > 0
    }

    /// Read and discard what arrived (ping answers); an error or EOF means the connection is lost.
    fn drain(&mut self) -> std::io::Result<()> {
        let mut chunk = [0u8; 65536];
        match self.stream.read(&mut chunk) {
            Ok(0) => Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                while self.take_response()?.is_some() {}
                Ok(())
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(e),
        }
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
        let mut stream = match Conn::connect(&args.counter, args.tls.as_ref()) {
            Ok(c) => c.stream,
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
