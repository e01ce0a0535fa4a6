//! TP-GRPO credit assignment: incremental step rewards, aggregated rewards at turning points,
//! and balancing of positive and negative turning points within a sampling batch.

use std::cmp::Ordering;

use super::config::{BalanceKey, ObjectiveConfig};
use super::turning_point::turning_points;
use crate::error::Error;
use crate::finite::no_overflow;

/// Incremental step rewards `d_k = seq[k+1] - seq[k]`, `k = 0..n`, of `seq = [R_ode, R_1, .., R_sde]`.
pub fn step_rewards(seq: &[f64]) -> Vec<f64> {
    seq.windows(2).map(|w| w[1] - w[0]).collect()
}

/// The credit of one trajectory.
#[derive(Debug, Clone, PartialEq)]
pub struct TrajectoryCredit {
    /// `d_k`, one per trained step.
    pub step_rewards: Vec<f64>,
    /// Turning points that keep their aggregated reward after balancing.
    pub turning_points: Vec<bool>,
    /// Turning points found before balancing (balancing may revert some to `d_k`).
    pub candidate_turning_points: Vec<bool>,
    /// The reward each step is trained on: `agg_k = R_sde - seq[k]` at kept turning points,
    /// `d_k` elsewhere.
    pub credited_rewards: Vec<f64>,
    /// The overall trend `Delta = R_sde - R_ode`.
    pub delta: f64,
}

/// Mean `|d_k|` over credited trajectories, per trained step: how much each step's action
/// changes the reward of the ODE completion (empty for no trajectories).
pub fn mean_abs_step_rewards(credits: &[TrajectoryCredit]) -> crate::Result<Vec<f64>> {
    let n = credits.first().map_or(0, |c| c.step_rewards.len());
    (0..n)
        .map(|k| {
            let sum = credits.iter().map(|c| c.step_rewards[k].abs()).sum::<f64>();
            no_overflow(sum / credits.len() as f64, "batch", || format!("mean |d_{k}|"))
        })
        .collect()
}

/// Checks a batch of reward sequences: non-empty, equal lengths of at least 2, finite values.
pub(crate) fn validate_batch(batch: &[Vec<f64>]) -> crate::Result<()> {
    let first = batch.first().ok_or_else(|| Error::config("batch", "is empty"))?;
    if first.len() < 2 {
        return Err(Error::config(
            "batch",
            format!("row 0 has {} value(s); need at least [R_ode, R_sde]", first.len()),
        ));
    }
    for (i, row) in batch.iter().enumerate() {
        if row.len() != first.len() {
            return Err(Error::config(
                "batch",
                format!("ragged rows: row {i} has {} values, row 0 has {}", row.len(), first.len()),
            ));
        }
        if let Some(j) = row.iter().position(|v| !v.is_finite()) {
            return Err(Error::config(
                "batch",
                format!("row {i}, value {j} is {} (rewards must be finite)", row[j]),
            ));
        }
    }
    Ok(())
}

/// Credits every trajectory of a sampling batch, each row `[R_ode, R_1, .., R_{n-1}, R_sde]`.
///
/// Turning points (see [`turning_points`]) get `agg_k = R_sde - seq[k]` instead of `d_k`. With
/// `balance`, when both signs occur among the batch's turning points (sign of the key:
/// `Delta` or `agg_k`), only the `m = min(#pos, #neg)` of each sign with the largest `|key|`
/// keep `agg_k` (ties: larger `|agg_k|`, then earlier step, then lower batch index); the others
/// revert to `d_k`.
pub fn credit_batch(
    batch: &[Vec<f64>],
    cfg: &ObjectiveConfig,
) -> crate::Result<Vec<TrajectoryCredit>> {
    validate_batch(batch)?;
    let mut credits: Vec<TrajectoryCredit> = batch
        .iter()
        .enumerate()
        .map(|(i, seq)| {
            let n = seq.len() - 1;
            let d = step_rewards(seq);
            let tp = turning_points(seq, cfg.consistency, cfg.first_step);
            let credited: Vec<f64> =
                (0..n).map(|k| if tp[k] { seq[n] - seq[k] } else { d[k] }).collect();
            let delta = no_overflow(seq[n] - seq[0], "batch", || {
                format!("row {i}: Delta = R_sde - R_ode = {:?} - {:?}", seq[n], seq[0])
            })?;
            for k in 0..n {
                no_overflow(d[k], "batch", || {
                    format!("row {i}: d_{k} = {:?} - {:?}", seq[k + 1], seq[k])
                })?;
                no_overflow(credited[k], "batch", || {
                    format!("row {i}: agg_{k} = R_sde - R_{k} = {:?} - {:?}", seq[n], seq[k])
                })?;
            }
            Ok(TrajectoryCredit {
                step_rewards: d,
                candidate_turning_points: tp.clone(),
                turning_points: tp,
                credited_rewards: credited,
                delta,
            })
        })
        .collect::<crate::Result<_>>()?;
    if cfg.balance {
        balance(&mut credits, cfg.balance_key);
    }
    Ok(credits)
}

/// One turning point being ranked for balancing.
struct Candidate {
    key: f64,
    agg: f64,
    step: usize,
    sample: usize,
}

fn balance(credits: &mut [TrajectoryCredit], key: BalanceKey) {
    let (mut pos, mut neg) = (Vec::new(), Vec::new());
    for (sample, c) in credits.iter().enumerate() {
        for step in (0..c.turning_points.len()).filter(|&k| c.turning_points[k]) {
            let agg = c.credited_rewards[step];
            let key = match key {
                BalanceKey::Delta => c.delta,
                BalanceKey::Agg => agg,
            };
            let cand = Candidate { key, agg, step, sample };
            if key > 0.0 {
                pos.push(cand);
            } else if key < 0.0 {
                neg.push(cand);
            }
        }
    }
    if pos.is_empty() || neg.is_empty() {
        return;
    }
    let m = pos.len().min(neg.len());
    let rank = |a: &Candidate, b: &Candidate| {
        b.key
            .abs()
            .partial_cmp(&a.key.abs())
            .unwrap_or(Ordering::Equal)
            .then(b.agg.abs().partial_cmp(&a.agg.abs()).unwrap_or(Ordering::Equal))
            .then(a.step.cmp(&b.step))
            .then(a.sample.cmp(&b.sample))
    };
    for group in [&mut pos, &mut neg] {
        group.sort_by(rank);
        for dropped in group.iter().skip(m) {
            let c = &mut credits[dropped.sample];
            c.turning_points[dropped.step] = false;
            c.credited_rewards[dropped.step] = c.step_rewards[dropped.step];
        }
    }
}
