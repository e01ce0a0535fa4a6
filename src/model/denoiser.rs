//! The denoiser a run trains: either family behind one type, so that the trainer, its
//! checkpoints and its replicas are written once.

use burn::prelude::*;
use burn::tensor::FloatDType;

use super::lora::{Adaptable, Projection};
use super::{Flux, MMDiT};

/// An SD3 / SD3.5 MMDiT or a FLUX.1 transformer.
// One value per trainer: the variants' size difference (a few hundred bytes of configuration
// and vectors) costs nothing, and Burn's module derive does not see through a Box.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Denoiser<B: Backend> {
    /// Stable Diffusion 3 / 3.5: sampled with classifier-free guidance.
    Sd3(MMDiT<B>),
    /// FLUX.1: packed latents, embedded guidance, a dynamically shifted schedule.
    Flux(Flux<B>),
}

impl<B: Backend> From<MMDiT<B>> for Denoiser<B> {
    fn from(model: MMDiT<B>) -> Self {
        Denoiser::Sd3(model)
    }
}

impl<B: Backend> From<Flux<B>> for Denoiser<B> {
    fn from(model: Flux<B>) -> Self {
        Denoiser::Flux(model)
    }
}

impl<B: Backend> Denoiser<B> {
    /// The transformer's configuration as JSON (its diffusers `config.json` fields), as run
    /// records compare it.
    pub fn config_json(&self) -> serde_json::Value {
        match self {
            Denoiser::Sd3(m) => serde_json::to_value(&m.config),
            Denoiser::Flux(m) => serde_json::to_value(&m.config),
        }
        .expect("configs serialise")
    }

    /// The dtype of the base weights, which the forward pass computes in.
    pub fn dtype(&self) -> FloatDType {
        match self {
            Denoiser::Sd3(m) => m.dtype(),
            Denoiser::Flux(m) => m.dtype(),
        }
    }

    /// `(blocks, image tokens, width)` of a pass on a latent `[C, H, W]`: what every block
    /// keeps per sample for the adapters' gradients (SD3: `H/p * W/p` tokens; FLUX: the 2x2
    /// packed tokens, through double and single blocks).
    pub fn activation_shape(&self, [_, h, w]: [usize; 3]) -> (usize, usize, usize) {
        match self {
            Denoiser::Sd3(m) => {
                let p = m.config.patch_size;
                (m.config.num_layers, (h / p) * (w / p), m.config.hidden_size())
            }
            Denoiser::Flux(m) => {
                let c = &m.config;
                (c.num_layers + c.num_single_layers, (h / 2) * (w / 2), c.hidden_size())
            }
        }
    }
}

impl<B: Backend> Adaptable<B> for Denoiser<B> {
    fn projections_mut(&mut self) -> Vec<(String, Projection<'_, B>)> {
        match self {
            Denoiser::Sd3(m) => m.projections_mut(),
            Denoiser::Flux(m) => m.projections_mut(),
        }
    }
}
