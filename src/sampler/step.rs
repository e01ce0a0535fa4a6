//! One denoising step: Euler ODE, the Flow-GRPO SDE step with noise scale alpha, and the CPS
//! step; the stochastic ones are Gaussian transitions with a log-probability.

use burn::prelude::*;
use serde::{Deserialize, Serialize};

use super::schedule::FlowSchedule;
use crate::error::Error;

/// `ln(sqrt(2 pi))`.
const LN_SQRT_2PI: f64 = 0.918_938_533_204_672_8;

/// Euler ODE step `x_next = x + (sigma_next - sigma) v`.
pub fn euler_step<B: Backend>(
    x: Tensor<B, 4>,
    v: Tensor<B, 4>,
    sigma: f64,
    sigma_next: f64,
) -> Tensor<B, 4> {
    x + v * (sigma_next - sigma)
}

/// The stochastic sampler of the trained steps; it also fixes the log-prob's form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SamplerKind {
    /// Flow-GRPO's SDE step ([`sde_step`]): normalised Gaussian log-density.
    Sde,
    /// The CPS step ([`cps_step`], the TP-GRPO scripts' choice): the unnormalised
    /// `-(x_next - mean)^2`.
    Cps,
}

impl SamplerKind {
    /// This sampler's Gaussian step at step `step` with noise scale `alpha`.
    pub fn step<B: Backend>(
        self,
        x: Tensor<B, 4>,
        v: Tensor<B, 4>,
        schedule: &FlowSchedule,
        step: usize,
        alpha: f64,
    ) -> crate::Result<GaussianStep<B>> {
        match self {
            SamplerKind::Sde => sde_step(x, v, schedule, step, alpha),
            SamplerKind::Cps => cps_step(x, v, schedule, step, alpha),
        }
    }
}

/// A Gaussian transition `x_next ~ N(mean, std^2 I)`.
#[derive(Debug, Clone)]
pub struct GaussianStep<B: Backend> {
    /// The transition mean `[B, C, H, W]` (carries the velocity's gradient).
    pub mean: Tensor<B, 4>,
    /// The per-element standard deviation (0 when alpha = 0: the step is Euler).
    pub std: f64,
    /// The sampler.
    pub kind: SamplerKind,
}

impl<B: Backend> GaussianStep<B> {
    /// `x_next = mean + std * eps`.
    pub fn sample(&self, eps: Tensor<B, 4>) -> Tensor<B, 4> {
        self.mean.clone() + eps * self.std
    }

    /// The per-sample log-probability `[B]` of a (stored, detached) `x_next`, a MEAN over the
    /// non-batch elements:
    /// - SDE: `-(x_next - mean)^2 / (2 std^2) - ln(std) - ln(sqrt(2 pi))`;
    /// - CPS: `-(x_next - mean)^2`.
    ///
    /// A deterministic SDE step (std 0, alpha = 0) has no density and is an error; the CPS
    /// form stays defined (it is then 0 at the mean).
    pub fn log_prob(&self, x_next: Tensor<B, 4>) -> crate::Result<Tensor<B, 1>> {
        if self.kind == SamplerKind::Sde && self.std <= 0.0 {
            return Err(Error::config(
                "noise_level",
                "the SDE step is deterministic (alpha = 0): it has no log-probability",
            ));
        }
        let [b, c, h, w] = self.mean.dims();
        let sq = (x_next.detach() - self.mean.clone()).powi_scalar(2);
        let per_elem = match self.kind {
            SamplerKind::Sde => sq / (-2.0 * self.std * self.std) - (self.std.ln() + LN_SQRT_2PI),
            SamplerKind::Cps => -sq,
        };
        Ok(per_elem.reshape([b, c * h * w]).mean_dim(1).reshape([b]))
    }
}

fn check(schedule: &FlowSchedule, step: usize, alpha: f64) -> crate::Result<(f64, f64)> {
    if !(alpha.is_finite() && alpha >= 0.0) {
        return Err(Error::config("noise_level", format!("must be >= 0, got {alpha}")));
    }
    if step >= schedule.num_steps() {
        return Err(Error::config(
            "step_index",
            format!("{step} is past the last step {} of the schedule", schedule.num_steps() - 1),
        ));
    }
    Ok((schedule.sigmas[step], schedule.sigmas[step + 1]))
}

/// Flow-GRPO's SDE step ("sde") at step `i` with noise scale `alpha`, discretising
/// `dx = [v + sigma_t^2 / (2t) (x + (1 - t) v)] dt + sigma_t dW`, `sigma_t = alpha sqrt(t / (1 - t))`:
///
/// ```text
/// dt        = sigma_next - sigma                       (< 0)
/// std_dev_t = alpha sqrt(sigma / (1 - (sigma == 1 ? sigmas[1] : sigma)))
/// mean      = x (1 + std_dev_t^2 dt / (2 sigma)) + v (1 + std_dev_t^2 (1 - sigma) / (2 sigma)) dt
/// std       = std_dev_t sqrt(-dt)
/// ```
///
/// alpha = 0 gives the Euler step exactly. The arithmetic runs in the tensors' float type.
pub fn sde_step<B: Backend>(
    x: Tensor<B, 4>,
    v: Tensor<B, 4>,
    schedule: &FlowSchedule,
    step: usize,
    alpha: f64,
) -> crate::Result<GaussianStep<B>> {
    let (sigma, sigma_next) = check(schedule, step, alpha)?;
    let dt = sigma_next - sigma;
    let denom = 1.0 - if sigma == 1.0 { schedule.sigmas[1] } else { sigma };
    let std_dev_t = alpha * (sigma / denom).sqrt();
    let var = std_dev_t * std_dev_t;
    let mean = x * (1.0 + var / (2.0 * sigma) * dt)
        + v * ((1.0 + var * (1.0 - sigma) / (2.0 * sigma)) * dt);
    Ok(GaussianStep { mean, std: std_dev_t * (-dt).sqrt(), kind: SamplerKind::Sde })
}

/// The CPS step at step `i` with noise scale `alpha`:
///
/// ```text
/// std  = sigma_next sin(alpha pi / 2)
/// x0   = x - sigma v,   x1 = x + (1 - sigma) v
/// mean = x0 (1 - sigma_next) + x1 sqrt(sigma_next^2 - std^2)
/// ```
pub fn cps_step<B: Backend>(
    x: Tensor<B, 4>,
    v: Tensor<B, 4>,
    schedule: &FlowSchedule,
    step: usize,
    alpha: f64,
) -> crate::Result<GaussianStep<B>> {
    let (sigma, sigma_next) = check(schedule, step, alpha)?;
    let std = sigma_next * (alpha * std::f64::consts::FRAC_PI_2).sin();
    let x0 = x.clone() - v.clone() * sigma;
    let x1 = x + v * (1.0 - sigma);
    let mean = x0 * (1.0 - sigma_next) + x1 * (sigma_next * sigma_next - std * std).max(0.0).sqrt();
    Ok(GaussianStep { mean, std, kind: SamplerKind::Cps })
}
