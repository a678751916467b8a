//! What a GPU and its driver offer for RDMA, read from the driver and the kernel.

use super::driver::{self, DriverResult};
use super::ffi::{self, attribute};
use crate::memory_path::GpuCapabilities;
use serde::Serialize;

/// Everything `host info` prints about one GPU.
#[derive(Debug, Clone, Serialize)]
pub struct GpuReport {
    pub ordinal: u32,
    pub name: String,
    pub pci_bus_id: String,
    pub compute_capability: String,
    pub multiprocessors: i32,
    pub total_memory_bytes: usize,
    pub capabilities: GpuCapabilities,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING`: 0 none, 100 owner, 200 all
    /// devices.
    pub rdma_writes_ordering: i32,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS` (bit 0 host, bit 1 memops).
    pub rdma_flush_writes_options: i32,
}

/// Is a peermem module loaded (`nvidia_peermem`, or the older `nv_peer_mem`), so that
/// `ibv_reg_mr` accepts GPU addresses?
pub fn peermem_loaded() -> bool {
    crate::rdma::loaded_peermem_module().is_some()
}

fn flag(device: i32, attr: i32) -> DriverResult<bool> {
    // An attribute the driver does not know (older than the feature) means "no".
    Ok(driver::device_attribute(device, attr).unwrap_or(0) != 0)
}

/// The capabilities of `device` (a raw `CUdevice`).
pub fn capabilities(device: i32) -> DriverResult<GpuCapabilities> {
    Ok(GpuCapabilities {
        dma_buf: flag(device, attribute::DMA_BUF_SUPPORTED)?,
        gpudirect_rdma: flag(device, attribute::GPU_DIRECT_RDMA_SUPPORTED)?,
        peermem_loaded: peermem_loaded(),
        can_map_host_memory: flag(device, attribute::CAN_MAP_HOST_MEMORY)?,
    })
}

/// The PCI bus id of `device` as sysfs names it (`0000:00:06.0`).
pub fn pci_bus_id(device: i32) -> DriverResult<String> {
    let attr = |a| driver::device_attribute(device, a);
    Ok(format!(
        "{:04x}:{:02x}:{:02x}.0",
        attr(attribute::PCI_DOMAIN_ID)?,
        attr(attribute::PCI_BUS_ID)?,
        attr(attribute::PCI_DEVICE_ID)?
    ))
}

/// Report every GPU of the machine (an empty list when CUDA finds none).
pub fn report_all() -> anyhow::Result<Vec<GpuReport>> {
    driver::check("cuInit", driver::init())?;
    let mut reports = Vec::new();
    for ordinal in 0..driver::device_count()? {
        let raw = driver::device_get(ordinal)?;
        let attr = |a| driver::device_attribute(raw, a);
        reports.push(GpuReport {
            ordinal: ordinal as u32,
            name: driver::device_name(raw)?,
            pci_bus_id: pci_bus_id(raw)?,
            compute_capability: format!(
                "{}.{}",
                attr(attribute::COMPUTE_CAPABILITY_MAJOR)?,
                attr(attribute::COMPUTE_CAPABILITY_MINOR)?
            ),
            multiprocessors: attr(attribute::MULTIPROCESSOR_COUNT)?,
            total_memory_bytes: driver::device_total_memory(raw)?,
            capabilities: capabilities(raw)?,
            rdma_writes_ordering: attr(attribute::GPU_DIRECT_RDMA_WRITES_ORDERING).unwrap_or(0),
            rdma_flush_writes_options: attr(attribute::GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS)
                .unwrap_or(0),
        });
    }
    Ok(reports)
}

/// How the NIC's writes into this GPU's memory become visible, in order, to the GPU's
/// next kernel (the receiver's verify kernel).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WritesVisibility {
    /// `cuFlushGPUDirectRDMAWrites` is available (flush-options host bit): call it after
    /// the last write, before the kernel.
    Flush,
    /// No flush, but the writes-ordering attribute says the owning GPU sees them in order.
    Ordered,
    /// Neither: the GPU may see stale data. NCCL flushes with an RDMA READ on a loopback
    /// queue pair there; this program refuses to receive into such a GPU instead.
    Unordered,
}

/// The decision from the two attributes (NVIDIA's documentation of
/// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING` and `..._FLUSH_WRITES_OPTIONS`).
pub fn classify_writes(ordering: i32, flush_options: i32) -> WritesVisibility {
    if flush_options & ffi::FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST != 0 {
        WritesVisibility::Flush
    } else if ordering >= ffi::GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER {
        WritesVisibility::Ordered
    } else {
        WritesVisibility::Unordered
    }
}

/// [`classify_writes`] for `device` (a raw `CUdevice`); an attribute the driver does not
/// know counts as 0 (the feature is missing).
pub fn writes_visibility(device: i32) -> WritesVisibility {
    let ordering =
        driver::device_attribute(device, attribute::GPU_DIRECT_RDMA_WRITES_ORDERING).unwrap_or(0);
    let options = driver::device_attribute(device, attribute::GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS)
        .unwrap_or(0);
    classify_writes(ordering, options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nic_writes_are_flushed_where_possible_and_refused_where_unordered() {
        // The H200: ordering "owner" (100), flush options 0x1.
        assert_eq!(classify_writes(100, 1), WritesVisibility::Flush);
        assert_eq!(classify_writes(0, 1), WritesVisibility::Flush);
        assert_eq!(classify_writes(100, 0), WritesVisibility::Ordered);
        assert_eq!(classify_writes(200, 2), WritesVisibility::Ordered);
        assert_eq!(classify_writes(0, 0), WritesVisibility::Unordered);
        assert_eq!(classify_writes(0, 2), WritesVisibility::Unordered);
    }
}
