//! `host bench tcp`: this project's TCP transfer against a plain socket copy of the same
//! bytes with the same chunking, both over loopback in this process, rounds interleaved.
//! Both are timed on the receiving side, from the moment its sockets are connected to the
//! last byte read into its (already faulted-in) buffer.

use anyhow::{bail, Context, Result};
use host::memory::host_buffer::verify_bytes;
use host::memory::select::AttemptLog;
use host::memory::HostBuffer;
use host::transfer::RecvOutcome;
use host::transport::tcp::frames::{Frame, FRAME_LEN};
use host::transport::tcp::{self, RecvMemory, TcpRecvConfig, TcpSendConfig};
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
        reference.push(reference_round(&plain, len, chunk)?);
    }
    let ours_med = median(&ours);
    let ref_med = median(&reference);
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({
            "benchmark": "tcp loopback: host's TCP transport vs a plain socket copy",
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

fn stats(v: &[f64]) -> serde_json::Value {
    json!({
        "median_gb_per_s": median(v),
        "min_gb_per_s": v.iter().copied().fold(f64::INFINITY, f64::min),
        "max_gb_per_s": v.iter().copied().fold(0.0, f64::max),
        "rounds_gb_per_s": v,
    })
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get((s.len().max(1) - 1) / 2).copied().unwrap_or(0.0)
}

/// One transfer through the real receiver (`serve`, host memory, --once) and sender.
fn project_round(source: &HostBuffer, size: u64, chunk: u64, streams: u16) -> Result<f64> {
    let (addr_tx, addr_rx) = mpsc::channel::<String>();
    let (report_tx, report_rx) = mpsc::channel::<RecvOutcome>();
    let receiver = std::thread::spawn(move || {
        let cfg = TcpRecvConfig {
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
        };
        tcp::serve(&cfg, &RecvMemory::Host, &mut |o| match o {
            RecvOutcome::Listening { addr } => {
                let _ = addr_tx.send(addr.clone());
            }
            other => {
                let _ = report_tx.send(other.clone());
            }
        })
    });
    let addr: SocketAddr = addr_rx
        .recv_timeout(TIMEOUT)
        .context("the receiver did not start")?
        .parse()?;
    let cfg = TcpSendConfig {
        peer: addr,
        bytes: size,
        chunk,
        depth: 16,
        streams,
        timeout: TIMEOUT,
        progress: false,
        protocol_version: host::transfer::header::VERSION,
        key: None,
    };
    let sent = tcp::send_repeated(&cfg, source, &AttemptLog::default(), 1)?;
    let outcome = report_rx.recv_timeout(TIMEOUT).context("no outcome")?;
    let _ = receiver.join();
    let RecvOutcome::Completed(r) = outcome else {
        bail!("the transfer did not complete: {outcome:?}");
    };
    if !r.ok() || !sent.iter().all(|s| s.receiver.is_some_and(|v| v.ok())) {
        bail!("the transfer did not verify");
    }
    Ok(r.gbps)
}

/// The reference: one socket, one writer thread writing a 12-byte frame header and the
/// chunk, one reader reading them into place; a byte back at the end.
fn reference_round(bytes: &[u8], len: usize, chunk: usize) -> Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let mut dest = vec![0xffu8; len];
    let reader = std::thread::spawn(move || -> Result<(f64, Vec<u8>)> {
        let (mut s, _) = listener.accept()?;
        s.set_read_timeout(Some(TIMEOUT))?;
        let start = Instant::now();
        let mut head = [0u8; FRAME_LEN];
        let mut got = 0usize;
        while got < dest.len() {
            s.read_exact(&mut head)?;
            let f = Frame::decode(&head);
            let (at, n) = (f.offset as usize, f.len as usize);
            let place = dest
                .get_mut(at..at + n)
                .context("frame outside the buffer")?;
            s.read_exact(place)?;
            got += n;
        }
        let seconds = start.elapsed().as_secs_f64();
        s.write_all(&[1])?;
        Ok((seconds, dest))
    });
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    s.set_write_timeout(Some(TIMEOUT))?;
    s.set_read_timeout(Some(TIMEOUT))?;
    for (i, piece) in bytes.chunks(chunk).enumerate() {
        let f = Frame {
            offset: (i * chunk) as u64,
            len: piece.len() as u32,
        };
        s.write_all(&f.encode())?;
        s.write_all(piece)?;
    }
    let mut done = [0u8; 1];
    s.read_exact(&mut done)?;
    let (seconds, dest) = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))??;
    if !verify_bytes(&dest).ok() {
        bail!("the reference copy is wrong");
    }
    Ok(len as f64 / seconds / 1e9)
}
