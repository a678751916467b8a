//! `host bench tcp`: this project's TCP transfer against a plain socket copy of the same
//! bytes with the same chunking, sockets and threads (one writer and one reader per
//! stream), both over loopback in this process, rounds interleaved.
//! Both are timed on the receiving side, from the moment its sockets are connected to the
//! last byte read into its (already faulted-in) buffer.

use anyhow::{bail, Context, Result};
use host::engine::{Cooldowns, RecvMemory, RecvOptions, SendOptions, TcpSendOptions};
use host::memory::host_buffer::verify_bytes;
use host::memory::HostBuffer;
use host::memory_path::AttemptLog;
use host::net::tcp::frames::{Frame, FRAME_LEN};
use host::transfer::RecvOutcome;
use serde_json::json;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(30);

pub fn run(size: u64, chunk: u64, streams: u16, rounds: u32) -> Result<ExitCode> {
    let len = usize::try_from(size)?;
    let chunk = usize::try_from(chunk.min(size))?;
    let source = HostBuffer::with_pattern(len)?;
    // The reference writes the same pattern from an ordinary vector.
    let plain = source.read_prefix(len);
    let mut ours = Vec::new();
    let mut reference = Vec::new();
    for _ in 0..rounds.max(1) {
        ours.push(project_round(&source, size, chunk as u64, streams)?);
        reference.push(reference_round(&plain, len, chunk, streams)?);
    }
    let ours_med = median(&ours);
    let ref_med = median(&reference);
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({
            "benchmark": "tcp loopback: host's TCP transport vs a plain socket copy with the same sockets and threads",
            "bytes": size,
            "chunk_bytes": chunk,
            "streams": streams,
            "rounds": rounds,
            "unit": "GB/s (10^9 bytes/s), receiver side, sockets connected to last byte in its buffer",
            "project": stats(&ours),
            "reference": stats(&reference),
            "ratio_of_medians": ours_med / ref_med,
        }))?
    );
    Ok(ExitCode::SUCCESS)
}

/// Median, min, max and every round (also `bench rails`').
pub(super) fn stats(v: &[f64]) -> serde_json::Value {
    json!({
        "median_gb_per_s": median(v),
        "min_gb_per_s": v.iter().copied().fold(f64::INFINITY, f64::min),
        "max_gb_per_s": v.iter().copied().fold(0.0, f64::max),
        "rounds_gb_per_s": v,
    })
}

pub(super) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get((s.len().max(1) - 1) / 2).copied().unwrap_or(0.0)
}

/// One transfer through the real receiver (`serve`, host memory, --once) and sender.
fn project_round(source: &HostBuffer, size: u64, chunk: u64, streams: u16) -> Result<f64> {
    let (addr_tx, addr_rx) = mpsc::channel::<String>();
    let (report_tx, report_rx) = mpsc::channel::<RecvOutcome>();
    let receiver = std::thread::spawn(move || {
        let opts = RecvOptions {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            once: true,
            max_bytes: size,
            timeout: TIMEOUT,
            max_connections: 1,
            max_memory: u64::MAX,
            min_rate: 0,
            max_per_peer: 1,
            allow: Default::default(),
            key: None,
            output: None,
            cancel: None,
        };
        let listener = TcpListener::bind(opts.bind)?;
        let admission = host::engine::serve::admission_of(&opts);
        let mut report = |o: &RecvOutcome| match o {
            RecvOutcome::Listening { addr } => {
                let _ = addr_tx.send(addr.clone());
            }
            other => {
                let _ = report_tx.send(other.clone());
            }
        };
        host::engine::serve::serve_tcp(
            listener,
            &opts,
            &RecvMemory::Host,
            &admission,
            None,
            &mut report,
        )
        .map_err(anyhow::Error::from)
    });
    let addr: SocketAddr = addr_rx
        .recv_timeout(TIMEOUT)
        .context("the receiver did not start")?
        .parse()?;
    let opts = SendOptions {
        peer: addr,
        chunk,
        depth: 16,
        timeout: TIMEOUT,
        progress: false,
        protocol_version: host::wire::VERSION,
        key: None,
        payload: host::transfer::PayloadOptions::default(),
        rail_timeout: host::engine::DEFAULT_RAIL_TIMEOUT,
        cooldowns: Cooldowns::new(),
        tcp: TcpSendOptions {
            streams,
            ..TcpSendOptions::default()
        },
        verbs: Default::default(),
        cancel: None,
    };
    let sent = host::engine::connect::send_tcp(&opts, source, &AttemptLog::default(), 1)?;
    let outcome = report_rx.recv_timeout(TIMEOUT).context("no outcome")?;
    let _ = receiver.join();
    let RecvOutcome::Completed(r) = outcome else {
        bail!("the transfer did not complete: {outcome:?}");
    };
    if !r.ok() || !sent.iter().all(host::transfer::SendReport::verified) {
        bail!("the transfer did not verify");
    }
    Ok(r.gbps)
}

/// The reference: the same number of sockets as the project's run, chunk `i` on socket
/// `i % streams`, one writer thread per socket writing a 12-byte frame header and the
/// chunk, one reader thread per socket reading them into place; a byte back at the end.
/// The same sockets and threads as the project's transfer, without its protocol.
fn reference_round(bytes: &[u8], len: usize, chunk: usize, streams: u16) -> Result<f64> {
    let n = usize::from(streams.max(1));
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let mut dest = vec![0xffu8; len];
    // Each reader's chunks, split off by the borrow checker: chunk i to reader i % n.
    let mut shares: Vec<Vec<(usize, &mut [u8])>> = (0..n).map(|_| Vec::new()).collect();
    for (i, place) in dest.chunks_mut(chunk.max(1)).enumerate() {
        shares[i % n].push((i * chunk, place));
    }
    // Connected before anything is timed (the listener's backlog holds them until
    // accepted), as the project's streams are before its clock starts.
    let writers: Vec<TcpStream> = (0..n)
        .map(|_| {
            let s = TcpStream::connect_timeout(&addr, TIMEOUT)?;
            s.set_write_timeout(Some(TIMEOUT))?;
            s.set_read_timeout(Some(TIMEOUT))?;
            Ok(s)
        })
        .collect::<Result<_>>()?;
    let readers: Vec<TcpStream> = (0..n)
        .map(|_| {
            let (s, _) = listener.accept()?;
            s.set_read_timeout(Some(TIMEOUT))?;
            Ok(s)
        })
        .collect::<Result<_>>()?;
    let seconds = std::thread::scope(|scope| -> Result<f64> {
        let start = Instant::now();
        let reading: Vec<_> = readers
            .iter()
            .zip(shares)
            .map(|(s, share)| {
                scope.spawn(move || -> Result<()> {
                    let mut s = s;
                    let mut head = [0u8; FRAME_LEN];
                    for (at, place) in share {
                        s.read_exact(&mut head)?;
                        let f = Frame::decode(&head);
                        if f.offset as usize != at || f.len as usize != place.len() {
                            bail!("frame {f:?} where {} bytes at {at} were due", place.len());
                        }
                        s.read_exact(place)?;
                    }
                    Ok(())
                })
            })
            .collect();
        let writing: Vec<_> = writers
            .iter()
            .enumerate()
            .map(|(k, s)| {
                scope.spawn(move || -> Result<()> {
                    let mut s = s;
                    for (i, piece) in bytes.chunks(chunk.max(1)).enumerate().skip(k).step_by(n) {
                        let f = Frame {
                            offset: (i * chunk) as u64,
                            len: piece.len() as u32,
                            crc: 0,
                        };
                        s.write_all(&f.encode())?;
                        s.write_all(piece)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for r in reading {
            r.join()
                .map_err(|_| anyhow::anyhow!("a reader panicked"))??;
        }
        let seconds = start.elapsed().as_secs_f64();
        for w in writing {
            w.join()
                .map_err(|_| anyhow::anyhow!("a writer panicked"))??;
        }
        // The byte back, as the project's receiver acks.
        let mut done = [0u8; 1];
        (&readers[0]).write_all(&[1])?;
        (&writers[0]).read_exact(&mut done)?;
        Ok(seconds)
    })?;
    if !verify_bytes(&dest).ok() {
        bail!("the reference copy is wrong");
    }
    Ok(len as f64 / seconds / 1e9)
}
