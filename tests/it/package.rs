//! The package's metadata against the dependency tree it builds with.

use std::process::Command;

fn version(s: &str) -> Vec<u64> {
    s.split('.').map(|p| p.parse().expect("numeric rust-version")).collect()
}

/// `rust-version` is at least every locked dependency's on this host (from `cargo metadata`,
/// the host's platform only), so a toolchain it admits can build the crate. Not `--offline`:
/// the optional backends' crates (cuda, wgpu, tch) are not in a fresh machine's cache after
/// `cargo test`, and cargo fetches them from the registry as the build fetched the others.
#[test]
fn rust_version_covers_every_dependency() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let rustc = Command::new("rustc").arg("-vV").output().expect("rustc runs");
    let info = String::from_utf8(rustc.stdout).unwrap();
    let host = info.lines().find_map(|l| l.strip_prefix("host: ")).expect("rustc names its host");
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked", "--filter-platform", host])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let resolved: Vec<&str> = meta["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    let packages = meta["packages"].as_array().unwrap();
    let ours = packages.iter().find(|p| p["name"] == "tpgrpo").expect("this package");
    let ours = version(ours["rust_version"].as_str().expect("rust-version is set"));
    let mut needing_more = Vec::new();
    for p in packages.iter().filter(|p| resolved.contains(&p["id"].as_str().unwrap())) {
        if let Some(v) = p["rust_version"].as_str() {
            if version(v) > ours {
                needing_more.push(format!("{} {} needs {v}", p["name"], p["version"]));
            }
        }
    }
    assert!(needing_more.is_empty(), "rust-version {ours:?} is too low: {needing_more:?}");
}
