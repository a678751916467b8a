//! CI's compile check of the kernels: the PTX embedded in the host binary has the entry
//! points, uses 16-byte stores (and the CRC kernel 16-byte loads, shared-memory tables
//! and shuffles), and NVIDIA's `ptxas` assembles it for the architectures
//! users run (Turing, Ampere, Hopper). No GPU needed.
#![cfg(feature = "cuda")]

use host::gpu::KERNELS_PTX;
use integration_tests::{skip, workspace_root};
use std::path::PathBuf;
use std::process::Command;

/// Where `tests/setup-env.sh` puts NVIDIA's ptxas, unless `PTXAS` names another.
fn ptxas() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PTXAS") {
        return Some(path.into());
    }
    let bundled = workspace_root().join("target/deps/nvcc/nvidia/cu13/bin/ptxas");
    bundled.is_file().then_some(bundled)
}

#[test]
fn ptx_has_every_kernel_entry_point() {
    for kernel in ["generate_data", "verify_data", "crc32c_chunks"] {
        assert!(
            ptx_builder_has_entry(KERNELS_PTX, kernel),
            "no `.entry {kernel}` in the embedded PTX"
        );
    }
}

fn ptx_builder_has_entry(ptx: &str, name: &str) -> bool {
    ptx.lines().any(|l| {
        l.contains(".entry")
            && l.split_whitespace()
                .any(|w| w.trim_end_matches('(') == name)
    })
}

#[test]
fn kernels_use_16_byte_global_accesses() {
    // The bandwidth target (0.95x cuMemsetD32) needs vector stores; a change that loses
    // them (a misaligned type, a different loop shape) shows up here, not only on a GPU.
    assert!(
        KERNELS_PTX.contains("st.global.v4"),
        "generate_data lost its vector stores"
    );
    assert!(
        KERNELS_PTX.contains("ld.global.v4"),
        "verify_data lost its vector loads"
    );
}

/// The PTX text of one kernel: from its `.entry` line to the next entry (or the end).
fn kernel_text(name: &str) -> &'static str {
    let start = KERNELS_PTX
        .find(&format!(".entry {name}("))
        .unwrap_or_else(|| panic!("no .entry {name}"));
    let rest = &KERNELS_PTX[start..];
    let end = rest[1..].find(".entry").map_or(rest.len(), |i| i + 1);
    &rest[..end]
}

#[test]
fn crc32c_reads_16_bytes_per_lane_and_looks_up_shared_memory() {
    // The kernel's speed rests on coalesced 16-byte loads and on the row tables being in
    // shared memory (one array, declared once: a second declaration would be a second,
    // unfilled copy).
    let crc = kernel_text("crc32c_chunks");
    assert!(
        crc.contains("ld.global.v4"),
        "crc32c_chunks lost its vector loads"
    );
    assert!(
        crc.contains("ld.shared.u32"),
        "crc32c_chunks no longer reads shared memory"
    );
    assert!(
        crc.contains("shfl.sync.bfly"),
        "crc32c_chunks lost its warp shuffles"
    );
    assert_eq!(
        crc.matches(".shared .align 16 .b8 crc32c_row_tables")
            .count(),
        1,
        "the shared row tables must be declared exactly once"
    );
    assert!(
        !crc.contains(".local"),
        "crc32c_chunks uses local memory (a stack)"
    );
}

#[test]
fn ptx_has_no_unresolved_calls_into_core() {
    // Every function the kernels call must be in the module: an `.extern .func` would
    // fail at load time with CUDA_ERROR_INVALID_PTX on the GPU.
    assert!(
        !KERNELS_PTX.contains(".extern .func"),
        "unresolved extern in the PTX"
    );
}

#[test]
fn ptxas_assembles_the_kernels_for_turing_ampere_and_hopper() {
    let Some(ptxas) = ptxas() else {
        let reason = "ptxas not found (run tests/setup-env.sh, or set PTXAS)";
        // CI installs it, so there the check must run, not skip.
        assert!(std::env::var_os("CI").is_none(), "{reason}");
        skip(
            "ptxas_assembles_the_kernels_for_turing_ampere_and_hopper",
            reason,
        );
        return;
    };
    let dir = std::env::temp_dir().join(format!("ptxas-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ptx = dir.join("kernels.ptx");
    std::fs::write(&ptx, KERNELS_PTX).unwrap();
    for arch in ["sm_75", "sm_80", "sm_90"] {
        let cubin = dir.join(format!("kernels.{arch}.cubin"));
        let out = Command::new(&ptxas)
            .arg(format!("-arch={arch}"))
            .arg("-v")
            .arg(&ptx)
            .arg("-o")
            .arg(&cubin)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", ptxas.display()));
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "ptxas -arch={arch} failed:\n{log}");
        assert!(std::fs::metadata(&cubin).unwrap().len() > 0);
        // A streaming kernel needs no stack and no spills; either would cost bandwidth.
        for line in log.lines().filter(|l| l.contains("stack frame")) {
            assert!(
                line.trim() == "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
                "{arch}: {line}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
