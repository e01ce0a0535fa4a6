//! MMDiT forward and forward+backward time per iteration on the selected backend.
//!
//! Preset: 4 blocks, 4 heads x 64 (D = 256), dual attention on blocks 0-1, qk-norm,
//! latent 16x32x32 (256 image tokens), 64 text tokens of width 256, pooled 128, position grid 32,
//! batch 2. `benches/torch_mmdit.py` measures diffusers on the same configuration.
//!
//! `cargo bench --bench mmdit` (`BENCH_ITERS` sets the timed iterations, default 10).

use std::time::{Duration, Instant};

use burn::prelude::*;
use burn::tensor::Distribution;
use tpgrpo::backend::{self, Backend, TrainBackend};
use tpgrpo::model::MMDiT;

mod common;
use common::bench_config;

struct Inputs<B: burn::prelude::Backend> {
    latent: Tensor<B, 4>,
    timestep: Tensor<B, 1>,
    text: Tensor<B, 3>,
    pooled: Tensor<B, 2>,
}

fn inputs<B: burn::prelude::Backend>(device: &B::Device) -> Inputs<B> {
    let n = Distribution::Normal(0.0, 1.0);
    Inputs {
        latent: Tensor::random([2, 16, 32, 32], n, device),
        timestep: Tensor::from_floats([1000.0, 464.88], device),
        text: Tensor::random([2, 64, 256], n, device),
        pooled: Tensor::random([2, 128], n, device),
    }
}

fn forward<B: burn::prelude::Backend>(model: &MMDiT<B>, x: &Inputs<B>) -> Tensor<B, 4> {
    model
        .forward(x.latent.clone(), x.timestep.clone(), x.text.clone(), x.pooled.clone())
        .expect("valid inputs")
}

/// Times `f` (one warm-up call), returning the median and mean of `iters` calls.
fn time(iters: usize, mut f: impl FnMut()) -> (Duration, Duration) {
    f();
    let mut times: Vec<Duration> = (0..iters)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    times.sort();
    (times[iters / 2], times.iter().sum::<Duration>() / iters as u32)
}

fn main() {
    let iters: usize = std::env::var("BENCH_ITERS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let device = backend::device();
    let config = bench_config();

    let model: MMDiT<Backend> = config.init(&device).expect("valid config");
    let x = inputs::<Backend>(&device);
    let (fwd_median, fwd_mean) = time(iters, || {
        let _ = forward(&model, &x).into_data();
    });

    let model: MMDiT<TrainBackend> = config.init(&device).expect("valid config");
    let x = inputs::<TrainBackend>(&device);
    let (bwd_median, bwd_mean) = time(iters, || {
        let loss = forward(&model, &x).powf_scalar(2.0).mean();
        let grads = loss.backward();
        drop(grads);
    });

    println!(
        "mmdit bench ({}, {iters} iterations, {} parameters)",
        backend::NAME,
        model.num_params()
    );
    println!("forward           median {:8.1} ms   mean {:8.1} ms", ms(fwd_median), ms(fwd_mean));
    println!("forward+backward  median {:8.1} ms   mean {:8.1} ms", ms(bwd_median), ms(bwd_mean));
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
