//! Applying a checkpoint to a module through a key plan, with every mismatch reported at once.

use std::collections::BTreeSet;
use std::ops::Range;
use std::path::Path;
use std::rc::Rc;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::prelude::*;
use burn::store::{ModuleSnapshot, TensorSnapshot, TensorSnapshotError};
use burn::tensor::{DType, Element};

use super::file::WeightFiles;
use crate::error::{Error, Result};

/// Where one module parameter comes from in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Source {
    /// The checkpoint key.
    pub key: String,
    /// Keep only these rows (first dimension) of the stored tensor, e.g. `q` of a fused `qkv`.
    pub rows: Option<Range<usize>>,
    /// Swap the two halves of the first dimension (Stability's `shift, scale` order to
    /// diffusers' `scale, shift`).
    pub swap_halves: bool,
    /// Drop trailing `1, 1` dimensions: a 1x1 convolution kernel `[out, in, 1, 1]` read as a
    /// linear weight `[out, in]` (LDM attention projections).
    pub squeeze_1x1: bool,
}

impl Source {
    /// The whole tensor stored under `key`.
    pub(crate) fn key(key: impl Into<String>) -> Self {
        Source { key: key.into(), rows: None, swap_halves: false, squeeze_1x1: false }
    }

    /// The 1x1 convolution kernel stored under `key`, read as a linear weight.
    pub(crate) fn conv_1x1(key: impl Into<String>) -> Self {
        Source { squeeze_1x1: true, ..Source::key(key) }
    }

    /// Rows `rows` of the tensor stored under `key`.
    pub(crate) fn rows(key: impl Into<String>, rows: Range<usize>) -> Self {
        Source { rows: Some(rows), ..Source::key(key) }
    }

    /// The tensor stored under `key` with the halves of its first dimension swapped.
    pub(crate) fn swapped(key: impl Into<String>) -> Self {
        Source { swap_halves: true, ..Source::key(key) }
    }

    /// The shape this source yields from a stored tensor of shape `stored`.
    fn shape(&self, stored: &[usize]) -> Option<Vec<usize>> {
        let mut shape = stored.to_vec();
        if let Some(rows) = &self.rows {
            if shape.is_empty() || rows.end > shape[0] || rows.start > rows.end {
                return None;
            }
            shape[0] = rows.len();
        }
        if self.swap_halves && shape.first().is_none_or(|d| d % 2 != 0) {
            return None;
        }
        if self.squeeze_1x1 {
            if shape.len() != 4 || shape[2..] != [1, 1] {
                return None;
            }
            shape.truncate(2);
        }
        Some(shape)
    }

    /// Reads the source and returns its values in the stored (PyTorch) layout.
    fn read(&self, files: &WeightFiles) -> Result<(Vec<f32>, Vec<usize>)> {
        let stored = &files.info(&self.key).expect("checked by apply_plan").shape;
        let mut values = files.read_f32(&self.key)?;
        let shape = self.shape(stored).expect("checked by apply_plan");
        let row: usize = stored[1..].iter().product();
        if let Some(rows) = &self.rows {
            values = values[rows.start * row..rows.end * row].to_vec();
        }
        if self.swap_halves {
            let half = values.len() / 2;
            values.rotate_left(half);
        }
        Ok((values, shape))
    }
}

/// One float parameter of a module: its path, Burn shape and whether it is a `Linear` weight
/// (stored transposed, `[in, out]`, relative to PyTorch's `[out, in]`).
#[derive(Debug, Clone)]
pub(crate) struct ParamSlot {
    /// Dotted path, enum variants skipped (`transformer_blocks.0.attn.to_q.weight`).
    pub path: String,
    /// Shape in Burn's layout.
    pub shape: Vec<usize>,
    /// Whether the parameter is the `weight` of a `burn::nn::Linear` or a [`crate::model::LoraLinear`].
    pub linear_weight: bool,
}

impl ParamSlot {
    /// The shape the parameter has in PyTorch layout (Linear weights transposed).
    pub(crate) fn torch_shape(&self) -> Vec<usize> {
        let mut s = self.shape.clone();
        if self.linear_weight {
            s.reverse();
        }
        s
    }
}

/// Visitor listing a module's float parameters without materialising lazy ones.
struct Slots {
    path: Vec<String>,
    containers: Vec<String>,
    slots: Vec<ParamSlot>,
}

impl<B: Backend> ModuleVisitor<B> for Slots {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.containers.push(container_type.to_string());
        if !container_type.starts_with("Enum:") {
            self.path.push(name.to_string());
        }
    }

    fn exit_module(&mut self, _name: &str, container_type: &str) {
        self.containers.pop();
        if !container_type.starts_with("Enum:") {
            self.path.pop();
        }
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let linear_weight = self
            .containers
            .last()
            .is_some_and(|c| c == "Struct:Linear" || c == "Struct:LoraLinear")
            && self.path.last().is_some_and(|p| p == "weight");
        self.slots.push(ParamSlot {
            path: self.path.join("."),
            shape: param.lazy_shape().to_vec(),
            linear_weight,
        });
    }
}

/// The float parameters of `module`, in visiting order.
pub(crate) fn param_slots<B: Backend, M: Module<B>>(module: &M) -> Vec<ParamSlot> {
    let mut v = Slots { path: Vec::new(), containers: Vec::new(), slots: Vec::new() };
    module.visit(&mut v);
    v.slots
}

/// Loads `files` into `module`: `plan` maps each parameter path to its [`Source`], and `owns`
/// says which checkpoint keys belong to this module (the rest of a multi-model file is left
/// alone). Missing keys, keys the plan does not use, and shape mismatches are all collected
/// and returned as one [`Error::Checkpoint`] naming `label` before anything is applied.
pub(crate) fn apply_plan<B: Backend, M: Module<B>>(
    module: &mut M,
    files: &WeightFiles,
    label: &Path,
    plan: impl Fn(&str) -> Source,
    owns: impl Fn(&str) -> bool,
) -> Result<()> {
    let slots = param_slots::<B, M>(module);
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    let mut planned = Vec::with_capacity(slots.len());
    for slot in slots {
        let source = plan(&slot.path);
        used.insert(source.key.clone());
        let expected = slot.torch_shape();
        match files.info(&source.key) {
            None => problems.push(format!(
                "missing key `{}` (for parameter `{}`, shape {expected:?})",
                source.key, slot.path
            )),
            Some(info) => match source.shape(&info.shape) {
                Some(found) if found == expected => planned.push((slot, source)),
                found => problems.push(format!(
                    "`{}` in {}: expected shape {expected:?}{}, found {:?}{}",
                    source.key,
                    files.path_of(&source.key).display(),
                    match (&source.rows, source.swap_halves, source.squeeze_1x1) {
                        (Some(r), _, _) => format!(" (rows {r:?} of the stored tensor)"),
                        (None, true, _) => " (halves swapped)".to_string(),
                        (None, false, true) => " (a 1x1 convolution kernel)".to_string(),
                        (None, false, false) => String::new(),
                    },
                    info.shape,
                    if found.is_none() { " (cannot be sliced as planned)" } else { "" },
                )),
            },
        }
    }
    for key in files.keys().filter(|k| owns(k) && !used.contains(*k)) {
        problems.push(format!("unexpected key `{key}` in {}", files.path_of(key).display()));
    }
    if !problems.is_empty() {
        return Err(Error::Checkpoint { path: label.to_path_buf(), problems });
    }

    let dtype: DType = <B::FloatElem as Element>::dtype();
    let files = Rc::new(files.clone());
    let count = planned.len();
    let snapshots: Vec<TensorSnapshot> = planned
        .into_iter()
        .map(|(slot, source)| {
            let files = Rc::clone(&files);
            let linear_weight = slot.linear_weight;
            let read = move || -> std::result::Result<TensorData, TensorSnapshotError> {
                let (values, shape) =
                    source.read(&files).map_err(|e| TensorSnapshotError::IoError(e.to_string()))?;
                let data = TensorData::new(values, shape);
                let data = if linear_weight { transpose_2d(data) } else { data };
                Ok(data.convert_dtype(dtype))
            };
            let path: Vec<String> = slot.path.split('.').map(str::to_string).collect();
            TensorSnapshot::from_closure(
                Rc::new(read),
                dtype,
                slot.shape.into(),
                path,
                Vec::new(),
                ParamId::new(),
            )
        })
        .collect();
    let result = module.apply(snapshots, None, None, true);
    let mut problems: Vec<String> = result.errors.iter().map(ToString::to_string).collect();
    if result.applied.len() != count && problems.is_empty() {
        problems.push(format!("applied {} of {count} tensors", result.applied.len()));
    }
    if !problems.is_empty() {
        return Err(Error::Checkpoint { path: label.to_path_buf(), problems });
    }
    Ok(())
}

/// Transposes a 2-D f32 tensor on the host (PyTorch `[out, in]` to Burn `[in, out]`).
fn transpose_2d(data: TensorData) -> TensorData {
    let [rows, cols] = [data.shape[0], data.shape[1]];
    let src: Vec<f32> = data.into_vec().expect("f32 data");
    let mut dst = vec![0.0f32; src.len()];
    for r in 0..rows {
        for c in 0..cols {
            dst[c * rows + r] = src[r * cols + c];
        }
    }
    TensorData::new(dst, [cols, rows])
}

/// Reads every float parameter of `module` in PyTorch layout: `(path, shape, f32 values)`.
pub fn export_params<B: Backend, M: Module<B>>(module: &M) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let slots = param_slots::<B, M>(module);
    let snapshots = module.collect(None, None, true);
    slots
        .into_iter()
        .zip(snapshots)
        .map(|(slot, snap)| {
            debug_assert_eq!(slot.path, snap.full_path());
            let data =
                snap.to_data().expect("module tensors are in memory").convert_dtype(DType::F32);
            let data = if slot.linear_weight { transpose_2d(data) } else { data };
            let shape = data.shape.to_vec();
            (slot.path, shape, data.into_vec().expect("f32 data"))
        })
        .collect()
}
