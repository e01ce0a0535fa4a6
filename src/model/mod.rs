//! Models: the SD3 / SD3.5 MMDiT denoiser.

pub mod mmdit;

pub use mmdit::{MMDiT, MMDiTConfig};
