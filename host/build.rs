//! Two jobs: give `src/gpu/context.rs` the kernels' PTX in OUT_DIR (it embeds it with
//! `include_str!`), and describe this build for `host --version` (the git commit and the
//! features built in).
//!
//! The PTX comes from one of two places (`HOST_PTX` picks; by default the first that
//! this toolchain can do):
//! - `built`: `ptx-builder` compiles `gpu-kernels` with the workspace's pinned nightly
//!   and its `llvm-tools` (what every build in this workspace does);
//! - `kept`: `gpu-kernels/ptx/kernels.ptx`, the same PTX kept in the repository, used
//!   only while its digest file still names the kernels' sources. A crate of a user's
//!   own on stable Rust depends on `host` with GPU support this way: stable cannot build
//!   PTX (no `-Zbuild-std`, no `llvm-tools`). CI proves the kept file byte-identical to a
//!   fresh build (`tests/kept-ptx.sh check`); `tests/kept-ptx.sh update` makes it anew.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The kernels the host launches; the builder checks each one is in the PTX.
const KERNELS: [&str; 3] = ["generate_data", "verify_data", "crc32c_chunks"];

/// The kept PTX and the digest of the sources it was built from, beside the kernels.
const KEPT_PTX: &str = "../gpu-kernels/ptx/kernels.ptx";
const KEPT_DIGEST: &str = "../gpu-kernels/ptx/kernels.ptx.sources-sha256";

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
    println!("cargo:rerun-if-changed={KEPT_PTX}");
    println!("cargo:rerun-if-changed={KEPT_DIGEST}");
    println!("cargo:rerun-if-env-changed=HOST_PTX");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let digest = builder
        .source_digest()
        .unwrap_or_else(|e| fail(&format!("reading the GPU kernels' sources: {e}")));
    std::fs::write(
        out_dir.join("kernels.ptx.sources-sha256"),
        format!("{digest}\n"),
    )
    .expect("write the digest into OUT_DIR");
    let mode = std::env::var("HOST_PTX").unwrap_or_default();
    // Ok: build the PTX here; Err: use the kept copy, and why not built (for its error).
    let build: Result<(), String> = match mode.as_str() {
        "built" => Ok(()),
        "kept" => Err("HOST_PTX=kept".to_string()),
        "" | "auto" => ptx_builder::PtxBuilder::toolchain_can_build().map_err(|e| e.to_string()),
        other => fail(&format!(
            "HOST_PTX={other}: expected `built`, `kept` or `auto`"
        )),
    };
    match build {
        Ok(()) => {
            let ptx = builder
                .build(&out_dir)
                .unwrap_or_else(|e| fail(&format!("building the GPU kernels to PTX: {e}")));
            std::fs::copy(&ptx, out_dir.join("kernels.ptx")).expect("copy the PTX into OUT_DIR");
            warn_if_kept_is_stale(&ptx, &digest);
        }
        Err(why_not_built) => use_kept(&out_dir, &digest, &why_not_built),
    }
}

/// Copy the kept PTX into OUT_DIR, if it is still the sources'.
fn use_kept(out_dir: &Path, digest: &str, why_not_built: &str) {
    let kept = std::fs::read_to_string(KEPT_DIGEST).unwrap_or_default();
    if kept.trim() != digest {
        fail(&format!(
            "the GPU kernels' sources have changed since gpu-kernels/ptx/kernels.ptx was made \
             (sources {}, kept PTX of {}), and this build cannot make PTX ({why_not_built}): \
             build with the pinned nightly, or run `tests/kept-ptx.sh update`",
            &digest[..12],
            kept.trim().get(..12).unwrap_or("none")
        ));
    }
    std::fs::copy(KEPT_PTX, out_dir.join("kernels.ptx"))
        .unwrap_or_else(|e| fail(&format!("copying {KEPT_PTX}: {e}")));
}

/// A developer who changed a kernel gets a reminder that the kept copy is behind (CI's
/// `tests/kept-ptx.sh check` fails until it is made anew).
fn warn_if_kept_is_stale(built: &Path, digest: &str) {
    let kept_digest = std::fs::read_to_string(KEPT_DIGEST).unwrap_or_default();
    let same_bytes = std::fs::read(built).ok() == std::fs::read(KEPT_PTX).ok();
    if kept_digest.trim() != digest || !same_bytes {
        println!(
            "cargo:warning=gpu-kernels/ptx/kernels.ptx is not this build's PTX: run \
             `tests/kept-ptx.sh update` and commit it (crates on stable Rust use the kept copy)"
        );
    }
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(1);
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
