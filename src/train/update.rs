//! The update phase of an epoch: the clipped per-step loss with CFG and the KL penalty,
//! gradients summed over micro-batches and trained steps, global-norm clipping, AdamW on the
//! adapter factors and the EMA.

use crate::model::Adaptable;
use std::collections::BTreeMap;

use burn::module::AutodiffModule;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

use super::collect::Batch;
use super::config::TrainConfig;
use super::ema::Ema;
use super::noise_scale::GradientNoise;
use super::observe::Observer;
use super::optim::{clip_global_norm, squared_norm, AdamW};
use crate::error::Result;
use crate::finite::ensure_finite;
use crate::grpo::{kl_penalty, policy_loss, LossStats};
use crate::model::Denoiser;
use crate::sampler::guidance::select_rows;
use crate::sampler::{Conditioning, FlowSchedule, Guidance};

/// Gradients of the adapter factors by name.
pub(crate) type Gradients<B> = BTreeMap<String, Tensor<B, 2>>;

/// What an epoch's optimizer steps measured.
#[derive(Default)]
pub(crate) struct UpdateStats {
    /// One entry per micro-batch and trained step, with the micro-batch's sample count.
    pub loss: Vec<(usize, LossStats)>,
    /// The global gradient norm before clipping, per optimizer step.
    pub grad_norm: Vec<f64>,
    /// Gradient-noise estimates of the optimizer steps with two or more micro-batches.
    pub noise: Vec<GradientNoise>,
}

/// Adds `grad` to the gradient named `name` in `grads` (inserts it when absent).
pub(crate) fn add_gradient<B: Backend>(grads: &mut Gradients<B>, name: String, grad: Tensor<B, 2>) {
    let sum = match grads.remove(&name) {
        Some(acc) => acc + grad,
        None => grad,
    };
    grads.insert(name, sum);
}

/// `rows` split into micro-batches: whole ones of `size` rows, then the remainder in
/// power-of-two parts, largest first (55 rows at size 16: 16, 16, 16, 4, 2, 1).
///
/// The informative samples of a step vary from epoch to epoch, and the JIT backends compile
/// new kernels for a new batch size (docs/gpu.md: batch 13 after 16 compiled 56 new ones): a
/// plain last micro-batch of `rows mod size` rows would bring up to `size - 1` new sizes over
/// a run, this at most `log2(size)`. The gradient is the same sum of per-sample terms either
/// way; only its summation order changes. `size` is positive (`TrainConfig::validate`).
pub(crate) fn micro_batches(rows: &[usize], size: usize) -> Vec<&[usize]> {
    assert!(size > 0, "micro-batches of 0 rows");
    let whole = rows.len() / size * size;
    let mut out: Vec<&[usize]> = rows[..whole].chunks(size).collect();
    let mut rest = &rows[whole..];
    while !rest.is_empty() {
        let part = 1 << rest.len().ilog2();
        out.push(&rest[..part]);
        rest = &rest[part..];
    }
    out
}

fn lift<B: AutodiffBackend>(c: &Conditioning<B::InnerBackend>) -> Conditioning<B> {
    Conditioning {
        text: Tensor::from_inner(c.text.clone()),
        pooled: Tensor::from_inner(c.pooled.clone()),
    }
}

/// The per-step losses of an epoch's batch: what every micro-batch's loss reads.
pub(crate) struct StepLosses<'a, B: AutodiffBackend> {
    /// The settings.
    pub config: &'a TrainConfig,
    /// The collected batch.
    pub batch: &'a Batch<B::InnerBackend>,
    /// `[sample][trained step]` advantages.
    pub advantages: &'a [Vec<f64>],
    /// The reference policy of the KL term (adapters off).
    pub reference: Denoiser<B::InnerBackend>,
    /// The rollouts' schedule.
    pub schedule: FlowSchedule,
}

/// One micro-batch: its rows and their CFG conditioning, for the policy (autodiff) and the
/// reference (inner backend), built once for all trained steps.
struct MicroBatch<'r, B: AutodiffBackend> {
    rows: &'r [usize],
    /// The rows' places in this replica's states.
    local: Vec<usize>,
    guide: Guidance<B>,
    guide_ref: Guidance<B::InnerBackend>,
}

impl<'a, B: AutodiffBackend> StepLosses<'a, B> {
    /// The losses of `batch` with `advantages` under `config`, against the reference policy
    /// of `model` (its adapters off).
    pub(crate) fn new(
        config: &'a TrainConfig,
        batch: &'a Batch<B::InnerBackend>,
        advantages: &'a [Vec<f64>],
        model: &Denoiser<B>,
    ) -> Result<Self> {
        let shape = batch.states[0].dims();
        let schedule = config.rollout.schedule([shape[1], shape[2], shape[3]])?;
        Ok(StepLosses { config, batch, advantages, reference: reference_policy(model), schedule })
    }

    /// The gradients of one micro-batch (`rows`, samples of this replica's batch) summed over
    /// every trained step, each step's loss (a mean over the rows) scaled by `scale`, and the
    /// loss statistics of each step.
    pub(crate) fn gradients(
        &self,
        model: &Denoiser<B>,
        rows: &[usize],
        scale: f64,
        observer: &mut dyn Observer,
    ) -> Result<(Gradients<B::InnerBackend>, Vec<LossStats>)> {
        let (batch, b, g) = (self.batch, rows.len(), self.config.rollout.guidance);
        let ids: Vec<usize> = rows.iter().map(|&i| batch.prompt_ids[i]).collect();
        let (c, u) = (batch.cond.select(&ids), batch.empty.select(&vec![0; b]));
        let micro = MicroBatch {
            rows,
            local: rows.iter().map(|&i| i - batch.rows.start).collect(),
            guide: Guidance::for_model(model, &lift::<B>(&c), &lift::<B>(&u), g, b, 1)?,
            guide_ref: Guidance::for_model(&self.reference, &c, &u, g, b, 1)?,
        };
        let (mut grads, mut stats) = (Gradients::new(), Vec::new());
        for (j, k) in self.config.rollout.window().enumerate() {
            let (loss, s) = self.step_loss(model, &micro, j, k)?;
            let g = (loss * scale).backward();
            for (name, t) in model.lora_tensors() {
                if let Some(grad) = t.grad(&g) {
                    add_gradient(&mut grads, name, grad);
                }
            }
            stats.push(s);
            observer.advance(1);
        }
        Ok((grads, stats))
    }

    /// The loss of trained step `j` (scheduler step `k`) on a micro-batch: the policy's CFG
    /// velocity at the stored `x_k`, the log-prob of the stored `x_{k+1}`, the clipped policy
    /// loss, plus `kl_beta` times the KL to the reference policy's step.
    fn step_loss(
        &self,
        model: &Denoiser<B>,
        micro: &MicroBatch<'_, B>,
        j: usize,
        k: usize,
    ) -> Result<(Tensor<B, 1>, LossStats)> {
        let (cfg, batch, rows) = (self.config, self.batch, micro.rows);
        let (obj, ro, b) = (&cfg.objective, &cfg.rollout, rows.len());
        let device = model.devices()[0].clone();
        let local = &micro.local;
        let x_inner = select_rows(&batch.states[k], local);
        let x_next = Tensor::<B, 4>::from_inner(select_rows(&batch.states[k + 1], local));
        let old = Tensor::<B, 1>::from_inner(select_rows(&batch.old_log_probs[j], local));
        let adv: Vec<f32> = rows.iter().map(|&i| self.advantages[i][j] as f32).collect();
        let adv = Tensor::<B, 1>::from_data(TensorData::new(adv, [b]), &device);
        let sigma = self.schedule.sigmas[k] * 1000.0;
        let x = Tensor::<B, 4>::from_inner(x_inner.clone());
        let v = micro.guide.velocity(model, x.clone(), Tensor::full([b], sigma, &device))?;
        let step = ro.sampler.step(x, v, &self.schedule, k, ro.noise_level)?;
        let (pg, mut stats) =
            policy_loss(step.log_prob(x_next)?, old, adv, obj.clip_range, obj.adv_clip_max);
        if obj.kl_beta == 0.0 {
            return Ok((pg, stats));
        }
        let t_ref = Tensor::full([b], sigma, &x_inner.device());
        let v_ref = micro.guide_ref.velocity(&self.reference, x_inner.clone(), t_ref)?;
        let ref_step = ro.sampler.step(x_inner, v_ref, &self.schedule, k, ro.noise_level)?;
        let std = Tensor::full([b], step.std, &device);
        let kl = kl_penalty(step.mean, Tensor::from_inner(ref_step.mean), std);
        stats.kl = kl.clone().into_scalar().elem::<f64>();
        Ok((pg + kl * obj.kl_beta, stats))
    }
}

/// One optimizer step's gradient, summed micro-batch by micro-batch, with the squared norms
/// of the micro-batch means that the gradient-noise estimate needs.
pub(crate) struct StepGradient<B: Backend> {
    /// The sum of the shares added so far.
    pub grads: Gradients<B>,
    /// `(rows, |micro-batch mean gradient|^2)` per micro-batch.
    pub micro_sq: Vec<(usize, f64)>,
    step_rows: usize,
}

impl<B: Backend> StepGradient<B> {
    /// An empty gradient of a step over `step_rows` samples (on all replicas together).
    pub(crate) fn new(step_rows: usize) -> Self {
        StepGradient { grads: Gradients::new(), micro_sq: Vec::new(), step_rows }
    }

    /// Adds a micro-batch of `rows` samples whose `share` is its mean gradient times
    /// `rows / step_rows` (every sample of the step weighs the same), so that
    /// `(step_rows / rows)^2 |share|^2` is the squared norm of its mean.
    pub(crate) fn add(&mut self, rows: usize, share: Gradients<B>) {
        let m = self.step_rows as f64 / rows as f64;
        self.micro_sq.push((rows, m * m * squared_norm(&share)));
        for (name, g) in share {
            add_gradient(&mut self.grads, name, g);
        }
    }
}

/// `grads` with a zero gradient for every adapter factor of `model` it lacks (factors
/// without a gradient path, such as the last block's text queries, or a replica with no
/// sample in a step).
pub(crate) fn complete<B: AutodiffBackend>(
    model: &Denoiser<B>,
    mut grads: Gradients<B::InnerBackend>,
) -> Gradients<B::InnerBackend> {
    for (name, p) in model.lora_tensors() {
        grads.entry(name).or_insert_with(|| p.inner().zeros_like());
    }
    grads
}

/// Clips `grads` to the global norm `max_norm`, takes an AdamW step on `model`'s adapter
/// factors, updates the EMA and returns the updated model and the norm before clipping.
/// Factors without a gradient get zero gradients ([`complete`]).
pub(crate) fn optimizer_step<B: AutodiffBackend>(
    model: Denoiser<B>,
    optimizer: &mut AdamW<B::InnerBackend>,
    ema: &mut Ema<B::InnerBackend>,
    grads: Gradients<B::InnerBackend>,
    max_norm: f64,
) -> Result<(Denoiser<B>, f64)> {
    let mut grads = complete(&model, grads);
    let params: Vec<(String, Tensor<B::InnerBackend, 2>)> =
        model.lora_tensors().into_iter().map(|(n, t)| (n, t.inner())).collect();
    let norm = clip_global_norm(&mut grads, max_norm);
    if !norm.is_finite() {
        for (name, g) in &grads {
            ensure_finite(
                g,
                &format!("gradient of {name} (optimizer step {})", optimizer.step + 1),
            )?;
        }
    }
    let updated = optimizer.step(params, &grads)?;
    for (name, t) in &updated {
        ensure_finite(t, &format!("adapter {name} after optimizer step {}", optimizer.step))?;
    }
    ema.update(optimizer.step, &updated)?;
    let lifted = updated.into_iter().map(|(n, t)| (n, Tensor::from_inner(t))).collect();
    Ok((model.with_lora_tensors(lifted)?, norm))
}

/// The reference policy of the KL term: `model` with its adapters off, on the inner backend.
pub(crate) fn reference_policy<B: AutodiffBackend>(
    model: &Denoiser<B>,
) -> Denoiser<B::InnerBackend> {
    model.valid().adapters_off()
}

#[cfg(test)]
mod tests {
    use super::micro_batches;

    fn sizes(n: usize, size: usize) -> Vec<usize> {
        let rows: Vec<usize> = (0..n).collect();
        let parts = micro_batches(&rows, size);
        assert_eq!(parts.concat(), rows, "{n} rows at {size}: every row once, in order");
        parts.iter().map(|p| p.len()).collect()
    }

    #[test]
    fn micro_batches_are_whole_then_powers_of_two() {
        assert_eq!(sizes(55, 16), [16, 16, 16, 4, 2, 1]);
        assert_eq!(sizes(64, 16), [16, 16, 16, 16]);
        assert_eq!(sizes(15, 16), [8, 4, 2, 1]);
        assert_eq!(sizes(0, 16), Vec::<usize>::new());
        assert_eq!(sizes(29, 12), [12, 12, 4, 1]);
        assert_eq!(sizes(3, 1), [1, 1, 1]);
        // Every count below 200 uses at most log2(16) + 1 = 5 distinct shapes at size 16.
        let mut shapes: Vec<usize> = (0..200).flat_map(|n| sizes(n, 16)).collect();
        shapes.sort_unstable();
        shapes.dedup();
        assert_eq!(shapes, [1, 2, 4, 8, 16]);
    }
}
