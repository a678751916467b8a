//! `host gpu-check` and `host bench gpu`: the GPU half on its own.

use anyhow::Result;
use host::cli::GpuCheckArgs;
use std::process::ExitCode;

#[cfg(feature = "cuda")]
pub fn check(args: &GpuCheckArgs) -> Result<ExitCode> {
    use super::output::{values_line, verification_words};
    use host::units::format_bytes;

    let size = usize::try_from(args.size)?;
    let report = host::gpu::check::run(args.gpu, size, args.mem)?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({ "ok": report.ok(), "report": report })
        );
    } else {
        let memory = match args.mem {
            host::memory_path::CheckMemory::Mapped => "GPU-mapped host memory",
            host::memory_path::CheckMemory::Device => "device memory",
        };
        println!(
            "{}: generate_data wrote {} into {memory} in {:.3} ms (launch + synchronise)",
            report.gpu,
            format_bytes(report.bytes as u64),
            report.kernel_ms
        );
        println!("{}", values_line(&report.first_values));
        println!("CPU check: {}", verification_words(&report.cpu));
        if let Some(bad) = report.gpu_mismatches {
            println!("GPU check (verify_data kernel): {bad} mismatches");
        }
    }
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(feature = "cuda")]
pub fn bench(gpu: u32) -> Result<ExitCode> {
    let report = host::gpu::bench::run(gpu)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(ExitCode::SUCCESS)
}

#[cfg(not(feature = "cuda"))]
const NO_CUDA: &str =
    "this build has no GPU support: rebuild with the default `cuda` feature (cargo build -p host)";

#[cfg(not(feature = "cuda"))]
pub fn check(_args: &GpuCheckArgs) -> Result<ExitCode> {
    anyhow::bail!(NO_CUDA)
}

#[cfg(not(feature = "cuda"))]
pub fn bench(_gpu: u32) -> Result<ExitCode> {
    anyhow::bail!(NO_CUDA)
}
