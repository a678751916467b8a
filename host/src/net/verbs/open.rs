//! Opening a verbs connection from the sender's side, what every rail does: the route to
//! the receiver (address and route resolution, each bounded), the checks of the device
//! (`--nic`) and of the largest message, the connect and its answer (the accept's
//! private data, or the reject's reason in words), and the source's memory chosen where
//! the NIC registers it.

use super::conn::{next_event, Resources};
use crate::memory::SendSource;
use crate::memory_factory::SendMemory;
use crate::memory_path::{walk, AttemptLog};
use crate::rdma::{
    self, errno_message, CmEventKind, CmId, ConnParams, Deadline, EventChannel, MemoryRegion,
};
use crate::transfer::TransferError;
use crate::units::format_bytes_apart;
use crate::wire::{RejectReason, WireError};
use std::net::SocketAddr;
use std::time::Duration;

/// Whether the RDMA CM resolves `peer`'s address and route to an RDMA device, within
/// `timeout` (for `--transport auto`): the first steps of a connection, then dropped.
/// Returns the name of the device the route leaves through (whose facts decide the
/// memory path).
pub fn reachable(peer: SocketAddr, timeout: Duration) -> Result<Option<String>, TransferError> {
    let channel = EventChannel::new()?;
    let id = CmId::new(&channel)?;
    resolve(&id, peer, timeout)?;
    // Resolution bound the id to the device the route leaves through.
    Ok(id.device_name())
}

/// Extra time given to the CM to report its own timeout.
const CM_GRACE: Duration = Duration::from_millis(500);

/// Resolve `peer`'s address and route on `id`, each step bounded by `timeout`.
pub fn resolve(id: &CmId, peer: SocketAddr, timeout: Duration) -> Result<(), TransferError> {
    let label = peer.to_string();
    id.resolve_addr(peer, timeout)?;
    // A little longer than the CM's own timeout, so that its ADDR_ERROR (with the
    // reason) comes first.
    let deadline = Deadline::after(timeout + CM_GRACE);
    let event = next_event(id, &deadline, &format!("address resolution of {label}"))?;
    match event.kind() {
        CmEventKind::AddrResolved => {}
        CmEventKind::AddrError => {
            let errno = -event.status();
            let why = if errno == libc::ENODEV {
                "no RDMA device on the way to it (the route leaves through a network interface without RDMA)".to_string()
            } else {
                format!("address resolution failed: {}", errno_message(errno))
            };
            return Err(TransferError::Unreachable { peer: label, why });
        }
        _ => {
            return Err(rdma::RdmaError::UnexpectedEvent {
                expected: "RDMA_CM_EVENT_ADDR_RESOLVED",
                got: event.name(),
                status: event.status(),
            }
            .into())
        }
    }
    drop(event);
    id.resolve_route(timeout)?;
    let deadline = Deadline::after(timeout + CM_GRACE);
    let event = next_event(id, &deadline, &format!("route resolution to {label}"))?;
    match event.kind() {
        CmEventKind::RouteResolved => Ok(()),
        CmEventKind::RouteError => Err(TransferError::Unreachable {
            peer: label,
            why: format!(
                "route resolution failed: {}",
                errno_message(-event.status())
            ),
        }),
        _ => Err(rdma::RdmaError::UnexpectedEvent {
            expected: "RDMA_CM_EVENT_ROUTE_RESOLVED",
            got: event.name(),
            status: event.status(),
        }
        .into()),
    }
}

/// IB CM reject reason "invalid service ID": nobody listens on that port.
const IB_CM_REJ_INVALID_SERVICE_ID: i32 = 8;

/// Connect with `private_data` and wait for ESTABLISHED; returns the accept's private data.
pub fn connect(
    id: &CmId,
    peer: SocketAddr,
    private_data: &[u8],
    timeout: Duration,
    raw: bool,
) -> Result<Vec<u8>, TransferError> {
    let label = peer.to_string();
    id.connect(&ConnParams::with_private_data(private_data))?;
    let deadline = Deadline::after(timeout);
    let event = next_event(id, &deadline, &format!("{label} to accept the connection"))?;
    let status = event.status();
    match event.kind() {
        CmEventKind::Established => Ok(event.private_data().to_vec()),
        CmEventKind::Rejected => match RejectReason::decode(event.private_data()) {
            Some(RejectReason::BadHeader(WireError::BadMagic { .. })) if raw => {
                Err(TransferError::Protocol(format!(
                    "receiver rejected the transfer: {label} expects framed transfers (it is `host recv` without --raw); drop --raw here or start it with --raw"
                )))
            }
            Some(reason) => Err(TransferError::Rejected(reason)),
            None if status == IB_CM_REJ_INVALID_SERVICE_ID || status == -libc::ECONNREFUSED => {
                Err(TransferError::NoReceiver {
                    peer: label,
                    why: "connection refused".into(),
                })
            }
            None => Err(TransferError::RejectedWithoutReason { peer: label, status }),
        },
        CmEventKind::Unreachable => Err(TransferError::NoReceiver {
            peer: label,
            why: format!("no answer: {}", errno_message(-status)),
        }),
        CmEventKind::ConnectError => Err(TransferError::Unreachable {
            peer: label,
            why: format!("connecting failed: {}", errno_message(-status)),
        }),
        _ => Err(rdma::RdmaError::UnexpectedEvent {
            expected: "RDMA_CM_EVENT_ESTABLISHED",
            got: event.name(),
            status,
        }
        .into()),
    }
}

/// The device's largest message, checked against what one work request carries.
pub fn check_message_size(id: &CmId, bytes: u64, what: &str) -> Result<(), TransferError> {
    let port = id.port_info()?;
    if bytes > port.max_msg_sz as u64 {
        // In exact bytes where the rounded sizes would read the same.
        let (bytes, max) = format_bytes_apart(bytes, port.max_msg_sz as u64);
        return Err(TransferError::Protocol(format!(
            "{what} of {bytes} exceeds the largest message of RDMA device {} ({max})",
            id.device_name().unwrap_or_else(|| "?".into()),
        )));
    }
    Ok(())
}

/// The route to `peer` must leave through `wanted`, if one is named.
pub fn check_device(
    id: &CmId,
    wanted: Option<&str>,
    peer: SocketAddr,
) -> Result<(), TransferError> {
    let Some(wanted) = wanted else {
        return Ok(());
    };
    match id.device_name() {
        Some(bound) if bound != wanted => Err(TransferError::Protocol(format!(
            "the route to {peer} leaves through RDMA device {bound}, not --nic {wanted}: give the receiver an address reached through {wanted}, or drop --nic"
        ))),
        _ => Ok(()),
    }
}

/// Walk the memory plan on this connection's protection domain: the first method whose
/// memory the NIC registers is the one the transfer uses (a trial registration, dropped
/// at once; the transfer registers the memory again for itself). A refusal (no dma-buf in
/// the NIC's driver, no peermem, a BAR1 too small) moves on to the next method.
/// Also returns the time spent making sources in the walk (since `making_before`).
pub(crate) fn choose_source<'m>(
    res: &Resources,
    memory: &'m mut SendMemory,
    making_before: Duration,
) -> Result<(&'m dyn SendSource, AttemptLog, Duration), TransferError> {
    let plan = memory.plan().clone();
    let walked = walk(&plan, |method| {
        let source = memory.source(method).map_err(|e| format!("{e:#}"))?;
        MemoryRegion::register(&res.pd, source.memory())
            .map(drop)
            .map_err(|e| e.to_string())
    })
    .map_err(|e| TransferError::Memory(e.into()))?;
    memory.settle(walked.method);
    let making = memory.making_time().saturating_sub(making_before);
    let source = memory
        .source(walked.method)
        .map_err(TransferError::Memory)?;
    Ok((source, walked.log, making))
}

/// Register the source's memory for the NIC to read. When the NIC refuses GPU memory
/// (no dma-buf support in its driver, no peermem), say what to use instead.
pub(crate) fn register_source<'s>(
    res: &Resources,
    source: &'s dyn SendSource,
) -> Result<MemoryRegion<'s>, TransferError> {
    let memory = source.memory();
    MemoryRegion::register(&res.pd, memory).map_err(|e| {
        if memory.target().is_gpu_memory() {
            TransferError::Protocol(format!(
                "the NIC could not register GPU memory for GPUDirect RDMA ({e}); use --mem staged or --mem mapped"
            ))
        } else {
            e.into()
        }
    })
}
