//! TLS on the client listeners against the real daemon (`docs/operations.md`,
//! "Security"): the lock protocols unchanged inside TLS (byte-identical
//! replies), `notls:` listeners, mutual TLS, locks released when a TLS connection closes, large
//! values and deep pipelines through the TLS send buffer, certificate reloads on SIGHUP, refused
//! key files; and hostile input on a TLS port: plaintext, garbage, truncated, oversized and
//! stalled handshakes, the connection limit, a byte stream split at every byte.
//!
//! The client is rustls itself (the same library as the daemon, configured independently: the
//! test CA and certificates come from `holdfast_testkit::pki`). Every wait is bounded by a
//! deadline. Tests that load the two shared cores hard or count descriptors hold [`serial`].

mod common;

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use common::{mcbin, Daemon, DEADLINE};
use holdfast::proto::counter as ct;
use holdfast::proto::dlock::{self as dl, req_type, status, LockFields};
use holdfast::tls::rustls;
use holdfast_testkit::pki::{self, Ca, Issued};
use rustls::pki_types::ServerName;
use rustls::ClientConfig;

// ---- shared helpers ----

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A test CA, the daemon's certificate (for 127.0.0.1 and localhost) and a directory for more.
struct Pki {
    dir: PathBuf,
    ca: Ca,
    ca_pem: PathBuf,
    server: Issued,
}

impl Pki {
    fn new(tag: &str) -> Pki {
        let dir = pki::temp_dir(tag);
        let ca = Ca::new("holdfast test CA");
        let ca_pem = ca.write(&dir.join("ca.pem"));
        let server = ca.issue(&dir, "server", &["127.0.0.1", "localhost"]);
        Pki {
            dir,
            ca,
            ca_pem,
            server,
        }
    }

    /// `--tls-cert`, `--tls-key` of the daemon's certificate.
    fn flags(&self) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            path_str(&self.server.cert),
            "--tls-key".into(),
            path_str(&self.server.key),
        ]
    }

    /// A client that trusts the test CA and presents no certificate.
    fn client(&self) -> Arc<ClientConfig> {
        holdfast::tls::client_config(Some(&self.ca_pem), None).expect("client config")
    }

    /// A client that trusts the test CA and presents `id`.
    fn client_with(&self, id: &Issued) -> Arc<ClientConfig> {
        holdfast::tls::client_config(Some(&self.ca_pem), Some((&id.cert, &id.key)))
            .expect("client config")
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn path_str(p: &Path) -> String {
    p.to_str().expect("UTF-8 path").to_string()
}

/// Start a daemon with `flags` (owned strings) on top of the common defaults.
fn start(flags: &[String]) -> Daemon {
    let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    Daemon::start(&refs)
}

/// Every listener TLS with `pki`'s certificate, plus `extra`.
fn tls_daemon(pki: &Pki, extra: &[&str]) -> Daemon {
    let mut flags = pki.flags();
    flags.extend(extra.iter().map(|s| s.to_string()));
    start(&flags)
}

fn server_name() -> ServerName<'static> {
    holdfast::tls::server_name("127.0.0.1").expect("server name")
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// A TLS client connection driven by hand (rustls's `ClientConnection` over a blocking socket),
/// so that a test can see every step: the handshake, what arrives, the close.
struct Tls {
    tcp: TcpStream,
    conn: rustls::ClientConnection,
    /// Plaintext received and not consumed yet.
    pending: Vec<u8>,
}

impl Tls {
    /// Connect and finish the handshake (a client that fails it gets the error).
    fn try_connect(addr: SocketAddr, config: Arc<ClientConfig>) -> io::Result<Tls> {
        Tls::try_connect_within(addr, config, DEADLINE)
    }

    /// As [`Tls::try_connect`], giving up when the server is silent for `within`.
    fn try_connect_within(
        addr: SocketAddr,
        config: Arc<ClientConfig>,
        within: Duration,
    ) -> io::Result<Tls> {
        Tls::try_over(TcpStream::connect(addr)?, config, within)
    }

    /// A TLS client on a connected socket.
    fn over(tcp: TcpStream, config: Arc<ClientConfig>) -> Tls {
        Tls::try_over(tcp, config, DEADLINE).expect("TLS handshake")
    }

    fn try_over(tcp: TcpStream, config: Arc<ClientConfig>, within: Duration) -> io::Result<Tls> {
        tcp.set_nodelay(true)?;
        tcp.set_read_timeout(Some(within))?;
        tcp.set_write_timeout(Some(DEADLINE))?;
        let conn =
            rustls::ClientConnection::new(config, server_name()).map_err(io::Error::other)?;
        let mut t = Tls {
            tcp,
            conn,
            pending: Vec::new(),
        };
        while t.conn.is_handshaking() {
            t.conn.complete_io(&mut t.tcp)?;
        }
        Ok(t)
    }

    fn connect(addr: SocketAddr, config: Arc<ClientConfig>) -> Tls {
        Tls::try_connect(addr, config).unwrap_or_else(|e| panic!("TLS handshake with {addr}: {e}"))
    }

    /// The DER of the certificate the server presented.
    fn peer_cert(&self) -> Vec<u8> {
        self.conn
            .peer_certificates()
            .and_then(|c| c.first())
            .expect("a server certificate")
            .to_vec()
    }

    /// Write everything rustls has queued.
    fn flush_tls(&mut self) -> io::Result<()> {
        while self.conn.wants_write() {
            self.conn.write_tls(&mut self.tcp)?;
        }
        Ok(())
    }

    fn try_send(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let n = self.conn.writer().write(bytes)?;
            bytes = &bytes[n..];
            self.flush_tls()?;
        }
        Ok(())
    }

    fn send(&mut self, bytes: &[u8]) {
        self.try_send(bytes).expect("TLS send");
    }

    /// Encrypt `plaintext` whole now and write the records from another thread, so that a
    /// pipeline far larger than the socket buffers goes out while this thread reads the replies.
    fn send_in_background(&mut self, plaintext: &[u8]) -> thread::JoinHandle<io::Result<()>> {
        self.conn.set_buffer_limit(None);
        self.conn
            .writer()
            .write_all(plaintext)
            .expect("buffer plaintext");
        let mut records = Vec::new();
        while self.conn.wants_write() {
            self.conn.write_tls(&mut records).expect("encrypt");
        }
        let mut tcp = self.tcp.try_clone().expect("clone socket");
        thread::spawn(move || tcp.write_all(&records))
    }

    /// Read until at least `n` plaintext bytes are pending. `Ok(false)`: the server closed first
    /// (close_notify or EOF); errors are TLS or socket errors (a timeout after DEADLINE).
    fn try_fill(&mut self, n: usize) -> io::Result<bool> {
        let deadline = Instant::now() + DEADLINE;
        let mut buf = vec![0u8; 64 * 1024];
        while self.pending.len() < n {
            match self.conn.reader().read(&mut buf) {
                Ok(0) => return Ok(false),
                Ok(k) => {
                    self.pending.extend_from_slice(&buf[..k]);
                    continue;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(false),
                Err(e) => return Err(e),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(ErrorKind::TimedOut, "no reply in time"));
            }
            self.tcp.set_read_timeout(Some(left))?;
            match self.conn.read_tls(&mut self.tcp) {
                Ok(0) => {
                    // EOF: whatever rustls decrypted before it is still readable.
                    self.conn.process_new_packets().map_err(io::Error::other)?;
                    let mut rest = self.conn.reader();
                    loop {
                        match rest.read(&mut buf) {
                            Ok(0) => break,
                            Ok(k) => self.pending.extend_from_slice(&buf[..k]),
                            Err(_) => break,
                        }
                    }
                    return Ok(self.pending.len() >= n);
                }
                Ok(_) => {}
                Err(e) if is_timeout(&e) || e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            self.conn.process_new_packets().map_err(io::Error::other)?;
            self.flush_tls()?;
        }
        Ok(true)
    }

    fn fill(&mut self, n: usize) {
        match self.try_fill(n) {
            Ok(true) => {}
            Ok(false) => panic!(
                "connection closed with {:?} pending, {n} bytes wanted",
                String::from_utf8_lossy(&self.pending[..self.pending.len().min(200)])
            ),
            Err(e) => panic!(
                "reading {n} bytes: {e}; have {:?}",
                String::from_utf8_lossy(&self.pending[..self.pending.len().min(200)])
            ),
        }
    }

    fn take(&mut self, n: usize) -> Vec<u8> {
        self.fill(n);
        self.pending.drain(..n).collect()
    }

    fn line(&mut self) -> String {
        loop {
            if let Some(i) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=i).collect();
                return String::from_utf8_lossy(&line).into_owned();
            }
            let have = self.pending.len();
            self.fill(have + 1);
        }
    }

    fn expect(&mut self, request: &[u8], reply: &[u8]) {
        self.send(request);
        let got = self.take(reply.len());
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(reply),
            "reply to {:?}",
            String::from_utf8_lossy(request)
        );
    }

    /// Send close_notify, then read everything until the server closes. Returns the bytes and
    /// whether the server ended with a close_notify of its own.
    fn close_and_read_all(mut self) -> (Vec<u8>, bool) {
        self.conn.send_close_notify();
        self.flush_tls().expect("send close_notify");
        self.read_to_close()
    }

    /// Read everything until the server closes: the bytes, and whether the server ended with a
    /// close_notify.
    fn read_to_close(mut self) -> (Vec<u8>, bool) {
        let deadline = Instant::now() + DEADLINE;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match self.conn.reader().read(&mut buf) {
                Ok(0) => return (self.pending, true),
                Ok(k) => {
                    self.pending.extend_from_slice(&buf[..k]);
                    continue;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => return (self.pending, false),
                Err(e) => panic!("reading to the close: {e}"),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "the server did not close");
            self.tcp.set_read_timeout(Some(left)).expect("timeout");
            match self.conn.read_tls(&mut self.tcp) {
                Ok(_) => {}
                Err(e) if is_timeout(&e) => continue,
                Err(e) => panic!("reading to the close: {e}"),
            }
            self.conn
                .process_new_packets()
                .expect("valid records to the close");
        }
    }

    /// Whether the server closes this connection (EOF, reset or a TLS alert) within `within`.
    fn closed_within(&mut self, within: Duration) -> bool {
        closed_within(&mut self.tcp, within)
    }
}

/// Whether the peer closes `tcp` within `within` (bytes that arrive meanwhile, such as a TLS
/// alert, are skipped).
fn closed_within(tcp: &mut TcpStream, within: Duration) -> bool {
    received_until_closed(tcp, within).is_some()
}

/// The bytes that arrive on `tcp` until the peer closes it (EOF or reset), if it does within
/// `within`.
fn received_until_closed(tcp: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        tcp.set_read_timeout(Some(left)).expect("timeout");
        match tcp.read(&mut buf) {
            Ok(0) => return Some(got),
            Ok(k) => got.extend_from_slice(&buf[..k]),
            Err(e) if is_timeout(&e) || e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Some(got),
        }
    }
}

/// Long enough for a loaded machine, far shorter than the default handshake timeout (10 s): a
/// connection closed within it was refused, not timed out.
const PROMPTLY: Duration = Duration::from_secs(3);

/// Whether the peer has closed `tcp` already (EOF or reset waiting), without waiting.
fn closed_now(tcp: &TcpStream) -> bool {
    tcp.set_nonblocking(true).expect("nonblocking");
    let mut buf = [0u8; 1];
    let closed = match tcp.peek(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != ErrorKind::WouldBlock,
    };
    tcp.set_nonblocking(false).expect("blocking");
    closed
}

/// Read a plain connection until EOF, collecting everything.
fn read_to_eof(tcp: &mut TcpStream) -> Vec<u8> {
    let deadline = Instant::now() + DEADLINE;
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no EOF");
        tcp.set_read_timeout(Some(left)).expect("timeout");
        match tcp.read(&mut buf) {
            Ok(0) => return out,
            Ok(k) => out.extend_from_slice(&buf[..k]),
            Err(e) if is_timeout(&e) || e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("read before EOF: {e}"),
        }
    }
}

/// The whole reply stream of `script` sent over plain TCP, then a half-close.
fn exchange_plain(addr: SocketAddr, script: &[u8]) -> Vec<u8> {
    let mut tcp = TcpStream::connect(addr).expect("connect");
    tcp.write_all(script).expect("send");
    tcp.shutdown(Shutdown::Write).expect("half-close");
    read_to_eof(&mut tcp)
}

/// The whole reply stream of `script` sent over TLS, then a close_notify; the daemon must end
/// the stream with its own close_notify (no truncation attack possible on the replies).
fn exchange_tls(addr: SocketAddr, config: Arc<ClientConfig>, script: &[u8]) -> Vec<u8> {
    let mut t = Tls::connect(addr, config);
    t.send(script);
    let (bytes, clean) = t.close_and_read_all();
    assert!(clean, "the daemon closed without close_notify");
    bytes
}

/// Poll `f` until it returns true; panics after DEADLINE with `what`.
fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// A memcached `stats` value read over `t`.
fn stat(t: &mut Tls, name: &str) -> u64 {
    t.send(b"stats\r\n");
    let mut value = None;
    loop {
        let line = t.line();
        if line == "END\r\n" {
            break;
        }
        let mut words = line.split_whitespace();
        if words.next() == Some("STAT") && words.next() == Some(name) {
            value = words.next().and_then(|v| v.parse().ok());
        }
    }
    value.unwrap_or_else(|| panic!("no stat {name}"))
}

/// A ClientHello as a real client sends it (rustls's first flight).
fn client_hello(pki: &Pki) -> Vec<u8> {
    let mut conn = rustls::ClientConnection::new(pki.client(), server_name()).expect("client");
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).expect("hello");
    }
    out
}

// ---- the protocols' request scripts ----

fn text_script() -> Vec<u8> {
    let mut s = Vec::new();
    for req in [
        &b"set a 0 0 1\r\n1\r\n"[..],
        b"get a\r\n",
        b"gets a\r\n",
        b"add a 0 0 1\r\n2\r\n",
        b"add b 5 0 3\r\nabc\r\n",
        b"append b 0 0 2\r\nde\r\n",
        b"prepend b 0 0 2\r\nzz\r\n",
        b"get a b missing\r\n",
        b"replace missing 0 0 1\r\nx\r\n",
        b"incr n 1\r\n",
        b"set n 0 0 2\r\n10\r\n",
        b"incr n 5\r\n",
        b"decr n 100\r\n",
        b"touch a 100\r\n",
        b"lock a\r\n",
        b"lock a\r\n",
        b"unlock a\r\n",
        b"unlock a\r\n",
        b"lock missing\r\n",
        b"unlock_all\r\n",
        b"delete b\r\n",
        b"delete b\r\n",
        b"set q 0 0 3 noreply\r\nxyz\r\n",
        b"get q\r\n",
        b"version\r\n",
        b"verbosity 1\r\n",
        b"bogus command\r\n",
        b"flush_all\r\n",
        b"get a n q\r\n",
    ] {
        s.extend_from_slice(req);
    }
    s
}

fn binary_script() -> Vec<u8> {
    let flags_exp = [0, 0, 0, 7, 0, 0, 0, 0];
    let delta = |d: u64| {
        let mut e = d.to_be_bytes().to_vec();
        e.extend_from_slice(&0u64.to_be_bytes());
        e.extend_from_slice(&0u32.to_be_bytes());
        e
    };
    let mut s = Vec::new();
    let frames = [
        mcbin::request(0x01, &flags_exp, b"k", b"value", 1, 0), // set
        mcbin::request(0x00, &[], b"k", &[], 2, 0),             // get
        mcbin::request(0x0c, &[], b"k", &[], 3, 0),             // getk
        mcbin::request(0x02, &flags_exp, b"k", b"other", 4, 0), // add: exists
        mcbin::request(0x0e, &[], b"k", b"-tail", 5, 0),        // append
        mcbin::request(0x09, &[], b"missing", &[], 6, 0),       // getq: silent miss
        mcbin::request(0x00, &[], b"missing", &[], 7, 0),       // get: not found
        mcbin::request(0x05, &delta(3), b"n", &[], 8, 0),       // incr: creates with initial 0
        mcbin::request(0x05, &delta(3), b"n", &[], 9, 0),       // incr
        mcbin::request(0x06, &delta(10), b"n", &[], 10, 0),     // decr
        mcbin::request(0x04, &[], b"k", &[], 11, 0),            // delete
        mcbin::request(0x04, &[], b"k", &[], 12, 0),            // delete: not found
        mcbin::request(0x0b, &[], &[], &[], 13, 0),             // version
        mcbin::request(0x0a, &[], &[], &[], 14, 0),             // noop
        mcbin::request(0x7f, &[], &[], &[], 15, 0),             // unknown
    ];
    for f in frames {
        s.extend_from_slice(&f);
    }
    s
}

fn lockd_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let word = (1u32 << 28) | (u32::from(opcode) << 20) | payload.len() as u32;
    let mut out = word.to_be_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

const ACQ: u8 = 1;
const REL: u8 = 2;
const TRY: u8 = 3;
const PING: u8 = 4;
const ADOPT: u8 = 5;
const SYNC: u8 = 6;
const ACQUIRED: u8 = 128;
const ACK: u8 = 132;

fn lockd_script() -> Vec<u8> {
    let mut s = Vec::new();
    for (op, payload) in [
        (ACQ, &b"one\0"[..]),
        (TRY, b"one\0"),
        (TRY, b"two\0"),
        (PING, b"any bytes"),
        (SYNC, b""),
        (REL, b"one\0"),
        (REL, b"one\0"),
        (ADOPT, b"two\0"),
        (ACQ, b""),
        (ACQ, b"no nul"),
        (9, b"unknown\0"),
        (REL, b"two\0"),
    ] {
        s.extend_from_slice(&lockd_frame(op, payload));
    }
    s
}

fn dlock_frame(id: u64, t: u64, lock: Option<LockFields<'_>>) -> Vec<u8> {
    let mut out = Vec::new();
    dl::encode_request(&mut out, Some(id), None, t, lock);
    out
}

fn dlock_lock(id: u64, keys: &[&[u8]], wait_us: Option<u64>) -> Vec<u8> {
    dlock_frame(
        id,
        req_type::LOCK,
        Some(LockFields {
            wait_micro: wait_us,
            release_micro: None,
            keys,
            native: Default::default(),
        }),
    )
}

fn dlock_unlock(id: u64, keys: &[&[u8]]) -> Vec<u8> {
    dlock_frame(
        id,
        req_type::UNLOCK,
        Some(LockFields {
            keys,
            ..Default::default()
        }),
    )
}

fn dlock_script() -> Vec<u8> {
    let mut s = Vec::new();
    s.extend_from_slice(&dlock_frame(1, req_type::PING, None));
    s.extend_from_slice(&dlock_lock(2, &[b"a", b"b"], Some(0)));
    s.extend_from_slice(&dlock_lock(3, &[b"a"], Some(0)));
    s.extend_from_slice(&dlock_unlock(4, &[b"a"]));
    s.extend_from_slice(&dlock_unlock(5, &[b"a", b"zz"]));
    s.extend_from_slice(&dlock_lock(6, &[], Some(0)));
    s.extend_from_slice(&dlock_frame(7, 99, None));
    s.extend_from_slice(&dlock_frame(8, req_type::LOCK, None));
    s
}

/// dlock replies with their clock fields (`server_unix_time`, `fence`) set to zero: two daemons
/// answer at different instants. Each frame is checked to re-encode to its own bytes first, so
/// that the rest is still compared byte for byte.
fn dlock_without_clock(mut bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let len = u32::from_be_bytes(bytes[..4].try_into().expect("prefix")) as usize;
        let (frame, rest) = bytes.split_at(4 + len);
        bytes = rest;
        let r = dl::decode_response(&frame[4..]).expect("a Response");
        let encode = |out: &mut Vec<u8>, time: i64, fence: Option<u64>| {
            dl::encode_response_fenced(
                out,
                r.request_id,
                r.status.expect("status"),
                r.error_text
                    .as_deref()
                    .map(|t| std::str::from_utf8(t).expect("UTF-8 error text")),
                r.keys.iter().map(Vec::as_slice),
                time,
                fence,
            )
        };
        let mut again = Vec::new();
        encode(&mut again, r.server_unix_time.expect("time"), r.fence);
        assert_eq!(again, frame, "a reply that re-encodes to itself");
        encode(&mut out, 0, r.fence.map(|_| 0));
    }
    out
}

fn counter_script() -> Vec<u8> {
    let mut s = Vec::new();
    let mut body = Vec::new();
    ct::acquire_body(&mut body, 2, 3, b"sem");
    ct::encode_request(&mut s, ct::op::ACQUIRE, 1, &body);
    body.clear();
    ct::acquire_body(&mut body, 2, 3, b"sem");
    ct::encode_request(&mut s, ct::op::ACQUIRE, 2, &body);
    body.clear();
    ct::get_body(&mut body, b"sem");
    ct::encode_request(&mut s, ct::op::GET, 3, &body);
    body.clear();
    ct::release_body(&mut body, 1, b"sem");
    ct::encode_request(&mut s, ct::op::RELEASE, 4, &body);
    body.clear();
    ct::release_body(&mut body, 5, b"none");
    ct::encode_request(&mut s, ct::op::RELEASE, 5, &body);
    ct::encode_request(&mut s, ct::op::NOOP, 6, &[]);
    ct::encode_request(&mut s, 0x7e, 7, &[]);
    s
}

// ---- the protocols are unchanged inside TLS ----

/// Which of a daemon's listeners a case talks to.
type Listener = fn(&Daemon) -> Option<SocketAddr>;

#[test]
fn every_protocol_answers_byte_identically_over_tls_and_plain_tcp() {
    let pki = Pki::new("tls-identical");
    let tls = tls_daemon(&pki, &[]);
    let plain = Daemon::start(&[]);
    let cases: [(&str, Listener, Vec<u8>); 5] = [
        ("memcache text", |d| d.memcache, text_script()),
        ("memcache binary", |d| d.memcache, binary_script()),
        ("lockd", |d| d.lockd, lockd_script()),
        ("dlock", |d| d.dlock, dlock_script()),
        ("counter", |d| d.counter, counter_script()),
    ];
    for (what, addr, script) in cases {
        let over_tls = exchange_tls(addr(&tls).unwrap(), pki.client(), &script);
        let over_tcp = exchange_plain(addr(&plain).unwrap(), &script);
        assert!(!over_tcp.is_empty(), "{what}: no replies at all");
        let (over_tls, over_tcp) = if what == "dlock" {
            (
                dlock_without_clock(&over_tls),
                dlock_without_clock(&over_tcp),
            )
        } else {
            (over_tls, over_tcp)
        };
        assert_eq!(
            String::from_utf8_lossy(&over_tls),
            String::from_utf8_lossy(&over_tcp),
            "{what}: replies over TLS and over plain TCP differ"
        );
    }
}

#[test]
fn requests_before_a_close_notify_are_all_answered_even_when_parsing_waits() {
    // The close_notify comes in the same read as the requests before it, while parsing waits (a
    // lock table dump under way, the limit of operations in flight): the requests are answered
    // first, as those before a plain client's EOF are.
    let pki = Pki::new("tls-close-notify-behind");
    let tls = tls_daemon(&pki, &[]);
    let plain = Daemon::start(&[]);
    let mut lockd = lockd_frame(ACQ, b"held\0");
    lockd.extend_from_slice(&lockd_frame(SYNC, b""));
    for i in 0..300u32 {
        lockd.extend_from_slice(&lockd_frame(PING, &i.to_be_bytes()));
    }
    let mut memcache = b"set k 0 0 1\r\nv\r\n".to_vec();
    memcache.extend_from_slice(&b"get k\r\n".repeat(5000));
    let mut dlock = Vec::new();
    for i in 0..3000 {
        dlock.extend_from_slice(&dlock_frame(i, req_type::PING, None));
    }
    let cases: [(&str, Listener, Vec<u8>); 3] = [
        ("lockd", |d| d.lockd, lockd),
        ("memcache", |d| d.memcache, memcache),
        ("dlock", |d| d.dlock, dlock),
    ];
    for (what, addr, script) in cases {
        let mut over_tls = exchange_tls(addr(&tls).unwrap(), pki.client(), &script);
        let mut over_tcp = exchange_plain(addr(&plain).unwrap(), &script);
        if what == "dlock" {
            over_tls = dlock_without_clock(&over_tls);
            over_tcp = dlock_without_clock(&over_tcp);
        }
        assert_eq!(over_tls.len(), over_tcp.len(), "{what}: reply bytes");
        assert!(over_tls == over_tcp, "{what}: the replies differ");
    }
}

#[test]
fn a_notls_listener_stays_plain_while_the_others_speak_tls() {
    let pki = Pki::new("tls-notls");
    let d = tls_daemon(&pki, &["--lockd", "notls:127.0.0.1:0"]);
    // lockd: plain TCP.
    let mut c = d.lockd();
    c.expect(&lockd_frame(PING, b"hi"), &lockd_frame(131, b"hi"));
    // The others: TLS, and a plaintext client is refused there.
    let mut t = Tls::connect(d.memcache.unwrap(), pki.client());
    t.expect(b"set k 0 0 1\r\nv\r\n", b"STORED\r\n");
    let mut plain = TcpStream::connect(d.memcache.unwrap()).unwrap();
    plain.write_all(b"get k\r\n").unwrap();
    let got = received_until_closed(&mut plain, PROMPTLY).expect("closed at once");
    assert!(!got.windows(5).any(|w| w == b"VALUE"));
    // A TLS client on the plain listener gets no handshake.
    assert!(
        Tls::try_connect_within(d.lockd.unwrap(), pki.client(), Duration::from_millis(300))
            .is_err()
    );
    for addr in [d.dlock.unwrap(), d.counter.unwrap()] {
        assert!(
            Tls::try_connect(addr, pki.client()).is_ok(),
            "{addr} is TLS"
        );
    }
}

/// Whether a TLS client with `config` gets a memcached reply (in TLS 1.3 the client's own
/// handshake ends before the server has checked its certificate: a refusal shows as an alert or a
/// close at the first read).
fn served(addr: SocketAddr, config: Arc<ClientConfig>) -> bool {
    let Ok(mut t) = Tls::try_connect(addr, config) else {
        return false;
    };
    if t.try_send(b"version\r\n").is_err() {
        return false;
    }
    matches!(t.try_fill(9), Ok(true)) && t.pending.starts_with(b"VERSION ")
}

#[test]
fn mutual_tls_serves_only_clients_with_a_certificate_of_the_client_ca() {
    let pki = Pki::new("tls-mutual");
    let d = tls_daemon(&pki, &["--tls-client-ca", &path_str(&pki.ca_pem)]);
    let addr = d.memcache.unwrap();
    let good = pki.ca.issue(&pki.dir, "client", &["client.test"]);
    let foreign_ca = Ca::new("another CA");
    let foreign = foreign_ca.issue(&pki.dir, "foreign", &["client.test"]);

    assert!(!served(addr, pki.client()), "no client certificate");
    assert!(
        !served(addr, pki.client_with(&foreign)),
        "a certificate of a foreign CA"
    );
    assert!(
        served(addr, pki.client_with(&good)),
        "the right certificate"
    );
    // Refused handshakes count and uncount: the daemon is left with one connection, ours.
    let mut t = Tls::connect(addr, pki.client_with(&good));
    wait_until("the refused connections are gone", || {
        stat(&mut t, "curr_connections") == 1
    });
    // Every protocol asks for the certificate.
    for addr in [d.lockd.unwrap(), d.dlock.unwrap(), d.counter.unwrap()] {
        if let Ok(mut t) = Tls::try_connect(addr, pki.client()) {
            assert!(
                t.closed_within(PROMPTLY),
                "{addr}: served without a certificate"
            );
        }
    }
}

// ---- locks and connection lifetimes over TLS ----

#[test]
fn locks_held_over_tls_are_released_when_the_tls_connection_closes() {
    let pki = Pki::new("tls-release");
    let d = tls_daemon(&pki, &["--orphan-timeout", "0"]);

    // dlock: a waiter is granted as soon as the holder's TLS connection goes.
    let mut holder = Tls::connect(d.dlock.unwrap(), pki.client());
    holder.send(&dlock_lock(1, &[b"key"], None));
    expect_dlock(&mut holder, 1, status::OK);
    let mut waiter = Tls::connect(d.dlock.unwrap(), pki.client());
    waiter.send(&dlock_lock(2, &[b"key"], Some(10_000_000)));
    drop(holder);
    expect_dlock(&mut waiter, 2, status::OK);

    // A close_notify alone, with the socket still open, is a close too.
    let mut holder = Tls::connect(d.dlock.unwrap(), pki.client());
    holder.send(&dlock_lock(3, &[b"k2"], None));
    expect_dlock(&mut holder, 3, status::OK);
    let mut waiter = Tls::connect(d.dlock.unwrap(), pki.client());
    waiter.send(&dlock_lock(4, &[b"k2"], Some(10_000_000)));
    holder.conn.send_close_notify();
    holder.flush_tls().unwrap();
    expect_dlock(&mut waiter, 4, status::OK);
    drop(holder);

    // lockd (orphans released at once): a queued ACQ is granted.
    let mut holder = Tls::connect(d.lockd.unwrap(), pki.client());
    holder.expect(&lockd_frame(ACQ, b"n\0"), &lockd_frame(ACQUIRED, b"n\0"));
    let mut waiter = Tls::connect(d.lockd.unwrap(), pki.client());
    waiter.expect(&lockd_frame(ACQ, b"n\0"), &lockd_frame(ACK, b"n\0"));
    drop(holder);
    assert_eq!(waiter.take(6), lockd_frame(ACQUIRED, b"n\0"));

    // memcached: the item's lock goes with its holder.
    let mut holder = Tls::connect(d.memcache.unwrap(), pki.client());
    holder.expect(b"set item 0 0 1\r\nv\r\n", b"STORED\r\n");
    holder.expect(b"lock item\r\n", b"OK\r\n");
    let mut other = Tls::connect(d.memcache.unwrap(), pki.client());
    other.expect(b"lock item\r\n", b"LOCKED\r\n");
    drop(holder);
    wait_until("the item's lock is released", || {
        other.send(b"lock item\r\n");
        other.line() == "OK\r\n"
    });

    // counter: the resources go back.
    let acquire = |opaque: u32| {
        let mut body = Vec::new();
        ct::acquire_body(&mut body, 1, 1, b"sem");
        let mut req = Vec::new();
        ct::encode_request(&mut req, ct::op::ACQUIRE, opaque, &body);
        req
    };
    let counter_status = |t: &mut Tls, req: &[u8]| {
        t.send(req);
        let h = t.take(ct::HEADER_LEN);
        let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
        t.take(len);
        h[2]
    };
    let mut holder = Tls::connect(d.counter.unwrap(), pki.client());
    assert_eq!(counter_status(&mut holder, &acquire(1)), ct::status::OK);
    let mut other = Tls::connect(d.counter.unwrap(), pki.client());
    assert_eq!(
        counter_status(&mut other, &acquire(2)),
        ct::status::NOT_AVAILABLE
    );
    drop(holder);
    wait_until("the counter's resource is released", || {
        counter_status(&mut other, &acquire(3)) == ct::status::OK
    });
}

fn expect_dlock(t: &mut Tls, id: u64, want: u32) {
    t.fill(4);
    let len = u32::from_be_bytes(t.pending[..4].try_into().unwrap()) as usize;
    let frame = t.take(4 + len);
    let r = dl::decode_response(&frame[4..]).expect("a Response");
    assert_eq!(
        (r.request_id, r.status),
        (Some(id), Some(want)),
        "dlock response {r:?}"
    );
}

#[test]
fn a_dlock_client_that_sends_close_notify_while_its_lock_waits_lets_its_locks_go() {
    // On plain TCP an EOF cancels a Lock waiting without a deadline, so that the connection can
    // close and free what it holds; a TLS client's close_notify is the same end of its requests.
    let pki = Pki::new("tls-close-notify-wait");
    let d = tls_daemon(&pki, &[]);
    let addr = d.dlock.unwrap();
    let mut a = Tls::connect(addr, pki.client());
    let mut b = Tls::connect(addr, pki.client());
    a.send(&dlock_lock(1, &[b"x"], None));
    expect_dlock(&mut a, 1, status::OK);
    b.send(&dlock_lock(2, &[b"y"], None));
    expect_dlock(&mut b, 2, status::OK);
    // a waits for y (forever), then is done.
    a.send(&dlock_lock(3, &[b"y"], None));
    a.conn.send_close_notify();
    a.flush_tls().unwrap();
    // x must come free.
    let mut c = Tls::connect(addr, pki.client());
    c.send(&dlock_lock(4, &[b"x"], Some(5_000_000)));
    expect_dlock(&mut c, 4, status::OK);
    assert!(a.closed_within(DEADLINE), "a's connection closes");
}

// ---- sizes and pipelines: the TLS send buffer and backpressure ----

#[test]
fn a_large_value_and_a_deep_pipeline_are_answered_whole_and_in_order_over_tls() {
    let _serial = serial();
    let pki = Pki::new("tls-large");
    let d = tls_daemon(&pki, &[]);
    let addr = d.memcache.unwrap();
    let value: Vec<u8> = (0..1_000_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let mut t = Tls::connect(addr, pki.client());
    let mut set = format!("set big 0 0 {}\r\n", value.len()).into_bytes();
    set.extend_from_slice(&value);
    set.extend_from_slice(b"\r\n");
    t.expect(&set, b"STORED\r\n");
    let header = format!("VALUE big 0 {}\r\n", value.len());
    t.send(b"get big\r\n");
    assert_eq!(t.line(), header);
    assert_eq!(t.take(value.len()), value);
    assert_eq!(t.take(7), b"\r\nEND\r\n");

    // Many whole values in one pipeline: far more than the TLS send buffer and the write
    // buffer's high-water mark, so the daemon stops parsing and resumes as the client reads.
    let gets = 40;
    let mut t = Tls::connect(addr, pki.client());
    let writer = t.send_in_background(&b"get big\r\n".repeat(gets));
    for i in 0..gets {
        assert_eq!(t.line(), header, "reply {i}");
        assert_eq!(t.take(value.len()), value, "value {i}");
        assert_eq!(t.take(7), b"\r\nEND\r\n");
    }
    writer.join().unwrap().expect("pipeline written");

    // Thousands of small requests in one write, each answered in order.
    let n = 20_000;
    let mut script = Vec::new();
    for i in 0..n {
        script.extend_from_slice(
            format!("set k{i} 0 0 {}\r\n{i}\r\n", i.to_string().len()).as_bytes(),
        );
        script.extend_from_slice(format!("get k{i}\r\n").as_bytes());
    }
    let mut t = Tls::connect(addr, pki.client());
    let writer = t.send_in_background(&script);
    for i in 0..n {
        assert_eq!(t.line(), "STORED\r\n", "set {i}");
        assert_eq!(
            t.line(),
            format!("VALUE k{i} 0 {}\r\n", i.to_string().len())
        );
        assert_eq!(t.line(), format!("{i}\r\n"));
        assert_eq!(t.line(), "END\r\n");
    }
    writer.join().unwrap().expect("pipeline written");
}

#[test]
fn replies_queued_before_a_close_are_written_whole_over_tls() {
    // A client that ends its requests (quit, close_notify, a half-close) while the end of a large
    // reply is still inside the daemon receives every byte: the connection closes only once
    // rustls has written its last records, not when the write buffer has moved into rustls.
    // Where the reply's end waits (the write buffer, rustls's up to 256 KiB, the kernel's send
    // buffer of a few MiB) depends on how far the client has read: the client stops at several
    // distances from the end, so that one of them has the end inside rustls.
    let _serial = serial();
    let pki = Pki::new("tls-close-drain");
    let d = tls_daemon(&pki, &[]);
    let addr = d.memcache.unwrap();
    let value: Vec<u8> = (0..1_000_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let mut t = Tls::connect(addr, pki.client());
    let mut set = format!("set big 0 0 {}\r\n", value.len()).into_bytes();
    set.extend_from_slice(&value);
    set.extend_from_slice(b"\r\n");
    t.expect(&set, b"STORED\r\n");
    drop(t);
    let copies = 6;
    let mut expected = Vec::new();
    for _ in 0..copies {
        expected.extend_from_slice(format!("VALUE big 0 {}\r\n", value.len()).as_bytes());
        expected.extend_from_slice(&value);
        expected.extend_from_slice(b"\r\n");
    }
    expected.extend_from_slice(b"END\r\n");
    let request = format!("get{}\r\n", " big".repeat(copies));
    let endings = ["quit", "close_notify", "half-close"];
    for (i, left) in (128 * 1024..5 * 1024 * 1024)
        .step_by(128 * 1024)
        .enumerate()
    {
        let ending = endings[i % endings.len()];
        // A fixed receive buffer (no autotuning): little of the reply waits on the client's side.
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        socket.set_recv_buffer_size(64 * 1024).expect("SO_RCVBUF");
        socket.connect(&addr.into()).expect("connect");
        let mut t = Tls::over(socket.into(), pki.client());
        t.send(request.as_bytes());
        t.fill(expected.len() - left);
        // The daemon fills what it can while the client is not reading.
        thread::sleep(Duration::from_millis(30));
        match ending {
            "quit" => t.send(b"quit\r\n"),
            "close_notify" => {
                t.conn.send_close_notify();
                t.flush_tls().unwrap();
            }
            _ => {
                t.conn.send_close_notify();
                t.flush_tls().unwrap();
                t.tcp.shutdown(Shutdown::Write).unwrap();
            }
        }
        thread::sleep(Duration::from_millis(30));
        let (got, clean) = t.read_to_close();
        assert_eq!(
            got.len(),
            expected.len(),
            "{ending} with {left} bytes unread: bytes received"
        );
        assert!(got == expected, "{ending}: the reply differs");
        assert!(clean, "{ending}: the daemon closed without close_notify");
    }
}

#[test]
fn a_closing_tls_client_that_stops_reading_is_closed_by_the_stall_timeout() {
    // The end of its reply waits inside rustls (and the kernel) while the client reads nothing:
    // the stall timeout closes the connection, wherever the end of the reply is.
    let _serial = serial();
    let pki = Pki::new("tls-close-stall");
    let d = tls_daemon(&pki, &["--client-stall-timeout", "300"]);
    let addr = d.memcache.unwrap();
    let value = vec![b's'; 1_000_000];
    let mut t = Tls::connect(addr, pki.client());
    let mut set = format!("set big 0 0 {}\r\n", value.len()).into_bytes();
    set.extend_from_slice(&value);
    set.extend_from_slice(b"\r\n");
    t.expect(&set, b"STORED\r\n");
    let copies = 6;
    let reply_len = copies * (value.len() + "VALUE big 0 1000000\r\n\r\n".len()) + 5;
    let request = format!("get{}\r\n", " big".repeat(copies));
    for left in (1024 * 1024..5 * 1024 * 1024).step_by(192 * 1024) {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        socket.set_recv_buffer_size(64 * 1024).expect("SO_RCVBUF");
        socket.connect(&addr.into()).expect("connect");
        let mut c = Tls::over(socket.into(), pki.client());
        c.send(request.as_bytes());
        c.fill(reply_len - left);
        thread::sleep(Duration::from_millis(30));
        c.send(b"quit\r\n");
        // Not another byte read: the daemon gives up on the connection.
        wait_until("the stalled connection is closed", || {
            stat(&mut t, "curr_connections") == 1
        });
    }
}

// ---- certificates: reloads and refused key files ----

/// A daemon whose stderr the test reads (every line also goes to the test's own stderr).
struct Logged {
    daemon: holdfast_testkit::Daemon,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Logged {
    fn start(args: &[String]) -> Logged {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_holdfast"));
        cmd.args(args).stderr(Stdio::piped());
        let mut daemon = holdfast_testkit::Daemon::spawn(&mut cmd, &["memcache"], DEADLINE)
            .unwrap_or_else(|e| panic!("start holdfast {args:?}: {e}"));
        let stderr = daemon.take_stderr().expect("stderr piped");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                eprintln!("{line}");
                sink.lock().unwrap().push(line);
            }
        });
        Logged { daemon, lines }
    }

    fn memcache(&self) -> SocketAddr {
        self.daemon.addr("memcache").expect("memcache listener")
    }

    fn logged(&self, needle: &str) -> bool {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains(needle))
    }

    fn sighup(&self) {
        // SAFETY: kill(2) on the PID of our own child, which has not been reaped.
        let rc = unsafe { libc::kill(self.daemon.pid() as libc::pid_t, libc::SIGHUP) };
        assert_eq!(rc, 0, "SIGHUP");
    }
}

fn memcache_only(pki: &Pki) -> Vec<String> {
    let mut args: Vec<String> = [
        "--memcache",
        "127.0.0.1:0",
        "--lockd",
        "off",
        "--dlock",
        "off",
        "--counter",
        "off",
        "--admin",
        "off",
        "--threads",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(common::test_threads());
    args.extend(pki.flags());
    args
}

fn cert_der(path: &Path) -> Vec<u8> {
    holdfast::tls::read_certs(path).expect("certificate")[0].to_vec()
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[test]
fn sighup_serves_a_new_certificate_to_new_connections_and_keeps_open_ones() {
    let pki = Pki::new("tls-reload");
    let d = Logged::start(&memcache_only(&pki));
    let addr = d.memcache();
    let first = cert_der(&pki.server.cert);
    let mut open = Tls::connect(addr, pki.client());
    assert_eq!(open.peer_cert(), first);
    open.expect(b"set k 0 0 1\r\n1\r\n", b"STORED\r\n");

    // A new certificate in the same files.
    let renewed = pki
        .ca
        .issue(&pki.dir, "server", &["127.0.0.1", "localhost"]);
    let second = cert_der(&renewed.cert);
    assert_ne!(first, second);
    d.sighup();
    wait_until("a new connection sees the new certificate", || {
        Tls::connect(addr, pki.client()).peer_cert() == second
    });
    // The connection opened before keeps its session.
    open.expect(b"get k\r\n", b"VALUE k 0 1\r\n1\r\nEND\r\n");

    // A key file others can read: the reload keeps the certificate in force, and says why.
    let third = pki
        .ca
        .issue(&pki.dir, "server", &["127.0.0.1", "localhost"]);
    chmod(&third.key, 0o644);
    d.sighup();
    wait_until("the daemon logs why it kept the certificate", || {
        d.logged("TLS certificate kept")
    });
    assert!(
        d.logged("0644"),
        "the log line names the mode: {:?}",
        d.lines.lock().unwrap()
    );
    let mut t = Tls::connect(addr, pki.client());
    assert_eq!(t.peer_cert(), second, "the certificate in force stays");
    t.expect(b"get k\r\n", b"VALUE k 0 1\r\n1\r\nEND\r\n");
    open.expect(b"version\r\n", holdfast::server::VERSION_REPLY);

    // Made private again, the key loads at the next SIGHUP.
    chmod(&third.key, 0o600);
    d.sighup();
    let third = cert_der(&third.cert);
    wait_until("a new connection sees the third certificate", || {
        Tls::connect(addr, pki.client()).peer_cert() == third
    });
    open.expect(b"get k\r\n", b"VALUE k 0 1\r\n1\r\nEND\r\n");
}

#[test]
fn a_key_file_others_can_read_is_refused_at_start_with_exit_status_2_and_one_line() {
    let pki = Pki::new("tls-key-mode");
    chmod(&pki.server.key, 0o644);
    let out = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(memcache_only(&pki))
        .stdin(Stdio::null())
        .output()
        .expect("run holdfast");
    assert_eq!(out.status.code(), Some(2), "exit status");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {stderr:?}");
    assert!(
        lines[0].contains(&path_str(&pki.server.key)) && lines[0].contains("0644"),
        "{}",
        lines[0]
    );
    assert!(out.stdout.is_empty(), "no listener was opened");
}

// ---- hostile input on a TLS port ----

#[test]
fn plaintext_on_a_tls_port_is_closed_and_nothing_is_parsed() {
    let pki = Pki::new("tls-plaintext");
    let d = tls_daemon(&pki, &[]);
    let addr = d.memcache.unwrap();
    for request in [
        &b"get a\r\n"[..],
        b"set planted 0 0 5\r\nvalue\r\n",
        b"set planted 0 0 5 noreply\r\nvalue\r\n",
    ] {
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(request).unwrap();
        let got = received_until_closed(&mut c, PROMPTLY).expect("closed at once");
        for reply in [&b"END"[..], b"STORED", b"ERROR", b"VALUE"] {
            assert!(
                !got.windows(reply.len()).any(|w| w == reply),
                "a plaintext reply to {request:?}: {got:?}"
            );
        }
    }
    // Nothing was stored.
    let mut t = Tls::connect(addr, pki.client());
    t.expect(b"get planted\r\n", b"END\r\n");
    // Plain old-protocol and dlock frames too.
    for (addr, bytes) in [
        (d.lockd.unwrap(), lockd_frame(ACQ, b"planted\0")),
        (d.dlock.unwrap(), dlock_lock(1, &[b"planted"], None)),
    ] {
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(&bytes).unwrap();
        assert!(
            closed_within(&mut c, PROMPTLY),
            "{addr}: plaintext waited for"
        );
    }
    let mut t = Tls::connect(d.lockd.unwrap(), pki.client());
    t.expect(
        &lockd_frame(TRY, b"planted\0"),
        &lockd_frame(ACQUIRED, b"planted\0"),
    );
    let mut t = Tls::connect(d.dlock.unwrap(), pki.client());
    t.send(&dlock_lock(2, &[b"planted"], Some(0)));
    expect_dlock(&mut t, 2, status::OK);
}

#[test]
fn garbage_on_a_tls_port_closes_that_connection_only() {
    let pki = Pki::new("tls-garbage");
    let d = tls_daemon(&pki, &[]);
    let addr = d.memcache.unwrap();
    let mut kept = Tls::connect(addr, pki.client());
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..50 {
        let len = 1 + (next() % 3000) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        let mut tcp = TcpStream::connect(addr).unwrap();
        // A write may fail once the daemon has closed: only the close matters.
        let _ = tcp.write_all(&bytes);
        let _ = tcp.shutdown(Shutdown::Write);
        assert!(
            closed_within(&mut tcp, PROMPTLY),
            "round {round}: {len} garbage bytes left the connection open"
        );
    }
    kept.expect(b"version\r\n", holdfast::server::VERSION_REPLY);
    wait_until("the garbage connections are uncounted", || {
        stat(&mut kept, "curr_connections") == 1
    });
}

#[test]
fn a_truncated_client_hello_is_closed_by_the_handshake_timeout_while_others_are_served() {
    let pki = Pki::new("tls-truncated");
    let d = tls_daemon(&pki, &["--tls-handshake-timeout", "300"]);
    let addr = d.memcache.unwrap();
    let hello = client_hello(&pki);
    let mut staller = TcpStream::connect(addr).unwrap();
    staller.write_all(&hello[..hello.len() / 2]).unwrap();
    let started = Instant::now();
    // Meanwhile others are served.
    let mut t = Tls::connect(addr, pki.client());
    t.expect(b"version\r\n", holdfast::server::VERSION_REPLY);
    assert!(closed_within(&mut staller, DEADLINE), "the staller stays");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250),
        "closed after {took:?}, before the timeout"
    );
    // A client that sends nothing at all goes the same way.
    let mut silent = TcpStream::connect(addr).unwrap();
    assert!(closed_within(&mut silent, DEADLINE));
    // The established connection is not subject to the handshake timeout.
    thread::sleep(Duration::from_millis(400));
    t.expect(b"version\r\n", holdfast::server::VERSION_REPLY);
    assert_eq!(stat(&mut t, "curr_connections"), 1);
}

#[test]
fn an_oversized_handshake_is_closed_and_memory_stays_bounded() {
    let _serial = serial();
    let pki = Pki::new("tls-oversized");
    let d = tls_daemon(&pki, &[]);
    let addr = d.memcache.unwrap();
    let rss_before = d.rss_kib();
    // A record header claiming more than any record may hold (16 KiB of plaintext, plus 2 KiB of
    // expansion for a protected one): refused on the header alone.
    for claimed in [0x4801u16, 0xffff] {
        let mut tcp = TcpStream::connect(addr).unwrap();
        let mut header = vec![0x16, 0x03, 0x01];
        header.extend_from_slice(&claimed.to_be_bytes());
        let _ = tcp.write_all(&header);
        let _ = tcp.write_all(&[0u8; 1024]);
        assert!(
            closed_within(&mut tcp, PROMPTLY),
            "a record of {claimed} bytes was waited for"
        );
    }
    // A whole plaintext record of 16 KiB + 1.
    let mut tcp = TcpStream::connect(addr).unwrap();
    let mut record = vec![
        0x16, 0x03, 0x01, 0x40, 0x01, 0x01, 0x00, 0x3f, 0xfd, 0x03, 0x03,
    ];
    record.resize(5 + 0x4001, 0);
    let _ = tcp.write_all(&record);
    assert!(closed_within(&mut tcp, PROMPTLY), "a 16 KiB + 1 record");
    // A ClientHello whose handshake header claims 16 MiB, sent as full records: the daemon closes
    // the connection long before it would have buffered the message.
    let mut clients = Vec::new();
    for _ in 0..50 {
        let mut tcp = TcpStream::connect(addr).unwrap();
        tcp.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut first = vec![0x01, 0xff, 0xff, 0xff];
        first.extend_from_slice(&[0x03, 0x03]);
        first.resize(16384, 0x41);
        let mut sent = 0;
        for i in 0..64 {
            let body = if i == 0 {
                first.clone()
            } else {
                vec![0x41; 16384]
            };
            let mut record = vec![0x16, 0x03, 0x03];
            record.extend_from_slice(&(body.len() as u16).to_be_bytes());
            record.extend_from_slice(&body);
            if tcp.write_all(&record).is_err() {
                break;
            }
            sent += record.len();
        }
        clients.push((tcp, sent));
    }
    for (tcp, sent) in clients.iter_mut() {
        assert!(
            closed_within(tcp, PROMPTLY),
            "a 16 MiB handshake message left open after {sent} bytes"
        );
    }
    let mut t = Tls::connect(addr, pki.client());
    t.expect(b"version\r\n", holdfast::server::VERSION_REPLY);
    let grown = d.rss_kib().saturating_sub(rss_before);
    assert!(grown < 32 * 1024, "the daemon grew by {grown} KiB");
    assert_eq!(stat(&mut t, "curr_connections"), 1);
}

#[test]
fn two_thousand_clients_stalled_in_the_handshake_do_not_stop_the_others() {
    let _serial = serial();
    let pki = Pki::new("tls-stallers");
    let d = tls_daemon(
        &pki,
        &[
            "--tls-handshake-timeout",
            "3000",
            "--lockd",
            "notls:127.0.0.1:0",
        ],
    );
    let addr = d.memcache.unwrap();
    let hello = client_hello(&pki);
    let fds_before = d.open_fds();
    let mut stallers = Vec::new();
    for i in 0..2000 {
        let mut tcp = TcpStream::connect(addr).expect("connect a staller");
        // Half of them send part of a ClientHello, the others nothing.
        if i % 2 == 0 {
            tcp.write_all(&hello[..hello.len() / 3]).unwrap();
        }
        stallers.push(tcp);
    }
    let started = Instant::now();
    wait_until("the daemon holds the stallers", || {
        d.open_fds() >= fds_before + 1900
    });
    // Served promptly, TLS and plain.
    let t0 = Instant::now();
    let mut t = Tls::connect(addr, pki.client());
    t.expect(b"version\r\n", holdfast::server::VERSION_REPLY);
    let mut plain = d.lockd();
    plain.expect(&lockd_frame(PING, b"p"), &lockd_frame(131, b"p"));
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(2), "served after {took:?}");
    assert!(stat(&mut t, "curr_connections") >= 2000);
    // The timeout closes every staller.
    for (i, s) in stallers.iter_mut().enumerate() {
        assert!(closed_within(s, DEADLINE), "staller {i} still open");
    }
    assert!(started.elapsed() >= Duration::from_millis(2500));
    wait_until("the stallers' descriptors are closed", || {
        d.open_fds() <= fds_before + 2
    });
    assert_eq!(stat(&mut t, "curr_connections"), 2);
}

#[test]
fn handshakes_count_toward_max_connections_and_failed_ones_are_uncounted() {
    let _serial = serial();
    let pki = Pki::new("tls-maxconn");
    let d = tls_daemon(
        &pki,
        &[
            "--max-connections",
            "100",
            "--tls-handshake-timeout",
            "3000",
        ],
    );
    let addr = d.memcache.unwrap();
    let started = Instant::now();
    let mut stallers: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    // The extra ones are closed at once; the first hundred wait for the timeout.
    thread::sleep(Duration::from_millis(500));
    let refused = stallers.iter().filter(|s| closed_now(s)).count();
    assert_eq!(refused, 100, "stallers closed at once");
    // The limit holds for TLS clients too while the stallers are there.
    let mut tcp = TcpStream::connect(addr).unwrap();
    assert!(closed_within(&mut tcp, Duration::from_millis(500)));
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "the checks ran within the handshake timeout"
    );
    // After the timeout every slot is free again.
    for s in stallers.iter_mut() {
        assert!(closed_within(s, DEADLINE));
    }
    drop(stallers);
    let mut t = Tls::connect(addr, pki.client());
    assert_eq!(stat(&mut t, "curr_connections"), 1);
    // Failed handshakes of every kind give their slot back: many more of them than the limit.
    let hello = client_hello(&pki);
    let foreign = Pki::new("tls-maxconn-foreign");
    for i in 0..150 {
        match i % 3 {
            0 => {
                let mut c = TcpStream::connect(addr).unwrap();
                let _ = c.write_all(b"get a\r\n");
                assert!(closed_within(&mut c, DEADLINE));
            }
            1 => {
                let mut c = TcpStream::connect(addr).unwrap();
                let _ = c.write_all(&hello[..20]);
                drop(c);
            }
            _ => {
                // A client that does not trust the daemon's certificate aborts the handshake.
                assert!(Tls::try_connect(addr, foreign.client()).is_err());
            }
        }
    }
    wait_until("every failed handshake is uncounted", || {
        stat(&mut t, "curr_connections") == 1
    });
    let mut more: Vec<Tls> = (0..98).map(|_| Tls::connect(addr, pki.client())).collect();
    more[97].expect(b"version\r\n", holdfast::server::VERSION_REPLY);
    assert_eq!(stat(&mut t, "curr_connections"), 99);
}

#[test]
fn a_tls_byte_stream_split_at_every_byte_is_answered() {
    let pki = Pki::new("tls-bytewise");
    let d = tls_daemon(&pki, &[]);
    for (addr, request, reply) in [
        (
            d.memcache.unwrap(),
            b"set k 0 0 5\r\nhello\r\nget k\r\n".to_vec(),
            b"STORED\r\nVALUE k 0 5\r\nhello\r\nEND\r\n".to_vec(),
        ),
        (
            d.lockd.unwrap(),
            lockd_frame(PING, b"bytewise"),
            lockd_frame(131, b"bytewise"),
        ),
    ] {
        let mut tcp = TcpStream::connect(addr).unwrap();
        tcp.set_nodelay(true).unwrap();
        let mut conn = rustls::ClientConnection::new(pki.client(), server_name()).unwrap();
        // Written before the handshake: rustls sends it right after its Finished.
        conn.writer().write_all(&request).unwrap();
        let mut got = Vec::new();
        let mut sent = 0;
        let deadline = Instant::now() + DEADLINE;
        let mut buf = vec![0u8; 65536];
        while got.len() < reply.len() {
            assert!(Instant::now() < deadline, "no reply; have {got:?}");
            let mut out = Vec::new();
            while conn.wants_write() {
                conn.write_tls(&mut out).unwrap();
            }
            for b in &out {
                tcp.write_all(std::slice::from_ref(b)).unwrap();
                thread::sleep(Duration::from_micros(200));
            }
            sent += out.len();
            tcp.set_read_timeout(Some(Duration::from_millis(50)))
                .unwrap();
            match conn.read_tls(&mut tcp) {
                Ok(0) => panic!("closed after {sent} bytes sent"),
                Ok(_) => {
                    conn.process_new_packets().expect("valid records");
                }
                Err(e) if is_timeout(&e) => {}
                Err(e) => panic!("{e}"),
            }
            loop {
                match conn.reader().read(&mut buf) {
                    Ok(0) => panic!("close_notify before the reply"),
                    Ok(k) => got.extend_from_slice(&buf[..k]),
                    Err(_) => break,
                }
            }
        }
        assert!(sent > 200, "the whole handshake went byte by byte ({sent})");
        assert_eq!(got, reply);
    }
}
