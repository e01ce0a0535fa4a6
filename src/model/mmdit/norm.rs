//! Adaptive layer norms: AdaLN-Zero (6 or 9 chunks) inside blocks, AdaLN-continuous at the ends.

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::silu;

use crate::model::precision::in_f32;

/// Epsilon of every LayerNorm in the MMDiT.
pub(crate) const LN_EPS: f64 = 1e-6;

/// LayerNorm over the last dimension without affine weights (torch `elementwise_affine=False`),
/// computed in f32 whatever the activations' dtype (as torch does under autocast).
pub(crate) fn layer_norm<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    in_f32(x, |x| {
        let (var, mean) = x.clone().var_mean_bias(D - 1);
        (x - mean) / (var + LN_EPS).sqrt()
    })
}

/// `modulate(n, shift, scale) = n * (1 + scale) + shift`, with `shift, scale: [B, D]`
/// broadcast over the tokens of `n: [B, N, D]`.
pub(crate) fn modulate<B: Backend>(
    n: Tensor<B, 3>,
    shift: Tensor<B, 2>,
    scale: Tensor<B, 2>,
) -> Tensor<B, 3> {
    n * (scale.unsqueeze_dim::<3>(1) + 1.0) + shift.unsqueeze_dim(1)
}

/// The output of [`AdaLayerNormZero`]: the modulated input plus the gates and MLP modulation.
#[derive(Debug, Clone)]
pub(crate) struct ZeroModulation<B: Backend> {
    /// `modulate(LN(x), shift_msa, scale_msa)`.
    pub x: Tensor<B, 3>,
    /// Gate of the attention residual.
    pub gate_msa: Tensor<B, 2>,
    /// Shift of the MLP input.
    pub shift_mlp: Tensor<B, 2>,
    /// Scale of the MLP input.
    pub scale_mlp: Tensor<B, 2>,
    /// Gate of the MLP residual.
    pub gate_mlp: Tensor<B, 2>,
    /// Dual-attention blocks: `modulate(LN(x), shift_msa2, scale_msa2)` and its gate.
    pub second: Option<(Tensor<B, 3>, Tensor<B, 2>)>,
}

/// AdaLN-Zero: `Linear(SiLU(temb))` chunked as shift_msa, scale_msa, gate_msa, shift_mlp,
/// scale_mlp, gate_mlp (and shift_msa2, scale_msa2, gate_msa2 in SD3.5 dual-attention blocks).
#[derive(Module, Debug)]
pub(crate) struct AdaLayerNormZero<B: Backend> {
    /// `Linear(D, 6D)` or `Linear(D, 9D)`.
    pub(crate) linear: Linear<B>,
    /// Whether the norm has the three extra chunks of a dual-attention block.
    pub dual: bool,
}

/// Settings of an [`AdaLayerNormZero`].
#[derive(Config, Debug)]
pub(crate) struct AdaLayerNormZeroConfig {
    /// Width of the stream.
    dim: usize,
    /// Three more chunks for the second attention of a dual-attention block.
    #[config(default = false)]
    dual_attention: bool,
}

impl AdaLayerNormZeroConfig {
    /// A 6-chunk norm, or a 9-chunk one for a dual-attention block.
    pub(crate) fn init<B: Backend>(&self, device: &B::Device) -> AdaLayerNormZero<B> {
        let chunks = if self.dual_attention { 9 } else { 6 };
        AdaLayerNormZero {
            linear: LinearConfig::new(self.dim, chunks * self.dim).init(device),
            dual: self.dual_attention,
        }
    }
}

impl<B: Backend> AdaLayerNormZero<B> {
    /// Modulates `x [B, N, D]` by `temb [B, D]`.
    pub(crate) fn forward(&self, x: Tensor<B, 3>, temb: Tensor<B, 2>) -> ZeroModulation<B> {
        let chunks = if self.dual { 9 } else { 6 };
        let mut c = self.linear.forward(silu(temb)).chunk(chunks, 1).into_iter();
        let mut next = || c.next().expect("chunk count");
        let (shift_msa, scale_msa, gate_msa) = (next(), next(), next());
        let (shift_mlp, scale_mlp, gate_mlp) = (next(), next(), next());
        let n = layer_norm(x);
        let second = (chunks == 9).then(|| {
            let (shift2, scale2, gate2) = (next(), next(), next());
            (modulate(n.clone(), shift2, scale2), gate2)
        });
        ZeroModulation {
            x: modulate(n, shift_msa, scale_msa),
            gate_msa,
            shift_mlp,
            scale_mlp,
            gate_mlp,
            second,
        }
    }
}

/// AdaLN-continuous: `Linear(SiLU(temb))` chunked as **scale, shift**, applied to `LN(x)`.
#[derive(Module, Debug)]
pub(crate) struct AdaLayerNormContinuous<B: Backend> {
    /// `Linear(D, 2D)`.
    pub(crate) linear: Linear<B>,
}

/// Settings of an [`AdaLayerNormContinuous`].
#[derive(Config, Debug)]
pub(crate) struct AdaLayerNormContinuousConfig {
    /// Width of the stream.
    dim: usize,
}

impl AdaLayerNormContinuousConfig {
    /// A continuous AdaLN of width `dim`.
    pub(crate) fn init<B: Backend>(&self, device: &B::Device) -> AdaLayerNormContinuous<B> {
        AdaLayerNormContinuous { linear: LinearConfig::new(self.dim, 2 * self.dim).init(device) }
    }
}

impl<B: Backend> AdaLayerNormContinuous<B> {
    /// `LN(x) * (1 + scale) + shift` with `[scale, shift] = Linear(SiLU(temb))`.
    pub(crate) fn forward(&self, x: Tensor<B, 3>, temb: Tensor<B, 2>) -> Tensor<B, 3> {
        let [scale, shift] =
            self.linear.forward(silu(temb)).chunk(2, 1).try_into().expect("two chunks");
        modulate(layer_norm(x), shift, scale)
    }
}
