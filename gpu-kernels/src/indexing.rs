//! The index arithmetic of the kernels, in plain functions that build for the host too.
//!
//! A kernel cannot be unit-tested on a machine without a GPU, but its arithmetic can:
//! the kernels in `kernels.rs` call exactly these functions, and the tests below replay
//! every thread of a launch on the CPU to show that each element is written once and
//! nothing past the end is touched. The host's launch configuration ([`launch_grid`])
//! lives here too, so the tests cover the grids the host really launches.

/// Elements per vector access: one 16-byte `st.global.v4`/`ld.global.v4` per thread step.
pub const VECTOR_ELEMENTS: u64 = 4;

/// Threads per block: 256 (8 warps) is a good default for a streaming kernel on every
/// architecture since Volta.
pub const BLOCK_THREADS: u32 = 256;

/// The most blocks one launch asks for; past that the kernels' grid-stride loops take
/// over (only for buffers over 64 GiB).
pub const MAX_BLOCKS: u64 = 1 << 24;

/// The blocks of a launch over `elements` i32s: one vector per thread, so the grid covers
/// the buffer and the stride loop runs once (measured on the H200, gpu-kernels/TUNING.md:
/// 1.02x cuMemsetD32 at 1 GiB, where a grid capped at a few blocks per SM stays at
/// 0.92-0.97x). At least one block, at most [`MAX_BLOCKS`].
pub fn launch_grid(elements: u64) -> u32 {
    let vectors = elements.div_ceil(VECTOR_ELEMENTS).max(1);
    vectors.div_ceil(BLOCK_THREADS as u64).min(MAX_BLOCKS) as u32
}

/// A thread's global index and the number of threads in the grid, from the special
/// registers `%ctaid.x`, `%ntid.x`, `%tid.x` and `%nctaid.x`.
#[inline(always)]
pub fn thread_and_stride(block: u32, block_dim: u32, thread: u32, grid_dim: u32) -> (u64, u64) {
    let block_dim = block_dim as u64;
    (
        block as u64 * block_dim + thread as u64,
        grid_dim as u64 * block_dim,
    )
}

/// Whole vectors in a buffer of `len` elements; the rest (0 to 3) is the tail.
#[inline(always)]
pub fn whole_vectors(len: u64) -> u64 {
    len / VECTOR_ELEMENTS
}

/// The tail element at `thread`'s position, if any: the 0 to 3 elements after the last
/// whole vector go to the first threads, one each. A kernel walks them grid-stride
/// (`thread`, `thread + stride`, ...) like the vectors, so a grid of fewer than four
/// threads still writes them all.
#[inline(always)]
pub fn tail_element(len: u64, thread: u64) -> Option<u64> {
    let index = whole_vectors(len) * VECTOR_ELEMENTS + thread;
    (thread < VECTOR_ELEMENTS && index < len).then_some(index)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;

    /// Replay a launch over `len` elements: every element index each thread touches.
    fn touched(len: u64, blocks: u32, block_dim: u32) -> std::vec::Vec<u32> {
        let mut count = vec![0u32; len as usize];
        for block in 0..blocks {
            for t in 0..block_dim {
                let (thread, stride) = thread_and_stride(block, block_dim, t, blocks);
                let mut v = thread;
                while v < whole_vectors(len) {
                    for lane in 0..VECTOR_ELEMENTS {
                        let i = v * VECTOR_ELEMENTS + lane;
                        assert!(i < len, "vector {v} reaches element {i} of {len}");
                        count[i as usize] += 1;
                    }
                    v += stride;
                }
                let mut t = thread;
                while let Some(i) = tail_element(len, t) {
                    assert!(i < len, "tail element {i} of {len}");
                    count[i as usize] += 1;
                    t += stride;
                }
            }
        }
        count
    }

    #[test]
    fn the_host_grid_writes_every_element_exactly_once() {
        for len in [
            0u64, 1, 2, 3, 4, 5, 255, 256, 1023, 1024, 1025, 4096, 4099, 100_003,
        ] {
            let count = touched(len, launch_grid(len), BLOCK_THREADS);
            if let Some(i) = count.iter().position(|&c| c != 1) {
                panic!("{len} elements: element {i} written {} times", count[i]);
            }
        }
    }

    #[test]
    fn small_grids_loop_and_still_write_every_element_once() {
        // Fewer threads than vectors: the grid-stride loop must cover the rest.
        for (len, blocks, block_dim) in [
            (1000u64, 1u32, 32u32),
            (4099, 3, 64),
            (7, 1, 1),
            (6, 1, 2),
            (64, 2, 4),
        ] {
            let count = touched(len, blocks, block_dim);
            assert!(
                count.iter().all(|&c| c == 1),
                "{len} elements, {blocks}x{block_dim}"
            );
        }
    }

    #[test]
    fn grids_are_bounded_and_never_empty() {
        assert_eq!(launch_grid(0), 1);
        assert_eq!(launch_grid(1), 1);
        assert_eq!(launch_grid(1024), 1);
        assert_eq!(launch_grid(1025), 2);
        // 2^30 + 4 elements (a 4 GiB+ buffer): still one vector per thread.
        let big = (1u64 << 30) + 4;
        assert_eq!(launch_grid(big) as u64, big.div_ceil(4).div_ceil(256));
        assert_eq!(launch_grid(u64::MAX) as u64, MAX_BLOCKS);
    }

    #[test]
    fn indices_past_two_to_the_32_do_not_wrap() {
        // The thread index and the element index are 64-bit: a buffer of more than 2^32
        // elements (16 GiB+) is covered by the stride loop without wrapping.
        let (thread, stride) = thread_and_stride(u32::MAX >> 8, BLOCK_THREADS, 255, u32::MAX >> 8);
        assert_eq!(thread, (u32::MAX as u64 >> 8) * 256 + 255);
        assert!(thread * VECTOR_ELEMENTS > u32::MAX as u64);
        assert_eq!(stride, (u32::MAX as u64 >> 8) * 256);
        assert_eq!(tail_element((1 << 33) + 3, 2), Some((1 << 33) + 2));
        assert_eq!(tail_element((1 << 33) + 3, 3), None);
    }
}
