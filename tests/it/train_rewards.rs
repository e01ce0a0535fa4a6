//! The main job as a user runs it: `train_sd3 --model <tiny SD3 folder> --prompts <txt folder>
//! --reward pickscore=<tiny CLIP> --reward aesthetic=<tiny CLIP>:0.5`, the example binary built
//! by `cargo test`, trained end to end with every reward logged in `metrics.jsonl`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use tpgrpo::train::EpochMetrics;

fn fixtures(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(sub)
}

#[test]
fn train_sd3_trains_on_a_prompt_folder_with_clip_rewards() {
    let dir = common::scratch("train-rewards");
    let prompts = dir.join("prompts");
    std::fs::create_dir_all(&prompts).unwrap();
    std::fs::write(prompts.join("train.txt"), "a cat on a mat\na red car\na bowl of fruit\n")
        .unwrap();
    std::fs::write(prompts.join("test.txt"), "a dog\na blue house\n").unwrap();
    let out = dir.join("run");
    let mut cmd = Command::new(common::example_binary("train_sd3"));
    cmd.arg("--model").arg(fixtures("pipeline/sd3_tiny"));
    cmd.arg("--prompts").arg(&prompts);
    cmd.arg("--reward").arg(format!("pickscore={}", fixtures("reward/pickscore").display()));
    cmd.arg("--reward").arg(format!("aesthetic={}:0.5", fixtures("reward/clip").display()));
    cmd.args(["--resolution", "64", "--out"]).arg(&out);
    for s in common::TINY_SD3_SETTINGS {
        cmd.args(["--set", s]);
    }
    let o = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("rewards  aesthetic"), "per-reward line: {stdout}");
    assert!(out.join("checkpoints/epoch-00002/adapter/adapter_model.safetensors").is_file());

    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let logged: Vec<EpochMetrics> =
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(logged.last().unwrap().eval_reward.is_some_and(f64::is_finite));
    let trained: Vec<&EpochMetrics> = logged.iter().filter(|m| m.epoch > 0).collect();
    assert_eq!(trained.len(), 2);
    for m in trained {
        let names: Vec<&str> = m.reward_terms.keys().map(String::as_str).collect();
        assert_eq!(names, ["aesthetic", "pickscore"]);
        // The logged total is the weighted sum of the logged terms (means are linear).
        let sum = m.reward_terms["pickscore"] + 0.5 * m.reward_terms["aesthetic"];
        assert!((m.reward_mean - sum).abs() < 1e-9, "{} vs {sum}", m.reward_mean);
        assert!(m.reward_std > 0.0, "different samples must score differently");
    }

    // A reward path that does not exist fails before the transformer is read, naming it.
    let o = Command::new(common::example_binary("train_sd3"))
        .arg("--model")
        .arg(fixtures("pipeline/sd3_tiny"))
        .args(["--reward", "pickscore=/no/such/folder", "--out"])
        .arg(dir.join("run2"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("/no/such/folder: no such folder"), "{err}");
}

/// The command line checks its enumerations, has a version, and its help names every reward
/// kind (issue 36, item 6: `--objective` took any string, `--reward` omitted the servers).
#[test]
fn train_sd3_checks_its_options_and_documents_every_reward_kind() {
    let run = |args: &[&str]| {
        Command::new(common::example_binary("train_sd3")).args(args).output().unwrap()
    };
    let o = run(&["--objective", "ppo"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("tp-grpo") && err.contains("flow-grpo"), "{err}");
    let o = run(&["--version"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && out.contains(env!("CARGO_PKG_VERSION")), "{out}");
    let help = String::from_utf8_lossy(&run(&["--help"]).stdout).to_string();
    for kind in [
        "pickscore=DIR",
        "clipscore=DIR",
        "aesthetic=DIR",
        "server=URL",
        "json-server=URL",
        "toy-alignment",
        "toy-geneval",
        "--no-progress",
    ] {
        assert!(help.contains(kind), "{kind}: {help}");
    }
}
