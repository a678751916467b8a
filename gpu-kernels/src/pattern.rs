//! The data pattern: element `i` is `2 * i` as an `i32` (0, 2, 4, 6, 8, ...).
//!
//! This is the only place the formula is written. The GPU kernels, the CPU fallback and
//! every verification call [`value`], so they cannot drift apart.

/// Bytes in one element of the pattern.
pub const ELEMENT_BYTES: usize = core::mem::size_of::<i32>();

/// The value of element `i`.
///
/// The arithmetic is done modulo 2^32 (`wrapping_mul` on the low 32 bits of the index),
/// so every index has a defined value, even past the 2^30 elements where `2 * i`
/// leaves the `i32` range; for buffers up to 4 GiB this is exactly `2 * i`.
#[inline(always)]
pub fn value(i: u64) -> i32 {
    (i as u32).wrapping_mul(2) as i32
}

/// Fill `out` with the pattern, `out[k] = value(first + k)`.
pub fn fill(out: &mut [i32], first: u64) {
    for (k, slot) in out.iter_mut().enumerate() {
        *slot = value(first + k as u64);
    }
}

/// The first index `k` where `data[k] != value(first + k)`, if any.
pub fn first_mismatch(data: &[i32], first: u64) -> Option<usize> {
    data.iter()
        .enumerate()
        .position(|(k, &v)| v != value(first + k as u64))
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;

    #[test]
    fn starts_with_the_even_numbers() {
        let mut v = vec![0; 5];
        fill(&mut v, 0);
        assert_eq!(v, [0, 2, 4, 6, 8]);
    }

    #[test]
    fn value_is_twice_the_index_for_a_1_gib_buffer() {
        let last = (1u64 << 30) / ELEMENT_BYTES as u64 - 1;
        assert_eq!(value(last), (2 * last) as i32);
        assert_eq!(value(12345), 24690);
    }

    #[test]
    fn wraps_modulo_2_pow_32() {
        assert_eq!(value(1 << 30), i32::MIN);
        assert_eq!(value(1 << 31), 0);
        assert_eq!(value((1 << 32) + 3), 6);
    }

    #[test]
    fn fill_honours_the_offset() {
        let mut v = vec![0; 3];
        fill(&mut v, 10);
        assert_eq!(v, [20, 22, 24]);
    }

    #[test]
    fn first_mismatch_finds_first_middle_and_last() {
        let mut v = vec![0; 100];
        fill(&mut v, 7);
        assert_eq!(first_mismatch(&v, 7), None);
        assert_eq!(first_mismatch(&v, 8), Some(0));
        for bad in [0usize, 50, 99] {
            let mut w = v.clone();
            w[bad] ^= 1;
            assert_eq!(first_mismatch(&w, 7), Some(bad));
        }
    }
}
