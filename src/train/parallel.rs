//! Data-parallel training: one [`Trainer`] replica per device, each on its own thread with its
//! own model, pipeline and reward, joined by Burn's collective (`burn-collective`).
//!
//! Every replica draws its contiguous share of the epoch's samples (the same seeds as on one
//! device), the rewards are gathered so that credit sees whole groups, the gradients of an
//! optimizer step are summed over the replicas before clipping and AdamW, and every replica
//! takes the same step. Replica 0 evaluates and writes metrics, samples and checkpoints.
//! Across processes and machines the same runs over MPI (`train_mpi`, with the `mpi`
//! feature): one process per device, each one replica.

use std::sync::mpsc;
use std::time::Duration;

use burn::collective::{reset_collective, CollectiveConfig};
use burn::tensor::backend::AutodiffBackend;

use super::metrics::EpochMetrics;
use super::observe::{Observer, Silent};
use super::replica::Replica;
use super::same_run::check_same_adapters;
use super::trainer::Trainer;
use crate::error::{Error, Result};
use crate::sampler::TextToImage;

/// How long the other replicas get to stop once one has failed, before the run returns the
/// failure anyway (a replica busy in a long forward pass notices at its next collective call).
pub const STOP_WAIT: Duration = Duration::from_secs(30);

/// Trains one replica per device of `devices` and returns the metrics of the first replica.
///
/// `build` makes the trainer of a replica on its device (it is called on the replica's
/// thread, after the replica has joined the collective, so a failing build stops the run like
/// any failure; a build that resumes sets the replica first, [`Trainer::with_replica`], so
/// that only the lead rewrites the metrics); `observer` sees the lead replica's progress and
/// metrics lines. At the end every replica checks that all hold the same adapters
/// ([`Error::RanksDiffer`] otherwise). The first replica error stops the run: the collective is reset, so replicas
/// waiting in it fail at once, and the others get [`STOP_WAIT`] to stop before the error is
/// returned.
pub fn train<B, P, F, O>(
    devices: Vec<B::Device>,
    build: F,
    observer: O,
) -> Result<Vec<EpochMetrics>>
where
    B: AutodiffBackend,
    P: TextToImage<B::InnerBackend>,
    F: Fn(Replica, &B::Device) -> Result<Trainer<B, P>> + Send + Sync + 'static,
    O: Observer + Send + 'static,
{
    if devices.is_empty() {
        return Err(Error::config("devices", "at least one device"));
    }
    let size = devices.len();
    let config = CollectiveConfig::default().with_num_devices(size);
    let build = std::sync::Arc::new(build);
    let (done, results) = mpsc::channel();
    let mut observer = Some(observer);
    for (d, device) in devices.into_iter().enumerate() {
        let replica = Replica::threads(d, size);
        let (build, done, config) = (build.clone(), done.clone(), config.clone());
        let lead_observer = observer.take();
        std::thread::Builder::new()
            .name(format!("replica-{}", replica.rank))
            .spawn(move || {
                let run = || -> Result<Vec<EpochMetrics>> {
                    if size > 1 {
                        replica.register::<B::InnerBackend>(&device, config)?;
                    }
                    let mut trainer = build(replica, &device)?.with_replica(replica);
                    let history = match lead_observer {
                        Some(mut observer) => trainer.train(&mut observer),
                        None => trainer.train(&mut Silent),
                    };
                    if size > 1 && history.is_ok() {
                        check_same_adapters(&trainer, &replica)?;
                    }
                    // A stop is agreed by every replica: they leave the collective together.
                    let agreed = matches!(history, Ok(_) | Err(Error::Stopped { .. }));
                    if size > 1 && agreed {
                        replica.finish::<B::InnerBackend>()?;
                    }
                    history
                };
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run))
                    .unwrap_or_else(|panic| {
                        let message = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "panicked".into());
                        Err(Error::Replica { rank: replica.rank, message })
                    });
                let _ = done.send((d, result));
            })
            .map_err(|e| Error::Replica { rank: d, message: e.to_string() })?;
    }
    drop(done);
    let mut history = None;
    let mut stopped = None;
    for _ in 0..size {
        let (d, result) = results.recv().map_err(|_| Error::Replica {
            rank: 0,
            message: "a replica thread ended without reporting".into(),
        })?;
        match result {
            Ok(h) if d == 0 => history = Some(h),
            Ok(_) => {}
            // Every replica stops at the same point; the lead may still be writing the
            // checkpoint: wait for all of them.
            Err(e @ Error::Stopped { .. }) => {
                if d == 0 || stopped.is_none() {
                    stopped = Some(e);
                }
            }
            Err(e) => {
                reset_collective::<B::InnerBackend>();
                let deadline = std::time::Instant::now() + STOP_WAIT;
                while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
                    if results.recv_timeout(left).is_err() {
                        break;
                    }
                }
                return Err(e);
            }
        }
    }
    if let Some(stopped) = stopped {
        return Err(stopped);
    }
    history.ok_or_else(|| Error::Replica { rank: 0, message: "no metrics".into() })
}

/// Trains this process's replica of an MPI job (`mpi` feature): `build` makes its trainer on
/// this process's device (see [`train`]), every rank checks that all ranks train the same
/// thing (settings, model weights and adapters, task, resumed epoch; [`Error::RanksDiffer`]
/// names what differs), the replicas train together, and at the end every rank checks that
/// all hold the same adapters. Returns this rank's metrics (the run's on rank 0, which alone
/// evaluates, writes and reports to `observer`).
///
/// An error returned here leaves the other ranks waiting in a collective unless it is one every
/// rank returns ([`Error::RanksDiffer`], [`Error::Stopped`]): the caller then aborts the job
/// ([`super::mpi::Mpi::abort`]; dropping the [`super::mpi::Mpi`] does too).
#[cfg(feature = "mpi")]
pub fn train_mpi<B, P, F, O>(
    mpi: &super::mpi::Mpi,
    build: F,
    mut observer: O,
) -> Result<Vec<EpochMetrics>>
where
    B: AutodiffBackend,
    P: TextToImage<B::InnerBackend>,
    F: FnOnce(Replica) -> Result<Trainer<B, P>>,
    O: Observer,
{
    let replica = mpi.replica();
    let mut trainer = build(replica)?.with_replica(replica);
    super::same_run::check_same_run(&trainer, &replica)?;
    let history = if replica.is_lead() {
        trainer.train(&mut observer)?
    } else {
        trainer.train(&mut Silent)?
    };
    check_same_adapters(&trainer, &replica)?;
    Ok(history)
}

#[cfg(test)]
mod tests {
    //! The gradient of each optimizer step, on one device and on two replicas, against the
    //! sum of its per-sample terms.
    //!
    //! With micro-batches of one sample, each term `grad loss_i / (|step| n)` is computed the
    //! same way wherever it is computed (same inputs, shapes and adapters), so a step's
    //! gradient on one device and on two replicas differ from the exact sum of the terms only
    //! by the order of f32 additions. Any order of adding `m` terms is within
    //! `gamma_m sum_i |term_i|` of their exact sum, `gamma_m = m u / (1 - m u)`, `u = 2^-24`
    //! (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., section 4.2),
    //! element by element, whatever the CPU: the tolerance comes from the magnitudes summed.
    //! A skipped or doubled sample, a replica stepping on its own share or a wrong scale
    //! moves some element by a whole term or more, which the test checks is more than twice
    //! the tolerance for every sample.

    use std::collections::BTreeMap;

    use burn::collective::CollectiveConfig;

    use crate::backend::{Backend as B, TrainBackend};
    use crate::model::Adaptable;
    use crate::toy::{self, ToyAlignment};
    use crate::train::update::{Gradients, StepLosses};
    use crate::train::{Replica, Silent, TrainConfig};

    /// Tensors by name, as f32 values.
    type Values = BTreeMap<String, Vec<f32>>;

    /// 2 prompts x 4 samples, rollout chunks of 4 (replica 0 draws samples 0..4 and replica 1
    /// samples 4..8, the single device's two chunks), 2 optimizer steps, micro-batches of 1.
    fn config() -> TrainConfig {
        let sets: Vec<String> = [
            "prompts_per_epoch=2",
            "group_size=4",
            "rollout_batch=4",
            "train_batch=1",
            "optimizer_steps_per_epoch=2",
            "rollout.num_steps=4",
            "rollout.window_size=2",
            "eval_every=0",
            "seed=3",
        ]
        .map(String::from)
        .into();
        toy::train_config().with_sources(None, &sets).unwrap()
    }

    fn values(grads: Gradients<B>) -> Values {
        grads.into_iter().map(|(n, t)| (n, t.into_data().to_vec::<f32>().unwrap())).collect()
    }

    /// What a replica computed in epoch 1: the samples of each optimizer step, each step's
    /// gradient at the initial adapters, the terms of each step's samples (on one device
    /// only: the others hold a share of the states), and the adapters after the epoch's
    /// update (on the replicas only, which must agree).
    struct Epoch {
        steps: Vec<Vec<usize>>,
        gradients: Vec<Values>,
        terms: Vec<Vec<Values>>,
        adapters: Values,
    }

    fn epoch(replica: Replica) -> Epoch {
        let device = Default::default();
        if replica.size > 1 {
            let collective = CollectiveConfig::default().with_num_devices(replica.size);
            replica.register::<B>(&device, collective).unwrap();
        }
        let out = std::env::temp_dir().join("tpgrpo-unit-never-written");
        let mut t = toy::trainer::<TrainBackend>(config(), Box::new(ToyAlignment), out, &device)
            .unwrap()
            .with_replica(replica);
        let mut batch = t.collect(1, &mut Silent).unwrap().expect("not stopped");
        let credit = t.credit(&mut batch).unwrap();
        let steps = t.step_samples(&credit, 1);
        let cfg = t.config().clone();
        let losses = StepLosses::new(&cfg, &batch, &credit.advantages, t.model()).unwrap();
        let (mut gradients, mut terms) = (Vec::new(), Vec::new());
        for samples in &steps {
            let (g, _) = t.step_gradient(&losses, samples, &mut Vec::new(), &mut Silent).unwrap();
            gradients.push(values(g));
            if replica.size == 1 {
                // Every sample weighs 1 / (step samples x trained steps).
                let scale = 1.0 / (samples.len() * cfg.rollout.window().len()) as f64;
                let term =
                    |i| values(losses.gradients(t.model(), &[i], scale, &mut Silent).unwrap().0);
                terms.push(samples.iter().map(|&i| term(i)).collect());
            }
        }
        drop(losses);
        let mut adapters = Values::new();
        if replica.size > 1 {
            t.update(&batch, &credit, 1, &mut Silent).unwrap();
            let lora = t.model().lora_tensors().into_iter().map(|(n, p)| (n, p.inner()));
            adapters = values(lora.collect());
            replica.finish::<B>().unwrap();
        }
        Epoch { steps, gradients, terms, adapters }
    }

    /// Checks `got` (one step's gradient) against the exact sum of `terms`, element by
    /// element, within `gamma_m sum |term|` plus the f64 rounding of the reference; returns
    /// the tolerances.
    fn assert_sum_of_terms(what: &str, got: &Values, terms: &[Values]) -> Values {
        let u = f64::powi(2.0, -24);
        let m = terms.len() as f64;
        let gamma = m * u / (1.0 - m * u) + m * f64::EPSILON;
        let mut tolerances = Values::new();
        for (name, g) in got {
            let mut tolerance = Vec::with_capacity(g.len());
            for (e, &value) in g.iter().enumerate() {
                let parts: Vec<f64> =
                    terms.iter().filter_map(|t| t.get(name)).map(|t| t[e] as f64).collect();
                let exact: f64 = parts.iter().sum();
                let bound = gamma * parts.iter().map(|p| p.abs()).sum::<f64>();
                let diff = (value as f64 - exact).abs();
                assert!(
                    diff <= bound,
                    "{what}: {name}[{e}] = {value}, sum of the terms {exact}, |diff| {diff} > {bound}"
                );
                tolerance.push(bound as f32);
            }
            tolerances.insert(name.clone(), tolerance);
        }
        tolerances
    }

    #[test]
    fn step_gradients_are_the_sum_of_their_terms_on_one_device_and_two_replicas() {
        let single = epoch(Replica::SINGLE);
        let replicas: Vec<Epoch> = (0..2)
            .map(|rank| std::thread::spawn(move || epoch(Replica::threads(rank, 2))))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        assert_eq!(single.steps.len(), 2, "two optimizer steps: {:?}", single.steps);
        for r in &replicas {
            assert_eq!(r.steps, single.steps);
        }
        for (s, terms) in single.terms.iter().enumerate() {
            let one = assert_sum_of_terms("one device", &single.gradients[s], terms);
            assert_sum_of_terms("two replicas", &replicas[0].gradients[s], terms);
            assert_eq!(replicas[0].gradients[s], replicas[1].gradients[s], "replicas disagree");
            // Every term is larger than twice the tolerance somewhere: leaving one out, or
            // counting it twice, fails the check above.
            for (i, term) in terms.iter().enumerate() {
                let seen = term
                    .iter()
                    .any(|(name, t)| t.iter().zip(&one[name]).any(|(v, tol)| v.abs() > 2.0 * tol));
                assert!(seen, "step {s}: sample {} is below the tolerance", single.steps[s][i]);
            }
        }
        // Both replicas took the same steps.
        assert!(!replicas[0].adapters.is_empty());
        assert_eq!(replicas[0].adapters, replicas[1].adapters);
    }
}
