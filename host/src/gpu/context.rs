//! One GPU, ready to run this project's kernels: the CUDA context, the module loaded from
//! the PTX embedded at build time, and a stream; and the kernel launches, which take
//! typed GPU memory ([`GpuMemory`]) rather than addresses.

use super::driver::{self, Bound, DriverError, PrimaryContext};
use super::ffi::{self, CUdevice, CUfunction};
use anyhow::{bail, Context as _, Result};
use gpu_kernels::indexing::{launch_grid, BLOCK_THREADS};
use gpu_kernels::pattern::ELEMENT_BYTES;
use std::ffi::CStr;
use std::os::raw::c_void;
use std::rc::Rc;

/// The PTX that `build.rs` made from the `gpu-kernels` crate.
pub const KERNELS_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels.ptx"));

/// The alignment the kernels' 16-byte vector accesses need (gpu-kernels/src/kernels.rs).
pub const KERNEL_ALIGN: u64 = 16;

/// Why a GPU could not be opened. Only [`GpuError::NoGpu`] means "this machine has no
/// GPU": callers may fall back (or tests skip) on that one alone. Every other variant is
/// a real failure on a machine that has a GPU, and must be reported as such.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The driver reports no GPU: `cuInit` says `CUDA_ERROR_NO_DEVICE`, or it finds no
    /// device, or NVIDIA's kernel driver is not loaded at all.
    #[error("no GPU: {why}")]
    NoGpu { why: String },

    /// `--gpu N` past the last GPU.
    #[error("GPU {ordinal} does not exist: this machine has {count} GPU(s)")]
    NoSuchGpu { ordinal: u32, count: u32 },

    /// A driver call failed on a machine with a GPU.
    #[error("{what}: {source}")]
    Driver {
        what: &'static str,
        source: anyhow::Error,
    },

    /// The embedded PTX did not load: a broken kernel build, or a driver too old for it.
    #[error("loading the kernels' PTX failed: {0}; the PTX embedded in this build does not load on this GPU and driver")]
    KernelLoad(DriverError),
}

impl GpuError {
    pub fn is_no_gpu(&self) -> bool {
        matches!(self, GpuError::NoGpu { .. })
    }
}

/// Memory the kernels of one GPU reach by a device address: device memory, host memory
/// mapped into the GPU, or a part of either. Kernel launches take this instead of an
/// address, and check alignment and length from it.
///
/// # Safety
/// Implementors promise that `[device_ptr(), device_ptr() + byte_len())` is memory
/// allocated in the context of `gpu()`, reachable by its kernels, and that it stays
/// allocated, and is reached by no other path than through this value, while `self` is
/// borrowed.
pub unsafe trait GpuMemory {
    fn gpu(&self) -> &Rc<Gpu>;
    fn device_ptr(&self) -> u64;
    fn byte_len(&self) -> usize;
}

/// [`GpuMemory`] held exclusively: kernels that write take this.
///
/// # Safety
/// Implementors promise that while `self` is borrowed mutably, no other value gives
/// access to any byte of the memory.
pub unsafe trait GpuMemoryMut: GpuMemory {}

pub struct Gpu {
    // Field order is drop order: the stream and the module go before the context they
    // were made in. Every buffer, stream and event of this GPU holds an `Rc<Gpu>`, so
    // the context outlives all of them.
    stream: driver::Stream,
    /// Kept loaded for the kernels' sake (never read: they hold its code); `None` when
    /// they are this build's own, loaded once for the process (`Resident`).
    _module: Option<driver::Module>,
    generate_data: CUfunction,
    verify_data: CUfunction,
    crc32c_chunks: CUfunction,
    device: CUdevice,
    ordinal: u32,
    context: PrimaryContext,
}

/// Whether NVIDIA's kernel driver is loaded (it creates `/proc/driver/nvidia`).
fn kernel_driver_loaded() -> bool {
    std::path::Path::new("/proc/driver/nvidia").exists()
}

fn driver_error(what: &'static str) -> impl FnOnce(DriverError) -> GpuError {
    move |e| GpuError::Driver {
        what,
        source: e.into(),
    }
}

/// This build's kernels on one device, loaded once for the life of the process, with
/// a retain of the device's primary context that is never released.
///
/// Why: loading the PTX (`cuModuleLoadData`: a JIT compile, or at best the driver's
/// cache lookup) took milliseconds, and a library that opens the GPU for every transfer
/// (each send of the Python module, each transfer of a serving receiver) paid them each
/// time. The kept retain is what makes keeping anything of the context safe: CUDA frees
/// everything made in a context (modules, page-locked memory) when its last retain goes,
/// which without this happens whenever the last `Gpu` of a program is dropped. The
/// page-locked memory that `allocations` keeps for reuse relies on it too.
pub(crate) struct Resident {
    /// Never unloaded (a `Resident` is never dropped).
    _module: driver::Module,
    generate_data: CUfunction,
    verify_data: CUfunction,
    crc32c_chunks: CUfunction,
    pub(crate) context: PrimaryContext,
}

// SAFETY: a context, a module and its functions are handles the driver API takes from
// any thread (it is thread-safe; every use binds the context first, on its own thread's
// context stack). A `Resident` is leaked, never dropped, so nothing of it is unloaded or
// released while another thread uses it; its fields are never written after it is made.
unsafe impl Send for Resident {}
// SAFETY: as for Send: shared references only read the handles.
unsafe impl Sync for Resident {}

/// The residents made so far, by ordinal.
static RESIDENTS: std::sync::Mutex<Vec<(u32, &'static Resident)>> =
    std::sync::Mutex::new(Vec::new());

impl Resident {
    /// The resident kernels of GPU `ordinal` (device `device`), loading them the first
    /// time (under the lock: a second caller waits for the first's load).
    fn of(ordinal: u32, device: CUdevice) -> Result<&'static Resident, GpuError> {
        let mut residents = RESIDENTS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, resident)) = residents.iter().find(|(o, _)| *o == ordinal) {
            return Ok(resident);
        }
        let context = PrimaryContext::retain(device)
            .map_err(driver_error("retaining the GPU's primary CUDA context"))?;
        let bound = context
            .bind()
            .map_err(driver_error("binding the CUDA context"))?;
        let module =
            driver::Module::load(&bound, &context, KERNELS_PTX).map_err(GpuError::KernelLoad)?;
        drop(bound);
        let (generate_data, verify_data, crc32c_chunks) = kernels_of(&module)?;
        let resident: &'static Resident = Box::leak(Box::new(Resident {
            _module: module,
            generate_data,
            verify_data,
            crc32c_chunks,
            context,
        }));
        residents.push((ordinal, resident));
        Ok(resident)
    }

    /// The resident kernels of GPU `ordinal`, if some `Gpu::open` loaded them: then its
    /// primary context lives until the process ends.
    pub(crate) fn loaded(ordinal: u32) -> Option<&'static Resident> {
        let residents = RESIDENTS.lock().unwrap_or_else(|e| e.into_inner());
        residents
            .iter()
            .find(|(o, _)| *o == ordinal)
            .map(|(_, r)| *r)
    }
}

/// The three kernels of a loaded module.
fn kernels_of(module: &driver::Module) -> Result<(CUfunction, CUfunction, CUfunction), GpuError> {
    let function = |name: &'static CStr| {
        module.function(name).map_err(driver_error(
            "finding a kernel in the PTX (cuModuleGetFunction)",
        ))
    };
    Ok((
        function(c"generate_data")?,
        function(c"verify_data")?,
        function(c"crc32c_chunks")?,
    ))
}

impl Gpu {
    /// Initialise CUDA and open GPU `ordinal` with the kernels this build embeds, loaded
    /// once per process (`Resident`).
    pub fn open(ordinal: u32) -> Result<Rc<Gpu>, GpuError> {
        // SAFETY: no PTX of the caller's: this crate's own kernels, whose contract the
        // launches below keep (gpu-kernels/src/kernels.rs).
        unsafe { Self::open_inner(ordinal, None) }
    }

    /// [`open`](Self::open) with other PTX: the tests load corrupted PTX to show that a
    /// broken kernel build is an error, not a missing GPU.
    ///
    /// # Safety
    /// The safe launches ([`generate`](Self::generate), [`verify`](Self::verify)) run the
    /// module's `generate_data` and `verify_data` on memory checked only against this
    /// crate's kernels' contract. If `ptx` defines them, they must do what those do:
    /// `generate_data(ptr, n)` writes only the `n` `i32`s at `ptr`, `verify_data(ptr, n,
    /// out)` reads only those and writes only the 16 bytes at `out`, `crc32c_chunks(data,
    /// len, chunk, piece, out)` reads only the `len` bytes at `data` and writes only
    /// `ceil(len / chunk)` words at `out`. Arbitrary device code behind those names could
    /// write any memory of the context.
    pub unsafe fn open_with_ptx(ordinal: u32, ptx: &str) -> Result<Rc<Gpu>, GpuError> {
        // SAFETY: the caller's contract, passed on.
        unsafe { Self::open_inner(ordinal, Some(ptx)) }
    }

    /// [`open`](Self::open) (`ptx` `None`: the resident kernels) or
    /// [`open_with_ptx`](Self::open_with_ptx) (a module of its own, unloaded with it).
    ///
    /// # Safety
    /// As for [`open_with_ptx`](Self::open_with_ptx), for `Some(ptx)`.
    unsafe fn open_inner(ordinal: u32, ptx: Option<&str>) -> Result<Rc<Gpu>, GpuError> {
        let init = driver::init();
        if init != 0 {
            let failure = driver::check("cuInit", init).unwrap_err();
            // The narrowest test for "no GPU": the driver says so, or there is no
            // kernel driver for it to talk to. Anything else is a broken installation.
            if init == ffi::CUDA_ERROR_NO_DEVICE || !kernel_driver_loaded() {
                return Err(GpuError::NoGpu {
                    why: failure.to_string(),
                });
            }
            return Err(GpuError::Driver {
                what: "initialising CUDA",
                source: failure.into(),
            });
        }
        let count = driver::device_count().map_err(driver_error("counting GPUs"))? as u32;
        if count == 0 {
            return Err(GpuError::NoGpu {
                why: "the driver finds no GPU (cuDeviceGetCount = 0)".into(),
            });
        }
        if ordinal >= count {
            return Err(GpuError::NoSuchGpu { ordinal, count });
        }
        let device = driver::device_get(ordinal as i32).map_err(driver_error("cuDeviceGet"))?;
        let context = PrimaryContext::retain(device)
            .map_err(driver_error("retaining the GPU's primary CUDA context"))?;
        let bound = context
            .bind()
            .map_err(driver_error("binding the CUDA context"))?;
        let (module, (generate_data, verify_data, crc32c_chunks)) = match ptx {
            Some(ptx) => {
                let module =
                    driver::Module::load(&bound, &context, ptx).map_err(GpuError::KernelLoad)?;
                let kernels = kernels_of(&module)?;
                (Some(module), kernels)
            }
            None => {
                let r = Resident::of(ordinal, device)?;
                (None, (r.generate_data, r.verify_data, r.crc32c_chunks))
            }
        };
        let stream =
            driver::Stream::new(&bound, &context).map_err(driver_error("cuStreamCreate"))?;
        drop(bound);
        Ok(Rc::new(Gpu {
            stream,
            _module: module,
            generate_data,
            verify_data,
            crc32c_chunks,
            device,
            ordinal,
            context,
        }))
    }

    /// Make this GPU's context current on the calling thread until the guard drops: every
    /// driver call that acts on "the current context" runs inside one (see `driver`).
    pub(crate) fn bind(&self) -> Result<Bound<'_>> {
        self.context
            .bind()
            .context("making the GPU's CUDA context current (cuCtxPushCurrent)")
    }

    /// A new stream of this GPU's context (copies that overlap the main stream's work).
    pub(crate) fn new_stream(&self) -> Result<driver::Stream> {
        let bound = self.bind()?;
        Ok(driver::Stream::new(&bound, &self.context)?)
    }

    /// A new event of this GPU's context; `timing` for the benchmark's timed events.
    pub(crate) fn new_event(&self, timing: bool) -> Result<driver::Event> {
        let bound = self.bind()?;
        Ok(driver::Event::new(&bound, &self.context, timing)?)
    }

    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    pub fn name(&self) -> String {
        driver::device_name(self.device).unwrap_or_else(|_| "unknown GPU".into())
    }

    pub fn raw_device(&self) -> i32 {
        self.device
    }

    /// The `verify_data` kernel of the loaded module (launched by `verify.rs`).
    pub(super) fn verify_data_kernel(&self) -> CUfunction {
        self.verify_data
    }

    /// The `crc32c_chunks` kernel of the loaded module (launched by `checksum.rs`).
    pub(crate) fn crc32c_chunks_kernel(&self) -> CUfunction {
        self.crc32c_chunks
    }

    /// The stream every launch and copy of this GPU runs on, in order.
    pub(crate) fn stream(&self) -> &driver::Stream {
        &self.stream
    }

    /// Wait for everything queued on the stream.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .context("the GPU failed while running queued work")
    }

    /// Wait for everything queued in this GPU's context, on any stream: a library
    /// caller's kernels (a tensor written on a side stream just before it is sent).
    pub fn synchronize_context(&self) -> Result<()> {
        driver::ctx_synchronize(&self.bind()?).context("the GPU failed while running queued work")
    }

    /// The checks every launch makes: the memory is this GPU's, 16-byte aligned, whole
    /// elements. Returns the element count.
    pub(super) fn kernel_elements(
        &self,
        kernel: &str,
        memory: &(impl GpuMemory + ?Sized),
    ) -> Result<u64> {
        if !std::ptr::eq(Rc::as_ptr(memory.gpu()), self) {
            bail!(
                "{kernel}: the memory belongs to another GPU value (GPU {}), not this GPU {}'s: use the Gpu that allocated it",
                memory.gpu().ordinal(),
                self.ordinal
            );
        }
        let misalignment = memory.device_ptr() % KERNEL_ALIGN;
        if misalignment != 0 {
            bail!(
                "{kernel}: memory must be {KERNEL_ALIGN}-byte aligned for the kernel's vector accesses; it starts {misalignment} bytes past a boundary"
            );
        }
        let len = memory.byte_len();
        if !len.is_multiple_of(ELEMENT_BYTES) {
            bail!("{kernel}: {len} bytes is not a whole number of i32 elements");
        }
        Ok((len / ELEMENT_BYTES) as u64)
    }

    /// Queue `generate_data` over `memory` on this GPU's stream and return at once.
    ///
    /// # Safety
    /// Until the stream has been synchronised (or an event recorded after the launch has
    /// completed), nothing may read or write `memory` and it must not be freed: the
    /// borrow ends when this returns, the kernel's writes do not.
    pub unsafe fn launch_generate(&self, memory: &mut (impl GpuMemoryMut + ?Sized)) -> Result<()> {
        let mut elements = self.kernel_elements("generate_data", memory)?;
        let mut ptr = memory.device_ptr();
        let bound = self.bind()?;
        let mut params = [
            (&mut ptr as *mut u64).cast::<c_void>(),
            (&mut elements as *mut u64).cast::<c_void>(),
        ];
        // SAFETY: generate_data(*mut i32, u64) of our module (loaded in this context,
        // which is bound), given two u64-sized values: a 16-byte aligned address of this
        // context's memory for `elements` i32s (checked above, and GpuMemory's promise)
        // and the count; the caller keeps everyone else off it until the launch completes.
        unsafe {
            driver::launch(
                &bound,
                self.generate_data,
                launch_grid(elements),
                BLOCK_THREADS,
                &self.stream,
                &mut params,
            )
        }
        .context("launching generate_data")
    }

    /// Fill `memory` with the pattern and wait for the kernel.
    pub fn generate(&self, memory: &mut (impl GpuMemoryMut + ?Sized)) -> Result<()> {
        // SAFETY: we synchronise before the borrow of `memory` ends.
        unsafe { self.launch_generate(memory)? };
        self.stream
            .synchronize()
            .context("generate_data failed while running")
    }

    /// Queue `cuMemsetD32` of `value` over `memory` (the benchmark's reference) and
    /// return at once.
    ///
    /// # Safety
    /// As for [`launch_generate`](Self::launch_generate).
    pub unsafe fn launch_memset_d32(
        &self,
        memory: &mut (impl GpuMemoryMut + ?Sized),
        value: u32,
    ) -> Result<()> {
        let elements = self.kernel_elements("cuMemsetD32", memory)?;
        let bound = self.bind()?;
        // SAFETY: memory of this context (checked), which is bound; 16-byte aligned whole
        // words; the caller keeps everyone else off it until the memset completes.
        unsafe {
            driver::memset_d32_async(
                &bound,
                memory.device_ptr(),
                value,
                elements as usize,
                &self.stream,
            )?
        };
        Ok(())
    }

    /// Fill `memory` with the 32-bit `value` and wait.
    pub fn fill_d32(&self, memory: &mut (impl GpuMemoryMut + ?Sized), value: u32) -> Result<()> {
        // SAFETY: we synchronise before the borrow ends.
        unsafe { self.launch_memset_d32(memory, value)? };
        self.synchronize()
    }

    /// Fill `memory` with `value` and wait, whatever its alignment and length (memory a
    /// caller lent need not be whole aligned words): 32-bit words where it is, else
    /// bytes, every byte then `value`'s first (little-endian) byte.
    pub fn fill_any(&self, memory: &mut (impl GpuMemoryMut + ?Sized), value: u32) -> Result<()> {
        if self.kernel_elements("cuMemsetD32", memory).is_ok() {
            return self.fill_d32(memory, value);
        }
        if !std::ptr::eq(Rc::as_ptr(memory.gpu()), self) {
            bail!("memset: the memory belongs to another GPU value");
        }
        let bound = self.bind()?;
        // SAFETY: memory of this context (checked), which is bound, `byte_len` bytes
        // (GpuMemory's promise); the exclusive borrow keeps everyone else off it, and we
        // synchronise before it ends.
        unsafe {
            driver::memset_d8_async(
                &bound,
                memory.device_ptr(),
                value.to_le_bytes()[0],
                memory.byte_len(),
                &self.stream,
            )?
        };
        self.synchronize()
    }
}
