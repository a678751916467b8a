//! The data path's entry points: `regMr`/`deregMr` (host memory only; a registration
//! remembers its range so `isend` and `irecv` can check their buffers lie inside it),
//! `isend`, `irecv` (up to `maxRecvs` buffers with their tags), `iflush` (nothing to
//! flush in host memory) and `test`, for every table version.

use super::entry::{guard, out};
use crate::abi::*;
use crate::comm::recv::RecvComm;
use crate::comm::send::SendComm;
use crate::comm::{
    checked, checked_shared, RequestHandle, RECV_MAGIC, RECV_MAGIC_VERBS, REQUEST_MAGIC,
    SEND_MAGIC, SEND_MAGIC_VERBS,
};
use crate::error::{NetError, Result};
use crate::verbs::recv::VerbsRecv;
use crate::verbs::send::VerbsSend;
use crate::wire::MAX_RECVS;
use std::ffi::{c_int, c_void};

/// A registration: host memory only; the handle remembers the range for the checks
/// of `isend`/`irecv`.
#[repr(C)]
struct Mr {
    magic: u64,
    start: usize,
    len: usize,
    /// Over verbs: the comm's registration (the NIC's keys for the range).
    verbs: Option<usize>,
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
    m == SEND_MAGIC || m == RECV_MAGIC || m == SEND_MAGIC_VERBS || m == RECV_MAGIC_VERBS
}

/// A comm's magic (which kind it is).
///
/// # Safety
/// As [`is_comm`]; `comm` is not null.
unsafe fn magic_of(comm: *mut c_void) -> u64 {
    // SAFETY: the caller's contract: 8 readable bytes.
    unsafe { *(comm as *const u64) }
}

/// # Safety
/// NCCL's `regMr`: `comm` null or a comm of this plugin's, `mhandle` null or a pointer
/// variable to write; `data` and `size` are only remembered, for the checks of `isend`
/// and `irecv`.
pub(super) unsafe extern "C" fn reg_mr(
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
        // Over verbs the NIC must know the memory: registered on the comm's PD.
        // SAFETY: is_comm checked that `comm` is a comm of ours (8 bytes of magic).
        let magic = unsafe { magic_of(comm) };
        let verbs = match magic {
            SEND_MAGIC_VERBS => {
                // SAFETY: a verbs send comm of ours by its magic; NCCL's contract for
                // regMr: the memory stays allocated until deregMr (net_v11.h), which is
                // what `register` asks.
                let c =
                    unsafe { checked_shared::<VerbsSend>(comm, SEND_MAGIC_VERBS, "send comm") }?;
                // SAFETY: as just said.
                Some(unsafe { c.register(data as *mut u8, size) }?)
            }
            RECV_MAGIC_VERBS => {
                // SAFETY: as above, a verbs receive comm.
                let c =
                    unsafe { checked_shared::<VerbsRecv>(comm, RECV_MAGIC_VERBS, "receive comm") }?;
                // SAFETY: as above.
                Some(unsafe { c.register(data as *mut u8, size) }?)
            }
            _ => None,
        };
        *mh = Box::into_raw(Box::new(Mr {
            magic: MR_MAGIC,
            start: data as usize,
            len: size,
            verbs,
        })) as *mut c_void;
        Ok(())
    })
}

/// # Safety
/// NCCL's `deregMr`: `mhandle` null or a registration of this plugin's not yet
/// deregistered.
pub(super) unsafe extern "C" fn dereg_mr(comm: *mut c_void, mhandle: *mut c_void) -> NcclResult {
    guard("deregMr", || {
        if mhandle.is_null() {
            return Ok(());
        }
        // SAFETY: a registration of ours, not yet deregistered.
        let mr: &mut Mr = unsafe { checked(mhandle, MR_MAGIC, "memory registration")? };
        // SAFETY: NCCL passes the comm the registration was made on (8 bytes of magic).
        let kind = unsafe { is_comm(comm) }.then(|| {
            // SAFETY: a comm of ours, checked just above.
            unsafe { magic_of(comm) }
        });
        match (kind, mr.verbs) {
            // Over TCP the comm's threads read and write NCCL's memory themselves: none
            // may once this returns (NCCL frees the memory next).
            (Some(SEND_MAGIC), None) => {
                // SAFETY: a TCP send comm of ours, by its magic.
                let c: &SendComm = unsafe { checked_shared(comm, SEND_MAGIC, "send comm")? };
                c.release(mr.start, mr.len)?;
            }
            (Some(RECV_MAGIC), None) => {
                // SAFETY: a TCP receive comm of ours, by its magic.
                let c: &RecvComm = unsafe { checked_shared(comm, RECV_MAGIC, "receive comm")? };
                c.release(mr.start, mr.len)?;
            }
            (Some(SEND_MAGIC_VERBS), Some(index)) => {
                // SAFETY: a verbs send comm of ours, by its magic.
                let c =
                    unsafe { checked_shared::<VerbsSend>(comm, SEND_MAGIC_VERBS, "send comm") }?;
                c.deregister(index)?;
            }
            (Some(_), Some(index)) => {
                // SAFETY: else a verbs receive comm of ours (checked's magic says if not).
                let c =
                    unsafe { checked_shared::<VerbsRecv>(comm, RECV_MAGIC_VERBS, "receive comm") }?;
                c.deregister(index)?;
            }
            (None, Some(_)) => {
                return Err(NetError::invalid("deregMr: not a comm of this plugin"));
            }
            (_, None) => {}
        }
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
) -> Result<Option<usize>> {
    if mhandle.is_null() {
        return Ok(None);
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
    Ok(mr.verbs)
}

/// The verbs registration a buffer of a verbs comm needs (the NIC reads and writes only
/// registered memory).
fn needs_registration(reg: Option<usize>, what: &str) -> Result<usize> {
    reg.ok_or_else(|| {
        NetError::invalid(format!(
            "{what}: over verbs every buffer must come with its registration (regMr on this comm)"
        ))
    })
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
    if data.is_null() && size > 0 {
        return Err(NetError::invalid("isend: null buffer"));
    }
    // SAFETY: the caller's contract (mhandle).
    let reg = unsafe { check_in_mr(mhandle, data, size, "isend") }?;
    // SAFETY: NCCL passes a send comm it got from connect and has not closed: 8 readable
    // bytes of magic say which kind.
    if !send_comm.is_null() && unsafe { magic_of(send_comm) } == SEND_MAGIC_VERBS {
        // SAFETY: as above, the magic checked again inside.
        let c: &VerbsSend = unsafe { checked_shared(send_comm, SEND_MAGIC_VERBS, "send comm")? };
        let reg = needs_registration(reg, "isend")?;
        if let Some(r) = c.isend(data as *const u8, size as u64, tag, reg)? {
            *rq = r;
        }
        return Ok(());
    }
    // SAFETY: a send comm NCCL got from connect and has not closed.
    let c: &SendComm = unsafe { checked_shared(send_comm, SEND_MAGIC, "send comm")? };
    if let Some(r) = c.isend(data as *const u8, size as u64, tag)? {
        *rq = r;
    }
    Ok(())
}

/// # Safety
/// NCCL's `isend` (v10, v11): as `isend_common` asks: a send comm of this plugin's not
/// yet closed, `data` readable for `size` bytes until `test` reports the request done,
/// `mhandle` null or its registration, `request` null or a pointer variable to write.
pub(super) unsafe extern "C" fn isend_v10(
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
pub(super) unsafe extern "C" fn isend_v9(
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
pub(super) unsafe extern "C" fn isend_v8(
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
    // SAFETY: NCCL passes a receive comm it got from accept and has not closed: 8
    // readable bytes of magic say which kind.
    let verbs = !recv_comm.is_null() && unsafe { magic_of(recv_comm) } == RECV_MAGIC_VERBS;
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
        let reg = unsafe { check_in_mr(mh, d, size, "irecv") }?;
        bufs.push((d as *mut u8, size as u64, tag, reg));
    }
    if verbs {
        // SAFETY: NCCL's contract (a receive comm of ours), the magic checked inside.
        let c: &VerbsRecv = unsafe { checked_shared(recv_comm, RECV_MAGIC_VERBS, "receive comm")? };
        let bufs = bufs
            .into_iter()
            .map(|(d, size, tag, reg)| Ok((d, size, tag, needs_registration(reg, "irecv")?)))
            .collect::<Result<Vec<_>>>()?;
        if let Some(r) = c.irecv(&bufs)? {
            *rq = r;
        }
        return Ok(());
    }
    // SAFETY: a receive comm NCCL got from accept and has not closed.
    let c: &RecvComm = unsafe { checked_shared(recv_comm, RECV_MAGIC, "receive comm")? };
    let bufs: Vec<_> = bufs
        .into_iter()
        .map(|(d, size, tag, _)| (d, size, tag))
        .collect();
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
pub(super) unsafe extern "C" fn irecv_v10(
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
pub(super) unsafe extern "C" fn irecv_v9(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL's arguments, as irecv_v10 asks (v9 has no profiler handles).
    unsafe {
        irecv_v10(
            recv_comm,
            n,
            data,
            sizes,
            tags,
            mhandles,
            std::ptr::null_mut(),
            request,
        )
    }
}

/// # Safety
/// NCCL's `irecv` (v8, `int` sizes): as [`irecv_v10`].
pub(super) unsafe extern "C" fn irecv_v8(
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
pub(super) unsafe extern "C" fn iflush_fn(
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
pub(super) unsafe extern "C" fn test_fn(
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
        let magic = if comm.is_null() {
            0
        } else {
            // SAFETY: the request's comm, alive while its requests are (NCCL closes a
            // comm only after its requests, or never tests them again): 8 bytes of magic.
            unsafe { magic_of(comm) }
        };
        if magic == SEND_MAGIC_VERBS || magic == RECV_MAGIC_VERBS {
            let got = if send {
                // SAFETY: as above; a verbs send comm by its magic.
                let c: &VerbsSend = unsafe { checked_shared(comm, SEND_MAGIC_VERBS, "send comm")? };
                c.test(index)?.map(|s| vec![s])
            } else {
                // SAFETY: as above; a verbs receive comm by its magic.
                let c: &VerbsRecv =
                    unsafe { checked_shared(comm, RECV_MAGIC_VERBS, "receive comm")? };
                c.test(index)?
            };
            if let Some(got) = got {
                *d = 1;
                if !sizes.is_null() {
                    for (i, s) in got.iter().enumerate() {
                        // SAFETY: NCCL's out-array, one element per buffer of the request.
                        unsafe { *sizes.add(i) = to_int(*s) };
                    }
                }
            }
            return Ok(());
        }
        if send {
            // SAFETY: the request's comm, alive while its requests are (NCCL closes a
            // comm only after its requests, or never tests them again).
            let c: &SendComm = unsafe { checked_shared(comm, SEND_MAGIC, "send comm")? };
            if let Some(size) = c.test(index)? {
                *d = 1;
                if !sizes.is_null() {
                    // SAFETY: NCCL's out-array, one element for a send.
                    unsafe { *sizes = to_int(size) };
                }
            }
        } else {
            // SAFETY: as above, for a receive comm.
            let c: &RecvComm = unsafe { checked_shared(comm, RECV_MAGIC, "receive comm")? };
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
