//! The sending side of the library: an [`Endpoint`] (a peer and the options for it) that
//! sends bytes the caller owns, in place, a file, or GPU memory; each chunk checked by
//! its CRC32C at the receiver and sent again if it fails.

use super::error::{Error, ErrorKind};
use super::{Cancel, Options, TransportKind};
use crate::engine::kept::{KeptSender, Tried};
use crate::engine::Cooldowns;
use crate::memory::{HostBuffer, LentBytes, SendSource};
use crate::memory_path::AttemptLog;
use crate::transfer::SendReport;
use crate::wire::Payload;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Send `source` (any [`SendSource`]: host memory, GPU memory behind a staging ring)
/// as the user's bytes; the report carries the receiver's verdict ("verified").
///
/// # Errors
/// The receiver refused, the transfer broke off, or the receiver did not verify it
/// ([`ErrorKind`] says which); an option out of range, before anything is sent.
pub fn send_source(
    peer: SocketAddr,
    source: &dyn SendSource,
    opts: &Options,
) -> Result<SendReport, Error> {
    let transport = chosen(peer, opts);
    send_with(peer, transport, source, opts, &Cooldowns::new(), None)
}

/// The transport a send to `peer` takes under `opts.transport` (`Auto`: verbs where the
/// RDMA connection manager finds a route to the peer, asked within 2 s at most).
fn chosen(peer: SocketAddr, opts: &Options) -> TransportKind {
    let wait = opts.timeout.min(Duration::from_secs(2));
    crate::transport::choose_here(opts.transport, Some(peer), wait).kind
}

/// [`send_source`] over `transport`, remembering failed rails in `cooldowns` (an
/// endpoint's); over TCP on the connection `kept` holds, if it has one that fits (else
/// on a new one, left there afterwards).
fn send_with(
    peer: SocketAddr,
    transport: TransportKind,
    source: &dyn SendSource,
    opts: &Options,
    cooldowns: &Cooldowns,
    kept: Option<&KeptSlot>,
) -> Result<SendReport, Error> {
    // Every send's options, however it came (a free function's, or an endpoint's with
    // this send's name): out of range, an error before any connection.
    opts.check()?;
    let cfg = opts.send_options(peer, source.len() as u64, Payload::Opaque, cooldowns);
    let report = match (transport, kept) {
        (TransportKind::Rdma, _) => {
            last(crate::engine::connect::send_verbs_source(&cfg, source, 1)?)?
        }
        (_, None) => last(crate::engine::connect::send_tcp(
            &cfg,
            source,
            &AttemptLog::default(),
            1,
        )?)?,
        (_, Some(slot)) => send_kept(&cfg, source, slot)?,
    };
    match Error::from_send_report(&report) {
        Some(e) => Err(e),
        None => Ok(report),
    }
}

/// The one report of a transfer.
fn last(mut reports: Vec<SendReport>) -> Result<SendReport, Error> {
    reports
        .pop()
        .ok_or_else(|| Error::new(ErrorKind::Other, "no report of the transfer"))
}

/// Send over TCP on `slot`'s connection where it has one that fits, else on a new one
/// offered as a session; the connection goes back into the slot while it stays good. A
/// send while another holds the connection (a clone of the endpoint on another thread)
/// opens one of its own.
fn send_kept(
    cfg: &crate::engine::SendOptions,
    source: &dyn SendSource,
    slot: &KeptSlot,
) -> Result<SendReport, Error> {
    let taken = slot.take().filter(|k| k.fits(cfg));
    if let Some(kept) = taken {
        match kept.send(cfg, source) {
            Tried::Sent(result, again) => {
                if let Some(again) = again {
                    slot.put(again);
                }
                return Ok(result?);
            }
            // The receiver closed it before answering: nothing was accepted.
            Tried::Closed => {}
        }
    }
    let mut fresh = None;
    let reports = crate::engine::connect::send_tcp_keeping(
        cfg,
        source,
        &AttemptLog::default(),
        1,
        Some(&mut fresh),
    )?;
    if let Some(fresh) = fresh {
        slot.put(fresh);
    }
    last(reports)
}

/// An endpoint's kept TCP connection, shared by its clones; taken out while a send uses
/// it.
#[derive(Default)]
struct KeptSlot(Mutex<Option<KeptSender>>);

impl KeptSlot {
    fn take(&self) -> Option<KeptSender> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Keep `kept` unless the slot holds one already (it closes then).
    fn put(&self, kept: KeptSender) {
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(kept);
        }
    }

    fn holds(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }
}

impl std::fmt::Debug for KeptSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptSlot")
            .field("holds", &self.holds())
            .finish()
    }
}

/// Send the bytes of a host buffer you own.
///
/// # Errors
/// As for [`send_source`].
pub fn send_host(peer: SocketAddr, data: &HostBuffer, opts: &Options) -> Result<SendReport, Error> {
    send_source(peer, data, opts)
}

/// Send GPU memory you allocated: each chunk's CRC32C computed by the checksum kernel
/// on the GPU, the bytes copied chunk by chunk through a page-locked ring into the
/// socket. The buffer comes back with the report.
///
/// # Errors
/// As for [`send_source`]; the staging ring could not be allocated.
#[cfg(feature = "cuda")]
pub fn send_device(
    peer: SocketAddr,
    data: crate::gpu::allocations::DeviceBuffer,
    opts: &Options,
) -> Result<(SendReport, crate::gpu::allocations::DeviceBuffer), Error> {
    let staged = stage(data, opts)?;
    let report = send_source(peer, &staged, opts)?;
    Ok((report, staged.into_device()))
}

#[cfg(feature = "cuda")]
fn stage(
    data: crate::gpu::allocations::DeviceBuffer,
    opts: &Options,
) -> Result<crate::gpu::sources::StagedSource, Error> {
    let chunk = usize::try_from(opts.chunk.min(data.len().max(1) as u64))
        .map_err(|e| Error::new(ErrorKind::InvalidArgument, e.to_string()))?;
    crate::gpu::sources::StagedSource::over(data, chunk)
        .map_err(|e| Error::new(ErrorKind::Other, format!("{e:#}")))
}

/// Send `len` bytes of GPU memory at `ptr` on device `ordinal` that the caller
/// allocated (the Python module's tensors), read in place through the staging ring.
///
/// # Safety
/// `[ptr, ptr + len)` must be device memory of that device's primary context (CUDA's
/// runtime and PyTorch allocate there), stay allocated until this returns, and not be
/// written meanwhile (the caller's streams are done with it: the function also waits for
/// all work queued in the context before it reads).
///
/// # Errors
/// As for [`send_source`]; the GPU could not be opened.
#[cfg(feature = "cuda")]
pub unsafe fn send_device_lent(
    peer: SocketAddr,
    ordinal: u32,
    ptr: u64,
    len: usize,
    opts: &Options,
) -> Result<SendReport, Error> {
    // SAFETY: the caller's contract, passed on as it is.
    unsafe {
        with_device_lent(ordinal, ptr, len, opts, |staged| {
            send_source(peer, staged, opts)
        })
    }
}

/// `f` with GPU memory the caller lent, behind its staging ring.
///
/// # Safety
/// As for [`send_device_lent`], until this returns.
#[cfg(feature = "cuda")]
unsafe fn with_device_lent<R>(
    ordinal: u32,
    ptr: u64,
    len: usize,
    opts: &Options,
    f: impl FnOnce(&crate::gpu::sources::StagedSource) -> Result<R, Error>,
) -> Result<R, Error> {
    let gpu = crate::gpu::Gpu::open(ordinal)
        .map_err(|e| Error::new(ErrorKind::Other, format!("GPU {ordinal}: {e:#}")))?;
    // A producer's kernel queued on any stream of the context (a side stream of the
    // caller's) is done before the first chunk is read.
    gpu.synchronize_context()
        .map_err(|e| Error::new(ErrorKind::Other, format!("{e:#}")))?;
    // SAFETY: the caller's contract: device memory of this primary context (which
    // Gpu::open binds), allocated and unwritten until we return; the buffer value is
    // dropped (never freed: it is borrowed) before we return, with the staging ring.
    let memory = unsafe { crate::gpu::allocations::DeviceBuffer::borrowed(&gpu, ptr, len) };
    let staged = stage(memory, opts)?;
    f(&staged)
}

/// A peer to send to, and how: the options every send of this endpoint uses, and the
/// transport chosen for it once (as `--transport` chooses).
///
/// Over TCP, the endpoint keeps its connection after a verified transfer and offers the
/// next on it, whatever its size (the streams stay open: no connect, offer, hellos or
/// proof of the key again); a receiver keeps it for its `timeout` after each transfer,
/// and a send that finds it closed opens a new one. Clones share it (a send while
/// another uses it opens one of its own); it closes when the last clone is dropped.
/// Over verbs each send opens its own connection (queue pairs, registration) and closes
/// it after the ack.
#[derive(Debug, Clone)]
pub struct Endpoint {
    peer: SocketAddr,
    opts: Options,
    transport: TransportKind,
    /// Where this endpoint's failed rails rest.
    cooldowns: Cooldowns,
    /// Its TCP connection between sends.
    kept: Arc<KeptSlot>,
}

/// An endpoint for `peer`.
///
/// # Errors
/// An option out of range ([`ErrorKind::InvalidArgument`]), before any connection.
pub fn connect(peer: SocketAddr, opts: &Options) -> Result<Endpoint, Error> {
    opts.check()?;
    // `--streams auto` decided once, so every send (and the kept connection each must
    // fit) has the same count.
    let opts = Options {
        streams: Some(opts.streams_to(peer)),
        ..opts.clone()
    };
    Ok(Endpoint {
        peer,
        transport: chosen(peer, &opts),
        opts,
        cooldowns: Cooldowns::new(),
        kept: Arc::default(),
    })
}

impl Endpoint {
    /// The receiver's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The transport its sends take (TCP or RDMA verbs).
    pub fn transport(&self) -> TransportKind {
        self.transport
    }

    /// The options every send of this endpoint uses (`streams` as chosen at [`connect`]).
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// The sockets each of its TCP sends opens: the count given, or the one chosen from
    /// the machine at [`connect`].
    pub fn streams(&self) -> u16 {
        self.opts.streams_to(self.peer)
    }

    /// The same endpoint (its kept connection shared), whose sends `cancel` stops.
    pub fn with_cancel(&self, cancel: &Cancel) -> Endpoint {
        let mut endpoint = self.clone();
        endpoint.opts.cancel = Some(cancel.clone());
        endpoint
    }

    /// Send `data` in place (no copy into a buffer of ours), named `name` if given.
    ///
    /// # Errors
    /// As for [`send_source`].
    pub fn send(&self, data: &[u8], name: Option<&str>) -> Result<SendReport, Error> {
        let opts = self.named(name);
        send_with(
            self.peer,
            self.transport,
            &LentBytes::new(data),
            &opts,
            &self.cooldowns,
            Some(&self.kept),
        )
    }

    /// Send the file at `path`, read whole first, named by its file name unless `name`
    /// says otherwise.
    ///
    /// # Errors
    /// The file cannot be read, or as for [`send_source`].
    pub fn send_file(&self, path: &Path, name: Option<&str>) -> Result<SendReport, Error> {
        let shown = path.display().to_string();
        let data = crate::transfer::input::read_input(&shown)
            .map_err(|e| Error::new(ErrorKind::InvalidArgument, format!("{e:#}")))?;
        let file_name = path.file_name().and_then(|n| n.to_str());
        let opts = self.named(name.or(file_name));
        send_with(
            self.peer,
            self.transport,
            &data,
            &opts,
            &self.cooldowns,
            Some(&self.kept),
        )
    }

    /// Send `len` bytes of GPU memory at `ptr` on device `ordinal` that the caller
    /// allocated (the Python module's tensors), read in place through the staging ring,
    /// on this endpoint's connection.
    ///
    /// # Safety
    /// As for the function [`send_device_lent`]: device memory of that device's primary
    /// context, allocated and not written until this returns.
    ///
    /// # Errors
    /// As for [`send_source`]; the GPU could not be opened.
    #[cfg(feature = "cuda")]
    pub unsafe fn send_device_lent(
        &self,
        ordinal: u32,
        ptr: u64,
        len: usize,
        name: Option<&str>,
    ) -> Result<SendReport, Error> {
        let opts = self.named(name);
        // SAFETY: the caller's contract, passed on as it is.
        unsafe {
            with_device_lent(ordinal, ptr, len, &opts, |staged| {
                send_with(
                    self.peer,
                    self.transport,
                    staged,
                    &opts,
                    &self.cooldowns,
                    Some(&self.kept),
                )
            })
        }
    }

    /// The endpoint's options with `name`, if given, in place of its own.
    fn named(&self, name: Option<&str>) -> Options {
        let mut opts = self.opts.clone();
        if let Some(name) = name {
            opts.name = Some(name.to_string());
        }
        opts
    }
}
