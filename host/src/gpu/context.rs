//! One GPU, ready to run this project's kernels: the CUDA context, the module loaded from
//! the PTX embedded at build time, and a stream.

use super::driver::{self, DriverResult};
use anyhow::{Context as _, Result};
use cust::context::Context;
use cust::device::Device;
use cust::module::Module;
use cust::prelude::*;

/// The PTX that `build.rs` made from the `gpu-kernels` crate.
pub const KERNELS_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels.ptx"));

/// Threads per block: 256 (8 warps) is a good default for a streaming kernel on every
/// architecture since Volta.
const BLOCK_THREADS: u32 = 256;
/// The most blocks one launch asks for; past that the kernels' grid-stride loops take
/// over (only for buffers over 64 GiB).
const MAX_BLOCKS: u64 = 1 << 24;

/// Counts returned by the verify kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuCheck {
    pub mismatches: u64,
    pub first_mismatch: Option<u64>,
}

pub struct Gpu {
    // Field order is drop order: stream and module go before the context.
    stream: Stream,
    module: Module,
    device: Device,
    ordinal: u32,
    _context: Context,
}

impl Gpu {
    /// Initialise CUDA and open GPU `ordinal`.
    pub fn open(ordinal: u32) -> Result<Gpu> {
        cust::init(cust::CudaFlags::empty()).context("cuInit: no usable NVIDIA driver/GPU")?;
        let count = Device::num_devices().context("cuDeviceGetCount")?;
        if ordinal >= count {
            anyhow::bail!("GPU {ordinal} does not exist: this machine has {count} GPU(s)");
        }
        let device = Device::get_device(ordinal).context("cuDeviceGet")?;
        let context = Context::new(device).context("creating the CUDA context")?;
        let module = Module::from_ptx(KERNELS_PTX, &[])
            .context("loading the kernels' PTX (cuModuleLoadData)")?;
        let stream = Stream::new(StreamFlags::NON_BLOCKING, None).context("cuStreamCreate")?;
        Ok(Gpu {
            stream,
            module,
            device,
            ordinal,
            _context: context,
        })
    }

    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    pub fn name(&self) -> String {
        self.device.name().unwrap_or_else(|_| "unknown GPU".into())
    }

    pub fn raw_device(&self) -> i32 {
        self.device.as_raw()
    }

    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Grid for the kernels over `elements` i32s: one 16-byte vector per thread.
    ///
    /// Measured on the H200 (gpu-kernels/TUNING.md): a grid that covers the buffer
    /// reaches 1.02x the bandwidth of cuMemsetD32 at 1 GiB, while a grid capped at a few
    /// blocks per multiprocessor, looping, stays at 0.92-0.97x.
    fn grid_for(&self, elements: u64) -> u32 {
        let vectors = elements.div_ceil(4).max(1);
        vectors.div_ceil(BLOCK_THREADS as u64).min(MAX_BLOCKS) as u32
    }

    /// Launch `generate_data` over `elements` i32s at device address `ptr` on `stream`
    /// (asynchronous: synchronise the stream before reading the data).
    ///
    /// `ptr` must be device-accessible memory of at least `4 * elements` bytes that stays
    /// allocated until the launch completes; the owning types guarantee that in this crate.
    pub fn launch_generate(&self, ptr: u64, elements: u64, stream: &Stream) -> Result<()> {
        let function = self.module.get_function("generate_data")?;
        let grid = self.grid_for(elements);
        // SAFETY: the kernel's contract (gpu-kernels/src/kernels.rs): ptr is 16-byte
        // aligned device-accessible memory for `elements` i32s (every caller passes a
        // CUDA allocation of that size), and nothing else writes it during the launch.
        unsafe {
            launch!(function<<<grid, BLOCK_THREADS, 0, stream>>>(ptr, elements))
                .context("launching generate_data")?;
        }
        Ok(())
    }

    /// Fill and wait: `generate_data` on this GPU's stream, then synchronise.
    pub fn generate(&self, ptr: u64, elements: u64) -> Result<()> {
        self.launch_generate(ptr, elements, &self.stream)?;
        self.stream
            .synchronize()
            .context("generate_data failed while running")
    }

    /// Compare `elements` i32s at `ptr` with the pattern on the GPU, without copying
    /// the data back.
    pub fn verify(&self, ptr: u64, elements: u64) -> Result<GpuCheck> {
        let function = self.module.get_function("verify_data")?;
        let result = super::allocations::DeviceMemory::new(16)?;
        let init: [u64; 2] = [0, u64::MAX];
        driver::memcpy_htod(result.ptr(), bytes_of(&init))?;
        let grid = self.grid_for(elements);
        let stream = &self.stream;
        // SAFETY: as in launch_generate for (ptr, elements); `result` is a 16-byte device
        // allocation holding [0, u64::MAX] that outlives the launch (we synchronise below).
        unsafe {
            launch!(function<<<grid, BLOCK_THREADS, 0, stream>>>(ptr, elements, result.ptr()))
                .context("launching verify_data")?;
        }
        stream
            .synchronize()
            .context("verify_data failed while running")?;
        let mut out = [0u64; 2];
        result.read_into(bytes_of_mut(&mut out))?;
        Ok(GpuCheck {
            mismatches: out[0],
            first_mismatch: (out[1] != u64::MAX).then_some(out[1]),
        })
    }

    /// `cuMemsetD32` on this GPU's stream: the reference the benchmark compares with.
    pub fn memset_d32_async(&self, ptr: u64, value: u32, count: usize) -> DriverResult<()> {
        driver::memset_d32_async(ptr, value, count, &self.stream)
    }
}

fn bytes_of(words: &[u64; 2]) -> &[u8] {
    // SAFETY: u64 has no padding or invalid bit patterns; the view has the same lifetime.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast(), 16) }
}

fn bytes_of_mut(words: &mut [u64; 2]) -> &mut [u8] {
    // SAFETY: every byte pattern is a valid u64; the view borrows `words` exclusively.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), 16) }
}
