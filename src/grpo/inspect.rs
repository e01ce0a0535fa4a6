//! The credit inspector behind `tpgrpo credit`: a JSON batch of reward sequences in, the step
//! rewards, turning points, credited rewards and advantages out, as a table or as JSON.

use serde::{Deserialize, Serialize};

use super::advantage::{flow_grpo_advantages, tp_grpo_advantages};
use super::config::ObjectiveConfig;
use super::credit::credit_batch;
use crate::error::Error;

/// The inspector's input file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreditInput {
    /// One row `[R_ode, R_1, .., R_{n-1}, R_sde]` per trajectory.
    pub batch: Vec<Vec<f64>>,
    /// The prompt (group) of each trajectory.
    pub prompt_ids: Vec<usize>,
    /// Overrides of [`ObjectiveConfig`] fields (`consistency`, `balance_key`, ...).
    #[serde(default)]
    pub options: serde_json::Map<String, serde_json::Value>,
}

/// Everything the inspector reports about one trajectory.
#[derive(Debug, Clone, Serialize)]
pub struct TrajectoryReport {
    /// The trajectory's prompt group.
    pub prompt_id: usize,
    /// The input rewards `[R_ode, .., R_sde]`.
    pub rewards: Vec<f64>,
    /// `Delta = R_sde - R_ode`.
    pub delta: f64,
    /// `d_k` per trained step.
    pub step_rewards: Vec<f64>,
    /// Turning points before balancing.
    pub candidate_turning_points: Vec<bool>,
    /// Turning points kept after balancing.
    pub turning_points: Vec<bool>,
    /// The reward each step is trained on.
    pub credited_rewards: Vec<f64>,
    /// TP-GRPO advantages per step (before clipping).
    pub tp_grpo_advantages: Vec<f64>,
    /// The Flow-GRPO advantage of the sample (before clipping).
    pub flow_grpo_advantage: f64,
}

/// The inspector's output.
#[derive(Debug, Clone, Serialize)]
pub struct CreditReport {
    /// The full configuration used.
    pub options: ObjectiveConfig,
    /// One report per trajectory, in input order.
    pub trajectories: Vec<TrajectoryReport>,
}

/// Parses an input file's text.
pub fn parse_credit_input(text: &str) -> crate::Result<CreditInput> {
    serde_json::from_str(text)
        .map_err(|e| Error::format("<input>", format!("invalid credit input: {e}")))
}

/// Credits a batch and computes both objectives' advantages.
pub fn inspect(input: &CreditInput) -> crate::Result<CreditReport> {
    let cfg = ObjectiveConfig::new().with_overrides(&input.options)?;
    let credits = credit_batch(&input.batch, &cfg)?;
    let credited: Vec<Vec<f64>> = credits.iter().map(|c| c.credited_rewards.clone()).collect();
    let tp = tp_grpo_advantages(&credited, &input.prompt_ids, cfg.std_scope, cfg.std_eps)?;
    let finals: Vec<f64> = input.batch.iter().map(|row| row[row.len() - 1]).collect();
    let flow = flow_grpo_advantages(&finals, &input.prompt_ids, cfg.std_scope, cfg.std_eps)?;
    let trajectories = credits
        .into_iter()
        .enumerate()
        .map(|(i, c)| TrajectoryReport {
            prompt_id: input.prompt_ids[i],
            rewards: input.batch[i].clone(),
            delta: c.delta,
            step_rewards: c.step_rewards,
            candidate_turning_points: c.candidate_turning_points,
            turning_points: c.turning_points,
            credited_rewards: c.credited_rewards,
            tp_grpo_advantages: tp[i].clone(),
            flow_grpo_advantage: flow[i],
        })
        .collect();
    Ok(CreditReport { options: cfg, trajectories })
}
