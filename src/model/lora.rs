//! LoRA adapters on the denoisers' attention and feed-forward projections, PEFT-compatible
//! export and merging.
//!
//! An adapted projection computes `y = x W + b + (alpha / r) (x A) B` with the base `W`, `b`
//! frozen, `A: [in, r]` drawn from `N(0, (1/r)^2)` and `B: [r, out]` zero, so a fresh adapter
//! leaves the model unchanged. The low-rank path is two small matmuls; `W + A B` is never formed
//! during training. Switching the adapters off ([`Adaptable::adapters_off`]) gives the reference
//! policy of the KL term from the same base tensors.
//!
//! (`crate::Error` is spelled out: `#[derive(Config)]` expands to code naming `Error`.)

use std::collections::BTreeMap;
use std::path::Path;

use burn::module::{ModuleMapper, Param};
use burn::prelude::*;

use super::lora_linear::{LoraAdapter, LoraLinear};
use super::{Flux, MMDiT};

use crate::files::write_atomically;
use crate::rng::gaussian;
use crate::weights::{save_safetensors, save_safetensors_with_metadata, WeightFiles};

/// A tensor to save: key, shape, f32 values.
type NamedTensor = (String, Vec<usize>, Vec<f32>);

/// PEFT's adapter weight file name.
pub(crate) const PEFT_WEIGHTS: &str = "adapter_model.safetensors";
/// PEFT's adapter configuration file name.
pub(crate) const PEFT_CONFIG: &str = "adapter_config.json";
/// Key prefix PEFT gives the wrapped model's modules.
pub(crate) const PEFT_PREFIX: &str = "base_model.model.";
/// diffusers' LoRA weight file name (what `pipe.load_lora_weights(dir)` reads).
pub const DIFFUSERS_LORA_WEIGHTS: &str = "pytorch_lora_weights.safetensors";
/// Key prefix of the transformer's tensors in a diffusers pipeline LoRA file.
const DIFFUSERS_PREFIX: &str = "transformer.";
/// Header metadata entry where diffusers keeps the adapter's PEFT `LoraConfig` (JSON, keys
/// prefixed like the tensors).
const DIFFUSERS_METADATA_KEY: &str = "lora_adapter_metadata";

/// The Flow-GRPO / TP-GRPO LoRA targets: the eight joint-attention projections.
pub(crate) fn default_targets() -> Vec<String> {
    ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0"]
        .into_iter()
        .chain(["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out"])
        .map(String::from)
        .collect()
}

/// The FLUX targets of flow_grpo's and TP-GRPO's FLUX scripts (diffusers' FLUX DreamBooth list):
/// the attention and feed-forward projections of the double-stream blocks; PEFT's suffix rule
/// also takes the single-stream blocks' `attn.to_q/k/v`.
pub fn flux_targets() -> Vec<String> {
    default_targets()
        .into_iter()
        .chain(
            ["ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2"]
                .map(String::from),
        )
        .collect()
}

/// LoRA hyper-parameters (the TP-GRPO launch scripts' defaults).
#[derive(Config, Debug, PartialEq)]
pub struct LoraConfig {
    /// Rank `r` of the update.
    #[config(default = 32)]
    pub rank: usize,
    /// `alpha`; the update is scaled by `alpha / r`.
    #[config(default = 64.0)]
    pub alpha: f64,
    /// Module-name suffixes to adapt, matched like PEFT (`attn.to_q` matches
    /// `transformer_blocks.3.attn.to_q`, not `transformer_blocks.3.attn2.to_q`).
    #[config(default = "default_targets()")]
    pub target_modules: Vec<String>,
    /// Seed of the Gaussian initialisation of `A`.
    #[config(default = 0)]
    pub seed: u64,
}

impl LoraConfig {
    /// Checks rank, alpha and targets, naming the offending field.
    pub fn validate(&self) -> crate::Result<()> {
        if self.rank == 0 {
            return Err(crate::Error::config("lora.rank", "must be at least 1"));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(crate::Error::config(
                "lora.alpha",
                format!("must be positive, got {}", self.alpha),
            ));
        }
        if self.target_modules.is_empty() {
            return Err(crate::Error::config("lora.target_modules", "names no module"));
        }
        Ok(())
    }

    /// Whether the module called `name` is targeted (PEFT's suffix rule).
    pub fn targets(&self, name: &str) -> bool {
        self.target_modules.iter().any(|t| suffix_match(name, t))
    }
}

/// The PEFT `LoraConfig` of `config` as JSON, as both layouts record it (keys prefixed by
/// `prefix`: none in `adapter_config.json`, `transformer.` in diffusers' metadata).
fn lora_config_json(config: &LoraConfig, prefix: &str) -> serde_json::Value {
    let fields = [
        ("peft_type", serde_json::json!("LORA")),
        ("r", config.rank.into()),
        ("lora_alpha", config.alpha.into()),
        ("target_modules", config.target_modules.clone().into()),
        ("init_lora_weights", "gaussian".into()),
        ("lora_dropout", 0.0.into()),
        ("bias", "none".into()),
        ("fan_in_fan_out", false.into()),
        ("use_rslora", false.into()),
        ("use_dora", false.into()),
    ];
    fields.into_iter().map(|(k, v)| (format!("{prefix}{k}"), v)).collect()
}

/// Writes a PEFT folder: `tensors` (PEFT keys) and `adapter_config.json`, each atomically.
fn write_peft(dir: &Path, tensors: &[NamedTensor], config: &LoraConfig) -> crate::Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| crate::Error::io(dir, e))?;
    save_safetensors(&dir.join(PEFT_WEIGHTS), tensors)?;
    let text = serde_json::to_string_pretty(&lora_config_json(config, "")).expect("JSON value");
    let path = dir.join(PEFT_CONFIG);
    write_atomically(&path, |tmp| std::fs::write(tmp, &text).map_err(|e| crate::Error::io(tmp, e)))
}

/// Writes diffusers' LoRA file: `tensors` (`transformer.` keys) with the `LoraConfig` in the
/// header's `lora_adapter_metadata`, atomically.
fn write_diffusers_lora(
    path: &Path,
    tensors: &[NamedTensor],
    config: &LoraConfig,
) -> crate::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| crate::Error::io(dir, e))?;
    }
    let metadata = [
        ("format".to_string(), "pt".to_string()),
        (
            DIFFUSERS_METADATA_KEY.to_string(),
            lora_config_json(config, DIFFUSERS_PREFIX).to_string(),
        ),
    ];
    save_safetensors_with_metadata(path, tensors, Some(metadata.into_iter().collect()))
}

/// Refuses PEFT LoRA variants this crate does not compute (DoRA, rsLoRA's `alpha / sqrt(r)`,
/// per-module ranks or alphas, transposed weights), naming the field: read as plain LoRA they
/// would give another model without a word.
fn refuse_variants<'a>(
    field: impl Fn(&str) -> Option<&'a serde_json::Value>,
    source: &Path,
) -> crate::Result<()> {
    for key in ["use_dora", "use_rslora", "fan_in_fan_out"] {
        if field(key).and_then(|v| v.as_bool()) == Some(true) {
            return Err(crate::Error::format(source, format!("`{key}` is not supported")));
        }
    }
    for key in ["rank_pattern", "alpha_pattern"] {
        if field(key).and_then(|v| v.as_object()).is_some_and(|m| !m.is_empty()) {
            return Err(crate::Error::format(
                source,
                format!("`{key}` (per-module values) is not supported"),
            ));
        }
    }
    Ok(())
}

/// PEFT's rule: `target` is the whole module name or a dot-separated suffix of it.
fn suffix_match(name: &str, target: &str) -> bool {
    name == target || name.strip_suffix(target).is_some_and(|head| head.ends_with('.'))
}

/// One adaptable linear layer of a model (opaque: only this crate's models hand them out).
pub struct Projection<'a, B: Backend>(pub(crate) &'a mut LoraLinear<B>);

/// A model whose linear layers can carry LoRA adapters: [`MMDiT`] and [`Flux`]. The adapters
/// are named by diffusers module names, so PEFT targets and files apply unchanged.
pub trait Adaptable<B: Backend>: Module<B> + Sized {
    /// Every adaptable projection (attention and feed-forward) with its diffusers module name
    /// (`transformer_blocks.{i}.attn.to_q`, `transformer_blocks.{i}.ff.net.2`, ...), in
    /// checkpoint order.
    fn projections_mut(&mut self) -> Vec<(String, Projection<'_, B>)>;

    /// The model with every lazily initialised parameter drawn. `init` is lazy (nothing is
    /// allocated until used or loaded), and clones of an undrawn parameter draw independently;
    /// call this before cloning a randomly initialised model.
    fn materialize(self) -> Self {
        self.map(&mut Materialize)
    }

    /// The adapters' factors as named tensors, `<module>.lora_A` (`A: [in, r]`) and
    /// `<module>.lora_B` (`B: [r, out]`), in model order: what the optimizer updates.
    fn lora_tensors(&self) -> Vec<(String, Tensor<B, 2>)> {
        adapters(self)
            .into_iter()
            .flat_map(|(name, l)| {
                [
                    (format!("{name}.lora_A"), l.lora_a.val()),
                    (format!("{name}.lora_B"), l.lora_b.val()),
                ]
            })
            .collect()
    }

    /// The model with its adapters' factors replaced by `tensors` (names and shapes as
    /// [`Adaptable::lora_tensors`] gives them; every factor must be given, as a trainable leaf).
    fn with_lora_tensors(mut self, tensors: Vec<(String, Tensor<B, 2>)>) -> crate::Result<Self> {
        let mut by_name: BTreeMap<String, Tensor<B, 2>> = tensors.into_iter().collect();
        for (name, p) in layers(&mut self) {
            let Some(l) = p.lora.as_mut() else { continue };
            for (suffix, slot) in [("lora_A", &mut l.lora_a), ("lora_B", &mut l.lora_b)] {
                let key = format!("{name}.{suffix}");
                let t = by_name
                    .remove(&key)
                    .ok_or_else(|| crate::Error::config("lora", format!("no value for `{key}`")))?;
                let expected = slot.lazy_shape().to_vec();
                if t.dims().to_vec() != expected {
                    return Err(crate::Error::shape(key, format!("{expected:?}"), &t.dims()));
                }
                *slot = Param::initialized(slot.id, t.detach().require_grad());
            }
        }
        match by_name.keys().next() {
            Some(name) => {
                Err(crate::Error::config("lora", format!("`{name}` is not an adapter factor")))
            }
            None => Ok(self),
        }
    }

    /// The model with the base frozen and fresh adapters on every projection `config` targets.
    ///
    /// `A` of the `j`-th adapted module is `N(0, (1/r)^2)` noise drawn on the host from
    /// `(config.seed, j)`, so the initialisation does not depend on the backend; `B = 0`.
    /// A target that matches no adaptable projection is an error naming it.
    fn with_lora(self, config: &LoraConfig) -> crate::Result<Self> {
        config.validate()?;
        // Lazily initialised parameters would be drawn anew in every clone (and the reference
        // policy is a clone): fix their values first.
        let mut model = self.materialize().no_grad();
        let device = model.devices()[0].clone();
        let (r, scale) = (config.rank, config.alpha / config.rank as f64);
        let names: Vec<String> = layers(&mut model).into_iter().map(|(n, _)| n).collect();
        for target in &config.target_modules {
            if !names.iter().any(|n| suffix_match(n, target)) {
                return Err(crate::Error::config(
                    "lora.target_modules",
                    format!(
                        "`{target}` matches no adaptable projection (their names end in \
                         attn.to_q, attn.to_k, attn.to_v, attn.to_out.0, attn.add_q_proj, \
                         attn.add_k_proj, attn.add_v_proj, attn.to_add_out, attn2.*, \
                         ff.net.0.proj, ff.net.2 or ff_context.*)"
                    ),
                ));
            }
        }
        for (name, p) in layers(&mut model) {
            let [d_in, d_out] = p.dims();
            if config.targets(&name) && r > d_in.min(d_out) {
                return Err(crate::Error::config(
                    "lora.rank",
                    format!("{r} is above the rank of `{name}` ({d_in} -> {d_out})"),
                ));
            }
        }
        let mut j = 0u64;
        for (name, p) in layers(&mut model) {
            if !config.targets(&name) {
                continue;
            }
            let [d_in, d_out] = p.dims();
            let a: Vec<f32> =
                gaussian(config.seed, j, d_in * r).into_iter().map(|v| v / r as f32).collect();
            j += 1;
            p.lora = Some(LoraAdapter {
                lora_a: Param::from_tensor(Tensor::from_data(
                    TensorData::new(a, [d_in, r]),
                    &device,
                )),
                lora_b: Param::from_tensor(Tensor::zeros([r, d_out], &device)),
                scale,
            });
        }
        Ok(model)
    }

    /// The same network with every adapter removed: the reference policy, sharing the base
    /// tensors (nothing is copied).
    fn adapters_off(&self) -> Self {
        let mut model = self.clone();
        for (_, p) in layers(&mut model) {
            p.lora = None;
        }
        model
    }

    /// The model with every adapter merged into its base weight (`W + (alpha/r) A B`).
    fn merge_lora(mut self) -> Self {
        for (_, p) in layers(&mut self) {
            let layer = std::mem::replace(
                p,
                LoraLinear { weight: p.weight.clone(), bias: p.bias.clone(), lora: None },
            );
            *p = layer.merged();
        }
        self
    }

    /// Whether any adapter is attached.
    fn has_lora(&self) -> bool {
        !adapters(self).is_empty()
    }

    /// Writes the adapters as a PEFT folder: `adapter_model.safetensors` (f32,
    /// `base_model.model.<module>.lora_A.weight [r, in]`, `lora_B.weight [out, r]`) and
    /// `adapter_config.json`; both files written atomically.
    fn save_peft(&self, dir: impl AsRef<Path>, config: &LoraConfig) -> crate::Result<()> {
        write_peft(dir.as_ref(), &peft_tensors(self, PEFT_PREFIX)?, config)
    }

    /// Writes the adapters as a diffusers pipeline LoRA file (`pytorch_lora_weights.safetensors`
    /// layout: f32 `transformer.<module>.lora_A.weight [r, in]` and `lora_B.weight [out, r]`,
    /// with the PEFT `LoraConfig` under the header's `lora_adapter_metadata`, so that
    /// `pipe.load_lora_weights` and `transformer.load_lora_adapter` apply `alpha / r`), atomically.
    fn save_diffusers_lora(
        &self,
        path: impl AsRef<Path>,
        config: &LoraConfig,
    ) -> crate::Result<()> {
        write_diffusers_lora(path.as_ref(), &peft_tensors(self, DIFFUSERS_PREFIX)?, config)
    }

    /// Multiplies every adapter's update by `factor` (diffusers' adapter weight, `--adapter-scale`):
    /// `y = x W + b + factor (alpha / r) (x A) B`.
    fn scale_lora(mut self, factor: f64) -> Self {
        for (_, p) in layers(&mut self) {
            if let Some(l) = p.lora.as_mut() {
                l.scale *= factor;
            }
        }
        self
    }

    /// Attaches a trained adapter from any of: a PEFT folder (`adapter_config.json`), a
    /// diffusers LoRA file or a folder holding `pytorch_lora_weights.safetensors`, or a
    /// training checkpoint folder (its `adapter/`). Returns the model and the adapter's
    /// [`LoraConfig`].
    fn load_adapter(self, path: impl AsRef<Path>) -> crate::Result<(Self, LoraConfig)> {
        let path = path.as_ref();
        if path.is_file() {
            return self.load_diffusers_lora(path);
        }
        if path.join(PEFT_CONFIG).is_file() {
            return self.load_peft(path);
        }
        if path.join(DIFFUSERS_LORA_WEIGHTS).is_file() {
            return self.load_diffusers_lora(path.join(DIFFUSERS_LORA_WEIGHTS));
        }
        if path.join("adapter").join(PEFT_CONFIG).is_file() {
            return self.load_peft(path.join("adapter"));
        }
        let what = if path.is_dir() { "holds no adapter" } else { "does not exist" };
        Err(crate::Error::format(
            path,
            format!(
                "{what}: expected a PEFT folder ({PEFT_CONFIG}), a diffusers LoRA file or a \
                 folder holding {DIFFUSERS_LORA_WEIGHTS}, or a checkpoint folder (adapter/)"
            ),
        ))
    }

    /// Attaches the adapters of a PEFT folder written by [`Adaptable::save_peft`] (or by PEFT for
    /// the same targets); returns the model and the folder's [`LoraConfig`]. Every adapter
    /// tensor must exist with the shape the module needs.
    fn load_peft(self, dir: impl AsRef<Path>) -> crate::Result<(Self, LoraConfig)> {
        let dir = dir.as_ref();
        let config_path = dir.join(PEFT_CONFIG);
        let text =
            std::fs::read_to_string(&config_path).map_err(|e| crate::Error::io(&config_path, e))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| crate::Error::format(&config_path, e.to_string()))?;
        let field = |k: &str| {
            json.get(k)
                .ok_or_else(|| crate::Error::format(&config_path, format!("missing field `{k}`")))
        };
        let rank = field("r")?
            .as_u64()
            .ok_or_else(|| crate::Error::format(&config_path, "`r` is not an integer"))?;
        let alpha = field("lora_alpha")?
            .as_f64()
            .ok_or_else(|| crate::Error::format(&config_path, "`lora_alpha` is not a number"))?;
        let targets: Vec<String> = serde_json::from_value(field("target_modules")?.clone())
            .map_err(|e| crate::Error::format(&config_path, format!("`target_modules`: {e}")))?;
        refuse_variants(|k| json.get(k), &config_path)?;
        let config = LoraConfig::new()
            .with_rank(rank as usize)
            .with_alpha(alpha)
            .with_target_modules(targets);
        let files = WeightFiles::open(dir.join(PEFT_WEIGHTS))?;
        let model = attach(self, &config, &files, dir, PEFT_PREFIX)?;
        Ok((model, config))
    }

    /// Attaches the transformer adapters of a diffusers LoRA file (as
    /// [`Adaptable::save_diffusers_lora`], `pipe.save_lora_weights` or a diffusers training script
    /// write it). The targets are the modules the file holds; `alpha` is its metadata's
    /// `lora_alpha`, or the rank when the file has none (diffusers' rule, a scale of 1).
    fn load_diffusers_lora(self, path: impl AsRef<Path>) -> crate::Result<(Self, LoraConfig)> {
        let path = path.as_ref();
        let files = WeightFiles::open(path)?;
        let mut modules = Vec::new();
        let mut ranks = BTreeMap::new();
        for key in files.keys() {
            let module = key.strip_prefix(DIFFUSERS_PREFIX).and_then(|k| {
                k.strip_suffix(".lora_A.weight").or(k.strip_suffix(".lora_B.weight"))
            });
            let Some(module) = module else {
                return Err(crate::Error::format(
                    path,
                    format!(
                        "`{key}` is not a transformer LoRA factor (`{DIFFUSERS_PREFIX}<module>.\
                         lora_A.weight` / `.lora_B.weight`; text-encoder adapters are not supported)"
                    ),
                ));
            };
            if key.ends_with(".lora_A.weight") {
                modules.push(module.to_string());
                let shape = &files.info(key).expect("listed key").shape;
                ranks.insert(shape.first().copied().unwrap_or(0), key.to_string());
            }
        }
        let rank = match ranks.len() {
            1 => *ranks.keys().next().expect("one rank"),
            0 => return Err(crate::Error::format(path, "holds no LoRA factor")),
            _ => {
                return Err(crate::Error::format(
                    path,
                    format!("the adapters have different ranks ({:?})", ranks.keys()),
                ))
            }
        };
        let metadata: Option<serde_json::Value> = files
            .metadata
            .get(DIFFUSERS_METADATA_KEY)
            .map(|text| {
                serde_json::from_str(text).map_err(|e| {
                    crate::Error::format(path, format!("`{DIFFUSERS_METADATA_KEY}`: {e}"))
                })
            })
            .transpose()?;
        let meta =
            |k: &str| metadata.as_ref().and_then(|m| m.get(format!("{DIFFUSERS_PREFIX}{k}")));
        if let Some(r) = meta("r").and_then(|r| r.as_u64()).filter(|&r| r as usize != rank) {
            return Err(crate::Error::format(
                path,
                format!("the metadata's rank {r} is not the factors' rank {rank}"),
            ));
        }
        let alpha = meta("lora_alpha").and_then(|a| a.as_f64()).unwrap_or(rank as f64);
        let config =
            LoraConfig::new().with_rank(rank).with_alpha(alpha).with_target_modules(modules);
        let model = attach(self, &config, &files, path, DIFFUSERS_PREFIX)?;
        Ok((model, config))
    }
}

/// The layers behind a model's projections.
fn layers<B: Backend, M: Adaptable<B>>(model: &mut M) -> Vec<(String, &mut LoraLinear<B>)> {
    model.projections_mut().into_iter().map(|(name, p)| (name, p.0)).collect()
}

/// Forces lazily initialised parameters to take their values.
struct Materialize;

impl<B: Backend> ModuleMapper<B> for Materialize {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let _ = param.val();
        param
    }
}

/// The attached adapters by module name, in model order.
pub(crate) fn adapters<B: Backend, M: Adaptable<B>>(model: &M) -> Vec<(String, LoraAdapter<B>)> {
    layers(&mut model.clone())
        .into_iter()
        .filter_map(|(name, p)| p.lora.take().map(|l| (name, l)))
        .collect()
}

/// [`Adaptable::save_peft`] into `dir` and [`Adaptable::save_diffusers_lora`] into its
/// `pytorch_lora_weights.safetensors`, the factors read from the device once.
pub(crate) fn save_adapter<B: Backend, M: Adaptable<B>>(
    model: &M,
    dir: &Path,
    config: &LoraConfig,
) -> crate::Result<()> {
    let mut tensors = peft_tensors(model, PEFT_PREFIX)?;
    write_peft(dir, &tensors, config)?;
    for (key, ..) in &mut tensors {
        key.replace_range(..PEFT_PREFIX.len(), DIFFUSERS_PREFIX);
    }
    write_diffusers_lora(&dir.join(DIFFUSERS_LORA_WEIGHTS), &tensors, config)
}

/// The adapters' factors in PyTorch layout under `prefix`: `<prefix><module>.lora_A.weight`
/// `[r, in]` and `.lora_B.weight` `[out, r]`.
fn peft_tensors<B: Backend, M: Adaptable<B>>(
    model: &M,
    prefix: &str,
) -> crate::Result<Vec<NamedTensor>> {
    let mut tensors = Vec::new();
    for (name, l) in adapters(model) {
        for (suffix, t) in [("lora_A", l.lora_a.val()), ("lora_B", l.lora_b.val())] {
            let [rows, cols] = t.dims();
            let values = t.transpose().into_data().convert::<f32>().to_vec::<f32>();
            let values = values.map_err(|e| crate::Error::config("lora", format!("{e:?}")))?;
            tensors.push((format!("{prefix}{name}.{suffix}.weight"), vec![cols, rows], values));
        }
    }
    Ok(tensors)
}

/// The model with adapters for `config` whose factors are read from `files`
/// (`<prefix><module>.lora_A.weight [r, in]`, `.lora_B.weight [out, r]`); every factor must
/// exist with the module's shape and every tensor of the file must be used.
fn attach<B: Backend, M: Adaptable<B>>(
    model: M,
    config: &LoraConfig,
    files: &WeightFiles,
    source: &Path,
    prefix: &str,
) -> crate::Result<M> {
    let rank = config.rank;
    let mut model = model.with_lora(config)?;
    let device = model.devices()[0].clone();
    let mut problems = Vec::new();
    let mut used = 0;
    for (name, p) in layers(&mut model) {
        let [d_in, d_out] = p.dims();
        let Some(l) = p.lora.as_mut() else { continue };
        for (suffix, [rows, cols]) in [("lora_A", [rank, d_in]), ("lora_B", [d_out, rank])] {
            let key = format!("{prefix}{name}.{suffix}.weight");
            match files.info(&key) {
                None => problems.push(format!("missing key `{key}`")),
                Some(info) if info.shape != [rows, cols] => problems.push(format!(
                    "`{key}`: expected shape {:?}, found {:?}",
                    [rows, cols],
                    info.shape
                )),
                Some(_) => {
                    used += 1;
                    let t = Tensor::<B, 2>::from_data(
                        TensorData::new(files.read_f32(&key)?, [rows, cols]),
                        &device,
                    )
                    .transpose();
                    let target = if suffix == "lora_A" { &mut l.lora_a } else { &mut l.lora_b };
                    *target = Param::from_tensor(t);
                }
            }
        }
    }
    if used != files.keys().count() {
        problems.push(format!(
            "{} tensors in the file, {used} used by the targeted modules",
            files.keys().count()
        ));
    }
    if !problems.is_empty() {
        return Err(crate::Error::Checkpoint { path: source.to_path_buf(), problems });
    }
    Ok(model)
}

/// The projections of each of `blocks`, named `{prefix}.{i}.{name}` after the block's own names.
fn block_projections<'a, B: Backend, T>(
    prefix: &str,
    blocks: &'a mut [T],
    projections: impl Fn(&'a mut T) -> Vec<(String, &'a mut LoraLinear<B>)>,
) -> Vec<(String, Projection<'a, B>)> {
    let mut out = Vec::new();
    for (i, block) in blocks.iter_mut().enumerate() {
        let named = projections(block).into_iter();
        out.extend(named.map(|(name, p)| (format!("{prefix}.{i}.{name}"), Projection(p))));
    }
    out
}

impl<B: Backend> Adaptable<B> for MMDiT<B> {
    fn projections_mut(&mut self) -> Vec<(String, Projection<'_, B>)> {
        block_projections("transformer_blocks", &mut self.transformer_blocks, |b| {
            b.projections_mut()
        })
    }
}

impl<B: Backend> Adaptable<B> for Flux<B> {
    fn projections_mut(&mut self) -> Vec<(String, Projection<'_, B>)> {
        let mut out = block_projections("transformer_blocks", &mut self.transformer_blocks, |b| {
            b.projections_mut()
        });
        out.extend(block_projections(
            "single_transformer_blocks",
            &mut self.single_transformer_blocks,
            |b| b.projections_mut(),
        ));
        out
    }
}
