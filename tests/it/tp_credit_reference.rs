//! TP-GRPO credit assignment and advantages against the float64 reference cases of
//! tests/fixtures/tp_credit_reference.json (or `$TPGRPO_TP_FIXTURE`), a copy of the design
//! notes' shared fixture with its header.

use std::path::PathBuf;

use serde_json::Value;
use tpgrpo::grpo::{
    credit_batch, flow_grpo_advantages, mean_abs_step_rewards, tp_grpo_advantages, ObjectiveConfig,
    StdScope,
};

fn fixture_path() -> PathBuf {
    std::env::var_os("TPGRPO_TP_FIXTURE").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tp_credit_reference.json")
    })
}

fn f64s(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

fn rows(v: &Value) -> Vec<Vec<f64>> {
    v.as_array().unwrap().iter().map(f64s).collect()
}

fn assert_close(name: &str, case: &str, ours: &[f64], theirs: &[f64]) {
    assert_eq!(ours.len(), theirs.len(), "{case}: {name} length");
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        assert!((a - b).abs() <= 1e-9, "{case}: {name}[{i}] = {a}, reference {b}");
    }
}

#[test]
fn credit_and_advantages_match_the_reference() {
    let path = fixture_path();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let fixture: Value = serde_json::from_str(&text).unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let options = case["options"].as_object().unwrap();
        let cfg = ObjectiveConfig::new()
            .with_overrides(options)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let batch = rows(&case["batch"]);
        let prompts: Vec<usize> = case["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_u64().unwrap() as usize)
            .collect();
        let expected = &case["expected"];

        let credits = credit_batch(&batch, &cfg).unwrap();
        for (i, c) in credits.iter().enumerate() {
            let case_i = format!("{name}, trajectory {i}");
            assert_close(
                "step_rewards",
                &case_i,
                &c.step_rewards,
                &f64s(&expected["step_rewards"][i]),
            );
            let tp: Vec<bool> = expected["turning_points"][i]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_bool().unwrap())
                .collect();
            assert_eq!(c.turning_points, tp, "{case_i}: turning points");
            assert_close(
                "credited_rewards",
                &case_i,
                &c.credited_rewards,
                &f64s(&expected["credited_rewards"][i]),
            );
        }

        let credited: Vec<Vec<f64>> = credits.iter().map(|c| c.credited_rewards.clone()).collect();
        let adv = tp_grpo_advantages(&credited, &prompts, StdScope::Group, 1e-4).unwrap();
        for (i, row) in adv.iter().enumerate() {
            assert_close(
                "tp_grpo_advantages",
                &format!("{name}, trajectory {i}"),
                row,
                &f64s(&expected["tp_grpo_advantages"][i]),
            );
        }
        let finals: Vec<f64> = batch.iter().map(|r| r[r.len() - 1]).collect();
        let group = flow_grpo_advantages(&finals, &prompts, StdScope::Group, 1e-4).unwrap();
        assert_close(
            "flow_grpo_advantages_group_std",
            name,
            &group,
            &f64s(&expected["flow_grpo_advantages_group_std"]),
        );
        let global = flow_grpo_advantages(&finals, &prompts, StdScope::Global, 1e-4).unwrap();
        assert_close(
            "flow_grpo_advantages_global_std",
            name,
            &global,
            &f64s(&expected["flow_grpo_advantages_global_std"]),
        );
        println!("{name}: ok ({} trajectories)", batch.len());
    }
}

#[test]
fn mean_step_reward_change_by_hand() {
    // Rows [R_ode, R_1, R_sde]: |d_0| = 1 and 0, |d_1| = 0.5 and 1.
    let batch = [vec![0.0, 1.0, 0.5], vec![1.0, 1.0, 0.0]];
    let credits = credit_batch(&batch, &ObjectiveConfig::new()).unwrap();
    assert_eq!(mean_abs_step_rewards(&credits).unwrap(), vec![0.5, 0.75]);
    // No trajectories (Flow-GRPO computes no completions): no steps to report.
    assert!(mean_abs_step_rewards(&[]).unwrap().is_empty());
}
