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
//!
//! # Training with a reward of your own
//!
//! A [`reward::Reward`] scores a batch of images against their prompts; the trainer of the
//! embedded toy task takes any reward and reports through a [`train::Observer`]:
//!
//! ```no_run
//! use tpgrpo::backend::{self, TrainBackend};
//! use tpgrpo::image::Image;
//! use tpgrpo::reward::{Prompt, Reward};
//! use tpgrpo::train::Silent;
//!
//! /// Mean brightness: brighter images score higher.
//! struct Brightness;
//!
//! impl Reward for Brightness {
//!     fn name(&self) -> &str {
//!         "brightness"
//!     }
//!     fn score(&self, images: &[Image], _: &[Prompt]) -> tpgrpo::Result<Vec<f64>> {
//!         let mean = |im: &Image| im.pixels.iter().map(|&v| v as f64).sum::<f64>();
//!         Ok(images.iter().map(|im| mean(im) / im.pixels.len() as f64).collect())
//!     }
//! }
//!
//! fn main() -> tpgrpo::Result<()> {
//!     let config = tpgrpo::toy::train_config().with_sources(None, &["epochs=2".into()])?;
//!     let device = backend::device();
//!     let mut trainer =
//!         tpgrpo::toy::trainer::<TrainBackend>(config, Box::new(Brightness), "runs/mine", &device)?;
//!     let history = trainer.train(&mut Silent)?;
//!     println!("reward after training: {:.3}", history.last().unwrap().reward_mean);
//!     Ok(())
//! }
//! ```

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
