//! Helpers shared by the training tests of this crate.
#![allow(dead_code)]

pub mod mlp;

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

pub type B = Autodiff<Flex>;

/// Every float parameter's values, in visit order.
pub fn params<B: Backend, M: Module<B>>(m: &M) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            let values = p.val().into_data().convert::<f32>();
            self.0.extend(values.to_vec::<f32>().unwrap());
        }
    }
    let mut c = Collect(Vec::new());
    m.visit(&mut c);
    c.0
}

/// Rows `from..from + n` of a row-major table with `cols` columns.
pub fn rows(values: &[f32], cols: usize, from: usize, n: usize) -> Tensor<B, 2> {
    let slice = values[from * cols..(from + n) * cols].to_vec();
    Tensor::from_data(TensorData::new(slice, [n, cols]), &Default::default())
}

/// Largest absolute difference, relative to `b`'s largest magnitude.
pub fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// Flex's RNG is process-wide: the tests of one file take turns.
pub fn rng_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}
