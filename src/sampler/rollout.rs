//! The rollout engine: batches of trajectories with an SDE window, and the batched ODE
//! completions of every intermediate state that TP-GRPO scores.

use std::ops::Range;

use burn::prelude::*;

use super::guidance::{Conditioning, Guidance, VelocityModel};
use super::noise::seeded_noise;
use super::schedule::{DynamicShift, FlowSchedule};
use super::step::{euler_step, SamplerKind};
use crate::error::Error;

/// How rollouts are sampled (defaults: the TP-GRPO SD3.5-medium scripts).
#[derive(Config, Debug, PartialEq)]
pub struct RolloutConfig {
    /// Scheduler steps `N`.
    #[config(default = 10)]
    pub num_steps: usize,
    /// Schedule shift (3 for SD3).
    #[config(default = 3.0)]
    pub shift: f64,
    /// FLUX: the scheduler's dynamic shift (`mu` from the number of 2x2-packed latent tokens),
    /// used instead of `shift`; `None` for SD3.
    #[config(default = "None")]
    pub dynamic_shift: Option<DynamicShift>,
    /// Guidance scale `g`: the CFG scale (SD3), or the embedded guidance (FLUX.1-dev).
    #[config(default = 4.5)]
    pub guidance: f64,
    /// Noise scale alpha of the stochastic steps (at most 1 with the CPS sampler).
    #[config(default = 0.7)]
    pub noise_level: f64,
    /// The stochastic sampler.
    #[config(default = "SamplerKind::Cps")]
    pub sampler: SamplerKind,
    /// First step of the SDE window.
    #[config(default = 0)]
    pub window_start: usize,
    /// Steps in the SDE window (the trained steps); steps outside it are Euler ODE steps.
    #[config(default = 9)]
    pub window_size: usize,
}

impl RolloutConfig {
    /// The trained steps `[window_start, window_start + window_size)`.
    pub fn window(&self) -> Range<usize> {
        self.window_start..self.window_start + self.window_size
    }

    /// The schedule of `steps` steps for latents `[C, H, W]`: SD3's shifted one, or FLUX's
    /// dynamically shifted one for `H/2 * W/2` tokens.
    pub fn flow_schedule(
        &self,
        steps: usize,
        [_, h, w]: [usize; 3],
    ) -> crate::Result<FlowSchedule> {
        match &self.dynamic_shift {
            None => FlowSchedule::new(steps, self.shift),
            Some(shift) => FlowSchedule::dynamic(steps, (h / 2) * (w / 2), shift),
        }
    }

    /// Checks the fields and builds the schedule of the rollouts for latents `[C, H, W]`.
    pub fn schedule(&self, latent_shape: [usize; 3]) -> crate::Result<FlowSchedule> {
        self.validate()?;
        self.flow_schedule(self.num_steps, latent_shape)
    }

    /// Checks the fields; a window reaching the last step (whose `sigma_next = 0` makes the
    /// step deterministic and the KL weight infinite) is rejected.
    pub fn validate(&self) -> crate::Result<()> {
        FlowSchedule::new(self.num_steps, self.shift)?;
        if let Some(shift) = &self.dynamic_shift {
            if shift.base_image_seq_len == shift.max_image_seq_len {
                return Err(Error::config(
                    "dynamic_shift",
                    "base_image_seq_len and max_image_seq_len are equal: mu is undefined",
                ));
            }
        }
        if !(self.noise_level.is_finite() && self.noise_level > 0.0) {
            return Err(Error::config(
                "noise_level",
                format!("must be > 0 for trained steps, got {}", self.noise_level),
            ));
        }
        // CPS's std is sigma_next sin(alpha pi / 2): alpha and 2 - alpha are one sampler.
        if self.sampler == SamplerKind::Cps && self.noise_level > 1.0 {
            return Err(Error::config(
                "noise_level",
                format!(
                    "must be at most 1 with the cps sampler, got {}: its step std \
                     sigma_next sin(alpha pi / 2) repeats above 1 (alpha and 2 - alpha give \
                     one sampler)",
                    self.noise_level
                ),
            ));
        }
        if self.window_size == 0 {
            return Err(Error::config("window_size", "must be at least 1"));
        }
        // `saturating_add`: a window start near `usize::MAX` must be refused, not wrap.
        if self.window_start.saturating_add(self.window_size) >= self.num_steps {
            return Err(Error::config(
                "window_start/window_size",
                format!(
                    "window of {} steps from step {} reaches step {} whose sigma_next is 0; \
                     trained steps must end before it",
                    self.window_size,
                    self.window_start,
                    self.num_steps - 1
                ),
            ));
        }
        Ok(())
    }
}

/// A batch of trajectories.
#[derive(Debug, Clone)]
pub struct Rollout<B: Backend> {
    /// `N + 1` latents `[B, C, H, W]`: the initial noise and the state after each step.
    pub latents: Vec<Tensor<B, 4>>,
    /// One `[B]` log-probability per trained step, in window order.
    pub log_probs: Vec<Tensor<B, 1>>,
    /// The trained steps.
    pub window: Range<usize>,
    /// The schedule (timesteps are `1000 sigma`).
    pub schedule: FlowSchedule,
    /// Velocity evaluations per sample (a guided pass counts once).
    pub nfe: usize,
}

/// Timesteps `[B]` all equal to `1000 sigma`.
fn timesteps<B: Backend>(sigma: f64, batch: usize, device: &B::Device) -> Tensor<B, 1> {
    Tensor::full([batch], sigma * 1000.0, device)
}

/// Samples one trajectory per seed: initial noise from stream 0 of each sample's seed, Euler
/// steps outside the SDE window, stochastic steps (noise from stream `i + 1`) inside it, CFG at
/// every step.
pub fn rollout<B: Backend, M: VelocityModel<B>>(
    model: &M,
    cfg: &RolloutConfig,
    seeds: &[u64],
    latent_shape: [usize; 3],
    cond: &Conditioning<B>,
    uncond: &Conditioning<B>,
    device: &B::Device,
) -> crate::Result<Rollout<B>> {
    let schedule = cfg.schedule(latent_shape)?;
    let b = seeds.len();
    let mut x = seeded_noise::<B>(seeds, 0, latent_shape, device);
    let guidance = Guidance::for_model(model, cond, uncond, cfg.guidance, b, 1)?;
    let mut latents = vec![x.clone()];
    let mut log_probs = Vec::new();
    for i in 0..schedule.num_steps() {
        let (sigma, sigma_next) = (schedule.sigmas[i], schedule.sigmas[i + 1]);
        let v = guidance.velocity(model, x.clone(), timesteps(sigma, b, device))?;
        x = if cfg.window().contains(&i) {
            let step = cfg.sampler.step(x, v, &schedule, i, cfg.noise_level)?;
            let next = step.sample(seeded_noise(seeds, i as u64 + 1, latent_shape, device));
            log_probs.push(step.log_prob(next.clone())?);
            next
        } else {
            euler_step(x, v, sigma, sigma_next)
        };
        latents.push(x.clone());
    }
    Ok(Rollout { latents, log_probs, window: cfg.window(), nfe: schedule.num_steps(), schedule })
}

/// The deterministic ODE completions `x0_ODE(s)` of states `x_s` (`[B, C, H, W]`, after `s`
/// steps), each run with guided Euler steps over `sigmas[s..]`. All completions that are at the
/// same step are advanced by ONE guided forward pass (the batches stacked), so the number of
/// passes is `N - min(s)` whatever the number of starts. Returns the clean samples in input
/// order and the velocity evaluations per sample.
pub fn ode_completions<B: Backend, M: VelocityModel<B>>(
    model: &M,
    schedule: &FlowSchedule,
    starts: &[(usize, Tensor<B, 4>)],
    cond: &Conditioning<B>,
    uncond: &Conditioning<B>,
    guidance: f64,
) -> crate::Result<(Vec<Tensor<B, 4>>, usize)> {
    let n = schedule.num_steps();
    if let Some((s, _)) = starts.iter().find(|(s, _)| *s > n) {
        return Err(Error::config(
            "step_index",
            format!("completion start {s} is past the last step {n}"),
        ));
    }
    let mut states: Vec<Tensor<B, 4>> = starts.iter().map(|(_, x)| x.clone()).collect();
    let first = starts.iter().map(|(s, _)| *s).min().unwrap_or(n);
    let mut nfe = 0;
    // The stacked conditioning for the current number of active completions, rebuilt only
    // when a new completion joins.
    let mut stacked: Option<(usize, Guidance<B>)> = None;
    for i in first..n {
        let active: Vec<usize> = (0..starts.len()).filter(|&j| starts[j].0 <= i).collect();
        let x = Tensor::cat(active.iter().map(|&j| states[j].clone()).collect(), 0);
        let b = x.dims()[0];
        let reps = active.len();
        if stacked.as_ref().is_none_or(|(r, _)| *r != reps) {
            stacked = Some((
                reps,
                Guidance::for_model(model, cond, uncond, guidance, cond.batch(), reps)?,
            ));
        }
        let (_, guided) = stacked.as_ref().expect("built above");
        let device = x.device();
        let (sigma, sigma_next) = (schedule.sigmas[i], schedule.sigmas[i + 1]);
        let v = guided.velocity(model, x.clone(), timesteps(sigma, b, &device))?;
        let next = euler_step(x, v, sigma, sigma_next);
        for (k, part) in next.chunk(reps, 0).into_iter().enumerate() {
            states[active[k]] = part;
        }
        nfe += reps;
    }
    Ok((states, nfe))
}

/// Generates clean samples from initial noise `[B, C, H, W]` at sigma 1: the guided Euler ODE
/// over the whole schedule (the ODE completion of step 0).
pub fn ode_sample<B: Backend, M: VelocityModel<B>>(
    model: &M,
    schedule: &FlowSchedule,
    noise: Tensor<B, 4>,
    cond: &Conditioning<B>,
    uncond: &Conditioning<B>,
    guidance: f64,
) -> crate::Result<Tensor<B, 4>> {
    let (mut out, _) = ode_completions(model, schedule, &[(0, noise)], cond, uncond, guidance)?;
    Ok(out.remove(0))
}
