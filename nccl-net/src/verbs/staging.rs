//! Staging buffers of a verbs receive comm: a receive posted for a message NCCL may send
//! under its LL or LL128 protocol (`integrity::must_stage`) is written by the peer into
//! one of these, registered on the comm's protection domain, and copied into NCCL's
//! buffer only once its CRC32C passed, because the receiving GPU reads NCCL's buffer as
//! the bytes land under those protocols, before `test` could say the message is bad.
//!
//! Such a receive is never let land in NCCL's buffer instead: when the pool holds
//! [`STAGING_MAX`] and other receives hold buffers of it, `irecv` says busy (a null
//! request; NCCL posts it again after its `test`s gave some back).
//!
//! The memory is this comm's own, allocated once per size class and reused; it is freed
//! only when the pool is dropped, after the link (its queue pair and registrations):
//! `recv::State` declares the pool after the link.

use super::Link;
use crate::error::NetError;
use crate::log::{info, NET};
use std::ptr::NonNull;

/// The staging memory a comm holds in all while other receives hold some of it: a
/// receive that would need more waits (its `irecv` is busy). One receive that needs
/// more on its own (NCCL's LL128 buffers made very large) is given it. NCCL keeps a few
/// steps in flight per connection (8 per protocol), so this is far more than it needs.
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

/// Where one buffer of a receive is staged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pick {
    /// The pool's idle buffer of that index.
    Reuse(usize),
    /// A new buffer of that many bytes.
    New(usize),
}

/// Where each buffer of a receive that needs staging (`Some(len)`) is staged, given the
/// pool's buffers (`(len, busy)`) and the bytes it holds: the smallest idle buffer that
/// fits, each taken once, else a new one of the next power of two (at least
/// [`MIN_BUFFER`]). `None`: the new ones would take the pool past [`STAGING_MAX`] while
/// other receives hold buffers of it (the receive is to wait for them).
fn plan(pool: &[(usize, bool)], bytes: usize, lens: &[Option<usize>]) -> Option<Vec<Option<Pick>>> {
    let mut taken: Vec<bool> = pool.iter().map(|&(_, busy)| busy).collect();
    let mut new_bytes = 0usize;
    let picks: Vec<Option<Pick>> = lens
        .iter()
        .map(|len| {
            let len = (*len)?;
            let best = (0..pool.len())
                .filter(|&k| !taken[k] && pool[k].0 >= len)
                .min_by_key(|&k| pool[k].0);
            Some(match best {
                Some(k) => {
                    taken[k] = true;
                    Pick::Reuse(k)
                }
                None => {
                    let size = len.next_power_of_two().max(MIN_BUFFER);
                    new_bytes = new_bytes.saturating_add(size);
                    Pick::New(size)
                }
            })
        })
        .collect();
    let others_hold = pool.iter().any(|&(_, busy)| busy);
    match new_bytes > 0 && bytes.saturating_add(new_bytes) > STAGING_MAX && others_hold {
        true => None,
        false => Some(picks),
    }
}

/// A comm's staging buffers.
#[derive(Default)]
pub struct Staging {
    buffers: Vec<Buffer>,
    bytes: usize,
    said_full: bool,
}

// SAFETY: the buffers are plain heap memory owned by the pool; the pool lives in a comm's
// state, which is only reached under its lock (`Confined`).
unsafe impl Send for Staging {}

impl Staging {
    /// A staging buffer for each buffer of a receive that needs one (`Some(len)`: at
    /// least `len` bytes, registered for remote write on `link`), its index in the same
    /// place; or none when the pool is full and other receives hold buffers of it (the
    /// receive waits: `irecv` says busy). Nothing is taken unless all are.
    ///
    /// # Errors
    /// A registration failed (what was taken for this receive is given back).
    pub fn take_all(
        &mut self,
        link: &mut Link,
        lens: &[Option<usize>],
    ) -> Result<Option<Vec<Option<usize>>>, NetError> {
        let pool: Vec<(usize, bool)> = self.buffers.iter().map(|b| (b.len, b.busy)).collect();
        let Some(picks) = plan(&pool, self.bytes, lens) else {
            if !self.said_full {
                self.said_full = true;
                info!(NET; "receive comm from {}: {} MiB of staging buffers held by receives in flight; a further small receive waits for them (irecv busy)", link.peer, self.bytes >> 20);
            }
            return Ok(None);
        };
        let mut got = Vec::with_capacity(picks.len());
        for pick in picks {
            let k = match pick {
                None => None,
                Some(Pick::Reuse(k)) => Some(k),
                Some(Pick::New(size)) => match self.make(link, size) {
                    Ok(k) => Some(k),
                    Err(e) => {
                        self.give_all(&got);
                        return Err(e);
                    }
                },
            };
            if let Some(k) = k {
                self.buffers[k].busy = true;
            }
            got.push(k);
        }
        Ok(Some(got))
    }

    /// A new buffer of `size` bytes, registered for remote write on `link`, idle: its
    /// index.
    fn make(&mut self, link: &mut Link, size: usize) -> Result<usize, NetError> {
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
            busy: false,
        });
        Ok(self.buffers.len() - 1)
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

    /// The buffers a receive took back (its receive done, or never posted).
    pub fn give_all(&mut self, taken: &[Option<usize>]) {
        for &k in taken.iter().flatten() {
            self.buffers[k].busy = false;
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        for b in &self.buffers {
            // SAFETY: made by Box::into_raw in `make` with this length; the pool is
            // dropped after the link, so no registration or work request names it.
            drop(unsafe {
                Box::from_raw(std::ptr::slice_from_raw_parts_mut(b.ptr.as_ptr(), b.len))
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: usize = 1 << 10;
    const M: usize = 1 << 20;

    #[test]
    fn the_smallest_idle_buffer_that_fits_is_reused_and_each_only_once() {
        let pool = [
            (256 * K, false),
            (64 * K, false),
            (128 * K, true),
            (128 * K, false),
        ];
        let picks = plan(
            &pool,
            576 * K,
            &[Some(100 * K), None, Some(100 * K), Some(60 * K)],
        );
        assert_eq!(
            picks,
            Some(vec![
                Some(Pick::Reuse(3)),
                None,
                Some(Pick::Reuse(0)),
                Some(Pick::Reuse(1))
            ])
        );
        // No idle buffer fits: a new one, a power of two, at least 64 KiB.
        let picks = plan(&pool, 576 * K, &[Some(300 * K), Some(1)]);
        assert_eq!(
            picks,
            Some(vec![Some(Pick::New(512 * K)), Some(Pick::Reuse(1))])
        );
        assert_eq!(
            plan(&[], 0, &[Some(1)]),
            Some(vec![Some(Pick::New(64 * K))])
        );
    }

    #[test]
    fn a_full_pool_makes_a_receive_wait_while_others_hold_buffers() {
        // 32 MiB held by receives in flight: a receive needing a new buffer waits (it
        // must not land unstaged, where the GPU could read bytes that fail their CRC).
        let held = vec![(M, true); 32];
        assert_eq!(plan(&held, 32 * M, &[Some(64 * K)]), None);
        // One that needs none (nothing to stage) goes.
        assert_eq!(plan(&held, 32 * M, &[None]), Some(vec![None]));
        // At the cap exactly it still fits; one byte class more does not.
        let mut pool = vec![(M, true); 31];
        assert!(plan(&pool, 31 * M, &[Some(M)]).is_some());
        assert_eq!(plan(&pool, 31 * M, &[Some(M), Some(1)]), None);
        // An idle buffer that fits is reused even at the cap.
        pool.push((M, false));
        assert_eq!(
            plan(&pool, 32 * M, &[Some(M)]),
            Some(vec![Some(Pick::Reuse(31))])
        );
    }

    #[test]
    fn a_receive_alone_is_staged_whatever_it_needs() {
        // Nothing else holds a buffer: waiting would wait for ever, so a receive larger
        // than the cap (LL128 buffers made huge) is given its buffers.
        let idle = vec![(M, false); 32];
        assert_eq!(
            plan(&idle, 32 * M, &[Some(48 * M)]),
            Some(vec![Some(Pick::New(64 * M))])
        );
        assert_eq!(
            plan(&[], 0, &[Some(48 * M), Some(48 * M)]),
            Some(vec![Some(Pick::New(64 * M)), Some(Pick::New(64 * M))])
        );
    }
}
