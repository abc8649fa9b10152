//! Tensor parallelism on CPU threads: an MLP split column-then-row over tp = 2 and 4 ranks
//! gives the one-device output and gradients, and after 5 AdamW steps the one-device
//! parameters (1e-6 relative, 32-bit), with one all-reduce forward and one backward per step.

use afterburner_parallel::tp::{HeadParallel, TensorParallel, TpLinear};
use afterburner_parallel::{
    Ddp, LaunchConfig, ParallelError, ProcessGroup, launch, local_devices, mesh_groups,
};
use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::nn::attention::{MhaInput, MultiHeadAttention, MultiHeadAttentionConfig};
use burn::nn::{Linear, LinearConfig};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::activation::gelu;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};

type B = Autodiff<Flex>;
const STEPS: usize = 5;
const LR: f64 = 1e-2;

#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    up: Linear<B>,
    down: Linear<B>,
}

#[derive(Module, Debug)]
struct TpMlp<B: Backend> {
    up: TpLinear<B>,
    down: TpLinear<B>,
}

fn loss(y: Tensor<B, 2>) -> Tensor<B, 1> {
    (y.clone() * y).mean()
}

/// Weight and bias of each layer, flattened: [up.w, up.b, down.w, down.b].
type Params = [Vec<f32>; 4];

fn values<const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().to_vec().unwrap()
}

/// The output after the first forward and the parameters after `STEPS` AdamW steps, on one
/// device.
fn one_device(mlp: Mlp<B>, x: Tensor<B, 2>) -> (Vec<f32>, Params) {
    let mut mlp = mlp;
    let mut optim = AdamWConfig::new().init();
    let mut first = None;
    for _ in 0..STEPS {
        let y = mlp.down.forward(gelu(mlp.up.forward(x.clone())));
        first.get_or_insert_with(|| values(y.clone()));
        let grads = GradientsParams::from_grads(loss(y).backward(), &mlp);
        mlp = optim.step(LR, mlp, grads);
    }
    let params = [
        values(mlp.up.weight.val()),
        values(mlp.up.bias.unwrap().val()),
        values(mlp.down.weight.val()),
        values(mlp.down.bias.unwrap().val()),
    ];
    (first.unwrap(), params)
}

/// One rank's output after the first forward, its shards after `STEPS` steps, and its
/// all-reduces.
struct Rank {
    output: Vec<f32>,
    up_w: Tensor<B, 2>,
    up_b: Tensor<B, 1>,
    down_w: Tensor<B, 2>,
    down_b: Tensor<B, 1>,
    all_reduces: u64,
}

fn tensor_parallel(mlp: Mlp<B>, x: Tensor<B, 2>, tp: usize) -> Vec<Rank> {
    launch::<Flex, _, _, _>(
        local_devices::<Flex>(tp).unwrap(),
        LaunchConfig::default(),
        move |group| {
            let tp = TensorParallel::new(group);
            let mut model = TpMlp {
                up: tp.column(mlp.up.clone())?,
                down: tp.row(mlp.down.clone())?,
            };
            let mut optim = AdamWConfig::new().init();
            let mut output = None;
            for _ in 0..STEPS {
                let h = gelu(model.up.forward(x.clone()));
                let y = model.down.forward(h);
                output.get_or_insert_with(|| values(y.clone()));
                let grads = GradientsParams::from_grads(loss(y).backward(), &model);
                tp.check()?;
                model = optim.step(LR, model, grads);
            }
            Ok::<_, ParallelError>(Rank {
                output: output.unwrap(),
                up_w: model.up.linear.weight.val(),
                up_b: model.up.linear.bias.unwrap().val(),
                down_w: model.down.linear.weight.val(),
                down_b: model.down.linear.bias.unwrap().val(),
                all_reduces: tp.all_reduces(),
            })
        },
    )
    .unwrap()
}

/// An 8 -> 16 -> 8 MLP seeded with `seed`, every parameter read once (Burn initialises them
/// lazily and separately per clone: read here, before the ranks clone it, all hold the same).
fn seeded_mlp(seed: u64) -> Mlp<B> {
    let device = Default::default();
    <Flex as Backend>::seed(&device, seed);
    let mlp = Mlp {
        up: LinearConfig::new(8, 16).init::<B>(&device),
        down: LinearConfig::new(16, 8).init::<B>(&device),
    };
    // Weights, then biases: the order the draws are made in.
    let _ = (mlp.up.weight.val(), mlp.down.weight.val());
    let _ = (
        mlp.up.bias.as_ref().map(|b| b.val()),
        mlp.down.bias.as_ref().map(|b| b.val()),
    );
    mlp
}

/// Largest difference relative to the largest value of `expected`.
fn relative(actual: &[f32], expected: &[f32]) -> f32 {
    assert_eq!(actual.len(), expected.len());
    let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    let diff = actual
        .iter()
        .zip(expected)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    diff / scale
}

#[test]
fn an_mlp_split_over_2_and_4_ranks_trains_as_on_one_device() {
    let device = Default::default();
    let mlp = seeded_mlp(7);
    // Tracked, as an activation inside a model is: its gradient is summed over the ranks.
    let x = Tensor::<B, 2>::random([4, 8], Distribution::Normal(0.0, 1.0), &device).require_grad();
    let (output, expected) = one_device(mlp.clone(), x.clone());
    for tp in [2, 4] {
        let ranks = tensor_parallel(mlp.clone(), x.clone(), tp);
        for rank in &ranks {
            let error = relative(&rank.output, &output);
            assert!(
                error < 1e-6,
                "tp {tp}: the output differs by {error:e}: {:?} vs {:?}",
                &rank.output[..4],
                &output[..4]
            );
            // One all-reduce forward (the row layer's sum), one backward (the column
            // layer's input gradient: the input is tracked), per step.
            assert_eq!(rank.all_reduces, 2 * STEPS as u64, "tp {tp}");
        }
        let cat = |pick: fn(&Rank) -> Tensor<B, 2>, dim| {
            values(Tensor::cat(ranks.iter().map(pick).collect(), dim))
        };
        let up_b = values(Tensor::cat(
            ranks.iter().map(|r| r.up_b.clone()).collect(),
            0,
        ));
        // The row layer's bias is whole on every rank, and the same.
        let down_b = values(ranks[0].down_b.clone());
        assert!(
            ranks[1..]
                .iter()
                .all(|r| values(r.down_b.clone()) == down_b)
        );
        let actual = [
            cat(|r| r.up_w.clone(), 1),
            up_b,
            cat(|r| r.down_w.clone(), 0),
            down_b,
        ];
        for (i, (a, e)) in actual.iter().zip(&expected).enumerate() {
            let error = relative(a, e);
            assert!(
                error < 1e-6,
                "tp {tp}: parameter {i} differs by {error:e} (relative)"
            );
        }
    }
}

#[test]
fn a_layer_that_does_not_split_evenly_is_named() {
    let device = Default::default();
    let linear = LinearConfig::new(6, 10).init::<B>(&device);
    let errors = launch::<Flex, _, _, _>(
        local_devices::<Flex>(4).unwrap(),
        LaunchConfig::default(),
        move |group| {
            let tp = TensorParallel::new(group);
            Ok::<_, ParallelError>(tp.column(linear.clone()).err().map(|e| e.to_string()))
        },
    )
    .unwrap();
    let error = errors[0].clone().unwrap();
    assert!(error.contains("tp_size = 4"), "{error}");
    assert!(error.contains("10 of a Linear [6, 10]"), "{error}");
}

/// Every parameter of `attention` read once (Burn initialises them lazily, per clone).
fn initialised(attention: MultiHeadAttention<B>) -> MultiHeadAttention<B> {
    for linear in [
        &attention.query,
        &attention.key,
        &attention.value,
        &attention.output,
    ] {
        let _ = (linear.weight.val(), linear.bias.as_ref().map(|b| b.val()));
    }
    attention
}

/// The attention's output after the first step and its 4 projections' weights after
/// `STEPS` AdamW steps: on one device (`tp` = None) or, concatenated, over `tp` ranks.
fn attention_run(
    attention: MultiHeadAttention<B>,
    x: Tensor<B, 3>,
    mask: Tensor<B, 3, burn::tensor::Bool>,
    tp: Option<usize>,
) -> (Vec<f32>, [Vec<f32>; 4]) {
    let Some(tp) = tp else {
        let (mut model, mut optim, mut first) = (attention, AdamWConfig::new().init(), None);
        for _ in 0..STEPS {
            let input = MhaInput::self_attn(x.clone()).mask_attn(mask.clone());
            let y = model.forward(input).context;
            first.get_or_insert_with(|| values(y.clone()));
            let grads = GradientsParams::from_grads(loss3(y).backward(), &model);
            model = optim.step(LR, model, grads);
        }
        let w = |l: &Linear<B>| values(l.weight.val());
        let m = &model;
        return (
            first.unwrap(),
            [w(&m.query), w(&m.key), w(&m.value), w(&m.output)],
        );
    };
    let ranks = launch::<Flex, _, _, _>(
        local_devices::<Flex>(tp).unwrap(),
        LaunchConfig::default(),
        move |group| {
            let tp = TensorParallel::new(group);
            let mut model: HeadParallel<B> = tp.heads(attention.clone())?;
            let (mut optim, mut first) = (AdamWConfig::new().init(), None);
            for _ in 0..STEPS {
                let y = model.forward_self(x.clone(), None, Some(mask.clone()), &tp);
                first.get_or_insert_with(|| values(y.clone()));
                let grads = GradientsParams::from_grads(loss3(y).backward(), &model);
                tp.check()?;
                model = optim.step(LR, model, grads);
            }
            let a = model.attention;
            let w = |l: Linear<B>| l.weight.val();
            Ok::<_, ParallelError>((
                first.unwrap(),
                [w(a.query), w(a.key), w(a.value), w(a.output)],
            ))
        },
    )
    .unwrap();
    let output = ranks[0].0.clone();
    assert!(
        ranks.iter().all(|r| r.0 == output),
        "every rank holds the whole output"
    );
    let cat = |i: usize, dim: usize| {
        values(Tensor::cat(
            ranks.iter().map(|r| r.1[i].clone()).collect(),
            dim,
        ))
    };
    (output, [cat(0, 1), cat(1, 1), cat(2, 1), cat(3, 0)])
}

fn loss3(y: Tensor<B, 3>) -> Tensor<B, 1> {
    (y.clone() * y).mean()
}

#[test]
fn attention_with_its_heads_split_over_2_and_4_ranks_trains_as_on_one_device() {
    let device = Default::default();
    <Flex as Backend>::seed(&Default::default(), 11);
    let attention = initialised(
        MultiHeadAttentionConfig::new(16, 4)
            .with_dropout(0.0)
            .init::<B>(&device),
    );
    let x =
        Tensor::<B, 3>::random([2, 5, 16], Distribution::Normal(0.0, 1.0), &device).require_grad();
    // A causal mask, as a decoder's.
    let mask = Tensor::<B, 2, burn::tensor::Bool>::tril_mask([5, 5], 0, &device)
        .unsqueeze::<3>()
        .repeat_dim(0, 2);
    let (output, expected) = attention_run(attention.clone(), x.clone(), mask.clone(), None);
    for tp in [2, 4] {
        let (actual_output, actual) =
            attention_run(attention.clone(), x.clone(), mask.clone(), Some(tp));
        let error = relative(&actual_output, &output);
        assert!(error < 1e-6, "tp {tp}: the output differs by {error:e}");
        for (i, (a, e)) in actual.iter().zip(&expected).enumerate() {
            let error = relative(a, e);
            assert!(
                error < 1e-6,
                "tp {tp}: projection {i} differs by {error:e} (relative)"
            );
        }
    }
}

#[test]
fn dp_2_by_tp_2_trains_as_on_one_device() {
    let device = Default::default();
    let mlp = seeded_mlp(13);
    // 8 rows: each data-parallel rank takes 4 (its tensor-parallel pair the same 4).
    let x = Tensor::<B, 2>::random([8, 8], Distribution::Normal(0.0, 1.0), &device);
    let (_, expected) = one_device(mlp.clone(), x.clone());
    let ranks = launch::<Flex, _, _, _>(
        local_devices::<Flex>(4).unwrap(),
        LaunchConfig::default(),
        move |group| {
            let (dp_group, tp_group) = mesh_groups(group, 2, Default::default())?;
            let dp_rank = dp_group.rank();
            let tp = TensorParallel::new(tp_group);
            let mut ddp = Ddp::<B, _>::new(dp_group);
            let mut model = TpMlp {
                up: tp.column(mlp.up.clone())?,
                down: tp.row(mlp.down.clone())?,
            };
            let mine = x.clone().slice([dp_rank * 4..dp_rank * 4 + 4, 0..8]);
            let mut optim = AdamWConfig::new().init();
            for _ in 0..STEPS {
                let y = model.down.forward(gelu(model.up.forward(mine.clone())));
                let mut grads = GradientsParams::from_grads(loss(y).backward(), &model);
                tp.check()?;
                ddp.sync_gradients(&model, &mut grads)?;
                model = optim.step(LR, model, grads);
            }
            Ok::<_, ParallelError>([model.up.linear.weight.val(), model.down.linear.weight.val()])
        },
    )
    .unwrap();
    // Ranks 0 and 1 form data-parallel row 0; row 1 (ranks 2, 3) holds the same shards.
    for (a, b) in ranks[..2].iter().zip(&ranks[2..]) {
        assert_eq!(values(a[0].clone()), values(b[0].clone()));
        assert_eq!(values(a[1].clone()), values(b[1].clone()));
    }
    let up = values(Tensor::cat(
        vec![ranks[0][0].clone(), ranks[1][0].clone()],
        1,
    ));
    let down = values(Tensor::cat(
        vec![ranks[0][1].clone(), ranks[1][1].clone()],
        0,
    ));
    let (up_error, down_error) = (relative(&up, &expected[0]), relative(&down, &expected[2]));
    assert!(up_error < 1e-6, "up differs by {up_error:e}");
    assert!(down_error < 1e-6, "down differs by {down_error:e}");
}

#[test]
fn a_mesh_gives_each_rank_its_row_and_column() {
    let got = launch::<Flex, _, _, _>(
        local_devices::<Flex>(6).unwrap(),
        LaunchConfig::default(),
        |group| {
            let rank = group.rank() as f32;
            let device = Default::default();
            let (dp, tp) = mesh_groups(group, 3, Default::default())?;
            let me = Tensor::<Flex, 1>::from_floats([rank], &device);
            let row: Vec<f32> = tp
                .all_gather(me.clone())?
                .into_iter()
                .map(|t| t.into_scalar())
                .collect();
            let root = (dp.rank() == 1).then(|| me.clone());
            let from_second_row = dp.broadcast(root, 1)?.into_scalar();
            let column_sum = dp
                .all_reduce(me, afterburner_parallel::ReduceOp::Sum)?
                .into_scalar();
            Ok::<_, ParallelError>((row, from_second_row, column_sum))
        },
    )
    .unwrap();
    // 6 ranks as 2 x 3: rows [0, 1, 2] and [3, 4, 5], columns [0, 3], [1, 4], [2, 5].
    for (rank, (row, second, sum)) in got.into_iter().enumerate() {
        let start = (rank / 3 * 3) as f32;
        assert_eq!(row, [start, start + 1.0, start + 2.0], "rank {rank}");
        assert_eq!(second, (3 + rank % 3) as f32, "rank {rank}");
        assert_eq!(sum, (2 * (rank % 3) + 3) as f32, "rank {rank}");
    }
    let error = launch::<Flex, _, _, _>(
        local_devices::<Flex>(4).unwrap(),
        LaunchConfig::default(),
        |group| Ok::<_, ParallelError>(mesh_groups(group, 3, Default::default()).err()),
    )
    .unwrap()[0]
        .clone()
        .unwrap()
        .to_string();
    assert!(error.contains("tp_size = 3"), "{error}");
}

#[test]
fn the_ranks_of_a_mesh_skip_a_step_together() {
    use afterburner_parallel::ParallelStrategy;
    use afterburner_parallel::tp::TensorParallelMesh;
    // Rank 3 alone saw an overflow (its part of a split layer's gradient): every rank skips.
    let skips = launch::<Flex, _, _, _>(
        local_devices::<Flex>(4).unwrap(),
        LaunchConfig::default(),
        |group| {
            let rank = group.rank();
            let mesh = TensorParallelMesh::<B, _>::new(group, 2, Default::default(), None)?;
            let both = [
                ParallelStrategy::<B>::agree_on_skip(&mesh, rank == 3, &Default::default())?,
                ParallelStrategy::<B>::agree_on_skip(&mesh, false, &Default::default())?,
            ];
            Ok::<_, ParallelError>(both)
        },
    )
    .unwrap();
    assert_eq!(skips, vec![[true, false]; 4]);
}
