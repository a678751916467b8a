//! Tutorial example 2 (docs/tutorial.md, steps 5 and 6): launch `generate_data` on a GPU
//! and check what it wrote.
//!
//! ```sh
//! cargo run --release -p host-examples --bin launch-kernel [ELEMENTS]   # default 2^20
//! ```
//!
//! It uses the host crate's safe GPU layer. That layer does not call cust's launch
//! wrappers: every CUDA driver call is declared in `host/src/gpu/ffi.rs` with a plain
//! integer result (cust 0.3.2 declares it as a Rust enum of CUDA 11's codes, and a newer
//! driver's code outside that enum would be undefined behaviour), and wrapped once in
//! `host/src/gpu/driver.rs`. cust supplies only the handle types and the link to
//! `libcuda.so`. So no `unsafe` here: the launch takes typed GPU memory, not an address.

use anyhow::{bail, Context as _, Result};
use gpu_kernels::pattern::{self, ELEMENT_BYTES};
use host::gpu::allocations::DeviceBuffer;
use host::gpu::Gpu;
use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` puts the whole chain of causes on one line.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let elements: usize = match std::env::args().nth(1) {
        None => 1 << 20,
        Some(n) => n.parse().ok().filter(|&n| n > 0).with_context(|| {
            format!("`{n}` is not a number of elements (a whole number, at least 1)")
        })?,
    };
    // Initialise CUDA, retain GPU 0's primary context, load the PTX that host/build.rs
    // embedded (the driver compiles it for this GPU now), look up both kernels. On a
    // machine without a GPU this is where it stops: `GpuError::NoGpu` says what the
    // driver reported, and it is an error like any other here.
    let gpu = Gpu::open(0)?;
    println!("GPU 0: {}", gpu.name());

    // Device memory: a `DeviceBuffer` frees itself when dropped, and holds the `Rc<Gpu>`
    // so the context outlives it.
    let bytes = elements * ELEMENT_BYTES;
    let mut buffer = DeviceBuffer::new(&gpu, bytes)?;

    // The launch: `generate` checks that the buffer belongs to this GPU, is 16-byte
    // aligned and holds whole i32s, passes (device address, element count as u64) as
    // the kernel's two parameters, and waits for the kernel to finish.
    gpu.generate(&mut buffer)?;

    // Copy back to the host (cuMemcpyDtoH) and compare with the same function the kernel
    // called: the writer and the checker share one definition of the data.
    let mut host = vec![0u8; bytes];
    buffer.read_into(&mut host)?;
    let values: Vec<i32> = host
        .chunks_exact(ELEMENT_BYTES)
        .map(|b| i32::from_ne_bytes(b.try_into().expect("4 bytes")))
        .collect();
    let wrong = (0..elements).filter(|&i| values[i] != pattern::value(i as u64));
    let (mismatches, first) = wrong.fold((0u64, None), |(n, first), i| (n + 1, first.or(Some(i))));
    let shown: Vec<String> = values.iter().take(5).map(i32::to_string).collect();
    println!("first values: {}", shown.join(", "));
    if let Some(first) = first {
        bail!("{mismatches} of {elements} elements differ from the pattern, the first at index {first}");
    }
    println!("generate_data wrote {elements} elements ({bytes} bytes): all match pattern::value");
    Ok(())
}
