//! `host bench gpu`: how fast the Rust kernel fills memory, against the driver's own
//! `cuMemsetD32` on the same buffer in the same run, plus the mapped and staged paths, and
//! the CRC32C kernel's read rate at 1 GiB against a device-to-device copy in the same run.
//! Prints JSON; docs/measurements.md's numbers are pasted from it.

use super::allocations::{DeviceBuffer, MappedHostBuffer, PinnedHostBuffer};
use super::checksum::{launch_crc32c_chunks_shaped, CRC_BLOCK_THREADS, DEFAULT_PIECE};
use super::context::{Gpu, GpuMemory};
use super::driver;
use super::sources::StagedSource;
pub use crate::integrity::bench::Spread;
use crate::memory::host_buffer::verify_bytes;
use crate::memory::{DataPath, Registrable, SendSource};
use crate::rdma::Deadline;
use crate::transfer::memcpy_wire::MemcpyWire;
use crate::transfer::plan::ChunkPlan;
use crate::transfer::schedule::{ChunkWire, Done, Posted, Schedule, WireError};
use anyhow::Result;
use serde::Serialize;
use std::ops::Range;
use std::rc::Rc;
use std::time::{Duration, Instant};

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
    pub crc32c: CrcResult,
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Median milliseconds of `op` on the GPU's stream, each repetition bracketed by events.
fn time_events(gpu: &Gpu, reps: usize, mut op: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..3 {
        op()?; // warm-up: module load, first-touch of the pages, clocks
    }
    let stream = gpu.stream();
    stream.synchronize()?;
    let start = gpu.new_event(true)?;
    let stop = gpu.new_event(true)?;
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        start.record(stream)?;
        op()?;
        stop.record(stream)?;
        stop.synchronize()?;
        samples.push(stop.elapsed_since(&start)? as f64);
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

fn fill(gpu: &Rc<Gpu>, bytes: usize) -> Result<FillResult> {
    let mut buffer = DeviceBuffer::new(gpu, bytes)?;
    let reps = repetitions(bytes);
    // SAFETY (both): time_events synchronises on its stop event after each launch, and
    // nothing else touches the buffer meanwhile.
    let kernel_ms = time_events(gpu, reps, || unsafe { gpu.launch_generate(&mut buffer) })?;
    // SAFETY: as above.
    let memset_ms = time_events(gpu, reps, || unsafe {
        gpu.launch_memset_d32(&mut buffer, 0x5a5a_5a5a)
    })?;
    // The last thing written was the memset: fill once more and check, so the timed
    // kernel is known to be the correct one.
    gpu.synchronize()?;
    gpu.generate(&mut buffer)?;
    let check = gpu.verify(&buffer)?;
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
fn mapped(gpu: &Rc<Gpu>, bytes: usize) -> Result<PathResult> {
    let mut host = MappedHostBuffer::new(gpu, bytes)?;
    // SAFETY: time_events synchronises after each launch; nothing else touches `host`.
    let mapped_ms = time_events(gpu, 10, || unsafe { gpu.launch_generate(&mut host) })?;
    let source = DeviceBuffer::new(gpu, bytes)?;
    let pinned = PinnedHostBuffer::new(gpu, bytes)?;
    let copy_ms = time_events(gpu, 10, || {
        let bound = gpu.bind()?;
        // SAFETY: both ranges are whole buffers of ours, `bytes` long, of the bound
        // context; pinned is not read until the stream syncs (time_events synchronises
        // after each repetition).
        unsafe {
            driver::memcpy_dtoh_async(
                &bound,
                pinned.as_mut_ptr(),
                source.device_ptr(),
                bytes,
                gpu.stream(),
            )?
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
    /// Chunks the schedule keeps with the wire at once.
    pub in_flight: u64,
    /// Interleaved rounds: each runs the three measurements below once, in turn.
    pub rounds: usize,
    /// What stands in for the NIC, which the GPU machine does not have.
    pub consumer: &'static str,
    /// GB/s of the staged source's copies, with a wire that takes each chunk at once.
    pub copy_alone_gb_per_s: Spread,
    /// GB/s of the consumer reading the ring's slots, with no copies.
    pub consumer_alone_gb_per_s: Spread,
    /// GB/s of the product's staged source and schedule with the consumer: copies and
    /// consumer overlapped through the ring.
    pub pipelined_gb_per_s: Spread,
    /// What running the two one after the other would give (medians):
    /// 1 / (1/copy + 1/consumer).
    pub serial_gb_per_s: f64,
    /// Pipelined median over the slower stage's median: 1.0 is perfect overlap.
    pub overlap_ratio: f64,
}

/// A wire that takes every chunk at once: the copies' speed alone.
struct InstantWire {
    last: Option<Done>,
}

// SAFETY: reads no bytes at all.
unsafe impl ChunkWire for InstantWire {
    /// # Safety
    /// As [`ChunkWire::post`] says.
    unsafe fn post(&mut self, chunks: &[Posted]) -> Result<(), WireError> {
        if let Some(p) = chunks.last() {
            self.last = Some(Done {
                pass: p.pass,
                through: p.chunk.index,
            });
        }
        Ok(())
    }
    fn wait(&mut self, _: &Deadline) -> Result<Option<Done>, WireError> {
        Ok(self.last)
    }
    fn drain(&mut self, _: &Deadline) {}
}

/// The ring's slots handed out in the staged source's order, without copying into them:
/// the consumer's speed alone, on the same memory.
struct RingOnly<'a> {
    ring: &'a dyn Registrable,
    slots: usize,
    slot_bytes: usize,
    len: usize,
}

// SAFETY: memory() is the staged source's ring, borrowed for 'a; chunks are whole slots
// inside it (offset / slot_bytes % slots < slots), and nothing writes the ring while the
// benchmark's consumer reads it (no copies run in this measurement).
unsafe impl SendSource for RingOnly<'_> {
    fn len(&self) -> usize {
        self.len
    }
    fn memory(&self) -> &dyn Registrable {
        self.ring
    }
    fn max_chunks_in_flight(&self) -> Option<usize> {
        Some(self.slots - 2)
    }
    fn prepare_chunk(&self, offset: usize, len: usize, _: Instant) -> Result<Range<usize>> {
        let start = (offset / self.slot_bytes % self.slots) * self.slot_bytes;
        Ok(start..start + len)
    }
    fn first_values(&self, _: usize) -> Result<Vec<i32>> {
        Ok(Vec::new())
    }
    fn path(&self) -> DataPath {
        DataPath::StagedThroughHostMemory
    }
    fn copy_out(&self, _: usize, _: &mut [u8]) -> Result<()> {
        anyhow::bail!("the benchmark's ring-only source holds no data to copy out")
    }
}

/// The staged pipeline as the sender runs it: the product's [`StagedSource`] and
/// [`Schedule`], with a consumer that does what the wire would (a host memcpy of each
/// chunk into a second buffer, on its own thread), against each stage alone, in
/// interleaved rounds.
fn staged(gpu: &Rc<Gpu>, bytes: usize, chunk: usize, rounds: usize) -> Result<StagedResult> {
    let source = StagedSource::generate(gpu, bytes, chunk)?;
    let (slots, slot_bytes) = source.ring_shape();
    let plan = ChunkPlan::new(bytes as u64, chunk as u64).map_err(anyhow::Error::msg)?;
    let schedule = Schedule::new(plan, 16, &source, Duration::from_secs(10));
    let ring_only = RingOnly {
        ring: source.memory(),
        slots,
        slot_bytes,
        len: bytes,
    };
    // One destination for every run, its pages mapped before any is timed.
    let mut destination = vec![1u8; bytes];
    let consume = |src: &dyn SendSource, destination: Vec<u8>| -> Result<(f64, Vec<u8>)> {
        let (took, destination) = MemcpyWire::scope(src.memory(), destination, |wire| {
            schedule.run(src, wire, "the memcpy consumer")
        })?;
        Ok((gb_per_s(bytes, took?.as_secs_f64() * 1e3), destination))
    };
    let (mut copy, mut consumer, mut pipelined) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..=rounds {
        let mut instant = InstantWire { last: None };
        let copy_took = schedule.run(&source, &mut instant, "no consumer")?;
        let (alone, d) = consume(&ring_only, destination)?;
        let (both, d) = consume(&source, d)?;
        destination = d;
        if round > 0 {
            // Round 0 warms up: first touch of the ring, the copy engine's clocks.
            copy.push(gb_per_s(bytes, copy_took.as_secs_f64() * 1e3));
            consumer.push(alone);
            pipelined.push(both);
        }
    }
    let check = verify_bytes(&destination);
    anyhow::ensure!(
        check.ok(),
        "the staged pipeline delivered wrong bytes: {check:?}"
    );
    let (copy, consumer, pipelined) = (
        Spread::of(&copy),
        Spread::of(&consumer),
        Spread::of(&pipelined),
    );
    Ok(StagedResult {
        bytes,
        chunk_bytes: slot_bytes,
        slots,
        in_flight: schedule.window,
        rounds,
        consumer: "memcpy of each chunk into a second host buffer, on its own thread",
        serial_gb_per_s: 1.0 / (1.0 / copy.median + 1.0 / consumer.median),
        overlap_ratio: pipelined.median / copy.median.min(consumer.median),
        copy_alone_gb_per_s: copy,
        consumer_alone_gb_per_s: consumer,
        pipelined_gb_per_s: pipelined,
    })
}

#[derive(Debug, Serialize)]
pub struct CrcTiming {
    pub chunk_bytes: u64,
    pub piece_bytes: u64,
    pub block_threads: u32,
    pub median_us: f64,
    /// Bytes checksummed per second (the kernel reads each byte once).
    pub gb_per_s: f64,
}

#[derive(Debug, Serialize)]
pub struct CrcResult {
    pub bytes: usize,
    pub data: &'static str,
    pub repetitions: usize,
    /// What one timed repetition holds.
    pub timed: &'static str,
    /// The default launch (`gpu::checksum::DEFAULT_PIECE`), 1 MiB chunks.
    pub kernel: CrcTiming,
    /// Every chunk's CRC from the GPU equals the CPU's (`integrity::chunk_crcs`).
    pub matches_cpu: bool,
    pub reference: &'static str,
    pub reference_median_us: f64,
    /// Bytes copied per second; the copy reads and writes each, so HBM moves twice this.
    pub reference_copy_gb_per_s: f64,
    /// Bytes read plus bytes written per second by the copy.
    pub reference_traffic_gb_per_s: f64,
    /// Kernel GB/s over the copy's traffic GB/s: the share of the memory bandwidth a copy
    /// reaches that the checksum's reads reach.
    pub kernel_over_reference_traffic: f64,
    /// Other piece sizes and block sizes (1 MiB chunks), and a chunk size that is not a
    /// multiple of 16 (every piece starts unaligned), from the same run.
    pub variants: Vec<CrcTiming>,
}

fn crc_timing(
    gpu: &Rc<Gpu>,
    data: &DeviceBuffer,
    out: &mut DeviceBuffer,
    chunk: u64,
    piece: u64,
    block_threads: u32,
    reps: usize,
) -> Result<CrcTiming> {
    // SAFETY: time_events synchronises after each launch; nothing else touches data or out.
    let ms = time_events(gpu, reps, || unsafe {
        launch_crc32c_chunks_shaped(data, chunk, piece, block_threads, out)
    })?;
    Ok(CrcTiming {
        chunk_bytes: chunk,
        piece_bytes: piece,
        block_threads,
        median_us: ms * 1e3,
        gb_per_s: gb_per_s(data.len(), ms),
    })
}

/// The CRC32C kernel over `bytes` of random data in device memory, against a
/// `cuMemcpyDtoDAsync` of the same buffer, in the same run.
fn crc32c(gpu: &Rc<Gpu>, bytes: usize) -> Result<CrcResult> {
    let chunk = 1u64 << 20;
    // Random bytes: the row tables' shared-memory bank conflicts depend on the data, and
    // random data is the honest (worst typical) case.
    let host = crate::integrity::bench::random_bytes(bytes, 0x5eed);
    let mut data = DeviceBuffer::new(gpu, bytes)?;
    data.write(0, &host)?;
    let mut out = DeviceBuffer::new(gpu, (bytes as u64).div_ceil(chunk) as usize * 4)?;
    let reps = repetitions(bytes);
    let kernel = crc_timing(
        gpu,
        &data,
        &mut out,
        chunk,
        DEFAULT_PIECE.min(chunk),
        CRC_BLOCK_THREADS,
        reps,
    )?;
    let gpu_crcs = super::checksum::crc32c_chunks(&data, chunk)?;
    let matches_cpu = gpu_crcs == crate::integrity::chunk_crcs(&host, chunk as usize);

    let copy = DeviceBuffer::new(gpu, bytes)?;
    let copy_ms = time_events(gpu, reps, || {
        let bound = gpu.bind()?;
        // SAFETY: two distinct allocations of this context, `bytes` long; time_events
        // synchronises after each repetition and nothing else touches them.
        unsafe {
            driver::memcpy_dtod_async(
                &bound,
                copy.device_ptr(),
                data.device_ptr(),
                bytes,
                gpu.stream(),
            )?
        };
        Ok(())
    })?;
    let mut variants = Vec::new();
    for piece in [16u64 << 10, 32 << 10, 128 << 10, 256 << 10] {
        variants.push(crc_timing(
            gpu,
            &data,
            &mut out,
            chunk,
            piece.min(chunk),
            CRC_BLOCK_THREADS,
            reps,
        )?);
    }
    for threads in [128, 512] {
        variants.push(crc_timing(
            gpu,
            &data,
            &mut out,
            chunk,
            DEFAULT_PIECE.min(chunk),
            threads,
            reps,
        )?);
    }
    let odd_chunk = chunk + 3;
    let mut odd_out = DeviceBuffer::new(gpu, (bytes as u64).div_ceil(odd_chunk) as usize * 4)?;
    variants.push(crc_timing(
        gpu,
        &data,
        &mut odd_out,
        odd_chunk,
        DEFAULT_PIECE.min(odd_chunk),
        CRC_BLOCK_THREADS,
        reps,
    )?);
    let traffic = gb_per_s(2 * bytes, copy_ms);
    Ok(CrcResult {
        bytes,
        data: "random bytes (xorshift64*), in device memory",
        repetitions: reps,
        timed: "cuMemsetD32Async of the CRC words (4 KiB) + the crc32c_chunks launch, as the product queues them",
        matches_cpu,
        reference: "cuMemcpyDtoDAsync of the same buffer into a second one",
        reference_median_us: copy_ms * 1e3,
        reference_copy_gb_per_s: gb_per_s(bytes, copy_ms),
        reference_traffic_gb_per_s: traffic,
        kernel_over_reference_traffic: kernel.gb_per_s / traffic,
        kernel,
        variants,
    })
}

/// Run everything on GPU `ordinal`.
pub fn run(ordinal: u32) -> Result<GpuBenchReport> {
    let gpu = Gpu::open(ordinal)?;
    let fill = FILL_SIZES
        .iter()
        .map(|&bytes| fill(&gpu, bytes))
        .collect::<Result<Vec<_>>>()?;

    let mut seed = DeviceBuffer::new(&gpu, 4096 * 4)?;
    // SAFETY: time_events synchronises after each launch.
    let seed_kernel_ms = time_events(&gpu, 200, || unsafe { gpu.launch_generate(&mut seed) })?;
    let mut host_samples = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        gpu.generate(&mut seed)?;
        host_samples.push(t.elapsed().as_secs_f64() * 1e6);
    }

    Ok(GpuBenchReport {
        gpu: gpu.name(),
        unit: "GB/s = 1e9 bytes per second",
        fill,
        seed_launch_kernel_us: seed_kernel_ms * 1e3,
        seed_launch_host_us: median(host_samples),
        mapped: mapped(&gpu, 256 << 20)?,
        staged: staged(&gpu, 256 << 20, 1 << 20, 9)?,
        crc32c: crc32c(&gpu, 1 << 30)?,
    })
}
