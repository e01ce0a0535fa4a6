//! Data-parallel training on the CPU: two NdArray replicas in one process, joined by Burn's
//! collective, against the single-device run of the same settings (same prompts, noise and
//! samples); the exact all-gather; a failing replica stops the run with its error. The
//! gradients of the optimizer steps are checked where they can be bounded, in the crate's
//! unit test `train::parallel::tests` (each step's gradient against the sum of its
//! per-sample terms).
//!
//! The collective's server is one per process and backend, so these tests take turns.

use crate::common;

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tpgrpo::backend::{Backend as B, TrainBackend};
use tpgrpo::prompts::Prompt;
use tpgrpo::reward::Reward;
use tpgrpo::toy::{self, ToyAlignment, ToyPipeline};
use tpgrpo::train::Silent;
use tpgrpo::train::{parallel, EpochMetrics, Replica, TrainConfig, Trainer};

static COLLECTIVE: Mutex<()> = Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    COLLECTIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Two epochs of [`common::DATA_PARALLEL_SETTINGS`].
fn config() -> TrainConfig {
    let sets: Vec<String> =
        common::DATA_PARALLEL_SETTINGS.iter().chain(&["epochs=2"]).map(|s| s.to_string()).collect();
    toy::train_config().with_sources(None, &sets).unwrap()
}

fn trainer(config: TrainConfig, out: &Path) -> Trainer<TrainBackend, ToyPipeline<B>> {
    toy::trainer(config, Box::new(ToyAlignment), out, &Default::default()).unwrap()
}

fn two_replicas(out: &Path) -> tpgrpo::Result<Vec<EpochMetrics>> {
    let out = out.to_path_buf();
    parallel::train::<TrainBackend, _, _, _>(
        vec![Default::default(); 2],
        move |_, device| toy::trainer(config(), Box::new(ToyAlignment), &out, device),
        Silent,
    )
}

/// Two replicas run the single device's epochs: the first epoch's samples, rewards, credit and
/// step count bit for bit (the replicas draw the single device's rollout chunks and gather
/// the rewards exactly), a second epoch after the first's update, and one metrics file
/// written by the lead.
///
/// The adapters are not compared: after AdamW they differ from the single device's by more
/// than summation order can be bounded from outside (`lr m / (sqrt(v) + eps)` turns f32
/// roundings of gradients near `eps` into steps of size `lr`; on one AMD EPYC a regrouped
/// single-device run differed by as much as an epoch moves the adapters). The unit test
/// `train::parallel::tests` compares the gradients instead, before the optimizer.
#[test]
fn two_replicas_run_the_single_device_epochs() {
    let _turn = turn();
    let single = common::scratch("dp-single");
    let one = trainer(config(), &single).train(&mut Silent).unwrap();
    let double = common::scratch("dp-double");
    let two = two_replicas(&double).unwrap();
    assert_first_epoch_like_one_device(&one, &two);
    // Only the lead replica writes: one metrics file with one line per epoch.
    let lines = tpgrpo::train::read_metrics(&double.join("metrics.jsonl")).unwrap();
    assert_eq!(lines.len(), 2);
}

/// The first epoch of `two` (a data-parallel run) equals that of `one` (one device) in
/// everything computed before the first optimizer step; both ran the same number of epochs
/// and optimizer steps.
fn assert_first_epoch_like_one_device(one: &[EpochMetrics], two: &[EpochMetrics]) {
    assert_eq!(one.len(), 2);
    assert_eq!(two.len(), 2);
    let (a, b) = (&one[0], &two[0]);
    assert_eq!(a.reward_mean, b.reward_mean);
    assert_eq!(a.reward_std, b.reward_std);
    assert_eq!(a.credit, b.credit);
    assert_eq!(a.nfe_per_sample, b.nfe_per_sample);
    assert_eq!(a.reward_terms, b.reward_terms);
    assert_eq!(a.optimizer_steps, b.optimizer_steps);
    assert!(a.optimizer_steps > 0, "the first epoch had no reward signal: {a:?}");
    assert_eq!(one[1].optimizer_steps, two[1].optimizer_steps);
}

/// Every replica's values, bit for bit, whatever they are.
#[test]
fn all_gather_is_exact() {
    let _turn = turn();
    let values = |rank: usize| -> Vec<f64> {
        let odd = [f64::MIN_POSITIVE / 3.0, -0.0, f64::MAX, 1.0 + f64::EPSILON, f64::NAN, -1e-300];
        odd.iter().take(rank + 2).map(|v| v * (rank + 1) as f64).collect()
    };
    let config = burn::collective::CollectiveConfig::default().with_num_devices(3);
    let handles: Vec<_> = (0..3)
        .map(|rank| {
            let config = config.clone();
            std::thread::spawn(move || {
                let r = Replica::threads(rank, 3);
                let device = Default::default();
                r.register::<B>(&device, config).unwrap();
                let all = r.all_gather::<B>(&values(rank), &device).unwrap();
                r.finish::<B>().unwrap();
                all
            })
        })
        .collect();
    for h in handles {
        let all = h.join().unwrap();
        for (rank, got) in all.iter().enumerate() {
            let want: Vec<u64> = values(rank).iter().map(|v| v.to_bits()).collect();
            assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want);
        }
    }
}

/// The shares of any number of replicas tile the samples in order, within one of each other.
#[test]
fn shares_tile_the_samples() {
    for size in 1..7 {
        for total in size..40 {
            let shares: Vec<_> =
                (0..size).map(|rank| Replica::threads(rank, size).share(total)).collect();
            assert_eq!(shares[0].start, 0);
            assert_eq!(shares[size - 1].end, total);
            for w in shares.windows(2) {
                assert_eq!(w[0].end, w[1].start);
            }
            let lens: Vec<usize> = shares.iter().map(|s| s.len()).collect();
            assert!(lens.iter().max().unwrap() - lens.iter().min().unwrap() <= 1, "{lens:?}");
        }
    }
}

/// A reward that fails, as a broken reward server would.
struct Broken;

impl Reward for Broken {
    fn name(&self) -> &str {
        "broken"
    }
    fn score(&self, _: &[tpgrpo::image::Image], _: &[Prompt]) -> tpgrpo::Result<Vec<f64>> {
        Err(tpgrpo::Error::config("reward", "the broken test reward"))
    }
}

/// Replica 1's reward fails during the first rollouts while replica 0 goes on to the reward
/// gather: the run stops with replica 1's error instead of waiting for it forever.
#[test]
fn a_failing_replica_stops_the_run() {
    let _turn = turn();
    let out = common::scratch("dp-failing");
    let started = Instant::now();
    let dir = out.clone();
    let err = parallel::train::<TrainBackend, _, _, _>(
        vec![Default::default(); 2],
        move |replica, device| {
            let reward: Box<dyn Reward> =
                if replica.rank == 1 { Box::new(Broken) } else { Box::new(ToyAlignment) };
            toy::trainer(config(), reward, &dir, device)
        },
        Silent,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("the broken test reward"), "{err}");
    assert!(started.elapsed() < parallel::STOP_WAIT + Duration::from_secs(60), "took too long");
    // The collective works again for the next run.
    let next = common::scratch("dp-after-failure");
    assert_eq!(two_replicas(&next).unwrap().len(), 2);
}
