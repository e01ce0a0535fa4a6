//! The compute backend, chosen by cargo feature: the only module that names NdArray, Cuda, Wgpu
//! or LibTorch.
//!
//! `cuda` wins over `wgpu`, which wins over `tch` (LibTorch: its first GPU when it was built with
//! CUDA and one is there, else the CPU), which wins over the default `ndarray` (CPU). Everything
//! else in the crate is generic over `B: Backend`; binaries and examples use these aliases.

use std::path::{Path, PathBuf};

#[cfg(feature = "cuda")]
mod selected {
    /// The inference backend selected by the `cuda` feature.
    pub type Backend = burn::backend::Cuda;
    /// Human-readable name of the selected backend.
    pub const NAME: &str = "cuda";
    pub use super::cubecl_cache::use_kernel_cache;
    pub use super::cubecl_devices::{device, device_count, on_gpu};
}

#[cfg(all(feature = "wgpu", not(feature = "cuda")))]
mod selected {
    /// The inference backend selected by the `wgpu` feature.
    pub type Backend = burn::backend::Wgpu;
    /// Human-readable name of the selected backend.
    pub const NAME: &str = "wgpu";
    pub use super::cubecl_cache::use_kernel_cache;
    pub use super::cubecl_devices::{device, device_count, on_gpu};
}

#[cfg(all(feature = "tch", not(any(feature = "cuda", feature = "wgpu"))))]
mod selected {
    /// The inference backend selected by the `tch` feature: LibTorch, f32 by default (bf16
    /// through `precision`).
    pub type Backend = burn::backend::LibTorch<f32>;
    /// Human-readable name of the selected backend.
    pub const NAME: &str = "tch";
    use burn::backend::libtorch::LibTorchDevice;

    /// LibTorch compiles nothing at run time: no cache.
    pub fn use_kernel_cache(_dir: &std::path::Path) -> crate::Result<Option<std::path::PathBuf>> {
        Ok(None)
    }

    /// The first GPU when this LibTorch was built with CUDA and sees one, else the CPU.
    pub fn device() -> LibTorchDevice {
        if tch::Cuda::is_available() {
            LibTorchDevice::Cuda(0)
        } else {
            LibTorchDevice::Cpu
        }
    }

    /// Whether `device` is a GPU.
    pub fn on_gpu(device: &LibTorchDevice) -> bool {
        matches!(device, LibTorchDevice::Cuda(_))
    }

    /// The GPUs LibTorch sees.
    pub fn device_count(_first: &LibTorchDevice) -> usize {
        tch::Cuda::device_count().max(0) as usize
    }
}

#[cfg(not(any(feature = "ndarray", feature = "cuda", feature = "wgpu", feature = "tch")))]
compile_error!(
    "tpgrpo needs a backend: enable one of the features `ndarray` (CPU, the default), `cuda`, \
     `wgpu` or `tch`"
);

#[cfg(all(feature = "ndarray", not(any(feature = "cuda", feature = "wgpu", feature = "tch"))))]
mod selected {
    /// The inference backend of the default build: NdArray on the CPU.
    pub type Backend = burn::backend::NdArray;
    /// Human-readable name of the selected backend.
    pub const NAME: &str = "ndarray";

    /// NdArray compiles nothing: no cache.
    pub(super) fn use_kernel_cache(
        _dir: &std::path::Path,
    ) -> crate::Result<Option<std::path::PathBuf>> {
        Ok(None)
    }

    /// The CPU.
    pub(super) fn device() -> burn::backend::ndarray::NdArrayDevice {
        Default::default()
    }

    /// Never: NdArray runs on the CPU.
    pub(super) fn on_gpu(_device: &burn::backend::ndarray::NdArrayDevice) -> bool {
        false
    }

    /// One CPU.
    pub(super) fn device_count(_first: &burn::backend::ndarray::NdArrayDevice) -> usize {
        1
    }
}

use selected::{device_count, on_gpu};
pub use selected::{Backend, NAME};

/// The folder of the persistent kernel caches: `$TPGRPO_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/tpgrpo`, else `$HOME/.cache/tpgrpo`, else `.tpgrpo-cache` in the working folder.
pub fn cache_dir() -> PathBuf {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("TPGRPO_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("tpgrpo")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("tpgrpo")))
        .unwrap_or_else(|| PathBuf::from(".tpgrpo-cache"))
}

/// Keeps CubeCL's autotune results and compiled kernels (CUDA's PTX; wgpu recompiles each run)
/// under `dir`, so that a second run starts warm; call it before the first tensor operation.
/// The other settings come from a `cubecl.toml` and `CUBECL_*` variables as CubeCL reads them,
/// and a cache folder set there wins. Returns the autotune cache folder; `None` on the CPU
/// backend, which compiles and tunes nothing.
pub fn use_kernel_cache(dir: &Path) -> crate::Result<Option<PathBuf>> {
    selected::use_kernel_cache(dir)
}

/// Devices of the CubeCL backends: every device is a GPU (lavapipe counts: it runs the GPU
/// kernels), the first is the default.
#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod cubecl_devices {
    use super::{Backend, Device};
    use burn::tensor::backend::Device as _;

    /// The first GPU.
    pub fn device() -> Device {
        Device::default()
    }

    /// Always.
    pub fn on_gpu(_device: &Device) -> bool {
        true
    }

    /// The devices of `first`'s kind.
    pub fn device_count(first: &Device) -> usize {
        <Backend as burn::tensor::backend::Backend>::device_count(first.to_id().type_id)
    }
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod cubecl_cache {
    use std::path::{Path, PathBuf};

    use cubecl_runtime::config::cache::CacheConfig;
    use cubecl_runtime::config::{CubeClRuntimeConfig, RuntimeConfig};

    pub fn use_kernel_cache(dir: &Path) -> crate::Result<Option<PathBuf>> {
        if CubeClRuntimeConfig::storage().lock().is_some() {
            return Err(crate::Error::config(
                "kernel cache",
                "CubeCL's settings were read before the cache folder was set; set it first",
            ));
        }
        let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
        if matches!(config.autotune.cache, CacheConfig::Target) {
            config.autotune.cache = CacheConfig::File(dir.to_path_buf());
        }
        config.compilation.cache.get_or_insert(CacheConfig::File(dir.to_path_buf()));
        let root = config.autotune.cache.root();
        CubeClRuntimeConfig::set(config);
        Ok(Some(root))
    }
}

/// Bytes of memory of `device` where known: the host's (its container's limit where lower) for
/// a CPU device; `None` on GPUs (CubeCL 0.10 and tch report no total).
pub fn memory(device: &Device) -> Option<u64> {
    if on_gpu(device) {
        None
    } else {
        crate::limits::host_memory()
    }
}

/// The training backend: the selected backend with reverse-mode autodiff.
pub type TrainBackend = burn::backend::Autodiff<Backend>;

/// The device type of the selected backend.
pub type Device = burn::tensor::Device<Backend>;

/// The default device of the selected backend (first GPU, or the CPU).
pub fn device() -> Device {
    selected::device()
}

/// The first `n` devices of the selected backend, for a data-parallel run; on the CPU `n`
/// replicas of the one CPU device, sharing its cores. Errors name `devices` when the backend
/// has fewer.
pub fn devices(n: usize) -> crate::Result<Vec<Device>> {
    use burn::tensor::backend::{Device as _, DeviceId};
    let first = device();
    if !on_gpu(&first) {
        return Ok(vec![first; n]);
    }
    let id = first.to_id();
    let count = device_count(&first);
    if n > count {
        return Err(crate::Error::config(
            "devices",
            format!("{n} devices asked for, {count} available to {NAME}"),
        ));
    }
    Ok((0..n as u16)
        .map(|i| Device::from_id(DeviceId { type_id: id.type_id, index_id: i }))
        .collect())
}

/// The device of a process that is rank `local_rank` among its machine's processes of a
/// multi-process run (MPI): device `local_rank` where the process sees several, its only device
/// where the launcher gave it one (`srun --gpus-per-task=1`, `CUDA_VISIBLE_DEVICES`), the CPU
/// on the CPU backend. Errors name `devices` when the process sees more than one device but
/// not `local_rank + 1`.
pub fn rank_device(local_rank: usize) -> crate::Result<Device> {
    let first = device();
    if !on_gpu(&first) || device_count(&first) == 1 {
        return Ok(first);
    }
    Ok(devices(local_rank + 1)?.swap_remove(local_rank))
}

/// What binaries call first: the kernel caches in [`cache_dir`] ([`use_kernel_cache`]), then
/// the default device.
pub fn init() -> crate::Result<Device> {
    use_kernel_cache(&cache_dir())?;
    Ok(device())
}
