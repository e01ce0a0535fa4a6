//! Line charts as PNG without a plotting library, with a 3x5 digit font.

use std::path::Path;

use image::{Rgb, RgbImage};

use super::metrics::EpochMetrics;
use crate::error::Result;
use crate::image::write_png;

/// 3x5 glyphs of `0-9`, `.` and `-` (bit 2 of each row is the left column).
fn glyph(c: char) -> [u8; 5] {
    match c {
        '0' => [7, 5, 5, 5, 7],
        '1' => [2, 6, 2, 2, 7],
        '2' => [7, 1, 7, 4, 7],
        '3' => [7, 1, 7, 1, 7],
        '4' => [5, 5, 7, 1, 1],
        '5' => [7, 4, 7, 1, 7],
        '6' => [7, 4, 7, 5, 7],
        '7' => [7, 1, 1, 1, 1],
        '8' => [7, 5, 7, 5, 7],
        '9' => [7, 5, 7, 1, 7],
        '.' => [0, 0, 0, 0, 2],
        '-' => [0, 0, 7, 0, 0],
        _ => [0; 5],
    }
}

/// Sets pixel `(x, y)` when it lies inside the image.
fn put(img: &mut RgbImage, x: i64, y: i64, color: Rgb<u8>) {
    if x >= 0 && y >= 0 && (x as u32) < img.width() && (y as u32) < img.height() {
        img.put_pixel(x as u32, y as u32, color);
    }
}

fn text(img: &mut RgbImage, x: i64, y: i64, s: &str, scale: i64, color: Rgb<u8>) {
    for (k, c) in s.chars().enumerate() {
        for (row, bits) in glyph(c).iter().enumerate() {
            for col in 0..3 {
                if bits & (4 >> col) != 0 {
                    for dy in 0..scale {
                        for dx in 0..scale {
                            let px = x + (k as i64 * 4 + col) * scale + dx;
                            put(img, px, y + row as i64 * scale + dy, color);
                        }
                    }
                }
            }
        }
    }
}

fn line(img: &mut RgbImage, (x0, y0): (f64, f64), (x1, y1): (f64, f64), color: Rgb<u8>) {
    let steps = ((x1 - x0).abs().max((y1 - y0).abs()) * 2.0).ceil().max(1.0) as usize;
    for i in 0..=steps {
        let t = i as f64 / steps as f64;
        let (x, y) = (x0 + t * (x1 - x0), y0 + t * (y1 - y0));
        for (dx, dy) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
            put(img, x as i64 + dx, y as i64 + dy, color);
        }
    }
}

/// One curve of a chart: RGB colour and `(x, y)` points.
pub struct Series {
    /// Line colour.
    pub color: [u8; 3],
    /// Points in data coordinates.
    pub points: Vec<(f64, f64)>,
}

/// Writes a line chart PNG of `series` with labelled axes (x from 0, y over the data range).
pub fn save_chart(path: &Path, series: &[Series]) -> Result<()> {
    let (w, h, left, bottom, top, right) = (720i64, 420i64, 60i64, 40i64, 20i64, 20i64);
    let mut img = RgbImage::from_pixel(w as u32, h as u32, Rgb([255, 255, 255]));
    let pts = series.iter().flat_map(|s| s.points.iter());
    let x_max = pts.clone().map(|p| p.0).fold(1.0f64, f64::max);
    let (mut y_min, mut y_max) =
        pts.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.1), b.max(p.1)));
    if !y_min.is_finite() {
        (y_min, y_max) = (0.0, 1.0);
    }
    let pad = ((y_max - y_min) * 0.1).max(1e-3);
    (y_min, y_max) = (y_min - pad, y_max + pad);
    let to_px = |x: f64, y: f64| {
        let px = left as f64 + x / x_max * (w - left - right) as f64;
        let py = top as f64 + (y_max - y) / (y_max - y_min) * (h - top - bottom) as f64;
        (px, py)
    };
    let grey = Rgb([200, 200, 200]);
    let black = Rgb([0, 0, 0]);
    for i in 0..=4 {
        let y = y_min + (y_max - y_min) * i as f64 / 4.0;
        let (_, py) = to_px(0.0, y);
        line(&mut img, (left as f64, py), ((w - right) as f64, py), grey);
        text(&mut img, 4, py as i64 - 5, &format!("{y:.3}"), 2, black);
    }
    for i in 0..=4 {
        let x = x_max * i as f64 / 4.0;
        let (px, _) = to_px(x, y_min);
        line(&mut img, (px, top as f64), (px, (h - bottom) as f64), grey);
        text(&mut img, px as i64 - 6, h - bottom + 8, &format!("{x:.0}"), 2, black);
    }
    line(
        &mut img,
        (left as f64, (h - bottom) as f64),
        ((w - right) as f64, (h - bottom) as f64),
        black,
    );
    line(&mut img, (left as f64, top as f64), (left as f64, (h - bottom) as f64), black);
    for s in series {
        let color = Rgb(s.color);
        for pair in s.points.windows(2) {
            line(&mut img, to_px(pair[0].0, pair[0].1), to_px(pair[1].0, pair[1].1), color);
        }
        for &(x, y) in &s.points {
            let (px, py) = to_px(x, y);
            line(&mut img, (px - 2.0, py), (px + 2.0, py), color);
        }
    }
    write_png(&img, path)
}

/// The reward curve of a run: the training reward per epoch (blue) and the held-out reward
/// where it was evaluated (red), as `train_sd3` writes `reward_curve.png`.
pub fn save_reward_curve(path: &Path, history: &[EpochMetrics]) -> Result<()> {
    let train: Vec<(f64, f64)> =
        history.iter().filter(|m| m.epoch > 0).map(|m| (m.epoch as f64, m.reward_mean)).collect();
    let eval: Vec<(f64, f64)> =
        history.iter().filter_map(|m| m.eval_reward.map(|r| (m.epoch as f64, r))).collect();
    save_chart(
        path,
        &[
            Series { color: [70, 110, 220], points: train },
            Series { color: [220, 80, 40], points: eval },
        ],
    )
}
