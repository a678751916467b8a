//! PCI functions as sysfs shows them: the chain of bridges above a device, its NUMA
//! node, its BAR1 aperture and its IOMMU group.

use serde::Serialize;
use std::path::{Path, PathBuf};

/// One PCI function and the way up from it to its host bridge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PciFunction {
    /// `0000:01:00.0`.
    pub address: String,
    /// The resolved sysfs directory (`/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0`).
    pub path: PathBuf,
    /// The host bridge (root complex) it hangs off: `pci0000:00`.
    pub host_bridge: String,
    /// The bridges between the host bridge and the device, top down (root port first).
    pub bridges: Vec<String>,
    /// `numa_node`; none where sysfs says -1 (no NUMA information) or nothing.
    pub numa_node: Option<u32>,
}

/// Is `text` a PCI address `DDDD:BB:DD.F` (hex, lower or upper case)?
fn is_pci_address(text: &str) -> bool {
    let mut parts = text.split([':', '.']);
    let widths = [(1, 8), (2, 2), (2, 2), (1, 1)];
    widths.iter().all(|&(min, max)| {
        parts.next().is_some_and(|p| {
            (min..=max).contains(&p.len()) && p.chars().all(|c| c.is_ascii_hexdigit())
        })
    }) && parts.next().is_none()
}

/// The host bridge and the chain of functions (the device last) of a path relative to
/// `sys/devices`: `pci0000:00/0000:00:01.0/0000:01:00.0`.
pub fn parse_chain(relative: &Path) -> Result<(String, Vec<String>), String> {
    let mut parts = relative.iter().map(|p| p.to_string_lossy().into_owned());
    let bridge = parts.next().unwrap_or_default();
    if !bridge.starts_with("pci") {
        return Err(format!(
            "{} is not below a PCI host bridge",
            relative.display()
        ));
    }
    let chain: Vec<String> = parts.collect();
    match chain.iter().find(|p| !is_pci_address(p)) {
        Some(odd) => Err(format!(
            "{} is not a PCI function ({odd} is no PCI address)",
            relative.display()
        )),
        None if chain.is_empty() => Err(format!("{} is a host bridge", relative.display())),
        None => Ok((bridge, chain)),
    }
}

/// The function whose resolved sysfs directory is `resolved` (below `root/sys/devices`).
pub fn function_at(root: &Path, resolved: &Path) -> Result<PciFunction, String> {
    let devices = root.join("sys/devices");
    let devices = devices.canonicalize().unwrap_or(devices);
    let relative = resolved
        .strip_prefix(&devices)
        .map_err(|_| format!("{} is not below {}", resolved.display(), devices.display()))?;
    let (host_bridge, mut chain) = parse_chain(relative)?;
    let address = chain
        .pop()
        .expect("parse_chain returns at least the device");
    let numa_node = std::fs::read_to_string(resolved.join("numa_node"))
        .ok()
        .and_then(|t| t.trim().parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok());
    Ok(PciFunction {
        address,
        path: resolved.to_path_buf(),
        host_bridge,
        bridges: chain,
        numa_node,
    })
}

/// `0000:00:06.0` as sysfs names it: lower case, a 4-digit domain where the driver gave
/// 8 (`00000000:00:06.0`, nvidia-smi's form).
pub fn normalize_bus_id(bus_id: &str) -> String {
    let lower = bus_id.trim().to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 && domain.starts_with("0000") => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => lower,
    }
}

/// The GPU's function from its PCI bus id (`0000:00:06.0`), through
/// `sys/bus/pci/devices/<id>`.
pub fn gpu_function(root: &Path, bus_id: &str) -> Result<PciFunction, String> {
    let id = normalize_bus_id(bus_id);
    let link = root.join("sys/bus/pci/devices").join(&id);
    let resolved = link.canonicalize().map_err(|e| {
        format!(
            "no PCI device {id} in {}: {e}",
            link.parent().unwrap_or(&link).display()
        )
    })?;
    function_at(root, &resolved)
}

/// The PCI function of RDMA device `name`: `sys/class/infiniband/<name>/device`. `None`
/// for a software device (rxe, siw), which has no such link or one to a virtual device.
pub fn rdma_device_function(root: &Path, name: &str) -> Result<Option<PciFunction>, String> {
    let class = root.join("sys/class/infiniband").join(name);
    if !class.exists() {
        return Err(format!(
            "no RDMA device {name} in {}",
            class.parent().unwrap_or(&class).display()
        ));
    }
    let Ok(resolved) = class.join("device").canonicalize() else {
        return Ok(None);
    };
    // A link that leads outside the PCI tree (a virtual or platform device) is no PCI
    // function either.
    Ok(function_at(root, &resolved).ok())
}

/// The size of BAR `index` from the text of a sysfs `resource` file.
///
/// The file has one line per resource, `start end flags` in hex; lines 0-5 are the BARs,
/// indexed by BAR register as lspci's "Region N" (the kernel reads a 64-bit BAR into its
/// own index and leaves the next, its upper half, as a line of zeros). NVIDIA GPUs have
/// BAR0 (registers, 32-bit), BAR1 (the framebuffer aperture, 64-bit prefetchable) and
/// BAR3; BAR1 is the window through which a peer device (the NIC) reaches GPU memory, and
/// its size is nvidia-smi's "BAR1 Memory Usage: Total". Hence line 1.
pub fn parse_bar_size(resource: &str, index: usize) -> Result<u64, String> {
    let line = resource
        .lines()
        .nth(index)
        .ok_or_else(|| format!("the resource file has no line {index}"))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .map(|f| u64::from_str_radix(f.trim_start_matches("0x"), 16))
        .collect::<Result<_, _>>()
        .map_err(|_| format!("resource line {index} is not hex: `{line}`"))?;
    match fields[..] {
        [start, end, _flags] if end > start => Ok(end - start + 1),
        [_, _, _] => Err(format!("BAR{index} is not assigned")),
        _ => Err(format!(
            "resource line {index} is not `start end flags`: `{line}`"
        )),
    }
}

/// The size of the GPU's framebuffer aperture, what NVIDIA calls BAR1: the second
/// assigned memory BAR, BAR0 being the GPU's registers. It is resource line 1 where BAR0
/// is 32-bit (an H100 on bare metal) and line 2 where BAR0 is 64-bit and takes lines 0-1
/// (the H200 machine here: its line 0 is even prefetchable, so neither the line number
/// nor the prefetch flag alone finds it; nvidia-smi agrees with this rule there, 256 GiB).
pub fn parse_aperture_size(resource: &str) -> Result<u64, String> {
    (0..6)
        .filter_map(|index| parse_bar_size(resource, index).ok())
        .nth(1)
        .ok_or_else(|| "no second memory BAR (the framebuffer aperture) is assigned".into())
}

/// BAR1's size in bytes: the aperture through which a NIC reaches GPU memory (see
/// [`parse_aperture_size`]).
pub fn bar1_bytes(function: &PciFunction) -> Result<u64, String> {
    let file = function.path.join("resource");
    let text = std::fs::read_to_string(&file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    parse_aperture_size(&text)
}

/// A function's IOMMU group and how the IOMMU treats its DMA.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IommuGroup {
    pub group: String,
    /// The group's `type`: `identity` (passthrough), `DMA`, `DMA-FQ` (translated), ...;
    /// none on kernels without the file.
    pub kind: Option<String>,
}

impl IommuGroup {
    /// Does the IOMMU translate this group's DMA? Then a NIC's peer-to-peer reads of GPU
    /// memory go through the IOMMU (and, with ACS redirection, up to the root complex).
    pub fn translated(&self) -> bool {
        self.kind.as_deref().is_some_and(|k| k.starts_with("DMA"))
    }
}

/// The function's `iommu_group` link and its `type`; none without an IOMMU.
pub fn iommu_group(function: &PciFunction) -> Option<IommuGroup> {
    let group = function.path.join("iommu_group").canonicalize().ok()?;
    let kind = std::fs::read_to_string(group.join("type"))
        .ok()
        .map(|t| t.trim().to_string());
    Some(IommuGroup {
        group: group.file_name()?.to_string_lossy().into_owned(),
        kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::fixture::Fixture;

    #[test]
    fn pci_addresses() {
        assert!(is_pci_address("0000:01:00.0"));
        assert!(is_pci_address("10000:e1:1f.7"));
        assert!(!is_pci_address("pci0000:00"));
        assert!(!is_pci_address("0000:01:00"));
        assert!(!is_pci_address("infiniband"));
    }

    #[test]
    fn bus_ids_as_sysfs_names_them() {
        assert_eq!(normalize_bus_id("0000:00:06.0"), "0000:00:06.0");
        assert_eq!(normalize_bus_id("00000000:3B:00.0"), "0000:3b:00.0");
    }

    #[test]
    fn a_gpu_behind_a_switch() {
        let f = Fixture::new();
        f.pci_device(
            "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0",
            1,
        );
        let gpu = gpu_function(f.root(), "0000:03:00.0").unwrap();
        assert_eq!(gpu.address, "0000:03:00.0");
        assert_eq!(gpu.host_bridge, "pci0000:00");
        assert_eq!(
            gpu.bridges,
            ["0000:00:01.0", "0000:01:00.0", "0000:02:00.0"]
        );
        assert_eq!(gpu.numa_node, Some(1));
        assert!(gpu.path.ends_with("0000:02:00.0/0000:03:00.0"));
    }

    #[test]
    fn numa_minus_one_is_unknown() {
        let f = Fixture::new();
        f.pci_device("pci0000:00/0000:00:06.0", -1);
        assert_eq!(
            gpu_function(f.root(), "0000:00:06.0").unwrap().numa_node,
            None
        );
    }

    /// This machine's own sysfs, where it has PCI devices: each resolves and names itself.
    #[test]
    fn the_real_sysfs_reads_too() {
        let Ok(entries) = std::fs::read_dir("/sys/bus/pci/devices") else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let f = gpu_function(Path::new("/"), &name).unwrap();
            assert_eq!(f.address, name);
            assert!(f.host_bridge.starts_with("pci"), "{f:?}");
        }
    }

    #[test]
    fn a_missing_device_says_so() {
        let f = Fixture::new();
        f.pci_device("pci0000:00/0000:00:06.0", 0);
        let e = gpu_function(f.root(), "0000:00:07.0").unwrap_err();
        assert!(e.starts_with("no PCI device 0000:00:07.0 in "), "{e}");
        let e = rdma_device_function(f.root(), "mlx5_0").unwrap_err();
        assert!(e.starts_with("no RDMA device mlx5_0 in "), "{e}");
    }

    #[test]
    fn software_rdma_devices_have_no_pci_function() {
        let f = Fixture::new();
        f.nic("rxe0", None);
        assert_eq!(rdma_device_function(f.root(), "rxe0"), Ok(None));
        // A link into the virtual tree is no PCI function either.
        f.dir("sys/devices/virtual/net/veth0");
        f.link(
            "sys/class/infiniband/siw0/device",
            "../../../devices/virtual/net/veth0",
        );
        assert_eq!(rdma_device_function(f.root(), "siw0"), Ok(None));
    }

    #[test]
    fn a_nic_by_its_class_link() {
        let f = Fixture::new();
        f.pci_device("pci0000:80/0000:80:02.0/0000:81:00.1", 1);
        f.nic("mlx5_1", Some("pci0000:80/0000:80:02.0/0000:81:00.1"));
        let nic = rdma_device_function(f.root(), "mlx5_1").unwrap().unwrap();
        assert_eq!(nic.address, "0000:81:00.1");
        assert_eq!(nic.host_bridge, "pci0000:80");
        assert_eq!(nic.bridges, ["0000:80:02.0"]);
    }

    // An H100's resource file (BAR0 16 MiB, BAR1 32 GiB at line 1, its upper half a line
    // of zeros, BAR3 32 MiB), as on a real machine.
    const H100_RESOURCE: &str = "\
0x00000000a2000000 0x00000000a2ffffff 0x0000000000040200
0x0000238000000000 0x00002387ffffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x000023880a000000 0x000023880bffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000000000000000 0x0000000000000000 0x0000000000000000
";

    // The H200 machine's own resource file (2026-12-03): BAR0 64-bit and prefetchable at
    // lines 0-1, the 256 GiB aperture at line 2 (nvidia-smi: BAR1 Total 262144 MiB).
    const H200_VM_RESOURCE: &str = "\
0x0000104002000000 0x0000104002ffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000100000000000 0x0000103fffffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000104000000000 0x0000104001ffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000000000000000 0x0000000000000000 0x0000000000000000
";

    #[test]
    fn the_aperture_is_the_second_assigned_bar() {
        assert_eq!(parse_aperture_size(H100_RESOURCE), Ok(32 << 30));
        assert_eq!(parse_aperture_size(H200_VM_RESOURCE), Ok(256 << 30));
        let only_bar0 = "0x0000000060000000 0x0000000060ffffff 0x0000000000040200\n";
        assert!(parse_aperture_size(only_bar0).is_err());
        assert!(parse_aperture_size("").is_err());
    }

    #[test]
    fn bar1_is_line_one_of_resource() {
        assert_eq!(parse_bar_size(H100_RESOURCE, 1), Ok(32 << 30));
        assert_eq!(parse_bar_size(H100_RESOURCE, 0), Ok(16 << 20));
        assert_eq!(parse_bar_size(H100_RESOURCE, 3), Ok(32 << 20));
        assert_eq!(
            parse_bar_size(H100_RESOURCE, 2),
            Err("BAR2 is not assigned".to_string())
        );
        assert!(parse_bar_size("garbage here now\n", 0).is_err());
        assert!(parse_bar_size("", 1).is_err());
        let f = Fixture::new();
        f.pci_device("pci0000:00/0000:00:06.0", 0);
        f.file(
            "sys/devices/pci0000:00/0000:00:06.0/resource",
            H100_RESOURCE,
        );
        let gpu = gpu_function(f.root(), "0000:00:06.0").unwrap();
        assert_eq!(bar1_bytes(&gpu), Ok(32 << 30));
    }

    #[test]
    fn iommu_groups_and_their_type() {
        let f = Fixture::new();
        f.pci_device("pci0000:00/0000:00:06.0", 0);
        let gpu = gpu_function(f.root(), "0000:00:06.0").unwrap();
        assert_eq!(iommu_group(&gpu), None);
        f.file("sys/kernel/iommu_groups/13/type", "DMA-FQ\n");
        f.link(
            "sys/devices/pci0000:00/0000:00:06.0/iommu_group",
            "../../../kernel/iommu_groups/13",
        );
        let group = iommu_group(&gpu).unwrap();
        assert_eq!(group.group, "13");
        assert!(group.translated());
        f.file("sys/kernel/iommu_groups/13/type", "identity\n");
        assert!(!iommu_group(&gpu).unwrap().translated());
    }
}
