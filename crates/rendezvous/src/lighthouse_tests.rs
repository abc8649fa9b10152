//! The lighthouse's collectives over the replicas present, and its named failures.

use super::*;

/// Runs collective 0 with `calls[r]` on replica r, each on its own thread.
fn round(
    lighthouse: &Arc<Lighthouse>,
    calls: Vec<(Op, Option<Vec<f32>>)>,
) -> Vec<Result<Reply, RendezvousError>> {
    let sessions: Vec<Session> = (0..calls.len())
        .map(|r| lighthouse.connect(r).unwrap())
        .collect();
    let threads: Vec<_> = calls
        .into_iter()
        .zip(sessions)
        .map(|((op, values), session)| {
            let lighthouse = lighthouse.clone();
            std::thread::spawn(move || lighthouse.collective(&session, 0, op, values))
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn a_gather_holds_the_replicas_present_and_a_mean_divides_by_them() {
    let lighthouse = Lighthouse::new(QuorumConfig::new(3)).unwrap();
    let gone = lighthouse.connect(2).unwrap();
    lighthouse.leave(&gone, "the test");
    let replies = round(
        &lighthouse,
        vec![(Op::Gather, Some(vec![1.0])), (Op::Gather, Some(vec![2.0]))],
    );
    for reply in replies {
        let reply = reply.unwrap();
        assert_eq!(reply.values, vec![vec![1.0], vec![2.0]]);
        assert_eq!(reply.members, vec![0, 1]);
    }
}

#[test]
fn mismatched_collectives_fail_every_member() {
    let lighthouse = Lighthouse::new(QuorumConfig::new(2)).unwrap();
    let replies = round(
        &lighthouse,
        vec![(Op::Sum, Some(vec![1.0])), (Op::Mean, Some(vec![2.0]))],
    );
    assert!(replies.iter().all(|r| r.is_err()), "{replies:?}");
    let lighthouse = Lighthouse::new(QuorumConfig::new(2)).unwrap();
    let replies = round(
        &lighthouse,
        vec![(Op::Sum, Some(vec![1.0])), (Op::Sum, Some(vec![2.0, 3.0]))],
    );
    for reply in replies {
        let error = reply.unwrap_err().to_string();
        assert!(error.contains("sent 2 values"), "{error}");
    }
}

#[test]
fn fewer_replicas_than_min_replicas_fail_the_collective() {
    let config = QuorumConfig::new(3).with_min_replicas(3);
    let lighthouse = Lighthouse::new(config).unwrap();
    let gone = lighthouse.connect(2).unwrap();
    lighthouse.leave(&gone, "the test");
    let replies = round(
        &lighthouse,
        vec![(Op::Mean, Some(vec![1.0])), (Op::Mean, Some(vec![2.0]))],
    );
    for reply in replies {
        let error = reply.unwrap_err().to_string();
        assert!(error.contains("min_replicas = 3"), "{error}");
    }
}

#[test]
fn a_broadcast_whose_root_left_fails_with_its_name() {
    let lighthouse = Lighthouse::new(QuorumConfig::new(2)).unwrap();
    let gone = lighthouse.connect(0).unwrap();
    lighthouse.leave(&gone, "the test");
    let session = lighthouse.connect(1).unwrap();
    let error = lighthouse
        .collective(&session, 0, Op::Broadcast(0), None)
        .unwrap_err()
        .to_string();
    assert!(error.contains("root, replica 0, left"), "{error}");
}
