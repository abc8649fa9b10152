//! [`HeadParallel`]: Burn's `MultiHeadAttention` with its heads split across the
//! tensor-parallel ranks (query, key and value column-parallel: each rank computes its
//! `n_heads / tp` heads whole; the output projection row-parallel, summed over the ranks).
//! One all-reduce forward (the output) and one backward (the input's gradient).

use burn::module::Module;
use burn::nn::attention::MultiHeadAttention;
use burn::tensor::activation::{quiet_softmax, softmax};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, Tensor};

use super::{Inner, TensorParallel};
use crate::{ParallelError, ProcessGroup};

/// Burn's `MultiHeadAttention` holding this rank's heads: `query`, `key`, `value`
/// `[d_model, d_model / tp]`, `output` `[d_model / tp, d_model]` (its bias whole, added
/// once after the sum),
/// `n_heads / tp` heads of the same `d_k`. Made by [`TensorParallel::heads`].
#[derive(Module, Debug)]
pub struct HeadParallel<B: Backend> {
    /// This rank's part of the attention (its `d_model` is this rank's `d_model / tp`).
    pub attention: MultiHeadAttention<B>,
}

impl<G> TensorParallel<G> {
    /// This rank's heads of `attention` (`n_heads` must split evenly over the ranks). As for
    /// [`column`](Self::column), every rank must split the same values.
    pub fn heads<B: AutodiffBackend>(
        &self,
        attention: MultiHeadAttention<B>,
    ) -> Result<HeadParallel<B>, ParallelError>
    where
        G: ProcessGroup<Inner<B>> + 'static,
    {
        if !attention.n_heads.is_multiple_of(self.size()) {
            return Err(ParallelError::InvalidConfig {
                field: "tp_size",
                value: self.size().to_string(),
                expected: format!("a divisor of the attention's {} heads", attention.n_heads),
            });
        }
        let MultiHeadAttention {
            query,
            key,
            value,
            output,
            dropout,
            activation,
            d_model,
            n_heads,
            d_k,
            min_float,
            quiet_softmax,
        } = attention;
        Ok(HeadParallel {
            attention: MultiHeadAttention {
                query: self.column(query)?.linear,
                key: self.column(key)?.linear,
                value: self.column(value)?.linear,
                output: self.row(output)?.linear,
                dropout,
                activation,
                d_model: d_model / self.size(),
                n_heads: n_heads / self.size(),
                d_k,
                min_float,
                quiet_softmax,
            },
        })
    }
}

impl<B: AutodiffBackend> HeadParallel<B> {
    /// Self-attention over `x` (`[batch, seq, d_model]`, whole on every rank): the output of
    /// Burn's `MultiHeadAttention::forward(MhaInput::self_attn(x))` (its `context`), whole on
    /// every rank. `mask_pad` `[batch, seq]` and `mask_attn` `[batch, seq, seq]` as Burn's.
    pub fn forward_self<G>(
        &self,
        x: Tensor<B, 3>,
        mask_pad: Option<Tensor<B, 2, Bool>>,
        mask_attn: Option<Tensor<B, 3, Bool>>,
        tp: &TensorParallel<G>,
    ) -> Tensor<B, 3>
    where
        G: ProcessGroup<Inner<B>> + 'static,
    {
        // One copy of the input for the three projections: one all-reduce of its gradient.
        let x = tp.copy_to_ranks(x);
        let local = self.local(x.clone(), x.clone(), x, mask_pad, mask_attn);
        self.output_bias(tp.sum_over_ranks(local))
    }

    /// Attention of `query` over `key` and `value` (each whole on every rank), as Burn's
    /// `MultiHeadAttention::forward(MhaInput::new(query, key, value))`'s `context`.
    pub fn forward<G>(
        &self,
        query: Tensor<B, 3>,
        key: Tensor<B, 3>,
        value: Tensor<B, 3>,
        mask_pad: Option<Tensor<B, 2, Bool>>,
        mask_attn: Option<Tensor<B, 3, Bool>>,
        tp: &TensorParallel<G>,
    ) -> Tensor<B, 3>
    where
        G: ProcessGroup<Inner<B>> + 'static,
    {
        let (query, key, value) = (
            tp.copy_to_ranks(query),
            tp.copy_to_ranks(key),
            tp.copy_to_ranks(value),
        );
        let local = self.local(query, key, value, mask_pad, mask_attn);
        self.output_bias(tp.sum_over_ranks(local))
    }

    /// The summed output projection plus its bias (whole on every rank, added once).
    fn output_bias(&self, sum: Tensor<B, 3>) -> Tensor<B, 3> {
        match &self.attention.output.bias {
            Some(bias) => sum.clone() + bias.val().cast(sum.dtype()).unsqueeze::<3>(),
            None => sum,
        }
    }

    /// This rank's heads, Burn's formulas (scaled dot product, masks, softmax, dropout) on
    /// them, and its partial output projection (without the bias).
    fn local(
        &self,
        query: Tensor<B, 3>,
        key: Tensor<B, 3>,
        value: Tensor<B, 3>,
        mask_pad: Option<Tensor<B, 2, Bool>>,
        mask_attn: Option<Tensor<B, 3, Bool>>,
    ) -> Tensor<B, 3> {
        let a = &self.attention;
        let [batch, seq, _] = query.dims();
        let heads = |x: Tensor<B, 3>, linear: &burn::nn::Linear<B>| {
            let [batch, seq, _] = x.dims();
            linear
                .forward(x)
                .reshape([batch, seq, a.n_heads, a.d_k])
                .swap_dims(1, 2)
        };
        let (q, k, v) = (
            heads(query, &a.query),
            heads(key, &a.key),
            heads(value, &a.value),
        );
        let scores = q.matmul(k.transpose()).div_scalar((a.d_k as f32).sqrt());
        let mut scores = a.dropout.forward(scores);
        if let Some(mask) = mask_pad {
            let [batch, seq] = mask.dims();
            scores = scores.mask_fill(mask.reshape([batch, 1, 1, seq]), a.min_float);
        }
        if let Some(mask) = mask_attn {
            let [batch, seq_1, seq_2] = mask.dims();
            scores = scores.mask_fill(mask.reshape([batch, 1, seq_1, seq_2]), a.min_float);
        }
        let weights = match a.quiet_softmax {
            true => quiet_softmax(scores, 3),
            false => softmax(scores, 3),
        };
        let context = weights
            .matmul(v)
            .swap_dims(1, 2)
            .reshape([batch, seq, a.n_heads * a.d_k]);
        burn::tensor::module::linear(context, a.output.weight.val(), None)
    }
}
