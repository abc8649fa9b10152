//! A worker that fails, panics or hangs makes the others return an error within a bounded
//! time; never a hang. A new launch works afterwards. The same through the host exchange
//! (what ranks sharing a GPU use).

use std::time::{Duration, Instant};

use afterburner_collectives::{
    LaunchConfig, LocalGroup, ParallelError, ProcessGroup, ReduceOp, launch, launch_through_host,
};
use burn::backend::Flex;
use burn::tensor::Tensor;

/// A launcher: [`launch`] or [`launch_through_host`].
type Launcher = fn(
    Vec<burn::tensor::Device<Flex>>,
    LaunchConfig,
    Box<dyn Fn(LocalGroup<Flex>) -> Result<String, String> + Send + Sync>,
) -> Result<Vec<String>, ParallelError>;

fn by_collective(
    devices: Vec<burn::tensor::Device<Flex>>,
    config: LaunchConfig,
    worker: Box<dyn Fn(LocalGroup<Flex>) -> Result<String, String> + Send + Sync>,
) -> Result<Vec<String>, ParallelError> {
    launch::<Flex, _, String, _>(devices, config, worker)
}

fn through_host(
    devices: Vec<burn::tensor::Device<Flex>>,
    config: LaunchConfig,
    worker: Box<dyn Fn(LocalGroup<Flex>) -> Result<String, String> + Send + Sync>,
) -> Result<Vec<String>, ParallelError> {
    launch_through_host::<Flex, _, String, _>(devices, config, worker)
}

/// Rank 1 misbehaves (per `how`) at its third step; rank 0 keeps all-reducing. Returns the
/// launch's result and how long it took.
fn run(
    launcher: Launcher,
    how: &'static str,
    timeout: Duration,
) -> (Result<Vec<String>, ParallelError>, Duration) {
    let start = Instant::now();
    let result = launcher(
        vec![Default::default(); 2],
        LaunchConfig { timeout },
        Box::new(move |g| {
            let device = *g.device();
            for step in 0..50 {
                if g.rank() == 1 && step == 2 {
                    match how {
                        "error" => return Err("data file missing".to_string()),
                        "panic" => panic!("out of memory (simulated)"),
                        "return" => return Ok("left early".into()),
                        _ => std::thread::sleep(Duration::from_secs(4)), // hangs, then leaves
                    }
                    return Ok("left".into());
                }
                let t = Tensor::<Flex, 1>::ones([4], &device);
                if let Err(e) = g.all_reduce(t, ReduceOp::Sum) {
                    return Ok(format!("rank {} stopped at step {step}: {e}", g.rank()));
                }
            }
            Ok("finished".into())
        }),
    );
    (result, start.elapsed())
}

#[test]
fn an_error_a_panic_or_a_hang_stops_every_rank() {
    stops_every_rank(by_collective);
}

#[test]
fn through_the_host_an_error_a_panic_or_a_hang_stops_every_rank() {
    stops_every_rank(through_host);
}

fn stops_every_rank(launcher: Launcher) {
    let (result, took) = run(launcher, "error", Duration::from_secs(30));
    let err = result.unwrap_err();
    assert!(
        matches!(&err, ParallelError::PeerFailed { rank: 1, reason } if reason.contains("data file missing")),
        "{err}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");

    let (result, took) = run(launcher, "panic", Duration::from_secs(30));
    let err = result.unwrap_err();
    assert!(
        matches!(&err, ParallelError::PeerFailed { rank: 1, reason } if reason.contains("out of memory")),
        "{err}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");

    // Rank 1 returns successfully at step 2: the group never goes on with rank 0 alone (its
    // all-reduces would complete with one rank and divide by the wrong count).
    let (result, took) = run(launcher, "return", Duration::from_secs(30));
    let err = result.unwrap_err();
    assert!(
        matches!(&err, ParallelError::PeerFailed { rank: 1, reason }
            if reason.contains("returned") && reason.contains("rank 0")),
        "{err}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");

    // Rank 1 stops calling collectives: rank 0's all_reduce times out after 1 s.
    let (result, took) = run(launcher, "hang", Duration::from_secs(1));
    let err = result.unwrap_err();
    assert!(
        matches!(
            err,
            ParallelError::Timeout {
                op: "all_reduce",
                rank: 0,
                ..
            }
        ),
        "{err}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");

    // The engine is usable again.
    let ok = launcher(
        vec![Default::default(); 2],
        LaunchConfig::default(),
        Box::new(|g| {
            let t = Tensor::<Flex, 1>::ones([2], g.device());
            let r = g.all_reduce(t, ReduceOp::Sum).map_err(|e| e.to_string())?;
            Ok(format!("{:?}", r.into_data().to_vec::<f32>().unwrap()))
        }),
    )
    .unwrap();
    assert_eq!(ok, vec!["[2.0, 2.0]", "[2.0, 2.0]"]);
}
