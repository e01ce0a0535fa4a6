//! Sampler steps against closed forms: a finite-difference check of d(log_prob)/d(velocity)
//! through autodiff, and Euler sampling of a point mass, whose exact velocity makes every
//! Euler step exact.

use crate::common;

use burn::prelude::*;
use burn::tensor::Distribution;
use tpgrpo::backend::{Backend as B, TrainBackend as AB};
use tpgrpo::sampler::{
    cps_step, euler_step, guided_velocity, sde_step, Conditioning, FlowSchedule,
};

#[test]
fn log_prob_gradient_matches_finite_differences() {
    let dev = common::device();
    let s = FlowSchedule::new(10, 3.0).unwrap();
    let n = Distribution::Normal(0.0, 1.0);
    let x = Tensor::<B, 4>::random([2, 2, 2, 2], n, &dev);
    let v = Tensor::<B, 4>::random([2, 2, 2, 2], n, &dev);
    for cps in [false, true] {
        let step = |x: Tensor<B, 4>, v: Tensor<B, 4>| {
            if cps {
                cps_step(x, v, &s, 3, 0.7)
            } else {
                sde_step(x, v, &s, 3, 0.7)
            }
        };
        let x_next =
            step(x.clone(), v.clone()).unwrap().sample(Tensor::random([2, 2, 2, 2], n, &dev));
        let total = |v: Tensor<B, 4>| -> f64 {
            step(x.clone(), v)
                .unwrap()
                .log_prob(x_next.clone())
                .unwrap()
                .sum()
                .into_scalar()
                .elem::<f64>()
        };

        let va = Tensor::<AB, 4>::from_data(v.to_data(), &dev).require_grad();
        let g = if cps {
            cps_step(Tensor::from_data(x.to_data(), &dev), va.clone(), &s, 3, 0.7)
        } else {
            sde_step(Tensor::from_data(x.to_data(), &dev), va.clone(), &s, 3, 0.7)
        }
        .unwrap()
        .log_prob(Tensor::from_data(x_next.to_data(), &dev))
        .unwrap()
        .sum()
        .backward();
        let grad: Vec<f32> = va.grad(&g).unwrap().into_data().to_vec().unwrap();

        let h = 1e-2;
        let base: Vec<f32> = v.to_data().to_vec().unwrap();
        for (i, gi) in grad.iter().enumerate() {
            let bump = |d: f32| {
                let mut w = base.clone();
                w[i] += d;
                total(Tensor::from_data(TensorData::new(w, [2, 2, 2, 2]), &dev))
            };
            // log_prob is quadratic in v, so the central difference is exact up to rounding.
            let fd = (bump(h) - bump(-h)) / (2.0 * h as f64);
            assert!(
                (*gi as f64 - fd).abs() <= 2e-3 * fd.abs().max(1e-2),
                "cps={cps} element {i}: autodiff {gi}, finite difference {fd}"
            );
        }
    }
}

#[test]
fn euler_sampling_of_a_point_mass_lands_on_it() {
    // Data concentrated at x0: the exact velocity is v(x, sigma) = (x - x0) / sigma.
    let dev = common::device();
    let n = Distribution::Normal(0.0, 1.0);
    let x0 = Tensor::<B, 4>::random([3, 4, 2, 2], n, &dev);
    for (steps, shift) in [(10, 3.0), (40, 3.0), (7, 1.0)] {
        let s = FlowSchedule::new(steps, shift).unwrap();
        let mut x = Tensor::<B, 4>::random([3, 4, 2, 2], n, &dev);
        for i in 0..steps {
            let (sigma, sigma_next) = (s.sigmas[i], s.sigmas[i + 1]);
            let v = (x.clone() - x0.clone()) / sigma;
            // The SDE step with alpha = 0 is this same Euler step.
            let sde = sde_step(x.clone(), v.clone(), &s, i, 0.0).unwrap().mean;
            x = euler_step(x, v, sigma, sigma_next);
            let d: f32 = (sde - x.clone()).abs().max().into_scalar().elem();
            assert!(d <= 1e-6, "step {i}: SDE(alpha=0) differs from Euler by {d}");
        }
        let (diff, _) = common::max_diff(x, x0.clone());
        assert!(diff <= 1e-5, "N={steps}: lands {diff} away from x0");
    }
}

#[test]
fn guidance_is_one_batched_pass_of_u_plus_g_times_c_minus_u() {
    let dev = common::device();
    let n = Distribution::Normal(0.0, 1.0);
    let model = common::PointMass::default();
    let cond = Conditioning {
        text: Tensor::<B, 3>::zeros([2, 3, 4], &dev),
        pooled: Tensor::random([2, 5], n, &dev),
    };
    let uncond = Conditioning {
        text: Tensor::<B, 3>::zeros([2, 3, 4], &dev),
        pooled: Tensor::random([2, 5], n, &dev),
    };
    let x = Tensor::<B, 4>::random([2, 3, 2, 2], n, &dev);
    let t = Tensor::<B, 1>::from_floats([900.0, 250.0], &dev);
    let g = guided_velocity(&model, x.clone(), t.clone(), &cond, &uncond, 4.5).unwrap();
    assert_eq!(model.calls.get(), 1, "CFG must be one forward pass");
    // By hand: u + g (c - u) = (x - x0_u)/s + g (x0_u - x0_c)/s.
    let sigma = Tensor::<B, 1>::from_floats([0.9, 0.25], &dev).reshape([2, 1, 1, 1]);
    let x0 = |p: Tensor<B, 2>| p.slice([0..2, 0..3]).reshape([2, 3, 1, 1]);
    let expected = (x - x0(uncond.pooled.clone())) / sigma.clone()
        + (x0(uncond.pooled.clone()) - x0(cond.pooled.clone())) / sigma * 4.5;
    let (diff, _) = common::max_diff(g, expected);
    assert!(diff <= 1e-5, "{diff}");
    let short = Conditioning {
        text: Tensor::<B, 3>::zeros([1, 3, 4], &dev),
        pooled: Tensor::zeros([1, 5], &dev),
    };
    assert!(guided_velocity(
        &model,
        Tensor::zeros([2, 3, 2, 2], &dev),
        Tensor::zeros([2], &dev),
        &cond,
        &short,
        4.5
    )
    .is_err());
}
