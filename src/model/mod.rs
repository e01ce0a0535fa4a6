//! Models: the SD3 / SD3.5 MMDiT denoiser and its LoRA adapters, the CLIP and T5 text
//! encoders, and the VAE.

pub mod attention;
pub mod clip;
pub mod lora;
pub mod lora_linear;
pub mod mmdit;
pub mod precision;
pub mod t5;
pub mod vae;

pub use clip::{ClipTextConfig, ClipTextModel};
pub use lora::LoraConfig;
pub use lora_linear::{LoraAdapter, LoraLinear};
pub use mmdit::{MMDiT, MMDiTConfig};
pub use precision::Precision;
pub use t5::{T5Config, T5EncoderModel};
pub use vae::{AutoencoderKL, VaeConfig};
