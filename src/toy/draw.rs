//! Procedural rendering of toy scenes: filled circles, squares and triangles on black.

use super::prompt::{Relation, Scene, Shape};
use crate::image::Image;
use crate::rng::SplitMix64;

/// Side of the toy images in pixels.
pub const IMAGE_SIZE: usize = 32;
/// Smallest and largest object side in pixels.
pub(crate) const OBJECT_SIZE: (usize, usize) = (8, 11);
/// Minimum centre offset, in pixels, along the axis of a relation.
pub(crate) const RELATION_MARGIN: f32 = 6.0;

/// An object's placement: shape, colour and bounding box `[x0, y0, side]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Placed {
    /// The shape.
    pub shape: Shape,
    /// RGB fill.
    pub rgb: [f32; 3],
    /// Left column.
    pub x: usize,
    /// Top row.
    pub y: usize,
    /// Side of the bounding box.
    pub side: usize,
}

impl Placed {
    fn centre(&self) -> (f32, f32) {
        let h = self.side as f32 / 2.0;
        (self.x as f32 + h, self.y as f32 + h)
    }

    fn overlaps(&self, other: &Placed, gap: usize) -> bool {
        let sep_x = self.x + self.side + gap <= other.x || other.x + other.side + gap <= self.x;
        let sep_y = self.y + self.side + gap <= other.y || other.y + other.side + gap <= self.y;
        !(sep_x || sep_y)
    }

    /// Whether pixel `(px, py)` (its centre) lies inside the shape.
    pub(crate) fn covers(&self, px: usize, py: usize) -> bool {
        if px < self.x || py < self.y || px >= self.x + self.side || py >= self.y + self.side {
            return false;
        }
        let s = self.side as f32;
        let (u, v) = ((px - self.x) as f32 + 0.5, (py - self.y) as f32 + 0.5);
        match self.shape {
            Shape::Square => true,
            Shape::Circle => (u - s / 2.0).powi(2) + (v - s / 2.0).powi(2) <= (s / 2.0).powi(2),
            // Apex at the top centre, base on the bottom row.
            Shape::Triangle => (u - s / 2.0).abs() <= v / 2.0,
        }
    }
}

fn satisfies(rel: Relation, placed: &Placed, anchor: &Placed) -> bool {
    let ((px, py), (ax, ay)) = (placed.centre(), anchor.centre());
    match rel {
        Relation::Above => ay - py >= RELATION_MARGIN,
        Relation::Below => py - ay >= RELATION_MARGIN,
        Relation::LeftOf => ax - px >= RELATION_MARGIN,
        Relation::RightOf => px - ax >= RELATION_MARGIN,
    }
}

/// A random layout of `scene` (non-overlapping objects, relations honoured), drawn from `seed`.
pub(crate) fn layout(scene: &Scene, seed: u64) -> Vec<Placed> {
    let mut rng = SplitMix64(seed);
    'attempt: loop {
        let mut objects: Vec<Placed> = Vec::new();
        let mut first_of_group = Vec::new();
        for group in &scene.include {
            first_of_group.push(objects.len());
            for _ in 0..group.count {
                let mut found = false;
                for _ in 0..200 {
                    let side = rng.range(OBJECT_SIZE.0, OBJECT_SIZE.1);
                    let x = rng.range(1, IMAGE_SIZE - side - 1);
                    let y = rng.range(1, IMAGE_SIZE - side - 1);
                    let p = Placed { shape: group.class, rgb: group.color.rgb(), x, y, side };
                    let free = objects.iter().all(|o| !o.overlaps(&p, 2));
                    let placed = group
                        .position
                        .is_none_or(|(rel, i)| satisfies(rel, &p, &objects[first_of_group[i]]));
                    if free && placed {
                        objects.push(p);
                        found = true;
                        break;
                    }
                }
                if !found {
                    continue 'attempt;
                }
            }
        }
        return objects;
    }
}

/// Paints `objects` on a black `IMAGE_SIZE x IMAGE_SIZE` canvas.
pub(crate) fn paint(objects: &[Placed]) -> Image {
    let n = IMAGE_SIZE;
    let mut pixels = vec![0.0f32; n * n * 3];
    for o in objects {
        for py in o.y..o.y + o.side {
            for px in o.x..o.x + o.side {
                if o.covers(px, py) {
                    pixels[3 * (py * n + px)..3 * (py * n + px) + 3].copy_from_slice(&o.rgb);
                }
            }
        }
    }
    Image { width: n, height: n, pixels }
}

/// A random rendering of `scene`.
pub fn render(scene: &Scene, seed: u64) -> Image {
    paint(&layout(scene, seed))
}
