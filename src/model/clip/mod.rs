//! CLIP (transformers' `CLIPModel`): the text tower SD3 conditions on, the ViT image tower
//! rewards score with, and CLIP's image preprocessing.

pub(crate) mod encoder;
pub(crate) mod model;
pub(crate) mod processor;
pub(crate) mod resample;
pub(crate) mod text;
pub(crate) mod vision;

pub use model::{ClipModel, ClipTowers};
pub use processor::{ClipImageProcessor, ResizeTo, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD};
pub use text::{ClipOutput, ClipTextConfig, ClipTextModel};
pub use vision::{ClipVisionConfig, ClipVisionModel};
