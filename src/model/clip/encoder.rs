//! The transformer encoder CLIP's text and image towers share: pre-norm layers of multi-head
//! self-attention (causal for text) and a two-layer MLP.

use burn::nn::{LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::{gelu, sigmoid};

use crate::model::attention::{self_attention, Scores};

/// Settings of one tower's [`ClipEncoder`] (from the fields of its `config.json`).
#[derive(Config, Debug, Copy)]
pub(crate) struct ClipEncoderConfig {
    /// `hidden_size`.
    pub(crate) width: usize,
    /// `intermediate_size`.
    pub(crate) intermediate: usize,
    /// `num_hidden_layers`.
    pub(crate) layers: usize,
    /// `num_attention_heads`.
    pub(crate) heads: usize,
    /// `layer_norm_eps`.
    pub(crate) eps: f64,
    /// `hidden_act` is `quick_gelu` (else exact GELU).
    pub(crate) quick_gelu: bool,
    /// A causal mask (the text tower).
    pub(crate) causal: bool,
}

/// Checks an activation name and head count; errors name the field.
pub(crate) fn validate_shape(hidden_act: &str, hidden: usize, heads: usize) -> crate::Result<()> {
    if hidden == 0 {
        return Err(crate::Error::config("hidden_size", "must be at least 1"));
    }
    if !matches!(hidden_act, "quick_gelu" | "gelu") {
        return Err(crate::Error::config(
            "hidden_act",
            format!("expected \"quick_gelu\" or \"gelu\", found {hidden_act:?}"),
        ));
    }
    if heads == 0 || !hidden.is_multiple_of(heads) {
        return Err(crate::Error::config(
            "num_attention_heads",
            format!("must divide hidden_size {hidden}"),
        ));
    }
    Ok(())
}

impl ClipEncoderConfig {
    /// A layer norm of the tower's width.
    pub(crate) fn norm<B: Backend>(&self, device: &B::Device) -> LayerNorm<B> {
        LayerNormConfig::new(self.width).with_epsilon(self.eps).init(device)
    }

    /// A randomly initialised encoder (weights are drawn lazily).
    pub(crate) fn init<B: Backend>(&self, device: &B::Device) -> ClipEncoder<B> {
        let d = self.width;
        let linear = |i, o| LinearConfig::new(i, o).init(device);
        let layers = (0..self.layers)
            .map(|_| ClipEncoderLayer {
                self_attn: ClipAttention {
                    q_proj: linear(d, d),
                    k_proj: linear(d, d),
                    v_proj: linear(d, d),
                    out_proj: linear(d, d),
                    heads: self.heads,
                    causal: self.causal,
                },
                layer_norm1: self.norm(device),
                mlp: ClipMlp {
                    fc1: linear(d, self.intermediate),
                    fc2: linear(self.intermediate, d),
                    quick_gelu: self.quick_gelu,
                },
                layer_norm2: self.norm(device),
            })
            .collect();
        ClipEncoder { layers }
    }
}

/// Multi-head self-attention, with a causal mask in the text tower.
#[derive(Module, Debug)]
pub(crate) struct ClipAttention<B: Backend> {
    /// Query projection.
    pub(crate) q_proj: Linear<B>,
    /// Key projection.
    pub(crate) k_proj: Linear<B>,
    /// Value projection.
    pub(crate) v_proj: Linear<B>,
    /// Output projection.
    pub(crate) out_proj: Linear<B>,
    heads: usize,
    causal: bool,
}

impl<B: Backend> ClipAttention<B> {
    /// `softmax(q k^T / sqrt(Dh) [+ causal mask]) v` over `heads` heads of `x: [B, T, D]`.
    pub(crate) fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let q = self.q_proj.forward(x.clone());
        let k = self.k_proj.forward(x.clone());
        let v = self.v_proj.forward(x);
        let scores = Scores { scale: None, causal: self.causal };
        self.out_proj.forward(self_attention(q, k, v, self.heads, scores))
    }
}

/// Two-layer MLP with quick-GELU `x sigmoid(1.702 x)` (OpenAI CLIP) or exact GELU (LAION).
#[derive(Module, Debug)]
pub(crate) struct ClipMlp<B: Backend> {
    /// `D -> intermediate`.
    pub(crate) fc1: Linear<B>,
    /// `intermediate -> D`.
    pub(crate) fc2: Linear<B>,
    quick_gelu: bool,
}

impl<B: Backend> ClipMlp<B> {
    /// `fc2(act(fc1 x))`.
    pub(crate) fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let h = self.fc1.forward(x);
        let h = if self.quick_gelu { h.clone() * sigmoid(h * 1.702) } else { gelu(h) };
        self.fc2.forward(h)
    }
}

/// Pre-norm encoder layer.
#[derive(Module, Debug)]
pub(crate) struct ClipEncoderLayer<B: Backend> {
    /// Self-attention.
    pub(crate) self_attn: ClipAttention<B>,
    /// Norm before attention.
    pub(crate) layer_norm1: LayerNorm<B>,
    /// Feed-forward.
    pub(crate) mlp: ClipMlp<B>,
    /// Norm before the MLP.
    pub(crate) layer_norm2: LayerNorm<B>,
}

impl<B: Backend> ClipEncoderLayer<B> {
    /// `x + attn(ln1 x)`, then `+ mlp(ln2 .)`.
    pub(crate) fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let x = x.clone() + self.self_attn.forward(self.layer_norm1.forward(x));
        x.clone() + self.mlp.forward(self.layer_norm2.forward(x))
    }
}

/// The stack of encoder layers.
#[derive(Module, Debug)]
pub(crate) struct ClipEncoder<B: Backend> {
    /// Layers in order.
    pub(crate) layers: Vec<ClipEncoderLayer<B>>,
}

impl<B: Backend> ClipEncoder<B> {
    /// All layers in order.
    pub(crate) fn forward(&self, mut x: Tensor<B, 3>) -> Tensor<B, 3> {
        for layer in &self.layers {
            x = layer.forward(x);
        }
        x
    }
}
