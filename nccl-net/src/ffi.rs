//! What NCCL calls: the exported tables `ncclNetPlugin_v11` (NCCL 2.28 looks it up
//! first), `_v10`, `_v9` and `_v8`, and their entry points. Each entry point checks its
//! pointers, runs inside `catch_unwind` (a panic becomes `ncclInternalError` and a line
//! in NCCL's log, never an unwind into C++), and logs every error it returns.
//! The older tables adapt their arguments and call the same code.
#![allow(non_upper_case_globals)]

use crate::abi::*;
use crate::comm::listen::ListenComm;
use crate::comm::recv::RecvComm;
use crate::comm::send::SendComm;
use crate::comm::{checked, RequestHandle, LISTEN_MAGIC, RECV_MAGIC, REQUEST_MAGIC, SEND_MAGIC};
use crate::config::Config;
use crate::error::{NetError, Result};
use crate::integrity;
use crate::log::{self, info, warn, NET};
use crate::props::{self, Device};
use crate::wire::MAX_RECVS;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, OnceLock};

/// The plugin's name: `NCCL_NET=grdma` picks it.
pub const NAME: &CStr = c"grdma";

/// What every init shares: how many inits are open (v11 calls init per communicator
/// and finalize per communicator; v8 to v10 call init once and never finalize).
struct Global {
    refs: usize,
    legacy: bool,
}

static GLOBAL: Mutex<Global> = Mutex::new(Global {
    refs: 0,
    legacy: false,
});
/// The devices, found at the first init and kept for the process: NCCL may keep the
/// name and PCI path pointers `getProperties` gave it.
static DEVICES: OnceLock<Vec<Device>> = OnceLock::new();

fn global() -> std::sync::MutexGuard<'static, Global> {
    GLOBAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn devices() -> Result<&'static [Device]> {
    DEVICES
        .get()
        .map(Vec::as_slice)
        .ok_or_else(|| NetError::internal("called before init"))
}

fn device(dev: c_int) -> Result<&'static Device> {
    let d = devices()?;
    usize::try_from(dev)
        .ok()
        .and_then(|i| d.get(i))
        .ok_or_else(|| {
            NetError::invalid(format!(
                "device {dev} does not exist (there are {})",
                d.len()
            ))
        })
}

/// Runs an entry point: its error or panic becomes a logged `ncclResult_t`.
fn guard(what: &str, f: impl FnOnce() -> Result<()>) -> NcclResult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => NcclResult::SUCCESS,
        Ok(Err(e)) => {
            warn!("{what}: {e}");
            e.code
        }
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            warn!("{what}: internal error (a panic: {msg}); the call failed, the process goes on");
            NcclResult::INTERNAL_ERROR
        }
    }
}

/// An output argument NCCL passed, as a reference; null is an error.
///
/// # Safety
/// `p` is null or points at a `T` this call may write and nothing else touches while
/// the reference lives (NCCL's output arguments, for the entry point's call).
unsafe fn out<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T> {
    // SAFETY: the caller's contract; null is refused.
    unsafe { p.as_mut() }.ok_or_else(|| NetError::invalid(format!("{what} is null")))
}

fn init_common(log_fn: NcclDebugLogger, legacy: bool) -> Result<()> {
    log::set_logger(log_fn);
    let mut g = global();
    if legacy {
        // v8-v10 have no finalize: the first legacy init holds its reference forever.
        if g.legacy {
            return Ok(());
        }
        g.legacy = true;
    }
    if DEVICES.get().is_none() {
        let spec = std::env::var("NCCL_SOCKET_IFNAME").ok();
        let found = props::discover(spec.as_deref())?;
        let list: Vec<String> = found
            .iter()
            .enumerate()
            .map(|(i, d)| format!("[{i}]{}:{}", d.name.to_string_lossy(), d.addr))
            .collect();
        info!(log::NET | NCCL_INIT; "using {}{}", list.join(" "),
            if found.iter().any(|d| !d.speed_known) {
                format!(" (speed unknown to sysfs reported as {} Mbit/s)", props::DEFAULT_SPEED_MBPS)
            } else { String::new() });
        let _ = DEVICES.set(found);
    }
    g.refs += 1;
    Ok(())
}

/// # Safety
/// NCCL's `init` (net_v11.h): `ctx` null or a pointer variable to write (handed back to
/// `finalize`), `log_fn` NCCL's logger or null.
unsafe extern "C" fn init_v11(
    ctx: *mut *mut c_void,
    comm_id: u64,
    _config: *mut NcclNetCommConfig,
    log_fn: NcclDebugLogger,
    _prof: NcclProfilerCallback,
) -> NcclResult {
    guard("init", || {
        init_common(log_fn, false)?;
        if !ctx.is_null() {
            // SAFETY: NCCL's out-pointer for the context it hands back to finalize.
            unsafe { *ctx = Box::into_raw(Box::new(comm_id)) as *mut c_void };
        }
        Ok(())
    })
}

/// # Safety
/// NCCL's `finalize`: `ctx` null or what `init_v11` wrote there, finalized once.
unsafe extern "C" fn finalize_v11(ctx: *mut c_void) -> NcclResult {
    guard("finalize", || {
        if !ctx.is_null() {
            // SAFETY: the context init_v11 made with Box::into_raw; finalized once.
            drop(unsafe { Box::from_raw(ctx as *mut u64) });
        }
        let mut g = global();
        g.refs = g.refs.saturating_sub(1);
        if g.refs == 0 {
            info!(NET; "finalized: sent {}; received {}",
                integrity::SENT.snapshot().line(), integrity::RECEIVED.snapshot().line());
        }
        Ok(())
    })
}

/// # Safety
/// NCCL's `init` (v10): `log_fn` NCCL's logger or null.
unsafe extern "C" fn init_v10(log_fn: NcclDebugLogger, _prof: NcclProfilerCallback) -> NcclResult {
    guard("init", || init_common(log_fn, true))
}

/// # Safety
/// NCCL's `init` (v8, v9): `log_fn` NCCL's logger or null.
unsafe extern "C" fn init_v8(log_fn: NcclDebugLogger) -> NcclResult {
    guard("init", || init_common(log_fn, true))
}

/// # Safety
/// NCCL's `devices`: `ndev` null or an `int` to write.
unsafe extern "C" fn devices_fn(ndev: *mut c_int) -> NcclResult {
    guard("devices", || {
        if std::env::var_os("NCCL_GRDMA_TEST_PANIC").is_some_and(|v| v == "devices") {
            panic!("NCCL_GRDMA_TEST_PANIC=devices");
        }
        // SAFETY: NCCL's output argument (devices: `int* ndev`).
        *unsafe { out(ndev, "devices: ndev") }? = devices()?.len() as c_int;
        Ok(())
    })
}

fn properties(dev: c_int) -> Result<NcclNetPropertiesV11> {
    let d = device(dev)?;
    let mut devs = [0; NCCL_NET_MAX_DEVS_PER_NIC];
    devs[0] = dev;
    Ok(NcclNetPropertiesV11 {
        name: d.name.as_ptr() as *mut c_char,
        pciPath: d
            .pci_path
            .as_ref()
            .map_or(std::ptr::null_mut(), |p| p.as_ptr() as *mut c_char),
        guid: dev as u64,
        // Host memory only: NCCL stages GPU data through host buffers for us.
        ptrSupport: NCCL_PTR_HOST,
        regIsGlobal: 0,
        forceFlush: 0,
        speed: d.speed_mbps,
        port: 0,
        latency: 0.0,
        maxComms: 65536,
        maxRecvs: MAX_RECVS as c_int,
        netDeviceType: NCCL_NET_DEVICE_HOST,
        netDeviceVersion: NCCL_NET_DEVICE_INVALID_VERSION,
        vProps: NcclNetVDeviceProps { ndevs: 1, devs },
        // `test` reports sizes as int: a power of two below 2 GiB (nccl_net.h's MAX_NET_SIZE).
        maxP2pBytes: 1 << 30,
        maxCollBytes: MAX_COLLNET_SIZE,
        maxMultiRequestSize: 1,
    })
}

/// # Safety
/// NCCL's `getProperties`: `p` null or its v11 properties struct to write.
unsafe extern "C" fn get_properties_v11(dev: c_int, p: *mut NcclNetPropertiesV11) -> NcclResult {
    guard("getProperties", || {
        // SAFETY: NCCL's output argument (getProperties: its properties struct).
        *unsafe { out(p, "getProperties: props") }? = properties(dev)?;
        Ok(())
    })
}

/// # Safety
/// NCCL's `getProperties` (v9, v10): `p` null or its v9 properties struct to write.
unsafe extern "C" fn get_properties_v9(dev: c_int, p: *mut NcclNetPropertiesV9) -> NcclResult {
    guard("getProperties", || {
        let v = properties(dev)?;
        // SAFETY: NCCL's output argument (getProperties: its properties struct).
        *unsafe { out(p, "getProperties: props") }? = NcclNetPropertiesV9 {
            name: v.name,
            pciPath: v.pciPath,
            guid: v.guid,
            ptrSupport: v.ptrSupport,
            regIsGlobal: v.regIsGlobal,
            forceFlush: v.forceFlush,
            speed: v.speed,
            port: v.port,
            latency: v.latency,
            maxComms: v.maxComms,
            maxRecvs: v.maxRecvs,
            netDeviceType: v.netDeviceType,
            netDeviceVersion: v.netDeviceVersion,
            vProps: v.vProps,
            maxP2pBytes: v.maxP2pBytes,
            maxCollBytes: v.maxCollBytes,
        };
        Ok(())
    })
}

/// # Safety
/// NCCL's `getProperties` (v8): `p` null or its v8 properties struct to write.
unsafe extern "C" fn get_properties_v8(dev: c_int, p: *mut NcclNetPropertiesV8) -> NcclResult {
    guard("getProperties", || {
        let v = properties(dev)?;
        // SAFETY: NCCL's output argument (getProperties: its properties struct).
        *unsafe { out(p, "getProperties: props") }? = NcclNetPropertiesV8 {
            name: v.name,
            pciPath: v.pciPath,
            guid: v.guid,
            ptrSupport: v.ptrSupport,
            regIsGlobal: v.regIsGlobal,
            speed: v.speed,
            port: v.port,
            latency: v.latency,
            maxComms: v.maxComms,
            maxRecvs: v.maxRecvs,
            netDeviceType: v.netDeviceType,
            netDeviceVersion: v.netDeviceVersion,
        };
        Ok(())
    })
}

/// # Safety
/// NCCL's `listen`: `handle` null or NCCL_NET_HANDLE_MAXSIZE bytes to write,
/// `listen_comm` null or a pointer variable to write.
unsafe extern "C" fn listen_v11(
    _ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: the same arguments.
    unsafe { listen_v8(dev, handle, listen_comm) }
}

/// # Safety
/// NCCL's `listen` (v8 to v10): as [`listen_v11`].
unsafe extern "C" fn listen_v8(
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> NcclResult {
    guard("listen", || {
        // SAFETY: NCCL's output argument (listen: `void** listenComm`).
        let lc = unsafe { out(listen_comm, "listen: listenComm") }?;
        *lc = std::ptr::null_mut();
        let handle = handle as *mut [u8; NCCL_NET_HANDLE_MAXSIZE];
        // SAFETY: NCCL's handle buffer, NCCL_NET_HANDLE_MAXSIZE bytes to fill.
        let h = unsafe { out(handle, "listen: handle") }?;
        let d = device(dev)?;
        let cfg = Config::from_env()?;
        let (comm, handle) = ListenComm::new(d.addr, &cfg)?;
        *h = handle.encode();
        *lc = Box::into_raw(comm) as *mut c_void;
        Ok(())
    })
}

/// `connect` of every version.
///
/// # Safety
/// As NCCL calls it: `handle` null or the listener's NCCL_NET_HANDLE_MAXSIZE-byte
/// handle, `send_comm` null or a pointer variable to write.
unsafe fn connect_common(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
) -> Result<()> {
    // SAFETY: the caller's contract (NCCL's `void** sendComm`).
    let sc = unsafe { out(send_comm, "connect: sendComm") }?;
    *sc = std::ptr::null_mut();
    device(dev)?;
    let handle = handle as *mut [u8; NCCL_NET_HANDLE_MAXSIZE];
    // SAFETY: the caller's contract (the handle's bytes).
    let h = unsafe { out(handle, "connect: handle") }?;
    if let Some(comm) = crate::comm::connect::connect(h)? {
        *sc = Box::into_raw(comm) as *mut c_void;
    }
    Ok(())
}

/// # Safety
/// NCCL's `connect`: `handle` null or the listener's NCCL_NET_HANDLE_MAXSIZE-byte
/// handle, `send_comm` null or a pointer variable to write.
unsafe extern "C" fn connect_v11(
    _ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    _dev_comm: *mut *mut NcclNetDeviceHandle,
) -> NcclResult {
    // SAFETY: NCCL's arguments, as connect_common asks.
    guard("connect", || unsafe {
        connect_common(dev, handle, send_comm)
    })
}

/// # Safety
/// NCCL's `connect` (v10): as [`connect_v11`].
unsafe extern "C" fn connect_v10(
    dev: c_int,
    _config: *mut NcclNetCommConfig,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    _dev_comm: *mut *mut NcclNetDeviceHandle,
) -> NcclResult {
    // SAFETY: NCCL's arguments, as connect_common asks.
    guard("connect", || unsafe {
        connect_common(dev, handle, send_comm)
    })
}

/// # Safety
/// NCCL's `connect` (v8, v9): as [`connect_v11`].
unsafe extern "C" fn connect_v8(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    _dev_comm: *mut *mut NcclNetDeviceHandle,
) -> NcclResult {
    // SAFETY: NCCL's arguments, as connect_common asks.
    guard("connect", || unsafe {
        connect_common(dev, handle, send_comm)
    })
}

/// # Safety
/// NCCL's `accept`: `listen_comm` a listen comm of this plugin's not yet closed (its
/// magic is checked), `recv_comm` null or a pointer variable to write.
unsafe extern "C" fn accept_fn(
    listen_comm: *mut c_void,
    recv_comm: *mut *mut c_void,
    _dev_comm: *mut *mut NcclNetDeviceHandle,
) -> NcclResult {
    guard("accept", || {
        // SAFETY: NCCL's output argument (accept: `void** recvComm`).
        let rc = unsafe { out(recv_comm, "accept: recvComm") }?;
        *rc = std::ptr::null_mut();
        // SAFETY: a listen comm NCCL got from listen and has not closed.
        let l: &mut ListenComm = unsafe { checked(listen_comm, LISTEN_MAGIC, "listen comm")? };
        if let Some(c) = l.accept()? {
            *rc = Box::into_raw(c) as *mut c_void;
        }
        Ok(())
    })
}

/// A registration: host memory only; the handle remembers the range for the checks
/// of `isend`/`irecv`.
#[repr(C)]
struct Mr {
    magic: u64,
    start: usize,
    len: usize,
}
const MR_MAGIC: u64 = u64::from_le_bytes(*b"grdMemRg");

/// Whether `comm` is a send or receive comm of ours.
///
/// # Safety
/// `comm` is null or points at 8 readable bytes (NCCL passes a comm it got from this
/// plugin: every one starts with its u64 magic).
unsafe fn is_comm(comm: *mut c_void) -> bool {
    if comm.is_null() {
        return false;
    }
    // SAFETY: the caller's contract.
    let m = unsafe { *(comm as *const u64) };
    m == SEND_MAGIC || m == RECV_MAGIC
}

/// # Safety
/// NCCL's `regMr`: `comm` null or a comm of this plugin's, `mhandle` null or a pointer
/// variable to write; `data` and `size` are only remembered, for the checks of `isend`
/// and `irecv`.
unsafe extern "C" fn reg_mr(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    kind: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    guard("regMr", || {
        // SAFETY: NCCL's output argument (regMr: `void** mhandle`).
        let mh = unsafe { out(mhandle, "regMr: mhandle") }?;
        // SAFETY: NCCL passes the comm it registers for, one of ours.
        if !unsafe { is_comm(comm) } {
            return Err(NetError::invalid(
                "regMr: not a send or receive comm of this plugin",
            ));
        }
        if kind != NCCL_PTR_HOST {
            return Err(NetError::internal(format!(
                "regMr: memory type {kind} ({}) is not host memory; this plugin carries host memory only (ptrSupport NCCL_PTR_HOST)",
                match kind { NCCL_PTR_CUDA => "CUDA", NCCL_PTR_DMABUF => "dma-buf", _ => "unknown" }
            )));
        }
        *mh = Box::into_raw(Box::new(Mr {
            magic: MR_MAGIC,
            start: data as usize,
            len: size,
        })) as *mut c_void;
        Ok(())
    })
}

/// # Safety
/// NCCL's `deregMr`: `mhandle` null or a registration of this plugin's not yet
/// deregistered.
unsafe extern "C" fn dereg_mr(_comm: *mut c_void, mhandle: *mut c_void) -> NcclResult {
    guard("deregMr", || {
        if mhandle.is_null() {
            return Ok(());
        }
        // SAFETY: a registration of ours, not yet deregistered.
        let mr: &mut Mr = unsafe { checked(mhandle, MR_MAGIC, "memory registration")? };
        mr.magic = 0;
        // SAFETY: made by Box::into_raw in reg_mr; freed once here.
        drop(unsafe { Box::from_raw(mhandle as *mut Mr) });
        Ok(())
    })
}

/// Whether `[data, data + size)` lies inside the registration `mhandle` (null: none).
///
/// # Safety
/// `mhandle` is null or a registration of this plugin's `regMr` not yet deregistered.
unsafe fn check_in_mr(
    mhandle: *mut c_void,
    data: *mut c_void,
    size: usize,
    what: &str,
) -> Result<()> {
    if mhandle.is_null() {
        return Ok(());
    }
    // SAFETY: the caller's contract (checked is given the registration's magic).
    let mr: &mut Mr = unsafe { checked(mhandle, MR_MAGIC, "memory registration")? };
    let start = data as usize;
    if start < mr.start || start.saturating_add(size) > mr.start + mr.len {
        return Err(NetError::invalid(format!(
            "{what}: buffer {start:#x}+{size} lies outside its registration {:#x}+{}",
            mr.start, mr.len
        )));
    }
    Ok(())
}

/// `isend` of every version.
///
/// # Safety
/// As NCCL calls it (net_v11.h): a send comm of this plugin's not yet closed, `data`
/// readable for `size` bytes until `test` reports the request done, `mhandle` null or
/// its registration, `request` null or a pointer variable to write.
unsafe fn isend_common(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> Result<()> {
    // SAFETY: the caller's contract (`void** request`).
    let rq = unsafe { out(request, "isend: request") }?;
    *rq = std::ptr::null_mut();
    // SAFETY: a send comm NCCL got from connect and has not closed.
    let c: &mut SendComm = unsafe { checked(send_comm, SEND_MAGIC, "send comm")? };
    if data.is_null() && size > 0 {
        return Err(NetError::invalid("isend: null buffer"));
    }
    // SAFETY: the caller's contract (mhandle).
    unsafe { check_in_mr(mhandle, data, size, "isend") }?;
    if let Some(r) = c.isend(data as *const u8, size as u64, tag)? {
        *rq = r;
    }
    Ok(())
}

/// # Safety
/// NCCL's `isend` (v10, v11): as `isend_common` asks: a send comm of this plugin's not
/// yet closed, `data` readable for `size` bytes until `test` reports the request done,
/// `mhandle` null or its registration, `request` null or a pointer variable to write.
unsafe extern "C" fn isend_v10(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    _phandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL's arguments, as isend_common asks.
    guard("isend", || unsafe {
        isend_common(send_comm, data, size, tag, mhandle, request)
    })
}

/// # Safety
/// NCCL's `isend` (v9): as [`isend_v10`].
unsafe extern "C" fn isend_v9(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL's arguments, as isend_common asks.
    guard("isend", || unsafe {
        isend_common(send_comm, data, size, tag, mhandle, request)
    })
}

/// # Safety
/// NCCL's `isend` (v8): as [`isend_v10`].
unsafe extern "C" fn isend_v8(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    guard("isend", || {
        let size =
            usize::try_from(size).map_err(|_| NetError::invalid(format!("isend: size {size}")))?;
        // SAFETY: NCCL's arguments, as isend_common asks.
        unsafe { isend_common(send_comm, data, size, tag, mhandle, request) }
    })
}

/// `irecv` of every version.
///
/// # Safety
/// As NCCL calls it (net_v11.h): a receive comm of this plugin's not yet closed, `data`,
/// `tags` and `mhandles` (or null) arrays of `n` elements, each buffer writable for its
/// size until `test` reports the request done, `request` null or a pointer variable to
/// write.
unsafe fn irecv_common(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: &[usize],
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> Result<()> {
    // SAFETY: the caller's contract (`void** request`).
    let rq = unsafe { out(request, "irecv: request") }?;
    *rq = std::ptr::null_mut();
    // SAFETY: a receive comm NCCL got from accept and has not closed.
    let c: &mut RecvComm = unsafe { checked(recv_comm, RECV_MAGIC, "receive comm")? };
    let n = n as usize;
    if n == 0 || n > MAX_RECVS || data.is_null() || tags.is_null() {
        return Err(NetError::invalid(format!(
            "irecv: {n} buffers (1 to maxRecvs = {MAX_RECVS}, with data and tags)"
        )));
    }
    let mut bufs = Vec::with_capacity(n);
    for (i, &size) in sizes.iter().enumerate().take(n) {
        // SAFETY: NCCL passes n-element arrays of buffers, tags, registrations.
        let (d, tag, mh) = unsafe {
            (
                *data.add(i),
                *tags.add(i),
                if mhandles.is_null() {
                    std::ptr::null_mut()
                } else {
                    *mhandles.add(i)
                },
            )
        };
        if d.is_null() && size > 0 {
            return Err(NetError::invalid(format!("irecv: buffer {i} is null")));
        }
        // SAFETY: the caller's contract (each mhandle).
        unsafe { check_in_mr(mh, d, size, "irecv") }?;
        bufs.push((d as *mut u8, size as u64, tag));
    }
    if let Some(r) = c.irecv(&bufs)? {
        *rq = r;
    }
    Ok(())
}

/// The `n` sizes of an `irecv`.
///
/// # Safety
/// `sizes` is null or an array of `n` elements (NCCL's).
unsafe fn sizes_of<T: Copy>(sizes: *mut T, n: c_int) -> Result<Vec<T>> {
    if sizes.is_null() || n <= 0 || n as usize > MAX_RECVS {
        return Err(NetError::invalid(format!(
            "irecv: {n} buffers (1 to maxRecvs = {MAX_RECVS}, with sizes)"
        )));
    }
    // SAFETY: the caller's contract: n elements, n checked above.
    Ok(unsafe { std::slice::from_raw_parts(sizes, n as usize) }.to_vec())
}

/// # Safety
/// NCCL's `irecv` (v10, v11): a receive comm of this plugin's not yet closed; `data`,
/// `sizes`, `tags` and `mhandles` (or null) arrays of `n` elements, each buffer
/// writable for its size until `test` reports the request done; `request` null or a
/// pointer variable to write.
unsafe extern "C" fn irecv_v10(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    _phandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL's arguments, as sizes_of and irecv_common ask.
    guard("irecv", || unsafe {
        irecv_common(
            recv_comm,
            n,
            data,
            &sizes_of(sizes, n)?,
            tags,
            mhandles,
            request,
        )
    })
}

/// # Safety
/// NCCL's `irecv` (v9): as [`irecv_v10`].
unsafe extern "C" fn irecv_v9(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL's arguments, as sizes_of and irecv_common ask.
    guard("irecv", || unsafe {
        irecv_common(
            recv_comm,
            n,
            data,
            &sizes_of(sizes, n)?,
            tags,
            mhandles,
            request,
        )
    })
}

/// # Safety
/// NCCL's `irecv` (v8, `int` sizes): as [`irecv_v10`].
unsafe extern "C" fn irecv_v8(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    guard("irecv", || {
        // SAFETY: NCCL's `int* sizes`, n elements.
        let s: Vec<usize> = unsafe { sizes_of(sizes, n) }?
            .into_iter()
            .map(|s| usize::try_from(s).map_err(|_| NetError::invalid(format!("irecv: size {s}"))))
            .collect::<Result<_>>()?;
        // SAFETY: NCCL's arguments, as irecv_common asks.
        unsafe { irecv_common(recv_comm, n, data, &s, tags, mhandles, request) }
    })
}

/// `iflush`: data lands in host memory, which the CPU sees at once: nothing to flush,
/// no request (NCCL only flushes CUDA memory, which this plugin never claims).
///
/// # Safety
/// NCCL's `iflush`: `request` null or a pointer variable to write (nothing else is
/// read).
unsafe extern "C" fn iflush_fn(
    _recv_comm: *mut c_void,
    _n: c_int,
    _data: *mut *mut c_void,
    _sizes: *mut c_int,
    _mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    guard("iflush", || {
        // SAFETY: NCCL's output argument (iflush: `void** request`).
        *unsafe { out(request, "iflush: request") }? = std::ptr::null_mut();
        Ok(())
    })
}

/// # Safety
/// NCCL's `test`: `request` a request of this plugin's not yet reported done (its magic
/// is checked), `done` an `int` to write, `sizes` null or an array of as many elements
/// as the request's buffers.
unsafe extern "C" fn test_fn(
    request: *mut c_void,
    done: *mut c_int,
    sizes: *mut c_int,
) -> NcclResult {
    guard("test", || {
        // SAFETY: NCCL's output argument (test: `int* done`).
        let d = unsafe { out(done, "test: done") }?;
        *d = 0;
        // SAFETY: a request of ours (from isend/irecv), not yet reported done.
        let h: &mut RequestHandle = unsafe { checked(request, REQUEST_MAGIC, "request")? };
        let (send, comm, index) = (h.send, h.comm, h.index);
        let to_int = |v: u64| c_int::try_from(v).unwrap_or(c_int::MAX);
        if send {
            // SAFETY: the request's comm, alive while its requests are (NCCL closes a
            // comm only after its requests, or never tests them again).
            let c: &mut SendComm = unsafe { checked(comm, SEND_MAGIC, "send comm")? };
            if let Some(size) = c.test(index)? {
                *d = 1;
                if !sizes.is_null() {
                    // SAFETY: NCCL's out-array, one element for a send.
                    unsafe { *sizes = to_int(size) };
                }
            }
        } else {
            // SAFETY: as above, for a receive comm.
            let c: &mut RecvComm = unsafe { checked(comm, RECV_MAGIC, "receive comm")? };
            if let Some(got) = c.test(index)? {
                *d = 1;
                if !sizes.is_null() {
                    for (i, s) in got.iter().enumerate() {
                        // SAFETY: NCCL's out-array, n elements for an n-buffer irecv.
                        unsafe { *sizes.add(i) = to_int(*s) };
                    }
                }
            }
        }
        Ok(())
    })
}

/// # Safety
/// NCCL's `closeSend`: `comm` null or a send comm of this plugin's, closed once; its
/// requests are not tested after.
unsafe extern "C" fn close_send(comm: *mut c_void) -> NcclResult {
    guard("closeSend", || {
        if comm.is_null() {
            return Ok(());
        }
        // SAFETY: a send comm of ours; NCCL closes it once.
        let c: &mut SendComm = unsafe { checked(comm, SEND_MAGIC, "send comm")? };
        // SAFETY: made by Box::into_raw in connect; `c` is not used after this.
        let mut b = unsafe { Box::from_raw(c as *mut SendComm) };
        // The threads stop and are joined before the comm (and its requests) is freed.
        b.close();
        drop(b);
        Ok(())
    })
}

/// # Safety
/// NCCL's `closeRecv`: `comm` null or a receive comm of this plugin's, closed once; its
/// requests are not tested after.
unsafe extern "C" fn close_recv(comm: *mut c_void) -> NcclResult {
    guard("closeRecv", || {
        if comm.is_null() {
            return Ok(());
        }
        // SAFETY: a receive comm of ours; NCCL closes it once.
        let c: &mut RecvComm = unsafe { checked(comm, RECV_MAGIC, "receive comm")? };
        // SAFETY: made by Box::into_raw in accept; `c` is not used after this.
        let mut b = unsafe { Box::from_raw(c as *mut RecvComm) };
        // The threads stop and are joined before the comm (and its requests) is freed.
        b.close();
        drop(b);
        Ok(())
    })
}

/// # Safety
/// NCCL's `closeListen`: `comm` null or a listen comm of this plugin's, closed once.
unsafe extern "C" fn close_listen(comm: *mut c_void) -> NcclResult {
    guard("closeListen", || {
        if comm.is_null() {
            return Ok(());
        }
        // SAFETY: a listen comm of ours; NCCL closes it once.
        let c: &mut ListenComm = unsafe { checked(comm, LISTEN_MAGIC, "listen comm")? };
        // SAFETY: made by Box::into_raw in listen; `c` is not used after this.
        let b = unsafe { Box::from_raw(c as *mut ListenComm) };
        (*b).close();
        Ok(())
    })
}

#[no_mangle]
pub static ncclNetPlugin_v11: NcclNetV11 = NcclNetV11 {
    name: NAME.as_ptr(),
    init: init_v11,
    devices: devices_fn,
    getProperties: get_properties_v11,
    listen: listen_v11,
    connect: connect_v11,
    accept: accept_fn,
    regMr: reg_mr,
    regMrDmaBuf: None,
    deregMr: dereg_mr,
    isend: isend_v10,
    irecv: irecv_v10,
    iflush: Some(iflush_fn),
    test: test_fn,
    closeSend: close_send,
    closeRecv: close_recv,
    closeListen: close_listen,
    getDeviceMr: None,
    irecvConsumed: None,
    makeVDevice: None,
    finalize: finalize_v11,
    setNetAttr: None,
};

#[no_mangle]
pub static ncclNetPlugin_v10: NcclNetV10 = NcclNetV10 {
    name: NAME.as_ptr(),
    init: init_v10,
    devices: devices_fn,
    getProperties: get_properties_v9,
    listen: listen_v8,
    connect: connect_v10,
    accept: accept_fn,
    regMr: reg_mr,
    regMrDmaBuf: None,
    deregMr: dereg_mr,
    isend: isend_v10,
    irecv: irecv_v10,
    iflush: Some(iflush_fn),
    test: test_fn,
    closeSend: close_send,
    closeRecv: close_recv,
    closeListen: close_listen,
    getDeviceMr: None,
    irecvConsumed: None,
    makeVDevice: None,
};

#[no_mangle]
pub static ncclNetPlugin_v9: NcclNetV9 = NcclNetV9 {
    name: NAME.as_ptr(),
    init: init_v8,
    devices: devices_fn,
    getProperties: get_properties_v9,
    listen: listen_v8,
    connect: connect_v8,
    accept: accept_fn,
    regMr: reg_mr,
    regMrDmaBuf: None,
    deregMr: dereg_mr,
    isend: isend_v9,
    irecv: irecv_v9,
    iflush: Some(iflush_fn),
    test: test_fn,
    closeSend: close_send,
    closeRecv: close_recv,
    closeListen: close_listen,
    getDeviceMr: None,
    irecvConsumed: None,
    makeVDevice: None,
};

#[no_mangle]
pub static ncclNetPlugin_v8: NcclNetV8 = NcclNetV8 {
    name: NAME.as_ptr(),
    init: init_v8,
    devices: devices_fn,
    getProperties: get_properties_v8,
    listen: listen_v8,
    connect: connect_v8,
    accept: accept_fn,
    regMr: reg_mr,
    regMrDmaBuf: None,
    deregMr: dereg_mr,
    isend: isend_v8,
    irecv: irecv_v8,
    iflush: Some(iflush_fn),
    test: test_fn,
    closeSend: close_send,
    closeRecv: close_recv,
    closeListen: close_listen,
    getDeviceMr: None,
    irecvConsumed: None,
};
