//! A fault-injecting TCP proxy for the peer links of a cluster on loopback (std only, threads).
//!
//! Owns one listener per directed pair of nodes (i -> j) and the connections through it; it
//! must not look into what it forwards. holdfast's peer transport sends from node i to node j
//! only on i's own outbound connection to the address that i's `--peers` gives for j (inbound
//! connections only receive), so starting node i with [`Mesh::peers_for`] (its own entry real,
//! every other entry the port of proxy(i -> j)) lets the proxies cut each direction alone:
//! symmetric and one-way partitions without any change to the daemon.
//!
//! Modes, switchable at run time ([`Proxy::set`]):
//! - [`Mode::Pass`]: forward both ways.
//! - [`Mode::Drop`]: a blackhole: accept and read, discard everything, forward nothing. A
//!   connection that discarded bytes lost part of its stream, so it is closed when the proxy
//!   goes back to `Pass` (as a sender's TCP would give up on a long-silent peer) and the sender
//!   reconnects; a half-forwarded frame never reaches the peer.
//! - [`Mode::Refuse`]: close every connection, and accept new ones only to close them at once
//!   as a firewall's REJECT would.
//!
//! Shared by the soak (`tools/soak`) and by `tests/cluster.rs` (which includes this file with
//! `#[path]`, so there is one copy).
#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often idle proxy threads look at the mode and the stop flag: short against an election
/// timeout (300 ms in the tests), so a partition starts and ends within a heartbeat or two.
const POLL: Duration = Duration::from_millis(10);
/// Bytes read per call: peer frames are small (heartbeats, a few entries) but a snapshot is not.
const CHUNK: usize = 64 << 10;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    Pass = 0,
    Drop = 1,
    Refuse = 2,
}

impl Mode {
    fn from_u8(v: u8) -> Mode {
        match v {
            1 => Mode::Drop,
            2 => Mode::Refuse,
            _ => Mode::Pass,
        }
    }
}

/// State shared by a proxy's threads.
struct Shared {
    target: SocketAddr,
    mode: AtomicU8,
    stop: AtomicBool,
    /// Bytes forwarded and discarded (both directions), for reports.
    forwarded: AtomicU64,
    discarded: AtomicU64,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Shared {
    fn mode(&self) -> Mode {
        Mode::from_u8(self.mode.load(Ordering::Acquire))
    }
}

/// One directed link: a listener on 127.0.0.1 (port chosen by the kernel) forwarding to
/// `target`. Stopped (every thread joined) when dropped.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl Proxy {
    pub fn start(target: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target,
            mode: AtomicU8::new(Mode::Pass as u8),
            stop: AtomicBool::new(false),
            forwarded: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
            threads: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name(format!("proxy-{}", addr.port()))
            .stack_size(128 << 10)
            .spawn(move || accept_loop(listener, s))?;
        Ok(Proxy {
            addr,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// Where the sending node must connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn set(&self, mode: Mode) {
        self.shared.mode.store(mode as u8, Ordering::Release);
    }

    pub fn mode(&self) -> Mode {
        self.shared.mode()
    }

    /// (bytes forwarded, bytes discarded) so far.
    pub fn bytes(&self) -> (u64, u64) {
        (
            self.shared.forwarded.load(Ordering::Relaxed),
            self.shared.discarded.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let threads = std::mem::take(
            &mut *self
                .shared
                .threads
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for t in threads {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((inbound, _)) => {
                if shared.mode() == Mode::Refuse {
                    refuse(inbound);
                    continue;
                }
                let outbound =
                    match TcpStream::connect_timeout(&shared.target, Duration::from_secs(1)) {
                        Ok(s) => s,
                        // The target is down: the sender sees its connection closed, as it would.
                        Err(_) => {
                            refuse(inbound);
                            continue;
                        }
                    };
                let _ = inbound.set_nodelay(true);
                let _ = outbound.set_nodelay(true);
                let _ = inbound.set_nonblocking(false);
                start_pair(inbound, outbound, &shared);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(POLL),
            Err(_) => std::thread::sleep(POLL),
        }
        // Forget the threads that have ended.
        let mut t = shared.threads.lock().unwrap_or_else(|e| e.into_inner());
        let (done, running): (Vec<_>, Vec<_>) = t.drain(..).partition(|h| h.is_finished());
        *t = running;
        drop(t);
        for h in done {
            let _ = h.join();
        }
    }
}

/// Close at once.
fn refuse(s: TcpStream) {
    let _ = s.shutdown(Shutdown::Both);
}

fn start_pair(inbound: TcpStream, outbound: TcpStream, shared: &Arc<Shared>) {
    let (Ok(in2), Ok(out2)) = (inbound.try_clone(), outbound.try_clone()) else {
        return;
    };
    // Either direction ending ends the pair: the flag tells the other thread.
    let done = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for (from, to) in [(inbound, out2), (outbound, in2)] {
        let (s, d) = (shared.clone(), done.clone());
        if let Ok(h) = std::thread::Builder::new()
            .name("proxy-pipe".into())
            .stack_size(128 << 10)
            .spawn(move || pipe(from, to, &s, &d))
        {
            handles.push(h);
        }
    }
    shared
        .threads
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .extend(handles);
}

/// Copy `from` to `to` as the mode says, until either side closes, the pair is done, the
/// proxy stops, or the mode closes the connection.
fn pipe(mut from: TcpStream, mut to: TcpStream, shared: &Shared, done: &AtomicBool) {
    let _ = from.set_read_timeout(Some(POLL));
    let _ = to.set_write_timeout(Some(Duration::from_secs(5)));
    let mut buf = vec![0u8; CHUNK];
    // Whether this pipe has discarded bytes: its stream has a hole, so it never forwards again.
    let mut holed = false;
    loop {
        if shared.stop.load(Ordering::Acquire) || done.load(Ordering::Acquire) {
            break;
        }
        let mode = shared.mode();
        if mode == Mode::Refuse {
            break;
        }
        if mode == Mode::Pass && holed {
            break;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                // The mode now, not before the read: bytes read after a cut are not forwarded.
                match shared.mode() {
                    Mode::Pass if !holed => {
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        shared.forwarded.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    _ => {
                        holed = true;
                        shared.discarded.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => break,
        }
    }
    done.store(true, Ordering::Release);
    for s in [&from, &to] {
        let _ = s.shutdown(Shutdown::Both);
    }
}

/// The proxies of a whole cluster: `n` nodes (ids 1..=n) whose real peer addresses are
/// `real`, one proxy per ordered pair (i, j), i != j.
pub struct Mesh {
    real: Vec<SocketAddr>,
    /// `links[i-1][j-1]`: proxy(i -> j); `None` on the diagonal.
    links: Vec<Vec<Option<Proxy>>>,
}

impl Mesh {
    pub fn start(real: &[SocketAddr]) -> std::io::Result<Mesh> {
        let n = real.len();
        let mut links = Vec::with_capacity(n);
        for i in 0..n {
            let mut row = Vec::with_capacity(n);
            for (j, target) in real.iter().enumerate() {
                row.push(if i == j {
                    None
                } else {
                    Some(Proxy::start(*target)?)
                });
            }
            links.push(row);
        }
        Ok(Mesh {
            real: real.to_vec(),
            links,
        })
    }

    pub fn len(&self) -> usize {
        self.real.len()
    }

    /// `--peers` for node `id`: its own real address, every other node through its proxy.
    pub fn peers_for(&self, id: usize) -> String {
        (1..=self.len())
            .map(|j| {
                let addr = if j == id {
                    self.real[j - 1]
                } else {
                    self.link(id, j).addr()
                };
                format!("{j}={addr}")
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// proxy(from -> to).
    pub fn link(&self, from: usize, to: usize) -> &Proxy {
        self.links[from - 1][to - 1]
            .as_ref()
            .expect("no link from a node to itself")
    }

    /// Cut (or restore, with `Mode::Pass`) what `from` sends to `to`.
    pub fn set(&self, from: usize, to: usize, mode: Mode) {
        self.link(from, to).set(mode);
    }

    /// Cut node `x` off from every other node, both ways.
    pub fn isolate(&self, x: usize, mode: Mode) {
        for j in 1..=self.len() {
            if j != x {
                self.set(x, j, mode);
                self.set(j, x, mode);
            }
        }
    }

    /// Every link back to `Pass`.
    pub fn heal(&self) {
        for row in &self.links {
            for p in row.iter().flatten() {
                p.set(Mode::Pass);
            }
        }
    }

    /// Links not in `Pass` now, as "i->j:mode".
    pub fn cuts(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (i, row) in self.links.iter().enumerate() {
            for (j, p) in row.iter().enumerate() {
                if let Some(p) = p {
                    if p.mode() != Mode::Pass {
                        out.push(format!("{}->{}:{:?}", i + 1, j + 1, p.mode()));
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// An echo server on loopback: every connection gets its bytes back.
    fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut s = s;
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    /// What arrives within `wait`: Some(bytes) (possibly empty), or None once the proxy closed.
    fn read_for(s: &mut TcpStream, wait: Duration) -> Option<Vec<u8>> {
        let until = Instant::now() + wait;
        let mut got = Vec::new();
        while Instant::now() < until {
            s.set_read_timeout(Some(Duration::from_millis(20)))
                .expect("timeout");
            let mut buf = [0u8; 64];
            match s.read(&mut buf) {
                Ok(0) => return None,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => return None,
            }
        }
        Some(got)
    }

    #[test]
    fn pass_forwards_both_ways_and_drop_discards_then_closes_on_heal() {
        let p = Proxy::start(echo()).expect("proxy");
        let mut c = TcpStream::connect(p.addr()).expect("connect");
        c.write_all(b"one").expect("write");
        assert_eq!(
            read_for(&mut c, Duration::from_millis(300)),
            Some(b"one".to_vec())
        );
        p.set(Mode::Drop);
        c.write_all(b"two").expect("write");
        assert_eq!(
            read_for(&mut c, Duration::from_millis(300)),
            Some(Vec::new())
        );
        assert!(p.bytes().1 >= 3, "{:?}", p.bytes());
        // The stream has a hole: healed, the proxy closes it; a new connection passes.
        p.set(Mode::Pass);
        assert_eq!(read_for(&mut c, Duration::from_secs(2)), None);
        let mut c = TcpStream::connect(p.addr()).expect("connect");
        c.write_all(b"three").expect("write");
        assert_eq!(
            read_for(&mut c, Duration::from_millis(300)),
            Some(b"three".to_vec())
        );
    }

    #[test]
    fn refuse_closes_open_connections_and_new_ones() {
        let p = Proxy::start(echo()).expect("proxy");
        let mut c = TcpStream::connect(p.addr()).expect("connect");
        c.write_all(b"x").expect("write");
        assert_eq!(
            read_for(&mut c, Duration::from_millis(300)),
            Some(b"x".to_vec())
        );
        p.set(Mode::Refuse);
        assert_eq!(read_for(&mut c, Duration::from_secs(2)), None);
        let mut c = TcpStream::connect(p.addr()).expect("connect");
        assert_eq!(read_for(&mut c, Duration::from_secs(2)), None);
    }

    #[test]
    fn a_mesh_gives_each_node_its_own_address_and_proxies_for_the_others() {
        let real: Vec<SocketAddr> = (0..3).map(|_| echo()).collect();
        let m = Mesh::start(&real).expect("mesh");
        let peers = m.peers_for(2);
        let parts: Vec<&str> = peers.split(',').collect();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[1], format!("2={}", real[1]));
        assert_eq!(parts[0], format!("1={}", m.link(2, 1).addr()));
        assert_eq!(parts[2], format!("3={}", m.link(2, 3).addr()));
        m.isolate(2, Mode::Drop);
        assert_eq!(m.cuts().len(), 4);
        m.heal();
        assert!(m.cuts().is_empty());
    }
}
