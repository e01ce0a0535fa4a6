//! The FlowMatchEulerDiscrete schedule of diffusers (1000 training steps, shift `s`).

use crate::error::Error;

/// The most sampling steps a schedule takes (diffusers trains on 1000 timesteps; more steps
/// only re-sample the same ones, and each stores a latent per sample in training).
pub(crate) const MAX_STEPS: usize = 10_000;

/// Training timesteps of the flow-matching scheduler.
pub(crate) const TRAIN_TIMESTEPS: f64 = 1000.0;

/// The noise levels of an N-step sampling run: `N + 1` sigmas from 1 down to 0.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowSchedule {
    /// `sigmas[0] = 1 > ... > sigmas[N-1] > sigmas[N] = 0`.
    pub sigmas: Vec<f64>,
    /// The shift `s` the schedule was built with.
    pub shift: f64,
}

/// `shift(u) = s u / (1 + (s - 1) u)`.
fn shift(s: f64, u: f64) -> f64 {
    s * u / (1.0 + (s - 1.0) * u)
}

impl FlowSchedule {
    /// The schedule of diffusers' `FlowMatchEulerDiscreteScheduler.set_timesteps(N)` with shift
    /// `s` (3 for SD3):
    ///
    /// ```text
    /// sigma_min = shift(1 / 1000),  sigma_max = shift(1) = 1
    /// t_i       = linspace(1000 sigma_max, 1000 sigma_min, N)
    /// sigma_i   = shift(t_i / 1000)        (shifted a second time, as diffusers does)
    /// sigmas    = [sigma_0 .. sigma_{N-1}, 0]
    /// ```
    pub fn new(num_steps: usize, shift_s: f64) -> crate::Result<Self> {
        if !(2..=MAX_STEPS).contains(&num_steps) {
            return Err(Error::config(
                "num_steps",
                format!("must be between 2 and {MAX_STEPS}, got {num_steps}"),
            ));
        }
        if !(shift_s.is_finite() && shift_s > 0.0) {
            return Err(Error::config(
                "shift",
                format!("must be a positive number, got {shift_s}"),
            ));
        }
        let (hi, lo) = (
            shift(shift_s, 1.0) * TRAIN_TIMESTEPS,
            shift(shift_s, 1.0 / TRAIN_TIMESTEPS) * TRAIN_TIMESTEPS,
        );
        let n = num_steps as f64 - 1.0;
        let mut sigmas: Vec<f64> = (0..num_steps)
            .map(|i| shift(shift_s, (hi + (lo - hi) * i as f64 / n) / TRAIN_TIMESTEPS))
            .collect();
        sigmas.push(0.0);
        Ok(FlowSchedule { sigmas, shift: shift_s })
    }

    /// The number of sampling steps `N`.
    pub fn num_steps(&self) -> usize {
        self.sigmas.len() - 1
    }

    /// The timesteps fed to the model, `1000 sigma_i` for `i < N` (floats, not rounded).
    pub fn timesteps(&self) -> Vec<f64> {
        self.sigmas[..self.num_steps()].iter().map(|s| s * TRAIN_TIMESTEPS).collect()
    }
}
