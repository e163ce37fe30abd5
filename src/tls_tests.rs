use super::*;

fn dir() -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "holdfast-tls-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(path: &Path, text: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn a_secret_file_others_can_read_is_refused() {
    let d = dir();
    let p = d.join("token");
    for mode in [0o644, 0o640, 0o604, 0o660, 0o602] {
        write(&p, "secret\n", mode);
        let e = read_token(&p).unwrap_err();
        assert!(e.contains("other users can access"), "{mode:o}: {e}");
    }
    write(&p, "secret\r\nsecond line\n", 0o600);
    assert_eq!(&*read_token(&p).unwrap(), b"secret");
    write(&p, "secret", 0o400);
    assert_eq!(&*read_token(&p).unwrap(), b"secret");
    write(&p, "\nsecret\n", 0o600);
    assert!(read_token(&p).unwrap_err().contains("empty"));
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn users_parse_memcacheds_format_and_check_passwords() {
    let u = Users::parse(b"alice:s3cret\r\n\nbob:with:colon\n").unwrap();
    assert_eq!(u.len(), 2);
    assert!(u.check(b"alice", b"s3cret"));
    assert!(!u.check(b"alice", b"s3cre"));
    assert!(!u.check(b"alice", b"s3cret "));
    assert!(u.check(b"bob", b"with:colon"));
    assert!(!u.check(b"carol", b""));
    assert!(Users::parse(b"nocolon\n").is_err());
    assert!(Users::parse(b"\n\n").is_err());
}

#[test]
fn constant_time_eq_is_equality() {
    assert!(constant_time_eq(b"", b""));
    assert!(constant_time_eq(b"abc", b"abc"));
    assert!(!constant_time_eq(b"abc", b"abd"));
    assert!(!constant_time_eq(b"abc", b"ab"));
}

#[test]
fn a_reload_keeps_an_item_whose_file_went_bad() {
    let d = dir();
    let dl = d.join("dlock");
    let ad = d.join("admin");
    write(&dl, "one\n", 0o600);
    write(&ad, "adm\n", 0o600);
    let files = SecretFiles {
        dlock_token: Some(dl.clone()),
        admin_token: Some(ad.clone()),
        ..SecretFiles::default()
    };
    let store = SecretStore::load(files, None).unwrap();
    let g = store.generation();
    write(&dl, "two\n", 0o600);
    write(&ad, "bad\n", 0o644);
    let errors = store.reload();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("admin token kept"), "{errors:?}");
    let now = store.current();
    assert_eq!(now.dlock_token.as_deref(), Some(&b"two"[..]));
    assert_eq!(now.admin_token.as_deref(), Some(&b"adm"[..]));
    assert!(store.generation() > g);
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn a_server_configuration_needs_a_matching_private_key_and_real_pem() {
    use holdfast_testkit::pki;
    let d = pki::temp_dir("tls-config");
    let ca = pki::Ca::new("unit CA");
    let ca_file = ca.write(&d.join("ca.pem"));
    let a = ca.issue(&d, "a", &["127.0.0.1"]);
    let b = ca.issue(&d, "b", &["127.0.0.1"]);
    assert!(server_config(&a.cert, &a.key, None).is_ok());
    assert!(server_config(&a.cert, &a.key, Some(&ca_file)).is_ok());
    let e = server_config(&a.cert, &b.key, None).unwrap_err();
    assert!(e.contains("a.pem"), "{e}");
    // A key file is a secret: readable by others, refused.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&a.key, std::fs::Permissions::from_mode(0o640)).unwrap();
    assert!(server_config(&a.cert, &a.key, None)
        .unwrap_err()
        .contains("other users can access"));
    // Not PEM at all, or PEM without a certificate.
    std::fs::write(d.join("junk.pem"), "not a certificate\n").unwrap();
    assert!(read_certs(&d.join("junk.pem")).is_err());
    assert!(read_certs(&b.key).is_err());
    assert!(client_config(Some(&ca_file), Some((&b.cert, &b.key))).is_ok());
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn the_provider_prefers_aes_128_gcm_and_keeps_every_suite() {
    let p = provider();
    let names: Vec<String> = p
        .cipher_suites
        .iter()
        .map(|s| format!("{:?}", s.suite()))
        .collect();
    assert_eq!(names[0], "TLS13_AES_128_GCM_SHA256", "{names:?}");
    assert_eq!(names.len(), rustls::crypto::ring::ALL_CIPHER_SUITES.len());
    let first12 = names.iter().position(|n| !n.starts_with("TLS13")).unwrap();
    assert!(names[first12..].iter().all(|n| !n.starts_with("TLS13")));
    assert!(names[first12].contains("AES_128_GCM"), "{names:?}");
}

#[test]
fn a_secret_file_of_another_user_is_refused() {
    use std::os::unix::fs::chown;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: giving a file to another user needs root");
        return;
    }
    let d = dir();
    let p = d.join("token");
    write(&p, "secret\n", 0o600);
    chown(&p, Some(65534), None).unwrap();
    let e = read_token(&p).unwrap_err();
    assert!(e.contains("belongs to user 65534"), "{e}");
    chown(&p, Some(0), None).unwrap();
    assert_eq!(&*read_token(&p).unwrap(), b"secret");
    // A link to a file others can read is the file others can read.
    let open = d.join("open");
    write(&open, "secret\n", 0o644);
    let link = d.join("link");
    std::os::unix::fs::symlink(&open, &link).unwrap();
    assert!(read_token(&link)
        .unwrap_err()
        .contains("other users can access"));
    std::fs::remove_dir_all(d).unwrap();
}
