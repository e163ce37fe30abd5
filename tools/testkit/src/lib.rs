//! The one launcher of the real daemon, shared by the integration tests (`tests/common`) and the
//! tools (`holdfast-scale`, `holdfast-soak`): start `holdfast` with its listeners on port 0, wait
//! (with a deadline) until it has printed the address of each, read its memory and descriptors
//! from `/proc`, and stop it by its PID.
//!
//! Owns: the child process it started, until it is reaped. Must not: be a dependency of the
//! daemon (it is a dev-dependency of `holdfast` and a dependency of `holdfast-tools` only), signal
//! any process but the child it started and has not reaped, or wait without a deadline.

pub mod pki;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How often `terminate` looks whether the child has exited.
const EXIT_POLL: Duration = Duration::from_millis(10);

/// A running daemon started by [`Daemon::spawn`]. Dropping it kills the child (SIGKILL) and
/// reaps it, unless it was already reaped.
pub struct Daemon {
    child: Child,
    /// (protocol, address) of each "listening" line, in the order printed.
    listeners: Vec<(String, SocketAddr)>,
}

impl Daemon {
    /// Starts `cmd` (stdin from /dev/null, stdout taken over: the daemon prints one line per
    /// listener there; stderr and everything else as the caller set them) and waits, at most
    /// `within`, until it has printed a "listening" line for each protocol in `wait_for`. Any
    /// other line on stdout, an early exit or the deadline is an error (the child is killed).
    pub fn spawn(cmd: &mut Command, wait_for: &[&str], within: Duration) -> Result<Daemon, String> {
        cmd.stdin(Stdio::null()).stdout(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", cmd.get_program().to_string_lossy()))?;
        let stdout = child.stdout.take();
        let mut d = Daemon {
            child,
            listeners: Vec::new(),
        };
        let stdout = stdout.ok_or("the daemon's stdout was not captured")?;
        // A reader thread, so that waiting for a line has a deadline; it ends at the daemon's
        // exit or at the first line after the wait (the receiver is gone).
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + within;
        while let Some(missing) = wait_for.iter().find(|p| d.addr(p).is_none()) {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match rx.recv_timeout(left) {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "the daemon printed no {missing} listening line within {within:?}"
                    ))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = match d.child.try_wait() {
                        Ok(Some(status)) => status.to_string(),
                        _ => "stdout closed".to_string(),
                    };
                    return Err(format!(
                        "the daemon exited ({status}) before printing its {missing} listener"
                    ));
                }
            };
            let listener = parse_listening(&line)
                .ok_or_else(|| format!("unexpected line from the daemon: {line}"))?;
            d.listeners.push(listener);
        }
        Ok(d)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The address `proto`'s listener printed, if it did.
    pub fn addr(&self, proto: &str) -> Option<SocketAddr> {
        self.listeners
            .iter()
            .find(|(p, _)| p == proto)
            .map(|&(_, a)| a)
    }

    /// Every listener seen so far: (protocol, address), in the order printed.
    pub fn listeners(&self) -> &[(String, SocketAddr)] {
        &self.listeners
    }

    /// The child's stderr, if the caller's command piped it (once).
    pub fn take_stderr(&mut self) -> Option<ChildStderr> {
        self.child.stderr.take()
    }

    /// Whether the child has not exited yet.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Resident memory in KiB, from /proc.
    pub fn rss_kib(&self) -> Option<u64> {
        rss_kib(self.pid())
    }

    /// Open file descriptors, from /proc.
    pub fn open_fds(&self) -> usize {
        open_fds(self.pid())
    }

    /// SIGTERM, then wait at most `grace` for the exit status. A child that has exited already
    /// gives its status without a signal; one that outlives `grace` is killed (SIGKILL) and the
    /// answer is an error.
    pub fn terminate(&mut self, grace: Duration) -> Result<ExitStatus, String> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Ok(status);
        }
        // SAFETY: kill(2) on the PID of our own child, which try_wait has just found not reaped
        // (only this value reaps it), so the PID cannot belong to another process.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let until = Instant::now() + grace;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if Instant::now() < until => std::thread::sleep(EXIT_POLL),
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return Err(format!(
                        "the daemon did not stop within {grace:?} of SIGTERM"
                    ));
                }
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// "holdfast: memcache listening on 127.0.0.1:11211" as (protocol, address).
pub fn parse_listening(line: &str) -> Option<(String, SocketAddr)> {
    let mut words = line.split_whitespace();
    match (
        words.next(),
        words.next(),
        words.next(),
        words.next(),
        words.next(),
        words.next(),
    ) {
        (Some("holdfast:"), Some(proto), Some("listening"), Some("on"), Some(addr), None) => {
            Some((proto.to_string(), addr.parse().ok()?))
        }
        _ => None,
    }
}

/// VmRSS of process `pid` in KiB, from /proc.
pub fn rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Open file descriptors of process `pid`, from /proc (0 if it cannot be read).
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_lines_parse_and_other_lines_do_not() {
        assert_eq!(
            parse_listening("holdfast: memcache listening on 127.0.0.1:11211"),
            Some(("memcache".into(), "127.0.0.1:11211".parse().unwrap()))
        );
        assert_eq!(
            parse_listening("holdfast: admin listening on [::1]:80"),
            Some(("admin".into(), "[::1]:80".parse().unwrap()))
        );
        for bad in [
            "",
            "holdfast: memcache listening on",
            "holdfast: memcache listening on nowhere",
            "holdfast: memcache listening on 127.0.0.1:1 extra",
            "memcached: memcache listening on 127.0.0.1:1",
        ] {
            assert_eq!(parse_listening(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn own_process_has_memory_and_descriptors() {
        assert!(rss_kib(std::process::id()).is_some_and(|k| k > 0));
        assert!(open_fds(std::process::id()) >= 3);
    }

    #[test]
    fn a_child_that_prints_no_listener_is_an_error_and_is_reaped() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo hello"]);
        let err = Daemon::spawn(&mut cmd, &["memcache"], Duration::from_secs(10))
            .err()
            .expect("not a daemon");
        assert!(err.contains("unexpected line"), "{err}");
        let mut cmd = Command::new("true");
        let err = Daemon::spawn(&mut cmd, &["memcache"], Duration::from_secs(10))
            .err()
            .expect("not a daemon");
        assert!(err.contains("exited"), "{err}");
    }

    #[test]
    fn a_silent_child_times_out_and_terminate_stops_a_running_one() {
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let t0 = Instant::now();
        let err = Daemon::spawn(&mut cmd, &["memcache"], Duration::from_millis(200))
            .err()
            .expect("silent");
        assert!(err.contains("within"), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(10));
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "echo 'holdfast: lockd listening on 127.0.0.1:9'; exec sleep 30",
        ]);
        let mut d = Daemon::spawn(&mut cmd, &["lockd"], Duration::from_secs(10)).expect("spawn");
        assert_eq!(d.addr("lockd"), Some("127.0.0.1:9".parse().unwrap()));
        assert!(d.is_running());
        let status = d
            .terminate(Duration::from_secs(10))
            .expect("stops on SIGTERM");
        assert!(!status.success());
        assert!(!d.is_running());
        // Already reaped: the status again, no signal to a PID that may be someone else's.
        assert_eq!(d.terminate(Duration::ZERO), Ok(status));
    }
}
