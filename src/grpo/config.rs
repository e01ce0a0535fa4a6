//! `ObjectiveConfig`: which objective is trained and the TP-GRPO reference defaults.

use burn::prelude::*;
use serde::{Deserialize, Serialize};

use super::advantage::StdScope;
use crate::error::Error;

/// The policy-gradient objective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Objective {
    /// TurningPoint-GRPO: per-step incremental rewards, turning points credited with the
    /// long-term reward.
    TpGrpo,
    /// Flow-GRPO: the final image's reward on every trained step (the baseline).
    FlowGrpo,
}

impl Objective {
    /// The name used in settings and metrics (`tp-grpo`, `flow-grpo`).
    pub fn name(self) -> &'static str {
        match self {
            Objective::TpGrpo => "tp-grpo",
            Objective::FlowGrpo => "flow-grpo",
        }
    }
}

/// What ranks turning points when positive and negative ones are balanced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BalanceKey {
    /// The trajectory's overall trend `Delta = R_sde - R_ode` (the reference code).
    Delta,
    /// The aggregated reward `agg_k = R_sde - R_k` of the turning point (the paper's text).
    Agg,
}

/// Objective settings, with the defaults of the released TP-GRPO SD3.5-medium scripts.
#[derive(Config, Debug, PartialEq)]
pub struct ObjectiveConfig {
    /// TP-GRPO or the Flow-GRPO baseline.
    #[config(default = "Objective::TpGrpo")]
    pub objective: Objective,
    /// Require a turning point's direction to agree with all later evolution ("consistent"
    /// turning points); `false` gives the paper's unconstrained Def. 4.1.
    #[config(default = true)]
    pub consistency: bool,
    /// Let the first trained step be a turning point (the initial-step rule).
    #[config(default = true)]
    pub first_step: bool,
    /// Balance positive and negative turning points within a sampling batch.
    #[config(default = true)]
    pub balance: bool,
    /// The key balancing ranks turning points by.
    #[config(default = "BalanceKey::Delta")]
    pub balance_key: BalanceKey,
    /// Standard deviation used to normalise advantages: the prompt group's or the epoch's.
    #[config(default = "StdScope::Group")]
    pub std_scope: StdScope,
    /// Added to the standard deviation when normalising.
    #[config(default = 1e-4)]
    pub std_eps: f64,
    /// Advantages are clipped to `[-adv_clip_max, adv_clip_max]` in the loss.
    #[config(default = 5.0)]
    pub adv_clip_max: f64,
    /// PPO clip range `eps` of the ratio (1e-5 with the cps sampler, 1e-4 with sde).
    #[config(default = 1e-5)]
    pub clip_range: f64,
    /// Weight `beta` of the KL penalty to the reference policy.
    #[config(default = 1e-4)]
    pub kl_beta: f64,
    /// Draw fresh noise for the pure-ODE sample `R_ode` (the reference code) instead of
    /// reusing the trajectory's initial noise (the paper).
    #[config(default = false)]
    pub fresh_ode_noise: bool,
}

impl ObjectiveConfig {
    /// Checks every field, naming the first invalid one.
    pub fn validate(&self) -> crate::Result<()> {
        let positive = [
            ("std_eps", self.std_eps),
            ("adv_clip_max", self.adv_clip_max),
            ("clip_range", self.clip_range),
        ];
        for (field, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                return Err(Error::config(field, format!("must be a positive number, got {v}")));
            }
        }
        if !(self.kl_beta.is_finite() && self.kl_beta >= 0.0) {
            return Err(Error::config(
                "kl_beta",
                format!("must be a non-negative number, got {}", self.kl_beta),
            ));
        }
        Ok(())
    }

    /// These defaults with the fields present in the JSON object `overrides` replaced; an unknown
    /// field or a value of the wrong type is an error naming the field.
    pub fn with_overrides(
        &self,
        overrides: &serde_json::Map<String, serde_json::Value>,
    ) -> crate::Result<Self> {
        let updates: Vec<_> = overrides.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let config = crate::overrides::apply(self, &updates)?;
        config.validate()?;
        Ok(config)
    }
}
