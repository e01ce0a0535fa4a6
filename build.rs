//! With the `tch` feature: records the `lib` folder of the LibTorch that torch-sys linked as the
//! run path of this package's binaries, tests, examples and benches, so that they start on the
//! machine that built them without `LD_LIBRARY_PATH` (which still wins elsewhere: the path is a
//! RUNPATH). Without `tch` it does nothing.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_TCH").is_none() {
        return;
    }
    // torch-sys (`links = "tch"`, a direct dependency under `tch`) publishes its lib folder.
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB");
    let unix = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os != "windows");
    if let (Ok(lib), true) = (lib, unix) {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
