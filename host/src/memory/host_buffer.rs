//! Page-aligned host memory: the CPU-pattern sender and the default receiver buffer.

use super::POISON;
use super::{DataPath, RecvSink, Registrable, RegistrationTarget, SendSource, Verification};
use anyhow::{bail, Result};
use gpu_kernels::pattern;
use std::alloc::{self, Layout};
use std::ops::Range;
use std::ptr::NonNull;
use std::time::Instant;

/// Page size used for alignment; registration pins whole pages anyway.
const PAGE: usize = 4096;
/// Bytes copied out at a time to check a buffer a peer may be writing (a whole number of
/// elements, small enough to stay in the CPU's cache).
const COPY_BLOCK: usize = 64 * 1024;

/// A page-aligned, heap-allocated byte buffer, or (made only inside the crate, see
/// `HostBuffer::borrowed`) memory a library caller owns and lends for one transfer.
///
/// The NIC may write it (a receiver's buffer, registered for remote write) while a memory
/// region borrows it, so shared methods reach its bytes only through its raw pointer,
/// copying them out: no `&[u8]` over it ever exists while `&self` is shared, since a peer
/// writing under a shared slice would be a data race. Slices are handed out only from
/// `&mut self`, when no registration can exist.
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    /// How it was allocated, freed with it in Drop; `None`: the caller's memory, lent.
    layout: Option<Layout>,
}

// SAFETY: HostBuffer owns its allocation exclusively, like a Vec<u8>; it is not Sync, so
// its shared methods never run on two threads at once.
unsafe impl Send for HostBuffer {}

impl HostBuffer {
    /// A zeroed buffer of `len` bytes (at least one page is allocated).
    pub fn zeroed(len: usize) -> Result<Self> {
        let Some(size) = len.max(1).checked_next_multiple_of(PAGE) else {
            bail!("{len} bytes of host memory cannot be allocated (the size overflows)");
        };
        let Ok(layout) = Layout::from_size_align(size, PAGE) else {
            bail!("{len} bytes of host memory cannot be allocated (larger than isize::MAX)");
        };
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            bail!("cannot allocate {len} bytes of host memory");
        };
        Ok(HostBuffer {
            ptr,
            len,
            layout: Some(layout),
        })
    }

    /// `len` bytes at `ptr` that a library caller owns (a Python buffer, a slice it lent
    /// for the length of a call), used as a receive buffer and never freed here.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must be memory that is valid for reads and writes and is read
    /// or written by nothing else (no Rust reference, no other thread) from this call
    /// until the value is dropped, and stays allocated until then. It need not be
    /// aligned: nothing reads it as anything but bytes ([`as_i32_mut`](Self::as_i32_mut)
    /// panics on such memory).
    pub(crate) unsafe fn borrowed(ptr: NonNull<u8>, len: usize) -> HostBuffer {
        HostBuffer {
            ptr,
            len,
            layout: None,
        }
    }

    /// Its address and length, for a link that writes it from its own threads under the
    /// rules of the memory it is lent as (`net::tcp::recv`'s claims).
    pub(crate) fn raw_parts(&self) -> (NonNull<u8>, usize) {
        (self.ptr, self.len)
    }

    /// A buffer for receiving: filled with [`POISON`], so nothing in it verifies before
    /// data arrives.
    pub fn poisoned(len: usize) -> Result<Self> {
        let buffer = Self::zeroed(len)?;
        buffer.fill_poison();
        Ok(buffer)
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

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes. `&mut self`: no registration (and so no NIC access) exists meanwhile.
    pub fn as_bytes(&mut self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes while self lives; the exclusive
        // borrow keeps every writer away for the slice's life.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable: a TCP receiver reads the socket straight into them.
    /// `&mut self`: no registration (and so no NIC access) exists meanwhile.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len initialised bytes while self lives; the exclusive
        // borrow keeps every other reader and writer away for the slice's life.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The whole elements of the buffer (a trailing partial element is left out).
    ///
    /// # Panics
    /// On memory a caller lent (`borrowed`) that is not aligned for
    /// `i32` (only the pattern is written this way, into buffers allocated here).
    pub fn as_i32_mut(&mut self) -> &mut [i32] {
        assert!(
            self.ptr.as_ptr().cast::<i32>().is_aligned(),
            "a buffer that is not aligned for i32 read as i32s"
        );
        // SAFETY: the memory is aligned for i32 (asserted; allocations here are page-aligned) and holds at least
        // len / 4 initialised i32s; &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().cast(), self.len / 4) }
    }

    /// Copy bytes `[offset, offset + out.len())` out through the raw pointer.
    fn copy_out(&self, offset: usize, out: &mut [u8]) {
        assert!(
            offset
                .checked_add(out.len())
                .is_some_and(|end| end <= self.len),
            "copy_out outside the buffer"
        );
        // SAFETY: the range lies inside the allocation (asserted); `out` is another
        // allocation, borrowed mutably (no view of this buffer can be one while `&self`
        // is shared). A raw copy, not a slice: a peer may write these bytes meanwhile.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
    }

    /// Run `f` over the first `len` bytes, in copied blocks of at most [`COPY_BLOCK`].
    fn for_each_block(&self, len: usize, f: impl FnMut(&[u8])) {
        self.for_each_block_in(0..len, f)
    }

    /// Run `f` over bytes `range`, in copied blocks of at most [`COPY_BLOCK`].
    fn for_each_block_in(&self, range: Range<usize>, mut f: impl FnMut(&[u8])) {
        let mut scratch = vec![0u8; range.len().min(COPY_BLOCK)];
        let mut offset = range.start;
        while offset < range.end {
            let n = (range.end - offset).min(COPY_BLOCK);
            self.copy_out(offset, &mut scratch[..n]);
            f(&scratch[..n]);
            offset += n;
        }
    }

    fn fill_poison(&self) {
        let words = self.len / 4;
        let ptr = self.ptr.as_ptr().cast::<u32>();
        for i in 0..words {
            // SAFETY: i < len / 4 words inside the page-aligned allocation; no slice of
            // the buffer exists while `&self` is shared (slices need `&mut self`).
            unsafe { ptr.add(i).write(POISON) };
        }
        for i in words * 4..self.len {
            // SAFETY: as above, the trailing bytes.
            unsafe { self.ptr.as_ptr().add(i).write(0xff) };
        }
    }

    /// Copy `data` into the buffer at `offset`. Through `&mut self`: a buffer lent to a
    /// transfer as its source (`&self`) may be read meanwhile by a wire's threads or the
    /// NIC, so nothing may rewrite it then.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        // SAFETY: `&mut self`: no transfer, wire or registration borrows the buffer.
        unsafe { self.write_shared(offset, data) }
    }

    /// [`write_at`](Self::write_at) through `&self`, for a registered buffer of control
    /// messages rewritten between sends ([`MessageBuffer`](crate::rdma::MessageBuffer)).
    ///
    /// # Safety
    /// Nothing reads or writes bytes `[offset, offset + data.len())` meanwhile: no request
    /// posted on them is outstanding and no wire was handed them.
    pub(crate) unsafe fn write_shared(&self, offset: usize, data: &[u8]) -> Result<()> {
        if offset
            .checked_add(data.len())
            .is_none_or(|end| end > self.len)
        {
            bail!(
                "{} bytes at offset {offset} do not fit a {}-byte buffer",
                data.len(),
                self.len
            );
        }
        // SAFETY: the range lies inside the allocation (checked); `data` is a different
        // allocation (slices of this buffer come only from `&mut self`, which cannot
        // coexist with `&self`); nothing else touches the range (the caller's promise).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len())
        };
        Ok(())
    }

    /// A copy of the first `len` bytes (clamped to the buffer).
    pub fn read_prefix(&self, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len.min(self.len)];
        self.copy_out(0, &mut out);
        out
    }

    /// A copy of bytes `[offset, offset + len)`, clamped to the buffer.
    pub fn read_range(&self, offset: usize, len: usize) -> Vec<u8> {
        let offset = offset.min(self.len);
        let mut out = vec![0u8; len.min(self.len - offset)];
        self.copy_out(offset, &mut out);
        out
    }

    fn leading_values(&self, count: usize) -> Vec<i32> {
        leading_values(
            &self.read_prefix(count.saturating_mul(pattern::ELEMENT_BYTES)),
            count,
        )
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // Lent memory goes back to its owner as it is.
        let Some(layout) = self.layout else { return };
        // SAFETY: allocated in zeroed() with this layout, freed once; registrations borrow
        // the buffer, so none is left.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

// SAFETY: the memory lives, unmoved, until Drop (an allocation of ours, or lent memory,
// which `borrowed`'s caller keeps valid until then), and Drop cannot run while borrowed.
unsafe impl Registrable for HostBuffer {
    fn target(&self) -> RegistrationTarget<'_> {
        RegistrationTarget::Host {
            ptr: self.ptr,
            len: self.len,
        }
    }
}

/// The first `count` whole elements of `bytes`.
pub fn leading_values(bytes: &[u8], count: usize) -> Vec<i32> {
    bytes
        .chunks_exact(pattern::ELEMENT_BYTES)
        .take(count)
        .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Check `bytes` against the pattern from element 0 on, on the CPU.
pub fn verify_bytes(bytes: &[u8]) -> Verification {
    let mut check = PatternCheck::default();
    check.update(bytes);
    check.finish()
}

/// The pattern check over bytes that come in blocks (copied out of a buffer a peer may
/// write): element indices and the CRC-32 run on across blocks. Every block but the last
/// must be whole elements.
#[derive(Default)]
struct PatternCheck {
    elements: u64,
    mismatches: u64,
    first_mismatch: Option<u64>,
    crc: crc32fast::Hasher,
    /// The last block ended inside an element.
    partial: bool,
}

impl PatternCheck {
    fn update(&mut self, block: &[u8]) {
        debug_assert!(
            !self.partial,
            "only the last block may end inside an element"
        );
        self.crc.update(block);
        for chunk in block.chunks_exact(pattern::ELEMENT_BYTES) {
            let got = i32::from_ne_bytes(chunk.try_into().expect("chunks_exact gives 4 bytes"));
            if got != pattern::value(self.elements) {
                self.mismatches += 1;
                self.first_mismatch.get_or_insert(self.elements);
            }
            self.elements += 1;
        }
        self.partial |= !block.len().is_multiple_of(pattern::ELEMENT_BYTES);
    }

    fn finish(mut self) -> Verification {
        // A trailing partial element cannot match the pattern.
        if self.partial {
            self.mismatches += 1;
            self.first_mismatch.get_or_insert(self.elements);
        }
        Verification {
            elements: self.elements,
            mismatches: self.mismatches,
            first_mismatch: self.first_mismatch,
            crc32: Some(self.crc.finalize()),
        }
    }
}

// SAFETY: memory() is this buffer, whose allocation never moves or changes size; chunks
// are ranges inside it (checked), and the source never writes its bytes after creation
// except through `&mut self`, which no transfer's `&self` borrow allows meanwhile.
unsafe impl SendSource for HostBuffer {
    fn len(&self) -> usize {
        self.len
    }

    fn memory(&self) -> &dyn Registrable {
        self
    }

    fn prepare_chunk(&self, offset: usize, len: usize, _deadline: Instant) -> Result<Range<usize>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(offset..end),
            _ => bail!(
                "chunk of {len} bytes at {offset} is outside a {}-byte buffer",
                self.len
            ),
        }
    }

    fn first_values(&self, count: usize) -> Result<Vec<i32>> {
        Ok(self.leading_values(count))
    }

    fn path(&self) -> DataPath {
        DataPath::HostMemory
    }

    fn copy_out(&self, offset: usize, dest: &mut [u8]) -> Result<()> {
        if offset
            .checked_add(dest.len())
            .is_none_or(|end| end > self.len)
        {
            bail!(
                "{} bytes at {offset} are outside a {}-byte buffer",
                dest.len(),
                self.len
            );
        }
        HostBuffer::copy_out(self, offset, dest);
        Ok(())
    }
}

// SAFETY: memory() is this buffer, of `len` bytes, for its whole life; poison writes and
// verify and first_values read through the raw pointer by copies (fill_poison,
// for_each_block, read_prefix), never through a reference.
unsafe impl RecvSink for HostBuffer {
    fn len(&self) -> usize {
        self.len
    }

    fn memory(&self) -> &dyn Registrable {
        self
    }

    fn poison(&self) -> Result<()> {
        self.fill_poison();
        Ok(())
    }

    fn verify(&self, len: usize) -> Result<Verification> {
        if len > self.len {
            bail!("asked to verify {len} bytes of a {}-byte buffer", self.len);
        }
        let mut check = PatternCheck::default();
        self.for_each_block(len, |block| check.update(block));
        Ok(check.finish())
    }

    fn first_values(&self, count: usize) -> Result<Vec<i32>> {
        Ok(self.leading_values(count))
    }

    fn path(&self) -> DataPath {
        DataPath::HostMemory
    }

    fn crc32c_chunks(&self, range: Range<usize>, chunk: usize) -> Result<Vec<u32>> {
        if range.start > range.end || range.end > self.len || chunk == 0 {
            bail!(
                "checksums of bytes {range:?} in chunks of {chunk} of a {}-byte buffer",
                self.len
            );
        }
        let mut crcs = Vec::with_capacity(range.len().div_ceil(chunk));
        let mut at = range.start;
        while at < range.end {
            let end = (at + chunk).min(range.end);
            let mut crc = crate::integrity::Crc32c::new();
            self.for_each_block_in(at..end, |block| crc.update(block));
            crcs.push(crc.value());
            at = end;
        }
        Ok(crcs)
    }

    fn write_to(&self, len: usize, out: &mut dyn std::io::Write) -> Result<()> {
        if len > self.len {
            bail!("asked to write {len} bytes of a {}-byte buffer", self.len);
        }
        let mut result = Ok(());
        self.for_each_block(len, |block| {
            if result.is_ok() {
                result = out.write_all(block);
            }
        });
        Ok(result?)
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
    fn a_poisoned_buffer_fails_from_element_zero() {
        let b = HostBuffer::poisoned(64).unwrap();
        let v = b.verify(64).unwrap();
        assert_eq!((v.mismatches, v.first_mismatch), (16, Some(0)));
        // And poisoning again after good data makes it fail again.
        let mut good = HostBuffer::with_pattern(64).unwrap();
        assert!(good.verify(64).unwrap().ok());
        RecvSink::poison(&good).unwrap();
        assert_eq!(good.verify(64).unwrap().mismatches, 16);
        assert!(good.as_bytes().chunks(4).all(|w| w == POISON.to_ne_bytes()));
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
    fn absurd_sizes_are_an_error_not_a_crash() {
        for len in [usize::MAX, usize::MAX - 3, isize::MAX as usize + 1] {
            let e = HostBuffer::zeroed(len).err().expect("refused").to_string();
            assert!(e.contains("cannot be allocated"), "{e}");
        }
        assert!(HostBuffer::with_pattern(usize::MAX - 3).is_err());
    }

    #[test]
    fn chunk_checksums_and_writing_out_read_what_landed() {
        // Small under Miri, which runs the CRC's table fallback a byte at a time.
        let len: usize = if cfg!(miri) { 2_003 } else { 200_003 };
        let mut b = HostBuffer::zeroed(len).unwrap();
        for (i, x) in b.as_bytes_mut().iter_mut().enumerate() {
            *x = (i * 31 + 7) as u8;
        }
        let bytes = b.as_bytes().to_vec();
        for chunk in [1usize, 4096, len / 3 + 2, len] {
            let got = RecvSink::crc32c_chunks(&b, 0..bytes.len(), chunk).unwrap();
            assert_eq!(got, crate::integrity::chunk_crcs(&bytes, chunk), "{chunk}");
        }
        let (a, z) = (len / 3, 2 * (len / 3));
        let one = RecvSink::crc32c_chunks(&b, a..z, z - a).unwrap();
        assert_eq!(one, [crate::integrity::crc32c(&bytes[a..z])]);
        assert!(RecvSink::crc32c_chunks(&b, 0..len + 1, 7).is_err());
        let mut out = Vec::new();
        b.write_to(len - 2, &mut out).unwrap();
        assert_eq!(out, bytes[..len - 2]);
    }

    #[test]
    fn chunks_are_ranges_of_the_registered_memory() {
        let b = HostBuffer::with_pattern(8192).unwrap();
        let far = Instant::now();
        assert_eq!(b.prepare_chunk(4096, 4096, far).unwrap(), 4096..8192);
        assert!(b.prepare_chunk(4096, 4100, far).is_err());
        assert!(b.prepare_chunk(usize::MAX, 2, far).is_err());
        assert_eq!(b.target().len(), 8192);
    }
}
