//! A linear layer that can carry a LoRA adapter: `y = x W + b + (alpha / r) (x A) B`; the
//! factors keep their own (f32) dtype and are cast to the activations' for the product.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::module::linear;

use crate::model::precision::{float_dtype, to_dtype};

/// A module's adaptable layers, each with its diffusers name relative to the module.
pub(crate) type Named<'a, B> = Vec<(&'static str, &'a mut LoraLinear<B>)>;

/// A linear layer that can carry a LoRA adapter; without one it is a plain `Linear`.
#[derive(Module, Debug)]
pub(crate) struct LoraLinear<B: Backend> {
    /// Base weight `[in, out]` (Burn layout; PyTorch stores `[out, in]`).
    pub weight: Param<Tensor<B, 2>>,
    /// Base bias `[out]`.
    pub bias: Option<Param<Tensor<B, 1>>>,
    /// The adapter, when attached.
    pub(crate) lora: Option<LoraAdapter<B>>,
}

/// The low-rank update of one linear layer.
#[derive(Module, Debug)]
pub(crate) struct LoraAdapter<B: Backend> {
    /// `A: [in, r]` (PEFT's `lora_A.weight` transposed).
    pub lora_a: Param<Tensor<B, 2>>,
    /// `B: [r, out]` (PEFT's `lora_B.weight` transposed).
    pub lora_b: Param<Tensor<B, 2>>,
    /// `alpha / r`.
    pub scale: f64,
}

/// Settings of a [`LoraLinear`] (without an adapter: [`crate::model::LoraConfig`] adds one).
#[derive(Config, Debug)]
pub(crate) struct LoraLinearConfig {
    /// Input features.
    d_input: usize,
    /// Output features.
    d_output: usize,
}

impl LoraLinearConfig {
    /// A randomly initialised layer with bias (Burn's `Linear` initialisation), no adapter.
    pub(crate) fn init<B: Backend>(&self, device: &B::Device) -> LoraLinear<B> {
        let base = burn::nn::LinearConfig::new(self.d_input, self.d_output).init::<B>(device);
        LoraLinear { weight: base.weight, bias: base.bias, lora: None }
    }
}

impl<B: Backend> LoraLinear<B> {
    /// `x W + b`, plus `scale (x A) B` when an adapter is attached.
    pub(crate) fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let base = linear(x.clone(), self.weight.val(), self.bias.as_ref().map(|b| b.val()));
        match &self.lora {
            None => base,
            Some(l) => {
                // The factors stay f32 (they are trained); they are cast to the activations'
                // dtype, and their gradients come back through the cast in f32.
                let dtype = float_dtype(&x);
                let (a, b) = (to_dtype(l.lora_a.val(), dtype), to_dtype(l.lora_b.val(), dtype));
                base + x.matmul(a.unsqueeze()).matmul(b.unsqueeze()) * l.scale
            }
        }
    }

    /// `[in, out]` of the base weight.
    pub(crate) fn dims(&self) -> [usize; 2] {
        let shape = self.weight.lazy_shape();
        [shape[0], shape[1]]
    }

    /// The layer with `W + scale A B` as its weight and no adapter.
    pub(crate) fn merged(self) -> Self {
        let weight = match &self.lora {
            None => return self,
            Some(l) => {
                let delta = l.lora_a.val().matmul(l.lora_b.val()) * l.scale;
                let weight = self.weight.val();
                let delta = to_dtype(delta, float_dtype(&weight));
                Param::from_tensor(weight + delta).set_require_grad(false)
            }
        };
        LoraLinear { weight, bias: self.bias, lora: None }
    }
}
