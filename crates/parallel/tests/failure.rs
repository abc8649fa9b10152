//! A worker that fails, panics or hangs makes the others return an error within a bounded
//! time; never a hang. A new launch works afterwards.

use std::time::{Duration, Instant};

use afterburner_parallel::{LaunchConfig, ParallelError, ProcessGroup, ReduceOp, launch};
use burn::backend::Flex;
use burn::tensor::Tensor;

/// Rank 1 misbehaves (per `how`) at its third step; rank 0 keeps all-reducing. Returns the
/// launch's result and how long it took.
fn run(how: &'static str, timeout: Duration) -> (Result<Vec<String>, ParallelError>, Duration) {
    let start = Instant::now();
    let result = launch::<Flex, _, String, _>(
        vec![Default::default(); 2],
        LaunchConfig { timeout },
        move |g| {
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
        },
    );
    (result, start.elapsed())
}

#[test]
fn an_error_a_panic_or_a_hang_stops_every_rank() {
    let (result, took) = run("error", Duration::from_secs(30));
    let err = result.unwrap_err();
    assert!(
        matches!(&err, ParallelError::PeerFailed { rank: 1, reason } if reason.contains("data file missing")),
        "{err}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");

    let (result, took) = run("panic", Duration::from_secs(30));
    let err = result.unwrap_err();
    assert!(
        matches!(&err, ParallelError::PeerFailed { rank: 1, reason } if reason.contains("out of memory")),
        "{err}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");

    // Rank 1 returns successfully at step 2: the group never goes on with rank 0 alone (its
    // all-reduces would complete with one rank and divide by the wrong count).
    let (result, took) = run("return", Duration::from_secs(30));
    let err = result.unwrap_err();
    assert!(
        matches!(&err, ParallelError::PeerFailed { rank: 1, reason }
            if reason.contains("returned") && reason.contains("rank 0")),
        "{err}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");

    // Rank 1 stops calling collectives: rank 0's all_reduce times out after 1 s.
    let (result, took) = run("hang", Duration::from_secs(1));
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
    let ok =
        launch::<Flex, _, String, _>(vec![Default::default(); 2], LaunchConfig::default(), |g| {
            let t = Tensor::<Flex, 1>::ones([2], g.device());
            let r = g.all_reduce(t, ReduceOp::Sum).map_err(|e| e.to_string())?;
            Ok(r.into_data().to_vec::<f32>().unwrap())
        })
        .unwrap();
    assert_eq!(ok, vec![vec![2.0, 2.0], vec![2.0, 2.0]]);
}
