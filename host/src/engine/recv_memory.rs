//! Where a receiver's transfers land ([`RecvMemory`]): host memory, this GPU's memory,
//! memory a library caller lent or lends once it has seen the offer, or a memory plan
//! walked per transfer; what each holds per transfer (admission's count) and which
//! offers it cannot take at all, asked before admission.

use super::options::SinkFactoryMaker;
use super::serve_offer::MemoryKind;
use crate::memory::lent::{AskCaller, LentPlace, LentTarget};
use crate::wire::{Header, RejectReason};
use std::sync::{Arc, Mutex};

/// Transfers a library call's receive takes at once (its admission's
/// `max_connections`): one, into the memory the call lends.
pub const LIBRARY_TRANSFERS_AT_ONCE: usize = 1;

/// Where received data goes.
pub enum RecvMemory {
    Host,
    /// GPU memory of this GPU, verified by the verify kernel (over TCP, staged through a
    /// page-locked ring).
    #[cfg(feature = "cuda")]
    Device(std::rc::Rc<crate::gpu::Gpu>),
    /// Memory a library caller lent (host or GPU), for one transfer of exactly its size:
    /// taken by the first offer admitted.
    Lent(Mutex<Option<LentTarget>>),
    /// Memory the caller lends once it has seen the offer (the library's `accept`): the
    /// first offer admitted is shown to it, and the serve ends with that offer, taken
    /// into the memory the caller gives or declined.
    Ask(AskCaller),
    /// A memory plan walked per transfer until the NIC registers a method's buffer
    /// (verbs: GPUDirect RDMA where the NIC takes GPU memory, else host memory).
    Plan(Arc<SinkFactoryMaker>),
}

impl RecvMemory {
    /// Room, beyond its data, that one transfer of up to `max_bytes` may hold here at
    /// most: the upload ring of the most streams a sender may open, where the transfer may
    /// land in GPU memory (a caller's lent or asked-for buffer, `--mem device`); nothing
    /// for host memory. A library call's memory limit adds it, so a small receive into
    /// GPU memory is not refused for its ring.
    pub fn ring_allowance(&self, max_bytes: u64) -> u64 {
        let may_be_gpu = match self {
            RecvMemory::Host | RecvMemory::Plan(_) => false,
            RecvMemory::Ask(_) => true,
            RecvMemory::Lent(target) => lent_on_gpu(target),
            #[cfg(feature = "cuda")]
            RecvMemory::Device(_) => true,
        };
        if !may_be_gpu {
            return 0;
        }
        let chunk = usize::try_from(max_bytes).unwrap_or(usize::MAX);
        upload_ring_bytes(usize::from(crate::net::tcp::frames::MAX_STREAMS), chunk)
            .map_or(0, |r| r as u64)
    }

    /// The bytes a transfer of `total` bytes in chunks of `chunk` over `streams` streams
    /// holds here.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    pub(super) fn bytes_for(&self, total: u64, chunk: u64, streams: u16) -> u64 {
        let ring = || {
            usize::try_from(chunk.min(total))
                .ok()
                .and_then(|c| upload_ring_bytes(streams as usize, c))
                .map_or(u64::MAX, |r| r as u64)
        };
        match self {
            RecvMemory::Host | RecvMemory::Plan(_) => total,
            // Asked before admission, and then lent memory.
            RecvMemory::Ask(_) => 0,
            // The caller's memory is there already; into GPU memory, the upload ring.
            RecvMemory::Lent(target) => {
                if lent_on_gpu(target) {
                    ring()
                } else {
                    0
                }
            }
            // The device buffer and the upload ring's page-locked slots.
            #[cfg(feature = "cuda")]
            RecvMemory::Device(_) => total.saturating_add(ring()),
        }
    }

    /// Why an offer cannot be taken into this memory at all, before admission: a lent
    /// buffer takes one transfer of exactly its size.
    pub(super) fn refuses(&self, header: &Header) -> Option<(RejectReason, Option<String>)> {
        let RecvMemory::Lent(target) = self else {
            return None;
        };
        let target = target.lock().unwrap_or_else(|p| p.into_inner());
        let Some(target) = target.as_ref() else {
            // Taken by a transfer in progress (admission allows one at a time).
            let reason = RejectReason::BusyConnections {
                active: LIBRARY_TRANSFERS_AT_ONCE as u64,
                max: LIBRARY_TRANSFERS_AT_ONCE as u64,
            };
            return Some((reason, None));
        };
        if header.total_bytes != target.len as u64 {
            let reason = RejectReason::SizeMismatch {
                offered: header.total_bytes,
                expected: target.len as u64,
            };
            return Some((reason, None));
        }
        if header.transfers > 1 {
            let reason = RejectReason::OneTransferPerBuffer {
                transfers: header.transfers.into(),
            };
            return Some((reason, None));
        }
        None
    }

    pub(super) fn kind(&self) -> MemoryKind {
        match self {
            #[cfg(feature = "cuda")]
            RecvMemory::Device(gpu) => MemoryKind::Device {
                ordinal: gpu.ordinal(),
            },
            RecvMemory::Lent(target) => {
                MemoryKind::Lent(target.lock().unwrap_or_else(|p| p.into_inner()).take())
            }
            RecvMemory::Plan(maker) => MemoryKind::Plan(maker.clone()),
            _ => MemoryKind::Host,
        }
    }
}

/// Whether a caller lent GPU memory (not yet taken by a transfer).
fn lent_on_gpu(target: &Mutex<Option<LentTarget>>) -> bool {
    target
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .is_some_and(|t| !matches!(t.place, LentPlace::Host(_)))
}

/// The page-locked ring an upload into GPU memory holds (none without the GPU).
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn upload_ring_bytes(streams: usize, chunk: usize) -> Option<usize> {
    #[cfg(feature = "cuda")]
    return crate::gpu::upload::ring_bytes(streams, chunk);
    #[cfg(not(feature = "cuda"))]
    None
}
