//! The trainer on a diffusers SD3 folder (the tiny fixture): rollouts through CLIP-L, CLIP-G,
//! T5, the MMDiT and the VAE, then LoRA updates, with live encoders and with an embedding cache
//! standing in for them.

use crate::common;

use std::path::{Path, PathBuf};

use tpgrpo::backend::{Backend as B, TrainBackend};
use tpgrpo::model::{Adaptable, MMDiT};
use tpgrpo::pipeline::{EmbeddingCache, Sd3Conditioner};
use tpgrpo::toy;
use tpgrpo::train::Silent;
use tpgrpo::train::{Task, TrainConfig, Trainer};

fn folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pipeline/sd3_tiny")
}

fn config() -> TrainConfig {
    let sets: Vec<String> = common::TINY_SD3_SETTINGS.map(String::from).into();
    TrainConfig::new().with_sources(None, &sets).unwrap()
}

fn run(conditioner: Sd3Conditioner<B>, name: &str) -> Vec<(String, Vec<f32>)> {
    let device = common::device();
    let transformer = MMDiT::<TrainBackend>::load(folder(), &device).unwrap();
    let out = common::scratch(name);
    let mut t = Trainer::new(
        config(),
        transformer,
        Task {
            pipeline: conditioner,
            reward: Box::new(common::Brightness),
            train_prompts: toy::prompts(toy::Split::Train),
            eval_prompts: toy::prompts(toy::Split::Eval),
            report: None,
        },
        &out,
    )
    .unwrap();
    let history = t.train(&mut Silent).unwrap();
    assert_eq!(history.last().unwrap().optimizer_steps, 2, "one step per epoch");
    assert!(history[1].reward_std > 0.0);
    assert!(out.join("samples/epoch-00002.png").is_file());
    assert!(out.join("checkpoints/epoch-00002/adapter/adapter_model.safetensors").is_file());
    t.model()
        .lora_tensors()
        .into_iter()
        .map(|(n, x)| (n, x.inner().into_data().to_vec().unwrap()))
        .collect()
}

#[test]
fn trains_a_diffusers_folder_with_live_encoders_and_with_a_cache() {
    let device = common::device();
    let live = Sd3Conditioner::<B>::load(folder(), 16, [16, 8, 8], &device).unwrap();
    let trained = run(live, "sd3-live");
    let moved = trained
        .iter()
        .filter(|(n, _)| n.ends_with("lora_B"))
        .any(|(_, v)| v.iter().any(|&x| x != 0.0));
    assert!(moved, "B factors start at 0 and must have moved");

    // The same run with every prompt served from an embedding cache and no encoders loaded
    // gives the same adapters bit for bit: the cache holds the encoders' exact outputs, and a
    // row of a batched encoder pass does not depend on the other rows on any CPU (each matmul
    // output is summed over K in one order whatever the batch size; softmax and norms are per
    // row), so both runs compute the same. A tolerance would not help: after AdamW a 1-ulp
    // difference in an embedding can move an adapter by up to the learning rate.
    let mut cached = Sd3Conditioner::<B>::load(folder(), 16, [16, 8, 8], &device).unwrap();
    let encoders = cached.encoders.take().unwrap();
    let prompts: Vec<String> = toy::prompts(toy::Split::Train)
        .into_iter()
        .chain(toy::prompts(toy::Split::Eval))
        .map(|p| p.text)
        .collect();
    let texts: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let path = common::scratch("sd3-cache-file").join("cache.safetensors");
    cached.cache = Some(EmbeddingCache::build(&encoders, &texts, 64, &path, &device).unwrap());
    drop(encoders);
    let from_cache = run(cached, "sd3-cached");
    for ((n, a), (_, b)) in trained.iter().zip(&from_cache) {
        let diff = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert_eq!(diff, 0.0, "{n}: cached run differs by {diff}");
    }
}
