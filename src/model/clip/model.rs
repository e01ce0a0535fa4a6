//! A whole `CLIPModel` folder: both towers, their projections and `logit_scale`, with the
//! folder's tokenizer and image processor.

use std::path::{Path, PathBuf};

use burn::prelude::*;
use serde_json::{json, Value};

use super::processor::{preprocessor_path, ClipImageProcessor};
use super::text::{ClipTextConfig, ClipTextModel};
use super::vision::{ClipVisionConfig, ClipVisionModel};
use crate::error::{Error, Result};
use crate::tokenizer::TextTokenizer;
use crate::weights::{apply_plan, read_config, torch_param_name, Source, WeightFiles};

/// CLIP's text length.
const CLIP_TEXT_LENGTH: usize = 77;

/// The two towers of a `CLIPModel` (`text_model.*` + `text_projection`, `vision_model.*` +
/// `visual_projection`).
#[derive(Module, Debug)]
pub struct ClipTowers<B: Backend> {
    /// Text tower.
    pub text: ClipTextModel<B>,
    /// Image tower.
    pub vision: ClipVisionModel<B>,
}

/// transformers' `CLIPModel` with what scoring needs beside the weights.
#[derive(Debug)]
pub struct ClipModel<B: Backend> {
    /// Both towers.
    pub towers: ClipTowers<B>,
    /// `log` of the similarity temperature (`logit_scale`, stored as a log).
    pub logit_scale: f64,
    /// The folder's tokenizer, padded to 77 tokens.
    pub tokenizer: TextTokenizer,
    /// The folder's `preprocessor_config.json`.
    pub processor: ClipImageProcessor,
    /// Where it was loaded from.
    pub folder: PathBuf,
}

/// `defaults`, then each object of `layers` on top, then `projection_dim`: a tower's config as
/// transformers assembles it (`text_config_dict` / `vision_config_dict` after
/// `text_config` / `vision_config`; `projection_dim` from the top level).
fn tower_config(defaults: Value, layers: [&Value; 2], projection_dim: &Value) -> Value {
    let mut out = defaults;
    for layer in layers {
        if let (Value::Object(out), Value::Object(layer)) = (&mut out, layer) {
            out.extend(layer.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
    }
    out["projection_dim"] = projection_dim.clone();
    out
}

impl<B: Backend> ClipModel<B> {
    /// Loads a transformers `CLIPModel` folder: `config.json`, `model.safetensors` (or
    /// shards), `preprocessor_config.json`, and the tokenizer (`tokenizer.json`, or
    /// `vocab.json` + `merges.txt`). Tower fields absent from `config.json` take transformers'
    /// defaults.
    pub fn load(dir: impl AsRef<Path>, device: &B::Device) -> Result<Self> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            return Err(Error::format(dir, "no such folder (expected a transformers CLIPModel)"));
        }
        let config_path = dir.join("config.json");
        let config: Value = read_config(&config_path)?;
        let bad =
            |e: serde_json::Error| Error::format(&config_path, format!("invalid config: {e}"));
        let projection_dim = match &config["projection_dim"] {
            Value::Null => json!(512),
            v => v.clone(),
        };
        let text_defaults = json!({
            "vocab_size": 49408, "hidden_size": 512, "intermediate_size": 2048,
            "num_hidden_layers": 12, "num_attention_heads": 8, "max_position_embeddings": 77,
            "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5, "eos_token_id": 49407,
        });
        let text = tower_config(
            text_defaults,
            [&config["text_config"], &config["text_config_dict"]],
            &projection_dim,
        );
        // Burn applies `#[config(default)]` in `new()`, not when deserialising.
        let vision_defaults = serde_json::to_value(ClipVisionConfig::new()).map_err(bad)?;
        let vision = tower_config(
            vision_defaults,
            [&config["vision_config"], &config["vision_config_dict"]],
            &projection_dim,
        );
        let text: ClipTextConfig = serde_json::from_value(text).map_err(bad)?;
        let vision: ClipVisionConfig = serde_json::from_value(vision).map_err(bad)?;
        let in_config = |e: Error| Error::format(&config_path, e.to_string());
        let mut towers = ClipTowers {
            text: text.init(device).map_err(in_config)?,
            vision: vision.init(device).map_err(in_config)?,
        };
        let files = WeightFiles::open_dir(dir, "model")?;
        let plan = |path: &str| {
            let key = path.split_once('.').map_or(path, |(_, rest)| rest);
            Source::key(torch_param_name(key))
        };
        let owns = |key: &str| !key.ends_with("position_ids") && key != "logit_scale";
        apply_plan(&mut towers, &files, dir, plan, owns)?;
        let logit_scale = match files.read_f32("logit_scale")?.as_slice() {
            [v] if v.is_finite() => *v as f64,
            other => {
                return Err(Error::format(
                    dir,
                    format!("`logit_scale` must be one finite number, found {other:?}"),
                ))
            }
        };
        Ok(ClipModel {
            towers,
            logit_scale,
            tokenizer: TextTokenizer::open(dir, CLIP_TEXT_LENGTH)?,
            processor: ClipImageProcessor::load(preprocessor_path(dir))?,
            folder: dir.to_path_buf(),
        })
    }

    /// L2-normalised image embeddings `[B, projection_dim]` of images in `[0, 1]`,
    /// preprocessed by the folder's processor.
    pub fn image_features(
        &self,
        images: &[crate::image::Image],
        device: &B::Device,
    ) -> Result<Tensor<B, 2>> {
        let size = self.towers.vision.image_size();
        let first = images.first().ok_or_else(|| Error::shape("images", "[B >= 1]", &[0]))?;
        if self.processor.output_size(first.height, first.width) != (size, size) {
            return Err(Error::format(
                preprocessor_path(&self.folder),
                format!("does not produce the {size}x{size} images the vision tower reads"),
            ));
        }
        let pixels = self.processor.process(images, device)?;
        Ok(l2_normalize(self.towers.vision.forward(pixels)?))
    }

    /// L2-normalised text embeddings `[B, projection_dim]` (tokenised to 77, truncated).
    pub fn text_features(&self, texts: &[&str], device: &B::Device) -> Result<Tensor<B, 2>> {
        let ids = self.tokenizer.encode(texts)?;
        Ok(l2_normalize(self.towers.text.forward(&ids, device)?.pooled))
    }
}

/// `x / ||x||` along the last dimension.
pub(crate) fn l2_normalize<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 2> {
    let norm = x.clone().powi_scalar(2).sum_dim(1).sqrt();
    x / norm
}
