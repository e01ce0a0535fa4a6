//! The toy task's prompts: counted objects, object pairs and relative positions, with
//! GenEval-style metadata (`{"tag", "include": [{"class", "color", "count", "position"}]}`).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::prompts::Prompt;

/// Object colours, with the RGB the renderer paints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Color {
    /// Red.
    Red,
    /// Green.
    Green,
    /// Blue.
    Blue,
    /// Yellow.
    Yellow,
}

/// Object shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Shape {
    /// A filled disc.
    Circle,
    /// A filled axis-aligned square.
    Square,
    /// A filled upward triangle.
    Triangle,
}

/// Relative positions between two objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Relation {
    /// Smaller y (image rows grow downwards).
    #[serde(rename = "above")]
    Above,
    /// Larger y.
    #[serde(rename = "below")]
    Below,
    /// Smaller x.
    #[serde(rename = "left of")]
    LeftOf,
    /// Larger x.
    #[serde(rename = "right of")]
    RightOf,
}

impl Color {
    /// Every colour.
    pub const ALL: [Color; 4] = [Color::Red, Color::Green, Color::Blue, Color::Yellow];

    /// The painted RGB value.
    pub fn rgb(self) -> [f32; 3] {
        match self {
            Color::Red => [0.9, 0.1, 0.1],
            Color::Green => [0.1, 0.75, 0.15],
            Color::Blue => [0.15, 0.3, 0.95],
            Color::Yellow => [0.95, 0.85, 0.1],
        }
    }

    fn word(self) -> &'static str {
        match self {
            Color::Red => "red",
            Color::Green => "green",
            Color::Blue => "blue",
            Color::Yellow => "yellow",
        }
    }
}

impl Shape {
    /// Every shape.
    pub const ALL: [Shape; 3] = [Shape::Circle, Shape::Square, Shape::Triangle];

    fn word(self, plural: bool) -> String {
        let w = match self {
            Shape::Circle => "circle",
            Shape::Square => "square",
            Shape::Triangle => "triangle",
        };
        if plural {
            format!("{w}s")
        } else {
            w.to_string()
        }
    }
}

impl Relation {
    /// Every relation.
    pub const ALL: [Relation; 4] =
        [Relation::Above, Relation::Below, Relation::LeftOf, Relation::RightOf];

    fn words(self) -> &'static str {
        match self {
            Relation::Above => "above",
            Relation::Below => "below",
            Relation::LeftOf => "left of",
            Relation::RightOf => "right of",
        }
    }
}

/// One required object group: `count` objects of `color` and `class`, optionally placed
/// relative to an earlier group (`position = (relation, index)`: this group is `relation` the
/// group `index`, as in GenEval's metadata).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Include {
    /// The shape.
    pub class: Shape,
    /// The colour.
    pub color: Color,
    /// How many.
    pub count: usize,
    /// Placement relative to an earlier group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<(Relation, usize)>,
}

/// A prompt's requirements (the metadata the scorer reads).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scene {
    /// `counting`, `two_object` or `position`.
    pub tag: String,
    /// The required object groups.
    pub include: Vec<Include>,
}

const NUMBERS: [&str; 4] = ["", "a", "two", "three"];

impl Scene {
    /// The prompt text (`"two red circles"`, `"a red circle and a blue square"`,
    /// `"a red circle above a blue square"`).
    pub fn text(&self) -> String {
        let phrase = |g: &Include| {
            format!("{} {} {}", NUMBERS[g.count], g.color.word(), g.class.word(g.count > 1))
        };
        match self.include.as_slice() {
            [one] => phrase(one),
            [a, b] => match b.position {
                // "B rel A": GenEval lists the anchor first and the placed object second.
                Some((rel, 0)) => format!("{} {} {}", phrase(b), rel.words(), phrase(a)),
                _ => format!("{} and {}", phrase(a), phrase(b)),
            },
            _ => String::new(),
        }
    }

    /// The prompt with this scene as metadata.
    pub fn prompt(&self) -> Prompt {
        Prompt {
            text: self.text(),
            metadata: serde_json::to_value(self).expect("scene serialises"),
        }
    }

    /// Reads a scene from a prompt's metadata.
    pub fn from_prompt(prompt: &Prompt) -> Result<Scene> {
        let scene: Scene = serde_json::from_value(prompt.metadata.clone()).map_err(|e| {
            Error::config("metadata", format!("prompt {:?}: not a toy scene: {e}", prompt.text))
        })?;
        if scene.include.is_empty() || scene.include.iter().any(|g| g.count == 0 || g.count > 3) {
            return Err(Error::config(
                "metadata.include",
                format!("prompt {:?}: 1 to 3 objects per group expected", prompt.text),
            ));
        }
        for (i, g) in scene.include.iter().enumerate() {
            if let Some((rel, anchor)) = g.position.filter(|&(_, anchor)| anchor >= i) {
                return Err(Error::config(
                    format!("metadata.include[{i}].position"),
                    format!(
                        "prompt {:?}: [{:?}, {anchor}] names group {anchor}, not an earlier \
                         group (0..{i})",
                        prompt.text,
                        rel.words()
                    ),
                ));
            }
        }
        Ok(scene)
    }
}

fn single(color: Color, class: Shape, count: usize) -> Include {
    Include { class, color, count, position: None }
}

/// Every toy scene: 36 counting, 66 two-object and 264 position scenes, in a fixed order.
pub(crate) fn all_scenes() -> Vec<Scene> {
    let objects: Vec<(Color, Shape)> =
        Color::ALL.iter().flat_map(|&c| Shape::ALL.iter().map(move |&s| (c, s))).collect();
    let mut scenes = Vec::new();
    for &(c, s) in &objects {
        for count in 1..=3 {
            scenes.push(Scene { tag: "counting".into(), include: vec![single(c, s, count)] });
        }
    }
    for (i, &(c1, s1)) in objects.iter().enumerate() {
        for &(c2, s2) in &objects[i + 1..] {
            scenes.push(Scene {
                tag: "two_object".into(),
                include: vec![single(c1, s1, 1), single(c2, s2, 1)],
            });
        }
    }
    for (i, &(c1, s1)) in objects.iter().enumerate() {
        for &(c2, s2) in &objects[i + 1..] {
            for rel in Relation::ALL {
                let placed = Include { position: Some((rel, 0)), ..single(c2, s2, 1) };
                scenes.push(Scene {
                    tag: "position".into(),
                    include: vec![single(c1, s1, 1), placed],
                });
            }
        }
    }
    scenes
}

/// Which split a scene belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Prompts used for pre-training and RL.
    Train,
    /// Held-out prompts, only evaluated (every fifth scene).
    Eval,
}

/// The prompts of `split` (every fifth scene of the task's grammar is held out).
pub fn prompts(split: Split) -> Vec<Prompt> {
    all_scenes()
        .iter()
        .enumerate()
        .filter(|(i, _)| (i % 5 == 2) == (split == Split::Eval))
        .map(|(_, s)| s.prompt())
        .collect()
}
