//! Images: the RGB `[H, W, 3]` buffer rewards score and pipelines return, and PNG writing
//! (single images and grids).

use std::path::Path;

use ::image::{ImageReader, Rgb, RgbImage};
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

/// An RGB buffer encoded as PNG (`what` names it in errors).
pub(crate) fn encode_png(img: &RgbImage, what: &Path) -> Result<Vec<u8>> {
    let mut bytes = std::io::Cursor::new(Vec::new());
    img.write_to(&mut bytes, ::image::ImageFormat::Png)
        .map_err(|e| Error::Image { what: what.display().to_string(), message: e.to_string() })?;
    Ok(bytes.into_inner())
}

/// The width and height an encoded image declares (`what` names it in errors).
pub(crate) fn png_dimensions(bytes: &[u8], what: &Path) -> Result<(u32, u32)> {
    let reader = ImageReader::new(std::io::Cursor::new(bytes)).with_guessed_format();
    let fail = |e: String| Error::format(what, format!("cannot read the image: {e}"));
    let reader = reader.map_err(|e| fail(e.to_string()))?;
    reader.into_dimensions().map_err(|e| fail(e.to_string()))
}

/// Writes PNG bytes to `path`, atomically.
pub(crate) fn write_png_bytes(bytes: &[u8], path: &Path) -> Result<()> {
    crate::files::write_atomically(path, |tmp| {
        std::fs::write(tmp, bytes).map_err(|e| Error::io(tmp, e))
    })
}

/// Writes an RGB buffer as a PNG, atomically.
pub(crate) fn write_png(img: &RgbImage, path: &Path) -> Result<()> {
    write_png_bytes(&encode_png(img, path)?, path)
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
    /// dropped) as PIL's `convert("RGB")` does. The size its header declares is checked
    /// against [`max_image_pixels`] before anything of that size is allocated.
    pub fn decode(bytes: &[u8]) -> Result<Image> {
        let fail = |message: String| Error::Image { what: "image".into(), message };
        let reader = || {
            ImageReader::new(std::io::Cursor::new(bytes))
                .with_guessed_format()
                .map_err(|e| fail(format!("cannot read: {e}")))
        };
        let (width, height) =
            reader()?.into_dimensions().map_err(|e| fail(format!("cannot decode: {e}")))?;
        check_pixels(width, height).map_err(fail)?;
        let decoded = reader()?.decode().map_err(|e| fail(format!("cannot decode: {e}")))?;
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

/// Bytes a decoded pixel may take on its way to an [`Image`]: the decoder's buffer (up to 8,
/// 16-bit RGBA), the 8-bit RGB copy (3) and the f32 RGB values (12).
const BYTES_PER_DECODED_PIXEL: u64 = 8 + 3 + 12;

/// The most pixels an image read from a file or a reward request may have: 64 Mpx (8192 x
/// 8192, 1.5 GiB on its way to an [`Image`]), or what a quarter of the machine's memory
/// holds when that is less.
/// (The memory is read once a process: every decoded image is checked against it.)
pub fn max_image_pixels() -> u64 {
    const MAX_PIXELS: u64 = 1 << 26;
    static LIMIT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        let fits = crate::limits::host_memory().map(|m| m / 4 / BYTES_PER_DECODED_PIXEL);
        fits.map_or(MAX_PIXELS, |f| f.min(MAX_PIXELS))
    })
}

/// An error message when `width x height` pixels exceed [`max_image_pixels`].
fn check_pixels(width: u32, height: u32) -> std::result::Result<(), String> {
    let (pixels, limit) = (u64::from(width) * u64::from(height), max_image_pixels());
    if pixels > limit {
        return Err(format!(
            "declares {width} x {height} pixels; at most {limit} are decoded (64 Mpx, or a \
             quarter of this machine's memory)"
        ));
    }
    Ok(())
}

/// The `(width, height)` an image file's header declares, refused (naming the file) when it
/// exceeds [`max_image_pixels`]; reads the header only.
pub fn image_dimensions(path: &Path) -> Result<(u32, u32)> {
    let fail = |e: String| Error::format(path, format!("cannot read the image: {e}"));
    let reader = ImageReader::open(path).map_err(|e| fail(e.to_string()))?;
    let reader = reader.with_guessed_format().map_err(|e| fail(e.to_string()))?;
    let (width, height) = reader.into_dimensions().map_err(|e| fail(e.to_string()))?;
    check_pixels(width, height).map_err(|m| Error::format(path, m))?;
    Ok((width, height))
}

/// Reads an image file (PNG, JPEG) as RGB (see [`Image::decode`]), its declared size checked
/// first ([`image_dimensions`]).
pub fn load_png(path: &Path) -> Result<Image> {
    image_dimensions(path)?;
    let reader = ImageReader::open(path).map_err(|e| Error::io(path, e))?;
    let reader = reader
        .with_guessed_format()
        .map_err(|e| Error::format(path, format!("cannot read the image: {e}")))?;
    let decoded =
        reader.decode().map_err(|e| Error::format(path, format!("cannot read the image: {e}")))?;
    Ok(Image::from_rgb8(decoded.to_rgb8()))
}

/// Writes one image as a PNG, atomically.
pub fn save_png(path: &Path, image: &Image) -> Result<()> {
    write_png(&image.to_rgb8()?, path)
}

/// Where the cells of a grid of equally sized images lie: `cols` columns of `cell` (w, h)
/// pixels, `below` free pixels under each (a caption's), `gap` pixels around every cell.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GridLayout {
    /// Columns.
    pub cols: usize,
    /// A scaled image's width and height.
    pub cell: (usize, usize),
    /// Free rows under each image.
    pub below: usize,
    /// Pixels between cells and around the grid.
    pub gap: usize,
}

impl GridLayout {
    /// The top-left pixel of cell `i`.
    pub(crate) fn origin(&self, i: usize) -> (usize, usize) {
        let (w, h) = self.cell;
        let (col, row) = (i % self.cols, i / self.cols);
        (self.gap + col * (w + self.gap), self.gap + row * (h + self.below + self.gap))
    }
}

/// `images` (all of one size) on white in a grid of `cols` columns, each scaled `scale` times
/// (nearest neighbour) with `below` free rows under it, `gap` pixels apart.
pub(crate) fn compose_grid(
    images: &[Image],
    cols: usize,
    scale: usize,
    below: usize,
    gap: usize,
) -> Result<(RgbImage, GridLayout)> {
    let Some(first) = images.first() else {
        return Err(Error::shape("images", "at least one image", &[0]));
    };
    if cols == 0 || scale == 0 {
        return Err(Error::shape("grid columns and scale", "at least 1", &[cols, scale]));
    }
    let (w, h) = (first.width * scale, first.height * scale);
    let layout = GridLayout { cols, cell: (w, h), below, gap };
    let rows = images.len().div_ceil(cols);
    let (width, height) = (cols * (w + gap) + gap, rows * (h + below + gap) + gap);
    let mut out = RgbImage::from_pixel(width as u32, height as u32, Rgb([255, 255, 255]));
    for (i, im) in images.iter().enumerate() {
        if (im.width, im.height) != (first.width, first.height) {
            return Err(Error::shape(
                format!("image {i}"),
                format!("{}x{}", first.height, first.width),
                &[im.height, im.width],
            ));
        }
        let (ox, oy) = layout.origin(i);
        let bytes = im.to_u8();
        for y in 0..h {
            for x in 0..w {
                let j = 3 * ((y / scale) * im.width + x / scale);
                let px = Rgb([bytes[j], bytes[j + 1], bytes[j + 2]]);
                out.put_pixel((ox + x) as u32, (oy + y) as u32, px);
            }
        }
    }
    Ok((out, layout))
}

/// Writes `images` as a PNG grid of `cols` columns, each scaled `scale` times (nearest
/// neighbour), atomically.
pub fn save_grid(path: &Path, images: &[Image], cols: usize, scale: usize) -> Result<()> {
    let (grid, _) = compose_grid(images, cols, scale, 0, 2)?;
    write_png(&grid, path)
}
