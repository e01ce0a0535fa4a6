//! The `compare` example on tiny settings: at equal NFE each objective stops once it has spent
//! the budget (TP-GRPO spends more a sample, so it trains fewer epochs), and a sweep writes a
//! row per objective and value; a bad sweep is refused before any run, naming the key.

use std::process::Command;

use crate::common;

const TINY: [&str; 8] = [
    "epochs=30",
    "prompts_per_epoch=2",
    "group_size=4",
    "rollout.num_steps=3",
    "rollout.window_size=1",
    "eval_every=3",
    "eval_prompts=4",
    "eval_steps=3",
];

fn compare(out: &std::path::Path, extra: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new(common::example_binary("compare"));
    cmd.arg("--out").arg(out).args(["--seeds", "0"]).args(extra);
    for s in TINY {
        cmd.args(["--set", s]);
    }
    let o = cmd.output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (o.status.success(), text(&o.stdout), text(&o.stderr))
}

/// The `| objective | seed | ... |` rows of a table, split into cells.
fn rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .filter(|l| l.starts_with("| tp-grpo") || l.starts_with("| flow-grpo"))
        .map(|l| l.trim_matches('|').split('|').map(|c| c.trim().to_string()).collect())
        .collect()
}

#[test]
fn equal_compute_and_sweeps() {
    let out = common::scratch("compare-nfe");
    // TP-GRPO spends more a sample (its ODE completions) than Flow-GRPO (the rollout alone), so
    // at 8 samples an epoch a budget of 200 NFE lasts it fewer epochs; each run stops in the
    // epoch that reaches the budget.
    let (ok, stdout, err) = compare(&out, &["--budget-nfe", "200"]);
    assert!(ok, "{stdout}\n{err}");
    let table = std::fs::read_to_string(out.join("results.md")).unwrap();
    let runs = rows(&table);
    let cell = |objective: &str, col: usize| -> f64 {
        let row = runs.iter().find(|r| r[0] == objective && r[1] == "0").unwrap();
        row[col].parse().unwrap_or_else(|_| panic!("{objective}: {row:?}"))
    };
    // Columns: epochs 7, NFE / sample 8, NFE 9.
    for objective in ["tp-grpo", "flow-grpo"] {
        let (epochs, per_sample, nfe) =
            (cell(objective, 7), cell(objective, 8), cell(objective, 9));
        assert!(nfe >= 200.0 && nfe - per_sample * 8.0 < 200.0, "{objective}: {nfe} NFE");
        assert_eq!(nfe, epochs * per_sample * 8.0, "{objective}");
    }
    assert!(cell("tp-grpo", 7) < cell("flow-grpo", 7), "{table}");
    for chart in ["compare.png", "compare-seconds.png", "compare-nfe.png"] {
        assert!(image::open(out.join(chart)).is_ok(), "{chart}");
    }

    let out = common::scratch("compare-sweep");
    let (ok, stdout, err) =
        compare(&out, &["--sweep", "rollout.noise_level=0.5,0.9", "--set", "epochs=1"]);
    assert!(ok, "{stdout}\n{err}");
    let table = std::fs::read_to_string(out.join("sweep.md")).unwrap();
    let cells: Vec<(String, String)> =
        rows(&table).into_iter().map(|r| (r[0].clone(), r[1].clone())).collect();
    let expected: Vec<(String, String)> =
        [("tp-grpo", "0.5"), ("tp-grpo", "0.9"), ("flow-grpo", "0.5"), ("flow-grpo", "0.9")]
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .into();
    assert_eq!(cells, expected, "{table}");
    assert!(image::open(out.join("sweep.png")).is_ok());
    let (ok, _, err) = compare(&out, &["--sweep", "rollout.noise=0.5"]);
    assert!(!ok && err.contains("rollout.noise"), "{err}");
}
