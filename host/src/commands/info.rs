//! `host info`: RDMA devices and ports with what each can register (the dma-buf probe,
//! the peermem module) and where it sits on the PCIe tree; GPUs with their RDMA
//! capabilities, BAR1, and their distance to each RDMA device; the rails (every RDMA
//! port) ranked for each GPU; the code path of the CPU's CRC32C.

use anyhow::Result;
use host::cli::InfoArgs;
use host::rails::words;
use host::rdma::{self, NicProbe, PortSummary};
use host::units::format_bytes;
use serde_json::json;
use std::process::ExitCode;

/// "port 1: active, 4X EDR, 100 Gb/s, link layer InfiniBand, MTU 4096 (max 4096),
/// largest message 1 GiB": the port's state, its link rate (where it has one), layer and
/// sizes.
pub(super) fn port_words(p: &PortSummary) -> String {
    let rate = match (&p.link, &p.sysfs_rate) {
        (_, Some(sysfs)) => format!("{sysfs}, "),
        (Some(link), None) => format!("{}, ", link.describe()),
        (None, None) => String::new(),
    };
    format!(
        "port {}: {} (physical {}), {rate}link layer {}, MTU {} (max {}), largest message {}",
        p.port,
        p.state,
        p.phys_state,
        p.link_layer,
        p.active_mtu,
        p.max_mtu,
        format_bytes(p.max_msg_sz as u64)
    )
}

pub fn run(args: &InfoArgs) -> Result<ExitCode> {
    // A listing, like ibv_devinfo and nvidia-smi together: "none" is an answer, not a
    // failure, so the exit code is 0 whenever the listing could be printed.
    let probes = rdma::probe_nics();
    if args.json {
        let devices = rdma::devices();
        let presence = rdma::presence::RdmaPresence::here();
        println!(
            "{}",
            json!({
                "rdma_devices": devices.as_ref().ok(),
                "rdma_devices_error": devices.as_ref().err().map(|e| e.to_string()),
                "no_rdma_device_advice": devices.is_err().then(|| presence.advice()),
                "nic_probes": probes.as_ref().ok(),
                "peermem": rdma::loaded_peermem_module(),
                "memlock": rdma::memlock::MemlockFacts::here(),
                "gpus": gpus_json(probes.as_deref().unwrap_or_default()),
                "rails": rails_json(),
                "cpu_crc32c": host::integrity::cpu_path(),
            })
        );
        return Ok(ExitCode::SUCCESS);
    }
    let peermem = rdma::describe_peermem(rdma::loaded_peermem_module());
    match rdma::devices() {
        Ok(devices) => {
            println!("RDMA devices:");
            for d in devices {
                println!(
                    "  {}: node GUID {}, firmware {}, up to {} work requests per queue, {} CQ entries",
                    d.name,
                    d.node_guid,
                    if d.firmware.is_empty() { "-" } else { &d.firmware },
                    d.max_qp_wr,
                    d.max_cqe
                );
                match probes.as_ref().map(|p| p.iter().find(|p| p.name == d.name)) {
                    Ok(Some(p)) => {
                        println!("    {}", p.dma_buf.describe());
                        println!("    {peermem}");
                        println!("    PCI: {}", p.location.describe());
                    }
                    Ok(None) => println!("    dma-buf registration: unknown (not probed)"),
                    Err(e) => println!("    dma-buf registration: unknown (could not probe: {e})"),
                }
                for p in d.ports {
                    println!("    {}", port_words(&p));
                    if let Some(advice) = rdma::port_advice(&p.state, p.phys_state, p.link_layer) {
                        println!("      {advice}");
                    }
                    for g in p.gids {
                        let mut extra: Vec<String> = Vec::new();
                        extra.extend(g.gid_type);
                        extra.extend(g.netdev);
                        let extra = if extra.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", extra.join(", "))
                        };
                        println!("      GID[{}] {}{extra}", g.index, g.gid);
                    }
                }
            }
        }
        Err(rdma::RdmaError::NoDevice) => {
            println!("RDMA devices: none found");
            for line in rdma::presence::RdmaPresence::here().advice() {
                println!("  {line}");
            }
        }
        Err(e) => println!("RDMA devices: none ({e})"),
    }
    print_gpus(probes.as_deref().unwrap_or_default());
    print_rails();
    // What checks host memory (TCP frames, files, the NCCL plugin's pieces) costs here.
    println!(
        "CPU checksums: CRC32C by {} (`host bench crc32c` measures it)",
        host::integrity::cpu_path()
    );
    Ok(ExitCode::SUCCESS)
}

/// Every rail (RDMA port) from sysfs: for each GPU in the order it takes them, or,
/// without a GPU, in the machine's order.
fn print_rails() {
    let rails = match host::rails::sysfs::here() {
        Ok(rails) if rails.is_empty() => {
            println!("Rails: none (sysfs lists no RDMA device port)");
            return;
        }
        Ok(rails) => rails,
        Err(e) => {
            println!("Rails: unknown ({e})");
            return;
        }
    };
    match super::facts::gpus() {
        Ok(gpus) if !gpus.is_empty() => {
            println!("Rails (every RDMA port), for each GPU:");
            let orders = super::rails::gpu_orders(&gpus, &rails);
            for (g, order) in gpus.iter().zip(&orders) {
                println!(
                    "  GPU {} (PCI {}): {}",
                    g.ordinal,
                    g.bus_id,
                    words::ORDER_HEADING
                );
                for line in words::ranked_lines(order) {
                    println!("    {line}");
                }
            }
        }
        found => {
            let why = found.err().unwrap_or_else(|| "there is none".into());
            println!("Rails (every RDMA port; no GPU to rank them for: {why}):");
            for r in &rails {
                println!("  {}", words::rail_line(r));
            }
        }
    }
}

/// The rails for `--json`: every one as read, and each GPU's order.
fn rails_json() -> serde_json::Value {
    let rails = match host::rails::sysfs::here() {
        Ok(rails) => rails,
        Err(e) => return json!({ "error": e }),
    };
    let per_gpu = match super::facts::gpus() {
        Ok(gpus) => {
            let orders = super::rails::gpu_orders(&gpus, &rails);
            json!(gpus
                .iter()
                .zip(orders)
                .map(|(g, order)| json!({
                    "ordinal": g.ordinal,
                    "pci_bus_id": g.bus_id,
                    "chosen": host::rails::chosen(&order).map(|r| r.to_string()),
                    "order": order,
                }))
                .collect::<Vec<_>>())
        }
        Err(why) => json!({ "none": why }),
    };
    json!({ "all": rails, "per_gpu": per_gpu })
}

/// The GPUs for `--json`: each one's report and its distance to every NIC.
#[cfg(feature = "cuda")]
fn gpus_json(nics: &[NicProbe]) -> serde_json::Value {
    use super::facts;
    match host::gpu::capabilities::report_all() {
        Ok(gpus) => json!(gpus
            .into_iter()
            .map(|g| {
                let function = facts::gpu_function(&g.pci_bus_id);
                let distances: serde_json::Map<String, serde_json::Value> = nics
                    .iter()
                    .map(|n| {
                        let d = facts::distance(&function, n);
                        (
                            n.name.clone(),
                            match d {
                                Ok(d) => json!(d.to_string()),
                                Err(e) => json!({ "unknown": e }),
                            },
                        )
                    })
                    .collect();
                json!({
                    "report": g,
                    "pci_path": function.as_ref().ok().map(|f| f.path.display().to_string()),
                    "bar1_bytes": function.as_ref().ok().and_then(|f| host::topology::bar1_bytes(f).ok()),
                    "distance_to_nics": distances,
                })
            })
            .collect::<Vec<_>>()),
        Err(e) => json!({ "none": format!("{e:#}") }),
    }
}

#[cfg(not(feature = "cuda"))]
fn gpus_json(_nics: &[NicProbe]) -> serde_json::Value {
    json!({ "none": super::facts::NO_CUDA })
}

/// Where the GPU at `bus_id` is, its BAR1, and its distance to every NIC.
#[cfg(feature = "cuda")]
fn print_placement(bus_id: &str, nics: &[NicProbe]) {
    use super::facts;
    use host::topology::PciDistance;
    // `--gpudirect-level`'s default, against which each GPU-NIC pair is rated.
    const DEFAULT_LEVEL: PciDistance = PciDistance::Pxb;
    let function = facts::gpu_function(bus_id);
    match &function {
        Ok(f) => {
            println!("    PCI path: {}", f.path.display());
            match host::topology::bar1_bytes(f) {
                Ok(bytes) => println!(
                    "    BAR1: {} (the window through which a NIC reaches GPU memory)",
                    format_bytes(bytes)
                ),
                Err(e) => println!("    BAR1: unknown ({e})"),
            }
        }
        Err(e) => println!("    PCI path: unknown ({e})"),
    }
    if nics.is_empty() {
        println!("    no RDMA device: GPU-NIC distance not applicable");
    }
    for nic in nics {
        match facts::distance(&function, nic) {
            Ok(d) => println!(
                "    to {}: {d} ({}), {} the default --gpudirect-level {DEFAULT_LEVEL}",
                nic.name,
                d.describe(),
                if d <= DEFAULT_LEVEL {
                    "within"
                } else {
                    "beyond"
                }
            ),
            Err(e) => println!("    to {}: distance not applicable ({e})", nic.name),
        }
    }
}

#[cfg(feature = "cuda")]
fn print_gpus(nics: &[NicProbe]) {
    use host::gpu::capabilities::{peermem_loaded, report_all};
    use host::memory_path::gpudirect_missing;
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    match report_all() {
        Ok(gpus) if gpus.is_empty() => println!("GPUs: none"),
        Ok(gpus) => {
            println!("GPUs:");
            for g in gpus {
                let c = &g.capabilities;
                println!(
                    "  GPU {}: {} (compute {}, {} SMs, {}, PCI {})",
                    g.ordinal,
                    g.name,
                    g.compute_capability,
                    g.multiprocessors,
                    format_bytes(g.total_memory_bytes as u64),
                    g.pci_bus_id
                );
                println!(
                    "    dma-buf export: {}; GPUDirect RDMA: {}; nvidia-peermem loaded: {}; can map host memory: {}",
                    yes_no(c.dma_buf),
                    yes_no(c.gpudirect_rdma),
                    yes_no(c.peermem_loaded),
                    yes_no(c.can_map_host_memory)
                );
                println!(
                    "    NIC writes ordering: {} ({}); flush options: {:#x}",
                    g.rdma_writes_ordering,
                    match g.rdma_writes_ordering {
                        0 => "none: flush before the GPU reads",
                        100 => "owner: this GPU sees them in order",
                        200 => "all devices",
                        _ => "unknown",
                    },
                    g.rdma_flush_writes_options
                );
                let registration = if c.dma_buf {
                    "GPU memory via dma-buf (ibv_reg_dmabuf_mr)".to_string()
                } else if c.peermem_loaded {
                    "GPU memory via nvidia-peermem (ibv_reg_mr)".to_string()
                } else {
                    format!("host memory only ({})", gpudirect_missing(c))
                };
                println!(
                    "    memory the NIC can register: {registration}; mapped and staged always"
                );
                print_placement(&g.pci_bus_id, nics);
            }
            if !peermem_loaded() {
                println!("  (nvidia-peermem is not loaded; dma-buf needs no module)");
            }
        }
        Err(e) => println!("GPUs: none usable ({e:#})"),
    }
}

#[cfg(not(feature = "cuda"))]
fn print_gpus(_nics: &[NicProbe]) {
    println!(
        "GPUs: not checked (this build has no CUDA support: built without the `cuda` feature)"
    );
    println!("GPU-NIC distance: not checked (no GPU support in this build)");
}
