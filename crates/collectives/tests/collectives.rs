//! The in-process engine's collectives give the same values on every rank.

use afterburner_collectives::{LaunchConfig, ProcessGroup, ReduceOp, launch};
use burn::backend::Flex;
use burn::tensor::Tensor;

fn values(t: Tensor<Flex, 1>) -> Vec<f32> {
    t.into_data().to_vec::<f32>().unwrap()
}

#[test]
fn all_reduce_broadcast_gather_scatter_barrier() {
    let results =
        launch::<Flex, _, String, _>(vec![Default::default(); 3], LaunchConfig::default(), |g| {
            let device = *g.device();
            let r = g.rank() as f32;
            let mine = Tensor::<Flex, 1>::from_floats([r, 10.0 * r, 1.0, 2.0, 3.0, 4.0], &device);
            let sum = values(
                g.all_reduce(mine.clone(), ReduceOp::Sum)
                    .map_err(|e| e.to_string())?,
            );
            let mean = values(
                g.all_reduce(mine.clone(), ReduceOp::Mean)
                    .map_err(|e| e.to_string())?,
            );
            let root = (g.rank() == 2).then(|| Tensor::from_floats([7.0, 8.0], &device));
            let bcast = values(g.broadcast(root, 2).map_err(|e| e.to_string())?);
            // Rank r sends r + 1 values.
            let short = Tensor::<Flex, 1>::ones([g.rank() + 1], &device).mul_scalar(r);
            let gathered: Vec<Vec<f32>> = g
                .all_gather(short)
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(values)
                .collect();
            let scattered = values(
                g.reduce_scatter(mine, ReduceOp::Sum)
                    .map_err(|e| e.to_string())?,
            );
            g.barrier(&device).map_err(|e| e.to_string())?;
            Ok((sum, mean, bcast, gathered, scattered))
        })
        .unwrap();
    for (rank, (sum, mean, bcast, gathered, scattered)) in results.into_iter().enumerate() {
        assert_eq!(sum, [3.0, 30.0, 3.0, 6.0, 9.0, 12.0]);
        assert_eq!(mean, [1.0, 10.0, 1.0, 2.0, 3.0, 4.0]);
        assert_eq!(bcast, [7.0, 8.0]);
        assert_eq!(
            gathered,
            vec![vec![0.0], vec![1.0, 1.0], vec![2.0, 2.0, 2.0]]
        );
        assert_eq!(scattered, sum[2 * rank..2 * rank + 2].to_vec());
    }
}

#[test]
fn no_devices_is_a_named_error() {
    let err =
        launch::<Flex, (), String, _>(vec![], LaunchConfig::default(), |_| Ok(())).unwrap_err();
    assert!(err.to_string().contains("devices"), "{err}");
}

/// A one-rank engine that records which of its own methods were called.
#[derive(Default, Clone)]
struct Counting {
    calls: std::sync::Arc<std::sync::Mutex<Vec<&'static str>>>,
}

impl Counting {
    fn called(&self, name: &'static str) {
        self.calls.lock().unwrap().push(name);
    }
}

impl ProcessGroup<Flex> for Counting {
    fn rank(&self) -> usize {
        0
    }

    fn world_size(&self) -> usize {
        1
    }

    fn all_reduce(
        &self,
        tensor: Tensor<Flex, 1>,
        _op: ReduceOp,
    ) -> Result<Tensor<Flex, 1>, afterburner_collectives::ParallelError> {
        self.called("all_reduce");
        Ok(tensor)
    }

    fn broadcast(
        &self,
        tensor: Option<Tensor<Flex, 1>>,
        _root: usize,
    ) -> Result<Tensor<Flex, 1>, afterburner_collectives::ParallelError> {
        self.called("broadcast");
        Ok(tensor.unwrap())
    }

    fn all_gather(
        &self,
        tensor: Tensor<Flex, 1>,
    ) -> Result<Vec<Tensor<Flex, 1>>, afterburner_collectives::ParallelError> {
        self.called("all_gather");
        Ok(vec![tensor])
    }

    fn reduce_scatter(
        &self,
        tensor: Tensor<Flex, 1>,
        _op: ReduceOp,
    ) -> Result<Tensor<Flex, 1>, afterburner_collectives::ParallelError> {
        self.called("reduce_scatter");
        Ok(tensor)
    }

    fn barrier(
        &self,
        _device: &burn::tensor::Device<Flex>,
    ) -> Result<(), afterburner_collectives::ParallelError> {
        self.called("barrier");
        Ok(())
    }
}

#[test]
fn a_boxed_or_shared_group_reaches_every_engine_method() {
    let engine = Counting::default();
    let boxed: Box<dyn ProcessGroup<Flex>> = Box::new(engine.clone());
    // The Accelerator holds its group boxed and shared.
    let shared = afterburner_collectives::SharedGroup::new(boxed);
    let device = Default::default();
    let t = Tensor::<Flex, 1>::from_floats([1.0, 2.0], &device);
    shared.all_reduce(t.clone(), ReduceOp::Sum).unwrap();
    shared.broadcast(Some(t.clone()), 0).unwrap();
    shared.all_gather(t.clone()).unwrap();
    shared.reduce_scatter(t, ReduceOp::Mean).unwrap();
    shared.barrier(&device).unwrap();
    assert_eq!(
        *engine.calls.lock().unwrap(),
        [
            "all_reduce",
            "broadcast",
            "all_gather",
            "reduce_scatter",
            "barrier"
        ]
    );
}

#[test]
fn a_slow_link_counts_the_bytes_each_rank_sends() {
    let device = Default::default();
    let link = afterburner_collectives::SlowLink::new(
        Counting::default(),
        std::time::Duration::from_millis(20),
        1e6,
    );
    let sent = link.bytes_sent();
    link.all_reduce(Tensor::<Flex, 1>::ones([1000], &device), ReduceOp::Sum)
        .unwrap();
    link.broadcast(Some(Tensor::<Flex, 1>::ones([10], &device)), 0)
        .unwrap();
    // Its time cost is measured in the bench, never asserted here.
    assert_eq!(sent.load(std::sync::atomic::Ordering::Relaxed), 4040);
}
