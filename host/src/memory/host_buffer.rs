//! Page-aligned host memory: the CPU-pattern sender and the default receiver buffer.

use super::{DataPath, RecvSink, Registration, SendSource, Verification};
use anyhow::{bail, Result};
use gpu_kernels::pattern;
use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::time::Instant;

/// Page size used for alignment; registration pins whole pages anyway.
const PAGE: usize = 4096;

/// A zeroed, page-aligned, heap-allocated byte buffer.
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: HostBuffer owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for HostBuffer {}

impl HostBuffer {
    /// A zeroed buffer of `len` bytes (at least one page is allocated).
    pub fn zeroed(len: usize) -> Result<Self> {
        let layout = Layout::from_size_align(len.max(1).next_multiple_of(PAGE), PAGE)?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            bail!("cannot allocate {len} bytes of host memory");
        };
        Ok(HostBuffer { ptr, len, layout })
    }

    /// A buffer holding the pattern, written by the CPU (`--gpu none`). `len` must be a
    /// whole number of elements.
    pub fn with_pattern(len: usize) -> Result<Self> {
        if !len.is_multiple_of(pattern::ELEMENT_BYTES) {
            bail!(
                "size {len} is not a multiple of {} bytes (one i32)",
                pattern::ELEMENT_BYTES
            );
        }
        let mut buffer = Self::zeroed(len)?;
        pattern::fill(buffer.as_i32_mut(), 0);
        Ok(buffer)
    }

    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised (zeroed at least) bytes while self lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole elements of the buffer (a trailing partial element is left out).
    pub fn as_i32(&self) -> &[i32] {
        // SAFETY: the allocation is page-aligned, so aligned for i32, and holds at least
        // len / 4 initialised i32s.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast(), self.len / 4) }
    }

    pub fn as_i32_mut(&mut self) -> &mut [i32] {
        // SAFETY: as in as_i32, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().cast(), self.len / 4) }
    }

    fn registration(&self) -> Registration {
        Registration::Host {
            addr: self.ptr.as_ptr(),
            len: self.len,
        }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in zeroed() with this layout, freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Check `bytes` against the pattern from element 0 on, on the CPU.
pub fn verify_bytes(bytes: &[u8]) -> Verification {
    let elements = bytes.len() / pattern::ELEMENT_BYTES;
    let mut mismatches = 0u64;
    let mut first_mismatch = None;
    for (i, chunk) in bytes.chunks_exact(pattern::ELEMENT_BYTES).enumerate() {
        let got = i32::from_ne_bytes(chunk.try_into().expect("chunks_exact gives 4 bytes"));
        if got != pattern::value(i as u64) {
            mismatches += 1;
            first_mismatch.get_or_insert(i as u64);
        }
    }
    // A trailing partial element cannot match the pattern.
    if !bytes.len().is_multiple_of(pattern::ELEMENT_BYTES) {
        mismatches += 1;
        first_mismatch.get_or_insert(elements as u64);
    }
    Verification {
        elements: elements as u64,
        mismatches,
        first_mismatch,
        crc32: Some(crc32fast::hash(bytes)),
    }
}

impl SendSource for HostBuffer {
    fn len(&self) -> usize {
        self.len
    }

    fn registration(&self) -> Registration {
        HostBuffer::registration(self)
    }

    fn prepare_chunk(&mut self, offset: usize, len: usize, _deadline: Instant) -> Result<u64> {
        debug_assert!(offset + len <= self.len);
        Ok(self.ptr.as_ptr() as u64 + offset as u64)
    }

    fn first_values(&self, count: usize) -> Result<Vec<i32>> {
        Ok(self.as_i32().iter().take(count).copied().collect())
    }

    fn path(&self) -> DataPath {
        DataPath::HostMemory
    }
}

impl RecvSink for HostBuffer {
    fn len(&self) -> usize {
        self.len
    }

    fn registration(&self) -> Registration {
        HostBuffer::registration(self)
    }

    fn verify(&mut self, len: usize) -> Result<Verification> {
        if len > self.len {
            bail!("asked to verify {len} bytes of a {}-byte buffer", self.len);
        }
        Ok(verify_bytes(&self.as_bytes()[..len]))
    }

    fn first_values(&self, count: usize) -> Result<Vec<i32>> {
        Ok(self.as_i32().iter().take(count).copied().collect())
    }

    fn path(&self) -> DataPath {
        DataPath::HostMemory
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_buffer_verifies() {
        let mut b = HostBuffer::with_pattern(16384).unwrap();
        assert_eq!(SendSource::first_values(&b, 5).unwrap(), [0, 2, 4, 6, 8]);
        let v = b.verify(16384).unwrap();
        assert!(v.ok());
        assert_eq!(v.elements, 4096);
        assert_eq!(v.crc32, Some(crc32fast::hash(b.as_bytes())));
    }

    #[test]
    fn planted_mismatches_are_found_first_last_middle() {
        for bad in [0usize, 2048, 4095] {
            let mut b = HostBuffer::with_pattern(16384).unwrap();
            b.as_i32_mut()[bad] = -1;
            let v = b.verify(16384).unwrap();
            assert_eq!((v.mismatches, v.first_mismatch), (1, Some(bad as u64)));
        }
    }

    #[test]
    fn zeroed_buffer_fails_from_element_one() {
        let mut b = HostBuffer::zeroed(64).unwrap();
        let v = b.verify(64).unwrap();
        assert_eq!((v.mismatches, v.first_mismatch), (15, Some(1)));
    }

    #[test]
    fn partial_element_is_a_mismatch() {
        let v = verify_bytes(&[0, 0, 0, 0, 2]);
        assert_eq!(
            (v.elements, v.mismatches, v.first_mismatch),
            (1, 1, Some(1))
        );
    }

    #[test]
    fn sizes_that_are_not_whole_elements_are_refused() {
        assert!(HostBuffer::with_pattern(6).is_err());
    }

    #[test]
    fn chunk_addresses_are_offsets_into_the_buffer() {
        let mut b = HostBuffer::with_pattern(8192).unwrap();
        let base = b.registration().base_address();
        assert_eq!(
            b.prepare_chunk(4096, 4096, Instant::now()).unwrap(),
            base + 4096
        );
    }
}
