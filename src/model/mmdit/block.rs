//! The joint transformer block: AdaLN-modulated joint attention and MLPs on the image and
//! text streams (diffusers `JointTransformerBlock`).

use burn::prelude::*;

use super::attention::{JointAttention, JointAttentionConfig, SelfAttention, SelfAttentionConfig};
use super::norm::{
    layer_norm, modulate, AdaLayerNormContinuous, AdaLayerNormContinuousConfig, AdaLayerNormZero,
    AdaLayerNormZeroConfig,
};
use crate::model::lora_linear::{LoraLinear, LoraLinearConfig, Named};
use crate::model::rope::Rope;

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
    pub(crate) proj_in: LoraLinear<B>,
    /// `Linear(4D, D)` (`net.2`).
    pub(crate) proj_out: LoraLinear<B>,
}

/// Settings of a [`FeedForward`].
#[derive(Config, Debug)]
pub(crate) struct FeedForwardConfig {
    /// Width of the stream.
    dim: usize,
}

impl FeedForwardConfig {
    /// An MLP of width `dim` with a `4 * dim` hidden layer.
    pub(crate) fn init<B: Backend>(&self, device: &B::Device) -> FeedForward<B> {
        let dim = self.dim;
        FeedForward {
            proj_in: LoraLinearConfig::new(dim, 4 * dim).init(device),
            proj_out: LoraLinearConfig::new(4 * dim, dim).init(device),
        }
    }
}

impl<B: Backend> FeedForward<B> {
    /// `proj_out(gelu_tanh(proj_in(x)))`.
    pub(crate) fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.proj_out.forward(gelu_tanh(self.proj_in.forward(x)))
    }

    /// The adaptable projections with their diffusers module names.
    pub(crate) fn projections_mut(&mut self) -> Named<'_, B> {
        vec![("net.0.proj", &mut self.proj_in), ("net.2", &mut self.proj_out)]
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

/// Settings of a [`JointTransformerBlock`] (diffusers' constructor arguments).
#[derive(Config, Debug)]
pub(crate) struct JointTransformerBlockConfig {
    /// Width of both streams.
    dim: usize,
    /// Attention heads.
    num_attention_heads: usize,
    /// Per-head RMSNorm of queries and keys (SD3.5).
    #[config(default = false)]
    qk_norm: bool,
    /// A second, image-only attention (SD3.5 dual-attention blocks).
    #[config(default = false)]
    use_dual_attention: bool,
    /// The last block: the text stream ends after attention.
    #[config(default = false)]
    context_pre_only: bool,
}

impl JointTransformerBlockConfig {
    /// The block these settings describe.
    pub(crate) fn init<B: Backend>(&self, device: &B::Device) -> JointTransformerBlock<B> {
        let (dim, heads, last) = (self.dim, self.num_attention_heads, self.context_pre_only);
        let attention = JointAttentionConfig::new(dim, heads)
            .with_qk_norm(self.qk_norm)
            .with_context_pre_only(last);
        let ff = FeedForwardConfig::new(dim);
        JointTransformerBlock {
            norm1: AdaLayerNormZeroConfig::new(dim)
                .with_dual_attention(self.use_dual_attention)
                .init(device),
            norm1_context: if last {
                ContextNorm::Continuous(AdaLayerNormContinuousConfig::new(dim).init(device))
            } else {
                ContextNorm::Zero(AdaLayerNormZeroConfig::new(dim).init(device))
            },
            attn: attention.init(device),
            attn2: self.use_dual_attention.then(|| {
                SelfAttentionConfig::new(dim, heads).with_qk_norm(self.qk_norm).init(device)
            }),
            ff: ff.init(device),
            ff_context: (!last).then(|| ff.init(device)),
        }
    }
}

impl<B: Backend> JointTransformerBlock<B> {
    /// The adaptable projections with their module names inside the block (`attn.to_q`,
    /// `attn2.to_out.0`, `ff.net.0.proj`, `ff_context.net.2`, ...), in checkpoint order.
    pub(crate) fn projections_mut(&mut self) -> Vec<(String, &mut LoraLinear<B>)> {
        let mut groups: Vec<(&str, Named<'_, B>)> = vec![("attn", self.attn.projections_mut())];
        if let Some(attn2) = self.attn2.as_mut() {
            groups.push(("attn2", attn2.projections_mut()));
        }
        groups.push(("ff", self.ff.projections_mut()));
        if let Some(ff) = self.ff_context.as_mut() {
            groups.push(("ff_context", ff.projections_mut()));
        }
        let out = groups
            .into_iter()
            .flat_map(|(prefix, list)| {
                list.into_iter().map(move |(n, p)| (format!("{prefix}.{n}"), p))
            })
            .collect();
        out
    }

    /// Updates image tokens `x [B, N, D]` and text tokens `c [B, L, D]` under `temb [B, D]`;
    /// the last block returns no text tokens. FLUX's double-stream blocks are these blocks with
    /// qk-norm and `rope` (text rows, then image rows) rotating the joint attention.
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
        rope: Option<&Rope<B>>,
    ) -> (Tensor<B, 3>, Option<Tensor<B, 3>>) {
        let m = self.norm1.forward(x.clone(), temb.clone());
        let (n_c, c_mod) = match &self.norm1_context {
            ContextNorm::Zero(norm) => {
                let cm = norm.forward(c.clone(), temb);
                (cm.x.clone(), Some(cm))
            }
            ContextNorm::Continuous(norm) => (norm.forward(c.clone(), temb), None),
        };
        let (attn_x, attn_c) = self.attn.forward(m.x, n_c, rope);
        let mut x = x + attn_x * m.gate_msa.unsqueeze_dim(1);
        if let (Some(attn2), Some((n_x2, gate2))) = (&self.attn2, m.second) {
            x = x + attn2.forward(n_x2, None) * gate2.unsqueeze_dim(1);
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
