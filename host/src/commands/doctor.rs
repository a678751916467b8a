//! `host doctor`: will GPUDirect RDMA work for this GPU and this NIC, and if not, the one
//! thing to change; and which path `--mem auto` will take.
//!
//! The facts come from the same probes as `host info`; the verdict is the decision
//! function's own plan ([`plan`]), so what doctor says is what a transfer will do. The
//! advice and the choice of NIC are pure functions, tested below.

use super::facts::{self, choose_nic, GpuFacts};
use anyhow::{bail, Result};
use host::cli::DoctorArgs;
use host::memory::select::{plan, Direction, GpuCapabilities, Method, NicFacts, PathFacts, Plan};
use host::rdma::{self, DmaBufProbe, NicLocation};
use host::topology::{self, PciDistance};
use host::transfer::units::format_bytes;
use std::process::ExitCode;

pub fn run(args: &DoctorArgs) -> Result<ExitCode> {
    let gpu: Result<GpuFacts, String> = facts::gpus().and_then(|gpus| {
        let count = gpus.len();
        gpus.into_iter()
            .find(|g| g.ordinal == args.gpu)
            .ok_or_else(|| format!("no GPU {} (this machine has {count})", args.gpu))
    });
    let function = match &gpu {
        Ok(g) => g.function.clone(),
        Err(e) => Err(e.clone()),
    };
    print_gpu(args.gpu, &gpu);
    let nics = match rdma::probe_nics() {
        Ok(nics) => nics,
        Err(e) => {
            println!("NIC: none ({e})");
            println!("GPUDirect RDMA: will not work: there is no RDMA NIC on this machine");
            println!("to change: add an RDMA NIC (InfiniBand or RoCE), ideally on the GPU's PCIe switch; without hardware, Soft-RoCE (README section 'Soft-RoCE')");
            println!("verdict: nothing can carry a transfer without an RDMA device");
            return Ok(ExitCode::FAILURE);
        }
    };
    let distances: Vec<(&str, Result<PciDistance, String>)> = nics
        .iter()
        .map(|n| (n.name.as_str(), facts::distance(&function, n)))
        .collect();
    let index = match choose_nic(&distances, args.nic.as_deref()) {
        Ok(i) => i,
        Err(e) => bail!(e),
    };
    let nic = &nics[index];
    let distance = distances[index].1.clone();
    let peermem = rdma::loaded_peermem_module();

    let chosen = if args.nic.is_some() {
        "as asked".to_string()
    } else {
        format!("the nearest of {}", nics.len())
    };
    println!("NIC {} ({chosen}): {}", nic.name, nic.location.describe());
    println!("  {}", nic.dma_buf.describe());
    println!("  {}", rdma::describe_peermem(peermem));
    match &distance {
        Ok(d) => println!(
            "  distance to the GPU: {d} ({}), {} --gpudirect-level {}",
            d.describe(),
            if *d <= args.gpudirect_level {
                "within"
            } else {
                "beyond"
            },
            args.gpudirect_level
        ),
        Err(e) => println!("  distance to the GPU: unknown ({e})"),
    }
    if let Some(group) = function.as_ref().ok().and_then(topology::iommu_group) {
        if group.translated() {
            println!(
                "  IOMMU: the GPU's group {} translates DMA (type {}): the NIC's peer-to-peer reads go through the IOMMU; if GPUDirect registers but transfers fail or crawl, boot with iommu=pt",
                group.group,
                group.kind.as_deref().unwrap_or("?")
            );
        }
    }

    let path_facts = PathFacts {
        gpu: gpu.as_ref().map(|g| g.caps).map_err(Clone::clone),
        nic: NicFacts {
            name: nic.name.clone(),
            dma_buf: nic.dma_buf.clone(),
            peermem,
        },
        distance,
        gpudirect_level: args.gpudirect_level,
        // A transfer's size is not known here; the sender and receiver check BAR1
        // against what they register.
        bar1: None,
    };
    let software = matches!(nic.location, NicLocation::Software);
    let send = plan(
        Direction::Send,
        host::memory::select::MemKind::Auto,
        &path_facts,
    )?;
    let recv = plan(
        Direction::Recv,
        host::memory::select::MemKind::Auto,
        &path_facts,
    )?;
    for line in verdict(&send, &path_facts, software) {
        println!("{line}");
    }
    println!("--mem auto: {}", auto_summary(&send, &recv));
    // Staged and host memory are paths too: with an RDMA device, something always works.
    Ok(ExitCode::SUCCESS)
}

/// The GPU's identity, PCI path, capabilities and BAR1.
fn print_gpu(ordinal: u32, gpu: &Result<GpuFacts, String>) {
    match gpu {
        Ok(g) => {
            println!("GPU {}: {} (PCI {})", g.ordinal, g.name, g.bus_id);
            match &g.function {
                Ok(f) => println!("  PCI path: {}", f.path.display()),
                Err(e) => println!("  PCI path: unknown ({e})"),
            }
            println!("  {}", describe_caps(&g.caps));
            if let Ok(f) = &g.function {
                match topology::bar1_bytes(f) {
                    Ok(b) => println!("  BAR1: {}", format_bytes(b)),
                    Err(e) => println!("  BAR1: unknown ({e})"),
                }
            }
        }
        Err(e) => println!("GPU {ordinal}: none: {e}"),
    }
}

fn describe_caps(c: &GpuCapabilities) -> String {
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    format!(
        "dma-buf export: {}; GPUDirect RDMA: {}; can map host memory: {}",
        yes_no(c.dma_buf),
        yes_no(c.gpudirect_rdma),
        yes_no(c.can_map_host_memory)
    )
}

/// "GPUDirect RDMA: ..." and, when it will not work, why for each method and the one
/// thing to change.
pub fn verdict(send: &Plan, facts: &PathFacts, nic_is_software: bool) -> Vec<String> {
    let gpudirect: Vec<&str> = send
        .attempts
        .iter()
        .filter(|m| m.is_gpudirect())
        .map(|m| m.name())
        .collect();
    if !gpudirect.is_empty() {
        return vec![format!(
            "GPUDirect RDMA: should work: {} will be tried (the NIC has the last word when it registers the memory)",
            gpudirect.join(", then ")
        )];
    }
    let mut lines = vec!["GPUDirect RDMA: will not work".to_string()];
    for l in send.left_out.iter().filter(|l| l.method.is_gpudirect()) {
        lines.push(format!("  {}: {}", l.method.name(), l.why));
    }
    if let Some(change) = one_thing(facts, nic_is_software) {
        lines.push(format!("to change: {change}"));
    }
    lines
}

/// The one change that would make GPUDirect RDMA possible, most fundamental first.
pub fn one_thing(facts: &PathFacts, nic_is_software: bool) -> Option<String> {
    let caps = match &facts.gpu {
        Ok(caps) => caps,
        Err(why) => return Some(format!("GPUDirect RDMA needs a GPU: {why}")),
    };
    if nic_is_software {
        return Some(format!(
            "use a hardware RDMA NIC: {} is a software device (rxe, siw), which cannot reach GPU memory",
            facts.nic.name
        ));
    }
    if !caps.gpudirect_rdma {
        return Some(
            "use a GPU with GPUDirect RDMA support (data-center GPUs have it): this one reports none"
                .into(),
        );
    }
    if let Ok(d) = facts.distance {
        if d > facts.gpudirect_level {
            return Some(format!(
                "use a NIC on the same PCIe switch as the GPU (this pair is {d}: {}), or accept the distance with --gpudirect-level {d}",
                d.describe()
            ));
        }
    }
    if let Some(fit) = facts.bar1 {
        if fit.register_bytes > fit.bar1_bytes {
            return Some(
                "a larger BAR1 (resizable BAR in the system firmware), or smaller transfers".into(),
            );
        }
    }
    let nic_refuses_dma_buf = matches!(facts.nic.dma_buf, DmaBufProbe::NotSupported { .. });
    match (caps.dma_buf, nic_refuses_dma_buf, facts.nic.peermem.is_some()) {
        (_, _, true) => None,
        (true, false, false) => None,
        (true, true, false) => Some(format!(
            "a newer rdma-core and NIC driver, so that ibv_reg_dmabuf_mr works on {} (or load nvidia-peermem: modprobe nvidia-peermem)",
            facts.nic.name
        )),
        (false, _, false) => Some(
            "load nvidia-peermem (modprobe nvidia-peermem), or use NVIDIA's open kernel module (driver r515+, Linux 5.12+) for dma-buf"
                .into(),
        ),
    }
}

/// "the sender tries dma-buf, then staged, then mapped; the receiver ..."
pub fn auto_summary(send: &Plan, recv: &Plan) -> String {
    let chain = |p: &Plan| {
        p.attempts
            .iter()
            .map(|m| m.name())
            .collect::<Vec<_>>()
            .join(", then ")
    };
    let first = |p: &Plan| p.attempts.first().copied().unwrap_or(Method::Host);
    format!(
        "the sender takes {} ({}), the receiver {} ({}); in order: sender {}; receiver {}",
        first(send).name(),
        first(send).describe(),
        first(recv).name(),
        first(recv).describe(),
        chain(send),
        chain(recv)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use host::memory::select::MemKind;
    use host::rdma::PeerMemModule;

    fn facts(dma_buf: bool, nic: DmaBufProbe, peermem: bool, d: PciDistance) -> PathFacts {
        PathFacts {
            gpu: Ok(GpuCapabilities {
                dma_buf,
                gpudirect_rdma: true,
                peermem_loaded: peermem,
                can_map_host_memory: true,
            }),
            nic: NicFacts {
                name: "mlx5_0".into(),
                dma_buf: nic,
                peermem: peermem.then_some(PeerMemModule::NvidiaPeermem),
            },
            distance: Ok(d),
            gpudirect_level: PciDistance::Pxb,
            bar1: None,
        }
    }

    const NO: DmaBufProbe = DmaBufProbe::NotSupported {
        errno: libc::EOPNOTSUPP,
    };
    const YES: DmaBufProbe = DmaBufProbe::Supported {
        errno: Some(libc::EBADF),
    };

    fn say(f: &PathFacts, software: bool) -> Vec<String> {
        let send = plan(Direction::Send, MemKind::Auto, f).unwrap();
        verdict(&send, f, software)
    }

    #[test]
    fn the_nearest_nic_unless_one_is_named() {
        let nics = [
            ("rxe0", Err("rxe0 is a software device".to_string())),
            ("mlx5_0", Ok(PciDistance::Sys)),
            ("mlx5_1", Ok(PciDistance::Pix)),
            ("mlx5_2", Ok(PciDistance::Pix)),
        ];
        assert_eq!(choose_nic(&nics, None), Ok(2));
        assert_eq!(choose_nic(&nics, Some("rxe0")), Ok(0));
        assert_eq!(
            choose_nic(&nics, Some("mlx5_9")),
            Err("no RDMA device mlx5_9 (there are: rxe0, mlx5_0, mlx5_1, mlx5_2)".to_string())
        );
        assert_eq!(choose_nic(&nics[..1], None), Ok(0));
        assert!(choose_nic(&[], None).is_err());
    }

    #[test]
    fn gpudirect_possible() {
        assert_eq!(
            say(&facts(true, YES, false, PciDistance::Pix), false),
            ["GPUDirect RDMA: should work: dma-buf will be tried (the NIC has the last word when it registers the memory)"]
        );
        assert_eq!(
            one_thing(&facts(true, YES, false, PciDistance::Pix), false),
            None
        );
        assert_eq!(
            one_thing(&facts(false, NO, true, PciDistance::Pxb), false),
            None
        );
    }

    #[test]
    fn the_one_thing_to_change() {
        let lines = say(&facts(true, NO, false, PciDistance::Pix), false);
        assert_eq!(lines[0], "GPUDirect RDMA: will not work");
        assert_eq!(
            lines[1],
            "  dma-buf: mlx5_0 cannot register dma-buf (ibv_reg_dmabuf_mr: Operation not supported, EOPNOTSUPP)"
        );
        assert_eq!(
            lines[2],
            "  peermem: neither nvidia_peermem nor nv_peer_mem is loaded"
        );
        assert_eq!(
            lines[3],
            "to change: a newer rdma-core and NIC driver, so that ibv_reg_dmabuf_mr works on mlx5_0 (or load nvidia-peermem: modprobe nvidia-peermem)"
        );
        let change = |f: &PathFacts, sw| one_thing(f, sw).unwrap();
        assert!(
            change(&facts(false, YES, false, PciDistance::Pix), false).starts_with(
                "load nvidia-peermem (modprobe nvidia-peermem), or use NVIDIA's open kernel module"
            )
        );
        assert_eq!(
            change(&facts(true, YES, true, PciDistance::Sys), false),
            "use a NIC on the same PCIe switch as the GPU (this pair is SYS: across NUMA nodes (the CPU sockets' interconnect)), or accept the distance with --gpudirect-level SYS"
        );
        assert!(change(&facts(true, NO, false, PciDistance::Pix), true)
            .starts_with("use a hardware RDMA NIC: mlx5_0 is a software device"));
        let mut no_attr = facts(true, YES, true, PciDistance::Pix);
        no_attr.gpu = Ok(GpuCapabilities {
            gpudirect_rdma: false,
            ..no_attr.gpu.unwrap()
        });
        assert!(change(&no_attr, false).starts_with("use a GPU with GPUDirect RDMA support"));
        let mut small = facts(true, YES, true, PciDistance::Pix);
        small.bar1 = Some(host::memory::select::Bar1Fit {
            bar1_bytes: 256 << 20,
            register_bytes: 1 << 30,
        });
        assert!(change(&small, false).starts_with("a larger BAR1"));
        let mut none = facts(true, YES, true, PciDistance::Pix);
        none.gpu = Err("this build has no GPU support".into());
        assert_eq!(
            change(&none, false),
            "GPUDirect RDMA needs a GPU: this build has no GPU support"
        );
    }

    #[test]
    fn what_auto_takes() {
        let f = facts(true, NO, true, PciDistance::Pix);
        let send = plan(Direction::Send, MemKind::Auto, &f).unwrap();
        let recv = plan(Direction::Recv, MemKind::Auto, &f).unwrap();
        assert_eq!(
            auto_summary(&send, &recv),
            "the sender takes peermem (GPUDirect RDMA, GPU memory registered through peermem), the receiver peermem (GPUDirect RDMA, GPU memory registered through peermem); in order: sender peermem, then staged, then mapped; receiver peermem, then host"
        );
        let mut f = f;
        f.gpu = Err("no GPU".into());
        let send = plan(Direction::Send, MemKind::Auto, &f).unwrap();
        let recv = plan(Direction::Recv, MemKind::Auto, &f).unwrap();
        assert_eq!(
            auto_summary(&send, &recv),
            "the sender takes host (host memory), the receiver host (host memory); in order: sender host; receiver host"
        );
    }
}
