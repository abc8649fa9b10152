//! The demo transformer's tensor-parallel plan (Megatron's): in every block the fused
//! query-key-value projection and the MLP's first Linear are column-parallel (each rank keeps
//! `n_heads / tp` heads and `4 d / tp` hidden units), the attention's output projection and the
//! MLP's second Linear row-parallel; the embeddings, the norms and the head stay whole on
//! every rank. Two all-reduces forward and two backward per block.

use afterburner::checkpoint::{BlockKind, Checkpointed, checkpoint};
use afterburner::parallel::tp::{ColumnParallel, RowParallel, TensorParallel};
use afterburner::parallel::{ParallelError, ProcessGroup};
use burn::module::Module;
use burn::nn::{Embedding, LayerNorm, Linear};
use burn::tensor::activation::gelu;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor};

use super::{Transformer, TransformerBlock, causal_attention, linear_2d, on_2d};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// One rank's [`TransformerBlock`] under tensor parallelism (see the module docs).
#[derive(Module, Debug)]
pub struct TpTransformerBlock<B: Backend> {
    norm1: Checkpointed<B, LayerNorm<B>>,
    /// This rank's heads of the query, key and value projections, `[d, 3 d / tp]`.
    pub qkv: ColumnParallel<B>,
    /// This rank's rows of the output projection, `[d / tp, d]`.
    pub proj: RowParallel<B>,
    norm2: Checkpointed<B, LayerNorm<B>>,
    /// This rank's hidden units, `[d, 4 d / tp]`.
    pub fc1: ColumnParallel<B>,
    /// This rank's rows of the MLP's output, `[4 d / tp, d]`.
    pub fc2: RowParallel<B>,
    /// This rank's heads.
    n_heads: usize,
}

/// One rank's [`Transformer`] under tensor parallelism, from [`Transformer::parallelize`].
#[derive(Module, Debug)]
pub struct TpTransformer<B: Backend> {
    tokens: Embedding<B>,
    positions: Embedding<B>,
    /// The blocks, each split, checkpointed as the plain model's.
    pub blocks: Vec<Checkpointed<B, TpTransformerBlock<B>>>,
    norm: LayerNorm<B>,
    /// The language-model head, whole on every rank.
    pub head: Linear<B>,
}

impl<B: AutodiffBackend> Transformer<B> {
    /// This rank's part of the model under `tp` (the plan in the module docs). Every rank
    /// must split the same model (build it once, run it or load a record, then clone it).
    /// `n_heads` must split evenly over the ranks.
    pub fn parallelize<G>(self, tp: &TensorParallel<G>) -> Result<TpTransformer<B>, ParallelError> {
        // Fresh autodiff leaves for this rank: ranks on threads that kept the clones' shared
        // leaves would share one autodiff graph, and so its lock, across a collective (a
        // rank's backward waiting for one still registering its forward: a deadlock).
        let device = self.head.weight.val().device();
        let this = self.fork(&device);
        let blocks = this
            .blocks
            .into_iter()
            .map(|block| Ok(Checkpointed::new(block.block.parallelize(tp)?)))
            .collect::<Result<_, ParallelError>>()?;
        Ok(TpTransformer {
            tokens: this.tokens,
            positions: this.positions,
            blocks,
            norm: this.norm,
            head: this.head,
        })
    }
}

impl<B: AutodiffBackend> TransformerBlock<B> {
    fn parallelize<G>(
        self,
        tp: &TensorParallel<G>,
    ) -> Result<TpTransformerBlock<B>, ParallelError> {
        if !self.n_heads.is_multiple_of(tp.size()) {
            return Err(ParallelError::InvalidConfig {
                field: "tp_size",
                value: tp.size().to_string(),
                expected: format!("a divisor of the transformer's {} heads", self.n_heads),
            });
        }
        Ok(TpTransformerBlock {
            norm1: self.norm1,
            qkv: tp.column_chunks(self.qkv, 3)?,
            proj: tp.row(self.proj)?,
            norm2: self.norm2,
            fc1: tp.column(self.fc1)?,
            fc2: tp.row(self.fc2)?,
            n_heads: self.n_heads / tp.size(),
        })
    }
}

impl<B: AutodiffBackend> TpTransformerBlock<B> {
    /// `[batch, seq, d_model]` to the same shape, whole on every rank.
    pub fn forward<G>(&self, x: Tensor<B, 3>, tp: &TensorParallel<G>) -> Tensor<B, 3>
    where
        G: ProcessGroup<Inner<B>> + 'static,
    {
        let h = self
            .norm1
            .forward(x.clone(), |n: &LayerNorm<B>, x| n.forward(x));
        let x = x + self.attention(h, tp);
        let h = self
            .norm2
            .forward(x.clone(), |n: &LayerNorm<B>, x| n.forward(x));
        let h = checkpoint(BlockKind::Cheap, column_2d(&self.fc1, h, tp), gelu);
        x + row_2d(&self.fc2, h, tp)
    }

    /// Causal self-attention over this rank's heads, summed over the ranks.
    fn attention<G>(&self, x: Tensor<B, 3>, tp: &TensorParallel<G>) -> Tensor<B, 3>
    where
        G: ProcessGroup<Inner<B>> + 'static,
    {
        let context = causal_attention(column_2d(&self.qkv, x, tp), self.n_heads);
        row_2d(&self.proj, context, tp)
    }
}

impl<B: AutodiffBackend> TpTransformer<B> {
    /// `[batch, seq]` token ids to `[batch, seq, vocab]` logits, whole on every rank.
    pub fn forward<G>(&self, tokens: Tensor<B, 2, Int>, tp: &TensorParallel<G>) -> Tensor<B, 3>
    where
        G: ProcessGroup<Inner<B>> + 'static,
    {
        let [b, s] = tokens.dims();
        let positions = Tensor::<B, 1, Int>::arange(0..s as i64, &tokens.device())
            .reshape([1, s])
            .repeat_dim(0, b);
        let x = self.tokens.forward(tokens) + self.positions.forward(positions);
        let x = self.blocks.iter().fold(x, |x, block| {
            let tp = tp.clone();
            block.forward(x, move |block: &TpTransformerBlock<B>, x| {
                block.forward(x, &tp)
            })
        });
        linear_2d(&self.head, self.norm.forward(x))
    }
}

/// A column-parallel layer on the `[batch * seq, d]` view (as [`linear_2d`]).
fn column_2d<B, G>(
    layer: &ColumnParallel<B>,
    x: Tensor<B, 3>,
    tp: &TensorParallel<G>,
) -> Tensor<B, 3>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + 'static,
{
    on_2d(x, |x| layer.forward(x, tp))
}

/// A row-parallel layer on the `[batch * seq, d]` view (as [`linear_2d`]).
fn row_2d<B, G>(layer: &RowParallel<B>, x: Tensor<B, 3>, tp: &TensorParallel<G>) -> Tensor<B, 3>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + 'static,
{
    on_2d(x, |x| layer.forward(x, tp))
}
