//! Line charts as PNG (plotters, with a font shipped in the crate so that they render the same
//! on a machine without fonts): a title, named axes with units, a legend, and one meaning per
//! colour in every chart — the objective ([`objective_color`]); the split is the line style.

use std::path::Path;
use std::sync::OnceLock;

use image::RgbImage;
use plotters::prelude::*;
use plotters::style::FontStyle;

use super::metrics::EpochMetrics;
use crate::error::{Error, Result};
use crate::image::{compose_grid, encode_png, write_png, write_png_bytes, Image};

/// DejaVu Sans cut to the characters the charts draw (`assets/fonts/`).
const FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans-subset.ttf");
/// The family name the charts ask plotters for.
const FAMILY: &str = "sans-serif";
/// Chart size in pixels.
const SIZE: (u32, u32) = (900, 540);

/// The colour of an objective in every chart: TP-GRPO blue, Flow-GRPO orange, anything else
/// grey (Okabe-Ito colours, told apart with every kind of colour blindness).
pub fn objective_color(objective: &str) -> [u8; 3] {
    match objective {
        "tp-grpo" => [0, 114, 178],
        "flow-grpo" => [230, 159, 0],
        _ => [110, 110, 110],
    }
}

/// The display name of an objective (`tp-grpo` -> `TP-GRPO`).
pub fn objective_label(objective: &str) -> String {
    match objective {
        "tp-grpo" => "TP-GRPO".into(),
        "flow-grpo" => "Flow-GRPO".into(),
        other => other.into(),
    }
}

/// One curve of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// The legend's text (empty: not in the legend).
    pub label: String,
    /// Line colour ([`objective_color`] of the curve's objective).
    pub color: [u8; 3],
    /// Dashed (training reward) or solid (held-out reward) line.
    pub dashed: bool,
    /// Points in data coordinates, in x order.
    pub points: Vec<(f64, f64)>,
}

/// A line chart: its title, axis names (with units) and curves.
#[derive(Debug, Clone)]
pub struct Chart {
    /// Title above the plot.
    pub title: String,
    /// Name of the x axis, with its unit.
    pub x_label: String,
    /// Name of the y axis, with its unit.
    pub y_label: String,
    /// The curves, each in the legend.
    pub series: Vec<Series>,
}

/// Registers the shipped font once (plotters keeps a process-wide font table).
fn font() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED
        .get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    match ok {
        true => Ok(()),
        false => Err(Error::Image { what: "chart font".into(), message: "invalid font".into() }),
    }
}

/// The data range of `values` padded by 8% (and at least `min_pad`) on both sides; `0..1`
/// when there are none.
fn padded(values: impl Iterator<Item = f64>, min_pad: f64) -> std::ops::Range<f64> {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    let pad = ((hi - lo) * 0.08).max(min_pad);
    lo - pad..hi + pad
}

/// Writes `chart` as a PNG (atomically).
pub fn save_chart(path: &Path, chart: &Chart) -> Result<()> {
    font()?;
    let (w, h) = SIZE;
    let mut pixels = vec![255u8; (w * h * 3) as usize];
    let failed = |e: String| Error::Image { what: path.display().to_string(), message: e };
    draw(&mut pixels, chart).map_err(|e| failed(e.to_string()))?;
    let img = RgbImage::from_raw(w, h, pixels).expect("buffer of the chart's size");
    write_png(&img, path)
}

/// Draws `chart` into an RGB buffer of [`SIZE`].
fn draw(pixels: &mut [u8], chart: &Chart) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::with_buffer(pixels, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let points = || chart.series.iter().flat_map(|s| s.points.iter());
    let x = padded(points().map(|p| p.0), 0.5);
    let y = padded(points().map(|p| p.1), 1e-3);
    let mut plot = ChartBuilder::on(&root)
        .caption(&chart.title, (FAMILY, 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x, y)?;
    plot.configure_mesh()
        .x_desc(&chart.x_label)
        .y_desc(&chart.y_label)
        .axis_desc_style((FAMILY, 18))
        .label_style((FAMILY, 14))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    for s in &chart.series {
        let [r, g, b] = s.color;
        let style = RGBColor(r, g, b).stroke_width(2);
        let line = s.points.iter().copied();
        if !s.dashed {
            plot.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, style.filled())))?;
        }
        let drawn = if s.dashed {
            plot.draw_series(DashedLineSeries::new(line, 8, 5, style))?
        } else {
            plot.draw_series(LineSeries::new(line, style))?
        };
        if !s.label.is_empty() {
            let dashed = s.dashed;
            drawn.label(&s.label).legend(move |(x, y)| {
                let width = if dashed { 10 } else { 24 };
                PathElement::new(vec![(x, y), (x + width, y)], style)
            });
        }
    }
    plot.configure_series_labels()
        .label_font((FAMILY, 15))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(160, 160, 160))
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present()?;
    Ok(())
}

/// The training reward (dashed: the mean over each epoch's rollouts) and the held-out reward
/// (solid: EMA weights, ODE samples, where evaluated) of one run, in its objective's colour.
pub fn reward_series(history: &[EpochMetrics], name: &str) -> Vec<Series> {
    let objective = history.iter().map(|m| m.objective.as_str()).find(|o| !o.is_empty());
    let color = objective_color(objective.unwrap_or_default());
    let train: Vec<(f64, f64)> =
        history.iter().filter(|m| m.epoch > 0).map(|m| (m.epoch as f64, m.reward_mean)).collect();
    let eval: Vec<(f64, f64)> =
        history.iter().filter_map(|m| m.eval_reward.map(|r| (m.epoch as f64, r))).collect();
    let series = |label: &str, dashed, points| Series {
        label: format!("{name}{label}"),
        color,
        dashed,
        points,
    };
    vec![series("training reward", true, train), series("held-out reward", false, eval)]
}

/// The reward curve of a run (`reward_curve.png`): [`reward_series`] against the epoch.
pub fn save_reward_curve(path: &Path, history: &[EpochMetrics]) -> Result<()> {
    let objective = history.iter().map(|m| m.objective.as_str()).find(|o| !o.is_empty());
    let chart = Chart {
        title: format!("{}: reward per epoch", objective_label(objective.unwrap_or("run"))),
        x_label: "epoch".into(),
        y_label: "reward (mean over samples)".into(),
        series: reward_series(history, ""),
    };
    save_chart(path, &chart)
}

/// Caption lines under each grid cell: the wrapped prompt (at most this many lines) and the
/// reward.
const CAPTION_LINES: usize = 3;
/// Caption font size and line height in pixels.
const CAPTION_FONT: (u32, u32) = (12, 14);

/// `text` wrapped at spaces into lines of at most `width` characters, at most `lines` of them
/// (the last ending in `…` when the text goes on).
fn wrap(text: &str, width: usize, lines: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        let word: String = word.chars().take(width).collect();
        match out.last_mut() {
            Some(line) if line.chars().count() + 1 + word.chars().count() <= width => {
                line.push(' ');
                line.push_str(&word);
            }
            _ => out.push(word),
        }
    }
    if out.len() > lines {
        out.truncate(lines);
        let last = &mut out[lines - 1];
        while last.chars().count() + 1 > width {
            last.pop();
        }
        last.push('…');
    }
    out
}

/// Writes `images` as a grid of `cols` columns, each image scaled `scale` times with its
/// caption beneath it: the prompt (wrapped, at most three lines) and the reward, as
/// `captions` give them (one per image).
pub fn save_captioned_grid(
    path: &Path,
    images: &[Image],
    captions: &[(String, f64)],
    cols: usize,
    scale: usize,
) -> Result<()> {
    write_png_bytes(&captioned_grid_png(path, images, captions, cols, scale)?, path)
}

/// [`save_captioned_grid`]'s PNG, encoded but not written (`path` names it in errors).
pub(crate) fn captioned_grid_png(
    path: &Path,
    images: &[Image],
    captions: &[(String, f64)],
    cols: usize,
    scale: usize,
) -> Result<Vec<u8>> {
    if captions.len() != images.len() {
        return Err(Error::shape(
            "captions",
            format!("{} captions", images.len()),
            &[captions.len()],
        ));
    }
    font()?;
    let (size, line) = CAPTION_FONT;
    let below = (CAPTION_LINES + 1) * line as usize + 6;
    let (grid, layout) = compose_grid(images, cols, scale, below, 6)?;
    let (gw, gh) = grid.dimensions();
    let mut pixels = grid.into_raw();
    let (w, h) = layout.cell;
    let chars = (w * 10 / (size as usize * 6)).max(8);
    let drawn = (|| -> std::result::Result<(), Box<dyn std::error::Error>> {
        let root = BitMapBackend::with_buffer(&mut pixels, (gw, gh)).into_drawing_area();
        let style = TextStyle::from((FAMILY, size)).color(&BLACK);
        let grey = TextStyle::from((FAMILY, size)).color(&RGBColor(90, 90, 90));
        for (i, (prompt, reward)) in captions.iter().enumerate() {
            let (ox, oy) = layout.origin(i);
            let mut y = (oy + h + 4) as i32;
            for text in wrap(prompt, chars, CAPTION_LINES) {
                root.draw_text(&text, &style, (ox as i32, y))?;
                y += line as i32;
            }
            root.draw_text(&format!("reward {reward:.3}"), &grey, (ox as i32, y))?;
        }
        root.present()?;
        Ok(())
    })();
    drawn.map_err(|e| Error::Image { what: path.display().to_string(), message: e.to_string() })?;
    let img = RgbImage::from_raw(gw, gh, pixels).expect("buffer of the grid's size");
    encode_png(&img, path)
}

#[cfg(test)]
mod tests {
    use super::wrap;

    #[test]
    fn captions_wrap_at_spaces_and_end_in_an_ellipsis() {
        assert_eq!(
            wrap("a red circle above a blue square", 14, 3),
            ["a red circle", "above a blue", "square"]
        );
        assert_eq!(wrap("one two three four", 7, 2), ["one two", "three…"]);
        assert_eq!(wrap("abcdefghijkl", 5, 3), ["abcde"]);
        assert!(wrap("", 5, 3).is_empty());
    }
}
