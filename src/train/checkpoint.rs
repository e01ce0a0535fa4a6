//! Training checkpoints: `<out>/checkpoints/epoch-NNNNN/` holding the adapters and their EMA
//! as PEFT folders (`adapter/`, `ema/`), the exact training state (`state.safetensors`:
//! adapter factors, EMA and AdamW moments, f32) and `trainer_state.json` (epoch, optimizer
//! step, settings). Every noise draw derives from the seed and the epoch, so these are all the
//! state a resumed run needs. The folder is built under a temporary name and renamed; the
//! `latest` file then points at it (written atomically).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::prelude::*;
use serde::{Deserialize, Serialize};

use super::config::TrainConfig;
use super::ema::Ema;
use super::optim::{AdamW, Moments};
use crate::error::{Error, Result};
use crate::model::MMDiT;
use crate::weights::{save_safetensors, write_atomically, WeightFiles};

/// Scalars of a checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainerState {
    /// Epochs completed.
    pub epoch: usize,
    /// Optimizer steps taken.
    pub optimizer_step: u64,
    /// The run's settings.
    pub config: TrainConfig,
}

/// Named f32 tensors read back from a checkpoint.
pub type Named<B> = Vec<(String, Tensor<B, 2>)>;

fn values<B: Backend>(t: &Tensor<B, 2>) -> Result<Vec<f32>> {
    t.clone()
        .into_data()
        .convert::<f32>()
        .to_vec()
        .map_err(|e| Error::config("checkpoint", format!("cannot read a tensor: {e:?}")))
}

/// Writes a checkpoint of epoch `state.epoch` under `out_dir/checkpoints/`; returns its folder.
pub fn save<B: Backend>(
    out_dir: &Path,
    state: &TrainerState,
    model: &MMDiT<B>,
    ema: &Ema<B>,
    optimizer: &AdamW<B>,
) -> Result<PathBuf> {
    let lora = &state.config.lora;
    let root = out_dir.join("checkpoints");
    let name = format!("epoch-{:05}", state.epoch);
    let (dir, tmp) = (root.join(&name), root.join(format!(".{name}.partial")));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    model.save_peft(tmp.join("adapter"), lora)?;
    model.clone().with_lora_tensors(ema.tensors.clone())?.save_peft(tmp.join("ema"), lora)?;
    let mut tensors = Vec::new();
    let mut push = |prefix: &str, name: &str, t: &Tensor<B, 2>| -> Result<()> {
        tensors.push((format!("{prefix}.{name}"), t.dims().to_vec(), values(t)?));
        Ok(())
    };
    for (n, t) in model.lora_tensors() {
        push("lora", &n, &t)?;
    }
    for (n, t) in &ema.tensors {
        push("ema", n, t)?;
    }
    for (n, m) in &optimizer.moments {
        push("exp_avg", n, &m.exp_avg)?;
        push("exp_avg_sq", n, &m.exp_avg_sq)?;
    }
    save_safetensors(&tmp.join("state.safetensors"), &tensors)?;
    let json = serde_json::to_string_pretty(state).expect("state serialises");
    let path = tmp.join("trainer_state.json");
    std::fs::write(&path, json).map_err(|e| Error::io(&path, e))?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    }
    std::fs::rename(&tmp, &dir).map_err(|e| Error::io(&dir, e))?;
    let latest = root.join("latest");
    write_atomically(&latest, |t| std::fs::write(t, &name).map_err(|e| Error::io(t, e)))?;
    Ok(dir)
}

/// The folder named by `out_dir/checkpoints/latest`.
pub fn latest(out_dir: &Path) -> Result<PathBuf> {
    let root = out_dir.join("checkpoints");
    let path = root.join("latest");
    let name = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let dir = root.join(name.trim());
    if !dir.join("trainer_state.json").is_file() {
        return Err(Error::format(
            &path,
            format!("names {}, which is not a checkpoint", dir.display()),
        ));
    }
    Ok(dir)
}

/// What a checkpoint folder holds.
pub struct Checkpoint<B: Backend> {
    /// Scalars and settings.
    pub state: TrainerState,
    /// Adapter factors by name.
    pub lora: Named<B>,
    /// EMA of the adapter factors by name.
    pub ema: Named<B>,
    /// AdamW moments by name.
    pub moments: BTreeMap<String, Moments<B>>,
}

/// Reads a checkpoint folder: state, adapter factors, EMA tensors and AdamW moments.
pub fn load<B: Backend>(dir: &Path, device: &B::Device) -> Result<Checkpoint<B>> {
    let path = dir.join("trainer_state.json");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let state: TrainerState =
        serde_json::from_str(&text).map_err(|e| Error::format(&path, e.to_string()))?;
    let files = WeightFiles::open(dir.join("state.safetensors"))?;
    let mut groups: BTreeMap<String, Named<B>> = BTreeMap::new();
    for key in files.keys() {
        let (prefix, name) = key
            .split_once('.')
            .ok_or_else(|| Error::format(dir, format!("unexpected key `{key}`")))?;
        let shape = files.info(key).expect("listed").shape.clone();
        if shape.len() != 2 {
            return Err(Error::format(dir, format!("`{key}` is not 2-D")));
        }
        let t =
            Tensor::from_data(TensorData::new(files.read_f32(key)?, [shape[0], shape[1]]), device);
        groups.entry(prefix.to_string()).or_default().push((name.to_string(), t));
    }
    let mut take = |p: &str| groups.remove(p).unwrap_or_default();
    let (lora, ema, avg, avg_sq) = (take("lora"), take("ema"), take("exp_avg"), take("exp_avg_sq"));
    if lora.is_empty() || lora.len() != ema.len() || avg.len() != avg_sq.len() {
        return Err(Error::format(dir, "state.safetensors is incomplete"));
    }
    let moments = avg
        .into_iter()
        .zip(avg_sq)
        .map(|((n, m), (_, v))| (n, Moments { exp_avg: m, exp_avg_sq: v }))
        .collect();
    Ok(Checkpoint { state, lora, ema, moments })
}
