//! Input embedders: patches with a cropped position table, timestep and pooled-text vectors,
//! and the text-feature projection.

use burn::module::{Param, ParamId};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::silu;

use crate::error::Error;
use crate::model::precision::{float_dtype, to_dtype};

/// Patch embedding (`pos_embed`): a `p x p` stride-`p` convolution plus the stored position table.
#[derive(Module, Debug)]
pub(crate) struct PatchEmbed<B: Backend> {
    /// `Conv2d(in_channels, D, p, stride p)`.
    pub(crate) proj: Conv2d<B>,
    /// Position table `[1, M*M, D]` for an `M x M` patch grid.
    pub pos_embed: Param<Tensor<B, 3>>,
    /// Patch side `p`.
    pub patch_size: usize,
    /// Grid side `M` of the position table.
    pub max_size: usize,
}

/// diffusers' fixed 2-D sin-cos position table `[M*M, D]` (`get_2d_sincos_pos_embed` with
/// `base_size`, interpolation scale 1), row-major over the `M x M` grid. For the patch in row
/// `i`, column `j`, with `s = base_size / M`: the first `D/2` channels are `emb(j s)`, the last
/// `D/2` are `emb(i s)`, where `emb(x) = [sin(x w_k), cos(x w_k)]` over
/// `w_k = 10000^(-k / (D/4))`, `k < D/4`.
pub(crate) fn sincos_pos_table(dim: usize, max_size: usize, base_size: usize) -> Vec<f32> {
    let quarter = dim / 4;
    let scale = base_size as f64 / max_size as f64;
    let emb = |x: f64, out: &mut Vec<f32>| {
        let w = |k: usize| 10000f64.powf(-(k as f64) / quarter as f64);
        out.extend((0..quarter).map(|k| (x * w(k)).sin() as f32));
        out.extend((0..quarter).map(|k| (x * w(k)).cos() as f32));
    };
    let mut table = Vec::with_capacity(max_size * max_size * dim);
    for i in 0..max_size {
        for j in 0..max_size {
            emb(j as f64 * scale, &mut table);
            emb(i as f64 * scale, &mut table);
        }
    }
    table
}

/// Settings of a [`PatchEmbed`].
#[derive(Config, Debug)]
pub(crate) struct PatchEmbedConfig {
    /// Latent channels.
    in_channels: usize,
    /// Width of the embedding.
    dim: usize,
    /// Side of a patch.
    patch_size: usize,
    /// Side `M` of the `M x M` position table.
    pos_embed_max_size: usize,
    /// Patches per side of the training resolution (sample size / patch), which scales the
    /// table's frequencies.
    base_size: usize,
}

impl PatchEmbedConfig {
    /// A patch embedder whose table is initialised as diffusers does ([`sincos_pos_table`]);
    /// loading a checkpoint replaces it.
    pub(crate) fn init<B: Backend>(&self, device: &B::Device) -> PatchEmbed<B> {
        let (dim, patch) = (self.dim, self.patch_size);
        let (in_channels, max_size, base_size) =
            (self.in_channels, self.pos_embed_max_size, self.base_size);
        // Lazy, like every other parameter: loading a checkpoint never computes it.
        let shape = [1, max_size * max_size, dim];
        let init = move |device: &B::Device, require_grad: bool| {
            let table = sincos_pos_table(dim, max_size, base_size);
            let t = Tensor::<B, 3>::from_data(TensorData::new(table, shape), device);
            if require_grad {
                t.require_grad()
            } else {
                t
            }
        };
        PatchEmbed {
            proj: Conv2dConfig::new([in_channels, dim], [patch, patch])
                .with_stride([patch, patch])
                .init(device),
            pos_embed: Param::uninitialized(
                ParamId::new(),
                init,
                device.clone(),
                true,
                shape.into(),
            ),
            patch_size: patch,
            max_size,
        }
    }
}

impl<B: Backend> PatchEmbed<B> {
    /// The centre crop of the position table for an `h x w` patch grid, as `[1, h*w, D]`:
    /// rows `(M-h)/2 ..`, columns `(M-w)/2 ..` of the table viewed as `[M, M, D]`.
    pub(crate) fn cropped_pos_embed(&self, h: usize, w: usize) -> crate::Result<Tensor<B, 3>> {
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
    pub(crate) fn forward(&self, latent: Tensor<B, 4>) -> crate::Result<Tensor<B, 3>> {
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
pub(crate) struct MlpEmbedder<B: Backend> {
    /// `Linear(in, D)`.
    pub(crate) linear_1: Linear<B>,
    /// `Linear(D, D)`.
    pub(crate) linear_2: Linear<B>,
}

/// Settings of an [`MlpEmbedder`].
#[derive(Config, Debug)]
pub(crate) struct MlpEmbedderConfig {
    /// Input features.
    d_input: usize,
    /// Output width.
    dim: usize,
}

impl MlpEmbedderConfig {
    /// An embedder from `d_input` to `dim` features.
    pub(crate) fn init<B: Backend>(&self, device: &B::Device) -> MlpEmbedder<B> {
        MlpEmbedder {
            linear_1: LinearConfig::new(self.d_input, self.dim).init(device),
            linear_2: LinearConfig::new(self.dim, self.dim).init(device),
        }
    }
}

impl<B: Backend> MlpEmbedder<B> {
    /// `linear_2(silu(linear_1(x)))`.
    pub(crate) fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.linear_2.forward(silu(self.linear_1.forward(x)))
    }
}

/// Number of sinusoidal features of the timestep projection.
pub(crate) const TIMESTEP_FEATURES: usize = 256;

/// Sinusoidal timestep features `[B, 256]`, cosines first:
/// `f_k = exp(-ln(10000) k / 128)`, `emb = [cos(t f_k), sin(t f_k)]`, `k = 0..128`.
pub(crate) fn timestep_features<B: Backend>(timestep: Tensor<B, 1>) -> Tensor<B, 2> {
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
pub(crate) struct TimeTextEmbed<B: Backend> {
    /// MLP on the sinusoidal timestep features.
    pub(crate) timestep_embedder: MlpEmbedder<B>,
    /// MLP on the pooled text vector.
    pub(crate) text_embedder: MlpEmbedder<B>,
}

/// Settings of a [`TimeTextEmbed`].
#[derive(Config, Debug)]
pub(crate) struct TimeTextEmbedConfig {
    /// Width of the embedding.
    dim: usize,
    /// Features of the pooled text vector.
    pooled_projection_dim: usize,
}

impl TimeTextEmbedConfig {
    /// Embedders into width `dim` for a pooled vector of `pooled_projection_dim`.
    pub(crate) fn init<B: Backend>(&self, device: &B::Device) -> TimeTextEmbed<B> {
        TimeTextEmbed {
            timestep_embedder: MlpEmbedderConfig::new(TIMESTEP_FEATURES, self.dim).init(device),
            text_embedder: MlpEmbedderConfig::new(self.pooled_projection_dim, self.dim)
                .init(device),
        }
    }
}

impl<B: Backend> TimeTextEmbed<B> {
    /// `temb [B, D]` from timesteps `[B]` (`sigma * 1000`, any float dtype: the features are
    /// computed in it and cast to `pooled`'s, as diffusers casts them to the hidden states') and
    /// pooled text `[B, P]`.
    pub(crate) fn forward(&self, timestep: Tensor<B, 1>, pooled: Tensor<B, 2>) -> Tensor<B, 2> {
        let features = to_dtype(timestep_features(timestep), float_dtype(&pooled));
        self.timestep_embedder.forward(features) + self.text_embedder.forward(pooled)
    }
}

#[cfg(test)]
mod tests {
    use super::sincos_pos_table;

    #[test]
    fn position_table_matches_diffusers() {
        // diffusers get_2d_sincos_pos_embed(8, 2, base_size=2): row 1 is (row 0, column 1).
        let t = sincos_pos_table(8, 2, 2);
        let (s1, c1, s2, c2) = (1f32.sin(), 1f32.cos(), 0.01f32.sin(), 0.01f32.cos());
        assert_eq!(&t[8..16], &[s1, s2, c1, c2, 0.0, 0.0, 1.0, 1.0]);
        assert_eq!(&t[16..24], &[0.0, 0.0, 1.0, 1.0, s1, s2, c1, c2]);
        // grid 4, base 2: positions scaled by 1/2; row 5 is (1, 1): sin(0.5) = 0.4794.
        let t = sincos_pos_table(8, 4, 2);
        assert!((t[40] - 0.5f32.sin()).abs() < 1e-7 && (t[44] - 0.5f32.sin()).abs() < 1e-7);
    }
}
