//! Streaming DiLoCo against a hand-written reference: two ranks whose "inner steps" add known
//! values to their parameters, synced by the strategy itself over an in-process group. For
//! P in {1, 2}, tau in {0, 1}, alpha in {0, 0.5, 1}: every rank's parameters after every step,
//! and the global parameters at the end, equal the reference's. Also: the outer gradients in
//! bf16 and int8 stay within their error bounds, and a round moves the same bytes whatever P
//! while one exchange moves 1/P of them.

use std::sync::atomic::Ordering;
use std::time::Duration;

use afterburner_localsgd::{DiLoCo, DiLoCoConfig, OuterDtype};
use afterburner_parallel::{
    LaunchConfig, ParallelStrategy, SharedGroup, SlowLink, flat_params, launch, with_flat_params,
};
use burn::backend::{Autodiff, Flex};
use burn::nn::{Linear, LinearConfig};
use burn::optim::SgdConfig;

type B = Autodiff<Flex>;

/// What rank `rank`'s inner step `step` adds to parameter value `i`.
fn inner(rank: usize, step: u64, i: usize) -> f32 {
    0.01 * (rank as f32 + 1.0) * ((step as f32 * 0.7 + i as f32 * 1.3).sin())
}

const H: usize = 4;
const STEPS: u64 = 11;

/// Runs the strategy on 2 ranks; returns per rank the parameters after every step and the
/// final ones after `finish`, and the bytes each rank sent.
fn run(config: DiLoCoConfig) -> Vec<(Vec<Vec<f32>>, Vec<f32>, u64)> {
    let device = Default::default();
    // Fixed weights (tests run in parallel, and the backend RNG is process-wide).
    let model: Linear<B> = LinearConfig::new(3, 2).init(&device);
    let fixed: Vec<f32> = (0..8).map(|i| 0.3 - 0.07 * i as f32).collect();
    let fixed = burn::tensor::Tensor::from_floats(fixed.as_slice(), &device);
    let model = with_flat_params::<B, _>(model, fixed);
    launch::<Flex, _, String, _>(vec![device; 2], LaunchConfig::default(), move |group| {
        let rank = group_rank(&group);
        let link = SlowLink::new(group, Duration::ZERO, 1e12);
        let sent = link.bytes_sent();
        let mut diloco = DiLoCo::<B, _>::new(SharedGroup::new(link), config.clone())
            .map_err(|e| e.to_string())?;
        let mut model = diloco.setup(model.clone()).map_err(|e| e.to_string())?;
        let after_setup = sent.load(Ordering::Relaxed);
        let mut trajectory = Vec::new();
        // The inner steps are by hand; DiLoCo leaves the (inner) optimizer alone.
        let mut optim = SgdConfig::new().init::<B, Linear<B>>();
        for step in 1..=STEPS {
            let flat = flat_params::<B, _>(&model).unwrap();
            let n = flat.dims()[0];
            let add: Vec<f32> = (0..n).map(|i| inner(rank, step, i)).collect();
            let add = burn::tensor::Tensor::from_floats(add.as_slice(), &flat.device());
            model = with_flat_params::<B, _>(model, flat + add);
            model = diloco
                .after_optimizer_step(model, &mut optim, step)
                .map_err(|e| e.to_string())?;
            trajectory.push(values(&model));
        }
        let model = diloco.finish(model, STEPS).map_err(|e| e.to_string())?;
        let bytes = sent.load(Ordering::Relaxed) - after_setup;
        Ok((trajectory, values(&model), bytes))
    })
    .unwrap()
}

fn group_rank<G: afterburner_parallel::ProcessGroup<Flex>>(group: &G) -> usize {
    group.rank()
}

fn values(model: &Linear<B>) -> Vec<f32> {
    flat_params::<B, _>(model)
        .unwrap()
        .into_data()
        .to_vec::<f32>()
        .unwrap()
}

/// The algorithm by hand, in f64: fragments strided by parameter (weight 6 values, then
/// bias 2), PyTorch's Nesterov SGD per fragment, delayed application, mixing.
fn reference(initial: &[f32], config: &DiLoCoConfig) -> (Vec<Vec<Vec<f64>>>, Vec<f64>) {
    let n = initial.len();
    let sizes = [6usize, 2];
    let p_count = config.fragments;
    let fragment_of = |i: usize| if i < sizes[0] { 0 } else { 1 % p_count };
    let members = |p: usize| (0..n).filter(move |&i| fragment_of(i) == p);
    let (lr, m, alpha) = (config.outer_lr, config.outer_momentum, config.mixing());
    let mut local: Vec<Vec<f64>> = vec![initial.iter().map(|&v| v as f64).collect(); 2];
    let mut global: Vec<f64> = local[0].clone();
    let mut buffer: Vec<Option<Vec<f64>>> = vec![None; p_count];
    let mut pending: Option<(usize, u64, Vec<f64>)> = None;
    let interval = (H / p_count) as u64;
    let mut trajectory = vec![Vec::new(); 2];
    let outer = |global: &mut Vec<f64>, buffer: &mut Option<Vec<f64>>, p: usize, g: &[f64]| {
        let idx: Vec<usize> = members(p).collect();
        let buf: Vec<f64> = match buffer.take() {
            Some(b) => b.iter().zip(g).map(|(b, g)| m * b + g).collect(),
            None => g.to_vec(),
        };
        for (k, &i) in idx.iter().enumerate() {
            let update = if m == 0.0 { g[k] } else { g[k] + m * buf[k] };
            global[i] -= lr * update;
        }
        if m != 0.0 {
            *buffer = Some(buf);
        }
    };
    let merge = |local: &mut Vec<Vec<f64>>, global: &[f64], p: usize, a: f64| {
        for l in local.iter_mut() {
            for i in members(p) {
                l[i] = (1.0 - a) * l[i] + a * global[i];
            }
        }
    };
    let exchange = |local: &[Vec<f64>], global: &[f64], p: usize| -> Vec<f64> {
        members(p)
            .map(|i| (global[i] - local[0][i] + global[i] - local[1][i]) / 2.0)
            .collect()
    };
    for step in 1..=STEPS {
        for (rank, l) in local.iter_mut().enumerate() {
            for (i, v) in l.iter_mut().enumerate() {
                *v += inner(rank, step, i) as f64;
            }
        }
        if let Some((p, at, g)) = pending.take() {
            match at == step {
                true => {
                    outer(&mut global, &mut buffer[p], p, &g);
                    merge(&mut local, &global, p, alpha);
                }
                false => pending = Some((p, at, g)),
            }
        }
        if step % interval == 0 {
            let p = ((step / interval - 1) % p_count as u64) as usize;
            let g = exchange(&local, &global, p);
            match config.delay {
                0 => {
                    outer(&mut global, &mut buffer[p], p, &g);
                    merge(&mut local, &global, p, alpha);
                }
                d => pending = Some((p, step + d as u64, g)),
            }
        }
        for rank in 0..2 {
            trajectory[rank].push(local[rank].clone());
        }
    }
    if let Some((p, _, g)) = pending.take() {
        outer(&mut global, &mut buffer[p], p, &g);
        merge(&mut local, &global, p, alpha);
    }
    for (p, momentum) in buffer.iter_mut().enumerate() {
        let g = exchange(&local, &global, p);
        outer(&mut global, momentum, p, &g);
        merge(&mut local, &global, p, 1.0);
    }
    (trajectory, global)
}

fn max_diff(a: &[f32], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .fold(0f64, |m, (a, b)| m.max((*a as f64 - b).abs()))
}

fn config(fragments: usize, delay: usize, mixing: f64) -> DiLoCoConfig {
    DiLoCoConfig {
        sync_every: H,
        fragments,
        delay,
        mixing: Some(mixing),
        ..Default::default()
    }
}

#[test]
fn trajectories_match_the_hand_written_reference() {
    for fragments in [1, 2] {
        for delay in [0, 1] {
            for mixing in [0.0, 0.5, 1.0] {
                let config = config(fragments, delay, mixing);
                let ranks = run(config.clone());
                let initial: Vec<f32> = {
                    // Step 1's parameters minus step 1's inner addition (no sync at step 1).
                    let first = &ranks[0].0[0];
                    (0..first.len())
                        .map(|i| first[i] - inner(0, 1, i))
                        .collect()
                };
                let (want, global) = reference(&initial, &config);
                let what = format!("P {fragments} tau {delay} alpha {mixing}");
                for (rank, (trajectory, last, _)) in ranks.iter().enumerate() {
                    for (step, got) in trajectory.iter().enumerate() {
                        let err = max_diff(got, &want[rank][step]);
                        assert!(err < 1e-5, "{what} rank {rank} step {}: {err}", step + 1);
                    }
                    let err = max_diff(last, &global);
                    assert!(err < 1e-5, "{what} rank {rank} after finish: {err}");
                }
            }
        }
    }
}

#[test]
fn one_fragment_no_delay_full_mixing_is_diloco_bitwise() {
    let plain = run(DiLoCoConfig {
        sync_every: H,
        ..Default::default()
    });
    let streaming = run(config(1, 0, 1.0));
    for (a, b) in plain.iter().zip(&streaming) {
        assert!(a.0 == b.0 && a.1 == b.1, "bitwise equal");
    }
}

#[test]
fn a_round_moves_the_same_bytes_and_one_exchange_1_over_p() {
    let bytes = |fragments| run(config(fragments, 0, 1.0))[0].2;
    // 11 steps: P = 1 exchanges at 4 and 8 (8 values each), plus finish (8): 24 values.
    // P = 2 exchanges every 2 steps (steps 2, 4, 6, 8, 10: weight 6, bias 2, weight, bias,
    // weight), plus finish (both): 6+2+6+2+6 + 8 = 30 values.
    assert_eq!(bytes(1), 4 * 24);
    assert_eq!(bytes(2), 4 * 30);
}

#[test]
fn low_precision_outer_gradients_stay_within_their_bounds() {
    let exact = run(config(1, 0, 1.0));
    for (dtype, bound) in [
        (OuterDtype::Bf16, 1e-3),
        (OuterDtype::F16, 1e-4),
        (OuterDtype::Int8, 1e-3),
    ] {
        let ranks = run(DiLoCoConfig {
            outer_dtype: dtype,
            ..config(1, 0, 1.0)
        });
        for (got, want) in ranks.iter().zip(&exact) {
            let want: Vec<f64> = want.1.iter().map(|&v| v as f64).collect();
            let err = max_diff(&got.1, &want);
            println!("{dtype}: final parameters vs f32 exchanges: {err:e}");
            assert!(err < bound, "{dtype}: {err}");
            assert!(
                err > 0.0 || dtype == OuterDtype::F32,
                "{dtype} changed nothing?"
            );
        }
        let sent = ranks[0].2 as f64 / exact[0].2 as f64;
        println!("{dtype}: bytes vs f32 {sent:.3}");
    }
}
