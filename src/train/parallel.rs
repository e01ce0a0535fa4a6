//! Data-parallel training: one [`Trainer`] replica per device, each on its own thread with its
//! own model, pipeline and reward, joined by Burn's collective (`burn-collective`).
//!
//! Every replica draws its contiguous share of the epoch's samples (the same seeds as on one
//! device), the rewards are gathered so that credit sees whole groups, the gradients of an
//! optimizer step are summed over the replicas before clipping and AdamW, and every replica
//! takes the same step. Replica 0 evaluates and writes metrics, samples and checkpoints.
//! Across nodes the same is meant to run through the collective's global mode (one process
//! per node and an orchestrator, [`Nodes`]); that does not work yet: in burn-collective 0.21
//! a node's sync after each global all-reduce (`SyncService::sync`) clears a copy of its list
//! of synced peers, not the list, so every global all-reduce after the first waits forever
//! (seen with two processes on 127.0.0.1, ring and centralized strategies alike). No command
//! line offers it (issue 22).

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
/// of `count`; the other nodes fetch its tensors at `address`, whose port this node serves;
/// `orchestrator` is the run's orchestrator ([`orchestrate`]). Addresses are `ws://host:port`.
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
}

/// The port of a `ws://host:port` address, or an error naming `field`.
fn port(field: &str, address: &str) -> Result<u16> {
    let bad = || Error::config(field, format!("{address:?} is not a ws://host:port address"));
    let rest = address.strip_prefix("ws://").ok_or_else(bad)?;
    let (host, port) = rest.trim_end_matches('/').rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() {
        return Err(bad());
    }
    port.parse().map_err(|_| bad())
}

/// The collective settings of a run with `devices` devices in this process.
fn collective_config(devices: usize, nodes: Option<&Nodes>) -> Result<CollectiveConfig> {
    let config = CollectiveConfig::default().with_num_devices(devices);
    let Some(n) = nodes else { return Ok(config) };
    port("orchestrator", &n.orchestrator)?;
    let data_port = port("node address", &n.address)?;
    let parse = |field: &str, s: &str| s.parse().map_err(|e: String| Error::config(field, e));
    Ok(config
        .with_num_nodes(n.count as u32)
        .with_global_address(parse("orchestrator", &n.orchestrator)?)
        .with_node_address(parse("node address", &n.address)?)
        .with_data_service_port(data_port))
}

/// Runs the orchestrator of a multi-node run on `port` until the process is interrupted: the
/// nodes register with it and learn each other's addresses (see the module's note: the
/// global mode does not work yet).
pub fn orchestrate(port: u16) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::config("orchestrator", format!("cannot start its runtime: {e}")))?;
    runtime.block_on(burn_collective::start_global_orchestrator(port));
    Ok(())
}

/// Trains one replica per device of `devices` (this node's; see [`Nodes`] for several) and
/// returns the metrics of this process's first replica (the run's, on node 0).
///
/// `build` makes the trainer of a replica on its device (it is called on the replica's
/// thread, after the replica has joined the collective, so a failing build stops the run like
/// any failure; a build that resumes sets the replica first, [`Trainer::with_replica`], so
/// that only the lead rewrites the metrics); `on_epoch` sees the lead replica's metrics lines. The first replica error
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
