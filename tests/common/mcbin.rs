//! memcached's binary protocol as the integration tests speak it (protocol-binary.xml, "Request
//! header" and "Response header"): request frames and whole responses. Written once here for
//! every suite, and on purpose not with the daemon's own codec, so that the tests check it.

use super::Client;

/// One request frame: header (magic 0x80, data type 0, vbucket 0) then extras, key and value.
pub fn request(
    opcode: u8,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
    opaque: u32,
    cas: u64,
) -> Vec<u8> {
    let body = extras.len() + key.len() + value.len();
    let mut v = vec![0x80, opcode];
    v.extend_from_slice(&(key.len() as u16).to_be_bytes());
    v.push(extras.len() as u8);
    v.push(0); // data type
    v.extend_from_slice(&0u16.to_be_bytes()); // vbucket
    v.extend_from_slice(&(body as u32).to_be_bytes());
    v.extend_from_slice(&opaque.to_be_bytes());
    v.extend_from_slice(&cas.to_be_bytes());
    v.extend_from_slice(extras);
    v.extend_from_slice(key);
    v.extend_from_slice(value);
    v
}

/// A binary response, every field.
#[derive(Debug, PartialEq, Eq, Clone)]
pub struct Resp {
    pub opcode: u8,
    pub status: u16,
    pub opaque: u32,
    pub cas: u64,
    pub extras: Vec<u8>,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

impl Resp {
    /// The body as it came: extras, key, value.
    pub fn body(&self) -> Vec<u8> {
        [&self.extras[..], &self.key, &self.value].concat()
    }
}

/// Read one whole response (panics after the client's deadline); checks the magic and the
/// data type.
pub fn read(c: &mut Client) -> Resp {
    let h = c.take(24);
    assert_eq!(h[0], 0x81, "response magic in {h:?}");
    assert_eq!(h[5], 0, "data type");
    let key_len = u16::from_be_bytes([h[2], h[3]]) as usize;
    let extras_len = h[4] as usize;
    let body = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
    let b = c.take(body);
    assert!(
        extras_len + key_len <= body,
        "extras and key within the body in {h:?}"
    );
    Resp {
        opcode: h[1],
        status: u16::from_be_bytes([h[6], h[7]]),
        opaque: u32::from_be_bytes([h[12], h[13], h[14], h[15]]),
        cas: u64::from_be_bytes([h[16], h[17], h[18], h[19], h[20], h[21], h[22], h[23]]),
        extras: b[..extras_len].to_vec(),
        key: b[extras_len..extras_len + key_len].to_vec(),
        value: b[extras_len + key_len..].to_vec(),
    }
}

/// Send one request and read one response.
pub fn call(c: &mut Client, frame: &[u8]) -> Resp {
    c.send(frame);
    read(c)
}
