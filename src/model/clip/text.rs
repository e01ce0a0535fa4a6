//! CLIP's text tower (transformers' `CLIPTextModelWithProjection`): SD3's CLIP-L
//! (`text_encoder/`) and CLIP-G (`text_encoder_2/`), and the text half of a `CLIPModel`.
//!
//! Module fields carry the checkpoint names (`text_model.encoder.layers.N.self_attn.q_proj`);
//! only norm `gamma` / `beta` differ (`weight` / `bias`).

use std::path::Path;

use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, Linear, LinearConfig};
use burn::prelude::*;

use super::encoder::{validate_shape, ClipEncoder, ClipEncoderConfig};
use crate::weights::{load_folder, torch_param_name, Source, WeightFiles};

/// A CLIP text encoder's `config.json` (the fields SD3 uses).
#[derive(Config, Debug)]
pub struct ClipTextConfig {
    /// Token vocabulary size.
    pub vocab_size: usize,
    /// Width `D`.
    pub hidden_size: usize,
    /// Width of the MLP.
    pub intermediate_size: usize,
    /// Number of encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Sequence length of the position table (77).
    #[config(default = 77)]
    pub max_position_embeddings: usize,
    /// `quick_gelu` (CLIP-L) or `gelu` (CLIP-G).
    #[config(default = "String::from(\"quick_gelu\")")]
    pub hidden_act: String,
    /// Layer-norm epsilon.
    #[config(default = 1e-5)]
    pub layer_norm_eps: f64,
    /// Width of the pooled output after `text_projection`.
    pub projection_dim: usize,
    /// End-of-text id; the legacy value 2 means "pool at the highest token id".
    #[config(default = 2)]
    pub eos_token_id: u32,
}

impl ClipTextConfig {
    /// Checks the configuration; errors name the field.
    pub fn validate(&self) -> crate::Result<()> {
        validate_shape(&self.hidden_act, self.hidden_size, self.num_attention_heads)?;
        if self.num_hidden_layers < 2 {
            return Err(crate::Error::config(
                "num_hidden_layers",
                "SD3 reads the penultimate layer: at least 2 layers are needed",
            ));
        }
        // Sizes in f64: a product of user-given numbers must not wrap.
        let (d, f) = (self.hidden_size as f64, self.intermediate_size as f64);
        let params = self.num_hidden_layers as f64 * (4.0 * d * d + 2.0 * d * f)
            + (self.vocab_size as f64 + self.max_position_embeddings as f64) * d
            + d * self.projection_dim as f64;
        crate::limits::check_params(
            "num_hidden_layers/hidden_size/intermediate_size/vocab_size/max_position_embeddings/projection_dim",
            params,
        )
    }

    /// A randomly initialised encoder (weights are drawn lazily).
    pub fn init<B: Backend>(&self, device: &B::Device) -> crate::Result<ClipTextModel<B>> {
        self.validate()?;
        let d = self.hidden_size;
        let shape = ClipEncoderConfig {
            width: d,
            intermediate: self.intermediate_size,
            layers: self.num_hidden_layers,
            heads: self.num_attention_heads,
            eps: self.layer_norm_eps,
            quick_gelu: self.hidden_act == "quick_gelu",
            causal: true,
        };
        Ok(ClipTextModel {
            text_model: ClipTextTransformer {
                embeddings: ClipEmbeddings {
                    token_embedding: EmbeddingConfig::new(self.vocab_size, d).init(device),
                    position_embedding: EmbeddingConfig::new(self.max_position_embeddings, d)
                        .init(device),
                },
                encoder: shape.init(device),
                final_layer_norm: shape.norm(device),
            },
            text_projection: Some(
                LinearConfig::new(d, self.projection_dim).with_bias(false).init(device),
            ),
            eos_token_id: self.eos_token_id as usize,
            vocab_size: self.vocab_size,
            max_positions: self.max_position_embeddings,
        })
    }
}

/// Token and position embeddings.
#[derive(Module, Debug)]
pub(crate) struct ClipEmbeddings<B: Backend> {
    /// `[vocab, D]`.
    pub(crate) token_embedding: Embedding<B>,
    /// `[77, D]`.
    pub(crate) position_embedding: Embedding<B>,
}

/// Embeddings, encoder and final norm (`text_model.*`).
#[derive(Module, Debug)]
pub(crate) struct ClipTextTransformer<B: Backend> {
    /// Token and position embeddings.
    pub(crate) embeddings: ClipEmbeddings<B>,
    /// Encoder layers.
    pub(crate) encoder: ClipEncoder<B>,
    /// Norm applied to the last layer's output (not to the penultimate features).
    pub(crate) final_layer_norm: LayerNorm<B>,
}

/// `CLIPTextModelWithProjection` (SD3), or `CLIPTextModel` (FLUX: no projection).
#[derive(Module, Debug)]
pub struct ClipTextModel<B: Backend> {
    /// The transformer.
    pub(crate) text_model: ClipTextTransformer<B>,
    /// Pooled-feature projection, no bias; absent in a `CLIPTextModel`.
    pub(crate) text_projection: Option<Linear<B>>,
    eos_token_id: usize,
    vocab_size: usize,
    max_positions: usize,
}

/// What SD3 takes from a CLIP encoder.
#[derive(Debug, Clone)]
pub struct ClipOutput<B: Backend> {
    /// Per-token features: the penultimate layer's output (`hidden_states[-2]`), `[B, T, D]`.
    pub hidden: Tensor<B, 3>,
    /// Projected pooled feature (`text_embeds`), `[B, projection_dim]`; without a projection
    /// the pooled feature itself (`pooler_output`), `[B, D]`.
    pub pooled: Tensor<B, 2>,
}

impl<B: Backend> ClipTextModel<B> {
    /// Loads a transformers `text_encoder/` folder: `config.json` and `model.safetensors` (or
    /// shards), a `CLIPTextModelWithProjection` or, when the weights hold no
    /// `text_projection.weight`, a `CLIPTextModel`. The `position_ids` buffer of older
    /// checkpoints is ignored.
    pub fn load(dir: impl AsRef<Path>, device: &B::Device) -> crate::Result<Self> {
        let dir = dir.as_ref();
        // Unreadable weights are reported by `load_folder` below, after the config.
        let projected = WeightFiles::open_dir(dir, "model")
            .map_or(true, |files| files.info("text_projection.weight").is_some());
        load_folder(
            dir,
            "model",
            |config: &ClipTextConfig| {
                let mut model = config.init(device)?;
                if !projected {
                    model.text_projection = None;
                }
                Ok(model)
            },
            |path| Source::key(torch_param_name(path)),
            |key| !key.ends_with("position_ids"),
        )
    }

    /// The position at which each sequence is pooled: the first end-of-text token, or with the
    /// legacy `eos_token_id = 2` the first occurrence of the highest id (transformers' rule).
    pub fn pool_positions(&self, ids: &[Vec<u32>]) -> crate::Result<Vec<usize>> {
        ids.iter()
            .enumerate()
            .map(|(b, row)| {
                let found = if self.eos_token_id == 2 {
                    let max = row.iter().copied().max();
                    row.iter().position(|&t| Some(t) == max)
                } else {
                    row.iter().position(|&t| t as usize == self.eos_token_id)
                };
                found.ok_or_else(|| {
                    crate::Error::config(
                        "input_ids",
                        format!("sequence {b} holds no end-of-text token {}", self.eos_token_id),
                    )
                })
            })
            .collect()
    }

    /// Encodes token sequences of equal length (at most 77): penultimate-layer features and
    /// the (projected) feature of the final-normed last layer at each pooling position.
    pub fn forward(&self, ids: &[Vec<u32>], device: &B::Device) -> crate::Result<ClipOutput<B>> {
        let t = ids.first().map_or(0, Vec::len);
        if ids.is_empty() || t == 0 || t > self.max_positions || ids.iter().any(|r| r.len() != t) {
            let lens: Vec<usize> = ids.iter().map(Vec::len).collect();
            return Err(crate::Error::shape(
                "input_ids",
                format!("[B >= 1, T] with 1 <= T <= {} for every row", self.max_positions),
                &lens,
            ));
        }
        if let Some(&bad) = ids.iter().flatten().find(|&&i| i as usize >= self.vocab_size) {
            return Err(crate::Error::config(
                "input_ids",
                format!("token id {bad} is outside the vocabulary of {}", self.vocab_size),
            ));
        }
        let pool = self.pool_positions(ids)?;
        let b = ids.len();
        let flat: Vec<i64> = ids.iter().flatten().map(|&i| i as i64).collect();
        let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(flat, [b, t]), device);
        let positions = Tensor::<B, 1, Int>::arange(0..t as i64, device).reshape([1, t]);
        let tm = &self.text_model;
        let mut x = tm.embeddings.token_embedding.forward(tokens)
            + tm.embeddings.position_embedding.forward(positions);
        let (last, rest) = tm.encoder.layers.split_last().expect("validated: >= 2 layers");
        for layer in rest {
            x = layer.forward(x);
        }
        let hidden = x.clone();
        let x = tm.final_layer_norm.forward(last.forward(x));
        let d = x.dims()[2];
        let rows: Vec<Tensor<B, 2>> = pool
            .iter()
            .enumerate()
            .map(|(i, &p)| x.clone().slice([i..i + 1, p..p + 1]).reshape([1, d]))
            .collect();
        let pooled = Tensor::cat(rows, 0);
        let pooled = match &self.text_projection {
            Some(projection) => projection.forward(pooled),
            None => pooled,
        };
        Ok(ClipOutput { hidden, pooled })
    }
}
