//! `Autocast<B>`: a backend that wraps another one, used as `Autodiff<Autocast<B>>`.
//!
//! On tensors of one dtype, outside an autocast scope, it computes what `B` computes, op for
//! op, with one change that makes every Burn `Linear` faster: a Linear applied to a
//! `[batch, seq, d]` input runs on the `[batch * seq, d]` view (see `linear.rs`). Burn 0.21
//! computes that Linear's weight gradient as `batch` small matmuls and a sum; on the 2-D view
//! it is one large matmul, with the same values. Two more things it adds over `B`:
//! - dtype promotion: an op on an f32 and a half tensor runs in f32, as in PyTorch, where
//!   Burn's backends reject the mix (`promote.rs`);
//! - op-level autocast: inside [`autocast_ops`], matmul, Linear and convolutions run in half
//!   and the precision-sensitive ops in f32, as under `torch.autocast` (`scope.rs`).
//!
//! Models built from Burn's own layers (`TransformerEncoder`, `MultiHeadAttention`,
//! `PositionWiseFeedForward`, `Linear`) get all of it without a change to their code:
//!
//! ```
//! use afterburner_precision::Autocast;
//! use burn::backend::{Autodiff, Flex};
//!
//! type Backend = Autodiff<Autocast<Flex>>;
//! ```
//!
//! `Autodiff` stays outermost, so gradients, checkpointing, collectives and Burn's optimizers
//! see an ordinary autodiff backend. `Autocast` also works above Autodiff,
//! `Autocast<Autodiff<B>>`, where Autodiff records its casts as `torch.autocast`'s are
//! (`autodiff.rs`; docs/precision.md compares the memory of the two). The tensors are `B`'s
//! own (`Autocast<B>` adds no wrapper around them), so reading and writing data, devices and
//! records are unchanged.
//!
//! Each op trait is implemented in its own file by the [`forward!`] macro, which writes a method
//! that calls `B`'s method of the same name, plus the few methods written by hand. The lists
//! were written with `tools/gen-forward.py` from burn-backend 0.21.0's traits; when Burn is
//! bumped, rerun it and compare.

use core::marker::PhantomData;

pub use nodes::record_autocast_nodes;
pub use scope::{autocast_dtype, autocast_ops};
pub use tf32::emulate_tf32;

use burn::tensor::DType;
use burn::tensor::TensorData;
use burn::tensor::backend::{Backend, BackendTypes, DTypeUsageSet, ExecutionError};

mod activation;
mod autodiff;
mod bool;
mod float;
mod int;
mod layer_norm_node;
mod linear;
mod module;
mod nodes;
mod promote;
mod quantized;
mod scope;
mod softmax_node;
mod tf32;
mod transaction;

/// Implements each listed method of an op trait by calling the inner backend's method of the
/// same name with the same arguments (`B => wrap;` passes each result through `wrap`).
macro_rules! forward {
    ($inner:ident => $wrap:path; $(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;)*) => {
        $(
            fn $name($($arg: $ty),*) -> $ret {
                $wrap($inner::$name($($arg),*))
            }
        )*
    };
    ($inner:ident; $(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
        $(
            fn $name($($arg: $ty),*) $(-> $ret)? {
                $inner::$name($($arg),*)
            }
        )*
    };
}
use forward;

/// Implements each listed method, whose first two arguments are float tensors, by calling
/// the inner backend's method after promoting those two to the dtype they meet at
/// (`promote.rs`).
macro_rules! promoted {
    ($(fn $name:ident($a:ident, $b:ident $(, $arg:ident: $ty:ty)*) -> $ret:ty;)*) => {
        $(
            fn $name($a: FloatTensor<Self>, $b: FloatTensor<Self> $(, $arg: $ty)*) -> $ret {
                let ($a, $b) = promote::pair::<B>($a, $b);
                B::$name($a, $b $(, $arg)*)
            }
        )*
    };
}
use promoted;

/// Implements each listed method, whose first argument is a float tensor, by calling the
/// inner backend's method on that tensor in f32 when an op-level autocast scope is on
/// (`scope.rs`: the ops autocast keeps in full precision).
macro_rules! in_f32 {
    ($(fn $name:ident($t:ident $(, $arg:ident: $ty:ty)*) -> $ret:ty;)*) => {
        $(
            fn $name($t: FloatTensor<Self> $(, $arg: $ty)*) -> $ret {
                B::$name(scope::to_f32::<B>($t) $(, $arg)*)
            }
        )*
    };
}
use in_f32;

/// A backend that computes what `B` computes, with every `Linear` on a 2-D view of its input,
/// mixed float dtypes promoted to the wider one, and op-level autocast inside
/// [`autocast_ops`](crate::autocast_ops).
///
/// Use it under Burn's `Autodiff`: `Autodiff<Autocast<Flex>>` (docs/performance.md,
/// docs/precision.md).
pub struct Autocast<B>(PhantomData<B>);

impl<B> Clone for Autocast<B> {
    fn clone(&self) -> Self {
        Self(PhantomData)
    }
}

impl<B> Default for Autocast<B> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<B: Backend> core::fmt::Debug for Autocast<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Autocast<{}>", core::any::type_name::<B>())
    }
}

/// Whether backend `B` promotes mixed float dtypes (an f32 tensor meeting a half one), which
/// it does when `Autocast` is in its stack (`Autodiff<Autocast<Flex>>`); Burn's own backends
/// reject the mix.
pub fn promotes_dtypes<B: Backend>(device: &B::Device) -> bool {
    B::name(device).contains("autocast<")
}

impl<B: Backend> BackendTypes for Autocast<B> {
    type Device = B::Device;
    type FloatTensorPrimitive = B::FloatTensorPrimitive;
    type FloatElem = B::FloatElem;
    type IntTensorPrimitive = B::IntTensorPrimitive;
    type IntElem = B::IntElem;
    type BoolTensorPrimitive = B::BoolTensorPrimitive;
    type BoolElem = B::BoolElem;
    type QuantizedTensorPrimitive = B::QuantizedTensorPrimitive;
}

impl<B: Backend> Backend for Autocast<B> {
    fn ad_enabled(device: &Self::Device) -> bool {
        B::ad_enabled(device)
    }

    fn memory_persistent_allocations<
        Output: Send,
        Input: Send,
        Func: Fn(Input) -> Output + Send,
    >(
        device: &Self::Device,
        input: Input,
        func: Func,
    ) -> Output {
        B::memory_persistent_allocations(device, input, func)
    }

    fn memory_cleanup(device: &Self::Device) {
        B::memory_cleanup(device)
    }

    /// `autocast<inner name>`, so checks on the inner backend's name still find it.
    fn name(device: &Self::Device) -> String {
        format!("autocast<{}>", B::name(device))
    }

    fn seed(device: &Self::Device, seed: u64) {
        B::seed(device, seed)
    }

    /// Counted as a host read: the host waits for every queued kernel.
    fn sync(device: &Self::Device) -> Result<(), ExecutionError> {
        crate::host_reads::add_read();
        B::sync(device)
    }

    fn staging<'a, Iter>(data: Iter, device: &Self::Device)
    where
        Iter: Iterator<Item = &'a mut TensorData>,
    {
        B::staging(data, device)
    }

    fn supports_dtype(device: &Self::Device, dtype: DType) -> bool {
        B::supports_dtype(device, dtype)
    }

    fn dtype_usage(device: &Self::Device, dtype: DType) -> DTypeUsageSet {
        B::dtype_usage(device, dtype)
    }

    fn device_count(type_id: u16) -> usize {
        B::device_count(type_id)
    }
}
