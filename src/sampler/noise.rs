//! Per-sample Gaussian noise generated on the host from a seed, so a sample's noise does not
//! depend on the backend, the device or the other samples of its batch.

/// SplitMix64: a small, well-mixed 64-bit generator.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// Uniform integer in `[lo, hi]`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }
}

/// `count` standard normal values for stream `stream` of sample `seed` (Box-Muller);
/// stream 0 is the initial noise, stream `i + 1` the noise of step `i`.
pub fn gaussian(seed: u64, stream: u64, count: usize) -> Vec<f32> {
    let mut rng = SplitMix64(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03));
    let mut out = Vec::with_capacity(count + 1);
    while out.len() < count {
        let (u1, u2) = (rng.uniform(), rng.uniform());
        let r = (-2.0 * u1.ln()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * u2;
        out.push((r * theta.cos()) as f32);
        out.push((r * theta.sin()) as f32);
    }
    out.truncate(count);
    out
}
