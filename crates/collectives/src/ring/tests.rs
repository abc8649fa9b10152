//! The ring on threads of one process: results against the fixed-order sum, bytes sent,
//! failures named and sticky, frames of an old generation refused.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use super::algorithms::chunk;
use super::{Endpoint, Ring, endpoint, frames};

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Member `r`'s values: magnitudes far apart, so the order of a sum shows in its bits.
fn values(r: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            ((i * 7 + r * 13) % 11) as f32 * 10f32.powi((r as i32 * 3 + i as i32) % 9 - 4) + 0.1
        })
        .collect()
}

/// The ring's documented order: chunk `c` summed from the member after position `c` around
/// to `c` itself, left to right.
fn fixed_order_sum(all: &[Vec<f32>]) -> Vec<f32> {
    let (n, len) = (all.len(), all[0].len());
    let mut out = vec![0f32; len];
    for c in 0..n {
        for i in chunk(len, n, c) {
            let mut sum = all[(c + 1) % n][i];
            for k in 2..=n {
                sum += all[(c + k) % n][i];
            }
            out[i] = if n == 1 { all[0][i] } else { sum };
        }
    }
    out
}

/// Runs `work` on a ring of `n` members (replica ids `0..n`) at `generation`, one thread each.
fn on_ring<T: Send>(n: usize, timeout: Duration, work: impl Fn(usize, Ring) -> T + Sync) -> Vec<T> {
    let endpoints: Vec<Endpoint> = (0..n)
        .map(|r| Endpoint::bind(LOOPBACK, r).unwrap())
        .collect();
    let peers: BTreeMap<usize, String> = (0..n).map(|r| (r, endpoints[r].address())).collect();
    let members: Vec<usize> = (0..n).collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (endpoint, peers, members, work) = (&endpoints[r], &peers, &members, &work);
                scope.spawn(move || {
                    let ring = Ring::build(endpoint, r, members, 7, peers, timeout).unwrap();
                    work(r, ring)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn all_reduce_is_the_fixed_order_sum_bitwise_and_sends_2_n_minus_1_over_n() {
    // One piece per chunk, and chunks of several pieces (each summed as it arrives).
    for (n, len) in (1..=4)
        .map(|n| (n, 12 * 1000))
        .chain([(2, 400_002), (3, 400_002)])
    {
        let all: Vec<Vec<f32>> = (0..n).map(|r| values(r, len)).collect();
        let expected = fixed_order_sum(&all);
        let results = on_ring(n, Duration::from_secs(10), |r, mut ring| {
            let sum = ring.all_reduce(values(r, len), false).unwrap();
            let mean = ring.all_reduce(values(r, len), true).unwrap();
            (sum, mean, ring.bytes_sent())
        });
        for (sum, mean, sent) in results {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&sum), bits(&expected), "n = {n}");
            let divided: Vec<f32> = expected.iter().map(|v| v / n as f32).collect();
            assert_eq!(bits(&mean), bits(&divided), "n = {n}");
            // Two all-reduces, each 2(n-1)/n of the buffer's bytes.
            assert_eq!(
                sent,
                2 * (2 * (n as u64 - 1) * 4 * len as u64 / n as u64),
                "n = {n}"
            );
        }
    }
}

#[test]
fn members_that_all_reduce_different_lengths_get_a_named_error() {
    let results = on_ring(2, Duration::from_secs(10), |r, mut ring| {
        ring.all_reduce(values(r, [8, 12][r]), false)
            .unwrap_err()
            .to_string()
    });
    for (r, err) in results.iter().enumerate() {
        assert!(err.contains("different lengths"), "member {r}: {err}");
    }
}

#[test]
fn reduce_scatter_all_gather_and_broadcast_over_four() {
    let n = 4;
    let len = 4 * 300_001; // a broadcast of several segments
    let all: Vec<Vec<f32>> = (0..n).map(|r| values(r, len)).collect();
    let expected = fixed_order_sum(&all);
    let results = on_ring(n, Duration::from_secs(10), |r, mut ring| {
        let scattered = ring.reduce_scatter(values(r, len), false).unwrap();
        let gathered = ring.all_gather(vec![r as f32; r + 1]).unwrap();
        let root = ring.broadcast((r == 2).then(|| values(2, len)), 2).unwrap();
        (scattered, gathered, root)
    });
    for (r, (scattered, gathered, root)) in results.into_iter().enumerate() {
        assert_eq!(scattered, expected[chunk(len, n, r)]);
        let want: Vec<Vec<f32>> = (0..n).map(|k| vec![k as f32; k + 1]).collect();
        assert_eq!(gathered, want);
        assert_eq!(root, all[2]);
    }
}

#[test]
fn a_member_that_dies_or_hangs_gives_the_others_a_named_sticky_error_within_the_timeout() {
    let timeout = Duration::from_secs(2);
    for hangs in [false, true] {
        let results = on_ring(4, timeout, |r, mut ring| {
            if r == 2 {
                if hangs {
                    std::thread::sleep(timeout * 3);
                }
                drop(ring); // dies: its links close
                return None;
            }
            let started = Instant::now();
            let first = ring.all_reduce(values(r, 4000), false).unwrap_err();
            let waited = started.elapsed();
            let again = ring.all_reduce(values(r, 4000), false).unwrap_err();
            Some((first, again, waited))
        });
        for (r, result) in results.into_iter().enumerate() {
            let Some((first, again, waited)) = result else {
                continue; // replica 2 itself
            };
            let text = first.to_string();
            // Replica 3 reads from it and names it; the others name the neighbour whose links
            // closed after (the quorum group then asks the lighthouse who left first).
            let named = if r == 3 { "replica 2" } else { "replica " };
            assert!(text.contains(named), "replica {r}: {text}");
            assert!(waited < timeout * 2, "{text} after {waited:?}");
            assert_eq!(first, again, "the first failure is sticky");
        }
    }
}

#[test]
fn a_frame_of_an_old_generation_is_refused_by_name() {
    let timeout = Duration::from_secs(5);
    let endpoint = Endpoint::bind(LOOPBACK, 0).unwrap();
    let rogue_listener = Endpoint::bind(LOOPBACK, 1).unwrap();
    let peers = BTreeMap::from([(0, endpoint.address()), (1, rogue_listener.address())]);
    // Replica 1 greets for generation 7, then sends a frame of generation 6.
    let address = endpoint.address();
    let rogue = std::thread::spawn(move || {
        let mut stream = endpoint::connect(&address, 1, 7, timeout).unwrap();
        let old = frames::Expected {
            generation: 6,
            op: 0,
            index: 0,
            count: None,
        };
        frames::write_block(&mut stream, old, &[1.0, 2.0]).unwrap();
        stream.flush().unwrap();
        std::thread::sleep(Duration::from_millis(500));
    });
    let mut ring = Ring::build(&endpoint, 0, &[0, 1], 7, &peers, timeout).unwrap();
    let error = ring
        .all_reduce(vec![1.0, 2.0], false)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("refused a frame of generation 6 from replica 1")
            && error.contains("this ring is generation 7"),
        "{error}"
    );
    rogue.join().unwrap();
}
