//! [`Fragments`]: Streaming DiLoCo's split of the flat parameter vector into P fragments that
//! sync one at a time, strided as the paper strides layers: by block (FSDP auto-wrap units,
//! unit `u` to fragment `u % P`) or, without units, by parameter (parameter `i` to fragment
//! `i % P`). Each fragment is a list of ranges of the flat vector (adjacent ranges merged).

use afterburner_parallel::{AutoWrapPolicy, ParallelError, ShardLayout};
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// The ranges of the flat parameter vector each fragment holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fragments {
    ranges: Vec<Vec<(usize, usize)>>,
    total: usize,
}

impl Fragments {
    /// `count` fragments of a model whose float parameters have `sizes` elements (visit
    /// order): parameter `i` goes to fragment `i % count`.
    pub fn strided(sizes: &[usize], count: usize) -> Self {
        let groups: Vec<usize> = (0..sizes.len()).collect();
        Self::by_groups(sizes, &groups, count)
    }

    /// `count` fragments of parameters with `sizes` elements belonging to `groups` (e.g.
    /// their FSDP units, numbered in visit order): group `g` goes to fragment `g % count`.
    pub fn by_groups(sizes: &[usize], groups: &[usize], count: usize) -> Self {
        let count = count.max(1);
        let mut ranges: Vec<Vec<(usize, usize)>> = vec![Vec::new(); count];
        let mut offset = 0;
        for (&size, &group) in sizes.iter().zip(groups) {
            let fragment = &mut ranges[group % count];
            match fragment.last_mut() {
                Some((start, len)) if *start + *len == offset => *len += size,
                _ => fragment.push((offset, size)),
            }
            offset += size;
        }
        Self {
            ranges,
            total: offset,
        }
    }

    /// The fragments of `model`'s float parameters: by the units `units` makes (strided by
    /// parameter under `AutoWrapPolicy::None`). Errors when `units` names a module type the
    /// model lacks.
    pub fn of_model<B: Backend, M: Module<B>>(
        model: &M,
        count: usize,
        units: &AutoWrapPolicy,
    ) -> Result<Self, ParallelError> {
        struct Sizes(Vec<usize>);
        impl<B: Backend> ModuleVisitor<B> for Sizes {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                self.0.push(param.val().shape().num_elements());
            }
        }
        let mut sizes = Sizes(Vec::new());
        model.visit(&mut sizes);
        if *units == AutoWrapPolicy::None {
            return Ok(Self::strided(&sizes.0, count));
        }
        let groups = ShardLayout::units_of(model, units, "diloco.fragment_units")?;
        Ok(Self::by_groups(&sizes.0, &groups, count))
    }

    /// The number of fragments.
    pub fn count(&self) -> usize {
        self.ranges.len()
    }

    /// The values fragment `p` holds.
    pub fn len(&self, p: usize) -> usize {
        self.ranges[p].iter().map(|(_, len)| len).sum()
    }

    /// Whether fragment `p` holds no values.
    pub fn is_empty(&self, p: usize) -> bool {
        self.len(p) == 0
    }

    /// Fragment `p`'s values of the flat vector `flat`, concatenated.
    pub fn gather<B: Backend>(&self, flat: &Tensor<B, 1>, p: usize) -> Tensor<B, 1> {
        match self.ranges[p].as_slice() {
            [(0, len)] if *len == self.total => flat.clone(),
            ranges => Tensor::cat(
                ranges
                    .iter()
                    .map(|&(start, len)| flat.clone().narrow(0, start, len))
                    .collect(),
                0,
            ),
        }
    }

    /// `flat` with fragment `p`'s values replaced by `values` (as [`gather`](Self::gather)
    /// returns them).
    pub fn scatter<B: Backend>(
        &self,
        flat: Tensor<B, 1>,
        p: usize,
        values: Tensor<B, 1>,
    ) -> Tensor<B, 1> {
        match self.ranges[p].as_slice() {
            [(0, len)] if *len == self.total => values,
            ranges => {
                let mut flat = flat;
                let mut at = 0;
                for &(start, len) in ranges {
                    let part = values.clone().narrow(0, at, len);
                    flat = flat.slice_assign(start..start + len, part);
                    at += len;
                }
                flat
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    #[test]
    fn strided_fragments_cover_every_value_once() {
        // Parameters of 2, 3, 1 and 4 values over 2 fragments: {0, 2} and {1, 3}.
        let f = Fragments::strided(&[2, 3, 1, 4], 2);
        assert_eq!(f.ranges, vec![vec![(0, 2), (5, 1)], vec![(2, 3), (6, 4)]]);
        assert_eq!((f.len(0), f.len(1)), (3, 7));
        // Blocks {0, 1}, {2}, {3}: blocks 0 and 2 in fragment 0.
        let blocks = Fragments::by_groups(&[2, 3, 1, 4], &[0, 0, 1, 2], 2);
        assert_eq!(blocks.ranges, vec![vec![(0, 5), (6, 4)], vec![(5, 1)]]);
        let one = Fragments::strided(&[2, 3, 1], 1);
        assert_eq!(one.ranges, vec![vec![(0, 6)]], "adjacent ranges merged");

        let device = Default::default();
        let flat = Tensor::<Flex, 1>::from_floats(
            [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
            &device,
        );
        let second = f.gather(&flat, 1);
        assert_eq!(
            second.clone().into_data().to_vec::<f32>().unwrap(),
            [2.0, 3.0, 4.0, 6.0, 7.0, 8.0, 9.0]
        );
        let back = f.scatter(flat, 1, second.mul_scalar(10.0));
        assert_eq!(
            back.into_data().to_vec::<f32>().unwrap(),
            [0.0, 1.0, 20.0, 30.0, 40.0, 5.0, 60.0, 70.0, 80.0, 90.0]
        );
    }
}
