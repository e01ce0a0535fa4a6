//! Checkpoint I/O shared by every model: lazy safetensors reading, applying a key plan to a
//! Burn module with a full report of missing, unexpected and mis-shaped keys, and atomic writing.

pub(crate) mod apply;
mod file;
mod save;

pub use apply::export_params;
pub(crate) use apply::{apply_plan, Source};
pub use file::{TensorInfo, WeightFiles};
pub use save::{save_safetensors, save_safetensors_with_metadata};

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::prelude::Backend;

use crate::error::{Error, Result};

/// Reads a model's `config.json` into `T`, ignoring fields `T` does not have; errors name the
/// file.
pub fn read_config<T: serde::de::DeserializeOwned>(path: impl AsRef<Path>) -> Result<T> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    serde_json::from_str(text).map_err(|e| Error::format(path, format!("invalid config: {e}")))
}

/// The file stem of a diffusers model's weights (`diffusion_pytorch_model.safetensors`, or its
/// shards and `.safetensors.index.json`).
pub(crate) const DIFFUSERS_STEM: &str = "diffusion_pytorch_model";

/// The model folder `path` names: its `transformer/` when `path` is a pipeline folder holding
/// one, else `path` itself.
pub(crate) fn transformer_dir(path: &Path) -> PathBuf {
    let transformer = path.join("transformer");
    if transformer.is_dir() {
        transformer
    } else {
        path.to_path_buf()
    }
}

/// Reads the configuration file `path` and parses its text with `parse`; errors are reported
/// against the file (a field's error names the field).
pub(crate) fn parse_config_file<T>(
    path: &Path,
    parse: impl FnOnce(&str) -> Result<T>,
) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    parse(&text).map_err(|e| match e {
        Error::Format { message, .. } => Error::format(path, message),
        Error::Config { field, message } => Error::format(path, format!("`{field}` {message}")),
        other => other,
    })
}

/// Opens a checkpoint given as one file: a `.safetensors` file, or a `.safetensors.index.json`
/// and its shards; anything else is an error naming the path.
pub(crate) fn open_checkpoint_file(path: &Path) -> Result<WeightFiles> {
    let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    if name.ends_with(".index.json") {
        WeightFiles::open_sharded(path)
    } else if name.ends_with(".safetensors") {
        WeightFiles::open(path)
    } else if !path.exists() {
        Err(Error::io(
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or folder"),
        ))
    } else {
        Err(Error::format(
            path,
            "expected a diffusers folder, a .safetensors file or a .safetensors.index.json",
        ))
    }
}

/// Writes a diffusers model folder: the module's parameters as an f32
/// `diffusion_pytorch_model.safetensors` under diffusers keys (`key` of each parameter path)
/// and `config_json` as `config.json`, each file written atomically.
pub(crate) fn save_diffusers_folder<B: Backend, M: Module<B>>(
    module: &M,
    dir: &Path,
    key: impl Fn(&str) -> String,
    config_json: &str,
) -> Result<()> {
    let tensors: Vec<_> = export_params(module)
        .into_iter()
        .map(|(path, shape, values)| (key(&path), shape, values))
        .collect();
    save_safetensors(&dir.join(format!("{DIFFUSERS_STEM}.safetensors")), &tensors)?;
    let config_path = dir.join("config.json");
    crate::files::write_atomically(&config_path, |tmp| {
        std::fs::write(tmp, config_json).map_err(|e| Error::io(tmp, e))
    })
}

/// The PyTorch name of a Burn parameter path: norm `gamma` / `beta` become `weight` / `bias`.
pub(crate) fn torch_param_name(path: &str) -> String {
    match path.rsplit_once('.') {
        Some((module, "gamma")) => format!("{module}.weight"),
        Some((module, "beta")) => format!("{module}.bias"),
        _ => path.to_string(),
    }
}

/// Loads a transformers / diffusers model folder: `config.json` read into `C`, the module
/// built by `init` (an invalid configuration is reported against `config.json`), then
/// `{stem}.safetensors` or its shards applied through `plan` and `owns` (see [`apply_plan`]).
pub(crate) fn load_folder<B: Backend, C: serde::de::DeserializeOwned, M: Module<B>>(
    dir: &Path,
    stem: &str,
    init: impl FnOnce(&C) -> Result<M>,
    plan: impl Fn(&str) -> Source,
    owns: impl Fn(&str) -> bool,
) -> Result<M> {
    let config_path = dir.join("config.json");
    let config: C = read_config(&config_path)?;
    let mut module = init(&config).map_err(|e| Error::format(&config_path, e.to_string()))?;
    let files = WeightFiles::open_dir(dir, stem)?;
    apply_plan(&mut module, &files, dir, plan, owns)?;
    Ok(module)
}
