//! How far apart two PCI functions are, in the classes of `nvidia-smi topo -m` and NCCL.

use super::pci::PciFunction;
use std::fmt;
use std::str::FromStr;

/// The distance between a GPU and a NIC, nearest first (so `<=` compares against a
/// `--gpudirect-level`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "UPPERCASE")]
pub enum PciDistance {
    /// At most one PCIe switch between them.
    Pix,
    /// Several PCIe switches, without going through the host bridge.
    Pxb,
    /// Through the PCIe host bridge (the CPU's root complex) they share.
    Phb,
    /// Through two host bridges of one NUMA node (`nvidia-smi topo -m`'s NODE; NCCL counts
    /// it as PHB, having one CPU node per NUMA node).
    Node,
    /// Across NUMA nodes: the CPU sockets' interconnect (QPI/UPI, Infinity Fabric).
    Sys,
}

impl PciDistance {
    pub const ALL: [PciDistance; 5] = [
        PciDistance::Pix,
        PciDistance::Pxb,
        PciDistance::Phb,
        PciDistance::Node,
        PciDistance::Sys,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PciDistance::Pix => "PIX",
            PciDistance::Pxb => "PXB",
            PciDistance::Phb => "PHB",
            PciDistance::Node => "NODE",
            PciDistance::Sys => "SYS",
        }
    }

    /// What lies between the two, in words.
    pub fn describe(self) -> &'static str {
        match self {
            PciDistance::Pix => "at most one PCIe switch between them",
            PciDistance::Pxb => "several PCIe switches between them, not the host bridge",
            PciDistance::Phb => "through the PCIe host bridge (the CPU)",
            PciDistance::Node => "through two PCIe host bridges of one NUMA node",
            PciDistance::Sys => "across NUMA nodes (the CPU sockets' interconnect)",
        }
    }
}

impl fmt::Display for PciDistance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PciDistance {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        PciDistance::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(text.trim()))
            .ok_or_else(|| format!("`{text}` is not one of PIX, PXB, PHB, NODE, SYS"))
    }
}

/// The switches above a function, top down, each named by its path from the host bridge.
///
/// A PCIe switch shows in sysfs as two levels: its upstream port and, below it, the
/// downstream port a device hangs off. So, like NCCL (which rewinds two path components
/// per step up), the switches of a device with bridges `b[0..d]` (root port first) are
/// the upstream ports `b[d-2]`, `b[d-4]`, ...; what is left at the top is the root port,
/// which belongs to the host bridge.
fn switches(function: &PciFunction) -> Vec<&[String]> {
    let d = function.bridges.len();
    let mut out: Vec<&[String]> = (0..d.saturating_sub(1))
        .rev()
        .step_by(2)
        .map(|upstream| &function.bridges[..=upstream])
        .collect();
    out.reverse();
    out
}

/// The distance between two functions (a GPU and a NIC; the order does not matter).
pub fn distance(a: &PciFunction, b: &PciFunction) -> PciDistance {
    if a.host_bridge != b.host_bridge {
        // -1 in numa_node means the kernel has no NUMA information: one node.
        return match (a.numa_node, b.numa_node) {
            (Some(x), Some(y)) if x != y => PciDistance::Sys,
            _ => PciDistance::Node,
        };
    }
    let (sa, sb) = (switches(a), switches(b));
    let common = sa.iter().zip(&sb).take_while(|(x, y)| x == y).count();
    if common == 0 {
        return PciDistance::Phb;
    }
    // The switches on the way: each side's own below the common one, and that one.
    match (sa.len() - common) + (sb.len() - common) + 1 {
        1 => PciDistance::Pix,
        _ => PciDistance::Pxb,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::fixture::Fixture;
    use crate::topology::pci::{gpu_function, rdma_device_function};

    #[test]
    fn levels_parse_in_any_case_and_order_nearest_first() {
        assert_eq!("pxb".parse(), Ok(PciDistance::Pxb));
        assert_eq!(" Sys ".parse(), Ok(PciDistance::Sys));
        assert_eq!("NODE".parse(), Ok(PciDistance::Node));
        assert_eq!(
            "LOC".parse::<PciDistance>(),
            Err("`LOC` is not one of PIX, PXB, PHB, NODE, SYS".to_string())
        );
        assert!(PciDistance::Pix < PciDistance::Pxb);
        assert!(PciDistance::Pxb < PciDistance::Phb);
        assert!(PciDistance::Phb < PciDistance::Node);
        assert!(PciDistance::Node < PciDistance::Sys);
        for d in PciDistance::ALL {
            assert_eq!(d.to_string().parse(), Ok(d));
            assert_eq!(
                serde_json::to_string(&d).unwrap(),
                format!("\"{}\"", d.name())
            );
        }
    }

    /// The distance between GPU `gpu` and NIC `nic` (chains below sys/devices, with
    /// their NUMA nodes), read from a fixture tree as on a real machine.
    fn classify(gpu: (&str, i32), nic: (&str, i32)) -> PciDistance {
        let f = Fixture::new();
        f.pci_device(gpu.0, gpu.1);
        f.pci_device(nic.0, nic.1);
        f.nic("mlx5_0", Some(nic.0));
        let gpu_id = gpu.0.rsplit('/').next().unwrap();
        let g = gpu_function(f.root(), gpu_id).unwrap();
        let n = rdma_device_function(f.root(), "mlx5_0").unwrap().unwrap();
        assert_eq!(distance(&g, &n), distance(&n, &g), "symmetric");
        distance(&g, &n)
    }

    const SWITCH: &str = "pci0000:00/0000:00:01.0/0000:01:00.0";

    #[test]
    fn pix_one_switch() {
        assert_eq!(
            classify(
                (&format!("{SWITCH}/0000:02:00.0/0000:03:00.0"), 0),
                (&format!("{SWITCH}/0000:02:01.0/0000:04:00.0"), 0),
            ),
            PciDistance::Pix
        );
        // Both behind the same downstream port (a two-port NIC's function 1 too).
        assert_eq!(
            classify(
                (&format!("{SWITCH}/0000:02:00.0/0000:03:00.0"), 0),
                (&format!("{SWITCH}/0000:02:00.0/0000:03:00.1"), 0),
            ),
            PciDistance::Pix
        );
    }

    #[test]
    fn pxb_two_levels_of_switches() {
        // The GPU behind a second switch hanging off the first one's downstream port.
        assert_eq!(
            classify(
                (
                    &format!("{SWITCH}/0000:02:00.0/0000:03:00.0/0000:04:00.0/0000:05:00.0"),
                    0
                ),
                (&format!("{SWITCH}/0000:02:01.0/0000:06:00.0"), 0),
            ),
            PciDistance::Pxb
        );
    }

    #[test]
    fn phb_different_root_ports_of_one_host_bridge() {
        assert_eq!(
            classify(
                ("pci0000:00/0000:00:01.0/0000:01:00.0", 0),
                ("pci0000:00/0000:00:02.0/0000:02:00.0", 0),
            ),
            PciDistance::Phb
        );
        // Devices on the root bus itself (a VM's GPU at 0000:00:06.0).
        assert_eq!(
            classify(
                ("pci0000:00/0000:00:06.0", -1),
                ("pci0000:00/0000:00:07.0", -1)
            ),
            PciDistance::Phb
        );
    }

    #[test]
    fn node_two_host_bridges_one_numa_node() {
        assert_eq!(
            classify(
                ("pci0000:00/0000:00:01.0/0000:01:00.0", 0),
                ("pci0000:20/0000:20:01.0/0000:21:00.0", 0),
            ),
            PciDistance::Node
        );
        // No NUMA information (-1): one node.
        assert_eq!(
            classify(
                ("pci0000:00/0000:00:01.0/0000:01:00.0", -1),
                ("pci0000:20/0000:20:01.0/0000:21:00.0", 1),
            ),
            PciDistance::Node
        );
    }

    #[test]
    fn sys_across_numa_nodes() {
        assert_eq!(
            classify(
                ("pci0000:00/0000:00:01.0/0000:01:00.0", 0),
                ("pci0000:80/0000:80:01.0/0000:81:00.0", 1),
            ),
            PciDistance::Sys
        );
    }
}
