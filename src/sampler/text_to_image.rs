//! What sampling needs around the denoiser: prompt conditioning, the latent shape, and
//! decoding latents to images (the SD3 encoders and VAE, or the toy task's).

use burn::prelude::*;

use super::guidance::Conditioning;
use crate::error::Result;
use crate::image::Image;

/// Prompt encoding and latent decoding of a text-to-image model (the transformer is kept
/// apart, so that it can live on the autodiff backend while these stay on the inner one).
pub trait TextToImage<B: Backend> {
    /// Prompt conditioning of `texts` (`""` is the unconditional prompt).
    fn encode(&self, texts: &[&str]) -> Result<Conditioning<B>>;
    /// Images in `[0, 1]` of latents `[B, C, H, W]`.
    fn decode(&self, latents: Tensor<B, 4>) -> Result<Vec<Image>>;
    /// `[C, H, W]` of one latent.
    fn latent_shape(&self) -> [usize; 3];
}

/// A boxed pipeline, so that a program can pick the model family at run time.
impl<B: Backend, T: TextToImage<B> + ?Sized> TextToImage<B> for Box<T> {
    fn encode(&self, texts: &[&str]) -> Result<Conditioning<B>> {
        (**self).encode(texts)
    }

    fn decode(&self, latents: Tensor<B, 4>) -> Result<Vec<Image>> {
        (**self).decode(latents)
    }

    fn latent_shape(&self) -> [usize; 3] {
        (**self).latent_shape()
    }
}
