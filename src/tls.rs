//! Certificates, keys and tokens: loading them, refusing files others can read, and reloading
//! them on SIGHUP.
//!
//! Every secret the daemon uses comes from a file ([`SecretFiles`]). [`Secrets`] is one loaded
//! set of them: the rustls configurations of the client listeners and of the peer links, the
//! dlock and admin tokens and the memcached users. [`SecretStore`] holds the current set;
//! [`SecretStore::reload`] loads each item again and keeps the old one of every item that fails
//! to load, so that a bad file never takes away what works. Readers take the current set with
//! [`SecretStore::current`] (a lock and an `Arc` clone: once per accepted connection or per
//! worker turn, never per request; [`SecretStore::generation`] says when to look again).
//!
//! The crypto provider is *ring*: it builds with a C compiler alone, where rustls's default
//! (aws-lc-rs) also wants cmake and, for some targets, a Go or NASM toolchain.

use std::collections::HashMap;
use std::fmt;
use std::io;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

pub use rustls;
use rustls::{ClientConfig, ServerConfig};

// The client side (the tools' `--tls` flags) and the file readers are the client library's, one
// implementation for the daemon, its tools and every Rust client.
pub use holdfast_client::tls::{
    check_private, client_config, client_flags, connect_blocking, provider, read_certs, read_key,
    read_secret, roots, server_name, server_name_of, ClientStream, MAX_FILE,
};

/// Where each secret comes from (the flags), validated only as paths: loading is [`Secrets::load`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecretFiles {
    /// `--tls-cert`, `--tls-key`: the client listeners' certificate chain and key.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// `--tls-client-ca`: clients of TLS listeners must present a certificate of these CAs.
    pub tls_client_ca: Option<PathBuf>,
    /// `--peer-tls-cert`, `--peer-tls-key`, `--peer-tls-ca`.
    pub peer: Option<PeerFiles>,
    /// `--memcache-auth-file`: `user:password` lines.
    pub memcache_auth: Option<PathBuf>,
    /// `--dlock-token-file`.
    pub dlock_token: Option<PathBuf>,
    /// `--admin-token-file`.
    pub admin_token: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// memcached users (`-Y` format): name to password.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Users(HashMap<Vec<u8>, Vec<u8>>);

impl Users {
    /// Parse `user:password` lines (memcached's `-Y` file). Blank lines are skipped; a line
    /// without a colon is an error (memcached stops at it too).
    pub fn parse(text: &[u8]) -> Result<Users, String> {
        let mut users = HashMap::new();
        for (n, line) in text.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                continue;
            }
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                return Err(format!("line {}: expected user:password", n + 1));
            };
            users.insert(line[..colon].to_vec(), line[colon + 1..].to_vec());
        }
        if users.is_empty() {
            return Err("no users".into());
        }
        Ok(Users(users))
    }

    /// Whether `user` exists with `password` (the comparison takes the same time wherever the
    /// two passwords first differ).
    pub fn check(&self, user: &[u8], password: &[u8]) -> bool {
        self.0
            .get(user)
            .is_some_and(|p| constant_time_eq(p, password))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Users {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Users({} users)", self.0.len())
    }
}

/// Compare two secrets without stopping at the first difference (a token compared byte by byte
/// with an early exit tells a patient attacker how much of its guess is right).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// One loaded set of secrets.
#[derive(Clone, Default)]
pub struct Secrets {
    /// The client listeners' (and the admin port's) TLS configuration.
    pub server: Option<Arc<ServerConfig>>,
    /// The peer listener's: a peer must present a certificate of the peer CA.
    pub peer_server: Option<Arc<ServerConfig>>,
    /// Dialing a peer: our certificate, and the peer CA to check theirs.
    pub peer_client: Option<Arc<ClientConfig>>,
    pub memcache_users: Option<Arc<Users>>,
    pub dlock_token: Option<Arc<[u8]>>,
    pub admin_token: Option<Arc<[u8]>>,
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secrets")
            .field("server", &self.server.is_some())
            .field("peer", &self.peer_server.is_some())
            .field("memcache_users", &self.memcache_users)
            .field("dlock_token", &self.dlock_token.is_some())
            .field("admin_token", &self.admin_token.is_some())
            .finish()
    }
}

impl Secrets {
    /// Load every file named; the first failure is the error (at start, one line and exit 2).
    /// `dlock_token` is the command line's `--dlock-token`, used when no file is named.
    pub fn load(files: &SecretFiles, dlock_token: Option<&str>) -> Result<Secrets, String> {
        Ok(Secrets {
            server: load_server(files)?,
            peer_server: load_peer_server(files)?,
            peer_client: load_peer_client(files)?,
            memcache_users: load_users(files)?,
            dlock_token: match &files.dlock_token {
                Some(p) => Some(read_token(p)?),
                None => dlock_token.map(|t| Arc::from(t.as_bytes())),
            },
            admin_token: files.admin_token.as_deref().map(read_token).transpose()?,
        })
    }
}

fn load_server(files: &SecretFiles) -> Result<Option<Arc<ServerConfig>>, String> {
    let Some((cert, key)) = &files.tls else {
        return Ok(None);
    };
    server_config(cert, key, files.tls_client_ca.as_deref()).map(Some)
}

fn load_peer_server(files: &SecretFiles) -> Result<Option<Arc<ServerConfig>>, String> {
    let Some(p) = &files.peer else {
        return Ok(None);
    };
    server_config(&p.cert, &p.key, Some(&p.ca)).map(Some)
}

fn load_peer_client(files: &SecretFiles) -> Result<Option<Arc<ClientConfig>>, String> {
    let Some(p) = &files.peer else {
        return Ok(None);
    };
    client_config(Some(&p.ca), Some((&p.cert, &p.key))).map(Some)
}

fn load_users(files: &SecretFiles) -> Result<Option<Arc<Users>>, String> {
    let Some(path) = &files.memcache_auth else {
        return Ok(None);
    };
    let text = read_secret(path)?;
    Users::parse(&text)
        .map(|u| Some(Arc::new(u)))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The current secrets, replaced whole by a reload.
pub struct SecretStore {
    files: SecretFiles,
    dlock_token_flag: Option<String>,
    current: RwLock<Arc<Secrets>>,
    generation: AtomicU64,
}

impl fmt::Debug for SecretStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretStore")
            .field("files", &self.files)
            .field("generation", &self.generation())
            .finish()
    }
}

impl SecretStore {
    pub fn load(files: SecretFiles, dlock_token: Option<String>) -> Result<SecretStore, String> {
        let secrets = Secrets::load(&files, dlock_token.as_deref())?;
        Ok(SecretStore::new(files, dlock_token, secrets))
    }

    /// A store of already loaded secrets (tests, and a daemon without any secret file).
    pub fn new(files: SecretFiles, dlock_token: Option<String>, secrets: Secrets) -> SecretStore {
        SecretStore {
            files,
            dlock_token_flag: dlock_token,
            current: RwLock::new(Arc::new(secrets)),
            generation: AtomicU64::new(1),
        }
    }

    pub fn current(&self) -> Arc<Secrets> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Bumped by every reload that changed something: a reader that cached a set compares this.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn files(&self) -> &SecretFiles {
        &self.files
    }

    /// Load every item again; an item that fails keeps its old value. Returns one line per
    /// failure (the caller logs them).
    pub fn reload(&self) -> Vec<String> {
        let old = self.current();
        let mut next = (*old).clone();
        let mut errors = Vec::new();
        let files = &self.files;
        let mut keep = |what: &str, r: Result<(), String>| {
            if let Err(e) = r {
                errors.push(format!("reload: {what} kept: {e}"));
            }
        };
        keep(
            "TLS certificate",
            load_server(files).map(|v| next.server = v),
        );
        keep(
            "peer TLS certificate",
            load_peer_server(files)
                .and_then(|s| load_peer_client(files).map(|c| (s, c)))
                .map(|(s, c)| {
                    next.peer_server = s;
                    next.peer_client = c;
                }),
        );
        keep(
            "memcache users",
            load_users(files).map(|v| next.memcache_users = v),
        );
        if let Some(p) = &files.dlock_token {
            keep(
                "dlock token",
                read_token(p).map(|t| next.dlock_token = Some(t)),
            );
        } else {
            next.dlock_token = self
                .dlock_token_flag
                .as_deref()
                .map(|t| Arc::from(t.as_bytes()));
        }
        if let Some(p) = &files.admin_token {
            keep(
                "admin token",
                read_token(p).map(|t| next.admin_token = Some(t)),
            );
        }
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(next);
        self.generation.fetch_add(1, Ordering::AcqRel);
        errors
    }
}

/// A token file's token: its first line without the line ending; an empty one is an error.
pub fn read_token(path: &Path) -> Result<Arc<[u8]>, String> {
    let text = read_secret(path)?;
    let line = text.split(|&b| b == b'\n').next().unwrap_or(&[]);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        return Err(format!("{}: the first line is empty", path.display()));
    }
    Ok(Arc::from(line))
}

/// A server configuration: our chain and key, and the CAs whose certificate a client must
/// present (mutual TLS), if any.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, String> {
    let chain = read_certs(cert)?;
    let key_der = read_key(key)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca {
        Some(ca) => {
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider())
                    .build()
                    .map_err(|e| format!("{}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key_der)
        .map_err(|e| format!("{} and {}: {e}", cert.display(), key.display()))?;
    // Our order of cipher suites, not the client's (see `provider`).
    config.ignore_client_order = true;
    Ok(Arc::new(config))
}

/// A blocking TLS stream over TCP (the peer links, the tools).
pub type ServerStream = rustls::StreamOwned<rustls::ServerConnection, std::net::TcpStream>;
/// A server's blocking TLS stream whose every read and write ends by a deadline (the admin
/// port's connection threads).
pub type DeadlineServerStream = rustls::StreamOwned<rustls::ServerConnection, Deadline<TcpStream>>;

use std::net::TcpStream;

/// A TCP stream (owned or borrowed) whose reads and writes each get the time left before
/// `deadline` as their timeout, and fail with `TimedOut` once it has passed. rustls's blocking
/// loops (`complete_io`, `StreamOwned::read`) read until a whole record or handshake message has
/// arrived: with a plain socket timeout, a peer that trickles a byte now and then keeps such a
/// loop going without end; through this, never past the deadline.
pub struct Deadline<T> {
    pub tcp: T,
    pub deadline: std::time::Instant,
}

impl<T: std::borrow::Borrow<TcpStream>> Deadline<T> {
    fn left(&self) -> io::Result<std::time::Duration> {
        let left = self
            .deadline
            .saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
        }
        Ok(left)
    }
}

impl<T: std::borrow::Borrow<TcpStream>> io::Read for Deadline<T> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left()?;
        let tcp = self.tcp.borrow();
        tcp.set_read_timeout(Some(left))?;
        (&*tcp).read(buf)
    }
}

impl<T: std::borrow::Borrow<TcpStream>> io::Write for Deadline<T> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.left()?;
        let tcp = self.tcp.borrow();
        tcp.set_write_timeout(Some(left))?;
        (&*tcp).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Run a blocking server handshake to its end, or fail once `deadline` has passed however the
/// client sends its bytes. The stream keeps the deadline for what follows (move it on with
/// `stream.sock.deadline`).
pub fn accept_blocking(
    config: Arc<ServerConfig>,
    tcp: TcpStream,
    deadline: std::time::Instant,
) -> io::Result<DeadlineServerStream> {
    let mut conn = rustls::ServerConnection::new(config).map_err(io::Error::other)?;
    let mut io = Deadline { tcp, deadline };
    while conn.is_handshaking() {
        conn.complete_io(&mut io)?;
    }
    Ok(rustls::StreamOwned::new(conn, io))
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
