//! `tpgrpo train`: the trainer of the installed binary. `--print-config` shows the effective
//! settings and task in the order options override them and reads back as `--config`; the
//! committed `configs/` are complete and valid; a tiny toy run trains and checkpoints.

use std::path::Path;
use std::process::Command;

use crate::common;

fn train(args: &[&str]) -> (bool, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_tpgrpo")).arg("train").args(args).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (o.status.success(), text(&o.stdout), text(&o.stderr))
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn print_config_shows_what_overrides_what_and_reads_back() {
    let dir = common::scratch("cli-train-config");
    let file = dir.join("settings.json");
    std::fs::write(
        &file,
        r#"{"task": {"model": "m", "reward": ["toy-geneval"], "resolution": 256},
            "epochs": 7, "rollout": {"noise_level": 0.5}, "objective": {"kl_beta": 0.01}}"#,
    )
    .unwrap();
    let file_arg = file.to_str().unwrap();
    let (ok, out, err) = train(&[
        "--config",
        file_arg,
        "--set",
        "epochs=9",
        "--resolution",
        "128",
        "--objective",
        "flow-grpo",
        "--print-config",
    ]);
    assert!(ok, "{err}");
    let v = json(&out);
    // Defaults < file < command line.
    assert_eq!(v["task"]["model"], "m");
    assert_eq!(v["task"]["reward"], serde_json::json!(["toy-geneval"]));
    assert_eq!(v["task"]["resolution"], 128);
    assert_eq!(v["epochs"], 9);
    assert_eq!(v["rollout"]["noise_level"], 0.5);
    assert_eq!(v["rollout"]["num_steps"], 10, "a default the file leaves alone");
    assert_eq!(v["objective"]["objective"], "flow-grpo");
    assert_eq!(v["objective"]["kl_beta"], 0.01);
    // What it printed is a settings file giving the same.
    let printed = dir.join("printed.json");
    std::fs::write(&printed, &out).unwrap();
    let (ok, again, err) = train(&["--config", printed.to_str().unwrap(), "--print-config"]);
    assert!(ok, "{err}");
    assert_eq!(json(&again), v, "the objective a file names is not replaced by a default");
    // Mistakes are named.
    std::fs::write(&file, r#"{"task": {"modle": "m"}}"#).unwrap();
    let (ok, _, err) = train(&["--config", file_arg, "--print-config"]);
    assert!(!ok && err.contains("settings.json") && err.contains("modle"), "{err}");
    std::fs::write(&file, r#"{"rollout": {"noise": 0.5}}"#).unwrap();
    let (ok, _, err) = train(&["--config", file_arg, "--print-config"]);
    assert!(!ok && err.contains("rollout.noise"), "{err}");
}

#[test]
fn the_committed_configs_are_complete_settings() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let (ok, out, err) = train(&["--config", path.to_str().unwrap(), "--print-config"]);
            assert!(ok, "{}: {err}", path.display());
            let committed = json(&std::fs::read_to_string(&path).unwrap());
            assert_eq!(
                json(&out),
                committed,
                "{}: not the full effective settings",
                path.display()
            );
            assert!(
                committed["task"]["model"].is_string() && committed["task"]["prompts"].is_string()
            );
            names.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    names.sort();
    assert_eq!(
        names,
        ["sd35-medium-geneval.json", "sd35-medium-ocr.json", "sd35-medium-pickscore.json"]
    );
}

#[test]
fn train_runs_the_toy_task() {
    let out = common::scratch("cli-train-toy");
    let mut args = vec!["--out", out.to_str().unwrap(), "--no-progress"];
    for s in ["epochs=1", "prompts_per_epoch=2", "group_size=2", "rollout_batch=4"] {
        args.extend(["--set", s]);
    }
    for s in ["train_batch=4", "rollout.num_steps=3", "rollout.window_size=1", "eval_every=0"] {
        args.extend(["--set", s]);
    }
    let (ok, stdout, err) = train(&args);
    assert!(ok, "{stdout}\n{err}");
    assert!(stdout.contains("tpgrpo train: embedded toy task"), "{stdout}");
    let checkpoint = out.join("checkpoints/epoch-00001");
    assert!(checkpoint.join("adapter/adapter_model.safetensors").is_file());
    assert!(checkpoint.join("adapter/pytorch_lora_weights.safetensors").is_file());
    assert!(checkpoint.join("ema/pytorch_lora_weights.safetensors").is_file());
}

#[test]
fn train_detects_a_flux_folder_and_trains_it() {
    let model =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/flux/pipeline/flux_tiny");
    let model = model.to_str().unwrap();
    // FLUX.1-dev's reference settings, with the folder's dynamic shift.
    let (ok, out, err) = train(&["--model", model, "--print-config"]);
    assert!(ok, "{err}");
    let v = json(&out);
    assert_eq!(
        (v["rollout"]["num_steps"].as_u64(), v["rollout"]["guidance"].as_f64()),
        (Some(6), Some(3.5))
    );
    assert_eq!(v["rollout"]["dynamic_shift"]["max_shift"], 1.15);
    assert_eq!(v["lora"]["rank"], 64);

    let out = common::scratch("cli-train-flux");
    let mut args = vec!["--model", model, "--out", out.to_str().unwrap(), "--no-progress"];
    args.extend(["--reward", "toy-geneval", "--resolution", "32"]);
    for s in ["epochs=1", "prompts_per_epoch=2", "group_size=2", "rollout_batch=4"] {
        args.extend(["--set", s]);
    }
    for s in ["train_batch=4", "rollout.num_steps=3", "rollout.window_size=1", "eval_every=0"] {
        args.extend(["--set", s]);
    }
    args.extend(["--set", "lora.rank=4"]);
    let (ok, stdout, err) = train(&args);
    assert!(ok, "{stdout}\n{err}");
    let checkpoint = out.join("checkpoints/epoch-00001");
    assert!(checkpoint.join("adapter/pytorch_lora_weights.safetensors").is_file(), "{stdout}");
    let state = std::fs::read_to_string(checkpoint.join("trainer_state.json")).unwrap();
    assert!(state.contains("num_single_layers"), "the run records the FLUX transformer");
}
