//! NCCL's net plugin ABI, declared in Rust from NCCL 2.28's headers
//! (`src/include/plugin/nccl_net.h`, `plugin/net/net_v11.h`, `net_v10.h`, `net_v9.h`,
//! `net_v8.h`, `nccl_common.h`, `nccl_device/net_device.h`): the property structs, the
//! function tables and the constants this plugin uses. Only types live here; the
//! functions are in `ffi/`. Each struct's size and every field's offset is tested
//! below against numbers worked out by hand from the C declarations (x86_64, LP64:
//! `int`, `float` and enums 4 bytes, pointers, `size_t` and `uint64_t` 8 bytes, a
//! struct aligned to its widest member).
#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_float, c_int, c_ulong, c_void};

/// `ncclResult_t` (nccl.h). A transparent `int` rather than a Rust enum, so that a
/// value from the other side of the boundary can never be an invalid enum.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NcclResult(pub c_int);

impl NcclResult {
    pub const SUCCESS: Self = Self(0);
    pub const SYSTEM_ERROR: Self = Self(2);
    pub const INTERNAL_ERROR: Self = Self(3);
    pub const INVALID_ARGUMENT: Self = Self(4);
    pub const INVALID_USAGE: Self = Self(5);
    pub const REMOTE_ERROR: Self = Self(6);
}

/// `NCCL_NET_HANDLE_MAXSIZE`: the bytes `listen` may write into the handle.
pub const NCCL_NET_HANDLE_MAXSIZE: usize = 128;
/// `NCCL_NET_MAX_REQUESTS`: requests NCCL keeps in flight per comm at most.
pub const NCCL_NET_MAX_REQUESTS: usize = 32;
/// `NCCL_NET_MAX_DEVS_PER_NIC` (v9, v10) and `NCCL_NET_MAX_DEVS_PER_NIC_V11`.
pub const NCCL_NET_MAX_DEVS_PER_NIC: usize = 4;
/// `NCCL_PTR_HOST`, `NCCL_PTR_CUDA`, `NCCL_PTR_DMABUF`: the `ptrSupport` bits.
pub const NCCL_PTR_HOST: c_int = 0x1;
pub const NCCL_PTR_CUDA: c_int = 0x2;
pub const NCCL_PTR_DMABUF: c_int = 0x4;
/// `NCCL_MAX_NET_SIZE_BYTES` (1 TiB) and `MAX_COLLNET_SIZE` (512 MiB), nccl_net.h.
pub const NCCL_MAX_NET_SIZE_BYTES: usize = 1 << 40;
pub const MAX_COLLNET_SIZE: usize = 512 << 20;
/// `ncclNetDeviceType::NCCL_NET_DEVICE_HOST` and `NCCL_NET_DEVICE_INVALID_VERSION`
/// (net_device.h): no device offload, the proxy thread moves the data.
pub const NCCL_NET_DEVICE_HOST: c_int = 0;
pub const NCCL_NET_DEVICE_INVALID_VERSION: c_int = 0;

/// `ncclDebugLogLevel` (nccl_common.h).
pub const NCCL_LOG_WARN: c_int = 2;
pub const NCCL_LOG_INFO: c_int = 3;
pub const NCCL_LOG_TRACE: c_int = 5;
/// `ncclDebugLogSubSys`: `NCCL_INIT`, `NCCL_NET`.
pub const NCCL_INIT: c_ulong = 0x1;
pub const NCCL_NET: c_ulong = 0x10;

/// `ncclDebugLogger_t`: `void (*)(ncclDebugLogLevel level, unsigned long flags,
/// const char* file, int line, const char* fmt, ...)`. A C variadic; this plugin
/// always calls it with the format `"%s"` and one string.
pub type NcclDebugLogger = Option<
    unsafe extern "C" fn(
        level: c_int,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    ),
>;

/// `ncclProfilerCallback_t`: `ncclResult_t (*)(void** eHandle, int type, void* pHandle,
/// int64_t pluginId, void* extData)`. Taken by `init` and not used.
pub type NcclProfilerCallback = Option<
    unsafe extern "C" fn(
        e_handle: *mut *mut c_void,
        kind: c_int,
        p_handle: *mut c_void,
        plugin_id: i64,
        ext_data: *mut c_void,
    ) -> NcclResult,
>;

/// `ncclNetVDeviceProps_v9_t` = `_v10_t` = `_v11_t`: `{ int ndevs; int devs[4]; }`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NcclNetVDeviceProps {
    pub ndevs: c_int,
    pub devs: [c_int; NCCL_NET_MAX_DEVS_PER_NIC],
}

/// `ncclNetCommConfig_v11_t` (given to v11's `init`) and `_v10_t` (given to v10's
/// `connect`): `{ int trafficClass; }`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclNetCommConfig {
    pub trafficClass: c_int,
}

/// `ncclNetDeviceHandle_v7_t`, which v8 to v11 typedef unchanged. This plugin offloads
/// nothing to the device, so never writes one.
#[repr(C)]
#[derive(Debug)]
pub struct NcclNetDeviceHandle {
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
    pub handle: *mut c_void,
    pub size: usize,
    pub needsProxyProgress: c_int,
}

/// `ncclNetProperties_v11_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclNetPropertiesV11 {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub regIsGlobal: c_int,
    pub forceFlush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: c_float,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
    pub vProps: NcclNetVDeviceProps,
    pub maxP2pBytes: usize,
    pub maxCollBytes: usize,
    pub maxMultiRequestSize: c_int,
}

/// `ncclNetProperties_v10_t` and `_v9_t` (identical): v11's without
/// `maxMultiRequestSize`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclNetPropertiesV9 {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub regIsGlobal: c_int,
    pub forceFlush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: c_float,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
    pub vProps: NcclNetVDeviceProps,
    pub maxP2pBytes: usize,
    pub maxCollBytes: usize,
}

/// `ncclNetProperties_v8_t`: no `forceFlush`, no virtual devices, no size limits.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclNetPropertiesV8 {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub regIsGlobal: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: c_float,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
}

/// `ncclNetCommAttr_v11_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclNetCommAttr {
    pub maxConcurrentPeers: i32,
    pub minConcurrentPeers: i32,
    pub maxFlowsPerPeer: i32,
    pub minFlowsPerPeer: i32,
}

/// `ncclNetAttr_v11_t`, the argument of `setNetAttr` (which this plugin leaves null).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclNetAttr {
    pub sendCommAttr: NcclNetCommAttr,
    pub recvCommAttr: NcclNetCommAttr,
    pub op: u32,
    pub algo: u32,
    pub proto: u32,
}

type Ptr = *mut c_void;
type PPtr = *mut *mut c_void;
type DevHandle = *mut *mut NcclNetDeviceHandle;

// The function types every table shares (same C signature in v8 to v11).
pub type DevicesFn = unsafe extern "C" fn(ndev: *mut c_int) -> NcclResult;
pub type AcceptFn =
    unsafe extern "C" fn(listen_comm: Ptr, recv_comm: PPtr, recv_dev_comm: DevHandle) -> NcclResult;
pub type RegMrFn = unsafe extern "C" fn(
    comm: Ptr,
    data: Ptr,
    size: usize,
    kind: c_int,
    mhandle: PPtr,
) -> NcclResult;
pub type RegMrDmaBufFn = unsafe extern "C" fn(
    comm: Ptr,
    data: Ptr,
    size: usize,
    kind: c_int,
    offset: u64,
    fd: c_int,
    mhandle: PPtr,
) -> NcclResult;
pub type DeregMrFn = unsafe extern "C" fn(comm: Ptr, mhandle: Ptr) -> NcclResult;
pub type IflushFn = unsafe extern "C" fn(
    recv_comm: Ptr,
    n: c_int,
    data: PPtr,
    sizes: *mut c_int,
    mhandles: PPtr,
    request: PPtr,
) -> NcclResult;
pub type TestFn =
    unsafe extern "C" fn(request: Ptr, done: *mut c_int, sizes: *mut c_int) -> NcclResult;
pub type CloseFn = unsafe extern "C" fn(comm: Ptr) -> NcclResult;
pub type GetDeviceMrFn =
    unsafe extern "C" fn(comm: Ptr, mhandle: Ptr, dptr_mhandle: PPtr) -> NcclResult;
pub type IrecvConsumedFn =
    unsafe extern "C" fn(recv_comm: Ptr, n: c_int, request: Ptr) -> NcclResult;
pub type MakeVDeviceFn =
    unsafe extern "C" fn(d: *mut c_int, props: *mut NcclNetVDeviceProps) -> NcclResult;

// v11 (and v10, v9 where noted): the functions whose signatures changed.
pub type InitV11Fn = unsafe extern "C" fn(
    ctx: PPtr,
    comm_id: u64,
    config: *mut NcclNetCommConfig,
    log: NcclDebugLogger,
    prof: NcclProfilerCallback,
) -> NcclResult;
pub type InitV10Fn =
    unsafe extern "C" fn(log: NcclDebugLogger, prof: NcclProfilerCallback) -> NcclResult;
pub type InitV8Fn = unsafe extern "C" fn(log: NcclDebugLogger) -> NcclResult;
pub type GetPropertiesV11Fn =
    unsafe extern "C" fn(dev: c_int, props: *mut NcclNetPropertiesV11) -> NcclResult;
pub type GetPropertiesV9Fn =
    unsafe extern "C" fn(dev: c_int, props: *mut NcclNetPropertiesV9) -> NcclResult;
pub type GetPropertiesV8Fn =
    unsafe extern "C" fn(dev: c_int, props: *mut NcclNetPropertiesV8) -> NcclResult;
pub type ListenV11Fn =
    unsafe extern "C" fn(ctx: Ptr, dev: c_int, handle: Ptr, listen_comm: PPtr) -> NcclResult;
pub type ListenV8Fn =
    unsafe extern "C" fn(dev: c_int, handle: Ptr, listen_comm: PPtr) -> NcclResult;
pub type ConnectV11Fn = unsafe extern "C" fn(
    ctx: Ptr,
    dev: c_int,
    handle: Ptr,
    send_comm: PPtr,
    send_dev_comm: DevHandle,
) -> NcclResult;
pub type ConnectV10Fn = unsafe extern "C" fn(
    dev: c_int,
    config: *mut NcclNetCommConfig,
    handle: Ptr,
    send_comm: PPtr,
    send_dev_comm: DevHandle,
) -> NcclResult;
pub type ConnectV8Fn = unsafe extern "C" fn(
    dev: c_int,
    handle: Ptr,
    send_comm: PPtr,
    send_dev_comm: DevHandle,
) -> NcclResult;
/// v10, v11: `isend(sendComm, data, size_t size, tag, mhandle, phandle, request)`.
pub type IsendV10Fn = unsafe extern "C" fn(
    send_comm: Ptr,
    data: Ptr,
    size: usize,
    tag: c_int,
    mhandle: Ptr,
    phandle: Ptr,
    request: PPtr,
) -> NcclResult;
/// v9: no profiler handle.
pub type IsendV9Fn = unsafe extern "C" fn(
    send_comm: Ptr,
    data: Ptr,
    size: usize,
    tag: c_int,
    mhandle: Ptr,
    request: PPtr,
) -> NcclResult;
/// v8: `int size`.
pub type IsendV8Fn = unsafe extern "C" fn(
    send_comm: Ptr,
    data: Ptr,
    size: c_int,
    tag: c_int,
    mhandle: Ptr,
    request: PPtr,
) -> NcclResult;
/// v10, v11: `irecv(recvComm, n, data, size_t* sizes, tags, mhandles, phandles, request)`.
pub type IrecvV10Fn = unsafe extern "C" fn(
    recv_comm: Ptr,
    n: c_int,
    data: PPtr,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: PPtr,
    phandles: PPtr,
    request: PPtr,
) -> NcclResult;
/// v9: no profiler handles.
pub type IrecvV9Fn = unsafe extern "C" fn(
    recv_comm: Ptr,
    n: c_int,
    data: PPtr,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: PPtr,
    request: PPtr,
) -> NcclResult;
/// v8: `int* sizes`.
pub type IrecvV8Fn = unsafe extern "C" fn(
    recv_comm: Ptr,
    n: c_int,
    data: PPtr,
    sizes: *mut c_int,
    tags: *mut c_int,
    mhandles: PPtr,
    request: PPtr,
) -> NcclResult;
pub type FinalizeFn = unsafe extern "C" fn(ctx: Ptr) -> NcclResult;
pub type SetNetAttrFn = unsafe extern "C" fn(ctx: Ptr, attr: *mut NcclNetAttr) -> NcclResult;

/// `ncclNet_v11_t`: the table NCCL 2.28 looks up first (`ncclNetPlugin_v11`). The
/// members the header says may be null are `Option`s.
#[repr(C)]
pub struct NcclNetV11 {
    pub name: *const c_char,
    pub init: InitV11Fn,
    pub devices: DevicesFn,
    pub getProperties: GetPropertiesV11Fn,
    pub listen: ListenV11Fn,
    pub connect: ConnectV11Fn,
    pub accept: AcceptFn,
    pub regMr: RegMrFn,
    pub regMrDmaBuf: Option<RegMrDmaBufFn>,
    pub deregMr: DeregMrFn,
    pub isend: IsendV10Fn,
    pub irecv: IrecvV10Fn,
    pub iflush: Option<IflushFn>,
    pub test: TestFn,
    pub closeSend: CloseFn,
    pub closeRecv: CloseFn,
    pub closeListen: CloseFn,
    pub getDeviceMr: Option<GetDeviceMrFn>,
    pub irecvConsumed: Option<IrecvConsumedFn>,
    pub makeVDevice: Option<MakeVDeviceFn>,
    pub finalize: FinalizeFn,
    pub setNetAttr: Option<SetNetAttrFn>,
}

/// `ncclNet_v10_t`: init takes no context, connect takes the comm config.
#[repr(C)]
pub struct NcclNetV10 {
    pub name: *const c_char,
    pub init: InitV10Fn,
    pub devices: DevicesFn,
    pub getProperties: GetPropertiesV9Fn,
    pub listen: ListenV8Fn,
    pub connect: ConnectV10Fn,
    pub accept: AcceptFn,
    pub regMr: RegMrFn,
    pub regMrDmaBuf: Option<RegMrDmaBufFn>,
    pub deregMr: DeregMrFn,
    pub isend: IsendV10Fn,
    pub irecv: IrecvV10Fn,
    pub iflush: Option<IflushFn>,
    pub test: TestFn,
    pub closeSend: CloseFn,
    pub closeRecv: CloseFn,
    pub closeListen: CloseFn,
    pub getDeviceMr: Option<GetDeviceMrFn>,
    pub irecvConsumed: Option<IrecvConsumedFn>,
    pub makeVDevice: Option<MakeVDeviceFn>,
}

/// `ncclNet_v9_t`: no profiler, isend/irecv without profiler handles.
#[repr(C)]
pub struct NcclNetV9 {
    pub name: *const c_char,
    pub init: InitV8Fn,
    pub devices: DevicesFn,
    pub getProperties: GetPropertiesV9Fn,
    pub listen: ListenV8Fn,
    pub connect: ConnectV8Fn,
    pub accept: AcceptFn,
    pub regMr: RegMrFn,
    pub regMrDmaBuf: Option<RegMrDmaBufFn>,
    pub deregMr: DeregMrFn,
    pub isend: IsendV9Fn,
    pub irecv: IrecvV9Fn,
    pub iflush: Option<IflushFn>,
    pub test: TestFn,
    pub closeSend: CloseFn,
    pub closeRecv: CloseFn,
    pub closeListen: CloseFn,
    pub getDeviceMr: Option<GetDeviceMrFn>,
    pub irecvConsumed: Option<IrecvConsumedFn>,
    pub makeVDevice: Option<MakeVDeviceFn>,
}

/// `ncclNet_v8_t`: `int` sizes, no `makeVDevice`.
#[repr(C)]
pub struct NcclNetV8 {
    pub name: *const c_char,
    pub init: InitV8Fn,
    pub devices: DevicesFn,
    pub getProperties: GetPropertiesV8Fn,
    pub listen: ListenV8Fn,
    pub connect: ConnectV8Fn,
    pub accept: AcceptFn,
    pub regMr: RegMrFn,
    pub regMrDmaBuf: Option<RegMrDmaBufFn>,
    pub deregMr: DeregMrFn,
    pub isend: IsendV8Fn,
    pub irecv: IrecvV8Fn,
    pub iflush: Option<IflushFn>,
    pub test: TestFn,
    pub closeSend: CloseFn,
    pub closeRecv: CloseFn,
    pub closeListen: CloseFn,
    pub getDeviceMr: Option<GetDeviceMrFn>,
    pub irecvConsumed: Option<IrecvConsumedFn>,
}

// SAFETY: the tables are immutable statics; `name` points at a `'static` C string
// literal and every other member is a function pointer, so sharing them between the
// threads NCCL calls from cannot race.
unsafe impl Sync for NcclNetV11 {}
// SAFETY: as for v11: an immutable static of a C string literal and function pointers.
unsafe impl Sync for NcclNetV10 {}
// SAFETY: as for v11.
unsafe impl Sync for NcclNetV9 {}
// SAFETY: as for v11.
unsafe impl Sync for NcclNetV8 {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    // ncclNetVDeviceProps: int ndevs @0, int devs[4] @4..20; align 4 -> 20 bytes.
    const VPROPS_SIZE: usize = 20;
    // ncclNetProperties_v11_t, field by field: name 0, pciPath 8 (pointers), guid 16
    // (uint64_t), then eleven 4-byte members from 24: ptrSupport 24, regIsGlobal 28,
    // forceFlush 32, speed 36, port 40, latency 44 (float), maxComms 48, maxRecvs 52,
    // netDeviceType 56 (enum), netDeviceVersion 60; vProps 64..84 (align 4); maxP2pBytes
    // rounds 84 up to 8 -> 88; maxCollBytes 96; maxMultiRequestSize 104..108; the struct
    // rounds 108 up to its alignment 8 -> 112.
    const PROPS_V11: [(usize, &str); 17] = [
        (0, "name"),
        (8, "pciPath"),
        (16, "guid"),
        (24, "ptrSupport"),
        (28, "regIsGlobal"),
        (32, "forceFlush"),
        (36, "speed"),
        (40, "port"),
        (44, "latency"),
        (48, "maxComms"),
        (52, "maxRecvs"),
        (56, "netDeviceType"),
        (60, "netDeviceVersion"),
        (64, "vProps"),
        (88, "maxP2pBytes"),
        (96, "maxCollBytes"),
        (104, "maxMultiRequestSize"),
    ];
    const PROPS_V11_SIZE: usize = 112;
    // v9/v10: the same up to maxCollBytes @96..104 -> 104 (already a multiple of 8).
    const PROPS_V9_SIZE: usize = 104;
    // v8: name 0, pciPath 8, guid 16, ptrSupport 24, regIsGlobal 28, speed 32, port 36,
    // latency 40, maxComms 44, maxRecvs 48, netDeviceType 52, netDeviceVersion 56..60,
    // rounded up to 8 -> 64.
    const PROPS_V8: [(usize, &str); 12] = [
        (0, "name"),
        (8, "pciPath"),
        (16, "guid"),
        (24, "ptrSupport"),
        (28, "regIsGlobal"),
        (32, "speed"),
        (36, "port"),
        (40, "latency"),
        (44, "maxComms"),
        (48, "maxRecvs"),
        (52, "netDeviceType"),
        (56, "netDeviceVersion"),
    ];
    const PROPS_V8_SIZE: usize = 64;
    // ncclNetDeviceHandle_v7_t: two ints 0, 4; void* handle 8; size_t size 16; int
    // needsProxyProgress 24..28, rounded up to 8 -> 32.
    const DEVICE_HANDLE_SIZE: usize = 32;
    // ncclNetAttr_v11_t: two ncclNetCommAttr_v11_t (4 x int32 = 16 bytes) at 0 and 16,
    // then three uint32_t at 32, 36, 40 -> 44, align 4.
    const NET_ATTR_SIZE: usize = 44;
    // The tables: `const char* name` then one pointer per function, 8 bytes each.
    // v11 has 21 functions (init .. setNetAttr) -> 8 * 22 = 176; v10 and v9 end at
    // makeVDevice (19 functions) -> 160; v8 has no makeVDevice -> 152.
    const NET_V11_SIZE: usize = 8 * 22;
    const NET_V10_SIZE: usize = 8 * 20;
    const NET_V9_SIZE: usize = 8 * 20;
    const NET_V8_SIZE: usize = 8 * 19;

    macro_rules! offsets {
        ($t:ty, $($f:ident),+) => {
            [$((offset_of!($t, $f), stringify!($f))),+]
        };
    }

    #[test]
    fn vdevice_props_and_config() {
        assert_eq!(size_of::<NcclNetVDeviceProps>(), VPROPS_SIZE);
        assert_eq!(offset_of!(NcclNetVDeviceProps, devs), 4);
        assert_eq!(size_of::<NcclNetCommConfig>(), 4);
        assert_eq!(size_of::<NcclResult>(), 4);
    }

    #[test]
    fn properties_v11_layout() {
        let got = offsets!(
            NcclNetPropertiesV11,
            name,
            pciPath,
            guid,
            ptrSupport,
            regIsGlobal,
            forceFlush,
            speed,
            port,
            latency,
            maxComms,
            maxRecvs,
            netDeviceType,
            netDeviceVersion,
            vProps,
            maxP2pBytes,
            maxCollBytes,
            maxMultiRequestSize
        );
        assert_eq!(got, PROPS_V11);
        assert_eq!(size_of::<NcclNetPropertiesV11>(), PROPS_V11_SIZE);
        assert_eq!(align_of::<NcclNetPropertiesV11>(), 8);
    }

    #[test]
    fn properties_v9_v10_layout() {
        let got = offsets!(
            NcclNetPropertiesV9,
            name,
            pciPath,
            guid,
            ptrSupport,
            regIsGlobal,
            forceFlush,
            speed,
            port,
            latency,
            maxComms,
            maxRecvs,
            netDeviceType,
            netDeviceVersion,
            vProps,
            maxP2pBytes,
            maxCollBytes
        );
        assert_eq!(got[..], PROPS_V11[..16]);
        assert_eq!(size_of::<NcclNetPropertiesV9>(), PROPS_V9_SIZE);
    }

    #[test]
    fn properties_v8_layout() {
        let got = offsets!(
            NcclNetPropertiesV8,
            name,
            pciPath,
            guid,
            ptrSupport,
            regIsGlobal,
            speed,
            port,
            latency,
            maxComms,
            maxRecvs,
            netDeviceType,
            netDeviceVersion
        );
        assert_eq!(got, PROPS_V8);
        assert_eq!(size_of::<NcclNetPropertiesV8>(), PROPS_V8_SIZE);
    }

    #[test]
    fn device_handle_and_attr_layout() {
        let got = offsets!(
            NcclNetDeviceHandle,
            netDeviceType,
            netDeviceVersion,
            handle,
            size,
            needsProxyProgress
        );
        assert_eq!(
            got,
            [
                (0, "netDeviceType"),
                (4, "netDeviceVersion"),
                (8, "handle"),
                (16, "size"),
                (24, "needsProxyProgress")
            ]
        );
        assert_eq!(size_of::<NcclNetDeviceHandle>(), DEVICE_HANDLE_SIZE);
        let got = offsets!(NcclNetAttr, sendCommAttr, recvCommAttr, op, algo, proto);
        assert_eq!(
            got,
            [
                (0, "sendCommAttr"),
                (16, "recvCommAttr"),
                (32, "op"),
                (36, "algo"),
                (40, "proto")
            ]
        );
        assert_eq!(size_of::<NcclNetAttr>(), NET_ATTR_SIZE);
        assert_eq!(size_of::<NcclNetCommAttr>(), 16);
    }

    #[test]
    fn table_v11_layout() {
        let got = offsets!(
            NcclNetV11,
            name,
            init,
            devices,
            getProperties,
            listen,
            connect,
            accept,
            regMr,
            regMrDmaBuf,
            deregMr,
            isend,
            irecv,
            iflush,
            test,
            closeSend,
            closeRecv,
            closeListen,
            getDeviceMr,
            irecvConsumed,
            makeVDevice,
            finalize,
            setNetAttr
        );
        // The header's order, one 8-byte slot each.
        for (i, (off, name)) in got.iter().enumerate() {
            assert_eq!(*off, 8 * i, "{name}");
        }
        assert_eq!(size_of::<NcclNetV11>(), NET_V11_SIZE);
    }

    #[test]
    fn tables_v10_v9_v8_layout() {
        let v10 = offsets!(
            NcclNetV10,
            name,
            init,
            devices,
            getProperties,
            listen,
            connect,
            accept,
            regMr,
            regMrDmaBuf,
            deregMr,
            isend,
            irecv,
            iflush,
            test,
            closeSend,
            closeRecv,
            closeListen,
            getDeviceMr,
            irecvConsumed,
            makeVDevice
        );
        let v9 = offsets!(
            NcclNetV9,
            name,
            init,
            devices,
            getProperties,
            listen,
            connect,
            accept,
            regMr,
            regMrDmaBuf,
            deregMr,
            isend,
            irecv,
            iflush,
            test,
            closeSend,
            closeRecv,
            closeListen,
            getDeviceMr,
            irecvConsumed,
            makeVDevice
        );
        let v8 = offsets!(
            NcclNetV8,
            name,
            init,
            devices,
            getProperties,
            listen,
            connect,
            accept,
            regMr,
            regMrDmaBuf,
            deregMr,
            isend,
            irecv,
            iflush,
            test,
            closeSend,
            closeRecv,
            closeListen,
            getDeviceMr,
            irecvConsumed
        );
        for (i, (off, name)) in v10.iter().enumerate() {
            assert_eq!(*off, 8 * i, "v10 {name}");
        }
        assert_eq!(v9, v10, "v9 has v10's slots");
        assert_eq!(v8[..], v10[..19], "v8 is v10 without makeVDevice");
        assert_eq!(size_of::<NcclNetV10>(), NET_V10_SIZE);
        assert_eq!(size_of::<NcclNetV9>(), NET_V9_SIZE);
        assert_eq!(size_of::<NcclNetV8>(), NET_V8_SIZE);
        // A nullable member costs no space: `Option<fn>` is one pointer, null = None.
        assert_eq!(size_of::<Option<MakeVDeviceFn>>(), 8);
    }
}
