//! Training: the TP-GRPO / Flow-GRPO epoch loop ([`Trainer`]), its settings, optimizer, EMA,
//! checkpoints, metrics (with the gradient noise scale), plots, and data-parallel replicas.

pub mod checkpoint;
pub mod collect;
pub mod config;
pub mod ema;
pub mod evaluate;
pub mod metrics;
pub mod noise_scale;
pub mod observe;
pub mod optim;
pub mod parallel;
pub mod plot;
pub mod replica;
pub mod run_dir;
pub mod trainer;
pub mod update;

pub use config::TrainConfig;
pub use ema::{Ema, EmaConfig};
pub use evaluate::Evaluation;
pub use metrics::{noise_scale, EpochMetrics};
pub use noise_scale::GradientNoise;
pub use observe::{Observer, Phase, Silent};
pub use optim::{clip_global_norm, AdamW, AdamWConfig};
pub use replica::Replica;
pub use trainer::{Task, Trainer};
