//! A 2-D mesh (`dp x tp`) over one process group: [`mesh_groups`] gives each rank its
//! data-parallel group and its tensor-parallel group, as [`SubGroup`]s of the one it has.
//!
//! Rank `r` of a world of `dp * tp` sits at `(r / tp, r % tp)`: its tensor-parallel group is the
//! `tp` consecutive ranks of its row, its data-parallel group the `dp` ranks of its column. A
//! [`SubGroup`] runs each collective as an all-gather over the whole parent group and keeps its
//! members' values (combined in member order), so every rank of the parent must call the
//! sub-groups' collectives in the same order, which a training step does (the same program on
//! every rank). It moves `world / members` times the bytes a separate communicator would: an
//! emulation that makes the mesh exact on any engine, not a fast one.

use std::sync::Arc;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::{ParallelError, ProcessGroup, Quorum, ReduceOp, SharedGroup};

/// A group of some of a parent group's ranks (see the module docs).
pub struct SubGroup<B: Backend, G> {
    parent: SharedGroup<G>,
    /// The parent ranks in this group, in order.
    members: Vec<usize>,
    /// This rank's place among them.
    rank: usize,
    device: B::Device,
}

impl<B: Backend, G: ProcessGroup<B>> SubGroup<B, G> {
    /// The sub-group of `parent` made of `members` (parent ranks, this rank among them).
    pub fn new(
        parent: SharedGroup<G>,
        members: Vec<usize>,
        device: B::Device,
    ) -> Result<Self, ParallelError> {
        let me = parent.with(|g| g.rank());
        let rank =
            members
                .iter()
                .position(|m| *m == me)
                .ok_or_else(|| ParallelError::InvalidConfig {
                    field: "members",
                    value: format!("{members:?}"),
                    expected: format!("a list of parent ranks that holds this rank ({me})"),
                })?;
        Ok(Self {
            parent,
            members,
            rank,
            device,
        })
    }

    /// Every member's `tensor`, in member order.
    fn gather(&self, tensor: Tensor<B, 1>) -> Result<Vec<Tensor<B, 1>>, ParallelError> {
        let all = self.parent.with(|g| g.all_gather(tensor))?;
        Ok(self.members.iter().map(|m| all[*m].clone()).collect())
    }
}

/// A rank's two groups in a mesh: `(data-parallel, tensor-parallel)`.
pub type MeshGroups<B, G> = (SubGroup<B, G>, SubGroup<B, G>);

/// This rank's data-parallel and tensor-parallel groups of a `dp x tp` mesh over `group`
/// (whose world size must be a multiple of `tp`), on `device`.
pub fn mesh_groups<B: Backend, G: ProcessGroup<B>>(
    group: G,
    tp: usize,
    device: B::Device,
) -> Result<MeshGroups<B, G>, ParallelError> {
    mesh_of(SharedGroup::new(group), tp, device)
}

/// [`mesh_groups`] over a group already shared (the caller keeps a handle on the whole).
pub fn mesh_of<B: Backend, G: ProcessGroup<B>>(
    shared: SharedGroup<G>,
    tp: usize,
    device: B::Device,
) -> Result<MeshGroups<B, G>, ParallelError> {
    let (rank, world) = shared.with(|g| (g.rank(), g.world_size()));
    if tp == 0 || !world.is_multiple_of(tp) {
        return Err(ParallelError::InvalidConfig {
            field: "tp_size",
            value: tp.to_string(),
            expected: format!("a divisor of the world size ({world}): world = dp x tp"),
        });
    }
    let (row, column) = (rank / tp, rank % tp);
    let dp_members = (0..world / tp).map(|r| r * tp + column).collect();
    let tp_members = (0..tp).map(|c| row * tp + c).collect();
    Ok((
        SubGroup::new(shared.clone(), dp_members, device.clone())?,
        SubGroup::new(shared, tp_members, device)?,
    ))
}

impl<B: Backend, G: ProcessGroup<B>> ProcessGroup<B> for SubGroup<B, G> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.members.len()
    }

    fn all_reduce(
        &self,
        tensor: Tensor<B, 1>,
        op: ReduceOp,
    ) -> Result<Tensor<B, 1>, ParallelError> {
        let parts = self.gather(tensor)?;
        let count = parts.len();
        let sum =
            parts
                .into_iter()
                .reduce(|a, b| a + b)
                .ok_or_else(|| ParallelError::Collective {
                    op: "all_reduce",
                    rank: self.rank,
                    reason: "a sub-group without members".into(),
                })?;
        Ok(match op {
            ReduceOp::Sum => sum,
            ReduceOp::Mean => sum.div_scalar(count as f64),
        })
    }

    fn broadcast(
        &self,
        tensor: Option<Tensor<B, 1>>,
        root: usize,
    ) -> Result<Tensor<B, 1>, ParallelError> {
        let mine = tensor.unwrap_or_else(|| Tensor::empty([0], &self.device));
        let parts = self.gather(mine)?;
        parts
            .into_iter()
            .nth(root)
            .ok_or_else(|| ParallelError::InvalidConfig {
                field: "root",
                value: root.to_string(),
                expected: format!("a rank of the sub-group (below {})", self.members.len()),
            })
    }

    fn all_gather(&self, tensor: Tensor<B, 1>) -> Result<Vec<Tensor<B, 1>>, ParallelError> {
        self.gather(tensor)
    }

    fn quorum(&self) -> Option<Arc<dyn Quorum>> {
        None
    }
}
