//! What a run reports while it trains, for the application to present (progress bars, charts,
//! logs): the library calls an [`Observer`] and prints nothing.

use super::metrics::EpochMetrics;
use crate::error::Result;

/// The phases of an epoch that report progress, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Rollouts and their rewards; units are samples.
    Rollouts,
    /// Optimizer steps; units are micro-batch passes over one trained step.
    Updates,
    /// The held-out evaluation; no units.
    Evaluation,
}

/// Receives a run's progress; every method does nothing unless implemented.
pub trait Observer {
    /// `phase` of epoch `epoch` starts, with `total` units of work (0 where not counted).
    fn phase(&mut self, epoch: usize, phase: Phase, total: usize) {
        let _ = (epoch, phase, total);
    }

    /// `done` more units of the current phase are finished.
    fn advance(&mut self, done: usize) {
        let _ = done;
    }

    /// Epoch `metrics.epoch` is finished and written (with its evaluation, when one ran;
    /// epoch 0 is the evaluation before training); `history` holds every epoch so far, this
    /// one last. An error stops the run, as a failed write of the run's own files does.
    fn epoch(&mut self, metrics: &EpochMetrics, history: &[EpochMetrics]) -> Result<()> {
        let _ = (metrics, history);
        Ok(())
    }
}

/// An observer that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct Silent;

impl Observer for Silent {}
