//! The SD3 VAE (diffusers' `AutoencoderKL` with 16 latent channels, no quant convs): the
//! decoder turns latents into images, the encoder images into latent means.
//!
//! Module fields carry the diffusers names (`decoder.up_blocks.N.resnets.M.conv1`); loading
//! also reads Stability single files (`first_stage_model.*`, LDM names, [`ldm_key`]).

use std::path::Path;

use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{GroupNorm, GroupNormConfig, Linear, LinearConfig, PaddingConfig2d};
use burn::prelude::*;
use burn::tensor::activation::silu;

use crate::model::attention::{self_attention, Scores};
use crate::weights::{apply_plan, load_folder, torch_param_name, Source, WeightFiles};

/// Key prefix of the VAE in Stability single-file checkpoints.
pub(crate) const LDM_PREFIX: &str = "first_stage_model.";

/// A VAE's `config.json` (the fields SD3 uses).
#[derive(Config, Debug)]
pub struct VaeConfig {
    /// Image channels in.
    #[config(default = 3)]
    pub in_channels: usize,
    /// Image channels out.
    #[config(default = 3)]
    pub out_channels: usize,
    /// Channels per resolution level, finest first.
    pub block_out_channels: Vec<usize>,
    /// Resnets per encoder level (the decoder has one more).
    #[config(default = 2)]
    pub layers_per_block: usize,
    /// Latent channels (16 for SD3).
    #[config(default = 16)]
    pub latent_channels: usize,
    /// GroupNorm groups.
    #[config(default = 32)]
    pub norm_num_groups: usize,
    /// Latent scale: `z_model = (z_vae - shift) * scale`.
    #[config(default = 1.5305)]
    pub scaling_factor: f64,
    /// Latent shift.
    #[config(default = 0.0609)]
    pub shift_factor: f64,
    /// SD3 has no quant conv; `true` is rejected.
    #[config(default = false)]
    pub use_quant_conv: bool,
    /// SD3 has no post-quant conv; `true` is rejected.
    #[config(default = false)]
    pub use_post_quant_conv: bool,
}

/// The most resolution levels a VAE may have (SD3's has 4): the image-to-latent factor
/// `2^(levels - 1)` stays far from overflow.
pub(crate) const MAX_LEVELS: usize = 16;

/// GroupNorm epsilon of every VAE norm.
const EPS: f64 = 1e-6;

impl VaeConfig {
    /// Checks the configuration; errors name the field.
    pub fn validate(&self) -> crate::Result<()> {
        if self.block_out_channels.is_empty() || self.block_out_channels.len() > MAX_LEVELS {
            return Err(crate::Error::config(
                "block_out_channels",
                format!("needs 1 to {MAX_LEVELS} levels, found {}", self.block_out_channels.len()),
            ));
        }
        crate::limits::check_positive(&[
            ("in_channels", self.in_channels),
            ("out_channels", self.out_channels),
            ("latent_channels", self.latent_channels),
            ("norm_num_groups", self.norm_num_groups),
        ])?;
        // Each level's resnets hold two 3x3 convolutions (encoder and decoder together
        // `2 layers_per_block + 1` resnets); in f64, so that no product wraps.
        let resnets = 2.0 * self.layers_per_block as f64 + 1.0;
        let params: f64 =
            self.block_out_channels.iter().map(|&c| resnets * 18.0 * (c as f64).powi(2)).sum();
        crate::limits::check_params("block_out_channels/layers_per_block", params)?;
        if let Some(c) = self.block_out_channels.iter().find(|&&c| c % self.norm_num_groups != 0) {
            return Err(crate::Error::config(
                "norm_num_groups",
                format!("{} groups do not divide {c} channels", self.norm_num_groups),
            ));
        }
        if self.use_quant_conv || self.use_post_quant_conv {
            return Err(crate::Error::config(
                "use_quant_conv",
                "the SD3 VAE has no quant_conv / post_quant_conv",
            ));
        }
        Ok(())
    }

    /// Spatial factor between images and latents: `2^(levels - 1)`.
    pub fn downsample_factor(&self) -> usize {
        1 << (self.block_out_channels.len() - 1)
    }

    /// A randomly initialised VAE (weights are drawn lazily).
    pub fn init<B: Backend>(&self, device: &B::Device) -> crate::Result<AutoencoderKL<B>> {
        self.validate()?;
        let g = self.norm_num_groups;
        let chans = &self.block_out_channels;
        let top = *chans.last().expect("validated");
        let levels = chans.len();
        let mut down_blocks = Vec::new();
        let mut prev = chans[0];
        for (i, &c) in chans.iter().enumerate() {
            down_blocks.push(DownBlock {
                resnets: (0..self.layers_per_block)
                    .map(|j| ResnetConfig::new(if j == 0 { prev } else { c }, c, g).init(device))
                    .collect(),
                downsamplers: (i + 1 < levels)
                    .then(|| Sampler { conv: conv(c, c, 3, 0, 2, device) })
                    .into_iter()
                    .collect(),
            });
            prev = c;
        }
        let mut up_blocks = Vec::new();
        let mut prev = top;
        for (i, &c) in chans.iter().rev().enumerate() {
            up_blocks.push(UpBlock {
                resnets: (0..=self.layers_per_block)
                    .map(|j| ResnetConfig::new(if j == 0 { prev } else { c }, c, g).init(device))
                    .collect(),
                upsamplers: (i + 1 < levels)
                    .then(|| Sampler { conv: conv(c, c, 3, 1, 1, device) })
                    .into_iter()
                    .collect(),
            });
            prev = c;
        }
        let norm = |c| GroupNormConfig::new(g, c).with_epsilon(EPS).init(device);
        Ok(AutoencoderKL {
            encoder: Encoder {
                conv_in: conv(self.in_channels, chans[0], 3, 1, 1, device),
                down_blocks,
                mid_block: MidBlockConfig::new(top, g).init(device),
                conv_norm_out: norm(top),
                conv_out: conv(top, 2 * self.latent_channels, 3, 1, 1, device),
            },
            decoder: Decoder {
                conv_in: conv(self.latent_channels, top, 3, 1, 1, device),
                mid_block: MidBlockConfig::new(top, g).init(device),
                up_blocks,
                conv_norm_out: norm(chans[0]),
                conv_out: conv(chans[0], self.out_channels, 3, 1, 1, device),
            },
            scaling_factor: self.scaling_factor,
            shift_factor: self.shift_factor,
            latent_channels: self.latent_channels,
            downsample: self.downsample_factor(),
        })
    }
}

fn conv<B: Backend>(
    i: usize,
    o: usize,
    k: usize,
    pad: usize,
    stride: usize,
    device: &B::Device,
) -> Conv2d<B> {
    Conv2dConfig::new([i, o], [k, k])
        .with_stride([stride, stride])
        .with_padding(PaddingConfig2d::Explicit(pad, pad, pad, pad))
        .init(device)
}

/// Residual block `x + conv2(silu(norm2(conv1(silu(norm1 x)))))`, with a 1x1 `conv_shortcut`
/// on `x` when the channel count changes.
#[derive(Module, Debug)]
pub(crate) struct Resnet<B: Backend> {
    /// First norm.
    pub(crate) norm1: GroupNorm<B>,
    /// First 3x3 convolution.
    pub(crate) conv1: Conv2d<B>,
    /// Second norm.
    pub(crate) norm2: GroupNorm<B>,
    /// Second 3x3 convolution.
    pub(crate) conv2: Conv2d<B>,
    /// 1x1 projection of the input, when channels change.
    pub(crate) conv_shortcut: Option<Conv2d<B>>,
}

/// Settings of a [`Resnet`].
#[derive(Config, Debug)]
pub(crate) struct ResnetConfig {
    /// Input channels.
    in_channels: usize,
    /// Output channels.
    out_channels: usize,
    /// Groups of the group norms.
    groups: usize,
}

impl ResnetConfig {
    /// The block these settings describe.
    pub(crate) fn init<B: Backend>(&self, device: &B::Device) -> Resnet<B> {
        let (i, o, groups) = (self.in_channels, self.out_channels, self.groups);
        let norm = |c| GroupNormConfig::new(groups, c).with_epsilon(EPS).init(device);
        Resnet {
            norm1: norm(i),
            conv1: conv(i, o, 3, 1, 1, device),
            norm2: norm(o),
            conv2: conv(o, o, 3, 1, 1, device),
            conv_shortcut: (i != o).then(|| conv(i, o, 1, 0, 1, device)),
        }
    }
}

impl<B: Backend> Resnet<B> {
    /// Applies the block to `[B, C, H, W]`.
    pub(crate) fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let h = self.conv1.forward(silu(self.norm1.forward(x.clone())));
        let h = self.conv2.forward(silu(self.norm2.forward(h)));
        let x = match &self.conv_shortcut {
            Some(c) => c.forward(x),
            None => x,
        };
        x + h
    }
}

/// Single-head self-attention over the pixels of the lowest resolution, residual.
#[derive(Module, Debug)]
pub(crate) struct VaeAttention<B: Backend> {
    /// Input norm.
    pub(crate) group_norm: GroupNorm<B>,
    /// Query projection.
    pub(crate) to_q: Linear<B>,
    /// Key projection.
    pub(crate) to_k: Linear<B>,
    /// Value projection.
    pub(crate) to_v: Linear<B>,
    /// Output projection (`to_out.0`).
    pub(crate) to_out: Linear<B>,
}

impl<B: Backend> VaeAttention<B> {
    /// `x + to_out(softmax(q k^T / sqrt(C)) v)` with `q, k, v` from `group_norm(x)` as
    /// `[B, HW, C]`.
    pub(crate) fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let [b, c, h, w] = x.dims();
        let t = self.group_norm.forward(x.clone()).reshape([b, c, h * w]).swap_dims(1, 2);
        let q = self.to_q.forward(t.clone());
        let k = self.to_k.forward(t.clone());
        let v = self.to_v.forward(t);
        let out = self_attention(q, k, v, 1, Scores::default());
        x + self.to_out.forward(out).swap_dims(1, 2).reshape([b, c, h, w])
    }
}

/// Resnet, attention, resnet at the lowest resolution.
#[derive(Module, Debug)]
pub(crate) struct MidBlock<B: Backend> {
    /// The two resnets.
    pub(crate) resnets: Vec<Resnet<B>>,
    /// The one attention.
    pub(crate) attentions: Vec<VaeAttention<B>>,
}

/// Settings of a [`MidBlock`].
#[derive(Config, Debug)]
pub(crate) struct MidBlockConfig {
    /// Channels at the lowest resolution.
    channels: usize,
    /// Groups of the group norms.
    groups: usize,
}

impl MidBlockConfig {
    /// The block these settings describe.
    pub(crate) fn init<B: Backend>(&self, device: &B::Device) -> MidBlock<B> {
        let (c, groups) = (self.channels, self.groups);
        let lin = || LinearConfig::new(c, c).init(device);
        let resnet = ResnetConfig::new(c, c, groups);
        MidBlock {
            resnets: vec![resnet.init(device), resnet.init(device)],
            attentions: vec![VaeAttention {
                group_norm: GroupNormConfig::new(groups, c).with_epsilon(EPS).init(device),
                to_q: lin(),
                to_k: lin(),
                to_v: lin(),
                to_out: lin(),
            }],
        }
    }
}

impl<B: Backend> MidBlock<B> {
    /// Applies the block.
    pub(crate) fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let x = self.resnets[0].forward(x);
        let x = self.attentions[0].forward(x);
        self.resnets[1].forward(x)
    }
}

/// The 3x3 convolution of a down- or upsampler.
#[derive(Module, Debug)]
pub(crate) struct Sampler<B: Backend> {
    /// Stride-2 unpadded (down) or stride-1 padded (up) convolution.
    pub(crate) conv: Conv2d<B>,
}

/// Encoder level: resnets, then a downsampler except at the last level.
#[derive(Module, Debug)]
pub(crate) struct DownBlock<B: Backend> {
    /// Resnets.
    pub(crate) resnets: Vec<Resnet<B>>,
    /// Zero or one downsampler: pad right/bottom by 1, 3x3 conv with stride 2.
    pub(crate) downsamplers: Vec<Sampler<B>>,
}

/// Decoder level: resnets, then a nearest-neighbour x2 upsampler except at the last level.
#[derive(Module, Debug)]
pub(crate) struct UpBlock<B: Backend> {
    /// Resnets.
    pub(crate) resnets: Vec<Resnet<B>>,
    /// Zero or one upsampler: nearest x2, 3x3 conv.
    pub(crate) upsamplers: Vec<Sampler<B>>,
}

/// Image to latent moments.
#[derive(Module, Debug)]
pub(crate) struct Encoder<B: Backend> {
    /// Stem convolution.
    pub(crate) conv_in: Conv2d<B>,
    /// Levels, finest first.
    pub(crate) down_blocks: Vec<DownBlock<B>>,
    /// Lowest-resolution block.
    pub(crate) mid_block: MidBlock<B>,
    /// Output norm.
    pub(crate) conv_norm_out: GroupNorm<B>,
    /// To `2 * latent` channels (mean, log-variance).
    pub(crate) conv_out: Conv2d<B>,
}

/// Latent to image.
#[derive(Module, Debug)]
pub(crate) struct Decoder<B: Backend> {
    /// Stem convolution.
    pub(crate) conv_in: Conv2d<B>,
    /// Lowest-resolution block.
    pub(crate) mid_block: MidBlock<B>,
    /// Levels, coarsest first.
    pub(crate) up_blocks: Vec<UpBlock<B>>,
    /// Output norm.
    pub(crate) conv_norm_out: GroupNorm<B>,
    /// To image channels.
    pub(crate) conv_out: Conv2d<B>,
}

/// Nearest-neighbour x2 upsampling of `[B, C, H, W]`.
fn upsample_nearest<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    let [b, c, h, w] = x.dims();
    x.reshape([b, c, h, 1, w, 1]).expand([b, c, h, 2, w, 2]).reshape([b, c, 2 * h, 2 * w])
}

/// `AutoencoderKL` of SD3.
#[derive(Module, Debug)]
pub struct AutoencoderKL<B: Backend> {
    /// Image encoder.
    pub(crate) encoder: Encoder<B>,
    /// Latent decoder.
    pub(crate) decoder: Decoder<B>,
    scaling_factor: f64,
    shift_factor: f64,
    latent_channels: usize,
    downsample: usize,
}

/// The LDM (Stability single-file) name, without [`LDM_PREFIX`], of diffusers VAE key `key` for
/// a VAE with `levels` resolution levels: `down_blocks.i` -> `down.i`, `up_blocks.i` ->
/// `up.(levels-1-i)`, `resnets` -> `block`, `mid_block.resnets.0/1` -> `mid.block_1/2`,
/// `mid_block.attentions.0` -> `mid.attn_1` (`q, k, v, proj_out, norm`), `conv_shortcut` ->
/// `nin_shortcut`, `conv_norm_out` -> `norm_out`, samplers' `downsamplers.0` -> `downsample`.
pub(crate) fn ldm_key(key: &str, levels: usize) -> String {
    let mut parts: Vec<String> = key.split('.').map(str::to_string).collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < parts.len() {
        let p = parts[i].as_str();
        let next = parts.get(i + 1).cloned().unwrap_or_default();
        match p {
            "down_blocks" => {
                out.push(format!("down.{next}"));
                i += 1;
            }
            "up_blocks" => {
                let n: usize = next.parse().unwrap_or(0);
                out.push(format!("up.{}", levels.saturating_sub(1 + n)));
                i += 1;
            }
            "resnets" if out.last().is_some_and(|l| l == "mid_block") => {
                out.pop();
                out.push(format!("mid.block_{}", next.parse::<usize>().unwrap_or(0) + 1));
                i += 1;
            }
            "attentions" if out.last().is_some_and(|l| l == "mid_block") => {
                out.pop();
                out.push("mid.attn_1".into());
                i += 1;
            }
            "resnets" => {
                out.push(format!("block.{next}"));
                i += 1;
            }
            "downsamplers" | "upsamplers" => {
                out.push(if p == "downsamplers" { "downsample" } else { "upsample" }.into());
                i += 1;
            }
            "to_q" => out.push("q".into()),
            "to_k" => out.push("k".into()),
            "to_v" => out.push("v".into()),
            "to_out" => {
                out.push("proj_out".into());
                i += 1;
            }
            "group_norm" => out.push("norm".into()),
            "conv_shortcut" => out.push("nin_shortcut".into()),
            "conv_norm_out" => out.push("norm_out".into()),
            _ => out.push(std::mem::take(&mut parts[i])),
        }
        i += 1;
    }
    out.join(".")
}

impl<B: Backend> AutoencoderKL<B> {
    /// Loads a diffusers `vae/` folder (`config.json` + `diffusion_pytorch_model.safetensors`).
    pub fn load(dir: impl AsRef<Path>, device: &B::Device) -> crate::Result<Self> {
        load_folder(
            dir.as_ref(),
            crate::weights::DIFFUSERS_STEM,
            |config: &VaeConfig| config.init(device),
            |p| Source::key(Self::diffusers_key(p)),
            |_| true,
        )
    }

    /// Loads the VAE of a Stability single-file checkpoint (`first_stage_model.*`, LDM names);
    /// the file does not hold the configuration, so it is given (the SD3 one for real files).
    pub fn load_single_file(
        path: impl AsRef<Path>,
        config: &VaeConfig,
        device: &B::Device,
    ) -> crate::Result<Self> {
        let path = path.as_ref();
        let files = WeightFiles::open(path)?;
        let levels = config.block_out_channels.len();
        let mut vae = config.init(device)?;
        let plan = |p: &str| {
            let key = Self::diffusers_key(p);
            let ldm = format!("{LDM_PREFIX}{}", ldm_key(&key, levels));
            let attention_weight = key.contains(".attentions.") && key.ends_with(".weight");
            if attention_weight && !key.contains("group_norm") {
                Source::conv_1x1(ldm)
            } else {
                Source::key(ldm)
            }
        };
        apply_plan(&mut vae, &files, path, plan, |k| k.starts_with(LDM_PREFIX))?;
        Ok(vae)
    }

    /// Spatial factor between images and latents.
    pub fn downsample_factor(&self) -> usize {
        self.downsample
    }

    /// The diffusers key of a parameter path (`to_out` -> `to_out.0`, norms' gamma/beta).
    fn diffusers_key(path: &str) -> String {
        torch_param_name(path).replace(".to_out.", ".to_out.0.")
    }

    /// Decodes model-space latents `[B, 16, h, w]` to images in `[0, 1]`, `[B, 3, 8h, 8w]`:
    /// `x = decoder(z / scaling_factor + shift_factor)`, then `clamp(x / 2 + 1/2, 0, 1)`.
    pub fn decode(&self, latents: Tensor<B, 4>) -> crate::Result<Tensor<B, 4>> {
        let dims = latents.dims();
        if dims[1] != self.latent_channels {
            return Err(crate::Error::shape(
                "latents",
                format!("[B, {}, h, w]", self.latent_channels),
                &dims,
            ));
        }
        let z = latents / self.scaling_factor + self.shift_factor;
        Ok((self.decode_raw(z) * 0.5 + 0.5).clamp(0.0, 1.0))
    }

    /// The decoder alone on VAE-space latents, image in about `[-1, 1]` (diffusers'
    /// `vae.decode(z).sample`).
    pub fn decode_raw(&self, z: Tensor<B, 4>) -> Tensor<B, 4> {
        let d = &self.decoder;
        let mut x = d.mid_block.forward(d.conv_in.forward(z));
        for block in &d.up_blocks {
            for r in &block.resnets {
                x = r.forward(x);
            }
            for up in &block.upsamplers {
                x = up.conv.forward(upsample_nearest(x));
            }
        }
        d.conv_out.forward(silu(d.conv_norm_out.forward(x)))
    }

    /// The latent mean of images in `[-1, 1]`, `[B, 3, H, W]` -> VAE-space `[B, 16, H/8, W/8]`
    /// (diffusers' `vae.encode(x).latent_dist.mean`); model space is
    /// `(mean - shift_factor) * scaling_factor`.
    pub fn encode_mean(&self, images: Tensor<B, 4>) -> Tensor<B, 4> {
        let e = &self.encoder;
        let mut x = e.conv_in.forward(images);
        for block in &e.down_blocks {
            for r in &block.resnets {
                x = r.forward(x);
            }
            for down in &block.downsamplers {
                let [b, c, h, w] = x.dims();
                let padded = Tensor::zeros([b, c, h + 1, w + 1], &x.device())
                    .slice_assign([0..b, 0..c, 0..h, 0..w], x);
                x = down.conv.forward(padded);
            }
        }
        let x = e.conv_out.forward(silu(e.conv_norm_out.forward(e.mid_block.forward(x))));
        x.narrow(1, 0, self.latent_channels)
    }
}

#[cfg(test)]
mod tests {
    use super::ldm_key;

    #[test]
    fn ldm_names() {
        let cases = [
            ("decoder.up_blocks.0.resnets.2.conv1.weight", "decoder.up.3.block.2.conv1.weight"),
            ("decoder.up_blocks.3.upsamplers.0.conv.bias", "decoder.up.0.upsample.conv.bias"),
            (
                "encoder.down_blocks.1.downsamplers.0.conv.weight",
                "encoder.down.1.downsample.conv.weight",
            ),
            (
                "encoder.down_blocks.1.resnets.0.conv_shortcut.weight",
                "encoder.down.1.block.0.nin_shortcut.weight",
            ),
            ("encoder.mid_block.resnets.1.norm2.bias", "encoder.mid.block_2.norm2.bias"),
            (
                "decoder.mid_block.attentions.0.to_out.0.weight",
                "decoder.mid.attn_1.proj_out.weight",
            ),
            ("decoder.mid_block.attentions.0.group_norm.weight", "decoder.mid.attn_1.norm.weight"),
            ("decoder.mid_block.attentions.0.to_q.bias", "decoder.mid.attn_1.q.bias"),
            ("decoder.conv_norm_out.weight", "decoder.norm_out.weight"),
            ("encoder.conv_in.weight", "encoder.conv_in.weight"),
        ];
        for (diffusers, ldm) in cases {
            assert_eq!(ldm_key(diffusers, 4), ldm, "{diffusers}");
        }
    }
}
