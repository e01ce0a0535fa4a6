//! The embedded default task: a tiny MMDiT (shipped in `models/toy/`) that draws coloured
//! shapes on 32x32 images from short prompts, its text encoder, renderer and reward.
//!
//! The "latent" is the image itself scaled to `[-1, 1]` (no VAE): `z = 2x - 1`, `x = z/2 + 1/2`.

pub(crate) mod alignment;
pub(crate) mod draw;
pub(crate) mod prompt;
pub(crate) mod scorer;
pub(crate) mod text;

use std::path::{Path, PathBuf};

use burn::prelude::*;

use crate::error::{Error, Result};
use crate::image::Image;
use crate::model::{MMDiT, MMDiTConfig};
use crate::sampler::Conditioning;
use crate::weights::{apply_plan, export_params, save_safetensors, Source, WeightFiles};

pub use alignment::ToyAlignment;
pub use draw::{render, IMAGE_SIZE};
pub use prompt::{prompts, Scene, Split};
pub use scorer::{ToyChecks, ToyScorer};
pub use text::{ToyTextEncoder, ToyTextEncoderConfig};

/// Text encoder weight file inside the toy model folder.
pub(crate) const TEXT_ENCODER_FILE: &str = "text_encoder.safetensors";

/// The shipped toy model folder: `models/toy` of this crate's source tree, or, for a binary
/// copied away from it (a GPU machine), `models/toy` under the working folder when the
/// source tree is not there. Loading names the first path when neither exists.
pub fn default_dir() -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("models").join("toy");
    let local = Path::new("models").join("toy");
    if !source.exists() && local.exists() {
        return local;
    }
    source
}

/// The toy transformer's configuration: SD3.5-style blocks (qk RMSNorm), width 64, 4 blocks,
/// 4x4 patches of RGB (8x8 tokens), 32-wide text features.
pub fn toy_config() -> MMDiTConfig {
    MMDiTConfig::new()
        .with_sample_size(IMAGE_SIZE)
        .with_patch_size(4)
        .with_in_channels(3)
        .with_out_channels(3)
        .with_num_layers(4)
        .with_attention_head_dim(32)
        .with_num_attention_heads(2)
        .with_joint_attention_dim(32)
        .with_caption_projection_dim(64)
        .with_pooled_projection_dim(32)
        .with_pos_embed_max_size(IMAGE_SIZE / 4)
        .with_dual_attention_layers(vec![])
        .with_qk_norm(Some("rms_norm".to_string()))
}

/// The toy model: transformer (`transformer/`, diffusers layout) and text encoder.
#[derive(Module, Debug)]
pub struct ToyModel<B: Backend> {
    /// The denoiser.
    pub transformer: MMDiT<B>,
    /// The prompt encoder.
    pub text_encoder: ToyTextEncoder<B>,
}

impl<B: Backend> ToyModel<B> {
    /// A randomly initialised toy model (the transformer with adaLN-Zero, for pre-training).
    pub fn init(device: &B::Device) -> Result<Self> {
        let config = toy_config();
        Ok(ToyModel {
            text_encoder: ToyTextEncoderConfig::new(config.joint_attention_dim).init(device),
            transformer: config.init(device)?.zero_init_modulation(device),
        })
    }

    /// Loads `dir/transformer/` and `dir/text_encoder.safetensors`.
    pub fn load(dir: impl AsRef<Path>, device: &B::Device) -> Result<Self> {
        let dir = dir.as_ref();
        let transformer = MMDiT::load_diffusers_dir(&dir.join("transformer"), device)?;
        if transformer.config.pooled_projection_dim != transformer.config.joint_attention_dim {
            return Err(Error::config(
                "pooled_projection_dim",
                "the toy encoder needs pooled_projection_dim == joint_attention_dim",
            ));
        }
        let path = dir.join(TEXT_ENCODER_FILE);
        let mut text_encoder =
            ToyTextEncoderConfig::new(transformer.config.joint_attention_dim).init(device);
        let files = WeightFiles::open(&path)?;
        apply_plan(&mut text_encoder, &files, &path, |p: &str| Source::key(p), |_| true)?;
        Ok(ToyModel { transformer, text_encoder })
    }

    /// Writes `dir/transformer/` (diffusers) and `dir/text_encoder.safetensors`, atomically.
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        let transformer = dir.join("transformer");
        std::fs::create_dir_all(&transformer).map_err(|e| Error::io(&transformer, e))?;
        self.transformer.save_diffusers(&transformer)?;
        save_safetensors(&dir.join(TEXT_ENCODER_FILE), &export_params(&self.text_encoder))
    }

    /// Prompt conditioning of `texts` (the empty string is the unconditional prompt).
    pub fn encode(&self, texts: &[&str]) -> Result<Conditioning<B>> {
        self.text_encoder.encode(texts)
    }
}

/// Latents `[B, 3, H, W]` (`2x - 1`) of images.
pub fn images_to_latents<B: Backend>(images: &[Image], device: &B::Device) -> Tensor<B, 4> {
    let (h, w) = (images[0].height, images[0].width);
    let values: Vec<f32> =
        images.iter().flat_map(|im| im.pixels.iter().map(|v| 2.0 * v - 1.0)).collect();
    Tensor::<B, 4>::from_data(TensorData::new(values, [images.len(), h, w, 3]), device)
        .permute([0, 3, 1, 2])
}

/// Images of latents: `(z/2 + 1/2)` clamped to `[0, 1]`.
pub fn latents_to_images<B: Backend>(latents: Tensor<B, 4>) -> Result<Vec<Image>> {
    Image::from_tensor(latents * 0.5 + 0.5)
}

/// The toy pipeline: the toy text encoder and the identity "VAE".
#[derive(Debug, Clone)]
pub struct ToyPipeline<B: Backend> {
    /// The prompt encoder.
    pub text_encoder: ToyTextEncoder<B>,
}

impl<B: Backend> crate::sampler::TextToImage<B> for ToyPipeline<B> {
    fn encode(&self, texts: &[&str]) -> Result<Conditioning<B>> {
        self.text_encoder.encode(texts)
    }

    fn decode(&self, latents: Tensor<B, 4>) -> Result<Vec<Image>> {
        latents_to_images(latents)
    }

    fn latent_shape(&self) -> [usize; 3] {
        [3, IMAGE_SIZE, IMAGE_SIZE]
    }
}

/// Training settings of the embedded task: the reference objective (TP-GRPO, clip range
/// 1e-5) without its KL penalty (beta 0: the held-out reward rose further in every seed,
/// docs/results.md) and CPS sampler (alpha 0.7, CFG 4.5), scaled to finish in under 10 minutes
/// on a 2-core CPU: 6 sampling steps (SDE window 0..5, 26 evaluations per TP-GRPO sample
/// instead of 64), 8 prompts x 8 samples and one optimizer step per epoch, 20 epochs, LoRA rank
/// 8, learning rate 1e-3, EMA updated every step, evaluation every 10 epochs on all 73 held-out
/// prompts with two seeds each.
pub fn train_config() -> crate::train::TrainConfig {
    use crate::grpo::ObjectiveConfig;
    use crate::model::LoraConfig;
    use crate::sampler::RolloutConfig;
    use crate::train::{AdamWConfig, EmaConfig, TrainConfig};
    TrainConfig::new()
        .with_epochs(20)
        .with_prompts_per_epoch(8)
        .with_group_size(8)
        .with_rollout_batch(16)
        .with_train_batch(16)
        .with_optimizer_steps_per_epoch(1)
        .with_eval_every(10)
        .with_eval_steps(40)
        .with_eval_images_per_prompt(2)
        .with_save_every(5)
        .with_objective(ObjectiveConfig::new().with_kl_beta(0.0))
        .with_rollout(RolloutConfig::new().with_num_steps(6).with_window_size(5))
        .with_lora(LoraConfig::new().with_rank(8).with_alpha(16.0))
        .with_optimizer(AdamWConfig::new().with_lr(1e-3))
        .with_ema(EmaConfig::new().with_every(1))
}

/// The toy task's reward named `name`: `toy-alignment` ([`ToyAlignment`], the default) or
/// `toy-geneval` ([`ToyScorer`]).
pub fn reward(name: &str) -> Result<Box<dyn crate::reward::Reward>> {
    match name {
        "toy-alignment" => Ok(Box::new(ToyAlignment)),
        "toy-geneval" => Ok(Box::new(ToyScorer)),
        other => Err(Error::config(
            "reward",
            format!("unknown reward {other:?} (known: toy-alignment, toy-geneval)"),
        )),
    }
}

/// A trainer for the shipped toy model (`models/toy/`) with `reward` on the toy prompts
/// (training split; held-out split for evaluation, with the [`ToyChecks`] report), writing to
/// `out_dir`.
pub fn trainer<B: burn::tensor::backend::AutodiffBackend>(
    config: crate::train::TrainConfig,
    reward: Box<dyn crate::reward::Reward>,
    out_dir: impl AsRef<Path>,
    device: &B::Device,
) -> Result<crate::train::Trainer<B, ToyPipeline<B::InnerBackend>>> {
    use burn::module::AutodiffModule;
    let model: ToyModel<B> = ToyModel::load(default_dir(), device)?;
    let pipeline = ToyPipeline { text_encoder: model.text_encoder.valid() };
    crate::train::Trainer::new(
        config,
        model.transformer,
        crate::train::Task {
            pipeline,
            reward,
            train_prompts: prompts(Split::Train),
            eval_prompts: prompts(Split::Eval),
            report: Some(Box::new(ToyChecks)),
        },
        out_dir,
    )
}

#[cfg(test)]
mod tests;
