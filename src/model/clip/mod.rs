//! CLIP (transformers' `CLIPModel`): the text tower SD3 conditions on, the ViT image tower
//! rewards score with, and CLIP's image preprocessing.

mod encoder;
mod model;
mod processor;
pub mod resample;
mod text;
mod vision;

pub use encoder::{ClipAttention, ClipEncoder, ClipEncoderLayer, ClipMlp};
pub use model::ClipModel;
pub use processor::{ClipImageProcessor, ResizeTo, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD};
pub use text::{ClipEmbeddings, ClipOutput, ClipTextConfig, ClipTextModel, ClipTextTransformer};
pub use vision::{ClipVisionConfig, ClipVisionEmbeddings, ClipVisionModel, ClipVisionTransformer};
