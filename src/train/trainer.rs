//! The trainer: the epoch loop over the phases (collection, credit, update), evaluation,
//! metrics, PNGs, checkpoints and resume.

use crate::model::Adaptable;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

use super::checkpoint::{self, RunRecord, TrainerState};
use super::collect::{epoch_prompts, Batch, Collector};
use super::config::TrainConfig;
use super::ema::Ema;
use super::evaluate::{Evaluation, Evaluator};
use super::metrics::{append_metrics, read_metrics, timed, wall_time, write_metrics, EpochMetrics};
use super::noise_scale::GradientNoise;
use super::observe::{Observer, Phase};
use super::optim::AdamW;
use super::plot::captioned_grid_png;
use super::replica::Replica;
use super::run_dir;
use super::tensorboard::EventWriter;
use super::update::{
    complete, micro_batches, optimizer_step, Gradients, StepGradient, StepLosses, UpdateStats,
};
use crate::error::{Error, Result};
use crate::finite::no_overflow;
use crate::grpo::{assign_credit, EpochCredit, LossStats};
use crate::image::write_png_bytes;

use crate::model::precision::cast_params;
use crate::model::Denoiser;
use crate::prompts::Prompt;
use crate::reward::{Report, Reward};
use crate::rng::{mix, salt, SplitMix64};
use crate::sampler::TextToImage;

/// What a run trains for: the pipeline around the transformer, the reward, and the training
/// and held-out prompts.
pub struct Task<P> {
    /// Encoders and decoder.
    pub pipeline: P,
    /// The reward.
    pub reward: Box<dyn Reward>,
    /// Training prompts.
    pub train_prompts: Vec<Prompt>,
    /// Held-out prompts.
    pub eval_prompts: Vec<Prompt>,
    /// Measured on the held-out images at every evaluation beside the reward.
    pub report: Option<Box<dyn Report>>,
}

/// The trainer: a LoRA-adapted transformer, its optimizer and EMA, and the task it trains for.
pub struct Trainer<B: AutodiffBackend, P: TextToImage<B::InnerBackend>> {
    config: TrainConfig,
    /// The policy: the base transformer with trainable adapters.
    model: Denoiser<B>,
    task: Task<P>,
    /// AdamW over the adapter factors.
    optimizer: AdamW<B::InnerBackend>,
    /// EMA of the adapter factors.
    ema: Ema<B::InnerBackend>,
    /// Epochs completed.
    epoch: usize,
    /// Output folder (metrics, images, checkpoints).
    out_dir: PathBuf,
    /// This trainer's replica of a data-parallel run ([`Replica::SINGLE`] by default).
    replica: Replica,
    /// Whether [`Trainer::resume`] accepts another reward or prompt set than the checkpoint's.
    allow_task_change: bool,
    /// Set to stop the run ([`Trainer::stopping_on`]).
    stop: Arc<AtomicBool>,
    /// Whether the state came from a checkpoint (the output folder holds this run).
    resumed: bool,
}

/// SHA-256 (hex) of the prompts, each as its JSON (text and metadata), training then held-out.
fn prompts_digest(train: &[Prompt], eval: &[Prompt]) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for (split, prompts) in [("train", train), ("eval", eval)] {
        hash.update(split.as_bytes());
        for p in prompts {
            hash.update(serde_json::to_vec(p).expect("prompts serialise"));
            hash.update(b"\n");
        }
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Every replica's micro-batches of an optimizer step as `(rows, |micro-batch mean gradient|^2)`.
type MicroNorms = Vec<(usize, f64)>;

/// Population mean and standard deviation of `what` (0, 0 for none); an error naming `what`
/// when either overflows f64.
fn mean_std(values: &[f64], what: &str) -> Result<(f64, f64)> {
    let n = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n;
    let mean = no_overflow(mean, "reward", || format!("the mean of {what}"))?;
    Ok((mean, no_overflow(var.sqrt(), "reward", || format!("the deviation of {what}"))?))
}

impl<B: AutodiffBackend, P: TextToImage<B::InnerBackend>> Trainer<B, P> {
    /// A trainer of `base` (an [`MMDiT`](crate::model::MMDiT), a [`Flux`](crate::model::Flux)
    /// or a [`Denoiser`]; adapters are attached here, per `config.lora`) for `task`, writing to
    /// `out_dir`.
    pub fn new(
        config: TrainConfig,
        base: impl Into<Denoiser<B>>,
        task: Task<P>,
        out_dir: impl AsRef<Path>,
    ) -> Result<Self> {
        config.validate()?;
        if task.train_prompts.len() < config.prompts_per_epoch {
            return Err(Error::config(
                "prompts_per_epoch",
                format!(
                    "{} distinct prompts per epoch, {} available",
                    config.prompts_per_epoch,
                    task.train_prompts.len()
                ),
            ));
        }
        for (split, prompts) in
            [("training", &task.train_prompts), ("held-out", &task.eval_prompts)]
        {
            for (i, prompt) in prompts.iter().enumerate() {
                task.reward.check_prompt(prompt).map_err(|e| {
                    Error::config("prompts", format!("{split} prompt {}: {e}", i + 1))
                })?;
            }
        }
        if config.eval_every > 0 && task.eval_prompts.is_empty() {
            return Err(Error::config("eval_every", "evaluation needs held-out prompts"));
        }
        let base = base.into();
        config.footprint(task.pipeline.latent_shape(), &base)?;
        let dtype = config.precision.resolve::<B>(&base.devices()[0])?;
        let model = cast_params(base, dtype).with_lora(&config.lora)?;
        let params: Vec<_> =
            model.lora_tensors().into_iter().map(|(n, t)| (n, t.inner())).collect();
        Ok(Trainer {
            optimizer: AdamW::new(config.optimizer.clone()),
            ema: Ema::new(config.ema.clone(), params),
            config,
            model,
            task,
            epoch: 0,
            out_dir: out_dir.as_ref().to_path_buf(),
            replica: Replica::SINGLE,
            allow_task_change: false,
            stop: Arc::new(AtomicBool::new(false)),
            resumed: false,
        })
    }

    /// The settings.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// The policy: the base transformer with its trainable adapters.
    pub fn model(&self) -> &Denoiser<B> {
        &self.model
    }

    /// What the run trains for.
    pub fn task(&self) -> &Task<P> {
        &self.task
    }

    /// The EMA of the adapter factors, by adapter name.
    pub fn ema_tensors(&self) -> &[(String, Tensor<B::InnerBackend, 2>)] {
        &self.ema.tensors
    }

    /// Epochs completed.
    pub fn epoch(&self) -> usize {
        self.epoch
    }

    /// The output folder (metrics, images, checkpoints).
    pub fn out_dir(&self) -> &Path {
        &self.out_dir
    }

    /// This trainer, resuming (see [`Trainer::resume`]) even when the checkpoint was trained
    /// with another reward or prompt set: the user's explicit choice, as the command line's
    /// `--allow-task-change`.
    pub fn allowing_task_change(mut self) -> Self {
        self.allow_task_change = true;
        self
    }

    /// This trainer, stopping when `stop` is set (by a signal handler, say): before the next
    /// rollout chunk, abandoning the epoch's rollouts (nothing has changed yet), or, once the
    /// epoch's updates have begun, when they end (skipping that epoch's evaluation, which is
    /// also cut short by a stop). It then writes a checkpoint of the last completed epoch and
    /// returns [`Error::Stopped`]; resuming from that checkpoint gives the run an uninterrupted
    /// one would have. Replicas of a data-parallel run agree before stopping (give every replica
    /// the same flag).
    pub fn stopping_on(mut self, stop: Arc<AtomicBool>) -> Self {
        self.stop = stop;
        self
    }

    /// Optimizer steps taken.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn optimizer_step(&self) -> u64 {
        self.optimizer.step
    }

    /// This trainer as replica `replica` of a data-parallel run (see [`super::parallel`]).
    pub fn with_replica(mut self, replica: Replica) -> Self {
        self.replica = replica;
        self
    }

    /// Refuses, naming the settings, a run whose largest tensors ([`TrainConfig::footprint`],
    /// at the base weights' dtype) cannot fit in `memory` bytes of the training device
    /// ([`crate::backend::memory`] for the selected backend).
    pub fn check_memory(&self, memory: Option<u64>) -> Result<()> {
        let dtype = self.config.precision.resolve::<B>(&self.model.devices()[0])?;
        let latent = self.task.pipeline.latent_shape();
        self.config.check_memory(
            latent,
            &self.model,
            burn::tensor::DType::from(dtype).size(),
            memory,
        )
    }

    /// Runs one epoch: collection, credit, update; returns its metrics (without evaluation).
    pub fn run_epoch(&mut self, observer: &mut dyn Observer) -> Result<EpochMetrics> {
        match self.try_epoch(observer)? {
            Some(metrics) => Ok(metrics),
            None => Err(self.stop_here()?),
        }
    }

    /// [`Trainer::run_epoch`], or `None` when a replica was asked to stop during the rollouts
    /// (every replica abandons the epoch; nothing has changed).
    fn try_epoch(&mut self, observer: &mut dyn Observer) -> Result<Option<EpochMetrics>> {
        let started = Instant::now();
        let epoch = self.epoch + 1;
        let batch = self.collect(epoch, observer)?;
        let device = self.model.devices()[0].clone();
        if self.replica.any::<B::InnerBackend>(batch.is_none(), &device)? {
            return Ok(None);
        }
        let mut batch = batch.expect("collected: no replica stopped");
        let mut seconds = batch.seconds;
        let (credit, updates) =
            timed::<B::InnerBackend, _>(&mut seconds.update, &device, "update", || {
                let credit = self.credit(&mut batch)?;
                let updates = self.update(&batch, &credit, epoch, observer)?;
                Ok((credit, updates))
            })?;
        let total = batch.rewards.len();
        self.epoch = epoch;
        let (reward_mean, reward_std) = mean_std(&batch.rewards.finals(), "the epoch's rewards")?;
        let mut reward_terms = BTreeMap::new();
        for (name, scores) in &batch.reward_terms {
            let (mean, _) = mean_std(scores, &format!("the epoch's `{name}` scores"))?;
            reward_terms.insert(name.clone(), mean);
        }
        let noise = GradientNoise::mean(&updates.noise);
        Ok(Some(EpochMetrics {
            epoch,
            objective: self.config.objective.objective.name().into(),
            reward_mean,
            reward_std,
            reward_terms,
            credit: credit.stats,
            loss: LossStats::mean(&updates.loss),
            grad_norm: updates.grad_norm.iter().sum::<f64>()
                / updates.grad_norm.len().max(1) as f64,
            grad_signal_sq: noise.map(|e| e.signal_sq),
            grad_noise_trace: noise.map(|e| e.noise_trace),
            optimizer_steps: self.optimizer.step,
            nfe_per_sample: batch.nfe as f64 / total as f64,
            seconds: started.elapsed().as_secs_f64(),
            phase_seconds: seconds,
            ..EpochMetrics::default()
        }))
    }

    /// Whether any replica was asked to stop (every replica gets the same answer).
    fn stop_agreed(&self) -> Result<bool> {
        let device = self.model.devices()[0].clone();
        self.replica.any::<B::InnerBackend>(self.stop.load(Ordering::Relaxed), &device)
    }

    /// The checkpoint of the last completed epoch (the lead writes it unless it is the latest
    /// already) as the [`Error::Stopped`] that ends the run.
    fn stop_here(&self) -> Result<Error> {
        let written = checkpoint::latest(&self.out_dir).ok();
        let dir = checkpoint::dir_of(&self.out_dir, self.epoch);
        let current = written.as_ref().is_some_and(|d| d == &dir);
        if self.replica.is_lead() && !current {
            self.save_checkpoint()?;
        }
        Ok(Error::Stopped { epoch: self.epoch, checkpoint: dir })
    }

    /// The collection phase: rollouts of this replica's share of epoch `epoch` with the
    /// current policy, and their rewards.
    pub(super) fn collect(
        &self,
        epoch: usize,
        observer: &mut dyn Observer,
    ) -> Result<Option<Batch<B::InnerBackend>>> {
        let policy = self.model.valid();
        let prompts = epoch_prompts(&self.task.train_prompts, &self.config, epoch);
        let collector = Collector {
            config: &self.config,
            policy: &policy,
            pipeline: &self.task.pipeline,
            reward: self.task.reward.as_ref(),
            stop: &self.stop,
        };
        let rows = self.replica.share(self.config.prompts_per_epoch * self.config.group_size);
        collector.collect(epoch, &prompts, rows, observer)
    }

    /// The credit phase: every replica's rewards gathered into `batch`, then the epoch's
    /// credit from them.
    pub(super) fn credit(&self, batch: &mut Batch<B::InnerBackend>) -> Result<EpochCredit> {
        batch.gather(&self.replica, &batch.states[0].device())?;
        let (objective, steps) = (&self.config.objective, self.config.rollout.window().len());
        assign_credit(&batch.rewards, &batch.prompt_ids, objective, steps)
    }

    /// The update phase: one optimizer step per part of [`Trainer::step_samples`], on the
    /// gradient of [`Trainer::step_gradient`] (the same on every replica); every replica
    /// clips, steps AdamW and updates the EMA alike.
    pub(super) fn update(
        &mut self,
        batch: &Batch<B::InnerBackend>,
        credit: &EpochCredit,
        epoch: usize,
        observer: &mut dyn Observer,
    ) -> Result<UpdateStats> {
        let cfg = self.config.clone();
        let steps = self.step_samples(credit, epoch);
        let parts: usize =
            steps.iter().map(|s| micro_batches(&batch.own(s), cfg.train_batch).len()).sum();
        observer.phase(epoch, Phase::Updates, parts * cfg.rollout.window().len());
        let losses = StepLosses::new(&cfg, batch, &credit.advantages, &self.model)?;
        let mut stats = UpdateStats::default();
        for samples in &steps {
            let (grads, micro) = self.step_gradient(&losses, samples, &mut stats.loss, observer)?;
            let (model, norm) = optimizer_step(
                self.model.clone(),
                &mut self.optimizer,
                &mut self.ema,
                grads,
                cfg.max_grad_norm,
            )?;
            self.model = model;
            stats.noise.extend(GradientNoise::estimate(&micro, norm * norm));
            stats.grad_norm.push(norm);
        }
        stats.loss = self.gather_losses(&stats.loss, &batch.states[0].device())?;
        Ok(stats)
    }

    /// The samples of each optimizer step of epoch `epoch`, all replicas' together: the
    /// informative samples in a seeded order, split evenly over `optimizer_steps_per_epoch`
    /// steps (fewer when there are fewer samples).
    pub(super) fn step_samples(&self, credit: &EpochCredit, epoch: usize) -> Vec<Vec<usize>> {
        let cfg = &self.config;
        let mut order = credit.informative.clone();
        SplitMix64(mix(cfg.seed, salt::UPDATE_ORDER + epoch as u64)).shuffle(&mut order);
        let steps = cfg.optimizer_steps_per_epoch.min(order.len().max(1));
        order.chunks(order.len().div_ceil(steps).max(1)).map(<[usize]>::to_vec).collect()
    }

    /// The gradient of one optimizer step over `samples` (all replicas' samples of the step):
    ///
    /// ```text
    /// G = sum_{i in samples} grad loss_i / (|samples| n)
    /// ```
    ///
    /// with `loss_i` summed over the `n` trained steps. Each replica sums the terms of its own
    /// samples, micro-batch by micro-batch, and the replicas' sums are added up (all-reduce),
    /// so every replica returns the same `G`; with it, every replica's micro-batches as
    /// `(rows, |micro-batch mean|^2)` for the noise estimate. The micro-batches' loss
    /// statistics are appended to `loss`.
    pub(super) fn step_gradient(
        &self,
        losses: &StepLosses<'_, B>,
        samples: &[usize],
        loss: &mut Vec<(usize, LossStats)>,
        observer: &mut dyn Observer,
    ) -> Result<(Gradients<B::InnerBackend>, MicroNorms)> {
        let n = self.config.rollout.window().len();
        let own = losses.batch.own(samples);
        let mut step = StepGradient::new(samples.len());
        for rows in micro_batches(&own, self.config.train_batch) {
            let scale = rows.len() as f64 / (samples.len() * n) as f64;
            let (share, stats) = losses.gradients(&self.model, rows, scale, observer)?;
            step.add(rows.len(), share);
            loss.extend(stats.into_iter().map(|s| (rows.len(), s)));
        }
        let grads = self.replica.all_reduce(complete(&self.model, step.grads))?;
        let device = losses.batch.states[0].device();
        let flat: Vec<f64> = step.micro_sq.iter().flat_map(|&(b, sq)| [b as f64, sq]).collect();
        let micro = self.replica.all_gather::<B::InnerBackend>(&flat, &device)?.concat();
        Ok((grads, micro.chunks(2).map(|p| (p[0] as usize, p[1])).collect()))
    }

    /// Every replica's loss statistics with their sample counts, in rank order.
    fn gather_losses(
        &self,
        local: &[(usize, LossStats)],
        device: &burn::tensor::Device<B::InnerBackend>,
    ) -> Result<Vec<(usize, LossStats)>> {
        let flat: Vec<f64> = local
            .iter()
            .flat_map(|(b, s)| {
                [
                    *b as f64,
                    s.ratio_mean,
                    s.clip_frac_above,
                    s.clip_frac_below,
                    s.approx_kl,
                    s.kl,
                    s.policy_loss,
                ]
            })
            .collect();
        let all = self.replica.all_gather::<B::InnerBackend>(&flat, device)?.concat();
        Ok(all
            .chunks(7)
            .map(|v| {
                let stats = LossStats {
                    ratio_mean: v[1],
                    clip_frac_above: v[2],
                    clip_frac_below: v[3],
                    approx_kl: v[4],
                    kl: v[5],
                    policy_loss: v[6],
                };
                (v[0] as usize, stats)
            })
            .collect())
    }

    /// The policy with the EMA adapters, on the inner backend.
    pub fn ema_model(&self) -> Result<Denoiser<B::InnerBackend>> {
        self.model.valid().with_lora_tensors(self.ema.tensors.clone())
    }

    /// The held-out evaluation with the EMA adapters (`eval_prompts` of the held-out prompts,
    /// 0: all).
    pub fn evaluate(&self) -> Result<Evaluation> {
        let never = AtomicBool::new(false);
        Ok(self.evaluate_unless(&never)?.expect("never stopped"))
    }

    /// [`Trainer::evaluate`], or `None` when `stop` is set before a chunk.
    fn evaluate_unless(&self, stop: &AtomicBool) -> Result<Option<Evaluation>> {
        let cfg = &self.config;
        let model = self.ema_model()?;
        let count = match cfg.eval_prompts {
            0 => self.task.eval_prompts.len(),
            n => n.min(self.task.eval_prompts.len()),
        };
        let evaluator = Evaluator {
            config: cfg,
            model: &model,
            pipeline: &self.task.pipeline,
            reward: self.task.reward.as_ref(),
            report: self.task.report.as_deref(),
            stop,
        };
        evaluator.evaluate(&self.task.eval_prompts[..count])
    }

    /// What the run trains on besides its settings: the transformer's configuration and the
    /// latent shape (the resolution).
    pub(crate) fn run_record(&self) -> RunRecord {
        RunRecord {
            transformer: self.model.config_json(),
            latent_shape: self.task.pipeline.latent_shape().to_vec(),
            reward: Some(self.task.reward.identity()),
            prompts: Some(prompts_digest(&self.task.train_prompts, &self.task.eval_prompts)),
        }
    }

    /// Writes a checkpoint of the current state (see [`checkpoint`]) and returns its folder.
    pub fn save_checkpoint(&self) -> Result<PathBuf> {
        let state = TrainerState {
            epoch: self.epoch,
            optimizer_step: self.optimizer.step,
            config: self.config.clone(),
            run: Some(self.run_record()),
        };
        let dir = checkpoint::save(
            &self.out_dir,
            &state,
            &self.model.valid(),
            &self.ema,
            &self.optimizer,
        )?;
        if self.config.keep_checkpoints > 0 {
            checkpoint::prune(&self.out_dir, &dir, self.config.keep_checkpoints)?;
        }
        Ok(dir)
    }

    /// Restores the latest checkpoint of the output folder (its settings must equal these but
    /// for the [resumable ones](TrainConfig::resume_conflicts)) and drops metrics lines of
    /// later epochs.
    pub fn resume(&mut self) -> Result<()> {
        self.resume_from(checkpoint::latest(&self.out_dir)?)
    }

    /// [`Trainer::resume`] from the checkpoint folder `dir` (any `checkpoints/epoch-NNNNN`,
    /// also of another run folder of the same task); later checkpoints of this run's folder are
    /// replaced as the run reaches them.
    pub fn resume_from(&mut self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = checkpoint::check_dir(dir.as_ref())?;
        let checkpoint::Checkpoint { state, lora, ema, moments } =
            checkpoint::load::<B::InnerBackend>(&dir, &self.model.devices()[0])?;
        let mut problems = self.config.resume_conflicts(&state.config);
        let run = self.run_record();
        if let Some(saved) = &state.run {
            if (&saved.transformer, &saved.latent_shape) != (&run.transformer, &run.latent_shape) {
                problems.push(format!(
                    "was trained on another model or resolution ({saved}), not this one ({run})"
                ));
            }
            let task_changes =
                [("reward", &saved.reward, &run.reward), ("prompts", &saved.prompts, &run.prompts)];
            for (what, before, now) in task_changes {
                let changed = before.as_ref().is_some_and(|b| Some(b) != now.as_ref());
                if changed && !self.allow_task_change {
                    problems.push(format!(
                        "{what} was {}, now {} (allow it with `--allow-task-change`, \
                         `Trainer::allowing_task_change`)",
                        before.as_deref().unwrap_or_default(),
                        now.as_deref().unwrap_or_default()
                    ));
                }
            }
        }
        if !problems.is_empty() {
            problems.push(format!(
                "an exact resume allows changes to {} only",
                super::config::RESUMABLE_CHANGES.join(", ")
            ));
            return Err(Error::Checkpoint { path: dir, problems });
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
        self.resumed = true;
        if !self.replica.is_lead() {
            return Ok(());
        }
        let path = self.out_dir.join("metrics.jsonl");
        let kept: Vec<EpochMetrics> =
            read_metrics(&path)?.into_iter().filter(|m| m.epoch <= self.epoch).collect();
        write_metrics(&path, &kept)
    }

    /// Runs epochs until `config.epochs`, evaluating, logging and checkpointing; `observer`
    /// sees each phase and every metrics line. Of a data-parallel run's replicas only the lead
    /// evaluates and writes; the others train alongside.
    pub fn train(&mut self, observer: &mut dyn Observer) -> Result<Vec<EpochMetrics>> {
        let cfg = self.config.clone();
        let lead = self.replica.is_lead();
        let resumed = self.resumed || self.epoch > 0;
        let start = if resumed { run_dir::Start::Resume } else { run_dir::Start::Fresh };
        let metrics_path = self.out_dir.join("metrics.jsonl");
        let mut history = Vec::new();
        // The lead holds the output folder for the whole run (shared with a claim the program
        // already holds).
        let _claim = lead.then(|| run_dir::claim(&self.out_dir, start)).transpose()?;
        if lead {
            history = read_metrics(&metrics_path)?;
        }
        let mut events = match lead && cfg.tensorboard {
            true => Some(EventWriter::create(
                &self.out_dir.join("tensorboard"),
                resumed.then_some(self.epoch),
            )?),
            false => None,
        };
        // (A run stopped before its first epoch ended resumes with its first evaluation done.)
        let evaluated = history.iter().any(|m| m.epoch == 0);
        if lead && self.epoch == 0 && cfg.eval_every > 0 && !evaluated {
            observer.phase(0, Phase::Evaluation, 0);
            let Some(eval) = self.evaluate_unless(&self.stop)? else {
                return Err(self.stop_here()?);
            };
            let grid = self.save_samples(0, &eval)?;
            let start = EpochMetrics {
                objective: cfg.objective.objective.name().into(),
                eval_reward: Some(eval.reward),
                eval_report: eval.report,
                wall_time: wall_time(),
                ..EpochMetrics::default()
            };
            append_metrics(&metrics_path, &start)?;
            if let Some(events) = events.as_mut() {
                events.epoch(&start, Some(&grid))?;
            }
            history = vec![start];
            observer.epoch(&history[0], &history)?;
        }
        while self.epoch < cfg.epochs {
            let Some(mut m) = self.try_epoch(observer)? else {
                return Err(self.stop_here()?);
            };
            let last = self.epoch == cfg.epochs;
            let mut grid = None;
            if lead && cfg.eval_every > 0 && (self.epoch.is_multiple_of(cfg.eval_every) || last) {
                observer.phase(self.epoch, Phase::Evaluation, 0);
                // Stopped during the evaluation: the epoch is logged without it.
                if let Some(eval) = self.evaluate_unless(&self.stop)? {
                    grid = Some(self.save_samples(self.epoch, &eval)?);
                    (m.eval_reward, m.eval_report) = (Some(eval.reward), eval.report);
                }
            }
            m.wall_time = wall_time();
            if lead {
                append_metrics(&metrics_path, &m)?;
                if let Some(events) = events.as_mut() {
                    events.epoch(&m, grid.as_deref())?;
                }
                if (cfg.save_every > 0 && self.epoch.is_multiple_of(cfg.save_every)) || last {
                    self.save_checkpoint()?;
                }
            }
            history.push(m);
            if let Some(m) = history.last() {
                observer.epoch(m, &history)?;
            }
            if self.stop_agreed()? {
                return Err(self.stop_here()?);
            }
        }
        Ok(history)
    }

    /// `samples/epoch-NNNNN.png`: the first 64 held-out prompts' first images, each captioned
    /// with its prompt and reward; returns the PNG's bytes.
    fn save_samples(&self, epoch: usize, eval: &Evaluation) -> Result<Vec<u8>> {
        let shown = eval.images.len().min(64);
        let captions: Vec<(String, f64)> = self.task.eval_prompts[..shown]
            .iter()
            .zip(&eval.image_rewards)
            .map(|(p, &r)| (p.text.clone(), r))
            .collect();
        let path = self.out_dir.join("samples").join(format!("epoch-{epoch:05}.png"));
        let png = captioned_grid_png(&path, &eval.images[..shown], &captions, 8, 4)?;
        write_png_bytes(&png, &path)?;
        Ok(png)
    }
}
