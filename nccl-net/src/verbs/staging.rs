//! Staging buffers of a verbs receive comm: a receive posted for a message NCCL may send
//! under its LL or LL128 protocol (`integrity::must_stage`) is written by the peer into
//! one of these, registered on the comm's protection domain, and copied into NCCL's
//! buffer only once its CRC32C passed, because the receiving GPU reads NCCL's buffer as
//! the bytes land under those protocols, before `test` could say the message is bad.
//!
//! The memory is this comm's own, allocated once per size class and reused; it is freed
//! only when the pool is dropped, after the link (its queue pair and registrations):
//! `recv::State` declares the pool after the link.

use super::Link;
use crate::error::NetError;
use crate::log::warn;
use std::ptr::NonNull;

/// The staging memory a comm may hold in all: beyond it a receive lands in NCCL's buffer
/// as a large one does (with one warning). NCCL keeps a few steps in flight per
/// connection (8 per protocol), so this is far more than it needs.
pub const STAGING_MAX: usize = 32 << 20;
/// The smallest buffer made (LL steps are 64 KiB at NCCL's defaults).
const MIN_BUFFER: usize = 64 << 10;

/// One staging buffer: its memory, its registration in the link, whether a receive
/// holds it.
struct Buffer {
    ptr: NonNull<u8>,
    len: usize,
    reg: usize,
    busy: bool,
}

/// A comm's staging buffers.
#[derive(Default)]
pub struct Staging {
    buffers: Vec<Buffer>,
    bytes: usize,
    warned: bool,
}

// SAFETY: the buffers are plain heap memory owned by the pool; the pool lives in a comm's
// state, which is only reached under its lock (`Confined`).
unsafe impl Send for Staging {}

impl Staging {
    /// A buffer of at least `len` bytes, registered for remote write on `link`: its
    /// index, or none when the pool is at [`STAGING_MAX`].
    ///
    /// # Errors
    /// The registration failed.
    pub fn take(&mut self, link: &mut Link, len: usize) -> Result<Option<usize>, NetError> {
        let fits = |b: &Buffer| !b.busy && b.len >= len;
        let best = (0..self.buffers.len())
            .filter(|&k| fits(&self.buffers[k]))
            .min_by_key(|&k| self.buffers[k].len);
        if let Some(k) = best {
            self.buffers[k].busy = true;
            return Ok(Some(k));
        }
        let size = len.next_power_of_two().max(MIN_BUFFER);
        if self.bytes + size > STAGING_MAX {
            if !self.warned {
                self.warned = true;
                warn!("receive comm from {}: {} MiB of staging buffers in use; further small receives land in NCCL's buffer unstaged", link.peer, STAGING_MAX >> 20);
            }
            return Ok(None);
        }
        let memory: Box<[u8]> = vec![0u8; size].into_boxed_slice();
        let Some(ptr) = NonNull::new(Box::into_raw(memory) as *mut u8) else {
            return Err(NetError::internal("an allocation returned null"));
        };
        // SAFETY: the memory stays allocated until the pool is dropped, after the link
        // and every registration in it (the module's rule); it is read only through raw
        // pointers, after the peer's "written" frame and before any answer lets it write
        // again (`recv`).
        let reg = match unsafe { link.register(ptr.as_ptr(), size) } {
            Ok(reg) => reg,
            Err(e) => {
                // SAFETY: made by Box::into_raw above with this length, never registered.
                drop(unsafe {
                    Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr.as_ptr(), size))
                });
                return Err(e);
            }
        };
        self.bytes += size;
        self.buffers.push(Buffer {
            ptr,
            len: size,
            reg,
            busy: true,
        });
        Ok(Some(self.buffers.len() - 1))
    }

    /// Where buffer `k` is, and its remote key (the address the peer writes byte 0 at).
    pub fn remote(&self, link: &Link, k: usize) -> Result<(u64, u32), NetError> {
        let b = &self.buffers[k];
        let (rkey, base) = link.registration(b.reg)?.remote();
        debug_assert_eq!(base, b.ptr.as_ptr() as u64);
        Ok((base, rkey))
    }

    /// Buffer `k`'s memory.
    pub fn ptr(&self, k: usize) -> *mut u8 {
        self.buffers[k].ptr.as_ptr()
    }

    /// Buffer `k` back, its receive done.
    pub fn give(&mut self, k: usize) {
        self.buffers[k].busy = false;
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        for b in &self.buffers {
            // SAFETY: made by Box::into_raw in `take` with this length; the pool is
            // dropped after the link, so no registration or work request names it.
            drop(unsafe {
                Box::from_raw(std::ptr::slice_from_raw_parts_mut(b.ptr.as_ptr(), b.len))
            });
        }
    }
}
