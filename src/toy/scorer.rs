//! The toy task's reward: a rule-based, GenEval-like scorer (colours, counts, shapes and
//! relative positions, with partial credit).
//!
//! Detection: each pixel (quantised to 8 bits) takes the nearest palette colour when it is
//! within [`COLOR_TOLERANCE`] of it, else it is background; 4-connected regions of one colour
//! with at least [`MIN_AREA`] pixels are objects; an object's shape follows from how much of
//! its bounding box it fills (square >= 0.9 > circle >= 0.68 > triangle).

use super::prompt::{Color, Include, Relation, Scene, Shape};
use crate::error::Result;
use crate::image::Image;
use crate::prompts::Prompt;
use crate::reward::{Report, Reward};

/// Largest Euclidean RGB distance at which a pixel counts as a palette colour.
pub(crate) const COLOR_TOLERANCE: f32 = 0.3;
/// Smallest object, in pixels.
pub(crate) const MIN_AREA: usize = 8;
/// Credit for a group when only objects of the right colour but the wrong shape are found.
pub(crate) const COLOR_ONLY_CREDIT: f64 = 0.3;

/// A detected object.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Detection {
    /// Its colour.
    pub color: Color,
    /// Its shape.
    pub shape: Shape,
    /// Pixel count.
    pub area: usize,
    /// Centroid column.
    pub cx: f32,
    /// Centroid row.
    pub cy: f32,
}

fn classify(rgb: [f32; 3]) -> Option<Color> {
    let dist = |c: [f32; 3]| ((0..3).map(|i| (rgb[i] - c[i]).powi(2)).sum::<f32>()).sqrt();
    Color::ALL
        .into_iter()
        .map(|c| (dist(c.rgb()), c))
        .filter(|(d, _)| *d < COLOR_TOLERANCE)
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

/// The objects in `image`.
pub(crate) fn detect(image: &Image) -> Vec<Detection> {
    let (w, h) = (image.width, image.height);
    let quantised = image.to_u8();
    let labels: Vec<Option<Color>> = quantised
        .chunks(3)
        .map(|p| classify([p[0] as f32 / 255.0, p[1] as f32 / 255.0, p[2] as f32 / 255.0]))
        .collect();
    let mut seen = vec![false; w * h];
    let mut out = Vec::new();
    for start in 0..w * h {
        let Some(color) = labels[start] else { continue };
        if seen[start] {
            continue;
        }
        seen[start] = true;
        let mut stack = vec![start];
        let (mut area, mut sx, mut sy) = (0usize, 0f32, 0f32);
        let (mut x0, mut x1, mut y0, mut y1) = (w, 0, h, 0);
        while let Some(i) = stack.pop() {
            let (x, y) = (i % w, i / w);
            area += 1;
            sx += x as f32 + 0.5;
            sy += y as f32 + 0.5;
            (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
            let mut visit = |j: usize| {
                if !seen[j] && labels[j] == Some(color) {
                    seen[j] = true;
                    stack.push(j);
                }
            };
            if x > 0 {
                visit(i - 1);
            }
            if x + 1 < w {
                visit(i + 1);
            }
            if y > 0 {
                visit(i - w);
            }
            if y + 1 < h {
                visit(i + w);
            }
        }
        if area < MIN_AREA {
            continue;
        }
        let fill = area as f32 / ((x1 - x0 + 1) * (y1 - y0 + 1)) as f32;
        let shape = if fill >= 0.9 {
            Shape::Square
        } else if fill >= 0.68 {
            Shape::Circle
        } else {
            Shape::Triangle
        };
        out.push(Detection { color, shape, area, cx: sx / area as f32, cy: sy / area as f32 });
    }
    out
}

/// The partial-credit score of `found` against `scene`, in `[0, 1]`: the mean over object
/// groups of `max(0, 1 - |n - count| / count)` for `n` objects of the right colour and shape
/// ([`COLOR_ONLY_CREDIT`] when only wrong-shape objects of the right colour exist, 0 when
/// none), and for each relation 1 when the largest matching objects' centroids are ordered as
/// required, else 0.
pub(crate) fn score_scene(scene: &Scene, found: &[Detection]) -> f64 {
    let mut terms = Vec::new();
    for group in &scene.include {
        let exact = matching(found, group, true).count();
        let term = if exact > 0 {
            let r = group.count as f64;
            (1.0 - (exact as f64 - r).abs() / r).max(0.0)
        } else if matching(found, group, false).next().is_some() {
            COLOR_ONLY_CREDIT
        } else {
            0.0
        };
        terms.push(term);
    }
    terms.extend(relations_held(scene, found).into_iter().map(|ok| if ok { 1.0 } else { 0.0 }));
    terms.iter().sum::<f64>() / terms.len() as f64
}

/// The objects of `group`'s colour (and shape, with `shape_too`).
fn matching<'a>(
    found: &'a [Detection],
    group: &Include,
    shape_too: bool,
) -> impl Iterator<Item = &'a Detection> + use<'a> {
    let (color, class) = (group.color, group.class);
    found.iter().filter(move |d| d.color == color && (!shape_too || d.shape == class))
}

/// For each relation of `scene`, in group order: whether the centroids of the largest objects
/// of the two groups (of the right colour and shape, else of the right colour) are ordered as
/// required.
fn relations_held(scene: &Scene, found: &[Detection]) -> Vec<bool> {
    let best = |group: &Include| {
        let exact = matching(found, group, true).max_by_key(|d| d.area);
        exact.or_else(|| matching(found, group, false).max_by_key(|d| d.area))
    };
    let mut held = Vec::new();
    for group in &scene.include {
        let Some((rel, anchor)) = group.position else { continue };
        held.push(match (best(group), best(&scene.include[anchor])) {
            (Some(p), Some(a)) => match rel {
                Relation::Above => p.cy < a.cy,
                Relation::Below => p.cy > a.cy,
                Relation::LeftOf => p.cx < a.cx,
                Relation::RightOf => p.cx > a.cx,
            },
            _ => false,
        });
    }
    held
}

/// Pass/fail checks behind a score, GenEval-style, as `(passed, made)` per kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Checks {
    /// Groups with at least one object of their colour.
    pub colors: (usize, usize),
    /// Colours with exactly as many objects (any shape) as the prompt asks of that colour.
    pub counts: (usize, usize),
    /// Of each colour's (up to) requested number of largest objects, those whose shape is
    /// among the shapes still unmatched for that colour.
    pub shapes: (usize, usize),
    /// Relations whose objects (as [`score_scene`] picks them) are ordered as required.
    pub relations: (usize, usize),
}

impl Checks {
    /// The checks of `found` against `scene`.
    pub(crate) fn of(scene: &Scene, found: &[Detection]) -> Self {
        let mut checks = Checks::default();
        let tally = |slot: &mut (usize, usize), passed: usize, made: usize| {
            slot.0 += passed;
            slot.1 += made;
        };
        for group in &scene.include {
            let any = matching(found, group, false).next().is_some();
            tally(&mut checks.colors, usize::from(any), 1);
        }
        let mut colors: Vec<Color> = Vec::new();
        for g in &scene.include {
            if !colors.contains(&g.color) {
                colors.push(g.color);
            }
        }
        for color in colors {
            let mut wanted: Vec<Shape> = Vec::new();
            for g in scene.include.iter().filter(|g| g.color == color) {
                wanted.extend(std::iter::repeat_n(g.class, g.count));
            }
            let mut objects: Vec<&Detection> = found.iter().filter(|d| d.color == color).collect();
            objects.sort_by_key(|d| std::cmp::Reverse(d.area));
            tally(&mut checks.counts, usize::from(objects.len() == wanted.len()), 1);
            objects.truncate(wanted.len());
            let made = objects.len();
            let right = objects
                .iter()
                .filter(|d| match wanted.iter().position(|&s| s == d.shape) {
                    Some(i) => {
                        wanted.swap_remove(i);
                        true
                    }
                    None => false,
                })
                .count();
            tally(&mut checks.shapes, right, made);
        }
        let held = relations_held(scene, found);
        tally(&mut checks.relations, held.iter().filter(|&&ok| ok).count(), held.len());
        checks
    }
}

impl std::ops::Add for Checks {
    type Output = Checks;

    /// The sum of two tallies.
    fn add(self, other: Checks) -> Checks {
        let sum = |a: (usize, usize), b: (usize, usize)| (a.0 + b.0, a.1 + b.1);
        Checks {
            colors: sum(self.colors, other.colors),
            counts: sum(self.counts, other.counts),
            shapes: sum(self.shapes, other.shapes),
            relations: sum(self.relations, other.relations),
        }
    }
}

/// The toy task's [`Reward`]: the rule-based score of the detected objects against the prompt's
/// scene metadata.
#[derive(Debug, Clone, Copy, Default)]
pub struct ToyScorer;

impl Reward for ToyScorer {
    fn name(&self) -> &str {
        "toy_geneval"
    }

    /// The prompt's metadata must be a toy scene ([`Scene::from_prompt`]).
    fn check_prompt(&self, prompt: &Prompt) -> Result<()> {
        Scene::from_prompt(prompt).map(|_| ())
    }

    fn score(&self, images: &[Image], prompts: &[Prompt]) -> Result<Vec<f64>> {
        images
            .iter()
            .zip(prompts)
            .map(|(image, prompt)| Ok(score_scene(&Scene::from_prompt(prompt)?, &detect(image))))
            .collect()
    }
}

/// [`ToyScorer`]'s score of each image against its prompt and the summed [`Checks`], from
/// one detection per image.
pub(crate) fn score_and_check(images: &[Image], prompts: &[Prompt]) -> Result<(Vec<f64>, Checks)> {
    let (mut scores, mut checks) = (Vec::with_capacity(images.len()), Checks::default());
    for (image, prompt) in images.iter().zip(prompts) {
        let (scene, found) = (Scene::from_prompt(prompt)?, detect(image));
        scores.push(score_scene(&scene, &found));
        checks = checks + Checks::of(&scene, &found);
    }
    Ok((scores, checks))
}

/// The toy task's evaluation [`Report`], whatever reward trains: the rule-based score
/// (`toy_geneval`, the mean [`ToyScorer`] score) and the pass rates of the checks
/// (`check_color`, `check_count`, `check_shape`, `check_relation`), from one detection per
/// image.
#[derive(Debug, Clone, Copy, Default)]
pub struct ToyChecks;

impl Report for ToyChecks {
    fn tally(&self, images: &[Image], prompts: &[Prompt]) -> Result<Vec<(String, f64, f64)>> {
        let (scores, checks) = score_and_check(images, prompts)?;
        let score: f64 = scores.iter().sum();
        let rate = |name: &str, (passed, made): (usize, usize)| {
            (name.to_string(), passed as f64, made as f64)
        };
        Ok(vec![
            ("toy_geneval".to_string(), score, images.len() as f64),
            rate("check_color", checks.colors),
            rate("check_count", checks.counts),
            rate("check_shape", checks.shapes),
            rate("check_relation", checks.relations),
        ])
    }
}
