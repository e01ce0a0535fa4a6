//! The trainer's configuration: reference defaults, a JSON file and `key.path=value`
//! overrides, every invalid value rejected with its field's name.

use std::path::Path;

use burn::prelude::*;
use serde_json::Value;

use super::ema::EmaConfig;
use super::optim::AdamWConfig;
use crate::grpo::ObjectiveConfig;
use crate::model::{Denoiser, LoraConfig, Precision};
use crate::overrides;
use crate::sampler::{DynamicShift, RolloutConfig};

/// Everything a training run needs besides the model, prompts and reward (defaults: the
/// TP-GRPO SD3.5-medium launch scripts, for one process).
#[derive(Config, Debug, PartialEq)]
pub struct TrainConfig {
    /// Epochs to run (an epoch: sample, credit, update).
    #[config(default = 100)]
    pub epochs: usize,
    /// Distinct prompts per epoch.
    #[config(default = 48)]
    pub prompts_per_epoch: usize,
    /// Samples per prompt (the group of the advantages).
    #[config(default = 24)]
    pub group_size: usize,
    /// Samples per rollout forward pass.
    #[config(default = 8)]
    pub rollout_batch: usize,
    /// Samples per training micro-batch.
    #[config(default = 8)]
    pub train_batch: usize,
    /// Optimizer steps per epoch; the epoch's samples are split evenly between them.
    #[config(default = 2)]
    pub optimizer_steps_per_epoch: usize,
    /// Global gradient-norm limit.
    #[config(default = 1.0)]
    pub max_grad_norm: f64,
    /// Evaluate every this many epochs (and before the first and after the last); 0: never.
    #[config(default = 10)]
    pub eval_every: usize,
    /// ODE steps of the evaluation samples.
    #[config(default = 40)]
    pub eval_steps: usize,
    /// Held-out prompts evaluated (the first ones of the split); 0: all.
    #[config(default = 0)]
    pub eval_prompts: usize,
    /// Evaluation images per held-out prompt, each from its own fixed seed (GenEval draws 4).
    #[config(default = 1)]
    pub eval_images_per_prompt: usize,
    /// Write a checkpoint every this many epochs (and after the last); 0: only at the end.
    #[config(default = 10)]
    pub save_every: usize,
    /// Checkpoints kept: after each save the oldest complete ones beyond this many are removed
    /// (never the one just written, which `latest` names); 0 keeps every checkpoint.
    #[config(default = 0)]
    pub keep_checkpoints: usize,
    /// Write TensorBoard event files (`tensorboard/` in the output folder): every metric per
    /// epoch and the held-out grid.
    #[config(default = false)]
    pub tensorboard: bool,
    /// Seed of prompt choice and every noise draw.
    #[config(default = 0)]
    pub seed: u64,
    /// Devices of this process, one data-parallel replica on each ([`super::parallel`]); the
    /// run's replicas are this times the nodes. The result does not depend on it beyond float
    /// summation order.
    #[config(default = 1)]
    pub devices: usize,
    /// Dtype of the frozen base weights and the activations: `auto` (bf16 where the backend
    /// computes it, else f32), `f32` or `bf16`; adapters, gradients, optimizer state, EMA,
    /// log-probs and the loss are f32 in every case.
    #[config(default = "Precision::Auto")]
    pub precision: Precision,
    /// Sampler of the rollouts.
    #[config(default = "RolloutConfig::new()")]
    pub rollout: RolloutConfig,
    /// TP-GRPO or Flow-GRPO objective.
    #[config(default = "ObjectiveConfig::new()")]
    pub objective: ObjectiveConfig,
    /// LoRA adapters.
    #[config(default = "LoraConfig::new()")]
    pub lora: LoraConfig,
    /// AdamW.
    #[config(default = "AdamWConfig::new()")]
    pub optimizer: AdamWConfig,
    /// EMA of the adapters.
    #[config(default = "EmaConfig::new()")]
    pub ema: EmaConfig,
}

/// Reads a settings file (`--config`) as JSON (a leading byte-order mark, which Windows editors write,
/// is skipped); errors name the file.
pub fn read_settings(path: &Path) -> crate::Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| crate::Error::io(path, e))?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    serde_json::from_str(text).map_err(|e| crate::Error::format(path, e.to_string()))
}

fn err(field: &str, message: impl Into<String>) -> crate::Error {
    crate::Error::config(field, message)
}

/// Settings a resumed run may change: they decide how long it runs and what it writes and
/// evaluates and on how many devices, not the training trajectory (every draw derives from the
/// seed and the epoch).
pub(crate) const RESUMABLE_CHANGES: [&str; 9] = [
    "epochs",
    "save_every",
    "keep_checkpoints",
    "tensorboard",
    "eval_every",
    "eval_steps",
    "eval_prompts",
    "eval_images_per_prompt",
    "devices",
];

impl TrainConfig {
    /// The FLUX.1-dev settings of the references (flow_grpo's `train_flux.py` and TP-GRPO's
    /// FLUX scripts, docs/training.md): 6 rollout steps (28 for evaluation) on FLUX's
    /// dynamically shifted schedule, embedded guidance 3.5, CPS with noise level 0.7, the SDE
    /// window `[0, 5)`, LoRA rank 64 / alpha 128 on the attention and feed-forward
    /// projections; every other setting as [`TrainConfig::new`].
    pub fn flux_dev() -> Self {
        TrainConfig::new()
            .with_eval_steps(28)
            .with_rollout(
                RolloutConfig::new()
                    .with_num_steps(6)
                    .with_dynamic_shift(Some(DynamicShift::new()))
                    .with_guidance(3.5)
                    .with_noise_level(0.7)
                    .with_window_start(0)
                    .with_window_size(5),
            )
            .with_lora(
                LoraConfig::new()
                    .with_rank(64)
                    .with_alpha(128.0)
                    .with_target_modules(crate::model::flux_targets()),
            )
    }

    /// The settings that differ from `saved` and would break an exact resume, each as
    /// `` `field` was X, now Y `` (every field but `epochs`, `eval_every`, `eval_steps`, `eval_prompts`,
    /// `eval_images_per_prompt`, `save_every`, `keep_checkpoints`, `tensorboard` and `devices`).
    pub fn resume_conflicts(&self, saved: &TrainConfig) -> Vec<String> {
        let flat = |c: &TrainConfig| {
            overrides::leaves(&serde_json::to_value(c).expect("settings serialise"))
                .into_iter()
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let (now, was) = (flat(self), flat(saved));
        let mut keys: Vec<&String> = now.keys().chain(was.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .filter(|k| !RESUMABLE_CHANGES.contains(&k.as_str()) && now.get(*k) != was.get(*k))
            .map(|k| {
                let show = |v: Option<&Value>| v.map_or("unset".to_string(), |v| v.to_string());
                format!("setting `{k}` was {}, now {}", show(was.get(k)), show(now.get(k)))
            })
            .collect()
    }

    /// These settings with the fields of the JSON file `file` (any subset, nested like the
    /// struct) and then the `key.path=value` overrides applied (`value` is JSON, or a bare
    /// string); validated.
    pub fn with_sources(&self, file: Option<&Path>, overrides: &[String]) -> crate::Result<Self> {
        let json = file.map(|path| read_settings(path).map(|json| (path, json))).transpose()?;
        self.with_json(json.as_ref().map(|(p, j)| (*p, j)), overrides)
    }

    /// [`TrainConfig::with_sources`] with the file already read: `file` is its path (for
    /// errors) and its JSON object.
    pub fn with_json(
        &self,
        file: Option<(&Path, &Value)>,
        overrides: &[String],
    ) -> crate::Result<Self> {
        let mut updates = Vec::new();
        if let Some((path, json)) = file {
            if !json.is_object() {
                return Err(crate::Error::format(path, "expected a JSON object"));
            }
            updates.extend(overrides::leaves(json));
        }
        for o in overrides {
            updates.push(overrides::parse_assignment(o)?);
        }
        let config = overrides::apply(self, &updates)?;
        config.validate()?;
        Ok(config)
    }

    /// Lower bounds of what a run of these settings holds for `denoiser` at latent shape
    /// `[C, H, W]`, as `(settings, holding, values)`: the epoch's states `(N + 1) S C H W`, and
    /// a training micro-batch's saved block inputs `L b T D` (every adapted block keeps its
    /// input `[b, T, D]` for the adapters' gradients; `T` counts image tokens only, `b` is at
    /// most `S`). Errors name the settings when a count exceeds 2^40 elements.
    pub fn footprint<B: Backend>(
        &self,
        latent: [usize; 3],
        denoiser: &Denoiser<B>,
    ) -> crate::Result<[(&'static str, &'static str, usize); 2]> {
        let samples = self.prompts_per_epoch.saturating_mul(self.group_size);
        let [c, h, w] = latent;
        let (blocks, tokens, width) = denoiser.activation_shape(latent);
        let batch = self.train_batch.min(samples);
        let count = |fields, what, sizes: &[usize]| {
            crate::limits::elements(fields, what, sizes).map(|n| (fields, what, n))
        };
        Ok([
            count(
                "prompts_per_epoch/group_size/rollout.num_steps",
                "the epoch's states",
                &[self.rollout.num_steps + 1, samples, c, h, w],
            )?,
            count(
                "train_batch",
                "a training micro-batch's saved block inputs",
                &[blocks, batch, tokens, width],
            )?,
        ])
    }

    /// Refuses, naming the settings, a run whose [`TrainConfig::footprint`] at `bytes` per
    /// value cannot fit in `memory` bytes (the training device's; `None`: unknown, no check).
    pub fn check_memory<B: Backend>(
        &self,
        latent: [usize; 3],
        denoiser: &Denoiser<B>,
        bytes: usize,
        memory: Option<u64>,
    ) -> crate::Result<()> {
        for (fields, what, n) in self.footprint(latent, denoiser)? {
            crate::limits::check_memory(fields, what, n as f64 * bytes as f64, memory)?;
        }
        Ok(())
    }

    /// Checks every field, naming the first invalid one.
    pub fn validate(&self) -> crate::Result<()> {
        crate::limits::check_positive(&[
            ("epochs", self.epochs),
            ("devices", self.devices),
            ("prompts_per_epoch", self.prompts_per_epoch),
            ("rollout_batch", self.rollout_batch),
            ("train_batch", self.train_batch),
            ("optimizer_steps_per_epoch", self.optimizer_steps_per_epoch),
            ("eval_steps", self.eval_steps),
            ("eval_images_per_prompt", self.eval_images_per_prompt),
        ])?;
        if self.eval_steps > crate::sampler::schedule::MAX_STEPS {
            return Err(err(
                "eval_steps",
                format!("at most {} steps", crate::sampler::schedule::MAX_STEPS),
            ));
        }
        if self.group_size < 2 {
            return Err(err("group_size", "a group needs at least 2 samples"));
        }
        let samples = crate::limits::elements(
            "prompts_per_epoch/group_size",
            "an epoch's samples",
            &[self.prompts_per_epoch, self.group_size],
        )?;
        if samples < self.optimizer_steps_per_epoch {
            return Err(err(
                "optimizer_steps_per_epoch",
                format!("{} steps for {samples} samples per epoch", self.optimizer_steps_per_epoch),
            ));
        }
        if self.max_grad_norm.is_nan() || self.max_grad_norm <= 0.0 {
            return Err(err("max_grad_norm", "must be positive"));
        }
        let o = &self.optimizer;
        let checks = [
            ("optimizer.lr", o.lr > 0.0 && o.lr.is_finite()),
            ("optimizer.beta1", (0.0..1.0).contains(&o.beta1)),
            ("optimizer.beta2", (0.0..1.0).contains(&o.beta2)),
            ("optimizer.eps", o.eps > 0.0),
            ("optimizer.weight_decay", o.weight_decay >= 0.0),
            ("ema.max_decay", (0.0..1.0).contains(&self.ema.max_decay)),
            ("ema.every", self.ema.every > 0),
        ];
        for (field, ok) in checks {
            if !ok {
                return Err(err(field, "out of range"));
            }
        }
        // Nested settings name their fields relative to themselves; report the dotted path.
        let nested = |prefix: &'static str| {
            move |e| match e {
                crate::Error::Config { field, message } if !field.starts_with(prefix) => {
                    err(&format!("{prefix}{field}"), message)
                }
                other => other,
            }
        };
        self.rollout.validate().map_err(nested("rollout."))?;
        self.objective.validate().map_err(nested("objective."))?;
        self.lora.validate().map_err(nested("lora."))
    }
}
