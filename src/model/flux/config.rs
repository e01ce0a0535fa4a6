//! `FluxConfig`: the hyper-parameters of a FLUX.1 transformer, named as diffusers'
//! `FluxTransformer2DModel` config.json names them.

use std::path::Path;

use burn::prelude::*;

use crate::error::Error;

/// Hyper-parameters of a FLUX transformer, field for field those of diffusers' `config.json`;
/// the defaults are diffusers' (FLUX.1-dev's sizes, without guidance embedding).
#[derive(Config, Debug, PartialEq)]
pub struct FluxConfig {
    /// Side of the patches the pipeline packs (1: the pipeline packs 2x2 latent pixels itself).
    #[config(default = 1)]
    pub patch_size: usize,
    /// Channels of a packed latent token (64 = 16 latent channels x 2 x 2).
    #[config(default = 64)]
    pub in_channels: usize,
    /// Channels out; `None`: `in_channels`.
    pub out_channels: Option<usize>,
    /// Double-stream blocks.
    #[config(default = 19)]
    pub num_layers: usize,
    /// Single-stream blocks.
    #[config(default = 38)]
    pub num_single_layers: usize,
    /// Features per attention head.
    #[config(default = 128)]
    pub attention_head_dim: usize,
    /// Attention heads; the hidden size is `num_attention_heads * attention_head_dim`.
    #[config(default = 24)]
    pub num_attention_heads: usize,
    /// Width of the T5 features fed to `context_embedder`.
    #[config(default = 4096)]
    pub joint_attention_dim: usize,
    /// Width of the pooled CLIP vector.
    #[config(default = 768)]
    pub pooled_projection_dim: usize,
    /// Whether the guidance scale is embedded (FLUX.1-dev: true; schnell: false).
    #[config(default = false)]
    pub guidance_embeds: bool,
    /// Channels of each head rotated with position axis 0, 1, 2 (they sum to the head width).
    #[config(default = "[16, 56, 56]")]
    pub axes_dims_rope: [usize; 3],
}

/// Keys diffusers writes into a transformer `config.json` that carry no model maths.
const IGNORED_KEYS: &[&str] = &["_class_name", "_diffusers_version", "_name_or_path"];

/// The RoPE base of every FLUX model (diffusers hard-codes it).
pub(crate) const ROPE_THETA: f64 = 10000.0;

impl FluxConfig {
    /// FLUX.1-dev's transformer (19 + 38 blocks, D = 3072, guidance embedded).
    pub fn flux1_dev() -> Self {
        FluxConfig::new().with_guidance_embeds(true)
    }

    /// The hidden size `D = heads * head_dim`.
    pub fn hidden_size(&self) -> usize {
        self.num_attention_heads * self.attention_head_dim
    }

    /// Channels out per token (`out_channels`, or `in_channels` when unset).
    pub fn output_channels(&self) -> usize {
        self.out_channels.unwrap_or(self.in_channels)
    }

    /// Checks every field, naming the first invalid one.
    pub fn validate(&self) -> crate::Result<()> {
        crate::limits::check_positive(&[
            ("patch_size", self.patch_size),
            ("in_channels", self.in_channels),
            ("output_channels", self.output_channels()),
            ("attention_head_dim", self.attention_head_dim),
            ("num_attention_heads", self.num_attention_heads),
            ("joint_attention_dim", self.joint_attention_dim),
            ("pooled_projection_dim", self.pooled_projection_dim),
        ])?;
        let d = self.attention_head_dim as f64 * self.num_attention_heads as f64;
        let params = self.num_layers as f64 * 24.0 * d * d
            + self.num_single_layers as f64 * 12.0 * d * d
            + (self.joint_attention_dim + self.pooled_projection_dim + self.in_channels) as f64 * d;
        crate::limits::check_params(
            "num_layers/num_single_layers/num_attention_heads/attention_head_dim",
            params,
        )?;
        let rotated: usize = self.axes_dims_rope.iter().sum();
        if rotated != self.attention_head_dim || self.axes_dims_rope.iter().any(|d| d % 2 != 0) {
            return Err(Error::config(
                "axes_dims_rope",
                format!(
                    "{:?} must be even and sum to attention_head_dim = {}",
                    self.axes_dims_rope, self.attention_head_dim
                ),
            ));
        }
        Ok(())
    }

    /// Reads a diffusers `config.json` and validates it. Missing fields take diffusers'
    /// defaults (the released FLUX.1 configs omit `axes_dims_rope` and `out_channels`); an
    /// unknown field is an error naming it.
    pub fn load_json(path: impl AsRef<Path>) -> crate::Result<Self> {
        crate::weights::parse_config_file(path.as_ref(), Self::from_json_str)
    }

    /// Parses a diffusers-style JSON configuration (see [`FluxConfig::load_json`]).
    pub fn from_json_str(text: &str) -> crate::Result<Self> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| Error::format("<config>", format!("invalid JSON: {e}")))?;
        let object = value.as_object().ok_or_else(|| {
            Error::format("<config>", "a transformer config must be a JSON object")
        })?;
        let mut merged = serde_json::to_value(FluxConfig::new()).expect("config serialises");
        let known = merged.as_object_mut().expect("a struct serialises to an object");
        for (key, v) in object {
            if IGNORED_KEYS.contains(&key.as_str()) {
                continue;
            }
            match known.get_mut(key) {
                Some(slot) => *slot = v.clone(),
                None => {
                    return Err(Error::config(
                        key.clone(),
                        "unknown FluxTransformer2DModel config field (it may change the model's \
                         maths)",
                    ))
                }
            }
        }
        let config: FluxConfig = serde_json::from_value(merged)
            .map_err(|e| Error::format("<config>", format!("invalid transformer config: {e}")))?;
        config.validate()?;
        Ok(config)
    }

    /// Writes the configuration as a diffusers `config.json` (with `_class_name`).
    pub fn to_diffusers_json(&self) -> String {
        let mut value = serde_json::to_value(self).expect("config serialises");
        value["_class_name"] = serde_json::json!("FluxTransformer2DModel");
        serde_json::to_string_pretty(&value).expect("config serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_config_reads_with_diffusers_defaults() {
        // FLUX.1-dev's transformer/config.json as released (no axes_dims_rope, no out_channels).
        let text = r#"{"_class_name": "FluxTransformer2DModel", "_diffusers_version": "0.30.0.dev0",
            "attention_head_dim": 128, "guidance_embeds": true, "in_channels": 64,
            "joint_attention_dim": 4096, "num_attention_heads": 24, "num_layers": 19,
            "num_single_layers": 38, "patch_size": 1, "pooled_projection_dim": 768}"#;
        assert_eq!(FluxConfig::from_json_str(text).unwrap(), FluxConfig::flux1_dev());
        let err = FluxConfig::from_json_str(r#"{"num_layrs": 3}"#).unwrap_err().to_string();
        assert!(err.contains("num_layrs"), "{err}");
        let err = FluxConfig::from_json_str(r#"{"axes_dims_rope": [16, 56, 58]}"#).unwrap_err();
        assert!(err.to_string().contains("axes_dims_rope"), "{err}");
        let round = FluxConfig::from_json_str(&FluxConfig::flux1_dev().to_diffusers_json());
        assert_eq!(round.unwrap(), FluxConfig::flux1_dev());
    }
}
