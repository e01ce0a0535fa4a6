//! Parity of the SD3 pipeline with transformers / diffusers on the tiny random folder written by
//! tests/fixtures/gen_pipeline.py: tokenizers, each text encoder, the assembled prompt
//! embeddings, the VAE (diffusers folder and Stability single file), and a 4-step run.

use crate::common;

use std::path::{Path, PathBuf};

use burn::prelude::*;
use tpgrpo::backend::Backend as B;
use tpgrpo::model::{AutoencoderKL, ClipTextModel, T5EncoderModel, VaeConfig};
use tpgrpo::pipeline::{EmbeddingCache, Sd3Pipeline, TextTokenizer, CLIP_LENGTH};
use tpgrpo::sampler::Conditioning;
use tpgrpo::sampler::TextToImage;
use tpgrpo::weights::WeightFiles;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pipeline")
}

fn folder() -> PathBuf {
    root().join("sd3_tiny")
}

struct Cases {
    prompts: Vec<String>,
    ids: serde_json::Value,
    max_t5: usize,
    steps: usize,
    cfg: f64,
}

fn cases() -> Cases {
    let text = std::fs::read_to_string(root().join("cases.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    Cases {
        prompts: serde_json::from_value(v["prompts"].clone()).unwrap(),
        ids: v["ids"].clone(),
        max_t5: v["max_sequence_length"].as_u64().unwrap() as usize,
        steps: v["steps"].as_u64().unwrap() as usize,
        cfg: v["guidance_scale"].as_f64().unwrap(),
    }
}

fn expected() -> WeightFiles {
    WeightFiles::open(root().join("expected.safetensors")).unwrap()
}

/// Asserts `out` matches fixture `key` to 1e-4 relative to the reference's largest magnitude.
fn assert_close<const D: usize>(out: Tensor<B, D>, key: &str) {
    common::parity(key, out, &expected(), key, 1e-4).unwrap();
}

fn ids(c: &Cases, name: &str) -> Vec<Vec<u32>> {
    serde_json::from_value(c.ids[name].clone()).unwrap()
}

#[test]
fn tokenizers_match_transformers() {
    let c = cases();
    let mut texts: Vec<&str> = c.prompts.iter().map(String::as_str).collect();
    texts.push("");
    for (sub, name, len) in [
        ("tokenizer", "clip_l", CLIP_LENGTH),
        ("tokenizer_2", "clip_g", CLIP_LENGTH),
        ("tokenizer_3", "t5", c.max_t5),
    ] {
        let tok = TextTokenizer::open(folder().join(sub), len).unwrap();
        assert_eq!(tok.encode(&texts).unwrap(), ids(&c, name), "{sub}");
    }
    // Truncation keeps both CLIP specials at the ends.
    let tok = TextTokenizer::open(folder().join("tokenizer"), 8).unwrap();
    let long = tok.encode(&["a red circle above a blue square and more"]).unwrap();
    let full = ids(&c, "clip_l");
    assert_eq!(long[0].len(), 8);
    assert_eq!(long[0][..7], full[0][..7]);
    assert_eq!(long[0][7], *full[0].iter().max().unwrap(), "eos last");
}

#[test]
fn text_encoders_match_transformers() {
    let c = cases();
    let device = common::device();
    for (sub, name) in [("text_encoder", "clip_l"), ("text_encoder_2", "clip_g")] {
        let model = ClipTextModel::<B>::load(folder().join(sub), &device).unwrap();
        let ids = ids(&c, name);
        let out = model.forward(&ids[..c.prompts.len()], &device).unwrap();
        assert_close(out.hidden, &format!("{name}.hidden"));
        assert_close(out.pooled, &format!("{name}.pooled"));
    }
    let t5 = T5EncoderModel::<B>::load(folder().join("text_encoder_3"), &device).unwrap();
    let out = t5.forward(&ids(&c, "t5")[..c.prompts.len()], &device).unwrap();
    assert_close(out, "t5.hidden");
}

#[test]
fn vae_matches_diffusers_from_folder_and_single_file() {
    let device = common::device();
    let exp = expected();
    let folder_vae = AutoencoderKL::<B>::load(folder().join("vae"), &device).unwrap();
    let config: VaeConfig = tpgrpo::weights::read_config(folder().join("vae/config.json")).unwrap();
    let single = AutoencoderKL::<B>::load_single_file(
        root().join("vae_single_file.safetensors"),
        &config,
        &device,
    )
    .unwrap();
    for vae in [folder_vae, single] {
        assert_close(vae.decode_raw(common::tensor(&exp, "vae.latents")), "vae.decoded");
        assert_close(vae.encode_mean(common::tensor(&exp, "vae.image")), "vae.encoded_mean");
    }
}

#[test]
fn prompt_embeddings_and_a_four_step_run_match_diffusers() {
    let c = cases();
    let device = common::device();
    let pipe = Sd3Pipeline::<B>::load(folder(), c.max_t5, &device).unwrap();
    let texts: Vec<&str> = c.prompts.iter().map(String::as_str).collect();
    let cond = pipe.conditioner.encode(&texts).unwrap();
    let uncond = pipe.conditioner.encode(&["", ""]).unwrap();
    assert_close(cond.text.clone(), "prompt_embeds");
    assert_close(cond.pooled.clone(), "pooled_prompt_embeds");
    assert_close(uncond.text, "negative_prompt_embeds");
    assert_close(uncond.pooled, "negative_pooled_prompt_embeds");

    let one = |t: &str| pipe.conditioner.encode(&[t]).unwrap();
    let noise = common::tensor::<4>(&expected(), "pipeline.noise");
    let latents = pipe.denoise(noise, &one(texts[0]), &one(""), c.steps, c.cfg).unwrap();
    assert_close(latents.clone(), "pipeline.latents");
    let image = pipe.conditioner.vae.decode(latents).unwrap();
    assert_close(image, "pipeline.image");
}

#[test]
fn embedding_cache_round_trips_without_the_encoders() {
    let c = cases();
    let device = common::device();
    let mut pipe = Sd3Pipeline::<B>::load(folder(), c.max_t5, &device).unwrap();
    let texts: Vec<&str> = c.prompts.iter().map(String::as_str).collect();
    let path = common::scratch("embedding-cache").join("prompts.safetensors");
    let encoders = pipe.conditioner.encoders.take().unwrap();
    EmbeddingCache::build(&encoders, &texts, 2, &path, &device).unwrap();
    pipe.conditioner.cache = Some(EmbeddingCache::open(&path).unwrap());
    // Encoders gone: cached prompts (and "") still encode, to the reference values.
    let cond: Conditioning<B> = pipe.conditioner.encode(&texts).unwrap();
    assert_close(cond.text, "prompt_embeds");
    assert_close(cond.pooled, "pooled_prompt_embeds");
    assert_close(pipe.conditioner.encode(&["", ""]).unwrap().text, "negative_prompt_embeds");
    let err = pipe.conditioner.encode(&["a prompt nobody cached"]).unwrap_err().to_string();
    assert!(err.contains("a prompt nobody cached") && err.contains("cache"), "{err}");
}

#[test]
fn bad_folders_are_named() {
    let device = common::device();
    let dir = common::scratch("bad-pipeline");
    let err = Sd3Pipeline::<B>::load(&dir, 16, &device).unwrap_err().to_string();
    assert!(err.contains("model_index.json"), "{err}");
    // A CLIP folder whose weights do not match its config names the key and both shapes.
    let clip = dir.join("text_encoder");
    std::fs::create_dir_all(&clip).unwrap();
    let src = folder().join("text_encoder");
    std::fs::copy(src.join("model.safetensors"), clip.join("model.safetensors")).unwrap();
    let config = std::fs::read_to_string(src.join("config.json")).unwrap();
    std::fs::write(
        clip.join("config.json"),
        config.replace("\"intermediate_size\": 64", "\"intermediate_size\": 80"),
    )
    .unwrap();
    let err = ClipTextModel::<B>::load(&clip, &device).unwrap_err().to_string();
    assert!(
        err.contains("mlp.fc1.weight") && err.contains("[80, 32]") && err.contains("[64, 32]"),
        "{err}"
    );
    let err = ClipTextModel::<B>::load(dir.join("nowhere"), &device).unwrap_err().to_string();
    assert!(err.contains("nowhere") && err.contains("config.json"), "{err}");
}
