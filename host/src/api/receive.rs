//! The receiving side of the library: a bound [`Listener`] that takes one transfer at a
//! time, into bytes of its own ([`Listener::receive`]) or in place into memory the caller
//! owns ([`Listener::receive_into`], and GPU memory with `receive_into_device`).

use super::error::{Error, ErrorKind};
use super::{Options, TransportKind};
use crate::engine::serve::{
    admission_of, listen_config, serve_any, AnyOffer, KeptOffers, LibraryCall, VerbsServe,
    VerbsSide, LIBRARY_TRANSFERS_AT_ONCE,
};
use crate::engine::{RecvMemory, RecvOptions};
use crate::memory::lent::{LentPlace, LentTarget};
use crate::net::verbs::listen::VerbsListen;
use crate::server::AllowList;
use crate::transfer::store::Output;
use crate::transfer::{RecvOutcome, RecvReport};
use std::net::{SocketAddr, TcpListener};
use std::ptr::NonNull;
use std::sync::Arc;

/// A verified transfer, received into bytes of the library's.
#[derive(Debug)]
pub struct Received {
    /// The sender's `--name`, if it gave one.
    pub name: Option<String>,
    /// The bytes, verified.
    pub bytes: Vec<u8>,
    /// What was checked and repaired (the JSON `host recv --json` prints).
    pub report: RecvReport,
}

/// A bound TCP receiver (the port is taken when this returns, so a sender may start).
/// Each receive serves one transfer; call again for the next (the same port: senders
/// that come in between wait in the listen queue).
pub struct Listener {
    listener: TcpListener,
    /// Over verbs too (`transport` RDMA, or `Auto` on a machine with an RDMA device): the
    /// CM listener on the same port number, paused between receives (connect requests
    /// wait in the CM's queue), shared by the handles of [`try_clone`](Self::try_clone).
    verbs: Option<Arc<VerbsListen>>,
    /// Connections kept by senders that carry many transfers on one (an
    /// [`Endpoint`](super::Endpoint)'s), their next offers held between receives.
    kept: Arc<KeptOffers<AnyOffer>>,
    opts: Options,
}

impl Listener {
    /// Listen on `addr` (port 0: the system picks; see [`local_addr`](Self::local_addr)).
    ///
    /// # Errors
    /// The address cannot be bound (in use, not this machine's); a wait of `opts` out of
    /// range ([`Options::check_waits`]).
    pub fn bind(addr: SocketAddr, opts: &Options) -> Result<Listener, Error> {
        opts.check_waits()?;
        let listener = TcpListener::bind(addr).map_err(|e| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("cannot listen on {addr}: {e}"),
            )
        })?;
        let bound = listener
            .local_addr()
            .map_err(|e| Error::new(ErrorKind::Other, format!("the bound address: {e}")))?;
        let verbs = match opts.transport {
            TransportKind::Tcp => None,
            TransportKind::Rdma => Some(verbs_listen(bound, opts)?),
            // Where the address is on an RDMA device: else TCP alone.
            TransportKind::Auto if crate::rdma::ensure_device().is_ok() => {
                verbs_listen(bound, opts).ok()
            }
            TransportKind::Auto => None,
        };
        Ok(Listener {
            listener,
            verbs,
            kept: KeptOffers::new(),
            opts: opts.clone(),
        })
    }

    /// The transports this listener serves: TCP, and RDMA verbs where it listens there too.
    pub fn transports(&self) -> Vec<TransportKind> {
        let mut t = Vec::new();
        if self.opts.transport != TransportKind::Rdma {
            t.push(TransportKind::Tcp);
        }
        if self.verbs.is_some() {
            t.push(TransportKind::Rdma);
        }
        t
    }

    /// The bound address (the port the system picked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// The options receives use.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// The same listener with other options (a receive with its own wait, say).
    pub fn with_options(mut self, opts: &Options) -> Listener {
        self.opts = opts.clone();
        self
    }

    /// A second handle on the same bound socket (for a receive on another thread).
    ///
    /// # Errors
    /// The system refused to duplicate the socket (out of descriptors).
    pub fn try_clone(&self) -> Result<Listener, Error> {
        Ok(Listener {
            listener: self.listener.try_clone().map_err(|e| {
                Error::new(
                    ErrorKind::Other,
                    format!("cannot duplicate the listener: {e}"),
                )
            })?,
            verbs: self.verbs.clone(),
            kept: self.kept.clone(),
            opts: self.opts.clone(),
        })
    }

    /// Receive one transfer into bytes of the library's, handed back if every check
    /// passed (the report says what was checked and repaired). Waits for a sender as long
    /// as [`Options::wait`] says (`None`: as long as none comes); once one has come,
    /// every wait is bounded by `timeout` and the transfer by `min_rate`.
    ///
    /// # Errors
    /// The transfer failed or did not pass its checks, or no sender came within the wait
    /// ([`ErrorKind`] says which).
    pub fn receive(&self) -> Result<Received, Error> {
        let (to, from) = std::sync::mpsc::channel();
        let report = self.serve_one(
            &RecvMemory::Host,
            Some(Output::Memory(to)),
            self.opts.max_bytes,
        )?;
        let (name, bytes) = from.try_recv().map_err(|_| {
            Error::new(
                ErrorKind::Other,
                "the transfer verified but its bytes were not handed over",
            )
        })?;
        Ok(Received {
            name,
            bytes,
            report,
        })
    }

    /// [`receive`](Self::receive), consuming the listener (the first version's API).
    ///
    /// # Errors
    /// As for [`receive`](Self::receive).
    pub fn receive_one(self) -> Result<Received, Error> {
        self.receive()
    }

    /// Receive one transfer in place into `buf`: the bytes land where they belong, with
    /// no copy and no allocation of the data's size. Only an offer of exactly
    /// `buf.len()` bytes is taken; any other is refused (the sender gets
    /// [`ErrorKind::Rejected`]) before a byte is written, and the receive goes on waiting.
    /// On an error the bytes of `buf` are unspecified (a part may have landed).
    ///
    /// # Errors
    /// As for [`receive`](Self::receive).
    pub fn receive_into(&self, buf: &mut [u8]) -> Result<RecvReport, Error> {
        let Some(ptr) = NonNull::new(buf.as_mut_ptr()).filter(|_| !buf.is_empty()) else {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "an empty buffer cannot receive a transfer",
            ));
        };
        // SAFETY: `buf` is borrowed mutably for this call, valid for reads and writes of
        // its length, and reached by nobody else meanwhile; `receive_lent` returns only
        // after every use of it has ended (it waits for the lent target's return).
        unsafe { self.receive_lent(LentPlace::Host(ptr), buf.len()) }
    }

    /// Receive one transfer in place into GPU memory of the caller's: the chunks go
    /// through a page-locked ring into `buf` and the checksum kernel checks them there.
    /// As [`receive_into`](Self::receive_into) otherwise.
    ///
    /// # Errors
    /// As for [`receive`](Self::receive).
    #[cfg(feature = "cuda")]
    pub fn receive_into_device(
        &self,
        buf: &mut crate::gpu::allocations::DeviceBuffer,
    ) -> Result<RecvReport, Error> {
        use crate::gpu::context::GpuMemory;
        if buf.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "an empty buffer cannot receive a transfer",
            ));
        }
        let place = LentPlace::Device {
            ordinal: buf.gpu().ordinal(),
            ptr: buf.device_ptr(),
        };
        // Work of the caller's still queued on the buffer is waited for by the receiver
        // itself (the whole context, before the first byte lands: `lent_landing`).
        // SAFETY: `buf` is borrowed mutably for this call: device memory of its GPU's
        // primary context (Gpu::open's), allocated until it is dropped, which the borrow
        // prevents, and reached by nobody else meanwhile; `receive_lent` returns only
        // after every use of it has ended.
        unsafe { self.receive_lent(place, buf.len()) }
    }

    /// Receive one transfer in place into `len` bytes at `place` (the Python module's
    /// buffers and tensors).
    ///
    /// # Safety
    /// As for [`LentTarget::new`]: the memory is valid for reads and writes of `len`
    /// bytes and touched by nothing else until this returns (it returns only after every
    /// use of the memory has ended).
    ///
    /// # Errors
    /// As for [`receive`](Self::receive).
    pub unsafe fn receive_lent(&self, place: LentPlace, len: usize) -> Result<RecvReport, Error> {
        if len == 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "an empty buffer cannot receive a transfer",
            ));
        }
        // SAFETY: the caller's contract, passed on; we wait for `returned` below before
        // we return, whatever the serve did.
        let (target, returned) = unsafe { LentTarget::new(place, len) };
        let memory = RecvMemory::Lent(std::sync::Mutex::new(Some(target)));
        // Offers of any other size than the buffer's are refused by the lent memory
        // itself ("exactly N bytes"), those beyond --max-bytes before that.
        let max_bytes = self.opts.max_bytes.max(len as u64);
        let served = self.serve_one(&memory, None, max_bytes);
        // The target, if no transfer took it, goes with `memory`; one that did is held by
        // its landing until that transfer's thread has dropped it.
        drop(memory);
        returned.wait();
        served
    }

    /// Serve until one transfer was accepted; its report if every check passed.
    pub(super) fn serve_one(
        &self,
        memory: &RecvMemory,
        output: Option<Output>,
        max_bytes: u64,
    ) -> Result<RecvReport, Error> {
        // Options given since the bind (`with_options`) are checked here.
        self.opts.check_waits()?;
        let listener = self.try_clone()?.listener;
        let cfg = RecvOptions {
            bind: self.local_addr(),
            once: true,
            max_bytes,
            timeout: self.opts.timeout,
            max_connections: LIBRARY_TRANSFERS_AT_ONCE,
            // Room for one transfer of --max-bytes and the books of its chunks (checked
            // chunks keep some per chunk, counted by admission with the data): twice the
            // data holds chunks down to a few dozen bytes; into GPU memory, its upload
            // ring too (4 MiB a stream at 1 MiB chunks: more than a small transfer's data).
            max_memory: max_bytes
                .saturating_mul(2)
                .saturating_add(memory.ring_allowance(max_bytes)),
            min_rate: self.opts.min_rate,
            max_per_peer: 1,
            allow: AllowList::default(),
            key: self.opts.key.clone(),
            output,
            cancel: self.opts.cancel.clone(),
        };
        let mut last = None;
        let mut report = |o: &RecvOutcome| {
            if !matches!(o, RecvOutcome::Listening { .. }) {
                last = Some(o.clone());
            }
        };
        let call = LibraryCall {
            wait: self.opts.wait,
        };
        let admission = admission_of(&cfg);
        let tcp = (self.opts.transport != TransportKind::Rdma).then_some(listener);
        let verbs = self
            .verbs
            .as_ref()
            .map(|v| VerbsSide::Shared(v.clone(), VerbsServe::default()));
        let served = serve_any(
            tcp,
            verbs,
            Some(self.kept.clone()),
            &cfg,
            memory,
            &admission,
            Some(call),
            &mut report,
        );
        if let Err(e) = served {
            return Err(with_last_refusal(e.into(), last.as_ref()));
        }
        match last {
            Some(RecvOutcome::Completed(report)) if report.ok() => Ok(*report),
            Some(RecvOutcome::Completed(report)) => Err(Error::from_recv_report(&report)),
            Some(RecvOutcome::Rejected { peer, reason }) => Err(Error::new(
                ErrorKind::Rejected,
                format!("refused the offer from {peer}: {reason}"),
            )),
            Some(RecvOutcome::Failed { peer, error }) => {
                Err(Error::from_words(format!("transfer from {peer}: {error}")))
            }
            other => Err(Error::new(
                ErrorKind::Other,
                format!("no transfer was received ({other:?})"),
            )),
        }
    }
}

/// A receive that ran out of its wait says so; where it refused an offer meanwhile (of
/// another size, several transfers at once, a wrong key), it names the last one too: "no
/// transfer arrived" alone would hide that a sender came and was told why it was refused.
fn with_last_refusal(e: Error, last: Option<&RecvOutcome>) -> Error {
    match (e.kind(), last) {
        (ErrorKind::TimedOut, Some(RecvOutcome::Rejected { peer, reason })) => Error::new(
            ErrorKind::TimedOut,
            format!(
                "{}; the last offer, from {peer}, was refused: {reason}",
                e.message()
            ),
        ),
        _ => e,
    }
}

/// A verbs listener on `addr` for a library [`Listener`], paused until a receive.
fn verbs_listen(addr: SocketAddr, opts: &Options) -> Result<Arc<VerbsListen>, Error> {
    let cfg = listen_config(&crate::engine::RecvOptions {
        max_bytes: opts.max_bytes,
        timeout: opts.timeout,
        key: opts.key.clone(),
        ..crate::engine::RecvOptions::once_on(addr, opts.max_bytes)
    });
    let heard_nothing = Box::new(|_| {});
    VerbsListen::start(addr, cfg, false, heard_nothing, true)
        .map(Arc::new)
        .map_err(|e| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("cannot listen on {addr} over RDMA: {e}"),
            )
        })
}
