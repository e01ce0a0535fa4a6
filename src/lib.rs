//! # tpgrpo
//!
//! TP-GRPO (TurningPoint-GRPO) reinforcement-learning fine-tuning of flow-matching
//! text-to-image models (Stable Diffusion 3 / 3.5) on Burn.
//!
//! - [`model`]: the SD3 / SD3.5 MMDiT ([`model::MMDiT`]), generic over the backend, loading
//!   diffusers and Stability checkpoints; SD3's text encoders (CLIP, T5) and VAE.
//! - [`pipeline`]: the diffusers-folder text-to-image pipeline; [`sampler`]: flow-matching
//!   sampling (ODE, SDE, CPS) and rollouts.
//! - [`weights`]: lazy safetensors reading and writing.
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
//! use tpgrpo::prompts::Prompt;
//! use tpgrpo::reward::Reward;
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
//!
//! # Sampling with SD3.5 and a trained adapter
//!
//! [`pipeline::Sd3Pipeline`] loads a diffusers folder (here a download of
//! `stabilityai/stable-diffusion-3.5-medium`); the adapters a run saves in its checkpoints
//! are PEFT folders that [`model::Adaptable::load_peft`] attaches (or that `merge_lora` folds in):
//!
//! ```no_run
//! use tpgrpo::backend::{self, Backend};
//! use tpgrpo::model::Adaptable;
//! use tpgrpo::pipeline::{SampleConfig, Sd3Pipeline, DEFAULT_T5_LENGTH};
//!
//! fn main() -> tpgrpo::Result<()> {
//!     let device = backend::init()?;
//!     let mut pipe =
//!         Sd3Pipeline::<Backend>::load("models/sd3.5-medium", DEFAULT_T5_LENGTH, &device)?;
//!     let adapter = "runs/pickscore/checkpoints/epoch-00100/ema";
//!     let (transformer, _lora) = pipe.transformer.load_peft(adapter)?;
//!     pipe.transformer = transformer.merge_lora();
//!     let config = SampleConfig::new().with_steps(28);
//!     let images = pipe.generate(&["a red cube on top of a blue sphere"], &[0], &config)?;
//!     tpgrpo::image::save_png("cube.png".as_ref(), &images[0])?;
//!     Ok(())
//! }
//! ```

#![warn(missing_docs)]
#![warn(unreachable_pub)]

pub mod backend;
pub mod doctor;
pub(crate) mod error;
pub(crate) mod files;
pub(crate) mod finite;
pub mod grpo;
pub mod image;
pub(crate) mod limits;
pub mod model;
pub(crate) mod overrides;
pub mod pipeline;
pub mod prelude;
pub mod prompts;
pub mod reward;
pub mod rng;
pub mod sampler;
pub(crate) mod tokenizer;
pub mod toy;
pub mod train;
pub mod weights;

pub use error::{Error, Result};
