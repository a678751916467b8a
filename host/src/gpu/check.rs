//! `host gpu-check`: generate the data on the GPU, show the first values, and check every
//! element against the CPU's pattern (and, for device memory, with the verify kernel too).
//! The sender's GPU half on its own, for machines without an RDMA device.

use super::allocations::{DeviceBuffer, MappedHostBuffer};
use super::context::Gpu;
use crate::memory::host_buffer::{leading_values, verify_bytes};
use crate::memory::Verification;
use crate::memory_path::CheckMemory;
use anyhow::{bail, Result};
use serde::Serialize;
use std::time::Instant;

#[derive(Debug, Serialize)]
pub struct CheckReport {
    pub gpu: String,
    pub memory: CheckMemory,
    pub bytes: usize,
    pub first_values: Vec<i32>,
    /// Launch + synchronise, as the host saw it.
    pub kernel_ms: f64,
    /// The CPU's element-by-element check against `pattern::value`.
    pub cpu: Verification,
    /// The verify kernel's result (device memory only).
    pub gpu_mismatches: Option<u64>,
}

impl CheckReport {
    pub fn ok(&self) -> bool {
        self.cpu.ok() && self.gpu_mismatches.unwrap_or(0) == 0
    }
}

pub fn run(ordinal: u32, bytes: usize, memory: CheckMemory) -> Result<CheckReport> {
    if bytes == 0 || !bytes.is_multiple_of(4) {
        bail!("size must be a positive multiple of 4 bytes, got {bytes}");
    }
    let gpu = Gpu::open(ordinal)?;
    let (host_bytes, kernel_ms, gpu_mismatches) = match memory {
        CheckMemory::Mapped => {
            let mut buffer = MappedHostBuffer::new(&gpu, bytes)?;
            let started = Instant::now();
            gpu.generate(&mut buffer)?;
            let ms = started.elapsed().as_secs_f64() * 1e3;
            (buffer.as_bytes().to_vec(), ms, None)
        }
        CheckMemory::Device => {
            let mut buffer = DeviceBuffer::new(&gpu, bytes)?;
            let started = Instant::now();
            gpu.generate(&mut buffer)?;
            let ms = started.elapsed().as_secs_f64() * 1e3;
            let on_gpu = gpu.verify(&buffer)?;
            let mut copy = vec![0u8; bytes];
            buffer.read_into(&mut copy)?;
            (copy, ms, Some(on_gpu.mismatches))
        }
    };
    let first_values = leading_values(&host_bytes, 5);
    Ok(CheckReport {
        gpu: format!("GPU {} ({})", gpu.ordinal(), gpu.name()),
        memory,
        bytes,
        first_values,
        kernel_ms,
        cpu: verify_bytes(&host_bytes),
        gpu_mismatches,
    })
}
