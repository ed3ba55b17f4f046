//! Bakes libtorch's library folder into the binaries' rpath, so that `cargo test` and the
//! `clawback-trainer` binary run without `LD_LIBRARY_PATH`. torch-sys reports the folder to
//! its direct dependents (its `links` key is `tch`) but only uses it for its own C++ shim.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Ok(dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
