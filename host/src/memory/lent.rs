//! Memory a library caller lends for one transfer, used in place (no copy into a buffer
//! of ours): bytes of its own to send ([`LentBytes`]), and host or GPU memory to receive
//! into ([`LentTarget`]), given back when the transfer has ended.

use super::{DataPath, HostBuffer, Registrable, RegistrationTarget, SendSource};
use anyhow::Result;
use std::marker::PhantomData;
use std::ops::Range;
use std::ptr::NonNull;
use std::time::Instant;

/// A caller's bytes as a [`SendSource`], for the lifetime `'a` of the borrow.
///
/// Inside is a [`HostBuffer`] over the caller's memory that is never written: it is
/// private here, and only the read-only traits reach it.
pub struct LentBytes<'a> {
    inner: HostBuffer,
    _borrow: PhantomData<&'a [u8]>,
}

impl<'a> LentBytes<'a> {
    /// `bytes`, to be sent. Empty slices are allowed here; the sender refuses them
    /// ("nothing to transfer").
    pub fn new(bytes: &'a [u8]) -> LentBytes<'a> {
        let ptr = NonNull::new(bytes.as_ptr().cast_mut()).unwrap_or(NonNull::dangling());
        // SAFETY: the slice is valid for reads of its length for 'a, which this value
        // does not outlive (PhantomData). It is never written: `inner` is private and
        // only reached through SendSource and Registrable, which read (a registration
        // of a send source gets no remote write, which is `unsafe` to ask for, and no
        // receive is ever posted into it: the NIC only reads it).
        // Others may read the bytes meanwhile (a shared borrow), which reading allows.
        let inner = unsafe { HostBuffer::borrowed(ptr, bytes.len()) };
        LentBytes {
            inner,
            _borrow: PhantomData,
        }
    }
}

// SAFETY: delegated to the HostBuffer over the caller's bytes, whose memory lives for 'a.
unsafe impl Registrable for LentBytes<'_> {
    fn target(&self) -> RegistrationTarget<'_> {
        self.inner.target()
    }
}

// SAFETY: delegated: the ranges are those of the HostBuffer over the caller's bytes.
unsafe impl SendSource for LentBytes<'_> {
    fn len(&self) -> usize {
        SendSource::len(&self.inner)
    }

    fn memory(&self) -> &dyn Registrable {
        self
    }

    fn prepare_chunk(&self, offset: usize, len: usize, deadline: Instant) -> Result<Range<usize>> {
        self.inner.prepare_chunk(offset, len, deadline)
    }

    fn first_values(&self, count: usize) -> Result<Vec<i32>> {
        self.inner.first_values(count)
    }

    fn path(&self) -> DataPath {
        DataPath::HostMemory
    }

    fn copy_out(&self, offset: usize, dest: &mut [u8]) -> Result<()> {
        SendSource::copy_out(&self.inner, offset, dest)
    }
}

/// Where a [`LentTarget`] lies.
#[derive(Debug, Clone, Copy)]
pub enum LentPlace {
    Host(NonNull<u8>),
    /// GPU memory of device `ordinal`'s primary context.
    Device {
        ordinal: u32,
        ptr: u64,
    },
}

/// Memory a caller lends for one receive, as raw parts that may go to the thread that
/// serves the transfer. The receiver turns it into its landing there; `in_use` goes
/// with the landing, so the lender learns ([`Returned::wait`]) when nothing touches the
/// memory any more.
#[derive(Debug)]
pub struct LentTarget {
    pub place: LentPlace,
    pub len: usize,
    in_use: std::sync::mpsc::Sender<()>,
}

// SAFETY: raw parts only; whoever made the value with `LentTarget::new` promised that the
// memory is used by nothing else until every use ends (`Returned::wait`), whatever
// thread uses it.
unsafe impl Send for LentTarget {}

/// The lender's end of a [`LentTarget`].
#[derive(Debug)]
pub struct Returned(std::sync::mpsc::Receiver<()>);

impl Returned {
    /// Wait until the target and everything made from it are gone (dropped): the memory
    /// is the lender's alone again. Every user of it is bounded by the transfer's
    /// timeouts, so this returns.
    pub fn wait(self) {
        // Nothing is ever sent: recv returns when the last Sender is dropped.
        let _ = self.0.recv();
    }
}

impl LentTarget {
    /// Lend `len` bytes at `place`.
    ///
    /// # Safety
    /// The memory must be valid for reads and writes of `len` bytes (device memory of
    /// that device's primary context, for [`LentPlace::Device`]), and be read or written
    /// by nothing else from this call until [`Returned::wait`] returns, and stay
    /// allocated until then.
    pub unsafe fn new(place: LentPlace, len: usize) -> (LentTarget, Returned) {
        let (in_use, returned) = std::sync::mpsc::channel();
        (LentTarget { place, len, in_use }, Returned(returned))
    }

    /// The token the landing keeps while it uses the memory.
    pub fn in_use(&self) -> std::sync::mpsc::Sender<()> {
        self.in_use.clone()
    }
}

/// An offer as a library caller sees it before anything is allocated or accepted for it
/// (`api::Listener::accept`): who sends, how much, and its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfferSeen {
    pub peer: std::net::SocketAddr,
    /// The transfer's size in bytes: a target lent for it must hold exactly this.
    pub bytes: u64,
    pub chunk: u64,
    /// The sender's `--name`, checked already (it stays inside a directory). Over verbs
    /// it follows the accept (the connection's private data has no room for it): `None`.
    pub name: Option<String>,
}

/// What the caller does with an [`OfferSeen`].
#[derive(Debug)]
pub enum Decision {
    /// Receive it into this memory.
    Into(LentTarget),
    /// Refuse it: the sender is told "declined".
    Decline,
}

/// A receive that shows its caller the first offer admitted and waits, at most
/// `within`, for the caller's [`Decision`]; no answer in time, or a caller gone, is a
/// decline.
#[derive(Debug)]
pub struct AskCaller {
    pub offers: std::sync::mpsc::Sender<(OfferSeen, std::sync::mpsc::SyncSender<Decision>)>,
    pub within: std::time::Duration,
}

impl AskCaller {
    /// Show `seen` to the caller and wait for its answer: the memory to receive into,
    /// or `None` to decline.
    pub fn ask(&self, seen: OfferSeen) -> Option<LentTarget> {
        let (answer, answered) = std::sync::mpsc::sync_channel(1);
        self.offers.send((seen, answer)).ok()?;
        match answered.recv_timeout(self.within) {
            Ok(Decision::Into(target)) => Some(target),
            Ok(Decision::Decline) | Err(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lent_bytes_read_back_as_they_are_and_out_of_range_is_an_error() {
        let data: Vec<u8> = (0..=255u8).cycle().take(10_001).collect();
        let lent = LentBytes::new(&data[1..]);
        assert_eq!(SendSource::len(&lent), 10_000);
        let mut out = vec![0u8; 100];
        lent.copy_out(9_900, &mut out).unwrap();
        assert_eq!(out, &data[9_901..]);
        assert!(lent.copy_out(9_901, &mut out).is_err());
        let range = lent.prepare_chunk(4_000, 1_000, Instant::now()).unwrap();
        assert_eq!(range, 4_000..5_000);
        assert!(lent.prepare_chunk(9_500, 1_000, Instant::now()).is_err());
        // The registration is the caller's own memory, unaligned as it is.
        match lent.memory().target() {
            RegistrationTarget::Host { ptr, len } => {
                assert_eq!(ptr.as_ptr().cast_const(), data[1..].as_ptr());
                assert_eq!(len, 10_000);
            }
            other => panic!("{other:?}"),
        }
        drop(lent);
        // Nothing was freed or written: the owner's bytes are as they were.
        assert_eq!(data[1], 1);
    }

    #[test]
    fn a_lender_waits_until_the_target_and_every_token_are_gone() {
        let mut memory = [0u8; 16];
        let ptr = NonNull::new(memory.as_mut_ptr()).unwrap();
        // SAFETY: `memory` outlives the wait below and nothing else touches it meanwhile.
        let (target, returned) = unsafe { LentTarget::new(LentPlace::Host(ptr), 16) };
        let token = target.in_use();
        drop(target);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            returned.wait();
            done_tx.send(()).unwrap();
        });
        // The token still lives: the lender must not have its memory back yet.
        assert!(done_rx
            .recv_timeout(std::time::Duration::from_millis(100))
            .is_err());
        drop(token);
        done_rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("the wait ended once the last token was dropped");
        waiter.join().unwrap();
        // The memory is the lender's again.
        memory[0] = 1;
        assert_eq!(memory[..2], [1, 0]);
    }
}
