//! The data-parallel gradient all-reduce (`Replica::all_reduce`) at SD3.5-medium LoRA size:
//! two replicas as threads of one process (burn-collective) on the selected backend's first
//! device(s) and, built with `--features mpi`, as two MPI processes (`mpirun`, this bench run
//! again as each rank); the first call and the median of later calls.
//!
//! SD3.5-medium with rank-32 adapters on the default targets adapts 243 projections of
//! 1536 x 1536: the joint attention's eight in 23 blocks, seven in the last (no `to_add_out`),
//! and the four of the second attention in the 13 dual-attention blocks; each has factors
//! `A [32, 1536]` and `B [1536, 32]`, 23.9M values (91 MiB in f32) in all.
//!
//! `cargo bench [--features mpi] --bench all_reduce [-- DEVICES]` (default 2); `BENCH_ITERS`
//! sets the timed iterations (default 10). An update's share is this time over the time of
//! the step's micro-batches (`cargo bench --bench mmdit -- sd35-medium`, times micro-batches
//! per step).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use burn::collective::CollectiveConfig;
use burn::prelude::*;
use burn::tensor::Distribution;
use tpgrpo::backend::{self, Backend as B};
use tpgrpo::train::Replica;

/// Adapted projections of SD3.5-medium (see the module note), their width and the rank.
const PROJECTIONS: usize = 243;
const WIDTH: usize = 1536;
const RANK: usize = 32;

fn gradients(device: &backend::Device) -> BTreeMap<String, Tensor<B, 2>> {
    let normal = Distribution::Normal(0.0, 1e-3);
    (0..PROJECTIONS)
        .flat_map(|p| {
            [
                (format!("{p:03}.lora_A"), Tensor::random([RANK, WIDTH], normal, device)),
                (format!("{p:03}.lora_B"), Tensor::random([WIDTH, RANK], normal, device)),
            ]
        })
        .collect()
}

/// Times `iters + 1` all-reduces of `grads` by `replica` (the first one apart).
fn time_all_reduce(
    replica: &Replica,
    grads: &BTreeMap<String, Tensor<B, 2>>,
    iters: usize,
) -> Vec<Duration> {
    (0..=iters)
        .map(|_| {
            let start = Instant::now();
            let summed = replica.all_reduce(grads.clone()).expect("all-reduce");
            let _ = summed.values().next().expect("a tensor").clone().into_data();
            start.elapsed()
        })
        .collect()
}

/// Prints the first and the median later time of each replica.
fn report(what: &str, times: &[Vec<Duration>]) {
    let values = PROJECTIONS * 2 * RANK * WIDTH;
    println!(
        "all-reduce of {values} values ({:.0} MiB f32) over {} {what} on {}:",
        values as f64 * 4.0 / (1 << 20) as f64,
        times.len(),
        backend::NAME
    );
    for (rank, t) in times.iter().enumerate() {
        let mut later = t[1..].to_vec();
        later.sort();
        println!(
            "  replica {rank}: first {:.1} ms, median {:.1} ms",
            t[0].as_secs_f64() * 1e3,
            later[later.len() / 2].as_secs_f64() * 1e3
        );
    }
}

fn main() {
    let iters: usize = std::env::var("BENCH_ITERS").map_or(10, |v| v.parse().unwrap());
    #[cfg(feature = "mpi")]
    if std::env::var_os(RANK_VAR).is_some() {
        return mpi_rank(iters);
    }
    let devices: usize =
        std::env::args().nth(1).filter(|a| !a.starts_with('-')).map_or(2, |a| a.parse().unwrap());
    let devices = backend::devices(devices).expect("devices");
    let n = devices.len();
    let config = CollectiveConfig::default().with_num_devices(n);
    let handles: Vec<_> = devices
        .into_iter()
        .enumerate()
        .map(|(rank, device)| {
            let config = config.clone();
            std::thread::spawn(move || {
                let replica = Replica::threads(rank, n);
                replica.register::<B>(&device, config).expect("register");
                let times = time_all_reduce(&replica, &gradients(&device), iters);
                replica.finish::<B>().expect("finish");
                times
            })
        })
        .collect();
    let times: Vec<Vec<Duration>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    report("threads (burn-collective)", &times);
    #[cfg(feature = "mpi")]
    {
        // The same over `n` MPI processes: this bench again as each rank.
        let status = std::process::Command::new("mpirun")
            .args(["--oversubscribe", "-np", &n.to_string()])
            .arg(std::env::current_exe().expect("this bench"))
            .env(RANK_VAR, "1")
            .env("BENCH_ITERS", iters.to_string())
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .status()
            .expect("mpirun (Open MPI) on the PATH");
        assert!(status.success(), "the MPI ranks failed: {status}");
    }
}

/// Set in the environment of this bench's MPI ranks.
#[cfg(feature = "mpi")]
const RANK_VAR: &str = "TPGRPO_BENCH_MPI_RANK";

/// One MPI rank: times the all-reduce; rank 0 gathers every rank's times and reports them.
#[cfg(feature = "mpi")]
fn mpi_rank(iters: usize) {
    use mpi::collective::SystemOperation;
    use mpi::traits::CommunicatorCollectives;

    let mpi = tpgrpo::train::mpi::Mpi::init().expect("MPI");
    let device = backend::rank_device(mpi.local_rank()).expect("this rank's device");
    let replica = mpi.replica();
    let times = time_all_reduce(&replica, &gradients(&device), iters);
    // MPI_Allreduce alone, on a host buffer of the same size: what the tensors' copies to
    // and from the host, their concatenation and split add is the difference.
    let world = mpi::topology::SimpleCommunicator::world();
    let send = vec![1e-3f32; PROJECTIONS * 2 * RANK * WIDTH];
    let mut recv = vec![0f32; send.len()];
    let raw: Vec<Duration> = (0..=iters)
        .map(|_| {
            let start = Instant::now();
            world.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
            start.elapsed()
        })
        .collect();
    for (what, times) in [
        ("MPI processes (Replica::all_reduce)", times),
        ("MPI processes (MPI_Allreduce of a host buffer alone)", raw),
    ] {
        let seconds: Vec<f64> = times.iter().map(|t| t.as_secs_f64()).collect();
        let all = replica.all_gather::<B>(&seconds, &device).expect("gather the times");
        if replica.is_lead() {
            let all: Vec<Vec<Duration>> = all
                .iter()
                .map(|t| t.iter().map(|&s| Duration::from_secs_f64(s)).collect())
                .collect();
            report(what, &all);
        }
    }
    mpi.finish();
}
