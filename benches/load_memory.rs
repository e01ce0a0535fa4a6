//! Peak resident memory of loading each component of a diffusers SD3 folder, against the
//! float32 size of its parameters (what the loaded model must hold): loading must not keep
//! duplicate copies while converting.
//!
//! `TPGRPO_LARGE_SD3=DIR cargo bench --bench load_memory`, DIR written by
//! `tests/fixtures/gen_large_sd3.py DIR` (random weights, SD3.5-medium sizes). Each component
//! is loaded in a fresh process (the peak, `VmHWM`, is per process); the last row loads the
//! transformer, both CLIP encoders and the VAE into one process; `pickscore` a
//! PickScore_v1-sized `CLIPModel` (both towers). Parts missing from DIR are skipped.
//!
//! `TPGRPO_LARGE_FLUX=DIR` adds the FLUX transformer written by
//! `tests/fixtures/gen_large_flux.py DIR` (FLUX.1-dev's widths, bf16): `flux` from the diffusers
//! folder, `flux-bfl` from the Black Forest Labs single file (fused tensors split by rows).

use std::path::{Path, PathBuf};
use std::process::Command;

use burn::module::Module;
use tpgrpo::backend::{self, Backend};
use tpgrpo::model::clip::ClipModel;
use tpgrpo::model::{AutoencoderKL, ClipTextModel, Flux, MMDiT, T5EncoderModel};

const PARTS: [&str; 7] = [
    "transformer",
    "text_encoder",
    "text_encoder_2",
    "text_encoder_3",
    "vae",
    "all-but-t5",
    "pickscore",
];

/// `VmHWM` (peak resident set) of this process, in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Loads `part` of `dir` and returns its parameter count.
fn load(dir: &Path, part: &str) -> tpgrpo::Result<usize> {
    let device = backend::init().expect("kernel cache settings");
    Ok(match part {
        "transformer" => MMDiT::<Backend>::load(dir.join(part), &device)?.num_params(),
        "text_encoder" | "text_encoder_2" => {
            ClipTextModel::<Backend>::load(dir.join(part), &device)?.num_params()
        }
        "text_encoder_3" => T5EncoderModel::<Backend>::load(dir.join(part), &device)?.num_params(),
        "vae" => AutoencoderKL::<Backend>::load(dir.join(part), &device)?.num_params(),
        "pickscore" => ClipModel::<Backend>::load(dir.join(part), &device)?.towers.num_params(),
        "flux" => Flux::<Backend>::load(dir.join("transformer"), &device)?.num_params(),
        "flux-bfl" => {
            Flux::<Backend>::load(dir.join("flux1-dev.safetensors"), &device)?.num_params()
        }
        _ => {
            let t = MMDiT::<Backend>::load(dir.join("transformer"), &device)?;
            let l = ClipTextModel::<Backend>::load(dir.join("text_encoder"), &device)?;
            let g = ClipTextModel::<Backend>::load(dir.join("text_encoder_2"), &device)?;
            let v = AutoencoderKL::<Backend>::load(dir.join("vae"), &device)?;
            t.num_params() + l.num_params() + g.num_params() + v.num_params()
        }
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        let (dir, part) = (PathBuf::from(&args[i + 1]), &args[i + 2]);
        match load(&dir, part) {
            Ok(n) => println!("{n} {}", peak_rss()),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    let sd3 = std::env::var_os("TPGRPO_LARGE_SD3").map(PathBuf::from);
    let flux = std::env::var_os("TPGRPO_LARGE_FLUX").map(PathBuf::from);
    if sd3.is_none() && flux.is_none() {
        println!(
            "load_memory: set TPGRPO_LARGE_SD3 and/or TPGRPO_LARGE_FLUX to folders written by \
             tests/fixtures/gen_large_sd3.py / gen_large_flux.py (skipped)"
        );
        return;
    }
    let mut rows: Vec<(PathBuf, &str, &str)> = Vec::new();
    if let Some(dir) = sd3 {
        for part in PARTS {
            rows.push((dir.clone(), part, if part == "all-but-t5" { "transformer" } else { part }));
        }
    }
    if let Some(dir) = flux {
        rows.push((dir.clone(), "flux", "transformer"));
        rows.push((dir, "flux-bfl", "flux1-dev.safetensors"));
    }
    println!("peak resident memory while loading ({})", backend::NAME);
    println!("| part | parameters | f32 size | peak RSS | peak / f32 size |");
    println!("|---|---|---|---|---|");
    let exe = std::env::current_exe().expect("own path");
    for (dir, part, needed) in rows {
        if !dir.join(needed).exists() {
            println!("| {part} | skipped: no {} |", dir.join(needed).display());
            continue;
        }
        let out = Command::new(&exe).arg("--child").arg(&dir).arg(part).output().expect("spawn");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut it = text.split_whitespace().map(|x| x.parse::<u64>().unwrap_or(0));
        let (Some(n), Some(peak)) = (it.next(), it.next()) else {
            println!("| {part} | failed: {} |", String::from_utf8_lossy(&out.stderr).trim());
            continue;
        };
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        println!(
            "| {part} | {:.1}M | {:.2} GiB | {:.2} GiB | {:.3} |",
            n as f64 / 1e6,
            gib(4 * n),
            gib(peak),
            peak as f64 / (4 * n) as f64
        );
    }
}
