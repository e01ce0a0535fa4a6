//! Rewards: a batched scorer of images given their prompts, and weighted sums of scorers.

mod aesthetic;
mod clip;

pub use aesthetic::{Aesthetic, AestheticMlp};
pub use clip::{ClipSimilarity, CLIPSCORE_DIVISOR, CLIP_BATCH, PICKSCORE_DIVISOR};

use crate::image::Image;

use crate::error::{Error, Result};

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

/// Measurements made at evaluation beside the reward (GenEval-style pass rates, a second
/// scorer): a batch's tallies `(name, passed, made)`, summed over the evaluation and reported
/// as `passed / made`.
pub trait Report {
    /// The tallies of `images[i]` against `prompts[i]`.
    fn tally(&self, images: &[Image], prompts: &[Prompt]) -> Result<Vec<(String, f64, f64)>>;
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
