//! Host-side randomness: a seeded 64-bit generator, seed mixing with named salts, Gaussian
//! draws and the shuffle. Everything random in the crate is derived from these on the host,
//! so a value never depends on the backend, the device or the rest of its batch.

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

    /// Shuffles `items` in place (Fisher-Yates from the front: position `i` takes a uniform
    /// pick of positions `i..`, so the first `k` items are a uniform choice of `k`, in order
    /// of drawing, whatever the length).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in 0..items.len().saturating_sub(1) {
            let j = self.range(i, items.len() - 1);
            items.swap(i, j);
        }
    }
}

/// A 64-bit hash of `(a, b)`: independent seeds for every epoch, sample and purpose.
pub(crate) fn mix(a: u64, b: u64) -> u64 {
    SplitMix64(a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15)).next_u64()
}

/// The salts that keep the run seed's uses apart: `mix(seed, SALT + epoch)` and the like.
pub(crate) mod salt {
    /// The choice of an epoch's prompts.
    pub(crate) const EPOCH_PROMPTS: u64 = 0x70_0000;
    /// The order of an epoch's samples (which prompt each rollout row draws).
    pub(crate) const SAMPLE_ORDER: u64 = 0x5A_0000;
    /// The order in which kept samples are split into optimizer steps.
    pub(crate) const UPDATE_ORDER: u64 = 0x7A_0000;
    /// The fresh initial noise of TP-GRPO's pure-ODE sample (`fresh_ode_noise`).
    pub(crate) const FRESH_ODE_NOISE: u64 = 0xF2E5;
    /// The fixed noise of the held-out evaluation images (xor-ed into the run seed).
    pub(crate) const EVALUATION: u64 = 0xE7A1;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The published SplitMix64 sequence from seed 0 (Vigna's reference `splitmix64.c`).
    #[test]
    fn next_u64_follows_the_reference_sequence() {
        let mut rng = SplitMix64(0);
        let got = [rng.next_u64(), rng.next_u64(), rng.next_u64()];
        assert_eq!(got, [0xE220_A839_7B1D_CDAF, 0x6E78_9E6A_A1B9_65F4, 0x06C4_5D18_8009_454F]);
    }

    /// Hand-worked from the reference sequence of seed 3 (2092789425003139053,
    /// 12918135221727111561, 11307387092600937729): position 0 takes 0 + d0 mod 4 = 1, position 1
    /// takes 1 + d1 mod 3 = 1 (stays), position 2 takes 2 + d2 mod 2 = 3.
    #[test]
    fn shuffle_of_four_follows_hand_worked_draws() {
        let mut v = [10, 20, 30, 40];
        SplitMix64(3).shuffle(&mut v);
        assert_eq!(v, [20, 10, 40, 30]);
    }

    /// Every position of a 3-item shuffle sees every item about a third of the time.
    #[test]
    fn shuffle_is_uniform_over_positions() {
        let mut counts = [[0usize; 3]; 3];
        let mut rng = SplitMix64(11);
        for _ in 0..30_000 {
            let mut v = [0usize, 1, 2];
            rng.shuffle(&mut v);
            for (pos, &item) in v.iter().enumerate() {
                counts[pos][item] += 1;
            }
        }
        for row in counts {
            for c in row {
                // 10,000 expected; 5 standard deviations is about 410.
                assert!((c as i64 - 10_000).abs() < 410, "{counts:?}");
            }
        }
    }
}
