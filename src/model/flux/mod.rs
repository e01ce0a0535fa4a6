//! The FLUX.1 transformer (diffusers `FluxTransformer2DModel`): double-stream blocks (the MMDiT
//! joint block with qk-norm and rotary positions), then single-stream blocks over
//! `[text; image]`.
//!
//! Module fields are named after diffusers' checkpoint keys; [`load`] holds the short remap and
//! the Black Forest Labs single-file key map.

pub(crate) mod config;
pub(crate) mod embed;
pub(crate) mod load;
pub(crate) mod single;

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::FloatDType;

pub use config::FluxConfig;
use config::ROPE_THETA;
use embed::{FluxTimeTextEmbed, FluxTimeTextEmbedConfig};
use single::{SingleTransformerBlock, SingleTransformerBlockConfig};

use crate::error::{Error, Result};
use crate::model::mmdit::block::{JointTransformerBlock, JointTransformerBlockConfig};
use crate::model::mmdit::norm::{AdaLayerNormContinuous, AdaLayerNormContinuousConfig};
use crate::model::precision::{float_dtype, to_dtype};
use crate::model::rope::Rope;

/// The FLUX denoiser: predicts the flow-matching velocity of packed latent tokens.
#[derive(Module, Debug)]
pub struct Flux<B: Backend> {
    /// Projection of the packed latent tokens to the hidden size.
    pub(crate) x_embedder: Linear<B>,
    /// Timestep, guidance and pooled-text conditioning.
    pub(crate) time_text_embed: FluxTimeTextEmbed<B>,
    /// Projection of the T5 features to the hidden size.
    pub(crate) context_embedder: Linear<B>,
    /// The double-stream blocks.
    pub(crate) transformer_blocks: Vec<JointTransformerBlock<B>>,
    /// The single-stream blocks.
    pub(crate) single_transformer_blocks: Vec<SingleTransformerBlock<B>>,
    /// Output AdaLN-continuous.
    pub(crate) norm_out: AdaLayerNormContinuous<B>,
    /// Projection to `p * p * out_channels` values per token.
    pub(crate) proj_out: Linear<B>,
    /// The configuration the model was built from.
    #[module(skip)]
    pub config: FluxConfig,
}

impl FluxConfig {
    /// Builds a model with lazily initialised (random) weights; see [`Flux::load`] for weights.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<Flux<B>> {
        self.validate()?;
        let dim = self.hidden_size();
        let heads = self.num_attention_heads;
        Ok(Flux {
            x_embedder: LinearConfig::new(self.in_channels, dim).init(device),
            time_text_embed: FluxTimeTextEmbedConfig::new(
                dim,
                self.pooled_projection_dim,
                self.guidance_embeds,
            )
            .init(device),
            context_embedder: LinearConfig::new(self.joint_attention_dim, dim).init(device),
            transformer_blocks: (0..self.num_layers)
                .map(|_| {
                    JointTransformerBlockConfig::new(dim, heads).with_qk_norm(true).init(device)
                })
                .collect(),
            single_transformer_blocks: (0..self.num_single_layers)
                .map(|_| SingleTransformerBlockConfig::new(dim, heads).init(device))
                .collect(),
            norm_out: AdaLayerNormContinuousConfig::new(dim).init(device),
            proj_out: LinearConfig::new(
                dim,
                self.patch_size * self.patch_size * self.output_channels(),
            )
            .init(device),
            config: self.clone(),
        })
    }
}

/// Packs latents `[B, C, H, W]` (`H`, `W` even) into tokens `[B, (H/2)(W/2), 4C]`, row-major
/// over the 2x2 cells, channel `4c + 2i + j` holding pixel `(i, j)` of channel `c` (diffusers'
/// `FluxPipeline._pack_latents`).
pub fn pack_latents<B: Backend>(latents: Tensor<B, 4>) -> Result<Tensor<B, 3>> {
    let [b, c, h, w] = latents.dims();
    if !h.is_multiple_of(2) || !w.is_multiple_of(2) || h == 0 || w == 0 {
        return Err(Error::shape(
            "latents",
            "[B, C, H, W] with H and W positive and even",
            &[b, c, h, w],
        ));
    }
    Ok(latents.reshape([b, c, h / 2, 2, w / 2, 2]).permute([0, 2, 4, 1, 3, 5]).reshape([
        b,
        (h / 2) * (w / 2),
        4 * c,
    ]))
}

/// Unpacks tokens `[B, (H/2)(W/2), 4C]` into latents `[B, C, H, W]`: the inverse of
/// [`pack_latents`].
pub fn unpack_latents<B: Backend>(
    tokens: Tensor<B, 3>,
    h: usize,
    w: usize,
) -> Result<Tensor<B, 4>> {
    let [b, l, c4] = tokens.dims();
    if !h.is_multiple_of(2)
        || !w.is_multiple_of(2)
        || l != (h / 2) * (w / 2)
        || !c4.is_multiple_of(4)
    {
        return Err(Error::shape(
            "tokens",
            format!("[B, {}, 4C] for an even {h}x{w} latent", (h / 2) * (w / 2)),
            &[b, l, c4],
        ));
    }
    Ok(tokens.reshape([b, h / 2, w / 2, c4 / 4, 2, 2]).permute([0, 3, 1, 4, 2, 5]).reshape([
        b,
        c4 / 4,
        h,
        w,
    ]))
}

/// Position ids `(0, row, col)` of the tokens of a `rows x cols` packed latent grid, row-major
/// (the FLUX pipeline's `img_ids`).
fn image_ids(rows: usize, cols: usize) -> Vec<[f64; 3]> {
    (0..rows).flat_map(|r| (0..cols).map(move |c| [0.0, r as f64, c as f64])).collect()
}

impl<B: Backend> Flux<B> {
    /// The rotary angles the FLUX pipeline uses for `text_len` text tokens and a `rows x cols`
    /// grid of packed latent tokens: text ids all zero (no rotation), image ids `(0, row, col)`
    /// row-major. They depend only on the sizes: a sampler computes them once per resolution.
    pub fn rope(
        &self,
        text_len: usize,
        rows: usize,
        cols: usize,
        device: &B::Device,
    ) -> Result<Rope<B>> {
        self.rope_from_ids(&vec![[0.0; 3]; text_len], &image_ids(rows, cols), device)
    }

    /// The rotary angles of any position ids: `txt_ids` then `img_ids`, one `(a0, a1, a2)` row
    /// per token (diffusers' `FluxPosEmbed` on `cat(txt_ids, img_ids)`).
    pub fn rope_from_ids(
        &self,
        txt_ids: &[[f64; 3]],
        img_ids: &[[f64; 3]],
        device: &B::Device,
    ) -> Result<Rope<B>> {
        let ids: Vec<[f64; 3]> = txt_ids.iter().chain(img_ids).copied().collect();
        Rope::new(&ids, &self.config.axes_dims_rope, ROPE_THETA, device)
    }

    /// Predicts the velocity `[B, L, out_channels]` of packed latent tokens, in `hidden`'s
    /// dtype, computed in the weights' dtype ([`Flux::dtype`]; the norms and rotations run in
    /// f32).
    ///
    /// - `hidden`: `[B, L, in_channels]` packed latent tokens;
    /// - `sigma`: `[B]` the noise level in `[0, 1]` (diffusers' `timestep` argument; the model
    ///   multiplies it by 1000);
    /// - `guidance`: `[B]` the guidance scale, given exactly when `guidance_embeds` is set;
    /// - `text`: `[B, T, joint_attention_dim]` T5 features; `pooled`: `[B, pooled_projection_dim]`;
    /// - `rope`: [`Flux::rope`] (or [`Flux::rope_from_ids`]) of the `T` text and `L` image tokens.
    ///
    /// Flow: `temb` -> double-stream blocks on (image, text) -> single-stream blocks on
    /// `cat(text, image)` -> image tokens -> AdaLN-continuous -> `proj_out`.
    pub fn forward(
        &self,
        hidden: Tensor<B, 3>,
        sigma: Tensor<B, 1>,
        guidance: Option<Tensor<B, 1>>,
        text: Tensor<B, 3>,
        pooled: Tensor<B, 2>,
        rope: &Rope<B>,
    ) -> Result<Tensor<B, 3>> {
        let cfg = &self.config;
        let [b, l, channels] = hidden.dims();
        if channels != cfg.in_channels || l == 0 {
            return Err(Error::shape(
                "hidden_states",
                format!("[B, L, {}] with L > 0", cfg.in_channels),
                &hidden.dims(),
            ));
        }
        if sigma.dims() != [b] {
            return Err(Error::shape("timestep", format!("[{b}]"), &sigma.dims()));
        }
        match (&guidance, cfg.guidance_embeds) {
            (Some(g), true) if g.dims() != [b] => {
                return Err(Error::shape("guidance", format!("[{b}]"), &g.dims()))
            }
            (None, true) => {
                return Err(Error::config("guidance", "the model embeds guidance: give a scale"))
            }
            (Some(_), false) => {
                return Err(Error::config(
                    "guidance",
                    "the model does not embed guidance (guidance_embeds is false)",
                ))
            }
            _ => {}
        }
        let [tb, t, tj] = text.dims();
        if tb != b || tj != cfg.joint_attention_dim {
            return Err(Error::shape(
                "encoder_hidden_states",
                format!("[{b}, T, {}]", cfg.joint_attention_dim),
                &text.dims(),
            ));
        }
        if pooled.dims() != [b, cfg.pooled_projection_dim] {
            return Err(Error::shape(
                "pooled_projections",
                format!("[{b}, {}]", cfg.pooled_projection_dim),
                &pooled.dims(),
            ));
        }
        if rope.len() != t + l || rope.head_dim() != cfg.attention_head_dim {
            return Err(Error::shape(
                "rope",
                format!(
                    "{} rows (text + image ids) of head width {}",
                    t + l,
                    cfg.attention_head_dim
                ),
                &[rope.len(), rope.head_dim()],
            ));
        }

        let (caller, dtype) = (float_dtype(&hidden), self.dtype());
        let mut x = self.x_embedder.forward(to_dtype(hidden, dtype));
        let temb = self.time_text_embed.forward(sigma, guidance, to_dtype(pooled, dtype));
        let mut c = self.context_embedder.forward(to_dtype(text, dtype));
        for block in &self.transformer_blocks {
            let (nx, nc) = block.forward(x, c, temb.clone(), Some(rope));
            x = nx;
            c = nc.expect("double-stream blocks keep the text stream");
        }
        let mut h = Tensor::cat(vec![c, x], 1);
        for block in &self.single_transformer_blocks {
            h = block.forward(h, temb.clone(), rope);
        }
        let d = h.dims()[2];
        let x = h.slice([0..b, t..t + l, 0..d]);
        let x = self.proj_out.forward(self.norm_out.forward(x, temb));
        Ok(to_dtype(x, caller))
    }

    /// The dtype of the base weights, which the forward pass computes in.
    pub fn dtype(&self) -> FloatDType {
        float_dtype(&self.context_embedder.weight.val())
    }
}
