//! Rewards: a batched scorer of images given their prompts, and weighted sums of scorers.

use burn::prelude::*;

use crate::error::{Error, Result};

/// An RGB image with values in `[0, 1]`, stored row-major as `[H, W, 3]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// `H * W * 3` values in `[0, 1]`.
    pub pixels: Vec<f32>,
}

impl Image {
    /// The pixel at `(x, y)`.
    pub fn rgb(&self, x: usize, y: usize) -> [f32; 3] {
        let i = 3 * (y * self.width + x);
        [self.pixels[i], self.pixels[i + 1], self.pixels[i + 2]]
    }

    /// The image as 8-bit RGB, `round(255 x)` clamped to `[0, 255]` (how the reference
    /// rewards quantise).
    pub fn to_u8(&self) -> Vec<u8> {
        self.pixels.iter().map(|v| (v * 255.0).round().clamp(0.0, 255.0) as u8).collect()
    }

    /// Images from a tensor `[B, 3, H, W]` of values in `[0, 1]` (clamped).
    pub fn from_tensor<B: Backend>(images: Tensor<B, 4>) -> Result<Vec<Image>> {
        let [b, c, h, w] = images.dims();
        if c != 3 {
            return Err(Error::shape("images", "[B, 3, H, W]", &[b, c, h, w]));
        }
        let data = images.clamp(0.0, 1.0).permute([0, 2, 3, 1]).into_data();
        let values: Vec<f32> = data
            .convert::<f32>()
            .to_vec()
            .map_err(|e| Error::config("images", format!("cannot read the tensor: {e:?}")))?;
        Ok(values
            .chunks(h * w * 3)
            .map(|p| Image { width: w, height: h, pixels: p.to_vec() })
            .collect())
    }
}

/// A prompt and the metadata a reward may read (GenEval-style object lists, OCR text, ...).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Prompt {
    /// The text given to the text encoders.
    pub text: String,
    /// Per-prompt metadata (`null` when the reward needs none).
    #[serde(default)]
    pub metadata: serde_json::Value,
}

/// A batched reward: one finite score per image.
pub trait Reward {
    /// A short name for logs and metrics.
    fn name(&self) -> &str;

    /// Scores `images[i]` against `prompts[i]`.
    fn score(&self, images: &[Image], prompts: &[Prompt]) -> Result<Vec<f64>>;
}

/// Scores `images` with `reward`, checking the batch size and that every score is finite: a
/// NaN or infinite score is an error naming the reward, the image and its prompt.
pub fn score_checked(
    reward: &dyn Reward,
    images: &[Image],
    prompts: &[Prompt],
) -> Result<Vec<f64>> {
    if images.len() != prompts.len() {
        return Err(Error::config(
            "reward",
            format!("{} images but {} prompts", images.len(), prompts.len()),
        ));
    }
    let scores = reward.score(images, prompts)?;
    if scores.len() != images.len() {
        return Err(Error::config(
            "reward",
            format!(
                "`{}` returned {} scores for {} images",
                reward.name(),
                scores.len(),
                images.len()
            ),
        ));
    }
    if let Some((i, s)) = scores.iter().enumerate().find(|(_, s)| !s.is_finite()) {
        return Err(Error::config(
            "reward",
            format!("`{}` scored image {i} (prompt {:?}) as {s}", reward.name(), prompts[i].text),
        ));
    }
    Ok(scores)
}

/// `sum_j w_j r_j(images)`: several rewards combined with weights.
pub struct WeightedSum {
    /// `(weight, reward)` pairs.
    pub terms: Vec<(f64, Box<dyn Reward>)>,
}

impl Reward for WeightedSum {
    fn name(&self) -> &str {
        "weighted_sum"
    }

    fn score(&self, images: &[Image], prompts: &[Prompt]) -> Result<Vec<f64>> {
        let mut total = vec![0.0; images.len()];
        for (w, reward) in &self.terms {
            for (t, s) in total.iter_mut().zip(score_checked(reward.as_ref(), images, prompts)?) {
                *t += w * s;
            }
        }
        Ok(total)
    }
}
