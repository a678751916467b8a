//! Tutorial example 4 (docs/tutorial.md, step 8): send a buffer you own over TCP with
//! the library's transport, and have the receiver verify it. Both ends run in this one
//! process, over 127.0.0.1; no GPU and no RDMA device needed.
//!
//! ```sh
//! cargo run -p host-examples --bin tcp-send [BYTES]    # default 16 MiB
//! ```
//!
//! The receiver (`engine::serve::serve`) and the sender (`engine::connect::send_tcp`)
//! are the ones
//! `host recv --transport tcp` and `host ... --transport tcp` run: an offer (a 32-byte
//! header), an accept, the data in chunks, and an acknowledgement carrying the
//! receiver's verdict after it checked every element.

use anyhow::{bail, Context as _, Result};
use gpu_kernels::pattern;
use host::engine::{RecvMemory, RecvOptions, SendOptions};
use host::memory::HostBuffer;
use host::memory_path::AttemptLog;
use host::transfer::RecvOutcome;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(10); // bounds every socket wait, both ends

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let bytes = match std::env::args().nth(1) {
        None => 16 << 20,
        Some(s) => host::units::parse_size(&s).map_err(anyhow::Error::msg)?,
    };
    // The buffer we own: page-aligned host memory, each i32 set to the pattern by the
    // same function the GPU kernel and the receiver's check call.
    if bytes == 0 || !bytes.is_multiple_of(pattern::ELEMENT_BYTES as u64) {
        bail!("{bytes} bytes is not a whole number of i32 elements (at least one)");
    }
    let mut buffer = HostBuffer::zeroed(bytes as usize)?;
    for (i, x) in buffer.as_i32_mut().iter_mut().enumerate() {
        *x = pattern::value(i as u64);
    }

    // The receiver on a thread of its own. Port 0: the system picks a free port, which
    // the first outcome (`Listening`) tells; `once`: return after one transfer.
    let (outcomes, rx) = mpsc::channel();
    // The admission's other limits (docs/internals.md, "The receiver against a careless
    // or hostile network") are generous here: one sender on loopback.
    let receiver = RecvOptions::once_on("127.0.0.1:0".parse()?, bytes);
    let served = std::thread::spawn(move || {
        let mut report = |o: &RecvOutcome| drop(outcomes.send(describe(o)));
        host::engine::serve::serve(&receiver, &RecvMemory::Host, &mut report)
    });
    let listening = rx
        .recv_timeout(TIMEOUT)
        .context("the receiver did not start")?;
    let Some(addr) = listening.strip_prefix("listening on ") else {
        bail!("receiver: {listening}");
    };
    println!("receiver: {listening}");

    // The sender: offer, chunks of 1 MiB with up to 4 handed to the socket writer at
    // once, one stream (socket), then wait for the receiver's verdict.
    let cfg = SendOptions {
        depth: 4,
        // The built-in pattern, checked element by element (--verify pattern); no
        // --key-file; one stream.
        ..SendOptions::to(addr.parse()?)
    };
    // A HostBuffer is a `SendSource`; the memory log is empty: we chose the memory.
    let reports = host::engine::connect::send_tcp(&cfg, &buffer, &AttemptLog::default(), 1)?;
    let report = &reports[0];
    let verdict = report
        .receiver
        .as_ref()
        .context("no verdict from the receiver")?;
    println!(
        "sender: {} bytes in {} chunk(s), {:.6} s ({:.3} GB/s); receiver's verdict: {:?}",
        report.bytes, report.chunks, report.seconds, report.gbps, verdict.status
    );
    // The receiver's own account of it, and its thread's end (it returns after `once`).
    println!(
        "receiver: {}",
        rx.recv_timeout(TIMEOUT).context("no outcome")?
    );
    let receiver_ok = served
        .join()
        .map_err(|_| anyhow::anyhow!("the receiver's thread panicked"))??;
    if !verdict.ok() || !receiver_ok {
        bail!("the receiver did not verify the data");
    }
    Ok(())
}

/// An outcome of the receiver in one line.
fn describe(outcome: &RecvOutcome) -> String {
    match outcome {
        RecvOutcome::Listening { addr } => format!("listening on {addr}"),
        RecvOutcome::Rejected { peer, reason } => format!("rejected {peer}: {reason}"),
        RecvOutcome::Failed { peer, error } => format!("transfer from {peer} failed: {error}"),
        RecvOutcome::Notice { text } => text.clone(),
        RecvOutcome::Completed(r) => match &r.verification {
            Some(v) if v.ok() => format!(
                "verified {} bytes: all {} elements match, first values {:?}",
                r.bytes, v.elements, r.first_values
            ),
            Some(v) => format!(
                "{} of {} elements wrong, first at {:?}",
                v.mismatches, v.elements, v.first_mismatch
            ),
            None => format!(
                "could not verify: {}",
                r.verify_error.as_deref().unwrap_or("?")
            ),
        },
    }
}
