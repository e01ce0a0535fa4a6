//! The embedded task's default reward: a dense prompt-alignment score that varies smoothly
//! with the pixels (the rule-based [`super::ToyScorer`] counts connected components, so most
//! pixel changes leave it flat).
//!
//! Every pixel `p` belongs softly to each palette colour and to the black background,
//! `w_k(p) = exp(-|p - k|^2 / (2 tau^2))` ([`COLOR_WIDTH`] = tau, RGB distance). With
//! `m_c = sum_p w_c(p)` the mass of colour `c`, `b` the background's and `N` the pixel count:
//!
//! ```text
//! amount_c   = 1 if lo_c <= m_c <= hi_c, m_c / lo_c below, hi_c / m_c above
//! order_r    = sigmoid(d_r - 2)      d_r: signed offset (pixels) of the two groups' colour
//!                                    centroids along the relation's axis, 0 if a mass is < 1
//! clutter    = max(0, N - b - sum over requested colours of min(m_c, hi_c))
//! purity     = 1 / (1 + clutter / A)  A: the mean area of one object
//! score      = purity * mean(amount_c over requested colours, order_r over relations)
//! ```
//!
//! `[lo_c, hi_c]` is the range of areas the renderer gives the prompt's objects of colour `c`
//! (sides 8 to 11 pixels), so rendered scenes score about 1; a relation between two groups of
//! one colour has no colour centroids to compare and is not scored. Areas and offsets are in
//! pixels of a 32x32 image, scaled to the image's size. Flood fills, empty and noise images
//! and wrong colours score low (`tests/it/toy_task.rs`).

use super::draw::{Placed, IMAGE_SIZE, OBJECT_SIZE};
use super::prompt::{Color, Relation, Scene, Shape};
use crate::error::Result;
use crate::image::Image;
use crate::prompts::Prompt;
use crate::reward::Reward;

/// Width `tau` of a colour's soft membership, in RGB distance (palette colours and black are
/// at least 0.75 apart).
pub(crate) const COLOR_WIDTH: f32 = 0.2;

/// Pixels of one object of `shape` with bounding-box side `side`, as the renderer draws it.
pub(crate) fn object_area(shape: Shape, side: usize) -> f64 {
    let placed = Placed { shape, rgb: [0.0; 3], x: 0, y: 0, side };
    let pixels = (0..side).flat_map(|y| (0..side).map(move |x| (x, y)));
    pixels.filter(|&(x, y)| placed.covers(x, y)).count() as f64
}

/// Soft masses and mass centroids of the palette colours, and the background mass.
struct Masses {
    mass: [f64; 4],
    cx: [f64; 4],
    cy: [f64; 4],
    background: f64,
}

fn index(color: Color) -> usize {
    Color::ALL.iter().position(|&c| c == color).expect("a palette colour")
}

fn masses(image: &Image) -> Masses {
    let mut m = Masses { mass: [0.0; 4], cx: [0.0; 4], cy: [0.0; 4], background: 0.0 };
    let weight = |p: [f32; 3], k: [f32; 3]| {
        let d2: f32 = (0..3).map(|i| (p[i] - k[i]).powi(2)).sum();
        (-d2 / (2.0 * COLOR_WIDTH * COLOR_WIDTH)).exp() as f64
    };
    for y in 0..image.height {
        for x in 0..image.width {
            let p = image.rgb(x, y);
            m.background += weight(p, [0.0; 3]);
            for (k, color) in Color::ALL.into_iter().enumerate() {
                let w = weight(p, color.rgb());
                m.mass[k] += w;
                m.cx[k] += w * (x as f64 + 0.5);
                m.cy[k] += w * (y as f64 + 0.5);
            }
        }
    }
    for k in 0..4 {
        if m.mass[k] > 0.0 {
            m.cx[k] /= m.mass[k];
            m.cy[k] /= m.mass[k];
        }
    }
    m
}

/// `1` inside `[lo, hi]`, `m / lo` below, `hi / m` above.
fn amount(m: f64, lo: f64, hi: f64) -> f64 {
    if m < lo {
        m / lo
    } else if m > hi {
        hi / m
    } else {
        1.0
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The alignment score of `image` with `scene` (see the module doc).
pub(crate) fn alignment(scene: &Scene, image: &Image) -> f64 {
    let m = masses(image);
    let pixels = (image.width * image.height) as f64;
    // Toy pixels per image pixel, in area and along a side.
    let area_scale = pixels / (IMAGE_SIZE * IMAGE_SIZE) as f64;
    let side_scale = (area_scale).sqrt();
    let (small, large) = OBJECT_SIZE;
    let mut range = [(0.0, 0.0); 4];
    for g in &scene.include {
        let k = index(g.color);
        range[k].0 += g.count as f64 * object_area(g.class, small) * area_scale;
        range[k].1 += g.count as f64 * object_area(g.class, large) * area_scale;
    }
    let requested: Vec<usize> = (0..4).filter(|&k| range[k].1 > 0.0).collect();
    let mut terms: Vec<f64> =
        requested.iter().map(|&k| amount(m.mass[k], range[k].0, range[k].1)).collect();
    for g in &scene.include {
        let Some((rel, anchor)) = g.position else { continue };
        let (p, a) = (index(g.color), index(scene.include[anchor].color));
        if p == a {
            continue;
        }
        if m.mass[p] < 1.0 || m.mass[a] < 1.0 {
            terms.push(0.0);
            continue;
        }
        let d = match rel {
            Relation::Above => m.cy[a] - m.cy[p],
            Relation::Below => m.cy[p] - m.cy[a],
            Relation::LeftOf => m.cx[a] - m.cx[p],
            Relation::RightOf => m.cx[p] - m.cx[a],
        };
        terms.push(sigmoid(d / side_scale - 2.0));
    }
    // Colour drawn beyond what the prompt's objects can take is clutter too.
    let drawn: f64 = requested.iter().map(|&k| m.mass[k].min(range[k].1)).sum();
    let clutter = (pixels - m.background - drawn).max(0.0);
    let sides = small..=large;
    let mean_area = Shape::ALL
        .into_iter()
        .flat_map(|s| sides.clone().map(move |side| object_area(s, side)))
        .sum::<f64>()
        / (Shape::ALL.len() * sides.count()) as f64;
    let purity = 1.0 / (1.0 + clutter / (mean_area * area_scale));
    purity * terms.iter().sum::<f64>() / terms.len() as f64
}

/// The embedded task's default [`Reward`]: the alignment of each image with its prompt's
/// scene metadata.
#[derive(Debug, Clone, Copy, Default)]
pub struct ToyAlignment;

impl Reward for ToyAlignment {
    fn name(&self) -> &str {
        "toy_alignment"
    }

    /// The prompt's metadata must be a toy scene ([`Scene::from_prompt`]).
    fn check_prompt(&self, prompt: &Prompt) -> Result<()> {
        Scene::from_prompt(prompt).map(|_| ())
    }

    fn score(&self, images: &[Image], prompts: &[Prompt]) -> Result<Vec<f64>> {
        images
            .iter()
            .zip(prompts)
            .map(|(image, prompt)| Ok(alignment(&Scene::from_prompt(prompt)?, image)))
            .collect()
    }
}
