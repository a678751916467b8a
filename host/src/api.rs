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
//! let mut data = HostBuffer::zeroed(4097)?;
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
    /// `--min-rate` (receiving): a transfer of N bytes must be done within
    /// `timeout + N / min_rate`, so a sender that trickles cannot hold
    /// [`Listener::receive_one`] for ever. 0 turns the rule off.
    pub min_rate: u64,
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
            min_rate: 1 << 20,
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
            rail_timeout: crate::transport::tcp::DEFAULT_RAIL_TIMEOUT,
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
    /// receiver's report says what was checked and repaired). Like
    /// [`TcpListener::accept`] it waits for a sender as long as none comes; once one
    /// has, every wait is bounded by `timeout` and the transfer by `min_rate`.
    pub fn receive_one(self) -> Result<Received> {
        let (to, from) = std::sync::mpsc::channel();
        let cfg = TcpRecvConfig {
            bind: self.local_addr(),
            once: true,
            max_bytes: self.opts.max_bytes,
            timeout: self.opts.timeout,
            max_connections: 1,
            // Room for one transfer of --max-bytes and the books of its chunks (checked
            // chunks keep some per chunk, counted by admission with the data): twice the
            // data holds chunks down to a few dozen bytes.
            max_memory: self.opts.max_bytes.saturating_mul(2),
            min_rate: self.opts.min_rate,
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

#[cfg(test)]
mod tests {
    //! A caller's mistakes, made through the safe API: each is an error, none a panic
    //! or a wait without end.
    use super::*;
    use std::io::Write as _;
    use std::time::Instant;

    fn listener(opts: &Options) -> (SocketAddr, std::thread::JoinHandle<Result<Received>>) {
        let l = Listener::bind("127.0.0.1:0".parse().unwrap(), opts).unwrap();
        let addr = l.local_addr();
        (addr, std::thread::spawn(move || l.receive_one()))
    }

    #[test]
    fn options_out_of_range_are_errors_before_anything_is_sent() {
        let data = HostBuffer::zeroed(4096).unwrap();
        // Nobody listens on port 1 of loopback: an option that passed its check would
        // fail on the connection instead, with another message.
        let nowhere: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let bad = [
            Options {
                chunk: 0,
                ..Options::default()
            },
            Options {
                streams: 0,
                ..Options::default()
            },
            Options {
                depth: 0,
                ..Options::default()
            },
            Options {
                max_resends: 200,
                ..Options::default()
            },
            Options {
                name: Some("../escape".into()),
                ..Options::default()
            },
        ];
        let unreachable = send_host(nowhere, &data, &Options::default())
            .unwrap_err()
            .to_string();
        for opts in bad {
            let e = send_host(nowhere, &data, &opts).unwrap_err().to_string();
            assert_ne!(e, unreachable, "{opts:?} reached the network");
            eprintln!("{e}");
        }
    }

    #[test]
    fn an_empty_buffer_is_refused_before_anything_is_sent() {
        let data = HostBuffer::zeroed(0).unwrap();
        let nowhere: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let e = send_host(nowhere, &data, &Options::default())
            .unwrap_err()
            .to_string();
        assert_eq!(e, "nothing to transfer (size 0)");
    }

    #[test]
    fn a_sender_that_trickles_cannot_hold_receive_one() {
        // 1 MiB offered at a --min-rate of 1 MiB/s, --timeout 1 s: over within ~2 s.
        let opts = Options {
            timeout: Duration::from_secs(1),
            ..Options::default()
        };
        let (addr, receiving) = listener(&opts);
        let header = crate::transfer::Header::of(
            crate::transfer::Op::Send,
            1 << 20,
            1 << 20,
            16,
            Payload::Opaque,
        )
        .unwrap();
        let hello = tcp::frames::Hello {
            index: 0,
            count: 1,
            rail: 0,
            token: 1,
        };
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(&[&header.encode()[..], &hello.encode()[..]].concat())
            .unwrap();
        let t0 = Instant::now();
        // A byte every 0.5 s: no single wait reaches --timeout.
        let trickle = std::thread::spawn(move || {
            for _ in 0..20 {
                std::thread::sleep(Duration::from_millis(500));
                if s.write_all(&[0]).is_err() {
                    break;
                }
            }
        });
        let got = receiving.join().unwrap();
        let took = t0.elapsed();
        assert!(got.is_err(), "a trickled transfer verified?");
        assert!(took < Duration::from_secs(4), "held for {took:?}");
        assert!(format!("{:#}", got.unwrap_err()).contains("too slow"));
        trickle.join().unwrap();
    }
}
