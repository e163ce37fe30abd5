//! The daemon's Prometheus histograms: their buckets and the counts in them. Below every other
//! module: the owner, the cluster node and the admin port fill and show them.

/// Latency buckets (upper bounds, seconds) of the lock-request histograms: from a fast
/// in-memory grant (tens of microseconds) to a daemon in trouble (a second).
pub const LATENCY_BOUNDS: [f64; 14] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 1.0,
];

/// Buckets (upper bounds, seconds) of the cluster's histograms (proposal to apply, log sync):
/// from a fast local sync to past the two election timeouts after which a proposal is given up.
pub const CLUSTER_BOUNDS: [f64; 14] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// A Prometheus histogram: counts per bucket (not cumulative; the last is +Inf), sum, count.
/// Its bounds are [`LATENCY_BOUNDS`] unless it was filled with [`Histogram::observe_in`].
#[derive(Clone, Debug, Default)]
pub struct Histogram {
    pub buckets: [u64; LATENCY_BOUNDS.len() + 1],
    pub sum_ns: u128,
    pub count: u64,
}

impl Histogram {
    /// Count `n` observations of `ns` nanoseconds each.
    pub fn observe(&mut self, ns: u64, n: u64) {
        self.observe_in(&LATENCY_BOUNDS, ns, n);
    }

    /// Count `n` observations of `ns` nanoseconds each, in buckets of `bounds`.
    pub fn observe_in(&mut self, bounds: &[f64; LATENCY_BOUNDS.len()], ns: u64, n: u64) {
        let secs = ns as f64 / 1e9;
        let i = bounds
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(bounds.len());
        self.buckets[i] += n;
        self.sum_ns += u128::from(ns) * u128::from(n);
        self.count += n;
    }
}
