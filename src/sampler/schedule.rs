//! The FlowMatchEulerDiscrete schedule of diffusers (1000 training steps, shift `s`).

use burn::prelude::*;

use crate::error::Error;

/// The most sampling steps a schedule takes (diffusers trains on 1000 timesteps; more steps
/// only re-sample the same ones, and each stores a latent per sample in training).
pub(crate) const MAX_STEPS: usize = 10_000;

/// Training timesteps of the flow-matching scheduler.
pub(crate) const TRAIN_TIMESTEPS: f64 = 1000.0;

/// The dynamic shift of FLUX's scheduler: `mu` linear in the number of image tokens, through
/// `(base_image_seq_len, base_shift)` and `(max_image_seq_len, max_shift)` (diffusers'
/// `calculate_shift`; FLUX.1's values are the defaults).
#[derive(Config, Debug, PartialEq)]
pub struct DynamicShift {
    /// Image tokens at which `mu = base_shift`.
    #[config(default = 256)]
    pub base_image_seq_len: usize,
    /// `mu` at `base_image_seq_len`.
    #[config(default = 0.5)]
    pub base_shift: f64,
    /// Image tokens at which `mu = max_shift`.
    #[config(default = 4096)]
    pub max_image_seq_len: usize,
    /// `mu` at `max_image_seq_len`.
    #[config(default = 1.15)]
    pub max_shift: f64,
}

impl DynamicShift {
    /// `mu` for `image_tokens` tokens (the line is extended beyond both ends, as diffusers does).
    pub fn mu(&self, image_tokens: usize) -> f64 {
        let (x0, x1) = (self.base_image_seq_len as f64, self.max_image_seq_len as f64);
        let slope = (self.max_shift - self.base_shift) / (x1 - x0);
        self.base_shift + slope * (image_tokens as f64 - x0)
    }

    /// Reads a diffusers `scheduler_config.json` of a FlowMatchEulerDiscreteScheduler with
    /// `use_dynamic_shifting`; missing fields take diffusers' defaults, a scheduler without
    /// dynamic shifting or with another time-shift type is an error naming the field.
    pub fn from_scheduler_config(path: impl AsRef<std::path::Path>) -> crate::Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::format(path, format!("invalid JSON: {e}")))?;
        if json.get("use_dynamic_shifting").and_then(|v| v.as_bool()) != Some(true) {
            return Err(Error::format(path, "`use_dynamic_shifting` must be true for FLUX"));
        }
        for (key, supported) in [("time_shift_type", "exponential"), ("shift_terminal", "")] {
            match json.get(key) {
                None | Some(serde_json::Value::Null) => {}
                Some(v) if v.as_str() == Some(supported) => {}
                Some(v) => {
                    return Err(Error::format(path, format!("`{key}` {v} is not supported")))
                }
            }
        }
        for key in [
            "use_karras_sigmas",
            "use_exponential_sigmas",
            "use_beta_sigmas",
            "invert_sigmas",
            "stochastic_sampling",
        ] {
            if json.get(key).and_then(|v| v.as_bool()) == Some(true) {
                return Err(Error::format(path, format!("`{key}` is not supported")));
            }
        }
        let defaults = DynamicShift::new();
        let int = |k: &str, d: usize| -> crate::Result<usize> {
            match json.get(k) {
                None => Ok(d),
                Some(v) => v.as_u64().map(|x| x as usize).ok_or_else(|| {
                    Error::format(path, format!("`{k}` is {v}, not a whole number"))
                }),
            }
        };
        let float = |k: &str, d: f64| -> crate::Result<f64> {
            match json.get(k) {
                None => Ok(d),
                Some(v) => v
                    .as_f64()
                    .ok_or_else(|| Error::format(path, format!("`{k}` is {v}, not a number"))),
            }
        };
        let shift = DynamicShift {
            base_image_seq_len: int("base_image_seq_len", defaults.base_image_seq_len)?,
            base_shift: float("base_shift", defaults.base_shift)?,
            max_image_seq_len: int("max_image_seq_len", defaults.max_image_seq_len)?,
            max_shift: float("max_shift", defaults.max_shift)?,
        };
        if shift.base_image_seq_len == shift.max_image_seq_len {
            return Err(Error::format(
                path,
                "`base_image_seq_len` and `max_image_seq_len` are equal: mu is undefined",
            ));
        }
        Ok(shift)
    }
}

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

    /// The schedule of diffusers' `FluxPipeline` for `N` steps and `image_tokens` packed latent
    /// tokens (FlowMatchEuler with dynamic shifting, `shift` from the scheduler config):
    ///
    /// ```text
    /// mu      = base_shift + (max_shift - base_shift) (L - base_seq_len) / (max_seq_len - base_seq_len)
    /// t_i     = linspace(1, 1/N, N)
    /// sigma_i = e^mu / (e^mu + 1/t_i - 1) = shift(t_i) with s = e^mu   (shifted once)
    /// sigmas  = [sigma_0 .. sigma_{N-1}, 0]
    /// ```
    ///
    /// FLUX.1 at 512 px (1024 tokens), 6 steps: `[1, .90374, .78970, .65249, .48422, .27300, 0]`.
    pub fn dynamic(
        num_steps: usize,
        image_tokens: usize,
        shift: &DynamicShift,
    ) -> crate::Result<Self> {
        if !(2..=MAX_STEPS).contains(&num_steps) {
            return Err(Error::config(
                "num_steps",
                format!("must be between 2 and {MAX_STEPS}, got {num_steps}"),
            ));
        }
        let s = shift.mu(image_tokens).exp();
        let n = num_steps as f64;
        let mut sigmas: Vec<f64> = (0..num_steps)
            .map(|i| self::shift(s, 1.0 + (1.0 / n - 1.0) * i as f64 / (n - 1.0)))
            .collect();
        sigmas.push(0.0);
        Ok(FlowSchedule { sigmas, shift: s })
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

#[cfg(test)]
mod tests {
    use super::{DynamicShift, FlowSchedule};

    /// diffusers 0.42.1's `FluxPipeline` schedule (`calculate_shift` + `retrieve_timesteps` on
    /// FLUX.1-dev's scheduler config; `scheduler.sigmas`, stored in f32): 6 steps at 512 px, 4 at
    /// 1024 px (mu = max_shift), 3 at 16 tokens (mu below base_shift), and 28 at 512 px.
    #[test]
    fn flux_schedule_matches_diffusers() {
        let cases: [(usize, usize, &[f64]); 3] = [
            (6, 1024, &[1.0, 0.90373558, 0.78970480, 0.65248942, 0.48421842, 0.27300331, 0.0]),
            (4, 4096, &[1.0, 0.90453076, 0.75951093, 0.51284415, 0.0]),
            (3, 16, &[1.0, 0.75997132, 0.44182166, 0.0]),
        ];
        for (n, tokens, expected) in cases {
            let s = FlowSchedule::dynamic(n, tokens, &DynamicShift::new()).unwrap();
            assert_eq!(s.sigmas.len(), expected.len());
            for (a, b) in s.sigmas.iter().zip(expected) {
                assert!((a - b).abs() < 1e-6, "{n} steps, {tokens} tokens: {:?}", s.sigmas);
            }
        }
        let s = FlowSchedule::dynamic(28, 1024, &DynamicShift::new()).unwrap();
        for (i, b) in [(1, 0.98065597), (14, 0.65248942), (27, 0.06501960)] {
            assert!((s.sigmas[i] - b).abs() < 1e-6, "{:?}", s.sigmas);
        }
        assert!(FlowSchedule::dynamic(1, 1024, &DynamicShift::new()).is_err());
    }
}
