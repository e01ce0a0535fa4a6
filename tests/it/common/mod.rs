//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use burn::prelude::*;
use tpgrpo::backend::{self, Backend as B};
use tpgrpo::weights::WeightFiles;

/// The default device of the test backend.
pub fn device() -> backend::Device {
    backend::device()
}

/// Reads `key` of a safetensors file as a tensor of rank `D`.
pub fn tensor<const D: usize>(files: &WeightFiles, key: &str) -> Tensor<B, D> {
    let info = files.info(key).unwrap_or_else(|| panic!("fixture key `{key}` missing"));
    let data = TensorData::new(files.read_f32(key).unwrap(), info.shape.clone());
    Tensor::from_data(data, &device())
}

/// A fresh scratch folder under the system temp dir, unique to this call (the process, a
/// counter and `name`), so tests running side by side never share one.
pub fn scratch(name: &str) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("tpgrpo-test-{pid}-{call}-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The committed MMDiT fixture folder.
pub fn mmdit_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mmdit")
}

/// The MMDiT's output on a fixture's inputs (`hidden_states`, `timestep`,
/// `encoder_hidden_states`, `pooled_projections`).
pub fn mmdit_forward(model: &tpgrpo::model::MMDiT<B>, inputs: &WeightFiles) -> Tensor<B, 4> {
    model
        .forward(
            tensor(inputs, "hidden_states"),
            tensor(inputs, "timestep"),
            tensor(inputs, "encoder_hidden_states"),
            tensor(inputs, "pooled_projections"),
        )
        .unwrap()
}

/// Max |a - b| over two equally shaped tensors, and max |b|.
pub fn max_diff<const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> (f32, f32) {
    assert_eq!(a.dims(), b.dims(), "shape mismatch");
    let diff: f32 = (a - b.clone()).abs().max().into_scalar().elem();
    let scale: f32 = b.abs().max().into_scalar().elem();
    (diff, scale)
}

/// The case folders of a parity fixture: the sub-folders of `root` holding `marker`, sorted;
/// none is an error naming `root`.
pub fn case_folders(root: &Path, marker: &str) -> Vec<PathBuf> {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join(marker).is_file())
        .collect();
    cases.sort();
    assert!(!cases.is_empty(), "no case folders under {}", root.display());
    cases
}

/// The reference comparison of every parity test: `out` against `expected`'s tensor `key`,
/// allowed `rel` times the reference's largest magnitude (at least 1). Prints the difference
/// under `what`; returns the failure as a message (a NaN fails).
pub fn parity<const D: usize>(
    what: &str,
    out: Tensor<B, D>,
    expected: &WeightFiles,
    key: &str,
    rel: f32,
) -> Result<(), String> {
    let (diff, scale) = max_diff(out, tensor::<D>(expected, key));
    let tol = rel * scale.max(1.0);
    println!("{what}: max|diff| = {diff:.3e} (tolerance {tol:.3e}, max|reference| {scale:.2})");
    if diff.is_nan() || diff > tol {
        return Err(format!("{what}: max|diff| {diff:e} > {tol:e}"));
    }
    Ok(())
}

/// An analytic conditional field: data concentrated at the point given by the pooled vector's
/// first `C` entries (broadcast over space), `v = (x - x0(c)) / sigma`; it counts its calls.
#[derive(Default)]
pub struct PointMass {
    /// Number of `velocity` calls so far.
    pub calls: std::cell::Cell<usize>,
}

impl tpgrpo::sampler::VelocityModel<B> for PointMass {
    fn velocity(
        &self,
        x: Tensor<B, 4>,
        t: Tensor<B, 1>,
        cond: &tpgrpo::sampler::Conditioning<B>,
    ) -> tpgrpo::Result<Tensor<B, 4>> {
        self.calls.set(self.calls.get() + 1);
        let [b, c, _, _] = x.dims();
        let x0 = cond.pooled.clone().slice([0..b, 0..c]).reshape([b, c, 1, 1]);
        let sigma = (t / 1000.0).reshape([b, 1, 1, 1]);
        Ok((x - x0) / sigma)
    }
}

/// A tiny SD3.5-style configuration (dual attention in block 0, qk-norm, 3 blocks).
pub fn tiny_config() -> tpgrpo::model::MMDiTConfig {
    tpgrpo::model::MMDiTConfig::new()
        .with_sample_size(8)
        .with_in_channels(4)
        .with_out_channels(4)
        .with_num_layers(3)
        .with_attention_head_dim(8)
        .with_num_attention_heads(2)
        .with_joint_attention_dim(12)
        .with_caption_projection_dim(16)
        .with_pooled_projection_dim(10)
        .with_pos_embed_max_size(4)
        .with_dual_attention_layers(vec![0])
        .with_qk_norm(Some("rms_norm".into()))
}

/// Deterministic pseudo-random tensor of `shape` (host noise, seed `seed`).
pub fn noise<BB: Backend, const D: usize>(seed: u64, shape: [usize; D]) -> Tensor<BB, D> {
    let count = shape.iter().product();
    let values = tpgrpo::rng::gaussian(seed, 0, count);
    Tensor::from_data(TensorData::new(values, shape), &Default::default())
}

/// Mean pixel value: a reward with an obvious optimum, for checking the update direction.
#[allow(dead_code)]
pub struct Brightness;

impl tpgrpo::reward::Reward for Brightness {
    fn name(&self) -> &str {
        "brightness"
    }
    fn score(
        &self,
        images: &[tpgrpo::image::Image],
        _: &[tpgrpo::prompts::Prompt],
    ) -> tpgrpo::Result<Vec<f64>> {
        Ok(images
            .iter()
            .map(|im| im.pixels.iter().map(|&v| v as f64).sum::<f64>() / im.pixels.len() as f64)
            .collect())
    }
}

/// A reward that records every batch it scores (the scores, in call order) and scores as
/// `inner` does.
#[allow(dead_code)]
pub struct Recording<R> {
    /// The scorer.
    pub inner: R,
    /// Every call's scores, in order.
    pub calls: std::sync::Arc<std::sync::Mutex<Vec<Vec<f64>>>>,
}

impl<R: tpgrpo::reward::Reward> tpgrpo::reward::Reward for Recording<R> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn score(
        &self,
        images: &[tpgrpo::image::Image],
        prompts: &[tpgrpo::prompts::Prompt],
    ) -> tpgrpo::Result<Vec<f64>> {
        let scores = self.inner.score(images, prompts)?;
        self.calls.lock().unwrap().push(scores.clone());
        Ok(scores)
    }
}

/// An example binary of this build (`target/<profile>/examples/`): `cargo test` builds them;
/// when it did not (`cargo test --test it`, nextest), it is built here with this build's
/// profile and features, once per name.
pub fn example_binary(name: &str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let bin = profile_dir.join("examples").join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !bin.is_file() && !built.iter().any(|b| b == name) {
        let features: Vec<&str> = [
            ("cli", cfg!(feature = "cli")),
            ("ndarray", cfg!(feature = "ndarray")),
            ("cuda", cfg!(feature = "cuda")),
            ("wgpu", cfg!(feature = "wgpu")),
            ("tch", cfg!(feature = "tch")),
        ]
        .into_iter()
        .filter_map(|(f, on)| on.then_some(f))
        .collect();
        let target_dir = profile_dir.parent().unwrap();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = std::process::Command::new(cargo);
        build.current_dir(env!("CARGO_MANIFEST_DIR")).args(["build", "--example", name]);
        build.arg("--target-dir").arg(target_dir);
        build.args(["--no-default-features", "--features", &features.join(",")]);
        if !cfg!(debug_assertions) {
            build.arg("--release");
        }
        let status = build.status().expect("cargo runs");
        assert!(status.success(), "building example {name} failed");
        built.push(name.to_string());
    }
    assert!(bin.is_file(), "{} missing after building it", bin.display());
    bin
}

/// Toy settings for data-parallel runs: 2 prompts x 4 samples in rollout chunks of 4 (replica 0
/// draws samples 0..4 and replica 1 samples 4..8, exactly one device's two chunks), 2 optimizer
/// steps of micro-batches of 2 (so two replicas' micro-batches differ from one device's), a
/// checkpoint every epoch, no evaluation.
pub const DATA_PARALLEL_SETTINGS: [&str; 11] = [
    "prompts_per_epoch=2",
    "group_size=4",
    "rollout_batch=4",
    "train_batch=2",
    "optimizer_steps_per_epoch=2",
    "rollout.num_steps=4",
    "rollout.window_size=2",
    "eval_every=0",
    "save_every=1",
    "seed=3",
    // The KL penalty's reference pass too (the toy preset trains without it).
    "objective.kl_beta=0.0001",
];

/// Settings for two quick epochs on the tiny SD3 folder (3 samples per prompt, 4 steps, 2
/// trained, evaluation and a checkpoint at epoch 2).
pub const TINY_SD3_SETTINGS: [&str; 13] = [
    "epochs=2",
    "prompts_per_epoch=2",
    "group_size=3",
    "rollout_batch=6",
    "train_batch=6",
    "rollout.num_steps=4",
    "rollout.window_size=2",
    "eval_every=2",
    "eval_steps=4",
    "eval_prompts=2",
    "save_every=2",
    "lora.rank=4",
    "optimizer_steps_per_epoch=1",
];
