//! Input embedders: patches with a cropped position table, timestep and pooled-text vectors,
//! and the text-feature projection.

use burn::module::{Initializer, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::silu;

use crate::error::{Error, Result};

/// Patch embedding (`pos_embed`): a `p x p` stride-`p` convolution plus the stored position table.
#[derive(Module, Debug)]
pub struct PatchEmbed<B: Backend> {
    /// `Conv2d(in_channels, D, p, stride p)`.
    pub proj: Conv2d<B>,
    /// Position table `[1, M*M, D]` for an `M x M` patch grid.
    pub pos_embed: Param<Tensor<B, 3>>,
    /// Patch side `p`.
    pub patch_size: usize,
    /// Grid side `M` of the position table.
    pub max_size: usize,
}

impl<B: Backend> PatchEmbed<B> {
    /// A patch embedder for `in_channels` latent channels, width `dim`, an `M x M` table.
    pub fn new(
        in_channels: usize,
        dim: usize,
        patch: usize,
        max_size: usize,
        device: &B::Device,
    ) -> Self {
        PatchEmbed {
            proj: Conv2dConfig::new([in_channels, dim], [patch, patch])
                .with_stride([patch, patch])
                .init(device),
            pos_embed: Initializer::Zeros.init([1, max_size * max_size, dim], device),
            patch_size: patch,
            max_size,
        }
    }

    /// The centre crop of the position table for an `h x w` patch grid, as `[1, h*w, D]`:
    /// rows `(M-h)/2 ..`, columns `(M-w)/2 ..` of the table viewed as `[M, M, D]`.
    pub fn cropped_pos_embed(&self, h: usize, w: usize) -> Result<Tensor<B, 3>> {
        let m = self.max_size;
        if h > m || w > m {
            return Err(Error::shape(
                "hidden_states",
                format!(
                    "at most {m}x{m} patches (pos_embed_max_size) of {0}x{0} pixels",
                    self.patch_size
                ),
                &[h, w],
            ));
        }
        let (top, left) = ((m - h) / 2, (m - w) / 2);
        let dim = self.pos_embed.dims()[2];
        let table = self.pos_embed.val().reshape([m, m, dim]);
        Ok(table.slice([top..top + h, left..left + w]).reshape([1, h * w, dim]))
    }

    /// Embeds a latent `[B, C, H, W]` as tokens `[B, (H/p)*(W/p), D]` in row-major patch order.
    pub fn forward(&self, latent: Tensor<B, 4>) -> Result<Tensor<B, 3>> {
        let [_, _, height, width] = latent.dims();
        let (h, w) = (height / self.patch_size, width / self.patch_size);
        let pos = self.cropped_pos_embed(h, w)?;
        let x = self.proj.forward(latent); // [B, D, h, w]
        let [b, d, _, _] = x.dims();
        Ok(x.reshape([b, d, h * w]).swap_dims(1, 2) + pos)
    }
}

/// Two linears with SiLU between them (`linear_1`, `linear_2`), as diffusers'
/// `TimestepEmbedding` and `PixArtAlphaTextProjection` hold them.
#[derive(Module, Debug)]
pub struct MlpEmbedder<B: Backend> {
    /// `Linear(in, D)`.
    pub linear_1: Linear<B>,
    /// `Linear(D, D)`.
    pub linear_2: Linear<B>,
}

impl<B: Backend> MlpEmbedder<B> {
    /// An embedder from `d_in` to `dim` features.
    pub fn new(d_in: usize, dim: usize, device: &B::Device) -> Self {
        MlpEmbedder {
            linear_1: LinearConfig::new(d_in, dim).init(device),
            linear_2: LinearConfig::new(dim, dim).init(device),
        }
    }

    /// `linear_2(silu(linear_1(x)))`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.linear_2.forward(silu(self.linear_1.forward(x)))
    }
}

/// Number of sinusoidal features of the timestep projection.
pub const TIMESTEP_FEATURES: usize = 256;

/// Sinusoidal timestep features `[B, 256]`, cosines first:
/// `f_k = exp(-ln(10000) k / 128)`, `emb = [cos(t f_k), sin(t f_k)]`, `k = 0..128`.
pub fn timestep_features<B: Backend>(timestep: Tensor<B, 1>) -> Tensor<B, 2> {
    let half = TIMESTEP_FEATURES / 2;
    let device = timestep.device();
    let freqs: Vec<f32> =
        (0..half).map(|k| ((-(10000f32.ln()) * k as f32) / half as f32).exp()).collect();
    let freqs = Tensor::<B, 1>::from_floats(freqs.as_slice(), &device).unsqueeze_dim::<2>(0);
    let args = timestep.unsqueeze_dim::<2>(1) * freqs;
    Tensor::cat(vec![args.clone().cos(), args.sin()], 1)
}

/// The conditioning vector `temb = timestep_embedder(features(t)) + text_embedder(pooled)`
/// (diffusers' `CombinedTimestepTextProjEmbeddings`).
#[derive(Module, Debug)]
pub struct TimeTextEmbed<B: Backend> {
    /// MLP on the sinusoidal timestep features.
    pub timestep_embedder: MlpEmbedder<B>,
    /// MLP on the pooled text vector.
    pub text_embedder: MlpEmbedder<B>,
}

impl<B: Backend> TimeTextEmbed<B> {
    /// Embedders into width `dim` for a pooled vector of `pooled_dim`.
    pub fn new(dim: usize, pooled_dim: usize, device: &B::Device) -> Self {
        TimeTextEmbed {
            timestep_embedder: MlpEmbedder::new(TIMESTEP_FEATURES, dim, device),
            text_embedder: MlpEmbedder::new(pooled_dim, dim, device),
        }
    }

    /// `temb [B, D]` from timesteps `[B]` (`sigma * 1000`) and pooled text `[B, P]`.
    pub fn forward(&self, timestep: Tensor<B, 1>, pooled: Tensor<B, 2>) -> Tensor<B, 2> {
        self.timestep_embedder.forward(timestep_features(timestep))
            + self.text_embedder.forward(pooled)
    }
}
