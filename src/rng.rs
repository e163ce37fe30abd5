//! xorshift64*: a tiny seeded pseudo-random generator for model tests, fuzz-style tests and load
//! tools. Deterministic (a failing seed replays exactly), no dependency. Not for anything that
//! needs unpredictability.
//!
//! The one generator of the project: the library's tests and simulators, the integration tests
//! (`tests/`) and the tools (`tools/`: bench, scale, soak) all use this one rather than a copy.

/// xorshift64* (Vigna). The seed must not be 0 (it would stay 0): [`Rng::new`] maps 0 to 1.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    /// A generator for a seed given by a person or a counter (0, 1, 2, ...): the seed is spread
    /// over all 64 bits (a multiply by the golden ratio) so that neighbouring seeds start far
    /// apart, and made odd so that it is never 0.
    pub fn mixed(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// The next value. (Named like `Iterator::next` because every test reads it that way; it is
    /// not an iterator: the sequence never ends.)
    #[allow(clippy::should_implement_trait)]
    #[inline]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform enough in `0..n` for tests (modulo bias is irrelevant at these sizes). `n > 0`.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform enough in `lo..=hi` (`lo <= hi`, not the whole u64 range).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// `below` for indices.
    pub fn index(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A value of random bit width, so that small and large numbers (every varint length) show up.
    pub fn wide(&mut self) -> u64 {
        match self.below(65) {
            64 => self.next(),
            bits => self.next() & ((1u64 << bits) - 1),
        }
    }

    /// Random bytes, `0..=max_len` of them.
    pub fn bytes(&mut self, max_len: u64) -> Vec<u8> {
        let len = self.below(max_len + 1);
        (0..len).map(|_| self.next() as u8).collect()
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn the_same_seed_gives_the_same_sequence_and_zero_is_not_stuck() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let xs: Vec<u64> = (0..5).map(|_| a.next()).collect();
        assert_eq!(xs, (0..5).map(|_| b.next()).collect::<Vec<_>>());
        assert_ne!(xs[0], xs[1]);
        let mut z = Rng::new(0);
        assert_ne!(z.next(), 0);
        assert!((0..1000).all(|_| z.below(10) < 10 && z.index(3) < 3));
        assert!((0..1000).all(|_| (5..=7).contains(&z.range(5, 7))));
        assert_ne!(Rng::mixed(1).next(), Rng::mixed(2).next());
        assert_ne!(Rng::mixed(0).next(), 0);
    }
}
