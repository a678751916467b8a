//! Compiles the `gpu-kernels` crate to PTX (see `ptx-builder`) and leaves it in OUT_DIR,
//! where `src/gpu/module.rs` embeds it with `include_str!`.

use std::path::PathBuf;

/// The kernels the host launches; the builder checks each one is in the PTX.
const KERNELS: [&str; 3] = ["generate_data", "verify_data", "crc32c_chunks"];

fn main() {
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return; // a build without CUDA needs no PTX
    }
    let builder = ptx_builder::PtxBuilder::new("../gpu-kernels")
        // sm_70 PTX loads on every GPU CUDA 13's driver supports, Volta onwards; the
        // driver compiles it for the GPU at hand when the module is loaded.
        .arch("sm_70")
        .kernels(KERNELS);
    for source in builder.sources() {
        println!("cargo:rerun-if-changed={}", source.display());
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    match builder.build(&out_dir) {
        Ok(ptx) => {
            std::fs::copy(&ptx, out_dir.join("kernels.ptx")).expect("copy the PTX into OUT_DIR");
        }
        Err(e) => {
            eprintln!("error: building the GPU kernels to PTX: {e}");
            std::process::exit(1);
        }
    }
}
