//! Numeric precision of the frozen base weights and of the activations they produce.
//!
//! Mixed precision as Flow-GRPO trains SD3: base weights and activations in bf16 where the
//! backend computes bf16, while LoRA factors, their gradients, the optimizer state, the EMA and
//! everything after the velocity (sampler steps, log-probs, ratios, the loss) stay in f32.
//! The boundaries are explicit casts: [`cast_params`] (base weights), the model's entry and exit
//! (`MMDiT::forward` computes in its weights' dtype and returns the caller's), the norms
//! ([`in_f32`]) and the adapter (`LoraLinear` casts its factors to the activations' dtype).

use burn::module::{Module, ModuleMapper, Param};
use burn::prelude::*;
use burn::tensor::{DType, FloatDType};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The dtype of base weights and activations (`precision` in the settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// bf16 where a GPU computes it (CUDA, LibTorch on CUDA, wgpu on GPUs that have it), f32
    /// on CPUs (LibTorch computes bf16 there too, but slower than f32).
    Auto,
    /// f32 everywhere.
    F32,
    /// bf16 base weights and activations; an error where the backend cannot compute bf16.
    Bf16,
}

impl Precision {
    /// The float dtype this precision means for backend `B` on `device`; `Bf16` where `B` cannot
    /// compute bf16 (NdArray, most Vulkan drivers) is an error naming the setting.
    pub fn resolve<B: Backend>(self, device: &B::Device) -> Result<FloatDType> {
        let bf16 = B::supports_dtype(device, DType::BF16);
        // LibTorch names its CPU device `libtorch<cpu>` (`autodiff<libtorch<cpu>>` under
        // autodiff); the other CPU backend, NdArray, has no bf16.
        let gpu = !B::name(device).contains("<cpu>");
        match self {
            Precision::F32 => Ok(FloatDType::F32),
            Precision::Auto => Ok(if bf16 && gpu { FloatDType::BF16 } else { FloatDType::F32 }),
            Precision::Bf16 if bf16 => Ok(FloatDType::BF16),
            Precision::Bf16 => Err(Error::config(
                "precision",
                format!(
                    "bf16 is not computed by the {} backend on {device:?}; use f32 (or auto)",
                    crate::backend::NAME
                ),
            )),
        }
    }

    /// `f32`, `bf16` or `auto`, as written in the settings.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Auto => "auto",
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Precision::Auto),
            "f32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            other => Err(Error::config(
                "precision",
                format!("unknown precision {other:?} (known: auto, f32, bf16)"),
            )),
        }
    }
}

/// The `f32`/`bf16` name of a float dtype, for banners and errors.
pub fn dtype_name(dtype: FloatDType) -> &'static str {
    match dtype {
        FloatDType::F64 => "f64",
        FloatDType::F32 | FloatDType::Flex32 => "f32",
        FloatDType::F16 => "f16",
        FloatDType::BF16 => "bf16",
    }
}

/// Casts every float parameter to `dtype`, keeping each one's id and whether it requires a
/// gradient (a cast parameter is a new leaf, not a node of the old one's graph).
struct CastFloats(FloatDType);

impl<B: Backend> ModuleMapper<B> for CastFloats {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let dtype = self.0;
        param.map(|t| {
            if t.dtype() == dtype.into() {
                return t;
            }
            let grad = t.is_require_grad();
            // Untracked first (`detach` keeps the flag), so the cast is not a graph node.
            t.set_require_grad(false).cast(dtype).set_require_grad(grad)
        })
    }
}

/// `module` with every float parameter in `dtype` (the base weights, before adapters are
/// attached: LoRA factors created or loaded afterwards are f32).
pub fn cast_params<B: Backend, M: Module<B>>(module: M, dtype: FloatDType) -> M {
    module.map(&mut CastFloats(dtype))
}

/// The float dtype of a tensor (every float tensor of this crate has one).
pub(crate) fn float_dtype<B: Backend, const D: usize>(x: &Tensor<B, D>) -> FloatDType {
    x.dtype().into()
}

/// `f(x)` computed in f32 and returned in `x`'s dtype: the norms, whose mean and variance lose
/// too much in bf16 (torch computes them in f32 under autocast, and diffusers' RMSNorm
/// upcasts explicitly). A no-op wrapper for f32 inputs.
pub(crate) fn in_f32<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    f: impl FnOnce(Tensor<B, D>) -> Tensor<B, D>,
) -> Tensor<B, D> {
    let dtype = float_dtype(&x);
    if dtype == FloatDType::F32 {
        return f(x);
    }
    f(x.cast(FloatDType::F32)).cast(dtype)
}

/// `x` in `dtype` (no cast, and no autodiff node, when it already is).
pub(crate) fn to_dtype<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    dtype: FloatDType,
) -> Tensor<B, D> {
    if float_dtype(&x) == dtype {
        x
    } else {
        x.cast(dtype)
    }
}
