//! Compile `gpu-kernels` to PTX at build time, as `host/build.rs` does, and leave it in
//! OUT_DIR for `print_ptx.rs` to embed.

use std::path::PathBuf;

fn main() {
    // The same kernels and architecture as the host build, so the PTX printed here is
    // the PTX the host program loads.
    let builder = ptx_builder::PtxBuilder::new("../../gpu-kernels")
        .arch("sm_70")
        .kernels(["generate_data", "verify_data"]);
    // Rebuild when a kernel source changes (cargo cannot see through the nested build).
    for source in builder.sources() {
        println!("cargo:rerun-if-changed={}", source.display());
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    match builder.build(&out_dir) {
        Ok(ptx) => {
            std::fs::copy(&ptx, out_dir.join("kernels.ptx")).expect("copy the PTX into OUT_DIR");
        }
        Err(e) => {
            // One line saying which step failed (a missing nightly component, llc...).
            eprintln!("error: building the GPU kernels to PTX: {e}");
            std::process::exit(1);
        }
    }
}
