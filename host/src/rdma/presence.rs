//! When no RDMA device is found: where to look, in the order an administrator would.
//! The kernel may see a device that this process cannot open (no `/dev/infiniband`, as
//! in a container), or the NIC's driver may be loaded without the user-space access
//! modules, or no driver at all. The facts come from sysfs, `/dev` and `/proc/modules`;
//! the advice is a pure function of them, tested below.

use std::path::Path;

/// Kernel modules that give user space RDMA access (libibverbs needs `ib_uverbs`,
/// librdmacm `rdma_ucm`).
pub const ACCESS_MODULES: [&str; 2] = ["ib_uverbs", "rdma_ucm"];

/// Drivers of RDMA devices: hardware NICs, then the software ones.
pub const DRIVER_MODULES: [&str; 9] = [
    "mlx5_ib",
    "mlx4_ib",
    "irdma",
    "bnxt_re",
    "efa",
    "qedr",
    "hns_roce_hw_v2",
    "rdma_rxe",
    "siw",
];

/// What this machine shows of RDMA outside libibverbs.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct RdmaPresence {
    /// Entries of `/sys/class/infiniband`: devices the kernel has.
    pub kernel_devices: Vec<String>,
    /// `/dev/infiniband` exists (the `uverbs` and `rdma_cm` character devices).
    pub dev_infiniband: bool,
    /// Which of [`ACCESS_MODULES`] and [`DRIVER_MODULES`] are loaded (or built in).
    pub modules: Vec<String>,
}

impl RdmaPresence {
    /// This machine's facts.
    pub fn here() -> RdmaPresence {
        Self::under(Path::new("/"))
    }

    /// The facts of a system tree rooted at `root` (fixtures in tests).
    pub fn under(root: &Path) -> RdmaPresence {
        let mut kernel_devices: Vec<String> = std::fs::read_dir(root.join("sys/class/infiniband"))
            .map(|dir| {
                dir.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        kernel_devices.sort();
        let modules = ACCESS_MODULES
            .iter()
            .chain(DRIVER_MODULES.iter())
            .filter(|m| root.join("sys/module").join(m).exists())
            .map(|m| m.to_string())
            .collect();
        RdmaPresence {
            kernel_devices,
            dev_infiniband: root.join("dev/infiniband").is_dir(),
            modules,
        }
    }

    /// Why there is no usable device and what to do, most likely cause first; the last
    /// line is Soft-RoCE, for machines without RDMA hardware.
    pub fn advice(&self) -> Vec<String> {
        let loaded = |m: &str| self.modules.iter().any(|x| x == m);
        let missing_access: Vec<&str> = ACCESS_MODULES
            .iter()
            .copied()
            .filter(|m| !loaded(m))
            .collect();
        let mut lines = Vec::new();
        if !self.kernel_devices.is_empty() {
            lines.push(format!(
                "the kernel has {} ({}), but this process cannot open {}",
                if self.kernel_devices.len() == 1 {
                    "an RDMA device"
                } else {
                    "RDMA devices"
                },
                self.kernel_devices.join(", "),
                if self.kernel_devices.len() == 1 {
                    "it"
                } else {
                    "them"
                }
            ));
            if !missing_access.is_empty() {
                lines.push(format!(
                    "load the user-space access modules: modprobe {}",
                    missing_access.join(" ")
                ));
            }
            if !self.dev_infiniband {
                lines.push("/dev/infiniband is missing: in a container, pass it in (docker run --device=/dev/infiniband --cap-add=IPC_LOCK)".into());
            } else {
                lines.push("check the permissions of /dev/infiniband/uverbs* and rdma_cm, and that rdma-core's libibverbs has a provider for the device (ibv_devices lists it)".into());
            }
        } else {
            let drivers: Vec<&str> = DRIVER_MODULES
                .iter()
                .copied()
                .filter(|m| loaded(m))
                .collect();
            lines.push("look for one: `ibv_devices` or `rdma link` list RDMA devices; `lspci | grep -i -e mellanox -e infiniband -e ethernet` shows the NICs".into());
            if drivers.is_empty() {
                lines.push("no RDMA driver is loaded: load the NIC's (modprobe mlx5_ib for ConnectX; irdma, bnxt_re, efa for others)".into());
            } else {
                lines.push(format!(
                    "{} {} loaded but made no device: check `dmesg` for its errors and the NIC's firmware",
                    drivers.join(", "),
                    if drivers.len() == 1 { "is" } else { "are" }
                ));
            }
            if !missing_access.is_empty() {
                lines.push(format!(
                    "then the user-space access modules: modprobe {}",
                    missing_access.join(" ")
                ));
            }
            if !self.dev_infiniband {
                lines.push(
                    "/dev/infiniband does not exist (it appears with ib_uverbs and a device; a container needs it passed in)"
                        .into(),
                );
            }
        }
        lines.push("without RDMA hardware: Soft-RoCE (modprobe rdma_rxe; rdma link add rxe0 type rxe netdev IFACE), or --transport tcp".into());
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(devices: &[&str], dev_ib: bool, modules: &[&str]) -> tempdir::TempTree {
        let t = tempdir::TempTree::new();
        for d in devices {
            std::fs::create_dir_all(t.path().join("sys/class/infiniband").join(d)).unwrap();
        }
        if dev_ib {
            std::fs::create_dir_all(t.path().join("dev/infiniband")).unwrap();
        }
        for m in modules {
            std::fs::create_dir_all(t.path().join("sys/module").join(m)).unwrap();
        }
        t
    }

    mod tempdir {
        use std::path::{Path, PathBuf};
        pub struct TempTree(PathBuf);
        impl TempTree {
            pub fn new() -> Self {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let p = std::env::temp_dir().join(format!(
                    "rdma-presence-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&p).unwrap();
                TempTree(p)
            }
            pub fn path(&self) -> &Path {
                &self.0
            }
        }
        impl Drop for TempTree {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn nothing_at_all_says_how_to_look_first_and_soft_roce_last() {
        let t = tree(&[], false, &[]);
        let p = RdmaPresence::under(t.path());
        assert_eq!(p, RdmaPresence::default());
        let advice = p.advice();
        assert!(advice[0].starts_with("look for one: `ibv_devices` or `rdma link`"));
        assert!(advice[1].contains("modprobe mlx5_ib"), "{advice:?}");
        assert_eq!(
            advice[2],
            "then the user-space access modules: modprobe ib_uverbs rdma_ucm"
        );
        assert!(advice[3].starts_with("/dev/infiniband does not exist"));
        assert!(advice
            .last()
            .unwrap()
            .starts_with("without RDMA hardware: Soft-RoCE"));
        assert_eq!(advice.len(), 5);
    }

    #[test]
    fn a_device_the_kernel_has_but_this_process_cannot_open() {
        let t = tree(&["mlx5_0"], false, &["mlx5_ib"]);
        let p = RdmaPresence::under(t.path());
        assert_eq!(p.kernel_devices, ["mlx5_0"]);
        assert!(!p.dev_infiniband);
        let advice = p.advice();
        assert_eq!(
            advice[0],
            "the kernel has an RDMA device (mlx5_0), but this process cannot open it"
        );
        assert_eq!(
            advice[1],
            "load the user-space access modules: modprobe ib_uverbs rdma_ucm"
        );
        assert!(advice[2].contains("docker run --device=/dev/infiniband"));
        let t = tree(
            &["mlx5_0", "mlx5_1"],
            true,
            &["mlx5_ib", "ib_uverbs", "rdma_ucm"],
        );
        let advice = RdmaPresence::under(t.path()).advice();
        assert_eq!(
            advice[0],
            "the kernel has RDMA devices (mlx5_0, mlx5_1), but this process cannot open them"
        );
        assert!(advice[1].starts_with("check the permissions of /dev/infiniband"));
        assert_eq!(advice.len(), 3);
    }

    #[test]
    fn a_driver_without_a_device_points_at_dmesg() {
        let t = tree(&[], true, &["mlx5_ib", "ib_uverbs", "rdma_ucm"]);
        let advice = RdmaPresence::under(t.path()).advice();
        assert_eq!(
            advice[1],
            "mlx5_ib is loaded but made no device: check `dmesg` for its errors and the NIC's firmware"
        );
        assert_eq!(advice.len(), 3);
    }
}
