//! Models: the SD3 / SD3.5 MMDiT denoiser and its LoRA adapters, the CLIP and T5 text
//! encoders, and the VAE.

pub(crate) mod attention;
pub mod clip;
pub(crate) mod lora;
pub(crate) mod lora_linear;
pub(crate) mod mmdit;
pub(crate) mod precision;
pub(crate) mod t5;
pub(crate) mod vae;

pub use clip::{ClipTextConfig, ClipTextModel};
pub use lora::{LoraConfig, DIFFUSERS_LORA_WEIGHTS};
pub use mmdit::{MMDiT, MMDiTConfig};
pub use precision::{cast_params, dtype_name, Precision};
pub use t5::{T5Config, T5EncoderModel};
pub use vae::{AutoencoderKL, VaeConfig};
