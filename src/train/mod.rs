//! Training: the TP-GRPO / Flow-GRPO epoch loop ([`Trainer`]) over the phases collection,
//! credit and update; its settings, observer, metrics, charts, checkpoints, run folders and
//! data-parallel replicas.

pub mod checkpoint;
pub(crate) mod collect;
pub(crate) mod config;
pub(crate) mod ema;
pub(crate) mod evaluate;
pub(crate) mod metrics;
#[cfg(feature = "mpi")]
pub mod mpi;
pub(crate) mod noise_scale;
pub(crate) mod observe;
pub(crate) mod optim;
pub mod parallel;
pub(crate) mod plot;
pub(crate) mod replica;
pub mod run_dir;
pub(crate) mod same_run;
pub(crate) mod tensorboard;
pub(crate) mod trainer;
pub(crate) mod update;

pub use collect::sample_order;
pub use config::{read_settings, TrainConfig};
pub use ema::EmaConfig;
pub use evaluate::Evaluation;
pub use metrics::{noise_scale, read_metrics, EpochMetrics, PhaseSeconds};
pub use noise_scale::GradientNoise;
pub use observe::{Observer, Phase, Silent};
pub use optim::AdamWConfig;
pub use plot::{objective_color, objective_label, reward_series, save_chart, save_reward_curve};
pub use plot::{save_captioned_grid, Chart, Series};
pub use replica::{Replica, Transport};
pub use tensorboard::{read_scalars, scalars, Scalar};
pub use trainer::{Task, Trainer};
