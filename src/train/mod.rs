//! Training: the TP-GRPO / Flow-GRPO epoch loop ([`Trainer`]), its settings, optimizer, EMA,
//! checkpoints, metrics and plots.

pub mod checkpoint;
pub mod config;
pub mod ema;
pub mod metrics;
pub mod optim;
pub mod plot;
pub mod trainer;

pub use config::TrainConfig;
pub use ema::{Ema, EmaConfig};
pub use metrics::{EpochMetrics, FIELDS};
pub use optim::{clip_global_norm, AdamW, AdamWConfig};
pub use trainer::{Pipeline, Trainer};
