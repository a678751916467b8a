//! The library: send a buffer you own to a `host recv` (or to [`receive`]), and receive
//! into one, with the same options the command line has ([`Options`]; `host` builds
//! its transfers from the same values). Over TCP, which every machine has; the verbs
//! path is the command line's (`host <ip> <port> --transport rdma`).
//!
//! ```
//! use host::api::{self, Options};
//! use host::memory::HostBuffer;
//!
//! # fn main() -> anyhow::Result<()> {
//! // The receiving side: one verified transfer, its bytes handed back.
//! let opts = Options::default();
//! let listener = api::Listener::bind("127.0.0.1:0".parse()?, &opts)?;
//! let addr = listener.local_addr();
//! let receiving = std::thread::spawn(move || listener.receive_one());
//!
//! // The sending side: any bytes, checked by CRC32C per chunk, repaired if need be.
//! let data = HostBuffer::zeroed(4097)?;
//! data.write_at(0, b"hello")?;
//! let report = api::send_host(addr, &data, &opts)?;
//! assert!(report.receiver.is_some_and(|v| v.ok()));
//!
//! let received = receiving.join().unwrap()?;
//! assert_eq!(&received.bytes[..5], b"hello");
//! # Ok(())
//! # }
//! ```
//!
//! GPU memory you allocated ([`crate::gpu::allocations::DeviceBuffer`]) is sent by
//! `send_device` (with the `cuda` feature): the checksum kernel computes every chunk's
//! CRC32C on the GPU, the chunks go through a page-locked staging ring, and the buffer is
//! given back. `examples/host/send_buffer.rs` and `receive_buffer.rs` show both ends.

use crate::memory::select::AttemptLog;
use crate::memory::{HostBuffer, SendSource};
use crate::server::{AllowList, Key};
use crate::transfer::header::{Payload, VerifyMode, DEFAULT_MAX_RESENDS};
use crate::transfer::store::Output;
use crate::transfer::{PayloadOptions, RecvOutcome, RecvReport, SendReport, TransferError};
use crate::transport::tcp::{self, RecvMemory, TcpRecvConfig, TcpSendConfig};
use anyhow::{bail, Context, Result};
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

/// How a transfer is made and checked: the command line's options of the same names.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--chunk`: bytes per chunk (one frame, one CRC32C).
    pub chunk: u64,
    /// `--depth`: chunks handed to the socket writers and not yet written.
    pub depth: u32,
    /// `--streams`: sockets per connection.
    pub streams: u16,
    /// `--timeout`: the bound of every wait.
    pub timeout: Duration,
    /// `--verify`; `None`: the payload's default (CRC32C for your data).
    pub verify: Option<VerifyMode>,
    /// `--max-resends`.
    pub max_resends: u8,
    /// `--name`.
    pub name: Option<String>,
    /// `--key-file`, read.
    pub key: Option<Key>,
    /// `--max-bytes` (receiving).
    pub max_bytes: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            chunk: 1 << 20,
            depth: 16,
            streams: 1,
            timeout: Duration::from_secs(10),
            verify: None,
            max_resends: DEFAULT_MAX_RESENDS,
            name: None,
            key: None,
            max_bytes: 1 << 30,
        }
    }
}

impl Options {
    /// The TCP sender's configuration for `bytes` of `payload` to `peer`.
    pub fn tcp_send_config(&self, peer: SocketAddr, bytes: u64, payload: Payload) -> TcpSendConfig {
        TcpSendConfig {
            peer,
            bytes,
            chunk: self.chunk.min(bytes.max(1)),
            depth: self.depth,
            streams: self.streams,
            timeout: self.timeout,
            progress: false,
            protocol_version: crate::transfer::header::VERSION,
            key: self.key.clone(),
            payload: PayloadOptions {
                payload,
                verify: self.verify.unwrap_or(VerifyMode::default_for(payload)),
                max_resends: self.max_resends,
                name: self.name.clone(),
                faults: None,
            },
            rails: Vec::new(),
            rail_timeout: crate::transport::tcp::sender::DEFAULT_RAIL_TIMEOUT,
            test_silent_rail: None,
        }
    }
}

/// Send `source` (any [`SendSource`]: host memory, GPU memory behind a staging ring)
/// as the user's bytes; the report carries the receiver's verdict.
pub fn send_source(
    peer: SocketAddr,
    source: &dyn SendSource,
    opts: &Options,
) -> Result<SendReport, TransferError> {
    let cfg = opts.tcp_send_config(peer, source.len() as u64, Payload::Opaque);
    let mut reports = tcp::send_repeated(&cfg, source, &AttemptLog::default(), 1)?;
    reports
        .pop()
        .ok_or_else(|| TransferError::Protocol("no report of the transfer".into()))
}

/// Send the bytes of a host buffer you own.
pub fn send_host(
    peer: SocketAddr,
    data: &HostBuffer,
    opts: &Options,
) -> Result<SendReport, TransferError> {
    send_source(peer, data, opts)
}

/// Send GPU memory you allocated: each chunk's CRC32C computed by the checksum kernel
/// on the GPU, the bytes copied chunk by chunk through a page-locked ring into the
/// socket. The buffer comes back with the report.
#[cfg(feature = "cuda")]
pub fn send_device(
    peer: SocketAddr,
    data: crate::gpu::allocations::DeviceBuffer,
    opts: &Options,
) -> Result<(SendReport, crate::gpu::allocations::DeviceBuffer), TransferError> {
    let chunk = usize::try_from(opts.chunk.min(data.len().max(1) as u64))
        .map_err(|e| TransferError::Protocol(e.to_string()))?;
    let staged =
        crate::gpu::sources::StagedSource::over(data, chunk).map_err(TransferError::Memory)?;
    let report = send_source(peer, &staged, opts)?;
    Ok((report, staged.into_device()))
}

/// A verified transfer, received.
#[derive(Debug)]
pub struct Received {
    /// The sender's `--name`, if it gave one.
    pub name: Option<String>,
    pub bytes: Vec<u8>,
    pub report: RecvReport,
}

/// A bound TCP receiver (the port is taken when this returns, so a sender may start).
pub struct Listener {
    listener: TcpListener,
    opts: Options,
}

impl Listener {
    /// Listen on `addr` (port 0: the system picks; see [`local_addr`](Self::local_addr)).
    pub fn bind(addr: SocketAddr, opts: &Options) -> Result<Listener> {
        let listener = TcpListener::bind(addr).with_context(|| format!("listening on {addr}"))?;
        Ok(Listener {
            listener,
            opts: opts.clone(),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Serve until one transfer was accepted; its bytes if every check passed (the
    /// receiver's report says what was checked and repaired).
    pub fn receive_one(self) -> Result<Received> {
        let (to, from) = std::sync::mpsc::channel();
        let cfg = TcpRecvConfig {
            bind: self.local_addr(),
            once: true,
            max_bytes: self.opts.max_bytes,
            timeout: self.opts.timeout,
            max_connections: 1,
            max_memory: self.opts.max_bytes,
            min_rate: 0,
            max_per_peer: 1,
            allow: AllowList::default(),
            key: self.opts.key.clone(),
            output: Some(Output::Memory(to)),
        };
        let mut last = None;
        let mut report = |o: &RecvOutcome| {
            if !matches!(o, RecvOutcome::Listening { .. }) {
                last = Some(o.clone());
            }
        };
        tcp::serve_on(self.listener, &cfg, &RecvMemory::Host, &mut report)?;
        match last {
            Some(RecvOutcome::Completed(report)) if report.ok() => {
                let (name, bytes) = from
                    .try_recv()
                    .context("the transfer verified but its bytes were not handed over")?;
                Ok(Received {
                    name,
                    bytes,
                    report,
                })
            }
            Some(RecvOutcome::Completed(report)) => bail!(
                "the transfer from {} did not pass its checks: {:?}",
                report.peer,
                report.integrity
            ),
            Some(RecvOutcome::Failed { peer, error }) => bail!("transfer from {peer}: {error}"),
            other => bail!("no transfer was received ({other:?})"),
        }
    }
}
