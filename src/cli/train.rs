//! The trainer's command line, shared by `tpgrpo train` and the `train_sd3` example (both
//! include this file).
//!
//! TP-GRPO fine-tuning of an SD3-family model.
//!
//! With no arguments it trains the embedded toy model (`models/toy/`, coloured shapes) on the
//! CPU with the dense prompt-alignment reward (`--reward toy-geneval`: the rule-based
//! GenEval-like scorer) and prints the held-out reward and the GenEval-style checks before and
//! after. `--model DIR` trains a diffusers SD3 / SD3.5 folder with the reference settings, on
//! a flow_grpo prompt folder (`--prompts DIR`) with real rewards (`--reward pickscore=DIR`,
//! `--reward aesthetic=DIR:0.5`, ...; several are summed with their weights), or on the toy
//! task's prompts and reward; `--features cuda` selects the GPU backend; `--objective
//! flow-grpo` the baseline.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::Parser;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use tpgrpo::backend::{self, Backend, TrainBackend};
use tpgrpo::model::dtype_name;
use tpgrpo::model::{Denoiser, Flux, MMDiT};
use tpgrpo::pipeline::{flux_latent_size, image_to_latent_size, Family, FluxConditioner};
use tpgrpo::pipeline::{Sd3Conditioner, DEFAULT_T5_LENGTH};
use tpgrpo::prompts::PromptSet;
use tpgrpo::reward::{load_rewards, Report, Reward};
use tpgrpo::sampler::DynamicShift;
use tpgrpo::sampler::TextToImage;
use tpgrpo::toy::{self, ToyChecks};
use tpgrpo::train::save_reward_curve;
use tpgrpo::train::{noise_scale, parallel, read_settings, run_dir, EpochMetrics, Task};
use tpgrpo::train::{Observer, Phase};
use tpgrpo::train::{Replica, TrainConfig, Trainer};

#[cfg(feature = "mpi")]
use tpgrpo::train::mpi::Mpi;
/// Without the `mpi` feature there is no MPI job to be a rank of.
#[cfg(not(feature = "mpi"))]
enum Mpi {}

/// The trainer's command-line options (`tpgrpo train`, `train_sd3`).
#[derive(Parser, Debug)]
#[command(version, about = "TP-GRPO fine-tuning of SD3 / SD3.5 (default: the embedded toy task)")]
pub struct Args {
    /// A diffusers SD3 / SD3.5 pipeline folder; without it (here or as `task.model` in
    /// `--config`), the embedded toy model.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The objective (the `objective.objective` setting; default `tp-grpo`).
    #[arg(long, value_parser = ["tp-grpo", "flow-grpo"])]
    objective: Option<String>,
    /// A reward, repeatable, each `KIND=TARGET[:WEIGHT]`: `pickscore=DIR`, `clipscore=DIR`,
    /// `aesthetic=DIR|FILE.pth`, `server=URL` (a flow_grpo reward server, pickle protocol),
    /// `json-server=URL` (its JSON variant; a URL may end in `#timeout_secs=300&batch_size=16`),
    /// or `toy-alignment` / `toy-geneval` (the toy task's dense alignment reward / rule-based
    /// scorer); several are summed with their weights (docs/rewards.md). Default: the
    /// `--config` file's `task.reward`, else `toy-alignment`.
    #[arg(long = "reward")]
    rewards: Vec<String>,
    /// A flow_grpo prompt folder (`train.txt` + `test.txt`, or `*_metadata.jsonl`); needs
    /// `--model`. Without it (here or as `task.prompts` in `--config`), the toy task's prompts.
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// A JSON file of settings (any subset of TrainConfig, nested; `configs/` holds the
    /// reference tasks'), optionally with a `task` object giving `model`, `prompts`, `reward`
    /// (a list) and `resolution`, which the command-line options override.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Overrides `key.path=value`, applied after the file (repeatable).
    #[arg(long = "set")]
    sets: Vec<String>,
    /// Output folder (metrics.jsonl, samples/, checkpoints/, reward_curve.png).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue from the latest checkpoint in the output folder, or from the checkpoint folder
    /// given (`--resume runs/x/checkpoints/epoch-00040`).
    #[arg(long, num_args = 0..=1, value_name = "CHECKPOINT", conflicts_with = "overwrite")]
    resume: Option<Option<PathBuf>>,
    /// Replace the run in the output folder (its metrics, checkpoints, samples and curve).
    #[arg(long)]
    overwrite: bool,
    /// Image side in pixels with `--model` (default: `task.resolution`, else 512, at which
    /// Flow-GRPO trains SD3.5).
    #[arg(long)]
    resolution: Option<usize>,
    /// Devices to train on, one data-parallel replica each (the `devices` setting; the CPU
    /// backend runs that many replicas on its one device).
    #[arg(long)]
    devices: Option<usize>,
    /// Run as one rank of an MPI job (`mpirun -np N tpgrpo train --mpi ...`, or SLURM's
    /// `srun`), one device per rank, rank 0 writing the run (docs/training.md); needs a build
    /// with the `mpi` feature.
    #[arg(long)]
    mpi: bool,
    /// With `--resume`: continue even though the reward or the prompt set differs from the
    /// checkpoint's (refused otherwise, as for other changes that break an exact resume).
    #[arg(long, requires = "resume")]
    allow_task_change: bool,
    /// No progress bars (they are drawn only when stderr is a terminal anyway).
    #[arg(long)]
    no_progress: bool,
    /// Print the effective settings (defaults, then `--config`, then `--set`, `--objective`,
    /// `--devices`) as JSON and exit without training.
    #[arg(long)]
    print_config: bool,
}

/// The `--reward` values as one reward on `device`.
fn rewards(specs: &[String], device: &backend::Device) -> tpgrpo::Result<Box<dyn Reward>> {
    load_rewards::<Backend>(specs, device, &toy::reward)
}

/// Trains one replica per device of the `devices` setting (`docs/training.md`) and returns
/// the run's metrics; `trainer` builds a replica's trainer from the settings, its reward (the
/// `--reward` values, loaded on its device first so that a wrong path fails early), the output
/// folder and its device. Each replica then checks its memory and, with `--resume`, resumes
/// as itself (only the lead rewrites the metrics).
fn train_replicas<P, F>(
    config: &TrainConfig,
    args: &Args,
    mpi: Option<&Mpi>,
    out: &Path,
    trainer: F,
) -> tpgrpo::Result<Vec<EpochMetrics>>
where
    P: TextToImage<Backend> + 'static,
    F: Fn(
            TrainConfig,
            Box<dyn Reward>,
            &Path,
            &backend::Device,
        ) -> tpgrpo::Result<Trainer<TrainBackend, P>>
        + Send
        + Sync
        + 'static,
{
    let lead = mpi.is_none_or(is_lead);
    let console = Console::new(config.epochs, out, !args.no_progress && lead);
    let (settings, specs, resume, out) =
        (config.clone(), args.rewards.clone(), args.resume.clone(), out.to_path_buf());
    let stop = stop_on_signals()?;
    let allow_task_change = args.allow_task_change;
    let build = move |replica: Replica, device: &backend::Device| {
        let reward = rewards(&specs, device)?;
        let mut trainer = trainer(settings.clone(), reward, &out, device)?.with_replica(replica);
        if allow_task_change {
            trainer = trainer.allowing_task_change();
        }
        trainer.check_memory(backend::memory(device))?;
        trainer = trainer.stopping_on(stop.clone());
        if let Some(checkpoint) = &resume {
            match checkpoint {
                Some(dir) => trainer.resume_from(dir)?,
                None => trainer.resume()?,
            }
            if replica.is_lead() {
                say!("resumed after epoch {}", trainer.epoch());
            }
        }
        Ok(trainer)
    };
    match mpi {
        None => {
            let devices = backend::devices(config.devices)?;
            parallel::train::<TrainBackend, _, _, _>(devices, build, console)
        }
        #[cfg(feature = "mpi")]
        Some(mpi) => {
            if config.devices != 1 {
                return Err(tpgrpo::Error::config(
                    "devices",
                    format!(
                        "{} with --mpi: each rank trains on one device (launch one rank per \
                         device)",
                        config.devices
                    ),
                ));
            }
            let device = backend::rank_device(mpi.local_rank())?;
            parallel::train_mpi(mpi, |replica| build(replica, &device), console)
        }
        #[cfg(not(feature = "mpi"))]
        Some(mpi) => match *mpi {},
    }
}

/// The replicas of the run, as the first line shows them: `N` devices, or `N MPI ranks`.
fn replicas(config: &TrainConfig, mpi: Option<&Mpi>) -> String {
    match mpi {
        None => config.devices.to_string(),
        #[cfg(feature = "mpi")]
        Some(mpi) => format!("{} MPI ranks", mpi.size()),
        #[cfg(not(feature = "mpi"))]
        Some(mpi) => match *mpi {},
    }
}

/// Whether this process is rank 0 of its MPI job (it writes and reports the run).
fn is_lead(mpi: &Mpi) -> bool {
    #[cfg(feature = "mpi")]
    return mpi.rank() == 0;
    #[cfg(not(feature = "mpi"))]
    match *mpi {}
}

/// What a run shows: progress bars on stderr, a line per epoch on stdout, and
/// `reward_curve.png` redrawn after every epoch.
struct Console {
    bars: MultiProgress,
    epochs: ProgressBar,
    phase: ProgressBar,
    curve: PathBuf,
}

impl Console {
    /// Bars drawn on stderr (indicatif draws nothing when it is not a terminal), or none.
    fn new(epochs: usize, out: &Path, progress: bool) -> Self {
        let target =
            if progress { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
        let bars = MultiProgress::with_draw_target(target);
        let bar = |len: usize, what: &str| {
            let style = ProgressStyle::with_template(
                "{prefix:>10} [{bar:30}] {pos}/{len} {msg} ({elapsed}, eta {eta})",
            )
            .expect("a valid template")
            .progress_chars("=> ");
            let pb = bars.add(ProgressBar::new(len as u64).with_style(style));
            pb.set_prefix(what.to_string());
            pb
        };
        let (epochs, phase) = (bar(epochs, "epochs"), bar(0, "epoch"));
        Console { bars, epochs, phase, curve: out.join("reward_curve.png") }
    }
}

impl Observer for Console {
    fn phase(&mut self, _epoch: usize, phase: Phase, total: usize) {
        self.phase.set_length(total as u64);
        self.phase.set_position(0);
        self.phase.set_message(match phase {
            Phase::Rollouts => "rollouts",
            Phase::Updates => "updates",
            Phase::Evaluation => "evaluation",
        });
    }

    fn advance(&mut self, done: usize) {
        self.phase.inc(done as u64);
    }

    fn epoch(&mut self, m: &EpochMetrics, history: &[EpochMetrics]) -> tpgrpo::Result<()> {
        self.bars.suspend(|| print_epoch(m));
        self.epochs.set_position(m.epoch as u64);
        self.epochs.set_message(format!("reward {:.3}", m.reward_mean));
        if self.epochs.position() >= self.epochs.length().unwrap_or(0) {
            self.phase.finish_and_clear();
            self.epochs.finish_and_clear();
        }
        save_reward_curve(&self.curve, history)
    }
}

/// The report's rates as `name value` pairs.
fn report_line(m: &EpochMetrics) -> String {
    m.eval_report.iter().map(|(k, v)| format!("  {k} {v:.3}")).collect()
}

/// Each reward's mean when several are summed.
fn terms_line(m: &EpochMetrics) -> String {
    if m.reward_terms.len() < 2 {
        return String::new();
    }
    let terms: String = m.reward_terms.iter().map(|(k, v)| format!("  {k} {v:.4}")).collect();
    format!("\n           rewards{terms}")
}

fn print_epoch(m: &EpochMetrics) {
    match (m.epoch, m.eval_reward) {
        (0, Some(r)) => say!("before training: held-out reward {r:.4}{}", report_line(m)),
        (_, eval) => say!(
            "epoch {:3}  reward {:.4} ± {:.4}  turning points {:3} (+{} / -{})  ratio {:.5}  \
             clip {:.2}/{:.2}  kl {:.2e}  nfe {:.0}  {:.1} s{}{}",
            m.epoch,
            m.reward_mean,
            m.reward_std,
            m.credit.turning_points,
            m.credit.turning_points_positive,
            m.credit.turning_points_negative,
            m.loss.ratio_mean,
            m.loss.clip_frac_above,
            m.loss.clip_frac_below,
            m.loss.kl,
            m.nfe_per_sample,
            m.seconds,
            terms_line(m),
            eval.map(|r| format!("\n           held-out {r:.4}{}", report_line(m)))
                .unwrap_or_default()
        ),
    }
}

/// How the run starts in its output folder, from `--resume` / `--overwrite`.
fn start(args: &Args) -> run_dir::Start {
    match (args.resume.is_some(), args.overwrite) {
        (true, _) => run_dir::Start::Resume,
        (_, true) => run_dir::Start::Overwrite,
        _ => run_dir::Start::Fresh,
    }
}

/// The `task` object of a settings file: what `--model`, `--prompts`, `--reward` and
/// `--resolution` give (the options take precedence).
#[derive(serde::Deserialize, serde::Serialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct TaskSettings {
    model: Option<PathBuf>,
    prompts: Option<PathBuf>,
    reward: Option<Vec<String>>,
    resolution: Option<usize>,
}

/// The `--config` file without its `task` object, and the task: the file's values where the
/// command line gives none, then the defaults.
fn read_config(args: &mut Args) -> tpgrpo::Result<Option<serde_json::Value>> {
    let mut task = TaskSettings::default();
    let mut settings = None;
    if let Some(path) = &args.config {
        let mut json = read_settings(path)?;
        if let Some(value) = json.as_object_mut().and_then(|o| o.remove("task")) {
            task = serde_json::from_value(value)
                .map_err(|e| tpgrpo::Error::format(path, format!("`task`: {e}")))?;
        }
        settings = Some(json);
    }
    args.model = args.model.take().or(task.model);
    args.prompts = args.prompts.take().or(task.prompts);
    if args.rewards.is_empty() {
        args.rewards = task.reward.unwrap_or_else(|| vec!["toy-alignment".to_string()]);
    }
    args.resolution = args.resolution.or(task.resolution).or(Some(512));
    if args.prompts.is_some() && args.model.is_none() {
        return Err(tpgrpo::Error::config(
            "prompts",
            "a prompt folder needs a model (`--model` or `task.model`)",
        ));
    }
    Ok(settings)
}

/// Exit status of a run stopped by SIGINT or SIGTERM once its checkpoint is written (sysexits'
/// `EX_TEMPFAIL`: run it again with `--resume`). A second signal ends the process at once with
/// the shell's status for it (130 for SIGINT, 143 for SIGTERM).
pub const STOPPED: i32 = 75;

/// A flag that SIGINT and SIGTERM set; a second one, when the flag is already set, exits at
/// once.
fn stop_on_signals() -> tpgrpo::Result<Arc<AtomicBool>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [SIGINT, SIGTERM] {
        // The shutdown hook first: it sees the flag as the previous signal left it.
        signal_hook::flag::register_conditional_shutdown(signal, 128 + signal, stop.clone())
            .and_then(|_| signal_hook::flag::register(signal, stop.clone()))
            .map_err(|e| tpgrpo::Error::config("signal handlers", e.to_string()))?;
    }
    Ok(stop)
}

/// Trains as `args` say (see the module documentation); a run stopped by a signal says where
/// its checkpoint is and exits with [`STOPPED`].
pub fn run(args: Args) -> tpgrpo::Result<()> {
    if args.mpi {
        return run_rank(args);
    }
    ended(train(args, None))
}

/// What a run that ended with `result` returns: a stop says where its checkpoint is and exits
/// with [`STOPPED`].
fn ended(result: tpgrpo::Result<()>) -> tpgrpo::Result<()> {
    match result {
        Err(tpgrpo::Error::Stopped { epoch, checkpoint }) => {
            say!(
                "stopped after epoch {epoch}: checkpoint {}; continue with --resume",
                checkpoint.display()
            );
            std::process::exit(STOPPED)
        }
        other => other,
    }
}

/// [`run`] as one rank of an MPI job. Rank 0 prints; an outcome every rank shares (the end, a
/// stop, ranks that differ) ends MPI normally, any other error is printed with the rank and
/// aborts the job, so that no rank waits for this one.
#[cfg(feature = "mpi")]
fn run_rank(args: Args) -> tpgrpo::Result<()> {
    let mpi = Mpi::init()?;
    let rank = mpi.rank();
    if rank != 0 {
        crate::console::silence();
    }
    match train(args, Some(&mpi)) {
        Ok(()) => {
            mpi.finish();
            Ok(())
        }
        Err(e @ (tpgrpo::Error::Stopped { .. } | tpgrpo::Error::RanksDiffer { .. })) => {
            let status = if matches!(e, tpgrpo::Error::Stopped { .. }) { STOPPED } else { 1 };
            mpi.finish();
            if rank == 0 {
                return ended(Err(e));
            }
            std::process::exit(status)
        }
        Err(e) => {
            crate::console::error(format_args!("rank {rank}: {e}"));
            mpi.abort(1)
        }
    }
}

/// Without the `mpi` feature: the error says how to build with it.
#[cfg(not(feature = "mpi"))]
fn run_rank(_: Args) -> tpgrpo::Result<()> {
    Err(tpgrpo::Error::config(
        "mpi",
        "`--mpi` needs a build with MPI: `cargo build --release --features mpi` (docs/training.md)",
    ))
}

/// [`run`] until the end or a stop, as rank `mpi` of an MPI job or alone.
fn train(mut args: Args, mpi: Option<&Mpi>) -> tpgrpo::Result<()> {
    let settings = read_config(&mut args)?;
    let file = args.config.as_deref().zip(settings.as_ref());
    let device = backend::init()?;
    let objective = args.objective.as_ref().map(|o| format!("objective.objective={o}"));
    let mut sets: Vec<String> = objective.into_iter().chain(args.sets.iter().cloned()).collect();
    sets.extend(args.devices.map(|n| format!("devices={n}")));
    if let Some(dir) = &args.model {
        return train_diffusers(dir, &args, mpi, file, &sets, &device);
    }
    let config = toy::train_config().with_json(file, &sets)?;
    if args.print_config {
        return print_config(&args, &config);
    }
    let objective = config.objective.objective.name();
    let out = args.out.clone().unwrap_or_else(|| PathBuf::from(format!("runs/toy-{objective}")));
    let claim = claim(&out, &args, mpi)?;
    say!(
        "tpgrpo train: embedded toy task, {} with {} on {} ({}) x {}, {} epochs of {} \
         prompts x {}, output {}",
        objective,
        args.rewards.join(" + "),
        backend::NAME,
        dtype_name(config.precision.resolve::<Backend>(&device)?),
        replicas(&config, mpi),
        config.epochs,
        config.prompts_per_epoch,
        config.group_size,
        out.display()
    );
    let history = train_replicas(&config, &args, mpi, &out, |settings, reward, out, device| {
        toy::trainer::<TrainBackend>(settings, reward, out, device)
    })?;
    report(&history, &config, &out);
    drop(claim);
    Ok(())
}

/// Prints the task and the settings as pretty JSON, in the settings' own order (a file
/// `--config` reads back).
fn print_config(args: &Args, config: &TrainConfig) -> tpgrpo::Result<()> {
    /// A settings file: the task, then every setting.
    #[derive(serde::Serialize)]
    struct SettingsFile<'a> {
        task: TaskSettings,
        #[serde(flatten)]
        settings: &'a TrainConfig,
    }
    let task = TaskSettings {
        model: args.model.clone(),
        prompts: args.prompts.clone(),
        reward: Some(args.rewards.clone()),
        resolution: args.resolution,
    };
    let file = SettingsFile { task, settings: config };
    say!("{}", serde_json::to_string_pretty(&file).expect("settings serialise"));
    Ok(())
}

/// Claims the output folder for this run (rank 0 of an MPI job, which alone writes it), and
/// says so when its lock was taken over from a run that was killed.
fn claim(out: &Path, args: &Args, mpi: Option<&Mpi>) -> tpgrpo::Result<Option<run_dir::Claim>> {
    if !mpi.is_none_or(is_lead) {
        return Ok(None);
    }
    let claim = run_dir::claim(out, start(args))?;
    if let Some(pid) = claim.took_over_from {
        say!(
            "{}: took over from process {pid}, which ended without releasing the folder",
            out.display()
        );
    }
    Ok(Some(claim))
}

/// Prints the held-out reward at the first and last evaluation and the gradient noise scale
/// against the samples of one update.
fn report(history: &[EpochMetrics], config: &TrainConfig, out: &std::path::Path) {
    let evals: Vec<&EpochMetrics> = history.iter().filter(|m| m.eval_reward.is_some()).collect();
    if let (Some(first), Some(last)) = (evals.first(), evals.last()) {
        let (a, b) = (first.eval_reward.unwrap_or(0.0), last.eval_reward.unwrap_or(0.0));
        let (e0, e1) = (first.epoch, last.epoch);
        say!("held-out reward: {a:.4} at epoch {e0} -> {b:.4} at epoch {e1} ({:+.4})", b - a);
        for (name, before) in &first.eval_report {
            let after = last.eval_report.get(name).copied().unwrap_or(f64::NAN);
            say!("  {name:<15} {before:.4} -> {after:.4} ({:+.4})", after - before);
        }
    }
    let n = config.prompts_per_epoch * config.group_size / config.optimizer_steps_per_epoch;
    match noise_scale(history) {
        Some(b) => say!("gradient noise scale: {b:.0} samples per update (this run: {n})"),
        None => say!(
            "gradient noise scale: not resolved (at {n} samples per update the gradient noise \
             hides the signal, or no update had two micro-batches)"
        ),
    }
    say!("metrics: {}", out.join("metrics.jsonl").display());
}

/// TP-GRPO / Flow-GRPO on a diffusers SD3 / SD3.5 or FLUX.1 folder (the family read from
/// `model_index.json`) with its family's reference settings (`TrainConfig::new`,
/// `TrainConfig::flux_dev` with the folder's dynamic shift), the GenEval-style prompts of the
/// embedded task and its `--reward`, at `--resolution`.
fn train_diffusers(
    dir: &std::path::Path,
    args: &Args,
    mpi: Option<&Mpi>,
    file: Option<(&Path, &serde_json::Value)>,
    sets: &[String],
    device: &backend::Device,
) -> tpgrpo::Result<()> {
    // The family decides the defaults (the references' settings for each); the settings file
    // and `--set` apply on top.
    let family = match Family::of(dir) {
        Ok(family) => family,
        // Settings can be printed for a model not downloaded yet: its family is unknown.
        Err(_) if args.print_config && !dir.join("model_index.json").exists() => {
            eprintln!(
                "note: {} holds no model_index.json: printing the SD3 settings",
                dir.display()
            );
            Family::Sd3
        }
        Err(e) => return Err(e),
    };
    let defaults = match family {
        Family::Sd3 => TrainConfig::new(),
        Family::Flux => {
            let mut flux = TrainConfig::flux_dev();
            let scheduler = dir.join("scheduler/scheduler_config.json");
            flux.rollout.dynamic_shift = Some(DynamicShift::from_scheduler_config(scheduler)?);
            flux
        }
    };
    let config = defaults.with_json(file, sets)?;
    if args.print_config {
        return print_config(args, &config);
    }
    let out = args.out.clone().unwrap_or_else(|| {
        PathBuf::from(format!("runs/{}-{}", family.name(), config.objective.objective.name()))
    });
    let claim = claim(&out, args, mpi)?;
    // Prompts first, and each replica loads its rewards before the transformer: a wrong path
    // fails before the transformer is read.
    let set = args.prompts.as_ref().map(PromptSet::load).transpose()?;
    let side = args.resolution.unwrap_or(512);
    let (train_prompts, eval_prompts, checks) = match &set {
        Some(set) => (set.train.clone(), set.test.clone(), false),
        None => (toy::prompts(toy::Split::Train), toy::prompts(toy::Split::Eval), true),
    };
    say!(
        "tpgrpo train: {} with {} and {} on {} ({}) x {}, {} epochs of {} prompts x {} at \
         {}px, {} training prompts ({}), output {}",
        dir.display(),
        config.objective.objective.name(),
        args.rewards.join(" + "),
        backend::NAME,
        dtype_name(config.precision.resolve::<Backend>(device)?),
        replicas(&config, mpi),
        config.epochs,
        config.prompts_per_epoch,
        config.group_size,
        side,
        train_prompts.len(),
        args.prompts.as_ref().map_or("the toy task's".into(), |p| p.display().to_string()),
        out.display()
    );
    let model = dir.to_path_buf();
    let history =
        train_replicas(&config, args, mpi, &out, move |settings, reward, out, device| {
            // What the reward reads of each prompt, checked at its file:line before the
            // transformer loads.
            if let Some(set) = &set {
                set.check(&|p| reward.check_prompt(p))?;
            }
            let resolution = |e| match e {
                tpgrpo::Error::Config { message, .. } => {
                    tpgrpo::Error::config("resolution", message)
                }
                other => other,
            };
            let (transformer, pipeline): (Denoiser<TrainBackend>, Box<dyn TextToImage<Backend>>) =
                match family {
                    Family::Sd3 => {
                        let transformer = MMDiT::<TrainBackend>::load(&model, device)?;
                        let config = &transformer.config;
                        let [h, w] =
                            image_to_latent_size(config, 8, [side, side]).map_err(resolution)?;
                        let latent = [config.in_channels, h, w];
                        let pipeline = Sd3Conditioner::<Backend>::load(
                            &model,
                            DEFAULT_T5_LENGTH,
                            latent,
                            device,
                        )?;
                        (transformer.into(), Box::new(pipeline))
                    }
                    Family::Flux => {
                        let transformer = Flux::<TrainBackend>::load(&model, device)?;
                        let [h, w] = flux_latent_size(8, [side, side]).map_err(resolution)?;
                        let latent = [transformer.config.in_channels / 4, h, w];
                        let pipeline = FluxConditioner::<Backend>::load(
                            &model,
                            DEFAULT_T5_LENGTH,
                            latent,
                            device,
                        )?;
                        (transformer.into(), Box::new(pipeline))
                    }
                };
            let report = checks.then(|| Box::new(ToyChecks) as Box<dyn Report>);
            let (train_prompts, eval_prompts) = (train_prompts.clone(), eval_prompts.clone());
            let task = Task { pipeline, reward, train_prompts, eval_prompts, report };
            Trainer::new(settings, transformer, task, out)
        })?;
    report(&history, &config, &out);
    drop(claim);
    Ok(())
}
