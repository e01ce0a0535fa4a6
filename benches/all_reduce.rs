//! The data-parallel gradient all-reduce (`Replica::all_reduce`, burn-collective) at
//! SD3.5-medium LoRA size: two replicas on the selected backend's first device(s), the first
//! call and the median of later calls.
//!
//! SD3.5-medium with rank-32 adapters on the default targets adapts 243 projections of
//! 1536 x 1536: the joint attention's eight in 23 blocks, seven in the last (no `to_add_out`),
//! and the four of the second attention in the 13 dual-attention blocks; each has factors
//! `A [32, 1536]` and `B [1536, 32]`, 23.9M values (91 MiB in f32) in all.
//!
//! `cargo bench --bench all_reduce [-- DEVICES]` (default 2); `BENCH_ITERS` sets the timed
//! iterations (default 10). An update's share is this time over the time of the step's
//! micro-batches (`cargo bench --bench mmdit -- sd35-medium`, times micro-batches per step).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use burn::collective::CollectiveConfig;
use burn::prelude::*;
use burn::tensor::Distribution;
use tpgrpo::backend::{self, Backend as B};
use tpgrpo::train::Replica;

/// Adapted projections of SD3.5-medium (see the module note), their width and the rank.
const PROJECTIONS: usize = 243;
const WIDTH: usize = 1536;
const RANK: usize = 32;

fn gradients(device: &backend::Device) -> BTreeMap<String, Tensor<B, 2>> {
    let normal = Distribution::Normal(0.0, 1e-3);
    (0..PROJECTIONS)
        .flat_map(|p| {
            [
                (format!("{p:03}.lora_A"), Tensor::random([RANK, WIDTH], normal, device)),
                (format!("{p:03}.lora_B"), Tensor::random([WIDTH, RANK], normal, device)),
            ]
        })
        .collect()
}

fn main() {
    let devices: usize =
        std::env::args().nth(1).filter(|a| !a.starts_with('-')).map_or(2, |a| a.parse().unwrap());
    let iters: usize = std::env::var("BENCH_ITERS").map_or(10, |v| v.parse().unwrap());
    let devices = backend::devices(devices).expect("devices");
    let n = devices.len();
    let config = CollectiveConfig::default().with_num_devices(n);
    let handles: Vec<_> = devices
        .into_iter()
        .enumerate()
        .map(|(rank, device)| {
            let config = config.clone();
            std::thread::spawn(move || {
                let replica = Replica::threads(rank, n);
                replica.register::<B>(&device, config).expect("register");
                let grads = gradients(&device);
                let mut times = Vec::new();
                for _ in 0..=iters {
                    let start = Instant::now();
                    let summed = replica.all_reduce(grads.clone()).expect("all-reduce");
                    let _ = summed.values().next().expect("a tensor").clone().into_data();
                    times.push(start.elapsed());
                }
                replica.finish::<B>().expect("finish");
                times
            })
        })
        .collect();
    let times: Vec<Vec<Duration>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let values = PROJECTIONS * 2 * RANK * WIDTH;
    println!(
        "all-reduce of {values} values ({:.0} MiB f32) over {n} replicas on {}:",
        values as f64 * 4.0 / (1 << 20) as f64,
        backend::NAME
    );
    for (rank, t) in times.iter().enumerate() {
        let mut later = t[1..].to_vec();
        later.sort();
        println!(
            "  replica {rank}: first {:.1} ms, median {:.1} ms",
            t[0].as_secs_f64() * 1e3,
            later[later.len() / 2].as_secs_f64() * 1e3
        );
    }
}
