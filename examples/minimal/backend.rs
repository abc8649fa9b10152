//! The backend, picked by cargo feature: `flex` (default, CPU), `cuda`, `wgpu`.

#[cfg(feature = "cuda")]
pub type B = burn::backend::Autodiff<burn::backend::Cuda>;
#[cfg(all(feature = "wgpu", not(feature = "cuda")))]
pub type B = burn::backend::Autodiff<burn::backend::Wgpu>;
#[cfg(all(feature = "flex", not(any(feature = "cuda", feature = "wgpu"))))]
pub type B = burn::backend::Autodiff<burn::backend::Flex>;

/// The default device of the selected backend.
pub fn device() -> burn::tensor::Device<B> {
    Default::default()
}
