//! The sending side of the library: an [`Endpoint`] (a peer and the options for it) that
//! sends bytes the caller owns, in place, a file, or GPU memory; each chunk checked by
//! its CRC32C at the receiver and sent again if it fails.

use super::error::{Error, ErrorKind};
use super::{Options, TransportKind};
use crate::engine::Cooldowns;
use crate::memory::select::AttemptLog;
use crate::memory::{HostBuffer, LentBytes, SendSource};
use crate::transfer::SendReport;
use crate::wire::Payload;
use std::net::SocketAddr;
use std::path::Path;
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
    send_with(peer, transport, source, opts, &Cooldowns::new())
}

/// The transport a send to `peer` takes under `opts.transport` (`Auto`: verbs where the
/// RDMA connection manager finds a route to the peer, asked within 2 s at most).
fn chosen(peer: SocketAddr, opts: &Options) -> TransportKind {
    let wait = opts.timeout.min(Duration::from_secs(2));
    crate::transport::choose_here(opts.transport, Some(peer), wait).kind
}

/// [`send_source`] over `transport`, remembering failed rails in `cooldowns` (an
/// endpoint's).
fn send_with(
    peer: SocketAddr,
    transport: TransportKind,
    source: &dyn SendSource,
    opts: &Options,
    cooldowns: &Cooldowns,
) -> Result<SendReport, Error> {
    let cfg = opts.send_options(peer, source.len() as u64, Payload::Opaque, cooldowns);
    let mut reports = match transport {
        TransportKind::Rdma => crate::engine::connect::send_verbs_source(&cfg, source, 1)?,
        _ => crate::engine::connect::send_tcp(&cfg, source, &AttemptLog::default(), 1)?,
    };
    let report = reports
        .pop()
        .ok_or_else(|| Error::new(ErrorKind::Other, "no report of the transfer"))?;
    match Error::from_send_report(&report) {
        Some(e) => Err(e),
        None => Ok(report),
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
    send_source(peer, &staged, opts)
}

/// A peer to send to, and how: the options every send of this endpoint uses, and the
/// transport chosen for it once (as `--transport` chooses).
///
/// Each send opens its own connection (the offer, the streams or queue pairs, the
/// chunks, the ack) and closes it when the receiver has acked; a connection that carries
/// many transfers of different sizes is not there yet (`host --reuse-connection` repeats
/// one transfer).
#[derive(Debug, Clone)]
pub struct Endpoint {
    peer: SocketAddr,
    opts: Options,
    transport: TransportKind,
    /// Where this endpoint's failed rails rest.
    cooldowns: Cooldowns,
}

/// An endpoint for `peer`.
///
/// # Errors
/// An option out of range ([`ErrorKind::InvalidArgument`]), before any connection.
pub fn connect(peer: SocketAddr, opts: &Options) -> Result<Endpoint, Error> {
    opts.check()?;
    Ok(Endpoint {
        peer,
        opts: opts.clone(),
        transport: chosen(peer, opts),
        cooldowns: Cooldowns::new(),
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

    /// The options every send of this endpoint uses.
    pub fn options(&self) -> &Options {
        &self.opts
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
        send_with(self.peer, self.transport, &data, &opts, &self.cooldowns)
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
