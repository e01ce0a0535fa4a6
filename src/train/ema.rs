//! Exponential moving average of the trainable tensors, used for evaluation and checkpoints.

use burn::prelude::*;

/// EMA schedule (Flow-GRPO's `EMAModuleWrapper`): decay `min((1 + s) / (10 + s), max_decay)`
/// at optimizer step `s`, applied every `every` optimizer steps.
#[derive(Config, Debug, PartialEq)]
pub struct EmaConfig {
    /// Upper bound of the decay.
    #[config(default = 0.9)]
    pub max_decay: f64,
    /// Optimizer steps between updates.
    #[config(default = 8)]
    pub every: u64,
}

/// The averaged tensors, by name, and the number of updates applied.
#[derive(Debug, Clone)]
pub(crate) struct Ema<B: Backend> {
    /// Schedule.
    pub config: EmaConfig,
    /// Averaged tensors (start equal to the initial trainable tensors).
    pub tensors: Vec<(String, Tensor<B, 2>)>,
}

impl<B: Backend> Ema<B> {
    /// An average starting at `tensors`.
    pub(crate) fn new(config: EmaConfig, tensors: Vec<(String, Tensor<B, 2>)>) -> Self {
        Ema { config, tensors }
    }

    /// The decay used after optimizer step `step`.
    pub(crate) fn decay(&self, step: u64) -> f64 {
        ((1.0 + step as f64) / (10.0 + step as f64)).min(self.config.max_decay)
    }

    /// After optimizer step `step` (1-based): when `step` is a multiple of `every`,
    /// `ema <- d ema + (1 - d) param` with `d = decay(step)`. Returns whether it updated;
    /// `params` must name the averaged tensors in the same order.
    pub(crate) fn update(
        &mut self,
        step: u64,
        params: &[(String, Tensor<B, 2>)],
    ) -> crate::Result<bool> {
        let names =
            |v: &[(String, Tensor<B, 2>)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        if names(&self.tensors) != names(params) {
            return Err(crate::Error::config(
                "ema",
                "the averaged tensors are not the trained ones",
            ));
        }
        if !step.is_multiple_of(self.config.every) {
            return Ok(false);
        }
        let d = self.decay(step);
        for ((_, e), (_, p)) in self.tensors.iter_mut().zip(params) {
            *e = e.clone() * d + p.clone() * (1.0 - d);
        }
        Ok(true)
    }
}
