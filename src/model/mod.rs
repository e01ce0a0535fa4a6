//! Models: the SD3 / SD3.5 MMDiT denoiser and its LoRA adapters.

pub mod lora;
pub mod mmdit;

pub use lora::{LoraConfig, LoraLinear};
pub use mmdit::{MMDiT, MMDiTConfig};
