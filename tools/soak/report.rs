//! Counters shared by every client thread, and the log of what went wrong.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Problems printed as they happen (the rest are only counted).
const PRINT_FIRST: u64 = 30;

macro_rules! counters {
    ($($name:ident),* $(,)?) => {
        #[derive(Default)]
        pub struct Counters { $(pub $name: AtomicU64,)* }
        impl Counters {
            pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name.load(Ordering::Relaxed)),)*]
            }
        }
    };
}

counters!(
    mc_grants,
    mc_conflicts,
    mc_stores_refused,
    lockd_grants,
    lockd_waited,
    lockd_orphans,
    lockd_adoptions,
    lockd_syncs,
    dlock_grants,
    dlock_leases,
    dlock_lapses,
    dlock_timeouts,
    dlock_idle,
    reconnects,
    resets,
    gave_up,
    dlock_gave_up_over_lease,
    slow_sends,
    hostile,
    // Cluster mode: the no-quorum answers, connections a node closed (killed,
    // fenced, sessions expired) or refused, grants over a mark whose holder's node may have
    // had its sessions expired (rule 10), and tokens checked (rule 11).
    no_quorum,
    closed_by_node,
    past_session_bound,
    tokens_checked,
);

pub struct Report {
    pub started: Instant,
    pub ops: AtomicU64,
    pub double_grants: AtomicU64,
    pub token_violations: AtomicU64,
    pub errors: AtomicU64,
    pub c: Counters,
}

impl Report {
    pub fn new() -> Report {
        Report {
            started: Instant::now(),
            ops: AtomicU64::new(0),
            double_grants: AtomicU64::new(0),
            token_violations: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            c: Counters::default(),
        }
    }

    pub fn op(&self) {
        self.ops.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self, c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn double_grant(&self, text: String) {
        let n = self.double_grants.fetch_add(1, Ordering::Relaxed)
            + self.errors.load(Ordering::Relaxed);
        self.log(n, format!("DOUBLE GRANT: {text}"));
    }

    pub fn error(&self, text: String) {
        let n = self.errors.fetch_add(1, Ordering::Relaxed)
            + self.double_grants.load(Ordering::Relaxed);
        self.log(n, format!("error: {text}"));
    }

    pub fn token_violation(&self, text: String) {
        let n = self.token_violations.fetch_add(1, Ordering::Relaxed) + self.failures();
        self.log(n, format!("TOKEN VIOLATION: {text}"));
    }

    fn log(&self, n: u64, line: String) {
        let at = self.started.elapsed().as_secs_f64();
        let line = format!("soak: [{at:.3}s] {line}");
        if n < PRINT_FIRST {
            eprintln!("{line}");
        } else if n == PRINT_FIRST {
            eprintln!("soak: (further problems are counted, not printed)");
        }
    }

    pub fn failures(&self) -> u64 {
        self.double_grants.load(Ordering::Relaxed)
            + self.errors.load(Ordering::Relaxed)
            + self.token_violations.load(Ordering::Relaxed)
    }
}
