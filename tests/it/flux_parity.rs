//! Parity of the FLUX transformer with diffusers' FluxTransformer2DModel on every case folder
//! under tests/fixtures/flux/ (or `$TPGRPO_FLUX_FIXTURES`), written by
//! tests/fixtures/gen_flux.py: guidance on and off, non-square grids, non-zero text ids, a
//! sharded bf16 folder and a BFL single file of the same weights as the first case.

use crate::common;

use std::path::{Path, PathBuf};

use burn::prelude::*;
use tpgrpo::backend::Backend as B;
use tpgrpo::model::{Adaptable, Flux, FluxConfig};
use tpgrpo::weights::WeightFiles;

/// The fixture folder.
fn fixtures() -> PathBuf {
    std::env::var_os("TPGRPO_FLUX_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/flux"))
}

/// The model of a case: its `transformer/` folder, or its one BFL single file read with the
/// `config.json` beside it (a BFL file does not store the rotary axes).
fn load(case: &Path) -> Flux<B> {
    let device = common::device();
    if case.join("transformer").is_dir() {
        return Flux::load(case, &device).unwrap();
    }
    let files: Vec<PathBuf> = std::fs::read_dir(case)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "safetensors") && !p.ends_with("io.safetensors")
        })
        .collect();
    assert_eq!(files.len(), 1, "{}: expected transformer/ or one single file", case.display());
    let config = FluxConfig::load_json(case.join("config.json")).unwrap();
    Flux::load_file_with_config(&files[0], &config, &device).unwrap()
}

/// Position ids `[N, 3]` of a fixture as rows.
fn ids(io: &WeightFiles, key: &str) -> Vec<[f64; 3]> {
    io.read_f32(key).unwrap().chunks(3).map(|r| [r[0] as f64, r[1] as f64, r[2] as f64]).collect()
}

#[test]
fn flux_matches_diffusers_on_every_case() {
    let root = fixtures();
    let cases = common::case_folders(&root, "io.safetensors");

    let device = common::device();
    let mut failures = Vec::new();
    for case in &cases {
        let model = load(case);
        let io = WeightFiles::open(case.join("io.safetensors")).unwrap();
        let rope =
            model.rope_from_ids(&ids(&io, "txt_ids"), &ids(&io, "img_ids"), &device).unwrap();
        let guidance = io.info("guidance").map(|_| common::tensor::<1>(&io, "guidance"));
        let out = model
            .forward(
                common::tensor(&io, "hidden_states"),
                common::tensor(&io, "timestep"),
                guidance,
                common::tensor(&io, "encoder_hidden_states"),
                common::tensor(&io, "pooled_projections"),
                &rope,
            )
            .unwrap_or_else(|e| panic!("{}: {e}", case.display()));
        let name = case.file_name().unwrap().to_string_lossy();
        if let Err(e) = common::parity(&name, out, &io, "output", 1e-4) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "parity failures:\n{}", failures.join("\n"));
    if std::env::var_os("TPGRPO_FLUX_FIXTURES").is_none() {
        assert!(cases.len() >= 5, "expected the 5 committed cases, found {}", cases.len());
    }
}

/// The pipeline's ids (`Flux::rope`) are the ids the fixtures were written with: zeros for
/// text, `(0, row, col)` row-major for the image.
#[test]
fn pipeline_rope_equals_the_fixture_ids() {
    let case = fixtures().join("no_guidance_non_square");
    let model = load(&case);
    let io = WeightFiles::open(case.join("io.safetensors")).unwrap();
    let device = common::device();
    let from_ids = model.rope_from_ids(&ids(&io, "txt_ids"), &ids(&io, "img_ids"), &device);
    let pipeline = model.rope(4, 3, 5, &device).unwrap();
    let x = common::noise::<B, 3>(1, [1, 15, 8]);
    let [text, pooled] =
        [common::noise::<B, 3>(2, [1, 4, 24]), common::noise::<B, 3>(3, [1, 1, 20])];
    let pooled = pooled.reshape([1, 20]);
    let sigma = Tensor::<B, 1>::from_floats([0.5], &device);
    let run = |rope| {
        model.forward(x.clone(), sigma.clone(), None, text.clone(), pooled.clone(), &rope).unwrap()
    };
    let (diff, _) = common::max_diff(run(pipeline), run(from_ids.unwrap()));
    assert_eq!(diff, 0.0);
}

/// Wrong inputs are refused by name, before any computation.
#[test]
fn bad_inputs_are_named() {
    let case = fixtures().join("guidance_square");
    let model = load(&case);
    let device = common::device();
    let rope = model.rope(5, 4, 4, &device).unwrap();
    let x = Tensor::<B, 3>::zeros([2, 16, 8], &device);
    let text = Tensor::<B, 3>::zeros([2, 5, 24], &device);
    let pooled = Tensor::<B, 2>::zeros([2, 20], &device);
    let sigma = Tensor::<B, 1>::ones([2], &device);
    let g = || Some(Tensor::<B, 1>::ones([2], &device));
    let err = |r: tpgrpo::Result<Tensor<B, 3>>| r.unwrap_err().to_string();
    assert!(err(model.forward(
        x.clone(),
        sigma.clone(),
        None,
        text.clone(),
        pooled.clone(),
        &rope
    ))
    .contains("guidance"));
    let short = model.rope(5, 4, 3, &device).unwrap();
    assert!(err(model.forward(
        x.clone(),
        sigma.clone(),
        g(),
        text.clone(),
        pooled.clone(),
        &short
    ))
    .contains("rope"));
    let wide = Tensor::<B, 3>::zeros([2, 16, 9], &device);
    assert!(err(model.forward(wide, sigma.clone(), g(), text.clone(), pooled.clone(), &rope))
        .contains("hidden_states"));
    assert!(err(model.forward(x, sigma, g(), text, Tensor::zeros([2, 19], &device), &rope))
        .contains("pooled_projections"));
    // A BFL file with 16-wide heads does not determine the rotary axes: loading it without a
    // configuration names the problem.
    let err = Flux::<B>::load(fixtures().join("bfl_single_file/flux_tiny.safetensors"), &device)
        .unwrap_err()
        .to_string();
    assert!(err.contains("axes_dims_rope"), "{err}");
}

/// An adapter peft made on the first case's model with the FLUX targets (attention and
/// feed-forward of the double blocks; PEFT's suffix rule also takes the single blocks'
/// `attn.to_q/k/v`) loads from peft's folder and from diffusers' LoRA file, reproduces peft's
/// adapted and merged outputs, and exports back to peft's keys and values.
#[test]
fn flux_lora_matches_peft_in_both_layouts() {
    let root = fixtures();
    let lora = root.join("lora");
    let case = root.join("guidance_square");
    let io = WeightFiles::open(case.join("io.safetensors")).unwrap();
    let expected = WeightFiles::open(lora.join("expected.safetensors")).unwrap();
    let rope = model_rope(&load(&case), &io);
    let run = |model: &Flux<B>| {
        model
            .forward(
                common::tensor(&io, "hidden_states"),
                common::tensor(&io, "timestep"),
                Some(common::tensor(&io, "guidance")),
                common::tensor(&io, "encoder_hidden_states"),
                common::tensor(&io, "pooled_projections"),
                &rope,
            )
            .unwrap()
    };
    let check = |what: &str, out: Tensor<B, 3>, key: &str| {
        common::parity(what, out, &expected, key, 1e-4).unwrap();
    };
    for source in [lora.join("peft"), lora.join("pytorch_lora_weights.safetensors")] {
        let (model, config) = load(&case).load_adapter(&source).unwrap();
        assert_eq!((config.rank, config.alpha), (4, 8.0), "{}", source.display());
        let modules = model.lora_tensors().len() / 2;
        assert_eq!(modules, 2 * 12 + 2 * 3, "{}", source.display());
        check(&source.display().to_string(), run(&model), "output");
        check("merged", run(&model.merge_lora()), "merged");
    }
    // Our export of the adapter is peft's file: the same keys, the same values.
    let (model, config) = load(&case).load_adapter(lora.join("peft")).unwrap();
    let out = common::scratch("flux-lora-export");
    model.save_peft(&out, &config).unwrap();
    let ours = WeightFiles::open(out.join("adapter_model.safetensors")).unwrap();
    let theirs = WeightFiles::open(lora.join("peft/adapter_model.safetensors")).unwrap();
    let keys = |f: &WeightFiles| {
        let mut k: Vec<String> = f.keys().map(str::to_string).collect();
        k.sort();
        k
    };
    assert_eq!(keys(&ours), keys(&theirs));
    for key in keys(&theirs) {
        assert_eq!(ours.read_f32(&key).unwrap(), theirs.read_f32(&key).unwrap(), "{key}");
    }
}

/// The rotary angles of a case's ids.
fn model_rope(model: &Flux<B>, io: &WeightFiles) -> tpgrpo::model::Rope<B> {
    model.rope_from_ids(&ids(io, "txt_ids"), &ids(io, "img_ids"), &common::device()).unwrap()
}

/// A model read from the BFL single file saves as a diffusers folder with exactly the keys and
/// shapes diffusers wrote for the same configuration, and reads back to the same parameters.
#[test]
fn bfl_to_diffusers_round_trips() {
    let device = common::device();
    let model = load(&fixtures().join("bfl_single_file"));
    let dir = common::scratch("flux-save");
    model.save_diffusers(&dir).unwrap();
    let ours = WeightFiles::open(dir.join("diffusion_pytorch_model.safetensors")).unwrap();
    let theirs = fixtures().join("guidance_square/transformer/diffusion_pytorch_model.safetensors");
    let theirs = WeightFiles::open(theirs).unwrap();
    let shapes = |f: &WeightFiles| -> std::collections::BTreeMap<String, Vec<usize>> {
        f.keys().map(|k| (k.to_string(), f.info(k).unwrap().shape.clone())).collect()
    };
    assert_eq!(shapes(&ours), shapes(&theirs));
    let back = Flux::<B>::load(&dir, &device).unwrap();
    assert_eq!(back.config, model.config);
    let params = |m: &Flux<B>| tpgrpo::weights::export_params(m);
    assert!(params(&back) == params(&model), "parameters changed in the round trip");
}
