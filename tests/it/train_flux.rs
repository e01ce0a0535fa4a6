//! The trainer on a diffusers FLUX folder (the tiny pipeline fixture): rollouts through CLIP-L,
//! T5, the FLUX transformer (packed latents, embedded guidance, dynamic shift) and the VAE,
//! LoRA updates on the FLUX targets, evaluation, checkpoints, and an exact resume.

use crate::common;

use std::path::{Path, PathBuf};

use tpgrpo::backend::{Backend as B, TrainBackend};
use tpgrpo::model::{Adaptable, Denoiser, Flux};
use tpgrpo::pipeline::{Family, FluxConditioner};
use tpgrpo::sampler::DynamicShift;
use tpgrpo::toy;
use tpgrpo::train::Silent;
use tpgrpo::train::{Task, TrainConfig, Trainer};

fn folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/flux/pipeline/flux_tiny")
}

/// FLUX.1-dev's settings, shrunk to a tiny run (4 steps, window 2, rank 4).
fn config(epochs: usize) -> TrainConfig {
    let mut sets: Vec<String> = common::TINY_SD3_SETTINGS.map(String::from).into();
    sets.push(format!("epochs={epochs}"));
    sets.push("save_every=1".into());
    TrainConfig::flux_dev().with_sources(None, &sets).unwrap()
}

fn trainer(config: TrainConfig, out: &Path) -> Trainer<TrainBackend, FluxConditioner<B>> {
    let device = common::device();
    let transformer = Flux::<TrainBackend>::load(folder(), &device).unwrap();
    let conditioner = FluxConditioner::<B>::load(folder(), 16, [16, 4, 6], &device).unwrap();
    let task = Task {
        pipeline: conditioner,
        reward: Box::new(common::Brightness),
        train_prompts: toy::prompts(toy::Split::Train),
        eval_prompts: toy::prompts(toy::Split::Eval),
        report: None,
    };
    Trainer::new(config, transformer, task, out).unwrap()
}

fn factors(t: &Trainer<TrainBackend, FluxConditioner<B>>) -> Vec<(String, Vec<f32>)> {
    let tensors = t.model().lora_tensors().into_iter();
    tensors.map(|(n, x)| (n, x.inner().into_data().to_vec().unwrap())).collect()
}

#[test]
fn trains_a_flux_folder_and_resumes_exactly() {
    assert_eq!(Family::of(folder()).unwrap(), Family::Flux);
    let straight = common::scratch("flux-straight");
    let mut a = trainer(config(2), &straight);
    assert!(matches!(a.model(), Denoiser::Flux(_)));
    // The FLUX targets: 12 projections in the double block, attn.to_q/k/v in both single ones.
    assert_eq!(a.model().lora_tensors().len() / 2, 12 + 2 * 3);
    let history = a.train(&mut Silent).unwrap();
    assert_eq!(history.len(), 3, "the evaluation before training plus 2 epochs");
    assert!(history[0].eval_reward.is_some() && history[2].eval_reward.is_some());
    for m in &history[1..] {
        assert!(m.reward_mean.is_finite() && m.loss.ratio_mean.is_finite(), "{m:?}");
        // 4 rollout steps plus completions from steps 0 and 1 (4 + 3). (NFE counts a guided
        // pass once either way; that FLUX makes one pass of batch B with the scale as its input
        // is `sampler::guidance`'s unit test.)
        assert_eq!(m.nfe_per_sample, 11.0, "{m:?}");
    }
    assert!(straight.join("samples/epoch-00002.png").is_file());
    let adapter = straight.join("checkpoints/epoch-00002/adapter");
    assert!(adapter.join("adapter_model.safetensors").is_file());
    assert!(adapter.join("pytorch_lora_weights.safetensors").is_file());
    let moved = factors(&a)
        .iter()
        .filter(|(n, _)| n.ends_with("lora_B"))
        .any(|(_, v)| v.iter().any(|&x| x != 0.0));
    assert!(moved, "B factors start at 0 and must have moved");
    // The checkpoint's adapter attaches to the base model as a PEFT folder.
    let base = Flux::<B>::load(folder(), &common::device()).unwrap();
    let (_, lora) = base.load_adapter(&adapter).unwrap();
    assert_eq!((lora.rank, lora.alpha), (4, 128.0));

    let split = common::scratch("flux-split");
    trainer(config(1), &split).train(&mut Silent).unwrap();
    let mut b = trainer(config(2), &split);
    b.resume().unwrap();
    assert_eq!(b.epoch(), 1);
    b.train(&mut Silent).unwrap();
    for ((n, x), (_, y)) in factors(&a).into_iter().zip(factors(&b)) {
        let diff = x.iter().zip(&y).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max);
        assert_eq!(diff, 0.0, "{n}: 1 + 1 epochs differ from 2 by {diff}");
    }
}

/// The schedule follows the folder's scheduler: FLUX's dynamic shift at the rollout's token
/// count.
#[test]
fn flux_settings_follow_the_references() {
    let c = TrainConfig::flux_dev();
    assert_eq!((c.rollout.num_steps, c.eval_steps, c.rollout.guidance), (6, 28, 3.5));
    assert_eq!((c.rollout.window_start, c.rollout.window_size), (0, 5));
    assert_eq!((c.lora.rank, c.lora.alpha), (64, 128.0));
    let shift =
        DynamicShift::from_scheduler_config(folder().join("scheduler/scheduler_config.json"));
    assert_eq!(shift.unwrap(), DynamicShift::new());
    // 512 px: 64x64 latents, 1024 tokens.
    let sigmas = c.rollout.schedule([16, 64, 64]).unwrap().sigmas;
    let expected = [1.0, 0.90373558, 0.78970480, 0.65248942, 0.48421842, 0.27300331, 0.0];
    assert!(sigmas.iter().zip(expected).all(|(a, b)| (a - b).abs() < 1e-6), "{sigmas:?}");
}
