//! The toy task's text encoder: learned word and position embeddings over a 20-word vocabulary.

use burn::module::{Initializer, Param};
use burn::nn::{Embedding, EmbeddingConfig};
use burn::prelude::*;

use crate::error::Error;
use crate::sampler::Conditioning;

/// The vocabulary; id 0 pads.
pub(crate) const VOCAB: [&str; 20] = [
    "<pad>",
    "a",
    "two",
    "three",
    "red",
    "green",
    "blue",
    "yellow",
    "circle",
    "circles",
    "square",
    "squares",
    "triangle",
    "triangles",
    "and",
    "above",
    "below",
    "left",
    "right",
    "of",
];
/// Tokens per prompt (shorter prompts are padded).
pub(crate) const MAX_TOKENS: usize = 8;

/// Word ids of `text`, padded to [`MAX_TOKENS`]; an unknown word or a too-long prompt is an
/// error naming it.
pub(crate) fn tokenize(text: &str) -> crate::Result<Vec<usize>> {
    let mut ids = Vec::with_capacity(MAX_TOKENS);
    for word in text.split_whitespace() {
        let id = VOCAB.iter().position(|v| *v == word && word != "<pad>").ok_or_else(|| {
            Error::config("prompt", format!("{text:?}: the toy vocabulary has no word {word:?}"))
        })?;
        ids.push(id);
    }
    if ids.len() > MAX_TOKENS {
        return Err(Error::config(
            "prompt",
            format!("{text:?} has {} words, the toy encoder takes {MAX_TOKENS}", ids.len()),
        ));
    }
    ids.resize(MAX_TOKENS, 0);
    Ok(ids)
}

/// Word plus position embeddings; the pooled vector is the mean word embedding (zero for the
/// empty prompt).
#[derive(Module, Debug)]
pub struct ToyTextEncoder<B: Backend> {
    /// `[VOCAB, D]` word embeddings (`weight`).
    pub(crate) token_embedding: Embedding<B>,
    /// `[MAX_TOKENS, D]` position embeddings.
    pub position_embedding: Param<Tensor<B, 2>>,
}

/// Settings of a [`ToyTextEncoder`].
#[derive(Config, Debug)]
pub struct ToyTextEncoderConfig {
    /// Width of the features (the transformer's `joint_attention_dim`).
    pub dim: usize,
}

impl ToyTextEncoderConfig {
    /// A randomly initialised encoder.
    pub fn init<B: Backend>(&self, device: &B::Device) -> ToyTextEncoder<B> {
        ToyTextEncoder {
            token_embedding: EmbeddingConfig::new(VOCAB.len(), self.dim).init(device),
            position_embedding: Initializer::Normal { mean: 0.0, std: 0.02 }
                .init([MAX_TOKENS, self.dim], device),
        }
    }
}

impl<B: Backend> ToyTextEncoder<B> {
    /// Text features `[B, MAX_TOKENS, D]` and pooled vectors `[B, D]` of `texts`.
    pub fn encode(&self, texts: &[&str]) -> crate::Result<Conditioning<B>> {
        let device = self.position_embedding.device();
        let ids: Vec<i64> = texts
            .iter()
            .map(|t| tokenize(t))
            .collect::<crate::Result<Vec<_>>>()?
            .into_iter()
            .flatten()
            .map(|i| i as i64)
            .collect();
        let b = texts.len();
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [b, MAX_TOKENS]), &device);
        let words = self.token_embedding.forward(ids.clone());
        let mask = ids.not_equal_elem(0).float().unsqueeze_dim::<3>(2);
        let count = mask.clone().sum_dim(1).clamp_min(1.0);
        let pooled = (words.clone() * mask).sum_dim(1).div(count).squeeze_dim::<2>(1);
        let text = words + self.position_embedding.val().unsqueeze::<3>();
        Ok(Conditioning { text, pooled })
    }
}
