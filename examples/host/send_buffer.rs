//! Send a buffer you own with the library (`host::api`): GPU memory you allocated and
//! filled, or, on a machine whose driver reports no GPU, host memory. Every chunk's
//! CRC32C is computed where the data lives (the checksum kernel on the GPU), the
//! receiver checks each chunk where it landed, a failed chunk is sent again, and the
//! receiver's digest of the whole must equal the sender's.
//!
//! ```sh
//! cargo run -p host-examples --bin receive-buffer              # prints its address
//! cargo run -p host-examples --bin send-buffer -- 127.0.0.1:PORT [BYTES]
//! ```

use anyhow::{Context as _, Result};
use host::api::{self, Options};
use host::transfer::SendReport;
use std::net::SocketAddr;
use std::process::ExitCode;

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
    let mut args = std::env::args().skip(1);
    let peer: SocketAddr = args
        .next()
        .context("usage: send-buffer <ip:port> [BYTES]")?
        .parse()
        .context("the receiver's address, as 127.0.0.1:7471")?;
    let bytes = match args.next() {
        Some(s) => host::units::parse_size(&s).map_err(anyhow::Error::msg)?,
        None => (64 << 20) + 3, // not a whole number of anything, on purpose
    };
    // Your data: here bytes that spell out their own offsets, so a misplaced byte shows.
    let data: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    let opts = Options {
        name: Some("send-buffer.bin".into()),
        ..Options::default()
    };
    let report = send(peer, &data, &opts)?;
    let verdict = report.receiver.context("no verdict from the receiver")?;
    println!(
        "sent {} bytes in {} chunks: {:.3} GB/s; receiver: {:?}, digest {:#010x}, {} chunk(s) repaired",
        report.bytes,
        report.chunks,
        report.gbps,
        verdict.status,
        report.integrity.digest.unwrap_or(0),
        report.integrity.repaired.len()
    );
    anyhow::ensure!(verdict.ok(), "the receiver did not verify the data");
    Ok(())
}

/// From GPU memory where there is a GPU; from host memory where the driver says there
/// is none (any other GPU failure is an error).
#[cfg(feature = "cuda")]
fn send(peer: SocketAddr, data: &[u8], opts: &Options) -> Result<SendReport> {
    use host::gpu::allocations::DeviceBuffer;
    use host::gpu::{Gpu, GpuError};
    match Gpu::open(0) {
        Ok(gpu) => {
            let mut buffer = DeviceBuffer::new(&gpu, data.len())?;
            buffer.write(0, data)?; // your kernel would fill it instead
            println!("sending from GPU memory of GPU 0 ({})", gpu.name());
            let (report, _buffer) = api::send_device(peer, buffer, opts)?;
            Ok(report)
        }
        Err(GpuError::NoGpu { why }) => {
            println!("sending from host memory (no GPU: {why})");
            send_host(peer, data, opts)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(not(feature = "cuda"))]
fn send(peer: SocketAddr, data: &[u8], opts: &Options) -> Result<SendReport> {
    println!("sending from host memory (built without the cuda feature)");
    send_host(peer, data, opts)
}

fn send_host(peer: SocketAddr, data: &[u8], opts: &Options) -> Result<SendReport> {
    let mut buffer = host::memory::HostBuffer::zeroed(data.len())?;
    buffer.write_at(0, data)?;
    Ok(api::send_host(peer, &buffer, opts)?)
}
