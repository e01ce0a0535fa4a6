//! The SD3 / SD3.5 multimodal diffusion transformer (MMDiT), one implementation for SD3-medium,
//! SD3.5-medium (dual attention, qk-norm), SD3.5-large and any smaller configuration.
//!
//! Module fields are named after diffusers' checkpoint keys; [`load`] holds the short remap.

pub(crate) mod attention;
pub(crate) mod block;
pub(crate) mod config;
pub(crate) mod embed;
pub(crate) mod load;
pub(crate) mod norm;

use burn::module::Param;
use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;

use block::{JointTransformerBlock, JointTransformerBlockConfig};
pub use config::MMDiTConfig;

use crate::error::{Error, Result};
use crate::model::precision::{float_dtype, to_dtype};
use burn::tensor::FloatDType;
use embed::{PatchEmbed, PatchEmbedConfig, TimeTextEmbed, TimeTextEmbedConfig};
use norm::{AdaLayerNormContinuous, AdaLayerNormContinuousConfig};

/// The MMDiT denoiser: predicts the flow-matching velocity of a latent.
#[derive(Module, Debug)]
pub struct MMDiT<B: Backend> {
    /// Patch embedding and position table.
    pub(crate) pos_embed: PatchEmbed<B>,
    /// Timestep and pooled-text conditioning.
    pub(crate) time_text_embed: TimeTextEmbed<B>,
    /// Projection of the text features to the hidden size.
    pub(crate) context_embedder: Linear<B>,
    /// The joint blocks; the last one is context-pre-only.
    pub(crate) transformer_blocks: Vec<JointTransformerBlock<B>>,
    /// Output AdaLN-continuous.
    pub(crate) norm_out: AdaLayerNormContinuous<B>,
    /// Projection to `p * p * out_channels` values per patch.
    pub(crate) proj_out: Linear<B>,
    /// The configuration the model was built from.
    #[module(skip)]
    pub config: MMDiTConfig,
}

impl MMDiTConfig {
    /// Builds a model with lazily initialised (random) weights; see [`MMDiT::load`] for weights.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<MMDiT<B>> {
        self.validate()?;
        let dim = self.hidden_size();
        let heads = self.num_attention_heads;
        let qk = self.has_qk_norm();
        let depth = self.num_layers;
        Ok(MMDiT {
            pos_embed: PatchEmbedConfig::new(
                self.in_channels,
                dim,
                self.patch_size,
                self.pos_embed_max_size,
                self.sample_size / self.patch_size,
            )
            .init(device),
            time_text_embed: TimeTextEmbedConfig::new(dim, self.pooled_projection_dim).init(device),
            context_embedder: LinearConfig::new(self.joint_attention_dim, dim).init(device),
            transformer_blocks: (0..depth)
                .map(|i| {
                    JointTransformerBlockConfig::new(dim, heads)
                        .with_qk_norm(qk)
                        .with_use_dual_attention(self.dual_attention_layers.contains(&i))
                        .with_context_pre_only(i + 1 == depth)
                        .init(device)
                })
                .collect(),
            norm_out: AdaLayerNormContinuousConfig::new(dim).init(device),
            proj_out: LinearConfig::new(dim, self.patch_size * self.patch_size * self.out_channels)
                .init(device),
            config: self.clone(),
        })
    }
}

/// Replaces `linear`'s weight and bias by zeros of their shapes (without drawing the random
/// values they were initialised lazily with).
fn zero_linear<B: Backend>(linear: &mut Linear<B>, device: &B::Device) {
    linear.weight = Param::from_tensor(Tensor::zeros(linear.weight.lazy_shape(), device));
    if let Some(bias) = &mut linear.bias {
        *bias = Param::from_tensor(Tensor::zeros(bias.lazy_shape(), device));
    }
}

impl<B: Backend> MMDiT<B> {
    /// The model with DiT's adaLN-Zero initialisation for training from scratch: every
    /// modulation linear (`norm1`, `norm1_context`, `norm_out`) and `proj_out` set to zero.
    ///
    /// All gates then start at 0, so each block is the identity, and the model predicts zero
    /// velocity; the modulation learns first (Peebles & Xie 2023, and Stability's MMDiT training
    /// code). [`MMDiTConfig::init`] keeps torch's default initialisation, as diffusers'
    /// constructor does, since checkpoints replace it.
    pub fn zero_init_modulation(mut self, device: &B::Device) -> Self {
        for block in &mut self.transformer_blocks {
            zero_linear(&mut block.norm1.linear, device);
            match &mut block.norm1_context {
                block::ContextNorm::Zero(norm) => zero_linear(&mut norm.linear, device),
                block::ContextNorm::Continuous(norm) => zero_linear(&mut norm.linear, device),
            }
        }
        zero_linear(&mut self.norm_out.linear, device);
        zero_linear(&mut self.proj_out, device);
        self
    }

    /// Predicts the velocity `[B, out_channels, H, W]` in `latent`'s dtype, computed in the
    /// weights' dtype ([`MMDiT::dtype`]; the inputs are cast to it, the norms run in f32).
    ///
    /// - `latent`: `[B, in_channels, H, W]`, `H` and `W` multiples of the patch size, at most
    ///   `pos_embed_max_size` patches per side (non-square is fine);
    /// - `timestep`: `[B]`, `sigma * 1000` as a float (not rounded);
    /// - `text`: `[B, L, joint_attention_dim]` prompt features;
    /// - `pooled`: `[B, pooled_projection_dim]` pooled prompt vector.
    ///
    /// Flow: patch-embed + cropped positions -> `temb` = time MLP + pooled MLP -> text projected
    /// by `context_embedder` -> joint blocks -> AdaLN-continuous -> `proj_out` -> unpatchify
    /// `[B, h, w, p, p, C] -> [B, C, h*p, w*p]`.
    pub fn forward(
        &self,
        latent: Tensor<B, 4>,
        timestep: Tensor<B, 1>,
        text: Tensor<B, 3>,
        pooled: Tensor<B, 2>,
    ) -> Result<Tensor<B, 4>> {
        let cfg = &self.config;
        let [b, channels, height, width] = latent.dims();
        let p = cfg.patch_size;
        if channels != cfg.in_channels
            || height % p != 0
            || width % p != 0
            || height == 0
            || width == 0
        {
            return Err(Error::shape(
                "hidden_states",
                format!("[B, {}, H, W] with H and W positive multiples of {p}", cfg.in_channels),
                &[b, channels, height, width],
            ));
        }
        if timestep.dims() != [b] {
            return Err(Error::shape("timestep", format!("[{b}]"), &timestep.dims()));
        }
        let [tb, _, tj] = text.dims();
        if tb != b || tj != cfg.joint_attention_dim {
            return Err(Error::shape(
                "encoder_hidden_states",
                format!("[{b}, L, {}]", cfg.joint_attention_dim),
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

        let (caller, dtype) = (float_dtype(&latent), self.dtype());
        let mut x = self.pos_embed.forward(to_dtype(latent, dtype))?;
        let temb = self.time_text_embed.forward(timestep, to_dtype(pooled, dtype));
        let mut c = Some(self.context_embedder.forward(to_dtype(text, dtype)));
        for block in &self.transformer_blocks {
            let (nx, nc) = block.forward(
                x,
                c.expect("only the last block drops the text stream"),
                temb.clone(),
                None,
            );
            x = nx;
            c = nc;
        }
        let x = self.proj_out.forward(self.norm_out.forward(x, temb));

        let (h, w, co) = (height / p, width / p, cfg.out_channels);
        let x = to_dtype(x, caller);
        Ok(x.reshape([b, h, w, p, p, co]).permute([0, 5, 1, 3, 2, 4]).reshape([
            b,
            co,
            h * p,
            w * p,
        ]))
    }

    /// The dtype of the base weights, which the forward pass computes in (see
    /// [`Precision`](crate::model::Precision)).
    pub fn dtype(&self) -> FloatDType {
        float_dtype(&self.context_embedder.weight.val())
    }
}

#[cfg(test)]
mod tests {
    use burn::prelude::*;
    use burn::tensor::Distribution;

    use super::MMDiTConfig;
    use crate::backend::Backend as B;
    use crate::model::Adaptable;

    #[test]
    fn zero_modulation_makes_blocks_identities_and_the_output_zero() {
        let device = Default::default();
        let config = MMDiTConfig::new()
            .with_sample_size(8)
            .with_patch_size(2)
            .with_in_channels(3)
            .with_out_channels(3)
            .with_num_layers(3)
            .with_attention_head_dim(8)
            .with_num_attention_heads(2)
            .with_joint_attention_dim(6)
            .with_caption_projection_dim(16)
            .with_pooled_projection_dim(5)
            .with_pos_embed_max_size(4)
            .with_dual_attention_layers(vec![0])
            .with_qk_norm(Some("rms_norm".to_string()));
        let random = config.init::<B>(&device).unwrap().materialize();
        let x = Tensor::<B, 3>::random([2, 16, 16], Distribution::Normal(0.0, 1.0), &device);
        let c = Tensor::<B, 3>::random([2, 4, 16], Distribution::Normal(0.0, 1.0), &device);
        let temb = Tensor::<B, 2>::random([2, 16], Distribution::Normal(0.0, 1.0), &device);
        // Torch's default initialisation: the first (dual-attention) block changes both streams.
        let (x1, c1) =
            random.transformer_blocks[0].forward(x.clone(), c.clone(), temb.clone(), None);
        assert!((x1 - x.clone()).abs().max().into_scalar() > 1e-2);
        assert!((c1.unwrap() - c.clone()).abs().max().into_scalar() > 1e-2);

        let zero = random.zero_init_modulation(&device);
        for block in &zero.transformer_blocks[..2] {
            let (x1, c1) = block.forward(x.clone(), c.clone(), temb.clone(), None);
            x1.into_data().assert_eq(&x.clone().into_data(), true);
            c1.unwrap().into_data().assert_eq(&c.clone().into_data(), true);
        }
        let latent = Tensor::<B, 4>::random([2, 3, 8, 8], Distribution::Normal(0.0, 1.0), &device);
        let text = Tensor::<B, 3>::random([2, 4, 6], Distribution::Normal(0.0, 1.0), &device);
        let pooled = Tensor::<B, 2>::random([2, 5], Distribution::Normal(0.0, 1.0), &device);
        let v = zero.forward(latent, Tensor::from_floats([500.0, 20.0], &device), text, pooled);
        v.unwrap()
            .into_data()
            .assert_eq(&Tensor::<B, 4>::zeros([2, 3, 8, 8], &device).into_data(), true);
    }
}
