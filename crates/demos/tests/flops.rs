//! The FLOPs `Autocast` counts for one training step (forward and backward) of the demo
//! models equal their closed forms within 1%.

use afterburner::{Autocast, count_flops};
use afterburner_demos::models::{TransformerConfig, VitConfig};
use burn::backend::{Autodiff, Flex};
use burn::tensor::{Int, Tensor};

type B = Autodiff<Autocast<Flex>>;

fn assert_within_1_percent(counted: u64, closed_form: u64, what: &str) {
    let gap = (counted as f64 - closed_form as f64).abs() / closed_form as f64;
    println!("{what}: counted {counted} FLOPs, closed form {closed_form}");
    assert!(
        gap <= 0.01,
        "{what}: counted {counted} FLOPs, closed form {closed_form} ({:.2}% apart)",
        gap * 100.0
    );
}

/// A GPT-like transformer: `6 N T` for its matmul parameters `N = 12 L d^2 + d V` (the
/// blocks' qkv, projection and MLP, and the output head) over `T` tokens, plus the
/// attention's two `[s, s]` matmuls per layer, forward and both gradients: `12 L b s^2 d`.
#[test]
fn the_transformer_counts_6_n_tokens_plus_attention() {
    let (vocab, d, heads, layers, b, s) = (40, 32, 4, 3, 2, 16);
    let device = Default::default();
    let model = TransformerConfig::new()
        .with_vocab_size(vocab)
        .with_d_model(d)
        .with_n_heads(heads)
        .with_n_layers(layers)
        .with_max_seq_len(s)
        .init::<B>(&device);
    let tokens = Tensor::<B, 1, Int>::arange(0..(b * s) as i64, &device)
        .remainder_scalar(vocab as i64)
        .reshape([b, s]);
    let (_, counted) = count_flops(|| model.forward(tokens).sum().backward());
    let n = 12 * layers * d * d + d * vocab;
    let closed_form = 6 * n * b * s + 12 * layers * b * s * s * d;
    assert_within_1_percent(counted, closed_form as u64, "transformer");
}

/// The ViT: the patch embedding (a convolution whose input, the images, needs no gradient:
/// forward and weight gradient, `4 b P d c p^2`), per layer the four attention projections
/// and the MLP (`6 b P (4 d^2 + 2 d d_ff)`) and the attention (`12 b P^2 d`), and the head on
/// the pooled tokens (`6 b d C`).
#[test]
fn the_vit_counts_its_closed_form() {
    let config = VitConfig::new()
        .with_image_size(8)
        .with_patch_size(2)
        .with_d_model(32)
        .with_n_heads(4)
        .with_n_layers(2)
        .with_d_ff(64);
    let (c, p, d, ff, l, classes) = (1, 2, 32, 64, 2, 10);
    let patches = config.num_patches();
    let b = 3;
    let device = Default::default();
    let model = config.init::<B>(&device);
    let images = Tensor::<B, 4>::ones([b, c, 8, 8], &device);
    let (_, counted) = count_flops(|| model.forward(images).sum().backward());
    let closed_form = 4 * b * patches * d * c * p * p
        + l * (6 * b * patches * (4 * d * d + 2 * d * ff) + 12 * b * patches * patches * d)
        + 6 * b * d * classes;
    assert_within_1_percent(counted, closed_form as u64, "ViT");
}

/// Nothing is counted on another thread's behalf, and a backend without `Autocast` counts
/// nothing (its ops do not pass through the counter).
#[test]
fn counts_are_per_thread_and_need_autocast() {
    let device = Default::default();
    let a = Tensor::<B, 2>::ones([4, 8], &device);
    let (_, here) = count_flops(|| {
        std::thread::scope(|scope| {
            scope.spawn(|| a.clone().matmul(a.clone().transpose()));
        })
    });
    assert_eq!(here, 0);
    let plain = Tensor::<Autodiff<Flex>, 2>::ones([4, 8], &device);
    let (_, uncounted) = count_flops(|| plain.clone().matmul(plain.transpose()));
    assert_eq!(uncounted, 0);
    let (_, counted) = count_flops(|| a.clone().matmul(a.transpose()));
    assert_eq!(counted, 2 * 4 * 8 * 4);
}
