//! `ibv_pd`: the protection domain memory regions and queue pairs of a connection share.

use super::{CmId, RdmaError};
use rdma_sys::*;
use std::ptr::NonNull;
use std::rc::Rc;

/// A protection domain on the device of a CM id. Keeps the id (and so the device
/// context the CM opened for it) alive.
pub struct ProtectionDomain {
    raw: NonNull<ibv_pd>,
    id: Rc<CmId>,
}

impl ProtectionDomain {
    pub fn new(id: &Rc<CmId>) -> Result<Rc<Self>, RdmaError> {
        let verbs = id.verbs()?;
        // SAFETY: a valid device context, kept alive by `id`.
        let raw = unsafe { ibv_alloc_pd(verbs.as_ptr()) };
        match NonNull::new(raw) {
            Some(raw) => Ok(Rc::new(ProtectionDomain {
                raw,
                id: id.clone(),
            })),
            None => Err(RdmaError::last("ibv_alloc_pd", || {
                id.device_name().unwrap_or_default()
            })),
        }
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_pd {
        self.raw.as_ptr()
    }

    pub fn id(&self) -> &Rc<CmId> {
        &self.id
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every MR and QP of this PD holds an Rc to it, so none is left.
        unsafe { ibv_dealloc_pd(self.raw.as_ptr()) };
    }
}
