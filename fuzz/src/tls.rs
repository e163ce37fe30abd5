//! The `tls_boundary` target: bytes as a TLS listener's socket delivers them, split at arbitrary
//! points, into the worker's own TLS path ([`TlsBoundary`]: rustls, then the protocol parsers).
//! Nothing may panic; the boundary itself checks that nothing is parsed before the handshake
//! ends and that the owner hears of the connection before its first request.
//!
//! Random bytes alone never get past a ClientHello, so most inputs drive a real rustls client
//! through the handshake first, and the fuzzer's bytes become its requests (and where its
//! records are split, cut short or corrupted): the record layer, close_notify and the parsers
//! behind TLS are reached. Input: a protocol byte, a mode byte, two bytes seeding the splits,
//! then the payload.
//!
//! - mode 0: the payload is the whole byte stream (not TLS, a broken handshake, ...);
//! - mode 1: a real client's ClientHello, then the payload as raw bytes;
//! - mode 2: a real client's whole stream: handshake, then the payload as plaintext requests,
//!   then (with bit 2 of the mode byte) its close_notify;
//! - mode 3: as 2, with one byte of the stream flipped.
//!
//! The client's randomness (its key share, its random) comes from the system, as in the daemon:
//! two runs of one input differ in their ciphertext, not in the path they take.

use std::io::Write;
use std::sync::{Arc, OnceLock};

use holdfast::server::{Proto, TlsBoundary};
use holdfast::tls::rustls;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, ServerConfig, SignatureScheme};

/// The server's certificate (P-256, for 127.0.0.1) and key: a fixed test identity.
const CERT: &str = r"-----BEGIN CERTIFICATE-----
MIIBvDCCAWGgAwIBAgIUUABMSVo1rUMTlO35AvEIkfU3iWMwCgYIKoZIzj0EAwIw
GzEZMBcGA1UEAwwQaG9sZGZhc3QgZnV6eiBDQTAgFw0yNjExMjYyMTU5MjVaGA8y
MTI2MTEwMjIxNTkyNVowFDESMBAGA1UEAwwJMTI3LjAuMC4xMFkwEwYHKoZIzj0C
AQYIKoZIzj0DAQcDQgAE+nvpmiZgFGgeda0IDB4KFFm96wtiRcjxX0xagS6ewb5x
+lqfjN0BB2SlpksOJzB6YpzsxUGveeTjVOaZDkkvh6OBhzCBhDAMBgNVHRMBAf8E
AjAAMA4GA1UdDwEB/wQEAwIHgDATBgNVHSUEDDAKBggrBgEFBQcDATAPBgNVHREE
CDAGhwR/AAABMB0GA1UdDgQWBBQRGUj0nD6r5xiZZ19vql67nuggdjAfBgNVHSME
GDAWgBQr2509lhIgsQcNR/XhRp/ItdKKCTAKBggqhkjOPQQDAgNJADBGAiEA9BmC
TgWSkvuKAcEsy51NWnG7wE5IV1obj9zlm00jHhQCIQDoD+lRkktWwLUQKIzBEDST
DDLha2N+UvATImhdIrGxig==
-----END CERTIFICATE-----";
const KEY: &str = r"-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgPtdKDI7rydwuhuCq
2OaeDqz5tEroziIitOBqFFan5R2hRANCAAT6e+maJmAUaB51rQgMHgoUWb3rC2JF
yPFfTFqBLp7BvnH6Wp+M3QEHZKWmSw4nMHpinOzFQa955ONU5pkOSS+H
-----END PRIVATE KEY-----";

const PROTOS: [Proto; 4] = [Proto::Memcache, Proto::Lockd, Proto::Dlock, Proto::Counter];
/// Rounds of client flight, server reply: a handshake takes two.
const ROUNDS: usize = 6;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn server_config() -> Arc<ServerConfig> {
    static CONFIG: OnceLock<Arc<ServerConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let certs = CertificateDer::pem_slice_iter(CERT.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .expect("certificate");
            let key = PrivateKeyDer::from_pem_slice(KEY.as_bytes()).expect("key");
            let config = ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .expect("server config");
            Arc::new(config)
        })
        .clone()
}

fn client_config() -> Arc<ClientConfig> {
    static CONFIG: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let p = provider();
            let config = ClientConfig::builder_with_provider(p.clone())
                .with_safe_default_protocol_versions()
                .expect("versions")
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(p)))
                .with_no_client_auth();
            Arc::new(config)
        })
        .clone()
}

/// The fuzzing client trusts the server's certificate as it is (its dates and names are not
/// what is under test) but checks the handshake's signatures, so that the handshake is real.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Chunk sizes for the reads: mostly small (a byte, a header's worth), sometimes large.
struct Splits(u64);

impl Splits {
    fn next(&mut self) -> usize {
        // xorshift64
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        match self.0 % 8 {
            0 => 1,
            1..=4 => 1 + (self.0 >> 8) as usize % 64,
            5 | 6 => 1 + (self.0 >> 8) as usize % 2048,
            _ => 1 + (self.0 >> 8) as usize % 65536,
        }
    }
}

/// Feed `bytes` in chunks; false once the connection has closed.
fn feed(b: &mut TlsBoundary, mut bytes: &[u8], splits: &mut Splits) -> bool {
    while !bytes.is_empty() {
        let n = splits.next().min(bytes.len());
        if !b.feed(&bytes[..n]) {
            return false;
        }
        bytes = &bytes[n..];
    }
    true
}

/// Everything the client has to send now.
fn flight(c: &mut rustls::ClientConnection) -> Vec<u8> {
    let mut out = Vec::new();
    while c.wants_write() {
        if c.write_tls(&mut out).is_err() {
            break;
        }
    }
    out
}

/// The server's output to the client; false when the client gives up on it.
fn answer(b: &mut TlsBoundary, c: &mut rustls::ClientConnection) -> bool {
    let out = b.take_output();
    let mut input = &out[..];
    let mut sink = [0u8; 16 * 1024];
    while !input.is_empty() {
        match c.read_tls(&mut input) {
            Ok(0) | Err(_) => return false,
            Ok(_) => {}
        }
        if c.process_new_packets().is_err() {
            return false;
        }
        // The replies themselves are not checked here (the connection target does that).
        while let Ok(n) = std::io::Read::read(&mut c.reader(), &mut sink) {
            if n == 0 {
                break;
            }
        }
    }
    true
}

pub fn run(data: &[u8]) {
    let (head, payload) = data.split_at(data.len().min(4));
    let byte = |i: usize| head.get(i).copied().unwrap_or(0);
    let proto = PROTOS[usize::from(byte(0)) % PROTOS.len()];
    let mode = byte(1);
    let seed = u64::from(u16::from_le_bytes([byte(2), byte(3)]));
    let mut splits = Splits(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut b = TlsBoundary::new(server_config(), proto);
    let name = ServerName::try_from("127.0.0.1").expect("name");
    match mode % 4 {
        0 => {
            feed(&mut b, payload, &mut splits);
        }
        1 => {
            let mut c = rustls::ClientConnection::new(client_config(), name).expect("client");
            if feed(&mut b, &flight(&mut c), &mut splits) {
                feed(&mut b, payload, &mut splits);
            }
        }
        m => {
            let mut c = rustls::ClientConnection::new(client_config(), name).expect("client");
            c.set_buffer_limit(None);
            // Written before the handshake: sent right behind the client's Finished.
            c.writer().write_all(payload).expect("buffered");
            if mode & 4 != 0 {
                c.send_close_notify();
            }
            // Where the one flipped byte is, counted over the client's whole stream.
            let mut flip = (m == 3).then(|| (seed as usize * 7) % (payload.len() + 600));
            for _ in 0..ROUNDS {
                let mut out = flight(&mut c);
                if out.is_empty() {
                    break;
                }
                let mut flipped = false;
                if let Some(at) = flip {
                    if at < out.len() {
                        out[at] ^= 0x5a;
                        flip = None;
                        flipped = true;
                    } else {
                        flip = Some(at - out.len());
                    }
                }
                if !feed(&mut b, &out, &mut splits) {
                    break;
                }
                // After a flipped byte the client's view is no longer what the server saw: the
                // server's answer to it would test the client (rustls's client debug-asserts on
                // some), not the daemon.
                if flipped || !answer(&mut b, &mut c) {
                    break;
                }
            }
        }
    }
}
