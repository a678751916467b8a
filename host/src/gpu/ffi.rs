//! Driver API declarations that cust 0.3.2's bindings (cust_raw, CUDA 11.x era) lack or
//! declare too narrowly. They resolve against the same libcuda.so.1 as cust's.
//!
//! Results and attributes are plain `c_int` here: a newer driver may return a code or
//! accept an attribute that cust_raw's Rust enums do not list, and turning an unknown
//! number into a Rust enum would be undefined behaviour.

use std::os::raw::{c_char, c_int, c_ulonglong, c_void};

/// `CUresult` as the raw number.
pub type RawResult = c_int;

/// `CUDA_ERROR_NO_DEVICE`: the driver is installed and finds no GPU.
pub const CUDA_ERROR_NO_DEVICE: c_int = 100;

/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD` (CUDA 11.7+).
pub const MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: c_int = 1;

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
    /// Raw so that a code cust_raw's enum does not list (a newer driver's) stays a number.
    #[link_name = "cuInit"]
    pub fn cuInit_raw(flags: std::os::raw::c_uint) -> RawResult;

    #[link_name = "cuDeviceGetCount"]
    pub fn cuDeviceGetCount_raw(count: *mut c_int) -> RawResult;

    pub fn cuMemGetHandleForAddressRange(
        handle: *mut c_void,
        dptr: u64,
        size: usize,
        handle_type: c_int,
        flags: c_ulonglong,
    ) -> RawResult;

    #[link_name = "cuDeviceGetAttribute"]
    pub fn cuDeviceGetAttribute_raw(
        value: *mut c_int,
        attribute: c_int,
        device: c_int,
    ) -> RawResult;

    #[link_name = "cuGetErrorName"]
    pub fn cuGetErrorName_raw(code: RawResult, name: *mut *const c_char) -> RawResult;

    /// `target` 0 = current context, `scope` 100 = to owner, 200 = to all devices.
    #[link_name = "cuFlushGPUDirectRDMAWrites"]
    pub fn cuFlushGPUDirectRDMAWrites_raw(target: c_int, scope: c_int) -> RawResult;
}
