//! The embedded toy task's parts: prompts, renderer, scorer (checked on hand-built scenes),
//! alignment and the text encoder.

use super::alignment::alignment;
use super::draw::{layout, paint, Placed};
use super::prompt::{all_scenes, Color, Include, Relation, Shape};
use super::scorer::{detect, score_scene, Checks, COLOR_ONLY_CREDIT};
use super::text::tokenize;
use super::{prompts, render, Scene, Split, ToyScorer};
use crate::image::Image;
use crate::prompts::Prompt;
use crate::reward::{score_checked, Reward};

fn obj(shape: Shape, color: Color, x: usize, y: usize, side: usize) -> Placed {
    Placed { shape, rgb: color.rgb(), x, y, side }
}

fn scene(include: Vec<Include>) -> Scene {
    Scene { tag: "test".into(), include }
}

fn group(color: Color, class: Shape, count: usize) -> Include {
    Include { class, color, count, position: None }
}

#[test]
fn prompt_texts_and_splits() {
    let scenes = all_scenes();
    assert_eq!(scenes.len(), 36 + 66 + 264);
    let texts: Vec<String> = scenes.iter().map(Scene::text).collect();
    assert!(texts.contains(&"two red circles".to_string()));
    assert!(texts.contains(&"a red circle and a blue square".to_string()));
    // GenEval order: the anchor is listed first, the placed object (with `position`) second.
    assert!(texts.contains(&"a blue square above a red circle".to_string()));
    let unique: std::collections::BTreeSet<&String> = texts.iter().collect();
    assert_eq!(unique.len(), texts.len(), "every scene has its own prompt");
    let (train, eval) = (prompts(Split::Train), prompts(Split::Eval));
    assert_eq!(train.len() + eval.len(), scenes.len());
    assert!(eval.iter().all(|p| !train.contains(p)));
    for p in train.iter().chain(&eval) {
        assert_eq!(&Scene::from_prompt(p).unwrap().text(), &p.text);
        assert!(tokenize(&p.text).is_ok(), "{}", p.text);
    }
}

#[test]
fn hand_placed_shapes_are_detected() {
    let image = paint(&[
        obj(Shape::Square, Color::Red, 2, 2, 9),
        obj(Shape::Circle, Color::Blue, 18, 3, 10),
        obj(Shape::Triangle, Color::Yellow, 10, 20, 11),
    ]);
    let mut found = detect(&image);
    found.sort_by(|a, b| a.cy.total_cmp(&b.cy).then(a.cx.total_cmp(&b.cx)));
    let summary: Vec<(Color, Shape)> = found.iter().map(|d| (d.color, d.shape)).collect();
    assert_eq!(
        summary,
        vec![
            (Color::Red, Shape::Square),
            (Color::Blue, Shape::Circle),
            (Color::Yellow, Shape::Triangle)
        ]
    );
    assert_eq!(found[0].area, 81);
    assert!((found[0].cx - 6.5).abs() < 1e-6 && (found[0].cy - 6.5).abs() < 1e-6);
}

#[test]
fn rendered_scenes_score_one() {
    for (i, s) in all_scenes().iter().enumerate() {
        for seed in 0..3 {
            let found = detect(&render(s, seed * 1000 + i as u64));
            assert_eq!(score_scene(s, &found), 1.0, "{} (seed {seed})", s.text());
            let c = Checks::of(s, &found);
            for (passed, made) in [c.colors, c.counts, c.shapes, c.relations] {
                assert_eq!(passed, made, "{} (seed {seed}): {c:?}", s.text());
            }
        }
    }
}

#[test]
fn partial_credit_by_hand() {
    let red_circle = obj(Shape::Circle, Color::Red, 2, 2, 10);
    let red_circle2 = obj(Shape::Circle, Color::Red, 18, 2, 10);
    let red_square = obj(Shape::Square, Color::Red, 2, 18, 9);
    let blue_square = obj(Shape::Square, Color::Blue, 18, 18, 9);
    let two_red_circles = scene(vec![group(Color::Red, Shape::Circle, 2)]);
    // Counting: 1 of 2 -> 1 - 1/2; 3 of 2 -> 1 - 1/2; none but a red square -> colour credit.
    let score = |s: &Scene, objs: &[Placed]| score_scene(s, &detect(&paint(objs)));
    assert_eq!(score(&two_red_circles, &[red_circle]), 0.5);
    assert_eq!(score(&two_red_circles, &[red_circle, red_circle2]), 1.0);
    let three = [red_circle, red_circle2, obj(Shape::Circle, Color::Red, 2, 18, 10)];
    assert_eq!(score(&two_red_circles, &three), 0.5);
    assert_eq!(score(&two_red_circles, &[red_square]), COLOR_ONLY_CREDIT);
    assert_eq!(score(&two_red_circles, &[blue_square]), 0.0);
    // Position: "a blue square above a red circle" = [red circle, blue square above #0].
    let above =
        Include { position: Some((Relation::Above, 0)), ..group(Color::Blue, Shape::Square, 1) };
    let pos = scene(vec![group(Color::Red, Shape::Circle, 1), above]);
    let low_blue = obj(Shape::Square, Color::Blue, 2, 20, 9);
    let high_blue = obj(Shape::Square, Color::Blue, 20, 1, 9);
    let low_red = obj(Shape::Circle, Color::Red, 20, 20, 10);
    assert_eq!(score(&pos, &[low_red, high_blue]), 1.0);
    assert_eq!(score(&pos, &[red_circle, low_blue]), 2.0 / 3.0);
    assert_eq!(score(&pos, &[red_circle]), 1.0 / 3.0);
}

#[test]
fn checks_by_hand() {
    let checks = |s: &Scene, objs: &[Placed]| Checks::of(s, &detect(&paint(objs)));
    let red_circle = obj(Shape::Circle, Color::Red, 2, 2, 10);
    let red_square = obj(Shape::Square, Color::Red, 18, 2, 9);
    let small_red_circle = obj(Shape::Circle, Color::Red, 2, 18, 8);
    let two_red_circles = scene(vec![group(Color::Red, Shape::Circle, 2)]);
    // Two red objects, the two largest a square (81 px) and a circle (80 px).
    let two = checks(&two_red_circles, &[red_circle, red_square]);
    assert_eq!(two, Checks { colors: (1, 1), counts: (1, 1), shapes: (1, 2), relations: (0, 0) });
    // Three red objects: count fails, only the two largest are shape-checked.
    let three = checks(&two_red_circles, &[red_circle, red_square, small_red_circle]);
    assert_eq!(three.counts, (0, 1));
    assert_eq!(three.shapes, (1, 2));
    // "a blue square above a red circle" with the blue square below: relation fails; no blue
    // object at all: colour, count and relation fail, nothing to shape-check for blue.
    let above =
        Include { position: Some((Relation::Above, 0)), ..group(Color::Blue, Shape::Square, 1) };
    let pos = scene(vec![group(Color::Red, Shape::Circle, 1), above]);
    let low_blue = obj(Shape::Square, Color::Blue, 2, 20, 9);
    let wrong = checks(&pos, &[red_circle, low_blue]);
    assert_eq!(wrong, Checks { colors: (2, 2), counts: (2, 2), shapes: (2, 2), relations: (0, 1) });
    let missing = checks(&pos, &[red_circle]);
    assert_eq!(
        missing,
        Checks { colors: (1, 2), counts: (1, 2), shapes: (1, 1), relations: (0, 1) }
    );
    let sum = wrong + missing;
    assert_eq!(sum.colors, (3, 4));
    assert_eq!(sum.relations, (0, 2));
}

#[test]
fn layouts_respect_relations_and_do_not_overlap() {
    for s in all_scenes().iter().filter(|s| s.tag == "position").take(40) {
        let objs = layout(s, 7);
        assert_eq!(objs.len(), 2);
        let (a, b) = (objs[0], objs[1]);
        let (ac, bc) = (a.y as f32 + a.side as f32 / 2.0, b.y as f32 + b.side as f32 / 2.0);
        let (ax, bx) = (a.x as f32 + a.side as f32 / 2.0, b.x as f32 + b.side as f32 / 2.0);
        match s.include[1].position.unwrap().0 {
            Relation::Above => assert!(bc < ac),
            Relation::Below => assert!(bc > ac),
            Relation::LeftOf => assert!(bx < ax),
            Relation::RightOf => assert!(bx > ax),
        }
    }
}

#[test]
fn scorer_errors_and_non_finite_scores() {
    let bad = Prompt { text: "two red circles".into(), metadata: serde_json::json!({"x": 1}) };
    let img = Image { width: 32, height: 32, pixels: vec![0.0; 32 * 32 * 3] };
    let err = ToyScorer.score(std::slice::from_ref(&img), &[bad]).unwrap_err().to_string();
    assert!(err.contains("metadata") && err.contains("two red circles"), "{err}");
    // A position naming a group that is not an earlier one (it used to index out of bounds
    // and panic, in both rewards; issue 39, item 6).
    for anchor in [5, 1] {
        let metadata = serde_json::json!({"tag": "position", "include": [
            {"class": "circle", "color": "red", "count": 1},
            {"class": "square", "color": "blue", "count": 1, "position": ["above", anchor]},
        ]});
        let bad = Prompt { text: "a blue square above a red circle".into(), metadata };
        let rewards: [&dyn Reward; 2] = [&ToyScorer, &crate::toy::ToyAlignment];
        for reward in rewards {
            let err = reward.score(std::slice::from_ref(&img), std::slice::from_ref(&bad));
            let err = err.unwrap_err().to_string();
            assert!(
                err.contains("metadata.include[1].position") && err.contains("not an earlier"),
                "{anchor}: {err}"
            );
        }
    }
    struct Nan;
    impl Reward for Nan {
        fn name(&self) -> &str {
            "nan"
        }
        fn score(&self, images: &[Image], _: &[Prompt]) -> crate::Result<Vec<f64>> {
            Ok(vec![f64::NAN; images.len()])
        }
    }
    let p = prompts(Split::Train).remove(0);
    let err = score_checked(&Nan, &[img], &[p]).unwrap_err().to_string();
    assert!(err.contains("`nan`") && err.contains("NaN"), "{err}");
    assert!(tokenize("two purple circles").unwrap_err().to_string().contains("\"purple\""));
}

/// The dense alignment reward by hand: one red 10x10 square on black. Exact palette pixels
/// belong to red with weight 1 and to the other references with weights below 1e-3, so for
/// "a red square" the mass 100 lies in the renderer's range [64, 121] (score 1), and for "two
/// red squares" it is 100 of at least 128 (score 100/128).
#[test]
fn alignment_by_hand() {
    let image = paint(&[obj(Shape::Square, Color::Red, 4, 4, 10)]);
    let one = alignment(&scene(vec![group(Color::Red, Shape::Square, 1)]), &image);
    assert!((one - 1.0).abs() < 1e-3, "{one}");
    let two = alignment(&scene(vec![group(Color::Red, Shape::Square, 2)]), &image);
    assert!((two - 100.0 / 128.0).abs() < 1e-3, "{two}");
    // A position prompt: blue right of red by 14 pixels holds (sigmoid(14 - 2) ~ 1); the
    // reverse relation fails (sigmoid(-16) ~ 0), halving the score.
    let pair = paint(&[
        obj(Shape::Square, Color::Red, 2, 10, 10),
        obj(Shape::Square, Color::Blue, 16, 10, 10),
    ]);
    let placed = |rel| Include { position: Some((rel, 0)), ..group(Color::Blue, Shape::Square, 1) };
    let right = scene(vec![group(Color::Red, Shape::Square, 1), placed(Relation::RightOf)]);
    let left = scene(vec![group(Color::Red, Shape::Square, 1), placed(Relation::LeftOf)]);
    assert!((alignment(&right, &pair) - 1.0).abs() < 1e-3);
    assert!((alignment(&left, &pair) - 2.0 / 3.0).abs() < 1e-3);
}

/// Rendered scenes score about 1; degenerate pictures score low: a flood fill with a requested
/// colour, an empty (black) image, uniform noise, and the scene drawn in other colours.
#[test]
fn alignment_rewards_rendered_scenes_and_no_degenerate_picture() {
    let mut rng = crate::rng::SplitMix64(9);
    let (mut rendered, mut worst_degenerate) = (Vec::new(), 0.0f64);
    for (i, s) in all_scenes().iter().enumerate() {
        for seed in 0..2 {
            rendered.push(alignment(s, &render(s, 100 * i as u64 + seed)));
        }
        let n = 32 * 32;
        let fill = Image { width: 32, height: 32, pixels: s.include[0].color.rgb().repeat(n) };
        let empty = Image { width: 32, height: 32, pixels: vec![0.0; 3 * n] };
        let noise = Image {
            width: 32,
            height: 32,
            pixels: (0..3 * n).map(|_| rng.uniform() as f32).collect(),
        };
        let unrequested: Vec<Color> =
            Color::ALL.into_iter().filter(|c| s.include.iter().all(|g| g.color != *c)).collect();
        let mut other = s.clone();
        for (g, &c) in other.include.iter_mut().zip(unrequested.iter().cycle()) {
            g.color = c;
        }
        let wrong = render(&other, i as u64);
        for (what, image) in [("fill", fill), ("empty", empty), ("noise", noise), ("wrong", wrong)]
        {
            let score = alignment(s, &image);
            assert!(score < 0.2, "{what} image scores {score} for {:?}", s.text());
            worst_degenerate = worst_degenerate.max(score);
        }
    }
    let mean = rendered.iter().sum::<f64>() / rendered.len() as f64;
    let min = rendered.iter().copied().fold(f64::INFINITY, f64::min);
    eprintln!("rendered: mean {mean:.4}, min {min:.4}; degenerate: max {worst_degenerate:.4}");
    assert!(mean > 0.97 && min > 0.9, "rendered scenes: mean {mean}, min {min}");
}
