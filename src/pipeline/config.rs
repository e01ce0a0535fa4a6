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
    /// Image height in pixels (a multiple of 8 x patch size).
    #[config(default = 1024)]
    pub height: usize,
    /// Image width in pixels.
    #[config(default = 1024)]
    pub width: usize,
    /// Negative prompt.
    #[config(default = "String::new()")]
    pub negative_prompt: String,
}
