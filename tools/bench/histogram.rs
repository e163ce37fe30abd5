//! A log-linear latency histogram in the manner of HdrHistogram: fixed buckets, exact below
//! 128 ns, then 128 sub-buckets per power of two up to 2^64, so any recorded value is reported
//! within 1/128 (0.8 %) above itself.
//!
//! Owns: counting samples and answering percentiles, min, max and mean.
//! Must not: allocate per sample (the bucket array, 58 KiB, is allocated once, in
//! [`Histogram::new`]), read a clock, or lose a sample.

/// log2 of the sub-buckets per power of two: 128 sub-buckets bound the relative error to 1/128,
/// finer than any difference worth reporting between two latency runs.
const SUB_BITS: u32 = 7;
const SUB: usize = 1 << SUB_BITS;
/// Every u64 has a bucket, so nothing needs an overflow bucket with no upper bound.
const MAX_BITS: u32 = 64;
/// 128 exact buckets for 0..128, then 128 for each power of two from 2^7 to 2^63.
const BUCKETS: usize = SUB + (MAX_BITS - SUB_BITS) as usize * SUB;

#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u64]>,
    total: u64,
    sum: u128,
    min: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    pub fn new() -> Self {
        Histogram {
            counts: vec![0; BUCKETS].into_boxed_slice(),
            total: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }

    /// The bucket of `v`: exact below 128, else the power of two and the top 7 bits below the
    /// leading one.
    fn index(v: u64) -> usize {
        if v < SUB as u64 {
            return v as usize;
        }
        let high = 63 - v.leading_zeros(); // SUB_BITS..MAX_BITS
        let shift = high - SUB_BITS;
        // Lossless: (v >> shift) is in SUB..2*SUB.
        let mantissa = (v >> shift) as usize;
        SUB + shift as usize * SUB + (mantissa - SUB)
    }

    /// The largest value that falls into bucket `i` (HdrHistogram's "highest equivalent value").
    fn highest(i: usize) -> u64 {
        if i < SUB {
            return i as u64;
        }
        let shift = ((i - SUB) / SUB) as u32;
        let mantissa = ((i - SUB) % SUB + SUB) as u128;
        // In u128: the last bucket ends at 2^64 - 1.
        (((mantissa + 1) << shift) - 1) as u64
    }

    pub fn record(&mut self, v: u64) {
        self.counts[Self::index(v)] += 1;
        self.total += 1;
        self.sum += u128::from(v);
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.total += other.total;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    pub fn reset(&mut self) {
        self.counts.fill(0);
        self.total = 0;
        self.sum = 0;
        self.min = u64::MAX;
        self.max = 0;
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    pub fn min(&self) -> u64 {
        if self.total == 0 {
            0
        } else {
            self.min
        }
    }

    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum as f64 / self.total as f64
        }
    }

    /// The value at quantile `q` (0.0..=1.0): the sample of rank ceil(q * n) (at least 1) in
    /// sorted order, reported as the highest value of its bucket, never above the true maximum.
    /// 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::highest(i).clamp(self.min, self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference: rank ceil(q * n) of the sorted samples.
    fn exact(sorted: &[u64], q: f64) -> u64 {
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1]
    }

    fn check_against_sorted(samples: &[u64]) {
        let mut h = Histogram::new();
        for &s in samples {
            h.record(s);
        }
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        for q in [0.0, 0.001, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999, 1.0] {
            let want = exact(&sorted, q);
            let got = h.quantile(q);
            // Never below the true value, and above it by at most one bucket's width (1/128).
            assert!(got >= want, "q {q}: got {got} < exact {want}");
            assert!(
                got - want <= want / SUB as u64,
                "q {q}: got {got}, exact {want}"
            );
        }
        assert_eq!(h.count(), samples.len() as u64);
        assert_eq!(h.max(), sorted[sorted.len() - 1]);
        assert_eq!(h.min(), sorted[0]);
        assert_eq!(h.quantile(1.0), h.max());
    }

    /// Reproducible samples: the project's one generator.
    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut rng = holdfast::rng::Rng(seed);
        move || rng.next()
    }

    #[test]
    fn percentiles_match_a_sorted_vector_within_one_bucket() {
        let mut next = rng(1);
        // Uniform small, log-uniform over the whole range, and a bimodal latency shape.
        let small: Vec<u64> = (0..10_000).map(|_| next() % 300).collect();
        check_against_sorted(&small);
        // Log-uniform over the whole range.
        let wide: Vec<u64> = (0..50_000).map(|_| next() >> (next() % 64)).collect();
        check_against_sorted(&wide);
        let bimodal: Vec<u64> = (0..20_000)
            .map(|i| {
                if i % 100 == 0 {
                    5_000_000 + next() % 1_000_000
                } else {
                    20_000 + next() % 10_000
                }
            })
            .collect();
        check_against_sorted(&bimodal);
        check_against_sorted(&[42]);
        check_against_sorted(&[0, u64::MAX]);
        check_against_sorted(&[1 << 41, 1 << 50, 1 << 45]);
    }

    #[test]
    fn values_below_128_are_exact() {
        let samples: Vec<u64> = (0..128).collect();
        let mut h = Histogram::new();
        for &s in &samples {
            h.record(s);
        }
        for (i, &s) in samples.iter().enumerate() {
            let q = (i + 1) as f64 / samples.len() as f64;
            assert_eq!(h.quantile(q), s);
        }
    }

    #[test]
    fn buckets_tile_the_range_without_gaps() {
        // Each bucket starts right after the previous one ends.
        for i in 1..BUCKETS {
            let start = Histogram::highest(i - 1) + 1;
            assert_eq!(Histogram::index(start), i, "bucket {i} starts at {start}");
            assert_eq!(Histogram::index(Histogram::highest(i)), i);
        }
        assert_eq!(Histogram::highest(BUCKETS - 1), u64::MAX);
        assert_eq!(Histogram::index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn merge_equals_recording_everything_in_one() {
        let mut next = rng(7);
        let (mut a, mut b, mut both) = (Histogram::new(), Histogram::new(), Histogram::new());
        for i in 0..10_000 {
            let v = next() >> (next() % 64);
            if i % 3 == 0 { &mut a } else { &mut b }.record(v);
            both.record(v);
        }
        a.merge(&b);
        for q in [0.5, 0.9, 0.99, 0.999, 1.0] {
            assert_eq!(a.quantile(q), both.quantile(q));
        }
        assert_eq!(
            (a.count(), a.min(), a.max()),
            (both.count(), both.min(), both.max())
        );
        assert_eq!(a.mean(), both.mean());
        a.reset();
        assert_eq!(
            (a.count(), a.quantile(0.99), a.max(), a.min()),
            (0, 0, 0, 0)
        );
    }
}
