//! What an RDMA device can register, asked rather than assumed.
//!
//! * dma-buf: NCCL's probe. `ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0)` on a fresh PD cannot
//!   register anything (fd -1); what matters is how it fails. A provider without
//!   dma-buf registration answers `EOPNOTSUPP` (rdma-core's default op) or
//!   `EPROTONOSUPPORT` (a kernel without the uverbs method); one with it looks at the fd
//!   and answers something else, usually `EBADF`.
//! * peermem: a kernel module (`nvidia_peermem`, or the older `nv_peer_mem`) that lets
//!   `ibv_reg_mr` pin GPU memory; its presence is read from `/sys/module` and
//!   `/proc/modules`, under a root path so tests can feed fixture trees.
//!
//! The facts are plain data; what to do with them is `memory_path`'s business.

use super::context::DeviceList;
use super::{errno_message, last_errno, RdmaError};
use crate::topology::pci::{rdma_device_function, PciFunction};
use rdma_sys::*;
use std::path::Path;
use std::ptr::NonNull;

/// The answer of the dma-buf registration probe.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum DmaBufProbe {
    /// The provider has `ibv_reg_dmabuf_mr`: the probe failed for another reason than
    /// "not supported" (`errno`), or it unexpectedly succeeded (`errno` none).
    Supported { errno: Option<i32> },
    /// The provider (or the kernel) lacks dma-buf registration.
    NotSupported { errno: i32 },
    /// The probe could not be made (device would not open, no PD, ...).
    Unknown { why: String },
}

impl DmaBufProbe {
    /// The verdict from a failed probe call's errno (NCCL's rule).
    pub fn from_failure(errno: i32) -> Self {
        if errno == libc::EOPNOTSUPP || errno == libc::EPROTONOSUPPORT {
            DmaBufProbe::NotSupported { errno }
        } else {
            DmaBufProbe::Supported { errno: Some(errno) }
        }
    }

    pub fn is_not_supported(&self) -> bool {
        matches!(self, DmaBufProbe::NotSupported { .. })
    }

    /// "dma-buf registration: ..." in words.
    pub fn describe(&self) -> String {
        let what = match self {
            DmaBufProbe::Supported { errno: Some(e) } => format!(
                "supported (the probe ibv_reg_dmabuf_mr with fd -1 answered {}, not EOPNOTSUPP)",
                errno_in_words(*e)
            ),
            DmaBufProbe::Supported { errno: None } => {
                "supported (the probe ibv_reg_dmabuf_mr with fd -1 unexpectedly succeeded)"
                    .to_string()
            }
            DmaBufProbe::NotSupported { errno } => format!(
                "not supported by the provider (ibv_reg_dmabuf_mr: {})",
                errno_in_words(*errno)
            ),
            DmaBufProbe::Unknown { why } => format!("unknown (could not probe: {why})"),
        };
        format!("dma-buf registration: {what}")
    }
}

/// The symbolic name of the errno values the probes meet.
pub fn errno_name(errno: i32) -> Option<&'static str> {
    Some(match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EBADF => "EBADF",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::ENOSYS => "ENOSYS",
        libc::EPROTONOSUPPORT => "EPROTONOSUPPORT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        _ => return None,
    })
}

/// "Operation not supported, EOPNOTSUPP" (or "..., errno N" for a value without a name).
pub fn errno_in_words(errno: i32) -> String {
    match errno_name(errno) {
        Some(name) => format!("{}, {name}", errno_message(errno)),
        None => format!("{}, errno {errno}", errno_message(errno)),
    }
}

/// The kernel module that lets `ibv_reg_mr` take GPU addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerMemModule {
    /// `nvidia_peermem`, shipped with the NVIDIA driver (r465+).
    NvidiaPeermem,
    /// `nv_peer_mem`, Mellanox's older out-of-tree module.
    NvPeerMem,
}

impl PeerMemModule {
    pub fn name(self) -> &'static str {
        match self {
            PeerMemModule::NvidiaPeermem => "nvidia_peermem",
            PeerMemModule::NvPeerMem => "nv_peer_mem",
        }
    }
}

/// The loaded peermem module under `root` (`/` on a real machine): a directory
/// `sys/module/<name>`, or a line of `proc/modules` starting with the name.
pub fn peermem_module(root: &Path) -> Option<PeerMemModule> {
    let modules = std::fs::read_to_string(root.join("proc/modules")).unwrap_or_default();
    [PeerMemModule::NvidiaPeermem, PeerMemModule::NvPeerMem]
        .into_iter()
        .find(|m| {
            root.join("sys/module").join(m.name()).is_dir()
                || modules
                    .lines()
                    .any(|l| l.split_whitespace().next() == Some(m.name()))
        })
}

/// [`peermem_module`] of this machine.
pub fn loaded_peermem_module() -> Option<PeerMemModule> {
    peermem_module(Path::new("/"))
}

/// "peermem: nvidia_peermem loaded" in words.
pub fn describe_peermem(module: Option<PeerMemModule>) -> String {
    match module {
        Some(m) => format!("peermem: {} loaded (ibv_reg_mr takes GPU memory)", m.name()),
        None => "peermem: not loaded (neither nvidia_peermem nor nv_peer_mem)".to_string(),
    }
}

/// Where a device sits on the PCIe tree: its function, or none (rxe, siw).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum NicLocation {
    Pci {
        function: PciFunction,
    },
    /// A software device (rxe, siw): no PCI function of its own.
    Software,
    /// sysfs could not be read.
    Unknown {
        why: String,
    },
}

impl NicLocation {
    /// The location of device `name` under `root` (`/` on a real machine).
    pub fn of(root: &Path, name: &str) -> Self {
        match rdma_device_function(root, name) {
            Ok(Some(function)) => NicLocation::Pci { function },
            Ok(None) => NicLocation::Software,
            Err(why) => NicLocation::Unknown { why },
        }
    }

    pub fn function(&self) -> Option<&PciFunction> {
        match self {
            NicLocation::Pci { function } => Some(function),
            _ => None,
        }
    }

    /// "PCI 0000:01:00.0 (/sys/devices/...)" in words.
    pub fn describe(&self) -> String {
        match self {
            NicLocation::Pci { function } => {
                format!("PCI {} ({})", function.address, function.path.display())
            }
            NicLocation::Software => "software device, no PCI function".to_string(),
            NicLocation::Unknown { why } => format!("PCI location unknown ({why})"),
        }
    }
}

/// What one RDMA device offers for GPU memory.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NicProbe {
    pub name: String,
    pub dma_buf: DmaBufProbe,
    pub location: NicLocation,
}

/// Probe every RDMA device of this machine. Errors if there is none.
pub fn probe_nics() -> Result<Vec<NicProbe>, RdmaError> {
    let list = DeviceList::get()?;
    if list.len() == 0 {
        return Err(RdmaError::NoDevice);
    }
    Ok(list
        .names()
        .into_iter()
        .map(|name| NicProbe {
            dma_buf: probe_dma_buf(&list, &name),
            location: NicLocation::of(Path::new("/"), &name),
            name,
        })
        .collect())
}

fn probe_dma_buf(list: &DeviceList, name: &str) -> DmaBufProbe {
    let unknown = |e: RdmaError| DmaBufProbe::Unknown { why: e.to_string() };
    let ctx = match list.open(name) {
        Ok(ctx) => ctx,
        Err(e) => return unknown(e),
    };
    // SAFETY: a valid, open context.
    let pd = match NonNull::new(unsafe { ibv_alloc_pd(ctx.as_ptr()) }) {
        Some(raw) => Pd(raw),
        None => return unknown(RdmaError::last("ibv_alloc_pd", || name)),
    };
    // SAFETY: a valid PD; fd -1 and length 0 register nothing, so no memory is involved.
    let mr = unsafe { ibv_reg_dmabuf_mr(pd.0.as_ptr(), 0, 0, 0, -1, 0) };
    // Read errno before anything else can overwrite it.
    let errno = last_errno();
    match NonNull::new(mr) {
        None => DmaBufProbe::from_failure(errno),
        Some(mr) => {
            // SAFETY: the region the call just returned, deregistered once.
            unsafe { ibv_dereg_mr(mr.as_ptr()) };
            DmaBufProbe::Supported { errno: None }
        }
    }
}

// The probe's PD, deallocated before its context (declaration order in `probe_dma_buf`).
struct Pd(NonNull<ibv_pd>);

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd; the probe's region (if any) is gone.
        unsafe { ibv_dealloc_pd(self.0.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::fixture::Fixture;

    #[test]
    fn nccls_rule_for_the_probes_errno() {
        assert_eq!(
            DmaBufProbe::from_failure(libc::EOPNOTSUPP),
            DmaBufProbe::NotSupported {
                errno: libc::EOPNOTSUPP
            }
        );
        assert!(DmaBufProbe::from_failure(libc::EPROTONOSUPPORT).is_not_supported());
        for other in [libc::EBADF, libc::EINVAL, libc::ENOMEM, 0] {
            assert_eq!(
                DmaBufProbe::from_failure(other),
                DmaBufProbe::Supported { errno: Some(other) }
            );
        }
    }

    #[test]
    fn probe_results_in_words() {
        assert_eq!(
            DmaBufProbe::from_failure(libc::EOPNOTSUPP).describe(),
            "dma-buf registration: not supported by the provider (ibv_reg_dmabuf_mr: Operation not supported, EOPNOTSUPP)"
        );
        assert_eq!(
            DmaBufProbe::from_failure(libc::EBADF).describe(),
            "dma-buf registration: supported (the probe ibv_reg_dmabuf_mr with fd -1 answered Bad file descriptor, EBADF, not EOPNOTSUPP)"
        );
        let unknown = DmaBufProbe::Unknown {
            why: "ibv_alloc_pd(mlx5_0): Cannot allocate memory (errno 12)".into(),
        };
        assert_eq!(
            unknown.describe(),
            "dma-buf registration: unknown (could not probe: ibv_alloc_pd(mlx5_0): Cannot allocate memory (errno 12))"
        );
        assert_eq!(
            errno_in_words(4095),
            format!("{}, errno 4095", errno_message(4095))
        );
    }

    #[test]
    fn peermem_by_sys_module_or_proc_modules() {
        let f = Fixture::new();
        assert_eq!(peermem_module(f.root()), None);
        f.file(
            "proc/modules",
            "nvidia_uvm 1 0 - Live 0x0\nnv_peer_mem_x 1 0 - Live 0x0\n",
        );
        assert_eq!(peermem_module(f.root()), None, "a prefix is not the module");
        f.file(
            "proc/modules",
            "nv_peer_mem 16384 0 - Live 0x0000000000000000\n",
        );
        assert_eq!(peermem_module(f.root()), Some(PeerMemModule::NvPeerMem));
        f.dir("sys/module/nvidia_peermem");
        assert_eq!(peermem_module(f.root()), Some(PeerMemModule::NvidiaPeermem));
        assert_eq!(
            describe_peermem(Some(PeerMemModule::NvidiaPeermem)),
            "peermem: nvidia_peermem loaded (ibv_reg_mr takes GPU memory)"
        );
        assert_eq!(
            describe_peermem(None),
            "peermem: not loaded (neither nvidia_peermem nor nv_peer_mem)"
        );
    }

    #[test]
    fn nic_locations_in_words() {
        let f = Fixture::new();
        f.pci_device("pci0000:00/0000:00:02.0/0000:02:00.0", 0);
        f.nic("mlx5_0", Some("pci0000:00/0000:00:02.0/0000:02:00.0"));
        f.nic("rxe0", None);
        let hw = NicLocation::of(f.root(), "mlx5_0");
        assert_eq!(hw.function().unwrap().address, "0000:02:00.0");
        assert!(
            hw.describe().starts_with("PCI 0000:02:00.0 ("),
            "{}",
            hw.describe()
        );
        let sw = NicLocation::of(f.root(), "rxe0");
        assert_eq!(sw.describe(), "software device, no PCI function");
        let missing = NicLocation::of(f.root(), "mlx5_9");
        assert!(
            missing
                .describe()
                .starts_with("PCI location unknown (no RDMA device mlx5_9"),
            "{}",
            missing.describe()
        );
    }
}
