//! CRC32C of every chunk of GPU memory, computed on that GPU by the `crc32c_chunks`
//! kernel (gpu-kernels/src/kernels.rs; its arithmetic in gpu-kernels/src/crc32c.rs).
//!
//! The per-chunk result equals [`crate::integrity::chunk_crcs`] (the CPU's hardware
//! CRC32C) over the same bytes: chunk `i` is bytes `[i * chunk, (i + 1) * chunk)`, the last
//! one possibly short. Any byte length and any address work (no alignment needed).

use super::allocations::DeviceBuffer;
use super::context::{Gpu, GpuMemory};
use super::driver;
use anyhow::{bail, ensure, Context as _, Result};
use gpu_kernels::crc32c::{chunk_count, launch_shape, warps_needed, LANES};
use std::os::raw::c_void;
use std::rc::Rc;

/// Threads per block (8 warps): the block shares one 16 KiB copy of the row tables.
pub const CRC_BLOCK_THREADS: u32 = 256;

/// Bytes of a chunk one warp takes: tuned on the H200 (gpu-kernels/TUNING.md).
pub const DEFAULT_PIECE: u64 = 64 << 10;

/// The most blocks one launch asks for; the kernel's warps walk the pieces grid-stride
/// beyond that.
const MAX_BLOCKS: u64 = 1 << 24;

/// The blocks of a launch over `len` bytes with [`CRC_BLOCK_THREADS`] threads each: a
/// warp per piece, at least one block.
pub fn crc_grid(len: u64, chunk: u64, piece: u64) -> u32 {
    crc_grid_of(len, chunk, piece, CRC_BLOCK_THREADS)
}

fn crc_grid_of(len: u64, chunk: u64, piece: u64, block_threads: u32) -> u32 {
    let warps_per_block = (block_threads as usize / LANES) as u64;
    let (chunk, piece) = launch_shape(len, chunk.max(1), piece.max(1));
    warps_needed(len, chunk, piece)
        .div_ceil(warps_per_block)
        .clamp(1, MAX_BLOCKS) as u32
}

/// Queue, on `memory`'s GPU's stream: zero `out`'s first `ceil(len / chunk)` words, then
/// `crc32c_chunks` over `memory` with chunks of `chunk` bytes, each split into pieces of
/// `piece` bytes, one warp each. Returns at once; the CRCs are in `out` once the stream
/// has passed the launch.
///
/// # Safety
/// Until the stream has been synchronised (or an event recorded after the launch has
/// completed), nothing may write `memory`, nothing may read or write `out`, and neither
/// may be freed: the borrows end when this returns, the kernel's reads and writes do not.
pub unsafe fn launch_crc32c_chunks(
    memory: &(impl GpuMemory + ?Sized),
    chunk: u64,
    piece: u64,
    out: &mut DeviceBuffer,
) -> Result<()> {
    // SAFETY: the caller's contract, passed on.
    unsafe { launch_crc32c_chunks_shaped(memory, chunk, piece, CRC_BLOCK_THREADS, out) }
}

/// [`launch_crc32c_chunks`] with blocks of `block_threads` threads (a multiple of 32, at
/// most what the driver allows this kernel: 64 K registers / 72 per thread, so 512 on the
/// H200): the benchmark's tuning variants.
///
/// # Safety
/// As for [`launch_crc32c_chunks`].
#[doc(hidden)]
pub unsafe fn launch_crc32c_chunks_shaped(
    memory: &(impl GpuMemory + ?Sized),
    chunk: u64,
    piece: u64,
    block_threads: u32,
    out: &mut DeviceBuffer,
) -> Result<()> {
    let gpu: &Rc<Gpu> = memory.gpu();
    ensure!(
        block_threads.is_multiple_of(32) && (32..=1024).contains(&block_threads),
        "crc32c_chunks: {block_threads} threads per block is not a whole number of warps up to 1024"
    );
    ensure!(
        chunk > 0,
        "crc32c_chunks: the chunk size must be at least 1 byte"
    );
    check_piece(chunk, piece)?;
    if !Rc::ptr_eq(gpu, GpuMemory::gpu(out)) {
        bail!(
            "crc32c_chunks: the data is GPU {}'s, the output GPU {}'s",
            gpu.ordinal(),
            GpuMemory::gpu(out).ordinal()
        );
    }
    let len = memory.byte_len() as u64;
    let chunks = chunk_count(len, chunk);
    if (out.len() as u64) < chunks * 4 {
        bail!(
            "crc32c_chunks: {len} bytes in chunks of {chunk} need {chunks} CRCs ({} bytes), the output holds {}",
            chunks * 4,
            out.len()
        );
    }
    if chunks == 0 {
        return Ok(());
    }
    let function = gpu.crc32c_chunks_kernel();
    let bound = gpu.bind()?;
    // The driver's limit for this kernel on this GPU: its registers per thread times the
    // block must fit the SM's register file (72 x 1024 does not on the H200).
    let most = driver::max_threads_per_block(&bound, function)
        .context("asking the driver for crc32c_chunks' largest block")?;
    ensure!(
        block_threads as i64 <= most as i64,
        "crc32c_chunks: at most {most} threads per block on this GPU, {block_threads} asked for"
    );
    // SAFETY: out is a device allocation of the bound context with room for `chunks`
    // words (checked), aligned (cuMemAlloc), that the caller keeps everyone off until the
    // stream has passed this launch.
    unsafe {
        driver::memset_d32_async(&bound, out.device_ptr(), 0, chunks as usize, gpu.stream())?
    };
    let grid = crc_grid_of(len, chunk, piece, block_threads);
    let (mut data, mut len_arg, mut chunk_arg, mut piece_arg, mut out_ptr) =
        (memory.device_ptr(), len, chunk, piece, out.device_ptr());
    let mut params = [
        (&mut data as *mut u64).cast::<c_void>(),
        (&mut len_arg as *mut u64).cast::<c_void>(),
        (&mut chunk_arg as *mut u64).cast::<c_void>(),
        (&mut piece_arg as *mut u64).cast::<c_void>(),
        (&mut out_ptr as *mut u64).cast::<c_void>(),
    ];
    // SAFETY: the kernel's contract (kernels.rs, crc32c_chunks(*const u8, u64, u64, u64,
    // *mut u32), five u64-sized values): `data` is `len` readable bytes of the bound
    // context (GpuMemory's promise, same GPU checked), `out` holds ceil(len / chunk)
    // zeroed words (the memset above, on the same stream), chunk and piece are nonzero;
    // the caller keeps everyone else off both until it completes.
    unsafe {
        driver::launch(
            &bound,
            function,
            grid,
            block_threads,
            gpu.stream(),
            &mut params,
        )
    }
    .context("launching crc32c_chunks")?;
    Ok(())
}

/// A piece is 1 byte to a whole chunk: a larger one names bytes of no chunk (the kernel
/// checks its arithmetic too, but the caller's mistake gets a reason here).
fn check_piece(chunk: u64, piece: u64) -> Result<()> {
    ensure!(
        piece > 0,
        "crc32c_chunks: the piece size must be at least 1 byte"
    );
    ensure!(
        piece <= chunk,
        "crc32c_chunks: a piece of {piece} bytes is larger than its chunk of {chunk} bytes"
    );
    Ok(())
}

/// The CRC32C of every `chunk` bytes of `memory` (the last chunk may be short),
/// computed on its GPU, with the default piece size (or the chunk, if smaller).
pub fn crc32c_chunks(memory: &(impl GpuMemory + ?Sized), chunk: u64) -> Result<Vec<u32>> {
    crc32c_chunks_with_piece(memory, chunk, DEFAULT_PIECE.min(chunk.max(1)))
}

/// [`crc32c_chunks`] with warps of `piece` bytes (the tests try several).
pub fn crc32c_chunks_with_piece(
    memory: &(impl GpuMemory + ?Sized),
    chunk: u64,
    piece: u64,
) -> Result<Vec<u32>> {
    ensure!(
        chunk > 0,
        "crc32c_chunks: the chunk size must be at least 1 byte"
    );
    check_piece(chunk, piece)?;
    let gpu = memory.gpu().clone();
    let chunks = chunk_count(memory.byte_len() as u64, chunk) as usize;
    let mut out = DeviceBuffer::new(&gpu, chunks * 4)?;
    // SAFETY: we synchronise before the borrows of `memory` and `out` end.
    unsafe { launch_crc32c_chunks(memory, chunk, piece, &mut out)? };
    gpu.synchronize()
        .context("crc32c_chunks failed while running")?;
    let mut bytes = vec![0u8; chunks * 4];
    out.read_into(&mut bytes)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_gives_every_piece_a_warp_and_is_never_empty() {
        assert_eq!(crc_grid(0, 1, 1), 1);
        assert_eq!(crc_grid(1, 1, 1), 1);
        // 1 GiB in 1 MiB chunks of 64 KiB pieces: 16384 warps, 2048 blocks of 8.
        assert_eq!(crc_grid(1 << 30, 1 << 20, 64 << 10), 2048);
        // A short last chunk still gets its chunk's share of warps.
        assert_eq!(crc_grid((1 << 30) + 3, 1 << 20, 64 << 10), 2050);
        assert_eq!(crc_grid(u64::MAX / 2, 1, 1), MAX_BLOCKS as u32);
        // A chunk longer than the buffer is the buffer: 8 KiB in 4 KiB pieces is two
        // warps, one block (it was 2^52 warps, the most blocks, and a kernel that never
        // ended on the H200).
        assert_eq!(crc_grid(8192, u64::MAX, 4096), 1);
        assert_eq!(crc_grid(8192, u64::MAX, u64::MAX), 1);
    }
}
