//! # tpgrpo
//!
//! TP-GRPO (TurningPoint-GRPO) reinforcement-learning fine-tuning of flow-matching
//! text-to-image models (Stable Diffusion 3 / 3.5) on Burn.
//!
//! - [`model::mmdit`]: the SD3 / SD3.5 MMDiT, generic over the backend, loading diffusers and
//!   Stability checkpoints.
//! - [`model::clip`], [`model::t5`], [`model::vae`] and [`pipeline`]: SD3's text encoders,
//!   VAE and the diffusers-folder text-to-image pipeline.
//! - [`weights`]: lazy safetensors reading, key plans, atomic writing.
//! - [`grpo`]: TP-GRPO / Flow-GRPO credit, advantages and loss.
//! - [`reward`]: the reward trait; [`toy`]: the embedded default task (tiny model, shapes, scorer).
//! - [`backend`]: the backend chosen by cargo features.

#![warn(missing_docs)]

pub mod backend;
pub mod doctor;
pub mod error;
pub mod finite;
pub mod grpo;
pub mod image;
pub mod limits;
pub mod model;
pub mod overrides;
pub mod paths;
pub mod pipeline;
pub mod prompts;
pub mod reward;
pub mod rng;
pub mod sampler;
pub mod tokenizer;
pub mod toy;
pub mod train;
pub mod weights;

pub use error::{Error, Result};
