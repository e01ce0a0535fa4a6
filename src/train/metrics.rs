//! Per-epoch training metrics, one JSON object per line in `metrics.jsonl`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::noise_scale::GradientNoise;
use crate::error::{Error, Result};
use crate::weights::write_atomically;

/// What one epoch did and measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochMetrics {
    /// Epoch number, from 1.
    pub epoch: usize,
    /// `tp-grpo` or `flow-grpo`.
    pub objective: String,
    /// Mean final reward of the epoch's rollouts.
    pub reward_mean: f64,
    /// Population std of the final rewards.
    pub reward_std: f64,
    /// Mean held-out reward with EMA weights after this epoch, when evaluated.
    pub eval_reward: Option<f64>,
    /// Turning points credited after balancing.
    pub turning_points: usize,
    /// ... of which with a positive trend `Delta`.
    pub turning_points_positive: usize,
    /// ... of which with a negative trend `Delta`.
    pub turning_points_negative: usize,
    /// Turning points before balancing.
    pub turning_point_candidates: usize,
    /// Mean `|R_{k+1} - R_k|` per trained step: how much one step changes the reward of the
    /// ODE completion (TP-GRPO; empty for Flow-GRPO, which computes no completions).
    #[serde(default)]
    pub step_reward_change: Vec<f64>,
    /// Samples trained on (the others had all-zero advantages).
    pub samples_used: usize,
    /// Samples dropped for all-zero advantages.
    pub samples_dropped: usize,
    /// Mean policy ratio over micro-batches and steps.
    pub ratio_mean: f64,
    /// Fraction of ratios above `1 + eps`.
    pub clip_frac_above: f64,
    /// Fraction of ratios below `1 - eps`.
    pub clip_frac_below: f64,
    /// `0.5 mean (logp - logp_old)^2`.
    pub approx_kl: f64,
    /// Mean KL penalty to the reference (adapters off), before `beta`.
    pub kl: f64,
    /// Mean policy-gradient loss.
    pub policy_loss: f64,
    /// Global gradient norm before clipping, mean over the epoch's optimizer steps.
    pub grad_norm: f64,
    /// Estimate of `|G|^2`, the squared expected gradient, mean over the epoch's optimizer
    /// steps ([`GradientNoise`]; `None` with one micro-batch per step).
    #[serde(default)]
    pub grad_signal_sq: Option<f64>,
    /// Estimate of `tr(Sigma)`, one sample's gradient variance, likewise.
    #[serde(default)]
    pub grad_noise_trace: Option<f64>,
    /// Optimizer steps taken so far.
    pub optimizer_steps: u64,
    /// Transformer evaluations per trajectory (rollout plus completions, CFG counted once).
    pub nfe_per_sample: f64,
    /// Wall-clock seconds of the epoch (rollouts, rewards, update; not evaluation).
    pub seconds: f64,
}

/// The names of every field a metrics line has.
pub const FIELDS: [&str; 24] = [
    "epoch",
    "objective",
    "reward_mean",
    "reward_std",
    "eval_reward",
    "turning_points",
    "turning_points_positive",
    "turning_points_negative",
    "turning_point_candidates",
    "step_reward_change",
    "samples_used",
    "samples_dropped",
    "ratio_mean",
    "clip_frac_above",
    "clip_frac_below",
    "approx_kl",
    "kl",
    "policy_loss",
    "grad_norm",
    "grad_signal_sq",
    "grad_noise_trace",
    "optimizer_steps",
    "nfe_per_sample",
    "seconds",
];

impl EpochMetrics {
    /// This epoch's gradient-noise estimates, when measured.
    pub fn gradient_noise(&self) -> Option<GradientNoise> {
        Some(GradientNoise { signal_sq: self.grad_signal_sq?, noise_trace: self.grad_noise_trace? })
    }
}

/// The gradient noise scale of a run ([`GradientNoise::scale`] of its epochs' estimates).
pub fn noise_scale(history: &[EpochMetrics]) -> Option<f64> {
    let estimates: Vec<GradientNoise> =
        history.iter().filter_map(EpochMetrics::gradient_noise).collect();
    GradientNoise::scale(&estimates)
}

/// Reads a metrics file (missing file: no lines).
pub fn read_metrics(path: &Path) -> Result<Vec<EpochMetrics>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| Error::format(path, format!("line {}: {e}", i + 1)))
        })
        .collect()
}

/// Rewrites the metrics file atomically with `lines`.
pub fn write_metrics(path: &Path, lines: &[EpochMetrics]) -> Result<()> {
    let text: String =
        lines.iter().map(|m| serde_json::to_string(m).expect("metrics serialise") + "\n").collect();
    write_atomically(path, |tmp| std::fs::write(tmp, &text).map_err(|e| Error::io(tmp, e)))
}
