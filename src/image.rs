//! Images: the RGB `[H, W, 3]` buffer rewards score and pipelines return, and PNG writing
//! (single images and grids).

use std::path::Path;

use ::image::{Rgb, RgbImage};
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
        let values: Vec<f32> = data.convert::<f32>().to_vec().map_err(|e| Error::Device {
            what: "reading images back".into(),
            message: format!("{e:?}"),
        })?;
        Ok(values
            .chunks(h * w * 3)
            .map(|p| Image { width: w, height: h, pixels: p.to_vec() })
            .collect())
    }
}

/// Writes an RGB buffer as a PNG, atomically.
pub(crate) fn write_png(img: &RgbImage, path: &Path) -> Result<()> {
    crate::files::write_atomically(path, |tmp| {
        img.save_with_format(tmp, ::image::ImageFormat::Png)
            .map_err(|e| Error::io(tmp, std::io::Error::other(e.to_string())))
    })
}

impl Image {
    /// An 8-bit RGB buffer as values `v / 255`.
    pub fn from_rgb8(rgb: RgbImage) -> Image {
        let (width, height) = (rgb.width() as usize, rgb.height() as usize);
        let pixels = rgb.into_raw().into_iter().map(|v| v as f32 / 255.0).collect();
        Image { width, height, pixels }
    }

    /// The image as an 8-bit RGB buffer ([`Image::to_u8`]).
    pub fn to_rgb8(&self) -> Result<RgbImage> {
        RgbImage::from_raw(self.width as u32, self.height as u32, self.to_u8()).ok_or_else(|| {
            Error::shape("image", "height x width x 3 bytes", &[self.height, self.width])
        })
    }

    /// Decodes an encoded image (PNG, JPEG) as RGB; other colour types are converted (alpha
    /// dropped) as PIL's `convert("RGB")` does.
    pub fn decode(bytes: &[u8]) -> Result<Image> {
        let decoded = ::image::load_from_memory(bytes).map_err(|e| Error::Image {
            what: "image".into(),
            message: format!("cannot decode: {e}"),
        })?;
        Ok(Image::from_rgb8(decoded.to_rgb8()))
    }

    /// The 8-bit image encoded as `format` (JPEG at the encoder's default quality 75, as PIL's
    /// `save(format="JPEG")`; PNG).
    pub fn encode(&self, format: ::image::ImageFormat) -> Result<Vec<u8>> {
        let mut out = std::io::Cursor::new(Vec::new());
        self.to_rgb8()?.write_to(&mut out, format).map_err(|e| Error::Image {
            what: "image".into(),
            message: format!("cannot encode as {format:?}: {e}"),
        })?;
        Ok(out.into_inner())
    }
}

/// Reads an image file (PNG) as RGB (see [`Image::decode`]).
pub fn load_png(path: &Path) -> Result<Image> {
    let decoded = ::image::open(path)
        .map_err(|e| Error::format(path, format!("cannot read the image: {e}")))?;
    Ok(Image::from_rgb8(decoded.to_rgb8()))
}

/// Writes one image as a PNG, atomically.
pub fn save_png(path: &Path, image: &Image) -> Result<()> {
    write_png(&image.to_rgb8()?, path)
}

/// Writes `images` as a grid PNG with `cols` columns, each pixel enlarged `scale` times.
pub fn save_grid(path: &Path, images: &[Image], cols: usize, scale: usize) -> Result<()> {
    let Some(first) = images.first() else {
        return Err(Error::shape("images", "at least one image", &[0]));
    };
    let (w, h) = (first.width * scale, first.height * scale);
    let rows = images.len().div_ceil(cols);
    let gap = 2;
    let mut out = RgbImage::from_pixel(
        (cols * (w + gap) + gap) as u32,
        (rows * (h + gap) + gap) as u32,
        Rgb([255, 255, 255]),
    );
    for (i, im) in images.iter().enumerate() {
        let (ox, oy) = (gap + (i % cols) * (w + gap), gap + (i / cols) * (h + gap));
        let bytes = im.to_u8();
        for y in 0..h {
            for x in 0..w {
                let j = 3 * ((y / scale) * im.width + x / scale);
                let px = Rgb([bytes[j], bytes[j + 1], bytes[j + 2]]);
                out.put_pixel((ox + x) as u32, (oy + y) as u32, px);
            }
        }
    }
    write_png(&out, path)
}
