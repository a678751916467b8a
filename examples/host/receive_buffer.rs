//! Receive into a buffer with the library (`host::api`): one transfer, every chunk's
//! CRC32C checked where it landed (and failed chunks sent again), then the bytes placed
//! in GPU memory and checked once more there: the checksum kernel over the GPU buffer
//! must give the sender's digest. On a machine whose driver reports no GPU the bytes
//! stay in host memory and the CPU checks the digest.
//!
//! ```sh
//! cargo run -p host-examples --bin receive-buffer [ADDRESS]    # default 127.0.0.1:0
//! ```

use anyhow::{Context as _, Result};
use host::api::{self, Options};
use std::io::Write as _;
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
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:0".into())
        .parse()
        .context("an address to listen on, as 127.0.0.1:7471")?;
    let opts = Options::default();
    let listener = api::Listener::bind(addr, &opts)?;
    println!("listening on {}", listener.local_addr());
    std::io::stdout().flush()?;
    let received = listener.receive_one()?;
    let digest = received
        .report
        .integrity
        .digest
        .context("the sender sent no checksums")?;
    println!(
        "received {} bytes named {:?} from {}: CRC32C of every chunk matched, {} repaired, digest {digest:#010x}",
        received.bytes.len(),
        received.name.as_deref().unwrap_or("-"),
        received.report.peer,
        received.report.integrity.repaired.len()
    );
    let (place, again) = place(&received.bytes, opts.chunk)?;
    anyhow::ensure!(
        again == digest,
        "the bytes in {place} give digest {again:#010x}, the sender's was {digest:#010x}"
    );
    println!("checked again in {place}: digest {again:#010x} matches");
    Ok(())
}

/// Put the bytes in GPU memory and compute their digest there (the checksum kernel per
/// chunk, combined); where the driver reports no GPU, on the CPU.
#[cfg(feature = "cuda")]
fn place(bytes: &[u8], chunk: u64) -> Result<(String, u32)> {
    use host::gpu::allocations::DeviceBuffer;
    use host::gpu::{checksum, Gpu, GpuError};
    match Gpu::open(0) {
        Ok(gpu) => {
            let mut buffer = DeviceBuffer::new(&gpu, bytes.len())?;
            buffer.write(0, bytes)?;
            let crcs = checksum::crc32c_chunks(&buffer, chunk)?;
            let digest = host::integrity::digest(&crcs, chunk, bytes.len() as u64);
            Ok((format!("GPU memory of GPU 0 ({})", gpu.name()), digest))
        }
        Err(GpuError::NoGpu { why }) => Ok((format!("host memory (no GPU: {why})"), cpu(bytes))),
        Err(e) => Err(e.into()),
    }
}

#[cfg(not(feature = "cuda"))]
fn place(bytes: &[u8], _: u64) -> Result<(String, u32)> {
    Ok((
        "host memory (built without the cuda feature)".into(),
        cpu(bytes),
    ))
}

fn cpu(bytes: &[u8]) -> u32 {
    host::integrity::crc32c(bytes)
}
