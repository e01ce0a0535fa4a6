//! Training checkpoints: `<out>/checkpoints/epoch-NNNNN/` holding the adapters and their EMA
//! as PEFT folders (`adapter/`, `ema/`), the exact training state (`state.safetensors`:
//! adapter factors, EMA and AdamW moments, f32) and `trainer_state.json` (epoch, optimizer
//! step, settings). Every noise draw derives from the seed and the epoch, so these are all the
//! state a resumed run needs. The folder is built under a temporary name and renamed; the
//! `latest` file then points at it (written atomically).

use crate::model::Adaptable;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::prelude::*;
use serde::{Deserialize, Serialize};

use super::config::TrainConfig;
use super::ema::Ema;
use super::optim::{AdamW, Moments};
use crate::error::{Error, Result};
use crate::files::write_atomically;
use crate::finite::ensure_finite_values;
use crate::model::Denoiser;
use crate::weights::{save_safetensors, WeightFiles};

/// Scalars of a checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainerState {
    /// Epochs completed.
    pub epoch: usize,
    /// Optimizer steps taken.
    pub optimizer_step: u64,
    /// The run's settings.
    pub config: TrainConfig,
    /// The model and resolution trained (absent in checkpoints written before it was recorded).
    #[serde(default)]
    pub run: Option<RunRecord>,
}

/// The model and resolution of a run, compared on resume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The transformer's configuration (diffusers' `config.json` fields).
    pub transformer: serde_json::Value,
    /// `[C, H, W]` of the latents.
    pub latent_shape: Vec<usize>,
    /// The reward's [`Reward::identity`](crate::reward::Reward::identity) (absent in
    /// checkpoints of earlier versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<String>,
    /// SHA-256 of the training and held-out prompts, text and metadata (absent in checkpoints
    /// of earlier versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompts: Option<String>,
}

impl std::fmt::Display for RunRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.transformer;
        write!(
            f,
            "{} layers of width {}, latents {:?}",
            c["num_layers"],
            c["attention_head_dim"].as_u64().unwrap_or(0)
                * c["num_attention_heads"].as_u64().unwrap_or(0),
            self.latent_shape
        )
    }
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
pub(crate) fn save<B: Backend>(
    out_dir: &Path,
    state: &TrainerState,
    model: &Denoiser<B>,
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
    // Each adapter as a PEFT folder that also holds diffusers' LoRA file, so that
    // `PeftModel.from_pretrained(transformer, dir)` and `pipe.load_lora_weights(dir)` both read it.
    let ema_model = model.clone().with_lora_tensors(ema.tensors.clone())?;
    for (m, folder) in [(model, "adapter"), (&ema_model, "ema")] {
        crate::model::lora::save_adapter(m, &tmp.join(folder), lora)?;
    }
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
    // Every factor's moments, zeros before its first step (what AdamW starts from), so that a
    // checkpoint written before any step (an epoch without reward signal) resumes too.
    for (n, t) in model.lora_tensors() {
        match optimizer.moments.get(&n) {
            Some(m) => {
                push("exp_avg", &n, &m.exp_avg)?;
                push("exp_avg_sq", &n, &m.exp_avg_sq)?;
            }
            None => {
                push("exp_avg", &n, &t.zeros_like())?;
                push("exp_avg_sq", &n, &t.zeros_like())?;
            }
        }
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
    remove_stale_pointers(&root);
    Ok(dir)
}

/// Keeps `keep` complete checkpoint folders of `out_dir` (at least 1): `written`, the one the
/// trainer has just written and `latest` names, and the newest others; the older ones are
/// removed. Folders being written (`.epoch-NNNNN.partial`) and other files are left alone.
pub(crate) fn prune(out_dir: &Path, written: &Path, keep: usize) -> Result<()> {
    let root = out_dir.join("checkpoints");
    let entries = std::fs::read_dir(&root).map_err(|e| Error::io(&root, e))?;
    let mut names: Vec<String> = entries
        .flatten()
        .filter(|e| e.path().join("trainer_state.json").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| is_checkpoint_name(n) && root.join(n) != written)
        .collect();
    // `epoch-` and at least five digits: longer numbers are later epochs.
    names.sort_by_key(|n| (n.len(), n.clone()));
    let old = names.len().saturating_sub(keep.max(1) - 1);
    for name in &names[..old] {
        let dir = root.join(name);
        std::fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    }
    Ok(())
}

/// Removes `.latest.tmp-PID` files that killed processes left behind (best effort).
fn remove_stale_pointers(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(".latest.tmp-") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The largest `latest` pointer read: a checkpoint folder name with room to spare.
const LATEST_MAX_BYTES: u64 = 64;

/// Whether `name` is a checkpoint folder name, `epoch-NNNNN` (nothing that could leave the
/// checkpoints folder).
fn is_checkpoint_name(name: &str) -> bool {
    name.strip_prefix("epoch-")
        .is_some_and(|n| n.len() >= 5 && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The checkpoint to resume from: the folder named by `out_dir/checkpoints/latest` (a bare
/// `epoch-NNNNN` name; anything else, such as a path out of the folder, is refused), or, when
/// `latest` is missing (a kill before it was first written), the newest complete
/// `epoch-NNNNN/` folder.
///
/// `latest` must be a small regular file (a FIFO would block the read, a device or a link to
/// one could be read without end), and an error never echoes more of it than a checkpoint
/// name's length.
pub fn latest(out_dir: &Path) -> Result<PathBuf> {
    let root = out_dir.join("checkpoints");
    let path = root.join("latest");
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return newest_complete(&root)?.ok_or_else(|| {
                Error::format(&root, "holds no complete checkpoint (epoch-NNNNN/) to resume from")
            })
        }
        Err(e) => return Err(Error::io(&path, e)),
    };
    if !meta.is_file() || meta.len() > LATEST_MAX_BYTES {
        return Err(Error::format(
            &path,
            format!(
                "is not the pointer this trainer writes (a regular file of at most \
                 {LATEST_MAX_BYTES} bytes naming a checkpoint folder); remove it to resume from \
                 the newest complete checkpoint"
            ),
        ));
    }
    let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
    let name = String::from_utf8_lossy(&bytes).trim().to_string();
    if !is_checkpoint_name(&name) {
        return Err(Error::format(
            &path,
            format!("names {name:?}, which is not a checkpoint folder name (epoch-NNNNN)"),
        ));
    }
    let dir = root.join(&name);
    if !dir.is_dir() || !dir.join("trainer_state.json").is_file() {
        return Err(Error::format(
            &path,
            format!("names {}, which is not a checkpoint", dir.display()),
        ));
    }
    Ok(dir)
}

/// The checkpoint folder of epoch `epoch` in `out_dir`.
pub(crate) fn dir_of(out_dir: &Path, epoch: usize) -> PathBuf {
    out_dir.join("checkpoints").join(format!("epoch-{epoch:05}"))
}

/// `dir` if it is a complete checkpoint folder (one holding `trainer_state.json`, which is
/// written last), else an error naming it.
pub(crate) fn check_dir(dir: &Path) -> Result<PathBuf> {
    if dir.join("trainer_state.json").is_file() {
        return Ok(dir.to_path_buf());
    }
    let what = if dir.is_dir() {
        "is not a complete checkpoint folder (no trainer_state.json)"
    } else {
        "does not exist"
    };
    Err(Error::format(dir, format!("{what}; checkpoints are checkpoints/epoch-NNNNN/")))
}

/// The complete checkpoint folder (with `trainer_state.json`, which is written last) of the
/// highest epoch under `root`, if any.
fn newest_complete(root: &Path) -> Result<Option<PathBuf>> {
    let entries = std::fs::read_dir(root).map_err(|e| Error::io(root, e))?;
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| is_checkpoint_name(n) && root.join(n).join("trainer_state.json").is_file())
        .collect();
    names.sort();
    Ok(names.pop().map(|n| root.join(n)))
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
    let mut value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::format(&path, e.to_string()))?;
    // Settings added after the checkpoint was written take their defaults.
    if let Some(saved) = value.get_mut("config") {
        let config = crate::overrides::fill(&TrainConfig::new(), saved)
            .map_err(|e| Error::format(&path, e.to_string()))?;
        *saved = serde_json::to_value(config).expect("settings serialise");
    }
    let state: TrainerState =
        serde_json::from_value(value).map_err(|e| Error::format(&path, e.to_string()))?;
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
        let values = files.read_f32(key)?;
        ensure_finite_values(&values, &format!("`{key}` in {}", files_path(dir).display()))?;
        let t = Tensor::from_data(TensorData::new(values, [shape[0], shape[1]]), device);
        groups.entry(prefix.to_string()).or_default().push((name.to_string(), t));
    }
    let mut take = |p: &str| -> BTreeMap<String, Tensor<B, 2>> {
        groups.remove(p).unwrap_or_default().into_iter().collect()
    };
    let (lora, mut ema, mut avg, mut avg_sq) =
        (take("lora"), take("ema"), take("exp_avg"), take("exp_avg_sq"));
    let mut problems: Vec<String> =
        groups.keys().map(|p| format!("unexpected `{p}.*` keys")).collect();
    if lora.is_empty() {
        problems.push("no adapter factors (`lora.*`)".into());
    }
    // Every factor needs its EMA and both AdamW moments, of its shape (a resume without them
    // would silently restart the optimizer).
    let (mut ema_out, mut moments) = (Vec::new(), BTreeMap::new());
    for (name, t) in &lora {
        let mut find =
            |group: &mut BTreeMap<String, Tensor<B, 2>>, prefix: &str| match group.remove(name) {
                Some(v) if v.dims() == t.dims() => Some(v),
                Some(v) => {
                    problems.push(format!(
                        "`{prefix}.{name}` has shape {:?}, the factor {:?}",
                        v.dims(),
                        t.dims()
                    ));
                    None
                }
                None => {
                    problems.push(format!("`{prefix}.{name}` is missing"));
                    None
                }
            };
        // Before the first optimizer step the moments are zeros by definition; checkpoints
        // written then by earlier versions lack them.
        let fresh = |group: &BTreeMap<String, Tensor<B, 2>>| {
            state.optimizer_step == 0 && !group.contains_key(name)
        };
        let (m, v) = if fresh(&avg) && fresh(&avg_sq) {
            (Some(t.zeros_like()), Some(t.zeros_like()))
        } else {
            (find(&mut avg, "exp_avg"), find(&mut avg_sq, "exp_avg_sq"))
        };
        let e = find(&mut ema, "ema");
        if let (Some(e), Some(m), Some(v)) = (e, m, v) {
            ema_out.push((name.clone(), e));
            moments.insert(name.clone(), Moments { exp_avg: m, exp_avg_sq: v });
        }
    }
    for (prefix, rest) in [("ema", ema), ("exp_avg", avg), ("exp_avg_sq", avg_sq)] {
        problems
            .extend(rest.keys().map(|n| format!("`{prefix}.{n}` belongs to no adapter factor")));
    }
    if !problems.is_empty() {
        return Err(Error::Checkpoint { path: files_path(dir), problems });
    }
    Ok(Checkpoint { state, lora: lora.into_iter().collect(), ema: ema_out, moments })
}

fn files_path(dir: &Path) -> PathBuf {
    dir.join("state.safetensors")
}
