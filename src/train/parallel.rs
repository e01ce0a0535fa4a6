//! Data-parallel training: one [`Trainer`] replica per device, each on its own thread with its
//! own model, pipeline and reward, joined by Burn's collective (`burn-collective`).
//!
//! Every replica draws its contiguous share of the epoch's samples (the same seeds as on one
//! device), the rewards are gathered so that credit sees whole groups, the gradients of an
//! optimizer step are summed over the replicas before clipping and AdamW, and every replica
//! takes the same step. Replica 0 evaluates and writes metrics, samples and checkpoints.
//! Across nodes the same runs through the collective's global mode: one process per node and
//! an orchestrator ([`Nodes`]).

use std::sync::mpsc;
use std::time::Duration;

use burn::collective::{reset_collective, CollectiveConfig};
use burn::tensor::backend::AutodiffBackend;

use super::metrics::EpochMetrics;
use super::replica::Replica;
use super::trainer::Trainer;
use crate::error::{Error, Result};
use crate::sampler::TextToImage;

/// How long the other replicas get to stop once one has failed, before the run returns the
/// failure anyway (a replica busy in a long forward pass notices at its next collective call).
pub const STOP_WAIT: Duration = Duration::from_secs(30);

/// The nodes of a multi-node run (the collective's global mode): this process is node `rank`
/// of `count`, reachable at `address`, serving tensors on `data_port`; `orchestrator` is the
/// address of the run's orchestrator (`tpgrpo orchestrator`), all as `ws://host:port`.
#[derive(Debug, Clone)]
pub struct Nodes {
    /// Nodes of the run.
    pub count: usize,
    /// This node's rank, `0..count`; its replicas are ranks `rank * devices ..`.
    pub rank: usize,
    /// The orchestrator, `ws://host:port`.
    pub orchestrator: String,
    /// This node, `ws://host:port`, as the other nodes reach it.
    pub address: String,
    /// Port of this node's tensor data service.
    pub data_port: u16,
}

/// The collective settings of a run with `devices` devices in this process.
fn collective_config(devices: usize, nodes: Option<&Nodes>) -> Result<CollectiveConfig> {
    let config = CollectiveConfig::default().with_num_devices(devices);
    let Some(n) = nodes else { return Ok(config) };
    let parse = |field: &str, s: &str| {
        if !s.starts_with("ws://") {
            return Err(Error::config(field, format!("{s:?} is not a ws://host:port address")));
        }
        s.parse().map_err(|e: String| Error::config(field, e))
    };
    Ok(config
        .with_num_nodes(n.count as u32)
        .with_global_address(parse("orchestrator", &n.orchestrator)?)
        .with_node_address(parse("node address", &n.address)?)
        .with_data_service_port(n.data_port))
}

/// Trains one replica per device of `devices` (this node's; see [`Nodes`] for several) and
/// returns the metrics of this process's first replica (the run's, on node 0).
///
/// `build` makes the trainer of a replica on its device (it is called on the replica's
/// thread, after the replica has joined the collective, so a failing build stops the run like
/// any failure); `on_epoch` sees the lead replica's metrics lines. The first replica error
/// stops the run: the collective is reset, so replicas waiting in it fail at once, and the
/// others get [`STOP_WAIT`] to stop before the error is returned.
pub fn train<B, P, F, E>(
    devices: Vec<B::Device>,
    nodes: Option<Nodes>,
    build: F,
    on_epoch: E,
) -> Result<Vec<EpochMetrics>>
where
    B: AutodiffBackend,
    P: TextToImage<B::InnerBackend>,
    F: Fn(Replica, &B::Device) -> Result<Trainer<B, P>> + Send + Sync + 'static,
    E: FnMut(&EpochMetrics) + Send + 'static,
{
    if devices.is_empty() {
        return Err(Error::config("devices", "at least one device"));
    }
    let (node, node_count) = nodes.as_ref().map_or((0, 1), |n| (n.rank, n.count));
    if node >= node_count {
        return Err(Error::config("node rank", format!("{node} of {node_count} nodes")));
    }
    let size = devices.len() * node_count;
    let config = collective_config(devices.len(), nodes.as_ref())?;
    let build = std::sync::Arc::new(build);
    let (done, results) = mpsc::channel();
    let first = node * devices.len();
    let mut on_epoch = Some(on_epoch);
    for (d, device) in devices.into_iter().enumerate() {
        let replica = Replica { rank: first + d, size };
        let (build, done, config) = (build.clone(), done.clone(), config.clone());
        let lead_epoch = on_epoch.take();
        std::thread::Builder::new()
            .name(format!("replica-{}", replica.rank))
            .spawn(move || {
                let run = || -> Result<Vec<EpochMetrics>> {
                    if size > 1 {
                        replica.register::<B::InnerBackend>(&device, config)?;
                    }
                    let mut trainer = build(replica, &device)?.with_replica(replica);
                    let history = match lead_epoch {
                        Some(mut f) => trainer.train(&mut f)?,
                        None => trainer.train(|_| {})?,
                    };
                    if size > 1 {
                        replica.finish::<B::InnerBackend>()?;
                    }
                    Ok(history)
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
            .map_err(|e| Error::Replica { rank: first + d, message: e.to_string() })?;
    }
    drop(done);
    let mut history = None;
    for _ in 0..size / node_count {
        let (d, result) = results.recv().map_err(|_| Error::Replica {
            rank: first,
            message: "a replica thread ended without reporting".into(),
        })?;
        match result {
            Ok(h) if d == 0 => history = Some(h),
            Ok(_) => {}
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
    history.ok_or_else(|| Error::Replica { rank: first, message: "no metrics".into() })
}
