//! The CUDA driver API entry points this program calls, declared here with their results
//! as plain `c_int`.
//!
//! Why not cust_raw's declarations (cust 0.3.2's bindings)? They return `CUresult`, a
//! Rust enum of the codes CUDA 11 knew. A newer driver returns codes that enum does not
//! list (`CUDA_ERROR_CONTAINED` = 226, for example, after a contained GPU error), and an
//! enum holding a value outside its variants is undefined behaviour the moment it exists.
//! So every call goes through a declaration of our own; cust_raw still provides the handle
//! types and links `libcuda.so`. Attributes are raw numbers for the same reason.

use std::os::raw::{c_char, c_int, c_uint, c_ulonglong, c_void};

pub use cust::sys::{CUcontext, CUdevice, CUdeviceptr, CUevent, CUfunction, CUmodule, CUstream};

/// `CUresult` as the raw number.
pub type RawResult = c_int;

/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: c_int = 0;
/// `CUDA_ERROR_NO_DEVICE`: the driver is installed and finds no GPU.
pub const CUDA_ERROR_NO_DEVICE: c_int = 100;
/// `CUDA_ERROR_NOT_READY`: an event or stream query whose work is still running.
pub const CUDA_ERROR_NOT_READY: c_int = 600;

/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD` (CUDA 11.7+).
pub const MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: c_int = 1;
/// `CU_MEMHOSTALLOC_DEVICEMAP`.
pub const MEMHOSTALLOC_DEVICEMAP: c_uint = 0x02;
/// `CU_STREAM_NON_BLOCKING`.
pub const STREAM_NON_BLOCKING: c_uint = 0x1;
/// `CU_EVENT_DEFAULT` and `CU_EVENT_DISABLE_TIMING`.
pub const EVENT_DEFAULT: c_uint = 0x0;
pub const EVENT_DISABLE_TIMING: c_uint = 0x2;
/// `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`.
pub const FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: c_int = 0;
/// `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`.
pub const POINTER_ATTRIBUTE_SYNC_MEMOPS: c_int = 6;

/// `CUdevice_attribute` values read by `host info` and the path choice.
pub mod attribute {
    use std::os::raw::c_int;
    pub const MULTIPROCESSOR_COUNT: c_int = 16;
    pub const CAN_MAP_HOST_MEMORY: c_int = 19;
    pub const PCI_BUS_ID: c_int = 33;
    pub const PCI_DEVICE_ID: c_int = 34;
    pub const PCI_DOMAIN_ID: c_int = 50;
    pub const COMPUTE_CAPABILITY_MAJOR: c_int = 75;
    pub const COMPUTE_CAPABILITY_MINOR: c_int = 76;
    pub const GPU_DIRECT_RDMA_SUPPORTED: c_int = 116;
    pub const GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS: c_int = 117;
    pub const GPU_DIRECT_RDMA_WRITES_ORDERING: c_int = 118;
    pub const DMA_BUF_SUPPORTED: c_int = 124;
}

/// Bits of `GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS`.
pub const FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST: c_int = 1;
/// `CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER`: the owning GPU sees NIC writes in order.
pub const GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER: c_int = 100;

#[link(name = "cuda")]
extern "C" {
    #[link_name = "cuInit"]
    pub fn cuInit(flags: c_uint) -> RawResult;
    #[link_name = "cuGetErrorName"]
    pub fn cuGetErrorName(code: RawResult, name: *mut *const c_char) -> RawResult;

    #[link_name = "cuDeviceGetCount"]
    pub fn cuDeviceGetCount(count: *mut c_int) -> RawResult;
    #[link_name = "cuDeviceGet"]
    pub fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> RawResult;
    #[link_name = "cuDeviceGetName"]
    pub fn cuDeviceGetName(name: *mut c_char, len: c_int, device: CUdevice) -> RawResult;
    #[link_name = "cuDeviceTotalMem_v2"]
    pub fn cuDeviceTotalMem(bytes: *mut usize, device: CUdevice) -> RawResult;
    #[link_name = "cuDeviceGetAttribute"]
    pub fn cuDeviceGetAttribute(value: *mut c_int, attribute: c_int, device: CUdevice)
        -> RawResult;

    #[link_name = "cuDevicePrimaryCtxRetain"]
    pub fn cuDevicePrimaryCtxRetain(context: *mut CUcontext, device: CUdevice) -> RawResult;
    #[link_name = "cuDevicePrimaryCtxRelease_v2"]
    pub fn cuDevicePrimaryCtxRelease(device: CUdevice) -> RawResult;
    #[link_name = "cuCtxPushCurrent_v2"]
    pub fn cuCtxPushCurrent(context: CUcontext) -> RawResult;
    #[link_name = "cuCtxPopCurrent_v2"]
    pub fn cuCtxPopCurrent(context: *mut CUcontext) -> RawResult;

    #[link_name = "cuModuleLoadData"]
    pub fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> RawResult;
    #[link_name = "cuModuleUnload"]
    pub fn cuModuleUnload(module: CUmodule) -> RawResult;
    #[link_name = "cuModuleGetFunction"]
    pub fn cuModuleGetFunction(
        function: *mut CUfunction,
        module: CUmodule,
        name: *const c_char,
    ) -> RawResult;
    #[link_name = "cuFuncGetAttribute"]
    pub fn cuFuncGetAttribute(
        value: *mut c_int,
        attribute: c_int,
        function: CUfunction,
    ) -> RawResult;
    #[link_name = "cuLaunchKernel"]
    pub fn cuLaunchKernel(
        function: CUfunction,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        shared_bytes: c_uint,
        stream: CUstream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> RawResult;

    #[link_name = "cuStreamCreate"]
    pub fn cuStreamCreate(stream: *mut CUstream, flags: c_uint) -> RawResult;
    #[link_name = "cuStreamDestroy_v2"]
    pub fn cuStreamDestroy(stream: CUstream) -> RawResult;
    #[link_name = "cuStreamSynchronize"]
    pub fn cuStreamSynchronize(stream: CUstream) -> RawResult;
    #[link_name = "cuCtxSynchronize"]
    pub fn cuCtxSynchronize() -> RawResult;

    #[link_name = "cuEventCreate"]
    pub fn cuEventCreate(event: *mut CUevent, flags: c_uint) -> RawResult;
    #[link_name = "cuEventDestroy_v2"]
    pub fn cuEventDestroy(event: CUevent) -> RawResult;
    #[link_name = "cuEventRecord"]
    pub fn cuEventRecord(event: CUevent, stream: CUstream) -> RawResult;
    #[link_name = "cuEventQuery"]
    pub fn cuEventQuery(event: CUevent) -> RawResult;
    #[link_name = "cuEventSynchronize"]
    pub fn cuEventSynchronize(event: CUevent) -> RawResult;
    #[link_name = "cuEventElapsedTime"]
    pub fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent) -> RawResult;

    #[link_name = "cuMemAlloc_v2"]
    pub fn cuMemAlloc(ptr: *mut CUdeviceptr, bytes: usize) -> RawResult;
    #[link_name = "cuMemFree_v2"]
    pub fn cuMemFree(ptr: CUdeviceptr) -> RawResult;
    #[link_name = "cuMemHostAlloc"]
    pub fn cuMemHostAlloc(ptr: *mut *mut c_void, bytes: usize, flags: c_uint) -> RawResult;
    #[link_name = "cuMemFreeHost"]
    pub fn cuMemFreeHost(ptr: *mut c_void) -> RawResult;
    #[link_name = "cuMemHostGetDevicePointer_v2"]
    pub fn cuMemHostGetDevicePointer(
        device: *mut CUdeviceptr,
        host: *mut c_void,
        flags: c_uint,
    ) -> RawResult;
    #[link_name = "cuMemsetD32Async"]
    pub fn cuMemsetD32Async(
        ptr: CUdeviceptr,
        value: c_uint,
        count: usize,
        stream: CUstream,
    ) -> RawResult;
    #[link_name = "cuMemsetD8Async"]
    pub fn cuMemsetD8Async(
        ptr: CUdeviceptr,
        value: std::os::raw::c_uchar,
        count: usize,
        stream: CUstream,
    ) -> RawResult;
    #[link_name = "cuMemcpyDtoHAsync_v2"]
    pub fn cuMemcpyDtoHAsync(
        host: *mut c_void,
        device: CUdeviceptr,
        bytes: usize,
        stream: CUstream,
    ) -> RawResult;
    #[link_name = "cuMemcpyDtoDAsync_v2"]
    pub fn cuMemcpyDtoDAsync(
        destination: CUdeviceptr,
        source: CUdeviceptr,
        bytes: usize,
        stream: CUstream,
    ) -> RawResult;
    #[link_name = "cuMemcpyDtoH_v2"]
    pub fn cuMemcpyDtoH(host: *mut c_void, device: CUdeviceptr, bytes: usize) -> RawResult;
    #[link_name = "cuMemcpyHtoDAsync_v2"]
    pub fn cuMemcpyHtoDAsync(
        device: CUdeviceptr,
        host: *const c_void,
        bytes: usize,
        stream: CUstream,
    ) -> RawResult;
    #[link_name = "cuPointerSetAttribute"]
    pub fn cuPointerSetAttribute(
        value: *const c_void,
        attribute: c_int,
        ptr: CUdeviceptr,
    ) -> RawResult;

    #[link_name = "cuMemGetHandleForAddressRange"]
    pub fn cuMemGetHandleForAddressRange(
        handle: *mut c_void,
        dptr: CUdeviceptr,
        size: usize,
        handle_type: c_int,
        flags: c_ulonglong,
    ) -> RawResult;

    /// `target` 0 = current context, `scope` 100 = to owner, 200 = to all devices.
    #[link_name = "cuFlushGPUDirectRDMAWrites"]
    pub fn cuFlushGPUDirectRDMAWrites(target: c_int, scope: c_int) -> RawResult;
}
