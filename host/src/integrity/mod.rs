//! CRC32C of each chunk on the CPU, with the same shape as the GPU kernel
//! (`gpu::checksum::crc32c_chunks`): chunk `i` is bytes `[i * chunk, (i + 1) * chunk)`,
//! the last one possibly short.
//!
//! The work is the `crc-fast` crate's, chosen at run time for the CPU: carry-less
//! multiplication over 512-bit registers (VPCLMULQDQ with AVX-512) where the CPU has it,
//! about 4 times the SSE4.2 `crc32` instruction's rate (107 against 27 GB/s on one core
//! of this project's build machine, 64 KiB buffers); PCLMULQDQ or the `crc32`
//! instruction on older x86-64, ARMv8's CRC and PMULL instructions on aarch64, tables
//! elsewhere ([`cpu_path`] names the one taken). Its tests check it against published
//! check values, the `crc32c` crate (a second implementation) and the GPU kernel's own
//! arithmetic; the GPU tests check the kernel against it.

pub mod bench;
mod combine;

/// The CRC32C (Castagnoli) of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

/// A CRC32C taken over bytes that come in several blocks (memory in pieces).
pub struct Crc32c(crc_fast::Digest);

impl Crc32c {
    pub fn new() -> Crc32c {
        Crc32c(crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi))
    }

    /// Takes in the next `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The CRC32C of every byte taken in so far.
    pub fn value(&self) -> u32 {
        self.0.finalize() as u32
    }
}

impl Default for Crc32c {
    fn default() -> Self {
        Crc32c::new()
    }
}

/// The code path `crc-fast` takes for CRC32C on this CPU (its own words, e.g.
/// `x86_64-avx512-vpclmulqdq`), for reports.
pub fn cpu_path() -> String {
    crc_fast::get_calculator_target(crc_fast::CrcAlgorithm::Crc32Iscsi)
}

/// The CRC32C of every `chunk` bytes of `data`, in order; empty for empty data.
///
/// # Panics
/// If `chunk` is 0.
pub fn chunk_crcs(data: &[u8], chunk: usize) -> Vec<u32> {
    assert!(chunk > 0, "a chunk of 0 bytes");
    data.chunks(chunk).map(crc32c).collect()
}

/// The CRC32C of a whole transfer from its chunks' CRC32Cs (chunks of `chunk` bytes,
/// the last one `total - (n - 1) * chunk`), by the CRC combine rule: the digest both
/// ends compare without reading the data again. The operator that shifts a CRC past
/// `chunk` zero bytes is built once for all chunks (`combine::Shift`): the `crc32c`
/// crate's `crc32c_combine` builds it anew on every call, 70 ms for 1024 chunks.
pub fn digest(chunk_crcs: &[u32], chunk: u64, total: u64) -> u32 {
    let whole = combine::Shift::by(chunk);
    let mut acc = 0u32;
    for (i, &crc) in chunk_crcs.iter().enumerate() {
        let len = chunk.min(total.saturating_sub(i as u64 * chunk));
        acc = match i {
            0 => crc,
            _ if len == chunk => whole.apply(acc) ^ crc,
            _ => combine::Shift::by(len).apply(acc) ^ crc,
        };
    }
    acc
}

/// Whether the CRC32C runs on CPU instructions made for it rather than from tables (at
/// a fraction of the speed): the path `crc-fast` chose ([`cpu_path`]), which on x86-64
/// needs PCLMULQDQ, not only SSE4.2.
pub fn hardware_accelerated() -> bool {
    !cpu_path().starts_with("software")
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_kernels::crc32c as arithmetic;

    #[test]
    fn published_check_values() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xFFu8; 32]), 0x62A8_AB43);
        assert_eq!(crc32c(&(0u8..32).collect::<Vec<_>>()), 0x46DD_794E);
    }

    /// Every length up to 1 KiB and around the SIMD paths' block sizes (16 to 512
    /// bytes a fold, 4 KiB and up), at every start alignment within 64 bytes: equal to
    /// the `crc32c` crate (another implementation), whole and taken in uneven blocks.
    #[test]
    fn equal_to_the_crc32c_crate_at_every_length_and_alignment() {
        let data = bench::random_bytes(70_000, 0x5eed);
        let mut lengths: Vec<usize> = (0..=1024).collect();
        for edge in [2048usize, 4096, 8192, 16_384, 65_536] {
            lengths.extend(edge - 3..=edge + 3);
        }
        for &len in &lengths {
            for start in [0usize, 1, 3, 7, 8, 15, 31, 63] {
                let bytes = &data[start..start + len];
                let want = crc32c::crc32c(bytes);
                assert_eq!(crc32c(bytes), want, "{len} bytes at +{start}");
                let mut blocks = Crc32c::new();
                for block in bytes.chunks(len / 3 + 1) {
                    blocks.update(block);
                }
                assert_eq!(blocks.value(), want, "{len} bytes in blocks at +{start}");
            }
        }
        assert!(!cpu_path().is_empty());
    }

    #[test]
    fn chunks_match_the_kernels_arithmetic_including_a_short_last_one() {
        let data: Vec<u8> = (0..10_007u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for chunk in [1usize, 3, 4, 17, 4096, 10_006, 10_007, 1 << 20] {
            let crcs = chunk_crcs(&data, chunk);
            assert_eq!(crcs.len(), data.len().div_ceil(chunk));
            for (i, crc) in crcs.iter().enumerate() {
                let end = ((i + 1) * chunk).min(data.len());
                assert_eq!(
                    *crc,
                    arithmetic::crc32c(&data[i * chunk..end]),
                    "chunk {chunk}, #{i}"
                );
            }
        }
        assert!(chunk_crcs(&[], 7).is_empty());
    }

    #[test]
    fn the_digest_of_the_chunks_is_the_crc_of_the_whole() {
        let data: Vec<u8> = (0..10_007u32).map(|i| (i * 7 + 3) as u8).collect();
        for chunk in [1usize, 4, 4096, 10_007] {
            let crcs = chunk_crcs(&data, chunk);
            assert_eq!(
                digest(&crcs, chunk as u64, data.len() as u64),
                crc32c(&data),
                "chunk {chunk}"
            );
        }
    }

    #[test]
    #[should_panic(expected = "a chunk of 0 bytes")]
    fn a_zero_chunk_is_refused() {
        chunk_crcs(b"abc", 0);
    }
}
