//! The T5 v1.1 encoder of SD3 (transformers' `T5EncoderModel`, `text_encoder_3/`).
//!
//! Checkpoint names are `encoder.block.N.layer.0.SelfAttention.*` (attention),
//! `layer.0.layer_norm`, `layer.1.DenseReluDense.*` (gated feed-forward) and `layer.1.layer_norm`;
//! the module names them `self_attention`, `attention_norm`, `ff`, `ff_norm` ([`t5_key`]).

use std::path::Path;

use burn::module::Param;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::{gelu_approximate, relu};

use crate::model::attention::{attend, merge_heads, split_heads, Scores};
use crate::weights::{load_folder, Source};

/// A T5 encoder's `config.json` (the fields the encoder uses).
#[derive(Config, Debug)]
pub struct T5Config {
    /// Token vocabulary size.
    pub vocab_size: usize,
    /// Width.
    pub d_model: usize,
    /// Width of one attention head.
    pub d_kv: usize,
    /// Width of the feed-forward layer.
    pub d_ff: usize,
    /// Number of encoder blocks.
    pub num_layers: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Relative-position buckets.
    #[config(default = 32)]
    pub relative_attention_num_buckets: usize,
    /// Distance beyond which positions share the last bucket.
    #[config(default = 128)]
    pub relative_attention_max_distance: usize,
    /// RMS-norm epsilon.
    #[config(default = 1e-6)]
    pub layer_norm_epsilon: f64,
    /// `gated-gelu` (T5 v1.1: tanh-approximated GELU) or `gated-relu`.
    #[config(default = "String::from(\"gated-gelu\")")]
    pub feed_forward_proj: String,
}

impl T5Config {
    /// Whether the gated feed-forward uses ReLU (else GELU); errors name the field.
    fn relu(&self) -> crate::Result<bool> {
        match self.feed_forward_proj.as_str() {
            "gated-gelu" => Ok(false),
            "gated-relu" => Ok(true),
            other => Err(crate::Error::config(
                "feed_forward_proj",
                format!("expected gated-gelu or gated-relu (T5 v1.1), found {other:?}"),
            )),
        }
    }

    /// Checks the configuration; errors name the field.
    pub fn validate(&self) -> crate::Result<()> {
        self.relu()?;
        crate::limits::check_positive(&[
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("d_kv", self.d_kv),
            ("d_ff", self.d_ff),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("relative_attention_num_buckets", self.relative_attention_num_buckets),
        ])?;
        // In f64, so that no product of user-given sizes wraps.
        let (d, inner) = (self.d_model as f64, self.num_heads as f64 * self.d_kv as f64);
        let params = self.num_layers as f64 * (4.0 * d * inner + 3.0 * d * self.d_ff as f64)
            + self.vocab_size as f64 * d;
        crate::limits::check_params("num_layers/d_model/num_heads/d_kv/d_ff/vocab_size", params)
    }

    /// A randomly initialised encoder (weights are drawn lazily).
    pub fn init<B: Backend>(&self, device: &B::Device) -> crate::Result<T5EncoderModel<B>> {
        self.validate()?;
        let relu = self.relu()?;
        let (d, inner) = (self.d_model, self.num_heads * self.d_kv);
        let linear = |i, o| LinearConfig::new(i, o).with_bias(false).init(device);
        let norm = || T5LayerNorm {
            weight: Param::from_tensor(Tensor::ones([d], device)),
            eps: self.layer_norm_epsilon,
        };
        let block = (0..self.num_layers)
            .map(|i| T5Block {
                self_attention: T5Attention {
                    q: linear(d, inner),
                    k: linear(d, inner),
                    v: linear(d, inner),
                    o: linear(inner, d),
                    relative_attention_bias: (i == 0).then(|| {
                        EmbeddingConfig::new(self.relative_attention_num_buckets, self.num_heads)
                            .init(device)
                    }),
                    heads: self.num_heads,
                },
                attention_norm: norm(),
                ff: T5DenseActDense {
                    wi_0: linear(d, self.d_ff),
                    wi_1: linear(d, self.d_ff),
                    wo: linear(self.d_ff, d),
                    relu,
                },
                ff_norm: norm(),
            })
            .collect();
        Ok(T5EncoderModel {
            shared: EmbeddingConfig::new(self.vocab_size, d).init(device),
            encoder: T5Stack { block, final_layer_norm: norm() },
            num_buckets: self.relative_attention_num_buckets,
            max_distance: self.relative_attention_max_distance,
            vocab_size: self.vocab_size,
        })
    }
}

/// RMS norm without mean subtraction or bias: `x / sqrt(mean(x^2) + eps) * weight`.
#[derive(Module, Debug)]
pub(crate) struct T5LayerNorm<B: Backend> {
    /// Per-channel scale.
    pub weight: Param<Tensor<B, 1>>,
    eps: f64,
}

impl<B: Backend> T5LayerNorm<B> {
    /// Normalises the last dimension.
    pub(crate) fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let var = x.clone().square().mean_dim(2);
        x / (var + self.eps).sqrt() * self.weight.val().unsqueeze::<3>()
    }
}

/// Self-attention without score scaling (T5 folds it into the weights), plus the
/// relative-position bias owned by the first block.
#[derive(Module, Debug)]
pub(crate) struct T5Attention<B: Backend> {
    /// Query projection.
    pub(crate) q: Linear<B>,
    /// Key projection.
    pub(crate) k: Linear<B>,
    /// Value projection.
    pub(crate) v: Linear<B>,
    /// Output projection.
    pub(crate) o: Linear<B>,
    /// `[buckets, heads]`, first block only.
    pub(crate) relative_attention_bias: Option<Embedding<B>>,
    heads: usize,
}

impl<B: Backend> T5Attention<B> {
    /// `o(softmax(q k^T + bias) v)` for `x: [B, T, D]` and `bias: [1, H, T, T]`.
    pub(crate) fn forward(&self, x: Tensor<B, 3>, bias: Tensor<B, 4>) -> Tensor<B, 3> {
        let h = self.heads;
        let q = split_heads(self.q.forward(x.clone()), h);
        let k = split_heads(self.k.forward(x.clone()), h);
        let v = split_heads(self.v.forward(x), h);
        let unscaled = Scores { scale: Some(1.0), causal: false };
        self.o.forward(merge_heads(attend(q, k, v, Some(bias), unscaled)))
    }
}

/// Gated feed-forward `wo(act(wi_0 x) * wi_1 x)`; T5 v1.1's gated-gelu uses the tanh
/// approximation of GELU (`gelu_new`).
#[derive(Module, Debug)]
pub(crate) struct T5DenseActDense<B: Backend> {
    /// Activated input projection.
    pub(crate) wi_0: Linear<B>,
    /// Linear gate.
    pub(crate) wi_1: Linear<B>,
    /// Output projection.
    pub(crate) wo: Linear<B>,
    relu: bool,
}

impl<B: Backend> T5DenseActDense<B> {
    /// Applies the feed-forward layer.
    pub(crate) fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let h = self.wi_0.forward(x.clone());
        let h = if self.relu { relu(h) } else { gelu_approximate(h) };
        self.wo.forward(h * self.wi_1.forward(x))
    }
}

/// One encoder block: pre-norm attention and pre-norm feed-forward, both residual.
#[derive(Module, Debug)]
pub(crate) struct T5Block<B: Backend> {
    /// `layer.0.SelfAttention`.
    pub(crate) self_attention: T5Attention<B>,
    /// `layer.0.layer_norm`.
    pub(crate) attention_norm: T5LayerNorm<B>,
    /// `layer.1.DenseReluDense`.
    pub(crate) ff: T5DenseActDense<B>,
    /// `layer.1.layer_norm`.
    pub(crate) ff_norm: T5LayerNorm<B>,
}

/// The encoder blocks and final norm (`encoder.*`).
#[derive(Module, Debug)]
pub(crate) struct T5Stack<B: Backend> {
    /// Blocks in order.
    pub(crate) block: Vec<T5Block<B>>,
    /// Norm after the last block.
    pub(crate) final_layer_norm: T5LayerNorm<B>,
}

/// `T5EncoderModel`.
#[derive(Module, Debug)]
pub struct T5EncoderModel<B: Backend> {
    /// Token embedding (`shared`; `encoder.embed_tokens` is the same tensor).
    pub(crate) shared: Embedding<B>,
    /// The encoder.
    pub(crate) encoder: T5Stack<B>,
    num_buckets: usize,
    max_distance: usize,
    vocab_size: usize,
}

/// The checkpoint key of a T5 module parameter path (see the module doc).
pub(crate) fn t5_key(path: &str) -> String {
    let renames = [
        (".self_attention.", ".layer.0.SelfAttention."),
        (".attention_norm.", ".layer.0.layer_norm."),
        (".ff.", ".layer.1.DenseReluDense."),
        (".ff_norm.", ".layer.1.layer_norm."),
    ];
    renames.iter().fold(path.to_string(), |p, (from, to)| p.replacen(from, to, 1))
}

/// The bidirectional relative-position bucket of `relative = key - query` (transformers'
/// `_relative_position_bucket`): half the buckets per direction; distances below a quarter of
/// the buckets are exact, larger ones share log-spaced buckets up to `max_distance`.
pub(crate) fn relative_position_bucket(
    relative: i64,
    num_buckets: usize,
    max_distance: usize,
) -> usize {
    let half = num_buckets / 2;
    let base = if relative > 0 { half } else { 0 };
    let n = relative.unsigned_abs() as usize;
    let max_exact = half / 2;
    if n < max_exact {
        return base + n;
    }
    // In f32 like the reference, then truncated.
    let scaled = (n as f32 / max_exact as f32).ln() / (max_distance as f32 / max_exact as f32).ln()
        * (half - max_exact) as f32;
    base + (max_exact + scaled as usize).min(half - 1)
}

impl<B: Backend> T5EncoderModel<B> {
    /// Loads a transformers `text_encoder_3/` folder: `config.json` and `model.safetensors`
    /// (or shards). `encoder.embed_tokens.weight`, when present, is the tied copy of `shared`.
    pub fn load(dir: impl AsRef<Path>, device: &B::Device) -> crate::Result<Self> {
        load_folder(
            dir.as_ref(),
            "model",
            |config: &T5Config| config.init(device),
            |path| Source::key(t5_key(path)),
            |key| key != "encoder.embed_tokens.weight",
        )
    }

    /// The attention bias `[1, H, T, T]` shared by every block.
    fn position_bias(&self, t: usize, device: &B::Device) -> Tensor<B, 4> {
        let table = self.encoder.block[0]
            .self_attention
            .relative_attention_bias
            .as_ref()
            .expect("the first block owns the bias");
        let buckets: Vec<i64> = (0..t * t)
            .map(|i| {
                let (query, key) = ((i / t) as i64, (i % t) as i64);
                relative_position_bucket(key - query, self.num_buckets, self.max_distance) as i64
            })
            .collect();
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(buckets, [t, t]), device);
        let bias = table.forward(ids); // [T, T, H]
        bias.permute([2, 0, 1]).unsqueeze::<4>()
    }

    /// Encodes token sequences of equal length (no attention mask, as SD3 does): the
    /// final-normed hidden states `[B, T, d_model]`.
    pub fn forward(&self, ids: &[Vec<u32>], device: &B::Device) -> crate::Result<Tensor<B, 3>> {
        let t = ids.first().map_or(0, Vec::len);
        if ids.is_empty() || t == 0 || ids.iter().any(|r| r.len() != t) {
            let lens: Vec<usize> = ids.iter().map(Vec::len).collect();
            return Err(crate::Error::shape("input_ids", "[B >= 1, T >= 1], equal rows", &lens));
        }
        if let Some(&bad) = ids.iter().flatten().find(|&&i| i as usize >= self.vocab_size) {
            return Err(crate::Error::config(
                "input_ids",
                format!("token id {bad} is outside the vocabulary of {}", self.vocab_size),
            ));
        }
        let flat: Vec<i64> = ids.iter().flatten().map(|&i| i as i64).collect();
        let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(flat, [ids.len(), t]), device);
        let bias = self.position_bias(t, device);
        let mut x = self.shared.forward(tokens);
        for block in &self.encoder.block {
            let h =
                block.self_attention.forward(block.attention_norm.forward(x.clone()), bias.clone());
            x = x + h;
            x = x.clone() + block.ff.forward(block.ff_norm.forward(x));
        }
        Ok(self.encoder.final_layer_norm.forward(x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_match_hand_worked_values() {
        // 32 buckets, max distance 128: 16 per direction, exact below 8.
        assert_eq!(relative_position_bucket(0, 32, 128), 0);
        assert_eq!(relative_position_bucket(-3, 32, 128), 3);
        assert_eq!(relative_position_bucket(3, 32, 128), 19);
        // n = 8: 8 + floor(ln(1)/ln(16) * 8) = 8; n = 16: 8 + floor(ln 2 / ln 16 * 8) = 10.
        assert_eq!(relative_position_bucket(-8, 32, 128), 8);
        assert_eq!(relative_position_bucket(-16, 32, 128), 10);
        assert_eq!(relative_position_bucket(500, 32, 128), 31);
    }

    #[test]
    fn keys_follow_the_checkpoint() {
        assert_eq!(
            t5_key("encoder.block.3.self_attention.q.weight"),
            "encoder.block.3.layer.0.SelfAttention.q.weight"
        );
        assert_eq!(
            t5_key("encoder.block.0.ff.wi_1.weight"),
            "encoder.block.0.layer.1.DenseReluDense.wi_1.weight"
        );
        assert_eq!(
            t5_key("encoder.block.0.ff_norm.weight"),
            "encoder.block.0.layer.1.layer_norm.weight"
        );
    }
}
