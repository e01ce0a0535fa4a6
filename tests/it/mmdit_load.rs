//! Loading, saving and input validation of the MMDiT: key names and shapes of the released
//! configurations against diffusers' state dicts, clear errors on bad checkpoints and inputs,
//! and a diffusers-format save that round-trips.

use crate::common;

use std::path::Path;

use burn::prelude::*;
use tpgrpo::backend::Backend as B;
use tpgrpo::model::{MMDiT, MMDiTConfig};
use tpgrpo::weights::{save_safetensors, WeightFiles};
use tpgrpo::Error;

fn models_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models")
}

/// The named configurations are the released models' `config.json`s (copied in `models/`).
#[test]
fn named_configs_equal_the_released_config_files() {
    let named = [
        ("sd3-medium", MMDiTConfig::sd3_medium()),
        ("sd3.5-medium", MMDiTConfig::sd3_5_medium()),
        ("sd3.5-large", MMDiTConfig::sd3_5_large()),
    ];
    for (name, config) in named {
        let file = MMDiTConfig::load_json(models_dir().join(format!("{name}.json"))).unwrap();
        assert_eq!(config, file, "{name}");
    }
}

/// A copy of the f32 `sd3_medium_style` case's transformer folder, to be damaged by a test.
fn copy_case(name: &str) -> std::path::PathBuf {
    let src = common::mmdit_fixtures().join("sd3_medium_style/transformer");
    let dir = common::scratch(name);
    for f in ["config.json", "diffusion_pytorch_model.safetensors"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    dir
}

/// Rewrites the weights of `dir` through `edit` on the list of `(key, shape, values)`.
fn edit_weights(dir: &Path, edit: impl FnOnce(&mut Vec<(String, Vec<usize>, Vec<f32>)>)) {
    let path = dir.join("diffusion_pytorch_model.safetensors");
    let files = WeightFiles::open(&path).unwrap();
    let mut tensors: Vec<_> = files
        .keys()
        .map(|k| (k.to_string(), files.info(k).unwrap().shape.clone(), files.read_f32(k).unwrap()))
        .collect();
    edit(&mut tensors);
    save_safetensors(&path, &tensors).unwrap();
}

fn load_err(path: &Path) -> Error {
    match MMDiT::<B>::load(path, &common::device()) {
        Ok(_) => panic!("{} loaded but should not have", path.display()),
        Err(e) => e,
    }
}

#[test]
fn truncated_and_corrupt_files_are_errors() {
    let dir = copy_case("truncated");
    let file = dir.join("diffusion_pytorch_model.safetensors");
    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(len - 10).unwrap();
    let e = load_err(&dir);
    assert!(matches!(e, Error::Format { .. }), "{e}");
    assert!(
        e.to_string().contains("truncated")
            && e.to_string().contains("diffusion_pytorch_model.safetensors"),
        "{e}"
    );

    std::fs::write(&file, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}").unwrap();
    let e = load_err(&dir);
    assert!(e.to_string().contains("corrupt safetensors header"), "{e}");

    std::fs::write(&file, b"abc").unwrap();
    assert!(load_err(&dir).to_string().contains("shorter than 8 bytes"));
}

#[test]
fn missing_unexpected_and_misshaped_keys_are_all_reported() {
    let dir = copy_case("keys");
    edit_weights(&dir, |t| {
        t.retain(|(k, _, _)| k != "transformer_blocks.0.attn.to_q.weight");
        t.push(("extra.weight".into(), vec![2], vec![1.0, 2.0]));
        let ff =
            t.iter_mut().find(|(k, _, _)| k == "transformer_blocks.1.ff.net.2.weight").unwrap();
        ff.1 = vec![ff.1[1], ff.1[0]];
    });
    let e = load_err(&dir);
    let Error::Checkpoint { problems, .. } = &e else { panic!("{e}") };
    assert_eq!(problems.len(), 3, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("missing key `transformer_blocks.0.attn.to_q.weight`"), "{msg}");
    assert!(msg.contains("unexpected key `extra.weight`"), "{msg}");
    assert!(
        msg.contains("`transformer_blocks.1.ff.net.2.weight`")
            && msg.contains("expected shape [32, 128]")
            && msg.contains("found [128, 32]"),
        "{msg}"
    );
}

#[test]
fn sharded_index_naming_a_missing_shard_is_an_error() {
    let src = common::mmdit_fixtures().join("sharded_bf16/transformer");
    let dir = common::scratch("shards");
    for entry in std::fs::read_dir(&src).unwrap() {
        let p = entry.unwrap().path();
        if !p.to_string_lossy().contains("00003-of") {
            std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
        }
    }
    let e = load_err(&dir);
    assert!(matches!(e, Error::Io { .. }) && e.to_string().contains("00003-of-00005"), "{e}");
}

/// A shard name that leaves the model's folder is refused before anything is opened, even
/// when the file it names exists and is a valid shard; a shard that is a symbolic link inside
/// the folder (as in the Hugging Face cache) still loads.
#[test]
fn sharded_index_entries_stay_inside_the_folder() {
    let src = common::mmdit_fixtures().join("sharded_bf16/transformer");
    let root = common::scratch("shards-escape");
    let dir = root.join("transformer");
    std::fs::create_dir_all(&dir).unwrap();
    let shard = "diffusion_pytorch_model-00003-of-00005.safetensors";
    for entry in std::fs::read_dir(&src).unwrap() {
        let p = entry.unwrap().path();
        let to =
            if p.ends_with(shard) { root.join(shard) } else { dir.join(p.file_name().unwrap()) };
        std::fs::copy(&p, to).unwrap();
    }
    let index = dir.join("diffusion_pytorch_model.safetensors.index.json");
    let original = std::fs::read_to_string(&index).unwrap();
    let outside = root.join(shard).display().to_string();
    for evil in [format!("../{shard}"), outside, format!("./../transformer/../{shard}")] {
        std::fs::write(&index, original.replace(shard, &evil)).unwrap();
        let e = load_err(&dir).to_string();
        assert!(e.contains("index.json: names") && e.contains("not a file inside"), "{evil}: {e}");
    }
    std::fs::write(&index, &original).unwrap();
    std::os::unix::fs::symlink(root.join(shard), dir.join(shard)).unwrap();
    MMDiT::<B>::load(&dir, &common::device()).expect("a shard linked from inside loads");
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let model =
        MMDiT::<B>::load(common::mmdit_fixtures().join("sd3_medium_style"), &common::device())
            .unwrap();
    let dev = common::device();
    let t = Tensor::<B, 1>::from_floats([500.0], &dev);
    let text = Tensor::<B, 3>::zeros([1, 3, 24], &dev);
    let pooled = Tensor::<B, 2>::zeros([1, 20], &dev);
    // 18x18 pixels = 9x9 patches > the 8x8 position table.
    let e = model
        .forward(Tensor::zeros([1, 16, 18, 18], &dev), t.clone(), text.clone(), pooled.clone())
        .unwrap_err();
    assert!(
        e.to_string().contains("pos_embed_max_size") && e.to_string().contains("[9, 9]"),
        "{e}"
    );
    let e = model
        .forward(Tensor::zeros([1, 4, 8, 8], &dev), t.clone(), text.clone(), pooled.clone())
        .unwrap_err();
    assert!(e.to_string().contains("hidden_states"), "{e}");
    let e = model
        .forward(Tensor::zeros([1, 16, 8, 7], &dev), t.clone(), text.clone(), pooled.clone())
        .unwrap_err();
    assert!(e.to_string().contains("multiples of 2"), "{e}");
    let e = model
        .forward(
            Tensor::zeros([1, 16, 8, 8], &dev),
            t.clone(),
            Tensor::zeros([1, 3, 23], &dev),
            pooled,
        )
        .unwrap_err();
    assert!(e.to_string().contains("encoder_hidden_states"), "{e}");
    let e = model
        .forward(
            Tensor::zeros([1, 16, 8, 8], &dev),
            Tensor::from_floats([1.0, 2.0], &dev),
            text,
            Tensor::zeros([1, 20], &dev),
        )
        .unwrap_err();
    assert!(e.to_string().contains("timestep"), "{e}");
}

#[test]
fn config_errors_name_the_field() {
    let base = std::fs::read_to_string(models_dir().join("sd3-medium.json")).unwrap();
    let edit =
        |from: &str, to: &str| MMDiTConfig::from_json_str(&base.replace(from, to)).unwrap_err();
    let e = edit("\"qk_norm\": null", "\"qk_norm\": null, \"use_rope\": true");
    assert!(matches!(&e, Error::Config { field, .. } if field == "use_rope"), "{e}");
    let e = edit("\"caption_projection_dim\": 1536", "\"caption_projection_dim\": 1024");
    assert!(matches!(&e, Error::Config { field, .. } if field == "caption_projection_dim"), "{e}");
    let e = edit("\"qk_norm\": null", "\"qk_norm\": \"layer_norm\"");
    assert!(matches!(&e, Error::Config { field, .. } if field == "qk_norm"), "{e}");
    let e = edit("\"dual_attention_layers\": []", "\"dual_attention_layers\": [24]");
    assert!(matches!(&e, Error::Config { field, .. } if field == "dual_attention_layers"), "{e}");
    let e = edit("\"num_layers\": 24,", "");
    assert!(matches!(&e, Error::Config { field, .. } if field == "num_layers"), "{e}");
    // SD3-medium's released config predates these two fields: they default.
    let old =
        base.replace("\"dual_attention_layers\": [],", "").replace(",\n  \"qk_norm\": null", "");
    let cfg = MMDiTConfig::from_json_str(&old).unwrap();
    assert!(cfg.dual_attention_layers.is_empty() && cfg.qk_norm.is_none());
}

#[test]
fn saving_in_diffusers_format_round_trips() {
    let case = common::mmdit_fixtures().join("sd35_medium_style/transformer");
    let model = MMDiT::<B>::load(&case, &common::device()).unwrap();
    let out = common::scratch("save");
    model.save_diffusers(&out).unwrap();

    // The same keys and values as the file diffusers wrote, and the same config.
    let original = WeightFiles::open(case.join("diffusion_pytorch_model.safetensors")).unwrap();
    let saved = WeightFiles::open(out.join("diffusion_pytorch_model.safetensors")).unwrap();
    assert_eq!(original.keys().collect::<Vec<_>>(), saved.keys().collect::<Vec<_>>());
    for k in original.keys() {
        assert_eq!(original.info(k).unwrap().shape, saved.info(k).unwrap().shape, "{k}");
        assert_eq!(original.read_f32(k).unwrap(), saved.read_f32(k).unwrap(), "{k}");
    }
    assert_eq!(
        MMDiTConfig::load_json(case.join("config.json")).unwrap(),
        MMDiTConfig::load_json(out.join("config.json")).unwrap()
    );
    let leftovers: Vec<_> =
        std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers.len(), 2, "temporary files left behind: {leftovers:?}");
}
