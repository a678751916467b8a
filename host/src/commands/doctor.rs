//! `host doctor`: which transports can carry a transfer here, judged one by one
//! (GPUDirect RDMA, RDMA from host memory, TCP); for GPUDirect RDMA, if it will not work,
//! why for each method and the one thing to change; which transport `--transport auto`
//! and which memory path `--mem auto` take.
//!
//! The facts come from the same probes as `host info`; the memory verdicts are the
//! decision function's own plan ([`plan`]), so what doctor says is what a transfer will
//! do. The judgement, the advice and the choice of NIC are pure functions, tested below.

use super::facts::{self, choose_nic, GpuFacts};
use anyhow::{bail, Result};
use host::cli::DoctorArgs;
use host::memory_factory::GpuSelection;
use host::memory_path::{
    plan, Direction, GpuCapabilities, MemKind, Method, NicFacts, PathFacts, Plan,
};
use host::rails::words;
use host::rdma::memlock::MemlockFacts;
use host::rdma::presence::RdmaPresence;
use host::rdma::{self, DmaBufProbe, NicLocation, RdmaError};
use host::topology::{self, PciDistance};
use host::transport::{self, TransportKind};
use host::units::format_bytes;
use serde::Serialize;
use serde_json::json;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

/// The RDMA device a transfer would use, as far as the transports' verdicts care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicState {
    pub name: String,
    /// Its ports that are active.
    pub active_ports: Vec<u8>,
}

/// One transport's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Judged {
    pub works: bool,
    /// Why, in one phrase.
    pub why: String,
}

/// Every transport's verdict, and what `--transport auto` takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Transports {
    pub gpudirect_rdma: Judged,
    pub rdma_host_memory: Judged,
    pub tcp: Judged,
    /// What a sender's `--transport auto` takes (to `--peer`, where given).
    pub auto_sender: TransportKind,
    /// What a receiver's `--transport auto` takes.
    pub auto_receiver: TransportKind,
    /// Why, in one line.
    pub auto_why: String,
}

impl Transports {
    /// Whether any transport can carry a transfer.
    pub fn any(&self) -> bool {
        self.gpudirect_rdma.works || self.rdma_host_memory.works || self.tcp.works
    }
}

/// Judge the transports from the facts: the NIC (or why there is none), the sender's
/// memory plan over RDMA, whether a TCP socket opens, and, with `--peer`, whether the
/// RDMA CM found a route to it (`Ok(device)`) or not.
pub fn judge(
    nic: &Result<NicState, String>,
    send: &Plan,
    tcp: &Result<(), String>,
    route: Option<&Result<Option<String>, String>>,
) -> Transports {
    let rdma_ok: Result<&NicState, String> = match nic {
        Err(why) => Err(why.clone()),
        Ok(n) if n.active_ports.is_empty() => Err(format!(
            "no port of {} is active (`host info` shows why)",
            n.name
        )),
        Ok(n) => Ok(n),
    };
    let gpudirect: Vec<&str> = send
        .attempts
        .iter()
        .filter(|m| m.is_gpudirect())
        .map(|m| m.name())
        .collect();
    let gpudirect_rdma = match (&rdma_ok, gpudirect.is_empty()) {
        (Err(why), _) => Judged {
            works: false,
            why: why.clone(),
        },
        (Ok(_), true) => Judged {
            works: false,
            why: gpudirect_reasons(send),
        },
        (Ok(n), false) => Judged {
            works: true,
            why: format!(
                "{} will be tried on {} (the NIC has the last word when it registers the memory)",
                gpudirect.join(", then "),
                n.name
            ),
        },
    };
    let rdma_host_memory = match &rdma_ok {
        Err(why) => Judged {
            works: false,
            why: why.clone(),
        },
        Ok(n) => Judged {
            works: true,
            why: format!(
                "{} reads host memory (the GPU's data staged or mapped there, or written by the CPU)",
                n.name
            ),
        },
    };
    let tcp = match tcp {
        Ok(()) => Judged {
            works: true,
            why: "a TCP socket opens here; no NIC reads the memory, so GPU data goes through host memory".into(),
        },
        Err(e) => Judged {
            works: false,
            why: format!("a TCP socket does not open here: {e}"),
        },
    };
    let device_present = nic.is_ok();
    let (auto_sender, auto_why) = match route {
        Some(Ok(dev)) => (
            TransportKind::Rdma,
            format!(
                "the RDMA CM found a route to the peer{}",
                dev.as_ref().map(|d| format!(" through {d}")).unwrap_or_default()
            ),
        ),
        Some(Err(why)) => (TransportKind::Tcp, why.clone()),
        None if device_present => (
            TransportKind::Rdma,
            "an RDMA device is present; a sender also needs the RDMA CM to find a route to its receiver through it, else tcp (--peer checks one)".into(),
        ),
        None => (TransportKind::Tcp, "no RDMA device found".into()),
    };
    Transports {
        gpudirect_rdma,
        rdma_host_memory,
        tcp,
        auto_sender,
        auto_receiver: if device_present {
            TransportKind::Rdma
        } else {
            TransportKind::Tcp
        },
        auto_why,
    }
}

/// Why the plan has no GPUDirect method: the reason, once when every method has the
/// same one, else each method's.
fn gpudirect_reasons(send: &Plan) -> String {
    let left: Vec<_> = send
        .left_out
        .iter()
        .filter(|l| l.method.is_gpudirect())
        .collect();
    match left.as_slice() {
        [] => "no GPUDirect method is planned".into(),
        [first, rest @ ..] if rest.iter().all(|l| l.why == first.why) => first.why.clone(),
        all => all
            .iter()
            .map(|l| format!("{}: {}", l.method.name(), l.why))
            .collect::<Vec<_>>()
            .join("; "),
    }
}

fn kind_name(k: TransportKind) -> &'static str {
    match k {
        TransportKind::Rdma => "rdma",
        TransportKind::Tcp => "tcp",
        TransportKind::Auto => "auto",
    }
}

/// The closing line: what can carry a transfer, and what `auto` takes.
pub fn verdict_line(t: &Transports) -> String {
    let mut carriers = Vec::new();
    if t.gpudirect_rdma.works {
        carriers.push("GPUDirect RDMA");
    }
    if t.rdma_host_memory.works {
        carriers.push("RDMA from host memory");
    }
    if t.tcp.works {
        carriers.push("TCP");
    }
    if carriers.is_empty() {
        return "verdict: nothing here can carry a transfer".into();
    }
    let gpudirect = if t.gpudirect_rdma.works {
        String::new()
    } else {
        format!("; not GPUDirect RDMA: {}", t.gpudirect_rdma.why)
    };
    format!(
        "verdict: {} can carry transfers; --transport auto takes {} ({}){gpudirect}",
        carriers.join(", "),
        kind_name(t.auto_sender),
        t.auto_why
    )
}

/// The NIC to judge and its facts, or why there is none (with the advice on looking).
struct NicChoice {
    probe: rdma::NicProbe,
    chosen: String,
    distance: Result<PciDistance, String>,
    ports: Vec<rdma::PortSummary>,
}

pub fn run(args: &DoctorArgs) -> Result<ExitCode> {
    let mut out: Vec<String> = Vec::new();
    let gpu: Result<GpuFacts, String> = match args.gpu {
        GpuSelection::None => Err("--gpu none was given: the CPU writes the pattern".into()),
        GpuSelection::Index(ordinal) => facts::gpus().and_then(|gpus| {
            let count = gpus.len();
            gpus.into_iter()
                .find(|g| g.ordinal == ordinal)
                .ok_or_else(|| format!("no GPU {ordinal} (this machine has {count})"))
        }),
    };
    let function = match &gpu {
        Ok(g) => g.function.clone(),
        Err(e) => Err(e.clone()),
    };
    gpu_lines(args.gpu, &gpu, &mut out);

    // With --peer: what a sender's `auto` would decide, and the route's device.
    let route: Option<Result<Option<String>, String>> = args.peer.map(|ip| {
        let peer = SocketAddr::new(ip, 7471);
        let chosen =
            transport::choose_here(TransportKind::Auto, Some(peer), Duration::from_secs(3));
        match chosen.kind {
            TransportKind::Rdma => Ok(chosen.route_device),
            _ => Err(chosen
                .note
                .unwrap_or_default()
                .trim_start_matches("--transport auto: ")
                .trim_end_matches(", using tcp")
                .to_string()),
        }
    });

    // The rails, ranked for this GPU among the machine's GPUs: shown below the NIC, and
    // with a GPU its first rail is the NIC judged when none is named.
    let rails_here = host::rails::sysfs::here();
    let order = rails_here
        .as_ref()
        .ok()
        .map(|rails| super::rails::order_for(args.gpu, rails));
    let mut presence: Option<RdmaPresence> = None;
    let nic: Result<NicChoice, String> = match rdma::probe_nics() {
        Err(RdmaError::NoDevice) => {
            let p = RdmaPresence::here();
            out.push(match &args.nic {
                Some(name) => {
                    format!("RDMA device: none found (so not {name}, asked for by --nic)")
                }
                None => "RDMA device: none found".into(),
            });
            for line in p.advice() {
                out.push(format!("  {line}"));
            }
            presence = Some(p);
            Err("there is no RDMA device".into())
        }
        Err(e) => {
            out.push(format!("RDMA device: none usable ({e})"));
            Err(format!("no RDMA device can be used ({e})"))
        }
        Ok(nics) => {
            let distances: Vec<(&str, Result<PciDistance, String>)> = nics
                .iter()
                .map(|n| (n.name.as_str(), facts::distance(&function, n)))
                .collect();
            let route_nic = route.as_ref().and_then(|r| r.clone().ok().flatten());
            // Only with a GPU whose place is known: without one the ranking is by speed
            // alone, and the nearest NIC is the same question.
            let rail_nic = order
                .as_deref()
                .filter(|_| function.is_ok())
                .and_then(host::rails::chosen)
                .map(|r| r.device)
                .filter(|d| nics.iter().any(|n| n.name == *d));
            let asked = args.nic.clone().or(route_nic.clone()).or(rail_nic.clone());
            let index = match choose_nic(&distances, asked.as_deref()) {
                Ok(i) => i,
                Err(e) => bail!(e),
            };
            let chosen = if args.nic.is_some() {
                "as asked".to_string()
            } else if route_nic.is_some() {
                "the route to --peer leaves through it".to_string()
            } else if rail_nic.is_some() {
                "the GPU's first rail, ranked below".to_string()
            } else {
                format!("the nearest of {}", nics.len())
            };
            let ports = rdma::devices()
                .ok()
                .and_then(|d| d.into_iter().find(|d| d.name == nics[index].name))
                .map(|d| d.ports)
                .unwrap_or_default();
            Ok(NicChoice {
                distance: distances[index].1.clone(),
                probe: nics[index].clone(),
                chosen,
                ports,
            })
        }
    };
    let peermem = rdma::loaded_peermem_module();
    if let Ok(n) = &nic {
        nic_lines(n, args, &function, peermem, &mut out);
    }
    if let (Some(order), Ok(rails)) = (&order, &rails_here) {
        rail_lines(args.gpu, &gpu, order, rails, &mut out);
    }

    let memlock = MemlockFacts::here();
    if let Some(m) = &memlock {
        out.push(m.describe(args.size));
    }

    let path_facts = PathFacts {
        gpu: gpu.as_ref().map(|g| g.caps).map_err(Clone::clone),
        nic: match &nic {
            Ok(n) => NicFacts {
                name: n.probe.name.clone(),
                dma_buf: n.probe.dma_buf.clone(),
                peermem,
            },
            Err(why) => NicFacts {
                name: "the RDMA device".into(),
                dma_buf: DmaBufProbe::Unknown { why: why.clone() },
                peermem,
            },
        },
        distance: nic
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|n| n.distance.clone()),
        gpudirect_level: args.gpudirect_level,
        // BAR1 against --size, as the sender and receiver check it against what they
        // register.
        bar1: function
            .as_ref()
            .ok()
            .and_then(|f| topology::bar1_bytes(f).ok())
            .map(|bar1_bytes| host::memory_path::Bar1Fit {
                bar1_bytes,
                register_bytes: args.size,
            }),
    };
    let software = matches!(
        nic.as_ref().map(|n| &n.probe.location),
        Ok(NicLocation::Software)
    );
    let send = plan(Direction::Send, MemKind::Auto, &path_facts)?;
    let recv = plan(Direction::Recv, MemKind::Auto, &path_facts)?;
    let tcp_send = host::engine::connect::tcp_plan(&send);
    let tcp_check = std::net::TcpListener::bind(("127.0.0.1", 0))
        .map(drop)
        .map_err(|e| e.to_string());
    let nic_state = nic.as_ref().map_err(Clone::clone).map(|n| NicState {
        name: n.probe.name.clone(),
        active_ports: n
            .ports
            .iter()
            .filter(|p| p.state == "active")
            .map(|p| p.port)
            .collect(),
    });
    let t = judge(&nic_state, &send, &tcp_check, route.as_ref());

    // GPUDirect RDMA: the verdict and, when it will not work, each method's reason and
    // the one thing to change.
    let to_change = if nic.is_ok() {
        out.extend(verdict(&send, &path_facts, software));
        one_thing(&path_facts, software)
    } else {
        out.push(format!(
            "GPUDirect RDMA: will not work: {}",
            t.gpudirect_rdma.why
        ));
        let change = no_nic_change(&path_facts.gpu);
        out.push(format!("to change: {change}"));
        Some(change)
    };
    out.push(format!(
        "RDMA from host memory: {}: {}",
        if t.rdma_host_memory.works {
            "works"
        } else {
            "will not work"
        },
        t.rdma_host_memory.why
    ));
    out.push(format!(
        "TCP: {}: {}",
        if t.tcp.works {
            "works"
        } else {
            "will not work"
        },
        t.tcp.why
    ));
    out.push(format!(
        "--transport auto: a sender takes {}, a receiver {} ({})",
        kind_name(t.auto_sender),
        kind_name(t.auto_receiver),
        t.auto_why
    ));
    if t.rdma_host_memory.works {
        out.push(format!(
            "--mem auto over RDMA: {}",
            auto_summary(&send, &recv)
        ));
    }
    let tcp_first = tcp_send.attempts.first().copied().unwrap_or(Method::Host);
    out.push(format!(
        "--mem auto over TCP: the sender takes {} ({}); the receiver host (host memory)",
        tcp_first.name(),
        tcp_words(tcp_first)
    ));
    let closing = verdict_line(&t);
    out.push(closing.clone());

    if args.json {
        println!(
            "{}",
            json!({
                "ok": t.any(),
                "gpu": gpu_json(&gpu),
                "nic": nic.as_ref().ok().map(|n| json!({
                    "name": n.probe.name,
                    "chosen": n.chosen,
                    "location": n.probe.location,
                    "dma_buf": n.probe.dma_buf,
                    "distance": n.distance.as_ref().ok().map(|d| d.to_string()),
                    "ports": n.ports,
                })),
                "no_rdma_device": presence.as_ref().map(|p| json!({
                    "facts": p,
                    "advice": p.advice(),
                })),
                "peermem": peermem,
                "rails": match (&order, &rails_here) {
                    (Some(order), _) => json!({
                        "chosen": host::rails::chosen(order).map(|r| r.to_string()),
                        "order": order,
                    }),
                    (None, Err(e)) => json!({ "error": e }),
                    (None, Ok(_)) => json!(null),
                },
                "memlock": memlock,
                "transports": t,
                "gpudirect_left_out": send.left_out.iter().filter(|l| l.method.is_gpudirect()).collect::<Vec<_>>(),
                "to_change": to_change,
                "mem_auto": {
                    "rdma": { "sender": send.attempts, "receiver": recv.attempts },
                    "tcp": { "sender": tcp_send.attempts, "receiver": [Method::Host] },
                },
                "verdict": closing.trim_start_matches("verdict: "),
            })
        );
    } else {
        for line in &out {
            println!("{line}");
        }
    }
    Ok(if t.any() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn gpu_json(gpu: &Result<GpuFacts, String>) -> serde_json::Value {
    match gpu {
        Ok(g) => json!({
            "ordinal": g.ordinal,
            "name": g.name,
            "pci_bus_id": g.bus_id,
            "capabilities": g.caps,
            "pci_path": g.function.as_ref().ok().map(|f| f.path.display().to_string()),
            "bar1_bytes": g.function.as_ref().ok().and_then(|f| topology::bar1_bytes(f).ok()),
        }),
        Err(why) => json!({ "none": why }),
    }
}

/// The NIC, how it was chosen, what it can register, its ports and its distance.
fn nic_lines(
    n: &NicChoice,
    args: &DoctorArgs,
    function: &Result<topology::PciFunction, String>,
    peermem: Option<rdma::PeerMemModule>,
    out: &mut Vec<String>,
) {
    out.push(format!(
        "NIC {} ({}): {}",
        n.probe.name,
        n.chosen,
        n.probe.location.describe()
    ));
    out.push(format!("  {}", n.probe.dma_buf.describe()));
    out.push(format!("  {}", rdma::describe_peermem(peermem)));
    for p in &n.ports {
        out.push(format!("  {}", super::info::port_words(p)));
        if let Some(advice) = rdma::port_advice(&p.state, p.phys_state, p.link_layer) {
            out.push(format!("    {advice}"));
        }
    }
    match &n.distance {
        Ok(d) => out.push(format!(
            "  distance to the GPU: {d} ({}), {} --gpudirect-level {}",
            d.describe(),
            if *d <= args.gpudirect_level {
                "within"
            } else {
                "beyond"
            },
            args.gpudirect_level
        )),
        Err(e) => out.push(format!("  distance to the GPU: unknown ({e})")),
    }
    if let Some(group) = function.as_ref().ok().and_then(topology::iommu_group) {
        if group.translated() {
            out.push(format!(
                "  IOMMU: the GPU's group {} translates DMA (type {}): the NIC's peer-to-peer reads go through the IOMMU; if GPUDirect registers but transfers fail or crawl, boot with iommu=pt",
                group.group,
                group.kind.as_deref().unwrap_or("?")
            ));
        }
    }
}

/// The rails in the order the GPU takes them (none printed where sysfs lists none: the
/// lines on looking for a device say enough), or without a GPU in the machine's order.
fn rail_lines(
    selection: GpuSelection,
    gpu: &Result<GpuFacts, String>,
    order: &[host::rails::RankedRail],
    rails: &[host::rails::Rail],
    out: &mut Vec<String>,
) {
    if rails.is_empty() {
        return;
    }
    match (selection, gpu) {
        (GpuSelection::Index(ordinal), Ok(_)) => {
            out.push(format!("GPU {ordinal}'s {}", words::ORDER_HEADING));
            out.extend(words::ranked_lines(order).iter().map(|l| format!("  {l}")));
        }
        _ => {
            out.push("rails (no GPU to rank them for; --rails N takes the fastest N):".into());
            out.extend(rails.iter().map(|r| format!("  {}", words::rail_line(r))));
        }
    }
}

/// The GPU's identity, PCI path, capabilities and BAR1.
fn gpu_lines(selection: GpuSelection, gpu: &Result<GpuFacts, String>, out: &mut Vec<String>) {
    match gpu {
        Ok(g) => {
            out.push(format!("GPU {}: {} (PCI {})", g.ordinal, g.name, g.bus_id));
            match &g.function {
                Ok(f) => out.push(format!("  PCI path: {}", f.path.display())),
                Err(e) => out.push(format!("  PCI path: unknown ({e})")),
            }
            out.push(format!("  {}", describe_caps(&g.caps)));
            if let Ok(f) = &g.function {
                match topology::bar1_bytes(f) {
                    Ok(b) => out.push(format!("  BAR1: {}", format_bytes(b))),
                    Err(e) => out.push(format!("  BAR1: unknown ({e})")),
                }
            }
        }
        Err(e) => match selection {
            GpuSelection::Index(ordinal) => out.push(format!("GPU {ordinal}: none: {e}")),
            GpuSelection::None => out.push(format!("GPU: none ({e})")),
        },
    }
}

/// A memory method over TCP, in words without registration (no NIC reads it).
fn tcp_words(m: Method) -> &'static str {
    match m {
        Method::Staged => "GPU memory copied chunk by chunk into host memory",
        other => other.describe(),
    }
}

/// What GPUDirect RDMA needs on a machine without an RDMA device.
pub fn no_nic_change(gpu: &Result<GpuCapabilities, String>) -> String {
    let nic =
        "an RDMA NIC (InfiniBand or RoCE), ideally on the GPU's PCIe switch (docs/hardware.md)";
    match gpu {
        Ok(_) => nic.to_string(),
        Err(why) => format!("GPUDirect RDMA needs a GPU ({why}) and {nic}"),
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
    use host::memory_path::MemKind;
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
        small.bar1 = Some(host::memory_path::Bar1Fit {
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

    fn nic(active: &[u8]) -> Result<NicState, String> {
        Ok(NicState {
            name: "mlx5_0".into(),
            active_ports: active.to_vec(),
        })
    }

    #[test]
    fn without_an_rdma_device_tcp_carries_and_gpudirect_says_why_not() {
        let mut f = facts(true, YES, false, PciDistance::Pix);
        f.nic.dma_buf = DmaBufProbe::Unknown {
            why: "there is no RDMA device".into(),
        };
        f.distance = Err("there is no RDMA device".into());
        let send = plan(Direction::Send, MemKind::Auto, &f).unwrap();
        let t = judge(&Err("there is no RDMA device".into()), &send, &Ok(()), None);
        assert!(!t.gpudirect_rdma.works && !t.rdma_host_memory.works && t.tcp.works);
        assert!(t.any(), "TCP carries: exit 0");
        assert_eq!(t.gpudirect_rdma.why, "there is no RDMA device");
        assert_eq!(
            (t.auto_sender, t.auto_receiver),
            (TransportKind::Tcp, TransportKind::Tcp)
        );
        assert_eq!(
            verdict_line(&t),
            "verdict: TCP can carry transfers; --transport auto takes tcp (no RDMA device found); not GPUDirect RDMA: there is no RDMA device"
        );
        // And if not even a socket opens, nothing can: exit 1.
        let t = judge(
            &Err("there is no RDMA device".into()),
            &send,
            &Err("Permission denied".into()),
            None,
        );
        assert!(!t.any());
        assert_eq!(
            verdict_line(&t),
            "verdict: nothing here can carry a transfer"
        );
    }

    #[test]
    fn a_software_nic_carries_host_memory_not_gpudirect() {
        // The Soft-RoCE guests: no GPU, rxe0 with an active port.
        let mut f = facts(true, NO, false, PciDistance::Pix);
        f.gpu = Err("this build has no GPU support".into());
        let send = plan(Direction::Send, MemKind::Auto, &f).unwrap();
        let t = judge(&nic(&[1]), &send, &Ok(()), None);
        assert!(!t.gpudirect_rdma.works && t.rdma_host_memory.works && t.tcp.works);
        assert_eq!(
            t.rdma_host_memory.why,
            "mlx5_0 reads host memory (the GPU's data staged or mapped there, or written by the CPU)"
        );
        assert_eq!(t.auto_receiver, TransportKind::Rdma);
        assert_eq!(
            verdict_line(&t),
            "verdict: RDMA from host memory, TCP can carry transfers; --transport auto takes rdma (an RDMA device is present; a sender also needs the RDMA CM to find a route to its receiver through it, else tcp (--peer checks one)); not GPUDirect RDMA: this build has no GPU support"
        );
        // Different reasons per method are each named.
        let f = facts(true, NO, false, PciDistance::Pix);
        let send = plan(Direction::Send, MemKind::Auto, &f).unwrap();
        let t = judge(&nic(&[1]), &send, &Ok(()), None);
        assert_eq!(
            t.gpudirect_rdma.why,
            "dma-buf: mlx5_0 cannot register dma-buf (ibv_reg_dmabuf_mr: Operation not supported, EOPNOTSUPP); peermem: neither nvidia_peermem nor nv_peer_mem is loaded"
        );
    }

    #[test]
    fn gpudirect_works_only_with_an_active_port_and_a_plan_for_it() {
        let f = facts(true, YES, false, PciDistance::Pix);
        let send = plan(Direction::Send, MemKind::Auto, &f).unwrap();
        let t = judge(&nic(&[1]), &send, &Ok(()), None);
        assert!(t.gpudirect_rdma.works, "{t:?}");
        assert!(t
            .gpudirect_rdma
            .why
            .starts_with("dma-buf will be tried on mlx5_0"));
        assert_eq!(verdict_line(&t), "verdict: GPUDirect RDMA, RDMA from host memory, TCP can carry transfers; --transport auto takes rdma (an RDMA device is present; a sender also needs the RDMA CM to find a route to its receiver through it, else tcp (--peer checks one))");
        let down = judge(&nic(&[]), &send, &Ok(()), None);
        assert!(!down.gpudirect_rdma.works && !down.rdma_host_memory.works);
        assert_eq!(
            down.rdma_host_memory.why,
            "no port of mlx5_0 is active (`host info` shows why)"
        );
    }

    #[test]
    fn with_a_peer_auto_is_what_the_route_says() {
        let f = facts(true, YES, false, PciDistance::Pix);
        let send = plan(Direction::Send, MemKind::Auto, &f).unwrap();
        let t = judge(&nic(&[1]), &send, &Ok(()), Some(&Ok(Some("mlx5_1".into()))));
        assert_eq!(t.auto_sender, TransportKind::Rdma);
        assert_eq!(
            t.auto_why,
            "the RDMA CM found a route to the peer through mlx5_1"
        );
        let no_route: Result<Option<String>, String> =
            Err("192.0.2.9:7471 is not reachable over RDMA (no route)".into());
        let t = judge(&nic(&[1]), &send, &Ok(()), Some(&no_route));
        assert_eq!(
            (t.auto_sender, t.auto_receiver),
            (TransportKind::Tcp, TransportKind::Rdma)
        );
        assert!(t.auto_why.contains("not reachable over RDMA"));
    }

    #[test]
    fn without_a_nic_the_change_is_a_nic_and_a_gpu_if_missing() {
        assert!(no_nic_change(&Ok(GpuCapabilities::default())).starts_with("an RDMA NIC"));
        assert_eq!(
            no_nic_change(&Err("--gpu none was given".into())),
            "GPUDirect RDMA needs a GPU (--gpu none was given) and an RDMA NIC (InfiniBand or RoCE), ideally on the GPU's PCIe switch (docs/hardware.md)"
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
