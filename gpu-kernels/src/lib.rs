//! The GPU side of the project, in plain `no_std` Rust.
//!
//! One crate, two builds:
//! - for `nvptx64-nvidia-cuda` (by `ptx-builder`, from `host/build.rs`) it yields the PTX
//!   kernels `generate_data` and `verify_data` (`kernels.rs`);
//! - for the host it is an ordinary library whose [`pattern`] module is the single
//!   definition of the data: the sender's CPU fallback, the receiver's check and the tests
//!   all call the very function the GPU runs; [`indexing`] is the kernels' index
//!   arithmetic and launch grid, tested on the CPU; [`crc32c`] is the arithmetic of the
//!   CRC32C kernel `crc32c_chunks` (tables, the combine rule, the per-row step), which
//!   the host's tests replay against published check values and the `crc32c` crate.
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, stdarch_nvptx, asm_experimental_arch, link_llvm_intrinsics)
)]

pub mod crc32c;
pub mod indexing;
pub mod pattern;

#[cfg(target_arch = "nvptx64")]
mod kernels;
