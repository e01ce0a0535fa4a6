//! PickScore throughput on the selected backend: images per second at batch 16, 512x512 inputs
//! (resized and cropped to 224 by the processor), with a PickScore_v1-sized random `CLIPModel`
//! (LAION ViT-H/14 image tower, 986M parameters), and the preprocessing's share.
//!
//! `TPGRPO_LARGE_SD3=DIR cargo bench --bench reward [-- CALLS]`, DIR written by
//! `tests/fixtures/gen_large_sd3.py DIR pickscore`.

use std::path::PathBuf;
use std::time::Instant;

use tpgrpo::backend::{self, Backend};
use tpgrpo::image::Image;
use tpgrpo::model::clip::ClipImageProcessor;
use tpgrpo::prompts::Prompt;
use tpgrpo::reward::{ClipSimilarity, Reward};

const BATCH: usize = 16;
const SIDE: usize = 512;

/// A smooth deterministic colour field per image (the content does not change the cost).
fn images() -> Vec<Image> {
    (0..BATCH)
        .map(|i| {
            let pixels = (0..SIDE * SIDE * 3)
                .map(|j| {
                    let (p, c) = (j / 3, j % 3);
                    let (x, y) = ((p % SIDE) as f32, (p / SIDE) as f32);
                    0.5 + 0.4 * (0.01 * (i + 1 + c) as f32 * x + 0.013 * y).sin()
                })
                .collect();
            Image { width: SIDE, height: SIDE, pixels }
        })
        .collect()
}

fn main() {
    let Some(dir) = std::env::var_os("TPGRPO_LARGE_SD3").map(PathBuf::from) else {
        eprintln!("set TPGRPO_LARGE_SD3 to a folder written by tests/fixtures/gen_large_sd3.py");
        return;
    };
    let calls: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(3);
    let device = backend::init().expect("kernel cache settings");
    let folder = dir.join("pickscore");
    let t = Instant::now();
    let reward = match ClipSimilarity::<Backend>::pickscore(&folder, &device) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    println!("backend {}, load {:.1} s", backend::NAME, t.elapsed().as_secs_f64());
    let images = images();
    let prompt = Prompt { text: "a photo of a cat".into(), metadata: serde_json::Value::Null };
    let prompts = vec![prompt; BATCH];
    let processor = ClipImageProcessor::load(folder.join("preprocessor_config.json")).unwrap();
    let t = Instant::now();
    for image in &images {
        processor.process_one(image).unwrap();
    }
    let pre = t.elapsed().as_secs_f64();
    println!("preprocessing {BATCH} images {SIDE}x{SIDE} -> 224: {pre:.3} s");
    for call in 1..=calls {
        let t = Instant::now();
        let scores = reward.score(&images, &prompts).unwrap();
        let s = t.elapsed().as_secs_f64();
        println!(
            "call {call}: batch {BATCH} in {s:.2} s = {:.2} images/s (preprocessing {:.1}%), \
             score[0] {:.4}",
            BATCH as f64 / s,
            100.0 * pre / s,
            scores[0]
        );
    }
}
