//! Cost of one 10-step CFG rollout (CPS, alpha 0.7, 9 trained steps) and of its TP-GRPO ODE
//! completions, for the benchmark preset of `benches/mmdit.rs` at batch 8 (64 text tokens).
//!
//! `cargo bench --bench sampler` (`BENCH_ITERS` timed repetitions, default 1).

use std::time::Instant;

use burn::prelude::*;
use burn::tensor::Distribution;
use tpgrpo::backend::{self, Backend};
use tpgrpo::model::MMDiT;
use tpgrpo::sampler::{ode_completions, rollout, Conditioning, RolloutConfig};

mod common;

fn main() {
    let iters: usize = std::env::var("BENCH_ITERS").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let device = backend::init().expect("kernel cache settings");
    let model: MMDiT<Backend> = common::bench_config().init(&device).expect("valid config");
    let batch = 8;
    let n = Distribution::Normal(0.0, 1.0);
    let cond = Conditioning {
        text: Tensor::random([batch, 64, 256], n, &device),
        pooled: Tensor::random([batch, 128], n, &device),
    };
    let uncond = Conditioning {
        text: Tensor::random([batch, 64, 256], n, &device),
        pooled: Tensor::random([batch, 128], n, &device),
    };
    let cfg = RolloutConfig::new();
    let seeds: Vec<u64> = (0..batch as u64).collect();

    println!(
        "sampler bench ({}, batch {batch}, N = {}, {} trained steps, CFG {})",
        backend::NAME,
        cfg.num_steps,
        cfg.window_size,
        cfg.guidance
    );
    for _ in 0..iters {
        let t = Instant::now();
        let r =
            rollout(&model, &cfg, &seeds, [16, 32, 32], &cond, &uncond, &device).expect("rollout");
        let _ = r.latents.last().expect("final latent").clone().into_data();
        let rollout_s = t.elapsed().as_secs_f64();

        let t = Instant::now();
        let starts: Vec<_> = r.window.clone().map(|s| (s, r.latents[s].clone())).collect();
        let (done, nfe) =
            ode_completions(&model, &r.schedule, &starts, &cond, &uncond, cfg.guidance)
                .expect("completions");
        let _ = done.last().expect("a completion").clone().into_data();
        let completions_s = t.elapsed().as_secs_f64();
        println!(
            "rollout      {rollout_s:8.2} s   NFE per sample {:3}   {:6.3} s per evaluation",
            r.nfe,
            rollout_s / r.nfe as f64
        );
        println!(
            "completions  {completions_s:8.2} s   NFE per sample {nfe:3}   {:6.3} s per evaluation   ({} passes)",
            completions_s / nfe as f64,
            r.schedule.num_steps() - r.window.start
        );
        println!(
            "total        {:8.2} s   NFE per sample {:3}",
            rollout_s + completions_s,
            r.nfe + nfe
        );
    }
}
