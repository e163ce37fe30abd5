//! holdfast-fanout: the watch fan-out of the native protocol, measured (`make bench`'s fan-out
//! row).
//!
//! Opens `--watchers` connections that each Watch one key, then, `--rounds` times, one more
//! connection Locks the key and Unlocks it (after `--warmup` rounds that are not measured: the
//! first grants meet cold buffers and TCP's quick-ACK start). Each grant and each release is an
//! event to every watcher. Reported: events delivered per second, and per grant the time from
//! the Lock's send to the last watcher's Acquired event (p50, p99, max). One thread, every
//! socket in one mio poll: the watchers are read while the Lock's answer is on its way, one
//! read per event, as watchers in processes of their own would read.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use holdfast::proto::dlock as dl;
use mio::{Events, Interest, Poll, Token};

/// The locking connection's token (the watchers' are their indexes).
const LOCKER: Token = Token(usize::MAX);

struct Watcher {
    stream: mio::net::TcpStream,
    buf: Vec<u8>,
    /// Event frames read so far.
    events: u64,
}

fn frame(id: u64, ty: u64, key: &[u8]) -> Vec<u8> {
    let keys = [key];
    let lock = dl::LockFields {
        keys: &keys,
        ..Default::default()
    };
    let mut out = Vec::new();
    dl::encode_request_version(&mut out, dl::NATIVE_VERSION, Some(id), None, ty, Some(lock));
    out
}

/// One whole frame read from a blocking stream: its Response.
fn read_response(s: &mut TcpStream) -> Result<dl::Response, String> {
    let mut head = [0u8; dl::PREFIX_LEN];
    s.read_exact(&mut head).map_err(|e| format!("read: {e}"))?;
    let mut body = vec![0u8; u32::from_be_bytes(head) as usize];
    s.read_exact(&mut body).map_err(|e| format!("read: {e}"))?;
    dl::decode_response(&body).map_err(|e| format!("a bad response: {e}"))
}

fn ask(s: &mut TcpStream, request: &[u8]) -> Result<dl::Response, String> {
    s.write_all(request).map_err(|e| format!("write: {e}"))?;
    let r = read_response(s)?;
    if r.status != Some(dl::status::OK) {
        return Err(format!("refused: {r:?}"));
    }
    Ok(r)
}

/// Reads what `s` has into `buf`. A read shorter than `chunk` emptied the socket, so it is the
/// last one: edge-triggered readiness fires again for data that arrives after it, and one
/// syscall per event is what a real watcher would spend.
fn drain(s: &mut mio::net::TcpStream, chunk: &mut [u8], buf: &mut Vec<u8>) -> Result<(), String> {
    loop {
        match s.read(chunk) {
            Ok(0) => return Err("a connection closed".into()),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if n < chunk.len() {
                    return Ok(());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) => return Err(format!("read: {e}")),
        }
    }
}

/// Writes a whole (small) request to a non-blocking stream.
fn write_all(s: &mut mio::net::TcpStream, mut bytes: &[u8]) -> Result<(), String> {
    while !bytes.is_empty() {
        match s.write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(e) => return Err(format!("write: {e}")),
        }
    }
    Ok(())
}

/// Counts the whole frames in `w.buf` as events and drops them.
fn count_frames(w: &mut Watcher) {
    let mut at = 0;
    while let Ok((_, n)) = dl::parse_frame(&w.buf[at..], usize::MAX) {
        at += n;
        w.events += 1;
    }
    w.buf.drain(..at);
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn run(addr: SocketAddr, watchers: usize, warmup: usize, rounds: usize) -> Result<(), String> {
    let key = format!("fanout-{}", std::process::id()).into_bytes();
    let mut poll = Poll::new().map_err(|e| e.to_string())?;
    let mut ws = Vec::with_capacity(watchers);
    for i in 0..watchers {
        let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        ask(&mut s, &frame(1, dl::req_type::WATCH, &key))?;
        s.set_nonblocking(true).map_err(|e| e.to_string())?;
        let mut stream = mio::net::TcpStream::from_std(s);
        poll.registry()
            .register(&mut stream, Token(i), Interest::READABLE)
            .map_err(|e| e.to_string())?;
        ws.push(Watcher {
            stream,
            buf: Vec::new(),
            events: 0,
        });
    }
    let locker = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    locker.set_nodelay(true).map_err(|e| e.to_string())?;
    locker.set_nonblocking(true).map_err(|e| e.to_string())?;
    let mut locker = mio::net::TcpStream::from_std(locker);
    poll.registry()
        .register(&mut locker, LOCKER, Interest::READABLE)
        .map_err(|e| e.to_string())?;
    let mut answers = Vec::new();
    let mut events = Events::with_capacity(1024);
    let mut chunk = vec![0u8; 64 << 10];
    let mut latencies = Vec::with_capacity(rounds);
    let mut start = Instant::now();
    for round in 0..(warmup + rounds) as u64 {
        if round == warmup as u64 {
            start = Instant::now();
        }
        for (step, ty) in [(0, dl::req_type::LOCK), (1, dl::req_type::UNLOCK)] {
            let want = round * 2 + step + 1;
            let sent = Instant::now();
            // The watchers are read while the Lock's answer is on its way: the events and the
            // answer travel at once, and the time measured is the server's, not this loop's.
            write_all(&mut locker, &frame(2 + round * 2 + step, ty, &key))?;
            let mut answered = false;
            let mut behind = ws.iter().filter(|w| w.events < want).count();
            while behind > 0 || !answered {
                poll.poll(&mut events, Some(Duration::from_secs(10)))
                    .map_err(|e| e.to_string())?;
                if events.is_empty() {
                    return Err(format!("{behind} watchers got no event in 10 s"));
                }
                for ev in events.iter() {
                    if ev.token() == LOCKER {
                        drain(&mut locker, &mut chunk, &mut answers)?;
                        if let Ok((body, n)) = dl::parse_frame(&answers, usize::MAX) {
                            let r = dl::decode_response(body)
                                .map_err(|e| format!("a bad response: {e}"))?;
                            if r.status != Some(dl::status::OK) {
                                return Err(format!("refused: {r:?}"));
                            }
                            answers.drain(..n);
                            answered = true;
                        }
                        continue;
                    }
                    let w = &mut ws[ev.token().0];
                    let before = w.events;
                    drain(&mut w.stream, &mut chunk, &mut w.buf)?;
                    count_frames(w);
                    if before < want && w.events >= want {
                        behind -= 1;
                    }
                }
            }
            if step == 0 && round >= warmup as u64 {
                latencies.push(sent.elapsed());
            }
        }
    }
    let took = start.elapsed();
    let delivered = watchers as u64 * 2 * rounds as u64;
    latencies.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "fanout watchers={watchers} rounds={rounds} events={delivered} events_per_s={:.0} \
         grant_to_last_p50_ms={:.3} p99_ms={:.3} max_ms={:.3}",
        delivered as f64 / took.as_secs_f64(),
        ms(quantile(&latencies, 0.5)),
        ms(quantile(&latencies, 0.99)),
        ms(quantile(&latencies, 1.0)),
    );
    Ok(())
}

fn main() -> ExitCode {
    let mut opts = getopts::Options::new();
    opts.optopt("", "addr", "the dlock listener (127.0.0.1:2627)", "ADDR");
    opts.optopt("", "watchers", "watching connections (1000)", "N");
    opts.optopt("", "rounds", "Lock+Unlock rounds measured (200)", "N");
    opts.optopt(
        "",
        "warmup",
        "Lock+Unlock rounds first, not measured (20)",
        "N",
    );
    opts.optflag("h", "help", "this help");
    let m = match opts.parse(std::env::args().skip(1)) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("holdfast-fanout: {e}");
            return ExitCode::from(2);
        }
    };
    if m.opt_present("help") {
        print!("{}", opts.usage("usage: holdfast-fanout [options]"));
        return ExitCode::SUCCESS;
    }
    let parse = |name: &str, default: &str| -> Option<String> {
        Some(m.opt_str(name).unwrap_or_else(|| default.to_string()))
    };
    let (Some(addr), Some(watchers), Some(warmup), Some(rounds)) = (
        parse("addr", "127.0.0.1:2627").and_then(|a| a.parse::<SocketAddr>().ok()),
        parse("watchers", "1000").and_then(|n| n.parse::<usize>().ok()),
        parse("warmup", "20").and_then(|n| n.parse::<usize>().ok()),
        parse("rounds", "200").and_then(|n| n.parse::<usize>().ok()),
    ) else {
        eprintln!("holdfast-fanout: bad --addr, --watchers, --warmup or --rounds");
        return ExitCode::from(2);
    };
    holdfast::fdlimit::raise_to_hard();
    match run(addr, watchers, warmup, rounds) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("holdfast-fanout: {e}");
            ExitCode::FAILURE
        }
    }
}
