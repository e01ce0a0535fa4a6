//! The compute backend, chosen by cargo feature: the only module that names NdArray, Cuda or Wgpu.
//!
//! `cuda` wins over `wgpu`, which wins over the default `ndarray` (CPU). Everything else in the
//! crate is generic over `B: Backend`; binaries and examples use these aliases.

#[cfg(feature = "cuda")]
mod selected {
    /// The inference backend selected by the `cuda` feature.
    pub type Backend = burn::backend::Cuda;
    /// Human-readable name of the selected backend.
    pub const NAME: &str = "cuda";
}

#[cfg(all(feature = "wgpu", not(feature = "cuda")))]
mod selected {
    /// The inference backend selected by the `wgpu` feature.
    pub type Backend = burn::backend::Wgpu;
    /// Human-readable name of the selected backend.
    pub const NAME: &str = "wgpu";
}

#[cfg(not(any(feature = "cuda", feature = "wgpu")))]
mod selected {
    /// The inference backend of the default build: NdArray on the CPU.
    pub type Backend = burn::backend::NdArray;
    /// Human-readable name of the selected backend.
    pub const NAME: &str = "ndarray";
}

pub use selected::{Backend, NAME};

/// The training backend: the selected backend with reverse-mode autodiff.
pub type TrainBackend = burn::backend::Autodiff<Backend>;

/// The device type of the selected backend.
pub type Device = burn::tensor::Device<Backend>;

/// The default device of the selected backend (first GPU, or the CPU).
pub fn device() -> Device {
    Device::default()
}
