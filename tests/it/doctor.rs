//! `tpgrpo doctor` on the CPU backend: every stage runs, checks its result against the host and
//! reports a time.

use burn::backend::{Autodiff, NdArray};
use tpgrpo::doctor::{run, DoctorConfig};

#[test]
fn every_stage_passes_on_ndarray_and_is_reported_in_order() {
    let device = Default::default();
    let mut out = Vec::new();
    let config = DoctorConfig::new().with_epoch(false).with_batch(4);
    let stages = run::<Autodiff<NdArray>>(&config, &device, &mut out).expect("doctor passes");
    let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "backend and device",
            "matmul 256x256 (first call)",
            "matmul 256x256 (second call)",
            "element-wise exp, mul, add",
            "attention 2x2x64x32",
            "toy forward (first call)",
            "toy forward (second call)",
            "toy forward bf16 vs f32",
            "LoRA forward+backward (first)",
            "LoRA forward+backward (second)",
        ]
    );
    // NdArray computes no bf16: the comparison is reported as skipped, not passed.
    assert!(stages[7].detail.starts_with("skipped"), "{}", stages[7].detail);
    let text = String::from_utf8(out).expect("utf-8");
    for s in &stages {
        assert!(s.seconds >= 0.0 && s.seconds.is_finite());
        assert!(text.contains(&s.name) && text.contains(&s.detail), "{text}");
    }
}
