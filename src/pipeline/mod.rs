//! The SD3 / SD3.5 text-to-image pipeline over a diffusers folder: tokenizers, CLIP-L, CLIP-G
//! and T5 prompt encoding assembled as `StableDiffusion3Pipeline.encode_prompt` does, the
//! MMDiT with the flow-matching Euler sampler and CFG, and the VAE decoder; and the FLUX.1
//! pipeline ([`FluxPipeline`]).
//!
//! Folder layout: `model_index.json`, `transformer/`, `vae/`, `text_encoder{,_2,_3}/`,
//! `tokenizer{,_2,_3}/`, `scheduler/scheduler_config.json` (see docs/pipeline.md).

mod config;
mod flux;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::prelude::*;

use crate::error::{Error, Result};
use crate::image::Image;
use crate::model::{AutoencoderKL, ClipTextModel, MMDiT, T5EncoderModel};
use crate::sampler::{ode_sample, seeded_noise, Conditioning, FlowSchedule, TextToImage};
pub use crate::tokenizer::TextTokenizer;
use crate::weights::{save_safetensors_with_metadata, WeightFiles};
pub use config::SampleConfig;
pub use flux::{flux_latent_size, FluxConditioner, FluxPipeline, FluxTextEncoders};

/// The model family of a diffusers pipeline folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `StableDiffusion3Pipeline` (SD3, SD3.5).
    Sd3,
    /// `FluxPipeline` (FLUX.1).
    Flux,
}

impl Family {
    /// The family of the pipeline folder `dir`, from `model_index.json`'s `_class_name`.
    pub fn of(dir: impl AsRef<Path>) -> Result<Self> {
        let path = dir.as_ref().join("model_index.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::format(&path, format!("invalid JSON: {e}")))?;
        match json.get("_class_name").and_then(|v| v.as_str()) {
            Some("StableDiffusion3Pipeline") => Ok(Family::Sd3),
            Some("FluxPipeline") => Ok(Family::Flux),
            other => Err(Error::format(
                &path,
                format!(
                    "`_class_name` {other:?} is neither StableDiffusion3Pipeline nor FluxPipeline"
                ),
            )),
        }
    }

    /// The name runs and messages use (`sd3`, `flux`).
    pub fn name(self) -> &'static str {
        match self {
            Family::Sd3 => "sd3",
            Family::Flux => "flux",
        }
    }
}

/// CLIP's sequence length.
pub const CLIP_LENGTH: usize = 77;
/// T5 sequence length of the released Flow-GRPO / TP-GRPO SD3 scripts (diffusers' default is 256).
pub const DEFAULT_T5_LENGTH: usize = 128;

/// The three text encoders and their tokenizers.
#[derive(Debug)]
pub struct Sd3TextEncoders<B: Backend> {
    /// CLIP-L (`text_encoder/`).
    pub clip_l: ClipTextModel<B>,
    /// CLIP-G (`text_encoder_2/`).
    pub clip_g: ClipTextModel<B>,
    /// T5 (`text_encoder_3/`).
    pub t5: T5EncoderModel<B>,
    /// `tokenizer/`, 77 tokens.
    pub tokenizer: TextTokenizer,
    /// `tokenizer_2/`, 77 tokens.
    pub tokenizer_2: TextTokenizer,
    /// `tokenizer_3/`, `max_sequence_length` tokens.
    pub tokenizer_3: TextTokenizer,
}

/// The longest T5 prompt diffusers' SD3 pipeline accepts.
pub const MAX_T5_LENGTH: usize = 512;

/// `max_sequence_length` must be 1 to [`MAX_T5_LENGTH`] tokens (diffusers' limit).
fn check_max_sequence_length(n: usize) -> Result<()> {
    if !(1..=MAX_T5_LENGTH).contains(&n) {
        return Err(Error::config(
            "max_sequence_length",
            format!("must be between 1 and {MAX_T5_LENGTH} T5 tokens, got {n}"),
        ));
    }
    Ok(())
}

impl<B: Backend> Sd3TextEncoders<B> {
    /// Loads the encoders and tokenizers of a diffusers SD3 folder; T5 sequences get
    /// `max_sequence_length` tokens.
    pub fn load(
        dir: impl AsRef<Path>,
        max_sequence_length: usize,
        device: &B::Device,
    ) -> Result<Self> {
        let dir = dir.as_ref();
        check_max_sequence_length(max_sequence_length)?;
        Ok(Sd3TextEncoders {
            clip_l: ClipTextModel::load(dir.join("text_encoder"), device)?,
            clip_g: ClipTextModel::load(dir.join("text_encoder_2"), device)?,
            t5: T5EncoderModel::load(dir.join("text_encoder_3"), device)?,
            tokenizer: TextTokenizer::open(dir.join("tokenizer"), CLIP_LENGTH)?,
            tokenizer_2: TextTokenizer::open(dir.join("tokenizer_2"), CLIP_LENGTH)?,
            tokenizer_3: TextTokenizer::open(dir.join("tokenizer_3"), max_sequence_length)?,
        })
    }

    /// SD3's prompt conditioning:
    /// `text = cat_seq(pad_channels(cat_ch(clipL_h, clipG_h), D_t5), t5)` `[B, 77 + L, D_t5]`
    /// with the CLIP features taken before the last layer, and
    /// `pooled = cat_ch(clipL_pooled, clipG_pooled)` `[B, P_l + P_g]`.
    pub fn encode(&self, texts: &[&str], device: &B::Device) -> Result<Conditioning<B>> {
        let l = self.clip_l.forward(&self.tokenizer.encode(texts)?, device)?;
        let g = self.clip_g.forward(&self.tokenizer_2.encode(texts)?, device)?;
        let t5 = self.t5.forward(&self.tokenizer_3.encode(texts)?, device)?;
        let clip = Tensor::cat(vec![l.hidden, g.hidden], 2);
        let [b, t, c] = clip.dims();
        let width = t5.dims()[2];
        if c > width {
            return Err(Error::config(
                "text_encoder_3.d_model",
                format!("T5 width {width} is smaller than the CLIP-L + CLIP-G width {c}"),
            ));
        }
        let clip = if c < width {
            Tensor::cat(vec![clip, Tensor::zeros([b, t, width - c], device)], 2)
        } else {
            clip
        };
        Ok(Conditioning {
            text: Tensor::cat(vec![clip, t5], 1),
            pooled: Tensor::cat(vec![l.pooled, g.pooled], 1),
        })
    }
}

/// What the trainer needs besides the transformer: prompt conditioning (encoders or a cache),
/// the VAE and the latent size.
#[derive(Debug)]
pub struct Sd3Conditioner<B: Backend> {
    /// Live text encoders, or `None` when every prompt comes from `cache`.
    pub encoders: Option<Sd3TextEncoders<B>>,
    /// Cached embeddings by prompt text.
    pub cache: Option<EmbeddingCache>,
    /// The VAE.
    pub vae: AutoencoderKL<B>,
    /// `[C, H/8, W/8]` of one latent.
    pub latent: [usize; 3],
    device: B::Device,
}

impl<B: Backend> Sd3Conditioner<B> {
    /// Loads the text encoders, tokenizers and VAE of a diffusers SD3 folder for latents of
    /// shape `latent` (`[C, H/8, W/8]`).
    pub fn load(
        dir: impl AsRef<Path>,
        max_sequence_length: usize,
        latent: [usize; 3],
        device: &B::Device,
    ) -> Result<Self> {
        let dir = dir.as_ref();
        Ok(Sd3Conditioner {
            encoders: Some(Sd3TextEncoders::load(dir, max_sequence_length, device)?),
            cache: None,
            vae: AutoencoderKL::load(dir.join("vae"), device)?,
            latent,
            device: device.clone(),
        })
    }
}

impl<B: Backend> TextToImage<B> for Sd3Conditioner<B> {
    fn encode(&self, texts: &[&str]) -> Result<Conditioning<B>> {
        if let Some(cache) = &self.cache {
            if texts.iter().all(|t| cache.contains(t)) {
                return cache.lookup(texts, &self.device);
            }
        }
        match &self.encoders {
            Some(enc) => enc.encode(texts, &self.device),
            None => {
                let missing =
                    texts.iter().find(|t| !self.cache.as_ref().is_some_and(|c| c.contains(t)));
                Err(Error::config(
                    "prompt",
                    format!(
                        "{missing:?} is not in the embedding cache and no text encoders are loaded"
                    ),
                ))
            }
        }
    }

    fn decode(&self, latents: Tensor<B, 4>) -> Result<Vec<Image>> {
        Image::from_tensor(self.vae.decode(latents)?)
    }

    fn latent_shape(&self) -> [usize; 3] {
        self.latent
    }
}

/// Prompt embeddings saved to one safetensors file (`prompt_embeds [N, T, D]`,
/// `pooled_prompt_embeds [N, P]`, the prompt texts as JSON in the header's `prompts`), so T5
/// need not be loaded while training on a fixed prompt set.
#[derive(Debug, Clone)]
pub struct EmbeddingCache {
    index: HashMap<String, usize>,
    text: Vec<f32>,
    pooled: Vec<f32>,
    text_shape: [usize; 2],
    pooled_width: usize,
}

impl EmbeddingCache {
    /// Encodes `prompts` (plus `""`, the negative prompt) in batches of `batch` and writes
    /// them to `path` atomically.
    pub fn build<B: Backend>(
        encoders: &Sd3TextEncoders<B>,
        prompts: &[&str],
        batch: usize,
        path: impl AsRef<Path>,
        device: &B::Device,
    ) -> Result<Self> {
        let mut all: Vec<&str> = vec![""];
        for p in prompts {
            if !all.contains(p) {
                all.push(p);
            }
        }
        let (mut text, mut pooled, mut text_shape, mut pooled_width) = (vec![], vec![], [0, 0], 0);
        for chunk in all.chunks(batch.max(1)) {
            let c = encoders.encode(chunk, device)?;
            let [_, t, d] = c.text.dims();
            (text_shape, pooled_width) = ([t, d], c.pooled.dims()[1]);
            text.extend(c.text.into_data().convert::<f32>().into_vec::<f32>().expect("f32"));
            pooled.extend(c.pooled.into_data().convert::<f32>().into_vec::<f32>().expect("f32"));
        }
        let n = all.len();
        let names = serde_json::to_string(&all).expect("strings serialise");
        let mut tensors = [
            ("prompt_embeds".to_string(), vec![n, text_shape[0], text_shape[1]], text),
            ("pooled_prompt_embeds".to_string(), vec![n, pooled_width], pooled),
        ];
        save_safetensors_with_metadata(
            path.as_ref(),
            &tensors,
            Some(HashMap::from([("prompts".to_string(), names)])),
        )?;
        let index = all.iter().enumerate().map(|(i, p)| (p.to_string(), i)).collect();
        let (text, pooled) = (std::mem::take(&mut tensors[0].2), std::mem::take(&mut tensors[1].2));
        Ok(EmbeddingCache { index, text, pooled, text_shape, pooled_width })
    }

    /// Reads a cache written by [`EmbeddingCache::build`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let files = WeightFiles::open(path)?;
        let prompts: Vec<String> = files
            .metadata
            .get("prompts")
            .and_then(|s| serde_json::from_str(s).ok())
            .ok_or_else(|| Error::format(path, "no `prompts` list in the header metadata"))?;
        let shape = |k: &str| {
            files.info(k).map(|i| i.shape.clone()).ok_or_else(|| Error::Checkpoint {
                path: path.to_path_buf(),
                problems: vec![format!("missing key `{k}`")],
            })
        };
        let (ts, ps) = (shape("prompt_embeds")?, shape("pooled_prompt_embeds")?);
        if ts.len() != 3 || ps.len() != 2 || ts[0] != prompts.len() || ps[0] != prompts.len() {
            return Err(Error::format(
                path,
                format!(
                    "{} prompts but prompt_embeds {ts:?} and pooled_prompt_embeds {ps:?}",
                    prompts.len()
                ),
            ));
        }
        Ok(EmbeddingCache {
            index: prompts.into_iter().enumerate().map(|(i, p)| (p, i)).collect(),
            text: files.read_f32("prompt_embeds")?,
            pooled: files.read_f32("pooled_prompt_embeds")?,
            text_shape: [ts[1], ts[2]],
            pooled_width: ps[1],
        })
    }

    /// Whether `prompt` is cached.
    pub fn contains(&self, prompt: &str) -> bool {
        self.index.contains_key(prompt)
    }

    /// The cached conditioning of `texts` (every one must be cached).
    pub fn lookup<B: Backend>(
        &self,
        texts: &[&str],
        device: &B::Device,
    ) -> Result<Conditioning<B>> {
        let [t, d] = self.text_shape;
        let (mut text, mut pooled) = (Vec::new(), Vec::new());
        for p in texts {
            let i = *self.index.get(*p).ok_or_else(|| {
                Error::config("prompt", format!("{p:?} is not in the embedding cache"))
            })?;
            text.extend_from_slice(&self.text[i * t * d..(i + 1) * t * d]);
            pooled.extend_from_slice(
                &self.pooled[i * self.pooled_width..(i + 1) * self.pooled_width],
            );
        }
        let b = texts.len();
        Ok(Conditioning {
            text: Tensor::from_data(TensorData::new(text, [b, t, d]), device),
            pooled: Tensor::from_data(TensorData::new(pooled, [b, self.pooled_width]), device),
        })
    }
}

/// A loaded SD3 / SD3.5 pipeline.
#[derive(Debug)]
pub struct Sd3Pipeline<B: Backend> {
    /// The denoiser.
    pub transformer: MMDiT<B>,
    /// Encoders, cache and VAE.
    pub conditioner: Sd3Conditioner<B>,
    /// Timestep shift of `scheduler/scheduler_config.json`.
    pub shift: f64,
}

/// The `shift` of a diffusers `scheduler/scheduler_config.json` (diffusers' default 1.0).
fn scheduler_shift(dir: &Path) -> Result<f64> {
    let path: PathBuf = dir.join("scheduler").join("scheduler_config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::format(&path, format!("invalid JSON: {e}")))?;
    if json.get("use_dynamic_shifting").and_then(|v| v.as_bool()) == Some(true) {
        return Err(Error::format(
            &path,
            "dynamic shifting is not supported (SD3 does not use it)",
        ));
    }
    match json.get("shift") {
        None => Ok(1.0),
        Some(v) => {
            v.as_f64().ok_or_else(|| Error::format(&path, format!("`shift` is {v}, not a number")))
        }
    }
}

/// The latent `[h, w]` of a `height x width` image for a transformer of `config` behind a VAE
/// that downsamples by `f`: both sides positive multiples of `f` times the patch size, and at
/// most the position table's `pos_embed_max_size` patches (checked before anything of that
/// size is allocated).
pub fn image_to_latent_size(
    config: &crate::model::MMDiTConfig,
    f: usize,
    [height, width]: [usize; 2],
) -> Result<[usize; 2]> {
    let unit = f * config.patch_size;
    if height == 0 || width == 0 || height % unit != 0 || width % unit != 0 {
        return Err(Error::config(
            "height/width",
            format!("{height}x{width} is not a positive multiple of {unit} (VAE x patch)"),
        ));
    }
    let most = config.pos_embed_max_size * unit;
    if height > most || width > most {
        return Err(Error::config(
            "height/width",
            format!(
                "{height}x{width} is larger than the model's position table allows ({most}x{most}: \
                 pos_embed_max_size {} patches of {unit} pixels)",
                config.pos_embed_max_size
            ),
        ));
    }
    Ok([height / f, width / f])
}

impl<B: Backend> Sd3Pipeline<B> {
    /// Opens a diffusers SD3 folder; T5 sequences get `max_sequence_length` tokens. The image
    /// size starts at the transformer's native one (`sample_size x` the VAE factor).
    pub fn load(
        dir: impl AsRef<Path>,
        max_sequence_length: usize,
        device: &B::Device,
    ) -> Result<Self> {
        let dir = dir.as_ref();
        check_max_sequence_length(max_sequence_length)?;
        if !dir.is_dir() {
            return Err(Error::format(dir, "no such folder (expected a diffusers SD3 pipeline)"));
        }
        let index = dir.join("model_index.json");
        if !index.is_file() {
            return Err(Error::format(dir, "not a diffusers pipeline folder: no model_index.json"));
        }
        let transformer = MMDiT::load(dir.join("transformer"), device)?;
        let (c, s) = (transformer.config.in_channels, transformer.config.sample_size);
        // The native size is the default image size: it must fit the position table before
        // any latent of that size is allocated.
        image_to_latent_size(&transformer.config, 1, [s, s]).map_err(|e| {
            Error::format(dir.join("transformer/config.json"), format!("`sample_size`: {e}"))
        })?;
        Ok(Sd3Pipeline {
            conditioner: Sd3Conditioner::load(dir, max_sequence_length, [c, s, s], device)?,
            transformer,
            shift: scheduler_shift(dir)?,
        })
    }

    /// `[height, width]` of the images, in pixels.
    pub fn image_size(&self) -> [usize; 2] {
        let f = self.conditioner.vae.downsample_factor();
        [self.conditioner.latent[1] * f, self.conditioner.latent[2] * f]
    }

    /// Sets the image size (training rollouts and default sampling); both sides must be
    /// positive multiples of the VAE factor times the patch size.
    pub fn set_image_size(&mut self, size: [usize; 2]) -> Result<()> {
        let [h, w] = self.latent_size(size)?;
        self.conditioner.latent[1..].copy_from_slice(&[h, w]);
        Ok(())
    }

    /// The latent `[h, w]` of an image `[height, width]`; errors unless both sides are
    /// positive multiples of the VAE factor times the patch size.
    fn latent_size(&self, [height, width]: [usize; 2]) -> Result<[usize; 2]> {
        let f = self.conditioner.vae.downsample_factor();
        image_to_latent_size(&self.transformer.config, f, [height, width])
    }

    /// Denoises `noise` `[B, C, h, w]` from sigma 1 with `steps` guided Euler steps.
    pub fn denoise(
        &self,
        noise: Tensor<B, 4>,
        cond: &Conditioning<B>,
        uncond: &Conditioning<B>,
        steps: usize,
        guidance_scale: f64,
    ) -> Result<Tensor<B, 4>> {
        let schedule = FlowSchedule::new(steps, self.shift)?;
        ode_sample(&self.transformer, &schedule, noise, cond, uncond, guidance_scale)
    }

    /// Generates one image per prompt from seeded noise (seed `seeds[i]` for prompt `i`).
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
        let device = &self.conditioner.device;
        let [h, w] = self.image_size();
        let [lh, lw] = self.latent_size([config.height.unwrap_or(h), config.width.unwrap_or(w)])?;
        let shape = [self.conditioner.latent[0], lh, lw];
        let noise = seeded_noise::<B>(seeds, 0, shape, device);
        let cond = self.encode(prompts)?;
        let negatives = vec![config.negative_prompt.as_str(); prompts.len()];
        let uncond = self.encode(&negatives)?;
        let latents = self.denoise(noise, &cond, &uncond, config.steps, config.guidance_scale)?;
        self.decode(latents)
    }
}

/// The pipeline's encoders and VAE (the transformer is used by [`Sd3Pipeline::denoise`]).
impl<B: Backend> TextToImage<B> for Sd3Pipeline<B> {
    fn encode(&self, texts: &[&str]) -> Result<Conditioning<B>> {
        self.conditioner.encode(texts)
    }

    fn decode(&self, latents: Tensor<B, 4>) -> Result<Vec<Image>> {
        self.conditioner.decode(latents)
    }

    fn latent_shape(&self) -> [usize; 3] {
        self.conditioner.latent_shape()
    }
}
