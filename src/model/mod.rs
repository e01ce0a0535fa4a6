//! Models: the SD3 / SD3.5 MMDiT and FLUX.1 denoisers and their LoRA adapters, the CLIP and T5
//! text encoders, and the VAE.

pub(crate) mod attention;
pub mod clip;
pub(crate) mod denoiser;
pub(crate) mod flux;
pub(crate) mod lora;
pub(crate) mod lora_linear;
pub(crate) mod mmdit;
pub(crate) mod precision;
pub(crate) mod rope;
pub(crate) mod t5;
pub(crate) mod vae;

pub use clip::{ClipTextConfig, ClipTextModel};
pub use denoiser::Denoiser;
pub use flux::{pack_latents, unpack_latents, Flux, FluxConfig};
pub use lora::{flux_targets, Adaptable, LoraConfig, Projection, DIFFUSERS_LORA_WEIGHTS};
pub use mmdit::{MMDiT, MMDiTConfig};
pub use precision::{cast_params, dtype_name, Precision};
pub use rope::Rope;
pub use t5::{T5Config, T5EncoderModel};
pub use vae::{AutoencoderKL, VaeConfig};
