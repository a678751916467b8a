//! `host bench gpu`: how fast the Rust kernel fills memory, against the driver's own
//! `cuMemsetD32` on the same buffer in the same run, plus the mapped and staged paths.
//! Prints JSON; the README's numbers are pasted from it.

use super::allocations::{DeviceMemory, PinnedHostMemory};
use super::context::Gpu;
use super::driver;
use anyhow::{Context as _, Result};
use cust::event::{Event, EventFlags};
use cust::stream::{Stream, StreamFlags};
use serde::Serialize;
use std::time::Instant;

/// Sizes the issue asks for: a launch-bound size, an L2-sized one and two HBM-bound ones.
pub const FILL_SIZES: [usize; 4] = [16 << 10, 4 << 20, 256 << 20, 1 << 30];

#[derive(Debug, Serialize)]
pub struct FillResult {
    pub bytes: usize,
    pub repetitions: usize,
    pub kernel_median_us: f64,
    pub kernel_gb_per_s: f64,
    pub memset_d32_median_us: f64,
    pub memset_d32_gb_per_s: f64,
    /// kernel GB/s over cuMemsetD32 GB/s.
    pub ratio: f64,
}

#[derive(Debug, Serialize)]
pub struct PathResult {
    pub bytes: usize,
    pub what: &'static str,
    pub gb_per_s: f64,
    pub reference: &'static str,
    pub reference_gb_per_s: f64,
    pub ratio: f64,
}

#[derive(Debug, Serialize)]
pub struct GpuBenchReport {
    pub gpu: String,
    /// GB = 10^9 bytes throughout.
    pub unit: &'static str,
    pub fill: Vec<FillResult>,
    /// The seed's launch: 4096 elements, time of the kernel alone (events) and of
    /// launch + synchronise as the host sees it.
    pub seed_launch_kernel_us: f64,
    pub seed_launch_host_us: f64,
    pub mapped: PathResult,
    pub staged: StagedResult,
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Median milliseconds of `op` on `stream`, each repetition bracketed by events.
fn time_events(stream: &Stream, reps: usize, mut op: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..3 {
        op()?; // warm-up: module load, first-touch of the pages, clocks
    }
    stream.synchronize()?;
    let start = Event::new(EventFlags::DEFAULT)?;
    let stop = Event::new(EventFlags::DEFAULT)?;
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        start.record(stream)?;
        op()?;
        stop.record(stream)?;
        stop.synchronize()?;
        samples.push(stop.elapsed_time_f32(&start)? as f64);
    }
    Ok(median(samples))
}

fn gb_per_s(bytes: usize, ms: f64) -> f64 {
    bytes as f64 / (ms * 1e-3) / 1e9
}

fn repetitions(bytes: usize) -> usize {
    // Enough samples for a stable median, about 16 GiB of traffic for the large sizes.
    ((16usize << 30) / bytes).clamp(20, 2000)
}

fn fill(gpu: &Gpu, bytes: usize) -> Result<FillResult> {
    let buffer = DeviceMemory::new(bytes)?;
    let elements = (bytes / 4) as u64;
    let reps = repetitions(bytes);
    let stream = gpu.stream();
    let kernel_ms = time_events(stream, reps, || {
        gpu.launch_generate(buffer.ptr(), elements, stream)
    })?;
    let memset_ms = time_events(stream, reps, || {
        Ok(gpu.memset_d32_async(buffer.ptr(), 0x5a5a_5a5a, bytes / 4)?)
    })?;
    // The last thing written was the memset: fill once more and check, so the timed
    // kernel is known to be the correct one.
    gpu.generate(buffer.ptr(), elements)?;
    let check = gpu.verify(buffer.ptr(), elements)?;
    anyhow::ensure!(
        check.mismatches == 0,
        "generate_data wrote wrong values: {check:?}"
    );
    let (kernel, memset) = (gb_per_s(bytes, kernel_ms), gb_per_s(bytes, memset_ms));
    Ok(FillResult {
        bytes,
        repetitions: reps,
        kernel_median_us: kernel_ms * 1e3,
        kernel_gb_per_s: kernel,
        memset_d32_median_us: memset_ms * 1e3,
        memset_d32_gb_per_s: memset,
        ratio: kernel / memset,
    })
}

/// The seed's method: the kernel writes mapped host memory over PCIe, against the
/// fastest way to get the same bytes to the host, a pinned device-to-host copy.
fn mapped(gpu: &Gpu, bytes: usize) -> Result<PathResult> {
    let stream = gpu.stream();
    let host = PinnedHostMemory::mapped(bytes)?;
    let device_view = host
        .device_ptr()
        .context("mapped memory without a device address")?;
    let mapped_ms = time_events(stream, 10, || {
        gpu.launch_generate(device_view, (bytes / 4) as u64, stream)
    })?;
    let source = DeviceMemory::new(bytes)?;
    let pinned = PinnedHostMemory::unmapped(bytes)?;
    let copy_ms = time_events(stream, 10, || {
        // SAFETY: pinned is valid for `bytes` and not touched until the stream syncs
        // (time_events synchronises on the stop event after each repetition).
        unsafe {
            driver::memcpy_dtoh_async(pinned.host_ptr(), source.ptr(), bytes, stream.as_inner())?
        };
        Ok(())
    })?;
    let (kernel, copy) = (gb_per_s(bytes, mapped_ms), gb_per_s(bytes, copy_ms));
    Ok(PathResult {
        bytes,
        what: "generate_data into mapped page-locked host memory",
        gb_per_s: kernel,
        reference: "cuMemcpyDtoHAsync into page-locked host memory",
        reference_gb_per_s: copy,
        ratio: kernel / copy,
    })
}

#[derive(Debug, Serialize)]
pub struct StagedResult {
    pub bytes: usize,
    pub chunk_bytes: usize,
    pub slots: usize,
    /// The consumer that stands in for the NIC (the GPU machine has no RDMA device).
    pub consumer: &'static str,
    pub copy_alone_gb_per_s: f64,
    pub consumer_alone_gb_per_s: f64,
    /// Copies and consumer overlapped through the ring.
    pub pipelined_gb_per_s: f64,
    /// What running the two one after the other would give: 1 / (1/copy + 1/consumer).
    pub serial_gb_per_s: f64,
    /// pipelined over the slower stage: 1.0 is perfect overlap.
    pub overlap_ratio: f64,
}

/// The staged pipeline: device-to-host copies into a ring of pinned slots, each slot read
/// by a consumer as soon as its copy lands, against each stage alone. A CPU CRC-32 stands
/// in for the NIC, which the GPU machine does not have.
fn staged(gpu: &Gpu, bytes: usize, chunk: usize) -> Result<StagedResult> {
    const SLOTS: usize = 8;
    let device = DeviceMemory::new(bytes)?;
    gpu.generate(device.ptr(), (bytes / 4) as u64)?;
    let ring = PinnedHostMemory::unmapped(SLOTS * chunk)?;
    let copy_stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
    let events = (0..SLOTS)
        .map(|_| Event::new(EventFlags::DISABLE_TIMING))
        .collect::<Result<Vec<_>, _>>()?;
    let chunks = bytes / chunk;
    let slot_bytes = |slot: usize| {
        // SAFETY: slot < SLOTS and the ring holds SLOTS * chunk bytes; callers read a
        // slot only after the copy into it has completed and before the next is issued.
        unsafe { std::slice::from_raw_parts(ring.host_ptr().add(slot * chunk), chunk) }
    };
    let issue = |k: usize| -> Result<()> {
        let slot = k % SLOTS;
        // SAFETY: the slot's previous chunk has been consumed (or waited for) before
        // chunk k is issued into it, so nobody reads it while the copy writes.
        unsafe {
            driver::memcpy_dtoh_async(
                ring.host_ptr().add(slot * chunk),
                device.ptr() + (k * chunk) as u64,
                chunk,
                copy_stream.as_inner(),
            )?;
        }
        events[slot].record(&copy_stream)?;
        Ok(())
    };
    // One pass over the data; `copy` and `consume` switch the two stages on or off.
    let run = |copy: bool, consume: bool| -> Result<(f64, u32)> {
        let started = Instant::now();
        let mut crc = crc32fast::Hasher::new();
        if copy {
            for k in 0..SLOTS.min(chunks) {
                issue(k)?;
            }
        }
        for k in 0..chunks {
            let slot = k % SLOTS;
            if copy {
                events[slot].synchronize()?;
            }
            if consume {
                crc.update(slot_bytes(slot));
            }
            if copy && k + SLOTS < chunks {
                issue(k + SLOTS)?;
            }
        }
        Ok((started.elapsed().as_secs_f64() * 1e3, crc.finalize()))
    };
    run(true, true)?; // warm-up
    let (copy_ms, _) = run(true, false)?;
    let (consume_ms, _) = run(false, true)?;
    let (pipeline_ms, crc) = run(true, true)?;
    let mut whole = vec![0u8; bytes];
    device.read_into(&mut whole)?;
    anyhow::ensure!(
        crc == crc32fast::hash(&whole),
        "the staged bytes differ from the device's"
    );
    let copy = gb_per_s(bytes, copy_ms);
    let consumer = gb_per_s(bytes, consume_ms);
    let pipelined = gb_per_s(bytes, pipeline_ms);
    Ok(StagedResult {
        bytes,
        chunk_bytes: chunk,
        slots: SLOTS,
        consumer: "CRC-32 (crc32fast) of each chunk on one CPU core",
        copy_alone_gb_per_s: copy,
        consumer_alone_gb_per_s: consumer,
        pipelined_gb_per_s: pipelined,
        serial_gb_per_s: 1.0 / (1.0 / copy + 1.0 / consumer),
        overlap_ratio: pipelined / copy.min(consumer),
    })
}

/// Run everything on GPU `ordinal`.
pub fn run(ordinal: u32) -> Result<GpuBenchReport> {
    let gpu = Gpu::open(ordinal)?;
    let fill = FILL_SIZES
        .iter()
        .map(|&bytes| fill(&gpu, bytes))
        .collect::<Result<Vec<_>>>()?;

    let seed = DeviceMemory::new(4096 * 4)?;
    let stream = gpu.stream();
    let seed_kernel_ms = time_events(stream, 200, || {
        gpu.launch_generate(seed.ptr(), 4096, stream)
    })?;
    let mut host_samples = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        gpu.generate(seed.ptr(), 4096)?;
        host_samples.push(t.elapsed().as_secs_f64() * 1e6);
    }

    Ok(GpuBenchReport {
        gpu: gpu.name(),
        unit: "GB/s = 1e9 bytes per second",
        fill,
        seed_launch_kernel_us: seed_kernel_ms * 1e3,
        seed_launch_host_us: median(host_samples),
        mapped: mapped(&gpu, 256 << 20)?,
        staged: staged(&gpu, 256 << 20, 1 << 20)?,
    })
}
