//! FLUX transformer forward and LoRA forward+backward time on the selected backend: the first
//! call (JIT compilation and autotuning on the GPU backends) and the median of later calls.
//!
//! `cargo bench --bench flux -- [SIZE] [BATCH] [PRECISION]` with `SIZE`:
//! - `preset` (default): 2 double + 2 single blocks, 4 heads x 64 (D = 256, rotary axes
//!   8 + 28 + 28), guidance embedded, latent 16x32x32 (256 packed tokens), 64 text tokens of
//!   width 256, pooled 128;
//! - `flux1-dev`: FLUX.1-dev's transformer (19 + 38 blocks, D = 3072) at 512 px (latent
//!   16x64x64, 1024 packed tokens) with 128 T5 tokens (flow_grpo's training length);
//! - `flux1-dev-blocks`: the same widths and inputs with 2 + 4 blocks, for a device whose memory
//!   does not hold the whole model.
//!
//! `PRECISION`: `f32` (default) or `bf16` base weights and activations (adapters stay f32).
//! Random weights; LoRA rank 64 / alpha 128 on the FLUX targets (`model::flux_targets`),
//! gradients of the adapters only. `BENCH_ITERS` sets the timed iterations (default 10).

use burn::module::AutodiffModule;
use burn::prelude::*;
use burn::tensor::Distribution;
use tpgrpo::backend::{self, TrainBackend};
use tpgrpo::model::{cast_params, flux_targets, pack_latents};
use tpgrpo::model::{Adaptable, Flux, FluxConfig, LoraConfig, Rope};

mod common;
use common::{args, time_and_report};

/// A FLUX benchmark size: the transformer, one latent `[C, H, W]` and the text tokens.
struct Size {
    config: FluxConfig,
    latent: [usize; 3],
    text_tokens: usize,
}

fn size(name: &str) -> Size {
    let dev = FluxConfig::flux1_dev();
    match name {
        "flux1-dev" => Size { config: dev, latent: [16, 64, 64], text_tokens: 128 },
        "flux1-dev-blocks" => Size {
            config: dev.with_num_layers(2).with_num_single_layers(4),
            latent: [16, 64, 64],
            text_tokens: 128,
        },
        "preset" => Size {
            config: FluxConfig::new()
                .with_num_layers(2)
                .with_num_single_layers(2)
                .with_num_attention_heads(4)
                .with_attention_head_dim(64)
                .with_axes_dims_rope([8, 28, 28])
                .with_joint_attention_dim(256)
                .with_pooled_projection_dim(128)
                .with_guidance_embeds(true),
            latent: [16, 32, 32],
            text_tokens: 64,
        },
        other => panic!("unknown size {other:?} (known: preset, flux1-dev, flux1-dev-blocks)"),
    }
}

struct Inputs<B: burn::prelude::Backend> {
    tokens: Tensor<B, 3>,
    sigma: Tensor<B, 1>,
    guidance: Tensor<B, 1>,
    text: Tensor<B, 3>,
    pooled: Tensor<B, 2>,
    rope: Rope<B>,
}

fn inputs<B: burn::prelude::Backend>(
    model: &Flux<B>,
    s: &Size,
    batch: usize,
    device: &B::Device,
) -> Inputs<B> {
    let n = Distribution::Normal(0.0, 1.0);
    let [c, h, w] = s.latent;
    let c_cfg = &s.config;
    Inputs {
        tokens: pack_latents(Tensor::random([batch, c, h, w], n, device)).expect("even latent"),
        sigma: Tensor::full([batch], 0.65249, device),
        guidance: Tensor::full([batch], 3.5, device),
        text: Tensor::random([batch, s.text_tokens, c_cfg.joint_attention_dim], n, device),
        pooled: Tensor::random([batch, c_cfg.pooled_projection_dim], n, device),
        rope: model.rope(s.text_tokens, h / 2, w / 2, device).expect("valid rope"),
    }
}

fn forward<B: burn::prelude::Backend>(model: &Flux<B>, x: &Inputs<B>) -> Tensor<B, 3> {
    model
        .forward(
            x.tokens.clone(),
            x.sigma.clone(),
            Some(x.guidance.clone()),
            x.text.clone(),
            x.pooled.clone(),
            &x.rope,
        )
        .expect("valid inputs")
}

fn main() {
    let (name, batch, precision) = args("BATCH", 2);
    let name = name.as_str();
    let iters: usize = std::env::var("BENCH_ITERS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let device = backend::init().expect("kernel cache settings");
    let s = size(name);

    let dtype = precision.resolve::<backend::Backend>(&device).expect("precision");
    let model: Flux<TrainBackend> = s.config.init(&device).expect("valid config");
    let model = cast_params(model, dtype);
    let lora_config =
        LoraConfig::new().with_rank(64).with_alpha(128.0).with_target_modules(flux_targets());
    let lora = model.clone().with_lora(&lora_config).expect("valid LoRA");
    let params = model.num_params();
    let frozen = model.valid();
    let x = inputs(&frozen, &s, batch, &device);
    let x_lora = inputs::<TrainBackend>(&lora, &s, batch, &device);
    time_and_report(
        "flux",
        name,
        batch,
        (dtype, params, iters),
        &device,
        || drop(forward(&frozen, &x).into_data()),
        || drop(forward(&lora, &x_lora).powf_scalar(2.0).mean().backward()),
    );
}
