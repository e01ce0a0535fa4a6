//! The main job: TP-GRPO fine-tuning of an SD3-family model.
//!
//! The trainer is not built yet (issues: sampler, objective, trainer). Until then this example
//! loads the model it would train, runs one forward pass to show the stack works on the
//! selected backend, and says what the finished job will do.

use std::path::PathBuf;

use burn::prelude::*;
use clap::Parser;
use tpgrpo::backend::{self, Backend};
use tpgrpo::model::{MMDiT, MMDiTConfig};

/// Command-line options.
#[derive(Parser, Debug)]
#[command(about = "TP-GRPO fine-tuning of SD3 / SD3.5 (trainer not implemented yet)")]
struct Args {
    /// A diffusers SD3/SD3.5 folder, transformer folder or single-file checkpoint.
    #[arg(long)]
    model: Option<PathBuf>,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> tpgrpo::Result<()> {
    println!("tpgrpo train_sd3 (backend: {})", backend::NAME);
    println!(
        "NOTE: the TP-GRPO trainer is not implemented yet; this run only checks the model stack."
    );
    let device = backend::device();
    let model: MMDiT<Backend> = match &args.model {
        Some(path) => MMDiT::load(path, &device)?,
        None => {
            // Until the embedded default model ships, a tiny random MMDiT stands in for it.
            let config = MMDiTConfig::new()
                .with_num_layers(2)
                .with_num_attention_heads(2)
                .with_attention_head_dim(32)
                .with_caption_projection_dim(64)
                .with_joint_attention_dim(64)
                .with_pooled_projection_dim(32)
                .with_pos_embed_max_size(16);
            config.init(&device)?
        }
    };
    let cfg = &model.config;
    println!(
        "model: {} blocks, hidden {}, {} heads, qk-norm {}, dual-attention blocks {:?}",
        cfg.num_layers,
        cfg.hidden_size(),
        cfg.num_attention_heads,
        cfg.has_qk_norm(),
        cfg.dual_attention_layers
    );
    let latent = Tensor::<Backend, 4>::random(
        [1, cfg.in_channels, 16, 16],
        burn::tensor::Distribution::Normal(0.0, 1.0),
        &device,
    );
    let v = model.forward(
        latent,
        Tensor::from_floats([1000.0], &device),
        Tensor::zeros([1, 8, cfg.joint_attention_dim], &device),
        Tensor::zeros([1, cfg.pooled_projection_dim], &device),
    )?;
    println!("one forward pass: velocity {:?}", v.dims());
    println!(
        "When finished, this job will: sample groups of images with the SDE sampler, score the ODE"
    );
    println!(
        "completions of every intermediate latent, credit turning points, and update LoRA adapters"
    );
    println!("with the clipped TP-GRPO objective, printing the held-out reward before and after.");
    Ok(())
}
