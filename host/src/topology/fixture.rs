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
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
