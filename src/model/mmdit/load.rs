//! Loading and saving MMDiT weights: diffusers `transformer/` folders (one or sharded
//! safetensors files) and Stability single-file checkpoints (`model.diffusion_model.*`).
//!
//! Module paths differ from diffusers keys in four places only ([`diffusers_key`]); the
//! Stability layout differs by renames, fused `qkv` tensors and swapped AdaLN-continuous halves
//! ([`stability_key`]).

use crate::model::Adaptable;
use std::path::Path;

use burn::prelude::*;

use super::{MMDiT, MMDiTConfig};
use crate::error::{Error, Result};
use crate::weights::{apply_plan, open_checkpoint_file, save_diffusers_folder, transformer_dir};
use crate::weights::{Source, WeightFiles, DIFFUSERS_STEM};

/// Key prefix of the transformer in Stability single-file checkpoints.
pub(crate) const STABILITY_PREFIX: &str = "model.diffusion_model.";

/// The diffusers checkpoint key of a module parameter path:
/// `to_out` -> `to_out.0`, `ff.proj_in` -> `ff.net.0.proj`, `ff.proj_out` -> `ff.net.2`,
/// RMSNorm `gamma` -> `weight`.
pub(crate) fn diffusers_key(path: &str) -> String {
    let segments: Vec<&str> = path.split('.').collect();
    let mut out: Vec<&str> = Vec::with_capacity(segments.len() + 2);
    for (i, s) in segments.iter().enumerate() {
        let parent = i.checked_sub(1).map(|j| segments[j]);
        match (*s, parent) {
            ("to_out", _) => out.extend(["to_out", "0"]),
            ("proj_in", Some("ff" | "ff_context")) => out.extend(["net", "0", "proj"]),
            ("proj_out", Some("ff" | "ff_context")) => out.extend(["net", "2"]),
            ("gamma", _) => out.push("weight"),
            _ => out.push(s),
        }
    }
    out.join(".")
}

/// Which part of a Stability tensor a diffusers tensor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    /// The whole tensor.
    Whole,
    /// Third `0`, `1` or `2` (q, k, v) of a fused `qkv` tensor, along the first dimension.
    Third(usize),
    /// The whole tensor with the two halves of its first dimension swapped (shift/scale order).
    Swapped,
}

/// The Stability single-file key (without [`STABILITY_PREFIX`]) and part holding the diffusers
/// tensor `key`, for a model whose last block is `last`; `None` for keys with no counterpart.
pub(crate) fn stability_key(key: &str, last: usize) -> Option<(String, Part)> {
    let whole = |k: String| Some((k, Part::Whole));
    let (module, param) = key.rsplit_once('.')?;
    let simple = match module {
        "pos_embed" if param == "pos_embed" => return whole("pos_embed".into()),
        "pos_embed.proj" => "x_embedder.proj",
        "time_text_embed.timestep_embedder.linear_1" => "t_embedder.mlp.0",
        "time_text_embed.timestep_embedder.linear_2" => "t_embedder.mlp.2",
        "time_text_embed.text_embedder.linear_1" => "y_embedder.mlp.0",
        "time_text_embed.text_embedder.linear_2" => "y_embedder.mlp.2",
        "context_embedder" => "context_embedder",
        "proj_out" => "final_layer.linear",
        "norm_out.linear" => {
            return Some((format!("final_layer.adaLN_modulation.1.{param}"), Part::Swapped))
        }
        _ => "",
    };
    if !simple.is_empty() {
        return whole(format!("{simple}.{param}"));
    }
    let rest = module.strip_prefix("transformer_blocks.")?;
    let (index, sub) = rest.split_once('.')?;
    let i: usize = index.parse().ok()?;
    let block = format!("joint_blocks.{i}");
    let (target, part) = match sub {
        "norm1.linear" => ("x_block.adaLN_modulation.1", Part::Whole),
        "norm1_context.linear" if i == last => ("context_block.adaLN_modulation.1", Part::Swapped),
        "norm1_context.linear" => ("context_block.adaLN_modulation.1", Part::Whole),
        "attn.to_q" => ("x_block.attn.qkv", Part::Third(0)),
        "attn.to_k" => ("x_block.attn.qkv", Part::Third(1)),
        "attn.to_v" => ("x_block.attn.qkv", Part::Third(2)),
        "attn.add_q_proj" => ("context_block.attn.qkv", Part::Third(0)),
        "attn.add_k_proj" => ("context_block.attn.qkv", Part::Third(1)),
        "attn.add_v_proj" => ("context_block.attn.qkv", Part::Third(2)),
        "attn.to_out.0" => ("x_block.attn.proj", Part::Whole),
        "attn.to_add_out" => ("context_block.attn.proj", Part::Whole),
        "attn.norm_q" => ("x_block.attn.ln_q", Part::Whole),
        "attn.norm_k" => ("x_block.attn.ln_k", Part::Whole),
        "attn.norm_added_q" => ("context_block.attn.ln_q", Part::Whole),
        "attn.norm_added_k" => ("context_block.attn.ln_k", Part::Whole),
        "attn2.to_q" => ("x_block.attn2.qkv", Part::Third(0)),
        "attn2.to_k" => ("x_block.attn2.qkv", Part::Third(1)),
        "attn2.to_v" => ("x_block.attn2.qkv", Part::Third(2)),
        "attn2.to_out.0" => ("x_block.attn2.proj", Part::Whole),
        "attn2.norm_q" => ("x_block.attn2.ln_q", Part::Whole),
        "attn2.norm_k" => ("x_block.attn2.ln_k", Part::Whole),
        "ff.net.0.proj" => ("x_block.mlp.fc1", Part::Whole),
        "ff.net.2" => ("x_block.mlp.fc2", Part::Whole),
        "ff_context.net.0.proj" => ("context_block.mlp.fc1", Part::Whole),
        "ff_context.net.2" => ("context_block.mlp.fc2", Part::Whole),
        _ => return None,
    };
    Some((format!("{block}.{target}.{param}"), part))
}

/// How diffusers keys are found in a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Keys as diffusers names them.
    Diffusers,
    /// Stability single file: [`STABILITY_PREFIX`] + [`stability_key`].
    Stability,
}

impl Layout {
    /// The checkpoint key and part holding diffusers key `key`.
    fn locate(self, key: &str, last: usize) -> (String, Part) {
        match self {
            Layout::Diffusers => (key.to_string(), Part::Whole),
            Layout::Stability => match stability_key(key, last) {
                Some((k, part)) => (format!("{STABILITY_PREFIX}{k}"), part),
                None => (format!("{STABILITY_PREFIX}<no counterpart of {key}>"), Part::Whole),
            },
        }
    }

    /// Whether checkpoint key `key` belongs to the transformer.
    fn owns(self, key: &str) -> bool {
        match self {
            Layout::Diffusers => true,
            Layout::Stability => key.starts_with(STABILITY_PREFIX),
        }
    }
}

/// Infers the configuration from tensor shapes and key presence: `D` and the patch from
/// `pos_embed.proj`, depth from the block count, `M` from the position table, qk-norm from
/// `norm_q`, dual attention from `attn2`, the head size from `norm_q` (64 without qk-norm, as
/// in every released SD3 model).
fn infer_config(files: &WeightFiles, layout: Layout, label: &Path) -> Result<MMDiTConfig> {
    let missing = |key: &str| Error::Checkpoint {
        path: label.to_path_buf(),
        problems: vec![format!("cannot infer the model: missing key `{key}`")],
    };
    let shape = |key: &str| -> Result<Vec<usize>> {
        let (k, _) = layout.locate(key, usize::MAX);
        files.info(&k).map(|i| i.shape.clone()).ok_or_else(|| missing(&k))
    };
    let has = |key: &str| files.info(&layout.locate(key, usize::MAX).0).is_some();

    let proj = shape("pos_embed.proj.weight")?;
    if proj.len() != 4 || proj[2] != proj[3] {
        return Err(Error::Checkpoint {
            path: label.to_path_buf(),
            problems: vec![format!(
                "patch embedding weight has shape {proj:?}, expected [D, C, p, p]"
            )],
        });
    }
    let (dim, in_channels, patch) = (proj[0], proj[1], proj[2]);
    let num_layers =
        (0..).take_while(|i| has(&format!("transformer_blocks.{i}.norm1.linear.weight"))).count();
    let qk = has("transformer_blocks.0.attn.norm_q.weight");
    let head_dim = if qk { shape("transformer_blocks.0.attn.norm_q.weight")?[0] } else { 64 };
    let positions = shape("pos_embed.pos_embed")?;
    let rows = positions.get(1).copied().unwrap_or(0);
    let m = (rows as f64).sqrt().round() as usize;
    if m * m != rows {
        return Err(Error::Checkpoint {
            path: label.to_path_buf(),
            problems: vec![format!(
                "position table has shape {positions:?}; {rows} rows is not a square grid"
            )],
        });
    }
    let config = MMDiTConfig {
        sample_size: 128,
        patch_size: patch,
        in_channels,
        num_layers,
        attention_head_dim: head_dim,
        num_attention_heads: dim / head_dim,
        joint_attention_dim: shape("context_embedder.weight")?[1],
        caption_projection_dim: dim,
        pooled_projection_dim: shape("time_text_embed.text_embedder.linear_1.weight")?[1],
        out_channels: shape("proj_out.weight")?[0] / (patch * patch),
        pos_embed_max_size: m,
        dual_attention_layers: (0..num_layers)
            .filter(|i| has(&format!("transformer_blocks.{i}.attn2.to_q.weight")))
            .collect(),
        qk_norm: qk.then(|| "rms_norm".to_string()),
    };
    config.validate().map_err(|e| Error::Checkpoint {
        path: label.to_path_buf(),
        problems: vec![format!("inferred configuration is invalid: {e}")],
    })?;
    Ok(config)
}

impl<B: Backend> MMDiT<B> {
    /// Loads a model from any of:
    /// - a diffusers pipeline folder (uses its `transformer/`) or `transformer/` folder:
    ///   `config.json` plus `diffusion_pytorch_model.safetensors` or sharded files with
    ///   `diffusion_pytorch_model.safetensors.index.json`;
    /// - a `*.safetensors.index.json` or a single `.safetensors` file, in diffusers or Stability
    ///   (`model.diffusion_model.*`) layout, the configuration inferred from the keys.
    ///
    /// F32, F16 and BF16 tensors are converted to the backend's float type one at a time.
    pub fn load(path: impl AsRef<Path>, device: &B::Device) -> Result<Self> {
        let path = path.as_ref();
        if path.is_dir() {
            return Self::load_diffusers_dir(&transformer_dir(path), device);
        }
        let files = open_checkpoint_file(path)?;
        let layout = if files.keys().any(|k| k.starts_with(STABILITY_PREFIX)) {
            Layout::Stability
        } else {
            Layout::Diffusers
        };
        let config = infer_config(&files, layout, path)?;
        Self::from_files(&config, &files, layout, path, device)
    }

    /// Loads a diffusers `transformer/` folder: `config.json` and its safetensors weights.
    pub fn load_diffusers_dir(dir: &Path, device: &B::Device) -> Result<Self> {
        let config = MMDiTConfig::load_json(dir.join("config.json"))?;
        let files = WeightFiles::open_dir(dir, DIFFUSERS_STEM)?;
        Self::from_files(&config, &files, Layout::Diffusers, dir, device)
    }

    fn from_files(
        config: &MMDiTConfig,
        files: &WeightFiles,
        layout: Layout,
        label: &Path,
        device: &B::Device,
    ) -> Result<Self> {
        let mut model = config.init::<B>(device)?;
        let last = config.num_layers - 1;
        let dim = config.hidden_size();
        let plan = |path: &str| {
            let (key, part) = layout.locate(&diffusers_key(path), last);
            match part {
                Part::Whole => Source::key(key),
                Part::Third(j) => Source::rows(key, j * dim..(j + 1) * dim),
                Part::Swapped => Source::swapped(key),
            }
        };
        apply_plan(&mut model, files, label, plan, |k| layout.owns(k))?;
        Ok(model)
    }

    /// Saves the model as a diffusers `transformer/` folder (`config.json` and an f32
    /// `diffusion_pytorch_model.safetensors`), each file written atomically. A model with LoRA
    /// adapters must be merged ([`Adaptable::merge_lora`](crate::model::Adaptable::merge_lora)) or exported ([`Adaptable::save_peft`](crate::model::Adaptable::save_peft)) first.
    pub fn save_diffusers(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        if self.has_lora() {
            return Err(Error::config(
                "lora",
                "the model carries LoRA adapters: merge_lora() before save_diffusers, \
                 or save_peft for the adapters alone",
            ));
        }
        save_diffusers_folder(self, dir, diffusers_key, &self.config.to_diffusers_json())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::backend::Backend as B;
    use crate::weights::apply::param_slots;

    fn models_dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("models")
    }

    /// The released configurations' parameters have exactly diffusers' keys and shapes
    /// (`tests/fixtures/mmdit_presets.json`, from diffusers' state dicts).
    #[test]
    fn presets_have_exactly_diffusers_keys_and_shapes() {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mmdit_presets.json"),
        )
        .unwrap();
        let presets: serde_json::Value = serde_json::from_str(&text).unwrap();
        for name in ["sd3-medium", "sd3.5-medium", "sd3.5-large"] {
            let config = MMDiTConfig::load_json(models_dir().join(format!("{name}.json"))).unwrap();
            // Lazily initialised: nothing is allocated for these multi-billion-parameter models.
            let model = config.init::<B>(&Default::default()).unwrap();
            let ours: BTreeMap<String, Vec<usize>> = param_slots::<B, _>(&model)
                .into_iter()
                .map(|s| (diffusers_key(&s.path), s.torch_shape()))
                .collect();
            let theirs: BTreeMap<String, Vec<usize>> =
                serde_json::from_value(presets[name]["shapes"].clone()).unwrap();
            let only_ours: Vec<_> = ours.keys().filter(|k| !theirs.contains_key(*k)).collect();
            let only_theirs: Vec<_> = theirs.keys().filter(|k| !ours.contains_key(*k)).collect();
            assert!(
                only_ours.is_empty() && only_theirs.is_empty(),
                "{name}: only ours {only_ours:?}, only diffusers {only_theirs:?}"
            );
            for (k, shape) in &theirs {
                assert_eq!(&ours[k], shape, "{name}: shape of {k}");
            }
            let count: usize = ours.values().map(|s| s.iter().product::<usize>()).sum();
            assert_eq!(
                count as u64,
                presets[name]["num_params"].as_u64().unwrap(),
                "{name}: parameter count"
            );
        }
    }
}
