//! `holdfast-bench`: a load generator for holdfast, memcached and redis-server.
//!
//! ```text
//!   main: flags → Config; prepare the key space (set / clear, one blocking connection)
//!     │ spawn --threads workers, each connecting its share of --connections
//!     │ all connected → one common start (epoch, warmup end, end) to every worker
//!     ▼
//!   worker 0 … worker N-1: mio Poll + Slab of connections, up to --pipeline ops in flight each,
//!     replies checked with the protocol's decoder, latency from each op's intended start
//!     │ Report::Window every second, Report::Done at the end (crossbeam channel)
//!     ▼
//!   main: progress line per second (runs over 3 s), then the totals and one `summary` line
//! ```
//!
//! Exit status: 0 after a run (errors are reported, not fatal), 1 when it could not connect or
//! prepare the keys or no operation succeeded, 2 for bad flags.

mod codec;
mod config;
mod etcd;
mod histogram;
mod worker;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use config::{Command, Config, Workload};
use histogram::Histogram;
use worker::{Assignment, Report, Shared, Start, ThreadResult};

/// Runs longer than this print a progress line per second.
const PROGRESS_ABOVE: Duration = Duration::from_secs(3);
/// Preparing the key space (10 000 sets take milliseconds) must finish within this.
const PREPARE_TIMEOUT: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    let config = match config::parse(std::env::args_os().skip(1)) {
        Ok(Command::Run(c)) => c,
        Ok(Command::Help(text)) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("holdfast-bench: {e} (try --help)");
            return ExitCode::from(2);
        }
    };
    // A thousand connections need more than the common default of 1024 descriptors.
    holdfast::fdlimit::raise_to_hard();
    match run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("holdfast-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(config: Config) -> Result<(), String> {
    if config.handshakes {
        return run_handshakes(&config);
    }
    // Lock tables cannot be cleared of a killed run's leftovers (old keeps orphans for seconds),
    // so their names are made distinct per run; stores are prepared, so their keys are stable.
    let prefix = if config.prepare().is_some() {
        b"hfb:".to_vec()
    } else {
        format!("hfb-{}:", std::process::id()).into_bytes()
    };
    let rel_sent = if config.workload == Workload::Contended {
        (0..config.keys).map(|_| AtomicU64::new(0)).collect()
    } else {
        Vec::new()
    };
    let shared = Arc::new(Shared {
        value: vec![b'x'; config.value_size],
        prefix,
        rel_sent,
        config,
    });
    let config = &shared.config;
    print_header(config);
    if let Some(req) = config.prepare() {
        worker::prepare(&shared, req, Instant::now() + PREPARE_TIMEOUT)?;
    }

    let (report_tx, reports) = crossbeam_channel::unbounded();
    let mut starts = Vec::new();
    let mut handles = Vec::new();
    let mut first = 0;
    for thread in 0..config.threads {
        // Spread the remainder over the first threads.
        let count = config.connections / config.threads
            + usize::from(thread < config.connections % config.threads);
        let (start_tx, start_rx) = crossbeam_channel::bounded(1);
        starts.push(start_tx);
        let (shared, tx) = (Arc::clone(&shared), report_tx.clone());
        let a = Assignment {
            thread,
            first,
            count,
        };
        first += count;
        let handle = std::thread::Builder::new()
            .name(format!("bench-{thread}"))
            .spawn(move || worker::run(shared, a, tx, start_rx))
            .map_err(|e| format!("starting a thread: {e}"))?;
        handles.push(handle);
    }
    drop(report_tx);

    // Wait until every thread has connected; one failure stops them all.
    let mut failure = None;
    for _ in 0..config.threads {
        match reports.recv() {
            Ok(Report::Connected { result: Ok(()), .. }) => {}
            Ok(Report::Connected {
                result: Err(e),
                thread,
            }) => failure = failure.or(Some(format!("thread {thread}: {e}"))),
            _ => failure = failure.or(Some("a thread ended before connecting".into())),
        }
    }
    if let Some(e) = failure {
        for s in &starts {
            let _ = s.send(None);
        }
        for h in handles {
            let _ = h.join();
        }
        return Err(e);
    }
    let warm_ns = config.warmup.as_nanos() as u64;
    let start = Start {
        epoch: Instant::now(),
        warm_ns,
        end_ns: warm_ns + config.duration.as_nanos() as u64,
    };
    for s in &starts {
        let _ = s.send(Some(start));
    }

    let total = collect(config, &reports, warm_ns);
    for h in handles {
        let _ = h.join();
    }
    print_result(config, &total);
    if total.ops == 0 {
        return Err("no operation succeeded".into());
    }
    Ok(())
}

/// Gather windows (printing progress) and the threads' results, merged.
fn collect(
    config: &Config,
    reports: &crossbeam_channel::Receiver<Report>,
    warm_ns: u64,
) -> ThreadResult {
    let progress = config.duration + config.warmup > PROGRESS_ABOVE;
    let mut windows: BTreeMap<u64, (usize, u64, u64, Histogram)> = BTreeMap::new();
    let mut total = ThreadResult::default();
    let mut done = 0;
    while done < config.threads {
        let Ok(report) = reports.recv() else { break };
        match report {
            Report::Window {
                index,
                ops,
                errors,
                hist,
            } => {
                let w = windows
                    .entry(index)
                    .or_insert_with(|| (0, 0, 0, Histogram::new()));
                w.0 += 1;
                w.1 += ops;
                w.2 += errors;
                w.3.merge(&hist);
                if w.0 == config.threads {
                    if progress {
                        let warmup = (index + 1) * worker::WINDOW_NS <= warm_ns;
                        println!(
                            "[{:>4}s]{} rate={:.0}/s p99={} errors={}",
                            index + 1,
                            if warmup { " warmup" } else { "" },
                            w.1 as f64,
                            us(w.3.quantile(0.99)),
                            w.2
                        );
                    }
                    windows.remove(&index);
                }
            }
            Report::Done(r) => {
                done += 1;
                total.hist.merge(&r.hist);
                total.ops += r.ops;
                total.errors += r.errors;
                total.unsent += r.unsent;
                total.unfinished += r.unfinished;
                total.handoffs += r.handoffs;
                total.wakeups += r.wakeups;
                for e in r.first_errors {
                    if total.first_errors.len() < worker::ERRORS_SHOWN {
                        total.first_errors.push(e);
                    }
                }
            }
            Report::Connected { .. } => {}
        }
    }
    total
}

fn print_header(config: &Config) {
    let lp = match config.rate {
        Some(r) => format!("open loop at {r:.0} ops/s"),
        None => "closed loop".into(),
    };
    let servers: Vec<String> = config.servers.iter().map(|s| s.to_string()).collect();
    let (connections, pipeline) = config.requested();
    let sockets = if config.sockets_per_connection > 1 {
        format!(
            " ({} sockets, one request in flight each)",
            config.connections
        )
    } else {
        String::new()
    };
    println!(
        "holdfast-bench: {} {} against {}, {} connections x pipeline {}{sockets}, {} thread{}, {}, {:.1} s (+{:.1} s warmup)",
        config.protocol.name(),
        workload_name(config),
        servers.join(","),
        connections,
        pipeline,
        config.threads,
        if config.threads == 1 { "" } else { "s" },
        lp,
        config.duration.as_secs_f64(),
        config.warmup.as_secs_f64(),
    );
}

/// Nanoseconds as microseconds with one decimal.
fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1000.0)
}

fn print_result(config: &Config, t: &ThreadResult) {
    let secs = config.duration.as_secs_f64();
    let rate = t.ops as f64 / secs;
    let h = &t.hist;
    let contended = config.workload == Workload::Contended;
    let what = if contended { "grants" } else { "ops" };
    println!("{what:<9} {} in {secs:.1} s", t.ops);
    println!("rate      {rate:.0} {what}/s");
    println!("errors    {}", t.errors);
    for e in &t.first_errors {
        println!("  error: {e}");
    }
    if t.errors as usize > t.first_errors.len() {
        println!(
            "  ... and {} more",
            t.errors as usize - t.first_errors.len()
        );
    }
    if t.unsent > 0 {
        println!(
            "unsent    {} ops were due but never sent, even during the drain: the server could not keep up with --rate (their latency is missing from the figures below)",
            t.unsent
        );
    }
    if t.unfinished > 0 {
        println!(
            "unfinished {} ops had no reply within the drain time",
            t.unfinished
        );
    }
    let label = if contended { "hand-off" } else { "latency" };
    println!(
        "{label:<9} p50={}us p90={}us p99={}us p999={}us max={}us (min {}us, mean {}us, {} samples)",
        us(h.quantile(0.5)),
        us(h.quantile(0.9)),
        us(h.quantile(0.99)),
        us(h.quantile(0.999)),
        us(h.max()),
        us(h.min()),
        us(h.mean() as u64),
        h.count()
    );
    let wakeups_per_grant = if t.handoffs == 0 {
        0.0
    } else {
        t.wakeups as f64 / t.handoffs as f64
    };
    if contended {
        println!(
            "hand-offs {} (grants after waiting), wake-ups per grant {wakeups_per_grant:.2}",
            t.handoffs
        );
    }
    let (connections, pipeline) = config.requested();
    let mut summary = format!(
        "summary protocol={} workload={} conns={} pipeline={} sockets={} threads={} ops={} rate={rate:.0} errors={} p50_us={} p90_us={} p99_us={} p999_us={} max_us={}",
        config.protocol.name(),
        workload_name(config),
        connections,
        pipeline,
        config.connections,
        config.threads,
        t.ops,
        t.errors,
        us(h.quantile(0.5)),
        us(h.quantile(0.9)),
        us(h.quantile(0.99)),
        us(h.quantile(0.999)),
        us(h.max()),
    );
    if let Some(r) = config.rate {
        summary += &format!(" target_rate={r:.0} unsent={}", t.unsent);
    }
    if contended {
        summary += &format!(
            " names={} handoffs={} wakeups_per_grant={wakeups_per_grant:.2}",
            config.keys, t.handoffs
        );
    }
    println!("{summary}");
}

/// `--handshakes`: each thread opens connections one after another, each with a full TLS
/// handshake when `--tls` (session resumption off) and one `version` round trip, for the
/// warm-up and the duration; the rate counts connections finished in the measured window, the
/// latency is from `connect` to the reply. Without `--tls` it measures the accept path alone.
fn run_handshakes(config: &Config) -> Result<(), String> {
    use std::io::{Read, Write};
    let tls = config.tls.as_ref().map(|tls| {
        let mut tls = (**tls).clone();
        tls.resumption = holdfast::tls::rustls::client::Resumption::disabled();
        Arc::new(tls)
    });
    print_header(config);
    let epoch = Instant::now();
    let warm = config.warmup;
    let end = warm + config.duration;
    let mut handles = Vec::new();
    for thread in 0..config.threads {
        let (tls, server) = (tls.clone(), config.servers[thread % config.servers.len()]);
        handles.push(std::thread::spawn(move || {
            let mut hist = Histogram::new();
            let mut errors = 0u64;
            let mut first_error = None;
            let mut reply = [0u8; 256];
            while epoch.elapsed() < end {
                let t0 = Instant::now();
                let one = (|| -> Result<(), String> {
                    let tcp =
                        std::net::TcpStream::connect_timeout(&server, worker::CONNECT_TIMEOUT)
                            .map_err(|e| e.to_string())?;
                    let _ = tcp.set_nodelay(true);
                    tcp.set_read_timeout(Some(worker::CONNECT_TIMEOUT))
                        .map_err(|e| e.to_string())?;
                    let mut s: Box<dyn worker::ReadWrite> = match &tls {
                        Some(tls) => {
                            let s = worker::tls_connect(tls, server, tcp)?;
                            s.sock
                                .set_read_timeout(Some(worker::CONNECT_TIMEOUT))
                                .map_err(|e| e.to_string())?;
                            Box::new(s)
                        }
                        None => Box::new(tcp),
                    };
                    s.write_all(b"version\r\n").map_err(|e| e.to_string())?;
                    let mut got = 0;
                    while !reply[..got].ends_with(b"\r\n") {
                        let n = s.read(&mut reply[got..]).map_err(|e| e.to_string())?;
                        if n == 0 || got + n == reply.len() {
                            return Err("no version reply".into());
                        }
                        got += n;
                    }
                    if !reply.starts_with(b"VERSION ") {
                        return Err("not a version reply".into());
                    }
                    Ok(())
                })();
                let measured = t0.duration_since(epoch) >= warm && epoch.elapsed() <= end;
                match one {
                    Ok(()) if measured => hist.record(t0.elapsed().as_nanos() as u64),
                    Ok(()) => {}
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert(e);
                    }
                }
            }
            (hist, errors, first_error)
        }));
    }
    let mut total = ThreadResult::default();
    for h in handles {
        let (hist, errors, first) = h.join().map_err(|_| "a thread panicked".to_string())?;
        total.ops += hist.count();
        total.hist.merge(&hist);
        total.errors += errors;
        total.first_errors.extend(first);
    }
    print_result(config, &total);
    if total.ops == 0 {
        return Err("no handshake succeeded".into());
    }
    Ok(())
}

/// The workload as reported: `--handshakes` replaces the workload.
fn workload_name(config: &Config) -> &'static str {
    if config.handshakes {
        "handshakes"
    } else {
        config.workload.name()
    }
}
