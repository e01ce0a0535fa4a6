//! CLIP-similarity rewards: PickScore and CLIPScore, both `exp(logit_scale) cos(text, image)`
//! over a divisor, as flow_grpo defines them.

use std::path::Path;

use burn::prelude::*;

use super::Reward;
use crate::error::Result;
use crate::image::Image;
use crate::model::clip::ClipModel;
use crate::prompts::Prompt;

/// Images scored per forward pass.
pub(crate) const CLIP_BATCH: usize = 16;
/// flow_grpo's PickScore divisor (scores of order 0.8).
pub const PICKSCORE_DIVISOR: f64 = 26.0;
/// flow_grpo's CLIPScore divisor.
pub const CLIPSCORE_DIVISOR: f64 = 30.0;

/// `exp(logit_scale) <t, i> / divisor` of L2-normalised CLIP text and image embeddings.
#[derive(Debug)]
pub struct ClipSimilarity<B: Backend> {
    clip: ClipModel<B>,
    divisor: f64,
    name: &'static str,
    device: B::Device,
}

impl<B: Backend> ClipSimilarity<B> {
    /// PickScore: any `CLIPModel` folder (yuvalkirstain/PickScore_v1 with the LAION ViT-H/14
    /// processor in practice), divided by 26.
    pub fn pickscore(dir: impl AsRef<Path>, device: &B::Device) -> Result<Self> {
        Self::new(dir, PICKSCORE_DIVISOR, "pickscore", device)
    }

    /// CLIPScore (openai/clip-vit-large-patch14 in flow_grpo), divided by 30.
    pub fn clip_score(dir: impl AsRef<Path>, device: &B::Device) -> Result<Self> {
        Self::new(dir, CLIPSCORE_DIVISOR, "clipscore", device)
    }

    fn new(
        dir: impl AsRef<Path>,
        divisor: f64,
        name: &'static str,
        device: &B::Device,
    ) -> Result<Self> {
        let clip = ClipModel::load(dir, device)?;
        Ok(ClipSimilarity { clip, divisor, name, device: device.clone() })
    }
}

impl<B: Backend> Reward for ClipSimilarity<B> {
    fn name(&self) -> &str {
        self.name
    }

    /// The kind and the `CLIPModel` folder.
    fn identity(&self) -> String {
        format!("{}={}", self.name, self.clip.folder.display())
    }

    fn score(&self, images: &[Image], prompts: &[Prompt]) -> Result<Vec<f64>> {
        let scale = self.clip.logit_scale.exp() / self.divisor;
        let mut scores = Vec::with_capacity(images.len());
        for (images, prompts) in images.chunks(CLIP_BATCH).zip(prompts.chunks(CLIP_BATCH)) {
            let texts: Vec<&str> = prompts.iter().map(|p| p.text.as_str()).collect();
            let image = self.clip.image_features(images, &self.device)?;
            let text = self.clip.text_features(&texts, &self.device)?;
            let cos = (image * text).sum_dim(1);
            let cos: Vec<f64> =
                cos.into_data().convert::<f64>().to_vec().map_err(|e| crate::Error::Device {
                    what: format!("reading {} scores back", self.name),
                    message: format!("{e:?}"),
                })?;
            scores.extend(cos.into_iter().map(|c| c * scale));
        }
        Ok(scores)
    }
}
