//! The facts `host info` and `host doctor` print and decide on, gathered from the GPU
//! driver and sysfs. Thin on purpose: the decisions are in `memory_path` and
//! `topology`, where tests feed them.

use host::memory_factory::GpuChoice;
use host::memory_path::{Attempt, AttemptLog, Bar1Fit, GpuCapabilities, NicFacts, PathFacts};
use host::rdma::{self, DmaBufProbe, NicLocation, NicProbe};
use host::topology::{self, PciDistance, PciFunction};
use std::path::Path;

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
    topology::gpu_function(Path::new("/"), bus_id)
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
/// The NIC to check: the one asked for, else the nearest to the GPU (unknown distances
/// last, the first of equals).
pub fn choose_nic(
    nics: &[(&str, Result<PciDistance, String>)],
    asked: Option<&str>,
) -> Result<usize, String> {
    if let Some(name) = asked {
        return nics.iter().position(|(n, _)| *n == name).ok_or_else(|| {
            let names: Vec<&str> = nics.iter().map(|(n, _)| *n).collect();
            format!("no RDMA device {name} (there are: {})", names.join(", "))
        });
    }
    nics.iter()
        .enumerate()
        .min_by_key(|(_, (_, d))| d.as_ref().ok().copied().map_or(usize::MAX, |d| d as usize))
        .map(|(i, _)| i)
        .ok_or_else(|| "no RDMA device".to_string())
}

/// The facts a transfer's memory plan is decided on: the GPU in use and the NIC the
/// transfer goes through (`--nic`, else the nearest to the GPU), asked just before.
/// Without a GPU nothing is probed: only host memory is left to decide on.
pub fn path_facts(
    gpu: &GpuChoice,
    nic: Option<&str>,
    gpudirect_level: PciDistance,
    register_bytes: u64,
) -> anyhow::Result<PathFacts> {
    let peermem = rdma::loaded_peermem_module();
    let unknown_nic = |why: String| NicFacts {
        name: nic.unwrap_or("the RDMA device").to_string(),
        dma_buf: DmaBufProbe::Unknown { why },
        peermem,
    };
    let mut facts = PathFacts {
        gpu: gpu.caps.clone(),
        nic: unknown_nic("not probed: no GPU".into()),
        distance: Err("no GPU".into()),
        gpudirect_level,
        bar1: None,
    };
    let Some(bus_id) = gpu.pci_bus_id.as_deref().filter(|_| gpu.caps.is_ok()) else {
        return Ok(facts);
    };
    let function = topology::gpu_function(Path::new("/"), bus_id);
    let nics = match rdma::probe_nics() {
        Ok(nics) => nics,
        Err(e) => {
            // The transfer itself will say there is no RDMA device.
            facts.nic = unknown_nic(e.to_string());
            return Ok(facts);
        }
    };
    let distances: Vec<(&str, Result<PciDistance, String>)> = nics
        .iter()
        .map(|n| (n.name.as_str(), distance(&function, n)))
        .collect();
    let index = choose_nic(&distances, nic).map_err(anyhow::Error::msg)?;
    facts.distance = distances[index].1.clone();
    facts.nic = NicFacts {
        name: nics[index].name.clone(),
        dma_buf: nics[index].dma_buf.clone(),
        peermem,
    };
    facts.bar1 = function
        .ok()
        .and_then(|f| topology::bar1_bytes(&f).ok())
        .map(|bar1_bytes| Bar1Fit {
            bar1_bytes,
            register_bytes,
        });
    Ok(facts)
}

/// The plan's notes for people: what was left out or refused, and the path taken; none
/// when the first method tried was taken with nothing left out.
pub fn memory_notes(log: &AttemptLog) -> Vec<String> {
    let plain = matches!(log.attempts.as_slice(), [Attempt::Taken { .. }] | []);
    if plain {
        Vec::new()
    } else {
        log.lines()
    }
}
