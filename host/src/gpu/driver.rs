//! The "result" layer over the CUDA driver API (cudarc's word for it): each function
//! makes one driver call that cust does not wrap (or wraps differently than this program
//! needs), checks its result and turns a failure into a [`DriverError`] that names the
//! call.
//!
//! Everything here is `pub(crate)`, and every function that takes a raw device or host
//! address the driver cannot check is an `unsafe fn` with its contract written beside it:
//! the safe layer above (`allocations.rs`, `context.rs`) calls them only with addresses
//! of memory it owns. Calls on an address the driver validates itself (it fails with an
//! error for memory it did not allocate) are safe functions.

use super::ffi;
use cust::sys as cu;
use std::ffi::CStr;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::raw::{c_int, c_void};

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
    // returns an error and leaves it untouched (we checked for null below).
    let status = unsafe { ffi::cuGetErrorName_raw(code, &mut name) };
    if status != 0 || name.is_null() {
        return format!("unknown CUDA error {code}");
    }
    // SAFETY: non-null, points to a static C string owned by the driver.
    unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

/// Turn a raw result into `Ok` or a [`DriverError`] for `call`.
pub(crate) fn check_raw(call: &'static str, code: c_int) -> DriverResult<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(DriverError {
            call,
            code,
            name: error_name(code),
        })
    }
}

/// The same for cust_raw's enum-typed results.
pub(crate) fn check(call: &'static str, result: cu::CUresult) -> DriverResult<()> {
    check_raw(call, result as c_int)
}

/// An integer device attribute by its raw number (see `ffi::attribute`).
pub(crate) fn device_attribute(device: c_int, attribute: c_int) -> DriverResult<c_int> {
    let mut value = 0;
    // SAFETY: value is a valid out-pointer; an unknown attribute is reported as an error.
    check_raw("cuDeviceGetAttribute", unsafe {
        ffi::cuDeviceGetAttribute_raw(&mut value, attribute, device)
    })?;
    Ok(value)
}

/// `cuMemAlloc`: `len` bytes of device memory (at least 256-byte aligned).
pub(crate) fn mem_alloc(len: usize) -> DriverResult<u64> {
    let mut ptr = 0;
    // SAFETY: ptr is a valid out-pointer; a context is current (the caller holds a Gpu).
    check("cuMemAlloc", unsafe { cu::cuMemAlloc_v2(&mut ptr, len) })?;
    Ok(ptr)
}

/// `cuMemFree`.
///
/// # Safety
/// `ptr` came from [`mem_alloc`], is freed once, and no work that uses it is pending.
pub(crate) unsafe fn mem_free(ptr: u64) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    check("cuMemFree", unsafe { cu::cuMemFree_v2(ptr) })
}

/// `cuMemHostAlloc`: page-locked host memory; with `device_map`, also mapped into the
/// GPU's address space so kernels can write it directly.
pub(crate) fn mem_host_alloc(len: usize, device_map: bool) -> DriverResult<*mut u8> {
    let flags = if device_map {
        cu::CU_MEMHOSTALLOC_DEVICEMAP
    } else {
        0
    };
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: ptr is a valid out-pointer.
    check("cuMemHostAlloc", unsafe {
        cu::cuMemHostAlloc(&mut ptr, len, flags)
    })?;
    Ok(ptr.cast())
}

/// `cuMemFreeHost`.
///
/// # Safety
/// `ptr` came from [`mem_host_alloc`], is freed once, and nothing (GPU or NIC) still uses it.
pub(crate) unsafe fn mem_free_host(ptr: *mut u8) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    check("cuMemFreeHost", unsafe { cu::cuMemFreeHost(ptr.cast()) })
}

/// `cuMemHostGetDevicePointer`: the GPU address of mapped host memory. The driver
/// fails for a pointer it did not allocate.
pub(crate) fn host_device_pointer(host: *mut u8) -> DriverResult<u64> {
    let mut device = 0;
    // SAFETY: device is a valid out-pointer; the driver looks `host` up among its own
    // allocations and never dereferences it.
    check("cuMemHostGetDevicePointer", unsafe {
        cu::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0)
    })?;
    Ok(device)
}

/// `cuMemsetD32Async` of `count` 32-bit words at `ptr`.
///
/// # Safety
/// `[ptr, ptr + 4 * count)` is device-accessible memory of the current context, 4-byte
/// aligned, that stays allocated and is not otherwise accessed until the memset has
/// completed on `stream` (the driver checks only that `ptr` is in *some* allocation).
pub(crate) unsafe fn memset_d32_async(
    ptr: u64,
    value: u32,
    count: usize,
    stream: &cust::stream::Stream,
) -> DriverResult<()> {
    // SAFETY: the caller's contract; the stream is alive (borrowed).
    check("cuMemsetD32Async", unsafe {
        cu::cuMemsetD32Async(ptr, value, count, stream.as_inner())
    })
}

/// `cuMemcpyDtoHAsync`.
///
/// # Safety
/// `host` is valid for `len` bytes, page-locked for true asynchrony, and neither read nor
/// freed until the copy has completed on `stream`.
pub(crate) unsafe fn memcpy_dtoh_async(
    host: *mut u8,
    device: u64,
    len: usize,
    stream: cu::CUstream,
) -> DriverResult<()> {
    // SAFETY: the caller's contract.
    check("cuMemcpyDtoHAsync", unsafe {
        cu::cuMemcpyDtoHAsync_v2(host.cast(), device, len, stream)
    })
}

/// `cuMemcpyDtoDAsync` of `len` bytes on `stream` (the CRC benchmark's reference).
///
/// # Safety
/// Both ranges are device-accessible memory of the current context, `len` bytes long,
/// not overlapping, that stay allocated and that nothing else accesses until the copy
/// has completed on `stream`.
pub(crate) unsafe fn memcpy_dtod_async(
    destination: u64,
    source: u64,
    len: usize,
    stream: &cust::stream::Stream,
) -> DriverResult<()> {
    // SAFETY: the caller's contract; the stream is alive (borrowed).
    check("cuMemcpyDtoDAsync", unsafe {
        cu::cuMemcpyDtoDAsync_v2(destination, source, len, stream.as_inner())
    })
}

/// `cuMemcpyDtoH` (synchronous) into a slice.
///
/// # Safety
/// `[device, device + out.len())` is device-accessible memory that no GPU work writes
/// during the copy.
pub(crate) unsafe fn memcpy_dtoh(out: &mut [u8], device: u64) -> DriverResult<()> {
    // SAFETY: out is valid for out.len() bytes and borrowed mutably for the whole call;
    // the device range is the caller's contract.
    check("cuMemcpyDtoH", unsafe {
        cu::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), device, out.len())
    })
}

/// `cuMemcpyHtoDAsync` from a slice, on `stream`.
///
/// # Safety
/// `[device, device + data.len())` is device-accessible memory that nothing else
/// accesses until the copy has completed on `stream`, and `data` stays valid and
/// unmodified until then (for pageable memory the driver copies it before returning).
pub(crate) unsafe fn memcpy_htod_async(
    device: u64,
    data: &[u8],
    stream: &cust::stream::Stream,
) -> DriverResult<()> {
    // SAFETY: the caller's contract; the stream is alive (borrowed).
    check("cuMemcpyHtoDAsync", unsafe {
        cu::cuMemcpyHtoDAsync_v2(device, data.as_ptr().cast(), data.len(), stream.as_inner())
    })
}

/// `cuPointerSetAttribute(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS)`: synchronous memory
/// operations on this allocation finish before they return, so a NIC reading it never
/// races a copy the CUDA runtime still thinks is in flight. NVIDIA's GPUDirect RDMA guide
/// asks for it on memory shared with a third-party device. The driver fails for an
/// address that is not in one of its allocations.
pub(crate) fn set_sync_memops(ptr: u64) -> DriverResult<()> {
    let enable: c_int = 1;
    // SAFETY: the value pointer is valid for the call; the driver looks ptr up among its
    // allocations and never dereferences it.
    check("cuPointerSetAttribute(SYNC_MEMOPS)", unsafe {
        cu::cuPointerSetAttribute(
            (&enable as *const c_int).cast(),
            cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
            ptr,
        )
    })
}

/// `cuMemGetHandleForAddressRange(DMA_BUF_FD)`: a dma-buf file descriptor for
/// `[ptr, ptr + len)`, which must be aligned to the host page size and lie inside one
/// allocation (the driver checks both and fails otherwise). The fd is closed when the
/// returned `OwnedFd` drops.
pub(crate) fn export_dma_buf(ptr: u64, len: usize) -> DriverResult<OwnedFd> {
    let mut fd: c_int = -1;
    // SAFETY: fd is a valid out-pointer for the int the DMA_BUF_FD handle type writes.
    check_raw("cuMemGetHandleForAddressRange(DMA_BUF_FD)", unsafe {
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

/// `cuInit(0)` as the raw result code: the caller tells "no GPU" apart from a broken
/// driver by the code, which cust would fold into `UnknownError` for some values.
pub(crate) fn init() -> c_int {
    // SAFETY: no pointers; cuInit may be called any number of times.
    unsafe { ffi::cuInit_raw(0) }
}

/// `cuDeviceGetCount`.
pub(crate) fn device_count() -> DriverResult<c_int> {
    let mut count = 0;
    // SAFETY: count is a valid out-pointer.
    check_raw("cuDeviceGetCount", unsafe {
        ffi::cuDeviceGetCount_raw(&mut count)
    })?;
    Ok(count)
}

/// `cuFlushGPUDirectRDMAWrites(current context, to owner)`: make the NIC's writes to
/// this GPU's memory visible to its next kernels.
pub(crate) fn flush_gpudirect_rdma_writes() -> DriverResult<()> {
    // SAFETY: no pointers; a context is current.
    check_raw("cuFlushGPUDirectRDMAWrites", unsafe {
        ffi::cuFlushGPUDirectRDMAWrites_raw(0, ffi::GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER)
    })
}
