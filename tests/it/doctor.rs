//! `tpgrpo doctor` on the CPU backend: every stage runs, checks its result against the host and
//! reports a time.

use burn::backend::{Autodiff, NdArray};
use std::sync::Mutex;

use tpgrpo::doctor::{run, DoctorConfig, Event};

#[test]
fn every_stage_passes_on_ndarray_and_is_reported_in_order() {
    let device = Default::default();
    let passed = Mutex::new(Vec::new());
    let report = |e: Event<'_>| {
        if let Event::Passed(s) = e {
            passed.lock().unwrap().push(s.clone());
        }
    };
    let config = DoctorConfig::new().with_epoch(false).with_batch(4);
    let stages = run::<Autodiff<NdArray>>(&config, &device, &report).expect("doctor passes");
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
    for s in &stages {
        assert!(s.seconds >= 0.0 && s.seconds.is_finite());
    }
    assert_eq!(passed.into_inner().unwrap(), stages, "each stage reported as it passed");
}
