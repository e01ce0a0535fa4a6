//! CLIP's image tower (transformers' `CLIPVisionModelWithProjection`): a ViT with a class
//! token, pre- and post-norm, and the projection into CLIP's joint embedding.

use burn::module::Param;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, Linear, LinearConfig};
use burn::prelude::*;

use super::encoder::{validate_shape, ClipEncoder, ClipEncoderConfig};

/// A CLIP vision tower's `config.json` (transformers' `CLIPVisionConfig`, with its defaults).
#[derive(Config, Debug)]
pub struct ClipVisionConfig {
    /// Width `D`.
    #[config(default = 768)]
    pub hidden_size: usize,
    /// Width of the MLP.
    #[config(default = 3072)]
    pub intermediate_size: usize,
    /// Number of encoder layers.
    #[config(default = 12)]
    pub num_hidden_layers: usize,
    /// Attention heads.
    #[config(default = 12)]
    pub num_attention_heads: usize,
    /// Input channels (3).
    #[config(default = 3)]
    pub num_channels: usize,
    /// Side of the square input image in pixels.
    #[config(default = 224)]
    pub image_size: usize,
    /// Side of a square patch in pixels.
    #[config(default = 32)]
    pub patch_size: usize,
    /// `quick_gelu` (OpenAI ViT-L/14) or `gelu` (LAION ViT-H/14).
    #[config(default = "String::from(\"quick_gelu\")")]
    pub hidden_act: String,
    /// Layer-norm epsilon.
    #[config(default = 1e-5)]
    pub layer_norm_eps: f64,
    /// Width of the image embedding after `visual_projection`.
    #[config(default = 512)]
    pub projection_dim: usize,
}

impl ClipVisionConfig {
    /// Checks the configuration; errors name the field.
    pub fn validate(&self) -> crate::Result<()> {
        validate_shape(&self.hidden_act, self.hidden_size, self.num_attention_heads)?;
        if self.num_channels != 3 {
            return Err(crate::Error::config("num_channels", "CLIP reads RGB images: expected 3"));
        }
        if self.patch_size == 0 || self.image_size < self.patch_size {
            return Err(crate::Error::config(
                "patch_size",
                format!("must be between 1 and image_size {}", self.image_size),
            ));
        }
        if !self.image_size.is_multiple_of(self.patch_size) {
            return Err(crate::Error::config(
                "image_size",
                format!("must be a multiple of patch_size {}", self.patch_size),
            ));
        }
        // Sizes in f64: a product of user-given numbers must not wrap.
        let (d, f, p) =
            (self.hidden_size as f64, self.intermediate_size as f64, self.patch_size as f64);
        let positions = (self.image_size as f64 / p).powi(2) + 1.0;
        let params = self.num_hidden_layers as f64 * (4.0 * d * d + 2.0 * d * f)
            + (3.0 * p * p + positions + self.projection_dim as f64) * d;
        crate::limits::check_params(
            "num_hidden_layers/hidden_size/intermediate_size/image_size/patch_size/projection_dim",
            params,
        )
    }

    /// Patches per image plus the class token.
    pub fn num_positions(&self) -> usize {
        (self.image_size / self.patch_size).pow(2) + 1
    }

    /// A randomly initialised tower (weights are drawn lazily).
    pub fn init<B: Backend>(&self, device: &B::Device) -> crate::Result<ClipVisionModel<B>> {
        self.validate()?;
        let (d, p) = (self.hidden_size, self.patch_size);
        let shape = ClipEncoderConfig {
            width: d,
            intermediate: self.intermediate_size,
            layers: self.num_hidden_layers,
            heads: self.num_attention_heads,
            eps: self.layer_norm_eps,
            quick_gelu: self.hidden_act == "quick_gelu",
            causal: false,
        };
        Ok(ClipVisionModel {
            vision_model: ClipVisionTransformer {
                embeddings: ClipVisionEmbeddings {
                    class_embedding: Param::from_tensor(Tensor::zeros([d], device)),
                    patch_embedding: Conv2dConfig::new([self.num_channels, d], [p, p])
                        .with_stride([p, p])
                        .with_bias(false)
                        .init(device),
                    position_embedding: EmbeddingConfig::new(self.num_positions(), d).init(device),
                },
                pre_layrnorm: shape.norm(device),
                encoder: shape.init(device),
                post_layernorm: shape.norm(device),
            },
            visual_projection: LinearConfig::new(d, self.projection_dim)
                .with_bias(false)
                .init(device),
            image_size: self.image_size,
        })
    }
}

/// Patch, class-token and position embeddings.
#[derive(Module, Debug)]
pub(crate) struct ClipVisionEmbeddings<B: Backend> {
    /// The class token `[D]`.
    pub class_embedding: Param<Tensor<B, 1>>,
    /// `P x P` convolution with stride `P`, no bias: one token per patch.
    pub(crate) patch_embedding: Conv2d<B>,
    /// `[patches + 1, D]`.
    pub(crate) position_embedding: Embedding<B>,
}

/// Embeddings, pre-norm, encoder and post-norm (`vision_model.*`; `pre_layrnorm` is
/// transformers' spelling).
#[derive(Module, Debug)]
pub(crate) struct ClipVisionTransformer<B: Backend> {
    /// Patch and position embeddings.
    pub(crate) embeddings: ClipVisionEmbeddings<B>,
    /// Norm before the encoder.
    pub(crate) pre_layrnorm: LayerNorm<B>,
    /// Encoder layers (no mask).
    pub(crate) encoder: ClipEncoder<B>,
    /// Norm of the class token's output.
    pub(crate) post_layernorm: LayerNorm<B>,
}

/// `CLIPVisionModelWithProjection`.
#[derive(Module, Debug)]
pub struct ClipVisionModel<B: Backend> {
    /// The transformer.
    pub(crate) vision_model: ClipVisionTransformer<B>,
    /// Image-embedding projection, no bias.
    pub(crate) visual_projection: Linear<B>,
    image_size: usize,
}

impl<B: Backend> ClipVisionModel<B> {
    /// The side of the square images the tower reads.
    pub fn image_size(&self) -> usize {
        self.image_size
    }

    /// Image embeddings `[B, projection_dim]` of preprocessed images `[B, 3, S, S]`:
    /// `x = [cls; conv(pixels)] + pos`, `h = encoder(pre_ln(x))`,
    /// `visual_projection(post_ln(h[:, 0]))`.
    pub fn forward(&self, pixels: Tensor<B, 4>) -> crate::Result<Tensor<B, 2>> {
        let [b, c, h, w] = pixels.dims();
        let s = self.image_size;
        if b == 0 || c != 3 || h != s || w != s {
            return Err(crate::Error::shape(
                "pixel_values",
                format!("[B, 3, {s}, {s}]"),
                &[b, c, h, w],
            ));
        }
        let vm = &self.vision_model;
        let patches = vm.embeddings.patch_embedding.forward(pixels);
        let [_, d, gh, gw] = patches.dims();
        let patches = patches.reshape([b, d, gh * gw]).swap_dims(1, 2);
        let cls = vm.embeddings.class_embedding.val().reshape([1, 1, d]).expand([b, 1, d]);
        let n = gh * gw + 1;
        let device = patches.device();
        let positions = Tensor::<B, 1, Int>::arange(0..n as i64, &device).reshape([1, n]);
        let x = Tensor::cat(vec![cls, patches], 1)
            + vm.embeddings.position_embedding.forward(positions);
        let x = vm.encoder.forward(vm.pre_layrnorm.forward(x));
        let pooled = vm.post_layernorm.forward(x.slice([0..b, 0..1]).reshape([b, d]));
        Ok(self.visual_projection.forward(pooled))
    }
}
