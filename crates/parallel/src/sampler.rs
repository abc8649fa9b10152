//! [`DistributedSampler`]: which items each rank sees in an epoch, and in which batches.

use crate::ParallelError;
use crate::rng::{derive_seed, permutation};

/// Domain tag of the shuffle seeds: epoch `e` is read in the order
/// `permutation(len, derive_seed(seed, SHUFFLE_DOMAIN, e))`.
const SHUFFLE_DOMAIN: u64 = 0xDA7A;

/// Which items each rank reads per epoch and how they are batched, like PyTorch's
/// `DistributedSampler` and `BatchSampler` together:
///
/// - shuffled from `(seed, epoch)`, the same order on every rank (in order without a seed);
/// - split into `world_size` disjoint shards: every `world_size`-th item from position `rank`;
/// - padded by repeating the order's first items so every rank gets as many items (the
///   default), or with [`drop_last`](Self::drop_last) the items that do not fill a whole batch
///   on every rank dropped instead (no padding, no partial batch);
/// - grouped into batches of [`batch_size`](Self::batch_size) (1 by default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedSampler {
    len: usize,
    world_size: usize,
    rank: usize,
    seed: Option<u64>,
    batch_size: usize,
    drop_last: bool,
}

impl DistributedSampler {
    /// A sampler over `len` items for `rank` of `world_size`, in order (no shuffle), padded,
    /// one item per batch.
    pub fn new(len: usize, world_size: usize, rank: usize) -> Result<Self, ParallelError> {
        let sampler = Self {
            len,
            world_size: 1,
            rank: 0,
            seed: None,
            batch_size: 1,
            drop_last: false,
        };
        sampler.shard(rank, world_size)
    }

    /// The same sampler for `rank` of `world_size`. Errors unless `rank < world_size`.
    pub fn shard(mut self, rank: usize, world_size: usize) -> Result<Self, ParallelError> {
        if world_size == 0 || rank >= world_size {
            return Err(ParallelError::InvalidConfig {
                field: "rank",
                value: format!("{rank} of world size {world_size}"),
                expected: "0 <= rank < world_size, world_size >= 1".into(),
            });
        }
        self.rank = rank;
        self.world_size = world_size;
        Ok(self)
    }

    /// Shuffles each epoch from `(seed, epoch)`.
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Groups each rank's items into batches of `batch_size`. Errors on 0.
    pub fn batch_size(mut self, batch_size: usize) -> Result<Self, ParallelError> {
        if batch_size == 0 {
            return Err(ParallelError::InvalidConfig {
                field: "batch_size",
                value: "0".into(),
                expected: "at least 1".into(),
            });
        }
        self.batch_size = batch_size;
        Ok(self)
    }

    /// Drops the items that do not fill a whole batch on every rank instead of padding.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Items per rank per epoch, padding included.
    pub fn num_samples(&self) -> usize {
        if self.drop_last {
            let round = self.world_size.saturating_mul(self.batch_size);
            self.len / round * self.batch_size
        } else {
            self.len.div_ceil(self.world_size)
        }
    }

    /// Items repeated to pad the last round (0 with `drop_last`); `gather_for_metrics`-style
    /// evaluation drops this many from the gathered results.
    pub fn num_padded(&self) -> usize {
        (self.num_samples() * self.world_size).saturating_sub(self.len)
    }

    /// Batches per rank per epoch (the last one may be smaller unless `drop_last`).
    pub fn num_batches(&self) -> usize {
        self.num_samples().div_ceil(self.batch_size)
    }

    /// This rank's item indices for `epoch`, in reading order.
    pub fn indices(&self, epoch: u64) -> Vec<usize> {
        let mut order = match self.seed {
            Some(seed) => permutation(self.len, derive_seed(seed, SHUFFLE_DOMAIN, epoch)),
            None => (0..self.len).collect(),
        };
        // With drop_last: whole rounds of batches only. Without: a no-op (shard pads).
        order.truncate(self.num_samples() * self.world_size);
        shard(order, self.rank, self.world_size, self.drop_last)
    }

    /// This rank's batches of item indices for `epoch`, in reading order.
    pub fn batches(&self, epoch: u64) -> Vec<Vec<usize>> {
        self.indices(epoch)
            .chunks(self.batch_size)
            .map(<[usize]>::to_vec)
            .collect()
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
    fn batches_pad_or_drop_the_partial_batch() {
        // One rank: 10 items in batches of 3 keep the last batch of 1, or drop it.
        let s = DistributedSampler::new(10, 1, 0)
            .unwrap()
            .batch_size(3)
            .unwrap();
        assert_eq!(s.num_batches(), 4);
        assert_eq!(s.batches(0).concat(), (0..10).collect::<Vec<_>>());
        let s = s.drop_last(true);
        assert_eq!(
            s.batches(0),
            vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8]]
        );
        // Three ranks, 10 items, batches of 2: padded, 2 batches each (4 items, 2 repeated);
        // with drop_last, 1 full batch each and no item twice.
        let ranks = |drop_last: bool| -> Vec<Vec<Vec<usize>>> {
            (0..3)
                .map(|r| {
                    let s = DistributedSampler::new(10, 3, r).unwrap().shuffle(9);
                    s.batch_size(2).unwrap().drop_last(drop_last).batches(4)
                })
                .collect()
        };
        let padded = ranks(false);
        assert!(padded.iter().all(|b| b.len() == 2 && b[0].len() == 2));
        let mut seen: Vec<usize> = padded.concat().concat();
        assert_eq!(seen.len(), 12);
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 10);
        let trimmed = ranks(true);
        assert!(trimmed.iter().all(|b| b.len() == 1 && b[0].len() == 2));
        let mut seen: Vec<usize> = trimmed.concat().concat();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 6);
    }

    #[test]
    fn a_rank_outside_the_world_or_a_zero_batch_is_an_error() {
        let err = DistributedSampler::new(10, 2, 2).unwrap_err().to_string();
        assert!(err.contains("rank"), "{err}");
        let err = DistributedSampler::new(10, 1, 0).unwrap().batch_size(0);
        assert!(err.unwrap_err().to_string().contains("batch_size"));
    }
}
