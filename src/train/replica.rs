//! One replica of a data-parallel run, and the collective operations it takes part in: its
//! share of the epoch's samples, exact gathers of host values and the gradient all-reduce,
//! all built on one sum over the replicas, through Burn's `burn-collective` between the
//! threads of one process or through MPI between processes (`mpi` feature). The
//! single-device run is replica 0 of 1, for which every operation is the identity and
//! nothing is communicated.

use std::ops::Range;

use burn::collective::{self, CollectiveConfig, PeerId, ReduceOperation};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;

use super::update::Gradients;
use crate::error::{Error, Result};

/// A replica: its rank among the `size` replicas of the run, and how the replicas meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replica {
    /// Rank, `0..size`; rank 0 writes metrics, samples and checkpoints.
    pub rank: usize,
    /// Replicas of the run.
    pub size: usize,
    /// How the replicas exchange values.
    pub transport: Transport,
}

/// How the replicas of a run exchange values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// Threads of one process, through Burn's collective (`burn-collective`, local mode); each
    /// replica registers first ([`Replica::register`]).
    #[default]
    Threads,
    /// One process per replica, through MPI's `MPI_COMM_WORLD` (rank = MPI rank), which the
    /// process has initialised ([`super::mpi::Mpi`]).
    #[cfg(feature = "mpi")]
    Mpi,
}

impl Default for Replica {
    fn default() -> Self {
        Replica::SINGLE
    }
}

/// Bits of an `f64` carried by each of the three `f32` values of [`Replica::all_gather`]:
/// integers below `2^22` are exact in `f32`, and a sum with zeros keeps them exact.
const BITS: u32 = 22;

impl Replica {
    /// The single-device run.
    pub const SINGLE: Replica = Replica::threads(0, 1);

    /// Replica `rank` of `size` threads of this process ([`Transport::Threads`]).
    pub const fn threads(rank: usize, size: usize) -> Replica {
        Replica { rank, size, transport: Transport::Threads }
    }

    /// Whether this replica writes the run's files (rank 0).
    pub fn is_lead(&self) -> bool {
        self.rank == 0
    }

    /// This replica's contiguous share `[total r / n, total (r + 1) / n)` of `total` items:
    /// the shares of ranks `0..n` tile `0..total` in order and differ in size by at most one.
    pub fn share(&self, total: usize) -> Range<usize> {
        let at = |r: usize| (total as u128 * r as u128 / self.size as u128) as usize;
        at(self.rank)..at(self.rank + 1)
    }

    /// Joins the run's collective as this replica on `device` (every replica of the process
    /// calls it, each from its own thread; blocks until all have); `config` holds the
    /// devices of this process and, for several nodes, the orchestrator's address.
    pub fn register<B: Backend>(&self, device: &B::Device, config: CollectiveConfig) -> Result<()> {
        collective::register::<B>(self.peer(), device.clone(), config).map_err(|e| self.fail(e))
    }

    /// Leaves the collective at the end of a run.
    pub fn finish<B: Backend>(&self) -> Result<()> {
        collective::finish_collective::<B>(self.peer()).map_err(|e| self.fail(e))
    }

    /// Every replica's `local` values, in rank order, bit for bit.
    ///
    /// An all-gather through a sum: replica `r` writes its values at its offset of a zeroed
    /// buffer and the buffers are summed, so every position holds one replica's value plus
    /// zeros. Each `f64` travels as three `f32` holding 22, 22 and 20 of its bits as
    /// integers, which the sum leaves exact. Two sums: the lengths, then the values.
    pub fn all_gather<B: Backend>(
        &self,
        local: &[f64],
        device: &B::Device,
    ) -> Result<Vec<Vec<f64>>> {
        if self.size == 1 {
            return Ok(vec![local.to_vec()]);
        }
        let lengths =
            self.sum_disjoint::<B>(&[local.len() as f64], self.rank, self.size, device)?;
        let lengths: Vec<usize> = lengths.iter().map(|&n| n as usize).collect();
        let offset = lengths[..self.rank].iter().sum();
        let all = self.sum_disjoint::<B>(local, offset, lengths.iter().sum(), device)?;
        let mut rest = all.as_slice();
        Ok(lengths
            .iter()
            .map(|&n| {
                let (head, tail) = rest.split_at(n);
                rest = tail;
                head.to_vec()
            })
            .collect())
    }

    /// Whether `local` holds on any replica (every replica gets the same answer; a collective
    /// that every replica must reach).
    pub(crate) fn any<B: Backend>(&self, local: bool, device: &B::Device) -> Result<bool> {
        if self.size == 1 {
            return Ok(local);
        }
        let all = self.all_gather::<B>(&[f64::from(u8::from(local))], device)?;
        Ok(all.iter().any(|v| v.first().is_some_and(|&x| x != 0.0)))
    }

    /// The sum over replicas of `values` placed at `offset` of a zero vector of `len` values,
    /// exact (see [`Replica::all_gather`]).
    fn sum_disjoint<B: Backend>(
        &self,
        values: &[f64],
        offset: usize,
        len: usize,
        device: &B::Device,
    ) -> Result<Vec<f64>> {
        let mask = (1u64 << BITS) - 1;
        let mut parts = vec![0f32; 3 * len];
        for (i, v) in values.iter().enumerate() {
            let bits = v.to_bits();
            for p in 0..3 {
                parts[3 * (offset + i) + p] = ((bits >> (BITS * p as u32)) & mask) as f32;
            }
        }
        let t = Tensor::<B, 1>::from_data(TensorData::new(parts, [3 * len]), device);
        let summed = self.all_reduce_tensor(t)?.into_data();
        let summed = summed.to_vec::<f32>().map_err(|e| self.fail(format!("{e:?}")))?;
        Ok(summed
            .chunks(3)
            .map(|p| {
                let bits = (0..3).fold(0u64, |acc, i| acc | ((p[i] as u64) << (BITS * i as u32)));
                f64::from_bits(bits)
            })
            .collect())
    }

    /// The sum over replicas of `grads` (every replica holds the same names and shapes), as
    /// one flat buffer so that the replicas meet once per optimizer step. Every replica gets
    /// the same sum, so every replica then takes the same step.
    pub fn all_reduce<B: Backend>(&self, grads: Gradients<B>) -> Result<Gradients<B>> {
        if self.size == 1 || grads.is_empty() {
            return Ok(grads);
        }
        let shapes: Vec<(String, [usize; 2])> =
            grads.iter().map(|(n, g)| (n.clone(), g.dims())).collect();
        let flat = Tensor::cat(grads.into_values().map(|g| g.flatten::<1>(0, 1)).collect(), 0);
        let summed = self.all_reduce_tensor(flat)?;
        let mut start = 0;
        Ok(shapes
            .into_iter()
            .map(|(name, [r, c])| {
                let g = summed.clone().slice(start..start + r * c).reshape([r, c]);
                start += r * c;
                (name, g)
            })
            .collect())
    }

    /// The element-wise sum of `t` over the replicas, in f32 (every replica gets the same).
    fn all_reduce_tensor<B: Backend>(&self, t: Tensor<B, 1>) -> Result<Tensor<B, 1>> {
        match self.transport {
            Transport::Threads => {
                let primitive = t.into_primitive().tensor();
                let summed =
                    collective::all_reduce::<B>(self.peer(), primitive, ReduceOperation::Sum)
                        .map_err(|e| self.fail(e))?;
                Ok(Tensor::from_primitive(TensorPrimitive::Float(summed)))
            }
            #[cfg(feature = "mpi")]
            Transport::Mpi => {
                let device = t.device();
                let values = t.into_data().convert::<f32>();
                let values = values.into_vec::<f32>().map_err(|e| self.fail(format!("{e:?}")))?;
                let summed = super::mpi::all_reduce_sum(&values)?;
                let len = summed.len();
                Ok(Tensor::from_data(TensorData::new(summed, [len]), &device))
            }
        }
    }

    fn peer(&self) -> PeerId {
        PeerId::from(self.rank)
    }

    fn fail(&self, e: impl std::fmt::Debug) -> Error {
        Error::Replica {
            rank: self.rank,
            message: format!(
                "collective operation failed ({e:?}); another replica stopped or the \
                 collective was reset"
            ),
        }
    }
}
