//! Which memory path to use: capabilities in, a plan or a clear refusal out.
//!
//! This is the one piece of the GPUDirect logic that can be tested anywhere: the
//! registration of GPU memory with a NIC needs real hardware, but the decision of what to
//! try, in what order, and what to say when nothing fits is plain data.
//!
//! Two generations live here:
//!
//! * [`plan::plan`] (the fallback chain): GPU capabilities, the NIC's probe answers, the
//!   GPU-NIC distance and BAR1 in; an ordered list of [`Method`]s to try, with each
//!   method left out and why, or a [`Refusal`]. [`walk::walk`] then tries them in order
//!   at run time and keeps a log of each attempt.
//! * [`choose_send_memory`] / [`choose_recv_memory`] (one answer from the GPU's
//!   capabilities alone), kept while the memory factory still uses them.

pub mod plan;
pub mod walk;

pub use plan::{plan, Bar1Fit, Direction, LeftOut, Method, NicFacts, PathFacts, Plan};
pub use walk::{walk, Attempt, AttemptLog, NothingWorked, Walked};

use std::fmt;

/// `--mem`: where the data lives when the NIC touches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemKind {
    /// The best path this GPU, driver and NIC allow; the program says which it took.
    Auto,
    /// Plain host memory; the CPU writes the pattern (no GPU involved).
    Host,
    /// Page-locked host memory mapped into the GPU; the kernel writes it over PCIe and
    /// the NIC reads host memory (the seed's method; not GPUDirect RDMA).
    Mapped,
    /// GPU memory registered with the NIC (GPUDirect RDMA: dma-buf, else nvidia-peermem).
    Device,
    /// GPU memory copied chunk by chunk into registered host memory, overlapped with the
    /// sends.
    Staged,
}

/// `host gpu-check --mem`: where the kernel writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckMemory {
    /// Page-locked host memory mapped into the GPU (the seed's method).
    Mapped,
    /// Device memory (`cuMemAlloc`), copied back for the CPU check.
    Device,
}

/// What the GPU and its driver offer, as far as the path choice cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct GpuCapabilities {
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`: GPU memory can be exported as a dma-buf
    /// (open kernel module, Linux 5.12+).
    pub dma_buf: bool,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`.
    pub gpudirect_rdma: bool,
    /// The nvidia-peermem kernel module is loaded, so `ibv_reg_mr` accepts GPU addresses.
    pub peermem_loaded: bool,
    /// `CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY`.
    pub can_map_host_memory: bool,
}

/// How GPU memory gets registered with the NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceRegistration {
    /// `cuMemGetHandleForAddressRange` + `ibv_reg_dmabuf_mr`.
    DmaBuf,
    /// `ibv_reg_mr` on the GPU address, through nvidia-peermem.
    PeerMem,
}

/// The decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryPlan {
    /// Host memory filled by the CPU; `note` says why, when it was a fallback.
    Host {
        note: Option<String>,
    },
    Mapped,
    Device(DeviceRegistration),
    Staged,
}

/// Why the asked-for path cannot be had; Display is the one-line error for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refusal {}

/// What is missing for GPUDirect RDMA, in the words a user can act on.
pub fn gpudirect_missing(caps: &GpuCapabilities) -> String {
    let mut missing = Vec::new();
    if !caps.dma_buf {
        missing.push(
            "the driver cannot export GPU memory as dma-buf (that needs NVIDIA's open kernel module, driver r515+, Linux 5.12+)",
        );
    }
    if !caps.peermem_loaded {
        missing.push("the nvidia-peermem kernel module is not loaded");
    }
    format!(
        "GPUDirect RDMA is not available: {}",
        missing.join(", and ")
    )
}

fn device_registration(caps: &GpuCapabilities) -> Option<DeviceRegistration> {
    if caps.dma_buf {
        Some(DeviceRegistration::DmaBuf)
    } else if caps.peermem_loaded {
        Some(DeviceRegistration::PeerMem)
    } else {
        None
    }
}

/// The sender's choice. `gpu` is the probed GPU's capabilities, or why there is none
/// (`--gpu none`, no driver, no device, a build without CUDA).
pub fn choose_send_memory(
    mem: MemKind,
    gpu: Result<GpuCapabilities, String>,
) -> Result<MemoryPlan, Refusal> {
    let caps = match (mem, gpu) {
        (MemKind::Host, _) => return Ok(MemoryPlan::Host { note: None }),
        (MemKind::Auto, Err(why)) => {
            return Ok(MemoryPlan::Host {
                note: Some(format!(
                    "{why}; the CPU writes the pattern into host memory"
                )),
            })
        }
        (_, Err(why)) => {
            return Err(Refusal(format!(
                "--mem {} needs a GPU: {why}",
                mem_name(mem)
            )))
        }
        (_, Ok(caps)) => caps,
    };
    match mem {
        MemKind::Host => unreachable!("handled above"),
        MemKind::Mapped if !caps.can_map_host_memory => Err(Refusal(
            "--mem mapped: this GPU cannot map host memory".into(),
        )),
        MemKind::Mapped => Ok(MemoryPlan::Mapped),
        MemKind::Staged => Ok(MemoryPlan::Staged),
        MemKind::Device => device_registration(&caps)
            .map(MemoryPlan::Device)
            .ok_or_else(|| {
                Refusal(format!(
                    "--mem device: {}; use --mem staged or --mem mapped",
                    gpudirect_missing(&caps)
                ))
            }),
        MemKind::Auto => Ok(match device_registration(&caps) {
            Some(method) => MemoryPlan::Device(method),
            None if caps.can_map_host_memory => MemoryPlan::Mapped,
            None => MemoryPlan::Staged,
        }),
    }
}

/// The receiver's choice: host memory (checked on the CPU) or GPU memory written by the
/// NIC (checked on the GPU). Mapped and staged make no sense for receiving.
pub fn choose_recv_memory(
    mem: MemKind,
    gpu: Result<GpuCapabilities, String>,
) -> Result<MemoryPlan, Refusal> {
    match (mem, gpu) {
        (MemKind::Host, _) => Ok(MemoryPlan::Host { note: None }),
        (MemKind::Mapped | MemKind::Staged, _) => Err(Refusal(format!(
            "--mem {} is for senders; a receiver takes host, device or auto",
            mem_name(mem)
        ))),
        (MemKind::Auto, Err(why)) => Ok(MemoryPlan::Host {
            note: Some(format!("{why}; receiving into host memory")),
        }),
        (MemKind::Device, Err(why)) => Err(Refusal(format!("--mem device needs a GPU: {why}"))),
        (MemKind::Auto, Ok(caps)) => Ok(match device_registration(&caps) {
            Some(method) => MemoryPlan::Device(method),
            None => MemoryPlan::Host {
                note: Some(format!(
                    "{}; receiving into host memory",
                    gpudirect_missing(&caps)
                )),
            },
        }),
        (MemKind::Device, Ok(caps)) => device_registration(&caps)
            .map(MemoryPlan::Device)
            .ok_or_else(|| Refusal(format!("--mem device: {}", gpudirect_missing(&caps)))),
    }
}

pub(crate) fn mem_name(mem: MemKind) -> &'static str {
    match mem {
        MemKind::Auto => "auto",
        MemKind::Host => "host",
        MemKind::Mapped => "mapped",
        MemKind::Device => "device",
        MemKind::Staged => "staged",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOTHING: GpuCapabilities = GpuCapabilities {
        dma_buf: false,
        gpudirect_rdma: false,
        peermem_loaded: false,
        can_map_host_memory: true,
    };
    const DMA_BUF: GpuCapabilities = GpuCapabilities {
        dma_buf: true,
        gpudirect_rdma: true,
        ..NOTHING
    };
    const PEERMEM: GpuCapabilities = GpuCapabilities {
        peermem_loaded: true,
        gpudirect_rdma: true,
        ..NOTHING
    };

    fn no_gpu() -> Result<GpuCapabilities, String> {
        Err("no GPU found".into())
    }

    #[test]
    fn auto_prefers_dma_buf_then_peermem_then_mapped() {
        let both = GpuCapabilities {
            peermem_loaded: true,
            ..DMA_BUF
        };
        assert_eq!(
            choose_send_memory(MemKind::Auto, Ok(both)),
            Ok(MemoryPlan::Device(DeviceRegistration::DmaBuf))
        );
        assert_eq!(
            choose_send_memory(MemKind::Auto, Ok(PEERMEM)),
            Ok(MemoryPlan::Device(DeviceRegistration::PeerMem))
        );
        assert_eq!(
            choose_send_memory(MemKind::Auto, Ok(NOTHING)),
            Ok(MemoryPlan::Mapped)
        );
        let unmappable = GpuCapabilities {
            can_map_host_memory: false,
            ..NOTHING
        };
        assert_eq!(
            choose_send_memory(MemKind::Auto, Ok(unmappable)),
            Ok(MemoryPlan::Staged)
        );
    }

    #[test]
    fn auto_without_a_gpu_falls_back_to_host_memory_and_says_why() {
        let plan = choose_send_memory(MemKind::Auto, no_gpu()).unwrap();
        let MemoryPlan::Host { note: Some(note) } = plan else {
            panic!("expected a host plan with a note, got {plan:?}");
        };
        assert!(note.contains("no GPU found"), "{note}");
    }

    #[test]
    fn device_without_gpudirect_is_refused_with_what_is_missing() {
        let err = choose_send_memory(MemKind::Device, Ok(NOTHING))
            .unwrap_err()
            .to_string();
        assert!(err.contains("open kernel module"), "{err}");
        assert!(err.contains("nvidia-peermem"), "{err}");
        assert!(err.contains("--mem staged"), "{err}");
    }

    #[test]
    fn gpu_paths_without_a_gpu_are_refused() {
        for mem in [MemKind::Mapped, MemKind::Device, MemKind::Staged] {
            let err = choose_send_memory(mem, no_gpu()).unwrap_err().to_string();
            assert!(err.contains("needs a GPU: no GPU found"), "{err}");
        }
    }

    #[test]
    fn explicit_choices_are_taken_as_asked() {
        assert_eq!(
            choose_send_memory(MemKind::Staged, Ok(DMA_BUF)),
            Ok(MemoryPlan::Staged)
        );
        assert_eq!(
            choose_send_memory(MemKind::Mapped, Ok(DMA_BUF)),
            Ok(MemoryPlan::Mapped)
        );
        assert_eq!(
            choose_send_memory(MemKind::Host, Ok(DMA_BUF)),
            Ok(MemoryPlan::Host { note: None })
        );
        assert_eq!(
            choose_send_memory(MemKind::Device, Ok(PEERMEM)),
            Ok(MemoryPlan::Device(DeviceRegistration::PeerMem))
        );
    }

    #[test]
    fn receiver_choices() {
        assert_eq!(
            choose_recv_memory(MemKind::Device, Ok(DMA_BUF)),
            Ok(MemoryPlan::Device(DeviceRegistration::DmaBuf))
        );
        assert!(choose_recv_memory(MemKind::Device, Ok(NOTHING)).is_err());
        assert!(choose_recv_memory(MemKind::Staged, Ok(DMA_BUF)).is_err());
        assert!(matches!(
            choose_recv_memory(MemKind::Auto, no_gpu()),
            Ok(MemoryPlan::Host { note: Some(_) })
        ));
        assert!(matches!(
            choose_recv_memory(MemKind::Auto, Ok(NOTHING)),
            Ok(MemoryPlan::Host { note: Some(_) })
        ));
    }
}
