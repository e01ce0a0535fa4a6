//! The trainer end to end on the embedded toy task (ndarray, tiny settings): the loop runs,
//! a run of 2 + 2 epochs with a resume in the middle equals a run of 4 epochs, the metrics
//! agree with credit recomputed from the recorded rewards, and checkpoints, sample grids and
//! the reward curve are written.

use crate::common;

use std::path::Path;

use tpgrpo::backend::{Backend as B, TrainBackend};
use tpgrpo::grpo::{credit_batch, flow_grpo_advantages, tp_grpo_advantages, ObjectiveConfig};
use tpgrpo::model::Adaptable;
use tpgrpo::toy::{self, ToyPipeline, ToyScorer};
use tpgrpo::train::Silent;
use tpgrpo::train::{EpochMetrics, Observer, Phase, TrainConfig, Trainer};

fn config(epochs: usize, objective: &str) -> TrainConfig {
    let sets: Vec<String> = [
        format!("epochs={epochs}"),
        "prompts_per_epoch=2".into(),
        "group_size=3".into(),
        "rollout_batch=4".into(),
        "train_batch=2".into(),
        "optimizer_steps_per_epoch=2".into(),
        "rollout.num_steps=4".into(),
        "rollout.window_size=2".into(),
        "eval_every=2".into(),
        "eval_steps=4".into(),
        "eval_prompts=4".into(),
        "save_every=2".into(),
        "seed=1".into(),
        // The KL penalty's reference pass too (the toy preset trains without it).
        "objective.kl_beta=0.0001".into(),
        format!("objective.objective={objective}"),
    ]
    .into();
    toy::train_config().with_sources(None, &sets).unwrap()
}

fn trainer(cfg: TrainConfig, out: &Path) -> Trainer<TrainBackend, ToyPipeline<B>> {
    toy::trainer(cfg, Box::new(ToyScorer), out, &Default::default()).unwrap()
}

fn factors(t: &Trainer<TrainBackend, ToyPipeline<B>>) -> Vec<(String, Vec<f32>)> {
    let lora = t.model().lora_tensors().into_iter().map(|(n, x)| (n, x.inner()));
    lora.chain(t.ema_tensors().to_vec())
        .map(|(n, x)| (n, x.into_data().to_vec::<f32>().unwrap()))
        .collect()
}

fn without_time(lines: &[EpochMetrics]) -> Vec<EpochMetrics> {
    let untimed = |m: &EpochMetrics| EpochMetrics {
        seconds: 0.0,
        phase_seconds: Default::default(),
        wall_time: 0.0,
        ..m.clone()
    };
    lines.iter().map(untimed).collect()
}

#[test]
fn tp_grpo_runs_and_resumes_identically() {
    let straight = common::scratch("train-straight");
    let mut a = trainer(config(4, "tp-grpo"), &straight);
    let history = a.train(&mut Silent).unwrap();
    assert_eq!(history.len(), 5, "the evaluation before training plus 4 epochs");
    // Two optimizer steps per epoch with an informative sample (an epoch whose advantages
    // are all zero has nothing to learn and makes no step).
    let informative = history[1..].iter().filter(|m| m.credit.samples_used > 0).count();
    assert!(informative > 0, "no epoch had a reward signal: {history:?}");
    assert_eq!(history.last().unwrap().optimizer_steps, 2 * informative as u64);
    for m in &history[1..] {
        assert!(m.reward_mean.is_finite() && m.loss.ratio_mean.is_finite());
        // 4 rollout steps + completions from steps 0 and 1 (4 + 3 evaluations).
        assert_eq!(m.nfe_per_sample, 11.0);
        assert_eq!(m.credit.samples_used + m.credit.samples_dropped, 6);
        // One mean |R_{k+1} - R_k| per trained step; each a mean of differences of scores in [0, 1].
        assert_eq!(m.credit.step_reward_change.len(), 2);
        assert!(m.credit.step_reward_change.iter().all(|d| (0.0..=1.0).contains(d)));
        // Gradient noise is estimated when an optimizer step has two micro-batches (its
        // ceil(used / 2) samples exceed train_batch 2); the variance term is never negative.
        assert_eq!(m.grad_signal_sq.is_some(), m.credit.samples_used >= 5, "{m:?}");
        assert_eq!(m.grad_noise_trace.is_some(), m.credit.samples_used >= 5, "{m:?}");
        assert!(m.grad_noise_trace.is_none_or(|s| s.is_finite() && s >= 0.0), "{m:?}");
    }
    assert!(history.iter().any(|m| m.grad_noise_trace.is_some()), "never estimated: {history:?}");
    assert!(history[0].eval_reward.is_some() && history[2].eval_reward.is_some());
    assert!(history[1].eval_reward.is_none());
    // The first update of an epoch re-scores the sampling policy: ratio 1 up to f32 noise.
    // (The second step of an epoch sees moved weights, so the mean is over both.)
    let first = history[1..].iter().find(|m| m.credit.samples_used > 0).unwrap();
    assert!((first.loss.ratio_mean - 1.0).abs() < 1e-2, "{}", first.loss.ratio_mean);

    let split = common::scratch("train-split");
    let mut b = trainer(config(2, "tp-grpo"), &split);
    b.train(&mut Silent).unwrap();
    let mut b = trainer(config(4, "tp-grpo"), &split);
    b.resume().unwrap();
    assert_eq!(b.epoch(), 2);
    b.train(&mut Silent).unwrap();
    let differing: Vec<(String, f32)> = factors(&a)
        .into_iter()
        .zip(factors(&b))
        .map(|((n, x), (_, y))| {
            (n, x.iter().zip(&y).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max))
        })
        .filter(|(_, d)| *d > 0.0)
        .collect();
    assert!(
        differing.is_empty(),
        "2 + 2 epochs differ from 4 (max |diff| by tensor): {differing:?}"
    );
    let read = |dir: &Path| tpgrpo::train::read_metrics(&dir.join("metrics.jsonl")).unwrap();
    assert_eq!(without_time(&read(&straight)), without_time(&read(&split)));

    for f in [
        "checkpoints/latest",
        "checkpoints/epoch-00004/adapter/adapter_model.safetensors",
        "checkpoints/epoch-00004/adapter/adapter_config.json",
        "checkpoints/epoch-00004/ema/adapter_model.safetensors",
        "checkpoints/epoch-00004/state.safetensors",
        "checkpoints/epoch-00002/trainer_state.json",
        "samples/epoch-00000.png",
        "samples/epoch-00004.png",
    ] {
        assert!(straight.join(f).is_file(), "{f} missing");
    }
    assert!(image::open(straight.join("samples/epoch-00000.png")).is_ok());

    // A checkpoint written before a setting existed loads with that setting's default.
    let dir = split.join("checkpoints/epoch-00004");
    let state = dir.join("trainer_state.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    json["config"].as_object_mut().unwrap().remove("devices").expect("devices is saved");
    std::fs::write(&state, json.to_string()).unwrap();
    let old = tpgrpo::train::checkpoint::load::<B>(&dir, &Default::default()).unwrap();
    assert_eq!(old.state.config.devices, 1);
    assert_eq!(old.state.config.group_size, 3, "the saved settings are kept");

    // Resuming with other settings is refused and names the setting.
    let mut c = trainer(config(4, "flow-grpo"), &split);
    let err = c.resume().unwrap_err().to_string();
    assert!(err.contains("`objective.objective` was \"tp-grpo\", now \"flow-grpo\""), "{err}");
}

/// Records what a run reports.
#[derive(Default)]
struct Events {
    /// `(epoch, phase, total, units advanced)` per phase, in order.
    phases: Vec<(usize, Phase, usize, usize)>,
    /// `(epoch, history length)` per finished epoch, and the last history.
    epochs: Vec<(usize, usize)>,
    last: Vec<EpochMetrics>,
}

impl Observer for Events {
    fn phase(&mut self, epoch: usize, phase: Phase, total: usize) {
        self.phases.push((epoch, phase, total, 0));
    }
    fn advance(&mut self, done: usize) {
        self.phases.last_mut().expect("a phase started first").3 += done;
    }
    fn epoch(&mut self, m: &EpochMetrics, history: &[EpochMetrics]) -> tpgrpo::Result<()> {
        self.epochs.push((m.epoch, history.len()));
        assert_eq!(history.last(), Some(m), "the metrics are the history's last line");
        self.last = history.to_vec();
        Ok(())
    }
}

/// The observer sees the evaluation before training, then per epoch the rollouts (every
/// sample), the updates (every announced unit) and, every `eval_every` epochs, an evaluation;
/// each epoch's metrics after its phases, with the history so far.
#[test]
fn the_observer_sees_every_phase_and_epoch_in_order() {
    let out = common::scratch("train-observed");
    let mut t = trainer(config(2, "tp-grpo"), &out);
    let mut events = Events::default();
    let history = t.train(&mut events).unwrap();
    let kinds: Vec<(usize, Phase)> = events.phases.iter().map(|p| (p.0, p.1)).collect();
    use Phase::*;
    assert_eq!(
        kinds,
        [
            (0, Evaluation),
            (1, Rollouts),
            (1, Updates),
            (2, Rollouts),
            (2, Updates),
            (2, Evaluation)
        ]
    );
    for &(epoch, phase, total, done) in &events.phases {
        assert_eq!(done, total, "epoch {epoch} {phase:?}: {done} of {total} units reported");
        if phase == Rollouts {
            assert_eq!(total, 6, "2 prompts x 3 samples");
        }
    }
    assert!(events.phases.iter().any(|p| p.1 == Updates && p.2 > 0), "some update ran");
    assert_eq!(events.epochs, [(0, 1), (1, 2), (2, 3)]);
    assert_eq!(events.last, history);
}

#[test]
fn flow_grpo_baseline_runs() {
    let out = common::scratch("train-flow");
    let mut t = trainer(config(1, "flow-grpo"), &out);
    let history = t.train(&mut Silent).unwrap();
    let m = &history[1];
    assert_eq!(m.objective, "flow-grpo");
    assert_eq!(m.nfe_per_sample, 4.0, "no ODE completions");
}

/// Population mean and standard deviation.
fn mean_std(v: &[f64]) -> (f64, f64) {
    let m = v.iter().sum::<f64>() / v.len() as f64;
    (m, (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len() as f64).sqrt())
}

/// One epoch of each objective with every sample in one rollout chunk and no evaluation: the
/// reward calls are then the final images, then (TP-GRPO) the ODE completions of each trained
/// step. The metrics line must agree with the statistics and the credit (the reference-checked
/// `credit_batch`) recomputed here from those recorded scores.
#[test]
fn metrics_agree_with_the_recorded_rewards() {
    for objective in ["tp-grpo", "flow-grpo"] {
        let sets = ["eval_every=0".to_string(), "rollout_batch=6".to_string()];
        let cfg = config(1, objective).with_sources(None, &sets).unwrap();
        let calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let reward = common::Recording { inner: ToyScorer, calls: calls.clone() };
        let out = common::scratch(&format!("train-recorded-{objective}"));
        let mut t =
            toy::trainer::<TrainBackend>(cfg, Box::new(reward), &out, &Default::default()).unwrap();
        let m = t.train(&mut Silent).unwrap().remove(0);
        let calls = calls.lock().unwrap().clone();
        let finals = &calls[0];
        let (mean, std) = mean_std(finals);
        assert!((m.reward_mean - mean).abs() < 1e-12 && (m.reward_std - std).abs() < 1e-12);
        // The samples' prompts are not recorded; the groups are recovered from the trainer's
        // documented order instead (each of the 2 prompts 3 times, shuffled): only the counts
        // below depend on them, and they are checked against group-free quantities too.
        let ids = tpgrpo::train::sample_order(t.config(), 1);
        let obj = ObjectiveConfig::new();
        let advantages: Vec<Vec<f64>> = if objective == "tp-grpo" {
            assert_eq!(calls.len(), 3, "finals, then completions from steps 0 and 1");
            let seqs: Vec<Vec<f64>> =
                (0..6).map(|i| vec![calls[1][i], calls[2][i], finals[i]]).collect();
            let credits = credit_batch(&seqs, &obj).unwrap();
            let count = |f: &dyn Fn(&tpgrpo::grpo::TrajectoryCredit) -> usize| {
                credits.iter().map(f).sum::<usize>()
            };
            let kept = |c: &tpgrpo::grpo::TrajectoryCredit| {
                c.turning_points.iter().filter(|&&x| x).count()
            };
            assert_eq!(m.credit.turning_points, count(&kept));
            assert_eq!(
                m.credit.turning_points_positive,
                count(&|c| if c.delta > 0.0 { kept(c) } else { 0 })
            );
            assert_eq!(
                m.credit.turning_point_candidates,
                count(&|c| c.candidate_turning_points.iter().filter(|&&x| x).count())
            );
            for k in 0..2 {
                let change = seqs.iter().map(|s| (s[k + 1] - s[k]).abs()).sum::<f64>() / 6.0;
                assert!((m.credit.step_reward_change[k] - change).abs() < 1e-12);
            }
            let credited: Vec<Vec<f64>> = credits.into_iter().map(|c| c.credited_rewards).collect();
            tp_grpo_advantages(&credited, &ids, obj.std_scope, obj.std_eps).unwrap()
        } else {
            assert_eq!(calls.len(), 1, "Flow-GRPO scores only the final images");
            let a = flow_grpo_advantages(finals, &ids, obj.std_scope, obj.std_eps).unwrap();
            a.into_iter().map(|x| vec![x, x]).collect()
        };
        let used = advantages.iter().filter(|row| row.iter().any(|&a| a != 0.0)).count();
        assert_eq!((m.credit.samples_used, m.credit.samples_dropped), (used, 6 - used));
    }
}

/// Two evaluation images per prompt: the first image of each prompt is the one-image
/// evaluation's (same seed), and the mean also covers a second, different seed (mean
/// brightness, a continuous score, tells the two rounds apart).
#[test]
fn evaluation_draws_several_seeds_per_prompt() {
    let bright = |cfg: TrainConfig, name: &str| {
        let out = common::scratch(name);
        let reward = Box::new(common::Brightness);
        toy::trainer::<TrainBackend>(cfg, reward, &out, &Default::default()).unwrap()
    };
    // The toy preset evaluates two images per prompt; set both counts explicitly.
    let images_per_prompt = |n: usize| {
        let mut cfg = config(1, "tp-grpo");
        cfg.eval_images_per_prompt = n;
        cfg
    };
    let one = bright(images_per_prompt(1), "train-eval-one");
    let two = bright(images_per_prompt(2), "train-eval-two");
    let (one, two) = (one.evaluate().unwrap(), two.evaluate().unwrap());
    let (r1, first, r2, images) = (one.reward, one.images, two.reward, two.images);
    assert_eq!(images.len(), 4, "one grid image per prompt");
    assert_eq!(images, first);
    let second_seed_mean = 2.0 * r2 - r1;
    assert!((0.0..=1.0).contains(&second_seed_mean), "{r1} {r2}");
    assert!((second_seed_mean - r1).abs() > 1e-4, "the second round reused the seeds: {r1} {r2}");
    let zero = config(1, "tp-grpo").with_sources(None, &["eval_images_per_prompt=0".into()]);
    assert!(zero.unwrap_err().to_string().contains("eval_images_per_prompt"));
}

/// The report beside any reward: trained on the dense alignment reward, the evaluation also
/// gives the rule-based score, equal to the mean `ToyScorer` score of the same images (an
/// evaluation that trains on `ToyScorer`), and the check pass rates.
#[test]
fn evaluation_reports_the_rule_based_score_and_checks() {
    let evaluate = |reward: Box<dyn tpgrpo::reward::Reward>, name: &str| {
        let out = common::scratch(name);
        let t =
            toy::trainer::<TrainBackend>(config(1, "tp-grpo"), reward, &out, &Default::default());
        t.unwrap().evaluate().unwrap()
    };
    let dense = evaluate(Box::new(toy::ToyAlignment), "train-report-dense");
    let rule = evaluate(Box::new(ToyScorer), "train-report-rule");
    let keys: Vec<&str> = dense.report.keys().map(String::as_str).collect();
    // The 4 evaluated prompts (the first held-out ones) only count objects: no relation is
    // checked, so no relation rate is reported.
    assert_eq!(
        keys,
        ["check_color", "check_count", "check_shape", "toy_geneval"],
        "{:?}",
        dense.report
    );
    assert!((dense.report["toy_geneval"] - rule.reward).abs() < 1e-12, "{dense:?} {rule:?}");
    assert_eq!(dense.report, rule.report);
    assert!(dense.report.values().all(|v| (0.0..=1.0).contains(v)));
    assert!((dense.reward - rule.reward).abs() > 1e-6, "two different rewards");
}

#[test]
fn invalid_settings_name_the_field() {
    let base = toy::train_config();
    let cases = [
        ("group_size=1", "group_size"),
        ("rollout.window_size=10", "rollout.window_start/window_size"),
        ("rollout.noise_level=1.1", "rollout.noise_level"),
        ("lora.rank=0", "lora.rank"),
        ("optimizer.lr=-1", "optimizer.lr"),
        ("objective.objective=ppo", "objective.objective"),
        ("nonsense=3", "nonsense"),
        ("lora.nope=3", "lora.nope"),
    ];
    for (set, field) in cases {
        let err = base.with_sources(None, &[set.to_string()]).unwrap_err().to_string();
        assert!(err.contains(field), "{set}: {err}");
    }
    // Above 1 CPS repeats itself (sin(1.1 pi / 2) = sin(0.9 pi / 2)); the SDE step does not.
    let sde = ["rollout.sampler=sde".to_string(), "rollout.noise_level=1.1".to_string()];
    assert!(base.with_sources(None, &sde).is_ok());
}

/// Mean brightness: a reward whose optimum is obvious, to check the update's direction.
#[test]
fn updates_move_the_reward_up() {
    for objective in ["tp-grpo", "flow-grpo"] {
        let sets: Vec<String> = [
            "epochs=6",
            "prompts_per_epoch=4",
            "group_size=6",
            "rollout_batch=24",
            "train_batch=24",
            "rollout.num_steps=4",
            "rollout.window_size=2",
            "optimizer_steps_per_epoch=1",
            "eval_every=6",
            "eval_steps=4",
            "eval_prompts=8",
            "save_every=0",
            "ema.every=1",
            "optimizer.lr=0.01",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("objective.objective={objective}")])
        .collect();
        let cfg = toy::train_config().with_sources(None, &sets).unwrap();
        let out = common::scratch(&format!("train-bright-{objective}"));
        let mut t = toy::trainer::<TrainBackend>(
            cfg,
            Box::new(common::Brightness),
            &out,
            &Default::default(),
        )
        .unwrap();
        let h = t.train(&mut Silent).unwrap();
        let (before, after) = (h[0].eval_reward.unwrap(), h[6].eval_reward.unwrap());
        eprintln!("{objective}: brightness {before:.4} -> {after:.4}");
        assert!(after > before + 0.01, "{objective}: brightness {before:.4} -> {after:.4}");
    }
}

/// Sets a stop flag when the run reaches `phase` of `epoch` (after `advances` progress reports
/// of it), as a signal handler would.
struct StopAt {
    epoch: usize,
    phase: Phase,
    advances: usize,
    flag: std::sync::Arc<std::sync::atomic::AtomicBool>,
    armed: bool,
}

impl Observer for StopAt {
    fn phase(&mut self, epoch: usize, phase: Phase, _total: usize) {
        self.armed = (epoch, phase) == (self.epoch, self.phase);
        if self.armed && self.advances == 0 {
            self.flag.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    fn advance(&mut self, _done: usize) {
        if self.armed {
            self.advances = self.advances.saturating_sub(1);
            if self.advances == 0 {
                self.flag.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}

/// A stop at any point (before the first evaluation ends, before or between an epoch's rollout
/// chunks, during its updates, during an evaluation) writes the checkpoint of the last completed
/// epoch and resumes to the adapters, EMA and metrics of a run never stopped (a stop once an
/// epoch's updates began skips that epoch's evaluation: the one line missing held-out values).
#[test]
fn a_stopped_run_resumes_to_the_uninterrupted_result() {
    let straight = common::scratch("stop-straight");
    let mut a = trainer(config(3, "tp-grpo"), &straight);
    a.train(&mut Silent).unwrap();
    let read = |dir: &Path| tpgrpo::train::read_metrics(&dir.join("metrics.jsonl")).unwrap();
    let expected = without_time(&read(&straight));
    // (stop point, advances into it, epochs completed at the stop)
    let cases = [
        (0, Phase::Evaluation, 0, 0),
        (2, Phase::Rollouts, 0, 1),
        (2, Phase::Rollouts, 1, 1),
        (2, Phase::Updates, 1, 2),
        (2, Phase::Evaluation, 0, 2),
    ];
    for (epoch, phase, advances, done) in cases {
        let out = common::scratch("stop-resumed");
        let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut stopper = StopAt { epoch, phase, advances, flag: flag.clone(), armed: false };
        let mut t = trainer(config(3, "tp-grpo"), &out).stopping_on(flag);
        let case = format!("stop at {phase:?} of epoch {epoch} after {advances}");
        match t.train(&mut stopper) {
            Err(tpgrpo::Error::Stopped { epoch, checkpoint }) => {
                assert_eq!(epoch, done, "{case}");
                assert_eq!(checkpoint, out.join(format!("checkpoints/epoch-{done:05}")), "{case}");
                assert!(checkpoint.join("trainer_state.json").is_file(), "{case}");
            }
            other => panic!("{case}: expected a stop, got {other:?}"),
        }
        let mut b = trainer(config(3, "tp-grpo"), &out);
        b.resume().unwrap();
        assert_eq!(b.epoch(), done, "{case}");
        b.train(&mut Silent).unwrap();
        assert_eq!(factors(&a), factors(&b), "{case}: adapters or EMA differ");
        let mut lines = without_time(&read(&out));
        // A stop during epoch 2's updates or evaluation skips that evaluation.
        if done == 2 {
            assert_eq!(lines[epoch].eval_reward, None, "{case}");
            lines[epoch].eval_reward = expected[epoch].eval_reward;
            lines[epoch].eval_report = expected[epoch].eval_report.clone();
        }
        assert_eq!(lines, expected, "{case}: metrics differ");
    }
}

/// With `tensorboard` set, the event file holds every epoch's scalars (checksums verified on
/// reading) equal to the metrics lines as f32; the format itself is checked by TensorBoard's
/// reader in `tests/fixtures/check_tensorboard.py`.
#[test]
fn tensorboard_events_hold_the_metrics() {
    let out = common::scratch("tensorboard");
    let mut cfg = config(2, "tp-grpo");
    cfg.tensorboard = true;
    trainer(cfg, &out).train(&mut Silent).unwrap();
    let files: Vec<_> = std::fs::read_dir(out.join("tensorboard"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("events.out.tfevents."))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let read = tpgrpo::train::read_scalars(&files[0]).unwrap();
    let lines = tpgrpo::train::read_metrics(&out.join("metrics.jsonl")).unwrap();
    let expected: Vec<tpgrpo::train::Scalar> = lines
        .iter()
        .flat_map(|m| {
            tpgrpo::train::scalars(m).into_iter().map(|(tag, v)| tpgrpo::train::Scalar {
                step: m.epoch as i64,
                tag,
                value: v as f32,
            })
        })
        .collect();
    assert_eq!(read, expected);
    assert!(read.iter().any(|s| s.tag == "reward/held-out" && s.step == 2));
    assert!(read.iter().any(|s| s.tag == "loss/ratio_mean" && s.step == 1));
}
