//! Mixed precision on the CPU: the cast boundaries, that adapters, gradients and outputs stay
//! f32 whatever the base weights' dtype, and that `bf16` is refused where the backend has none.
//!
//! NdArray cannot compute bf16, but it computes f64 and panics on any operation that mixes
//! float dtypes. So the model with f64 base weights and f32 adapters, fed f32 inputs, runs only
//! if every boundary is an explicit cast; its output must agree with the all-f32 model (the
//! path checked against diffusers) to f32 rounding, and its adapter gradients likewise.

use std::panic::{catch_unwind, AssertUnwindSafe};

use burn::backend::{Autodiff, NdArray};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, FloatDType};
use tpgrpo::model::cast_params;
use tpgrpo::model::{Adaptable, LoraConfig, MMDiT, Precision};

use crate::common;

type B = Autodiff<NdArray>;

/// The base model with adapters whose `B` factors are non-zero, so the adapter path counts.
fn with_adapters<T: AutodiffBackend>(base: MMDiT<T>) -> MMDiT<T> {
    let model = base.with_lora(&LoraConfig::new().with_rank(4).with_alpha(8.0)).unwrap();
    let tensors = model
        .lora_tensors()
        .into_iter()
        .enumerate()
        .map(|(i, (name, t))| {
            let dims = t.dims();
            (name, common::noise::<T, 2>(100 + i as u64, dims) * 0.3)
        })
        .collect();
    model.with_lora_tensors(tensors).unwrap()
}

fn max_rel<T: Backend>(got: Tensor<T, 1>, want: Tensor<T, 1>) -> f64 {
    let scale: f64 = want.clone().abs().max().into_scalar().elem();
    let diff: f64 = (got - want).abs().max().into_scalar().elem();
    diff / scale
}

/// The velocity of `model` on fixed inputs (non-square latents, batch 2) and the gradient of
/// `mean(v^2)` with respect to every adapter factor, flattened; asserts both are f32.
fn velocity_and_adapter_grads<T: AutodiffBackend>(
    model: &MMDiT<T>,
) -> (Tensor<T, 1>, Tensor<T, 1>) {
    let device = Default::default();
    let x = common::noise::<T, 4>(1, [2, 4, 8, 6]);
    let t = Tensor::<T, 1>::from_floats([700.0, 30.0], &device);
    let text = common::noise::<T, 3>(2, [2, 5, 12]);
    let pooled = common::noise::<T, 2>(3, [2, 10]);
    let v = model.forward(x, t, text, pooled).unwrap();
    assert_eq!(v.dtype(), DType::F32, "the velocity comes back in the caller's dtype");
    let grads = v.clone().powf_scalar(2.0).mean().backward();
    let factors: Vec<Tensor<T, 1>> = model
        .lora_tensors()
        .into_iter()
        .map(|(_, p)| {
            let g = p.grad(&grads).expect("every factor gets a gradient");
            assert_eq!(g.dtype(), DType::F32, "adapter gradients are f32");
            Tensor::from_inner(g).flatten(0, 1)
        })
        .collect();
    (v.flatten(0, 3), Tensor::cat(factors, 0))
}

#[test]
fn ndarray_refuses_mixed_float_dtypes_which_makes_the_boundary_test_meaningful() {
    let a = Tensor::<NdArray, 1>::from_floats([1.0, 2.0], &Default::default());
    let b = a.clone().cast(FloatDType::F64);
    assert!(catch_unwind(AssertUnwindSafe(|| a + b)).is_err());
}

#[test]
fn f64_base_with_f32_adapters_agrees_with_f32_and_keeps_adapters_and_outputs_f32() {
    let device = Default::default();
    // Every kind of layer: a dual-attention block, per-head RMS qk-norm, a context-pre-only
    // last block; non-square latents.
    let base = common::tiny_config().init::<B>(&device).unwrap().materialize();
    let wide = with_adapters(cast_params(base.clone(), FloatDType::F64));
    let narrow = with_adapters(base);
    assert_eq!(wide.dtype(), FloatDType::F64);
    assert_eq!(narrow.dtype(), FloatDType::F32);
    for (name, t) in wide.lora_tensors() {
        assert_eq!(t.dtype(), DType::F32, "{name}");
    }

    let (v64, g64) = velocity_and_adapter_grads(&wide);
    let (v32, g32) = velocity_and_adapter_grads(&narrow);
    // f32 rounding over three blocks: ~1e-6 relative per operation; 1e-4 leaves room for the
    // sums of the attention and MLP widths, and is 100x below what a missing term would give.
    let (dv, dg) = (max_rel(v64, v32), max_rel(g64, g32));
    assert!(dv < 1e-4, "velocity differs by {dv:.2e}");
    assert!(dg < 1e-4, "adapter gradients differ by {dg:.2e}");
    assert!(dv > 0.0, "the f64 path computed in f64, not in f32");
}

#[test]
fn precision_resolves_to_f32_on_ndarray_and_bf16_is_an_error_naming_the_setting() {
    let device = Default::default();
    assert_eq!(Precision::Auto.resolve::<NdArray>(&device).unwrap(), FloatDType::F32);
    assert_eq!(Precision::F32.resolve::<NdArray>(&device).unwrap(), FloatDType::F32);
    let e = Precision::Bf16.resolve::<NdArray>(&device).unwrap_err().to_string();
    assert!(e.contains("precision") && e.contains("bf16"), "{e}");

    let dir = std::env::temp_dir().join(format!("tpgrpo-precision-{}", std::process::id()));
    let config = tpgrpo::toy::train_config()
        .with_sources(None, &["precision=bf16".to_string()])
        .expect("bf16 is a valid setting");
    let reward = tpgrpo::toy::reward("toy-alignment").unwrap();
    let e = tpgrpo::toy::trainer::<B>(config, reward, &dir, &device).err().expect("refused");
    assert!(e.to_string().contains("precision"), "{e}");
    let e = tpgrpo::toy::train_config()
        .with_sources(None, &["precision=fp16".to_string()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("precision"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// LibTorch computes bf16 on the CPU, so the bf16 path runs here for real: `auto` keeps f32 on
/// the CPU, `bf16` resolves, and the model with bf16 base weights and f32 adapters agrees with
/// the f32 model to bf16 rounding, velocity and adapter gradients alike.
#[cfg(feature = "tch")]
#[test]
fn libtorch_bf16_agrees_with_f32_to_bf16_rounding() {
    use burn::backend::libtorch::{LibTorch, LibTorchDevice};
    type T = Autodiff<LibTorch<f32>>;
    let device = LibTorchDevice::Cpu;
    assert_eq!(Precision::Auto.resolve::<T>(&device).unwrap(), FloatDType::F32);
    assert_eq!(Precision::Bf16.resolve::<T>(&device).unwrap(), FloatDType::BF16);

    let base = common::tiny_config().init::<T>(&device).unwrap().materialize();
    let half = with_adapters(cast_params(base.clone(), FloatDType::BF16));
    let full = with_adapters(base);
    assert_eq!(half.dtype(), FloatDType::BF16);
    let (v16, g16) = velocity_and_adapter_grads(&half);
    let (v32, g32) = velocity_and_adapter_grads(&full);
    // bf16 keeps 8 significant bits: each rounding is off by at most u = 2^-9 = 2.0e-3
    // relative. Inputs, weights and every activation are rounded, through three blocks of a few
    // dozen operations each; errors of ~10-30 u relative to the largest output are expected
    // (1.2e-2 = 6 u for both was measured on one machine), and 0.1 (50 u) is a bound no
    // f32-vs-bf16 difference of a correct path reaches, while a missing term (an adapter, a
    // gate, a residual) moves the output by O(1) relative.
    let (dv, dg) = (max_rel(v16, v32), max_rel(g16, g32));
    assert!(dv < 0.1, "velocity differs by {dv:.2e}");
    assert!(dg < 0.1, "adapter gradients differ by {dg:.2e}");
    // f32 rounding would give ~1e-6; anything above 2^-12 shows the bf16 weights were used.
    assert!(dv > 2.4e-4, "the bf16 path computed in f32 ({dv:.2e})");
}
