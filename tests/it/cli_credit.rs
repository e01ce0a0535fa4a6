//! The `tpgrpo credit` inspector: tables, JSON, and clear errors on bad input.

use crate::common;

use std::process::Command;

fn run(input: &str, json: bool) -> (bool, String, String) {
    let dir = common::scratch(&format!("cli-{:x}", input.len() * 31 + usize::from(json)));
    let path = dir.join("rewards.json");
    std::fs::write(&path, input).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tpgrpo"));
    cmd.args(["credit", "--input"]).arg(&path);
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

const WORKED: &str = r#"{"batch": [[0.5, 0.48, 0.47, 0.52, 0.55], [0.6, 0.62, 0.58, 0.57, 0.57]], "prompt_ids": [0, 0]}"#;

#[test]
fn prints_a_table_and_json() {
    let (ok, out, err) = run(WORKED, false);
    assert!(ok, "{err}");
    assert!(
        out.contains("trajectory 0 (prompt 0)") && out.contains("trajectory 1 (prompt 0)"),
        "{out}"
    );
    // The worked example of docs/objective.md: step 2 of trajectory 0 is a turning point
    // credited 0.55 - 0.47 = +0.08.
    let step2 =
        out.lines().find(|l| l.trim_start().starts_with("2 ") && l.contains('*')).expect(&out);
    assert!(step2.contains("+0.0800"), "{step2}");
    assert!(out.contains("2 turning point(s) credited"), "{out}");

    let (ok, out, err) = run(WORKED, true);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["trajectories"][0]["turning_points"],
        serde_json::json!([false, false, true, false])
    );
    assert_eq!(v["options"]["balance_key"], "delta");
}

#[test]
fn bad_input_gets_a_clear_error() {
    let cases = [
        (r#"{"batch": [[0.1, 0.2], [0.1]], "prompt_ids": [0, 0]}"#, "ragged rows"),
        (r#"{"batch": [[0.1]], "prompt_ids": [0]}"#, "at least [R_ode, R_sde]"),
        (r#"{"batch": [[0.1, NaN]], "prompt_ids": [0]}"#, "invalid credit input"),
        (
            r#"{"batch": [[0.1, 0.2]], "prompt_ids": [0], "options": {"consistent": true}}"#,
            "`consistent`: unknown option",
        ),
        (
            r#"{"batch": [[0.1, 0.2]], "prompt_ids": [0], "options": {"balance_key": "max"}}"#,
            "`balance_key`: invalid value",
        ),
        (r#"{"batch": [[0.1, 0.2]], "prompt_ids": [0, 1]}"#, "prompt_ids"),
        (r#"{"batch": [], "prompt_ids": []}"#, "is empty"),
        // Finite rewards whose derived quantities overflow f64, each named where computed:
        // a step reward, Delta and agg (differences), a group's mean (a sum), its deviation
        // (squares).
        (r#"{"batch": [[-1e308, 1e308, 0]], "prompt_ids": [0]}"#, "row 0: d_0 = 1e308 - -1e308"),
        (
            r#"{"batch": [[0, 0], [1e308, -1e308]], "prompt_ids": [0, 0]}"#,
            "row 1: Delta = R_sde - R_ode = -1e308 - 1e308 overflows",
        ),
        (
            r#"{"batch": [[0, 1e308], [0, 1e308]], "prompt_ids": [0, 0]}"#,
            "the mean of prompt 0's step-0 rewards overflows",
        ),
        (
            r#"{"batch": [[0, 1e200], [0, -1e200]], "prompt_ids": [0, 1],
                "options": {"std_scope": "global"}}"#,
            "the standard deviation of all samples' step-0 rewards overflows",
        ),
    ];
    for (input, message) in cases {
        let (ok, _, err) = run(input, false);
        assert!(!ok, "{input} was accepted");
        assert!(
            err.contains(message) && err.contains("error:"),
            "{input}: stderr {err:?} lacks {message:?}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}
