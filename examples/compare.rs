//! TP-GRPO against the Flow-GRPO baseline on the embedded toy task: the same seeds, prompts
//! per epoch and optimizer steps for both, three seeds each, and either the same epochs or the
//! same compute (`--budget-seconds`, `--budget-nfe`: each objective trains until it has spent
//! that much, then evaluates once more). Writes the held-out reward curves against the epoch
//! (`compare.png`), the training seconds (`compare-seconds.png`) and the transformer
//! evaluations (`compare-nfe.png`) — TP-GRPO blue, Flow-GRPO orange; light lines per seed, full
//! colour the mean — a Markdown table (held-out reward, the rule-based score and check pass
//! rates before and after, epochs, NFE and seconds spent, each run's gradient noise scale), and
//! `first-last.png`: the first and last evaluation grids of each objective's first seed side
//! by side; prints the table.

#[macro_use]
#[path = "../src/cli/console.rs"]
mod console;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Parser;
use tpgrpo::backend::{self, TrainBackend};
use tpgrpo::toy;
use tpgrpo::train::{noise_scale, read_metrics, run_dir, EpochMetrics, Observer};
use tpgrpo::train::{objective_color, objective_label, save_chart, Chart, Series};

/// Command-line options.
#[derive(Parser, Debug)]
#[command(about = "TP-GRPO vs Flow-GRPO on the embedded toy task")]
struct Args {
    /// Seeds (one run per objective and seed).
    #[arg(long, value_delimiter = ',', default_value = "0,1,2")]
    seeds: Vec<u64>,
    /// `toy-alignment` (dense prompt alignment) or `toy-geneval` (the rule-based scorer).
    #[arg(long, default_value = "toy-alignment")]
    reward: String,
    /// Overrides `key.path=value` applied to both objectives (repeatable).
    #[arg(long = "set")]
    sets: Vec<String>,
    /// Output folder.
    #[arg(long, default_value = "runs/compare")]
    out: PathBuf,
    /// Replace runs left in the output folder by an earlier comparison (else they are refused).
    #[arg(long)]
    overwrite: bool,
    /// Train each run until its training epochs have taken this many seconds (instead of
    /// the `epochs` setting, which then only bounds the run), then evaluate.
    #[arg(long, conflicts_with = "budget_nfe")]
    budget_seconds: Option<f64>,
    /// Train each run until it has made this many transformer evaluations (rollouts and
    /// completions of every sample; the `epochs` setting then only bounds the run), then
    /// evaluate.
    #[arg(long)]
    budget_nfe: Option<f64>,
    /// An ablation instead of the comparison: `key.path=v1,v2,...` trains every objective of
    /// `--objectives` with each value and seed, and writes `sweep.md` and `sweep.png` (the
    /// final held-out reward against the value).
    #[arg(long)]
    sweep: Option<String>,
    /// The objectives compared or swept.
    #[arg(long, value_delimiter = ',', default_value = "tp-grpo,flow-grpo",
          value_parser = ["tp-grpo", "flow-grpo"])]
    objectives: Vec<String>,
}

/// What a run may spend.
#[derive(Clone, Copy, Debug)]
enum Budget {
    /// The `epochs` setting.
    Epochs,
    /// Seconds of training (evaluation excluded).
    Seconds(f64),
    /// Transformer evaluations.
    Nfe(f64),
}

impl Budget {
    fn of(args: &Args) -> Budget {
        match (args.budget_seconds, args.budget_nfe) {
            (Some(s), _) => Budget::Seconds(s),
            (_, Some(n)) => Budget::Nfe(n),
            _ => Budget::Epochs,
        }
    }

    /// Whether a run that has spent `seconds` and `nfe` is done.
    fn spent(&self, seconds: f64, nfe: f64) -> bool {
        match *self {
            Budget::Epochs => false,
            Budget::Seconds(s) => seconds >= s,
            Budget::Nfe(n) => nfe >= n,
        }
    }
}

fn main() {
    let args = Args::parse();
    let result = match &args.sweep {
        Some(spec) => sweep(spec, &args),
        None => run(args),
    };
    if let Err(e) = result {
        console::fail(e);
    }
}

/// `key.path=v1,v2,...` as the key and its values.
fn parse_sweep(spec: &str) -> tpgrpo::Result<(String, Vec<String>)> {
    let bad = || tpgrpo::Error::config("sweep", format!("{spec:?} is not key.path=v1,v2,..."));
    let (key, values) = spec.split_once('=').ok_or_else(bad)?;
    let values: Vec<String> = values.split(',').map(|v| v.trim().to_string()).collect();
    if key.trim().is_empty() || values.iter().any(|v| v.is_empty()) {
        return Err(bad());
    }
    Ok((key.trim().to_string(), values))
}

/// The ablation of `--sweep`: every objective, value and seed; a table of the final held-out
/// reward (mean and spread over seeds), the rule-based score and checks, and a chart of the
/// final held-out reward against the value.
fn sweep(spec: &str, args: &Args) -> tpgrpo::Result<()> {
    let (key, values) = parse_sweep(spec)?;
    // Every value is checked before the first run starts.
    for value in &values {
        toy::train_config().with_sources(None, &[format!("{key}={value}")])?;
    }
    let numeric: Option<Vec<f64>> = values.iter().map(|v| v.parse().ok()).collect();
    let x = |i: usize| numeric.as_ref().map_or(i as f64, |v| v[i]);
    let mut table = format!(
        "| objective | {key} | seeds | held-out before | held-out after (mean ± sd) | change | rule-based score after | colour / count / shape / relation checks after | NFE / sample | train seconds (mean) |\n|---|---|---|---|---|---|---|---|---|---|\n"
    );
    let mut series = Vec::new();
    for objective in &args.objectives {
        let (color, name) = (objective_color(objective), objective_label(objective));
        let mut means = Vec::new();
        for (i, value) in values.iter().enumerate() {
            let setting = format!("{key}={value}");
            let mut runs = Vec::new();
            for &seed in &args.seeds {
                say!("{objective}, {setting}, seed {seed}");
                runs.push(run_one(objective, seed, Some(&setting), args)?);
            }
            let first = |r: &Run| r.evals[0].reward;
            let last = |r: &Run| r.evals[r.evals.len() - 1].reward;
            let n = runs.len() as f64;
            let before = runs.iter().map(first).sum::<f64>() / n;
            let after = runs.iter().map(last).sum::<f64>() / n;
            let rate = |name: &str| {
                let v: Vec<f64> =
                    runs.iter().filter_map(|r| r.reports[1].get(name).copied()).collect();
                if v.is_empty() {
                    "-".to_string()
                } else {
                    format!("{:.3}", v.iter().sum::<f64>() / v.len() as f64)
                }
            };
            let checks: Vec<String> =
                ["check_color", "check_count", "check_shape", "check_relation"].map(rate).into();
            writeln!(
                table,
                "| {objective} | {value} | {} | {before:.4} | {after:.4} ± {:.4} | {:+.4} | {} | {} | {:.0} | {:.0} |",
                runs.len(),
                spread(runs.iter().map(last)),
                after - before,
                rate("toy_geneval"),
                checks.join(" / "),
                runs.iter().map(|r| r.nfe_per_sample).sum::<f64>() / n,
                runs.iter().map(|r| r.seconds).sum::<f64>() / n,
            )
            .expect("string");
            let tint = color.map(|c| c / 3 + 170);
            for (j, r) in runs.iter().enumerate() {
                let label = match (i, j) {
                    (0, 0) => format!("{name}, each seed"),
                    _ => String::new(),
                };
                series.push(Series {
                    label,
                    color: tint,
                    dashed: false,
                    points: vec![(x(i), last(r))],
                });
            }
            means.push((x(i), after));
        }
        let label = format!("{name}, mean of {} seeds", args.seeds.len());
        series.push(Series { label, color, dashed: false, points: means });
    }
    std::fs::create_dir_all(&args.out).map_err(|e| tpgrpo::Error::io(&args.out, e))?;
    let chart = Chart {
        title: format!("Final held-out reward against {key} ({} seeds)", args.seeds.len()),
        x_label: match numeric {
            Some(_) => key.clone(),
            None => format!("{key} (value index: {})", values.join(", ")),
        },
        y_label: "final held-out reward (mean over prompts)".into(),
        series,
    };
    save_chart(&args.out.join("sweep.png"), &chart)?;
    let path = args.out.join("sweep.md");
    std::fs::write(&path, &table).map_err(|e| tpgrpo::Error::io(&path, e))?;
    say!("\n{table}");
    say!("chart: {}", args.out.join("sweep.png").display());
    Ok(())
}

/// One evaluation of a run: when (epoch, training seconds and transformer evaluations spent
/// so far) and the held-out reward.
#[derive(Clone, Copy, Debug)]
struct Point {
    epoch: usize,
    seconds: f64,
    nfe: f64,
    reward: f64,
}

/// A run's evaluations, its first and last report, NFE per sample, what it spent and its
/// gradient noise scale.
struct Run {
    evals: Vec<Point>,
    /// The report of the first and the last evaluation.
    reports: [std::collections::BTreeMap<String, f64>; 2],
    nfe_per_sample: f64,
    epochs: usize,
    seconds: f64,
    nfe: f64,
    noise_scale: Option<f64>,
}

/// The training seconds and transformer evaluations the epochs of `history` spent
/// (`samples` per epoch; the line before training spent nothing).
fn spent(history: &[EpochMetrics], samples: f64) -> (f64, f64) {
    let trained = history.iter().filter(|m| m.epoch > 0);
    trained.fold((0.0, 0.0), |(s, n), m| (s + m.seconds, n + m.nfe_per_sample * samples))
}

/// The evaluations of `history` with the training seconds and NFE spent up to each.
fn points(history: &[EpochMetrics], samples: f64) -> Vec<Point> {
    let evaluated = history.iter().enumerate().filter_map(|(i, m)| Some((i, m.eval_reward?)));
    evaluated
        .map(|(i, reward)| {
            let (seconds, nfe) = spent(&history[..=i], samples);
            Point { epoch: history[i].epoch, seconds, nfe, reward }
        })
        .collect()
}

/// One run of `objective` with `seed`, the `--set` values and then `setting` (a sweep's
/// `key=value`), in its own folder of the output.
fn run_one(objective: &str, seed: u64, setting: Option<&str>, args: &Args) -> tpgrpo::Result<Run> {
    let device = backend::init()?;
    let sets: Vec<String> =
        [format!("objective.objective={objective}"), format!("seed={seed}"), "save_every=0".into()]
            .into_iter()
            .chain(args.sets.iter().cloned())
            .chain(setting.map(String::from))
            .collect();
    let config = toy::train_config().with_sources(None, &sets)?;
    let samples = (config.prompts_per_epoch * config.group_size) as f64;
    let folder = match setting {
        Some(s) => format!("{objective}-{s}-seed{seed}"),
        None => format!("{objective}-seed{seed}"),
    };
    let out = args.out.join(folder);
    let start = if args.overwrite { run_dir::Start::Overwrite } else { run_dir::Start::Fresh };
    // Held for this run (dropped at the end of the function).
    let claim = run_dir::claim(&out, start)?;
    if let Some(pid) = claim.took_over_from {
        say!("{}: took over from process {pid}, which ended without releasing it", out.display());
    }
    let reward = toy::reward(&args.reward)?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut trainer =
        toy::trainer::<TrainBackend>(config, reward, &out, &device)?.stopping_on(stop.clone());
    let budget = Budget::of(args);
    let label = format!("{objective} seed {seed}");
    let mut progress = Progress { label, budget, samples, stop };
    let metrics = out.join("metrics.jsonl");
    let mut history: Vec<EpochMetrics> = match trainer.train(&mut progress) {
        Ok(history) => history,
        // The budget is spent: the trainer stopped after the epoch that spent it.
        Err(tpgrpo::Error::Stopped { .. }) => read_metrics(&metrics)?,
        Err(e) => return Err(e),
    };
    // A run ends with an evaluation (a budget can end it between two).
    if history.last().is_some_and(|m| m.eval_reward.is_none()) {
        let eval = trainer.evaluate()?;
        let last = history.last_mut().expect("a line");
        (last.eval_reward, last.eval_report) = (Some(eval.reward), eval.report);
        say!(
            "  {} epoch {:3}: held-out {:.4} (end of budget)",
            progress.label,
            last.epoch,
            eval.reward
        );
    }
    let trained = &history[1..];
    let evaluated: Vec<&EpochMetrics> =
        history.iter().filter(|m| m.eval_reward.is_some()).collect();
    let report = |m: Option<&&EpochMetrics>| m.map(|m| m.eval_report.clone()).unwrap_or_default();
    let evals = points(&history, samples);
    let (seconds, nfe) = spent(&history, samples);
    Ok(Run {
        reports: [report(evaluated.first()), report(evaluated.last())],
        nfe_per_sample: trained.iter().map(|m| m.nfe_per_sample).sum::<f64>()
            / trained.len() as f64,
        epochs: trained.len(),
        seconds,
        nfe,
        noise_scale: noise_scale(&history),
        evals,
    })
}

/// The mean over runs of each evaluation's `(x, reward)`, as far as every run has evaluations
/// (under a budget, runs may evaluate a different number of times).
fn mean_curve(runs: &[Run], x: fn(&Point) -> f64) -> Vec<(f64, f64)> {
    let n = runs.iter().map(|r| r.evals.len()).min().unwrap_or(0);
    (0..n)
        .map(|i| {
            let mean = |f: &dyn Fn(&Point) -> f64| {
                runs.iter().map(|r| f(&r.evals[i])).sum::<f64>() / runs.len() as f64
            };
            (mean(&|p| x(p)), mean(&|p| p.reward))
        })
        .collect()
}

/// The x axis of a chart: its file, the axis name and an evaluation's value on it.
struct Axis {
    file: &'static str,
    name: &'static str,
    x: fn(&Point) -> f64,
}

/// The charts: reward against the epoch, the training seconds and the NFE.
const AXES: [Axis; 3] = [
    Axis { file: "compare.png", name: "epoch", x: |p| p.epoch as f64 },
    Axis {
        file: "compare-seconds.png",
        name: "training time (s, evaluation excluded)",
        x: |p| p.seconds,
    },
    Axis {
        file: "compare-nfe.png",
        name: "transformer evaluations (rollouts + completions)",
        x: |p| p.nfe,
    },
];

fn run(args: Args) -> tpgrpo::Result<()> {
    let objectives = args.objectives.clone();
    let budget = Budget::of(&args);
    let mut table = String::from(
        "| objective | seed | held-out before | held-out after | change | rule-based score | colour / count / shape / relation checks | epochs | NFE / sample | NFE | train seconds | noise scale |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut series: Vec<Vec<Series>> = vec![Vec::new(); AXES.len()];
    let mut summary = Vec::new();
    for objective in &objectives {
        let (color, name) = (objective_color(objective), objective_label(objective));
        let mut runs = Vec::new();
        for &seed in &args.seeds {
            say!("{objective}, seed {seed}");
            let r = run_one(objective, seed, None, &args)?;
            let (first, last) = (r.evals[0].reward, r.evals[r.evals.len() - 1].reward);
            writeln!(
                table,
                "| {objective} | {seed} | {first:.4} | {last:.4} | {:+.4} | {} | {} | {} | {:.0} | {:.3e} | {:.0} | {} |",
                last - first,
                before_after(&r.reports, &["toy_geneval"]),
                before_after(&r.reports, &["check_color", "check_count", "check_shape", "check_relation"]),
                r.epochs,
                r.nfe_per_sample,
                r.nfe,
                r.seconds,
                r.noise_scale.map_or("not resolved".into(), |b| format!("{b:.0}"))
            )
            .expect("string");
            // Each seed in a light tint of the objective's colour, in the legend once.
            let tint = color.map(|c| c / 3 + 170);
            for (chart, axis) in series.iter_mut().zip(&AXES) {
                chart.push(Series {
                    label: if runs.is_empty() {
                        format!("{name}, each seed")
                    } else {
                        String::new()
                    },
                    color: tint,
                    dashed: false,
                    points: r.evals.iter().map(|p| ((axis.x)(p), p.reward)).collect(),
                });
            }
            runs.push(r);
        }
        let curve = mean_curve(&runs, |p| p.epoch as f64);
        let (first, last) = (curve[0].1, curve[curve.len() - 1].1);
        let spread = spread(runs.iter().map(|r| r.evals[r.evals.len() - 1].reward));
        summary.push(format!(
            "| {objective} | mean (± sd over seeds) | {first:.4} | {last:.4} ± {spread:.4} | {:+.4} | | | | | | | |",
            last - first
        ));
        for (chart, axis) in series.iter_mut().zip(&AXES) {
            let label = format!("{name}, mean of {} seeds", runs.len());
            let points = mean_curve(&runs, axis.x);
            chart.push(Series { label, color, dashed: false, points });
        }
    }
    for line in summary {
        writeln!(table, "{line}").expect("string");
    }
    std::fs::create_dir_all(&args.out).map_err(|e| tpgrpo::Error::io(&args.out, e))?;
    let budget = match budget {
        Budget::Epochs => "same epochs".to_string(),
        Budget::Seconds(s) => format!("same training time, {s} s"),
        Budget::Nfe(n) => format!("same compute, {n:.0} NFE"),
    };
    for (axis, series) in AXES.iter().zip(series) {
        let chart = Chart {
            title: format!(
                "Held-out reward, TP-GRPO vs Flow-GRPO ({} seeds, {budget})",
                args.seeds.len()
            ),
            x_label: axis.name.into(),
            y_label: "held-out reward (mean over prompts)".into(),
            series,
        };
        save_chart(&args.out.join(axis.file), &chart)?;
    }
    first_last(&args)?;
    let path = args.out.join("results.md");
    std::fs::write(&path, &table).map_err(|e| tpgrpo::Error::io(&path, e))?;
    say!("\n{table}");
    for axis in &AXES {
        say!("chart: {}", args.out.join(axis.file).display());
    }
    Ok(())
}

/// The sample standard deviation of `values` (0 for fewer than two).
fn spread(values: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = values.collect();
    if v.len() < 2 {
        return 0.0;
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
}

/// `a -> b` of the named report rates (first and last evaluation), `/`-separated.
fn before_after(reports: &[std::collections::BTreeMap<String, f64>; 2], names: &[&str]) -> String {
    let rates = |i: usize| -> Vec<String> {
        names.iter().map(|n| reports[i].get(*n).map_or("-".into(), |v| format!("{v:.2}"))).collect()
    };
    format!("{} -> {}", rates(0).join(" / "), rates(1).join(" / "))
}

/// `first-last.png`: for each objective, the first seed's first and last evaluation grids
/// side by side (TP-GRPO above Flow-GRPO).
fn first_last(args: &Args) -> tpgrpo::Result<()> {
    let Some(seed) = args.seeds.first() else { return Ok(()) };
    let mut rows = Vec::new();
    for objective in &args.objectives {
        let dir = args.out.join(format!("{objective}-seed{seed}")).join("samples");
        let mut grids: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(|e| tpgrpo::Error::io(&dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "png"))
            .collect();
        grids.sort();
        let open = |p: &PathBuf| {
            image::open(p).map(|i| i.to_rgb8()).map_err(|e| tpgrpo::Error::format(p, e.to_string()))
        };
        if let (Some(a), Some(b)) = (grids.first(), grids.last()) {
            rows.push([open(a)?, open(b)?]);
        }
    }
    let Some([a, _]) = rows.first() else { return Ok(()) };
    let (w, h, gap) = (a.width(), a.height(), 16);
    let mut out = image::RgbImage::from_pixel(
        2 * w + gap,
        rows.len() as u32 * (h + gap),
        image::Rgb([255; 3]),
    );
    for (r, pair) in rows.iter().enumerate() {
        for (c, grid) in pair.iter().enumerate() {
            image::imageops::overlay(
                &mut out,
                grid,
                (c as u32 * (w + gap)) as i64,
                (r as u32 * (h + gap)) as i64,
            );
        }
    }
    let path = args.out.join("first-last.png");
    out.save(&path).map_err(|e| tpgrpo::Error::format(&path, e.to_string()))
}

/// Prints each held-out evaluation of a run as it comes, and stops the run once its
/// [`Budget`] is spent.
struct Progress {
    label: String,
    budget: Budget,
    /// Samples per epoch.
    samples: f64,
    stop: Arc<AtomicBool>,
}

impl Observer for Progress {
    fn epoch(&mut self, m: &EpochMetrics, history: &[EpochMetrics]) -> tpgrpo::Result<()> {
        if let Some(r) = m.eval_reward {
            say!("  {} epoch {:3}: held-out {r:.4}", self.label, m.epoch);
        }
        let (seconds, nfe) = spent(history, self.samples);
        if self.budget.spent(seconds, nfe) {
            self.stop.store(true, Ordering::Relaxed);
        }
        Ok(())
    }
}
