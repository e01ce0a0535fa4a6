//! `tpgrpo score` on the reward fixture's images: the same scores as transformers (through the
//! command line, one prompt per image), and clear errors for bad input.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/reward")
}

fn score(args: &[String]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tpgrpo")).arg("score").args(args).output().unwrap()
}

#[test]
fn scores_images_on_disk_like_the_reference() {
    let f = fixtures();
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(f.join("cases.json")).unwrap()).unwrap();
    let cases = cases["cases"].as_array().unwrap();
    let dir = std::env::temp_dir().join(format!("tpgrpo-cli-score-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prompts = dir.join("prompts.jsonl");
    let lines: Vec<String> =
        cases.iter().map(|c| serde_json::json!({"prompt": c["prompt"]}).to_string()).collect();
    std::fs::write(&prompts, lines.join("\n") + "\n").unwrap();
    let mut args = vec![
        "--reward".to_string(),
        format!("pickscore={}", f.join("pickscore").display()),
        "--reward".to_string(),
        format!("clipscore={}:2", f.join("clip").display()),
        "--prompts".to_string(),
        prompts.display().to_string(),
        "--images".to_string(),
    ];
    args.extend(
        cases
            .iter()
            .map(|c| f.join("images").join(c["image"].as_str().unwrap()).display().to_string()),
    );
    let o = score(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for (row, case) in out["scores"].as_array().unwrap().iter().zip(cases) {
        let (p, c) = (case["pickscore"].as_f64().unwrap(), case["clipscore"].as_f64().unwrap());
        assert!((row["terms"]["pickscore"].as_f64().unwrap() - p).abs() < 5e-4, "{row}");
        assert!((row["terms"]["clipscore"].as_f64().unwrap() - c).abs() < 5e-4, "{row}");
        assert!((row["score"].as_f64().unwrap() - (p + 2.0 * c)).abs() < 1.5e-3, "{row}");
    }
}

#[test]
fn bad_input_is_named() {
    let f = fixtures();
    let image = f.join("images/img0_32x32.png").display().to_string();
    let dir = std::env::temp_dir().join(format!("tpgrpo-cli-score-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let three = dir.join("two.txt");
    std::fs::write(&three, "a\nb\nc\n").unwrap();
    let one = dir.join("one.txt");
    std::fs::write(&one, "a\n").unwrap();
    let pick = format!("pickscore={}", f.join("pickscore").display());
    let cases: [(Vec<String>, &str); 4] = [
        (
            vec![pick.clone(), three.display().to_string(), image.clone(), image.clone()],
            "3 prompts for 2 images",
        ),
        (
            vec!["pickscore=/no/such".into(), one.display().to_string(), image.clone()],
            "/no/such: no such folder",
        ),
        (
            vec!["colour=/x".into(), one.display().to_string(), image.clone()],
            "unknown reward kind `colour`",
        ),
        (
            vec![pick.clone(), one.display().to_string(), "/no/such.png".into()],
            "/no/such.png: cannot read the image",
        ),
    ];
    for (parts, want) in cases {
        let mut args = vec![
            "--reward".into(),
            parts[0].clone(),
            "--prompts".into(),
            parts[1].clone(),
            "--images".into(),
        ];
        args.extend(parts[2..].iter().cloned());
        let o = score(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(want), "{want}: {err}");
    }
}

/// A PNG whose header declares `width x height` 1-bit grey pixels, with one empty data chunk.
fn png_header_only(width: u32, height: u32) -> Vec<u8> {
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
            }
        }
        !crc
    }
    let chunk = |kind: &[u8], data: &[u8]| {
        let mut c = (data.len() as u32).to_be_bytes().to_vec();
        let body: Vec<u8> = kind.iter().chain(data).copied().collect();
        c.extend(&body);
        c.extend(crc32(&body).to_be_bytes());
        c
    };
    let mut ihdr = width.to_be_bytes().to_vec();
    ihdr.extend(height.to_be_bytes());
    ihdr.extend([1, 0, 0, 0, 0]);
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend(chunk(b"IHDR", &ihdr));
    png.extend(chunk(b"IDAT", &[]));
    png.extend(chunk(b"IEND", &[]));
    png
}

/// Images are bounded before decoding (issue 39, item 4): a PNG of 100 bytes declaring
/// 23000 x 23000 1-bit pixels (8.3 GB once expanded to f32 RGB, which `score` used to reach)
/// is refused from its header, naming the file, before any reward loads.
#[test]
fn an_image_declaring_too_many_pixels_is_refused_before_decoding() {
    let dir = crate::common::scratch("score-huge");
    let big = dir.join("big.png");
    std::fs::write(&big, png_header_only(23000, 23000)).unwrap();
    std::fs::write(dir.join("p.txt"), "a red circle\n").unwrap();
    let o = score(&[
        "--reward".into(),
        "toy-geneval".into(),
        "--prompts".into(),
        dir.join("p.txt").display().to_string(),
        "--images".into(),
        big.display().to_string(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("big.png") && err.contains("declares 23000 x 23000 pixels"), "{err}");
    let e = tpgrpo::image::Image::decode(&png_header_only(23000, 23000)).unwrap_err();
    assert!(e.to_string().contains("declares 23000 x 23000"), "{e}");
}

/// What the reward reads of a prompt is checked at its `file:line` before any image is scored
/// (issue 39, item 6): a toy scene whose position names a later group.
#[test]
fn prompt_metadata_the_reward_reads_is_checked_at_its_line() {
    let dir = crate::common::scratch("score-metadata");
    let bad = r#"{"prompt": "two", "tag": "position", "include": [{"class": "circle", "color": "red", "count": 1}, {"class": "square", "color": "blue", "count": 1, "position": ["above", 5]}]}"#;
    std::fs::write(dir.join("p.jsonl"), format!("{bad}\n")).unwrap();
    let image = fixtures().join("images/img0_32x32.png").display().to_string();
    let o = score(&[
        "--reward".into(),
        "toy-geneval".into(),
        "--prompts".into(),
        dir.join("p.jsonl").display().to_string(),
        "--images".into(),
        image,
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("p.jsonl:1:") && err.contains("position"), "{err}");
}
