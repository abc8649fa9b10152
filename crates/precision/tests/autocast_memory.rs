//! What the autodiff graph keeps under op-level autocast, above and below Autodiff: with the
//! casts recorded (`Autocast<Autodiff<Flex>>`) a half matmul saves the half copy of an f32
//! input, which is freed when nothing else holds it; with the casts below Autodiff
//! (`Autodiff<Autocast<Flex>>`) it keeps the f32 input. LayerNorm and softmax as one node each
//! save less than decomposed.
//!
//! One test in its own binary: the counting allocator sees the whole process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use afterburner_precision::{Autocast, autocast_ops};
use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::nn::{Gelu, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Distribution, Tensor};

/// The system allocator, counting live bytes and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A pre-norm MLP stack: LayerNorm (f32 under autocast), Linear, GELU, Linear, per block.
#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    norms: Vec<LayerNorm<B>>,
    ups: Vec<Linear<B>>,
    downs: Vec<Linear<B>>,
    gelu: Gelu,
}

impl<B: Backend> Mlp<B> {
    fn new(blocks: usize, width: usize, device: &B::Device) -> Self {
        Self {
            norms: (0..blocks)
                .map(|_| LayerNormConfig::new(width).init(device))
                .collect(),
            ups: (0..blocks)
                .map(|_| LinearConfig::new(width, 2 * width).init(device))
                .collect(),
            downs: (0..blocks)
                .map(|_| LinearConfig::new(2 * width, width).init(device))
                .collect(),
            gelu: Gelu::new(),
        }
    }

    fn forward(&self, mut x: Tensor<B, 2>) -> Tensor<B, 2> {
        for ((norm, up), down) in self.norms.iter().zip(&self.ups).zip(&self.downs) {
            let h = down.forward(self.gelu.forward(up.forward(norm.forward(x.clone()))));
            x = x + h;
        }
        x
    }
}

/// Heap bytes the autodiff graph holds after one forward pass in bf16 per op (the output
/// alive, before backward), above what was live before it: the tensors saved for backward.
fn saved_bytes<B: AutodiffBackend>(model: &Mlp<B>, x: &Tensor<B, 2>) -> usize {
    let start = LIVE.load(Ordering::Relaxed);
    let out = autocast_ops(DType::BF16, || model.forward(x.clone()));
    let saved = LIVE.load(Ordering::Relaxed) - start;
    drop(out);
    saved
}

/// The bytes saved for backward by a 4-block MLP on a [2048, 128] input: after a warm-up pass
/// (thread pools and caches allocate once), as [`saved_bytes`] measures them.
fn measure<B: AutodiffBackend>() -> usize {
    let device = Default::default();
    B::seed(&device, 1);
    let model = Mlp::<B>::new(BLOCKS, WIDTH, &device);
    let x = Tensor::<B, 2>::random([ROWS, WIDTH], Distribution::Normal(0.0, 1.0), &device);
    saved_bytes(&model, &x);
    saved_bytes(&model, &x)
}

/// Attention's projections: one LayerNorm whose output three Linears (query, key, value) read.
#[derive(Module, Debug)]
struct Qkv<B: Backend> {
    norm: LayerNorm<B>,
    projections: Vec<Linear<B>>,
}

/// The bytes [`Qkv`] on a [2048, 128] input saves for backward, as [`measure`] measures.
fn measure_qkv<B: AutodiffBackend>() -> usize {
    let device = Default::default();
    let model = Qkv::<B> {
        norm: LayerNormConfig::new(WIDTH).init(&device),
        projections: (0..3)
            .map(|_| LinearConfig::new(WIDTH, WIDTH).init(&device))
            .collect(),
    };
    let x = Tensor::<B, 2>::random([ROWS, WIDTH], Distribution::Normal(0.0, 1.0), &device);
    let saved = || {
        let start = LIVE.load(Ordering::Relaxed);
        let out = autocast_ops(DType::BF16, || {
            let h = model.norm.forward(x.clone());
            let mut projected = model.projections.iter().map(|p| p.forward(h.clone()));
            let first = projected.next().expect("three projections");
            projected.fold(first, |acc, p| acc + p)
        });
        let saved = LIVE.load(Ordering::Relaxed) - start;
        drop(out);
        saved
    };
    saved();
    saved()
}

/// The bytes attention's weights save for backward: `softmax(scores) @ values` on `[HEADS, ROWS
/// / 8, ROWS / 8]` scores (f32, as a half `q @ k^T` hands them on after the recorded cast) and
/// `[HEADS, ROWS / 8, WIDTH]` values, as [`measure`] measures.
fn measure_attention<B: AutodiffBackend>() -> usize {
    let device = Default::default();
    let tokens = ROWS / 8;
    let normal = Distribution::Normal(0.0, 1.0);
    let scores = Tensor::<B, 3>::random([HEADS, tokens, tokens], normal, &device).require_grad();
    let values = Tensor::<B, 3>::random([HEADS, tokens, WIDTH], normal, &device).require_grad();
    let saved = || {
        let start = LIVE.load(Ordering::Relaxed);
        let out = autocast_ops(DType::BF16, || {
            burn::tensor::activation::softmax(scores.clone(), 2).matmul(values.clone())
        });
        let saved = LIVE.load(Ordering::Relaxed) - start;
        drop(out);
        saved
    };
    saved();
    saved()
}

const HEADS: usize = 4;
const BLOCKS: usize = 4;
const WIDTH: usize = 128;
const ROWS: usize = 2048;

#[test]
fn recorded_casts_save_half_copies_nodes_save_less_and_shared_casts_one_copy() {
    let below = measure::<Autodiff<Autocast<Flex>>>();
    let above = measure::<Autocast<Autodiff<Flex>>>();
    let qkv_above = measure_qkv::<Autocast<Autodiff<Flex>>>();
    let attention_above = measure_attention::<Autocast<Autodiff<Flex>>>();
    afterburner_precision::record_autocast_nodes::<Autocast<Autodiff<Flex>>>();
    let nodes = measure::<Autocast<Autodiff<Flex>>>();
    let qkv_nodes = measure_qkv::<Autocast<Autodiff<Flex>>>();
    let attention_nodes = measure_attention::<Autocast<Autodiff<Flex>>>();
    let kib = |b: usize| b / 1024;
    println!(
        "saved for backward, KiB: casts below Autodiff {}; recorded {}; recorded, layer norm \
         as one node {}",
        kib(below),
        kib(above),
        kib(nodes)
    );
    println!(
        "query/key/value projections, saved KiB: recorded {}; with the nodes and the cast \
         cache {}",
        kib(qkv_above),
        kib(qkv_nodes)
    );
    println!(
        "softmax then matmul, saved KiB: recorded {}; softmax as one node {}",
        kib(attention_above),
        kib(attention_nodes)
    );
    // Each block's LayerNorm output (f32, freed after the cast when the cast is recorded)
    // feeds one half Linear: below Autodiff the Linear keeps it in f32 (4 bytes a value),
    // recorded it keeps the half copy (2 bytes). Recorded, the Linears also keep the half
    // copies of their weights (2 bytes a value, 4 * WIDTH^2 values a block), which below
    // Autodiff are made and freed inside each op.
    let expected = BLOCKS * (ROWS * WIDTH * 2 - 4 * WIDTH * WIDTH * 2);
    assert!(
        above + expected * 9 / 10 <= below,
        "recorded {above} vs below {below}: expected at least {expected} bytes fewer"
    );
    // Decomposed, each LayerNorm saves its centred input and normalised output (2 f32
    // copies); as one node, its input only.
    let one_copy = BLOCKS * ROWS * WIDTH * 4;
    assert!(
        nodes + one_copy * 9 / 10 <= above && nodes + one_copy * 11 / 10 >= above,
        "layer norm as one node {nodes} vs decomposed {above}: expected {one_copy} bytes fewer"
    );
    // Recorded, each projection casts the LayerNorm output and keeps its half copy (3 x 2
    // bytes a value); with the scope's cast cache they share one (2 bytes), and the norm saves
    // its input only (4 bytes a value instead of 8).
    let expected = ROWS * WIDTH * (4 + 4);
    assert!(
        qkv_nodes + expected * 9 / 10 <= qkv_above && qkv_nodes + expected * 11 / 10 >= qkv_above,
        "shared cast {qkv_nodes} vs three {qkv_above}: expected {expected} bytes fewer"
    );
    // Decomposed in f32, the softmax keeps `exp`'s input (Autodiff recomputes `exp` from it)
    // and the division's numerator, `exp`'s output (4 + 4 bytes a score), and the matmul the
    // half cast of its output (2 bytes); as one node it keeps one half copy, which the matmul
    // reads as its cast (2 bytes).
    let expected = HEADS * (ROWS / 8) * (ROWS / 8) * 8;
    assert!(
        attention_nodes + expected * 9 / 10 <= attention_above
            && attention_nodes + expected * 11 / 10 >= attention_above,
        "softmax node {attention_nodes} vs decomposed {attention_above}: expected {expected} \
         bytes fewer"
    );
}
