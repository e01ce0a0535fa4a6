//! Training over MPI (`mpi` feature) on this machine: `mpirun --oversubscribe -np 2` ranks of
//! the `tpgrpo` binary on loopback, against one process of the same settings; a failing, a
//! killed and a panicking rank stop the job; ranks that train different settings or model
//! weights are refused, naming the difference.
//!
//! Needs Open MPI's `mpirun` (`apt-get install -y openmpi-bin libopenmpi-dev`; `.ci/run`
//! installs it) and runs with `cargo test --release --features mpi --test mpi`.

#[path = "it/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use tpgrpo::train::{read_metrics, EpochMetrics};

/// The arguments of `tpgrpo train` after `train` with `common::DATA_PARALLEL_SETTINGS` (two
/// ranks draw one process's rollout chunks), `extra` settings and output `out`.
fn train_args(out: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["--no-progress".to_string(), "--out".into()];
    args.push(out.display().to_string());
    for s in common::DATA_PARALLEL_SETTINGS.iter().chain(extra) {
        args.extend(["--set".to_string(), s.to_string()]);
    }
    args
}

/// `mpirun` with Open MPI's settings for this machine: as many ranks as asked on its cores,
/// as root where the tests run as root.
fn mpirun() -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.arg("--oversubscribe")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    cmd
}

/// `ranks` MPI ranks each running `tpgrpo train --mpi` with its own arguments (MPMD:
/// `-np 1 A : -np 1 B`), stopped if they run past `limit`.
fn run_ranks(ranks: &[Vec<String>], limit: Duration) -> (Output, Duration) {
    let mut cmd = mpirun();
    for (i, args) in ranks.iter().enumerate() {
        if i > 0 {
            cmd.arg(":");
        }
        cmd.args(["-np", "1", env!("CARGO_BIN_EXE_tpgrpo"), "train", "--mpi"]).args(args);
    }
    wait(cmd, limit, |_| {})
}

/// Runs `cmd`, calling `during` with its process id once, and kills it past `limit`.
fn wait(mut cmd: Command, limit: Duration, during: impl FnOnce(u32)) -> (Output, Duration) {
    let start = Instant::now();
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("mpirun");
    during(child.id());
    let pid = child.id();
    let watchdog = std::thread::spawn(move || {
        while start.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(200));
            if !Path::new(&format!("/proc/{pid}")).exists() {
                return;
            }
        }
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    });
    let output = child.wait_with_output().unwrap();
    let took = start.elapsed();
    drop(watchdog);
    assert!(took < limit, "the job ran past {limit:?}: {}", text(&output));
    (output, took)
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// One process of `tpgrpo train` (no MPI) with `args`, writing to `out`.
fn single(out: &Path, args: &[String]) -> Vec<EpochMetrics> {
    let o = Command::new(env!("CARGO_BIN_EXE_tpgrpo")).arg("train").args(args).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    read_metrics(&out.join("metrics.jsonl")).unwrap()
}

/// What an epoch computes before its first optimizer step, which a data-parallel run
/// reproduces bit for bit (the ranks draw the single process's rollout chunks and gather
/// the rewards exactly); the adapters after AdamW are not (see `tests/it/data_parallel.rs`).
fn before_update(m: &EpochMetrics) -> impl PartialEq + std::fmt::Debug {
    let m = m.clone();
    (
        m.epoch,
        m.reward_mean,
        m.reward_std,
        m.credit,
        m.nfe_per_sample,
        m.reward_terms,
        m.optimizer_steps,
    )
}

/// Two ranks run the single process's first epoch bit for bit and as many optimizer steps in
/// the second; rank 0 alone writes the metrics and checkpoints. A run of one epoch in one
/// process, resumed on two ranks for the second, draws the single process's second epoch bit
/// for bit (its rollouts depend only on the adapters after the first epoch).
#[test]
fn two_ranks_train_like_one_process_and_resume_across_rank_counts() {
    let first = common::scratch("mpi-one");
    let one = single(&first, &train_args(&first, &["epochs=2"]));
    let out = common::scratch("mpi-two");
    let args = train_args(&out, &["epochs=2"]);
    let (o, _) = run_ranks(&[args.clone(), args], Duration::from_secs(300));
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(stdout.matches("tpgrpo train:").count(), 1, "rank 0 alone reports: {stdout}");
    assert!(stdout.contains("x 2 MPI ranks"), "{stdout}");
    let two = read_metrics(&out.join("metrics.jsonl")).unwrap();
    assert_eq!(two.len(), 2);
    assert_eq!(before_update(&one[0]), before_update(&two[0]));
    assert!(one[0].optimizer_steps > 0, "the first epoch had no reward signal");
    assert_eq!(one[1].optimizer_steps, two[1].optimizer_steps);
    assert!(out.join("checkpoints/epoch-00002/trainer_state.json").is_file());

    let resumed = common::scratch("mpi-resumed");
    single(&resumed, &train_args(&resumed, &["epochs=1"]));
    let mut args = train_args(&resumed, &["epochs=2"]);
    args.push("--resume".into());
    let (o, _) = run_ranks(&[args.clone(), args], Duration::from_secs(300));
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("resumed after epoch 1"), "{}", text(&o));
    let after = read_metrics(&resumed.join("metrics.jsonl")).unwrap();
    assert_eq!(after.len(), 2);
    assert_eq!(before_update(&one[1]), before_update(&after[1]));
}

/// Ranks whose settings differ, or whose model folders hold different weights, are refused
/// at start by every rank, with the setting or tensor and both values named.
#[test]
fn ranks_that_train_different_things_are_refused() {
    let out = common::scratch("mpi-settings");
    let a = train_args(&out, &["epochs=1"]);
    let b = train_args(&out, &["epochs=1", "rollout.noise_level=0.9"]);
    let (o, _) = run_ranks(&[a, b], Duration::from_secs(120));
    assert!(!o.status.success(), "{}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains(
            "rank 1 does not train what rank 0 trains: setting `rollout.noise_level`: 0.7 on \
             rank 0, 0.9 on rank 1"
        ),
        "{}",
        text(&o)
    );
    assert!(read_metrics(&out.join("metrics.jsonl")).unwrap().is_empty(), "nothing trained");

    // The tiny SD3 folder, and a copy whose transformer has one tensor changed.
    let dir = common::scratch("mpi-model");
    let original = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pipeline/sd3_tiny");
    let changed = dir.join("sd3_tiny_changed");
    copy_dir(&original, &changed);
    let weights = changed.join("transformer/diffusion_pytorch_model.safetensors");
    let changed_key = change_one_tensor(&weights);
    let model_args = |model: &Path| {
        let mut args: Vec<String> =
            ["--no-progress", "--resolution", "64", "--out"].map(String::from).into();
        args.push(dir.join("run").display().to_string());
        args.extend(["--model".into(), model.display().to_string()]);
        for s in common::TINY_SD3_SETTINGS {
            args.extend(["--set".to_string(), s.to_string()]);
        }
        args
    };
    let (o, _) =
        run_ranks(&[model_args(&original), model_args(&changed)], Duration::from_secs(120));
    assert!(!o.status.success(), "{}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("rank 1 does not train what rank 0 trains: 1 parameter(s) differ, first `"),
        "{}",
        text(&o)
    );
    assert!(stderr.contains(&changed_key), "names `{changed_key}`: {}", text(&o));
}

/// Copies folder `from` to `to`, recursively.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Rewrites the safetensors file `path` with its first float tensor's first element changed;
/// returns the tensor's key.
fn change_one_tensor(path: &Path) -> String {
    use safetensors::tensor::TensorView;
    let bytes = std::fs::read(path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = file.names().into_iter().map(String::from).collect();
    names.sort();
    let key = names
        .iter()
        .find(|n| n.ends_with(".weight") && n.starts_with("transformer_blocks.0.attn.to_q"))
        .expect("a query projection")
        .clone();
    let mut tensors: Vec<(String, Vec<u8>, safetensors::Dtype, Vec<usize>)> = names
        .iter()
        .map(|n| {
            let t = file.tensor(n).unwrap();
            (n.clone(), t.data().to_vec(), t.dtype(), t.shape().to_vec())
        })
        .collect();
    let target = tensors.iter_mut().find(|t| t.0 == key).unwrap();
    // Flip the lowest mantissa bit of the first element, whatever the float type.
    target.1[0] ^= 1;
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, data, dtype, shape)| {
            (n.clone(), TensorView::new(*dtype, shape.clone(), data).unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
    key
}

/// A rank whose start fails (here: a checkpoint that does not exist) while the other waits in
/// the start-up check stops the job at once, the error naming the rank.
#[test]
fn a_failing_rank_stops_the_job() {
    let out = common::scratch("mpi-failing");
    let a = train_args(&out, &["epochs=3"]);
    let mut b = a.clone();
    b.extend(["--resume".into(), out.join("no-such-checkpoint").display().to_string()]);
    let (o, took) = run_ranks(&[a, b], Duration::from_secs(120));
    // The launcher exits with the status rank 1 aborted with. Its own "MPI_ABORT was invoked
    // on rank 1" notice is not checked: Open MPI 4.1's launcher sometimes loses it
    // (`ORTE_ERROR_LOG: Data unpack would read past end of buffer` in show_help.c, open-mpi/ompi
    // #8356), once in CI with every other MPI job of these tests held back.
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    // Rank 1's error is one whole line: written piece by piece, the launcher's notice landed
    // inside it under load (8 of 60 runs beside two busy loops).
    let stderr = String::from_utf8_lossy(&o.stderr);
    let whole = stderr.lines().any(|l| {
        l.starts_with("error: rank 1: ") && l.contains("no-such-checkpoint: does not exist")
    });
    assert!(whole, "{}", text(&o));
    assert!(took < Duration::from_secs(60), "took {took:?}");
}

/// Rank 1, killed (SIGKILL) in the middle of training, stops rank 0 within seconds; the
/// launcher names it, and every checkpoint left is complete.
#[test]
fn a_killed_rank_stops_the_job() {
    let out = common::scratch("mpi-killed");
    let args = train_args(&out, &["epochs=500"]);
    let mut cmd = mpirun();
    cmd.args(["-np", "2", env!("CARGO_BIN_EXE_tpgrpo"), "train", "--mpi"]).args(&args);
    let metrics = out.join("metrics.jsonl");
    let marker = out.display().to_string();
    let mut killed_at = None;
    let (o, _) = wait(cmd, Duration::from_secs(300), |_| {
        // Once rank 0 has logged an epoch, kill rank 1 (found by its arguments and rank).
        let start = Instant::now();
        while read_metrics(&metrics).map_or(true, |m| m.is_empty()) {
            assert!(start.elapsed() < Duration::from_secs(120), "no epoch within two minutes");
            std::thread::sleep(Duration::from_millis(100));
        }
        let pid = rank_pid(&marker, 1).expect("rank 1's process");
        Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
        killed_at = Some(Instant::now());
    });
    let stopped_after = killed_at.unwrap().elapsed();
    assert!(!o.status.success(), "{}", text(&o));
    assert!(stopped_after < Duration::from_secs(30), "rank 0 went on for {stopped_after:?}");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("process rank 1") && stderr.contains("signal 9"), "{}", text(&o));
    // The checkpoints left are whole (a folder is renamed into place once written).
    for entry in std::fs::read_dir(out.join("checkpoints")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("epoch-") {
            assert!(path.join("trainer_state.json").is_file(), "{name} is incomplete");
        }
    }
}

/// The process id of MPI rank `rank` whose command line contains `marker`.
fn rank_pid(marker: &str, rank: usize) -> Option<u32> {
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        let environ = std::fs::read(entry.path().join("environ")).ok()?;
        let has = |bytes: &[u8], s: &str| bytes.split(|&b| b == 0).any(|part| part == s.as_bytes());
        let runs = String::from_utf8_lossy(&cmdline).contains(marker)
            && cmdline.starts_with(env!("CARGO_BIN_EXE_tpgrpo").as_bytes());
        (runs && has(&environ, &want)).then_some(pid)
    })
}

/// A rank that panics while the other waits in a collective aborts the job with
/// `mpi::ABORTED`: dropping the `Mpi` during the unwinding aborts instead of finalizing. This
/// test runs [`rank_of_a_panicking_job`] (this binary again) as two ranks.
#[test]
fn a_panicking_rank_aborts_the_job() {
    let mut cmd = mpirun();
    cmd.args(["-np", "2"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "rank_of_a_panicking_job", "--include-ignored", "--nocapture"])
        .env("TPGRPO_TEST_MPI_JOB", "1");
    let (o, took) = wait(cmd, Duration::from_secs(120), |_| {});
    assert_eq!(o.status.code(), Some(tpgrpo::train::mpi::ABORTED), "{}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("rank 1 panics here"), "{}", text(&o));
    assert!(!stderr.contains("rank 0 was not stopped"), "{}", text(&o));
    assert!(took < Duration::from_secs(60), "took {took:?}");
}

/// One rank of [`a_panicking_rank_aborts_the_job`]: rank 1 panics, rank 0 waits for it in an
/// all-gather. Run any other way it fails, naming the test that runs it.
#[test]
#[ignore = "a rank of a_panicking_rank_aborts_the_job"]
fn rank_of_a_panicking_job() {
    assert!(
        std::env::var("TPGRPO_TEST_MPI_JOB").is_ok(),
        "a rank of a_panicking_rank_aborts_the_job, which runs it under mpirun"
    );
    let mpi = tpgrpo::train::mpi::Mpi::init().unwrap();
    let replica = mpi.replica();
    if replica.rank == 1 {
        panic!("rank 1 panics here");
    }
    let device = Default::default();
    let all = replica.all_gather::<tpgrpo::backend::Backend>(&[1.0], &device).unwrap();
    panic!("rank 0 was not stopped: it gathered {all:?}");
}
