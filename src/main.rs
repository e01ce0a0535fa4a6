//! The `tpgrpo` command line.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[macro_use]
#[path = "cli/console.rs"]
mod console;
#[path = "cli/train.rs"]
mod train;
use tpgrpo::backend::{self, Backend, TrainBackend};
use tpgrpo::doctor::{DoctorConfig, Event};
use tpgrpo::grpo::{inspect, parse_credit_input, CreditReport};
use tpgrpo::model::{cast_params, Adaptable, MMDiT, Precision};
use tpgrpo::pipeline::{SampleConfig, Sd3Pipeline};
use tpgrpo::reward::{load_rewards, score_terms};
use tpgrpo::Error;

/// `println!` for results: a closed stdout (`tpgrpo credit ... | head`) ends the program quietly
/// with status 141, as a Unix tool ends on SIGPIPE; any other output failure is an error.
macro_rules! out {
    ($($arg:tt)*) => {
        emit(format_args!($($arg)*))
    };
}

/// Writes one line to stdout (see [`out!`]).
fn emit(args: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    let written =
        stdout.write_fmt(args).and_then(|()| stdout.write_all(b"\n")).and_then(|()| stdout.flush());
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(141),
        Err(e) => console::fail(format_args!("standard output: {e}")),
    }
}

/// tpgrpo: TP-GRPO fine-tuning tools.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Train with TP-GRPO or Flow-GRPO: the embedded toy task by default, or a diffusers
    /// SD3 / SD3.5 folder (`--model`) with real prompts and rewards (the `train_sd3` example).
    Train(train::Args),
    /// Show TP-GRPO credit assignment for a batch of reward sequences: step rewards, turning
    /// points, credited rewards and advantages.
    Credit {
        /// JSON file: {"batch": [[R_ode, R_1, .., R_sde], ..], "prompt_ids": [..], "options": {..}}
        #[arg(long)]
        input: PathBuf,
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Generate an image with an SD3 / SD3.5 diffusers folder.
    Sample {
        /// The diffusers folder (`model_index.json`, `transformer/`, `vae/`, text encoders).
        #[arg(long)]
        model: PathBuf,
        /// The prompt.
        #[arg(long)]
        prompt: String,
        /// Negative prompt.
        #[arg(long, default_value = "")]
        negative_prompt: String,
        /// Euler steps.
        #[arg(long, default_value_t = 40)]
        steps: usize,
        /// Classifier-free guidance scale.
        #[arg(long, default_value_t = 4.5)]
        cfg: f64,
        /// Noise seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Image height in pixels (default: the model's native size).
        #[arg(long)]
        height: Option<usize>,
        /// Image width in pixels (default: the model's native size).
        #[arg(long)]
        width: Option<usize>,
        /// T5 sequence length.
        #[arg(long, default_value_t = tpgrpo::pipeline::DEFAULT_T5_LENGTH)]
        max_sequence_length: usize,
        /// Output PNG.
        #[arg(long, default_value = "img.png")]
        out: PathBuf,
        /// A trained adapter applied to the transformer: a PEFT folder, a diffusers LoRA file
        /// (`pytorch_lora_weights.safetensors`) or a training checkpoint folder.
        #[arg(long)]
        adapter: Option<PathBuf>,
        /// Weight of the adapter's update (diffusers' adapter weight): 0 is the base model.
        #[arg(long, default_value_t = 1.0, requires = "adapter")]
        adapter_scale: f64,
        /// Transformer weights and activations: `auto` (bf16 where the backend computes it),
        /// `f32` or `bf16`.
        #[arg(long, default_value = "auto")]
        precision: Precision,
    },
    /// Merge a trained adapter into a transformer and write it as a diffusers `transformer/`
    /// folder (f32), which diffusers and `tpgrpo sample` load without the adapter.
    Merge {
        /// The base transformer: a diffusers pipeline or `transformer/` folder, or a
        /// single-file checkpoint.
        #[arg(long)]
        model: PathBuf,
        /// The adapter: a PEFT folder, a diffusers LoRA file or a training checkpoint folder.
        #[arg(long)]
        adapter: PathBuf,
        /// Weight of the adapter's update.
        #[arg(long, default_value_t = 1.0)]
        adapter_scale: f64,
        /// The folder to write (`config.json`, `diffusion_pytorch_model.safetensors`); must not
        /// hold a model already.
        #[arg(long)]
        out: PathBuf,
    },
    /// Score images on disk with rewards, as training would (check a reward before a long run);
    /// prints JSON.
    Score {
        /// A reward, repeatable: `KIND=PATH[:WEIGHT]` (`pickscore=DIR`, `clipscore=DIR`,
        /// `aesthetic=DIR|FILE.pth`) or `toy-alignment` / `toy-geneval`.
        #[arg(long = "reward", required = true)]
        rewards: Vec<String>,
        /// Prompt file (`.txt`: one a line; `.jsonl`: flow_grpo metadata lines): one prompt per
        /// image, in order, or a single prompt for every image.
        #[arg(long)]
        prompts: PathBuf,
        /// The images (PNG).
        #[arg(long, required = true, num_args = 1..)]
        images: Vec<PathBuf>,
    },
    /// Check the selected backend stage by stage (device, matmul, element-wise, attention, toy
    /// forward, LoRA backward, one toy epoch), printing each stage's time as it goes.
    Doctor {
        /// Seconds after which the watchdog names the stage still running.
        #[arg(long, default_value_t = 30)]
        stall_secs: u64,
        /// Skip the toy training epoch.
        #[arg(long)]
        no_epoch: bool,
    },
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Train(args) => train::run(args),
        Command::Credit { input, json } => credit(&input, json),
        Command::Sample {
            model,
            prompt,
            negative_prompt,
            steps,
            cfg,
            seed,
            height,
            width,
            max_sequence_length,
            out,
            adapter,
            adapter_scale,
            precision,
        } => {
            let config = SampleConfig::new()
                .with_steps(steps)
                .with_guidance_scale(cfg)
                .with_height(height)
                .with_width(width)
                .with_negative_prompt(negative_prompt);
            let adapter = adapter.map(|path| (path, adapter_scale));
            let weights = Weights { model, adapter, precision, max_sequence_length };
            sample(&weights, &prompt, seed, &config, &out)
        }
        Command::Merge { model, adapter, adapter_scale, out } => {
            merge(&model, &adapter, adapter_scale, &out)
        }
        Command::Score { rewards, prompts, images } => score(&rewards, &prompts, &images),
        Command::Doctor { stall_secs, no_epoch } => doctor(stall_secs, !no_epoch),
    };
    if let Err(e) = result {
        console::fail(e);
    }
}

fn credit(path: &PathBuf, json: bool) -> tpgrpo::Result<()> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let input = parse_credit_input(&text).map_err(|e| match e {
        Error::Format { message, .. } => Error::format(path, message),
        other => other,
    })?;
    let report = inspect(&input)?;
    if json {
        out!("{}", serde_json::to_string_pretty(&report).expect("report serialises"));
    } else {
        out!("{}", render_table(&report).trim_end());
    }
    Ok(())
}

/// Renders the report as a table per trajectory. `*` marks a kept turning point, `-` one that
/// balancing reverted to its step reward.
fn render_table(report: &CreditReport) -> String {
    let mut out = String::new();
    let objective = report.options.objective.name();
    let (mut kept, mut reverted) = (0, 0);
    for (i, t) in report.trajectories.iter().enumerate() {
        let n = t.step_rewards.len();
        let _ = writeln!(
            out,
            "trajectory {i} (prompt {})  R_ode {:+.4}  R_sde {:+.4}  Delta {:+.4}  flow-grpo advantage {:+.4}",
            t.prompt_id, t.rewards[0], t.rewards[n], t.delta, t.flow_grpo_advantage
        );
        let _ = writeln!(out, "  step  R_after      d_k   TP  credited  tp-grpo adv");
        for k in 0..n {
            let mark = match (t.turning_points[k], t.candidate_turning_points[k]) {
                (true, _) => "*",
                (false, true) => "-",
                _ => " ",
            };
            kept += usize::from(t.turning_points[k]);
            reverted += usize::from(t.candidate_turning_points[k] && !t.turning_points[k]);
            let _ = writeln!(
                out,
                "  {k:>4}  {:>7.4}  {:>+7.4}   {mark}   {:>+7.4}  {:>+11.4}",
                t.rewards[k + 1],
                t.step_rewards[k],
                t.credited_rewards[k],
                t.tp_grpo_advantages[k]
            );
        }
    }
    let _ = writeln!(
        out,
        "{} trajectories, objective {objective}: {kept} turning point(s) credited, {reverted} reverted by balancing",
        report.trajectories.len()
    );
    out
}

/// What `tpgrpo sample` generates with: the pipeline folder, an adapter and its scale, the
/// transformer's precision and the T5 length.
struct Weights {
    model: PathBuf,
    adapter: Option<(PathBuf, f64)>,
    precision: Precision,
    max_sequence_length: usize,
}

fn sample(
    weights: &Weights,
    prompt: &str,
    seed: u64,
    config: &SampleConfig,
    out: &std::path::Path,
) -> tpgrpo::Result<()> {
    let device = backend::init()?;
    let dtype = weights.precision.resolve::<Backend>(&device)?;
    let mut pipe =
        Sd3Pipeline::<Backend>::load(&weights.model, weights.max_sequence_length, &device)?;
    if let Some((path, scale)) = &weights.adapter {
        let (adapted, lora) = pipe.transformer.load_adapter(path)?;
        pipe.transformer = adapted.scale_lora(*scale).merge_lora();
        let modules = lora.target_modules.len();
        out!(
            "adapter {} (rank {}, alpha {}, {modules} targets) x {scale}",
            path.display(),
            lora.rank,
            lora.alpha
        );
    }
    pipe.transformer = cast_params(pipe.transformer, dtype);
    let images = pipe.generate(&[prompt], &[seed], config)?;
    tpgrpo::image::save_png(out, &images[0])?;
    out!("wrote {} ({}x{})", out.display(), images[0].width, images[0].height);
    Ok(())
}

fn merge(
    model: &std::path::Path,
    adapter: &std::path::Path,
    scale: f64,
    out: &std::path::Path,
) -> tpgrpo::Result<()> {
    for existing in ["config.json", "diffusion_pytorch_model.safetensors"] {
        if out.join(existing).exists() {
            return Err(Error::format(
                out,
                format!("already holds {existing}; choose another --out or remove it"),
            ));
        }
    }
    let device = backend::init()?;
    let base = MMDiT::<Backend>::load(model, &device)?;
    let (adapted, lora) = base.load_adapter(adapter)?;
    adapted.scale_lora(scale).merge_lora().save_diffusers(out)?;
    out!(
        "merged {} (rank {}, alpha {}) x {scale} into {}: wrote {}",
        adapter.display(),
        lora.rank,
        lora.alpha,
        model.display(),
        out.display()
    );
    Ok(())
}

fn score(
    rewards: &[String],
    prompt_file: &std::path::Path,
    images: &[PathBuf],
) -> tpgrpo::Result<()> {
    let prompts = tpgrpo::prompts::read_prompts(prompt_file)?;
    if prompts.len() != 1 && prompts.len() != images.len() {
        return Err(Error::config(
            "prompts",
            format!(
                "{} prompts for {} images (give one per image, or one)",
                prompts.len(),
                images.len()
            ),
        ));
    }
    // Every header first (a bad file fails before the rewards load), then one image at a time:
    // images on disk may differ in size, and only one is in memory at once.
    for path in images {
        tpgrpo::image::image_dimensions(path)?;
    }
    let device = backend::init()?;
    let reward = load_rewards::<Backend>(rewards, &device, &tpgrpo::toy::reward)?;
    // What the reward reads of each prompt, at its file:line (prompt i is on line i + 1).
    for (i, prompt) in prompts.iter().enumerate() {
        reward.check_prompt(prompt).map_err(|e| {
            Error::format(format!("{}:{}", prompt_file.display(), i + 1), e.to_string())
        })?;
    }
    let mut rows = Vec::with_capacity(images.len());
    // One prompt for every image, or one each.
    for (path, prompt) in images.iter().zip(prompts.iter().cycle()) {
        let image = tpgrpo::image::load_png(path)?;
        let (total, terms) = score_terms(reward.as_ref(), &[image], std::slice::from_ref(prompt))?;
        let terms: serde_json::Map<String, serde_json::Value> =
            terms.into_iter().map(|t| (t.name, t.scores[0].into())).collect();
        rows.push(serde_json::json!({
            "image": path.display().to_string(),
            "prompt": prompt.text,
            "score": total[0],
            "terms": terms,
        }));
    }
    let out = serde_json::json!({ "reward": rewards, "scores": rows });
    out!("{}", serde_json::to_string_pretty(&out).expect("scores serialise"));
    Ok(())
}

fn doctor(stall_secs: u64, epoch: bool) -> tpgrpo::Result<()> {
    let config = DoctorConfig::new().with_stall_secs(stall_secs).with_epoch(epoch);
    let cache = match backend::use_kernel_cache(&backend::cache_dir())? {
        Some(dir) => dir.display().to_string(),
        None => "none (the CPU backend compiles nothing)".to_string(),
    };
    let device = backend::device();
    out!("tpgrpo doctor: backend {}, kernel and autotune cache {cache}", backend::NAME);
    let stages = tpgrpo::doctor::run::<TrainBackend>(&config, &device, &print_stage)?;
    let total: f64 = stages.iter().map(|s| s.seconds).sum();
    out!("all {} stages passed in {total:.1} s", stages.len());
    Ok(())
}

/// One line per doctor event, flushed at once (a hang shows where it is).
fn print_stage(event: Event<'_>) {
    match event {
        Event::Passed(s) => out!("{:<32}{:9.3} s  {}", s.name, s.seconds, s.detail),
        Event::Failed { stage, seconds } => out!("{stage:<32}{seconds:9.3} s  FAILED"),
        Event::Running { stage, seconds } => out!("  ... still in '{stage}' after {seconds} s"),
    }
    let _ = std::io::Write::flush(&mut std::io::stdout());
}
