//! `MMDiTConfig`: the hyper-parameters of an SD3 / SD3.5 transformer, named as diffusers'
//! `SD3Transformer2DModel` config.json names them.

use std::path::Path;

use burn::prelude::*;

use crate::error::Error;

/// Hyper-parameters of an MMDiT, field for field those of diffusers' `config.json`.
#[derive(Config, Debug, PartialEq)]
pub struct MMDiTConfig {
    /// Nominal latent size the model was trained at (kept for round-trips; the forward pass
    /// accepts any size up to the position table).
    #[config(default = 128)]
    pub sample_size: usize,
    /// Side of the square patches (2 in every released model).
    #[config(default = 2)]
    pub patch_size: usize,
    /// Latent channels in.
    #[config(default = 16)]
    pub in_channels: usize,
    /// Number of joint transformer blocks (`depth`).
    #[config(default = 24)]
    pub num_layers: usize,
    /// Features per attention head.
    #[config(default = 64)]
    pub attention_head_dim: usize,
    /// Attention heads; the hidden size is `num_attention_heads * attention_head_dim`.
    #[config(default = 24)]
    pub num_attention_heads: usize,
    /// Width of the text features fed to `context_embedder` (4096 for CLIP-L/G + T5).
    #[config(default = 4096)]
    pub joint_attention_dim: usize,
    /// Output width of `context_embedder`; must equal the hidden size.
    #[config(default = 1536)]
    pub caption_projection_dim: usize,
    /// Width of the pooled text vector (2048 for CLIP-L + CLIP-G).
    #[config(default = 2048)]
    pub pooled_projection_dim: usize,
    /// Latent channels out.
    #[config(default = 16)]
    pub out_channels: usize,
    /// Side `M` of the stored position table (`M*M` patch positions).
    #[config(default = 192)]
    pub pos_embed_max_size: usize,
    /// Blocks with a second, image-only self-attention (SD3.5-medium's MMDiT-X: 0..=12).
    #[config(default = "Vec::new()")]
    pub dual_attention_layers: Vec<usize>,
    /// `"rms_norm"` to normalise queries and keys per head (SD3.5), or none (SD3).
    pub qk_norm: Option<String>,
}

/// Keys diffusers may write into a transformer `config.json` that carry no model maths.
const IGNORED_KEYS: &[&str] = &["_class_name", "_diffusers_version", "_name_or_path"];

impl MMDiTConfig {
    /// Stable Diffusion 3 medium's transformer (24 blocks, D = 1536, no qk-norm), as
    /// `models/sd3-medium.json` and the released `config.json` give it.
    pub fn sd3_medium() -> Self {
        MMDiTConfig::new().with_qk_norm(None)
    }

    /// Stable Diffusion 3.5 medium's transformer: SD3 medium with MMDiT-X (dual attention in
    /// blocks 0-12), per-head RMS qk-norm and a 384-wide position table.
    pub fn sd3_5_medium() -> Self {
        MMDiTConfig::new()
            .with_pos_embed_max_size(384)
            .with_dual_attention_layers((0..=12).collect())
            .with_qk_norm(Some("rms_norm".into()))
    }

    /// Stable Diffusion 3.5 large's transformer (38 blocks of 38 heads, D = 2432, qk-norm).
    pub fn sd3_5_large() -> Self {
        MMDiTConfig::new()
            .with_num_layers(38)
            .with_num_attention_heads(38)
            .with_caption_projection_dim(2432)
            .with_qk_norm(Some("rms_norm".into()))
    }

    /// The hidden size `D = heads * head_dim`.
    pub fn hidden_size(&self) -> usize {
        self.num_attention_heads * self.attention_head_dim
    }

    /// Whether queries and keys are RMS-normalised per head.
    pub fn has_qk_norm(&self) -> bool {
        self.qk_norm.is_some()
    }

    /// Checks every field, naming the first invalid one.
    pub fn validate(&self) -> crate::Result<()> {
        crate::limits::check_positive(&[
            ("patch_size", self.patch_size),
            ("in_channels", self.in_channels),
            ("num_layers", self.num_layers),
            ("attention_head_dim", self.attention_head_dim),
            ("num_attention_heads", self.num_attention_heads),
            ("joint_attention_dim", self.joint_attention_dim),
            ("pooled_projection_dim", self.pooled_projection_dim),
            ("out_channels", self.out_channels),
            ("pos_embed_max_size", self.pos_embed_max_size),
        ])?;
        // Sizes are products of user-given numbers: bound them in f64 (no overflow) before
        // anything is built or allocated.
        let (d, m) = (
            self.attention_head_dim as f64 * self.num_attention_heads as f64,
            self.pos_embed_max_size as f64,
        );
        let params = self.num_layers as f64 * 40.0 * d * d
            + m * m * d
            + (self.joint_attention_dim + self.pooled_projection_dim) as f64 * d;
        crate::limits::check_params(
            "num_layers/num_attention_heads/attention_head_dim/pos_embed_max_size",
            params,
        )?;
        if self.caption_projection_dim != self.hidden_size() {
            return Err(Error::config(
                "caption_projection_dim",
                format!(
                    "is {} but must equal num_attention_heads * attention_head_dim = {}",
                    self.caption_projection_dim,
                    self.hidden_size()
                ),
            ));
        }
        if let Some(&l) = self.dual_attention_layers.iter().find(|&&l| l >= self.num_layers) {
            return Err(Error::config(
                "dual_attention_layers",
                format!("block {l} does not exist (num_layers = {})", self.num_layers),
            ));
        }
        match self.qk_norm.as_deref() {
            None | Some("rms_norm") => Ok(()),
            Some(other) => Err(Error::config(
                "qk_norm",
                format!("`{other}` is not supported (expected \"rms_norm\" or null)"),
            )),
        }
    }

    /// Reads a diffusers `config.json` (or one of the `models/*.json` presets) and validates it.
    ///
    /// `dual_attention_layers` and `qk_norm` may be absent (SD3-medium's config predates them);
    /// any other missing field, and any unknown field, is an error naming it.
    pub fn load_json(path: impl AsRef<Path>) -> crate::Result<Self> {
        crate::weights::parse_config_file(path.as_ref(), Self::from_json_str)
    }

    /// Parses a diffusers-style JSON configuration (see [`MMDiTConfig::load_json`]).
    pub fn from_json_str(text: &str) -> crate::Result<Self> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| Error::format("<config>", format!("invalid JSON: {e}")))?;
        let object = value.as_object_mut().ok_or_else(|| {
            Error::format("<config>", "a transformer config must be a JSON object")
        })?;
        for key in IGNORED_KEYS {
            object.remove(*key);
        }
        object.entry("dual_attention_layers").or_insert(serde_json::json!([]));
        object.entry("qk_norm").or_insert(serde_json::Value::Null);
        let known = [
            "sample_size",
            "patch_size",
            "in_channels",
            "num_layers",
            "attention_head_dim",
            "num_attention_heads",
            "joint_attention_dim",
            "caption_projection_dim",
            "pooled_projection_dim",
            "out_channels",
            "pos_embed_max_size",
            "dual_attention_layers",
            "qk_norm",
        ];
        if let Some(unknown) = object.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(Error::config(
                unknown.clone(),
                "unknown SD3Transformer2DModel config field (it may change the model's maths)",
            ));
        }
        if let Some(missing) = known.iter().find(|k| !object.contains_key(**k)) {
            return Err(Error::config(*missing, "missing from the config"));
        }
        let config: MMDiTConfig = serde_json::from_value(value)
            .map_err(|e| Error::format("<config>", format!("invalid transformer config: {e}")))?;
        config.validate()?;
        Ok(config)
    }

    /// Writes the configuration as a diffusers `config.json` (with `_class_name`).
    pub fn to_diffusers_json(&self) -> String {
        let mut value = serde_json::to_value(self).expect("config serialises");
        value["_class_name"] = serde_json::json!("SD3Transformer2DModel");
        serde_json::to_string_pretty(&value).expect("config serialises")
    }
}
