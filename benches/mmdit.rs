//! MMDiT forward and LoRA forward+backward time on the selected backend: the first call (JIT
//! compilation and autotuning on the GPU backends) and the median of later calls.
//!
//! `cargo bench --bench mmdit -- [SIZE] [BATCH] [PRECISION]` with `SIZE`:
//! - `preset` (default): 4 blocks, 4 heads x 64 (D = 256), dual attention on blocks 0-1,
//!   qk-norm, latent 16x32x32 (256 image tokens), 64 text tokens of width 256, pooled 128,
//!   batch 2;
//! - `sd35-medium`: SD3.5-medium's transformer (24 blocks, D = 1536, MMDiT-X) at 512 px
//!   (latent 16x64x64, 1024 image tokens), 333 text tokens (77 CLIP + 256 T5), batch 2.
//!
//! `PRECISION`: `f32` (default) or `bf16` base weights and activations (adapters stay f32, as in
//! training; `bf16` is an error where the backend has none).
//!
//! Random weights; LoRA rank 32 on the default targets, gradients of the adapters only.
//! `BENCH_ITERS` sets the timed iterations (default 10). `benches/torch_mmdit.py` measures
//! diffusers on the same shapes.

use burn::module::AutodiffModule;
use burn::prelude::*;
use burn::tensor::Distribution;
use tpgrpo::backend::{self, TrainBackend};
use tpgrpo::model::cast_params;
use tpgrpo::model::{Adaptable, LoraConfig, MMDiT};

mod common;
use common::{args, size, time_and_report, Size};

struct Inputs<B: burn::prelude::Backend> {
    latent: Tensor<B, 4>,
    timestep: Tensor<B, 1>,
    text: Tensor<B, 3>,
    pooled: Tensor<B, 2>,
}

fn inputs<B: burn::prelude::Backend>(s: &Size, batch: usize, device: &B::Device) -> Inputs<B> {
    let n = Distribution::Normal(0.0, 1.0);
    let [c, h, w] = s.latent;
    Inputs {
        latent: Tensor::random([batch, c, h, w], n, device),
        timestep: Tensor::full([batch], 464.88, device),
        text: Tensor::random([batch, s.text[0], s.text[1]], n, device),
        pooled: Tensor::random([batch, s.pooled], n, device),
    }
}

fn forward<B: burn::prelude::Backend>(model: &MMDiT<B>, x: &Inputs<B>) -> Tensor<B, 4> {
    model
        .forward(x.latent.clone(), x.timestep.clone(), x.text.clone(), x.pooled.clone())
        .expect("valid inputs")
}

fn main() {
    let (name, batch, precision) = args("BATCH", 2);
    let name = name.as_str();
    let iters: usize = std::env::var("BENCH_ITERS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let device = backend::init().expect("kernel cache settings");
    let s = size(name);

    let dtype = precision.resolve::<backend::Backend>(&device).expect("precision");
    let model: MMDiT<TrainBackend> = s.config.init(&device).expect("valid config");
    let model = cast_params(model, dtype);
    let lora = model.clone().with_lora(&LoraConfig::new().with_rank(32)).expect("valid LoRA");
    let params = model.num_params();
    let frozen = model.valid();
    let x = inputs(&s, batch, &device);
    let x_lora = inputs::<TrainBackend>(&s, batch, &device);
    time_and_report(
        "mmdit",
        name,
        batch,
        (dtype, params, iters),
        &device,
        || drop(forward(&frozen, &x).into_data()),
        || drop(forward(&lora, &x_lora).powf_scalar(2.0).mean().backward()),
    );
}
