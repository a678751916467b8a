//! A user's program: receive in one thread, send in another, through `host::api`. From
//! GPU memory where the driver reports a GPU (the checksum kernel computes every chunk's
//! CRC32C there, from the PTX embedded at build time), from host memory where it reports
//! none; any other GPU failure is an error.

use anyhow::{ensure, Result};
use host::api::{self, Options};
use host::gpu::allocations::DeviceBuffer;
use host::gpu::{Gpu, GpuError};
use host::memory::HostBuffer;

fn main() -> Result<()> {
    let bytes = (8 << 20) + 3;
    let data: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    let opts = Options::default();
    let listener = api::Listener::bind("127.0.0.1:0".parse()?, &opts)?;
    let addr = listener.local_addr();
    let receiving = std::thread::spawn(move || listener.receive_one());
    let report = match Gpu::open(0) {
        Ok(gpu) => {
            let mut buffer = DeviceBuffer::new(&gpu, data.len())?;
            buffer.write(0, &data)?;
            println!(
                "outside-crate: sending from GPU memory of GPU 0 ({})",
                gpu.name()
            );
            api::send_device(addr, buffer, &opts)?.0
        }
        Err(GpuError::NoGpu { why }) => {
            println!("outside-crate: sending from host memory (no GPU: {why})");
            let mut buffer = HostBuffer::zeroed(data.len())?;
            buffer.write_at(0, &data)?;
            api::send_host(addr, &buffer, &opts)?
        }
        Err(e) => return Err(e.into()),
    };
    let received = receiving.join().expect("the receiving thread panicked")?;
    ensure!(report.receiver.is_some_and(|v| v.ok()), "not verified");
    ensure!(received.bytes == data, "the bytes differ");
    println!(
        "outside-crate: {} bytes received and equal, CRC32C of {} chunks checked",
        received.bytes.len(),
        report.chunks
    );
    Ok(())
}
