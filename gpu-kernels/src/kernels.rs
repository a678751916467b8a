//! The PTX kernels. Compiled only for `nvptx64-nvidia-cuda`.
//!
//! Both kernels walk the buffer with a grid-stride loop over 16-byte vectors
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

use crate::indexing::{tail_element, whole_vectors};
use crate::pattern::value;
use core::arch::nvptx::{_block_dim_x, _block_idx_x, _grid_dim_x, _thread_idx_x, trap};
use core::sync::atomic::{AtomicU64, Ordering};

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

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // A kernel cannot unwind or print: stop the launch, which the host sees as
    // CUDA_ERROR_ILLEGAL_INSTRUCTION from its next synchronisation.
    // SAFETY: `trap` aborts the kernel; it has no other effect.
    unsafe { trap() }
}
