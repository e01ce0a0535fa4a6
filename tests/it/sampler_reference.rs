//! The schedule and the SDE / CPS steps against the float64 reference of
//! tests/fixtures/flow_sde_reference.json (or `$TPGRPO_SDE_FIXTURE`), a copy of the design
//! notes' shared fixture with its header.

use crate::common;

use std::path::PathBuf;

use burn::prelude::*;
use serde_json::Value;
use tpgrpo::backend::Backend as B;
use tpgrpo::sampler::{cps_step, euler_step, sde_step, FlowSchedule};

fn fixture() -> Value {
    let path = std::env::var_os("TPGRPO_SDE_FIXTURE").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/flow_sde_reference.json")
    });
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn f64s(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

/// A fixture array of `shape` as one sample `[1, ...shape]`.
fn tensor(v: &Value, shape: &[usize]) -> Tensor<B, 4> {
    let values: Vec<f32> = f64s(v).into_iter().map(|x| x as f32).collect();
    let dims: [usize; 4] = [1, shape[0], shape[1], shape[2]];
    Tensor::from_data(TensorData::new(values, dims), &common::device())
}

fn assert_tensor(name: &str, ours: Tensor<B, 4>, reference: &Value) {
    let ours: Vec<f32> = ours.into_data().to_vec().unwrap();
    for (i, (a, b)) in ours.iter().zip(f64s(reference)).enumerate() {
        assert!(
            ((*a as f64) - b).abs() <= 1e-5 * b.abs().max(1.0),
            "{name}[{i}]: {a} vs reference {b}"
        );
    }
}

/// 1e-5 relative; the 1e-9 floor only matters for exact zeros (CPS at alpha = 0, whose
/// log-prob is 0 in float64 and f32 rounding noise here).
fn assert_scalar(name: &str, ours: f64, reference: f64) {
    assert!(
        (ours - reference).abs() <= 1e-5 * reference.abs() + 1e-9,
        "{name}: {ours} vs reference {reference}"
    );
}

#[test]
fn schedules_match() {
    let f = fixture();
    for s in f["schedules"].as_array().unwrap() {
        let (n, shift) = (s["num_steps"].as_u64().unwrap() as usize, s["shift"].as_f64().unwrap());
        let ours = FlowSchedule::new(n, shift).unwrap();
        let theirs = f64s(&s["sigmas"]);
        assert_eq!(ours.sigmas.len(), theirs.len());
        for (i, (a, b)) in ours.sigmas.iter().zip(&theirs).enumerate() {
            assert!((a - b).abs() <= 1e-6, "N={n} shift={shift}: sigma[{i}] {a} vs {b}");
        }
    }
    // The note's N=10, s=3 timesteps.
    let t = FlowSchedule::new(10, 3.0).unwrap().timesteps();
    for (a, b) in
        t.iter().zip([1000.0, 960.13, 913.35, 857.69, 790.37, 707.28, 602.15, 464.88, 278.05, 8.93])
    {
        assert!((a - b).abs() < 0.01, "{t:?}");
    }
}

#[test]
fn sde_and_cps_steps_match() {
    let f = fixture();
    for (kind, cases) in [("sde", &f["sde_cases"]), ("cps", &f["cps_cases"])] {
        for (ci, c) in cases.as_array().unwrap().iter().enumerate() {
            let name = format!("{kind} case {ci}");
            let shape: Vec<usize> = c["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            let schedule = FlowSchedule::new(
                c["num_steps"].as_u64().unwrap() as usize,
                c["shift"].as_f64().unwrap(),
            )
            .unwrap();
            let (step, alpha) =
                (c["step_index"].as_u64().unwrap() as usize, c["noise_level"].as_f64().unwrap());
            let (x, v, eps) =
                (tensor(&c["x"], &shape), tensor(&c["v"], &shape), tensor(&c["eps"], &shape));
            let g = match kind {
                "sde" => sde_step(x.clone(), v.clone(), &schedule, step, alpha).unwrap(),
                _ => cps_step(x.clone(), v.clone(), &schedule, step, alpha).unwrap(),
            };
            assert_tensor(&format!("{name} mean"), g.mean.clone(), &c["mean"]);
            let std_key = if kind == "sde" { "step_std" } else { "std" };
            assert_scalar(&format!("{name} std"), g.std, c[std_key].as_f64().unwrap());
            let x_next = g.sample(eps);
            assert_tensor(&format!("{name} x_next"), x_next.clone(), &c["x_next"]);
            match c["log_prob"].as_f64() {
                Some(lp) => {
                    // Re-score the reference's x_next, as training does.
                    let ours = g
                        .log_prob(tensor(&c["x_next"], &shape))
                        .unwrap()
                        .into_scalar()
                        .elem::<f64>();
                    assert_scalar(&format!("{name} log_prob"), ours, lp);
                }
                None => {
                    // alpha = 0: exactly Euler, and no log-probability.
                    assert!(g.log_prob(x_next.clone()).is_err(), "{name}");
                    let (s, sn) = (schedule.sigmas[step], schedule.sigmas[step + 1]);
                    let euler: Vec<f32> = euler_step(x, v, s, sn).into_data().to_vec().unwrap();
                    assert_eq!(euler, x_next.into_data().to_vec::<f32>().unwrap(), "{name}");
                }
            }
        }
    }
}

#[test]
fn invalid_steps_are_rejected() {
    let dev = common::device();
    assert!(FlowSchedule::new(1, 3.0).unwrap_err().to_string().contains("num_steps"));
    assert!(FlowSchedule::new(10, 0.0).unwrap_err().to_string().contains("shift"));
    let s = FlowSchedule::new(10, 3.0).unwrap();
    let x = Tensor::<B, 4>::zeros([1, 1, 2, 2], &dev);
    assert!(sde_step(x.clone(), x.clone(), &s, 0, -0.1)
        .unwrap_err()
        .to_string()
        .contains("noise_level"));
    assert!(sde_step(x.clone(), x.clone(), &s, 10, 0.7)
        .unwrap_err()
        .to_string()
        .contains("step_index"));
    // alpha = 0 makes the SDE step Euler: it has no density.
    let euler = sde_step(x.clone(), x.clone(), &s, 3, 0.0).unwrap();
    assert!(euler.log_prob(x).unwrap_err().to_string().contains("alpha = 0"));
}
