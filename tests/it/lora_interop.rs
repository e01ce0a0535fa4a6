//! Adapters the ecosystem reads: the PEFT folder and diffusers' LoRA file this crate writes are
//! loaded by peft (`PeftModel.from_pretrained`) and diffusers (`load_lora_adapter`) in
//! `tests/fixtures/gen_lora.py`, whose outputs on fixed inputs (float64, saved f32) the adapted
//! and merged Rust models must reproduce; an adapter that peft itself saved loads too.

use std::path::{Path, PathBuf};

use burn::prelude::*;
use tpgrpo::backend::Backend as B;
use tpgrpo::model::{Adaptable, LoraConfig, MMDiT, DIFFUSERS_LORA_WEIGHTS};
use tpgrpo::weights::WeightFiles;

use crate::common;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lora")
}

/// The base transformer of the fixture (SD3.5-style: qk RMSNorm, dual attention).
fn base() -> MMDiT<B> {
    let dir = common::mmdit_fixtures().join("sd35_medium_style/transformer");
    MMDiT::load(dir, &common::device()).unwrap()
}

/// The adapter the fixture's `adapter/` holds: rank 4, alpha 8 on the joint-attention
/// projections and two of the dual-attention ones, `A` as initialised, `B` deterministic noise.
fn adapted() -> (MMDiT<B>, LoraConfig) {
    let mut targets = LoraConfig::new().target_modules;
    targets.extend(["attn2.to_q".to_string(), "attn2.to_out.0".to_string()]);
    let config =
        LoraConfig::new().with_rank(4).with_alpha(8.0).with_target_modules(targets).with_seed(3);
    let model = base().with_lora(&config).unwrap();
    let tensors = model
        .lora_tensors()
        .into_iter()
        .enumerate()
        .map(|(i, (name, t))| match name.ends_with("lora_B") {
            true => (name, common::noise(500 + i as u64, t.dims()) * 0.3),
            false => (name, t),
        })
        .collect();
    (model.with_lora_tensors(tensors).unwrap(), config)
}

/// Writes the adapter both ways into `dir` (what the generator reads).
fn export(dir: &Path) {
    let (model, config) = adapted();
    model.save_peft(dir, &config).unwrap();
    model.save_diffusers_lora(dir.join(DIFFUSERS_LORA_WEIGHTS), &config).unwrap();
}

/// Writes `tests/fixtures/lora/adapter/` (or `$TPGRPO_LORA_EXPORT`); run by the generator.
#[test]
#[ignore = "writes the fixture input; run by tests/fixtures/gen_lora.py"]
fn write_fixture_adapter() {
    let dir = std::env::var_os("TPGRPO_LORA_EXPORT")
        .map(PathBuf::from)
        .unwrap_or_else(|| fixtures().join("adapter"));
    export(&dir);
}

fn forward(model: &MMDiT<B>) -> Tensor<B, 4> {
    let inputs = WeightFiles::open(fixtures().join("expected.safetensors")).unwrap();
    common::mmdit_forward(model, &inputs)
}

/// Compares `model`'s output with the reference output `key` at 1e-5 of its magnitude.
fn assert_matches(model: &MMDiT<B>, key: &str) {
    let expected = WeightFiles::open(fixtures().join("expected.safetensors")).unwrap();
    common::parity(key, forward(model), &expected, key, 1e-5).unwrap();
}

#[test]
fn this_build_exports_the_adapter_that_python_loaded() {
    let dir = common::scratch("lora-export");
    export(&dir);
    let committed = fixtures().join("adapter");
    for file in ["adapter_model.safetensors", DIFFUSERS_LORA_WEIGHTS] {
        let (now, then) = (
            WeightFiles::open(dir.join(file)).unwrap(),
            WeightFiles::open(committed.join(file)).unwrap(),
        );
        let keys =
            |f: &WeightFiles| f.keys().map(String::from).collect::<std::collections::BTreeSet<_>>();
        assert_eq!(keys(&now), keys(&then), "{file}: keys");
        assert_eq!(now.metadata, then.metadata, "{file}: header metadata");
        for key in now.keys() {
            assert_eq!(now.info(key).unwrap().shape, then.info(key).unwrap().shape, "{key}");
            let (a, b) = (now.read_f32(key).unwrap(), then.read_f32(key).unwrap());
            // Host noise goes through libm's log and cos, whose last bit may differ between
            // CPUs: a few ulps of the values' magnitude.
            let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            let diff = a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(diff <= 1e-6 * scale.max(1.0), "{file} {key}: max|diff| {diff:e}");
        }
    }
    let json = |d: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(d.join("adapter_config.json")).unwrap())
            .unwrap()
    };
    assert_eq!(json(&dir), json(&committed));
}

#[test]
fn peft_and_diffusers_outputs_are_reproduced() {
    assert_matches(&base(), "base");
    let adapter = fixtures().join("adapter");
    // The PEFT folder, as PeftModel.from_pretrained read it.
    let (peft, config) = base().load_adapter(&adapter).unwrap();
    assert_eq!((config.rank, config.alpha), (4, 8.0));
    assert_matches(&peft, "peft");
    // diffusers' LoRA file, as transformer.load_lora_adapter read it, at weight 1 and 0.5.
    let (diffusers, config) = base().load_adapter(adapter.join(DIFFUSERS_LORA_WEIGHTS)).unwrap();
    assert_eq!((config.rank, config.alpha), (4, 8.0));
    assert_matches(&diffusers, "diffusers");
    assert_matches(&diffusers.clone().scale_lora(0.5), "diffusers_weight_0.5");
    // Merged, written as a diffusers folder and read back (peft's merge_and_unload).
    let dir = common::scratch("lora-merged");
    diffusers.merge_lora().save_diffusers(&dir).unwrap();
    assert_matches(&MMDiT::<B>::load(&dir, &common::device()).unwrap(), "merged");
    // An adapter that peft itself saved (save_pretrained after loading ours).
    let (saved, _) = base().load_adapter(fixtures().join("peft_saved")).unwrap();
    assert_matches(&saved, "peft");
}

#[test]
fn a_diffusers_file_without_metadata_scales_by_one_and_bad_files_are_named() {
    let dir = common::scratch("lora-bad");
    let committed =
        WeightFiles::open(fixtures().join("adapter").join(DIFFUSERS_LORA_WEIGHTS)).unwrap();
    let tensors: Vec<(String, Vec<usize>, Vec<f32>)> = committed
        .keys()
        .map(|k| {
            (
                k.to_string(),
                committed.info(k).unwrap().shape.clone(),
                committed.read_f32(k).unwrap(),
            )
        })
        .collect();
    // No metadata: diffusers' rule, alpha = r.
    let plain = dir.join("plain.safetensors");
    tpgrpo::weights::save_safetensors(&plain, &tensors).unwrap();
    let (_, config) = base().load_adapter(&plain).unwrap();
    assert_eq!((config.rank, config.alpha), (4, 4.0));
    // A text-encoder factor, and a missing one, are named.
    let mut extra = tensors.clone();
    extra.push(("text_encoder.layers.0.q_proj.lora_A.weight".into(), vec![1], vec![0.0]));
    let path = dir.join("extra.safetensors");
    tpgrpo::weights::save_safetensors(&path, &extra).unwrap();
    let err = base().load_adapter(&path).unwrap_err().to_string();
    assert!(
        err.contains("text_encoder.layers.0.q_proj") && err.contains("extra.safetensors"),
        "{err}"
    );
    let missing: Vec<_> = tensors
        .iter()
        .filter(|(k, ..)| !k.ends_with("blocks.1.attn.to_k.lora_B.weight"))
        .cloned()
        .collect();
    let path = dir.join("missing.safetensors");
    tpgrpo::weights::save_safetensors(&path, &missing).unwrap();
    let err = base().load_adapter(&path).unwrap_err().to_string();
    assert!(err.contains("transformer.transformer_blocks.1.attn.to_k.lora_B.weight"), "{err}");
    // A PEFT variant read as plain LoRA would be another model: refused by name.
    let peft = dir.join("dora");
    std::fs::create_dir_all(&peft).unwrap();
    for file in ["adapter_model.safetensors", "adapter_config.json"] {
        std::fs::copy(fixtures().join("adapter").join(file), peft.join(file)).unwrap();
    }
    let config = std::fs::read_to_string(peft.join("adapter_config.json")).unwrap();
    let config = config.replace("\"use_dora\": false", "\"use_dora\": true");
    std::fs::write(peft.join("adapter_config.json"), config).unwrap();
    let err = base().load_adapter(&peft).unwrap_err().to_string();
    assert!(err.contains("use_dora") && err.contains("adapter_config.json"), "{err}");
    let err = base().load_adapter(dir.join("nothing")).unwrap_err().to_string();
    assert!(err.contains("nothing") && err.contains("does not exist"), "{err}");
}
