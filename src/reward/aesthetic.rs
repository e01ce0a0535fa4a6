//! The LAION improved aesthetic predictor: an MLP on L2-normalised CLIP ViT-L/14 image
//! embeddings, read from its released PyTorch file.

use std::path::Path;

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::store::TensorSnapshot;
use burn_store::pytorch::PytorchReader;

use super::Reward;
use crate::error::{Error, Result};
use crate::image::Image;
use crate::model::clip::ClipModel;
use crate::prompts::Prompt;

/// The indices of the linear layers in the released `layers` `nn.Sequential` (dropouts
/// between them hold no weights).
const LINEAR_KEYS: [usize; 5] = [0, 2, 4, 6, 7];

/// `Linear(768, 1024) -> Linear(1024, 128) -> Linear(128, 64) -> Linear(64, 16) ->
/// Linear(16, 1)` with no activations (dropouts are identity at inference).
#[derive(Module, Debug)]
pub(crate) struct AestheticMlp<B: Backend> {
    /// The five linear layers, in order (`layers.0, 2, 4, 6, 7` in the file).
    pub(crate) layers: Vec<Linear<B>>,
}

fn tensor(reader: &PytorchReader, path: &Path, key: &str) -> Result<(Vec<f32>, Vec<usize>)> {
    let snap: &TensorSnapshot =
        reader.get(key).ok_or_else(|| Error::format(path, format!("missing key `{key}`")))?;
    let data =
        snap.to_data().map_err(|e| Error::format(path, format!("cannot read `{key}`: {e:?}")))?;
    let shape = data.shape.clone();
    let values = data
        .convert::<f32>()
        .to_vec()
        .map_err(|e| Error::format(path, format!("cannot read `{key}`: {e:?}")))?;
    Ok((values, shape.to_vec()))
}

impl<B: Backend> AestheticMlp<B> {
    /// Reads the released `sac+logos+ava1-l14-linearMSE.pth` (a PyTorch `state_dict` with
    /// keys `layers.{0,2,4,6,7}.{weight,bias}`), or any file of that layout; the layer sizes
    /// come from the file and must chain, ending in one output.
    pub(crate) fn load(path: impl AsRef<Path>, device: &B::Device) -> Result<Self> {
        let path = path.as_ref();
        let reader = PytorchReader::new(path)
            .map_err(|e| Error::format(path, format!("cannot read a PyTorch file: {e}")))?;
        let mut layers = Vec::new();
        let mut width = None;
        for i in LINEAR_KEYS {
            let (w, w_shape) = tensor(&reader, path, &format!("layers.{i}.weight"))?;
            let (b, b_shape) = tensor(&reader, path, &format!("layers.{i}.bias"))?;
            let [out, inp] = w_shape[..] else {
                return Err(Error::format(path, format!("`layers.{i}.weight` must be 2-D")));
            };
            if b_shape != [out] || width.is_some_and(|d| d != inp) {
                return Err(Error::format(
                    path,
                    format!(
                        "`layers.{i}` has shape {w_shape:?} / {b_shape:?}, which does not chain"
                    ),
                ));
            }
            width = Some(out);
            let weight = Tensor::<B, 2>::from_data(TensorData::new(w, [out, inp]), device);
            let mut linear = LinearConfig::new(inp, out).init(device);
            linear.weight = linear.weight.map(|_| weight.transpose());
            linear.bias = linear
                .bias
                .map(|p| p.map(|_| Tensor::from_data(TensorData::new(b, [out]), device)));
            layers.push(linear);
        }
        if width != Some(1) {
            return Err(Error::format(path, "the last layer must have one output"));
        }
        Ok(AestheticMlp { layers })
    }

    /// The input width (the CLIP embedding width it expects).
    pub(crate) fn input_width(&self) -> usize {
        self.layers[0].weight.dims()[0]
    }

    /// Scores `[B]` of embeddings `[B, D]`.
    pub(crate) fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 1> {
        let x = self.layers.iter().fold(x, |x, layer| layer.forward(x));
        let b = x.dims()[0];
        x.reshape([b])
    }
}

/// The aesthetic reward: `mlp(normalise(clip_image_features(image)))`; the prompt is unused.
#[derive(Debug)]
pub struct Aesthetic<B: Backend> {
    mlp_path: std::path::PathBuf,
    clip: ClipModel<B>,
    mlp: AestheticMlp<B>,
    device: B::Device,
}

impl<B: Backend> Aesthetic<B> {
    /// The MLP file and a `CLIPModel` folder (openai/clip-vit-large-patch14); the MLP's input
    /// width must be the CLIP embedding width.
    pub fn load(mlp: impl AsRef<Path>, clip: impl AsRef<Path>, device: &B::Device) -> Result<Self> {
        let mlp_path = mlp.as_ref();
        let mlp = AestheticMlp::load(mlp_path, device)?;
        let clip = ClipModel::load(clip, device)?;
        let dim = clip.towers.vision.visual_projection.weight.dims()[1];
        if mlp.input_width() != dim {
            return Err(Error::format(
                mlp_path,
                format!(
                    "reads {}-wide embeddings but {} embeds images in {dim}",
                    mlp.input_width(),
                    clip.folder.display()
                ),
            ));
        }
        Ok(Aesthetic { mlp_path: mlp_path.to_path_buf(), clip, mlp, device: device.clone() })
    }
}

impl<B: Backend> Reward for Aesthetic<B> {
    fn name(&self) -> &str {
        "aesthetic"
    }

    /// The MLP file and the `CLIPModel` folder.
    fn identity(&self) -> String {
        format!("aesthetic={}:{}", self.mlp_path.display(), self.clip.folder.display())
    }

    fn score(&self, images: &[Image], _prompts: &[Prompt]) -> Result<Vec<f64>> {
        let mut scores = Vec::with_capacity(images.len());
        for images in images.chunks(super::clip::CLIP_BATCH) {
            let features = self.clip.image_features(images, &self.device)?;
            let s = self.mlp.forward(features).into_data().convert::<f64>();
            scores.extend(s.to_vec::<f64>().map_err(|e| Error::Device {
                what: "reading aesthetic scores back".into(),
                message: format!("{e:?}"),
            })?);
        }
        Ok(scores)
    }
}
