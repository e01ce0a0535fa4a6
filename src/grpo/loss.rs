//! The clipped policy-ratio loss and the KL penalty to the reference policy, on any backend.

use burn::prelude::*;
use serde::{Deserialize, Serialize};

/// Statistics of the loss at one micro-batch and trained step (their means are logged in
/// `metrics.jsonl`).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LossStats {
    /// Mean importance ratio `exp(logp - logp_old)`.
    pub ratio_mean: f64,
    /// Fraction of samples with ratio above `1 + eps`.
    pub clip_frac_above: f64,
    /// Fraction of samples with ratio below `1 - eps`.
    pub clip_frac_below: f64,
    /// `0.5 * mean((logp - logp_old)^2)`.
    pub approx_kl: f64,
    /// The KL penalty to the reference policy, before `beta` (0 when `beta = 0`: not computed).
    pub kl: f64,
    /// The clipped policy-gradient loss `L_pg`.
    pub policy_loss: f64,
}

impl LossStats {
    /// The field-wise mean of `stats`, each weighted by its sample count (all zero for none
    /// or no samples), so a statistic means the same however the samples were grouped.
    pub fn mean(stats: &[(usize, LossStats)]) -> LossStats {
        let n = stats.iter().map(|(b, _)| *b).sum::<usize>().max(1) as f64;
        let sum =
            |f: fn(&LossStats) -> f64| stats.iter().map(|(b, s)| *b as f64 * f(s)).sum::<f64>() / n;
        LossStats {
            ratio_mean: sum(|s| s.ratio_mean),
            clip_frac_above: sum(|s| s.clip_frac_above),
            clip_frac_below: sum(|s| s.clip_frac_below),
            approx_kl: sum(|s| s.approx_kl),
            kl: sum(|s| s.kl),
            policy_loss: sum(|s| s.policy_loss),
        }
    }
}

fn scalar<B: Backend>(t: Tensor<B, 1>) -> f64 {
    t.into_scalar().elem::<f64>()
}

/// The clipped policy-gradient loss over a micro-batch of one trained step:
///
/// ```text
/// r    = exp(logp - logp_old)
/// A    = clamp(advantage, -adv_clip_max, adv_clip_max)
/// L_pg = mean_b max(-A r, -A clamp(r, 1 - eps, 1 + eps))
/// ```
///
/// Gradients flow through `log_prob` only; `old_log_prob` and `advantages` are detached.
pub fn policy_loss<B: Backend>(
    log_prob: Tensor<B, 1>,
    old_log_prob: Tensor<B, 1>,
    advantages: Tensor<B, 1>,
    clip_range: f64,
    adv_clip_max: f64,
) -> (Tensor<B, 1>, LossStats) {
    let log_ratio = log_prob - old_log_prob.detach();
    let ratio = log_ratio.clone().exp();
    let adv = advantages.detach().clamp(-adv_clip_max, adv_clip_max);
    let unclipped = -adv.clone() * ratio.clone();
    let clipped = -adv * ratio.clone().clamp(1.0 - clip_range, 1.0 + clip_range);
    let loss = unclipped.max_pair(clipped).mean();

    let r = ratio.detach();
    let stats = LossStats {
        ratio_mean: scalar(r.clone().mean()),
        clip_frac_above: scalar(r.clone().greater_elem(1.0 + clip_range).float().mean()),
        clip_frac_below: scalar(r.lower_elem(1.0 - clip_range).float().mean()),
        approx_kl: 0.5 * scalar(log_ratio.detach().powi_scalar(2).mean()),
        kl: 0.0,
        policy_loss: scalar(loss.clone().detach()),
    };
    (loss, stats)
}

/// The KL penalty between the Gaussian steps of the policy and the reference policy, which
/// share the step std: `mean_b [ mean_CHW (mu - mu_ref)^2 / (2 std_b^2) ]`.
///
/// `mean` and `ref_mean` are `[B, C, H, W]`, `std` is `[B]`; `ref_mean` is detached.
pub fn kl_penalty<B: Backend>(
    mean: Tensor<B, 4>,
    ref_mean: Tensor<B, 4>,
    std: Tensor<B, 1>,
) -> Tensor<B, 1> {
    let [b, c, h, w] = mean.dims();
    let sq =
        (mean - ref_mean.detach()).powi_scalar(2).reshape([b, c * h * w]).mean_dim(1).reshape([b]);
    (sq / (std.detach().powi_scalar(2) * 2.0)).mean()
}
