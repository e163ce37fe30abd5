//! `holdfast-client-bench`: lock+unlock pairs per second and their latency through
//! `holdfast-client` against the raw native protocol at depth 1, side by side.
//!
//! ```text
//! holdfast-client-bench --server HOST:PORT --threads N --seconds S [--mode client|raw] [--key-prefix P]
//! ```
//!
//! Each of N threads takes and releases its own key (exclusive, connection-bound) in a loop for
//! S seconds. `--mode client` (the default): the threads share ONE `holdfast_client::Client`
//! (one multiplexed connection). `--mode raw`: one connection per thread, one request in flight
//! (a v3 Lock, its answer, a v3 Unlock, its answer), framed by the shared codec
//! (`holdfast::proto::dlock`). Prints one line of JSON:
//! `{"mode":"client","threads":N,"pairs":P,"seconds":S,"pairs_per_s":X,"p50_us":A,"p99_us":B}`
//! (latency of one whole pair, in microseconds).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use holdfast::proto::dlock::{self as dl, req_type, status, LockFields};

struct Args {
    server: String,
    threads: usize,
    seconds: f64,
    raw: bool,
    prefix: String,
}

fn parse_args() -> Result<Args, String> {
    let mut opts = getopts::Options::new();
    opts.reqopt("", "server", "dlock server", "HOST:PORT")
        .reqopt("", "threads", "threads", "N")
        .reqopt("", "seconds", "how long", "S")
        .optopt(
            "",
            "mode",
            "client (one shared Client) or raw (v3 frames)",
            "client|raw",
        )
        .optopt(
            "",
            "key-prefix",
            "key names: P0, P1, ... (default bench-)",
            "P",
        );
    let m = opts
        .parse(std::env::args().skip(1))
        .map_err(|e| format!("{e}\n{}", opts.usage("Usage: holdfast-client-bench")))?;
    let num = |name: &str| -> Result<f64, String> {
        let s = m.opt_str(name).unwrap_or_default();
        s.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v > 0.0)
            .ok_or(format!("--{name} {s}: not a positive number"))
    };
    let raw = match m.opt_str("mode").as_deref() {
        None | Some("client") => false,
        Some("raw") => true,
        Some(other) => return Err(format!("--mode {other}: client or raw")),
    };
    Ok(Args {
        server: m.opt_str("server").unwrap_or_default(),
        threads: num("threads")? as usize,
        seconds: num("seconds")?,
        raw,
        prefix: m.opt_str("key-prefix").unwrap_or_else(|| "bench-".into()),
    })
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("holdfast-client-bench: {e}");
            std::process::exit(64);
        }
    };
    let until = Instant::now() + Duration::from_secs_f64(args.seconds);
    let client = if args.raw {
        None
    } else {
        match holdfast_client::Client::connect([args.server.clone()]) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("holdfast-client-bench: {e}");
                std::process::exit(69);
            }
        }
    };
    let started = Instant::now();
    let results: Vec<Result<Vec<u32>, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..args.threads)
            .map(|i| {
                let key = format!("{}{i}", args.prefix);
                let client = client.as_ref();
                let server = &args.server;
                s.spawn(move || match client {
                    Some(c) => run_client(c, &key, until),
                    None => run_raw(server, &key, until),
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let mut lat = Vec::new();
    for r in results {
        match r {
            Ok(v) => lat.extend(v),
            Err(e) => {
                eprintln!("holdfast-client-bench: {e}");
                std::process::exit(1);
            }
        }
    }
    lat.sort_unstable();
    let pct = |p: f64| -> u32 {
        if lat.is_empty() {
            return 0;
        }
        lat[((lat.len() - 1) as f64 * p).round() as usize]
    };
    println!(
        "{{\"mode\":\"{}\",\"threads\":{},\"pairs\":{},\"seconds\":{:.3},\"pairs_per_s\":{:.1},\"p50_us\":{},\"p99_us\":{}}}",
        if args.raw { "raw" } else { "client" },
        args.threads,
        lat.len(),
        elapsed,
        lat.len() as f64 / elapsed,
        pct(0.50),
        pct(0.99)
    );
}

fn micros(d: Duration) -> u32 {
    d.as_micros().min(u128::from(u32::MAX)) as u32
}

fn run_client(c: &holdfast_client::Client, key: &str, until: Instant) -> Result<Vec<u32>, String> {
    let mut lat = Vec::new();
    while Instant::now() < until {
        let t = Instant::now();
        let g = c.lock(key).acquire().map_err(|e| format!("lock: {e}"))?;
        g.unlock().map_err(|e| format!("unlock: {e}"))?;
        lat.push(micros(t.elapsed()));
    }
    Ok(lat)
}

/// One request, one answer (depth 1), through the shared codec.
fn round_trip(tcp: &mut TcpStream, buf: &mut Vec<u8>, frame: &[u8]) -> Result<bool, String> {
    tcp.write_all(frame).map_err(|e| e.to_string())?;
    loop {
        match dl::parse_frame(buf, 1 << 20) {
            Ok((body, n)) => {
                let r = dl::decode_response_view(body).map_err(|e| e.to_string())?;
                let ok = r.status_is(status::OK);
                buf.drain(..n);
                return Ok(ok);
            }
            Err(dl::FrameError::TooLarge) => return Err("frame too large".into()),
            Err(dl::FrameError::Incomplete) => {}
        }
        let mut chunk = [0u8; 4096];
        let n = tcp.read(&mut chunk).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn run_raw(server: &str, key: &str, until: Instant) -> Result<Vec<u32>, String> {
    let mut tcp = TcpStream::connect(server).map_err(|e| format!("{server}: {e}"))?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let keys = [key.as_bytes()];
    let fields = LockFields {
        keys: &keys,
        ..Default::default()
    };
    let (mut lock, mut unlock) = (Vec::new(), Vec::new());
    dl::encode_request_version(
        &mut lock,
        dl::NATIVE_VERSION,
        Some(1),
        None,
        req_type::LOCK,
        Some(fields),
    );
    dl::encode_request_version(
        &mut unlock,
        dl::NATIVE_VERSION,
        Some(2),
        None,
        req_type::UNLOCK,
        Some(fields),
    );
    let mut buf = Vec::new();
    let mut lat = Vec::new();
    while Instant::now() < until {
        let t = Instant::now();
        if !round_trip(&mut tcp, &mut buf, &lock)? {
            return Err("lock refused".into());
        }
        if !round_trip(&mut tcp, &mut buf, &unlock)? {
            return Err("unlock refused".into());
        }
        lat.push(micros(t.elapsed()));
    }
    Ok(lat)
}
