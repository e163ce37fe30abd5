//! Test certificates: a CA and the certificates it signs, written as PEM files with the modes
//! the daemon expects (keys 0600), made in pure Rust (rcgen).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

/// A certificate authority that signs test certificates.
pub struct Ca {
    pub cert_pem: String,
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A certificate and its key written to files.
#[derive(Clone, Debug)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Ca {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        Ca {
            cert_pem: cert.pem(),
            cert,
            key,
        }
    }

    /// Write the CA's certificate to `path` (public: mode 0644).
    pub fn write(&self, path: &Path) -> PathBuf {
        write(path, &self.cert_pem, 0o644);
        path.to_path_buf()
    }

    /// Issue a certificate for `names` (IP addresses become IP names, the rest DNS names; the
    /// first is also the common name) and write it and its key as `dir/stem.pem` and
    /// `dir/stem.key` (mode 0600). Good for both server and client authentication.
    pub fn issue(&self, dir: &Path, stem: &str, names: &[&str]) -> Issued {
        let sans: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(sans).expect("certificate params");
        if let Some(first) = names.first() {
            params.distinguished_name.push(DnType::CommonName, *first);
        }
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().expect("key");
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("certificate");
        let cert_path = dir.join(format!("{stem}.pem"));
        let key_path = dir.join(format!("{stem}.key"));
        write(&cert_path, &cert.pem(), 0o644);
        write(&key_path, &key.serialize_pem(), 0o600);
        Issued {
            cert: cert_path,
            key: key_path,
        }
    }
}

fn write(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).expect("write PEM file");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A fresh directory under the system's temporary directory for one test's files.
pub fn temp_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "holdfast-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_issues_files_with_the_right_modes() {
        let d = temp_dir("pki");
        let ca = Ca::new("test CA");
        let ca_path = ca.write(&d.join("ca.pem"));
        let leaf = ca.issue(&d, "node1", &["127.0.0.1", "localhost"]);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&leaf.key), 0o600);
        assert_eq!(mode(&ca_path), 0o644);
        assert!(std::fs::read_to_string(&leaf.cert)
            .unwrap()
            .starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(std::fs::read_to_string(&leaf.key)
            .unwrap()
            .contains("PRIVATE KEY"));
        std::fs::remove_dir_all(d).unwrap();
    }
}
