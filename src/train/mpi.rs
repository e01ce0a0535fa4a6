//! Data-parallel training across processes and machines over MPI (`mpi` feature): this
//! process's place in the job ([`Mpi`]), the sum that replicas of [`Transport::Mpi`] meet in,
//! and how a failing rank stops the job.
//!
//! One process per device, launched by `mpirun -np N` (Open MPI, MPICH) or SLURM's `srun`;
//! rank and size come from MPI, and each process is one [`Replica`] of the run
//! ([`super::parallel::train_mpi`]). A rank that fails must not leave the others waiting in a
//! collective: an error or a panic aborts the job (`MPI_Abort`, which stops every rank), and a
//! rank killed from outside is noticed by the launcher, which stops the rest.

use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives};

use super::replica::{Replica, Transport};
use crate::error::{Error, Result};

/// Exit status of every rank of a job aborted because one rank was dropped before
/// [`Mpi::finish`] (a panic, or an error returned past it) (sysexits' `EX_SOFTWARE`).
pub const ABORTED: i32 = 70;

/// This process in an MPI job: MPI initialised, its rank among all processes and among those
/// of its machine.
///
/// Dropping it before [`Mpi::finish`] — a panic unwinding past it, or an error returned past
/// it — aborts the whole job with status [`ABORTED`], because finalizing MPI there would let
/// this rank end quietly while the others wait for it in a collective forever.
pub struct Mpi {
    universe: Option<Universe>,
    rank: usize,
    size: usize,
    local_rank: usize,
}

impl Mpi {
    /// Initialises MPI for this process (once per process); the error says when it was
    /// already initialised.
    pub fn init() -> Result<Mpi> {
        let universe = mpi::initialize()
            .ok_or_else(|| Error::config("mpi", "MPI is already initialised in this process"))?;
        let world = universe.world();
        // The processes of this machine (shared memory), in world rank order.
        let local = world.split_shared(world.rank());
        Ok(Mpi {
            rank: world.rank() as usize,
            size: world.size() as usize,
            local_rank: local.rank() as usize,
            universe: Some(universe),
        })
    }

    /// This process's rank, `0..size`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Processes of the job.
    pub fn size(&self) -> usize {
        self.size
    }

    /// This process's rank among the job's processes on its machine: the index of the device
    /// it trains on.
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// This process's replica of the run.
    pub fn replica(&self) -> Replica {
        Replica { rank: self.rank, size: self.size, transport: Transport::Mpi }
    }

    /// Waits for every rank, then ends MPI in this process; every rank calls it once its run
    /// has ended the same way (finished, stopped on request, or refused by
    /// [`super::parallel::train_mpi`]'s checks). The wait keeps a rank that exits with a
    /// non-zero status (a stop) from having the launcher end rank 0 while it still writes
    /// the checkpoint.
    pub fn finish(mut self) {
        SimpleCommunicator::world().barrier();
        drop(self.universe.take());
    }

    /// Stops every process of the job at once; the launcher exits with `code` and names this
    /// rank.
    pub fn abort(&self, code: i32) -> ! {
        SimpleCommunicator::world().abort(code)
    }
}

impl Drop for Mpi {
    fn drop(&mut self) {
        if self.universe.is_some() {
            self.abort(ABORTED);
        }
    }
}

/// The element-wise sum of `values` over every rank of the job, in f32 (`MPI_Allreduce`).
/// Open MPI's and MPICH's algorithms give every rank the same bits (they combine the same
/// partial sums, at most in swapped order, which f32 addition does not see); a run checks that
/// its replicas' adapters agree at its end.
pub(crate) fn all_reduce_sum(values: &[f32]) -> Result<Vec<f32>> {
    if !mpi::environment::is_initialized() || mpi::environment::is_finalized() {
        return Err(Error::config(
            "replica transport",
            "MPI is not running: create an `Mpi` first",
        ));
    }
    let mut summed = vec![0f32; values.len()];
    SimpleCommunicator::world().all_reduce_into(values, &mut summed[..], SystemOperation::sum());
    Ok(summed)
}
