//! The process's open-file limit (`RLIMIT_NOFILE`): read it, and raise the soft limit to the hard
//! one. Shared by the daemon (at start, as memcached does, so that `--max-connections` is not cut
//! short by a low default soft limit), the load tools (many client sockets) and the tests.
//!
//! Owns: the two libc calls and their `unsafe`. Must not: lower a limit, or fail loudly (a limit
//! that cannot be raised leaves the process as it was; the caller reads what is in force).

/// The (soft, hard) open-file limits in force, or `None` if they cannot be read.
pub fn limits() -> Option<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into a plain struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    Some((lim.rlim_cur, lim.rlim_max))
}

/// Raise the soft open-file limit to the hard limit (if it is lower); returns the soft limit
/// then in force (0 if it cannot be read).
pub fn raise_to_hard() -> u64 {
    let Some((soft, hard)) = limits() else {
        return 0;
    };
    if soft < hard {
        let lim = libc::rlimit {
            rlim_cur: hard,
            rlim_max: hard,
        };
        // SAFETY: setrlimit reads a plain struct we own.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    }
    limits().map_or(0, |(soft, _)| soft)
}

#[cfg(test)]
mod tests {
    #[test]
    fn raising_leaves_the_soft_limit_at_the_hard_limit() {
        let (_, hard) = super::limits().expect("getrlimit");
        assert_eq!(super::raise_to_hard(), hard);
        assert_eq!(super::limits(), Some((hard, hard)));
    }
}
