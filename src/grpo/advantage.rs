//! Group-normalised advantages: per trained step for TP-GRPO, on the outcome for Flow-GRPO.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::finite::no_overflow;

/// Which standard deviation normalises advantages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StdScope {
    /// The prompt group's (TP-GRPO; Flow-GRPO's per-prompt tracking).
    Group,
    /// All samples of the epoch (Flow-GRPO's SD3 configs).
    Global,
}

/// Population mean and standard deviation.
fn mean_std(values: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let n = values.clone().count() as f64;
    let mean = values.clone().sum::<f64>() / n;
    let var = values.map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// Z-scores each column of `values[sample][step]` within prompt groups:
/// `A[i,k] = (c[i,k] - mean_{g(i)} c[.,k]) / (std c[.,k] + eps)`, population std over the group
/// of sample `i` ([`StdScope::Group`]) or over all samples ([`StdScope::Global`]).
pub(crate) fn group_zscores(
    values: &[Vec<f64>],
    prompt_ids: &[usize],
    scope: StdScope,
    eps: f64,
) -> crate::Result<Vec<Vec<f64>>> {
    if prompt_ids.len() != values.len() {
        return Err(Error::config(
            "prompt_ids",
            format!("has {} entries for {} samples", prompt_ids.len(), values.len()),
        ));
    }
    let steps = values.first().map_or(0, Vec::len);
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, &p) in prompt_ids.iter().enumerate() {
        groups.entry(p).or_default().push(i);
    }
    let mut out = vec![vec![0.0; steps]; values.len()];
    let checked = |(mean, std): (f64, f64), whose: &dyn Fn() -> String| -> crate::Result<_> {
        no_overflow(mean, "rewards", || format!("the mean of {}", whose()))?;
        no_overflow(std, "rewards", || format!("the standard deviation of {}", whose()))?;
        Ok((mean, std))
    };
    for k in 0..steps {
        let global_std = match scope {
            StdScope::Global => {
                let all = || format!("all samples' step-{k} rewards");
                Some(checked(mean_std(values.iter().map(|row| row[k])), &all)?.1)
            }
            StdScope::Group => None,
        };
        for (prompt, members) in &groups {
            let group = || format!("prompt {prompt}'s step-{k} rewards");
            let (mean, group_std) =
                checked(mean_std(members.iter().map(|&i| values[i][k])), &group)?;
            let std = global_std.unwrap_or(group_std);
            for &i in members {
                out[i][k] = no_overflow((values[i][k] - mean) / (std + eps), "rewards", || {
                    format!("the advantage of sample {i} at step {k}")
                })?;
            }
        }
    }
    Ok(out)
}

/// TP-GRPO advantages `[sample][step]` from the credited rewards of each trained step.
pub fn tp_grpo_advantages(
    credited: &[Vec<f64>],
    prompt_ids: &[usize],
    scope: StdScope,
    eps: f64,
) -> crate::Result<Vec<Vec<f64>>> {
    group_zscores(credited, prompt_ids, scope, eps)
}

/// Flow-GRPO advantages: the z-scored final reward of each sample, one value per sample (the
/// trainer repeats it on every trained step).
pub fn flow_grpo_advantages(
    final_rewards: &[f64],
    prompt_ids: &[usize],
    scope: StdScope,
    eps: f64,
) -> crate::Result<Vec<f64>> {
    let column: Vec<Vec<f64>> = final_rewards.iter().map(|&r| vec![r]).collect();
    Ok(group_zscores(&column, prompt_ids, scope, eps)?.into_iter().map(|row| row[0]).collect())
}

/// Whether each sample carries a training signal: `false` when its advantage is exactly 0 at
/// every step (such samples are dropped from the update).
pub fn informative_samples(advantages: &[Vec<f64>]) -> Vec<bool> {
    advantages.iter().map(|row| row.iter().any(|&a| a != 0.0)).collect()
}

/// Clips every advantage to `[-max, max]`.
pub fn clip_advantages(advantages: &mut [Vec<f64>], max: f64) {
    for a in advantages.iter_mut().flatten() {
        *a = a.clamp(-max, max);
    }
}
