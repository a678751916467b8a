//! The fallback chain: what to try, in what order, and what is left out and why.
//!
//! Facts in (the GPU's capabilities, the NIC's probe answers, the distance between them,
//! the user's `--gpudirect-level`, BAR1), a [`Plan`] out. The plan is only what *may*
//! work; the NIC can still refuse a registration at run time, which is why it is a list
//! that [`super::walk::walk`] goes through, not one answer.

use super::{mem_name, DeviceRegistration, GpuCapabilities, MemKind, Refusal};
use crate::rdma::{errno_in_words, DmaBufProbe, PeerMemModule};
use crate::topology::PciDistance;
use crate::units::format_bytes;
use serde::Serialize;

/// One way of putting the data where the NIC can reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// GPU memory exported as a dma-buf and registered with `ibv_reg_dmabuf_mr`.
    DmaBuf,
    /// GPU memory registered with `ibv_reg_mr` through the peermem kernel module.
    #[serde(rename = "peermem")]
    PeerMem,
    /// GPU memory copied chunk by chunk into registered host memory.
    Staged,
    /// Page-locked host memory the GPU writes over PCIe.
    Mapped,
    /// Host memory (the CPU writes or checks the pattern).
    Host,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::DmaBuf => "dma-buf",
            Method::PeerMem => "peermem",
            Method::Staged => "staged",
            Method::Mapped => "mapped",
            Method::Host => "host",
        }
    }

    /// What the method is, in words.
    pub fn describe(self) -> &'static str {
        match self {
            Method::DmaBuf => "GPUDirect RDMA, GPU memory registered as a dma-buf",
            Method::PeerMem => "GPUDirect RDMA, GPU memory registered through peermem",
            Method::Staged => "GPU memory staged through registered host memory",
            Method::Mapped => "GPU-mapped host memory",
            Method::Host => "host memory",
        }
    }

    /// Does the NIC touch GPU memory?
    pub fn is_gpudirect(self) -> bool {
        matches!(self, Method::DmaBuf | Method::PeerMem)
    }

    /// The old API's name for a GPUDirect method.
    pub fn device_registration(self) -> Option<DeviceRegistration> {
        match self {
            Method::DmaBuf => Some(DeviceRegistration::DmaBuf),
            Method::PeerMem => Some(DeviceRegistration::PeerMem),
            _ => None,
        }
    }
}

/// Which end of a transfer: mapped and staged are ways of sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Direction {
    Send,
    Recv,
}

/// What the NIC said when asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NicFacts {
    pub name: String,
    pub dma_buf: DmaBufProbe,
    pub peermem: Option<PeerMemModule>,
}

/// BAR1 against what a connection would register: the NIC reaches GPU memory through
/// BAR1, so a registration larger than the aperture cannot be mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Bar1Fit {
    pub bar1_bytes: u64,
    pub register_bytes: u64,
}

/// Every fact the choice depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathFacts {
    /// The GPU's capabilities, or why there is no GPU (`--gpu none`, no driver, a build
    /// without CUDA).
    pub gpu: Result<GpuCapabilities, String>,
    pub nic: NicFacts,
    /// The GPU-NIC distance, or why it is unknown (then it does not rule anything out).
    pub distance: Result<PciDistance, String>,
    /// `--gpudirect-level`: the farthest distance at which GPUDirect is tried.
    pub gpudirect_level: PciDistance,
    /// None where BAR1 or the size is unknown.
    pub bar1: Option<Bar1Fit>,
}

/// A method the plan does not try, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeftOut {
    pub method: Method,
    pub why: String,
}

/// The methods to try, in order, and those left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub attempts: Vec<Method>,
    pub left_out: Vec<LeftOut>,
}

/// Why GPUDirect `method` cannot work with these facts (empty: it may).
pub fn gpudirect_blockers(
    method: Method,
    caps: &GpuCapabilities,
    facts: &PathFacts,
) -> Vec<String> {
    let mut why = Vec::new();
    match method {
        Method::DmaBuf => {
            if !caps.dma_buf {
                why.push(
                    "the GPU driver cannot export GPU memory as dma-buf (that needs NVIDIA's open kernel module, driver r515+, Linux 5.12+)"
                        .to_string(),
                );
            }
            if let DmaBufProbe::NotSupported { errno } = facts.nic.dma_buf {
                why.push(format!(
                    "{} cannot register dma-buf (ibv_reg_dmabuf_mr: {})",
                    facts.nic.name,
                    errno_in_words(errno)
                ));
            }
        }
        Method::PeerMem => {
            if facts.nic.peermem.is_none() {
                why.push("neither nvidia_peermem nor nv_peer_mem is loaded".to_string());
            }
        }
        _ => unreachable!("only GPUDirect methods have blockers"),
    }
    if !caps.gpudirect_rdma {
        why.push("the GPU does not support GPUDirect RDMA".to_string());
    }
    if let Ok(d) = facts.distance {
        if d > facts.gpudirect_level {
            why.push(format!(
                "GPU and NIC are {d}, beyond --gpudirect-level {}",
                facts.gpudirect_level
            ));
        }
    }
    if let Some(fit) = facts.bar1 {
        if fit.register_bytes > fit.bar1_bytes {
            why.push(format!(
                "the GPU's BAR1 ({}) is smaller than the {} to register",
                format_bytes(fit.bar1_bytes),
                format_bytes(fit.register_bytes)
            ));
        }
    }
    why
}

/// The plan for `direction` with `--mem mem`.
pub fn plan(direction: Direction, mem: MemKind, facts: &PathFacts) -> Result<Plan, Refusal> {
    let only = |m: Method| {
        Ok(Plan {
            attempts: vec![m],
            left_out: Vec::new(),
        })
    };
    if mem == MemKind::Host {
        return only(Method::Host);
    }
    if direction == Direction::Recv && matches!(mem, MemKind::Mapped | MemKind::Staged) {
        return Err(Refusal(format!(
            "--mem {} is for senders; a receiver takes host, device or auto",
            mem_name(mem)
        )));
    }
    let caps = match &facts.gpu {
        Ok(caps) => caps,
        Err(why) if mem == MemKind::Auto => {
            let gpu_methods: &[Method] = match direction {
                Direction::Send => &[
                    Method::DmaBuf,
                    Method::PeerMem,
                    Method::Staged,
                    Method::Mapped,
                ],
                Direction::Recv => &[Method::DmaBuf, Method::PeerMem],
            };
            return Ok(Plan {
                attempts: vec![Method::Host],
                left_out: gpu_methods
                    .iter()
                    .map(|&method| LeftOut {
                        method,
                        why: why.clone(),
                    })
                    .collect(),
            });
        }
        Err(why) => {
            return Err(Refusal(format!(
                "--mem {} needs a GPU: {why}",
                mem_name(mem)
            )))
        }
    };
    let mut attempts = Vec::new();
    let mut left_out = Vec::new();
    for method in [Method::DmaBuf, Method::PeerMem] {
        let why = gpudirect_blockers(method, caps, facts);
        if why.is_empty() {
            attempts.push(method);
        } else {
            left_out.push(LeftOut {
                method,
                why: why.join(", and "),
            });
        }
    }
    match (mem, direction) {
        (MemKind::Device, _) if attempts.is_empty() => Err(Refusal(format!(
            "--mem device: GPUDirect RDMA cannot work here: {}; use {}",
            left_out
                .iter()
                .map(|l| format!("{}: {}", l.method.name(), l.why))
                .collect::<Vec<_>>()
                .join("; "),
            match direction {
                Direction::Send => "--mem staged or --mem mapped",
                Direction::Recv => "--mem host",
            }
        ))),
        (MemKind::Device, _) => Ok(Plan { attempts, left_out }),
        (MemKind::Staged, _) => only(Method::Staged),
        (MemKind::Mapped, _) if !caps.can_map_host_memory => Err(Refusal(
            "--mem mapped: this GPU cannot map host memory".into(),
        )),
        (MemKind::Mapped, _) => only(Method::Mapped),
        (MemKind::Auto, Direction::Send) => {
            attempts.push(Method::Staged);
            if caps.can_map_host_memory {
                attempts.push(Method::Mapped);
            } else {
                left_out.push(LeftOut {
                    method: Method::Mapped,
                    why: "the GPU cannot map host memory".into(),
                });
            }
            Ok(Plan { attempts, left_out })
        }
        (MemKind::Auto, Direction::Recv) => {
            attempts.push(Method::Host);
            Ok(Plan { attempts, left_out })
        }
        (MemKind::Host, _) => unreachable!("handled above"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EOPNOTSUPP: DmaBufProbe = DmaBufProbe::NotSupported {
        errno: libc::EOPNOTSUPP,
    };

    fn caps(dma_buf: bool, gpudirect_rdma: bool) -> GpuCapabilities {
        GpuCapabilities {
            dma_buf,
            gpudirect_rdma,
            peermem_loaded: false,
            can_map_host_memory: true,
        }
    }

    fn facts(
        gpu: GpuCapabilities,
        dma_buf: DmaBufProbe,
        peermem: bool,
        distance: PciDistance,
        bar1_fits: bool,
    ) -> PathFacts {
        PathFacts {
            gpu: Ok(gpu),
            nic: NicFacts {
                name: "mlx5_0".into(),
                dma_buf,
                peermem: peermem.then_some(PeerMemModule::NvidiaPeermem),
            },
            distance: Ok(distance),
            gpudirect_level: PciDistance::Pxb,
            bar1: Some(Bar1Fit {
                bar1_bytes: 256 << 20,
                register_bytes: if bar1_fits { 64 << 20 } else { 1 << 30 },
            }),
        }
    }

    fn methods(plan: &Plan) -> Vec<Method> {
        plan.attempts.clone()
    }

    /// Every combination of the facts, against an independent statement of the rules.
    #[test]
    fn every_combination_of_the_facts() {
        let probes = [
            DmaBufProbe::Supported {
                errno: Some(libc::EBADF),
            },
            EOPNOTSUPP,
            DmaBufProbe::Unknown {
                why: "ibv_open_device(mlx5_0): Permission denied (errno 13)".into(),
            },
        ];
        let mut checked = 0;
        for probe in &probes {
            for peermem in [true, false] {
                for gpu_dma_buf in [true, false] {
                    for attribute in [true, false] {
                        for distance in [PciDistance::Pix, PciDistance::Sys] {
                            for bar1_fits in [true, false] {
                                let f = facts(
                                    caps(gpu_dma_buf, attribute),
                                    probe.clone(),
                                    peermem,
                                    distance,
                                    bar1_fits,
                                );
                                let near = distance <= PciDistance::Pxb && bar1_fits && attribute;
                                let dma_buf = near && gpu_dma_buf && !probe.is_not_supported();
                                let peer = near && peermem;
                                let mut gpudirect = Vec::new();
                                if dma_buf {
                                    gpudirect.push(Method::DmaBuf);
                                }
                                if peer {
                                    gpudirect.push(Method::PeerMem);
                                }
                                let ctx = format!(
                                    "probe {probe:?}, peermem {peermem}, GPU dma-buf {gpu_dma_buf}, attribute {attribute}, {distance}, BAR1 fits {bar1_fits}"
                                );

                                let send = plan(Direction::Send, MemKind::Auto, &f).unwrap();
                                let mut want = gpudirect.clone();
                                want.extend([Method::Staged, Method::Mapped]);
                                assert_eq!(methods(&send), want, "send auto: {ctx}");
                                // Each GPUDirect method is either tried or left out.
                                assert_eq!(
                                    send.left_out.len() + gpudirect.len(),
                                    2,
                                    "send auto: {ctx}"
                                );

                                let recv = plan(Direction::Recv, MemKind::Auto, &f).unwrap();
                                let mut want = gpudirect.clone();
                                want.push(Method::Host);
                                assert_eq!(methods(&recv), want, "recv auto: {ctx}");

                                for direction in [Direction::Send, Direction::Recv] {
                                    let device = plan(direction, MemKind::Device, &f);
                                    if gpudirect.is_empty() {
                                        let e = device.unwrap_err().to_string();
                                        assert!(e.contains("dma-buf: "), "{e}: {ctx}");
                                        assert!(e.contains("peermem: "), "{e}: {ctx}");
                                    } else {
                                        assert_eq!(
                                            methods(&device.unwrap()),
                                            gpudirect,
                                            "device: {ctx}"
                                        );
                                    }
                                    assert_eq!(
                                        methods(&plan(direction, MemKind::Host, &f).unwrap()),
                                        [Method::Host]
                                    );
                                }
                                assert_eq!(
                                    methods(&plan(Direction::Send, MemKind::Staged, &f).unwrap()),
                                    [Method::Staged]
                                );
                                assert_eq!(
                                    methods(&plan(Direction::Send, MemKind::Mapped, &f).unwrap()),
                                    [Method::Mapped]
                                );
                                for mem in [MemKind::Staged, MemKind::Mapped] {
                                    assert!(plan(Direction::Recv, mem, &f).is_err());
                                }
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 3 * 2 * 2 * 2 * 2 * 2);
    }

    #[test]
    fn left_out_methods_say_why() {
        let f = facts(caps(true, true), EOPNOTSUPP, false, PciDistance::Sys, false);
        let p = plan(Direction::Send, MemKind::Auto, &f).unwrap();
        assert_eq!(p.attempts, [Method::Staged, Method::Mapped]);
        assert_eq!(
            p.left_out,
            [
                LeftOut {
                    method: Method::DmaBuf,
                    why: "mlx5_0 cannot register dma-buf (ibv_reg_dmabuf_mr: Operation not supported, EOPNOTSUPP), and GPU and NIC are SYS, beyond --gpudirect-level PXB, and the GPU's BAR1 (256 MiB) is smaller than the 1 GiB to register".into()
                },
                LeftOut {
                    method: Method::PeerMem,
                    why: "neither nvidia_peermem nor nv_peer_mem is loaded, and GPU and NIC are SYS, beyond --gpudirect-level PXB, and the GPU's BAR1 (256 MiB) is smaller than the 1 GiB to register".into()
                },
            ]
        );
    }

    #[test]
    fn the_level_is_the_farthest_distance_allowed() {
        let mut f = facts(caps(true, true), EOPNOTSUPP, true, PciDistance::Sys, true);
        assert_eq!(
            plan(Direction::Send, MemKind::Device, &f).unwrap_err().to_string(),
            "--mem device: GPUDirect RDMA cannot work here: dma-buf: mlx5_0 cannot register dma-buf (ibv_reg_dmabuf_mr: Operation not supported, EOPNOTSUPP), and GPU and NIC are SYS, beyond --gpudirect-level PXB; peermem: GPU and NIC are SYS, beyond --gpudirect-level PXB; use --mem staged or --mem mapped"
        );
        f.gpudirect_level = PciDistance::Sys;
        assert_eq!(
            plan(Direction::Send, MemKind::Device, &f).unwrap().attempts,
            [Method::PeerMem]
        );
        // An unknown distance or BAR1 rules nothing out: the run-time attempt decides.
        f.gpudirect_level = PciDistance::Pix;
        f.distance = Err("rxe0 is a software device".into());
        f.bar1 = None;
        assert_eq!(
            plan(Direction::Recv, MemKind::Device, &f).unwrap().attempts,
            [Method::PeerMem]
        );
    }

    #[test]
    fn without_a_gpu() {
        let mut f = facts(caps(true, true), EOPNOTSUPP, true, PciDistance::Pix, true);
        f.gpu = Err("--gpu none was given".into());
        let p = plan(Direction::Send, MemKind::Auto, &f).unwrap();
        assert_eq!(p.attempts, [Method::Host]);
        assert_eq!(p.left_out.len(), 4);
        assert!(p.left_out.iter().all(|l| l.why == "--gpu none was given"));
        let p = plan(Direction::Recv, MemKind::Auto, &f).unwrap();
        assert_eq!(p.attempts, [Method::Host]);
        assert_eq!(p.left_out.len(), 2);
        for mem in [MemKind::Device, MemKind::Staged, MemKind::Mapped] {
            assert_eq!(
                plan(Direction::Send, mem, &f).unwrap_err().to_string(),
                format!("--mem {} needs a GPU: --gpu none was given", mem_name(mem))
            );
        }
        assert_eq!(
            plan(Direction::Recv, MemKind::Device, &f)
                .unwrap_err()
                .to_string(),
            "--mem device needs a GPU: --gpu none was given"
        );
    }

    #[test]
    fn a_gpu_that_cannot_map_host_memory() {
        let mut gpu = caps(false, false);
        gpu.can_map_host_memory = false;
        let f = facts(gpu, EOPNOTSUPP, false, PciDistance::Pix, true);
        let p = plan(Direction::Send, MemKind::Auto, &f).unwrap();
        assert_eq!(p.attempts, [Method::Staged]);
        assert_eq!(
            p.left_out.last(),
            Some(&LeftOut {
                method: Method::Mapped,
                why: "the GPU cannot map host memory".into()
            })
        );
        assert_eq!(
            plan(Direction::Send, MemKind::Mapped, &f)
                .unwrap_err()
                .to_string(),
            "--mem mapped: this GPU cannot map host memory"
        );
        assert_eq!(
            plan(Direction::Recv, MemKind::Device, &f).unwrap_err().to_string(),
            "--mem device: GPUDirect RDMA cannot work here: dma-buf: the GPU driver cannot export GPU memory as dma-buf (that needs NVIDIA's open kernel module, driver r515+, Linux 5.12+), and mlx5_0 cannot register dma-buf (ibv_reg_dmabuf_mr: Operation not supported, EOPNOTSUPP), and the GPU does not support GPUDirect RDMA; peermem: neither nvidia_peermem nor nv_peer_mem is loaded, and the GPU does not support GPUDirect RDMA; use --mem host"
        );
    }

    #[test]
    fn the_plan_as_json() {
        let f = facts(caps(true, true), EOPNOTSUPP, true, PciDistance::Pix, true);
        let p = plan(Direction::Send, MemKind::Auto, &f).unwrap();
        assert_eq!(
            serde_json::to_value(&p).unwrap(),
            serde_json::json!({
                "attempts": ["peermem", "staged", "mapped"],
                "left_out": [{
                    "method": "dma-buf",
                    "why": "mlx5_0 cannot register dma-buf (ibv_reg_dmabuf_mr: Operation not supported, EOPNOTSUPP)"
                }]
            })
        );
    }
}
