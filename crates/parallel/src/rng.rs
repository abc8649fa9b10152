//! Small deterministic random numbers: seeds derived from (seed, counter) and shuffles.
//!
//! The one generator of the workspace: the [`DistributedSampler`](crate::DistributedSampler)
//! shuffles data with it from `(seed, epoch)`, and the `afterburner` Accelerator derives its
//! backend seeds with it from `(seed, optimizer step)`. Burn 0.21 cannot read a backend's RNG
//! state back, so nothing here needs to: saving the seed and the counters is enough to replay
//! both exactly.

/// SplitMix64: a fast, well-mixed 64-bit generator (Steele, Lea, Flood 2014).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (n > 0), by rejection so it is unbiased.
    pub fn below(&mut self, n: u64) -> u64 {
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let x = self.next_u64();
            if x < zone {
                return x % n;
            }
        }
    }
}

/// A seed for stream `stream` (an epoch, a step) derived from a base `seed`.
pub fn derive_seed(seed: u64, domain: u64, stream: u64) -> u64 {
    let mut g = SplitMix64::new(seed ^ domain.rotate_left(32));
    let a = g.next_u64();
    SplitMix64::new(a ^ stream).next_u64()
}

/// `0..n` in an order fixed by `seed` (Fisher-Yates).
pub fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut g = SplitMix64::new(seed);
    for i in (1..n).rev() {
        let j = g.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_is_a_fixed_shuffle() {
        let a = permutation(100, 7);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        assert_eq!(a, permutation(100, 7));
        assert_ne!(a, permutation(100, 8));
    }

    #[test]
    fn derived_seeds_differ_by_stream_and_domain() {
        assert_ne!(derive_seed(1, 0, 0), derive_seed(1, 0, 1));
        assert_ne!(derive_seed(1, 0, 0), derive_seed(1, 1, 0));
        assert_eq!(derive_seed(1, 2, 3), derive_seed(1, 2, 3));
    }
}
