//! One connection to one server, plain or TLS, shared by the threads that send on it and the
//! driver thread that reads it.
//!
//! Owns: the socket and, with TLS, the rustls session. Sends are whole frames under a mutex (two
//! threads' frames never interleave); only the driver reads. Must not: decode frames (the driver
//! does) or retry (a failed send or read means the connection is gone).

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rustls::ClientConfig;

/// How long one read waits for bytes before the driver looks at its timers.
pub const TICK: Duration = Duration::from_millis(20);

pub enum Link {
    Plain {
        /// Senders write here, one frame at a time.
        writer: Mutex<TcpStream>,
        /// The driver reads here (a clone of the same socket, with a read timeout of [`TICK`]).
        reader: TcpStream,
    },
    Tls {
        session: Box<Mutex<TlsSession>>,
        /// The same socket, for poll(2) and shutdown.
        tcp: TcpStream,
    },
}

pub struct TlsSession {
    conn: rustls::ClientConnection,
    tcp: TcpStream,
}

/// What one read brought.
pub enum Got {
    /// Bytes were appended to the buffer.
    Data,
    /// Nothing within [`TICK`].
    Idle,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Link {
    /// Connect to `server` ("host:port"), each of its addresses in turn, within `timeout` each;
    /// with `tls`, the handshake too (the server's certificate checked against the host as given).
    pub fn connect(
        server: &str,
        tls: Option<&Arc<ClientConfig>>,
        timeout: Duration,
    ) -> io::Result<Link> {
        let mut last = None;
        for addr in server.to_socket_addrs()? {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(tcp) => return Link::over(tcp, server, tls, timeout),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::new(ErrorKind::NotFound, "no address")))
    }

    fn over(
        tcp: TcpStream,
        server: &str,
        tls: Option<&Arc<ClientConfig>>,
        timeout: Duration,
    ) -> io::Result<Link> {
        tcp.set_nodelay(true)?;
        match tls {
            None => {
                let reader = tcp.try_clone()?;
                reader.set_read_timeout(Some(TICK))?;
                Ok(Link::Plain {
                    writer: Mutex::new(tcp),
                    reader,
                })
            }
            Some(config) => {
                let name = crate::tls::server_name_of(server)
                    .map_err(|e| io::Error::new(ErrorKind::InvalidInput, e))?;
                tcp.set_read_timeout(Some(timeout))?;
                tcp.set_write_timeout(Some(timeout))?;
                let stream = crate::tls::connect_blocking(config.clone(), name, tcp)?;
                let rustls::StreamOwned { conn, sock } = stream;
                sock.set_read_timeout(None)?;
                sock.set_write_timeout(None)?;
                let poll_tcp = sock.try_clone()?;
                Ok(Link::Tls {
                    session: Box::new(Mutex::new(TlsSession { conn, tcp: sock })),
                    tcp: poll_tcp,
                })
            }
        }
    }

    /// Write one whole frame.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        match self {
            Link::Plain { writer, .. } => locked(writer).write_all(frame),
            Link::Tls { session, .. } => {
                let mut s = locked(session);
                let TlsSession { conn, tcp } = &mut *s;
                conn.writer().write_all(frame)?;
                while conn.wants_write() {
                    conn.write_tls(tcp)?;
                }
                Ok(())
            }
        }
    }

    /// Append what arrives within [`TICK`] to `buf`, read through `scratch` (kept by the caller:
    /// zeroing a fresh buffer per read would cost more than the read). Only the thread that
    /// holds the reading role calls this. End of stream is an error.
    pub fn recv(&self, scratch: &mut [u8], buf: &mut Vec<u8>) -> io::Result<Got> {
        match self {
            Link::Plain { reader, .. } => {
                let chunk = scratch;
                match (&*reader).read(chunk) {
                    Ok(0) => Err(ErrorKind::UnexpectedEof.into()),
                    Ok(n) => {
                        buf.extend_from_slice(&chunk[..n]);
                        Ok(Got::Data)
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                        ) =>
                    {
                        Ok(Got::Idle)
                    }
                    Err(e) => Err(e),
                }
            }
            Link::Tls { session, tcp } => {
                let mut pfd = libc::pollfd {
                    fd: tcp.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd for the duration of the call.
                let n = unsafe { libc::poll(&mut pfd, 1, TICK.as_millis() as i32) };
                if n <= 0 {
                    return Ok(Got::Idle);
                }
                let mut s = locked(session);
                let TlsSession { conn, tcp } = &mut *s;
                // Readable: this read returns at once (bytes, or the end of the stream).
                if conn.read_tls(tcp)? == 0 {
                    return Err(ErrorKind::UnexpectedEof.into());
                }
                let state = conn
                    .process_new_packets()
                    .map_err(|e| io::Error::new(ErrorKind::InvalidData, e))?;
                let mut left = state.plaintext_bytes_to_read();
                let chunk = scratch;
                while left > 0 {
                    let n = conn.reader().read(chunk)?;
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    left = left.saturating_sub(n);
                }
                if state.peer_has_closed() {
                    return Err(ErrorKind::UnexpectedEof.into());
                }
                while conn.wants_write() {
                    conn.write_tls(tcp)?;
                }
                Ok(Got::Data)
            }
        }
    }

    /// Close both directions: the driver's read ends, senders fail.
    pub fn shutdown(&self) {
        let tcp = match self {
            Link::Plain { reader, .. } => reader,
            Link::Tls { tcp, .. } => tcp,
        };
        let _ = tcp.shutdown(Shutdown::Both);
    }
}
