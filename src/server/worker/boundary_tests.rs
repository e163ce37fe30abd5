use std::io::{Read, Write};

use super::*;
use holdfast_testkit::pki;

/// A server configuration for 127.0.0.1 and a client that trusts it.
fn configs() -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
    let dir = pki::temp_dir("boundary");
    let ca = pki::Ca::new("boundary test CA");
    let ca_pem = ca.write(&dir.join("ca.pem"));
    let server = ca.issue(&dir, "server", &["127.0.0.1"]);
    let s = crate::tls::server_config(&server.cert, &server.key, None).unwrap();
    let c = crate::tls::client_config(Some(&ca_pem), None).unwrap();
    std::fs::remove_dir_all(dir).unwrap();
    (s, c)
}

fn client(config: Arc<rustls::ClientConfig>) -> rustls::ClientConnection {
    rustls::ClientConnection::new(config, crate::tls::server_name("127.0.0.1").unwrap()).unwrap()
}

/// What the client has to send now.
fn flight(c: &mut rustls::ClientConnection) -> Vec<u8> {
    let mut out = Vec::new();
    while c.wants_write() {
        c.write_tls(&mut out).unwrap();
    }
    out
}

/// Hand the server's output to the client; returns the plaintext it yields.
fn deliver(b: &mut TlsBoundary, c: &mut rustls::ClientConnection) -> Vec<u8> {
    let out = b.take_output();
    let mut input = &out[..];
    let mut plain = Vec::new();
    while !input.is_empty() {
        c.read_tls(&mut input).unwrap();
        c.process_new_packets().unwrap();
        // WouldBlock once it has handed over what it has (the bytes stay in `plain`).
        let _ = c.reader().read_to_end(&mut plain);
    }
    plain
}

#[test]
fn a_request_sharing_a_read_with_the_finished_message_comes_after_the_opening() {
    let (server, config) = configs();
    for proto in [Proto::Memcache, Proto::Dlock] {
        let mut b = TlsBoundary::new(server.clone(), proto);
        let mut c = client(config.clone());
        // Written before the handshake ends: rustls sends it right behind its Finished.
        let mut request = b"get a\r\n".to_vec();
        if proto == Proto::Dlock {
            request.clear();
            let ping = crate::proto::dlock::req_type::PING;
            crate::proto::dlock::encode_request(&mut request, Some(1), None, ping, None);
        }
        c.writer().write_all(&request).unwrap();
        assert!(b.feed(&flight(&mut c)));
        assert!(!b.is_open(), "open after the ClientHello alone");
        deliver(&mut b, &mut c);
        let finished_and_request = flight(&mut c);
        assert!(b.feed(&finished_and_request));
        assert!(b.is_open());
        let want: &[&str] = match proto {
            Proto::Dlock => &["open", "dlock_open", "request"],
            _ => &["open", "request"],
        };
        assert_eq!(b.log(), want, "{proto:?}");
    }
}

#[test]
fn a_handshake_and_requests_split_at_every_byte_are_served() {
    let (server, config) = configs();
    let mut b = TlsBoundary::new(server, Proto::Memcache);
    let mut c = client(config);
    c.writer().write_all(b"version\r\nget a\r\n").unwrap();
    let mut replies = Vec::new();
    for _ in 0..4 {
        for byte in flight(&mut c) {
            assert!(b.feed(&[byte]));
        }
        replies.extend(deliver(&mut b, &mut c));
    }
    assert!(b.is_open());
    assert_eq!(b.requests(), 1, "the get went to the owner");
    assert_eq!(
        replies,
        crate::server::VERSION_REPLY,
        "the worker's own reply"
    );
}

#[test]
fn plaintext_and_garbage_close_the_connection_with_nothing_parsed() {
    let (server, _) = configs();
    for input in [
        &b"get a\r\n"[..],
        b"set k 0 0 1\r\nx\r\n",
        &[0x16, 0x03, 0x01, 0xff, 0xff],
        &[0x17, 0x03, 0x03, 0x00, 0x05, 1, 2, 3, 4, 5],
    ] {
        let mut b = TlsBoundary::new(server.clone(), Proto::Memcache);
        assert!(!b.feed(input), "{input:?} left the connection open");
        assert!(!b.is_open());
        assert!(b.log().is_empty());
    }
}

#[test]
fn a_close_notify_behind_the_requests_ends_the_connection_after_they_are_answered() {
    let (server, config) = configs();
    let mut b = TlsBoundary::new(server, Proto::Memcache);
    let mut c = client(config);
    b.feed(&flight(&mut c));
    deliver(&mut b, &mut c);
    b.feed(&flight(&mut c));
    deliver(&mut b, &mut c);
    assert!(b.is_open());
    c.writer().write_all(&b"version\r\n".repeat(3000)).unwrap();
    c.send_close_notify();
    assert!(!b.feed(&flight(&mut c)), "closed after the close_notify");
    let replies = deliver(&mut b, &mut c);
    assert_eq!(replies, crate::server::VERSION_REPLY.repeat(3000));
    assert!(b.is_closed());
}
