//! The credit phase of an epoch: its reward rows (which say which objective they serve) to
//! per-step advantages, the samples worth training on, and the statistics logged with them.

use serde::{Deserialize, Serialize};

use super::advantage::{flow_grpo_advantages, informative_samples, tp_grpo_advantages};
use super::config::{Objective, ObjectiveConfig};
use super::credit::{credit_batch, mean_abs_step_rewards};

/// An epoch's rewards, one row per sample, shaped by the objective they serve.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RewardRows {
    /// TP-GRPO: `[R_ode, R_1, .., R_{n-1}, R_sde]` per sample (the ODE completions' rewards,
    /// then the trajectory's own).
    Sequences(Vec<Vec<f64>>),
    /// Flow-GRPO: the final reward `R_sde` per sample.
    Finals(Vec<f64>),
}

impl RewardRows {
    /// The empty rows of `objective`.
    pub(crate) fn empty(objective: Objective) -> Self {
        match objective {
            Objective::TpGrpo => RewardRows::Sequences(Vec::new()),
            Objective::FlowGrpo => RewardRows::Finals(Vec::new()),
        }
    }

    /// The final reward `R_sde` of every sample.
    pub(crate) fn finals(&self) -> Vec<f64> {
        match self {
            RewardRows::Sequences(rows) => rows.iter().map(|r| r[r.len() - 1]).collect(),
            RewardRows::Finals(finals) => finals.clone(),
        }
    }

    /// Appends `more` rows of the same objective.
    pub(crate) fn extend(&mut self, more: RewardRows) -> crate::Result<()> {
        match (self, more) {
            (RewardRows::Sequences(a), RewardRows::Sequences(b)) => a.extend(b),
            (RewardRows::Finals(a), RewardRows::Finals(b)) => a.extend(b),
            _ => return Err(crate::Error::config("objective", "reward rows of two objectives")),
        }
        Ok(())
    }

    /// The number of samples.
    pub(crate) fn len(&self) -> usize {
        match self {
            RewardRows::Sequences(rows) => rows.len(),
            RewardRows::Finals(finals) => finals.len(),
        }
    }
}

/// What credit assignment did in an epoch (logged in `metrics.jsonl`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct CreditStats {
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
    pub step_reward_change: Vec<f64>,
    /// Samples trained on (the others had all-zero advantages).
    pub samples_used: usize,
    /// Samples dropped for all-zero advantages.
    pub samples_dropped: usize,
}

/// An epoch's credit: advantages per sample and trained step, and what it found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EpochCredit {
    /// `[sample][trained step]`.
    pub advantages: Vec<Vec<f64>>,
    /// The samples with a non-zero advantage at some step, in sample order.
    pub informative: Vec<usize>,
    /// Counts for the metrics.
    pub stats: CreditStats,
}

/// Advantages of an epoch's samples: TP-GRPO credit (turning points, balancing) and
/// per-step group z-scores for [`RewardRows::Sequences`]; the z-scored final reward repeated
/// on each of the `trained_steps` steps for [`RewardRows::Finals`].
pub(crate) fn assign_credit(
    rows: &RewardRows,
    prompt_ids: &[usize],
    cfg: &ObjectiveConfig,
    trained_steps: usize,
) -> crate::Result<EpochCredit> {
    let mut stats = CreditStats::default();
    let advantages = match rows {
        RewardRows::Sequences(seqs) => {
            let credits = credit_batch(seqs, cfg)?;
            stats.step_reward_change = mean_abs_step_rewards(&credits)?;
            for c in &credits {
                let count = c.turning_points.iter().filter(|&&t| t).count();
                stats.turning_points += count;
                stats.turning_point_candidates +=
                    c.candidate_turning_points.iter().filter(|&&t| t).count();
                if c.delta > 0.0 {
                    stats.turning_points_positive += count;
                } else {
                    stats.turning_points_negative += count;
                }
            }
            let credited: Vec<Vec<f64>> = credits.into_iter().map(|c| c.credited_rewards).collect();
            tp_grpo_advantages(&credited, prompt_ids, cfg.std_scope, cfg.std_eps)?
        }
        RewardRows::Finals(finals) => {
            flow_grpo_advantages(finals, prompt_ids, cfg.std_scope, cfg.std_eps)?
                .into_iter()
                .map(|a| vec![a; trained_steps])
                .collect()
        }
    };
    let keep = informative_samples(&advantages);
    let informative: Vec<usize> = (0..advantages.len()).filter(|&i| keep[i]).collect();
    stats.samples_used = informative.len();
    stats.samples_dropped = advantages.len() - informative.len();
    Ok(EpochCredit { advantages, informative, stats })
}
