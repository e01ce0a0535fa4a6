//! The rollout engine and batched ODE completions.

use crate::common;

use burn::prelude::*;
use tpgrpo::backend::Backend as B;
use tpgrpo::model::MMDiT;
use tpgrpo::sampler::{ode_completions, rollout, Conditioning, RolloutConfig, SamplerKind};

fn conditioning(b: usize, l: usize, j: usize, p: usize, seed: f64) -> Conditioning<B> {
    let dev = common::device();
    let ramp =
        |n: usize| (0..n).map(|i| ((i as f64 * 0.37 + seed).sin()) as f32).collect::<Vec<_>>();
    Conditioning {
        text: Tensor::from_data(TensorData::new(ramp(b * l * j), [b, l, j]), &dev),
        pooled: Tensor::from_data(TensorData::new(ramp(b * p), [b, p]), &dev),
    }
}

#[test]
fn batched_completions_equal_one_by_one_and_count_the_reference_nfe() {
    let dev = common::device();
    let model = MMDiT::<B>::load(common::mmdit_fixtures().join("sd35_medium_style"), &dev).unwrap();
    let (cond, uncond) = (conditioning(2, 5, 24, 20, 0.1), conditioning(2, 5, 24, 20, 2.0));
    let cfg = RolloutConfig::new().with_num_steps(10).with_window_size(9).with_guidance(4.5);
    let r = rollout(&model, &cfg, &[11, 12], [16, 8, 8], &cond, &uncond, &dev).unwrap();
    assert_eq!(r.latents.len(), 11);
    assert_eq!(r.log_probs.len(), 9);
    assert_eq!(r.nfe, 10);

    // TP-GRPO scores the states before each trained step: x_0 .. x_8.
    let starts: Vec<(usize, Tensor<B, 4>)> = (0..9).map(|s| (s, r.latents[s].clone())).collect();
    let (batched, nfe) =
        ode_completions(&model, &r.schedule, &starts, &cond, &uncond, 4.5).unwrap();
    // 10 + 9 + ... + 2 = 54 completion evaluations per sample: 64 with the rollout, as the note says.
    assert_eq!(nfe, 54);
    assert_eq!(r.nfe + nfe, 64);
    for (s, x) in starts {
        let (alone, _) =
            ode_completions(&model, &r.schedule, &[(s, x)], &cond, &uncond, 4.5).unwrap();
        let (diff, scale) = common::max_diff(batched[s].clone(), alone[0].clone());
        assert!(
            diff <= 1e-5 * scale.max(1.0),
            "start {s}: batched and single completions differ by {diff}"
        );
    }
}

#[test]
fn each_sample_is_reproducible_from_its_own_seed() {
    let dev = common::device();
    let model = common::PointMass::default();
    let cfg =
        RolloutConfig::new().with_sampler(SamplerKind::Sde).with_num_steps(6).with_window_size(4);
    let both = conditioning(2, 3, 4, 8, 0.5);
    let second = Conditioning {
        text: both.text.clone().slice_dim(0, 1..2),
        pooled: both.pooled.clone().slice_dim(0, 1..2),
    };
    let r2 = rollout(&model, &cfg, &[3, 7], [2, 2, 2], &both, &both, &dev).unwrap();
    let r1 = rollout(&model, &cfg, &[7], [2, 2, 2], &second, &second, &dev).unwrap();
    for (a, b) in r2.latents.iter().zip(&r1.latents) {
        let a: Vec<f32> = a.clone().slice_dim(0, 1..2).into_data().to_vec().unwrap();
        assert_eq!(a, b.clone().into_data().to_vec::<f32>().unwrap());
    }
    // With unguided point-mass velocities the final latent is the target: the pooled vector.
    let last = r1.latents.last().unwrap().clone().mean_dim(3).mean_dim(2).reshape([2]);
    let target = second.pooled.clone().slice([0..1, 0..2]).reshape([2]);
    let (diff, _) = common::max_diff(last, target);
    assert!(diff < 1e-4, "{diff}");
}

#[test]
fn a_window_reaching_the_last_step_is_rejected() {
    let cfg = RolloutConfig::new().with_num_steps(10).with_window_size(10);
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("window_size") && e.contains("sigma_next is 0"), "{e}");
    assert!(RolloutConfig::new()
        .with_noise_level(-1.0)
        .schedule([16, 8, 8])
        .unwrap_err()
        .to_string()
        .contains("noise_level"));
}
