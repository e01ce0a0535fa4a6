//! AdamW over named tensors (the LoRA factors), with torch's update rule and global-norm
//! gradient clipping.
//!
//! Burn's `AdamW` is keyed by `ParamId`s that change whenever adapters are rebuilt from a file,
//! and its gradient clipping is per tensor; the trainer needs torch's *global* norm and an
//! optimizer state that checkpoints by name, so the few lines of the update live here.

use std::collections::BTreeMap;

use burn::prelude::*;

/// AdamW hyper-parameters (the TP-GRPO defaults).
#[derive(Config, Debug, PartialEq)]
pub struct AdamWConfig {
    /// Learning rate.
    #[config(default = 3e-4)]
    pub lr: f64,
    /// First-moment decay `beta_1`.
    #[config(default = 0.9)]
    pub beta1: f64,
    /// Second-moment decay `beta_2`.
    #[config(default = 0.999)]
    pub beta2: f64,
    /// `epsilon` added to `sqrt(v_hat)` (torch's default, not Burn's 1e-5).
    #[config(default = 1e-8)]
    pub eps: f64,
    /// Decoupled weight decay.
    #[config(default = 1e-4)]
    pub weight_decay: f64,
}

/// Moments of one tensor.
#[derive(Debug, Clone)]
pub struct Moments<B: Backend> {
    /// First moment `m`.
    pub exp_avg: Tensor<B, 2>,
    /// Second moment `v`.
    pub exp_avg_sq: Tensor<B, 2>,
}

/// AdamW state: the step count and the moments of every tensor by name.
#[derive(Debug, Clone)]
pub(crate) struct AdamW<B: Backend> {
    /// Hyper-parameters.
    pub config: AdamWConfig,
    /// Optimizer steps taken.
    pub step: u64,
    /// Moments by tensor name.
    pub moments: BTreeMap<String, Moments<B>>,
}

impl<B: Backend> AdamW<B> {
    /// A fresh optimizer.
    pub(crate) fn new(config: AdamWConfig) -> Self {
        AdamW { config, step: 0, moments: BTreeMap::new() }
    }

    /// One AdamW step (torch's rule) on `params` with `grads` of the same names:
    ///
    /// ```text
    /// p <- p - lr * wd * p
    /// m <- b1 m + (1 - b1) g,   v <- b2 v + (1 - b2) g^2
    /// p <- p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
    /// ```
    pub(crate) fn step(
        &mut self,
        params: Vec<(String, Tensor<B, 2>)>,
        grads: &BTreeMap<String, Tensor<B, 2>>,
    ) -> crate::Result<Vec<(String, Tensor<B, 2>)>> {
        self.step += 1;
        let c = &self.config;
        let t = self.step as i32;
        let (bc1, bc2) = (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t));
        let mut out = Vec::with_capacity(params.len());
        for (name, p) in params {
            let g = grads
                .get(&name)
                .ok_or_else(|| crate::Error::Internal(format!("no gradient for `{name}`")))?
                .clone();
            let state = self
                .moments
                .remove(&name)
                .unwrap_or_else(|| Moments { exp_avg: g.zeros_like(), exp_avg_sq: g.zeros_like() });
            let m = state.exp_avg * c.beta1 + g.clone() * (1.0 - c.beta1);
            let v = state.exp_avg_sq * c.beta2 + g.square() * (1.0 - c.beta2);
            let denom = (v.clone() / bc2).sqrt() + c.eps;
            let p = p.clone() - p * (c.lr * c.weight_decay);
            let p = p - (m.clone() / bc1) / denom * c.lr;
            self.moments.insert(name.clone(), Moments { exp_avg: m, exp_avg_sq: v });
            out.push((name, p));
        }
        Ok(out)
    }
}

/// The squared global L2 norm of `grads`: the sum of every element's square, reduced on the
/// device and read back once.
pub(crate) fn squared_norm<B: Backend>(grads: &BTreeMap<String, Tensor<B, 2>>) -> f64 {
    grads
        .values()
        .map(|g| g.clone().square().sum())
        .reduce(|a, b| a + b)
        .map_or(0.0, |total| total.into_scalar().elem::<f64>())
}

/// Scales `grads` so their global L2 norm is at most `max_norm` (torch's `clip_grad_norm_`:
/// factor `max_norm / (norm + 1e-6)` when below 1); returns the norm before clipping.
pub(crate) fn clip_global_norm<B: Backend>(
    grads: &mut BTreeMap<String, Tensor<B, 2>>,
    max_norm: f64,
) -> f64 {
    let total = squared_norm(grads).sqrt();
    let factor = max_norm / (total + 1e-6);
    if factor < 1.0 {
        for g in grads.values_mut() {
            *g = g.clone() * factor;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend as B;

    #[test]
    fn adamw_matches_torch_rule_by_hand() {
        let device = Default::default();
        let (lr, b1, b2, eps, wd) = (0.1, 0.9, 0.999, 1e-8, 0.01);
        let config = AdamWConfig::new()
            .with_lr(lr)
            .with_beta1(b1)
            .with_beta2(b2)
            .with_eps(eps)
            .with_weight_decay(wd);
        let mut opt = AdamW::<B>::new(config);
        let mut p = [1.0f64, -2.0];
        let grads = [[0.5f64, -0.25], [-1.0, 0.75]];
        let (mut m, mut v) = ([0.0f64; 2], [0.0f64; 2]);
        let mut tensor = Tensor::<B, 2>::from_floats([[1.0, -2.0]], &device);
        for (t, g) in grads.iter().enumerate() {
            let t = t as i32 + 1;
            for i in 0..2 {
                p[i] -= lr * wd * p[i];
                m[i] = b1 * m[i] + (1.0 - b1) * g[i];
                v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
                let (mh, vh) = (m[i] / (1.0 - b1.powi(t)), v[i] / (1.0 - b2.powi(t)));
                p[i] -= lr * mh / (vh.sqrt() + eps);
            }
            let g = BTreeMap::from([(
                "w".to_string(),
                Tensor::<B, 2>::from_floats([[g[0] as f32, g[1] as f32]], &device),
            )]);
            tensor = opt.step(vec![("w".into(), tensor)], &g).unwrap().remove(0).1;
        }
        let got: Vec<f32> = tensor.into_data().to_vec().unwrap();
        assert!((got[0] as f64 - p[0]).abs() < 1e-6 && (got[1] as f64 - p[1]).abs() < 1e-6);
        assert_eq!(opt.step, 2);
        let missing =
            opt.step(vec![("x".into(), Tensor::zeros([1, 1], &device))], &BTreeMap::new());
        assert!(missing.unwrap_err().to_string().contains("`x`"));
    }

    #[test]
    fn global_norm_clipping_by_hand() {
        let device = Default::default();
        let mut g = BTreeMap::from([
            ("a".to_string(), Tensor::<B, 2>::from_floats([[3.0]], &device)),
            ("b".to_string(), Tensor::<B, 2>::from_floats([[0.0, 4.0]], &device)),
        ]);
        let norm = clip_global_norm(&mut g, 1.0);
        assert!((norm - 5.0).abs() < 1e-9);
        let a: f32 = g["a"].clone().into_scalar().elem();
        assert!((a - 0.6).abs() < 1e-6, "{a}");
        // Below the limit nothing changes.
        let norm = clip_global_norm(&mut g, 10.0);
        assert!((norm - 1.0).abs() < 1e-5);
        assert!((g["a"].clone().into_scalar().elem::<f32>() - a).abs() == 0.0);
    }
}
