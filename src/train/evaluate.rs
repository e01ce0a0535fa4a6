//! The held-out evaluation: EMA weights, deterministic ODE samples from fixed seeds, the mean
//! reward and the first image of each prompt.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use burn::prelude::*;

use super::config::TrainConfig;
use crate::error::Result;
use crate::finite::{ensure_finite, ensure_finite_values, no_overflow};
use crate::image::Image;
use crate::model::Denoiser;
use crate::prompts::Prompt;
use crate::reward::{score_checked, Report, Reward};
use crate::rng::{mix, salt};
use crate::sampler::{ode_sample, seeded_noise, TextToImage};

/// What evaluation reads: the model to evaluate (EMA weights), the pipeline and the reward.
pub(crate) struct Evaluator<'a, B: Backend, P: TextToImage<B>> {
    /// The settings (`eval_steps`, `eval_images_per_prompt`, guidance, seed).
    pub config: &'a TrainConfig,
    /// The evaluated transformer.
    pub model: &'a Denoiser<B>,
    /// Encoders and decoder.
    pub pipeline: &'a P,
    /// The reward.
    pub reward: &'a dyn Reward,
    /// Measured beside the reward.
    pub report: Option<&'a dyn Report>,
    /// Set to stop: read before each chunk.
    pub stop: &'a AtomicBool,
}

/// What an evaluation measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// The mean reward.
    pub reward: f64,
    /// The report's rates by name (`passed / made` of its summed tallies).
    pub report: BTreeMap<String, f64>,
    /// The first image of each prompt.
    pub images: Vec<Image>,
    /// The reward of each image of `images`.
    pub image_rewards: Vec<f64>,
}

impl<B: Backend, P: TextToImage<B>> Evaluator<'_, B, P> {
    /// Mean reward and report of `eval_steps`-step guided ODE samples of `prompts`,
    /// `eval_images_per_prompt` per prompt from fixed seeds (image `j` of prompt `i` has the
    /// seed of item `j * len + i`), and the first image of each prompt; `None` when `stop` was
    /// set before a chunk.
    pub(crate) fn evaluate(&self, prompts: &[Prompt]) -> Result<Option<Evaluation>> {
        let cfg = self.config;
        let device = self.model.devices()[0].clone();
        let empty = self.pipeline.encode(&[""])?;
        let shape = self.pipeline.latent_shape();
        let schedule = cfg.rollout.flow_schedule(cfg.eval_steps, shape)?;
        let chunk_size = cfg.rollout_batch.saturating_mul(4);
        let (mut scores, mut images, mut image_rewards) = (Vec::new(), Vec::new(), Vec::new());
        let mut tallies: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for (c, chunk) in prompts.chunks(chunk_size).enumerate() {
            if self.stop.load(Ordering::Relaxed) {
                return Ok(None);
            }
            // Each chunk is encoded once and sampled with every image's seed.
            let texts: Vec<&str> = chunk.iter().map(|p| p.text.as_str()).collect();
            let cond = self.pipeline.encode(&texts)?;
            let uncond = empty.select(&vec![0; chunk.len()]);
            for j in 0..cfg.eval_images_per_prompt {
                let seeds: Vec<u64> = (0..chunk.len())
                    .map(|i| {
                        let item = j * prompts.len() + c * chunk_size + i;
                        mix(cfg.seed ^ salt::EVALUATION, item as u64)
                    })
                    .collect();
                let noise = seeded_noise(&seeds, 0, shape, &device);
                let g = cfg.rollout.guidance;
                let out = ode_sample(self.model, &schedule, noise, &cond, &uncond, g)?;
                ensure_finite(&out, "evaluation latents (EMA weights, before decoding)")?;
                let imgs = self.pipeline.decode(out)?;
                for (i, image) in imgs.iter().enumerate() {
                    ensure_finite_values(
                        &image.pixels,
                        &format!("evaluation image {i} of the chunk"),
                    )?;
                }
                let chunk_scores = score_checked(self.reward, &imgs, chunk)?;
                if j == 0 {
                    image_rewards.extend(chunk_scores.iter().copied());
                }
                scores.extend(chunk_scores);
                for (name, passed, made) in
                    self.report.map_or(Ok(vec![]), |r| r.tally(&imgs, chunk))?
                {
                    let t = tallies.entry(name).or_default();
                    (t.0, t.1) = (t.0 + passed, t.1 + made);
                }
                if j == 0 {
                    images.extend(imgs);
                }
            }
        }
        let reward =
            no_overflow(scores.iter().sum::<f64>() / scores.len().max(1) as f64, "reward", || {
                "the mean held-out reward".into()
            })?;
        let report = tallies
            .into_iter()
            .filter(|(_, (_, made))| *made > 0.0)
            .map(|(name, (passed, made))| (name, passed / made))
            .collect();
        Ok(Some(Evaluation { reward, report, images, image_rewards }))
    }
}
