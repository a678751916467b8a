//! What NCCL calls: the exported tables `ncclNetPlugin_v11` (NCCL 2.28 looks it up
//! first), `_v10`, `_v9` and `_v8`, and their entry points. Each entry point checks its
//! pointers, runs inside `catch_unwind` (a panic becomes `ncclInternalError` and a line
//! in NCCL's log, never an unwind into C++), and logs every error it returns.
//! The older tables adapt their arguments and call the same code.
#![allow(non_upper_case_globals)]

mod data;
mod entry;

use crate::abi::*;
use crate::comm::listen::ListenComm;
use crate::comm::recv::RecvComm;
use crate::comm::send::SendComm;
use crate::comm::{
    checked, taken, LISTEN_MAGIC, RECV_MAGIC, RECV_MAGIC_VERBS, SEND_MAGIC, SEND_MAGIC_VERBS,
};
use crate::config::{Config, Transport};
use crate::error::{NetError, Result};
use crate::integrity;
use crate::log::{self, info, NET};
use crate::props::{self, Device};
use crate::verbs::recv::VerbsRecv;
use crate::verbs::send::VerbsSend;
use crate::verbs::setup::{VerbsListen, VLISTEN_MAGIC};
use crate::wire::MAX_RECVS;
use data::*;
use entry::{guard, out};
use std::ffi::{c_char, c_int, c_void, CStr};
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

fn init_common(log_fn: NcclDebugLogger, legacy: bool) -> Result<()> {
    log::set_logger(log_fn);
    // Built with panic = "abort" (the workspace's release profile), every entry's
    // catch_unwind is inert: a panic would abort NCCL's process instead of becoming an
    // error. Refused at once, saying how to build it (NCCL then goes on without it).
    if cfg!(panic = "abort") {
        return Err(NetError::internal(
            "this plugin was built with panic = \"abort\" (cargo's --release profile), so a bug in it would abort the process; build it with `cargo build -p nccl-net --profile plugin` (tests/nccl/build-plugin.sh)",
        ));
    }
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
        let found = props::discover(spec.as_deref(), Transport::from_env()?)?;
        let list: Vec<String> = found
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let verbs = match &d.rdma {
                    Some(r) => format!("verbs on {}, ", r.to_string_lossy()),
                    None => String::new(),
                };
                format!(
                    "[{i}]{}:{} ({verbs}{} Mbit/s from {})",
                    d.name.to_string_lossy(),
                    d.addr,
                    d.speed_mbps,
                    d.speed_from.words()
                )
            })
            .collect();
        info!(log::NET | NCCL_INIT; "using {}; CRC32C by {}", list.join(" "),
            crate::integrity::crc32c_path());
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
        // A verbs device is named by its RDMA device (as NCCL's IB transport names its
        // HCAs), a TCP one by its interface.
        name: d.rdma.as_ref().unwrap_or(&d.name).as_ptr() as *mut c_char,
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
        if d.rdma.is_some() {
            let (comm, handle) = VerbsListen::new(d.addr, &cfg)?;
            *h = handle.encode();
            *lc = Box::into_raw(comm) as *mut c_void;
        } else {
            let (comm, handle) = ListenComm::new(d, &cfg)?;
            *h = handle.encode();
            *lc = Box::into_raw(comm) as *mut c_void;
        }
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
        *sc = comm;
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
        // SAFETY: NCCL passes a listen comm of ours (or null); its magic says which kind.
        if !listen_comm.is_null() && unsafe { *(listen_comm as *const u64) } == VLISTEN_MAGIC {
            // SAFETY: the magic says it is a verbs listen comm; NCCL's contract as above.
            let l: &mut VerbsListen =
                unsafe { checked(listen_comm, VLISTEN_MAGIC, "listen comm")? };
            if let Some(c) = l.accept()? {
                *rc = Box::into_raw(c) as *mut c_void;
            }
            return Ok(());
        }
        // SAFETY: a listen comm of ours (NCCL's contract), its magic checked.
        let l: &mut ListenComm = unsafe { checked(listen_comm, LISTEN_MAGIC, "listen comm")? };
        if let Some(c) = l.accept()? {
            *rc = Box::into_raw(c) as *mut c_void;
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
        // SAFETY: NCCL passes a send comm of ours: its magic says which kind.
        if unsafe { *(comm as *const u64) } == SEND_MAGIC_VERBS {
            // SAFETY: a verbs send comm of ours, boxed in connect; NCCL closes it once.
            unsafe { taken::<VerbsSend>(comm, SEND_MAGIC_VERBS, "send comm")? }.close();
        } else {
            // The threads stop and are joined before the comm (and its requests) is freed.
            // SAFETY: a send comm of ours, boxed in connect; NCCL closes it once.
            unsafe { taken::<SendComm>(comm, SEND_MAGIC, "send comm")? }.close();
        }
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
        // SAFETY: NCCL passes a receive comm of ours: its magic says which kind.
        if unsafe { *(comm as *const u64) } == RECV_MAGIC_VERBS {
            // SAFETY: a verbs receive comm of ours, boxed in accept; NCCL closes it once.
            unsafe { taken::<VerbsRecv>(comm, RECV_MAGIC_VERBS, "receive comm")? }.close();
        } else {
            // The threads stop and are joined before the comm (and its requests) is freed.
            // SAFETY: a receive comm of ours, boxed in accept; NCCL closes it once.
            unsafe { taken::<RecvComm>(comm, RECV_MAGIC, "receive comm")? }.close();
        }
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
        // SAFETY: NCCL passes a listen comm of ours: its magic says which kind.
        if unsafe { *(comm as *const u64) } == VLISTEN_MAGIC {
            // SAFETY: a verbs listen comm of ours, boxed in listen; NCCL closes it once.
            drop(unsafe { taken::<VerbsListen>(comm, VLISTEN_MAGIC, "listen comm")? });
        } else {
            // SAFETY: a listen comm of ours, boxed in listen; NCCL closes it once.
            unsafe { taken::<ListenComm>(comm, LISTEN_MAGIC, "listen comm")? }.close();
        }
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
