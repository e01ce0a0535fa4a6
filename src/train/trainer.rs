//! The GRPO epoch loop for flow models: prompt groups, rollouts (with ODE completions for
//! TP-GRPO), rewards, credit and advantages, clipped per-step updates with gradient
//! accumulation, AdamW, EMA, evaluation, metrics and checkpoints.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use indicatif::{ProgressBar, ProgressStyle};

use super::checkpoint::{self, TrainerState};
use super::config::TrainConfig;
use super::ema::Ema;
use super::metrics::{read_metrics, write_metrics, EpochMetrics};
use super::noise_scale::GradientNoise;
use super::optim::{clip_global_norm, squared_norm, AdamW};
use super::plot::{save_chart, save_grid, Series};
use crate::error::{Error, Result};
use crate::grpo::{
    credit_batch, flow_grpo_advantages, informative_samples, kl_penalty, mean_abs_step_rewards,
    policy_loss, tp_grpo_advantages, Objective,
};
use crate::model::MMDiT;
use crate::reward::{score_checked, Image, Prompt, Reward};
use crate::sampler::noise::SplitMix64;
use crate::sampler::{
    cps_step, ode_completions, rollout, sde_step, seeded_noise, Conditioning, FlowSchedule,
    GaussianStep, Guidance, SamplerKind,
};

/// What the trainer needs from a text-to-image pipeline besides the transformer: prompt
/// encoding, decoding latents to images, and the latent shape.
pub trait Pipeline<B: Backend> {
    /// Prompt conditioning of `texts` (`""` is the unconditional prompt).
    fn encode(&self, texts: &[&str]) -> Result<Conditioning<B>>;
    /// Images in `[0, 1]` of latents `[B, C, H, W]`.
    fn decode(&self, latents: Tensor<B, 4>) -> Result<Vec<Image>>;
    /// `[C, H, W]` of one latent.
    fn latent_shape(&self) -> [usize; 3];
}

/// A 64-bit hash of `(a, b)`: independent seeds for every epoch, sample and purpose.
pub fn mix(a: u64, b: u64) -> u64 {
    SplitMix64(a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15)).next_u64()
}

/// The trainer: a LoRA-adapted transformer, its optimizer and EMA, a pipeline and a reward.
pub struct Trainer<B: AutodiffBackend, P: Pipeline<B::InnerBackend>> {
    /// The settings.
    pub config: TrainConfig,
    /// The policy: the base transformer with trainable adapters.
    pub model: MMDiT<B>,
    /// Encoders and decoder.
    pub pipeline: P,
    /// The reward.
    pub reward: Box<dyn Reward>,
    /// AdamW over the adapter factors.
    pub optimizer: AdamW<B::InnerBackend>,
    /// EMA of the adapter factors.
    pub ema: Ema<B::InnerBackend>,
    /// Epochs completed.
    pub epoch: usize,
    /// Training prompts.
    pub train_prompts: Vec<Prompt>,
    /// Held-out prompts.
    pub eval_prompts: Vec<Prompt>,
    /// Output folder (metrics, images, checkpoints).
    pub out_dir: PathBuf,
}

/// One epoch's rollouts: every sample's states, old log-probs, rewards and prompt.
struct Batch<B: Backend> {
    /// `states[k]`: `[S, C, H, W]` latent before scheduler step `k` (`k = 0..=N`).
    states: Vec<Tensor<B, 4>>,
    /// `old_log_probs[j]`: `[S]` log-prob of trained step `j` under the sampling policy.
    old_log_probs: Vec<Tensor<B, 1>>,
    /// `[S][n + 1]` reward sequences (TP-GRPO) or `[S][1]` final rewards.
    rewards: Vec<Vec<f64>>,
    /// Index into the epoch's prompts of each sample.
    prompt_ids: Vec<usize>,
    /// Conditioning of the epoch's prompts.
    cond: Conditioning<B>,
    /// Conditioning of the empty prompt (one row).
    empty: Conditioning<B>,
    /// Transformer evaluations, summed over samples.
    nfe: usize,
}

/// Turning-point counts and advantages of an epoch.
#[derive(Default)]
struct Credit {
    /// `[sample][trained step]`.
    advantages: Vec<Vec<f64>>,
    /// Turning points after balancing.
    turning_points: usize,
    /// ... in trajectories with `Delta > 0`.
    positive: usize,
    /// ... in trajectories with `Delta < 0`.
    negative: usize,
    /// Turning points before balancing.
    candidates: usize,
    /// Mean `|d_k|` per trained step (TP-GRPO; empty for Flow-GRPO).
    step_reward_change: Vec<f64>,
}

/// Loss statistics of every micro-batch and trained step, and the norm of every optimizer step.
#[derive(Default)]
struct UpdateStats {
    ratio: Vec<f64>,
    above: Vec<f64>,
    below: Vec<f64>,
    approx_kl: Vec<f64>,
    kl: Vec<f64>,
    loss: Vec<f64>,
    grad_norm: Vec<f64>,
    noise: Vec<GradientNoise>,
}

/// Adds `grad` to the gradient named `name` in `grads` (inserts it when absent).
fn add_gradient<B: Backend>(
    grads: &mut BTreeMap<String, Tensor<B, 2>>,
    name: String,
    grad: Tensor<B, 2>,
) {
    let sum = match grads.remove(&name) {
        Some(acc) => acc + grad,
        None => grad,
    };
    grads.insert(name, sum);
}

fn bar(len: usize, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len as u64);
    pb.set_style(
        ProgressStyle::with_template("{prefix:>10} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb.set_prefix(what.to_string());
    pb
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn select<B: Backend, const D: usize>(t: &Tensor<B, D>, rows: &[usize]) -> Tensor<B, D> {
    let idx: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
    let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(idx, [rows.len()]), &t.device());
    t.clone().select(0, idx)
}

fn select_cond<B: Backend>(c: &Conditioning<B>, rows: &[usize]) -> Conditioning<B> {
    Conditioning { text: select(&c.text, rows), pooled: select(&c.pooled, rows) }
}

fn lift_cond<B: AutodiffBackend>(c: &Conditioning<B::InnerBackend>) -> Conditioning<B> {
    Conditioning {
        text: Tensor::from_inner(c.text.clone()),
        pooled: Tensor::from_inner(c.pooled.clone()),
    }
}

fn gaussian_step<B: Backend>(
    kind: SamplerKind,
    x: Tensor<B, 4>,
    v: Tensor<B, 4>,
    schedule: &FlowSchedule,
    k: usize,
    alpha: f64,
) -> Result<GaussianStep<B>> {
    match kind {
        SamplerKind::Sde => sde_step(x, v, schedule, k, alpha),
        SamplerKind::Cps => cps_step(x, v, schedule, k, alpha),
    }
}

impl<B: AutodiffBackend, P: Pipeline<B::InnerBackend>> Trainer<B, P> {
    /// A trainer for `base` (adapters are attached here, per `config.lora`).
    pub fn new(
        config: TrainConfig,
        base: MMDiT<B>,
        pipeline: P,
        reward: Box<dyn Reward>,
        train_prompts: Vec<Prompt>,
        eval_prompts: Vec<Prompt>,
        out_dir: impl AsRef<Path>,
    ) -> Result<Self> {
        config.validate()?;
        if train_prompts.len() < config.prompts_per_epoch {
            return Err(Error::config(
                "prompts_per_epoch",
                format!(
                    "{} distinct prompts per epoch, {} available",
                    config.prompts_per_epoch,
                    train_prompts.len()
                ),
            ));
        }
        if config.eval_every > 0 && eval_prompts.is_empty() {
            return Err(Error::config("eval_every", "evaluation needs held-out prompts"));
        }
        let model = base.with_lora(&config.lora)?;
        let params: Vec<_> =
            model.lora_tensors().into_iter().map(|(n, t)| (n, t.inner())).collect();
        Ok(Trainer {
            optimizer: AdamW::new(config.optimizer.clone()),
            ema: Ema::new(config.ema.clone(), params),
            config,
            model,
            pipeline,
            reward,
            epoch: 0,
            train_prompts,
            eval_prompts,
            out_dir: out_dir.as_ref().to_path_buf(),
        })
    }

    /// The `P` distinct prompts of epoch `epoch` (a seeded partial shuffle of the training
    /// prompts).
    fn epoch_prompts(&self, epoch: usize) -> Vec<Prompt> {
        let mut rng = SplitMix64(mix(self.config.seed, 0x70_0000 + epoch as u64));
        let mut idx: Vec<usize> = (0..self.train_prompts.len()).collect();
        for i in 0..self.config.prompts_per_epoch {
            let j = rng.range(i, idx.len() - 1);
            idx.swap(i, j);
        }
        idx[..self.config.prompts_per_epoch]
            .iter()
            .map(|&i| self.train_prompts[i].clone())
            .collect()
    }

    fn encode_prompts(&self, prompts: &[Prompt]) -> Result<Conditioning<B::InnerBackend>> {
        let texts: Vec<&str> = prompts.iter().map(|p| p.text.as_str()).collect();
        self.pipeline.encode(&texts)
    }

    /// The empty prompt's conditioning, encoded once and repeated `batch` times.
    fn uncond(
        empty: &Conditioning<B::InnerBackend>,
        batch: usize,
    ) -> Conditioning<B::InnerBackend> {
        select_cond(empty, &vec![0; batch])
    }

    /// Rollouts of every sample of epoch `epoch` with the current policy, and their rewards.
    fn sample(&self, epoch: usize, pb: &ProgressBar) -> Result<Batch<B::InnerBackend>> {
        let cfg = &self.config;
        let policy = self.model.valid();
        let device = policy.devices()[0].clone();
        let prompts = self.epoch_prompts(epoch);
        let cond = self.encode_prompts(&prompts)?;
        let empty = self.pipeline.encode(&[""])?;
        let total = cfg.prompts_per_epoch * cfg.group_size;
        // Each prompt repeated G times, then shuffled: micro-batches mix groups.
        let mut prompt_ids: Vec<usize> = (0..total).map(|i| i / cfg.group_size).collect();
        let mut rng = SplitMix64(mix(cfg.seed, 0x5A_0000 + epoch as u64));
        for i in (1..total).rev() {
            prompt_ids.swap(i, rng.range(0, i));
        }
        let schedule = cfg.rollout.schedule()?;
        let window = cfg.rollout.window();
        let shape = self.pipeline.latent_shape();
        let tp = cfg.objective.objective == Objective::TpGrpo;
        let mut states: Vec<Vec<Tensor<B::InnerBackend, 4>>> =
            vec![Vec::new(); schedule.num_steps() + 1];
        let mut old: Vec<Vec<Tensor<B::InnerBackend, 1>>> = vec![Vec::new(); window.len()];
        let mut rewards = Vec::with_capacity(total);
        let mut nfe = 0;
        pb.set_length(total as u64);
        pb.set_position(0);
        for start in (0..total).step_by(cfg.rollout_batch) {
            let rows: Vec<usize> = (start..(start + cfg.rollout_batch).min(total)).collect();
            let b = rows.len();
            let seeds: Vec<u64> =
                rows.iter().map(|&i| mix(mix(cfg.seed, epoch as u64), i as u64)).collect();
            let ids: Vec<usize> = rows.iter().map(|&i| prompt_ids[i]).collect();
            let c = select_cond(&cond, &ids);
            let u = Self::uncond(&empty, b);
            let r = rollout(&policy, &cfg.rollout, &seeds, shape, &c, &u, &device)?;
            nfe += r.nfe * b;
            let batch_prompts: Vec<Prompt> = ids.iter().map(|&i| prompts[i].clone()).collect();
            let finals = self.pipeline.decode(r.latents[schedule.num_steps()].clone())?;
            let final_scores = score_checked(self.reward.as_ref(), &finals, &batch_prompts)?;
            if tp {
                // R_ode and R_1..R_{n-1}: ODE completions of the state before each trained step.
                let mut starts: Vec<(usize, Tensor<B::InnerBackend, 4>)> =
                    window.clone().map(|k| (k, r.latents[k].clone())).collect();
                if cfg.objective.fresh_ode_noise {
                    let fresh: Vec<u64> = seeds.iter().map(|&s| mix(s, 0xF2E5)).collect();
                    starts[0] = (0, seeded_noise(&fresh, 0, shape, &device));
                }
                let (done, extra) =
                    ode_completions(&policy, &schedule, &starts, &c, &u, cfg.rollout.guidance)?;
                nfe += extra * b;
                let mut seq: Vec<Vec<f64>> = vec![Vec::with_capacity(window.len() + 1); b];
                for latent in done {
                    let images = self.pipeline.decode(latent)?;
                    let scores = score_checked(self.reward.as_ref(), &images, &batch_prompts)?;
                    for (s, v) in seq.iter_mut().zip(scores) {
                        s.push(v);
                    }
                }
                for (s, v) in seq.iter_mut().zip(&final_scores) {
                    s.push(*v);
                }
                rewards.extend(seq);
            } else {
                rewards.extend(final_scores.iter().map(|&v| vec![v]));
            }
            for (k, latent) in r.latents.into_iter().enumerate() {
                states[k].push(latent);
            }
            for (j, lp) in r.log_probs.into_iter().enumerate() {
                old[j].push(lp);
            }
            pb.inc(b as u64);
        }
        Ok(Batch {
            states: states.into_iter().map(|s| Tensor::cat(s, 0)).collect(),
            old_log_probs: old.into_iter().map(|s| Tensor::cat(s, 0)).collect(),
            rewards,
            prompt_ids,
            cond,
            empty,
            nfe,
        })
    }

    /// Runs one epoch (sampling, credit, optimizer steps) and returns its metrics.
    pub fn run_epoch(&mut self, pb: &ProgressBar) -> Result<EpochMetrics> {
        let started = Instant::now();
        let epoch = self.epoch + 1;
        let cfg = self.config.clone();
        let obj = &cfg.objective;
        pb.set_message("rollouts");
        let batch = self.sample(epoch, pb)?;
        let total = batch.rewards.len();

        let finals: Vec<f64> =
            batch.rewards.iter().map(|r| *r.last().expect("non-empty")).collect();
        let credit = self.credit(&batch, &finals)?;
        let keep = informative_samples(&credit.advantages);
        let mut used: Vec<usize> = (0..total).filter(|&i| keep[i]).collect();
        let mut rng = SplitMix64(mix(cfg.seed, 0x7A_0000 + epoch as u64));
        for i in (1..used.len()).rev() {
            used.swap(i, rng.range(0, i));
        }

        // The used samples split over the optimizer steps; each step sums the gradients of its
        // micro-batches over every trained step.
        pb.set_message("updates");
        let n = cfg.rollout.window().len();
        pb.set_length((used.len().div_ceil(cfg.train_batch).max(1) * n) as u64);
        pb.set_position(0);
        let mut stats = UpdateStats::default();
        let chunks = cfg.optimizer_steps_per_epoch.min(used.len().max(1));
        for chunk in used.chunks(used.len().div_ceil(chunks).max(1)) {
            let micro: Vec<&[usize]> = chunk.chunks(cfg.train_batch).collect();
            let scale = 1.0 / (micro.len() * n) as f64;
            let reference = self.model.valid().adapters_off();
            // Each micro-batch's share is kept apart first: the norms of the micro-batch means
            // and of their mean give the gradient noise estimates.
            let m = micro.len() as f64;
            let mut grads: BTreeMap<String, Tensor<B::InnerBackend, 2>> = BTreeMap::new();
            let mut micro_sq = Vec::with_capacity(micro.len());
            for rows in micro {
                let mut share = BTreeMap::new();
                self.accumulate(
                    &batch,
                    rows,
                    &credit.advantages,
                    &reference,
                    scale,
                    &mut share,
                    &mut stats,
                    pb,
                )?;
                micro_sq.push((rows.len(), m * m * squared_norm(&share)));
                for (name, g) in share {
                    add_gradient(&mut grads, name, g);
                }
            }
            let norm = self.optimizer_step(grads)?;
            stats.noise.extend(GradientNoise::estimate(&micro_sq, norm * norm));
            stats.grad_norm.push(norm);
        }
        self.epoch = epoch;

        let noise = GradientNoise::mean(&stats.noise);
        let rm = mean(&finals);
        let var = finals.iter().map(|r| (r - rm).powi(2)).sum::<f64>() / finals.len() as f64;
        Ok(EpochMetrics {
            epoch,
            objective: obj.objective.name().into(),
            reward_mean: rm,
            reward_std: var.sqrt(),
            eval_reward: None,
            turning_points: credit.turning_points,
            turning_points_positive: credit.positive,
            turning_points_negative: credit.negative,
            turning_point_candidates: credit.candidates,
            step_reward_change: credit.step_reward_change,
            samples_used: used.len(),
            samples_dropped: total - used.len(),
            ratio_mean: mean(&stats.ratio),
            clip_frac_above: mean(&stats.above),
            clip_frac_below: mean(&stats.below),
            approx_kl: mean(&stats.approx_kl),
            kl: mean(&stats.kl),
            policy_loss: mean(&stats.loss),
            grad_norm: mean(&stats.grad_norm),
            grad_signal_sq: noise.map(|e| e.signal_sq),
            grad_noise_trace: noise.map(|e| e.noise_trace),
            optimizer_steps: self.optimizer.step,
            nfe_per_sample: batch.nfe as f64 / total as f64,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// TP-GRPO credit and advantages (or the Flow-GRPO baseline's) of an epoch's samples.
    fn credit(&self, batch: &Batch<B::InnerBackend>, finals: &[f64]) -> Result<Credit> {
        let obj = &self.config.objective;
        let mut out = Credit::default();
        out.advantages = match obj.objective {
            Objective::TpGrpo => {
                let credits = credit_batch(&batch.rewards, obj)?;
                out.step_reward_change = mean_abs_step_rewards(&credits);
                for c in &credits {
                    let count = c.turning_points.iter().filter(|&&t| t).count();
                    out.turning_points += count;
                    out.candidates += c.candidate_turning_points.iter().filter(|&&t| t).count();
                    if c.delta > 0.0 {
                        out.positive += count;
                    } else {
                        out.negative += count;
                    }
                }
                let credited: Vec<Vec<f64>> =
                    credits.into_iter().map(|c| c.credited_rewards).collect();
                tp_grpo_advantages(&credited, &batch.prompt_ids, obj.std_scope, obj.std_eps)?
            }
            Objective::FlowGrpo => {
                let n = self.config.rollout.window().len();
                flow_grpo_advantages(finals, &batch.prompt_ids, obj.std_scope, obj.std_eps)?
                    .into_iter()
                    .map(|a| vec![a; n])
                    .collect()
            }
        };
        Ok(out)
    }

    /// Adds to `grads` the gradients of one micro-batch (`rows`) at every trained step:
    /// policy CFG velocity at the stored `x_k`, log-prob of the stored `x_{k+1}`, clipped
    /// policy loss plus `kl_beta` times the KL to `reference`, all scaled by `scale`.
    #[allow(clippy::too_many_arguments)]
    fn accumulate(
        &self,
        batch: &Batch<B::InnerBackend>,
        rows: &[usize],
        advantages: &[Vec<f64>],
        reference: &MMDiT<B::InnerBackend>,
        scale: f64,
        grads: &mut BTreeMap<String, Tensor<B::InnerBackend, 2>>,
        stats: &mut UpdateStats,
        pb: &ProgressBar,
    ) -> Result<()> {
        let cfg = &self.config;
        let (obj, ro) = (&cfg.objective, &cfg.rollout);
        let schedule = ro.schedule()?;
        let device = self.model.devices()[0].clone();
        let b = rows.len();
        let ids: Vec<usize> = rows.iter().map(|&i| batch.prompt_ids[i]).collect();
        let c_inner = select_cond(&batch.cond, &ids);
        let u_inner = Self::uncond(&batch.empty, b);
        let guide =
            Guidance::new(&lift_cond::<B>(&c_inner), &lift_cond::<B>(&u_inner), ro.guidance, b, 1)?;
        let guide_ref = Guidance::new(&c_inner, &u_inner, ro.guidance, b, 1)?;
        for (j, k) in ro.window().enumerate() {
            let x_inner = select(&batch.states[k], rows);
            let x_next = Tensor::<B, 4>::from_inner(select(&batch.states[k + 1], rows));
            let old = Tensor::<B, 1>::from_inner(select(&batch.old_log_probs[j], rows));
            let adv: Vec<f32> = rows.iter().map(|&i| advantages[i][j] as f32).collect();
            let adv = Tensor::<B, 1>::from_data(TensorData::new(adv, [b]), &device);
            let sigma = schedule.sigmas[k] * 1000.0;
            let x = Tensor::<B, 4>::from_inner(x_inner.clone());
            let v = guide.velocity(&self.model, x.clone(), Tensor::full([b], sigma, &device))?;
            let step = gaussian_step(ro.sampler, x, v, &schedule, k, ro.noise_level)?;
            let (pg, s) =
                policy_loss(step.log_prob(x_next)?, old, adv, obj.clip_range, obj.adv_clip_max);
            let mut loss = pg.clone();
            if obj.kl_beta > 0.0 {
                let t_ref = Tensor::full([b], sigma, &x_inner.device());
                let v_ref = guide_ref.velocity(reference, x_inner.clone(), t_ref)?;
                let ref_step =
                    gaussian_step(ro.sampler, x_inner, v_ref, &schedule, k, ro.noise_level)?;
                let std = Tensor::full([b], step.std, &device);
                let kl = kl_penalty(step.mean.clone(), Tensor::from_inner(ref_step.mean), std);
                stats.kl.push(kl.clone().into_scalar().elem::<f64>());
                loss = loss + kl * obj.kl_beta;
            }
            stats.loss.push(pg.into_scalar().elem::<f64>());
            stats.ratio.push(s.ratio_mean);
            stats.above.push(s.clip_frac_above);
            stats.below.push(s.clip_frac_below);
            stats.approx_kl.push(s.approx_kl);
            let g = (loss * scale).backward();
            for (name, t) in self.model.lora_tensors() {
                if let Some(grad) = t.grad(&g) {
                    add_gradient(grads, name, grad);
                }
            }
            pb.inc(1);
        }
        Ok(())
    }

    /// Clips the summed gradients to the global norm, takes an AdamW step, writes the new
    /// factors into the model and updates the EMA; returns the norm before clipping.
    fn optimizer_step(
        &mut self,
        mut grads: BTreeMap<String, Tensor<B::InnerBackend, 2>>,
    ) -> Result<f64> {
        let params: Vec<(String, Tensor<B::InnerBackend, 2>)> =
            self.model.lora_tensors().into_iter().map(|(n, t)| (n, t.inner())).collect();
        // Factors with no gradient path (the last block's text queries) get zeros.
        for (name, p) in &params {
            grads.entry(name.clone()).or_insert_with(|| p.zeros_like());
        }
        let norm = clip_global_norm(&mut grads, self.config.max_grad_norm);
        let updated = self.optimizer.step(params, &grads)?;
        self.ema.update(self.optimizer.step, &updated)?;
        let lifted = updated.into_iter().map(|(n, t)| (n, Tensor::from_inner(t))).collect();
        self.model = self.model.clone().with_lora_tensors(lifted)?;
        Ok(norm)
    }

    /// The policy with the EMA adapters, on the inner backend.
    pub fn ema_model(&self) -> Result<MMDiT<B::InnerBackend>> {
        self.model.valid().with_lora_tensors(self.ema.tensors.clone())
    }

    /// Mean reward of `config.eval_steps`-step ODE samples (CFG, EMA weights,
    /// `eval_images_per_prompt` fixed seeds per prompt) on the held-out prompts, and the first
    /// image of each prompt.
    pub fn evaluate(&self) -> Result<(f64, Vec<Image>)> {
        let cfg = &self.config;
        let model = self.ema_model()?;
        let device = model.devices()[0].clone();
        let count = if cfg.eval_prompts == 0 {
            self.eval_prompts.len()
        } else {
            cfg.eval_prompts.min(self.eval_prompts.len())
        };
        let empty = self.pipeline.encode(&[""])?;
        let schedule = FlowSchedule::new(cfg.eval_steps, cfg.rollout.shift)?;
        let shape = self.pipeline.latent_shape();
        let chunk_size = cfg.rollout_batch * 4;
        let (mut scores, mut images) = (Vec::new(), Vec::new());
        for (c, chunk) in self.eval_prompts[..count].chunks(chunk_size).enumerate() {
            // Each chunk is encoded once and sampled with every image's seed: image `j` of
            // prompt `i` has the seed of item `j * count + i`.
            let cond = self.encode_prompts(chunk)?;
            let uncond = Self::uncond(&empty, chunk.len());
            for j in 0..cfg.eval_images_per_prompt {
                let seeds: Vec<u64> = (0..chunk.len())
                    .map(|i| mix(cfg.seed ^ 0xE7A1, (j * count + c * chunk_size + i) as u64))
                    .collect();
                let noise = seeded_noise(&seeds, 0, shape, &device);
                let (out, _) = ode_completions(
                    &model,
                    &schedule,
                    &[(0, noise)],
                    &cond,
                    &uncond,
                    cfg.rollout.guidance,
                )?;
                let imgs = self.pipeline.decode(out[0].clone())?;
                scores.extend(score_checked(self.reward.as_ref(), &imgs, chunk)?);
                if j == 0 {
                    images.extend(imgs);
                }
            }
        }
        Ok((mean(&scores), images))
    }

    /// Writes a checkpoint of the current state (see [`checkpoint`]) and returns its folder.
    pub fn save_checkpoint(&self) -> Result<PathBuf> {
        let state = TrainerState {
            epoch: self.epoch,
            optimizer_step: self.optimizer.step,
            config: self.config.clone(),
        };
        checkpoint::save(
            &self.out_dir,
            &state,
            &self.model.valid(),
            &self.ema,
            &self.optimizer,
            &self.config.lora,
        )
    }

    /// Restores the latest checkpoint of the output folder (its settings must equal these but
    /// for `epochs`) and drops metrics lines of later epochs.
    pub fn resume(&mut self) -> Result<()> {
        let dir = checkpoint::latest(&self.out_dir)?;
        let checkpoint::Checkpoint { state, lora, ema, moments } =
            checkpoint::load::<B::InnerBackend>(&dir, &self.model.devices()[0])?;
        let (mut a, mut b) = (
            serde_json::to_value(&state.config).expect("ser"),
            serde_json::to_value(&self.config).expect("ser"),
        );
        a["epochs"] = 0.into();
        b["epochs"] = 0.into();
        if a != b {
            return Err(Error::Checkpoint {
                path: dir,
                problems: vec![
                    "was written with other settings (only `epochs` may change on resume)".into(),
                ],
            });
        }
        self.model = self.model.clone().with_lora_tensors(
            lora.into_iter().map(|(n, t)| (n, Tensor::from_inner(t))).collect(),
        )?;
        // The file lists tensors by key; the EMA follows the model's order.
        let mut ema: BTreeMap<String, Tensor<B::InnerBackend, 2>> = ema.into_iter().collect();
        let order: Vec<String> = self.model.lora_tensors().into_iter().map(|(n, _)| n).collect();
        self.ema.tensors = order
            .into_iter()
            .map(|n| {
                let t = ema.remove(&n).ok_or_else(|| Error::Checkpoint {
                    path: dir.clone(),
                    problems: vec![format!("no EMA tensor for `{n}`")],
                })?;
                Ok((n, t))
            })
            .collect::<Result<_>>()?;
        self.optimizer.moments = moments;
        self.optimizer.step = state.optimizer_step;
        self.epoch = state.epoch;
        let path = self.out_dir.join("metrics.jsonl");
        let kept: Vec<EpochMetrics> =
            read_metrics(&path)?.into_iter().filter(|m| m.epoch <= self.epoch).collect();
        write_metrics(&path, &kept)
    }

    /// Runs epochs until `config.epochs`, evaluating, logging, plotting and checkpointing;
    /// `on_epoch` sees every metrics line.
    pub fn train(&mut self, mut on_epoch: impl FnMut(&EpochMetrics)) -> Result<Vec<EpochMetrics>> {
        let cfg = self.config.clone();
        std::fs::create_dir_all(&self.out_dir).map_err(|e| Error::io(&self.out_dir, e))?;
        let metrics_path = self.out_dir.join("metrics.jsonl");
        let mut history = read_metrics(&metrics_path)?;
        if self.epoch == 0 && cfg.eval_every > 0 {
            let (r, images) = self.evaluate()?;
            self.save_samples(0, &images)?;
            let start = EpochMetrics { eval_reward: Some(r), ..EpochMetrics::empty(0, &cfg) };
            on_epoch(&start);
            history = vec![start];
            write_metrics(&metrics_path, &history)?;
        }
        let epochs = bar(cfg.epochs, "epochs");
        epochs.set_position(self.epoch as u64);
        let inner = bar(1, "epoch");
        while self.epoch < cfg.epochs {
            let mut m = self.run_epoch(&inner)?;
            let last = self.epoch == cfg.epochs;
            if cfg.eval_every > 0 && (self.epoch % cfg.eval_every == 0 || last) {
                inner.set_message("evaluation");
                let (r, images) = self.evaluate()?;
                self.save_samples(self.epoch, &images)?;
                m.eval_reward = Some(r);
            }
            history.push(m.clone());
            write_metrics(&metrics_path, &history)?;
            if (cfg.save_every > 0 && self.epoch % cfg.save_every == 0) || last {
                self.save_checkpoint()?;
            }
            epochs.inc(1);
            epochs.set_message(format!("reward {:.3}", m.reward_mean));
            on_epoch(&m);
        }
        inner.finish_and_clear();
        epochs.finish_and_clear();
        self.save_curves(&history)?;
        Ok(history)
    }

    fn save_samples(&self, epoch: usize, images: &[Image]) -> Result<()> {
        let dir = self.out_dir.join("samples");
        let shown = &images[..images.len().min(64)];
        save_grid(&dir.join(format!("epoch-{epoch:05}.png")), shown, 8, 4)
    }

    fn save_curves(&self, history: &[EpochMetrics]) -> Result<()> {
        let train: Vec<(f64, f64)> = history
            .iter()
            .filter(|m| m.epoch > 0)
            .map(|m| (m.epoch as f64, m.reward_mean))
            .collect();
        let eval: Vec<(f64, f64)> =
            history.iter().filter_map(|m| m.eval_reward.map(|r| (m.epoch as f64, r))).collect();
        save_chart(
            &self.out_dir.join("reward_curve.png"),
            &[
                Series { color: [70, 110, 220], points: train },
                Series { color: [220, 80, 40], points: eval },
            ],
        )
    }
}

impl EpochMetrics {
    /// A line with nothing measured yet (epoch 0: the evaluation before training; its
    /// training fields are zero).
    pub fn empty(epoch: usize, config: &TrainConfig) -> Self {
        EpochMetrics {
            epoch,
            objective: config.objective.objective.name().into(),
            reward_mean: 0.0,
            reward_std: 0.0,
            eval_reward: None,
            turning_points: 0,
            turning_points_positive: 0,
            turning_points_negative: 0,
            turning_point_candidates: 0,
            step_reward_change: Vec::new(),
            samples_used: 0,
            samples_dropped: 0,
            ratio_mean: 0.0,
            clip_frac_above: 0.0,
            clip_frac_below: 0.0,
            approx_kl: 0.0,
            kl: 0.0,
            policy_loss: 0.0,
            grad_norm: 0.0,
            grad_signal_sq: None,
            grad_noise_trace: None,
            optimizer_steps: 0,
            nfe_per_sample: 0.0,
            seconds: 0.0,
        }
    }
}
