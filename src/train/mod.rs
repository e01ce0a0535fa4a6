//! Training: the optimizer, EMA and (soon) the TP-GRPO / Flow-GRPO epoch loop.

pub mod ema;
pub mod optim;

pub use ema::{Ema, EmaConfig};
pub use optim::{clip_global_norm, AdamW, AdamWConfig};
