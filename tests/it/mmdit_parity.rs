//! Parity of the MMDiT with diffusers' SD3Transformer2DModel on every case folder under
//! tests/fixtures/mmdit/ (or `$TPGRPO_MMDIT_FIXTURES`), written by tests/fixtures/gen_mmdit.py.

use crate::common;

use std::path::{Path, PathBuf};

use tpgrpo::backend::Backend as B;
use tpgrpo::model::MMDiT;
use tpgrpo::weights::WeightFiles;

/// The model inside a case folder: its `transformer/` or its one single-file checkpoint.
fn model_path(case: &Path) -> PathBuf {
    let transformer = case.join("transformer");
    if transformer.is_dir() {
        return transformer;
    }
    let single: Vec<PathBuf> = std::fs::read_dir(case)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.ends_with(".safetensors")
                && name != "inputs.safetensors"
                && name != "expected.safetensors"
        })
        .collect();
    assert_eq!(single.len(), 1, "{}: expected transformer/ or one checkpoint file", case.display());
    single[0].clone()
}

#[test]
fn mmdit_matches_diffusers_on_every_case() {
    let root = std::env::var_os("TPGRPO_MMDIT_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(common::mmdit_fixtures);
    let cases = common::case_folders(&root, "expected.safetensors");

    let device = common::device();
    let mut failures = Vec::new();
    for case in &cases {
        let model = MMDiT::<B>::load(model_path(case), &device)
            .unwrap_or_else(|e| panic!("{}: load failed: {e}", case.display()));
        let inputs = WeightFiles::open(case.join("inputs.safetensors")).unwrap();
        let expected = WeightFiles::open(case.join("expected.safetensors")).unwrap();
        let out = common::mmdit_forward(&model, &inputs);
        let name = case.file_name().unwrap().to_string_lossy();
        if let Err(e) = common::parity(&name, out, &expected, "sample", 1e-4) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "parity failures:\n{}", failures.join("\n"));
    if std::env::var_os("TPGRPO_MMDIT_FIXTURES").is_none() {
        assert!(cases.len() >= 5, "expected the 5 committed cases, found {}", cases.len());
    }
}
