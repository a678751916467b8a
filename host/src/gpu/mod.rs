//! The GPU side of the host program, on `cust`, layered like cudarc:
//! - `ffi`: the few driver declarations cust 0.3.2 lacks;
//! - `driver`: one checked function per driver call (all of the GPU's `unsafe`);
//! - `allocations`: RAII owners of device, mapped and pinned memory;
//! - `context`: a GPU with its context, the embedded kernels and a stream;
//! - `capabilities`: what the GPU offers for RDMA (for `host info` and `--mem auto`);
//! - `sources`: the sender's and receiver's buffers in GPU-reachable memory;
//! - `checksum`: the CRC32C of each chunk of GPU memory, by the `crc32c_chunks` kernel.
//!
//! # Soundness: the GPU's promises
//!
//! (The rest are in [`crate::soundness`]; each `compile_fail` example must not compile.)
//!
//! ## No slice over page-locked memory a peer may write
//!
//! ```no_run
//! use host::gpu::{allocations::PinnedHostBuffer, Gpu};
//! use host::rdma::{MemoryRegion, ProtectionDomain};
//! fn read(gpu: &std::rc::Rc<Gpu>, pd: &std::rc::Rc<ProtectionDomain>) {
//!     let ring = PinnedHostBuffer::new(gpu, 64).unwrap();
//!     // SAFETY: (not run) dropped below, before the ring; no reference reads it.
//!     let mr = unsafe { MemoryRegion::register_remote_writable(pd, &ring) }.unwrap();
//!     let mut copy = vec![0u8; 64];
//!     ring.read_at(0, &mut copy).unwrap(); // a copy: fine while the peer may write
//!     drop(mr);
//! }
//! ```
//!
//! ```compile_fail,E0502
//! use host::gpu::{allocations::PinnedHostBuffer, Gpu};
//! use host::rdma::{MemoryRegion, ProtectionDomain};
//! fn read(gpu: &std::rc::Rc<Gpu>, pd: &std::rc::Rc<ProtectionDomain>) {
//!     let mut ring = PinnedHostBuffer::new(gpu, 64).unwrap();
//!     // SAFETY: (not run) the point is that it does not compile.
//!     let mr = unsafe { MemoryRegion::register_remote_writable(pd, &ring) }.unwrap();
//!     let bytes: &[u8] = ring.as_bytes(); // page-locked memory the peer may write: refused
//!     drop(mr);
//!     let _ = bytes;
//! }
//! ```
//!
//! ## Safe code runs no device code but this crate's kernels
//!
//! The launches check memory against the embedded kernels' contract, so loading other PTX
//! is `unsafe`: safe code could otherwise run any device code on memory it does not own.
//!
//! ```compile_fail,E0133
//! use host::gpu::Gpu;
//! let gpu = Gpu::open_with_ptx(0, ".version 8.0\n.target sm_90\n.address_size 64\n");
//! ```
//!
//! ```no_run
//! use host::gpu::Gpu;
//! let gpu = Gpu::open(0).unwrap(); // the kernels this build embeds
//! ```
//!
//! ## Buffers of one GPU are not used with another
//!
//! Every buffer holds the `Rc<Gpu>` it was allocated with; a launch checks that it is its
//! own GPU's (a run-time check: both are the same type), and every driver call binds that
//! GPU's context first, whatever context other code left current. `tests/tests/gpu.rs`
//! shows both on a GPU (`a_buffer_of_another_gpu_is_refused`,
//! `another_current_context_does_not_redirect_allocations_or_launches`).
//!
//! ## An upload is not read before its copies land
//!
//! Copies into an upload's device memory are queued only inside `DeviceUpload::fill`,
//! which returns once every one has landed, and `DeviceUpload::memory` refuses while any
//! may still be running (shown on a GPU by `an_upload_is_not_readable_before_its_copies_land`:
//! four writers, verified the moment `fill` returns).
//!
//! ## A slot writer never leaves its fill
//!
//! A [`SlotWriter`](upload::SlotWriter)`<'f>` lends slots of its upload's page-locked
//! ring; `'f` is chosen by each call of `fill` for its own writers, so a writer cannot be
//! swapped into a nested fill of another upload (and then used after that upload is
//! dropped, writing freed page-locked memory) nor stored outside its closure.
//!
//! ```no_run
//! use host::gpu::{upload::DeviceUpload, Gpu};
//! fn nested(a: &mut DeviceUpload) {
//!     let t = std::time::Duration::from_secs(1);
//!     a.fill(1, t, |_, outer| {
//!         // A writer thread may run an upload of its own, with a GPU of its own.
//!         let gpu = Gpu::open(0).map_err(|e| e.to_string())?;
//!         let mut b = DeviceUpload::new(&gpu, 4096, 4096, 1).map_err(|e| e.to_string())?;
//!         b.fill(1, t, |_, inner| inner.write_at(0, 4, |bytes| Ok(bytes.fill(2))))?;
//!         outer.write_at(0, 4, |bytes| Ok(bytes.fill(1)))
//!     })
//!     .unwrap();
//! }
//! ```
//!
//! ```compile_fail
//! use host::gpu::{upload::DeviceUpload, Gpu};
//! use std::sync::Mutex;
//! fn nested(a: &mut DeviceUpload) {
//!     let t = std::time::Duration::from_secs(1);
//!     a.fill(1, t, |_, outer| {
//!         let gpu = Gpu::open(0).map_err(|e| e.to_string())?;
//!         let mut b = DeviceUpload::new(&gpu, 4096, 4096, 1).map_err(|e| e.to_string())?;
//!         let outer = Mutex::new(outer);
//!         b.fill(1, t, |_, inner| {
//!             // Trade writers between the fills: refused (their brands differ).
//!             std::mem::swap(&mut **outer.lock().unwrap(), inner);
//!             Ok(())
//!         })?;
//!         drop(b); // the inner upload's ring is freed, and `outer` would now lend it
//!         outer.into_inner().unwrap().write_at(0, 4, |bytes| Ok(bytes.fill(1)))
//!     })
//!     .unwrap();
//! }
//! ```

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
pub mod verify;

pub use context::{Gpu, GpuError, KERNELS_PTX};
pub use verify::GpuCheck;
