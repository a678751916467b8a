//! The device list (`ibv_get_device_list`) and device contexts this program opens itself
//! (`ibv_open_device`): for `host info`'s queries, the NIC probe, and a connection's
//! watch on the device's asynchronous events. (The contexts of connections are the RDMA
//! CM's, reached through their ids.)

use super::{c_str, RdmaError};
use rdma_sys::*;
use std::ptr::NonNull;

/// The device list, freed when dropped.
pub(crate) struct DeviceList {
    raw: NonNull<*mut ibv_device>,
    len: usize,
}

impl DeviceList {
    /// Every RDMA device of the machine; `NoDevice` where the kernel has no RDMA support.
    pub fn get() -> Result<DeviceList, RdmaError> {
        let mut n: libc::c_int = 0;
        // SAFETY: valid out-pointer; returns an owned array or null with errno set.
        let raw = unsafe { ibv_get_device_list(&mut n) };
        match NonNull::new(raw) {
            Some(raw) => Ok(DeviceList {
                raw,
                len: n.max(0) as usize,
            }),
            None => match super::last_errno() {
                // ENOSYS: the kernel has no RDMA support at all.
                libc::ENOSYS | libc::ENODEV | libc::ENOENT | 0 => Err(RdmaError::NoDevice),
                errno => Err(RdmaError::verb("ibv_get_device_list", "", errno)),
            },
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The devices' names ("rxe0", "mlx5_0").
    pub fn names(&self) -> Vec<String> {
        self.devices().map(|(_, name)| name).collect()
    }

    /// Open the device called `name`.
    pub fn open(&self, name: &str) -> Result<Context, RdmaError> {
        let dev = self
            .devices()
            .find(|(_, n)| n == name)
            .map(|(dev, _)| dev)
            .ok_or_else(|| RdmaError::InvalidArgument(format!("no RDMA device {name}")))?;
        // SAFETY: a device of this live list; returns an owned context or null with
        // errno set.
        let ctx = unsafe { ibv_open_device(dev) };
        NonNull::new(ctx)
            .map(Context)
            .ok_or_else(|| RdmaError::last("ibv_open_device", || name))
    }

    fn devices(&self) -> impl Iterator<Item = (*mut ibv_device, String)> + '_ {
        (0..self.len).map(move |i| {
            // SAFETY: the list holds `len` valid device pointers while it is not freed.
            let dev = unsafe { *self.raw.as_ptr().add(i) };
            // SAFETY: a device of the live list; the name is owned by the device.
            let name = c_str(unsafe { ibv_get_device_name(dev) }, "?");
            (dev, name)
        })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: obtained from ibv_get_device_list, freed once; open contexts keep their
        // devices alive independently.
        unsafe { ibv_free_device_list(self.raw.as_ptr()) };
    }
}

/// A device context of our own, closed when dropped (after whatever was made on it).
pub(crate) struct Context(NonNull<ibv_context>);

impl Context {
    /// Open the device called `name`.
    pub fn open_named(name: &str) -> Result<Context, RdmaError> {
        DeviceList::get()?.open(name)
    }

    pub fn as_ptr(&self) -> *mut ibv_context {
        self.0.as_ptr()
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: opened by ibv_open_device, closed once; everything made on it (a probe's
        // PD) is dropped before it by its owner's declaration order.
        unsafe { ibv_close_device(self.0.as_ptr()) };
    }
}
