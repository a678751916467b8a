//! Fixture file-system trees for the sysfs readers' tests, in a temporary directory that
//! is removed when the fixture drops.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

pub(crate) struct Fixture {
    root: PathBuf,
}

impl Fixture {
    pub fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "host-sysfs-fixture-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("create the fixture root");
        Fixture {
            root: root.canonicalize().expect("canonical fixture root"),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn dir(&self, relative: &str) {
        std::fs::create_dir_all(self.root.join(relative)).expect("create a fixture dir");
    }

    pub fn file(&self, relative: &str, text: &str) {
        let path = self.root.join(relative);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("create parents");
        std::fs::write(path, text).expect("write a fixture file");
    }

    /// A symlink at `relative` pointing to `target` (relative to the link's directory,
    /// as in the real sysfs).
    pub fn link(&self, relative: &str, target: &str) {
        let path = self.root.join(relative);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("create parents");
        let _ = std::fs::remove_file(&path);
        std::os::unix::fs::symlink(target, path).expect("create a fixture symlink");
    }

    /// A PCI device at `sys/devices/<chain>` with its `numa_node`, and its
    /// `sys/bus/pci/devices/<address>` link.
    pub fn pci_device(&self, chain: &str, numa_node: i32) {
        self.file(
            &format!("sys/devices/{chain}/numa_node"),
            &format!("{numa_node}\n"),
        );
        let address = chain.rsplit('/').next().expect("a device");
        self.link(
            &format!("sys/bus/pci/devices/{address}"),
            &format!("../../../devices/{chain}"),
        );
    }

    /// An RDMA device `sys/class/infiniband/<name>`, with a `device` link to the PCI
    /// device at `sys/devices/<chain>` (none: a software device).
    pub fn nic(&self, name: &str, chain: Option<&str>) {
        self.dir(&format!("sys/class/infiniband/{name}"));
        if let Some(chain) = chain {
            self.link(
                &format!("sys/class/infiniband/{name}/device"),
                &format!("../../../devices/{chain}"),
            );
        }
    }

    /// Port `port` of RDMA device `name`, with the files the kernel writes: `state`
    /// ("4: ACTIVE"), `rate` ("400 Gb/sec (4X NDR)"; none: the kernel could not state
    /// one) and `link_layer`.
    pub fn ib_port(&self, name: &str, port: u8, state: &str, rate: Option<&str>, layer: &str) {
        let dir = format!("sys/class/infiniband/{name}/ports/{port}");
        self.file(&format!("{dir}/state"), &format!("{state}\n"));
        if let Some(rate) = rate {
            self.file(&format!("{dir}/rate"), &format!("{rate}\n"));
        }
        self.file(&format!("{dir}/link_layer"), &format!("{layer}\n"));
    }

    /// The two RDMA devices the rails tests read: `mlx5` on the PCI device at `chain`
    /// (port 1 ACTIVE at 400 Gb/s NDR, port 2 DOWN with no rate, InfiniBand) and
    /// Soft-RoCE `rxe0` (no PCI function; port 1 ACTIVE at 2.5 Gb/s, Ethernet).
    pub fn mlx5_and_rxe(&self, mlx5: &str, chain: &str) {
        self.nic(mlx5, Some(chain));
        let (state, rate) = NDR_ACTIVE;
        self.ib_port(mlx5, 1, state, Some(rate), "InfiniBand");
        self.ib_port(mlx5, 2, "1: DOWN", None, "InfiniBand");
        self.nic("rxe0", None);
        let rate = "2.5 Gb/sec (1X SDR)";
        self.ib_port("rxe0", 1, "4: ACTIVE", Some(rate), "Ethernet");
    }
}

/// A whole machine as a fixture tree: its GPUs' bus ids, in the order CUDA numbers them.
pub(crate) struct Machine {
    pub fixture: Fixture,
    pub gpus: Vec<String>,
}

/// An active 400G InfiniBand port 1 (ConnectX-7, NDR), as the kernel states it.
const NDR_ACTIVE: (&str, &str) = ("4: ACTIVE", "400 Gb/sec (4X NDR)");

impl Machine {
    /// DGX-like: 8 GPUs and 8 single-port 400G NICs behind 4 PCIe switches, 2 GPUs and
    /// 2 NICs on each switch, two switches per CPU socket (NUMA nodes 0 and 1). Each
    /// switch hangs off a host bridge of its own (`pci0000:00`, `pci0000:20`;
    /// `pci0000:80`, `pci0000:a0`): root port, switch upstream port, one downstream
    /// port per device. GPUs 2s and 2s+1 and NICs `mlx5_{2s}` and `mlx5_{2s+1}` share
    /// switch s (PIX); the other switch of the socket is NODE away, the other socket SYS
    /// (the pattern `nvidia-smi topo -m` shows on such machines).
    pub fn dgx_like() -> Machine {
        let f = Fixture::new();
        let mut gpus = Vec::new();
        for switch in 0..4u32 {
            let host = 0x20 * switch + if switch < 2 { 0 } else { 0x40 };
            let numa = if switch < 2 { 0 } else { 1 };
            let root = format!("0000:{host:02x}:01.0");
            let bus = host + 0x10;
            let upstream = format!("0000:{bus:02x}:00.0");
            let top = format!("pci0000:{host:02x}/{root}/{upstream}");
            // Downstream ports 0..3 on bus+1, one device below each on bus+2..bus+5.
            let below = |port: u32| {
                format!(
                    "{top}/0000:{:02x}:{port:02x}.0/0000:{:02x}:00.0",
                    bus + 1,
                    bus + 2 + port
                )
            };
            for g in 0..2 {
                let chain = below(g);
                f.pci_device(&chain, numa);
                gpus.push(chain.rsplit('/').next().expect("a device").to_string());
            }
            for n in 0..2 {
                let chain = below(2 + n);
                let name = format!("mlx5_{}", 2 * switch + n);
                f.pci_device(&chain, numa);
                f.nic(&name, Some(&chain));
                f.ib_port(&name, 1, NDR_ACTIVE.0, Some(NDR_ACTIVE.1), "InfiniBand");
            }
        }
        Machine { fixture: f, gpus }
    }

    /// GB200-like: one compute tray, 2 Grace CPUs (NUMA nodes 0 and 1) and 4 GPUs, GPUs
    /// 0 and 1 on the first Grace, 2 and 3 on the second, with 4 single-port 400G NICs,
    /// two on each Grace. The GPUs hang off the Grace CPUs through NVLink-C2C and show
    /// in PCI domains of their own (`0008`, `0009`, `0018`, `0019`), each directly on a
    /// root port; the NICs sit on Grace root ports in other domains (`0000`, `0002`,
    /// `0010`, `0012`). No GPU shares a PCIe switch, or even a host bridge, with any
    /// NIC: a rule that looks for a shared switch has nothing to go on, and only the
    /// NUMA node tells the near NICs from the far ones. The bus numbers are this
    /// fixture's own; the layout follows what is published of the tray (docs/hardware.md).
    pub fn gb200_like() -> Machine {
        let f = Fixture::new();
        let mut gpus = Vec::new();
        for (domain, numa) in [(0x0008, 0), (0x0009, 0), (0x0018, 1), (0x0019, 1)] {
            let chain = format!("pci{domain:04x}:00/{domain:04x}:00:00.0/{domain:04x}:01:00.0");
            f.pci_device(&chain, numa);
            gpus.push(format!("{domain:04x}:01:00.0"));
        }
        for (n, (domain, numa)) in [(0x0000, 0), (0x0002, 0), (0x0010, 1), (0x0012, 1)]
            .into_iter()
            .enumerate()
        {
            let chain = format!("pci{domain:04x}:00/{domain:04x}:00:00.0/{domain:04x}:01:00.0");
            let name = format!("mlx5_{n}");
            f.pci_device(&chain, numa);
            f.nic(&name, Some(&chain));
            f.ib_port(&name, 1, NDR_ACTIVE.0, Some(NDR_ACTIVE.1), "InfiniBand");
        }
        Machine { fixture: f, gpus }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
