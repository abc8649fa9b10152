//! [`DistributedSampler`]: which items each rank sees in an epoch.

use crate::ParallelError;

/// Splits `len` items into disjoint per-rank shards each epoch, like PyTorch's
/// `DistributedSampler`: shuffled from `(seed, epoch)` (the same order on every rank), then
/// either padded by repeating items from the start so every rank gets the same count
/// (`drop_last = false`, the default), or trimmed to a multiple of the world size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedSampler {
    len: usize,
    world_size: usize,
    rank: usize,
    seed: Option<u64>,
    drop_last: bool,
}

impl DistributedSampler {
    /// A sampler over `len` items for `rank` of `world_size`, in order (no shuffle), padded.
    pub fn new(len: usize, world_size: usize, rank: usize) -> Result<Self, ParallelError> {
        if world_size == 0 || rank >= world_size {
            return Err(ParallelError::InvalidConfig {
                field: "rank",
                value: format!("{rank} of world size {world_size}"),
                expected: "0 <= rank < world_size, world_size >= 1",
            });
        }
        Ok(Self {
            len,
            world_size,
            rank,
            seed: None,
            drop_last: false,
        })
    }

    /// Shuffles each epoch from `(seed, epoch)`.
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Trims to a multiple of the world size instead of padding.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Items per rank per epoch.
    pub fn num_samples(&self) -> usize {
        if self.drop_last {
            self.len / self.world_size
        } else {
            self.len.div_ceil(self.world_size)
        }
    }

    /// Items repeated to pad the last round (0 with `drop_last`); `gather_for_metrics`-style
    /// evaluation drops this many from the gathered results.
    pub fn num_padded(&self) -> usize {
        self.num_samples() * self.world_size - self.len.min(self.num_samples() * self.world_size)
    }

    /// This rank's item indices for `epoch`.
    pub fn indices(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        if let Some(seed) = self.seed {
            shuffle(&mut order, seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        }
        shard(order, self.rank, self.world_size, self.drop_last)
    }
}

/// `rank`'s share of `order` (the same order on every rank): every `world_size`-th item from
/// position `rank`, after padding `order` by repeating its start to a multiple of
/// `world_size` (or trimming it, with `drop_last`), so every rank gets as many items.
pub fn shard(mut order: Vec<usize>, rank: usize, world_size: usize, drop_last: bool) -> Vec<usize> {
    let world_size = world_size.max(1);
    let per_rank = if drop_last {
        order.len() / world_size
    } else {
        order.len().div_ceil(world_size)
    };
    let total = per_rank * world_size;
    if total > order.len() && !order.is_empty() {
        let pad: Vec<usize> = order
            .iter()
            .copied()
            .cycle()
            .take(total - order.len())
            .collect();
        order.extend(pad);
    }
    order.truncate(total);
    order.into_iter().skip(rank).step_by(world_size).collect()
}

/// Fisher-Yates with a xorshift64* generator seeded from `seed`.
fn shuffle(items: &mut [usize], seed: u64) {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    for i in (1..items.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_disjoint_and_cover_everything() {
        for (len, world) in [(10, 2), (10, 3), (7, 4), (3, 4)] {
            let all: Vec<Vec<usize>> = (0..world)
                .map(|r| {
                    DistributedSampler::new(len, world, r)
                        .unwrap()
                        .shuffle(5)
                        .indices(1)
                })
                .collect();
            let n = all[0].len();
            assert!(all.iter().all(|s| s.len() == n), "equal shard sizes");
            let mut seen: Vec<usize> = all.concat();
            assert_eq!(seen.len(), n * world);
            seen.sort();
            seen.dedup();
            assert_eq!(
                seen,
                (0..len).collect::<Vec<_>>(),
                "len {len} world {world}"
            );
            let s = DistributedSampler::new(len, world, 0).unwrap();
            assert_eq!(s.num_padded(), n * world - len);
        }
    }

    #[test]
    fn drop_last_trims_and_epochs_reshuffle() {
        let shards: Vec<Vec<usize>> = (0..3)
            .map(|r| {
                DistributedSampler::new(10, 3, r)
                    .unwrap()
                    .drop_last(true)
                    .indices(0)
            })
            .collect();
        assert!(shards.iter().all(|s| s.len() == 3));
        let s = DistributedSampler::new(100, 2, 1).unwrap().shuffle(1);
        assert_ne!(s.indices(0), s.indices(1));
        assert_eq!(s.indices(3), s.indices(3));
    }

    #[test]
    fn a_rank_outside_the_world_is_an_error() {
        let err = DistributedSampler::new(10, 2, 2).unwrap_err().to_string();
        assert!(err.contains("rank"), "{err}");
    }
}
