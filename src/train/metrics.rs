//! Per-epoch training metrics, one JSON object per line in `metrics.jsonl`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use burn::tensor::backend::Backend;

use serde::{Deserialize, Serialize};

use super::noise_scale::GradientNoise;
use crate::error::{Error, Result};
use crate::files::write_atomically;
use crate::grpo::{CreditStats, LossStats};

/// What one epoch did and measured: one flat JSON object per line (the credit and loss
/// statistics are flattened in), every field defaulted when absent.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct EpochMetrics {
    /// Epoch number, from 1 (0: the evaluation before training).
    pub epoch: usize,
    /// `tp-grpo` or `flow-grpo`.
    pub objective: String,
    /// Mean final reward of the epoch's rollouts.
    pub reward_mean: f64,
    /// Population std of the final rewards.
    pub reward_std: f64,
    /// Mean unweighted score of each reward term on the final rewards (one entry per
    /// `--reward`).
    #[serde(default)]
    pub reward_terms: BTreeMap<String, f64>,
    /// Mean held-out reward with EMA weights after this epoch, when evaluated.
    pub eval_reward: Option<f64>,
    /// The task's report on the same held-out images, when evaluated (the toy task: its
    /// rule-based score and GenEval-style check pass rates).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub eval_report: BTreeMap<String, f64>,
    /// Turning points and the samples kept (see [`CreditStats`]).
    #[serde(flatten)]
    pub credit: CreditStats,
    /// Means over micro-batches and trained steps (see [`LossStats`]).
    #[serde(flatten)]
    pub loss: LossStats,
    /// Global gradient norm before clipping, mean over the epoch's optimizer steps.
    pub grad_norm: f64,
    /// Estimate of `|G|^2`, the squared expected gradient, mean over the epoch's optimizer
    /// steps ([`GradientNoise`]; `None` with one micro-batch per step).
    pub grad_signal_sq: Option<f64>,
    /// Estimate of `tr(Sigma)`, one sample's gradient variance, likewise.
    pub grad_noise_trace: Option<f64>,
    /// Optimizer steps taken so far.
    pub optimizer_steps: u64,
    /// Transformer evaluations per trajectory (rollout plus completions, CFG counted once).
    pub nfe_per_sample: f64,
    /// Wall-clock seconds of the epoch (rollouts, rewards, update; not evaluation).
    pub seconds: f64,
    /// The epoch's seconds by phase.
    pub phase_seconds: PhaseSeconds,
    /// When the line was written: seconds since the Unix epoch (UTC), as TensorBoard's
    /// `wall_time`; 0 in lines of earlier versions.
    pub wall_time: f64,
}

/// Wall-clock seconds of an epoch's phases, each ended by waiting for the device's queued
/// work, so that the time of asynchronous GPU work lands in the phase that launched it.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PhaseSeconds {
    /// The SDE rollouts (prompt encoding included).
    pub rollout: f64,
    /// TP-GRPO's ODE completions of the trained steps' states (0 for Flow-GRPO).
    pub completions: f64,
    /// Decoding and scoring the final and completed latents.
    pub reward: f64,
    /// Gathering, credit and the update: losses, backward passes, all-reduce, AdamW, EMA.
    pub update: f64,
}

/// Runs `work`, waits for the work it queued on `device`, and adds the seconds to `slot`
/// (`what` names the phase in a device error).
pub(crate) fn timed<B: Backend, T>(
    slot: &mut f64,
    device: &B::Device,
    what: &str,
    work: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let start = Instant::now();
    let out = work()?;
    B::sync(device).map_err(|e| Error::Device { what: what.into(), message: format!("{e:?}") })?;
    *slot += start.elapsed().as_secs_f64();
    Ok(out)
}

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

/// Reads a metrics file (missing file: no lines). A last line without its line end is a write
/// cut short by a kill (lines are appended whole, each ended by `\n`) and is left out.
pub fn read_metrics(path: &Path) -> Result<Vec<EpochMetrics>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let complete = text.rfind('\n').map_or("", |end| &text[..=end]);
    complete
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| Error::format(path, format!("line {}: {e}", i + 1)))
        })
        .collect()
}

/// Seconds since the Unix epoch, now.
pub(crate) fn wall_time() -> f64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    now.map_or(0.0, |d| d.as_secs_f64())
}

/// Appends `line` to the metrics file as one JSON line (written with one `write` and synced),
/// so that a reader following the file (`tail -f`) sees each epoch as it ends.
pub(crate) fn append_metrics(path: &Path, line: &EpochMetrics) -> Result<()> {
    use std::io::Write;
    let text = serde_json::to_string(line).expect("metrics serialise") + "\n";
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    file.write_all(text.as_bytes()).and_then(|()| file.sync_data()).map_err(|e| Error::io(path, e))
}

/// Rewrites the metrics file atomically with `lines` (a resume cutting it to its checkpoint).
pub(crate) fn write_metrics(path: &Path, lines: &[EpochMetrics]) -> Result<()> {
    let text: String =
        lines.iter().map(|m| serde_json::to_string(m).expect("metrics serialise") + "\n").collect();
    write_atomically(path, |tmp| std::fs::write(tmp, &text).map_err(|e| Error::io(tmp, e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines are appended (what a reader already read never changes), stamped, and a line cut
    /// short by a kill is left out on reading while the complete ones are kept.
    #[test]
    fn metrics_are_appended_with_timestamps_and_a_torn_line_is_left_out() {
        let dir = std::env::temp_dir().join(format!("tpgrpo-metrics-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("metrics.jsonl");
        let line = |epoch| EpochMetrics { epoch, wall_time: wall_time(), ..Default::default() };
        append_metrics(&path, &line(1)).unwrap();
        let first = std::fs::read(&path).unwrap();
        append_metrics(&path, &line(2)).unwrap();
        let both = std::fs::read(&path).unwrap();
        assert!(both.starts_with(&first) && both.len() > first.len(), "appended, not rewritten");
        let read = read_metrics(&path).unwrap();
        assert_eq!(read.iter().map(|m| m.epoch).collect::<Vec<_>>(), [1, 2]);
        // 2026-01-01 as the lower bound: a real clock, not zero.
        assert!(read.iter().all(|m| m.wall_time > 1.767e9), "{read:?}");
        let mut torn = both.clone();
        torn.extend(b"{\"epoch\": 3, \"rew");
        std::fs::write(&path, torn).unwrap();
        assert_eq!(read_metrics(&path).unwrap().len(), 2, "the torn line is left out");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
