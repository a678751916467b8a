//! What the receive loop needs of the memory a transfer lands in, between passes: the
//! checks (the pattern, CRC32Cs where the bytes are), writing it out, poisoning it
//! before the next transfer. Any receive buffer a verbs NIC writes ([`RecvSink`]) is
//! one; so is GPU memory a TCP link stages into ([`StagedGpu`], the `cuda` feature).

use crate::memory::{DataPath, RecvSink, Verification};
use anyhow::Result;
use std::ops::Range;

/// The memory a transfer lands in, as the receive loop checks it.
pub trait Landed {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Fill with the poison, so data that never arrived cannot pass (before a transfer).
    fn poison(&self) -> Result<()>;
    /// The first `len` bytes against the pattern.
    fn verify(&self, len: usize) -> Result<Verification>;
    /// CRC32C of every `chunk` bytes of `range`, where the bytes are.
    fn crc32c_chunks(&self, range: Range<usize>, chunk: usize) -> Result<Vec<u32>>;
    /// The first `len` bytes to `out` (`--output`).
    fn write_to(&self, len: usize, out: &mut dyn std::io::Write) -> Result<()>;
    fn first_values(&self, count: usize) -> Result<Vec<i32>>;
    fn path(&self) -> DataPath;
}

impl<T: RecvSink + ?Sized> Landed for T {
    fn len(&self) -> usize {
        RecvSink::len(self)
    }
    fn poison(&self) -> Result<()> {
        RecvSink::poison(self)
    }
    fn verify(&self, len: usize) -> Result<Verification> {
        RecvSink::verify(self, len)
    }
    fn crc32c_chunks(&self, range: Range<usize>, chunk: usize) -> Result<Vec<u32>> {
        RecvSink::crc32c_chunks(self, range, chunk)
    }
    fn write_to(&self, len: usize, out: &mut dyn std::io::Write) -> Result<()> {
        RecvSink::write_to(self, len, out)
    }
    fn first_values(&self, count: usize) -> Result<Vec<i32>> {
        RecvSink::first_values(self, count)
    }
    fn path(&self) -> DataPath {
        RecvSink::path(self)
    }
}

/// GPU memory a TCP link fills through a page-locked ring ([`DeviceUpload`]): the link
/// borrows the upload while a pass runs, the receive loop between passes (one thread,
/// one borrow at a time).
///
/// [`DeviceUpload`]: crate::gpu::upload::DeviceUpload
#[cfg(feature = "cuda")]
pub struct StagedGpu {
    pub gpu: std::rc::Rc<crate::gpu::Gpu>,
    pub upload: std::cell::RefCell<crate::gpu::upload::DeviceUpload>,
    pub len: usize,
}

#[cfg(feature = "cuda")]
impl StagedGpu {
    fn with_memory<R>(
        &self,
        f: impl FnOnce(&crate::gpu::allocations::DeviceBuffer) -> Result<R>,
    ) -> Result<R> {
        let upload = self
            .upload
            .try_borrow()
            .map_err(|_| anyhow::anyhow!("the GPU memory is being filled"))?;
        f(upload.memory()?)
    }
}

#[cfg(feature = "cuda")]
impl Landed for StagedGpu {
    fn len(&self) -> usize {
        self.len
    }

    fn poison(&self) -> Result<()> {
        self.upload
            .try_borrow_mut()
            .map_err(|_| anyhow::anyhow!("the GPU memory is being filled"))?
            .poison()
    }

    fn verify(&self, len: usize) -> Result<Verification> {
        let check = self.with_memory(|m| self.gpu.verify(&m.slice(0..len)?))?;
        Ok(Verification {
            elements: (len / 4) as u64,
            mismatches: check.mismatches,
            first_mismatch: check.first_mismatch,
            crc32: None, // checked on the GPU: the bytes never come back to the CPU
        })
    }

    fn crc32c_chunks(&self, range: Range<usize>, chunk: usize) -> Result<Vec<u32>> {
        self.with_memory(|m| crate::gpu::checksum::crc32c_chunks(&m.slice(range)?, chunk as u64))
    }

    fn write_to(&self, len: usize, out: &mut dyn std::io::Write) -> Result<()> {
        // Out of GPU memory in blocks, after the data verified there.
        const BLOCK: usize = 64 << 20;
        self.with_memory(|memory| {
            let mut block = vec![0u8; len.min(BLOCK)];
            let mut offset = 0;
            while offset < len {
                let n = (len - offset).min(BLOCK);
                memory.read_range_into(offset, &mut block[..n])?;
                out.write_all(&block[..n])?;
                offset += n;
            }
            Ok(())
        })
    }

    fn first_values(&self, count: usize) -> Result<Vec<i32>> {
        self.with_memory(|m| crate::gpu::sources::read_device_values(m, count))
    }

    fn path(&self) -> DataPath {
        DataPath::StagedThroughHostMemory
    }
}
