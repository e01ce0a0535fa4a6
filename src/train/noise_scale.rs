//! The gradient noise scale (McCandlish et al., 2018, "An Empirical Model of Large-Batch
//! Training"): how many samples an update needs before its gradient is more signal than noise.

/// Unbiased estimates of the squared true gradient `|G|^2` and the per-sample gradient
/// variance `tr(Sigma)`, from one update's micro-batch and full-batch gradients.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradientNoise {
    /// Estimate of `|G|^2`, the squared norm of the expected gradient (can come out negative
    /// when the noise dominates).
    pub signal_sq: f64,
    /// Estimate of `tr(Sigma)`, the summed variance of one sample's gradient.
    pub noise_trace: f64,
}

impl GradientNoise {
    /// The estimates of one update from the squared norms of its `m` micro-batches' mean
    /// gradients `micro[i] = (b_i, |G_i|^2)` and of the update's gradient `full_sq = |G_full|^2`,
    /// `G_full = sum_i b_i G_i / B` being the mean over all `B = sum_i b_i` samples (how the
    /// trainer accumulates them: every sample weighs the same).
    ///
    /// A mean of `b` independent sample gradients has `E|G_b|^2 = |G|^2 + tr(Sigma) / b`; with
    /// `s = mean_i |G_i|^2` and `h = mean_i 1/b_i`, `E s = |G|^2 + h tr(Sigma)` and
    /// `E |G_full|^2 = |G|^2 + tr(Sigma) / B`, so `tr(Sigma) = (s - |G_full|^2) / (h - 1/B)`
    /// and `|G|^2 = |G_full|^2 - tr(Sigma) / B` (the paper's appendix A.1, written for
    /// micro-batches of any sizes; `h > 1/B` once `m >= 2`). `None` with fewer than two
    /// micro-batches: nothing then separates signal from noise.
    pub fn estimate(micro: &[(usize, f64)], full_sq: f64) -> Option<Self> {
        if micro.len() < 2 || micro.iter().any(|&(b, _)| b == 0) {
            return None;
        }
        let m = micro.len() as f64;
        let total = micro.iter().map(|&(b, _)| b as f64).sum::<f64>();
        let s = micro.iter().map(|&(_, g2)| g2).sum::<f64>() / m;
        let h = micro.iter().map(|&(b, _)| 1.0 / b as f64).sum::<f64>() / m;
        let noise_trace = (s - full_sq) / (h - 1.0 / total);
        Some(GradientNoise { signal_sq: full_sq - noise_trace / total, noise_trace })
    }

    /// The mean of `estimates` (each field averaged); `None` when there are none.
    pub fn mean(estimates: &[GradientNoise]) -> Option<Self> {
        let n = estimates.len() as f64;
        (!estimates.is_empty()).then(|| GradientNoise {
            signal_sq: estimates.iter().map(|e| e.signal_sq).sum::<f64>() / n,
            noise_trace: estimates.iter().map(|e| e.noise_trace).sum::<f64>() / n,
        })
    }

    /// The noise scale `B_noise = tr(Sigma) / |G|^2` of averaged estimates (the paper
    /// averages numerator and denominator separately over many updates, then divides): the
    /// batch size, in samples, at which an update's gradient noise equals its signal. `None`
    /// when there are no estimates or the averaged signal is not positive (noise so large
    /// that these updates cannot measure the signal).
    pub fn scale(estimates: &[GradientNoise]) -> Option<f64> {
        let mean = Self::mean(estimates)?;
        (mean.signal_sq > 0.0).then(|| mean.noise_trace / mean.signal_sq)
    }
}
