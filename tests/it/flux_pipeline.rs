//! Parity of the FLUX pipeline with diffusers' FluxPipeline on the tiny random folder written by
//! tests/fixtures/gen_flux.py (`tests/fixtures/flux/pipeline/`): prompt embeddings (CLIP-L
//! pooled, T5), 2x2 packing, a 4-step run with embedded guidance on the dynamically shifted
//! schedule, and the decoded images.

use crate::common;

use std::path::{Path, PathBuf};

use burn::prelude::*;
use tpgrpo::backend::Backend as B;
use tpgrpo::model::{pack_latents, unpack_latents};
use tpgrpo::pipeline::{FluxPipeline, SampleConfig};
use tpgrpo::sampler::{DynamicShift, TextToImage};
use tpgrpo::weights::WeightFiles;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/flux/pipeline")
}

/// Asserts `out` matches fixture `key` to 1e-4 relative to the reference's largest magnitude.
fn assert_close<const D: usize>(out: Tensor<B, D>, expected: &WeightFiles, key: &str) {
    common::parity(key, out, expected, key, 1e-4).unwrap();
}

#[test]
fn flux_pipeline_matches_diffusers() {
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("cases.json")).unwrap()).unwrap();
    let prompts: Vec<String> = serde_json::from_value(cases["prompts"].clone()).unwrap();
    let prompts: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let number = |k: &str| cases[k].as_f64().unwrap();
    let device = common::device();
    let expected = WeightFiles::open(root().join("expected.safetensors")).unwrap();
    let pipe = FluxPipeline::<B>::load(
        root().join("flux_tiny"),
        number("max_sequence_length") as usize,
        &device,
    )
    .unwrap();

    let cond = pipe.conditioner.encode(&prompts).unwrap();
    assert_close(cond.text.clone(), &expected, "prompt_embeds");
    assert_close(cond.pooled.clone(), &expected, "pooled_prompt_embeds");

    // Packing is a permutation: exact both ways.
    let noise = common::tensor::<4>(&expected, "noise");
    let [_, _, h, w] = noise.dims();
    let packed = pack_latents(noise.clone()).unwrap();
    assert_eq!(common::max_diff(packed.clone(), common::tensor(&expected, "packed_noise")).0, 0.0);
    assert_eq!(common::max_diff(unpack_latents(packed, h, w).unwrap(), noise.clone()).0, 0.0);

    let latents = pipe.denoise(noise, &cond, number("steps") as usize, number("guidance_scale"));
    let latents = latents.unwrap();
    assert_close(pack_latents(latents.clone()).unwrap(), &expected, "latents");
    assert_close(pipe.conditioner.vae.decode(latents).unwrap(), &expected, "image");
}

#[test]
fn flux_generate_sizes_and_refusals() {
    let device = common::device();
    let mut pipe = FluxPipeline::<B>::load(root().join("flux_tiny"), 16, &device).unwrap();
    // diffusers' default: 128 latent pixels a side behind this VAE's factor 2.
    assert_eq!(pipe.image_size(), [256, 256]);
    pipe.set_image_size([8, 12]).unwrap();
    assert_eq!(pipe.conditioner.latent_shape(), [16, 4, 6]);
    let config = SampleConfig::new().with_steps(2).with_guidance_scale(3.5);
    let images = pipe.generate(&["a red circle"], &[3], &config).unwrap();
    assert_eq!((images.len(), images[0].width, images[0].height), (1, 12, 8));
    let err = |r: tpgrpo::Result<_>| r.map(|_: Vec<_>| ()).unwrap_err().to_string();
    let bad = config.clone().with_negative_prompt("blurry".into());
    assert!(err(pipe.generate(&["x"], &[0], &bad)).contains("negative_prompt"));
    let odd = config.clone().with_height(Some(10));
    assert!(err(pipe.generate(&["x"], &[0], &odd)).contains("height/width"));
    assert!(pipe.set_image_size([6, 8]).unwrap_err().to_string().contains("height/width"));

    // A scheduler without dynamic shifting is refused by name.
    let dir = common::scratch("flux-scheduler");
    let config = dir.join("scheduler_config.json");
    std::fs::write(&config, r#"{"use_dynamic_shifting": false, "shift": 3.0}"#).unwrap();
    let e = DynamicShift::from_scheduler_config(&config).unwrap_err().to_string();
    assert!(e.contains("use_dynamic_shifting"), "{e}");
    std::fs::write(&config, r#"{"use_dynamic_shifting": true, "use_karras_sigmas": true}"#)
        .unwrap();
    let e = DynamicShift::from_scheduler_config(&config).unwrap_err().to_string();
    assert!(e.contains("use_karras_sigmas"), "{e}");
    std::fs::write(&config, r#"{"use_dynamic_shifting": true, "max_shift": 1.2}"#).unwrap();
    let shift = DynamicShift::from_scheduler_config(&config).unwrap();
    assert_eq!(shift, DynamicShift::new().with_max_shift(1.2));
}
