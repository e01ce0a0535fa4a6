//! FLUX's conditioning vector: timestep, embedded guidance and pooled CLIP text.

use burn::prelude::*;

use crate::model::mmdit::embed::{
    timestep_features, MlpEmbedder, MlpEmbedderConfig, TIMESTEP_FEATURES,
};
use crate::model::precision::{float_dtype, to_dtype};

/// `temb = timestep_embedder(f(1000 sigma)) [+ guidance_embedder(f(1000 g))] +
/// text_embedder(pooled)` (diffusers' `CombinedTimestepGuidanceTextProjEmbeddings`, or
/// `CombinedTimestepTextProjEmbeddings` without guidance), `f` the 256 sinusoidal features.
#[derive(Module, Debug)]
pub(crate) struct FluxTimeTextEmbed<B: Backend> {
    /// MLP on the timestep features.
    pub(crate) timestep_embedder: MlpEmbedder<B>,
    /// MLP on the guidance features (guidance-distilled models).
    pub(crate) guidance_embedder: Option<MlpEmbedder<B>>,
    /// MLP on the pooled text vector.
    pub(crate) text_embedder: MlpEmbedder<B>,
}

/// Settings of a [`FluxTimeTextEmbed`].
#[derive(Config, Debug)]
pub(crate) struct FluxTimeTextEmbedConfig {
    /// Width of the embedding.
    dim: usize,
    /// Features of the pooled text vector.
    pooled_projection_dim: usize,
    /// Whether the guidance scale is embedded.
    guidance_embeds: bool,
}

impl FluxTimeTextEmbedConfig {
    /// The embedders these settings describe.
    pub(crate) fn init<B: Backend>(&self, device: &B::Device) -> FluxTimeTextEmbed<B> {
        let features = MlpEmbedderConfig::new(TIMESTEP_FEATURES, self.dim);
        FluxTimeTextEmbed {
            timestep_embedder: features.init(device),
            guidance_embedder: self.guidance_embeds.then(|| features.init(device)),
            text_embedder: MlpEmbedderConfig::new(self.pooled_projection_dim, self.dim)
                .init(device),
        }
    }
}

impl<B: Backend> FluxTimeTextEmbed<B> {
    /// `temb [B, D]` from `sigma [B]`, `guidance [B]` (required exactly when the model embeds
    /// it; checked by the caller) and `pooled [B, P]`; the sinusoids are taken of `1000 sigma`
    /// and `1000 g` in their dtype and cast to `pooled`'s (diffusers first rounds sigma to the
    /// activations' dtype, which differs only for half-precision weights).
    pub(crate) fn forward(
        &self,
        sigma: Tensor<B, 1>,
        guidance: Option<Tensor<B, 1>>,
        pooled: Tensor<B, 2>,
    ) -> Tensor<B, 2> {
        let dtype = float_dtype(&pooled);
        let features = |t: Tensor<B, 1>| to_dtype(timestep_features(t * 1000.0), dtype);
        let mut temb = self.timestep_embedder.forward(features(sigma));
        if let (Some(embedder), Some(g)) = (&self.guidance_embedder, guidance) {
            temb = temb + embedder.forward(features(g));
        }
        temb + self.text_embedder.forward(pooled)
    }
}
