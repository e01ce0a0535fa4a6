//! Reliability of a training run against careless input (issue 21): run folders are not
//! mixed, divergence and bad state stop the run naming what went non-finite, resume refuses
//! exactly what it cannot continue and never leaves the run folder, sizes are checked before
//! anything is allocated.

use crate::common;

use std::path::Path;

use tpgrpo::backend::{Backend as B, TrainBackend};
use tpgrpo::toy::{self, ToyPipeline, ToyScorer};
use tpgrpo::train::Silent;
use tpgrpo::train::{TrainConfig, Trainer};
use tpgrpo::weights::{save_safetensors, WeightFiles};

fn config(extra: &[&str]) -> TrainConfig {
    let mut sets: Vec<String> = [
        "epochs=1",
        "prompts_per_epoch=2",
        "group_size=2",
        "rollout_batch=4",
        "train_batch=4",
        "optimizer_steps_per_epoch=1",
        "rollout.num_steps=3",
        "rollout.window_size=1",
        "eval_every=0",
        "save_every=1",
        "seed=3",
        "objective.objective=flow-grpo",
    ]
    .map(String::from)
    .into();
    sets.extend(extra.iter().map(|s| s.to_string()));
    toy::train_config().with_sources(None, &sets).unwrap()
}

fn trainer(cfg: TrainConfig, out: &Path) -> Trainer<TrainBackend, ToyPipeline<B>> {
    // The dense reward: groups of two practically never tie, so every epoch takes a step.
    toy::trainer(cfg, toy::reward("toy-alignment").unwrap(), out, &Default::default()).unwrap()
}

/// A toy trainer scored by the rule-based scorer, or the error that refused it.
fn scorer_trainer(
    cfg: TrainConfig,
    out: &Path,
) -> tpgrpo::Result<Trainer<TrainBackend, ToyPipeline<B>>> {
    toy::trainer(cfg, Box::new(ToyScorer), out, &Default::default())
}

/// The error refusing a toy trainer of `cfg` (panics when it is built).
fn trainer_error(cfg: TrainConfig, out: &Path) -> String {
    scorer_trainer(cfg, out).err().expect("the settings are refused").to_string()
}

#[test]
fn a_fresh_run_in_another_runs_folder_is_refused_and_nothing_is_mixed() {
    let out = common::scratch("rel-folder");
    trainer(config(&[]), &out).train(&mut Silent).unwrap();
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let e = trainer(config(&["epochs=2"]), &out).train(&mut Silent).unwrap_err().to_string();
    assert!(e.contains("holds another run") && e.contains("metrics.jsonl"), "{e}");
    assert_eq!(std::fs::read_to_string(out.join("metrics.jsonl")).unwrap(), metrics);
    // The same run continues with --resume.
    let mut t = trainer(config(&["epochs=2"]), &out);
    t.resume().unwrap();
    t.train(&mut Silent).unwrap();
    assert_eq!(std::fs::read_to_string(out.join("metrics.jsonl")).unwrap().lines().count(), 2);
}

/// A reward scoring every image the same value.
struct Constant(f64);

impl tpgrpo::reward::Reward for Constant {
    fn name(&self) -> &str {
        "constant"
    }
    fn score(
        &self,
        images: &[tpgrpo::image::Image],
        _: &[tpgrpo::prompts::Prompt],
    ) -> tpgrpo::Result<Vec<f64>> {
        Ok(vec![self.0; images.len()])
    }
}

/// Finite rewards of 1e308 pass the finite check, but the epoch's mean overflows: the run
/// stops naming it (it used to write `null` into metrics.jsonl and fail the next resume),
/// and nothing of the epoch is written. Both objectives: Flow-GRPO's group mean, TP-GRPO's
/// mean of the final rewards for the metrics (its credit sees differences only, all 0).
#[test]
fn rewards_whose_sums_overflow_stop_the_run_naming_the_quantity() {
    for (objective, message) in [
        ("flow-grpo", "the mean of prompt"),
        ("tp-grpo", "the mean of the epoch's rewards overflows"),
    ] {
        let out = common::scratch(&format!("rel-huge-{objective}"));
        let cfg = config(&[&format!("objective.objective={objective}")]);
        let mut t =
            toy::trainer::<TrainBackend>(cfg, Box::new(Constant(1e308)), &out, &Default::default())
                .unwrap();
        let e = t.train(&mut Silent).unwrap_err().to_string();
        assert!(e.contains(message) && e.contains("overflows f64"), "{objective}: {e}");
        assert!(!out.join("checkpoints").exists(), "{objective}: a checkpoint was written");
        let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap_or_default();
        assert!(!metrics.contains("null"), "{objective}: {metrics}");
    }
}

#[test]
fn divergence_stops_the_run_naming_the_adapter_before_a_checkpoint_is_written() {
    let out = common::scratch("rel-diverge");
    // Flow-GRPO with these seeds has an informative sample in epoch 1, so a step is taken.
    let e = trainer(config(&["optimizer.lr=1e39"]), &out).train(&mut Silent).unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, tpgrpo::Error::NonFinite { .. }) && text.contains("after optimizer step 1"),
        "{text}"
    );
    assert!(!out.join("checkpoints").exists(), "a checkpoint was written with NaN adapters");
}

/// Rewrites `state.safetensors` of `dir` through `edit` on its `(key, shape, values)` list.
fn rewrite_state(dir: &Path, edit: impl FnOnce(&mut Vec<(String, Vec<usize>, Vec<f32>)>)) {
    rewrite_file(&dir.join("state.safetensors"), edit);
}

/// Rewrites the safetensors file `path` through `edit` on its `(key, shape, values)` list.
fn rewrite_file(path: &Path, edit: impl FnOnce(&mut Vec<(String, Vec<usize>, Vec<f32>)>)) {
    let path = path.to_path_buf();
    let files = WeightFiles::open(&path).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = files
        .keys()
        .map(|k| (k.to_string(), files.info(k).unwrap().shape.clone(), files.read_f32(k).unwrap()))
        .collect();
    drop(files);
    edit(&mut tensors);
    save_safetensors(&path, &tensors).unwrap();
}

#[test]
fn resume_validates_the_whole_state_and_names_what_is_wrong() {
    let out = common::scratch("rel-state");
    trainer(config(&[]), &out).train(&mut Silent).unwrap();
    let ckpt = out.join("checkpoints/epoch-00001");
    let saved = std::fs::read(ckpt.join("state.safetensors")).unwrap();
    let resume = || trainer(config(&["epochs=2"]), &out).resume().unwrap_err().to_string();

    rewrite_state(&ckpt, |t| t.retain(|(k, _, _)| !k.starts_with("exp_avg.")));
    let e = resume();
    assert!(e.contains("`exp_avg.") && e.contains("is missing"), "{e}");

    std::fs::write(ckpt.join("state.safetensors"), &saved).unwrap();
    rewrite_state(&ckpt, |t| {
        let moment = t.iter_mut().find(|(k, _, _)| k.starts_with("exp_avg_sq.")).unwrap();
        moment.1 = vec![moment.2.len(), 1];
    });
    let e = resume();
    assert!(e.contains("`exp_avg_sq.") && e.contains("has shape"), "{e}");

    std::fs::write(ckpt.join("state.safetensors"), &saved).unwrap();
    rewrite_state(&ckpt, |t| {
        t.iter_mut().find(|(k, _, _)| k.starts_with("ema.")).unwrap().2[0] = f32::NAN
    });
    let e = resume();
    assert!(e.contains("`ema.") && e.contains("NaN or infinite"), "{e}");
}

/// A checkpoint written before the first optimizer step (an epoch without reward signal: a
/// constant reward here, as a binary reward gives early on) resumes (issue 39, item 2): it
/// holds zero moments, which is what AdamW starts from, and one written by an earlier version
/// without any moments resumes too.
#[test]
fn a_checkpoint_written_before_any_optimizer_step_resumes() {
    let out = common::scratch("rel-no-step");
    let build = |epochs: usize| {
        let cfg = config(&[&format!("epochs={epochs}")]);
        toy::trainer::<TrainBackend>(cfg, Box::new(Constant(0.5)), &out, &Default::default())
            .unwrap()
    };
    let history = build(1).train(&mut Silent).unwrap();
    assert_eq!(history[0].optimizer_steps, 0, "{history:?}");
    let ckpt = out.join("checkpoints/epoch-00001");
    let files = WeightFiles::open(ckpt.join("state.safetensors")).unwrap();
    let moments: Vec<String> =
        files.keys().filter(|k| k.starts_with("exp_avg")).map(str::to_string).collect();
    assert_eq!(moments.len(), 2 * files.keys().filter(|k| k.starts_with("lora.")).count());
    for k in &moments {
        assert!(files.read_f32(k).unwrap().iter().all(|&v| v == 0.0), "{k}");
    }
    let saved = std::fs::read(ckpt.join("state.safetensors")).unwrap();
    rewrite_state(&ckpt, |t| t.retain(|(k, _, _)| !k.starts_with("exp_avg")));
    let mut old = build(2);
    old.resume().expect("a step-0 checkpoint without moments resumes");
    // What it resumed with, as its next checkpoint holds it: zero moments.
    let again =
        WeightFiles::open(old.save_checkpoint().unwrap().join("state.safetensors")).unwrap();
    for k in &moments {
        assert!(again.read_f32(k).unwrap().iter().all(|&v| v == 0.0), "{k}");
    }
    std::fs::write(ckpt.join("state.safetensors"), &saved).unwrap();
    let mut t = build(2);
    t.resume().unwrap();
    assert_eq!(t.epoch(), 1);
    t.train(&mut Silent).unwrap();
    assert_eq!(t.epoch(), 2);
}

#[test]
fn resume_refuses_changes_that_break_exactness_naming_each_and_allows_harmless_ones() {
    let out = common::scratch("rel-settings");
    trainer(config(&[]), &out).train(&mut Silent).unwrap();
    let e = trainer(config(&["epochs=2", "optimizer.lr=0.5", "lora.rank=4"]), &out)
        .resume()
        .unwrap_err()
        .to_string();
    assert!(e.contains("`optimizer.lr` was 0.001, now 0.5") && e.contains("`lora.rank`"), "{e}");
    assert!(!e.contains("`epochs`"), "{e}");
    let mut t = trainer(config(&["epochs=2", "save_every=2", "eval_every=5"]), &out);
    t.resume().expect("epochs, save_every and eval_every may change");
    assert_eq!(t.epoch(), 1);

    // The model and resolution are recorded; another one is refused.
    let state = out.join("checkpoints/epoch-00001/trainer_state.json");
    let text = std::fs::read_to_string(&state).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["run"]["latent_shape"] = serde_json::json!([3, 64, 64]);
    std::fs::write(&state, json.to_string()).unwrap();
    let e = trainer(config(&["epochs=2"]), &out).resume().unwrap_err().to_string();
    assert!(e.contains("another model or resolution"), "{e}");
    std::fs::write(&state, text).unwrap();
}

#[test]
fn resume_falls_back_to_the_newest_complete_checkpoint_and_never_leaves_the_run_folder() {
    let out = common::scratch("rel-latest");
    trainer(config(&["epochs=2"]), &out).train(&mut Silent).unwrap();
    let latest = out.join("checkpoints/latest");
    // A kill before `latest` was written, with a half-written later checkpoint beside.
    std::fs::remove_file(&latest).unwrap();
    std::fs::create_dir_all(out.join("checkpoints/epoch-00003")).unwrap();
    let mut t = trainer(config(&["epochs=3"]), &out);
    t.resume().unwrap();
    assert_eq!(t.epoch(), 2, "epoch-00003 has no trainer_state.json: not complete");

    for evil in ["../../outside", "/etc", "epoch-00001/../../x"] {
        std::fs::write(&latest, evil).unwrap();
        let e = trainer(config(&["epochs=3"]), &out).resume().unwrap_err().to_string();
        assert!(e.contains("not a checkpoint folder name"), "{evil}: {e}");
    }
    // Not the pointer the trainer writes (issue 39, item 8): a FIFO (a read would block
    // forever), a link to an endless device, a large file (whose content used to be echoed
    // whole in the error), a folder. Each is refused at once without reading or echoing it.
    for what in ["fifo", "device", "large", "folder"] {
        let _ = std::fs::remove_file(&latest);
        let _ = std::fs::remove_dir(&latest);
        match what {
            "fifo" => {
                let made = std::process::Command::new("mkfifo").arg(&latest).status().unwrap();
                assert!(made.success());
            }
            "device" => std::os::unix::fs::symlink("/dev/zero", &latest).unwrap(),
            "large" => std::fs::write(&latest, "x".repeat(100_000)).unwrap(),
            _ => std::fs::create_dir(&latest).unwrap(),
        }
        let e = trainer(config(&["epochs=3"]), &out).resume().unwrap_err().to_string();
        assert!(e.contains("is not the pointer this trainer writes"), "{what}: {e}");
        assert!(e.len() < 400, "{what}: {e}");
    }
}

#[test]
fn sizes_are_checked_before_anything_is_allocated_naming_the_field() {
    let e = toy::train_config()
        .with_sources(None, &["rollout.num_steps=1000000000000".to_string()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("rollout.num_steps"), "{e}");
    let dir = common::scratch("rel-sizes");
    let e = trainer_error(config(&["lora.rank=100000000"]), &dir);
    assert!(e.contains("lora.rank"), "{e}");
    let e = tpgrpo::pipeline::Sd3Pipeline::<B>::load(&dir, 0, &Default::default())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("max_sequence_length"), "{e}");
    let mmdit = tpgrpo::model::MMDiTConfig::new();
    let e = tpgrpo::pipeline::image_to_latent_size(&mmdit, 8, [1_000_000, 512]).unwrap_err();
    assert!(e.to_string().contains("position table"), "{e}");
    tpgrpo::pipeline::image_to_latent_size(&mmdit, 8, [1024, 512]).expect("within the table");
}

/// Opens `path` and reads every tensor; `Err` on the first failure.
fn read_all(path: &Path) -> tpgrpo::Result<usize> {
    let files = WeightFiles::open(path)?;
    let keys: Vec<String> = files.keys().map(str::to_string).collect();
    let mut n = 0;
    for k in &keys {
        n += files.read_f32(k)?.len();
    }
    Ok(n)
}

#[test]
fn the_safetensors_reader_never_panics_on_truncated_or_corrupted_files() {
    let dir = common::scratch("rel-fuzz");
    let path = dir.join("valid.safetensors");
    let tensors = vec![
        ("a.weight".to_string(), vec![3, 4], (0..12).map(|i| i as f32).collect()),
        ("b".to_string(), vec![5], vec![0.5; 5]),
        ("c.bias".to_string(), vec![2, 1, 2], vec![-1.0; 4]),
    ];
    save_safetensors(&path, &tensors).unwrap();
    let valid = std::fs::read(&path).unwrap();
    assert_eq!(read_all(&path).unwrap(), 21);
    let mut rng = tpgrpo::rng::SplitMix64(21);
    let bad = dir.join("bad.safetensors");
    let (mut errors, mut loads) = (0, 0);
    for case in 0..600 {
        let mut bytes = valid.clone();
        if case % 3 == 0 {
            bytes.truncate(rng.range(0, valid.len() - 1));
        } else {
            // Half the flips on the 8-byte length and the JSON header, where parsing is.
            let flips = 1 + rng.range(0, 3);
            for _ in 0..flips {
                let at = if rng.uniform() < 0.5 {
                    rng.range(0, 120)
                } else {
                    rng.range(0, valid.len() - 1)
                };
                bytes[at] ^= 1 << rng.range(0, 7);
            }
        }
        std::fs::write(&bad, &bytes).unwrap();
        match std::panic::catch_unwind(|| read_all(&bad)) {
            Ok(Ok(_)) => loads += 1,
            Ok(Err(_)) => errors += 1,
            Err(_) => panic!("case {case}: the reader panicked on {} bytes", bytes.len()),
        }
    }
    // Both outcomes occur: the cases reach the parser's error paths and its success path.
    assert!(errors > 100 && loads > 10, "{errors} errors, {loads} loads");
}

#[test]
fn oversized_transformer_configs_are_refused_naming_the_file_and_fields() {
    let dir = common::scratch("rel-config");
    let path = dir.join("config.json");
    let base = serde_json::json!({
        "sample_size": 8, "patch_size": 2, "in_channels": 4, "num_layers": 1,
        "attention_head_dim": 8, "num_attention_heads": 2, "joint_attention_dim": 12,
        "caption_projection_dim": 16, "pooled_projection_dim": 6, "out_channels": 4,
        "pos_embed_max_size": 6
    });
    let write = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut v = base.clone();
        edit(&mut v);
        std::fs::write(&path, v.to_string()).unwrap();
        tpgrpo::model::MMDiTConfig::load_json(&path)
    };
    write(&|_| {}).expect("the base configuration is valid");
    for (field, value) in [("num_layers", 1_000_000_000u64), ("pos_embed_max_size", 10_000_000)] {
        let e = write(&|v| v[field] = value.into()).unwrap_err().to_string();
        assert!(e.contains("config.json") && e.contains(field) && e.contains("parameters"), "{e}");
    }
    // A byte-order mark (some editors write one) is not an error.
    std::fs::write(&path, format!("\u{feff}{base}")).unwrap();
    tpgrpo::model::MMDiTConfig::load_json(&path).expect("BOM accepted");
    let settings = dir.join("settings.json");
    std::fs::write(&settings, "\u{feff}{\"epochs\": 3}").unwrap();
    let c = toy::train_config().with_sources(Some(&settings), &[]).expect("BOM accepted");
    assert_eq!(c.epochs, 3);
}

#[test]
fn nested_settings_are_named_by_their_dotted_path() {
    let error = |set: &str| {
        toy::train_config().with_sources(None, &[set.to_string()]).unwrap_err().to_string()
    };
    let e = error("objective.kl_beta=-1");
    assert!(e.contains("`objective.kl_beta`"), "{e}");
    let e = error("rollout.window_start=5");
    assert!(e.contains("`rollout.window_start/window_size`"), "{e}");
    let e = error("lora.rank=0");
    assert!(e.contains("`lora.rank`") && !e.contains("lora.lora"), "{e}");
}

/// NaN base weights: the evaluation before training stops, naming the evaluation latents,
/// instead of scoring NaN images (which score a finite 0).
#[test]
fn nan_base_weights_stop_the_first_evaluation() {
    let dir = common::scratch("rel-nan-eval");
    let model = dir.join("toy");
    std::fs::create_dir_all(model.join("transformer")).unwrap();
    for f in [
        "transformer/config.json",
        "transformer/diffusion_pytorch_model.safetensors",
        "text_encoder.safetensors",
    ] {
        std::fs::copy(toy::default_dir().join(f), model.join(f)).unwrap();
    }
    rewrite_file(&model.join("transformer/diffusion_pytorch_model.safetensors"), |t| {
        let proj = t.iter_mut().find(|(k, _, _)| k == "proj_out.weight").unwrap();
        proj.2[0] = f32::NAN;
    });
    let device = Default::default();
    let loaded = tpgrpo::toy::ToyModel::<TrainBackend>::load(&model, &device).unwrap();
    let pipeline =
        ToyPipeline { text_encoder: burn::module::AutodiffModule::valid(&loaded.text_encoder) };
    let task = tpgrpo::train::Task {
        pipeline,
        reward: toy::reward("toy-alignment").unwrap(),
        train_prompts: toy::prompts(toy::Split::Train),
        eval_prompts: toy::prompts(toy::Split::Eval),
        report: None,
    };
    let cfg = config(&["eval_every=1", "eval_prompts=2", "eval_steps=3"]);
    let mut t = Trainer::new(cfg, loaded.transformer, task, dir.join("run")).unwrap();
    let e = t.train(&mut Silent).unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, tpgrpo::Error::NonFinite { .. }) && text.contains("evaluation latents"),
        "{text}"
    );
}

/// Writes `config` as `dir/config.json` and loads the folder with `load` (no weights: a
/// refused configuration is reported before any weight file is looked for).
fn load_config_error<M>(
    dir: &Path,
    config: serde_json::Value,
    load: impl Fn(&Path) -> tpgrpo::Result<M>,
) -> Option<String> {
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    load(dir).err().map(|e| e.to_string())
}

/// A `config.json` case: the base file, the field changed, its value, a word the error says.
type Case = (serde_json::Value, &'static str, serde_json::Value, &'static str);

/// Loads each case's `config.json` (`base` with `field` set to `value`) and expects an error
/// naming the file and the field and containing `says`.
fn refuse_each<M, const N: usize>(
    dir: &Path,
    cases: [Case; N],
    load: impl Fn(&Path) -> tpgrpo::Result<M>,
) {
    for (base, field, value, says) in cases {
        let mut config = base;
        config[field] = value;
        let e = load_config_error(dir, config, &load).expect(field);
        assert!(e.contains("config.json") && e.contains(field) && e.contains(says), "{e}");
    }
}

/// The text encoders' and the VAE's `config.json`: sizes whose product would wrap or exceed
/// what this crate builds, and zeros that would divide by zero, are refused naming the file
/// and the fields before a module is built (each of these used to abort or panic).
#[test]
fn encoder_and_vae_configs_with_impossible_sizes_are_refused_naming_file_and_fields() {
    use tpgrpo::model::{AutoencoderKL, ClipTextModel, T5EncoderModel};
    let dir = common::scratch("rel-encoder-configs");
    let device = Default::default();
    // Complete files, as transformers and diffusers write them.
    let t5 = serde_json::json!({"vocab_size": 32, "d_model": 8, "d_kv": 4, "d_ff": 16,
        "num_layers": 2, "num_heads": 2, "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128, "layer_norm_epsilon": 1e-6,
        "feed_forward_proj": "gated-gelu"});
    let clip = serde_json::json!({"vocab_size": 32, "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 2, "num_attention_heads": 2, "projection_dim": 8,
        "max_position_embeddings": 77, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
        "eos_token_id": 2});
    let vae = serde_json::json!({"block_out_channels": [8, 16], "norm_num_groups": 4,
        "in_channels": 3, "out_channels": 3, "layers_per_block": 2, "latent_channels": 16,
        "scaling_factor": 1.5305, "shift_factor": 0.0609, "use_quant_conv": false,
        "use_post_quant_conv": false});
    let t5_cases: [Case; 3] = [
        (t5.clone(), "num_layers", 1_000_000_000u64.into(), "parameters"),
        (t5.clone(), "d_model", (1u64 << 40).into(), "parameters"),
        (t5.clone(), "num_heads", 0.into(), "num_heads"),
    ];
    refuse_each(&dir, t5_cases, |d| T5EncoderModel::<B>::load(d, &device));
    let clip_cases: [Case; 3] = [
        (clip.clone(), "intermediate_size", (1u64 << 62).into(), "parameters"),
        (clip.clone(), "max_position_embeddings", (1u64 << 60).into(), "parameters"),
        (clip.clone(), "hidden_size", 0.into(), "hidden_size"),
    ];
    refuse_each(&dir, clip_cases, |d| ClipTextModel::<B>::load(d, &device));
    let vae_cases: [Case; 4] = [
        (vae.clone(), "norm_num_groups", 0.into(), "norm_num_groups"),
        (vae.clone(), "layers_per_block", 1_000_000_000u64.into(), "parameters"),
        (vae.clone(), "block_out_channels", serde_json::json!(vec![8; 70]), "levels"),
        (vae.clone(), "latent_channels", 0.into(), "latent_channels"),
    ];
    refuse_each(&dir, vae_cases, |d| AutoencoderKL::<B>::load(d, &device));
    // The CLIP image tower's sizes, as a transformers CLIPModel's vision_config.
    let vision =
        tpgrpo::model::clip::ClipVisionConfig::new().with_image_size(1 << 31).with_patch_size(1);
    let e = vision.validate().unwrap_err().to_string();
    assert!(e.contains("image_size") && e.contains("parameters"), "{e}");
}

/// Settings whose epoch could never be held: element counts that would wrap are refused by
/// `Trainer::new`, counts beyond the device's memory by `Trainer::check_memory`, each naming
/// the settings (`group_size = 2^32` used to abort on allocation, `2^64 - 1` to wrap).
#[test]
fn epochs_that_cannot_fit_are_refused_naming_the_settings() {
    let dir = common::scratch("rel-footprint");
    let e = toy::train_config()
        .with_sources(None, &["group_size=18446744073709551615".to_string()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("prompts_per_epoch/group_size"), "{e}");
    let e = trainer_error(config(&["group_size=4294967296"]), &dir);
    assert!(e.contains("group_size") && e.contains("the epoch's states"), "{e}");
    // 2^20 samples of 4 states of 3 x 32 x 32 f32 values: 48 GiB; refused against 1 GiB.
    let t = trainer(config(&["group_size=524288"]), &dir);
    let e = t.check_memory(Some(1 << 30)).unwrap_err().to_string();
    assert!(e.contains("group_size") && e.contains("48.0 GiB") && e.contains("1.0 GiB"), "{e}");
    t.check_memory(Some(64 << 30)).expect("fits in 64 GiB");
    trainer(config(&[]), &dir).check_memory(Some(1 << 30)).expect("the test run fits");
    // 4000 samples: states 187.5 MiB; a micro-batch of all of them saves 4 blocks' inputs of
    // 64 tokens x 64 channels each, 250 MiB: refused against 200 MiB, naming train_batch.
    let t = trainer(config(&["train_batch=1000000000", "group_size=2000"]), &dir);
    let e = t.check_memory(Some(200 << 20)).unwrap_err().to_string();
    assert!(e.contains("`train_batch`") && e.contains("0.2 GiB for a training"), "{e}");
    t.check_memory(Some(256 << 20)).expect("fits in 256 MiB");
}

/// Every setting of the toy run, set to each hostile value a careless user could type: the
/// settings are refused with an error naming that setting, or they build a trainer whose
/// memory check passes or names a setting; never a panic (which `catch_unwind` would see) or
/// an allocation abort (which would end this test binary).
#[test]
fn every_setting_with_hostile_values_is_an_error_naming_it_or_a_run_never_a_panic() {
    let dir = common::scratch("rel-hostile");
    let base = serde_json::to_value(config(&[])).unwrap();
    let hostile =
        ["0", "-1", "1e300", "NaN", "18446744073709551615", "4294967296", "x", "[]", "null"];
    let memory = tpgrpo::backend::memory(&Default::default());
    let (mut refused, mut built) = (0, 0);
    for key in leaves(&base, "") {
        for value in hostile {
            let set = format!("{key}={value}");
            let outcome = std::panic::catch_unwind(|| {
                let cfg = config(&[])
                    .with_sources(None, std::slice::from_ref(&set))
                    .map_err(|e| e.to_string())?;
                let t = scorer_trainer(cfg, &dir).map_err(|e| e.to_string())?;
                t.check_memory(memory).map_err(|e| e.to_string())
            });
            match outcome {
                Err(_) => panic!("`--set {set}` panicked"),
                Ok(Ok(())) => built += 1,
                Ok(Err(e)) => {
                    // The leaf's last name is in the message (nested ones by their dotted path
                    // or in a product of settings such as `prompts_per_epoch/group_size`).
                    let leaf = key.rsplit('.').next().unwrap();
                    assert!(e.contains(leaf) || e.contains(&key), "`--set {set}`: {e}");
                    refused += 1;
                }
            }
        }
    }
    assert!(refused > 100 && built > 10, "refused {refused}, built {built}");
}

/// The dotted paths of the leaves (non-objects and empty objects) of a JSON object.
fn leaves(value: &serde_json::Value, prefix: &str) -> Vec<String> {
    match value.as_object() {
        Some(map) if !map.is_empty() => map
            .iter()
            .flat_map(|(k, v)| {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                leaves(v, &key)
            })
            .collect(),
        _ => vec![prefix.to_string()],
    }
}

/// `--set` values of a `train_sd3` toy run of a few seconds an epoch (no evaluation, a
/// checkpoint every epoch).
const TINY_TOY_RUN: [&str; 8] = [
    "prompts_per_epoch=2",
    "group_size=2",
    "rollout_batch=4",
    "train_batch=4",
    "rollout.num_steps=3",
    "rollout.window_size=1",
    "eval_every=0",
    "save_every=1",
];

/// Two trainers on one output folder (issue 39, item 1), as two processes: while a run holds
/// the folder a second one, even with `--overwrite`, is refused naming the folder and the
/// first run's PID, and leaves the lock with it; once the first is killed (its PID still in
/// the lock file) the next run takes the folder over, says so, and leaves no PID when it ends.
#[test]
fn a_folder_in_use_is_refused_and_a_killed_runs_lock_is_taken_over() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let out = common::scratch("rel-lock");
    let run = |epochs: &str| {
        let mut cmd = Command::new(common::example_binary("train_sd3"));
        cmd.arg("--out").arg(&out).arg("--overwrite");
        for s in TINY_TOY_RUN.iter().chain([&epochs]) {
            cmd.args(["--set", s]);
        }
        cmd
    };
    let mut first =
        run("epochs=100000").stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let pid = first.id().to_string();
    let lock = out.join(".tpgrpo.lock");
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::fs::read_to_string(&lock).unwrap_or_default() != pid {
        assert!(Instant::now() < deadline, "the first run did not take the lock in 2 minutes");
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = run("epochs=1").output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "the second run was not refused: {err}");
    assert!(
        err.contains(&out.display().to_string()) && err.contains(&format!("process {pid}")),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&lock).unwrap(), pid, "the first run keeps the folder");
    first.kill().unwrap();
    first.wait().unwrap();
    let o = run("epochs=1").output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains(&format!("took over from process {pid}")), "{stdout}");
    assert!(out.join("checkpoints/epoch-00001/trainer_state.json").is_file());
    assert_eq!(std::fs::read_to_string(&lock).unwrap(), "", "a finished run leaves no PID");
}

/// The write end of a pipe whose read end is already closed: the first write to it fails
/// with a broken pipe, whenever it comes.
fn closed_pipe() -> std::process::Stdio {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    writer.into()
}

/// A closed stdout never stops training (issue 39, item 5): `train_sd3` with its stdout
/// closed from the start (as `| head -0` would) finishes its run, checkpoint included, with
/// one warning on stderr and no panic; `tpgrpo credit` on a closed stdout ends quietly with
/// status 141, as a Unix tool ends on SIGPIPE, and on a full one with a one-line error.
#[test]
fn a_closed_stdout_stops_neither_training_nor_quietly_ends_a_command() {
    use std::process::{Command, Stdio};
    let out = common::scratch("rel-epipe");
    let mut cmd = Command::new(common::example_binary("train_sd3"));
    cmd.arg("--out").arg(&out);
    for s in TINY_TOY_RUN.iter().chain(&["epochs=1"]) {
        cmd.args(["--set", s]);
    }
    let o = cmd.stdout(closed_pipe()).stderr(Stdio::piped()).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.matches("standard output failed").count(), 1, "{err}");
    assert!(out.join("checkpoints/epoch-00001/trainer_state.json").is_file());

    let input = out.join("credit.json");
    std::fs::write(&input, r#"{"batch": [[0.5, 0.4, 0.6]], "prompt_ids": [0]}"#).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_tpgrpo"))
        .args(["credit", "--input"])
        .arg(&input)
        .stdout(closed_pipe())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(141), "{err}");
    assert!(err.is_empty(), "{err}");

    // Any other failure of stdout (a full disk: /dev/full) is an error, on one line.
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_tpgrpo"))
        .args(["credit", "--input"])
        .arg(&input)
        .stdout(full)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.starts_with("error: standard output: ") && err.lines().count() == 1, "{err}");
}

/// Resuming with another reward or prompt set (issue 39, item 7) is refused naming it, as
/// every other change that breaks an exact resume is, unless the user allows it; the same
/// reward and prompts resume.
#[test]
fn resume_refuses_another_reward_or_prompt_set_unless_allowed() {
    let out = common::scratch("rel-task-change");
    trainer(config(&[]), &out).train(&mut Silent).unwrap();
    let again = |reward: &str, train_prompts: Vec<tpgrpo::prompts::Prompt>| {
        let device = Default::default();
        let model = tpgrpo::toy::ToyModel::<TrainBackend>::load(toy::default_dir(), &device);
        let model = model.unwrap();
        let task = tpgrpo::train::Task {
            pipeline: ToyPipeline {
                text_encoder: burn::module::AutodiffModule::valid(&model.text_encoder),
            },
            reward: toy::reward(reward).unwrap(),
            train_prompts,
            eval_prompts: toy::prompts(toy::Split::Eval),
            report: None,
        };
        Trainer::new(config(&["epochs=2"]), model.transformer, task, &out).unwrap()
    };
    let prompts = toy::prompts(toy::Split::Train);
    let e = again("toy-geneval", prompts.clone()).resume().unwrap_err().to_string();
    assert!(e.contains("reward was toy_alignment, now toy_geneval"), "{e}");
    let fewer = prompts[1..].to_vec();
    let e = again("toy-alignment", fewer.clone()).resume().unwrap_err().to_string();
    assert!(e.contains("prompts was ") && e.contains("--allow-task-change"), "{e}");
    again("toy-alignment", fewer).allowing_task_change().resume().expect("allowed");
    let mut t = again("toy-alignment", prompts);
    t.resume().expect("the same task resumes");
    assert_eq!(t.epoch(), 1);
}

/// `keep_checkpoints` removes the oldest checkpoints after each save, never the one `latest`
/// names (issue 36, item 5, part); the run resumes from the latest and goes on pruning.
#[test]
fn keep_checkpoints_prunes_the_oldest_and_the_run_resumes() {
    let out = common::scratch("rel-keep");
    let kept = || {
        let entries = std::fs::read_dir(out.join("checkpoints")).unwrap();
        let mut names: Vec<String> = entries
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    trainer(config(&["epochs=3", "keep_checkpoints=2"]), &out).train(&mut Silent).unwrap();
    assert_eq!(kept(), ["epoch-00002", "epoch-00003"]);
    let mut t = trainer(config(&["epochs=4", "keep_checkpoints=2"]), &out);
    t.resume().unwrap();
    assert_eq!(t.epoch(), 3);
    t.train(&mut Silent).unwrap();
    assert_eq!(kept(), ["epoch-00003", "epoch-00004"]);
    let latest = std::fs::read_to_string(out.join("checkpoints/latest")).unwrap();
    assert_eq!(latest.trim(), "epoch-00004");
}

/// Preemption (issue 36, item 5), as a cluster does it: SIGTERM mid-run makes `train_sd3` write
/// the checkpoint of the last completed epoch and exit with status 75; `--resume` then ends
/// where a run never stopped ends (the same state file, byte for byte), and so does
/// `--resume PATH` from an older checkpoint. Two signals in a row end the process at once with
/// the shell's status for a signal, leaving every checkpoint complete.
#[cfg(unix)]
#[test]
fn a_signalled_run_checkpoints_and_resumes_to_the_uninterrupted_result() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let run = |out: &std::path::Path, extra: &[&str]| {
        let mut cmd = Command::new(common::example_binary("train_sd3"));
        cmd.arg("--out").arg(out).args(["--no-progress"]).args(extra);
        for s in TINY_TOY_RUN {
            cmd.args(["--set", s]);
        }
        cmd
    };
    let latest_epoch = |out: &std::path::Path| -> usize {
        std::fs::read_to_string(out.join("checkpoints/latest"))
            .ok()
            .and_then(|n| n.trim().strip_prefix("epoch-").and_then(|e| e.parse().ok()))
            .unwrap_or(0)
    };
    let wait_for_epoch = |out: &std::path::Path, epoch: usize| {
        let deadline = Instant::now() + Duration::from_secs(120);
        while latest_epoch(out) < epoch {
            assert!(Instant::now() < deadline, "no checkpoint of epoch {epoch} in 2 minutes");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let signal = |pid: u32, script: &str| {
        let script = script.replace("PID", &pid.to_string());
        assert!(Command::new("sh").arg("-c").arg(script).status().unwrap().success());
    };

    let out = common::scratch("rel-signal");
    let mut child = run(&out, &["--set", "epochs=100000"]).stdout(Stdio::piped()).spawn().unwrap();
    wait_for_epoch(&out, 2);
    signal(child.id(), "kill -TERM PID");
    let status = child.wait().unwrap();
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    assert_eq!(status.code(), Some(75), "{stdout}");
    let stopped = latest_epoch(&out);
    assert!(stdout.contains(&format!("stopped after epoch {stopped}")), "{stdout}");
    let end = format!("epochs={}", stopped + 2);
    let o = run(&out, &["--resume", "--set", &end]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let straight = common::scratch("rel-signal-straight");
    let o = run(&straight, &["--set", &end]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let state = |dir: &std::path::Path| {
        let name = format!("checkpoints/epoch-{:05}/state.safetensors", stopped + 2);
        std::fs::read(dir.join(name)).unwrap()
    };
    assert!(state(&out) == state(&straight), "the resumed run ends elsewhere");

    // --resume PATH: back to epoch 1 of the same folder, and on to the same end.
    let one = out.join("checkpoints/epoch-00001");
    let o = run(&out, &["--resume", one.to_str().unwrap(), "--set", &end]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("resumed after epoch 1"));
    assert!(state(&out) == state(&straight), "resuming from epoch 1 ends elsewhere");
    let o = run(&out, &["--resume", out.join("nothing").to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("nothing") && err.contains("does not exist"));

    // A second signal: at once, with the shell's status for the signal.
    let twice = common::scratch("rel-signal-twice");
    let mut child = run(&twice, &["--set", "epochs=100000"]).stdout(Stdio::null()).spawn().unwrap();
    wait_for_epoch(&twice, 2);
    signal(child.id(), "kill -INT PID; kill -TERM PID");
    let code = child.wait().unwrap().code();
    assert!(matches!(code, Some(130 | 143)), "exit status {code:?}");
    let last = latest_epoch(&twice);
    let o = run(&twice, &["--resume", "--set", &format!("epochs={}", last + 1)]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
