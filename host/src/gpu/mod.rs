//! The GPU side of the host program, on `cust`, layered like cudarc:
//! - `ffi`: the few driver declarations cust 0.3.2 lacks;
//! - `driver`: one checked function per driver call (all of the GPU's `unsafe`);
//! - `allocations`: RAII owners of device, mapped and pinned memory;
//! - `context`: a GPU with its context, the embedded kernels and a stream;
//! - `capabilities`: what the GPU offers for RDMA (for `host info` and `--mem auto`);
//! - `sources`: the sender's and receiver's buffers in GPU-reachable memory;
//! - `checksum`: the CRC32C of each chunk of GPU memory, by the `crc32c_chunks` kernel.

pub mod allocations;
pub mod bench;
pub mod capabilities;
pub mod check;
pub mod checksum;
pub mod context;
pub mod driver;
mod ffi;
pub mod sources;
pub mod upload;

pub use context::{Gpu, GpuCheck, KERNELS_PTX};
