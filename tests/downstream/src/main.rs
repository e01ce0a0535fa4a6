//! One TP-GRPO epoch of tpgrpo's toy task with a reward defined here, through the public API
//! only; exits non-zero when anything fails or the run reports nothing.

use tpgrpo::backend::{self, TrainBackend};
use tpgrpo::image::Image;
use tpgrpo::reward::Reward;
use tpgrpo::prompts::Prompt;
use tpgrpo::train::{EpochMetrics, Observer, Phase};

/// Mean brightness of the image: a reward a user could write in a few lines.
struct Brightness;

impl Reward for Brightness {
    fn name(&self) -> &str {
        "brightness"
    }

    fn score(&self, images: &[Image], _prompts: &[Prompt]) -> tpgrpo::Result<Vec<f64>> {
        let mean =
            |im: &Image| im.pixels.iter().map(|&v| v as f64).sum::<f64>() / im.pixels.len() as f64;
        Ok(images.iter().map(mean).collect())
    }
}

/// Counts what the run reports.
#[derive(Default)]
struct Counts {
    phases: Vec<Phase>,
    epochs: usize,
}

impl Observer for Counts {
    fn phase(&mut self, _epoch: usize, phase: Phase, _total: usize) {
        self.phases.push(phase);
    }

    fn epoch(&mut self, _m: &EpochMetrics, _history: &[EpochMetrics]) -> tpgrpo::Result<()> {
        self.epochs += 1;
        Ok(())
    }
}

fn main() -> tpgrpo::Result<()> {
    let device = backend::device();
    let config = tpgrpo::toy::train_config().with_sources(
        None,
        &["epochs=1", "prompts_per_epoch=2", "group_size=4", "eval_every=0"].map(String::from),
    )?;
    let out = std::env::temp_dir().join(format!("tpgrpo-downstream-{}", std::process::id()));
    let mut trainer =
        tpgrpo::toy::trainer::<TrainBackend>(config, Box::new(Brightness), &out, &device)?;
    let mut counts = Counts::default();
    let history = trainer.train(&mut counts)?;
    let _ = std::fs::remove_dir_all(&out);
    let m = history.last().expect("one epoch");
    assert!(m.reward_mean.is_finite() && m.reward_mean > 0.0, "reward {}", m.reward_mean);
    assert_eq!(counts.epochs, 1);
    assert_eq!(counts.phases, [Phase::Rollouts, Phase::Updates]);
    println!("downstream: one epoch, brightness reward {:.4}", m.reward_mean);
    Ok(())
}
