//! TLS for holdfast's clients: the rustls client configuration that `--tls`, `--tls-ca`,
//! `--tls-cert` and `--tls-key` mean in every holdfast tool, and the certificate, key and CA
//! file readers the daemon shares (it re-exports them from `holdfast::tls`).
//!
//! The crypto provider is *ring* (it builds with a C compiler alone). Files are read with a cap
//! of [`MAX_FILE`] bytes; a private key must be private to its owner, as ssh wants of one.

use std::io;
use std::path::Path;
use std::sync::Arc;

pub use rustls;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};

/// The largest certificate, key, CA or token file read (a hostile or mistaken path such as a
/// device must not make a reader read without end).
pub const MAX_FILE: u64 = 1 << 20;

/// A blocking TLS client stream over TCP.
pub type ClientStream = rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>;

/// Refuse a secret file that users other than its owner may read or write (as ssh does with a
/// private key): mode bits for group or others, or an owner that is neither this process's
/// user nor root.
pub fn check_private(path: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    check_private_meta(path, &meta)
}

fn check_private_meta(path: &Path, meta: &std::fs::Metadata) -> Result<(), String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{}: other users can access this secret file (mode {mode:04o}); chmod 600 it",
            path.display()
        ));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me && meta.uid() != 0 {
        return Err(format!(
            "{}: this secret file belongs to user {}, not to this process's user ({me}) or root",
            path.display(),
            meta.uid()
        ));
    }
    Ok(())
}

/// Read a file of at most [`MAX_FILE`] bytes.
fn read_capped(path: &Path) -> Result<Vec<u8>, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    take_capped(path, f)
}

/// The rest of open file `f` (named `path` in errors), if it is at most [`MAX_FILE`] bytes.
fn take_capped(path: &Path, f: std::fs::File) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    f.take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(format!("{}: larger than {MAX_FILE} bytes", path.display()));
    }
    Ok(bytes)
}

/// A secret file: opened, checked private on the open file (see [`check_private`]: what is
/// checked is what is read, even if the path is replaced meanwhile), then read.
pub fn read_secret(path: &Path) -> Result<Vec<u8>, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = f
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    check_private_meta(path, &meta)?;
    take_capped(path, f)
}

/// *ring* with AES-128-GCM ahead of AES-256-GCM in each TLS version (as Go's crypto/tls and
/// Mozilla's recommended configurations order them): both are strong, and the lock protocols'
/// small records spend much of their time in the cipher, whose 10 rounds against 14 show.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring::cipher_suite as cs;
    let mut p = rustls::crypto::ring::default_provider();
    let rank = |s: &rustls::SupportedCipherSuite| {
        let suite = s.suite();
        let first = [
            cs::TLS13_AES_128_GCM_SHA256.suite(),
            cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256.suite(),
            cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256.suite(),
        ];
        // TLS 1.3 before 1.2, and AES-128 first within each; otherwise *ring*'s order.
        let v13 = matches!(s, rustls::SupportedCipherSuite::Tls13(_));
        (!v13, !first.contains(&suite))
    };
    p.cipher_suites.sort_by_key(rank);
    Arc::new(p)
}

/// A PEM certificate chain (public: no permission check).
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = read_capped(path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate", path.display()));
    }
    Ok(certs)
}

/// A PEM private key (PKCS#8, PKCS#1 or SEC1), private to its owner.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let bytes = read_secret(path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// The CA certificates of a PEM file, as a trust store.
pub fn roots(path: &Path) -> Result<Arc<RootCertStore>, String> {
    let mut store = RootCertStore::empty();
    for cert in read_certs(path)? {
        store
            .add(cert)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(Arc::new(store))
}

/// The system's trusted roots (`/etc/ssl/certs` and its kin, found as OpenSSL finds them).
fn system_roots() -> Result<Arc<RootCertStore>, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut store = RootCertStore::empty();
    let (added, _) = store.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err("no trusted CA certificates on this system: name one with --tls-ca".into());
    }
    Ok(Arc::new(store))
}

/// A client configuration: the CAs that may sign the server's certificate (none: the system's
/// trusted roots, as curl and every TLS client do), and our own chain and key for mutual TLS.
pub fn client_config(
    ca: Option<&Path>,
    identity: Option<(&Path, &Path)>,
) -> Result<Arc<ClientConfig>, String> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match ca {
        Some(ca) => builder.with_root_certificates(roots(ca)?),
        None => builder.with_root_certificates(system_roots()?),
    };
    let config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(read_certs(cert)?, read_key(key)?)
            .map_err(|e| format!("{} and {}: {e}", cert.display(), key.display()))?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The client flags every holdfast tool takes (`--tls`, `--tls-ca`, `--tls-cert`, `--tls-key`)
/// as one client configuration: `None` when none is given; any of them means TLS; a certificate
/// needs its key and a key its certificate.
pub fn client_flags(
    tls: bool,
    ca: Option<&Path>,
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<Option<Arc<ClientConfig>>, String> {
    let identity = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => return Err("--tls-cert and --tls-key go together".into()),
    };
    if !tls && ca.is_none() && identity.is_none() {
        return Ok(None);
    }
    client_config(ca, identity).map(Some)
}

/// The name a client checks the server's certificate against: an IP address as itself, else a
/// DNS name.
pub fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(host.to_string()).map_err(|e| format!("{host}: {e}"))
}

/// The name a client checks the certificate of `server` ("host:port", "[v6]:port") against:
/// the host as given.
pub fn server_name_of(server: &str) -> Result<ServerName<'static>, String> {
    let host = server
        .rsplit_once(':')
        .map_or(server, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']');
    server_name(host)
}

/// Run a blocking client handshake to its end.
pub fn connect_blocking(
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    mut tcp: std::net::TcpStream,
) -> io::Result<ClientStream> {
    let mut conn = rustls::ClientConnection::new(config, name).map_err(io::Error::other)?;
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp)?;
    }
    Ok(rustls::StreamOwned::new(conn, tcp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A file of `len` bytes with `mode` in a directory of this test's own.
    fn file(name: &str, len: u64, mode: u32) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("holdfast-tls-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, vec![b'x'; len as usize]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn files_over_the_cap_and_secrets_others_can_read_are_refused() {
        let at_cap = file("at-cap", MAX_FILE, 0o600);
        assert_eq!(read_secret(&at_cap).unwrap().len() as u64, MAX_FILE);
        assert_eq!(read_capped(&at_cap).unwrap().len() as u64, MAX_FILE);
        let over = file("over", MAX_FILE + 1, 0o600);
        for r in [read_secret(&over), read_capped(&over)] {
            let e = r.unwrap_err();
            assert!(e.contains("larger than"), "{e}");
        }
        let shared = file("shared", 10, 0o644);
        assert!(read_secret(&shared).is_err());
        assert_eq!(read_capped(&shared).unwrap().len(), 10);
        for p in [at_cap, over, shared] {
            let _ = std::fs::remove_dir_all(p.parent().unwrap());
        }
    }
}
