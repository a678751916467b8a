//! One endpoint, one listener, many transfers, each landing in place in memory the
//! receiving caller owns (`host::api`): `COUNT` transfers of different sizes received
//! into buffers of the caller's with `receive_into` (every chunk's CRC32C checked where
//! it landed), the last one started with `start_send` and polled to its end while the
//! caller goes on. With a GPU (the `cuda` feature and a driver that finds one), one more
//! transfer lands in a `DeviceBuffer` of the caller's (`receive_into_device`), checked by
//! the checksum kernel there.
//!
//! ```sh
//! cargo run -p host-examples --bin endpoint [COUNT [ADDRESS [OP]]]   # default 100 127.0.0.1:0 send
//! ```
//!
//! The transport is the library's choice (`Options::transport`, `Auto`): RDMA verbs where
//! the address is on an RDMA device (the Soft-RoCE guests run it so), else TCP. `OP`
//! (verbs): `send`, or `write` for RDMA WRITEs into the receiving caller's buffers.

use anyhow::{ensure, Context as _, Result};
use host::api::{self, Options};
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Bytes that say where they are and which transfer they belong to.
fn bytes_of(transfer: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ transfer as u8)
        .collect()
}

fn size_of(transfer: usize) -> usize {
    1000 + 4099 * transfer
}

fn run() -> Result<()> {
    let count: usize = match std::env::args().nth(1) {
        Some(n) => n.parse().context("COUNT: a whole number of transfers")?,
        None => 100,
    };
    ensure!(count >= 1, "COUNT: at least one transfer");
    let op = match std::env::args().nth(3).as_deref() {
        None | Some("send") => api::Op::Send,
        Some("write") => api::Op::Write,
        Some(other) => anyhow::bail!("OP: send or write, not {other:?}"),
    };
    let opts = Options {
        wait: Some(Duration::from_secs(30)),
        op,
        ..Options::default()
    };
    let bind: std::net::SocketAddr = match std::env::args().nth(2) {
        Some(a) => a
            .parse()
            .context("ADDRESS: an IP address and port, as 192.0.2.1:0")?,
        None => "127.0.0.1:0".parse()?,
    };
    let listener = api::Listener::bind(bind, &opts)?;
    let endpoint = api::connect(listener.local_addr(), &opts)?;
    let over = match endpoint.transport() {
        api::TransportKind::Rdma => "RDMA verbs",
        _ => "TCP",
    };

    // The receiving caller: its own buffers, one per transfer, each checked on arrival.
    let receiving = std::thread::spawn(move || -> Result<(usize, u64)> {
        let mut bytes = 0u64;
        for t in 0..count {
            let mut buf = vec![0u8; size_of(t)];
            let report = listener.receive_into(&mut buf)?;
            ensure!(buf == bytes_of(t, buf.len()), "transfer {t} differs");
            bytes += report.bytes;
        }
        Ok((count, bytes))
    });

    // The sending caller: all but the last transfer one after another, the last one
    // started and polled.
    // A send that did not go on the connection of the one before opened a new one
    // (over TCP the endpoint keeps its connection; over verbs each send opens its own).
    let mut connections = 0usize;
    for t in 0..count - 1 {
        let sent = endpoint.send(&bytes_of(t, size_of(t)), None)?;
        connections += usize::from(!sent.kept_connection);
    }
    let last = count - 1;
    let mut pending = endpoint.start_send(bytes_of(last, size_of(last)), None)?;
    let t0 = Instant::now();
    let mut polls = 0u64;
    while !pending.is_done() {
        ensure!(
            t0.elapsed() < Duration::from_secs(60),
            "the last send never ended"
        );
        polls += 1;
        std::thread::sleep(Duration::from_micros(200));
    }
    let (report, _bytes_back) = pending.wait();
    let report = report?;
    ensure!(report.receiver.is_some_and(|v| v.ok()), "not verified");
    connections += usize::from(!report.kept_connection);
    let (received, bytes) = receiving.join().expect("the receiving thread")?;
    let s = if connections == 1 { "" } else { "s" };
    println!(
        "{received} transfers over one endpoint ({over}, {connections} connection{s}), {bytes} bytes, each received in place and checked"
    );
    println!("the last one started with start_send and polled {polls} times until it was verified");
    gpu(&opts)
}

/// One transfer into a `DeviceBuffer` of the caller's, where there is a GPU.
#[cfg(feature = "cuda")]
fn gpu(opts: &Options) -> Result<()> {
    use host::gpu::allocations::DeviceBuffer;
    use host::gpu::Gpu;
    if let Err(e) = Gpu::open(0) {
        if e.is_no_gpu() {
            println!("no GPU here ({e}): the GPU transfer is left out");
            return Ok(());
        }
        return Err(e.into());
    }
    let len = (16 << 20) + 3;
    let listener = api::Listener::bind("127.0.0.1:0".parse()?, opts)?;
    let addr = listener.local_addr();
    let receiving = std::thread::spawn(move || -> Result<Vec<u8>> {
        let gpu = Gpu::open(0)?;
        let mut target = DeviceBuffer::new(&gpu, len)?;
        listener.receive_into_device(&mut target)?;
        let mut back = vec![0u8; len];
        target.read_into(&mut back)?;
        Ok(back)
    });
    let gpu = Gpu::open(0)?;
    let mut source = DeviceBuffer::new(&gpu, len)?;
    let data = bytes_of(7, len);
    source.write(0, &data)?;
    api::send_device(addr, source, opts)?;
    let back = receiving.join().expect("the receiving thread")?;
    ensure!(back == data, "the GPU buffer differs");
    println!("{len} bytes from a GPU buffer into a DeviceBuffer of the caller's, checked by the kernel there: equal");
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn gpu(_: &Options) -> Result<()> {
    println!("built without the cuda feature: the GPU transfer is left out");
    Ok(())
}
