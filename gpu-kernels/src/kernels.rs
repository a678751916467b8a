//! The PTX kernels. Compiled only for `nvptx64-nvidia-cuda`.
//!
//! `crc32c_chunks` (below the pattern kernels) has its own contract and layout, described
//! at the function and in `crate::crc32c`.
//!
//! The pattern kernels walk the buffer with a grid-stride loop over 16-byte vectors
//! (`st.global.v4` / `ld.global.v4` in the PTX), the widest access one thread can make:
//! a memory-bound kernel reaches the bandwidth of `cuMemsetD32` only with wide accesses
//! and enough of them in flight. The 0 to 3 elements past the last whole vector are
//! handled one by one by the first threads. The index arithmetic is in
//! [`crate::indexing`], where the CPU tests replay it.
//!
//! # Safety contract (for the host that launches them)
//! `data` points to at least `len` `i32`s of device-accessible memory, aligned to 16
//! bytes (every CUDA allocation is), and nothing else writes that memory during the
//! launch. `result` (verify only) points to two `u64`s: the mismatch count, set to 0, and
//! the first bad index, set to `u64::MAX`, before the launch.

use crate::crc32c::{
    init_term, launch_shape, mul, piece_of_warp, row_step, shift, split_piece, update_bytes,
    warps_needed, Piece, LANES, LANE_BYTES, LANE_UNSHIFT, ROW_BYTES, ROW_TABLES,
};
use crate::indexing::{tail_element, whole_vectors};
use crate::pattern::value;
use core::arch::asm;
use core::arch::nvptx::{
    _block_dim_x, _block_idx_x, _grid_dim_x, _syncthreads, _thread_idx_x, trap,
};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Four `i32`s with 16-byte alignment, so LLVM emits one vector store or load.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Vec4([i32; 4]);

/// This thread's global index and the number of threads in the grid.
#[inline(always)]
fn thread_and_stride() -> (u64, u64) {
    // SAFETY: reading the special registers (%ctaid, %ntid, %tid, %nctaid) has no
    // side effects; they are defined in every kernel.
    let (block, block_dim, thread, grid_dim) = unsafe {
        (
            _block_idx_x(),
            _block_dim_x(),
            _thread_idx_x(),
            _grid_dim_x(),
        )
    };
    crate::indexing::thread_and_stride(
        block as u32,
        block_dim as u32,
        thread as u32,
        grid_dim as u32,
    )
}

#[inline(always)]
fn expected_vec4(first: u64) -> Vec4 {
    Vec4([
        value(first),
        value(first + 1),
        value(first + 2),
        value(first + 3),
    ])
}

/// `data[i] = pattern::value(i)` for `i < len`.
///
/// # Safety
/// See the module's safety contract.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn generate_data(data: *mut i32, len: u64) {
    let (thread, stride) = thread_and_stride();
    let vectors = data as *mut Vec4;
    let whole = whole_vectors(len);
    let mut v = thread;
    while v < whole {
        // SAFETY: v < len / 4, so the 16 bytes at vector v lie inside the buffer.
        unsafe { vectors.add(v as usize).write(expected_vec4(v * 4)) };
        v += stride;
    }
    let mut t = thread;
    while let Some(tail) = tail_element(len, t) {
        // SAFETY: tail_element returns only indices below len.
        unsafe { data.add(tail as usize).write(value(tail)) };
        t += stride;
    }
}

/// Count the elements with `data[i] != pattern::value(i)` and find the first of them.
///
/// `result[0]` gets the number of mismatches added, `result[1]` the lowest bad index
/// (it stays `u64::MAX` when all is well). Each thread counts in a register and touches
/// the global counters only if it saw a mismatch, so good data costs no atomics.
///
/// # Safety
/// See the module's safety contract.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn verify_data(data: *const i32, len: u64, result: *mut u64) {
    let (thread, stride) = thread_and_stride();
    let vectors = data as *const Vec4;
    let whole = whole_vectors(len);
    let mut bad = 0u64;
    let mut first_bad = u64::MAX;
    let mut note = |index: u64| {
        bad += 1;
        first_bad = first_bad.min(index);
    };
    let mut v = thread;
    while v < whole {
        // SAFETY: v < len / 4, so the 16 bytes at vector v lie inside the buffer.
        let got = unsafe { vectors.add(v as usize).read() };
        let want = expected_vec4(v * 4);
        for lane in 0..4 {
            if got.0[lane] != want.0[lane] {
                note(v * 4 + lane as u64);
            }
        }
        v += stride;
    }
    let mut t = thread;
    while let Some(tail) = tail_element(len, t) {
        // SAFETY: tail_element returns only indices below len.
        if unsafe { data.add(tail as usize).read() } != value(tail) {
            note(tail);
        }
        t += stride;
    }
    if bad != 0 {
        // SAFETY: result points to two u64s that only atomic operations touch during
        // the launch (module contract), so viewing them as atomics is sound.
        unsafe {
            AtomicU64::from_ptr(result).fetch_add(bad, Ordering::Relaxed);
            AtomicU64::from_ptr(result.add(1)).fetch_min(first_bad, Ordering::Relaxed);
        }
    }
}

// ---- crc32c_chunks ---------------------------------------------------------------------

/// Sixteen bytes with 16-byte alignment: one `ld.global.v4.u32`.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Vec4U([u32; 4]);

/// Bytes of `ROW_TABLES`, the shared-memory copy the kernel declares.
const TABLE_BYTES: usize = core::mem::size_of::<[[u32; 256]; LANE_BYTES]>();

extern "C" {
    /// `shfl.sync.bfly.b32` over the full warp; the LLVM intrinsic (not inline asm), so
    /// LLVM knows it is convergent and never moves it into divergent code.
    #[link_name = "llvm.nvvm.shfl.sync.bfly.i32"]
    fn shfl_sync_bfly(member_mask: u32, value: u32, lane_mask: u32, clamp: u32) -> u32;
}

/// The 32-bit shared-memory address of this block's 16 KiB table area.
///
/// rustc's NVPTX target has no way to place a `static` in shared memory, so the array is
/// declared in PTX itself, inside the kernel (`.shared` at function scope). Called once
/// per kernel: each call would declare its own array.
#[inline(always)]
fn shared_tables() -> u32 {
    let base: u32;
    // SAFETY: declares a block-scoped shared array and reads its address; no memory is
    // touched.
    unsafe {
        asm!(
            "{{",
            ".shared .align 16 .b8 crc32c_row_tables[{bytes}];",
            "mov.u32 {base}, crc32c_row_tables;",
            "}}",
            bytes = const TABLE_BYTES,
            base = out(reg32) base,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    base
}

/// `ld.shared.u32` at the shared address `address`.
#[inline(always)]
fn load_shared(address: u32) -> u32 {
    let value: u32;
    // SAFETY: only called with addresses inside the table area of `shared_tables`,
    // written before the block's barrier; reading shared memory has no other effect.
    unsafe {
        asm!(
            "ld.shared.u32 {value}, [{address}];",
            value = out(reg32) value,
            address = in(reg32) address,
            options(pure, readonly, nostack, preserves_flags)
        );
    }
    value
}

/// `st.shared.u32` at the shared address `address`.
#[inline(always)]
fn store_shared(address: u32, value: u32) {
    // SAFETY: only called with addresses inside the table area of `shared_tables`, each
    // by one thread, before the barrier that precedes every read.
    unsafe {
        asm!(
            "st.shared.u32 [{address}], {value};",
            address = in(reg32) address,
            value = in(reg32) value,
            options(nostack, preserves_flags)
        );
    }
}

/// XOR of `value` over the 32 lanes, in every lane (five butterfly shuffles).
#[inline(always)]
fn warp_xor(mut value: u32) -> u32 {
    let mut distance = 16;
    while distance > 0 {
        // SAFETY: all 32 lanes of the warp execute this (the caller's control flow is
        // warp-uniform), as the full member mask says.
        value ^= unsafe { shfl_sync_bfly(u32::MAX, value, distance, 0x1f) };
        distance >>= 1;
    }
    value
}

/// The CRC32C of every `chunk` bytes of `data[..len]` (the last chunk may be short) into
/// `out[i]` for chunk `i`, by XOR: the host sets `out` to zeros first.
///
/// Each warp takes one `piece` of a chunk (gpu-kernels/src/crc32c.rs, "The kernel's
/// layout"): a byte-wise head up to a 16-byte boundary, 512-byte rows read with one
/// coalesced 16-byte load per lane and folded with the 16 row tables in shared memory, a
/// byte-wise tail; the lanes' registers are moved to the piece's end and XORed with
/// shuffles, and lane 0 moves the piece's register to its chunk's end (the combine rule)
/// and XORs it into `out` with one atomic. The piece that starts a chunk adds the
/// chunk's pre- and post-inversion term. Warps walk the pieces grid-stride, so any grid
/// covers them all; the block size must be a multiple of 32.
///
/// # Safety
/// `data` points to `len` readable bytes of device-accessible memory (no alignment
/// needed), `out` to `ceil(len / chunk)` `u32`s of zeros that only this launch touches
/// meanwhile; `chunk > 0`, `piece > 0`.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn crc32c_chunks(
    data: *const u8,
    len: u64,
    chunk: u64,
    piece: u64,
    out: *mut u32,
) {
    let tables = shared_tables();
    // SAFETY: special registers, no side effects.
    let (block, block_dim, thread, grid_dim) = unsafe {
        (
            _block_idx_x() as u64,
            _block_dim_x() as u64,
            _thread_idx_x() as u64,
            _grid_dim_x() as u64,
        )
    };
    // The row tables into shared memory, a word per thread per step (coalesced reads of
    // the module's global copy), then a barrier before any lookup.
    let words = ROW_TABLES.as_flattened();
    let mut i = thread as usize;
    while i < words.len() {
        store_shared(tables + 4 * i as u32, words[i]);
        i += block_dim as usize;
    }
    // SAFETY: every thread of the block reaches this barrier once (no early return above).
    unsafe { _syncthreads() };

    let lane = (thread % LANES as u64) as usize;
    let warps_per_block = block_dim / LANES as u64;
    let mut warp = block * warps_per_block + thread / LANES as u64;
    let stride = grid_dim * warps_per_block;
    let (chunk, piece) = launch_shape(len, chunk, piece);
    let total = warps_needed(len, chunk, piece);
    while warp < total {
        // The same piece for all lanes: the branch is warp-uniform, as the shuffles need.
        if let Some(p) = piece_of_warp(warp, len, chunk, piece) {
            // SAFETY: p lies inside [0, len) (piece_of_warp), so data + p.start .. p.end
            // is readable (the kernel's contract); p.chunk < ceil(len / chunk).
            unsafe { warp_piece(data, &p, lane, tables, out) };
        }
        warp += stride;
    }
}

/// One warp's piece (see [`crc32c_chunks`]).
///
/// # Safety
/// `data[p.start..p.end]` is readable, `out[p.chunk]` is a `u32` only atomics touch.
#[inline(always)]
unsafe fn warp_piece(data: *const u8, p: &Piece, lane: usize, tables: u32, out: *mut u32) {
    // SAFETY: p.start < len, inside the buffer (the caller's contract).
    let base = unsafe { data.add(p.start as usize) };
    let len = p.end - p.start;
    let (head, rows) = split_piece(base as u64, len);
    // Lane 0's register starts with the head; see crc32c.rs on why that is its place.
    let mut register = 0;
    if lane == 0 {
        // SAFETY: head <= len (split_piece), so these bytes are inside the piece.
        let head_bytes = unsafe { core::slice::from_raw_parts(base, head as usize) };
        register = update_bytes(0, head_bytes);
    }
    // 16-byte aligned: head ends on a 16-byte boundary of the address (or at the end).
    // SAFETY: head <= len, so this is inside the piece or one past its end.
    let rows_start = unsafe { base.add(head as usize) } as *const Vec4U;
    let lookup = |k: usize, v: u32| load_shared(tables + (k as u32 * 256 + v) * 4);
    let load = |row: u64| -> [u32; 4] {
        // SAFETY: row < rows, so this lane's 16 bytes of it lie before the tail.
        unsafe { rows_start.add(row as usize * LANES + lane).read().0 }
    };
    // Four rows' loads issued before their lookups, so each lane has 64 bytes in flight.
    let mut row = 0;
    while row + 4 <= rows {
        // Named values, not an array looped over: that kept them in local memory.
        let (a, b, c, d) = (load(row), load(row + 1), load(row + 2), load(row + 3));
        register = row_step(register, a, lookup);
        register = row_step(register, b, lookup);
        register = row_step(register, c, lookup);
        register = row_step(register, d, lookup);
        row += 4;
    }
    while row < rows {
        register = row_step(register, load(row), lookup);
        row += 1;
    }
    // Lane l's register ran 16 * l bytes past the rows; take that back, then to the end.
    let rows_end = head + rows * ROW_BYTES as u64;
    let tail = len - rows_end;
    let mut value = shift(mul(register, LANE_UNSHIFT[lane]), tail);
    if tail != 0 {
        let from = (rows_end + (lane * LANE_BYTES) as u64).min(len);
        let to = (from + LANE_BYTES as u64).min(len);
        // SAFETY: rows_end <= from <= to <= len: bytes of the piece's tail.
        let tail_bytes =
            unsafe { core::slice::from_raw_parts(base.add(from as usize), (to - from) as usize) };
        let part = update_bytes(0, tail_bytes);
        value ^= shift(part, len - to);
    }
    let piece_register = warp_xor(value);
    if lane == 0 {
        let mut contribution = shift(piece_register, p.chunk_end - p.end);
        if p.start == p.chunk_start {
            contribution ^= init_term(p.chunk_end - p.chunk_start);
        }
        // SAFETY: out[p.chunk] is a u32 that only this launch's atomics touch.
        unsafe {
            AtomicU32::from_ptr(out.add(p.chunk as usize))
                .fetch_xor(contribution, Ordering::Relaxed)
        };
    }
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // A kernel cannot unwind or print: stop the launch, which the host sees as
    // CUDA_ERROR_ILLEGAL_INSTRUCTION from its next synchronisation.
    // SAFETY: `trap` aborts the kernel; it has no other effect.
    unsafe { trap() }
}
