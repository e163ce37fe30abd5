//! The `holdfast` daemon: parse flags, raise the file limit, start the threads, print one line per
//! listener, wait for SIGINT or SIGTERM, stop cleanly.

use std::io::Write;
use std::process::ExitCode;

use holdfast::config::{self, Command};
use holdfast::server::Server;

fn main() -> ExitCode {
    let config = match config::parse(std::env::args_os().skip(1)) {
        Ok(Command::Run(c)) => c,
        Ok(Command::Help(text)) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Ok(Command::Version) => {
            println!("holdfast {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("holdfast: {e} (try --help)");
            return ExitCode::from(2);
        }
    };
    raise_fd_limit();
    // Block the stop signals in every thread (threads inherit the mask); this thread waits for
    // them with sigwait, so no handler runs in the middle of anything.
    let signals = stop_signals();
    // SAFETY: `signals` is an initialised sigset; pthread_sigmask only changes this thread's mask.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &signals, std::ptr::null_mut()) };

    let server = match Server::start(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("holdfast: {e}");
            return ExitCode::FAILURE;
        }
    };
    {
        let mut stdout = std::io::stdout().lock();
        for (proto, addr) in &server.addresses {
            let _ = writeln!(stdout, "holdfast: {} listening on {addr}", proto.name());
        }
        let _ = stdout.flush();
    }
    let mut signal = 0;
    // SAFETY: both pointers are valid for the duration of the call.
    unsafe { libc::sigwait(&signals, &mut signal) };
    server.stop();
    ExitCode::SUCCESS
}

fn stop_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set before sigaddset uses it.
    unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

/// Raise the open-file limit to the hard limit, as memcached does, so that `--max-connections`
/// is not cut short by a low default soft limit.
fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit read and write a plain struct we own.
    unsafe {
        let mut lim = std::mem::zeroed::<libc::rlimit>();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}
