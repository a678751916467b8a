//! The verify kernel's launch: compare GPU memory with the pattern on the GPU and bring
//! back two words (mismatches, first bad index), not the data. Apart from the context
//! because it allocates its result in device memory, which the context's module must not
//! need (allocations are made in a context, not the other way round).

use super::allocations::DeviceBuffer;
use super::context::{Gpu, GpuMemory};
use super::driver;
use anyhow::{Context as _, Result};
use gpu_kernels::indexing::{launch_grid, BLOCK_THREADS};
use std::os::raw::c_void;

/// Counts returned by the verify kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuCheck {
    pub mismatches: u64,
    pub first_mismatch: Option<u64>,
}

impl Gpu {
    /// Compare `memory` with the pattern on the GPU, without copying the data back.
    pub fn verify(&self, memory: &(impl GpuMemory + ?Sized)) -> Result<GpuCheck> {
        let mut elements = self.kernel_elements("verify_data", memory)?;
        // The kernel's result words, [mismatches, first bad index], start as [0, MAX].
        // They are set on the launch's own stream, so the kernel sees them set.
        let gpu = memory.gpu();
        let mut result = DeviceBuffer::new(gpu, 16)?;
        let mut init = [0u8; 16];
        init[8..].copy_from_slice(&u64::MAX.to_ne_bytes());
        result.write(0, &init)?;
        let (mut ptr, mut out) = (memory.device_ptr(), result.device_ptr());
        let bound = self.bind()?;
        let mut params = [
            (&mut ptr as *mut u64).cast::<c_void>(),
            (&mut elements as *mut u64).cast::<c_void>(),
            (&mut out as *mut u64).cast::<c_void>(),
        ];
        // SAFETY: verify_data(*const i32, u64, *mut u64) of our module, in the bound
        // context, given three u64-sized values: (ptr, elements) as in launch_generate,
        // read-only; `result` is a 16-byte allocation of this context holding [0, MAX]
        // (written on this stream before the launch) that outlives the launch: we
        // synchronise below before it can drop.
        unsafe {
            driver::launch(
                &bound,
                self.verify_data_kernel(),
                launch_grid(elements),
                BLOCK_THREADS,
                self.stream(),
                &mut params,
            )
        }
        .context("launching verify_data")?;
        drop(bound);
        self.stream()
            .synchronize()
            .context("verify_data failed while running")?;
        let mut out = [0u8; 16];
        result.read_into(&mut out)?;
        let word = |i: usize| u64::from_ne_bytes(out[i * 8..i * 8 + 8].try_into().unwrap());
        Ok(GpuCheck {
            mismatches: word(0),
            first_mismatch: (word(1) != u64::MAX).then_some(word(1)),
        })
    }
}
