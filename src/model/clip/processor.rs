//! CLIP's image preprocessing as transformers' (slow, PIL-based) `CLIPImageProcessor` does it,
//! configured by a model folder's `preprocessor_config.json`.

use std::path::{Path, PathBuf};

use burn::prelude::*;
use serde_json::Value;

use super::resample::pil_bicubic;
use crate::error::{Error, Result};
use crate::image::Image;

/// OpenAI CLIP's per-channel mean (transformers' `OPENAI_CLIP_MEAN`).
pub const OPENAI_CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
/// OpenAI CLIP's per-channel standard deviation (`OPENAI_CLIP_STD`).
pub const OPENAI_CLIP_STD: [f32; 3] = [0.268_629_54, 0.261_302_6, 0.275_777_1];
/// Most pixels a resized image may have (2^26, 192 MiB of RGB): a sliver of an image would
/// otherwise resize to an allocation that aborts the process.
pub(crate) const MAX_RESIZED_PIXELS: usize = 1 << 26;
/// PIL's `Image.BICUBIC`, the only resampling CLIP processors use.
const PIL_BICUBIC: u64 = 3;

/// How the resize step sizes its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResizeTo {
    /// The shorter side becomes this, the longer keeps the aspect ratio (truncated).
    ShortestEdge(usize),
    /// Exactly this `(height, width)`.
    Exact(usize, usize),
}

/// The steps of `CLIPImageProcessor`: resize (bicubic), centre crop, rescale, normalise.
#[derive(Debug, Clone, PartialEq)]
pub struct ClipImageProcessor {
    /// The resize step, if enabled.
    pub resize: Option<ResizeTo>,
    /// The centre crop `(height, width)`, if enabled.
    pub crop: Option<(usize, usize)>,
    /// The factor on 8-bit values (1/255), if enabled.
    pub rescale: Option<f64>,
    /// Per-channel `(mean, std)`, if enabled.
    pub normalize: Option<([f32; 3], [f32; 3])>,
}

impl Default for ClipImageProcessor {
    /// OpenAI CLIP's 224-pixel preprocessing.
    fn default() -> Self {
        ClipImageProcessor {
            resize: Some(ResizeTo::ShortestEdge(224)),
            crop: Some((224, 224)),
            rescale: Some(1.0 / 255.0),
            normalize: Some((OPENAI_CLIP_MEAN, OPENAI_CLIP_STD)),
        }
    }
}

/// A positive size in `json[field]`, an error naming the file and field otherwise.
fn size_field(json: &Value, field: &str, path: &Path) -> Result<usize> {
    json.as_u64()
        .filter(|&n| n > 0 && n <= 1 << 16)
        .map(|n| n as usize)
        .ok_or_else(|| Error::format(path, format!("`{field}` must be a size in 1..=65536")))
}

fn flag(json: &Value, field: &str, path: &Path) -> Result<bool> {
    match &json[field] {
        Value::Null => Ok(true),
        Value::Bool(b) => Ok(*b),
        other => {
            Err(Error::format(path, format!("`{field}` must be true or false, found {other}")))
        }
    }
}

fn triple(json: &Value, field: &str, default: [f32; 3], path: &Path) -> Result<[f32; 3]> {
    match &json[field] {
        Value::Null => Ok(default),
        Value::Array(v) if v.len() == 3 && v.iter().all(Value::is_number) => {
            Ok([0, 1, 2].map(|i| v[i].as_f64().unwrap_or(f64::NAN) as f32))
        }
        other => Err(Error::format(path, format!("`{field}` must be 3 numbers, found {other}"))),
    }
}

impl ClipImageProcessor {
    /// Reads `preprocessor_config.json` in either of its forms: the old one (`"size": 224,
    /// "crop_size": 224`) and the new one (`{"shortest_edge": 224}` or `{"height", "width"}`);
    /// absent fields take transformers' defaults. Errors name the file and field.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let json: Value = crate::weights::read_config(path)?;
        let p = path;
        let resize = if flag(&json, "do_resize", p)? {
            Some(match &json["size"] {
                Value::Null => ResizeTo::ShortestEdge(224),
                Value::Object(o) if o.contains_key("shortest_edge") => ResizeTo::ShortestEdge(
                    size_field(&o["shortest_edge"], "size.shortest_edge", p)?,
                ),
                Value::Object(o) if o.contains_key("height") || o.contains_key("width") => {
                    let h = size_field(o.get("height").unwrap_or(&Value::Null), "size.height", p)?;
                    let w = size_field(o.get("width").unwrap_or(&Value::Null), "size.width", p)?;
                    ResizeTo::Exact(h, w)
                }
                n => ResizeTo::ShortestEdge(size_field(n, "size", p)?),
            })
        } else {
            None
        };
        if let Some(r) = json.get("resample").filter(|r| !r.is_null()) {
            if r.as_u64() != Some(PIL_BICUBIC) {
                return Err(Error::format(
                    p,
                    format!("`resample` {r} is not supported: CLIP uses bicubic (3)"),
                ));
            }
        }
        let crop = if flag(&json, "do_center_crop", p)? {
            Some(match &json["crop_size"] {
                Value::Null => (224, 224),
                Value::Object(o) => (
                    size_field(o.get("height").unwrap_or(&Value::Null), "crop_size.height", p)?,
                    size_field(o.get("width").unwrap_or(&Value::Null), "crop_size.width", p)?,
                ),
                n => {
                    let s = size_field(n, "crop_size", p)?;
                    (s, s)
                }
            })
        } else {
            None
        };
        let rescale = if flag(&json, "do_rescale", p)? {
            match &json["rescale_factor"] {
                Value::Null => Some(1.0 / 255.0),
                v => Some(v.as_f64().filter(|f| f.is_finite() && *f > 0.0).ok_or_else(|| {
                    Error::format(p, format!("`rescale_factor` must be positive, found {v}"))
                })?),
            }
        } else {
            None
        };
        let normalize = if flag(&json, "do_normalize", p)? {
            let mean = triple(&json, "image_mean", OPENAI_CLIP_MEAN, p)?;
            let std = triple(&json, "image_std", OPENAI_CLIP_STD, p)?;
            if std.iter().any(|s| !s.is_normal() || *s < 0.0) || mean.iter().any(|m| !m.is_finite())
            {
                return Err(Error::format(p, "`image_mean` / `image_std` must be finite, std > 0"));
            }
            Some((mean, std))
        } else {
            None
        };
        let out = ClipImageProcessor { resize, crop, rescale, normalize };
        if let (Some(ResizeTo::ShortestEdge(s)), Some((ch, cw))) = (out.resize, out.crop) {
            if ch > s || cw > s {
                return Err(Error::format(
                    p,
                    format!("`crop_size` {ch}x{cw} is larger than the resized shortest edge {s}"),
                ));
            }
        }
        if let (Some(ResizeTo::Exact(h, w)), Some((ch, cw))) = (out.resize, out.crop) {
            if ch > h || cw > w {
                return Err(Error::format(
                    p,
                    format!("`crop_size` {ch}x{cw} is larger than the resized size {h}x{w}"),
                ));
            }
        }
        Ok(out)
    }

    /// The `(height, width)` of an image of `(height, width)` after resizing, as transformers'
    /// `get_resize_output_image_size`: `short -> s`, `long -> int(s * long / short)`.
    pub fn resized_size(&self, height: usize, width: usize) -> (usize, usize) {
        match self.resize {
            None => (height, width),
            Some(ResizeTo::Exact(h, w)) => (h, w),
            Some(ResizeTo::ShortestEdge(s)) => {
                let (short, long) = (height.min(width).max(1), height.max(width));
                let long = (s as f64 * long as f64 / short as f64) as usize;
                if width <= height {
                    (long, s)
                } else {
                    (s, long)
                }
            }
        }
    }

    /// The `(height, width)` of the processed images of `(height, width)` inputs.
    pub fn output_size(&self, height: usize, width: usize) -> (usize, usize) {
        self.crop.unwrap_or_else(|| self.resized_size(height, width))
    }

    /// One image as `[3, H, W]` values: 8-bit quantisation (`round(255 x)`), PIL's bicubic
    /// resize (`resample::pil_bicubic`), centre crop at `((h - ch) / 2, (w - cw) / 2)`
    /// (floored), `x * rescale` computed in f64 and stored as f32, then `(x - mean) / std` in
    /// f32, as numpy does it in transformers.
    pub fn process_one(&self, image: &Image) -> Result<Vec<f32>> {
        let (w0, h0) = (image.width, image.height);
        if w0 == 0 || h0 == 0 || image.pixels.len() != w0 * h0 * 3 {
            return Err(Error::shape("image", "[H >= 1, W >= 1, 3]", &[h0, w0, 3]));
        }
        let (h, w) = self.resized_size(h0, w0);
        if h.checked_mul(w).is_none_or(|n| n > MAX_RESIZED_PIXELS) {
            return Err(Error::shape(
                "image",
                format!(
                    "an aspect ratio the resize keeps within {MAX_RESIZED_PIXELS} pixels \
                     (this {h0}x{w0} image would become {h}x{w})"
                ),
                &[h0, w0, 3],
            ));
        }
        let pixels = pil_bicubic(&image.to_u8(), (w0, h0), (w, h))?;
        let (ch, cw) = self.crop.unwrap_or((h, w));
        if ch > h || cw > w {
            return Err(Error::shape(
                "image",
                format!("at least {ch}x{cw} for the centre crop"),
                &[h, w, 3],
            ));
        }
        let (top, left) = ((h - ch) / 2, (w - cw) / 2);
        let mut out = vec![0f32; 3 * ch * cw];
        for c in 0..3 {
            for y in 0..ch {
                for x in 0..cw {
                    let v = pixels[3 * ((top + y) * w + left + x) + c];
                    let mut v = match self.rescale {
                        Some(f) => (v as f64 * f) as f32,
                        None => v as f32,
                    };
                    if let Some((mean, std)) = self.normalize {
                        v = (v - mean[c]) / std[c];
                    }
                    out[(c * ch + y) * cw + x] = v;
                }
            }
        }
        Ok(out)
    }

    /// A batch as `pixel_values` `[B, 3, H, W]`; every image must come out the same size.
    pub fn process<B: Backend>(
        &self,
        images: &[Image],
        device: &B::Device,
    ) -> Result<Tensor<B, 4>> {
        let first = images.first().ok_or_else(|| Error::shape("images", "[B >= 1]", &[0]))?;
        let (h, w) = self.output_size(first.height, first.width);
        let mut values = Vec::with_capacity(images.len() * 3 * h * w);
        for (i, image) in images.iter().enumerate() {
            if self.output_size(image.height, image.width) != (h, w) {
                return Err(Error::Image {
                    what: format!("image {i}"),
                    message: format!("would process to another size than image 0 ({h}x{w})"),
                });
            }
            values.extend(self.process_one(image)?);
        }
        Ok(Tensor::from_data(TensorData::new(values, [images.len(), 3, h, w]), device))
    }
}

/// The `preprocessor_config.json` of a model folder.
pub(crate) fn preprocessor_path(dir: &Path) -> PathBuf {
    dir.join("preprocessor_config.json")
}
