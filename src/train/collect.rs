//! The collection phase of an epoch: the epoch's prompts and sample order, rollouts with the
//! sampling policy, ODE completions of the trained steps' states (TP-GRPO), decoding and
//! rewards, gathered into a [`Batch`] whose reward rows say which objective they serve.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use burn::prelude::*;

use super::config::TrainConfig;
use super::metrics::{timed, PhaseSeconds};
use super::observe::{Observer, Phase};
use super::replica::Replica;
use crate::error::Result;
use crate::finite::{ensure_finite, ensure_finite_values};
use crate::grpo::{Objective, RewardRows};
use crate::model::Denoiser;
use crate::prompts::Prompt;
use crate::reward::{score_terms, Reward, Term};
use crate::rng::{mix, salt, SplitMix64};
use crate::sampler::{ode_completions, rollout, seeded_noise, Conditioning, Rollout, TextToImage};

/// One epoch's rollouts: the states and old log-probs of this replica's samples, and every
/// sample's rewards and prompt.
pub(crate) struct Batch<B: Backend> {
    /// The samples this replica drew (all of them on a single device); the tensors hold
    /// these rows, sample `rows.start` first.
    pub rows: Range<usize>,
    /// `states[k]`: `[S, C, H, W]` latent before scheduler step `k` (`k = 0..=N`).
    pub states: Vec<Tensor<B, 4>>,
    /// `old_log_probs[j]`: `[S]` log-prob of trained step `j` under the sampling policy.
    pub old_log_probs: Vec<Tensor<B, 1>>,
    /// The rewards, shaped by the objective (of this replica's rows until gathered).
    pub rewards: RewardRows,
    /// Index into the epoch's prompts of each sample.
    pub prompt_ids: Vec<usize>,
    /// Conditioning of the epoch's prompts.
    pub cond: Conditioning<B>,
    /// Conditioning of the empty prompt (one row).
    pub empty: Conditioning<B>,
    /// Transformer evaluations, summed over samples.
    pub nfe: usize,
    /// Each reward term's unweighted scores of the final images, in sample order.
    pub reward_terms: BTreeMap<String, Vec<f64>>,
    /// This replica's seconds in rollouts, completions and rewards.
    pub seconds: PhaseSeconds,
}

impl<B: Backend> Batch<B> {
    /// This replica's samples among `samples`, in their order.
    pub(crate) fn own(&self, samples: &[usize]) -> Vec<usize> {
        samples.iter().copied().filter(|i| self.rows.contains(i)).collect()
    }

    /// Gathers every replica's rewards, reward terms and evaluation counts, so that credit
    /// sees whole groups exactly as on a single device (the shares tile the samples in rank
    /// order); the states stay with the replica that drew them.
    pub(crate) fn gather(&mut self, replica: &Replica, device: &B::Device) -> Result<()> {
        let rewards = match &self.rewards {
            RewardRows::Finals(f) => {
                RewardRows::Finals(replica.all_gather::<B>(f, device)?.concat())
            }
            RewardRows::Sequences(rows) => {
                let width = rows.first().map_or(0, Vec::len);
                let flat = replica.all_gather::<B>(&rows.concat(), device)?.concat();
                RewardRows::Sequences(flat.chunks(width.max(1)).map(<[f64]>::to_vec).collect())
            }
        };
        self.rewards = rewards;
        for scores in self.reward_terms.values_mut() {
            *scores = replica.all_gather::<B>(scores, device)?.concat();
        }
        let nfe = replica.all_gather::<B>(&[self.nfe as f64], device)?;
        self.nfe = nfe.iter().map(|n| n[0] as usize).sum();
        Ok(())
    }
}

/// The `P` distinct prompts of epoch `epoch`: the first `P` of a seeded shuffle of the
/// training prompts.
pub(crate) fn epoch_prompts(train: &[Prompt], config: &TrainConfig, epoch: usize) -> Vec<Prompt> {
    let mut rng = SplitMix64(mix(config.seed, salt::EPOCH_PROMPTS + epoch as u64));
    let mut idx: Vec<usize> = (0..train.len()).collect();
    rng.shuffle(&mut idx);
    idx[..config.prompts_per_epoch].iter().map(|&i| train[i].clone()).collect()
}

/// The prompt of every sample of epoch `epoch`: each of the `P` prompts `G` times, shuffled
/// so that rollout and training micro-batches mix groups.
pub fn sample_order(config: &TrainConfig, epoch: usize) -> Vec<usize> {
    let total = config.prompts_per_epoch * config.group_size;
    let mut ids: Vec<usize> = (0..total).map(|i| i / config.group_size).collect();
    SplitMix64(mix(config.seed, salt::SAMPLE_ORDER + epoch as u64)).shuffle(&mut ids);
    ids
}

/// What collection reads: the settings, the sampling policy, the pipeline and the reward.
pub(crate) struct Collector<'a, B: Backend, P: TextToImage<B>> {
    /// The settings.
    pub config: &'a TrainConfig,
    /// The sampling policy (the adapted transformer on the inner backend).
    pub policy: &'a Denoiser<B>,
    /// Encoders and decoder.
    pub pipeline: &'a P,
    /// The reward.
    pub reward: &'a dyn Reward,
    /// Set to stop: read before each rollout chunk.
    pub stop: &'a AtomicBool,
}

/// One rollout chunk's samples: their seeds, prompts and guidance conditioning.
struct Chunk<B: Backend> {
    seeds: Vec<u64>,
    prompts: Vec<Prompt>,
    cond: Conditioning<B>,
    uncond: Conditioning<B>,
}

impl<B: Backend, P: TextToImage<B>> Collector<'_, B, P> {
    /// Rollouts of the samples `rows` of epoch `epoch` on `prompts` (of the
    /// [`sample_order`]), in chunks of `rollout_batch`, and their rewards; `None` when `stop` was
    /// set before a chunk (the epoch is abandoned: nothing it drew is kept).
    pub(crate) fn collect(
        &self,
        epoch: usize,
        prompts: &[Prompt],
        rows: Range<usize>,
        observer: &mut dyn Observer,
    ) -> Result<Option<Batch<B>>> {
        let cfg = self.config;
        let device = self.policy.devices()[0].clone();
        let mut seconds = PhaseSeconds::default();
        let texts: Vec<&str> = prompts.iter().map(|p| p.text.as_str()).collect();
        let (cond, empty) =
            timed::<B, _>(&mut seconds.rollout, &device, "prompt encoding", || {
                Ok((self.pipeline.encode(&texts)?, self.pipeline.encode(&[""])?))
            })?;
        let prompt_ids = sample_order(cfg, epoch);
        let mut states: Vec<Vec<Tensor<B, 4>>> = vec![Vec::new(); cfg.rollout.num_steps + 1];
        let mut old: Vec<Vec<Tensor<B, 1>>> = vec![Vec::new(); cfg.rollout.window().len()];
        let mut rewards = RewardRows::empty(cfg.objective.objective);
        let mut nfe = 0;
        let mut reward_terms: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        observer.phase(epoch, Phase::Rollouts, rows.len());
        for start in rows.clone().step_by(cfg.rollout_batch) {
            if self.stop.load(Ordering::Relaxed) {
                return Ok(None);
            }
            let chunk_rows: Vec<usize> =
                (start..(start + cfg.rollout_batch).min(rows.end)).collect();
            let ids: Vec<usize> = chunk_rows.iter().map(|&i| prompt_ids[i]).collect();
            let chunk = Chunk {
                seeds: chunk_rows
                    .iter()
                    .map(|&i| mix(mix(cfg.seed, epoch as u64), i as u64))
                    .collect(),
                prompts: ids.iter().map(|&i| prompts[i].clone()).collect(),
                cond: cond.select(&ids),
                uncond: empty.select(&vec![0; chunk_rows.len()]),
            };
            let (r, chunk_rewards, terms, chunk_nfe) = self.sample_chunk(&chunk, &mut seconds)?;
            rewards.extend(chunk_rewards)?;
            for term in terms {
                reward_terms.entry(term.name).or_default().extend(term.scores);
            }
            nfe += chunk_nfe;
            for (k, latent) in r.latents.into_iter().enumerate() {
                states[k].push(latent);
            }
            for (j, lp) in r.log_probs.into_iter().enumerate() {
                old[j].push(lp);
            }
            observer.advance(chunk_rows.len());
        }
        Ok(Some(Batch {
            rows,
            states: states.into_iter().map(|s| Tensor::cat(s, 0)).collect(),
            old_log_probs: old.into_iter().map(|s| Tensor::cat(s, 0)).collect(),
            rewards,
            prompt_ids,
            cond,
            empty,
            nfe,
            reward_terms,
            seconds,
        }))
    }

    /// One chunk's rollout, its reward rows, the reward terms of its final images and its
    /// transformer evaluations (summed over samples), adding each phase's time to `seconds`.
    fn sample_chunk(
        &self,
        chunk: &Chunk<B>,
        seconds: &mut PhaseSeconds,
    ) -> Result<(Rollout<B>, RewardRows, Vec<Term>, usize)> {
        let cfg = self.config;
        let device = self.policy.devices()[0].clone();
        let shape = self.pipeline.latent_shape();
        let (c, u) = (&chunk.cond, &chunk.uncond);
        let r = timed::<B, _>(&mut seconds.rollout, &device, "rollouts", || {
            rollout(self.policy, &cfg.rollout, &chunk.seeds, shape, c, u, &device)
        })?;
        let b = chunk.seeds.len();
        let (finals, terms) = timed::<B, _>(&mut seconds.reward, &device, "rewards", || {
            self.score(r.latents[cfg.rollout.num_steps].clone(), &chunk.prompts)
        })?;
        let mut nfe = r.nfe * b;
        let rows = match cfg.objective.objective {
            Objective::FlowGrpo => RewardRows::Finals(finals),
            Objective::TpGrpo => {
                let (mut seqs, extra) = self.completion_rewards(&r, chunk, seconds)?;
                nfe += extra * b;
                for (s, v) in seqs.iter_mut().zip(finals) {
                    s.push(v);
                }
                RewardRows::Sequences(seqs)
            }
        };
        Ok((r, rows, terms, nfe))
    }

    /// `[R_ode, R_1, .., R_{n-1}]` of each sample: rewards of the ODE completions of the state
    /// before each trained step (the pure-ODE sample from fresh noise with `fresh_ode_noise`),
    /// and the completions' evaluations per sample.
    fn completion_rewards(
        &self,
        r: &Rollout<B>,
        chunk: &Chunk<B>,
        seconds: &mut PhaseSeconds,
    ) -> Result<(Vec<Vec<f64>>, usize)> {
        let cfg = self.config;
        let window = cfg.rollout.window();
        let device = r.latents[0].device();
        let mut starts: Vec<(usize, Tensor<B, 4>)> =
            window.clone().map(|k| (k, r.latents[k].clone())).collect();
        if cfg.objective.fresh_ode_noise {
            let fresh: Vec<u64> =
                chunk.seeds.iter().map(|&s| mix(s, salt::FRESH_ODE_NOISE)).collect();
            starts[0] = (0, seeded_noise(&fresh, 0, self.pipeline.latent_shape(), &device));
        }
        let (c, u, g) = (&chunk.cond, &chunk.uncond, cfg.rollout.guidance);
        let (done, extra) =
            timed::<B, _>(&mut seconds.completions, &device, "completions", || {
                ode_completions(self.policy, &r.schedule, &starts, c, u, g)
            })?;
        let mut seqs: Vec<Vec<f64>> = vec![Vec::with_capacity(window.len() + 1); chunk.seeds.len()];
        for latent in done {
            let (scores, _) = timed::<B, _>(&mut seconds.reward, &device, "rewards", || {
                self.score(latent, &chunk.prompts)
            })?;
            for (s, v) in seqs.iter_mut().zip(scores) {
                s.push(v);
            }
        }
        Ok((seqs, extra))
    }

    /// Decodes latents and scores the images against their prompts (totals and terms);
    /// non-finite latents or images stop the run (a NaN image would otherwise get a finite
    /// score).
    fn score(&self, latents: Tensor<B, 4>, prompts: &[Prompt]) -> Result<(Vec<f64>, Vec<Term>)> {
        ensure_finite(&latents, "sampled latents (before decoding)")?;
        let images = self.pipeline.decode(latents)?;
        for (i, image) in images.iter().enumerate() {
            ensure_finite_values(&image.pixels, &format!("decoded image {i} of the chunk"))?;
        }
        score_terms(self.reward, &images, prompts)
    }
}
