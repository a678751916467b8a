//! An offer seen before it is taken ([`Listener::accept`]): the receiver learns who sends
//! how many bytes under what name, and only then says where they go (bytes of ours,
//! memory of its own of exactly that size, GPU memory) or declines. This is how a
//! receiver takes a transfer whose size it does not know beforehand into a buffer it
//! allocates for it, and how it refuses what it does not want before a byte moves.
//!
//! The sender waits for the answer as for any receiver's accept: the caller has the
//! listener's `timeout` to decide, after which the offer is declined for it.

use super::error::{Error, ErrorKind};
use super::receive::{Listener, Received};
use crate::engine::RecvMemory;
use crate::memory::lent::{AskCaller, Decision, LentPlace, LentTarget, OfferSeen};
use crate::transfer::RecvReport;
use std::net::SocketAddr;
use std::ptr::NonNull;
use std::sync::mpsc;
use std::time::Duration;

/// An admitted offer waiting for its receiver's decision. Dropping it declines it, and
/// returns once its serve has ended, as [`decline`](Incoming::decline) does.
#[derive(Debug)]
pub struct Incoming {
    seen: OfferSeen,
    answer: mpsc::SyncSender<Decision>,
    /// The serve's result, sent once when it ends (after the transfer, or the decline).
    ended: mpsc::Receiver<Result<RecvReport, Error>>,
    /// Taken (or declined) already: nothing left for `Drop` to do.
    decided: bool,
    /// How long the end of a declined serve is waited for at most.
    within: Duration,
}

impl Drop for Incoming {
    fn drop(&mut self) {
        if self.decided {
            return;
        }
        // Declined, and its serve waited for: a next `accept` must not start while this
        // one's listener is still being put away, or the two would take each other's
        // offers (an offer heard by the ending one was held where the new one no
        // longer looked, and its sender waited out its timeout).
        let _ = self.answer.send(Decision::Decline);
        let _ = self.ended.recv_timeout(self.within);
    }
}

impl Listener {
    /// Wait for the next sender's offer (as long as [`Options::wait`](super::Options)
    /// says) and hand it over before anything is allocated or accepted for it: its
    /// size, name and peer; then [`Incoming::receive`], [`Incoming::receive_into`] or
    /// [`Incoming::decline`]. Offers beyond `max_bytes` are refused before they are
    /// shown.
    ///
    /// # Errors
    /// No sender came within the wait ([`ErrorKind::TimedOut`]); the serve could not
    /// start (out of threads or descriptors).
    pub fn accept(&self) -> Result<Incoming, Error> {
        let listener = self.try_clone()?;
        let (offers, offered) = mpsc::channel();
        let (end, ended) = mpsc::channel();
        let within = self.options().timeout;
        let max_bytes = self.options().max_bytes;
        std::thread::Builder::new()
            .name("accept".into())
            .spawn(move || {
                let memory = RecvMemory::Ask(AskCaller { offers, within });
                let served = listener.serve_one(&memory, None, max_bytes);
                // The result first, then the asking end: a caller that sees the offers'
                // channel close finds the result waiting.
                let _ = end.send(served);
                drop(memory);
            })
            .map_err(|e| {
                Error::new(
                    ErrorKind::Other,
                    format!("cannot start the receive's thread: {e}"),
                )
            })?;
        match offered.recv() {
            Ok((seen, answer)) => Ok(Incoming {
                seen,
                answer,
                ended,
                decided: false,
                // The refusal is one write; the serve then puts its listener away.
                within: within + Duration::from_secs(1),
            }),
            Err(_) => Err(match ended.recv() {
                Ok(Err(e)) => e,
                _ => Error::new(ErrorKind::Other, "the receive ended without an offer"),
            }),
        }
    }
}

impl Incoming {
    /// The sender's address.
    pub fn peer(&self) -> SocketAddr {
        self.seen.peer
    }

    /// The transfer's size in bytes: memory to receive it into holds exactly this.
    pub fn len(&self) -> u64 {
        self.seen.bytes
    }

    /// Whether the transfer is empty (never: senders offer at least one byte).
    pub fn is_empty(&self) -> bool {
        self.seen.bytes == 0
    }

    /// The sender's chunk size (one frame, one CRC32C each).
    pub fn chunk(&self) -> u64 {
        self.seen.chunk
    }

    /// The sender's name for the transfer, if it gave one and it is known before the
    /// transfer is taken: over TCP it comes with the offer; over RDMA verbs it follows
    /// the accept, so it is `None` here and the receive's report has it
    /// (`integrity.name`).
    pub fn name(&self) -> Option<&str> {
        self.seen.name.as_deref()
    }

    /// Take the transfer into bytes of the library's (allocated now, of the offered
    /// size), handed back if every check passed.
    ///
    /// # Errors
    /// As for [`Listener::receive`]; the offer was declined for taking longer than the
    /// timeout to decide.
    pub fn receive(self) -> Result<Received, Error> {
        let len = usize::try_from(self.seen.bytes).map_err(|_| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("{} bytes do not fit this machine's memory", self.seen.bytes),
            )
        })?;
        let name = self.seen.name.clone();
        let mut bytes = vec![0u8; len];
        let report = self.receive_into(&mut bytes)?;
        Ok(Received {
            name,
            bytes,
            report,
        })
    }

    /// Take the transfer in place into `buf`, which must hold exactly [`len`](Self::len)
    /// bytes (else the offer is declined and nothing is written).
    ///
    /// # Errors
    /// `buf` is not of the offered size ([`ErrorKind::InvalidArgument`]); as for
    /// [`Listener::receive_into`].
    pub fn receive_into(self, buf: &mut [u8]) -> Result<RecvReport, Error> {
        self.check_len(buf.len())?;
        let ptr = NonNull::new(buf.as_mut_ptr()).ok_or_else(|| {
            Error::new(ErrorKind::InvalidArgument, "an empty buffer cannot receive")
        })?;
        // SAFETY: `buf` is borrowed mutably for this call, valid for reads and writes of
        // its length and reached by nobody else meanwhile; `receive_lent` returns only
        // after every use of it has ended.
        unsafe { self.receive_lent(LentPlace::Host(ptr), buf.len()) }
    }

    /// Take the transfer in place into GPU memory of the caller's, checked there by the
    /// checksum kernel; `buf` holds exactly [`len`](Self::len) bytes.
    ///
    /// # Errors
    /// As for [`receive_into`](Self::receive_into).
    #[cfg(feature = "cuda")]
    pub fn receive_into_device(
        self,
        buf: &mut crate::gpu::allocations::DeviceBuffer,
    ) -> Result<RecvReport, Error> {
        use crate::gpu::context::GpuMemory;
        self.check_len(buf.len())?;
        let place = LentPlace::Device {
            ordinal: buf.gpu().ordinal(),
            ptr: buf.device_ptr(),
        };
        // SAFETY: `buf` is borrowed mutably for this call: device memory of its GPU's
        // primary context, allocated until dropped (which the borrow prevents), reached by
        // nobody else meanwhile; `receive_lent` returns only after every use has ended.
        unsafe { self.receive_lent(place, buf.len()) }
    }

    /// Take the transfer in place into `len` bytes at `place` (the Python module's
    /// buffers and tensors).
    ///
    /// # Safety
    /// As for [`LentTarget::new`]: the memory is valid for reads and writes of `len`
    /// bytes and touched by nothing else until this returns (it returns only after every
    /// use of the memory has ended).
    ///
    /// # Errors
    /// As for [`receive_into`](Self::receive_into).
    pub unsafe fn receive_lent(
        mut self,
        place: LentPlace,
        len: usize,
    ) -> Result<RecvReport, Error> {
        self.check_len(len)?;
        self.decided = true;
        // SAFETY: the caller's contract, passed on; `returned` is waited for below,
        // whatever the serve did.
        let (target, returned) = unsafe { LentTarget::new(place, len) };
        // A serve that stopped waiting (the timeout passed) gives the target back here,
        // dropped with the failed send or with the channel.
        let _ = self.answer.send(Decision::Into(target));
        let served = self.ended.recv().unwrap_or_else(|_| {
            Err(Error::new(
                ErrorKind::Other,
                "the receive's thread ended without a word",
            ))
        });
        returned.wait();
        // After a decision, a decline is the serve's own: it stopped waiting for the
        // decision (the timeout passed). Other refusals (admission's) say what they are.
        let declined = crate::wire::RejectReason::Declined.to_string();
        served.map_err(|e| match e.kind() {
            ErrorKind::Rejected if e.message().ends_with(&declined) => Error::new(
                ErrorKind::TimedOut,
                format!(
                    "the offer from {} was declined: it was not taken within the listener's timeout",
                    self.seen.peer
                ),
            ),
            _ => e,
        })
    }

    /// Refuse the transfer: the sender is told its receiver declined it. Returns once
    /// the serve has ended.
    pub fn decline(self) {
        // Drop declines and waits.
        drop(self);
    }

    fn check_len(&self, len: usize) -> Result<(), Error> {
        match len as u64 == self.seen.bytes {
            true => Ok(()),
            false => Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "the offer is {} bytes and the buffer {len}: a buffer of exactly the offer's size takes it",
                    self.seen.bytes
                ),
            )),
        }
    }
}
