//! Sampling Gaussian data with its exact (closed-form) velocity: the Euler ODE and the SDE
//! (whose drift preserves the marginals) must end at the data distribution, CPS at its mean, and the
//! per-step noise must have the moments the step reports.

use crate::common;

use burn::prelude::*;
use tpgrpo::backend::Backend as B;
use tpgrpo::sampler::{
    ode_completions, rollout, sde_step, seeded_noise, Conditioning, FlowSchedule, RolloutConfig,
    SamplerKind, VelocityModel,
};

/// Data `x0 ~ N(m, s^2)` per element. With `x = (1-sigma) x0 + sigma n` and
/// `V = (1-sigma)^2 s^2 + sigma^2`, the exact velocity `E[n - x0 | x]` is
/// `(sigma - (1-sigma) s^2) / V * (x - (1-sigma) m) - m`.
struct GaussianData {
    m: f64,
    s: f64,
}

impl VelocityModel<B> for GaussianData {
    fn velocity(
        &self,
        x: Tensor<B, 4>,
        t: Tensor<B, 1>,
        _: &Conditioning<B>,
    ) -> tpgrpo::Result<Tensor<B, 4>> {
        let sigma = t.into_data().to_vec::<f32>().unwrap()[0] as f64 / 1000.0;
        let var = (1.0 - sigma).powi(2) * self.s * self.s + sigma * sigma;
        let k = (sigma - (1.0 - sigma) * self.s * self.s) / var;
        Ok((x - (1.0 - sigma) * self.m) * k - self.m)
    }
}

fn moments(x: Tensor<B, 4>) -> (f64, f64) {
    let v: Vec<f32> = x.into_data().to_vec().unwrap();
    let n = v.len() as f64;
    let mean = v.iter().map(|&a| a as f64).sum::<f64>() / n;
    (mean, v.iter().map(|&a| (a as f64 - mean).powi(2)).sum::<f64>() / n)
}

const SHAPE: [usize; 3] = [1, 128, 128]; // 16384 draws
const STEPS: usize = 200;

#[test]
fn ode_and_sde_sampling_reach_the_gaussian_data() {
    let dev = common::device();
    let data = GaussianData { m: 0.5, s: 0.3 };
    let cond = Conditioning {
        text: Tensor::<B, 3>::zeros([1, 1, 1], &dev),
        pooled: Tensor::zeros([1, 1], &dev),
    };
    // Monte-Carlo standard errors with 16384 draws: mean 0.3/128 = 0.0023, variance
    // 0.09 * sqrt(2/16384) = 0.001. Tolerances are 4 standard errors plus 0.003 for the
    // discretisation: the Euler variance error is O(1/N), measured 0.0063 at N = 50 and 0.0012
    // at N = 200 (shift 1).
    let check = |name: &str, x: Tensor<B, 4>, check_var: bool| {
        let (mean, var) = moments(x);
        println!("{name}: mean {mean} variance {var}");
        assert!((mean - 0.5).abs() < 4.0 * 0.0023 + 0.003, "{name}: mean {mean}");
        if check_var {
            assert!((var - 0.09).abs() < 4.0 * 0.001 + 0.003, "{name}: variance {var}");
        }
    };
    let schedule = FlowSchedule::new(STEPS, 1.0).unwrap();
    let x0 = seeded_noise::<B>(&[5], 0, SHAPE, &dev);
    let (ode, _) = ode_completions(&data, &schedule, &[(0, x0)], &cond, &cond, 1.0).unwrap();
    check("euler", ode[0].clone(), true);
    for sampler in [SamplerKind::Sde, SamplerKind::Cps] {
        let cfg = RolloutConfig::new()
            .with_num_steps(STEPS)
            .with_shift(1.0)
            .with_window_size(STEPS - 1)
            .with_sampler(sampler)
            .with_guidance(1.0);
        let r = rollout(&data, &cfg, &[5], SHAPE, &cond, &cond, &dev).unwrap();
        // CPS re-noises a fixed fraction sin(alpha pi/2) of sigma_next at every step whatever
        // the step size, so it does not converge to a marginal-preserving SDE: on spread data
        // its variance shrinks (0.062 instead of 0.09 at N = 200, 0.059 at N = 50). Only its
        // mean is checked; the SDE sampler must reach the data distribution.
        check(
            &format!("{sampler:?}"),
            r.latents.last().unwrap().clone(),
            sampler == SamplerKind::Sde,
        );
    }
}

#[test]
fn step_noise_has_the_reported_moments() {
    let dev = common::device();
    let schedule = FlowSchedule::new(10, 3.0).unwrap();
    let x = Tensor::<B, 4>::full([1, 1, 128, 128], 0.3, &dev);
    let v = Tensor::<B, 4>::full([1, 1, 128, 128], -0.2, &dev);
    let step = sde_step(x, v, &schedule, 2, 0.7).unwrap();
    let draws = step.sample(seeded_noise(&[9], 3, SHAPE, &dev));
    let mean_value: f32 = step.mean.clone().slice([0..1, 0..1, 0..1, 0..1]).into_scalar().elem();
    let (mean, var) = moments(draws);
    let sd = step.std;
    assert!((mean - mean_value as f64).abs() < 4.0 * sd / 128.0, "mean {mean} vs {mean_value}");
    assert!(
        (var.sqrt() - sd).abs() < 4.0 * sd / (2.0 * 16384f64).sqrt(),
        "std {} vs {sd}",
        var.sqrt()
    );
}
