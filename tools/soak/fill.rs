//! `--fill-mb N` (cluster mode): before the clients and the faults start, N MiB of 1,000-byte
//! items `fill:<i>` are written through the nodes (pipelined `set ... noreply`, one connection
//! per node), so that snapshots, log compaction and snapshot transfers to restarted or cut-off
//! nodes happen on a real state during the faults. At the end a sample of them must still be
//! readable, each with its own value, on every node.
//!
//! Owns only the fill's keys (the clients use `mc:` names). A connection that breaks (a no-quorum
//! close, a node stalled past a timeout) is reopened and the writes since its last confirmed
//! point are sent again: a `get` of the last key written, every [`CONFIRM_EVERY`] sets, answered
//! with the value confirms every set before it on that connection.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::net::{Conn, Fail, Res, Rng};

/// Bytes of each value.
pub const VALUE_LEN: usize = 1000;
/// Sets written at once.
const BATCH: u64 = 200;
/// Sets between two confirming gets.
const CONFIRM_EVERY: u64 = 2000;
/// How long one confirming get (or a sample's get) may take.
const GET_WITHIN: Duration = Duration::from_secs(30);
/// Keys read back from every node at the end.
pub const SAMPLE: u64 = 200;

fn key(i: u64) -> String {
    format!("fill:{i}")
}

/// The value of item `i`: its index, then letters that depend on it (a value read back under
/// another key, or cut, does not match).
fn value(i: u64) -> Vec<u8> {
    let mut v = format!("{i:020}:").into_bytes();
    while v.len() < VALUE_LEN {
        v.push(b'a' + ((i as usize + v.len() * 7) % 26) as u8);
    }
    v
}

/// What the fill did.
pub struct Filled {
    pub items: u64,
    pub seconds: f64,
    /// Connections reopened (their unconfirmed sets sent again).
    pub retries: u64,
}

/// Items for `mib` MiB of values.
pub fn items_for(mib: u64) -> u64 {
    (mib << 20) / VALUE_LEN as u64
}

/// Write every item through `addrs` (item i through node i mod n); an error if that is not
/// done within `within`.
pub fn fill(addrs: &[SocketAddr], items: u64, within: Duration) -> Result<Filled, String> {
    let start = Instant::now();
    let deadline = start + within;
    let n = addrs.len() as u64;
    let threads: Vec<_> = addrs
        .iter()
        .enumerate()
        .map(|(j, &addr)| {
            let mine: Vec<u64> = (j as u64..items).step_by(n as usize).collect();
            std::thread::Builder::new()
                .name(format!("fill-{}", j + 1))
                .spawn(move || fill_one(addr, &mine, deadline))
        })
        .collect();
    let mut retries = 0;
    let mut errors = Vec::new();
    for t in threads {
        match t.map_err(|e| e.to_string()).and_then(|t| {
            t.join()
                .unwrap_or_else(|_| Err("a fill thread panicked".into()))
        }) {
            Ok(r) => retries += r,
            Err(e) => errors.push(e),
        }
    }
    if let Some(e) = errors.into_iter().next() {
        return Err(e);
    }
    Ok(Filled {
        items,
        seconds: start.elapsed().as_secs_f64(),
        retries,
    })
}

/// The items `keys` through one node, in order; the number of reopened connections.
fn fill_one(addr: SocketAddr, keys: &[u64], deadline: Instant) -> Result<u64, String> {
    let mut confirmed = 0usize;
    let mut retries = 0u64;
    let mut last_error = String::new();
    while confirmed < keys.len() {
        if Instant::now() > deadline {
            return Err(format!(
                "fill through {addr}: {confirmed} of {} items confirmed by the deadline \
                 ({retries} reconnects; last: {last_error})",
                keys.len()
            ));
        }
        match stream(addr, keys, &mut confirmed) {
            Ok(()) => {}
            Err(e) => {
                retries += 1;
                last_error = e.to_string();
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    Ok(retries)
}

/// Send the sets from `*confirmed` on over one connection, moving `*confirmed` on at each
/// answered get.
fn stream(addr: SocketAddr, keys: &[u64], confirmed: &mut usize) -> Res<()> {
    let mut c = Conn::connect(addr)?;
    let mut at = *confirmed;
    let mut since = 0;
    while at < keys.len() {
        let end = (at + BATCH as usize).min(keys.len());
        let mut req = Vec::with_capacity((end - at) * (VALUE_LEN + 40));
        for &k in &keys[at..end] {
            req.extend_from_slice(format!("set {} 0 0 {VALUE_LEN} noreply\r\n", key(k)).as_bytes());
            req.extend_from_slice(&value(k));
            req.extend_from_slice(b"\r\n");
        }
        c.send(&req)?;
        since += (end - at) as u64;
        at = end;
        if since >= CONFIRM_EVERY || at == keys.len() {
            since = 0;
            let k = keys[at - 1];
            match get(&mut c, k)? {
                Some(v) if v == value(k) => *confirmed = at,
                other => {
                    c.close(false);
                    return Err(Fail::Proto(format!(
                        "get {} after its set: {}",
                        key(k),
                        describe(&other)
                    )));
                }
            }
        }
    }
    c.close(false);
    Ok(())
}

fn describe(v: &Option<Vec<u8>>) -> String {
    match v {
        None => "a miss".into(),
        Some(v) => format!(
            "another value ({} bytes, {:?}...)",
            v.len(),
            String::from_utf8_lossy(&v[..v.len().min(24)])
        ),
    }
}

/// `get fill:<i>`: the value, or None on a miss.
fn get(c: &mut Conn, i: u64) -> Res<Option<Vec<u8>>> {
    c.send(format!("get {}\r\n", key(i)).as_bytes())?;
    c.recv(Instant::now() + GET_WITHIN, |b| {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let line = &b[..eol];
        if line == b"END" {
            return Ok(Some((None, eol + 2)));
        }
        let text = String::from_utf8_lossy(line);
        let f: Vec<&str> = text.split_whitespace().collect();
        if f.len() < 4 || f[0] != "VALUE" {
            return Err(format!("get: unexpected {text:?}"));
        }
        let len: usize = f[3]
            .parse()
            .map_err(|_| format!("get: bad length {text:?}"))?;
        let body = eol + 2;
        let end = body + len + 2 + 5; // data, CRLF, "END\r\n"
        if b.len() < end {
            return Ok(None);
        }
        if &b[body + len..end] != b"\r\nEND\r\n" {
            return Err("get: value not followed by END".into());
        }
        Ok(Some((Some(b[body..body + len].to_vec()), end)))
    })
}

/// Read SAMPLE items (spread over the whole fill, from `seed`) back from every node; one text
/// per item that is missing or wrong, or per node that does not answer.
pub fn check(addrs: &[SocketAddr], items: u64, seed: u64) -> (u64, Vec<String>) {
    let mut rng = Rng::mixed(seed ^ 0xf111_f111_f111_f111);
    let sample: Vec<u64> = (0..SAMPLE.min(items))
        .map(|s| {
            // One key in each SAMPLE-th of the fill, at random within it.
            let lo = items * s / SAMPLE.min(items);
            let hi = (items * (s + 1) / SAMPLE.min(items)).max(lo + 1);
            lo + rng.below(hi - lo)
        })
        .collect();
    let mut checked = 0;
    let mut errors = Vec::new();
    for (j, &addr) in addrs.iter().enumerate() {
        let mut c = match Conn::connect(addr) {
            Ok(c) => c,
            Err(e) => {
                errors.push(format!("fill check: node {}: {e}", j + 1));
                continue;
            }
        };
        for &i in &sample {
            match get(&mut c, i) {
                Ok(Some(v)) if v == value(i) => checked += 1,
                Ok(other) => errors.push(format!(
                    "fill check: node {}: {}: {}",
                    j + 1,
                    key(i),
                    describe(&other)
                )),
                Err(e) => {
                    errors.push(format!("fill check: node {}: get {}: {e}", j + 1, key(i)));
                    break;
                }
            }
        }
        c.close(false);
    }
    (checked, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_their_length_and_differ() {
        assert_eq!(value(0).len(), VALUE_LEN);
        assert_eq!(value(123_456_789).len(), VALUE_LEN);
        assert_ne!(value(1), value(2));
        assert_eq!(items_for(1), 1048);
    }
}
