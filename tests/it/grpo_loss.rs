//! The clipped policy loss and the KL penalty against hand-worked values and gradients.

use crate::common;

use burn::prelude::*;
use tpgrpo::backend::{self, TrainBackend as AB};
use tpgrpo::grpo::{kl_penalty, policy_loss};
use tpgrpo::model::{Adaptable, LoraConfig, MMDiT};
use tpgrpo::sampler::{cps_step, Conditioning, FlowSchedule, Guidance};

fn floats(t: Tensor<<AB as burn::tensor::backend::AutodiffBackend>::InnerBackend, 1>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().unwrap()
}

/// d loss / d log_prob for log-probs `logp`, stored log-probs `old` and advantages `adv`.
fn grad(logp: [f32; 4], old: [f32; 4], adv: [f32; 4], eps: f64) -> (f32, Vec<f32>) {
    let dev = backend::device();
    let lp = Tensor::<AB, 1>::from_floats(logp, &dev).require_grad();
    let (loss, _) = policy_loss(
        lp.clone(),
        Tensor::from_floats(old, &dev),
        Tensor::from_floats(adv, &dev),
        eps,
        5.0,
    );
    let value: f32 = loss.clone().into_scalar().elem();
    let g = loss.backward();
    (value, floats(lp.grad(&g).unwrap()))
}

#[test]
fn at_ratio_one_the_gradient_is_the_advantage_weighted_log_prob_gradient() {
    let logp = [-0.3, 0.2, 1.5, -2.0];
    let adv = [1.0, -0.5, 2.0, 7.0]; // 7 is clipped to adv_clip_max = 5
    let (value, g) = grad(logp, logp, adv, 1e-4);
    // loss = mean(-A * 1) and d/dlogp_i = -A_i / B.
    let clipped = [1.0, -0.5, 2.0, 5.0];
    assert!((value - (-(1.0 - 0.5 + 2.0 + 5.0) / 4.0)).abs() < 1e-6, "{value}");
    for (gi, a) in g.iter().zip(clipped) {
        assert!((gi - (-a / 4.0)).abs() < 1e-6, "{g:?}");
    }
}

#[test]
fn clipping_stops_the_gradient_only_in_the_direction_the_advantage_pushes() {
    let eps = 1e-4;
    // Ratios e^{+0.01} (above 1+eps) for samples 0-1 and e^{-0.01} (below 1-eps) for 2-3.
    let logp = [0.01, 0.01, -0.01, -0.01];
    let old = [0.0; 4];
    let adv = [1.0, -1.0, 1.0, -1.0];
    let (_, g) = grad(logp, old, adv, eps);
    let r_up = 0.01f32.exp();
    let r_down = (-0.01f32).exp();
    // Above the range, a positive advantage wants the ratio even higher: clipped, no gradient;
    // a negative one pushes it back down: gradient -A r / B.
    assert_eq!(g[0], 0.0, "{g:?}");
    assert!((g[1] - r_up / 4.0).abs() < 1e-6, "{g:?}");
    // Below the range, a positive advantage pulls the ratio back up; a negative one is clipped.
    assert!((g[2] - (-r_down / 4.0)).abs() < 1e-6, "{g:?}");
    assert_eq!(g[3], 0.0, "{g:?}");
}

#[test]
fn statistics_are_the_hand_computed_ones() {
    let dev = backend::device();
    let lp = Tensor::<AB, 1>::from_floats([0.01, 0.0, -0.02, 0.00005], &dev);
    let (_, stats) = policy_loss(lp, Tensor::zeros([4], &dev), Tensor::ones([4], &dev), 1e-4, 5.0);
    let ratios = [0.01f64.exp(), 1.0, (-0.02f64).exp(), 0.00005f64.exp()];
    assert!((stats.ratio_mean - ratios.iter().sum::<f64>() / 4.0).abs() < 1e-6);
    assert_eq!(stats.clip_frac_above, 0.25);
    assert_eq!(stats.clip_frac_below, 0.25);
    let kl = 0.5 * (0.01f64.powi(2) + 0.02f64.powi(2) + 0.00005f64.powi(2)) / 4.0;
    assert!((stats.approx_kl - kl).abs() < 1e-9, "{} vs {kl}", stats.approx_kl);
}

#[test]
fn kl_penalty_matches_hand_values_and_vanishes_at_the_reference() {
    let dev = backend::device();
    // Sample 0: differences (1, 0, 0, 1) -> mean square 0.5, std 0.5 -> 0.5 / (2 * 0.25) = 1.
    // Sample 1: differences (2, 2, 2, 2) -> mean square 4, std 2 -> 4 / (2 * 4) = 0.5.
    let mean = Tensor::<AB, 1>::from_floats([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0], &dev)
        .reshape([2, 1, 2, 2])
        .require_grad();
    let reference = Tensor::<AB, 4>::zeros([2, 1, 2, 2], &dev);
    let std = Tensor::<AB, 1>::from_floats([0.5, 2.0], &dev);
    let kl = kl_penalty(mean.clone(), reference, std.clone());
    assert!((kl.clone().into_scalar().elem::<f32>() - 0.75).abs() < 1e-6);
    // d/dmu = 2 (mu - mu_ref) / (2 std^2 * CHW * B).
    let g = floats(mean.grad(&kl.backward()).unwrap().reshape([8]));
    // Sample 0: 1 / 0.25 = 4; sample 1: 2 / 4 = 0.5; both over C*H*W * B = 8.
    let expected = [4.0, 0.0, 0.0, 4.0, 0.5, 0.5, 0.5, 0.5].map(|x: f32| x / 8.0);
    for (a, b) in g.iter().zip(expected) {
        assert!((a - b).abs() < 1e-6, "{g:?}");
    }
    let same = kl_penalty(mean.clone(), mean.detach(), std);
    assert_eq!(same.into_scalar().elem::<f32>(), 0.0);
}

/// The KL term of the loss on a real network: the step means of the policy (LoRA on) and the
/// reference (the same network with the adapters off) at a CPS step with CFG.
fn kl_between(policy: &MMDiT<AB>, reference: &MMDiT<AB>) -> f32 {
    let schedule = FlowSchedule::new(10, 3.0).unwrap();
    let x: Tensor<AB, 4> = common::noise(11, [2, 4, 8, 8]);
    let cond =
        Conditioning { text: common::noise(12, [2, 5, 12]), pooled: common::noise(13, [2, 10]) };
    let uncond =
        Conditioning { text: common::noise(14, [2, 5, 12]), pooled: common::noise(15, [2, 10]) };
    let guidance = Guidance::new(&cond, &uncond, 4.5, 2, 1).unwrap();
    let t = Tensor::full([2], schedule.sigmas[3] * 1000.0, &x.device());
    let mean = |m: &MMDiT<AB>| {
        let v = guidance.velocity(m, x.clone(), t.clone()).unwrap();
        cps_step(x.clone(), v, &schedule, 3, 0.7).unwrap()
    };
    let (step, ref_step) = (mean(policy), mean(reference));
    let std = Tensor::full([2], step.std, &x.device());
    kl_penalty(step.mean, ref_step.mean, std).into_scalar().elem()
}

#[test]
fn kl_term_is_zero_when_the_adapters_are_off() {
    // Materialised, so that the clone below holds the same values (lazy parameters are
    // drawn when first read).
    let base: MMDiT<AB> = common::tiny_config().init(&backend::device()).unwrap().materialize();
    let policy = base.clone().with_lora(&LoraConfig::new().with_rank(4)).unwrap();
    let reference = policy.adapters_off();
    // Fresh adapters (B = 0) and a policy with its adapters switched off: exactly 0.
    assert_eq!(kl_between(&policy, &reference), 0.0);
    // After training (B != 0) the term is positive; switched off again it is 0 again.
    let trained = policy
        .lora_tensors()
        .into_iter()
        .enumerate()
        .map(|(i, (n, t))| {
            let t = if n.ends_with("lora_B") {
                common::noise(50 + i as u64, t.dims()) * 0.05
            } else {
                t
            };
            (n, t)
        })
        .collect();
    let trained = policy.with_lora_tensors(trained).unwrap();
    assert!(kl_between(&trained, &reference) > 1e-3);
    // Switched off again it is the untouched base model, held apart since before the
    // adapters were attached.
    assert_eq!(kl_between(&trained.adapters_off(), &base), 0.0);
}
