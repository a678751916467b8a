//! `host info`: RDMA devices and ports, and GPUs with their RDMA capabilities.

use anyhow::Result;
use host::rdma;
use host::transfer::units::format_bytes;
use std::process::ExitCode;

pub fn run() -> Result<ExitCode> {
    // A listing, like ibv_devinfo and nvidia-smi together: "none" is an answer, not a
    // failure, so the exit code is 0 whenever the listing could be printed.
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
                for p in d.ports {
                    println!(
                        "    port {}: {}, link layer {}, MTU {} (max {}), largest message {}",
                        p.port,
                        p.state,
                        p.link_layer,
                        p.active_mtu,
                        p.max_mtu,
                        format_bytes(p.max_msg_sz as u64)
                    );
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
        Err(e) => println!("RDMA devices: none ({e})"),
    }
    print_gpus();
    Ok(ExitCode::SUCCESS)
}

#[cfg(feature = "cuda")]
fn print_gpus() {
    use host::gpu::capabilities::{peermem_loaded, report_all};
    use host::memory::select::gpudirect_missing;
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
            }
            if !peermem_loaded() {
                println!("  (nvidia-peermem is not loaded; dma-buf needs no module)");
            }
        }
        Err(e) => println!("GPUs: none usable ({e:#})"),
    }
}

#[cfg(not(feature = "cuda"))]
fn print_gpus() {
    println!(
        "GPUs: not checked (this build has no CUDA support: built without the `cuda` feature)"
    );
}
