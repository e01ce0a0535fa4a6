//! The types most programs using the crate need: `use tpgrpo::prelude::*;`.

pub use crate::grpo::ObjectiveConfig;
pub use crate::image::Image;
pub use crate::model::{Adaptable, Flux, FluxConfig, LoraConfig, MMDiT, MMDiTConfig, Precision};
pub use crate::pipeline::{SampleConfig, Sd3Pipeline};
pub use crate::prompts::{Prompt, PromptSet};
pub use crate::reward::Reward;
pub use crate::sampler::{RolloutConfig, TextToImage};
pub use crate::train::{EpochMetrics, Observer, Phase, Silent, Task, TrainConfig, Trainer};
pub use crate::{Error, Result};
