//! LoRA: a fresh adapter is the identity, only adapters train, merging and PEFT export agree
//! with the adapted forward; AdamW and global-norm clipping against hand-worked values; the
//! gradient noise estimates against hand-worked values and gradients of known distribution.

use crate::common;

use burn::backend::Autodiff;
use burn::prelude::*;
use common::{noise, scratch, tiny_config};
use tpgrpo::backend::Backend as B;
use tpgrpo::model::{Adaptable, LoraConfig, MMDiT};
use tpgrpo::rng::gaussian;
use tpgrpo::train::GradientNoise;
use tpgrpo::weights::{export_params, WeightFiles};

type AB = Autodiff<B>;

fn forward<BB: Backend>(m: &MMDiT<BB>, seed: u64) -> Tensor<BB, 4> {
    m.forward(
        noise(seed, [2, 4, 8, 8]),
        Tensor::from_floats([900.0, 250.0], &Default::default()),
        noise(seed + 1, [2, 5, 12]),
        noise(seed + 2, [2, 10]),
    )
    .unwrap()
}

fn same<BB: Backend, const D: usize>(a: Tensor<BB, D>, b: Tensor<BB, D>) -> f32 {
    (a - b).abs().max().into_scalar().elem()
}

/// The model with every B factor set to small noise, as after some training.
fn trained<BB: Backend>(m: MMDiT<BB>) -> MMDiT<BB> {
    let tensors = m
        .lora_tensors()
        .into_iter()
        .enumerate()
        .map(|(i, (name, t))| {
            let t =
                if name.ends_with("lora_B") { noise(100 + i as u64, t.dims()) * 0.1 } else { t };
            (name, t)
        })
        .collect();
    m.with_lora_tensors(tensors).unwrap()
}

#[test]
fn fresh_adapters_leave_the_output_unchanged_and_follow_peft_targets() {
    let base: MMDiT<B> = tiny_config().init(&Default::default()).unwrap().materialize();
    let adapted = base.clone().with_lora(&LoraConfig::new().with_rank(4)).unwrap();
    assert_eq!(same(forward(&base, 1), forward(&adapted, 1)), 0.0);
    let modules = |m: &MMDiT<B>| -> Vec<String> {
        let names = m.lora_tensors().into_iter().map(|(n, _)| n);
        names.filter_map(|n| n.strip_suffix(".lora_A").map(str::to_string)).collect()
    };
    let names = modules(&adapted);
    // 8 joint-attention projections per block, 7 in the context-pre-only last block; no attn2.
    assert_eq!(names.len(), 8 + 8 + 7);
    assert!(names.contains(&"transformer_blocks.0.attn.to_out.0".to_string()));
    assert!(names.iter().all(|n| !n.contains("attn2")));
    // A ~ N(0, (1/r)^2), B = 0.
    let factors = adapted.lora_tensors();
    assert!(factors[0].0.ends_with(".lora_A") && factors[1].0.ends_with(".lora_B"));
    let a: Vec<f32> = factors[0].1.clone().into_data().to_vec().unwrap();
    let std = (a.iter().map(|v| v * v).sum::<f32>() / a.len() as f32).sqrt();
    assert!((std - 0.25).abs() < 0.05, "std of A = {std}, expected 1/r = 0.25");
    assert_eq!(factors[1].1.clone().abs().max().into_scalar().elem::<f32>(), 0.0);

    let attn2 = LoraConfig::new().with_rank(4).with_target_modules(vec!["attn2.to_q".into()]);
    let names = modules(&base.clone().with_lora(&attn2).unwrap());
    assert_eq!(names, vec!["transformer_blocks.0.attn2.to_q".to_string()]);
    // Feed-forward projections are adaptable too (PEFT's names); the text stream's MLP is
    // `ff_context`, absent from the last block.
    let ff = LoraConfig::new().with_rank(4).with_target_modules(vec!["ff.net.0.proj".into()]);
    assert_eq!(modules(&base.clone().with_lora(&ff).unwrap()).len(), 3);
    let ff_context = ff.clone().with_target_modules(vec!["ff_context.net.2".into()]);
    assert_eq!(
        modules(&base.clone().with_lora(&ff_context).unwrap()),
        ["transformer_blocks.0.ff_context.net.2", "transformer_blocks.1.ff_context.net.2"]
    );
    let bad = LoraConfig::new().with_target_modules(vec!["norm1.linear".into()]);
    let err = base.clone().with_lora(&bad).unwrap_err().to_string();
    assert!(err.contains("target_modules") && err.contains("norm1.linear"), "{err}");
    let err = base.clone().with_lora(&LoraConfig::new().with_rank(0)).unwrap_err().to_string();
    assert!(err.contains("lora.rank"), "{err}");
    // A rank above a targeted layer's own (16 -> 16 here) adds nothing and is refused before
    // the factors are allocated.
    let err = base.with_lora(&LoraConfig::new().with_rank(17)).unwrap_err().to_string();
    assert!(err.contains("lora.rank") && err.contains("16 -> 16"), "{err}");
}

#[test]
fn only_adapter_weights_change_after_optimizer_steps() {
    let device = Default::default();
    let model: MMDiT<AB> =
        tiny_config().init(&device).unwrap().with_lora(&LoraConfig::new().with_rank(4)).unwrap();
    let base_before: Vec<_> = export_params(&model.adapters_off());
    let lora_before = model.lora_tensors();
    let mut model = model;
    let target: Tensor<AB, 4> = noise(7, [2, 4, 8, 8]);
    for _ in 0..3 {
        let loss = (forward(&model, 3) - target.clone()).square().mean();
        let grads = loss.backward();
        // Plain gradient descent: what changes is what has a gradient.
        let updated = model
            .lora_tensors()
            .into_iter()
            .map(|(n, t)| {
                let g = t.grad(&grads).unwrap_or_else(|| panic!("no grad: {n}"));
                let stepped = t.inner() - g.mul_scalar(0.1);
                (n, Tensor::from_inner(stepped))
            })
            .collect();
        model = model.with_lora_tensors(updated).unwrap();
    }
    let base_after = export_params(&model.adapters_off());
    assert_eq!(base_before.len(), base_after.len());
    for ((name, _, before), (_, _, after)) in base_before.iter().zip(&base_after) {
        assert_eq!(before, after, "frozen parameter {name} changed");
    }
    for ((name, before), (_, after)) in lora_before.into_iter().zip(model.lora_tensors()) {
        // The last block drops the text stream after attention, so its text queries get no
        // gradient: both factors stay (as in diffusers + PEFT, where AdamW's weight decay alone
        // would move A).
        if name.starts_with("transformer_blocks.2.attn.add_q_proj.") {
            assert_eq!(same(before, after), 0.0, "{name}");
            continue;
        }
        assert!(same(before, after) > 0.0, "adapter factor {name} did not change");
    }
}

#[test]
fn merged_and_peft_round_tripped_models_match_the_adapted_forward() {
    let config = LoraConfig::new().with_rank(4).with_alpha(8.0);
    let base: MMDiT<B> = tiny_config().init(&Default::default()).unwrap().materialize();
    let adapted = trained(base.clone().with_lora(&config).unwrap());
    let expected = forward(&adapted, 5);
    assert!(same(expected.clone(), forward(&base, 5)) > 1e-3, "the adapters must matter here");

    // Merged weights give the same function; saved as diffusers and reloaded, too.
    let merged = adapted.clone().merge_lora();
    assert!(!merged.has_lora());
    assert!(same(forward(&merged, 5), expected.clone()) < 1e-5);
    let dir = scratch("lora-merge");
    let err = adapted.save_diffusers(&dir).unwrap_err().to_string();
    assert!(err.contains("merge_lora"), "{err}");
    merged.save_diffusers(&dir).unwrap();
    let reloaded = MMDiT::<B>::load(&dir, &Default::default()).unwrap();
    assert!(same(forward(&reloaded, 5), expected.clone()) < 1e-5);

    // PEFT export: key names and PyTorch shapes, config fields, and an exact round trip.
    let peft = scratch("lora-peft");
    adapted.save_peft(&peft, &config).unwrap();
    let files = WeightFiles::open(peft.join("adapter_model.safetensors")).unwrap();
    let a = files.info("base_model.model.transformer_blocks.1.attn.to_q.lora_A.weight").unwrap();
    let b =
        files.info("base_model.model.transformer_blocks.2.attn.add_v_proj.lora_B.weight").unwrap();
    assert_eq!((a.shape.clone(), b.shape.clone()), (vec![4, 16], vec![16, 4]));
    assert_eq!(files.keys().count(), 2 * 23);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(peft.join("adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(json["peft_type"], "LORA");
    assert_eq!(json["r"], 4);
    assert_eq!(json["lora_alpha"], 8.0);
    assert_eq!(json["target_modules"].as_array().unwrap().len(), 8);
    let (loaded, loaded_config) = base.clone().load_peft(&peft).unwrap();
    assert_eq!(loaded_config.rank, 4);
    assert_eq!(same(forward(&loaded, 5), expected), 0.0);

    // A folder for other targets is refused with every problem named.
    let other = LoraConfig::new().with_rank(2);
    let wrong = scratch("lora-peft-wrong");
    base.clone().with_lora(&other).unwrap().save_peft(&wrong, &other).unwrap();
    std::fs::copy(wrong.join("adapter_config.json"), peft.join("adapter_config.json")).unwrap();
    let err = base.load_peft(&peft).unwrap_err().to_string();
    assert!(err.contains("expected shape [2, 16], found [4, 16]"), "{err}");
}

/// One-dimensional gradients: micro-batch means 2 and 6 of two samples each, update mean 4.
/// `s = (4 + 36) / 2 = 20`, `h = 1/2`, `B = 4`: `tr(Sigma) = (20 - 16) / (1/2 - 1/4) = 16`,
/// `|G|^2 = 16 - 16/4 = 12`.
#[test]
fn gradient_noise_by_hand() {
    let e = GradientNoise::estimate(&[(2, 4.0), (2, 36.0)], 16.0).unwrap();
    assert!((e.noise_trace - 16.0).abs() < 1e-12, "{e:?}");
    assert!((e.signal_sq - 12.0).abs() < 1e-12, "{e:?}");
    assert_eq!(GradientNoise::estimate(&[(4, 4.0)], 4.0), None, "one micro-batch");
    // Averaged separately: signal (12 - 2) / 2 = 5, noise (16 + 30) / 2 = 23.
    let other = GradientNoise { signal_sq: -2.0, noise_trace: 30.0 };
    assert!((GradientNoise::scale(&[e, other]).unwrap() - 4.6).abs() < 1e-12);
    let lost = GradientNoise { signal_sq: -20.0, noise_trace: 30.0 };
    assert_eq!(GradientNoise::scale(&[e, lost]), None, "mean signal below zero");
    assert_eq!(GradientNoise::scale(&[]), None);
}

/// Sample gradients drawn from a known Gaussian (mean `mu`, per-coordinate std `sd`), split
/// into micro-batches of unequal sizes like a trainer's last short micro-batch: averaged over
/// many updates the estimates recover `|mu|^2` and `sum sd^2` within five standard errors.
#[test]
fn gradient_noise_estimates_are_unbiased_for_known_gradients() {
    let (mu, sd) = ([0.3f64, -0.2, 0.1, 0.0, 0.25], [0.5f64, 1.0, 0.2, 0.7, 0.4]);
    let sizes = [3usize, 5, 4, 2];
    let sq = |g: &[f64]| g.iter().map(|x| x * x).sum::<f64>();
    let updates = 20_000;
    let draws = gaussian(7, 0, updates * sizes.iter().sum::<usize>() * mu.len());
    let mut draws = draws.into_iter().map(f64::from);
    let mut normal = move || draws.next().expect("enough draws");
    let (mut signal, mut noise) = (Vec::new(), Vec::new());
    for _ in 0..updates {
        let mut micro = Vec::new();
        let mut full = [0.0f64; 5];
        for &b in &sizes {
            let mut g = [0.0f64; 5];
            for _ in 0..b {
                for j in 0..5 {
                    g[j] += (mu[j] + sd[j] * normal()) / b as f64;
                }
            }
            let total = sizes.iter().sum::<usize>() as f64;
            for j in 0..5 {
                full[j] += g[j] * b as f64 / total;
            }
            micro.push((b, sq(&g)));
        }
        let e = GradientNoise::estimate(&micro, sq(&full)).unwrap();
        signal.push(e.signal_sq);
        noise.push(e.noise_trace);
    }
    let check = |xs: &[f64], want: f64, what: &str| {
        let n = xs.len() as f64;
        let m = xs.iter().sum::<f64>() / n;
        let se = (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0) / n).sqrt();
        assert!((m - want).abs() < 5.0 * se, "{what}: {m:.5} vs {want:.5} (se {se:.5})");
        se
    };
    let se = check(&signal, sq(&mu), "|G|^2");
    check(&noise, sq(&sd), "tr(Sigma)");
    // The check can fail: a standard error this small separates |mu|^2 from zero.
    assert!(5.0 * se < sq(&mu), "standard error {se}");
}
