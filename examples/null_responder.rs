//! A do-nothing memcached-text responder: the ceiling of a load on this machine (`make bench`'s
//! "vs a do-nothing responder" row). One thread, one epoll loop; it keeps no state, answers a
//! `set` (its data block swallowed) with `STORED` and every other line with `OK`, so that
//! `holdfast-bench --protocol memcache-text --workload lock` accepts every reply. Whatever rate
//! it reaches is what the client, the kernel and loopback allow; a server can only approach it.
//!
//! usage: null_responder ADDR   (prints "null_responder listening on ADDR"; stops on SIGTERM)

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

const LISTENER: Token = Token(usize::MAX);
/// Longest request line it waits for before dropping the connection (the bench sends short ones).
const MAX_LINE: usize = 4096;

struct Conn {
    stream: TcpStream,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    /// Bytes of a `set` data block (and its CRLF) still to skip.
    skip: usize,
}

impl Conn {
    /// Answer every complete line in `rbuf`; false if the connection must be dropped.
    fn answer(&mut self) -> bool {
        let mut at = 0;
        loop {
            if self.skip > 0 {
                let n = self.skip.min(self.rbuf.len() - at);
                self.skip -= n;
                at += n;
                if self.skip > 0 {
                    break;
                }
                continue;
            }
            let rest = &self.rbuf[at..];
            let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
                if rest.len() > MAX_LINE {
                    return false;
                }
                break;
            };
            let line = &rest[..nl];
            if line.starts_with(b"set ") {
                // set <key> <flags> <exptime> <bytes>: skip <bytes> + CRLF.
                let bytes = line
                    .split(|&b| b == b' ')
                    .nth(4)
                    .and_then(|b| std::str::from_utf8(b).ok())
                    .and_then(|b| b.trim_end().parse::<usize>().ok());
                let Some(bytes) = bytes else { return false };
                self.skip = bytes + 2;
                self.wbuf.extend_from_slice(b"STORED\r\n");
            } else {
                self.wbuf.extend_from_slice(b"OK\r\n");
            }
            at += nl + 1;
        }
        self.rbuf.drain(..at);
        true
    }

    /// Read until WouldBlock, answer, write until WouldBlock; false when the peer is gone.
    fn serve(&mut self) -> bool {
        let mut buf = [0u8; 65536];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => return false,
                Ok(n) => self.rbuf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        if !self.answer() {
            return false;
        }
        while !self.wbuf.is_empty() {
            match self.stream.write(&self.wbuf) {
                Ok(n) => {
                    self.wbuf.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        true
    }
}

fn main() -> std::io::Result<()> {
    let addr: SocketAddr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:0".into())
        .parse()
        .map_err(|e| std::io::Error::new(ErrorKind::InvalidInput, format!("ADDR: {e}")))?;
    let mut poll = Poll::new()?;
    let mut listener = TcpListener::bind(addr)?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    println!("null_responder listening on {}", listener.local_addr()?);
    let mut conns: HashMap<usize, Conn> = HashMap::new();
    let mut next = 0usize;
    let mut events = Events::with_capacity(1024);
    loop {
        poll.poll(&mut events, None)?;
        for ev in events.iter() {
            if ev.token() == LISTENER {
                while let Ok((mut stream, _)) = listener.accept() {
                    let _ = stream.set_nodelay(true);
                    let t = Token(next);
                    poll.registry().register(
                        &mut stream,
                        t,
                        Interest::READABLE | Interest::WRITABLE,
                    )?;
                    let conn = Conn {
                        stream,
                        rbuf: Vec::new(),
                        wbuf: Vec::new(),
                        skip: 0,
                    };
                    conns.insert(next, conn);
                    next += 1;
                }
                continue;
            }
            let id = ev.token().0;
            let alive = conns.get_mut(&id).is_some_and(Conn::serve);
            if !alive {
                if let Some(mut c) = conns.remove(&id) {
                    let _ = poll.registry().deregister(&mut c.stream);
                }
            }
        }
    }
}
