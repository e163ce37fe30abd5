//! systemd readiness (`sd_notify`): one datagram to `$NOTIFY_SOCKET` when every listener is up
//! (`Type=notify`), one when stopping. No crate: a Unix datagram socket from std.
//!
//! It owns nothing; without `$NOTIFY_SOCKET` (not under systemd) it does nothing.

use std::os::unix::net::UnixDatagram;

/// Tell systemd the daemon is ready (listeners bound, threads running).
pub fn ready() {
    send(&format!(
        "READY=1\nMAINPID={}\nSTATUS=listening",
        std::process::id()
    ));
}

/// Tell systemd the daemon is stopping.
pub fn stopping() {
    send("STOPPING=1");
}

/// Send `state` to `$NOTIFY_SOCKET`: a path, or an abstract socket name starting with `@`.
pub fn send(state: &str) -> bool {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return false;
    };
    let Ok(sock) = UnixDatagram::unbound() else {
        return false;
    };
    let bytes = path.as_encoded_bytes();
    let sent = if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name)
            .and_then(|a| sock.send_to_addr(state.as_bytes(), &a))
    } else {
        sock.send_to(state.as_bytes(), std::path::Path::new(&path))
    };
    match sent {
        Ok(_) => true,
        Err(e) => {
            crate::log_warn!("sd_notify to {}: {e}", path.to_string_lossy());
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_reaches_the_notify_socket() {
        let dir = std::env::temp_dir().join(format!("holdfast-notify-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("notify");
        let _ = std::fs::remove_file(&path);
        let rx = UnixDatagram::bind(&path).unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        // The only test in this crate that sets NOTIFY_SOCKET; nothing else reads it.
        std::env::set_var("NOTIFY_SOCKET", &path);
        ready();
        std::env::remove_var("NOTIFY_SOCKET");
        let mut buf = [0u8; 256];
        let n = rx.recv(&mut buf).unwrap();
        let msg = std::str::from_utf8(&buf[..n]).unwrap();
        assert!(msg.starts_with("READY=1\n"), "{msg}");
        assert!(msg.contains(&format!("MAINPID={}", std::process::id())));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!send("READY=1"), "without NOTIFY_SOCKET nothing is sent");
    }
}
