//! TP-GRPO against the Flow-GRPO baseline on the embedded toy task: the same seeds, prompts
//! per epoch, epochs and optimizer steps for both, three seeds each. Writes one PNG with every
//! held-out reward curve (TP-GRPO red, Flow-GRPO blue; pale lines per seed, saturated the mean),
//! a Markdown table (held-out reward, the rule-based score and check pass rates before and
//! after, each run's gradient noise scale), and `first-last.png`: the first and last
//! evaluation grids of each objective's first seed side by side; prints the table.

#[macro_use]
#[path = "../src/cli/console.rs"]
mod console;

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Parser;
use tpgrpo::backend::{self, TrainBackend};
use tpgrpo::toy;
use tpgrpo::train::{noise_scale, run_dir, EpochMetrics, Observer};
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
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        console::fail(e);
    }
}

/// `(epoch, held-out reward)` of one run, the mean training reward of its last epoch, its NFE
/// per sample and its seconds.
struct Run {
    evals: Vec<(usize, f64)>,
    /// The report of the first and the last evaluation.
    reports: [std::collections::BTreeMap<String, f64>; 2],
    nfe: f64,
    seconds: f64,
    noise_scale: Option<f64>,
}

fn run_one(objective: &str, seed: u64, args: &Args) -> tpgrpo::Result<Run> {
    let device = backend::init()?;
    let sets: Vec<String> =
        [format!("objective.objective={objective}"), format!("seed={seed}"), "save_every=0".into()]
            .into_iter()
            .chain(args.sets.iter().cloned())
            .collect();
    let config = toy::train_config().with_sources(None, &sets)?;
    let out = args.out.join(format!("{objective}-seed{seed}"));
    let start = if args.overwrite { run_dir::Start::Overwrite } else { run_dir::Start::Fresh };
    // Held for this run (dropped at the end of the function).
    let claim = run_dir::claim(&out, start)?;
    if let Some(pid) = claim.took_over_from {
        say!("{}: took over from process {pid}, which ended without releasing it", out.display());
    }
    let reward = toy::reward(&args.reward)?;
    let mut trainer = toy::trainer::<TrainBackend>(config, reward, &out, &device)?;
    let mut progress = HeldOut { label: format!("{objective} seed {seed}") };
    let history: Vec<EpochMetrics> = trainer.train(&mut progress)?;
    let trained = &history[1..];
    let evaluated: Vec<&EpochMetrics> =
        history.iter().filter(|m| m.eval_reward.is_some()).collect();
    let report = |m: Option<&&EpochMetrics>| m.map(|m| m.eval_report.clone()).unwrap_or_default();
    Ok(Run {
        evals: history.iter().filter_map(|m| m.eval_reward.map(|r| (m.epoch, r))).collect(),
        reports: [report(evaluated.first()), report(evaluated.last())],
        nfe: trained.iter().map(|m| m.nfe_per_sample).sum::<f64>() / trained.len() as f64,
        seconds: trained.iter().map(|m| m.seconds).sum(),
        noise_scale: noise_scale(&history),
    })
}

fn mean_curve(runs: &[Run]) -> Vec<(f64, f64)> {
    let epochs: Vec<usize> = runs[0].evals.iter().map(|e| e.0).collect();
    epochs
        .iter()
        .enumerate()
        .map(|(i, &e)| {
            (e as f64, runs.iter().map(|r| r.evals[i].1).sum::<f64>() / runs.len() as f64)
        })
        .collect()
}

fn run(args: Args) -> tpgrpo::Result<()> {
    let objectives = ["tp-grpo", "flow-grpo"];
    let mut table = String::from(
        "| objective | seed | held-out before | held-out after | change | rule-based score | colour / count / shape / relation checks | NFE / sample | train seconds | noise scale |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut series = Vec::new();
    let mut summary = Vec::new();
    for objective in objectives {
        let (color, name) = (objective_color(objective), objective_label(objective));
        let mut runs = Vec::new();
        for &seed in &args.seeds {
            say!("{objective}, seed {seed}");
            let r = run_one(objective, seed, &args)?;
            let (first, last) = (r.evals[0].1, r.evals[r.evals.len() - 1].1);
            writeln!(
                table,
                "| {objective} | {seed} | {first:.4} | {last:.4} | {:+.4} | {} | {} | {:.0} | {:.0} | {} |",
                last - first,
                before_after(&r.reports, &["toy_geneval"]),
                before_after(&r.reports, &["check_color", "check_count", "check_shape", "check_relation"]),
                r.nfe,
                r.seconds,
                r.noise_scale.map_or("not resolved".into(), |b| format!("{b:.0}"))
            )
            .expect("string");
            // Each seed in a light tint of the objective's colour, in the legend once.
            let tint = color.map(|c| c / 3 + 170);
            series.push(Series {
                label: if runs.is_empty() { format!("{name}, each seed") } else { String::new() },
                color: tint,
                dashed: false,
                points: r.evals.iter().map(|&(e, v)| (e as f64, v)).collect(),
            });
            runs.push(r);
        }
        let curve = mean_curve(&runs);
        let (first, last) = (curve[0].1, curve[curve.len() - 1].1);
        summary.push(format!(
            "| {objective} | mean | {first:.4} | {last:.4} | {:+.4} | | | | | |",
            last - first
        ));
        let label = format!("{name}, mean of {} seeds", runs.len());
        series.push(Series { label, color, dashed: false, points: curve });
    }
    for line in summary {
        writeln!(table, "{line}").expect("string");
    }
    std::fs::create_dir_all(&args.out).map_err(|e| tpgrpo::Error::io(&args.out, e))?;
    let chart = Chart {
        title: format!("Held-out reward, TP-GRPO vs Flow-GRPO ({} seeds)", args.seeds.len()),
        x_label: "epoch".into(),
        y_label: "held-out reward (mean over prompts)".into(),
        series,
    };
    save_chart(&args.out.join("compare.png"), &chart)?;
    first_last(&args)?;
    let path = args.out.join("results.md");
    std::fs::write(&path, &table).map_err(|e| tpgrpo::Error::io(&path, e))?;
    say!("\n{table}");
    say!("chart: {}", args.out.join("compare.png").display());
    Ok(())
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
    for objective in ["tp-grpo", "flow-grpo"] {
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

/// Prints each held-out evaluation of a run as it comes.
struct HeldOut {
    label: String,
}

impl Observer for HeldOut {
    fn epoch(&mut self, m: &EpochMetrics, _: &[EpochMetrics]) -> tpgrpo::Result<()> {
        if let Some(r) = m.eval_reward {
            say!("  {} epoch {:3}: held-out {r:.4}", self.label, m.epoch);
        }
        Ok(())
    }
}
