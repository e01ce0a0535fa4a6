//! `tpgrpo doctor`: a staged self-check of the selected backend. Each stage runs a kernel family
//! on the device, checks its result against a host reference where one is cheap, and prints its
//! time as it goes; a watchdog thread names the stage still running every `stall_secs` seconds,
//! so a first call that hangs in JIT compilation or autotuning says where it hangs.

use crate::model::Adaptable;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use burn::module::AutodiffModule;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, FloatDType};

use crate::error::Error;
use crate::model::attention::{attend, Scores};
use crate::model::precision::cast_params;
use crate::model::LoraConfig;
use crate::rng::SplitMix64;
use crate::toy::{self, ToyModel};

/// The doctor's settings.
#[derive(Config, Debug)]
pub struct DoctorConfig {
    /// Seconds after which the watchdog names the stage still running (and again every as many).
    #[config(default = 30)]
    pub stall_secs: u64,
    /// Run the last stage, one toy training epoch (the slowest).
    #[config(default = true)]
    pub epoch: bool,
    /// Batch of the toy forward and LoRA stages (the toy preset's rollout batch with CFG).
    #[config(default = 32)]
    pub batch: usize,
}

/// One finished stage.
#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    /// The stage's name.
    pub name: String,
    /// Wall-clock seconds, results read back to the host.
    pub seconds: f64,
    /// What the stage checked, for the report.
    pub detail: String,
}

/// When "still running" lines are due: the stage running, since when, and the next line's time.
struct Stall {
    period: Duration,
    current: Option<(String, Duration)>,
    next: Duration,
}

impl Stall {
    fn new(period: Duration) -> Self {
        Stall { period, current: None, next: period }
    }

    /// The stage `stage` starts (`Some`) or the running one ends (`None`) at time `now`.
    fn mark(&mut self, stage: Option<String>, now: Duration) {
        self.current = stage.map(|name| (name, now));
        self.next = self.period;
    }

    /// The report due at time `now`, if any (the stage and its whole seconds so far): one per
    /// whole period the stage has run.
    fn poll(&mut self, now: Duration) -> Option<(String, u64)> {
        let (name, start) = self.current.as_ref()?;
        if now.saturating_sub(*start) < self.next {
            return None;
        }
        let due = (name.clone(), self.next.as_secs());
        self.next += self.period;
        Some(due)
    }
}

/// Reports the current stage as still running, from a background thread of `scope`.
struct Watchdog<'scope> {
    tx: Sender<Option<String>>,
    thread: Option<ScopedJoinHandle<'scope, ()>>,
}

impl<'scope> Watchdog<'scope> {
    /// Starts the watchdog thread with period `stall`, handing each due report (stage, whole
    /// seconds) to `report`.
    fn start<'env>(
        scope: &'scope Scope<'scope, 'env>,
        stall: Duration,
        report: impl Fn(&str, u64) + Send + 'scope,
    ) -> Self {
        let (tx, rx) = channel::<Option<String>>();
        let thread = scope.spawn(move || {
            let clock = Instant::now();
            let mut due = Stall::new(stall);
            loop {
                match rx.recv_timeout(Duration::from_millis(200)) {
                    Ok(stage) => due.mark(stage, clock.elapsed()),
                    Err(RecvTimeoutError::Disconnected) => return,
                    Err(RecvTimeoutError::Timeout) => {}
                }
                while let Some((stage, seconds)) = due.poll(clock.elapsed()) {
                    report(&stage, seconds);
                }
            }
        });
        Watchdog { tx, thread: Some(thread) }
    }

    /// Marks the start (`Some`) or end (`None`) of a stage.
    fn mark(&self, stage: Option<&str>) {
        // The thread only exits when the sender is dropped, so the send cannot fail.
        let _ = self.tx.send(stage.map(str::to_string));
    }
}

impl Drop for Watchdog<'_> {
    fn drop(&mut self) {
        let (tx, _) = channel();
        drop(std::mem::replace(&mut self.tx, tx));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the doctor reports while it runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Event<'a> {
    /// A stage passed.
    Passed(&'a Stage),
    /// A stage failed after `seconds`; [`run`] returns the error.
    Failed {
        /// The stage's name.
        stage: &'a str,
        /// Seconds until it failed.
        seconds: f64,
    },
    /// A stage is still running after `seconds` (every [`DoctorConfig::stall_secs`]).
    Running {
        /// The stage's name.
        stage: &'a str,
        /// Whole seconds it has run.
        seconds: u64,
    },
}

/// Runs the stages in order on `device`, reporting each to `report` (from a watchdog thread
/// too, for a stage still running), and returns their times; stops at the first failed check
/// or panic with an error naming the stage.
pub fn run<B: AutodiffBackend>(
    config: &DoctorConfig,
    device: &B::Device,
    report: &(dyn Fn(Event<'_>) + Sync),
) -> crate::Result<Vec<Stage>> {
    std::thread::scope(|scope| run_stages::<B>(config, device, report, scope))
}

fn run_stages<'scope, B: AutodiffBackend>(
    config: &DoctorConfig,
    device: &B::Device,
    report: &'scope (dyn Fn(Event<'_>) + Sync),
    scope: &'scope Scope<'scope, '_>,
) -> crate::Result<Vec<Stage>> {
    let stall = Duration::from_secs(config.stall_secs.max(1));
    let watchdog = Watchdog::start(scope, stall, move |stage, seconds| {
        report(Event::Running { stage, seconds })
    });
    let mut stages = Vec::new();
    let mut stage =
        |name: &str, f: &mut dyn FnMut() -> crate::Result<String>| -> crate::Result<()> {
            watchdog.mark(Some(name));
            let start = Instant::now();
            let result = catch_unwind(AssertUnwindSafe(&mut *f));
            let seconds = start.elapsed().as_secs_f64();
            watchdog.mark(None);
            let outcome = match result {
                Ok(Ok(detail)) => Ok(detail),
                Ok(Err(e)) => Err(e.to_string()),
                Err(panic) => Err(panic_message(panic.as_ref())),
            };
            match outcome {
                Ok(detail) => {
                    stages.push(Stage { name: name.to_string(), seconds, detail });
                    report(Event::Passed(stages.last().expect("just pushed")));
                    Ok(())
                }
                Err(message) => {
                    report(Event::Failed { stage: name, seconds });
                    Err(Error::Doctor { stage: name.into(), message })
                }
            }
        };
    let inner = <B::InnerBackend as burn::tensor::backend::Backend>::name(device);
    stage("backend and device", &mut || {
        let sum = Tensor::<B::InnerBackend, 1>::from_floats([1.0, 2.0, 3.0], device).sum();
        expect_close("sum of [1, 2, 3]", &[sum.into_scalar().elem::<f64>()], &[6.0], 0.0)?;
        Ok(format!("{inner} on {device:?}"))
    })?;
    stage("matmul 256x256 (first call)", &mut || check_matmul::<B::InnerBackend>(256, device))?;
    stage("matmul 256x256 (second call)", &mut || check_matmul::<B::InnerBackend>(256, device))?;
    stage("element-wise exp, mul, add", &mut || check_elementwise::<B::InnerBackend>(device))?;
    stage("attention 2x2x64x32", &mut || check_attention::<B::InnerBackend>(device))?;
    let model: ToyModel<B> = ToyModel::load(toy::default_dir(), device)?;
    let policy = model.transformer.valid();
    let batch = config.batch;
    stage("toy forward (first call)", &mut || toy_forward(&policy, batch, device))?;
    stage("toy forward (second call)", &mut || toy_forward(&policy, batch, device))?;
    stage("toy forward bf16 vs f32", &mut || toy_forward_bf16(&policy, batch, device))?;
    let lora = model.transformer.clone().with_lora(&LoraConfig::new())?;
    stage("LoRA forward+backward (first)", &mut || lora_backward(&lora, batch, device))?;
    stage("LoRA forward+backward (second)", &mut || lora_backward(&lora, batch, device))?;
    if config.epoch {
        stage("toy epoch (8 prompts x 8)", &mut || toy_epoch::<B>(device))?;
    }
    Ok(stages)
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(s), _) => format!("panic: {s}"),
        (_, Some(s)) => format!("panic: {s}"),
        _ => "panic".to_string(),
    }
}

/// `Ok` when every `got[i]` is within `tol * (1 + |want[i]|)` of `want[i]`.
fn expect_close(what: &str, got: &[f64], want: &[f64], tol: f64) -> crate::Result<()> {
    let worst = got
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / (1.0 + w.abs()))
        .fold(0.0f64, |a, e| if e.is_nan() { f64::INFINITY } else { a.max(e) });
    if got.len() != want.len() || worst > tol {
        return Err(Error::Device {
            what: what.into(),
            message: format!("relative error {worst:.2e} above {tol:.0e} against the host"),
        });
    }
    Ok(())
}

/// Uniform values in `[-1, 1)` from `seed`.
fn host_values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64(seed);
    (0..n).map(|_| (rng.uniform() * 2.0 - 1.0) as f32).collect()
}

fn to_host<B: Backend, const D: usize>(t: Tensor<B, D>) -> crate::Result<Vec<f64>> {
    let data = t.into_data().convert::<f64>();
    data.to_vec::<f64>()
        .map_err(|e| Error::Device { what: "reading back".into(), message: format!("{e:?}") })
}

/// `A B` of `n x n` matrices against the host product.
fn check_matmul<B: Backend>(n: usize, device: &B::Device) -> crate::Result<String> {
    let (a, b) = (host_values(n * n, 1), host_values(n * n, 2));
    let ta = Tensor::<B, 1>::from_floats(a.as_slice(), device).reshape([n, n]);
    let tb = Tensor::<B, 1>::from_floats(b.as_slice(), device).reshape([n, n]);
    let got = to_host(ta.matmul(tb))?;
    let want: Vec<f64> = (0..n * n)
        .map(|ij| (0..n).map(|k| a[ij / n * n + k] as f64 * b[k * n + ij % n] as f64).sum())
        .collect();
    expect_close("matmul", &got, &want, 1e-2)?;
    Ok(format!("{n}x{n} product matches the host"))
}

/// `2 exp(x) + x` on a million values against the host.
fn check_elementwise<B: Backend>(device: &B::Device) -> crate::Result<String> {
    let x = host_values(1 << 20, 3);
    let t = Tensor::<B, 1>::from_floats(x.as_slice(), device);
    let got = to_host(t.clone().exp().mul_scalar(2.0).add(t))?;
    let want: Vec<f64> = x.iter().map(|&v| 2.0 * (v as f64).exp() + v as f64).collect();
    expect_close("2 exp(x) + x", &got, &want, 1e-3)?;
    Ok("2^20 values match the host".to_string())
}

/// [`attend`] on `[2, 2, 64, 32]` against a host softmax attention.
fn check_attention<B: Backend>(device: &B::Device) -> crate::Result<String> {
    let (heads, n, dh) = (4usize, 64usize, 32usize);
    let [q, k, v] = [4u64, 5, 6].map(|s| host_values(heads * n * dh, s));
    let t = |x: &[f32]| Tensor::<B, 1>::from_floats(x, device).reshape([2, 2, n, dh]);
    let got = to_host(attend(t(&q), t(&k), t(&v), None, Scores::default()))?;
    let scale = 1.0 / (dh as f64).sqrt();
    let mut want = vec![0.0; heads * n * dh];
    for h in 0..heads {
        let at = |x: &[f32], i: usize, d: usize| x[(h * n + i) * dh + d] as f64;
        for i in 0..n {
            let s: Vec<f64> = (0..n)
                .map(|j| scale * (0..dh).map(|d| at(&q, i, d) * at(&k, j, d)).sum::<f64>())
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for d in 0..dh {
                want[(h * n + i) * dh + d] = (0..n).map(|j| e[j] / z * at(&v, j, d)).sum();
            }
        }
    }
    expect_close("attention", &got, &want, 1e-3)?;
    Ok("softmax(q k^T / sqrt(d)) v matches the host".to_string())
}

/// Random toy-shaped inputs of `batch` rows (8 text tokens).
fn toy_inputs<B: Backend>(
    batch: usize,
    device: &B::Device,
) -> (Tensor<B, 4>, Tensor<B, 1>, Tensor<B, 3>, Tensor<B, 2>) {
    let (c, s) = (toy::toy_config(), toy::IMAGE_SIZE);
    (
        random([batch, c.in_channels, s, s], 7, device),
        Tensor::full([batch], 500.0, device),
        random([batch, 8, c.joint_attention_dim], 8, device),
        random([batch, c.pooled_projection_dim], 9, device),
    )
}

/// A tensor of [`host_values`].
fn random<B: Backend, const D: usize>(
    dims: [usize; D],
    seed: u64,
    device: &B::Device,
) -> Tensor<B, D> {
    let values = host_values(dims.iter().product(), seed);
    Tensor::<B, 1>::from_floats(values.as_slice(), device).reshape(dims)
}

fn toy_forward<B: Backend>(
    model: &crate::model::MMDiT<B>,
    batch: usize,
    device: &B::Device,
) -> crate::Result<String> {
    let (x, t, text, pooled) = toy_inputs::<B>(batch, device);
    let v = to_host(model.forward(x, t, text, pooled)?)?;
    finite("toy velocity", &v)?;
    Ok(format!("batch {batch}, {} finite outputs", v.len()))
}

/// The toy forward with bf16 base weights against the f32 one, the largest difference relative
/// to the largest f32 output: bf16 rounds each operation by up to u = 2^-9 (2.0e-3), and 0.1
/// (50 u) of the output's scale allows that to accumulate over the blocks; a missing term moves
/// the output by O(1). On the toy transformer ours differs as diffusers' bf16 model does
/// (1.8e-2 and 1.95e-2 on the same normal inputs), and on inputs drawn as here diffusers'
/// differs by up to 6.9e-2 (docs/gpu.md). Skipped where `B` has no bf16.
fn toy_forward_bf16<B: Backend>(
    model: &crate::model::MMDiT<B>,
    batch: usize,
    device: &B::Device,
) -> crate::Result<String> {
    if !B::supports_dtype(device, DType::BF16) {
        return Ok(format!("skipped: {} computes no bf16 here", B::name(device)));
    }
    let (x, t, text, pooled) = toy_inputs::<B>(batch, device);
    let want = to_host(model.forward(x.clone(), t.clone(), text.clone(), pooled.clone())?)?;
    let half = cast_params(model.clone(), FloatDType::BF16);
    let got = to_host(half.forward(x, t, text, pooled)?)?;
    finite("bf16 toy velocity", &got)?;
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-12);
    let worst = got.iter().zip(&want).fold(0.0f64, |m, (g, w)| m.max((g - w).abs())) / scale;
    if worst > 0.1 {
        return Err(Error::Device {
            what: "the bf16 toy forward".into(),
            message: format!("differs from f32 by {worst:.2e} of the output's scale"),
        });
    }
    Ok(format!("max difference {worst:.1e} of the output's scale (limit 0.1)"))
}

fn lora_backward<B: AutodiffBackend>(
    model: &crate::model::MMDiT<B>,
    batch: usize,
    device: &B::Device,
) -> crate::Result<String> {
    let (x, t, text, pooled) = toy_inputs::<B>(batch, device);
    let loss = model.forward(x, t, text, pooled)?.powf_scalar(2.0).mean();
    let grads = loss.backward();
    let adapters = crate::model::lora::adapters(model);
    let mut norm = 0.0;
    for (_, a) in &adapters {
        for p in [&a.lora_a, &a.lora_b] {
            if let Some(g) = p.val().grad(&grads) {
                norm += to_host(g.powf_scalar(2.0).sum())?[0];
            }
        }
    }
    finite("LoRA gradient norm", &[norm])?;
    Ok(format!("{} adapters, |grad| = {:.3e}", adapters.len(), norm.sqrt()))
}

fn finite(what: &str, values: &[f64]) -> crate::Result<()> {
    match values.iter().position(|v| !v.is_finite()) {
        Some(i) => {
            Err(Error::Device { what: what.into(), message: format!("value {i} is {}", values[i]) })
        }
        None => Ok(()),
    }
}

/// One epoch of the toy preset (no evaluation, no checkpoint) in a scratch folder.
fn toy_epoch<B: AutodiffBackend>(device: &B::Device) -> crate::Result<String> {
    let dir = std::env::temp_dir().join(format!("tpgrpo-doctor-{}", std::process::id()));
    let config = toy::train_config().with_epochs(1).with_eval_every(0).with_save_every(0);
    let mut trainer = toy::trainer::<B>(config, toy::reward("toy-alignment")?, &dir, device)?;
    let result = trainer.run_epoch(&mut crate::train::Silent);
    remove_scratch(&dir);
    let m = result?;
    Ok(format!("reward {:.4}, {} turning points", m.reward_mean, m.credit.turning_points))
}

fn remove_scratch(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schedule on a hand-set clock: one line per whole period of the running stage, none
    /// before, none after it ends, and a new stage counts from its own start.
    #[test]
    fn stall_lines_are_due_once_per_period_of_the_running_stage() {
        let s = Duration::from_secs_f64;
        let mut due = Stall::new(s(1.0));
        assert_eq!(due.poll(s(5.0)), None, "no stage, no line");
        due.mark(Some("slow".into()), s(10.0));
        assert_eq!(due.poll(s(10.9)), None);
        let due_at = |name: &str, secs| Some((name.to_string(), secs));
        assert_eq!(due.poll(s(11.0)), due_at("slow", 1));
        assert_eq!(due.poll(s(11.5)), None, "once per period");
        assert_eq!(due.poll(s(13.2)), due_at("slow", 2));
        assert_eq!(due.poll(s(13.2)), due_at("slow", 3));
        assert_eq!(due.poll(s(13.2)), None);
        due.mark(None, s(13.5));
        assert_eq!(due.poll(s(99.0)), None, "nothing after the stage ends");
        due.mark(Some("next".into()), s(100.0));
        assert_eq!(due.poll(s(100.5)), None, "a new stage counts from its start");
        assert_eq!(due.poll(s(101.0)), due_at("next", 1));
    }

    /// The thread reports through `report`: waits (up to a minute, so a loaded machine only
    /// slows it) for the first report of a stalled stage; after the end, nothing new is due.
    #[test]
    fn watchdog_thread_reports_the_stalled_stage() {
        let (tx, rx) = std::sync::mpsc::channel();
        let tx = std::sync::Mutex::new(tx);
        std::thread::scope(|scope| {
            let dog = Watchdog::start(scope, Duration::from_secs(1), move |stage, secs| {
                let _ = tx.lock().map(|t| t.send((stage.to_string(), secs)));
            });
            dog.mark(Some("slow stage"));
            let first = rx.recv_timeout(Duration::from_secs(60)).expect("a report within a minute");
            assert_eq!(first, ("slow stage".to_string(), 1));
            dog.mark(None);
        });
        // Reports already due before the end was seen may follow; all name the stage.
        for (stage, _) in rx.try_iter() {
            assert_eq!(stage, "slow stage");
        }
    }

    #[test]
    fn host_comparison_rejects_large_errors_and_nan() {
        assert!(expect_close("x", &[1.0, 2.0], &[1.0, 2.0 + 1e-6], 1e-5).is_ok());
        assert!(expect_close("x", &[1.0, 2.1], &[1.0, 2.0], 1e-2).is_err());
        assert!(expect_close("x", &[f64::NAN], &[0.0], 1.0).is_err());
        assert!(expect_close("x", &[1.0], &[1.0, 2.0], 1.0).is_err());
    }
}
