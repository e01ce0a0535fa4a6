//! The joint transformer block: AdaLN-modulated joint attention and MLPs on the image and
//! text streams (diffusers `JointTransformerBlock`).

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;

use super::attention::{JointAttention, SelfAttention};
use super::norm::{layer_norm, modulate, AdaLayerNormContinuous, AdaLayerNormZero};

/// GELU with the tanh approximation, `0.5 x (1 + tanh(z))`, `z = sqrt(2/pi) (x + 0.044715 x^3)`,
/// evaluated as the identical `x * sigmoid(2z) = x / (1 + exp(-2z))`: one exponential instead of
/// Burn's `tanh` (f64 per element on ndarray) and `powf` (8x faster there). `-2z` is clamped to
/// `[-40, 40]`, where `tanh(z)` is already `+-1` in f32, so neither value nor gradient overflows.
pub(crate) fn gelu_tanh<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
    let cube = x.clone() * x.clone() * x.clone();
    let minus_2z = (x.clone() + cube * 0.044715) * (-2.0 * SQRT_2_OVER_PI);
    x / (minus_2z.clamp(-40.0, 40.0).exp() + 1.0)
}

/// The MLP `Linear(D, 4D) -> GELU(tanh) -> Linear(4D, D)` (checkpoint keys `net.0.proj`, `net.2`).
#[derive(Module, Debug)]
pub(crate) struct FeedForward<B: Backend> {
    /// `Linear(D, 4D)` feeding the GELU (`net.0.proj`).
    pub(crate) proj_in: Linear<B>,
    /// `Linear(4D, D)` (`net.2`).
    pub(crate) proj_out: Linear<B>,
}

impl<B: Backend> FeedForward<B> {
    /// An MLP of width `dim` with a `4 * dim` hidden layer.
    pub(crate) fn new(dim: usize, device: &B::Device) -> Self {
        FeedForward {
            proj_in: LinearConfig::new(dim, 4 * dim).init(device),
            proj_out: LinearConfig::new(4 * dim, dim).init(device),
        }
    }

    /// `proj_out(gelu_tanh(proj_in(x)))`.
    pub(crate) fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.proj_out.forward(gelu_tanh(self.proj_in.forward(x)))
    }
}

/// The text stream's input norm: AdaLN-Zero, or AdaLN-continuous in the last block, whose text
/// stream ends after attention ("context pre-only").
#[derive(Module, Debug)]
pub(crate) enum ContextNorm<B: Backend> {
    /// Blocks that update the text stream.
    Zero(AdaLayerNormZero<B>),
    /// The last block.
    Continuous(AdaLayerNormContinuous<B>),
}

/// One MMDiT block.
#[derive(Module, Debug)]
pub(crate) struct JointTransformerBlock<B: Backend> {
    /// Image-stream AdaLN-Zero (9 chunks in dual-attention blocks).
    pub(crate) norm1: AdaLayerNormZero<B>,
    /// Text-stream norm.
    pub(crate) norm1_context: ContextNorm<B>,
    /// Joint attention.
    pub(crate) attn: JointAttention<B>,
    /// Image-only attention of SD3.5 dual-attention blocks.
    pub(crate) attn2: Option<SelfAttention<B>>,
    /// Image MLP.
    pub(crate) ff: FeedForward<B>,
    /// Text MLP; absent in the last block.
    pub(crate) ff_context: Option<FeedForward<B>>,
}

impl<B: Backend> JointTransformerBlock<B> {
    /// A block of width `dim`; `last` makes it context-pre-only.
    pub(crate) fn new(
        dim: usize,
        heads: usize,
        qk: bool,
        dual: bool,
        last: bool,
        device: &B::Device,
    ) -> Self {
        JointTransformerBlock {
            norm1: AdaLayerNormZero::new(dim, dual, device),
            norm1_context: if last {
                ContextNorm::Continuous(AdaLayerNormContinuous::new(dim, device))
            } else {
                ContextNorm::Zero(AdaLayerNormZero::new(dim, false, device))
            },
            attn: JointAttention::new(dim, heads, qk, last, device),
            attn2: dual.then(|| SelfAttention::new(dim, heads, qk, device)),
            ff: FeedForward::new(dim, device),
            ff_context: (!last).then(|| FeedForward::new(dim, device)),
        }
    }

    /// Updates image tokens `x [B, N, D]` and text tokens `c [B, L, D]` under `temb [B, D]`;
    /// the last block returns no text tokens.
    ///
    /// ```text
    /// x += gate_msa * attn_x(n_x, n_c)           n_x = modulate(LN(x), shift_msa, scale_msa)
    /// x += gate_msa2 * attn2(n_x2)               (dual-attention blocks)
    /// x += gate_mlp * ff(modulate(LN(x), shift_mlp, scale_mlp))
    /// c += c_gate_msa * attn_c(n_x, n_c);  c += c_gate_mlp * ff_context(modulate(LN(c), ..))
    /// ```
    pub(crate) fn forward(
        &self,
        x: Tensor<B, 3>,
        c: Tensor<B, 3>,
        temb: Tensor<B, 2>,
    ) -> (Tensor<B, 3>, Option<Tensor<B, 3>>) {
        let m = self.norm1.forward(x.clone(), temb.clone());
        let (n_c, c_mod) = match &self.norm1_context {
            ContextNorm::Zero(norm) => {
                let cm = norm.forward(c.clone(), temb);
                (cm.x.clone(), Some(cm))
            }
            ContextNorm::Continuous(norm) => (norm.forward(c.clone(), temb), None),
        };
        let (attn_x, attn_c) = self.attn.forward(m.x, n_c);
        let mut x = x + attn_x * m.gate_msa.unsqueeze_dim(1);
        if let (Some(attn2), Some((n_x2, gate2))) = (&self.attn2, m.second) {
            x = x + attn2.forward(n_x2) * gate2.unsqueeze_dim(1);
        }
        let ff = self.ff.forward(modulate(layer_norm(x.clone()), m.shift_mlp, m.scale_mlp));
        let x = x + ff * m.gate_mlp.unsqueeze_dim(1);

        let c = match (c_mod, attn_c, &self.ff_context) {
            (Some(cm), Some(attn_c), Some(ff_context)) => {
                let c = c + attn_c * cm.gate_msa.unsqueeze_dim(1);
                let ff =
                    ff_context.forward(modulate(layer_norm(c.clone()), cm.shift_mlp, cm.scale_mlp));
                Some(c + ff * cm.gate_mlp.unsqueeze_dim(1))
            }
            _ => None,
        };
        (x, c)
    }
}
