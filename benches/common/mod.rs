//! The benchmark sizes shared by the benches.

// Each bench uses a part of this module.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use tpgrpo::model::{MMDiTConfig, Precision};

/// 4 blocks, 4 heads x 64 (D = 256), dual attention on blocks 0-1, qk-norm, text width 256,
/// pooled 128, position grid 32 (latents 16x32x32 give 256 image tokens).
pub fn bench_config() -> MMDiTConfig {
    MMDiTConfig::new()
        .with_sample_size(32)
        .with_num_layers(4)
        .with_num_attention_heads(4)
        .with_attention_head_dim(64)
        .with_joint_attention_dim(256)
        .with_caption_projection_dim(256)
        .with_pooled_projection_dim(128)
        .with_pos_embed_max_size(32)
        .with_dual_attention_layers(vec![0, 1])
        .with_qk_norm(Some("rms_norm".into()))
}

/// A benchmark size: an MMDiT configuration and its input shapes.
pub struct Size {
    /// The transformer.
    pub config: MMDiTConfig,
    /// One latent, `[C, H, W]`.
    pub latent: [usize; 3],
    /// Text tokens and their width.
    pub text: [usize; 2],
    /// Pooled text width.
    pub pooled: usize,
}

/// `preset` ([`bench_config`], 16x32x32 latents, 64 text tokens of width 256, pooled 128) or
/// `sd35-medium` (SD3.5-medium's transformer at 512 px: 16x64x64 latents, 333 text tokens of
/// width 4096, pooled 2048).
pub fn size(name: &str) -> Size {
    match name {
        "sd35-medium" => Size {
            config: MMDiTConfig::sd3_5_medium(),
            latent: [16, 64, 64],
            text: [333, 4096],
            pooled: 2048,
        },
        "preset" => {
            Size { config: bench_config(), latent: [16, 32, 32], text: [64, 256], pooled: 128 }
        }
        other => panic!("unknown size {other:?} (known: preset, sd35-medium)"),
    }
}

/// The arguments `[SIZE] [COUNT] [PRECISION]` after cargo's own flags: the size name (default
/// `preset`), a count named `what` (default `default`) and the precision (default f32).
pub fn args(what: &str, default: usize) -> (String, usize, Precision) {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let name = args.first().cloned().unwrap_or_else(|| "preset".into());
    let count = args
        .get(1)
        .map_or(default, |c| c.parse().unwrap_or_else(|_| panic!("{what} is a number, not {c:?}")));
    let precision = args.get(2).map_or(Precision::F32, |p| {
        p.parse().unwrap_or_else(|_| panic!("PRECISION is f32 or bf16, not {p:?}"))
    });
    (name, count, precision)
}

/// The first call's time, then the median of `iters` more.
pub fn time(iters: usize, mut f: impl FnMut()) -> (Duration, Duration) {
    let mut once = || {
        let t = Instant::now();
        f();
        t.elapsed()
    };
    let first = once();
    let mut times: Vec<Duration> = (0..iters).map(|_| once()).collect();
    times.sort();
    (first, times[iters / 2])
}

/// Times the frozen model's forward (`forward`) and the adapted model's forward + backward
/// (`step`, synced with `device` before it stops the clock), then prints both as the
/// `bench` bench of size `name`: the first call's time and the median of `iters` more.
pub fn time_and_report(
    bench: &str,
    name: &str,
    batch: usize,
    (dtype, params, iters): (burn::tensor::FloatDType, usize, usize),
    device: &tpgrpo::backend::Device,
    mut forward: impl FnMut(),
    mut step: impl FnMut(),
) {
    let (fwd_first, fwd) = time(iters, &mut forward);
    let (bwd_first, bwd) = time(iters, || {
        step();
        // GPU backends queue kernels: wait for the backward to finish, not only to be queued.
        <tpgrpo::backend::Backend as burn::prelude::Backend>::sync(device).expect("device sync");
    });
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{bench} bench: {name}, batch {batch}, {} backend, {}, {iters} iterations, {params} \
         parameters",
        tpgrpo::backend::NAME,
        tpgrpo::model::dtype_name(dtype)
    );
    println!("forward                first {:9.1} ms   median {:8.1} ms", ms(fwd_first), ms(fwd));
    println!("LoRA forward+backward  first {:9.1} ms   median {:8.1} ms", ms(bwd_first), ms(bwd));
}
