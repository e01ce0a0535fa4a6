//! Sampling settings of the SD3 pipeline.

use burn::prelude::*;

/// Sampling settings of [`super::Sd3Pipeline::generate`].
#[derive(Config, Debug)]
pub struct SampleConfig {
    /// Euler steps.
    #[config(default = 40)]
    pub steps: usize,
    /// Classifier-free guidance scale.
    #[config(default = 4.5)]
    pub guidance_scale: f64,
    /// Image height in pixels (a multiple of 8 x patch size); `None`: the model's native size.
    #[config(default = "None")]
    pub height: Option<usize>,
    /// Image width in pixels; `None`: the model's native size.
    #[config(default = "None")]
    pub width: Option<usize>,
    /// Negative prompt.
    #[config(default = "String::new()")]
    pub negative_prompt: String,
}
