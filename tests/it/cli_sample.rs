//! `tpgrpo sample` on the tiny SD3 fixture folder: writes a PNG of the model's native size,
//! reproducibly per seed, and names a bad folder.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn sample(model: &Path, seed: u64, out: &Path) -> (bool, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_tpgrpo"))
        .args(["sample", "--model"])
        .arg(model)
        .args(["--prompt", "a red circle above a blue square", "--steps", "4"])
        .args(["--max-sequence-length", "16", "--seed", &seed.to_string(), "--out"])
        .arg(out)
        .output()
        .unwrap();
    (o.status.success(), String::from_utf8_lossy(&o.stderr).into())
}

#[test]
fn sample_writes_a_png_from_the_tiny_folder() {
    let model: PathBuf =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pipeline/sd3_tiny");
    let dir = common::scratch("cli-sample");
    let paths: Vec<PathBuf> = ["a.png", "b.png", "c.png"].iter().map(|n| dir.join(n)).collect();
    for (path, seed) in paths.iter().zip([1, 1, 2]) {
        let (ok, err) = sample(&model, seed, path);
        assert!(ok, "{err}");
    }
    let read = |p: &Path| image::open(p).unwrap().to_rgb8();
    let (a, b, c) = (read(&paths[0]), read(&paths[1]), read(&paths[2]));
    assert_eq!(a.dimensions(), (16, 16), "transformer sample_size 8 x VAE factor 2");
    assert_eq!(a.as_raw(), b.as_raw(), "same seed, same image");
    assert_ne!(a.as_raw(), c.as_raw(), "another seed, another image");
    assert!(a.as_raw().iter().any(|&v| v != a.as_raw()[0]), "not a constant image");

    let o = Command::new(env!("CARGO_BIN_EXE_tpgrpo"))
        .args(["sample", "--model"])
        .arg(&model)
        .args(["--prompt", "x", "--steps", "2", "--height", "10", "--out"])
        .arg(dir.join("bad.png"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("height/width") && err.contains("10x16"), "{err}");

    let (ok, err) = sample(&dir.join("no-such-model"), 0, &dir.join("x.png"));
    assert!(!ok && err.contains("no-such-model") && err.contains("no such folder"), "{err}");
}

/// `--adapter` at scale 0 is the base model, at 1 another image; `tpgrpo merge` writes the
/// merged transformer that peft's `merge_and_unload` computes (tests/fixtures/lora) and refuses
/// to write over a model.
#[test]
fn sample_and_merge_apply_a_trained_adapter() {
    use tpgrpo::backend::Backend as B;
    use tpgrpo::model::{Adaptable, LoraConfig, MMDiT};

    let model: PathBuf =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pipeline/sd3_tiny");
    let dir = common::scratch("cli-sample-adapter");
    let base = MMDiT::<B>::load(&model, &common::device()).unwrap();
    let config = LoraConfig::new().with_rank(2);
    let adapted = base.with_lora(&config).unwrap();
    let tensors = adapted
        .lora_tensors()
        .into_iter()
        .map(|(n, t)| match n.ends_with("lora_B") {
            true => (n, common::noise::<B, 2>(7, t.dims()) * 2.0),
            false => (n, t),
        })
        .collect();
    let adapter = dir.join("adapter");
    adapted.with_lora_tensors(tensors).unwrap().save_peft(&adapter, &config).unwrap();
    let run = |extra: &[&str], out: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_tpgrpo"))
            .args(["sample", "--model"])
            .arg(&model)
            .args(["--prompt", "a red circle", "--steps", "3", "--max-sequence-length", "16"])
            .args(extra)
            .arg("--out")
            .arg(dir.join(out))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        image::open(dir.join(out)).unwrap().to_rgb8().into_raw()
    };
    let adapter_arg = adapter.to_str().unwrap();
    let plain = run(&[], "plain.png");
    assert_eq!(plain, run(&["--adapter", adapter_arg, "--adapter-scale", "0"], "zero.png"));
    assert_ne!(plain, run(&["--adapter", adapter_arg], "adapted.png"));

    let lora = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lora");
    let transformer = common::mmdit_fixtures().join("sd35_medium_style/transformer");
    let merge = |out: &Path| {
        Command::new(env!("CARGO_BIN_EXE_tpgrpo"))
            .args(["merge", "--model"])
            .arg(&transformer)
            .arg("--adapter")
            .arg(lora.join("adapter"))
            .arg("--out")
            .arg(out)
            .output()
            .unwrap()
    };
    let merged = dir.join("merged");
    let o = merge(&merged);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let inputs = tpgrpo::weights::WeightFiles::open(lora.join("expected.safetensors")).unwrap();
    let merged_model = MMDiT::<B>::load(&merged, &common::device()).unwrap();
    let out = common::mmdit_forward(&merged_model, &inputs);
    common::parity("merged", out, &inputs, "merged", 1e-5).unwrap();
    let o = merge(&merged);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("already holds config.json"), "{err}");
}
