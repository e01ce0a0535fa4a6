//! Per-sample Gaussian noise tensors drawn on the host from each sample's seed
//! ([`crate::rng::gaussian`]), so a sample's noise does not depend on the backend, the device
//! or the other samples of its batch.

use burn::prelude::*;

use crate::rng::gaussian;

/// Per-sample noise `[B, C, H, W]` of stream `stream` for the given seeds.
pub fn seeded_noise<B: Backend>(
    seeds: &[u64],
    stream: u64,
    shape: [usize; 3],
    device: &B::Device,
) -> Tensor<B, 4> {
    let count = shape.iter().product();
    let values: Vec<f32> = seeds.iter().flat_map(|&s| gaussian(s, stream, count)).collect();
    Tensor::from_data(TensorData::new(values, [seeds.len(), shape[0], shape[1], shape[2]]), device)
}
