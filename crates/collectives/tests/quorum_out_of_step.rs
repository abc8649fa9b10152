//! A fault-tolerant group whose members disagree on a collective: the replica out of step (a
//! newcomer that called another collective than the others) leaves the quorum with the error,
//! and the replicas that were right run the collective without it. Ranks that fail together
//! all fail, as before.

use std::sync::Arc;

use afterburner_collectives::{Lighthouse, LocalReplicas, ProcessGroup, QuorumConfig, ReduceOp};
use burn::backend::Flex;
use burn::tensor::Tensor;

/// Replica `id`'s first collective: a sum of `[id + 1]`, the same on every replica.
fn first_sum(group: &dyn ProcessGroup<Flex>, id: usize) -> Vec<f32> {
    let device = Default::default();
    let one = Tensor::<Flex, 1>::from_floats([(id + 1) as f32], &device);
    let summed = group.all_reduce(one, ReduceOp::Sum).unwrap();
    summed.into_data().to_vec::<f32>().unwrap()
}

#[test]
fn the_replica_out_of_step_leaves_and_the_others_go_on() {
    let lighthouse = Lighthouse::new(QuorumConfig::new(3)).unwrap();
    let threads: Vec<_> = (0..3)
        .map(|id| {
            let lighthouse: Arc<Lighthouse> = lighthouse.clone();
            std::thread::spawn(move || {
                let device = Default::default();
                let group = lighthouse.replica::<Flex>(id, &device).unwrap();
                assert_eq!(first_sum(&group, id), vec![6.0]);
                // The second collective: replicas 0 and 1 sum 2 values, replica 2 sums 4.
                let len = if id == 2 { 4 } else { 2 };
                let values = Tensor::<Flex, 1>::ones([len], &device);
                group
                    .all_reduce(values, ReduceOp::Sum)
                    .map(|t| t.into_data().to_vec::<f32>().unwrap())
                    .map_err(|e| e.to_string())
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // A tie is not the case here: 2 against 1, the 2 were right.
    assert_eq!(results[0], Ok(vec![2.0, 2.0]));
    assert_eq!(results[1], Ok(vec![2.0, 2.0]));
    let error = results[2].clone().unwrap_err();
    assert!(
        error.contains("replica 2 sent 4 values, replica 0 sent 2"),
        "{error}"
    );
    // The first to leave, before the others finished (and dropped their handles).
    let departure = lighthouse.departures().remove(0);
    assert_eq!(departure.replica, 2);
    assert!(
        departure.reason.contains("out of step"),
        "{}",
        departure.reason
    );
}
