//! Pre-trains the embedded toy model (`models/toy/`) by flow matching on procedurally drawn
//! shape images: the recipe that produced the shipped weights, kept so it can be re-run.
//!
//! `x_sigma = (1 - sigma) x0 + sigma eps`, target velocity `eps - x0`, `sigma` logit-normal
//! (SD3's training distribution), 10% of prompts replaced by the empty prompt so classifier-free
//! guidance works, AdamW, from DiT's adaLN-Zero initialisation. Ends with a 40-step ODE
//! evaluation on held-out prompts, overall, per prompt kind and per check (colour, count, shape,
//! relation: `toy::ToyChecks`); `--grid` also writes the images. The defaults reproduce
//! the shipped weights (37 minutes on 2 cores).

#[macro_use]
#[path = "../src/cli/console.rs"]
mod console;

use std::path::PathBuf;
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::prelude::*;
use clap::Parser;
use tpgrpo::backend::{self, Backend, TrainBackend};
use tpgrpo::image::Image;
use tpgrpo::prompts::Prompt;
use tpgrpo::reward::{score_checked, Report};
use tpgrpo::rng::SplitMix64;
use tpgrpo::sampler::{ode_sample, seeded_noise, FlowSchedule};
use tpgrpo::toy::{self, prompts, render, Scene, Split, ToyChecks, ToyModel, ToyScorer};

/// Command-line options.
#[derive(Parser, Debug)]
#[command(about = "Flow-matching pre-training of the embedded toy model")]
struct Args {
    /// Optimizer steps (0 with `--resume`: only evaluate the weights in `--out`).
    #[arg(long, default_value_t = 8000)]
    steps: usize,
    /// Images per step.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Peak learning rate (linear warm-up over the first 100 steps, then cosine to 10%).
    #[arg(long, default_value_t = 2e-3)]
    lr: f64,
    /// Seed of prompts, layouts, noise and initialisation.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output folder (required: the shipped model is only replaced when named, `--out models/toy`).
    #[arg(long)]
    out: PathBuf,
    /// Continue from the weights in `--out` instead of a fresh initialisation.
    #[arg(long)]
    resume: bool,
    /// Also write the held-out evaluation images (one per prompt, rows of 8) to this PNG.
    #[arg(long)]
    grid: Option<PathBuf>,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        console::fail(e);
    }
}

fn lr_at(step: usize, total: usize, peak: f64) -> f64 {
    let warm = 100.min(total);
    if step < warm {
        return peak * (step + 1) as f64 / warm as f64;
    }
    let p = (step - warm) as f64 / (total - warm).max(1) as f64;
    peak * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * p).cos()))
}

fn run(args: Args) -> tpgrpo::Result<()> {
    if args.batch == 0 {
        return Err(tpgrpo::Error::config("batch", "must be at least 1"));
    }
    if !(args.lr.is_finite() && args.lr > 0.0) {
        return Err(tpgrpo::Error::config("lr", format!("{} is not a positive number", args.lr)));
    }
    let device = backend::init()?;
    let image_bytes = 3 * toy::IMAGE_SIZE * toy::IMAGE_SIZE * 4;
    let fits = args.batch as f64 * image_bytes as f64
        <= backend::memory(&device).unwrap_or(u64::MAX) as f64;
    if !fits {
        return Err(tpgrpo::Error::config("batch", "a step's images do not fit in memory"));
    }
    <Backend as burn::tensor::backend::Backend>::seed(&device, args.seed);
    let mut model: ToyModel<TrainBackend> =
        if args.resume { ToyModel::load(&args.out, &device)? } else { ToyModel::init(&device)? };
    say!("toy model: {} parameters, backend {}", model.num_params(), backend::NAME);
    let train: Vec<Scene> =
        prompts(Split::Train).iter().map(Scene::from_prompt).collect::<tpgrpo::Result<_>>()?;
    let mut rng = SplitMix64(args.seed ^ 0x5eed);
    let mut optim = AdamWConfig::new().with_weight_decay(0.0).with_epsilon(1e-8).init();
    let shape = [3, toy::IMAGE_SIZE, toy::IMAGE_SIZE];
    let start = Instant::now();
    let mut running = 0.0;
    for step in 0..args.steps {
        let scenes: Vec<&Scene> =
            (0..args.batch).map(|_| &train[rng.range(0, train.len() - 1)]).collect();
        let images: Vec<_> = scenes.iter().map(|s| render(s, rng.next_u64())).collect();
        let texts: Vec<String> = scenes
            .iter()
            .map(|s| if rng.uniform() < 0.1 { String::new() } else { s.text() })
            .collect();
        let x0 = toy::images_to_latents::<TrainBackend>(&images, &device);
        let seeds: Vec<u64> = (0..args.batch).map(|_| rng.next_u64()).collect();
        let eps = seeded_noise::<TrainBackend>(&seeds, 0, shape, &device);
        let sigmas: Vec<f32> = seeds
            .iter()
            .map(|&s| {
                let u = tpgrpo::rng::gaussian(s, 1, 1)[0];
                1.0 / (1.0 + (-u).exp())
            })
            .collect();
        let sigma = Tensor::<TrainBackend, 1>::from_floats(sigmas.as_slice(), &device);
        let s4 = sigma.clone().reshape([args.batch, 1, 1, 1]);
        let xt = x0.clone() * (s4.clone().neg() + 1.0) + eps.clone() * s4;
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let cond = model.encode(&refs)?;
        let v = model.transformer.forward(xt, sigma * 1000.0, cond.text, cond.pooled)?;
        let loss = (v - (eps - x0)).square().mean();
        let value: f32 = loss.clone().into_scalar().elem();
        if !value.is_finite() {
            return Err(tpgrpo::Error::NonFinite {
                what: format!("flow-matching loss at step {step} (nothing saved)"),
                count: 1,
                total: 1,
            });
        }
        running = if step == 0 { value } else { 0.98 * running + 0.02 * value };
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(lr_at(step, args.steps, args.lr), model, grads);
        if step % 100 == 0 || step + 1 == args.steps {
            say!(
                "step {step:5}  loss {running:.4}  lr {:.2e}  {:.0} s",
                lr_at(step, args.steps, args.lr),
                start.elapsed().as_secs_f64()
            );
        }
    }
    let model = model.valid();
    if args.steps > 0 {
        model.save(&args.out)?;
        say!("saved {}", args.out.display());
    }

    // Held-out evaluation: 40-step ODE, CFG 4.5, one image per prompt.
    let eval = prompts(Split::Eval);
    let (images, scores, checks) = evaluate(&model, &eval, &device)?;
    if let Some(path) = &args.grid {
        tpgrpo::image::save_grid(path, &images, 8, 4)?;
        say!("wrote {}", path.display());
    }
    let mean = |tag: Option<&str>| {
        let picked: Vec<f64> = eval
            .iter()
            .zip(&scores)
            .filter(|(p, _)| tag.is_none_or(|t| p.metadata["tag"] == t))
            .map(|(_, &s)| s)
            .collect();
        (picked.iter().sum::<f64>() / picked.len() as f64, picked.len())
    };
    let perfect = scores.iter().filter(|&&s| s >= 1.0).count();
    let (all, n) = mean(None);
    say!("held-out reward {all:.3} over {n} prompts ({perfect} perfect)");
    for tag in ["counting", "two_object", "position"] {
        let (m, n) = mean(Some(tag));
        say!("  {tag:<10} {m:.3} ({n} prompts)");
    }
    let rates: Vec<String> = checks
        .iter()
        .filter_map(|(name, passed, made)| {
            let check = name.strip_prefix("check_")?;
            Some(format!("{check} {:.3}", passed / made.max(1.0)))
        })
        .collect();
    say!("checks passed: {}", rates.join(", "));
    Ok(())
}

/// A report's `(name, sum, count)` entries.
type Tally = Vec<(String, f64, f64)>;

fn evaluate(
    model: &ToyModel<Backend>,
    eval: &[Prompt],
    device: &backend::Device,
) -> tpgrpo::Result<(Vec<Image>, Vec<f64>, Tally)> {
    let texts: Vec<&str> = eval.iter().map(|p| p.text.as_str()).collect();
    let cond = model.encode(&texts)?;
    let uncond = model.encode(&vec![""; texts.len()])?;
    let seeds: Vec<u64> = (0..eval.len() as u64).collect();
    let noise = seeded_noise::<Backend>(&seeds, 0, [3, toy::IMAGE_SIZE, toy::IMAGE_SIZE], device);
    let schedule = FlowSchedule::new(40, 3.0)?;
    let out = ode_sample(&model.transformer, &schedule, noise, &cond, &uncond, 4.5)?;
    let images = toy::latents_to_images(out)?;
    let scores = score_checked(&ToyScorer, &images, eval)?;
    let checks = ToyChecks.tally(&images, eval)?;
    Ok((images, scores, checks))
}
