//! A TP-GRPO epoch at a benchmark size with random weights: seconds per phase (rollouts,
//! ODE completions, decoding and reward, update) for the first epoch (JIT compilation and
//! autotuning on the GPU backends) and a second one.
//!
//! `cargo bench --bench epoch -- [SIZE] [SAMPLES] [PRECISION]`: `SIZE` as in
//! `benches/mmdit.rs` (`preset`, default, or `sd35-medium`); `SAMPLES` per epoch (default 8:
//! 2 prompts x 4), rolled out and trained in batches of 8; `PRECISION` `f32` (default) or
//! `bf16`. The reference TP-GRPO sampler (10 steps, CFG 4.5, 9 trained steps), one optimizer
//! step, LoRA rank 32. The text conditioning is random (the encoders run once per prompt and
//! are left out); the VAE decoder is SD3's at `sd35-medium` (a narrow one at `preset`) with
//! random weights; the reward is the mean brightness of each image.

use burn::prelude::*;
use burn::tensor::Distribution;
use tpgrpo::backend::{self, TrainBackend};
use tpgrpo::image::Image;
use tpgrpo::model::dtype_name;
use tpgrpo::model::{AutoencoderKL, LoraConfig, MMDiT, VaeConfig};
use tpgrpo::prompts::Prompt;
use tpgrpo::reward::Reward;
use tpgrpo::sampler::{Conditioning, TextToImage};
use tpgrpo::train::{Task, TrainConfig, Trainer};

mod common;
use common::{args, size, Size};

type Inner = backend::Backend;

/// Random conditioning for prompts `p0`, `p1`, ... (row `i` for `pi`) and a random-weight VAE.
struct RandomPipeline {
    text: Tensor<Inner, 3>,
    pooled: Tensor<Inner, 2>,
    vae: AutoencoderKL<Inner>,
    latent: [usize; 3],
}

impl TextToImage<Inner> for RandomPipeline {
    fn encode(&self, texts: &[&str]) -> tpgrpo::Result<Conditioning<Inner>> {
        let rows: Vec<usize> = texts
            .iter()
            .map(|t| t.strip_prefix('p').and_then(|i| i.parse::<usize>().ok()).map_or(0, |i| i + 1))
            .collect();
        let rows = Tensor::from_data(
            TensorData::new(rows.iter().map(|&r| r as i64).collect(), [rows.len()]),
            &self.text.device(),
        );
        Ok(Conditioning {
            text: self.text.clone().select(0, rows.clone()),
            pooled: self.pooled.clone().select(0, rows),
        })
    }

    fn decode(&self, latents: Tensor<Inner, 4>) -> tpgrpo::Result<Vec<Image>> {
        Image::from_tensor(self.vae.decode(latents)?)
    }

    fn latent_shape(&self) -> [usize; 3] {
        self.latent
    }
}

/// The mean brightness of each image.
struct Brightness;

impl Reward for Brightness {
    fn name(&self) -> &str {
        "brightness"
    }

    fn score(&self, images: &[Image], _prompts: &[Prompt]) -> tpgrpo::Result<Vec<f64>> {
        Ok(images
            .iter()
            .map(|i| i.pixels.iter().map(|&p| p as f64).sum::<f64>() / i.pixels.len() as f64)
            .collect())
    }
}

fn main() {
    let (name, samples, precision) = args("SAMPLES", 8);
    let name = name.as_str();
    let device = backend::init().expect("kernel cache settings");
    let Size { config, latent, text, pooled } = size(name);
    let group = 4;
    let prompts = samples.div_ceil(group);
    let n = Distribution::Normal(0.0, 1.0);
    let vae_channels = if name == "sd35-medium" { vec![128, 256, 512, 512] } else { vec![32; 4] };
    let pipeline = RandomPipeline {
        text: Tensor::random([prompts + 1, text[0], text[1]], n, &device),
        pooled: Tensor::random([prompts + 1, pooled], n, &device),
        vae: VaeConfig::new(vae_channels).init(&device).expect("valid VAE"),
        latent,
    };
    let train = TrainConfig::new()
        .with_epochs(2)
        .with_prompts_per_epoch(prompts)
        .with_group_size(group)
        .with_rollout_batch(8)
        .with_train_batch(8)
        .with_optimizer_steps_per_epoch(1)
        .with_eval_every(0)
        .with_precision(precision)
        .with_lora(LoraConfig::new().with_rank(32));
    let task = Task {
        pipeline,
        reward: Box::new(Brightness),
        train_prompts: (0..prompts)
            .map(|i| Prompt { text: format!("p{i}"), metadata: serde_json::Value::Null })
            .collect(),
        eval_prompts: Vec::new(),
        report: None,
    };
    let base: MMDiT<TrainBackend> = config.init(&device).expect("valid config");
    let params = base.num_params();
    let out = std::env::temp_dir().join("tpgrpo-epoch-bench");
    let mut trainer = Trainer::new(train, base, task, out).expect("valid settings");
    println!(
        "epoch bench: {name}, {} samples ({prompts} prompts x {group}), {} backend, {}, {params} \
         parameters",
        prompts * group,
        backend::NAME,
        dtype_name(precision.resolve::<Inner>(&device).expect("precision")),
    );
    println!("epoch   rollouts   completions   decode+reward   update     total   (seconds)");
    for _ in 0..2 {
        let m = trainer.run_epoch(&mut tpgrpo::train::Silent).expect("epoch");
        let p = m.phase_seconds;
        println!(
            "{:5} {:10.2} {:13.2} {:15.2} {:8.2} {:9.2}   NFE per sample {:.0}, {} samples trained",
            m.epoch,
            p.rollout,
            p.completions,
            p.reward,
            p.update,
            m.seconds,
            m.nfe_per_sample,
            m.credit.samples_used,
        );
    }
}
