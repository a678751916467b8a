//! The "result" layer over the CUDA driver API (cudarc's word for it): each function
//! makes one driver call through `ffi`, checks its raw result and turns a
//! failure into a [`DriverError`] that names the call.
//!
//! Two rules hold here, and the layer above relies on them:
//!
//! - **A context is bound around every call that acts on "the current context".** Such a
//!   function takes a `Bound`, which only `Bound::push` makes: it pushes a context
//!   onto the calling thread's stack and pops it when dropped. So no allocation, free,
//!   copy, launch, stream or event lands in whatever context some other code left current
//!   (cust's safe API can make any context current, and so can a second GPU opened on the
//!   same thread).
//! - **Raw addresses are `unsafe`.** Everything here is `pub(crate)`, and every function
//!   that takes a device or host address the driver cannot check is an `unsafe fn` with
//!   its contract beside it; the safe layer above (`allocations.rs`, `context.rs`) calls
//!   them only with addresses of memory it owns. Calls on an address the driver validates
//!   itself (it fails for memory it did not allocate) are safe functions.
//!
//! The handle owners (`PrimaryContext`, `Stream`, `Event`, `Module`) destroy their
//! object in `Drop`, binding their context for it; whoever holds one keeps its context
//! retained for longer (an `Rc<Gpu>`, or field order inside `Gpu`).

use super::ffi::{self, CUcontext, CUdevice, CUdeviceptr, CUevent, CUfunction, CUmodule, CUstream};
use std::ffi::{CStr, CString};
use std::marker::PhantomData;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::raw::{c_int, c_uint, c_void};

/// A failed driver call: which call, and the driver's name for the error.
#[derive(Debug, thiserror::Error)]
#[error("{call} failed: {name} ({code})")]
pub struct DriverError {
    pub call: &'static str,
    pub code: c_int,
    pub name: String,
}

pub type DriverResult<T> = Result<T, DriverError>;

/// The driver's name for a raw result code, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
fn error_name(code: c_int) -> String {
    let mut name = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static NUL-terminated string or
    // returns an error and leaves it untouched (we check for null below).
    let status = unsafe { ffi::cuGetErrorName(code, &mut name) };
    if status != ffi::CUDA_SUCCESS || name.is_null() {
        return format!("unknown CUDA error {code}");
    }
    // SAFETY: non-null, points to a static C string owned by the driver.
    unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

/// Turn a raw result into `Ok` or a [`DriverError`] for `call`.
pub(crate) fn check(call: &'static str, code: c_int) -> DriverResult<()> {
    if code == ffi::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(DriverError {
            call,
            code,
            name: error_name(code),
        })
    }
}

// --- no context needed -----------------------------------------------------------------

/// `cuInit(0)` as the raw result code: the caller tells "no GPU" apart from a broken
/// driver by the code.
pub(crate) fn init() -> c_int {
    // SAFETY: no pointers; cuInit may be called any number of times.
    unsafe { ffi::cuInit(0) }
}

/// `cuDeviceGetCount`.
pub(crate) fn device_count() -> DriverResult<c_int> {
    let mut count = 0;
    // SAFETY: count is a valid out-pointer.
    check("cuDeviceGetCount", unsafe {
        ffi::cuDeviceGetCount(&mut count)
    })?;
    Ok(count)
}

/// `cuDeviceGet`: the device handle of GPU `ordinal`.
pub(crate) fn device_get(ordinal: c_int) -> DriverResult<CUdevice> {
    let mut device = 0;
    // SAFETY: device is a valid out-pointer; a bad ordinal is reported as an error.
    check("cuDeviceGet", unsafe {
        ffi::cuDeviceGet(&mut device, ordinal)
    })?;
    Ok(device)
}

/// `cuDeviceGetName`.
pub(crate) fn device_name(device: CUdevice) -> DriverResult<String> {
    let mut name = [0 as std::os::raw::c_char; 256];
    // SAFETY: the buffer holds name.len() chars; the driver writes a NUL-terminated name
    // of at most that many.
    check("cuDeviceGetName", unsafe {
        ffi::cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int, device)
    })?;
    // SAFETY: NUL-terminated within the buffer (the driver's contract, and the buffer
    // started zeroed).
    Ok(unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

/// `cuDeviceTotalMem`: bytes of memory on the GPU.
pub(crate) fn device_total_memory(device: CUdevice) -> DriverResult<usize> {
    let mut bytes = 0;
    // SAFETY: bytes is a valid out-pointer.
    check("cuDeviceTotalMem", unsafe {
        ffi::cuDeviceTotalMem(&mut bytes, device)
    })?;
    Ok(bytes)
}

/// An integer device attribute by its raw number (see `ffi::attribute`).
pub(crate) fn device_attribute(device: CUdevice, attribute: c_int) -> DriverResult<c_int> {
    let mut value = 0;
    // SAFETY: value is a valid out-pointer; an unknown attribute is reported as an error.
    check("cuDeviceGetAttribute", unsafe {
        ffi::cuDeviceGetAttribute(&mut value, attribute, device)
    })?;
    Ok(value)
}

// --- contexts ----------------------------------------------------------------------------

/// The device's primary context, retained (`cuDevicePrimaryCtxRetain`) until dropped.
/// Every `Gpu` of one device shares it, as the CUDA runtime and cudarc do: opening the
/// same GPU twice costs no second context.
pub(crate) struct PrimaryContext {
    raw: CUcontext,
    device: CUdevice,
}

impl PrimaryContext {
    pub(crate) fn retain(device: CUdevice) -> DriverResult<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: raw is a valid out-pointer; the device handle came from cuDeviceGet.
        check("cuDevicePrimaryCtxRetain", unsafe {
            ffi::cuDevicePrimaryCtxRetain(&mut raw, device)
        })?;
        Ok(PrimaryContext { raw, device })
    }

    /// Make the context current on this thread until the returned guard drops.
    pub(crate) fn bind(&self) -> DriverResult<Bound<'_>> {
        Bound::push(self.raw)
    }

    pub(crate) fn raw(&self) -> CUcontext {
        self.raw
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: paired with the retain in `retain`; the owners of everything made in
        // the context (streams, events, modules, memory) drop before this (they hold the
        // Gpu that holds us, or come before us in its fields).
        unsafe { ffi::cuDevicePrimaryCtxRelease(self.device) };
    }
}

/// Proof that a context is current on this thread: [`push`](Bound::push) pushes it,
/// `Drop` pops it, so the thread's previous current context (anyone's) is back afterwards.
/// Not `Send`: a context stack belongs to one thread.
pub(crate) struct Bound<'c> {
    _context: PhantomData<&'c ()>,
    _one_thread: PhantomData<*const ()>,
}

impl Bound<'_> {
    /// `cuCtxPushCurrent(context)`. The caller holds the context alive for `'c`.
    fn push<'c>(context: CUcontext) -> DriverResult<Bound<'c>> {
        // SAFETY: a retained context (PrimaryContext holds it for the borrow 'c).
        check("cuCtxPushCurrent", unsafe {
            ffi::cuCtxPushCurrent(context)
        })?;
        Ok(Bound {
            _context: PhantomData,
            _one_thread: PhantomData,
        })
    }
}

impl Drop for Bound<'_> {
    fn drop(&mut self) {
        let mut popped = std::ptr::null_mut();
        // SAFETY: pops the context push() pushed: Bound is not Send, and every push in
        // this program is paired with this pop in reverse order (guards nest).
        unsafe { ffi::cuCtxPopCurrent(&mut popped) };
    }
}

// --- modules and launches ------------------------------------------------------------

/// A module loaded from PTX (`cuModuleLoadData`), unloaded in `Drop`.
pub(crate) struct Module {
    raw: CUmodule,
    context: CUcontext,
}

impl Module {
    /// JIT-compile and load `ptx` into the bound context.
    pub(crate) fn load(
        bound: &Bound<'_>,
        context: &PrimaryContext,
        ptx: &str,
    ) -> DriverResult<Self> {
        let _ = bound;
        let image = CString::new(ptx).map_err(|_| DriverError {
            call: "cuModuleLoadData",
            code: -1,
            name: "the PTX contains a NUL byte".into(),
        })?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: raw is a valid out-pointer; image is a NUL-terminated PTX text that
        // lives for the call; a context is bound (`bound`).
        check("cuModuleLoadData", unsafe {
            ffi::cuModuleLoadData(&mut raw, image.as_ptr().cast())
        })?;
        Ok(Module {
            raw,
            context: context.raw(),
        })
    }

    /// `cuModuleGetFunction(name)`.
    pub(crate) fn function(&self, name: &CStr) -> DriverResult<CUfunction> {
        let _bound = Bound::push(self.context)?;
        let mut function = std::ptr::null_mut();
        // SAFETY: the module is loaded (self lives); name is NUL-terminated.
        check("cuModuleGetFunction", unsafe {
            ffi::cuModuleGetFunction(&mut function, self.raw, name.as_ptr())
        })?;
        Ok(function)
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if let Ok(_bound) = Bound::push(self.context) {
            // SAFETY: loaded by us, unloaded once; its functions are only used by the Gpu
            // that owns this module, which is being dropped.
            unsafe { ffi::cuModuleUnload(self.raw) };
        }
    }
}

/// `cuFuncGetAttribute(MAX_THREADS_PER_BLOCK)`: the largest block `function` launches
/// with on this GPU (its registers per thread times the block must fit an SM).
pub(crate) fn max_threads_per_block(
    _bound: &Bound<'_>,
    function: CUfunction,
) -> DriverResult<c_int> {
    let mut value = 0;
    // SAFETY: value is a valid out-pointer; `function` is a kernel of a module loaded in
    // the bound context (the caller's Gpu keeps it loaded).
    check("cuFuncGetAttribute(MAX_THREADS_PER_BLOCK)", unsafe {
        ffi::cuFuncGetAttribute(
            &mut value,
            ffi::FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            function,
        )
    })?;
    Ok(value)
}

/// `cuLaunchKernel` on a 1-D grid.
///
/// # Safety
/// `function` is a kernel of a module loaded in the bound context and still loaded;
/// `params` point to values that match the kernel's parameters in number, order and
/// size; and the memory the kernel will touch through them is this context's, stays
/// allocated and is not accessed by anyone else until the launch has completed on
/// `stream`.
pub(crate) unsafe fn launch(
    _bound: &Bound<'_>,
    function: CUfunction,
    grid: u32,
    block: u32,
    stream: &Stream,
    params: &mut [*mut c_void],
) -> DriverResult<()> {
    // SAFETY: the caller's contract; the stream lives (borrowed).
    check("cuLaunchKernel", unsafe {
        ffi::cuLaunchKernel(
            function,
            grid,
            1,
            1,
            block,
            1,
            1,
            0,
            stream.raw,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}

// --- streams and events ------------------------------------------------------------------

/// A non-blocking stream (`cuStreamCreate`), destroyed in `Drop`.
pub(crate) struct Stream {
    raw: CUstream,
    context: CUcontext,
}

impl Stream {
    pub(crate) fn new(_bound: &Bound<'_>, context: &PrimaryContext) -> DriverResult<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: raw is a valid out-pointer; a context is bound.
        check("cuStreamCreate", unsafe {
            ffi::cuStreamCreate(&mut raw, ffi::STREAM_NON_BLOCKING)
        })?;
        Ok(Stream {
            raw,
            context: context.raw(),
        })
    }

    /// Wait for everything queued on the stream.
    pub(crate) fn synchronize(&self) -> DriverResult<()> {
        let _bound = Bound::push(self.context)?;
        // SAFETY: a live stream of this context.
        check("cuStreamSynchronize", unsafe {
            ffi::cuStreamSynchronize(self.raw)
        })
    }

    /// Whether `other` was created in the same context.
    pub(crate) fn same_context(&self, context: CUcontext) -> bool {
        self.context == context
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Ok(_bound) = Bound::push(self.context) {
            // SAFETY: created by us, destroyed once; queued work still completes (the
            // driver defers the release), and its owners wait for it before freeing
            // memory the work uses.
            unsafe { ffi::cuStreamDestroy(self.raw) };
        }
    }
}

/// An event (`cuEventCreate`), destroyed in `Drop`.
pub(crate) struct Event {
    raw: CUevent,
    context: CUcontext,
}

impl Event {
    pub(crate) fn new(
        _bound: &Bound<'_>,
        context: &PrimaryContext,
        timing: bool,
    ) -> DriverResult<Self> {
        let flags = if timing {
            ffi::EVENT_DEFAULT
        } else {
            ffi::EVENT_DISABLE_TIMING
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: raw is a valid out-pointer; a context is bound.
        check("cuEventCreate", unsafe {
            ffi::cuEventCreate(&mut raw, flags)
        })?;
        Ok(Event {
            raw,
            context: context.raw(),
        })
    }

    /// Record the event on `stream`, which must be of the same context (checked: the
    /// driver's behaviour for a stream of another context is undefined).
    pub(crate) fn record(&self, stream: &Stream) -> DriverResult<()> {
        if !stream.same_context(self.context) {
            return Err(DriverError {
                call: "cuEventRecord",
                code: -1,
                name: "the stream belongs to another CUDA context than the event".into(),
            });
        }
        let _bound = Bound::push(self.context)?;
        // SAFETY: both handles live and of one context (checked).
        check("cuEventRecord", unsafe {
            ffi::cuEventRecord(self.raw, stream.raw)
        })
    }

    /// Whether the work before the event's record has completed.
    pub(crate) fn is_complete(&self) -> DriverResult<bool> {
        let _bound = Bound::push(self.context)?;
        // SAFETY: a live event.
        match unsafe { ffi::cuEventQuery(self.raw) } {
            ffi::CUDA_SUCCESS => Ok(true),
            ffi::CUDA_ERROR_NOT_READY => Ok(false),
            code => check("cuEventQuery", code).map(|()| false),
        }
    }

    pub(crate) fn synchronize(&self) -> DriverResult<()> {
        let _bound = Bound::push(self.context)?;
        // SAFETY: a live event.
        check("cuEventSynchronize", unsafe {
            ffi::cuEventSynchronize(self.raw)
        })
    }

    /// Milliseconds from `start`'s completion to this event's (both timing events of one
    /// context, both completed).
    pub(crate) fn elapsed_since(&self, start: &Event) -> DriverResult<f32> {
        let _bound = Bound::push(self.context)?;
        let mut ms = 0f32;
        // SAFETY: ms is a valid out-pointer; both events live; the driver reports an
        // error for events of other contexts or not yet recorded.
        check("cuEventElapsedTime", unsafe {
            ffi::cuEventElapsedTime(&mut ms, start.raw, self.raw)
        })?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(_bound) = Bound::push(self.context) {
            // SAFETY: created by us, destroyed once.
            unsafe { ffi::cuEventDestroy(self.raw) };
        }
    }
}

// --- memory ------------------------------------------------------------------------------

/// `cuMemAlloc`: `len` bytes of device memory (at least 256-byte aligned).
pub(crate) fn mem_alloc(_bound: &Bound<'_>, len: usize) -> DriverResult<CUdeviceptr> {
    let mut ptr = 0;
    // SAFETY: ptr is a valid out-pointer; a context is bound.
    check("cuMemAlloc", unsafe { ffi::cuMemAlloc(&mut ptr, len) })?;
    Ok(ptr)
}

/// `cuMemFree`.
///
/// # Safety
/// `ptr` came from [`mem_alloc`] in the bound context, is freed once, and no work that
/// uses it is pending.
pub(crate) unsafe fn mem_free(_bound: &Bound<'_>, ptr: CUdeviceptr) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    check("cuMemFree", unsafe { ffi::cuMemFree(ptr) })
}

/// `cuMemHostAlloc`: page-locked host memory; with `device_map`, also mapped into the
/// GPU's address space so kernels can write it directly.
pub(crate) fn mem_host_alloc(
    _bound: &Bound<'_>,
    len: usize,
    device_map: bool,
) -> DriverResult<*mut u8> {
    let flags = if device_map {
        ffi::MEMHOSTALLOC_DEVICEMAP
    } else {
        0
    };
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: ptr is a valid out-pointer; a context is bound.
    check("cuMemHostAlloc", unsafe {
        ffi::cuMemHostAlloc(&mut ptr, len, flags)
    })?;
    Ok(ptr.cast())
}

/// `cuMemFreeHost`.
///
/// # Safety
/// `ptr` came from [`mem_host_alloc`], is freed once, and nothing (GPU or NIC) still uses it.
pub(crate) unsafe fn mem_free_host(_bound: &Bound<'_>, ptr: *mut u8) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    check("cuMemFreeHost", unsafe { ffi::cuMemFreeHost(ptr.cast()) })
}

/// `cuMemHostGetDevicePointer`: the GPU address of mapped host memory. The driver
/// fails for a pointer it did not allocate.
pub(crate) fn host_device_pointer(_bound: &Bound<'_>, host: *mut u8) -> DriverResult<CUdeviceptr> {
    let mut device = 0;
    // SAFETY: device is a valid out-pointer; the driver looks `host` up among its own
    // allocations and never dereferences it.
    check("cuMemHostGetDevicePointer", unsafe {
        ffi::cuMemHostGetDevicePointer(&mut device, host.cast(), 0)
    })?;
    Ok(device)
}

/// `cuMemsetD32Async` of `count` 32-bit words at `ptr`.
///
/// # Safety
/// `[ptr, ptr + 4 * count)` is device-accessible memory of the bound context, 4-byte
/// aligned, that stays allocated and is not otherwise accessed until the memset has
/// completed on `stream` (the driver checks only that `ptr` is in *some* allocation).
pub(crate) unsafe fn memset_d32_async(
    _bound: &Bound<'_>,
    ptr: CUdeviceptr,
    value: u32,
    count: usize,
    stream: &Stream,
) -> DriverResult<()> {
    // SAFETY: the caller's contract; the stream is alive (borrowed).
    check("cuMemsetD32Async", unsafe {
        ffi::cuMemsetD32Async(ptr, value as c_uint, count, stream.raw)
    })
}

/// `cuMemsetD8Async`.
///
/// # Safety
/// `[ptr, ptr + count)` must be device memory of the bound context that nothing else
/// reads or writes until the stream has passed the memset.
pub(crate) unsafe fn memset_d8_async(
    _bound: &Bound<'_>,
    ptr: CUdeviceptr,
    value: u8,
    count: usize,
    stream: &Stream,
) -> DriverResult<()> {
    // SAFETY: the caller's contract; the stream is alive (borrowed).
    check("cuMemsetD8Async", unsafe {
        ffi::cuMemsetD8Async(ptr, value, count, stream.raw)
    })
}

/// `cuMemcpyDtoHAsync`.
///
/// # Safety
/// `host` is valid for `len` bytes, page-locked for true asynchrony, and neither read nor
/// freed until the copy has completed on `stream`; the device range is memory of the
/// bound context that nothing writes meanwhile.
pub(crate) unsafe fn memcpy_dtoh_async(
    _bound: &Bound<'_>,
    host: *mut u8,
    device: CUdeviceptr,
    len: usize,
    stream: &Stream,
) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    check("cuMemcpyDtoHAsync", unsafe {
        ffi::cuMemcpyDtoHAsync(host.cast(), device, len, stream.raw)
    })
}

/// `cuMemcpyDtoDAsync` of `len` bytes on `stream` (the CRC benchmark's reference).
///
/// # Safety
/// Both ranges are device-accessible memory of the bound context, `len` bytes long, not
/// overlapping, that stay allocated and that nothing else accesses until the copy has
/// completed on `stream`.
pub(crate) unsafe fn memcpy_dtod_async(
    _bound: &Bound<'_>,
    destination: CUdeviceptr,
    source: CUdeviceptr,
    len: usize,
    stream: &Stream,
) -> DriverResult<()> {
    // SAFETY: the caller's contract; the stream is alive (borrowed).
    check("cuMemcpyDtoDAsync", unsafe {
        ffi::cuMemcpyDtoDAsync(destination, source, len, stream.raw)
    })
}

/// `cuMemcpyDtoH` (synchronous) into a slice.
///
/// # Safety
/// `[device, device + out.len())` is device-accessible memory of the bound context that
/// no GPU work writes during the copy.
pub(crate) unsafe fn memcpy_dtoh(
    _bound: &Bound<'_>,
    out: &mut [u8],
    device: CUdeviceptr,
) -> DriverResult<()> {
    // SAFETY: out is valid for out.len() bytes and borrowed mutably for the whole call;
    // the device range is the caller's contract.
    check("cuMemcpyDtoH", unsafe {
        ffi::cuMemcpyDtoH(out.as_mut_ptr().cast(), device, out.len())
    })
}

/// `cuMemcpyHtoDAsync` of `len` bytes from `host`, on `stream`.
///
/// # Safety
/// `[device, device + len)` is device memory of the bound context that nothing else
/// accesses until the copy has completed on `stream`, and `host` is valid for `len`
/// bytes that stay unmodified until then (for pageable memory the driver copies them
/// before returning).
pub(crate) unsafe fn memcpy_htod_async(
    _bound: &Bound<'_>,
    device: CUdeviceptr,
    host: *const u8,
    len: usize,
    stream: &Stream,
) -> DriverResult<()> {
    // SAFETY: the caller's contract; the stream is alive (borrowed).
    check("cuMemcpyHtoDAsync", unsafe {
        ffi::cuMemcpyHtoDAsync(device, host.cast(), len, stream.raw)
    })
}

/// `cuPointerSetAttribute(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS)`: synchronous memory
/// operations on this allocation finish before they return, so a NIC reading it never
/// races a copy the CUDA runtime still thinks is in flight. NVIDIA's GPUDirect RDMA guide
/// asks for it on memory shared with a third-party device. The driver fails for an
/// address that is not in one of its allocations.
/// `cuCtxSynchronize`: wait for all work queued in the bound context, on every stream
/// (a library caller's too).
pub(crate) fn ctx_synchronize(_bound: &Bound<'_>) -> DriverResult<()> {
    // SAFETY: no arguments; the bound context is current on this thread.
    check("cuCtxSynchronize", unsafe { ffi::cuCtxSynchronize() })
}

pub(crate) fn set_sync_memops(_bound: &Bound<'_>, ptr: CUdeviceptr) -> DriverResult<()> {
    let enable: c_int = 1;
    // SAFETY: the value pointer is valid for the call; the driver looks ptr up among its
    // allocations and never dereferences it.
    check("cuPointerSetAttribute(SYNC_MEMOPS)", unsafe {
        ffi::cuPointerSetAttribute(
            (&enable as *const c_int).cast(),
            ffi::POINTER_ATTRIBUTE_SYNC_MEMOPS,
            ptr,
        )
    })
}

/// `cuMemGetHandleForAddressRange(DMA_BUF_FD)`: a dma-buf file descriptor for
/// `[ptr, ptr + len)`, which must be aligned to the host page size and lie inside one
/// allocation (the driver checks both and fails otherwise). The fd is closed when the
/// returned `OwnedFd` drops.
pub(crate) fn export_dma_buf(
    _bound: &Bound<'_>,
    ptr: CUdeviceptr,
    len: usize,
) -> DriverResult<OwnedFd> {
    let mut fd: c_int = -1;
    // SAFETY: fd is a valid out-pointer for the int the DMA_BUF_FD handle type writes.
    check("cuMemGetHandleForAddressRange(DMA_BUF_FD)", unsafe {
        ffi::cuMemGetHandleForAddressRange(
            (&mut fd as *mut c_int).cast(),
            ptr,
            len,
            ffi::MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    })?;
    // SAFETY: on success the driver returns a new open fd that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `cuFlushGPUDirectRDMAWrites(current context, to owner)`: make the NIC's writes to
/// the bound context's memory visible to its next kernels.
pub(crate) fn flush_gpudirect_rdma_writes(_bound: &Bound<'_>) -> DriverResult<()> {
    // SAFETY: no pointers; a context is bound.
    check("cuFlushGPUDirectRDMAWrites", unsafe {
        ffi::cuFlushGPUDirectRDMAWrites(0, ffi::GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_code_no_enum_lists_stays_a_number() {
        // 226 is CUDA_ERROR_CONTAINED (CUDA 12.x), unknown to cust_raw's CUresult enum;
        // 987654 is nobody's. Both must come back as numbers with a name, not as an
        // invalid enum value.
        let contained = check("cuTest", 226).unwrap_err();
        assert_eq!(contained.code, 226);
        assert!(
            ["CUDA_ERROR_CONTAINED", "unknown CUDA error 226"].contains(&contained.name.as_str()),
            "{contained}"
        );
        let nobodys = check("cuTest", 987_654).unwrap_err();
        assert_eq!(
            nobodys.to_string(),
            "cuTest failed: unknown CUDA error 987654 (987654)"
        );
        assert!(check("cuTest", ffi::CUDA_SUCCESS).is_ok());
    }
}
