//! The FLUX.1 text-to-image pipeline over a diffusers folder: CLIP-L's pooled output and T5's
//! features as `FluxPipeline.encode_prompt` assembles them, the FLUX transformer with embedded
//! guidance and the dynamically shifted Euler schedule, and the VAE decoder.
//!
//! Folder layout: `model_index.json`, `transformer/`, `vae/`, `text_encoder/` (CLIPTextModel),
//! `text_encoder_2/` (T5), `tokenizer{,_2}/`, `scheduler/scheduler_config.json`.

use std::path::Path;

use burn::prelude::*;

use super::config::SampleConfig;
use super::{check_max_sequence_length, CLIP_LENGTH};
use crate::error::{Error, Result};
use crate::image::Image;
use crate::model::{AutoencoderKL, ClipTextModel, Flux, T5EncoderModel};
use crate::sampler::TextToImage;
use crate::sampler::{ode_sample, seeded_noise, Conditioning, DynamicShift, FlowSchedule};
use crate::tokenizer::TextTokenizer;

/// diffusers' `FluxPipeline.default_sample_size`: the default image is 128 latent pixels a side.
const DEFAULT_LATENT_SIZE: usize = 128;

/// The two text encoders of a FLUX pipeline and their tokenizers.
#[derive(Debug)]
pub struct FluxTextEncoders<B: Backend> {
    /// CLIP-L without projection (`text_encoder/`): the pooled vector.
    pub clip: ClipTextModel<B>,
    /// T5 (`text_encoder_2/`): the per-token features.
    pub t5: T5EncoderModel<B>,
    /// `tokenizer/`, 77 tokens.
    pub tokenizer: TextTokenizer,
    /// `tokenizer_2/`, `max_sequence_length` tokens.
    pub tokenizer_2: TextTokenizer,
}

impl<B: Backend> FluxTextEncoders<B> {
    /// Loads the encoders and tokenizers of a diffusers FLUX folder; T5 sequences get
    /// `max_sequence_length` tokens (512 at most; flow_grpo trains with 128).
    pub fn load(
        dir: impl AsRef<Path>,
        max_sequence_length: usize,
        device: &B::Device,
    ) -> Result<Self> {
        let dir = dir.as_ref();
        check_max_sequence_length(max_sequence_length)?;
        Ok(FluxTextEncoders {
            clip: ClipTextModel::load(dir.join("text_encoder"), device)?,
            t5: T5EncoderModel::load(dir.join("text_encoder_2"), device)?,
            tokenizer: TextTokenizer::open(dir.join("tokenizer"), CLIP_LENGTH)?,
            tokenizer_2: TextTokenizer::open(dir.join("tokenizer_2"), max_sequence_length)?,
        })
    }

    /// FLUX's prompt conditioning: `text` = T5's last hidden state `[B, L, D_t5]` (padded to
    /// `max_sequence_length`, no attention mask), `pooled` = CLIP's final-normed feature at the
    /// end-of-text token `[B, D_clip]` (no projection).
    pub fn encode(&self, texts: &[&str], device: &B::Device) -> Result<Conditioning<B>> {
        let pooled = self.clip.forward(&self.tokenizer.encode(texts)?, device)?.pooled;
        let text = self.t5.forward(&self.tokenizer_2.encode(texts)?, device)?;
        Ok(Conditioning { text, pooled })
    }
}

/// What sampling and training need besides the transformer: prompt conditioning, the VAE and
/// the latent size.
#[derive(Debug)]
pub struct FluxConditioner<B: Backend> {
    /// The text encoders.
    pub encoders: FluxTextEncoders<B>,
    /// The VAE (16 latent channels; FLUX's scaling 0.3611 and shift 0.1159 from its config).
    pub vae: AutoencoderKL<B>,
    /// `[C, H/f, W/f]` of one (unpacked) latent.
    pub latent: [usize; 3],
    device: B::Device,
}

impl<B: Backend> FluxConditioner<B> {
    /// Loads the text encoders, tokenizers and VAE of a diffusers FLUX folder for (unpacked)
    /// latents of shape `latent` (`[C, H/f, W/f]`, `H/f` and `W/f` even).
    pub fn load(
        dir: impl AsRef<Path>,
        max_sequence_length: usize,
        latent: [usize; 3],
        device: &B::Device,
    ) -> Result<Self> {
        let dir = dir.as_ref();
        let [_, h, w] = latent;
        if !h.is_multiple_of(2) || !w.is_multiple_of(2) || h == 0 || w == 0 {
            return Err(Error::shape(
                "latent",
                "[C, H, W] with H and W positive and even",
                &latent,
            ));
        }
        Ok(FluxConditioner {
            encoders: FluxTextEncoders::load(dir, max_sequence_length, device)?,
            vae: AutoencoderKL::load(dir.join("vae"), device)?,
            latent,
            device: device.clone(),
        })
    }
}

impl<B: Backend> TextToImage<B> for FluxConditioner<B> {
    fn encode(&self, texts: &[&str]) -> Result<Conditioning<B>> {
        self.encoders.encode(texts, &self.device)
    }

    fn decode(&self, latents: Tensor<B, 4>) -> Result<Vec<Image>> {
        Image::from_tensor(self.vae.decode(latents)?)
    }

    fn latent_shape(&self) -> [usize; 3] {
        self.latent
    }
}

/// A loaded FLUX.1 pipeline.
#[derive(Debug)]
pub struct FluxPipeline<B: Backend> {
    /// The denoiser.
    pub transformer: Flux<B>,
    /// Encoders and VAE.
    pub conditioner: FluxConditioner<B>,
    /// The schedule's dynamic shift (`scheduler/scheduler_config.json`).
    pub shift: DynamicShift,
}

/// The latent `[h, w]` of a `height x width` image behind a VAE that downsamples by `f`: both
/// sides positive multiples of `2 f` (latents are packed 2x2 into tokens).
pub fn flux_latent_size(f: usize, [height, width]: [usize; 2]) -> Result<[usize; 2]> {
    let unit = 2 * f;
    if height == 0 || width == 0 || !height.is_multiple_of(unit) || !width.is_multiple_of(unit) {
        return Err(Error::config(
            "height/width",
            format!("{height}x{width} is not a positive multiple of {unit} (VAE x 2x2 packing)"),
        ));
    }
    Ok([height / f, width / f])
}

impl<B: Backend> FluxPipeline<B> {
    /// Opens a diffusers FLUX folder; T5 sequences get `max_sequence_length` tokens. The image
    /// size starts at diffusers' default, 128 latent pixels a side (1024 px for FLUX.1).
    pub fn load(
        dir: impl AsRef<Path>,
        max_sequence_length: usize,
        device: &B::Device,
    ) -> Result<Self> {
        let dir = dir.as_ref();
        check_max_sequence_length(max_sequence_length)?;
        if !dir.join("model_index.json").is_file() {
            return Err(Error::format(dir, "not a diffusers pipeline folder: no model_index.json"));
        }
        let transformer = Flux::load(dir.join("transformer"), device)?;
        let packed = transformer.config.in_channels;
        if !packed.is_multiple_of(4) {
            return Err(Error::format(
                dir.join("transformer/config.json"),
                format!("`in_channels` {packed} is not 4 x the latent channels (2x2 packing)"),
            ));
        }
        let latent = [packed / 4, DEFAULT_LATENT_SIZE, DEFAULT_LATENT_SIZE];
        Ok(FluxPipeline {
            conditioner: FluxConditioner::load(dir, max_sequence_length, latent, device)?,
            transformer,
            shift: DynamicShift::from_scheduler_config(
                dir.join("scheduler/scheduler_config.json"),
            )?,
        })
    }

    /// `[height, width]` of the images, in pixels.
    pub fn image_size(&self) -> [usize; 2] {
        let f = self.conditioner.vae.downsample_factor();
        [self.conditioner.latent[1] * f, self.conditioner.latent[2] * f]
    }

    /// Sets the image size (training rollouts and default sampling); both sides must be
    /// positive multiples of twice the VAE factor.
    pub fn set_image_size(&mut self, size: [usize; 2]) -> Result<()> {
        let [h, w] = flux_latent_size(self.conditioner.vae.downsample_factor(), size)?;
        self.conditioner.latent[1..].copy_from_slice(&[h, w]);
        Ok(())
    }

    /// The schedule of `steps` Euler steps for latents of `[h, w]` (packed into
    /// `h/2 * w/2` tokens, which set the shift).
    pub fn schedule(&self, steps: usize, [h, w]: [usize; 2]) -> Result<FlowSchedule> {
        FlowSchedule::dynamic(steps, (h / 2) * (w / 2), &self.shift)
    }

    /// Denoises `noise` `[B, C, h, w]` (unpacked) from sigma 1 with `steps` Euler steps, the
    /// guidance scale embedded (one forward pass per step, no unconditional branch: `Flux`
    /// embeds guidance as a `VelocityModel`).
    pub fn denoise(
        &self,
        noise: Tensor<B, 4>,
        cond: &Conditioning<B>,
        steps: usize,
        guidance_scale: f64,
    ) -> Result<Tensor<B, 4>> {
        let [_, _, h, w] = noise.dims();
        let schedule = self.schedule(steps, [h, w])?;
        ode_sample(&self.transformer, &schedule, noise, cond, cond, guidance_scale)
    }

    /// Generates one image per prompt from seeded noise (seed `seeds[i]` for prompt `i`);
    /// `config.guidance_scale` is the embedded guidance (FLUX.1-dev: 3.5). FLUX takes no
    /// negative prompt: a non-empty one is an error.
    pub fn generate(
        &self,
        prompts: &[&str],
        seeds: &[u64],
        config: &SampleConfig,
    ) -> Result<Vec<Image>> {
        if prompts.len() != seeds.len() {
            return Err(Error::config(
                "seeds",
                format!("{} seeds for {} prompts", seeds.len(), prompts.len()),
            ));
        }
        if !config.negative_prompt.is_empty() {
            return Err(Error::config(
                "negative_prompt",
                "FLUX samples with embedded guidance and no negative prompt",
            ));
        }
        let device = &self.conditioner.device;
        let f = self.conditioner.vae.downsample_factor();
        let [h, w] = self.image_size();
        let [lh, lw] =
            flux_latent_size(f, [config.height.unwrap_or(h), config.width.unwrap_or(w)])?;
        let noise = seeded_noise::<B>(seeds, 0, [self.conditioner.latent[0], lh, lw], device);
        let cond = self.conditioner.encode(prompts)?;
        let latents = self.denoise(noise, &cond, config.steps, config.guidance_scale)?;
        self.conditioner.decode(latents)
    }
}
