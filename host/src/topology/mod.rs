//! Where devices sit on the PCIe tree, read from sysfs: the facts behind "is this NIC
//! close enough to this GPU for GPUDirect RDMA".
//!
//! Every reader takes the root of the file system (`/` on a real machine) so the tests
//! build fixture trees in a temporary directory, with the same symlinks as the real
//! `/sys` (`/sys/bus/pci/devices/0000:01:00.0 -> ../../../devices/pci0000:00/...`). The
//! classification itself ([`distance::distance`]) is a pure function of two
//! [`pci::PciFunction`]s.

pub mod distance;
pub mod pci;

#[cfg(test)]
pub(crate) mod fixture;

pub use distance::{distance, PciDistance};
pub use pci::{
    bar1_bytes, gpu_function, iommu_group, rdma_device_function, IommuGroup, PciFunction,
};
