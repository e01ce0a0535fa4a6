//! Checkpoint I/O shared by every model: lazy safetensors reading, applying a key plan to a
//! Burn module with a full report of missing, unexpected and mis-shaped keys, and atomic writing.

mod apply;
mod file;
mod save;

pub use apply::{apply_plan, Source};
pub use apply::{export_params, param_slots, ParamSlot};
pub use file::{TensorInfo, WeightFiles};
pub use save::{save_safetensors, write_atomically};
