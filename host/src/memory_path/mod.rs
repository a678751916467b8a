//! Which memory path to use: capabilities in, a plan or a clear refusal out.
//!
//! Apart from [`crate::memory`] (what memory is: the traits a transfer reads and writes
//! through, what a region registers), because it decides from the NIC's probes
//! (`rdma::probe`) while the RDMA wrappers register `memory`'s types: kept in
//! one folder, the two would import each other.
//!
//! This is the one piece of the GPUDirect logic that can be tested anywhere: the
//! registration of GPU memory with a NIC needs real hardware, but the decision of what to
//! try, in what order, and what to say when nothing fits is plain data.
//!
//! [`plan::plan`] (the fallback chain): GPU capabilities, the NIC's probe answers, the
//! GPU-NIC distance and BAR1 in; an ordered list of [`Method`]s to try, with each method
//! left out and why, or a [`Refusal`]. [`walk::walk`] then tries them in order at run
//! time (the sender and the receiver, on each connection's protection domain) and keeps
//! a log of each attempt.

pub mod plan;
pub mod walk;

pub use plan::{plan, Bar1Fit, Direction, LeftOut, Method, NicFacts, PathFacts, Plan};
pub use walk::{walk, Attempt, AttemptLog, NothingWorked, Walked};

use std::fmt;

/// `--mem`: where the data lives when the NIC touches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemKind {
    /// The best path this GPU, driver and NIC allow; the program says which it took.
    Auto,
    /// Plain host memory; the CPU writes the pattern (no GPU involved).
    Host,
    /// Page-locked host memory mapped into the GPU; the kernel writes it over PCIe and
    /// the NIC reads host memory (not GPUDirect RDMA).
    Mapped,
    /// GPU memory registered with the NIC (GPUDirect RDMA: dma-buf, else nvidia-peermem).
    Device,
    /// GPU memory copied chunk by chunk into registered host memory, overlapped with the
    /// sends.
    Staged,
}

/// `host gpu-check --mem`: where the kernel writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckMemory {
    /// Page-locked host memory mapped into the GPU.
    Mapped,
    /// Device memory (`cuMemAlloc`), copied back for the CPU check.
    Device,
}

/// What the GPU and its driver offer, as far as the path choice cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct GpuCapabilities {
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`: GPU memory can be exported as a dma-buf
    /// (open kernel module, Linux 5.12+).
    pub dma_buf: bool,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`.
    pub gpudirect_rdma: bool,
    /// The nvidia-peermem kernel module is loaded, so `ibv_reg_mr` accepts GPU addresses.
    pub peermem_loaded: bool,
    /// `CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY`.
    pub can_map_host_memory: bool,
}

/// How GPU memory gets registered with the NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceRegistration {
    /// `cuMemGetHandleForAddressRange` + `ibv_reg_dmabuf_mr`.
    DmaBuf,
    /// `ibv_reg_mr` on the GPU address, through nvidia-peermem.
    PeerMem,
}

/// Why the asked-for path cannot be had; Display is the one-line error for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refusal {}

/// What is missing for GPUDirect RDMA, in the words a user can act on.
pub fn gpudirect_missing(caps: &GpuCapabilities) -> String {
    let mut missing = Vec::new();
    if !caps.dma_buf {
        missing.push(
            "the driver cannot export GPU memory as dma-buf (that needs NVIDIA's open kernel module, driver r515+, Linux 5.12+)",
        );
    }
    if !caps.peermem_loaded {
        missing.push("the nvidia-peermem kernel module is not loaded");
    }
    format!(
        "GPUDirect RDMA is not available: {}",
        missing.join(", and ")
    )
}

pub(crate) fn mem_name(mem: MemKind) -> &'static str {
    match mem {
        MemKind::Auto => "auto",
        MemKind::Host => "host",
        MemKind::Mapped => "mapped",
        MemKind::Device => "device",
        MemKind::Staged => "staged",
    }
}
