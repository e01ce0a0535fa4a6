//! FLUX's single-stream block: one stream of `[text; image]` tokens, attention and MLP side by
//! side under one modulation (diffusers `FluxSingleTransformerBlock`).

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::silu;

use crate::model::lora_linear::{LoraLinear, LoraLinearConfig};
use crate::model::mmdit::attention::{SelfAttention, SelfAttentionConfig};
use crate::model::mmdit::block::gelu_tanh;
use crate::model::mmdit::norm::{layer_norm, modulate};
use crate::model::rope::Rope;

/// AdaLN-Zero with one set of chunks: `Linear(SiLU(temb))` chunked as shift, scale, gate
/// (diffusers `AdaLayerNormZeroSingle`).
#[derive(Module, Debug)]
pub(crate) struct AdaLayerNormZeroSingle<B: Backend> {
    /// `Linear(D, 3D)`.
    pub(crate) linear: Linear<B>,
}

impl<B: Backend> AdaLayerNormZeroSingle<B> {
    /// `(modulate(LN(x), shift, scale), gate)` for `x [B, N, D]`, `temb [B, D]`.
    pub(crate) fn forward(
        &self,
        x: Tensor<B, 3>,
        temb: Tensor<B, 2>,
    ) -> (Tensor<B, 3>, Tensor<B, 2>) {
        let [shift, scale, gate] =
            self.linear.forward(silu(temb)).chunk(3, 1).try_into().expect("three chunks");
        (modulate(layer_norm(x), shift, scale), gate)
    }
}

/// One single-stream block.
#[derive(Module, Debug)]
pub(crate) struct SingleTransformerBlock<B: Backend> {
    /// The block's modulation.
    pub(crate) norm: AdaLayerNormZeroSingle<B>,
    /// Attention with qk-norm and no output projection.
    pub(crate) attn: SelfAttention<B>,
    /// `Linear(D, 4D)` of the MLP branch.
    pub(crate) proj_mlp: LoraLinear<B>,
    /// `Linear(5D, D)` over the concatenated attention and MLP outputs.
    pub(crate) proj_out: LoraLinear<B>,
}

/// Settings of a [`SingleTransformerBlock`].
#[derive(Config, Debug)]
pub(crate) struct SingleTransformerBlockConfig {
    /// Width of the stream.
    dim: usize,
    /// Attention heads.
    num_attention_heads: usize,
}

impl SingleTransformerBlockConfig {
    /// The block these settings describe (MLP ratio 4, as in every FLUX model).
    pub(crate) fn init<B: Backend>(&self, device: &B::Device) -> SingleTransformerBlock<B> {
        let dim = self.dim;
        SingleTransformerBlock {
            norm: AdaLayerNormZeroSingle { linear: LinearConfig::new(dim, 3 * dim).init(device) },
            attn: SelfAttentionConfig::new(dim, self.num_attention_heads)
                .with_qk_norm(true)
                .with_pre_only(true)
                .init(device),
            proj_mlp: LoraLinearConfig::new(dim, 4 * dim).init(device),
            proj_out: LoraLinearConfig::new(5 * dim, dim).init(device),
        }
    }
}

impl<B: Backend> SingleTransformerBlock<B> {
    /// Updates tokens `h [B, S, D]` (text then image) under `temb [B, D]`, with `rope` rows for
    /// all `S` tokens:
    ///
    /// ```text
    /// (n, gate) = norm(h, temb)
    /// h += gate * proj_out(cat(attn(n), gelu_tanh(proj_mlp(n))))
    /// ```
    pub(crate) fn forward(
        &self,
        h: Tensor<B, 3>,
        temb: Tensor<B, 2>,
        rope: &Rope<B>,
    ) -> Tensor<B, 3> {
        let (n, gate) = self.norm.forward(h.clone(), temb);
        let mlp = gelu_tanh(self.proj_mlp.forward(n.clone()));
        let attn = self.attn.forward(n, Some(rope));
        h + self.proj_out.forward(Tensor::cat(vec![attn, mlp], 2)) * gate.unsqueeze_dim(1)
    }

    /// The adaptable projections with their module names inside the block.
    pub(crate) fn projections_mut(&mut self) -> Vec<(String, &mut LoraLinear<B>)> {
        let mut out: Vec<(String, &mut LoraLinear<B>)> = self
            .attn
            .projections_mut()
            .into_iter()
            .map(|(name, p)| (format!("attn.{name}"), p))
            .collect();
        out.push(("proj_mlp".into(), &mut self.proj_mlp));
        out.push(("proj_out".into(), &mut self.proj_out));
        out
    }
}
