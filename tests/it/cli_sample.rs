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
