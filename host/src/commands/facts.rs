//! The facts `host info` and `host doctor` print and decide on, gathered from the GPU
//! driver and sysfs. Thin on purpose: the decisions are in `memory::select` and
//! `topology`, where tests feed them.

use host::memory::select::GpuCapabilities;
use host::rdma::{NicLocation, NicProbe};
use host::topology::{self, PciDistance, PciFunction};

/// Why a build without the `cuda` feature has no GPU.
#[cfg(not(feature = "cuda"))]
pub const NO_CUDA: &str = "this build has no GPU support (built without the `cuda` feature)";

/// One GPU, as far as the GPUDirect decision cares.
pub struct GpuFacts {
    pub ordinal: u32,
    pub name: String,
    pub bus_id: String,
    pub caps: GpuCapabilities,
    /// Its PCI function in sysfs, or why it was not found.
    pub function: Result<PciFunction, String>,
}

/// The GPU's sysfs function from its bus id (`0000:00:06.0`).
#[cfg(feature = "cuda")]
pub fn gpu_function(bus_id: &str) -> Result<PciFunction, String> {
    topology::gpu_function(std::path::Path::new("/"), bus_id)
}

/// Every GPU, or why there is none to use.
#[cfg(feature = "cuda")]
pub fn gpus() -> Result<Vec<GpuFacts>, String> {
    let reports = host::gpu::capabilities::report_all().map_err(|e| format!("{e:#}"))?;
    Ok(reports
        .into_iter()
        .map(|g| GpuFacts {
            function: gpu_function(&g.pci_bus_id),
            ordinal: g.ordinal,
            name: g.name,
            bus_id: g.pci_bus_id,
            caps: g.capabilities,
        })
        .collect())
}

#[cfg(not(feature = "cuda"))]
pub fn gpus() -> Result<Vec<GpuFacts>, String> {
    Err(NO_CUDA.to_string())
}

/// The distance between a GPU and a NIC, or why it cannot be told.
pub fn distance(gpu: &Result<PciFunction, String>, nic: &NicProbe) -> Result<PciDistance, String> {
    let gpu = gpu
        .as_ref()
        .map_err(|e| format!("the GPU's PCI location is unknown: {e}"))?;
    match &nic.location {
        NicLocation::Pci { function } => Ok(topology::distance(gpu, function)),
        NicLocation::Software => Err(format!(
            "{} is a software device, no PCI function",
            nic.name
        )),
        NicLocation::Unknown { why } => {
            Err(format!("{}'s PCI location is unknown: {why}", nic.name))
        }
    }
}
