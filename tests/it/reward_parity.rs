//! PickScore, CLIPScore and the aesthetic MLP against transformers (float64 towers, the PIL
//! `CLIPImageProcessorPil`), on the fixture written by `tests/fixtures/gen_reward.py`, or on
//! the folder `$TPGRPO_REWARD_FIXTURES` names.

use crate::common;

use std::path::PathBuf;

use burn::prelude::*;
use tpgrpo::backend::Backend as B;
use tpgrpo::image::load_png;
use tpgrpo::model::clip::{ClipImageProcessor, ResizeTo};
use tpgrpo::prompts::Prompt;
use tpgrpo::reward::{score_checked, Aesthetic, ClipSimilarity};
use tpgrpo::weights::WeightFiles;

/// Absolute tolerance on every score (scores are of order 0.1-1; the aesthetic's of order 10).
const SCORE_TOLERANCE: f64 = 5e-4;

fn fixtures() -> PathBuf {
    std::env::var_os("TPGRPO_REWARD_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/reward"))
}

struct Case {
    image: String,
    prompt: String,
    expected: serde_json::Value,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(fixtures().join("cases.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            image: c["image"].as_str().unwrap().to_string(),
            prompt: c["prompt"].as_str().unwrap().to_string(),
            expected: c.clone(),
        })
        .collect()
}

/// Scores every case one image at a time (the images differ in size) and compares `key`.
fn check(reward: &dyn tpgrpo::reward::Reward, key: &str) {
    let mut worst = 0f64;
    for case in cases() {
        let image = load_png(&fixtures().join("images").join(&case.image)).unwrap();
        let prompt = Prompt { text: case.prompt.clone(), metadata: serde_json::Value::Null };
        let got = score_checked(reward, &[image], &[prompt]).unwrap()[0];
        let want = case.expected[key].as_f64().unwrap();
        println!("{key} {}: {got:.6} vs {want:.6}", case.image);
        worst = worst.max((got - want).abs());
    }
    println!("{key}: max |diff| {worst:.2e}");
    assert!(worst < SCORE_TOLERANCE, "{key}: max |diff| {worst} >= {SCORE_TOLERANCE}");
}

#[test]
fn pickscore_matches_transformers() {
    let reward = ClipSimilarity::<B>::pickscore(fixtures().join("pickscore"), &common::device());
    check(&reward.unwrap(), "pickscore");
}

#[test]
fn clipscore_matches_transformers() {
    let reward = ClipSimilarity::<B>::clip_score(fixtures().join("clip"), &common::device());
    check(&reward.unwrap(), "clipscore");
}

#[test]
fn aesthetic_matches_the_reference_mlp() {
    let f = fixtures();
    let reward =
        Aesthetic::<B>::load(f.join("clip/aesthetic.pth"), f.join("clip"), &common::device());
    check(&reward.unwrap(), "aesthetic");
}

/// Both `preprocessor_config.json` forms read to the same steps, and the pixels of every
/// fixture image equal transformers' PIL processor (Pillow 13): the resize reproduces Pillow's
/// fixed-point bicubic and its order of passes exactly, so
/// the only differences left are float rounding of rescale and normalise (none expected: the
/// same f64 then f32 operations).
#[test]
fn preprocessing_matches_the_pil_processor() {
    let f = fixtures();
    let old = ClipImageProcessor::load(f.join("clip/preprocessor_config.json")).unwrap();
    let new = ClipImageProcessor::load(f.join("pickscore/preprocessor_config.json")).unwrap();
    assert_eq!(old, new);
    assert_eq!(new.resize, Some(ResizeTo::ShortestEdge(32)));
    assert_eq!(new.crop, Some((32, 32)));
    let expected = WeightFiles::open(f.join("pixel_values.safetensors")).unwrap();
    let names: Vec<String> = expected.keys().map(str::to_string).collect();
    // The scored cases and the pixel-only images (tall and wide, either resize order).
    assert!(cases().iter().all(|c| names.contains(&c.image)));
    assert!(names.len() >= cases().len() + 9, "{names:?}");
    let mut worst = 0f32;
    for name in &names {
        let image = load_png(&f.join("images").join(name)).unwrap();
        let got = new.process_one(&image).unwrap();
        let want = expected.read_f32(name).unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        println!("{name}: max |diff| {diff:.2e}");
        worst = worst.max(diff);
    }
    assert!(worst <= 1e-6, "pixel values differ from PIL's by up to {worst}");
}

/// transformers' output size rule, worked by hand: short side to 224, long side
/// `int(224 * long / short)`.
#[test]
fn resize_sizes_follow_transformers() {
    let p = ClipImageProcessor::default();
    assert_eq!(p.resized_size(480, 640), (224, 298)); // 224 * 640 / 480 = 298.67
    assert_eq!(p.resized_size(640, 480), (298, 224));
    assert_eq!(p.resized_size(100, 100), (224, 224));
    assert_eq!(p.resized_size(37, 100), (224, 605)); // 605.4
    assert_eq!(p.output_size(37, 100), (224, 224));
}

/// A processed batch has the shape the vision tower reads, whatever the input sizes.
#[test]
fn batches_of_mixed_sizes_process_to_one_shape() {
    let p = ClipImageProcessor::load(fixtures().join("clip/preprocessor_config.json")).unwrap();
    let images: Vec<_> = cases()
        .iter()
        .map(|c| load_png(&fixtures().join("images").join(&c.image)).unwrap())
        .collect();
    let batch: Tensor<B, 4> = p.process(&images, &common::device()).unwrap();
    assert_eq!(batch.dims(), [images.len(), 3, 32, 32]);
}

/// A sliver (1 x 100000) would resize to 224 x 22.4M pixels: refused before allocating, naming
/// the sizes.
#[test]
fn slivers_are_refused_before_resizing() {
    let p = ClipImageProcessor::default();
    let sliver = tpgrpo::image::Image { width: 100_000, height: 1, pixels: vec![0.5; 300_000] };
    let err = p.process_one(&sliver).unwrap_err().to_string();
    assert!(err.contains("1x100000 image would become 224x22400000"), "{err}");
}
