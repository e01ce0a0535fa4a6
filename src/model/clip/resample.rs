//! PIL's bicubic resize of 8-bit RGB images (`Image.resize(size, Image.BICUBIC)`), bit for bit:
//! CLIP processors resize with it, and a reward should see the pixels its reference saw.

use crate::error::{Error, Result};

/// Pillow's fixed-point precision for 8-bit images (`PRECISION_BITS = 32 - 8 - 2`).
const PRECISION_BITS: u32 = 22;
/// The bicubic kernel's support in input pixels at scale 1.
const SUPPORT: f64 = 2.0;

/// Keys' cubic convolution kernel with `a = -0.5` (Pillow's `bicubic_filter`):
/// `(a+2)|x|^3 - (a+3)|x|^2 + 1` for `|x| < 1`, `a(|x|^3 - 5|x|^2 + 8|x| - 4)` for
/// `1 <= |x| < 2`, else 0.
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// One output sample's taps: the first input index and fixed-point weights.
struct Taps {
    first: usize,
    weights: Vec<i64>,
}

/// Pillow's `precompute_coeffs` + `normalize_coeffs_8bpc` for `input -> output` samples:
/// `scale = in/out`, the kernel widened by `f = max(scale, 1)`; output `i` is centred at
/// `c = (i + 0.5) scale` and reads inputs `[trunc(c - 2f + 0.5), trunc(c + 2f + 0.5))` (clipped)
/// with weights `k((j - c + 0.5) / f)` normalised to sum 1, then rounded half away from zero to
/// multiples of `2^-22`.
fn taps(input: usize, output: usize) -> Vec<Taps> {
    let scale = input as f64 / output as f64;
    let filterscale = scale.max(1.0);
    let support = SUPPORT * filterscale;
    (0..output)
        .map(|i| {
            let center = (i as f64 + 0.5) * scale;
            let first = ((center - support + 0.5) as i64).max(0) as usize;
            let end = ((center + support + 0.5) as i64).min(input as i64) as usize;
            let w: Vec<f64> =
                (first..end).map(|j| bicubic((j as f64 - center + 0.5) / filterscale)).collect();
            let total: f64 = w.iter().sum();
            let one = (1u64 << PRECISION_BITS) as f64;
            let weights = w
                .iter()
                .map(|&v| {
                    let v = if total != 0.0 { v / total } else { v };
                    if v < 0.0 {
                        (-0.5 + v * one) as i64
                    } else {
                        (0.5 + v * one) as i64
                    }
                })
                .collect();
            Taps { first, weights }
        })
        .collect()
}

/// Pillow's `clip8`: the fixed-point sum (with its `2^21` rounding bias) shifted down and
/// clamped to `[0, 255]`.
fn clip8(sum: i64) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Resamples along one axis: `count` lines of `input` samples, `stride` bytes between
/// samples and `line` bytes between lines, into `output` samples per line.
fn pass(src: &[u8], lines: usize, input: usize, output: usize, along_rows: bool) -> Vec<u8> {
    let taps = taps(input, output);
    let (out_w, out_h) = if along_rows { (output, lines) } else { (lines, output) };
    let in_w = if along_rows { input } else { lines };
    let mut out = vec![0u8; out_w * out_h * 3];
    for line in 0..lines {
        for (o, t) in taps.iter().enumerate() {
            let mut sum = [1i64 << (PRECISION_BITS - 1); 3];
            for (n, &w) in t.weights.iter().enumerate() {
                let (x, y) = if along_rows { (t.first + n, line) } else { (line, t.first + n) };
                let p = 3 * (y * in_w + x);
                for c in 0..3 {
                    sum[c] += src[p + c] as i64 * w;
                }
            }
            let (x, y) = if along_rows { (o, line) } else { (line, o) };
            let q = 3 * (y * out_w + x);
            for c in 0..3 {
                out[q + c] = clip8(sum[c]);
            }
        }
    }
    out
}

/// `PIL.Image.resize((width, height), BICUBIC)` of an 8-bit RGB buffer `[H, W, 3]`, as Pillow
/// 13 does it: two passes, each rounded to 8 bits and run only where its size changes, rows
/// (horizontal) first unless the height shrinks by more than twice as many pixels as the width
/// (`h0 - h1 > max(0, 2 (w0 - w1))`), when the columns go first to make the row pass cheaper.
///
/// The order changes the result (the intermediate image is rounded): a 37x90 image resized to
/// 30x72 differs in 1796 of its 6480 values between the two orders. Pillow before 13.0 always
/// resized rows first.
pub(crate) fn pil_bicubic(
    pixels: &[u8],
    from: (usize, usize),
    to: (usize, usize),
) -> Result<Vec<u8>> {
    let ((w0, h0), (w1, h1)) = (from, to);
    if pixels.len() != w0 * h0 * 3 || w0 == 0 || h0 == 0 || w1 == 0 || h1 == 0 {
        return Err(Error::shape(
            "image",
            format!("{h0}x{w0}x3 bytes resized to {h1}x{w1}"),
            &[pixels.len()],
        ));
    }
    let shrink = |a: usize, b: usize| a as i128 - b as i128;
    let columns_first = shrink(h0, h1) > 0 && shrink(h0, h1) > 2 * shrink(w0, w1);
    let rows = |src: &[u8], lines: usize| pass(src, lines, w0, w1, true);
    let columns = |src: &[u8], lines: usize| pass(src, lines, h0, h1, false);
    Ok(match (w1 != w0, h1 != h0) {
        (false, false) => pixels.to_vec(),
        (true, false) => rows(pixels, h0),
        (false, true) => columns(pixels, w0),
        (true, true) if columns_first => rows(&columns(pixels, w0), h1),
        (true, true) => columns(&rows(pixels, h0), w1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Constant images stay constant (weights sum to one after rounding, within the bias).
    #[test]
    fn constant_images_stay_constant() {
        for (from, to) in [((7, 5), (3, 2)), ((3, 4), (11, 9)), ((40, 40), (13, 29))] {
            let src = vec![200u8; from.0 * from.1 * 3];
            let out = pil_bicubic(&src, from, to).unwrap();
            assert!(out.iter().all(|&v| v == 200), "{from:?} -> {to:?}: {out:?}");
        }
    }

    /// One-row cases with Pillow 13.0's own output (`Image.fromarray(a).resize((w, 1),
    /// Image.BICUBIC)`): a step halved, and a bump shrunk by 2/3 (negative lobes clamp to 0).
    #[test]
    fn one_row_cases_match_pillow() {
        let rgb = |v: &[u8]| -> Vec<u8> { v.iter().flat_map(|&x| [x; 3]).collect() };
        let out = pil_bicubic(&rgb(&[0, 0, 255, 255]), (4, 1), (2, 1)).unwrap();
        assert_eq!(out, rgb(&[21, 234]));
        let out = pil_bicubic(&rgb(&[0, 0, 255, 255, 255, 0]), (6, 1), (4, 1)).unwrap();
        assert_eq!(out, rgb(&[0, 170, 255, 88]));
        assert!((bicubic(0.25) - 0.8671875).abs() < 1e-12);
        assert!((bicubic(1.25) + 0.0703125).abs() < 1e-12);
    }

    /// Pillow 13.0's order of the two passes, on grey images whose result depends on it
    /// (outputs of `Image.fromarray(a).resize((w, h), Image.BICUBIC)`): a 3x7 image shrunk to
    /// 2x3 (height by 4 pixels, more than twice the width's 1) and a 2x6 image to 3x3 (width
    /// grows): columns first. Rows first would give 187 at (0, 0) in the first and
    /// `[197, 131, 63], [57, 52, 48]` in the last two rows of the second.
    #[test]
    fn columns_go_first_when_the_height_shrinks_more() {
        let rgb = |v: &[u8]| -> Vec<u8> { v.iter().flat_map(|&x| [x; 3]).collect() };
        let tall = [
            95, 217, 15, 215, 248, 69, 205, 61, 29, 19, 59, 81, 120, 208, 64, 89, 127, 128, 76,
            154, 95,
        ];
        let out = pil_bicubic(&rgb(&tall), (3, 7), (2, 3)).unwrap();
        assert_eq!(out, rgb(&[186, 96, 107, 79, 113, 126]));
        let narrow = [95, 217, 15, 215, 248, 69, 205, 61, 29, 19, 59, 81];
        let out = pil_bicubic(&rgb(&narrow), (2, 6), (3, 3)).unwrap();
        assert_eq!(out, rgb(&[64, 140, 215, 199, 131, 63, 56, 53, 49]));
    }
}
