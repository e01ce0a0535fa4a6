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

/// A fresh scratch folder under the system temp dir, unique to this process and `name`.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tpgrpo-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The committed MMDiT fixture folder.
pub fn mmdit_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mmdit")
}

/// Max |a - b| over two equally shaped tensors, and max |b|.
pub fn max_diff<const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> (f32, f32) {
    assert_eq!(a.dims(), b.dims(), "shape mismatch");
    let diff: f32 = (a - b.clone()).abs().max().into_scalar().elem();
    let scale: f32 = b.abs().max().into_scalar().elem();
    (diff, scale)
}
