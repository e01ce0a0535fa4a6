//! The trainer as `train_sd3 --model DIR --prompts DIR --reward pickscore=DIR --reward
//! aesthetic=DIR:0.5` assembles it: the tiny SD3 folder, a flow_grpo prompt folder and the
//! tiny CLIP rewards, trained end to end, with every reward logged in `metrics.jsonl`.

mod common;

use std::path::{Path, PathBuf};

use tpgrpo::backend::{Backend as B, TrainBackend};
use tpgrpo::model::MMDiT;
use tpgrpo::pipeline::Sd3Conditioner;
use tpgrpo::prompts::PromptSet;
use tpgrpo::reward::{load_rewards, RewardSpec};
use tpgrpo::train::{EpochMetrics, Task, TrainConfig, Trainer};

fn fixtures(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(sub)
}

#[test]
fn trains_sd3_on_a_prompt_folder_with_clip_rewards() {
    let device = common::device();
    let out = common::scratch("train-rewards");
    let prompts = out.join("prompts");
    std::fs::create_dir_all(&prompts).unwrap();
    std::fs::write(prompts.join("train.txt"), "a cat on a mat\na red car\na bowl of fruit\n")
        .unwrap();
    std::fs::write(prompts.join("test.txt"), "a dog\na blue house\n").unwrap();
    let set = PromptSet::load(&prompts).unwrap();

    let pick = format!("pickscore={}", fixtures("reward/pickscore").display());
    let aesthetic = format!("aesthetic={}:0.5", fixtures("reward/clip").display());
    let specs = [RewardSpec::parse(&pick).unwrap(), RewardSpec::parse(&aesthetic).unwrap()];
    let no_named = |name: &str| -> tpgrpo::Result<Box<dyn tpgrpo::reward::Reward>> {
        panic!("no named reward expected, got {name}")
    };
    let reward = load_rewards::<B>(&specs, &device, &no_named).unwrap();

    let sets: Vec<String> = [
        "epochs=2",
        "prompts_per_epoch=2",
        "group_size=3",
        "rollout_batch=6",
        "train_batch=6",
        "rollout.num_steps=4",
        "rollout.window_size=2",
        "eval_every=2",
        "eval_steps=4",
        "eval_prompts=2",
        "save_every=2",
        "lora.rank=4",
        "optimizer_steps_per_epoch=1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let config = TrainConfig::new().with_sources(None, &sets).unwrap();
    let sd3 = fixtures("pipeline/sd3_tiny");
    let transformer = MMDiT::<TrainBackend>::load(&sd3, &device).unwrap();
    let conditioner = Sd3Conditioner::<B>::load(&sd3, 16, [16, 8, 8], &device).unwrap();
    let task = Task {
        pipeline: conditioner,
        reward,
        train_prompts: set.train,
        eval_prompts: set.test,
        report: None,
    };
    let mut trainer = Trainer::new(config, transformer, task, &out).unwrap();
    let history = trainer.train(|_| {}).unwrap();
    assert_eq!(history.last().unwrap().optimizer_steps, 2);
    assert!(history.last().unwrap().eval_reward.is_some_and(f64::is_finite));

    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let logged: Vec<EpochMetrics> =
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let trained: Vec<&EpochMetrics> = logged.iter().filter(|m| m.epoch > 0).collect();
    assert_eq!(trained.len(), 2);
    for m in trained {
        let names: Vec<&str> = m.reward_terms.keys().map(String::as_str).collect();
        assert_eq!(names, ["aesthetic", "pickscore"]);
        // The logged total is the weighted sum of the logged terms (means are linear).
        let sum = m.reward_terms["pickscore"] + 0.5 * m.reward_terms["aesthetic"];
        assert!((m.reward_mean - sum).abs() < 1e-9, "{} vs {sum}", m.reward_mean);
        assert!(m.reward_std > 0.0, "different samples must score differently");
    }
}
