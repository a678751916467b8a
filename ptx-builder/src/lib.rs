//! Compile a `no_std` Rust crate into one PTX file, from a build script.
//!
//! Rust-CUDA's `cuda_builder` drives NVIDIA's NVVM through a codegen backend that needs
//! LLVM 7; this builder uses what every nightly ships instead: rustc's own
//! `nvptx64-nvidia-cuda` target and LLVM's NVPTX backend. The steps, each a plain tool:
//!
//! 1. `cargo build --target nvptx64-nvidia-cuda -Zbuild-std=core` with
//!    `--emit=llvm-bc,link`: LLVM bitcode for the kernel crate and for `core` (no prebuilt
//!    `core` exists for this target, so it is built from the `rust-src` component);
//! 2. `llvm-link` the crate's and `core`'s bitcode into one module, so calls into `core`
//!    (panics from bounds checks, for instance) resolve instead of staying externs;
//! 3. `opt` internalizes everything but the kernel entry points, drops the dead code and
//!    optimizes (`default<O3>`);
//! 4. `llc` lowers the module to PTX text.
//!
//! `llvm-link`, `opt` and `llc` come with the toolchain's `llvm-tools` component.
//!
//! ```no_run
//! // in build.rs
//! let ptx = ptx_builder::PtxBuilder::new("../gpu-kernels")
//!     .arch("sm_70")
//!     .kernels(["generate_data"])
//!     .build(std::path::Path::new(&std::env::var("OUT_DIR").unwrap()))
//!     .unwrap_or_else(|e| panic!("{e}"));
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The rustc target that produces PTX.
pub const TARGET: &str = "nvptx64-nvidia-cuda";

/// Builds the PTX of one kernel crate. See the crate docs for the pipeline.
#[derive(Debug, Clone)]
pub struct PtxBuilder {
    crate_dir: PathBuf,
    arch: String,
    kernels: Vec<String>,
}

/// What went wrong, with what to do about it.
#[derive(Debug)]
pub enum BuildError {
    /// A tool could not be started at all.
    Spawn {
        tool: String,
        error: std::io::Error,
    },
    /// A tool ran and failed; `output` is what it printed.
    Failed {
        step: String,
        output: String,
    },
    /// A component of the toolchain is missing.
    MissingComponent {
        what: String,
        fix: String,
    },
    /// The PTX was produced but lacks an entry point that was asked for.
    MissingEntry {
        kernel: String,
        ptx: PathBuf,
    },
    Io(std::io::Error),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Spawn { tool, error } => write!(f, "could not run {tool}: {error}"),
            BuildError::Failed { step, output } => write!(f, "{step} failed:\n{output}"),
            BuildError::MissingComponent { what, fix } => write!(f, "{what} is missing: {fix}"),
            BuildError::MissingEntry { kernel, ptx } => {
                write!(f, "{} has no `.entry {kernel}`: is it `#[no_mangle] pub unsafe extern \"ptx-kernel\"`?", ptx.display())
            }
            BuildError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for BuildError {}

impl From<std::io::Error> for BuildError {
    fn from(e: std::io::Error) -> Self {
        BuildError::Io(e)
    }
}

impl PtxBuilder {
    /// A builder for the crate at `crate_dir` (relative paths are taken from the current
    /// directory, which in a build script is the package's own directory).
    pub fn new(crate_dir: impl AsRef<Path>) -> Self {
        PtxBuilder {
            crate_dir: crate_dir.as_ref().to_path_buf(),
            arch: "sm_70".into(),
            kernels: Vec::new(),
        }
    }

    /// The virtual architecture the PTX is written for (`.target`); the driver compiles
    /// it for the real GPU at load time, so an older arch runs on newer GPUs.
    pub fn arch(mut self, arch: impl Into<String>) -> Self {
        self.arch = arch.into();
        self
    }

    /// The kernel entry points to keep; everything else is internalized and may vanish.
    pub fn kernels<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.kernels = names.into_iter().map(Into::into).collect();
        self
    }

    /// The files whose change should rebuild the PTX (for `cargo:rerun-if-changed`).
    pub fn sources(&self) -> Vec<PathBuf> {
        vec![
            self.crate_dir.join("src"),
            self.crate_dir.join("Cargo.toml"),
        ]
    }

    /// The SHA-256, in hex, of what the PTX is built from: every file under the crate's
    /// `src/` and its `Cargo.toml` (each as its path relative to the crate, then its
    /// length and bytes, in path order), the architecture and the kernel names. A PTX
    /// file kept beside the sources is named by it, so a build that cannot make PTX can
    /// tell whether the kept one is still the sources' (host/build.rs).
    pub fn source_digest(&self) -> Result<String, BuildError> {
        use sha2::{Digest, Sha256};
        let mut files = Vec::new();
        collect_files(&self.crate_dir.join("src"), &mut files)?;
        files.push(self.crate_dir.join("Cargo.toml"));
        let mut named: Vec<(String, PathBuf)> = files
            .into_iter()
            .map(|f| {
                let rel = f.strip_prefix(&self.crate_dir).unwrap_or(&f);
                (rel.to_string_lossy().replace('\\', "/"), f)
            })
            .collect();
        named.sort();
        let mut hash = Sha256::new();
        for (rel, path) in named {
            let bytes = std::fs::read(&path)?;
            hash.update(rel.as_bytes());
            hash.update([0]);
            hash.update((bytes.len() as u64).to_le_bytes());
            hash.update(&bytes);
        }
        hash.update(format!(
            "arch={}\0kernels={}",
            self.arch,
            self.kernels.join(",")
        ));
        Ok(hash.finalize().iter().map(|b| format!("{b:02x}")).collect())
    }

    /// Whether the toolchain running this build can make PTX at all: a nightly (for
    /// `-Zbuild-std`) with the `llvm-tools` component. Stable cannot, which is why a
    /// dependent crate on stable uses the PTX kept beside the sources.
    pub fn toolchain_can_build() -> Result<(), BuildError> {
        let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
        let version =
            Command::new(&rustc)
                .arg("-V")
                .output()
                .map_err(|error| BuildError::Spawn {
                    tool: "rustc".into(),
                    error,
                })?;
        let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
        if !version.contains("nightly") {
            return Err(BuildError::MissingComponent {
                what: format!("a nightly toolchain for -Zbuild-std ({version} is not one)"),
                fix: "build with the workspace's pinned nightly (rust-toolchain.toml)".into(),
            });
        }
        LlvmTools::find().map(|_| ())
    }

    /// Build into `out_dir` and return the path of `<crate name>.ptx` there.
    pub fn build(&self, out_dir: &Path) -> Result<PathBuf, BuildError> {
        let tools = LlvmTools::find()?;
        let target_dir = out_dir.join("ptx-target");
        self.cargo_build(&target_dir)?;

        let deps = target_dir.join(TARGET).join("release").join("deps");
        let crate_name = self.crate_name()?;
        let kernel_bc = newest_bitcode(&deps, &crate_name)?;
        let core_bc = newest_bitcode(&deps, "core")?;

        let linked = out_dir.join(format!("{crate_name}.linked.bc"));
        run(
            "llvm-link",
            Command::new(&tools.llvm_link)
                .arg(&kernel_bc)
                .arg(&core_bc)
                .arg("-o")
                .arg(&linked),
        )?;

        let optimized = out_dir.join(format!("{crate_name}.opt.bc"));
        run(
            "opt",
            Command::new(&tools.opt)
                .arg("-passes=internalize,globaldce,default<O3>")
                .arg(format!(
                    "-internalize-public-api-list={}",
                    self.kernels.join(",")
                ))
                .arg(&linked)
                .arg("-o")
                .arg(&optimized),
        )?;

        let ptx = out_dir.join(format!("{crate_name}.ptx"));
        run(
            "llc",
            Command::new(&tools.llc)
                .arg(format!("-mtriple={TARGET}"))
                .arg(format!("-mcpu={}", self.arch))
                .arg(&optimized)
                .arg("-o")
                .arg(&ptx),
        )?;

        let text = std::fs::read_to_string(&ptx)?;
        for kernel in &self.kernels {
            if !has_entry(&text, kernel) {
                return Err(BuildError::MissingEntry {
                    kernel: kernel.clone(),
                    ptx,
                });
            }
        }
        Ok(ptx)
    }

    fn cargo_build(&self, target_dir: &Path) -> Result<(), BuildError> {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.arg("build")
            .arg("--release")
            .arg("--target")
            .arg(TARGET)
            .arg("-Zbuild-std=core")
            .arg("--manifest-path")
            .arg(self.crate_dir.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(target_dir)
            .env(
                "RUSTFLAGS",
                format!("--emit=llvm-bc,link -C target-cpu={}", self.arch),
            );
        // The outer build's settings are for the host: its flags, wrappers (clippy's
        // driver, sccache) and target dir must not leak into the device build.
        for var in [
            "CARGO_ENCODED_RUSTFLAGS",
            "RUSTC_WRAPPER",
            "RUSTC_WORKSPACE_WRAPPER",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_TARGET",
            "CARGO_MAKEFLAGS",
        ] {
            cmd.env_remove(var);
        }
        let output = cmd.output().map_err(|error| BuildError::Spawn {
            tool: "cargo".into(),
            error,
        })?;
        if output.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        if stderr.contains("rust-src") || stderr.contains("library/Cargo.lock") {
            return Err(BuildError::MissingComponent {
                what: "the rust-src component (needed by -Zbuild-std)".into(),
                fix: "rustup component add rust-src".into(),
            });
        }
        Err(BuildError::Failed {
            step: format!("cargo build --target {TARGET} -Zbuild-std=core"),
            output: stderr,
        })
    }

    fn crate_name(&self) -> Result<String, BuildError> {
        let manifest = std::fs::read_to_string(self.crate_dir.join("Cargo.toml"))?;
        let name = manifest
            .lines()
            .find_map(|l| {
                let (key, value) = l.split_once('=')?;
                (key.trim() == "name").then(|| value.trim().trim_matches('"').to_string())
            })
            .ok_or_else(|| BuildError::Failed {
                step: "reading the kernel crate's Cargo.toml".into(),
                output: "no `name = ...` line".into(),
            })?;
        Ok(name.replace('-', "_"))
    }
}

/// Does `ptx` declare a kernel entry point called `name`?
pub fn has_entry(ptx: &str, name: &str) -> bool {
    ptx.lines().any(|l| {
        l.split_whitespace()
            .skip_while(|w| *w != ".entry")
            .nth(1)
            .is_some_and(|w| w.trim_end_matches('(') == name)
    })
}

/// Every file under `dir`, recursively.
fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), BuildError> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_files(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

/// llvm-link, opt and llc from the active toolchain's `llvm-tools` component.
struct LlvmTools {
    llvm_link: PathBuf,
    opt: PathBuf,
    llc: PathBuf,
}

impl LlvmTools {
    fn find() -> Result<Self, BuildError> {
        let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
        let sysroot = Command::new(&rustc)
            .args(["--print", "sysroot"])
            .output()
            .map_err(|error| BuildError::Spawn {
                tool: "rustc".into(),
                error,
            })?;
        let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
        let host = Command::new(&rustc)
            .args(["--print", "host-tuple"])
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "x86_64-unknown-linux-gnu".into());
        let bin = sysroot.join("lib/rustlib").join(host).join("bin");
        let tool = |name: &str| -> Result<PathBuf, BuildError> {
            let path = bin.join(name);
            if path.is_file() {
                Ok(path)
            } else {
                Err(BuildError::MissingComponent {
                    what: format!("{} (from the llvm-tools component)", path.display()),
                    fix: "rustup component add llvm-tools".into(),
                })
            }
        };
        Ok(LlvmTools {
            llvm_link: tool("llvm-link")?,
            opt: tool("opt")?,
            llc: tool("llc")?,
        })
    }
}

/// The most recently written `<prefix>-<hash>.bc` in `deps` (stale hashes from older
/// builds may sit beside it).
fn newest_bitcode(deps: &Path, prefix: &str) -> Result<PathBuf, BuildError> {
    let wanted = format!("{prefix}-");
    std::fs::read_dir(deps)?
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with(&wanted) && name.ends_with(".bc")
        })
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
        .ok_or_else(|| BuildError::Failed {
            step: "looking for bitcode".into(),
            output: format!("no {wanted}*.bc in {}", deps.display()),
        })
}

fn run(step: &str, cmd: &mut Command) -> Result<(), BuildError> {
    let output = cmd.output().map_err(|error| BuildError::Spawn {
        tool: step.into(),
        error,
    })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(BuildError::Failed {
            step: step.into(),
            output: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_entries_and_only_entries() {
        let ptx = ".visible .entry generate_data(\n\t.param .u64 a\n)\n.func helper(\n";
        assert!(has_entry(ptx, "generate_data"));
        assert!(!has_entry(ptx, "helper"));
        assert!(!has_entry(ptx, "generate"));
    }

    #[test]
    fn reads_the_crate_name_with_underscores() {
        let dir = std::env::temp_dir().join(format!("ptx-builder-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("Cargo.toml"), "[package]\nname = \"my-kernels\"\n").unwrap();
        assert_eq!(PtxBuilder::new(&dir).crate_name().unwrap(), "my_kernels");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn newest_bitcode_ignores_other_crates() {
        let dir = std::env::temp_dir().join(format!("ptx-builder-bc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("core-1.bc"), "").unwrap();
        std::fs::write(dir.join("core_arch-2.bc"), "").unwrap();
        assert_eq!(newest_bitcode(&dir, "core").unwrap(), dir.join("core-1.bc"));
        assert!(newest_bitcode(&dir, "missing").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
