//! The library: send bytes you own to a `host recv` (or to a [`Listener`]), and receive
//! them into memory of yours, with the same options the command line has ([`Options`];
//! `host` builds its transfers from the same values). Over TCP, which every machine has,
//! or RDMA verbs: [`Options::transport`] decides as `--transport` does (`auto`, the
//! default, takes verbs where the RDMA connection manager finds a route to the peer).
//!
//! ```
//! use host::api::{self, Options};
//!
//! # fn main() -> Result<(), api::Error> {
//! // The receiving side: one verified transfer, in place into a buffer of yours.
//! let opts = Options::default();
//! let listener = api::Listener::bind("127.0.0.1:0".parse().unwrap(), &opts)?;
//! let addr = listener.local_addr();
//! let receiving = std::thread::spawn(move || {
//!     let mut buf = vec![0u8; 4097];
//!     listener.receive_into(&mut buf).map(|report| (report, buf))
//! });
//!
//! // The sending side: any bytes, checked by CRC32C per chunk, repaired if need be.
//! let mut data = vec![0u8; 4097];
//! data[..5].copy_from_slice(b"hello");
//! let endpoint = api::connect(addr, &opts)?;
//! let report = endpoint.send(&data, Some("greeting"))?;
//! assert!(report.receiver.is_some_and(|v| v.ok()));
//!
//! let (received, buf) = receiving.join().unwrap()?;
//! assert_eq!(buf, data);
//! assert_eq!(received.integrity.name.as_deref(), Some("greeting"));
//! # Ok(())
//! # }
//! ```
//!
//! - [`connect`] gives an [`Endpoint`]: [`Endpoint::send`] (bytes, in place),
//!   [`Endpoint::send_file`], and [`Endpoint::start_send`], which returns a [`Pending`]
//!   at once; `send_device` sends GPU memory you allocated (the `cuda` feature: the
//!   checksum kernel computes every chunk's CRC32C on the GPU, the chunks go through a
//!   page-locked staging ring). Over TCP an endpoint keeps its connection between sends
//!   (of any size), so only the first pays for the opening.
//! - [`Listener::bind`] gives a [`Listener`]: [`Listener::receive`] (bytes of ours),
//!   [`Listener::receive_into`] (in place into yours; an offer of another size is refused
//!   before a byte lands), `receive_into_device` (a `DeviceBuffer`, checked by the
//!   checksum kernel on the GPU), [`Listener::start_receive_into`], and
//!   [`Listener::accept`], which shows the next offer (its size, name, peer) before
//!   anything is allocated for it: an [`Incoming`] the caller takes into memory sized
//!   for it, or declines.
//! - Every failure is an [`Error`]: one line of words and an [`ErrorKind`].
//!
//! `examples/host/send_buffer.rs` and `receive_buffer.rs` show both ends; the Python
//! module (`python/`) is built on these calls.

#![warn(missing_docs)]

mod error;
mod incoming;
mod pending;
mod receive;
mod send;

pub use error::{Error, ErrorKind};
pub use incoming::Incoming;
pub use pending::{Pending, PendingReceive, PendingSend};
pub use receive::{Listener, Received};
pub use send::{connect, send_host, send_source, Endpoint};
#[cfg(feature = "cuda")]
pub use send::{send_device, send_device_lent};

pub use crate::engine::Cancel;
use crate::engine::{Cooldowns, SendOptions, TcpSendOptions, VerbsSendOptions};
use crate::net::tcp::frames::MAX_STREAMS;
use crate::net::tcp::streams::{choose_streams, StreamFacts};
use crate::server::Key;
use crate::transfer::PayloadOptions;
pub use crate::transport::TransportKind;
pub use crate::wire::Op;
use crate::wire::{Payload, VerifyMode, DEFAULT_MAX_RESENDS, MAX_RESENDS};
use std::net::SocketAddr;
use std::time::Duration;

/// How a transfer is made and checked: the command line's options of the same names.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--chunk`: bytes per chunk (one frame, one CRC32C).
    pub chunk: u64,
    /// `--depth`: chunks handed to the socket writers and not yet written.
    pub depth: u32,
    /// `--streams`: sockets per TCP connection. `None`, the default, is `--streams auto`:
    /// chosen from this machine's cores and the link the route to the receiver leaves by
    /// (8 to this machine itself; the rule is [`crate::net::tcp::streams`]'s), decided
    /// once per [`connect`] or free-function send. [`Endpoint::options`] shows the count
    /// chosen.
    pub streams: Option<u16>,
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
    /// `--max-bytes` (receiving into bytes of ours; receiving into a buffer of yours, its
    /// size is the limit).
    pub max_bytes: u64,
    /// `--min-rate` (receiving): a transfer of N bytes must be done within
    /// `timeout + N / min_rate`, so a sender that trickles cannot hold a receive for
    /// ever. 0 turns the rule off.
    pub min_rate: u64,
    /// Receiving: how long a receive waits for a sender to come; `None`, as long as
    /// none does (as `accept` waits).
    pub wait: Option<Duration>,
    /// `--transport`: TCP, RDMA verbs, or `Auto` (verbs where this machine has an RDMA
    /// device and, sending, a route to the peer through it; a receiver then listens on
    /// both).
    pub transport: TransportKind,
    /// `--op` (verbs): each chunk as a SEND into the receiver's posted receives, or an
    /// RDMA WRITE into its buffer.
    pub op: Op,
    /// A token that stops the transfers made under these options once cancelled (the
    /// connection is broken off; the call returns [`ErrorKind::Cancelled`] when no
    /// thread touches its memory any more). [`Pending::cancel`] makes one per transfer.
    /// Looked at every 50 ms while a receive waits for a sender, while a send waits for
    /// the answer to its offer, and while bytes move; not while a socket connects
    /// (bounded by its connect timeout) or a verbs connection opens (by `timeout`).
    pub cancel: Option<Cancel>,
    /// Test only (`--test-inject-faults 1/N`): flip a bit in every Nth chunk after its
    /// CRC32C was computed, so the receiver's checks and the resends are exercised.
    #[doc(hidden)]
    pub test_inject_faults: Option<crate::transfer::faults::FaultInjector>,
}

/// The longest [`Options::timeout`] and [`Options::wait`]: a day, as the command line's
/// `--timeout`.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);

impl Default for Options {
    fn default() -> Self {
        Options {
            chunk: 1 << 20,
            depth: 16,
            streams: None,
            timeout: Duration::from_secs(10),
            verify: None,
            max_resends: DEFAULT_MAX_RESENDS,
            name: None,
            key: None,
            max_bytes: 1 << 30,
            min_rate: 1 << 20,
            wait: None,
            transport: TransportKind::Auto,
            op: Op::Send,
            cancel: None,
            test_inject_faults: None,
        }
    }
}

impl Options {
    /// The checks a send makes of its options before any connection.
    ///
    /// # Errors
    /// An option out of range ([`ErrorKind::InvalidArgument`]), with its flag's name.
    pub fn check(&self) -> Result<(), Error> {
        let bad = |what: String| Err(Error::new(ErrorKind::InvalidArgument, what));
        if self.chunk == 0 || self.chunk > u32::MAX as u64 {
            return bad(format!(
                "--chunk {} is outside 1..=4294967295 bytes",
                self.chunk
            ));
        }
        if let Some(streams) = self.streams.filter(|s| !(1..=MAX_STREAMS).contains(s)) {
            return bad(format!("--streams {streams} is outside 1..={MAX_STREAMS}"));
        }
        if self.depth == 0 {
            return bad("--depth 0: at least one chunk must be in flight".into());
        }
        if self.max_resends > MAX_RESENDS {
            return bad(format!(
                "--max-resends {} is outside 0..={MAX_RESENDS}",
                self.max_resends
            ));
        }
        self.check_waits()?;
        if let Some(name) = &self.name {
            if let Err(e) = crate::wire::encode_name(name) {
                return bad(format!("--name {name:?}: {e}"));
            }
        }
        Ok(())
    }

    /// The checks of `timeout` and `wait`, which receives make too: each is at most
    /// [`MAX_TIMEOUT`], as the command line's `--timeout` is (a longer one is taken for a
    /// mistake; a receive that waits without end has `wait: None`), and `timeout` is not
    /// zero.
    ///
    /// # Errors
    /// A wait out of range ([`ErrorKind::InvalidArgument`]).
    pub fn check_waits(&self) -> Result<(), Error> {
        let bad = |what: String| Err(Error::new(ErrorKind::InvalidArgument, what));
        let limit = MAX_TIMEOUT.as_secs();
        if self.timeout.is_zero() {
            return bad("--timeout 0: every wait needs a bound".into());
        }
        if self.timeout > MAX_TIMEOUT {
            return bad(format!(
                "--timeout {} s is outside (0, {limit}]",
                self.timeout.as_secs_f64()
            ));
        }
        match self.wait {
            Some(wait) if wait > MAX_TIMEOUT => bad(format!(
                "a receive's wait of {} s is longer than {limit} s (no wait: as long as none comes)",
                wait.as_secs_f64()
            )),
            _ => Ok(()),
        }
    }

    /// The sockets a TCP send to `peer` opens: [`Options::streams`], or where that is
    /// `None` this machine's choice for the route to `peer` (as `--streams auto`).
    pub fn streams_to(&self, peer: SocketAddr) -> u16 {
        self.streams
            .unwrap_or_else(|| choose_streams(&StreamFacts::here(peer)).streams)
    }

    /// The sender's configuration for `bytes` of `payload` to `peer`.
    pub(crate) fn send_options(
        &self,
        peer: SocketAddr,
        bytes: u64,
        payload: Payload,
        cooldowns: &Cooldowns,
    ) -> SendOptions {
        SendOptions {
            peer,
            chunk: self.chunk.min(bytes.max(1)),
            depth: self.depth,
            timeout: self.timeout,
            progress: false,
            protocol_version: crate::wire::VERSION,
            key: self.key.clone(),
            payload: PayloadOptions {
                payload,
                verify: self.verify.unwrap_or(VerifyMode::default_for(payload)),
                max_resends: self.max_resends,
                name: self.name.clone(),
                faults: self.test_inject_faults,
            },
            rail_timeout: crate::engine::DEFAULT_RAIL_TIMEOUT,
            cooldowns: cooldowns.clone(),
            tcp: TcpSendOptions {
                streams: self.streams_to(peer),
                rails: Vec::new(),
                test_silent_rail: None,
            },
            verbs: VerbsSendOptions {
                op: self.op,
                ..VerbsSendOptions::default()
            },
            cancel: self.cancel.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    //! A caller's mistakes, made through the safe API: each is an error, none a panic
    //! or a wait without end.
    use super::*;
    use crate::memory::HostBuffer;
    use std::io::Write as _;
    use std::time::Instant;

    fn listener(opts: &Options) -> (SocketAddr, std::thread::JoinHandle<Result<Received, Error>>) {
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
                streams: Some(0),
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
            Options {
                timeout: Duration::ZERO,
                ..Options::default()
            },
            // Past the longest wait: `Instant::now() + timeout` would overflow somewhere.
            Options {
                timeout: Duration::MAX,
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
    fn senders_that_come_together_are_taken_by_the_next_receives_not_refused_as_busy() {
        // Both offers reach the loop before the first transfer pauses the listener: the
        // second was refused "busy" though the next receive would have taken it.
        let opts = Options {
            timeout: Duration::from_secs(5),
            wait: Some(Duration::from_secs(10)),
            ..Options::default()
        };
        for round in 0..5 {
            let listener = bound(&opts);
            let addr = listener.local_addr();
            let senders: Vec<_> = (0..3u8)
                .map(|k| {
                    let opts = opts.clone();
                    std::thread::spawn(move || {
                        connect(addr, &opts)?.send(&[k; 1000], None)?;
                        Ok::<_, Error>(())
                    })
                })
                .collect();
            let mut got: Vec<u8> = (0..3)
                .map(|_| listener.receive().expect("each sender's transfer").bytes[0])
                .collect();
            got.sort_unstable();
            assert_eq!(got, [0, 1, 2], "round {round}");
            for s in senders {
                s.join()
                    .unwrap()
                    .unwrap_or_else(|e| panic!("round {round}: {e}"));
            }
        }
    }

    #[test]
    fn a_receive_whose_waits_are_out_of_range_is_an_error_not_a_panic() {
        let day = MAX_TIMEOUT;
        let too_long = day + Duration::from_secs(1);
        for opts in [
            Options {
                timeout: Duration::MAX,
                ..Options::default()
            },
            Options {
                wait: Some(Duration::MAX),
                ..Options::default()
            },
        ] {
            let Err(e) = Listener::bind("127.0.0.1:0".parse().unwrap(), &opts) else {
                panic!("{opts:?} was taken");
            };
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        }
        // Given after the bind: the receive says so (before this check, the receive's
        // thread panicked adding the wait to the clock, and the call said only that the
        // thread ended without a result).
        let ok = Options {
            timeout: day,
            wait: Some(Duration::from_millis(50)),
            ..Options::default()
        };
        let listener = bound(&ok);
        let e = listener.receive().unwrap_err();
        assert_eq!(
            e.kind(),
            ErrorKind::TimedOut,
            "the longest wait is allowed: {e}"
        );
        let listener = listener.with_options(&Options {
            wait: Some(too_long),
            ..ok.clone()
        });
        let e = listener.receive().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(e.message().contains("86400"), "{}", e.message());
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
    fn streams_default_to_the_machines_choice_decided_once_at_connect() {
        use crate::net::tcp::streams::{choose_streams, StreamFacts};
        let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let auto = Options {
            transport: TransportKind::Tcp,
            ..Options::default()
        };
        assert_eq!(auto.streams, None, "the default is --streams auto");
        let chosen = choose_streams(&StreamFacts::here(peer)).streams;
        let sent_with = |o: &Options| {
            o.send_options(peer, 1 << 20, Payload::Opaque, &Cooldowns::new())
                .tcp
                .streams
        };
        assert_eq!(sent_with(&auto), chosen);
        let endpoint = send::connect(peer, &auto).unwrap();
        assert_eq!(endpoint.streams(), chosen);
        assert_eq!(endpoint.options().streams, Some(chosen));
        let three = Options {
            streams: Some(3),
            ..auto
        };
        assert_eq!(sent_with(&three), 3);
        assert_eq!(send::connect(peer, &three).unwrap().streams(), 3);
    }

    #[test]
    fn a_sender_that_trickles_cannot_hold_receive_one() {
        // 1 MiB offered at a --min-rate of 1 MiB/s, --timeout 1 s: over within ~2 s.
        let opts = Options {
            timeout: Duration::from_secs(1),
            ..Options::default()
        };
        let (addr, receiving) = listener(&opts);
        let mut s = offer_by_hand(addr);
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

    #[test]
    fn a_receive_cancelled_mid_transfer_ends_at_once_and_hangs_up_on_the_sender() {
        // A sender that offers 1 MiB and then trickles a byte every 100 ms, below any
        // rate the receive would stop it for within its 30 s timeout: the cancel does.
        let opts = Options {
            timeout: Duration::from_secs(30),
            min_rate: 0,
            ..Options::default()
        };
        let listener = bound(&opts);
        let addr = listener.local_addr();
        let receiving = listener.start_receive_into(vec![0u8; 1 << 20]).unwrap();
        let mut s = offer_by_hand(addr);
        // The accept, then a chunk's frame and a byte at a time.
        let mut accept = [0u8; crate::wire::ACCEPT_LEN];
        std::io::Read::read_exact(&mut s, &mut accept).unwrap();
        let frame = crate::net::tcp::frames::Frame {
            offset: 0,
            len: 1 << 20,
            crc: 0,
        };
        s.write_all(&frame.encode()).unwrap();
        let trickle = std::thread::spawn(move || {
            for k in 0..300 {
                std::thread::sleep(Duration::from_millis(100));
                if s.write_all(&[0]).is_err() {
                    return Some(k);
                }
            }
            None
        });
        std::thread::sleep(Duration::from_millis(500));
        let t0 = Instant::now();
        receiving.cancel();
        let (got, _buf) = receiving.wait();
        let e = got.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        // The sender's writes fail soon after: the connection was broken off.
        let stopped = trickle.join().unwrap();
        assert!(
            stopped.is_some_and(|k| k < 30),
            "the sender could go on writing"
        );
    }

    /// A sender made by hand: its first socket, which has offered 1 MiB in one chunk
    /// (and said its hello); what it sends next is the test's.
    fn offer_by_hand(addr: SocketAddr) -> std::net::TcpStream {
        let header =
            crate::wire::Header::of(crate::wire::Op::Send, 1 << 20, 1 << 20, 16, Payload::Opaque)
                .unwrap();
        offer_by_hand_of(addr, header)
    }

    /// A sender's first bytes, `header` and stream 0's hello, written by hand.
    fn offer_by_hand_of(addr: SocketAddr, header: crate::wire::Header) -> std::net::TcpStream {
        let hello = crate::net::tcp::frames::Hello {
            index: 0,
            count: 1,
            rail: 0,
            token: 1,
        };
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(&[&header.encode()[..], &hello.encode()[..]].concat())
            .unwrap();
        s
    }

    /// Bytes that say where they are: a wrong offset or a stale chunk shows.
    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
            .collect()
    }

    fn bound(opts: &Options) -> Listener {
        Listener::bind("127.0.0.1:0".parse().unwrap(), opts).unwrap()
    }

    #[test]
    fn receive_into_lands_odd_sizes_in_place_with_the_senders_name() {
        let opts = Options {
            chunk: 64 << 10,
            ..Options::default()
        };
        for len in [1usize, 3, 4097, (1 << 20) + 3] {
            let listener = bound(&opts);
            let addr = listener.local_addr();
            let data = pattern(len, len as u8);
            let receiving = std::thread::spawn(move || {
                let mut buf = vec![0u8; len];
                let at = buf.as_ptr();
                let report = listener.receive_into(&mut buf);
                // Landed where it was asked to, not in a buffer of the library's.
                assert_eq!(buf.as_ptr(), at);
                report.map(|r| (r, buf))
            });
            let sent = connect(addr, &opts)
                .unwrap()
                .send(&data, Some("odd"))
                .unwrap();
            assert!(sent.receiver.is_some_and(|v| v.ok()));
            let (report, buf) = receiving.join().unwrap().unwrap();
            assert!(buf == data, "{len} bytes differ");
            assert_eq!(report.bytes, len as u64);
            assert_eq!(report.integrity.name.as_deref(), Some("odd"));
            assert!(report.integrity.chunks_checked > 0);
        }
    }

    #[test]
    fn an_offer_of_another_size_is_refused_before_a_byte_lands() {
        let opts = Options {
            wait: Some(Duration::from_millis(1500)),
            ..Options::default()
        };
        let listener = bound(&opts);
        let addr = listener.local_addr();
        let receiving = std::thread::spawn(move || {
            let mut buf = vec![0xabu8; 100];
            let r = listener.receive_into(&mut buf);
            (r, buf)
        });
        let endpoint = connect(addr, &opts).unwrap();
        for len in [101usize, 99] {
            let e = endpoint.send(&pattern(len, 1), None).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Rejected, "{e}");
            assert!(e.message().contains("exactly 100 bytes"), "{}", e.message());
        }
        // The right size, but several transfers offered on one connection (the CLI's
        // `--iters 3 --reuse-connection`): refused in words the sender can act on, not
        // as an inconsistent header.
        let data = HostBuffer::zeroed(100).unwrap();
        let cfg = opts.send_options(addr, 100, Payload::Opaque, &Cooldowns::new());
        let log = crate::memory_path::AttemptLog::default();
        let e = crate::engine::connect::send_tcp(&cfg, &data, &log, 3).unwrap_err();
        assert!(
            e.to_string().contains("one transfer per offer")
                && e.to_string().contains("asked for 3")
                && e.to_string().contains("drop --reuse-connection"),
            "{e}"
        );
        let (r, buf) = receiving.join().unwrap();
        // Nobody sent the right size within the wait: a timeout, and the buffer as it was;
        // the timeout names the last offer refused meanwhile.
        let e = r.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
        assert!(
            e.message().contains("no transfer arrived")
                && e.message().contains("the last offer, from 127.0.0.1:")
                && e.message().contains("one transfer per offer"),
            "{}",
            e.message()
        );
        assert!(buf.iter().all(|&b| b == 0xab));
    }

    #[test]
    fn a_receive_with_no_sender_ends_at_its_wait() {
        let opts = Options {
            wait: Some(Duration::from_millis(300)),
            ..Options::default()
        };
        let listener = bound(&opts);
        let t0 = Instant::now();
        let e = listener.receive().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        // And the listener serves the next receive.
        let addr = listener.local_addr();
        let sending = std::thread::spawn(move || {
            connect(addr, &Options::default())
                .unwrap()
                .send(b"after", None)
        });
        let got = listener.receive();
        assert_eq!(got.unwrap().bytes, b"after");
        sending.join().unwrap().unwrap();
    }

    #[test]
    fn accept_shows_each_offer_first_and_the_caller_sizes_its_buffer_from_it() {
        let opts = Options {
            chunk: 64 << 10,
            ..Options::default()
        };
        let listener = bound(&opts);
        let addr = listener.local_addr();
        let lens = [1usize, 4097, (1 << 20) + 3, 7];
        let receiving = std::thread::spawn(move || {
            let mut got = Vec::new();
            for k in 0..lens.len() {
                let incoming = listener.accept().unwrap();
                assert_eq!(incoming.peer().ip(), addr.ip());
                let name = incoming.name().map(str::to_string);
                let len = incoming.len() as usize;
                match k % 2 {
                    // Into a buffer of the caller's, allocated for the size it was shown.
                    0 => {
                        let mut buf = vec![0u8; len];
                        let at = buf.as_ptr();
                        let report = incoming.receive_into(&mut buf).unwrap();
                        assert_eq!(buf.as_ptr(), at);
                        assert_eq!(report.bytes, len as u64);
                        got.push((name, buf));
                    }
                    // Into bytes of the library's.
                    _ => {
                        let received = incoming.receive().unwrap();
                        assert_eq!(received.name, name);
                        got.push((name, received.bytes));
                    }
                }
            }
            got
        });
        let endpoint = connect(addr, &opts).unwrap();
        for (k, &len) in lens.iter().enumerate() {
            let name = format!("t{k}");
            let sent = endpoint.send(&pattern(len, k as u8), Some(&name)).unwrap();
            assert!(sent.receiver.is_some_and(|v| v.ok()));
        }
        let got = receiving.join().unwrap();
        for (k, (name, bytes)) in got.into_iter().enumerate() {
            assert_eq!(name.as_deref(), Some(format!("t{k}").as_str()));
            assert!(bytes == pattern(lens[k], k as u8), "transfer {k} differs");
        }
    }

    #[test]
    fn a_declined_offer_and_a_buffer_of_another_size_refuse_before_a_byte_lands() {
        let opts = Options::default();
        let listener = bound(&opts);
        let addr = listener.local_addr();
        let receiving = std::thread::spawn(move || {
            listener.accept().unwrap().decline();
            // A buffer of another size: an error here, and the offer declined.
            let mut small = vec![0xabu8; 9];
            let e = listener
                .accept()
                .unwrap()
                .receive_into(&mut small)
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            assert!(small.iter().all(|&b| b == 0xab));
            // Dropped undecided: declined too. Then one taken, on the same listener.
            drop(listener.accept().unwrap());
            listener.accept().unwrap().receive().unwrap().bytes
        });
        let endpoint = connect(addr, &opts).unwrap();
        for _ in 0..3 {
            let e = endpoint.send(b"not wanted", None).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Rejected, "{e}");
            assert!(e.message().contains("declined"), "{}", e.message());
        }
        endpoint.send(b"wanted", None).unwrap();
        assert_eq!(receiving.join().unwrap(), b"wanted");
    }

    #[test]
    fn an_offer_not_taken_within_the_timeout_is_declined_and_says_so_at_both_ends() {
        let opts = Options {
            timeout: Duration::from_millis(400),
            ..Options::default()
        };
        let listener = bound(&opts);
        let addr = listener.local_addr();
        let receiving = std::thread::spawn(move || {
            let incoming = listener.accept().unwrap();
            std::thread::sleep(Duration::from_millis(900));
            let mut buf = vec![0u8; incoming.len() as usize];
            incoming.receive_into(&mut buf)
        });
        let sender_opts = Options {
            timeout: Duration::from_secs(5),
            ..Options::default()
        };
        let e = connect(addr, &sender_opts)
            .unwrap()
            .send(b"too late", None)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Rejected, "{e}");
        let e = receiving.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
        assert!(e.message().contains("not taken within"), "{}", e.message());
    }

    /// An offer refused after its caller lent memory for it (here: several transfers on
    /// one connection, which a lent buffer never takes) ends the call with that refusal.
    /// It went on waiting for another sender the caller was never asked about (until
    /// the listener's wait, then called the refusal a timeout; with no wait, for ever).
    #[test]
    fn an_offer_refused_after_the_caller_lent_memory_for_it_ends_the_receive() {
        let opts = Options {
            wait: Some(Duration::from_secs(20)),
            ..Options::default()
        };
        let listener = bound(&opts);
        let addr = listener.local_addr();
        let header =
            crate::wire::Header::of(crate::wire::Op::Send, 4096, 4096, 16, Payload::Opaque)
                .unwrap()
                .with_transfers(2)
                .unwrap();
        let _sender = offer_by_hand_of(addr, header);
        let incoming = listener.accept().unwrap();
        let t0 = std::time::Instant::now();
        let mut buf = vec![0u8; incoming.len() as usize];
        let e = incoming.receive_into(&mut buf).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Rejected, "{e}");
        assert!(e.message().contains("one transfer"), "{}", e.message());
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    }

    /// A kept connection's next offer is held to the listener's `max_bytes` as a new
    /// connection's is: it skipped the check (made in the listener's handshake), and
    /// `accept` showed an offer of any size.
    #[test]
    fn a_kept_connections_next_offer_over_max_bytes_is_refused_before_it_is_shown() {
        let opts = Options {
            max_bytes: 1 << 20,
            wait: Some(Duration::from_secs(3)),
            ..Options::default()
        };
        let listener = bound(&opts);
        let addr = listener.local_addr();
        let receiving = std::thread::spawn(move || {
            let first = listener.accept().unwrap().receive().unwrap().bytes;
            (first, listener.accept().map(|i| i.len()))
        });
        let endpoint = connect(addr, &Options::default()).unwrap();
        endpoint.send(b"small", None).unwrap();
        let e = endpoint.send(&vec![7u8; 2 << 20], None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Rejected, "{e}");
        let (first, second) = receiving.join().unwrap();
        assert_eq!(first, b"small");
        let e = second.expect_err("an offer over max_bytes was shown to the caller");
        assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
        assert!(
            e.message().contains("exceeds its --max-bytes"),
            "{}",
            e.message()
        );
    }

    #[test]
    fn accept_with_no_sender_ends_at_its_wait() {
        let opts = Options {
            wait: Some(Duration::from_millis(300)),
            ..Options::default()
        };
        let e = bound(&opts).accept().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    }

    #[test]
    fn one_endpoint_and_one_listener_carry_a_hundred_transfers() {
        let opts = Options::default();
        let listener = bound(&opts);
        let addr = listener.local_addr();
        let receiving = std::thread::spawn(move || {
            let mut sizes = Vec::new();
            for i in 0..100usize {
                let mut buf = vec![0u8; 1000 + i];
                listener.receive_into(&mut buf).unwrap();
                assert!(buf == pattern(1000 + i, i as u8), "transfer {i} differs");
                sizes.push(buf.len());
            }
            sizes
        });
        let endpoint = connect(addr, &opts).unwrap();
        for i in 0..100usize {
            let sent = endpoint.send(&pattern(1000 + i, i as u8), None).unwrap();
            // One connection: opened by the first, kept for every one after it.
            assert_eq!(sent.kept_connection, i > 0, "transfer {i}");
        }
        let sizes = receiving.join().unwrap();
        assert_eq!(sizes.len(), 100);
    }

    #[test]
    fn a_kept_connection_carries_sizes_names_refusals_and_faults_and_reopens_when_closed() {
        let opts = Options {
            chunk: 64 << 10,
            timeout: Duration::from_millis(1500),
            test_inject_faults: Some(crate::transfer::faults::FaultInjector::parse("1/5").unwrap()),
            max_resends: 8,
            ..Options::default()
        };
        let listener = bound(&opts);
        let addr = listener.local_addr();
        let lens = [(3 << 20) + 1, 1, 65536, 12_345];
        let receiving = std::thread::spawn(move || {
            let mut got = Vec::new();
            for len in lens {
                let incoming = listener.accept().unwrap();
                assert_eq!(incoming.len(), len as u64);
                got.push(incoming.receive().unwrap());
            }
            // A next offer declined on the kept connection: it closes, the sender's next
            // send opens another.
            listener.accept().unwrap().decline();
            got.push(listener.receive().unwrap());
            // The receiver waits its timeout (1.5 s) for a next offer, then closes: the
            // send after that finds it closed and opens a new one.
            got.push(listener.receive().unwrap());
            got
        });
        let endpoint = connect(addr, &opts).unwrap();
        for (k, &len) in lens.iter().enumerate() {
            let sent = endpoint
                .send(&pattern(len, k as u8), Some(&format!("n{k}")))
                .unwrap();
            assert_eq!(sent.kept_connection, k > 0, "transfer {k}");
        }
        let e = endpoint.send(b"declined", None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Rejected, "{e}");
        let sent = endpoint.send(b"after the refusal", None).unwrap();
        assert!(!sent.kept_connection, "a refused connection is not kept");
        std::thread::sleep(Duration::from_millis(2500));
        let sent = endpoint.send(b"after the idle close", None).unwrap();
        assert!(
            !sent.kept_connection,
            "the receiver closed it after 1.5 s idle"
        );
        let got = receiving.join().unwrap();
        for (k, &len) in lens.iter().enumerate() {
            assert_eq!(got[k].name.as_deref(), Some(format!("n{k}").as_str()));
            assert!(
                got[k].bytes == pattern(len, k as u8),
                "transfer {k} differs"
            );
        }
        assert!(
            got[..lens.len()]
                .iter()
                .any(|r| !r.report.integrity.repaired.is_empty()),
            "faults 1 in 5 and nothing repaired"
        );
        assert_eq!(got[4].bytes, b"after the refusal");
        assert_eq!(got[5].bytes, b"after the idle close");
    }

    #[test]
    fn a_next_offer_nobody_takes_times_out_as_a_new_connections_offer_does() {
        let opts = Options {
            timeout: Duration::from_millis(500),
            ..Options::default()
        };
        let listener = bound(&opts);
        let addr = listener.local_addr();
        let receiving = std::thread::spawn(move || {
            let first = listener.receive().unwrap().bytes;
            // No receive for a while: the next offer is held, unanswered, then dropped
            // (older than the listener's timeout) when the next receive starts.
            std::thread::sleep(Duration::from_millis(1000));
            (first, listener.receive().unwrap().bytes)
        });
        let endpoint = connect(addr, &opts).unwrap();
        endpoint.send(b"first", None).unwrap();
        let e = endpoint.send(b"unanswered", None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
        std::thread::sleep(Duration::from_millis(1000));
        let sent = endpoint.send(b"third", None).unwrap();
        assert!(
            !sent.kept_connection,
            "a connection whose offer timed out is not kept"
        );
        let (first, third) = receiving.join().unwrap();
        assert_eq!(
            (first.as_slice(), third.as_slice()),
            (&b"first"[..], &b"third"[..])
        );
    }

    #[test]
    fn a_cancelled_receive_ends_at_once_and_the_listener_serves_the_next() {
        // Waiting for a sender with no end (wait None): the cancel ends it.
        let opts = Options::default();
        let listener = bound(&opts);
        let addr = listener.local_addr();
        let receiving = listener.start_receive_into(vec![0u8; 5]).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let t0 = Instant::now();
        receiving.cancel();
        let (got, _buf) = receiving.wait();
        let e = got.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        // The listener goes on.
        let next = listener.start_receive_into(vec![0u8; 5]).unwrap();
        connect(addr, &opts).unwrap().send(b"after", None).unwrap();
        let (got, buf) = next.wait();
        got.unwrap();
        assert_eq!(buf, b"after");
    }

    #[test]
    fn a_send_cancelled_while_its_next_offer_waits_ends_at_once_and_is_not_retried() {
        let opts = Options {
            timeout: Duration::from_secs(20),
            ..Options::default()
        };
        let listener = bound(&opts);
        let addr = listener.local_addr();
        let endpoint = connect(addr, &opts).unwrap();
        let receiving = listener.start_receive_into(vec![0u8; 5]).unwrap();
        endpoint.send(b"first", None).unwrap();
        receiving.wait().0.unwrap();
        // No receive now: the next offer waits for an answer (up to 20 s), until the
        // cancel.
        let pending = endpoint.start_send(b"second".to_vec(), None).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        pending.cancel();
        let (sent, back) = pending.wait();
        let e = sent.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert_eq!(back, b"second");
        // The endpoint opens a new connection for its next send, which a receive takes.
        let receiving = listener.start_receive_into(vec![0u8; 5]).unwrap();
        let sent = endpoint.send(b"third", None).unwrap();
        assert!(!sent.kept_connection);
        let (got, buf) = receiving.wait();
        got.unwrap();
        assert_eq!(buf, b"third");
    }

    #[test]
    fn a_send_cancelled_while_its_offer_waits_for_an_answer_ends_at_once() {
        // A listener in no receive: the connection is taken by the system, the offer
        // waits for an answer (up to 20 s), until the cancel.
        let opts = Options {
            timeout: Duration::from_secs(20),
            transport: TransportKind::Tcp,
            ..Options::default()
        };
        let listener = bound(&opts);
        let pending = connect(listener.local_addr(), &opts)
            .unwrap()
            .start_send(b"unanswered".to_vec(), None)
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        pending.cancel();
        let e = pending.wait().0.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    }

    #[test]
    fn a_send_cancelled_before_it_starts_opens_no_connection() {
        let opts = Options {
            wait: Some(Duration::from_millis(300)),
            transport: TransportKind::Tcp,
            ..Options::default()
        };
        let listener = bound(&opts);
        let cancel = Cancel::new();
        cancel.cancel();
        let endpoint = connect(listener.local_addr(), &opts)
            .unwrap()
            .with_cancel(&cancel);
        let e = endpoint.send(b"never", None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");
        // Nothing came to the listener.
        let waited = listener.accept().unwrap_err();
        assert_eq!(waited.kind(), ErrorKind::TimedOut, "{waited}");
    }

    #[test]
    fn pending_transfers_are_polled_to_their_end_and_give_the_memory_back() {
        let opts = Options {
            chunk: 256 << 10,
            ..Options::default()
        };
        let listener = bound(&opts);
        let addr = listener.local_addr();
        let data = pattern((8 << 20) + 1, 7);
        let mut receiving = listener.start_receive_into(vec![0u8; data.len()]).unwrap();
        let mut sending = connect(addr, &opts)
            .unwrap()
            .start_send(data.clone(), None)
            .unwrap();
        let t0 = Instant::now();
        let mut polls = 0u64;
        while !(sending.is_done() && receiving.is_done()) {
            assert!(t0.elapsed() < Duration::from_secs(30), "never done");
            polls += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(polls > 0);
        let (sent, back) = sending.wait();
        assert!(sent.unwrap().receiver.is_some_and(|v| v.ok()));
        assert!(back == data);
        let (got, buf) = receiving.wait();
        got.unwrap();
        assert!(buf == data);
    }

    /// A receive whose `Pending` is dropped undone is cancelled: it went on serving (with
    /// no wait, for ever), took the next sender's transfer into a buffer nobody would
    /// see, and the listener's next receive waited in vain.
    #[test]
    fn a_pending_receive_dropped_undone_is_cancelled_and_takes_no_transfer() {
        let opts = Options {
            wait: Some(Duration::from_secs(4)),
            ..Options::default()
        };
        let listener = bound(&opts);
        let addr = listener.local_addr();
        drop(listener.start_receive_into(vec![0u8; 5]).unwrap());
        // The cancel is seen between transfers, within a moment.
        std::thread::sleep(Duration::from_millis(300));
        let sending = std::thread::spawn(move || {
            connect(addr, &Options::default())
                .unwrap()
                .send(b"hello", None)
        });
        // The sender's offer waits in the listen queue for the next receive (had the
        // dropped one gone on, it would have taken the transfer by now).
        std::thread::sleep(Duration::from_millis(700));
        let got = listener.receive().unwrap();
        assert_eq!(got.bytes, b"hello");
        sending.join().unwrap().unwrap();
    }

    /// A sender that floods control messages nobody asked for (here empty ones) ends its
    /// transfer: each was kept, unbounded, and counted as news against the idle timeout,
    /// so memory grew at line rate until the whole transfer's deadline.
    #[test]
    fn a_sender_that_floods_messages_nobody_asked_for_ends_its_transfer() {
        let opts = Options {
            wait: Some(Duration::from_secs(10)),
            ..Options::default()
        };
        let listener = bound(&opts);
        let addr = listener.local_addr();
        let receiving = std::thread::spawn(move || listener.receive());
        let mut sender = offer_by_hand(addr);
        let flood: Vec<u8> = (0..10_000)
            .flat_map(|_| crate::net::tcp::frames::Frame::control(&[]).encode())
            .collect();
        // The receiver may break the connection off before the flood is all written.
        let _ = sender.write_all(&flood);
        let e = receiving.join().unwrap().unwrap_err();
        assert!(
            e.message().contains("more messages than were asked for"),
            "{e}"
        );
    }

    #[test]
    fn injected_faults_are_repaired_into_the_callers_buffer() {
        let opts = Options {
            chunk: 64 << 10,
            test_inject_faults: Some(crate::transfer::faults::FaultInjector::parse("1/3").unwrap()),
            max_resends: 8,
            ..Options::default()
        };
        let listener = bound(&opts);
        let addr = listener.local_addr();
        let data = pattern((4 << 20) + 5, 3);
        let len = data.len();
        let receiving = std::thread::spawn(move || {
            let mut buf = vec![0u8; len];
            listener.receive_into(&mut buf).map(|r| (r, buf))
        });
        connect(addr, &opts).unwrap().send(&data, None).unwrap();
        let (report, buf) = receiving.join().unwrap().unwrap();
        assert!(buf == data);
        assert!(
            !report.integrity.repaired.is_empty(),
            "nothing was repaired"
        );
    }

    #[test]
    fn a_wrong_key_is_rejected_with_its_kind() {
        let key = |b: u8| Some(crate::server::Key::from_bytes(&[b; 32]).unwrap());
        let recv_opts = Options {
            key: key(1),
            wait: Some(Duration::from_secs(2)),
            ..Options::default()
        };
        let listener = bound(&recv_opts);
        let addr = listener.local_addr();
        let receiving = std::thread::spawn(move || listener.receive());
        let e = connect(
            addr,
            &Options {
                key: key(2),
                ..Options::default()
            },
        )
        .unwrap()
        .send(b"secret", None)
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Rejected, "{e}");
        assert_eq!(
            receiving.join().unwrap().unwrap_err().kind(),
            ErrorKind::TimedOut
        );
    }
}
