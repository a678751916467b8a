//! Two jobs: compile the `gpu-kernels` crate to PTX (see `ptx-builder`) and leave it in
//! OUT_DIR, where `src/gpu/module.rs` embeds it with `include_str!`; and describe this
//! build for `host --version` (the git commit and the features built in).

use std::path::PathBuf;
use std::process::Command;

/// The kernels the host launches; the builder checks each one is in the PTX.
const KERNELS: [&str; 2] = ["generate_data", "verify_data"];

fn main() {
    describe_build();
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

/// `HOST_VERSION` for `host --version`: "0.1.0 (commit 1a2b3c4d5e6f, features: cuda)".
/// The commit is `$HOST_GIT_COMMIT` where a packager sets it, else the one checked out
/// (uncommitted edits are not told apart: that would rerun this script, and the PTX
/// build, on every edit), else "unknown" (a tarball without `.git`): the build never
/// fails for want of git.
fn describe_build() {
    println!("cargo:rerun-if-env-changed=HOST_GIT_COMMIT");
    let commit = match std::env::var("HOST_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => git_commit().unwrap_or_else(|| "unknown, not built from a git checkout".into()),
    };
    let features = if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        "cuda"
    } else {
        "none (built without `cuda`: no GPU support)"
    };
    println!(
        "cargo:rustc-env=HOST_VERSION={} (commit {commit}, features: {features})",
        std::env::var("CARGO_PKG_VERSION").expect("cargo sets CARGO_PKG_VERSION")
    );
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The checkout's commit, and a rerun when it moves.
fn git_commit() -> Option<String> {
    // Only this workspace's own repository: a tarball unpacked inside another checkout
    // must not take that one's commit.
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").ok()?);
    let top = PathBuf::from(git(&["rev-parse", "--show-toplevel"])?);
    if manifest.parent()?.canonicalize().ok()? != top.canonicalize().ok()? {
        return None;
    }
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    // HEAD names the branch; the branch's ref (or packed-refs) moves with every commit,
    // HEAD with every checkout.
    for path in ["HEAD", "packed-refs"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    if let Some(head_ref) = git(&["symbolic-ref", "-q", "HEAD"]) {
        if let Some(p) = git(&["rev-parse", "--git-path", &head_ref]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    Some(commit)
}
