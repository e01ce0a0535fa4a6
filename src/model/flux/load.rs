//! Loading and saving FLUX weights: diffusers `transformer/` folders (one or sharded safetensors
//! files) and Black Forest Labs single files (`flux1-dev.safetensors`, keys optionally under
//! `model.diffusion_model.`).
//!
//! Module paths map to diffusers keys as the MMDiT's do ([`diffusers_key`]); the BFL layout
//! differs by renames, fused `qkv` / `linear1` tensors and swapped output-norm halves
//! ([`bfl_key`]).

use std::path::Path;

use burn::prelude::*;

use super::{Flux, FluxConfig};
use crate::error::{Error, Result};
use crate::model::mmdit::load::diffusers_key;
use crate::weights::{apply_plan, open_checkpoint_file, save_diffusers_folder, transformer_dir};
use crate::weights::{Source, WeightFiles, DIFFUSERS_STEM};

/// Optional key prefix of the transformer in BFL / ComfyUI single files.
pub(crate) const BFL_PREFIX: &str = "model.diffusion_model.";

/// Where a diffusers tensor lives in a BFL checkpoint: the key (without [`BFL_PREFIX`]) and
/// which rows, for a model of hidden size `dim`; `None` for keys with no counterpart.
///
/// `double_blocks.i.{img,txt}_attn.qkv` stack q, k, v (`D` rows each); `single_blocks.i.linear1`
/// stacks q, k, v and the MLP input (`D, D, D, 4D` rows); `final_layer.adaLN_modulation.1`
/// holds (shift, scale) where diffusers' `norm_out.linear` holds (scale, shift).
pub(crate) fn bfl_key(key: &str, dim: usize) -> Option<Source> {
    let (module, param) = key.rsplit_once('.')?;
    let whole = |k: &str| Some(Source::key(format!("{k}.{param}")));
    let third =
        |k: &str, j: usize| Some(Source::rows(format!("{k}.{param}"), j * dim..(j + 1) * dim));
    let simple = match module {
        "x_embedder" => "img_in",
        "context_embedder" => "txt_in",
        "time_text_embed.timestep_embedder.linear_1" => "time_in.in_layer",
        "time_text_embed.timestep_embedder.linear_2" => "time_in.out_layer",
        "time_text_embed.guidance_embedder.linear_1" => "guidance_in.in_layer",
        "time_text_embed.guidance_embedder.linear_2" => "guidance_in.out_layer",
        "time_text_embed.text_embedder.linear_1" => "vector_in.in_layer",
        "time_text_embed.text_embedder.linear_2" => "vector_in.out_layer",
        "proj_out" => "final_layer.linear",
        "norm_out.linear" => {
            return Some(Source::swapped(format!("final_layer.adaLN_modulation.1.{param}")))
        }
        _ => "",
    };
    if !simple.is_empty() {
        return whole(simple);
    }
    // RMSNorm weights are `scale` in BFL files.
    let norm = |k: &str| (param == "weight").then(|| Source::key(format!("{k}.scale")));
    if let Some(rest) = module.strip_prefix("transformer_blocks.") {
        let (i, sub) = rest.split_once('.')?;
        let b = format!("double_blocks.{}", i.parse::<usize>().ok()?);
        return match sub {
            "norm1.linear" => whole(&format!("{b}.img_mod.lin")),
            "norm1_context.linear" => whole(&format!("{b}.txt_mod.lin")),
            "attn.to_q" => third(&format!("{b}.img_attn.qkv"), 0),
            "attn.to_k" => third(&format!("{b}.img_attn.qkv"), 1),
            "attn.to_v" => third(&format!("{b}.img_attn.qkv"), 2),
            "attn.add_q_proj" => third(&format!("{b}.txt_attn.qkv"), 0),
            "attn.add_k_proj" => third(&format!("{b}.txt_attn.qkv"), 1),
            "attn.add_v_proj" => third(&format!("{b}.txt_attn.qkv"), 2),
            "attn.norm_q" => norm(&format!("{b}.img_attn.norm.query_norm")),
            "attn.norm_k" => norm(&format!("{b}.img_attn.norm.key_norm")),
            "attn.norm_added_q" => norm(&format!("{b}.txt_attn.norm.query_norm")),
            "attn.norm_added_k" => norm(&format!("{b}.txt_attn.norm.key_norm")),
            "attn.to_out.0" => whole(&format!("{b}.img_attn.proj")),
            "attn.to_add_out" => whole(&format!("{b}.txt_attn.proj")),
            "ff.net.0.proj" => whole(&format!("{b}.img_mlp.0")),
            "ff.net.2" => whole(&format!("{b}.img_mlp.2")),
            "ff_context.net.0.proj" => whole(&format!("{b}.txt_mlp.0")),
            "ff_context.net.2" => whole(&format!("{b}.txt_mlp.2")),
            _ => None,
        };
    }
    let rest = module.strip_prefix("single_transformer_blocks.")?;
    let (i, sub) = rest.split_once('.')?;
    let b = format!("single_blocks.{}", i.parse::<usize>().ok()?);
    match sub {
        "norm.linear" => whole(&format!("{b}.modulation.lin")),
        "attn.to_q" => third(&format!("{b}.linear1"), 0),
        "attn.to_k" => third(&format!("{b}.linear1"), 1),
        "attn.to_v" => third(&format!("{b}.linear1"), 2),
        "proj_mlp" => Some(Source::rows(format!("{b}.linear1.{param}"), 3 * dim..7 * dim)),
        "attn.norm_q" => norm(&format!("{b}.norm.query_norm")),
        "attn.norm_k" => norm(&format!("{b}.norm.key_norm")),
        "proj_out" => whole(&format!("{b}.linear2")),
        _ => None,
    }
}

/// How diffusers keys are found in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Layout {
    /// Keys as diffusers names them.
    Diffusers,
    /// BFL names under this prefix (empty or [`BFL_PREFIX`]).
    Bfl(&'static str),
}

impl Layout {
    /// The layout of a checkpoint from its keys.
    fn detect(files: &WeightFiles) -> Self {
        let bfl = |prefix: &'static str| {
            files.keys().any(|k| k.starts_with(&format!("{prefix}double_blocks.")))
        };
        if bfl(BFL_PREFIX) {
            Layout::Bfl(BFL_PREFIX)
        } else if bfl("") {
            Layout::Bfl("")
        } else {
            Layout::Diffusers
        }
    }

    /// Where diffusers key `key` is stored, for a model of hidden size `dim`.
    fn locate(&self, key: &str, dim: usize) -> Source {
        match self {
            Layout::Diffusers => Source::key(key),
            Layout::Bfl(prefix) => match bfl_key(key, dim) {
                Some(source) => Source { key: format!("{prefix}{}", source.key), ..source },
                None => Source::key(format!("{prefix}<no counterpart of {key}>")),
            },
        }
    }

    /// Whether checkpoint key `key` belongs to the transformer.
    fn owns(&self, key: &str) -> bool {
        match self {
            Layout::Diffusers => true,
            Layout::Bfl(prefix) => key.starts_with(prefix),
        }
    }
}

/// Infers the configuration from tensor shapes and key presence: `D` and the input channels from
/// `x_embedder`, the head width from `norm_q`, the block counts, guidance from
/// `guidance_embedder`. The rotary axes are not stored: `axes_dims_rope` is FLUX.1's
/// `[16, 56, 56]` for 128-wide heads, and any other width needs a configuration
/// ([`Flux::load_file_with_config`]).
fn infer_config(files: &WeightFiles, layout: &Layout, label: &Path) -> Result<FluxConfig> {
    let problem =
        |message: String| Error::Checkpoint { path: label.to_path_buf(), problems: vec![message] };
    // Rows do not change the second dimension, and no key lookup below depends on `dim`.
    let shape = |key: &str| -> Result<Vec<usize>> {
        let k = layout.locate(key, 0).key;
        files
            .info(&k)
            .map(|i| i.shape.clone())
            .ok_or_else(|| problem(format!("cannot infer the model: missing key `{k}`")))
    };
    let has = |key: &str| files.info(&layout.locate(key, 0).key).is_some();
    let x_in = shape("x_embedder.weight")?;
    let (dim, in_channels) = (x_in[0], x_in.get(1).copied().unwrap_or(0));
    let head_dim = shape("transformer_blocks.0.attn.norm_q.weight")?[0];
    let count = |f: &dyn Fn(usize) -> String| (0..).take_while(|&i| has(&f(i))).count();
    let num_layers = count(&|i| format!("transformer_blocks.{i}.norm1.linear.weight"));
    let num_single_layers = count(&|i| format!("single_transformer_blocks.{i}.norm.linear.weight"));
    if head_dim != 128 {
        return Err(problem(format!(
            "heads of width {head_dim}: the rotary axes (axes_dims_rope) are not stored in the \
             file; load it with a configuration (Flux::load_file_with_config)"
        )));
    }
    let config = FluxConfig {
        patch_size: 1,
        in_channels,
        out_channels: Some(shape("proj_out.weight")?[0]),
        num_layers,
        num_single_layers,
        attention_head_dim: head_dim,
        num_attention_heads: dim / head_dim.max(1),
        joint_attention_dim: shape("context_embedder.weight")?[1],
        pooled_projection_dim: shape("time_text_embed.text_embedder.linear_1.weight")?[1],
        guidance_embeds: has("time_text_embed.guidance_embedder.linear_1.weight"),
        axes_dims_rope: [16, 56, 56],
    };
    config.validate().map_err(|e| problem(format!("inferred configuration is invalid: {e}")))?;
    Ok(config)
}

impl<B: Backend> Flux<B> {
    /// Loads a model from any of:
    /// - a diffusers pipeline folder (uses its `transformer/`) or `transformer/` folder:
    ///   `config.json` plus `diffusion_pytorch_model.safetensors` or sharded files with their
    ///   index;
    /// - a `.safetensors` file (or `.safetensors.index.json`) in diffusers or BFL layout
    ///   (`flux1-dev.safetensors`, with or without `model.diffusion_model.`), the configuration
    ///   inferred from the keys.
    ///
    /// F32, F16 and BF16 tensors are converted to the backend's float type one at a time.
    pub fn load(path: impl AsRef<Path>, device: &B::Device) -> Result<Self> {
        let path = path.as_ref();
        if path.is_dir() {
            let dir = transformer_dir(path);
            let config = FluxConfig::load_json(dir.join("config.json"))?;
            let files = WeightFiles::open_dir(&dir, DIFFUSERS_STEM)?;
            return Self::from_files(&config, &files, &Layout::Diffusers, &dir, device);
        }
        let files = open_checkpoint_file(path)?;
        let layout = Layout::detect(&files);
        let config = infer_config(&files, &layout, path)?;
        Self::from_files(&config, &files, &layout, path, device)
    }

    /// Loads a single file (or sharded index) in diffusers or BFL layout with a given
    /// configuration, for models whose configuration the keys do not determine (diffusers'
    /// `from_single_file(..., config=...)`).
    pub fn load_file_with_config(
        path: impl AsRef<Path>,
        config: &FluxConfig,
        device: &B::Device,
    ) -> Result<Self> {
        let path = path.as_ref();
        let files = open_checkpoint_file(path)?;
        let layout = Layout::detect(&files);
        Self::from_files(config, &files, &layout, path, device)
    }

    fn from_files(
        config: &FluxConfig,
        files: &WeightFiles,
        layout: &Layout,
        label: &Path,
        device: &B::Device,
    ) -> Result<Self> {
        let mut model = config.init::<B>(device)?;
        let dim = config.hidden_size();
        let plan = |path: &str| layout.locate(&diffusers_key(path), dim);
        apply_plan(&mut model, files, label, plan, |k| layout.owns(k))?;
        Ok(model)
    }

    /// Saves the model as a diffusers `transformer/` folder (`config.json` and an f32
    /// `diffusion_pytorch_model.safetensors`), each file written atomically.
    pub fn save_diffusers(&self, dir: impl AsRef<Path>) -> Result<()> {
        save_diffusers_folder(self, dir.as_ref(), diffusers_key, &self.config.to_diffusers_json())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::backend::Backend as B;
    use crate::weights::apply::param_slots;

    /// FLUX.1-dev's parameters have exactly diffusers' keys and shapes, and every one has a BFL
    /// counterpart (`tests/fixtures/flux/flux1_dev_keys.json`, from diffusers' state dict and
    /// the BFL names of its converter's inverse).
    #[test]
    fn flux1_dev_has_exactly_diffusers_keys_and_shapes() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/flux/flux1_dev_keys.json");
        let reference: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let model = FluxConfig::flux1_dev().init::<B>(&Default::default()).unwrap();
        let ours: BTreeMap<String, Vec<usize>> = param_slots::<B, _>(&model)
            .into_iter()
            .map(|s| (diffusers_key(&s.path), s.torch_shape()))
            .collect();
        let theirs: BTreeMap<String, Vec<usize>> =
            serde_json::from_value(reference["shapes"].clone()).unwrap();
        assert_eq!(ours, theirs);
        let count: usize = ours.values().map(|s| s.iter().product::<usize>()).sum();
        assert_eq!(count as u64, reference["num_params"].as_u64().unwrap());
        let bfl: BTreeMap<String, Vec<usize>> =
            serde_json::from_value(reference["bfl_shapes"].clone()).unwrap();
        let dim = FluxConfig::flux1_dev().hidden_size();
        for (key, shape) in &ours {
            let source = bfl_key(key, dim).unwrap_or_else(|| panic!("no BFL key for {key}"));
            let stored =
                bfl.get(&source.key).unwrap_or_else(|| panic!("{key} -> {} absent", source.key));
            let rows = source.rows.map(|r| r.len()).unwrap_or(stored[0]);
            assert_eq!(rows, shape[0], "{key}");
            assert_eq!(stored[1..], shape[1..], "{key}");
        }
    }
}
