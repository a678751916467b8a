//! The buffers the NIC reads from (sender) and writes into (receiver), whatever memory
//! they live in. The transfer code sees only these two traits, so it is the same for
//! host memory, GPU-mapped host memory, GPU memory read directly by the NIC (GPUDirect
//! RDMA) and GPU memory staged through host memory.

pub mod factory;
pub mod host_buffer;
pub mod select;

pub use factory::{make_send_source, GpuSelection, SinkFactory, SourceConfig};
pub use host_buffer::HostBuffer;
pub use select::CheckMemory;

use anyhow::Result;
use std::os::fd::RawFd;
use std::time::Instant;

/// How the RDMA layer must register a buffer with the NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    /// Ordinary (or page-locked) host memory: `ibv_reg_mr` on a CPU address.
    Host { addr: *mut u8, len: usize },
    /// GPU memory exported as a dma-buf: `ibv_reg_dmabuf_mr(fd, offset, len, iova)`.
    /// `iova` is the address work requests use for the region (the GPU address).
    DmaBuf {
        fd: RawFd,
        offset: u64,
        len: usize,
        iova: u64,
    },
    /// GPU memory by its device address: `ibv_reg_mr` on it, which works only where the
    /// nvidia-peermem kernel module lets the NIC driver pin GPU pages.
    DeviceAddress { addr: u64, len: usize },
}

impl Registration {
    pub fn len(&self) -> usize {
        match *self {
            Registration::Host { len, .. }
            | Registration::DmaBuf { len, .. }
            | Registration::DeviceAddress { len, .. } => len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The address a work request uses for byte 0 of the region.
    pub fn base_address(&self) -> u64 {
        match *self {
            Registration::Host { addr, .. } => addr as u64,
            Registration::DmaBuf { iova, .. } => iova,
            Registration::DeviceAddress { addr, .. } => addr,
        }
    }
}

/// The road the bytes take between memory and the wire, named truthfully for output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DataPath {
    /// The CPU wrote the pattern into host memory (`--gpu none`, or no GPU found).
    HostMemory,
    /// The GPU kernel wrote into page-locked host memory mapped into the GPU; the NIC
    /// reads host memory. Not GPUDirect RDMA.
    GpuMappedHostMemory,
    /// The NIC reads (or writes) GPU memory directly: GPUDirect RDMA.
    GpuDirectRdma,
    /// The GPU's memory is copied chunk by chunk into registered host memory, overlapped
    /// with the sends.
    StagedThroughHostMemory,
}

impl DataPath {
    /// The words used in "Data sent successfully via ...".
    pub fn describe(self) -> &'static str {
        match self {
            DataPath::HostMemory => "RDMA from host memory (pattern written by the CPU)",
            DataPath::GpuMappedHostMemory => "RDMA from GPU-mapped host memory",
            DataPath::GpuDirectRdma => "GPUDirect RDMA",
            DataPath::StagedThroughHostMemory => "RDMA from host memory staged from GPU memory",
        }
    }
}

/// The sender's data, already generated, ready for the NIC.
pub trait SendSource {
    /// Bytes to send.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The memory to register once, before the first work request.
    fn registration(&self) -> Registration;

    /// How many chunks may be posted and not yet completed, if this source limits it
    /// (a staging ring has a fixed number of slots).
    fn max_chunks_in_flight(&self) -> Option<usize> {
        None
    }

    /// Make the bytes `[offset, offset + len)` of the data available in the registered
    /// region and return the address a work request must use for them. A staged source
    /// waits here (until `deadline`) for the copy of that chunk.
    fn prepare_chunk(&mut self, offset: usize, len: usize, deadline: Instant) -> Result<u64>;

    /// The NIC has finished reading the chunk that starts at `offset`.
    fn release_chunk(&mut self, _offset: usize) {}

    /// The first few elements, read back for the user (`First 5 values: ...`).
    fn first_values(&self, count: usize) -> Result<Vec<i32>>;

    fn path(&self) -> DataPath;
}

/// What the receiver found when it checked the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Verification {
    /// Elements compared.
    pub elements: u64,
    /// Elements that differ from the pattern.
    pub mismatches: u64,
    /// The lowest index of a mismatch.
    pub first_mismatch: Option<u64>,
    /// CRC-32 (IEEE) of the bytes, where the receiver could compute it on the CPU.
    pub crc32: Option<u32>,
}

impl Verification {
    pub fn ok(&self) -> bool {
        self.mismatches == 0
    }
}

/// The receiver's buffer.
pub trait RecvSink {
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The memory to register; it is the only remotely writable memory of a connection.
    fn registration(&self) -> Registration;

    /// Check the first `len` bytes against the pattern (element `i` = `pattern::value(i)`).
    fn verify(&mut self, len: usize) -> Result<Verification>;

    /// Up to `count` leading elements, for the user.
    fn first_values(&self, count: usize) -> Result<Vec<i32>>;

    fn path(&self) -> DataPath;
}
